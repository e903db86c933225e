"""A failing call's text reads in one glance, in pytest's manner: by default the headline,
the reasons, the metrics that failed against their limits, the worst elements, every
input (scalars by value) and the command that reruns the test; `-v` adds every metric
with its threshold, `-vv` the sign tests' sums too. The result files keep everything.

Faults are planted in an offline run of the shipped float32 dump: its dumped outputs
are the device's, so scaling one file by (1 + 2**-12) is a biased kernel, a NaN written
into one is a kernel's NaN, and the same done to a backward's output a wrong backward.
"""

from __future__ import annotations

import json
import pickle
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch

from pytest_msprobe.standards import check
from pytest_msprobe.standards.verdict import DETAIL_ALL, DETAIL_METRICS, Reason, is_sign_sum

if TYPE_CHECKING:
    from conftest import DumpRun  # the root conftest's run_dump result (tests/conftest.py is another)

DUMP = "torch_mlpcnn_tensor_fp32"
LINEAR = "Functional.linear.0.forward"
OFFLINE = ("--msprobe-device=cpu", "--msprobe-offline")
#: the most lines a failure of one output may print by default
SHORT = 22


def _plant(dump: Path, name: str, change: Callable[[torch.Tensor], torch.Tensor]) -> None:
    path = dump.parent / "dump_tensor_data" / name
    torch.save(change(torch.load(path, weights_only=True)), path)


def _biased(tensor: torch.Tensor) -> torch.Tensor:
    return tensor * (1 + 2**-12)


def _wrong(tensor: torch.Tensor) -> torch.Tensor:
    return tensor * 1.001


def _nan(tensor: torch.Tensor) -> torch.Tensor:
    tensor = tensor.clone()
    tensor.view(-1)[3] = float("nan")
    return tensor


def _failure(run: DumpRun, call: str) -> str:
    outcome = run.calls[call]
    assert outcome.outcome == "failed", outcome.text
    return outcome.text


@pytest.mark.parametrize(
    ("file", "change", "call", "says"),
    [
        (f"{LINEAR}.output.0.pt", _biased, LINEAR, "mean_ulp_err = "),
        (f"{LINEAR}.output.0.pt", _nan, LINEAR, "inf/NaN element(s) disagree"),
        ("Tensor.__mul__.0.backward.output.0.pt", _wrong, "Tensor.__mul__.0.backward", "failed metrics:"),
    ],
    ids=["biased output", "NaN", "wrong backward"],
)
def test_a_failure_is_short_and_names_only_what_failed(
    copy_dump: Callable[[str], Path],
    run_dump: Callable[..., DumpRun],
    file: str,
    change: Callable[[torch.Tensor], torch.Tensor],
    call: str,
    says: str,
) -> None:
    dump = copy_dump(DUMP)
    _plant(dump, file, change)
    text = _failure(run_dump(dump, *OFFLINE, "-k", call.replace(".", " and ")), call)
    lines = text.splitlines()
    assert len(lines) <= SHORT, text
    assert lines[0].startswith(f"{call}: error by the ") and "offline" in lines[0], text
    assert says in text
    assert any(line.lstrip().startswith("reason: ") for line in lines), text
    assert "inputs:" in text and "shape (" in text
    assert "worst elements" in text
    assert not any(is_sign_sum(line.split(" = ")[0].strip()) for line in lines if " = " in line), text
    assert lines[-1].startswith("reproduce: pytest ")


def test_failed_metrics_are_the_ones_the_standard_failed_with_their_limits(
    copy_dump: Callable[[str], Path], run_dump: Callable[..., DumpRun]
) -> None:
    dump = copy_dump(DUMP)
    _plant(dump, f"{LINEAR}.output.0.pt", _biased)
    text = _failure(run_dump(dump, *OFFLINE, "-k", "linear and 0 and forward"), LINEAR)
    failed = text.split("failed metrics:\n", 1)[1].split("  worst elements", 1)[0]
    shown = {line.split(" = ")[0].strip(): line for line in failed.splitlines()}
    assert {"mean_ulp_err", "ulp_err_proportion", "ulp_err_proportion_ratio"} <= set(shown), failed
    assert "(limit 64)" in shown["mean_ulp_err"] and "(limit 0.05)" in shown["ulp_err_proportion"]
    # metrics that passed are not presented as the failure's
    named = {line.split(" = ")[0].strip() for line in text.splitlines() if " = " in line}
    for passing in ("max_ulp_err", "bias_ulp", "cosine", "max_abs_err", "ref_ulp_err_proportion"):
        assert passing not in named, text


def test_verbosity_adds_every_metric_then_the_sums_and_the_files_keep_everything(
    copy_dump: Callable[[str], Path], run_dump: Callable[..., DumpRun], tmp_path: Path
) -> None:
    dump = copy_dump(DUMP)
    _plant(dump, f"{LINEAR}.output.0.pt", _biased)
    select = ("-k", "linear and 0 and forward")
    metrics = _failure(run_dump(dump, *OFFLINE, *select, "-v"), LINEAR)
    assert "max_ulp_err = " in metrics and "cosine = " in metrics
    assert "mean_ulp_err = 2964.61  (threshold 64)  FAILED" in metrics
    assert "bias_signs_sq" not in metrics and "(the sign tests' sums: -vv)" in metrics
    out = tmp_path / "everything"
    everything = _failure(run_dump(dump, *OFFLINE, *select, "-vv", f"--msprobe-out={out}"), LINEAR)
    assert "bias_signs_sq = " in everything and "ref_scale_bias_signs = " in everything
    # the files keep the whole text whatever the verbosity, and the failed metrics
    quiet = tmp_path / "quiet"
    run_dump(dump, *OFFLINE, *select, f"--msprobe-out={quiet}")
    for folder in (out, quiet):
        (journal,) = folder.glob("msprobe_records_*.jsonl")
        record = next(json.loads(line) for line in journal.read_text().splitlines() if LINEAR in line)
        assert "bias_signs_sq = " in record["message"] and "max_ulp_err = " in record["message"]
        assert record["outputs"][0]["failed"]["mean_ulp_err"] == 64
        assert "shown" not in record


def test_every_input_is_listed_scalars_by_value(
    copy_dump: Callable[[str], Path], run_dump: Callable[..., DumpRun]
) -> None:
    dump = copy_dump(DUMP)
    call = "Tensor.__mul__.0.forward"
    _plant(dump, f"{call}.output.0.pt", _biased)
    scalar = json.loads(dump.read_text())["data"][call]["input_args"][1]["value"]
    text = _failure(run_dump(dump, *OFFLINE, "-k", "__mul__ and 0 and forward"), call)
    inputs = text.split("inputs:\n", 1)[1].splitlines()
    assert inputs[0] == f"  input_args[0]: file {call}.input.0.pt, float32, shape (4, 5, 8)", text
    assert inputs[1] == f"  input_args[1]: {scalar!r} (float)", text


def test_the_reproduce_command_reruns_that_test_alone(
    copy_dump: Callable[[str], Path], pytester: pytest.Pytester
) -> None:
    dump = copy_dump(DUMP)
    _plant(dump, f"{LINEAR}.output.0.pt", _biased)
    first = pytester.runpytest_inprocess(f"--msprobe-dump={dump}", *OFFLINE, "-p", "no:cacheprovider")
    command = next(line for line in first.outlines if line.startswith("reproduce: "))
    words = shlex.split(command.removeprefix("reproduce: "))
    assert words[0] == "pytest" and words[-1].endswith(f"::{LINEAR}")
    again = pytester.runpytest_inprocess(*words[1:], "-p", "no:cacheprovider")
    again.assert_outcomes(failed=1)
    assert f"FAILED {words[-1]}" in again.stdout.str()


def test_the_public_message_keeps_its_default_and_marks_what_failed() -> None:
    bench = torch.linspace(-1, 1, 4096, dtype=torch.float64).reshape(64, 64)
    device = (bench * (1 + 2**-12)).float()
    verdict = check(bench, device, api="linear")
    assert verdict.status == "error"
    assert verdict.failed and set(verdict.failed) <= set(verdict.metrics)
    short, every = verdict.message(), verdict.message(DETAIL_ALL)
    assert short == verdict.message(0)
    assert "failed metrics:" in short and len(short.splitlines()) < len(verdict.message(DETAIL_METRICS).splitlines())
    assert all(f"{key} = " in every for key in verdict.metrics)
    for key in verdict.metrics:
        assert (f"    {key} = " in short) == (key in verdict.failed), short
    passing = check(bench, bench.float(), api="linear")
    assert passing.status == "pass" and not passing.failed


def test_a_reason_travels_with_its_limits() -> None:
    """xdist pickles verdicts from the workers: the failed metrics go with them."""
    reason = Reason("error_rate 0.5 > 0", {"error_rate": 0.0})
    back = pickle.loads(pickle.dumps(reason))
    assert back == "error_rate 0.5 > 0" and back.limits == {"error_rate": 0.0}
    assert json.dumps([reason]) == '["error_rate 0.5 > 0"]'
