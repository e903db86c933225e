"""--msprobe-repeat=K: the device runs K times on each call's inputs and a call whose
outputs differ bitwise between runs fails. The CPU is deterministic, so the kernel is
made nondeterministic here (tests/scripts/split_k_linear.py: float32 linear summing in
a random order each run, forward and weight gradient, as atomic adds do)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

from pytest_msprobe.judge.findings.repeat import bit_differences
from pytest_msprobe.results.msprobe_csv import DETAILS_HEADER
from pytest_msprobe.testing.dumpwriter import DumpWriter

KERNEL_FOLDER = Path(__file__).parents[2] / "scripts"  # split_k_linear, a plugin module (-p)
LINEAR = ("Functional.linear.0.forward", "Functional.linear.0.backward")
EXP = ("Torch.exp.0.forward", "Torch.exp.0.backward")


def linear_dump(root: Path) -> Path:
    writer = DumpWriter(root, "tensor")
    generator = torch.Generator().manual_seed(11)
    x, w, b, upstream = (torch.randn(*shape, generator=generator) for shape in ((32, 64), (16, 64), (16,), (32, 16)))
    writer.forward("Functional.linear.0", [x, w, b], {}, torch.nn.functional.linear(x, w, b))
    writer.backward("Functional.linear.0", [upstream], [upstream.sum(0), upstream @ w, x.T @ upstream])
    writer.forward("Torch.exp.0", [x], {}, x.exp())
    writer.backward("Torch.exp.0", [x], [x * x.exp()])
    return writer.write()


@pytest.fixture
def nondeterministic(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    """Run pytest in a subprocess (the kernel replaces torch's linear for good) with
    the nondeterministic kernel planted; returns (result, its result folder)."""
    monkeypatch.setenv("PYTHONPATH", str(KERNEL_FOLDER))
    linear_dump(pytester.path / "dump")

    def run(*args: str) -> pytest.RunResult:
        return pytester.runpytest_subprocess(
            "--msprobe-dump=dump", "--msprobe-device=cpu", "-p", "split_k_linear", "-p", "no:cacheprovider", "-q", *args
        )

    return run


def test_a_nondeterministic_kernel_fails_forward_and_backward(nondeterministic, pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nmsprobe_repeat = 3\n")  # the ini option, as the flag
    result = nondeterministic()
    result.assert_outcomes(passed=2, failed=2)
    text = result.stdout.str()
    for call in LINEAR:
        assert f"{call}: error: nondeterministic (the accuracy standards' verdict follows)" in text
        assert f"{call}: pass by the ulp standard on cpu" in text  # the first run is as accurate as ever
    assert "elements differ bitwise between 3 runs of the device on the same inputs" in text
    assert "ULP of float32" in text and "atomic adds" in text

    out = pytester.path / "msprobe-out"
    [journal] = out.glob("msprobe_records_*.jsonl")
    records = {record["call"]: record for record in map(json.loads, journal.read_text().splitlines())}
    assert {call: records[call]["status"] for call in LINEAR + EXP} == {
        **dict.fromkeys(LINEAR, "error"),
        **dict.fromkeys(EXP, "pass"),
    }
    [metrics_file] = out.glob("accuracy_checking_metrics_*.jsonl")
    metrics = {row["name"]: row for row in map(json.loads, metrics_file.read_text().splitlines())}
    forward = metrics["Functional.linear.0.forward.output.0"]
    assert forward["status"] == "error" and forward["repeat_runs"] == 3
    assert 0 < forward["nondeterministic_elements"] <= 32 * 16 and 0 < forward["nondeterministic_max_abs_diff"] < 1e-4
    weight_gradient = metrics["Functional.linear.0.backward.output.1"]
    assert weight_gradient["nondeterministic_elements"] > 0
    assert (
        "nondeterministic_elements" not in metrics["Functional.linear.0.backward.output.0"]
    )  # x's gradient: one order
    assert "nondeterministic_elements" not in metrics["Torch.exp.0.forward.output.0"]
    [details_file] = out.glob("accuracy_checking_details_*.csv")
    with open(details_file, encoding="utf-8-sig", newline="") as handle:
        header, *rows = list(csv.reader(handle))
    assert tuple(header) == DETAILS_HEADER
    row = next(dict(zip(header, row, strict=False)) for row in rows if row[0] == "Functional.linear.0.forward.output.0")
    assert row["Status"] == "error" and row["Message"].startswith("nondeterministic: ")


def test_one_run_or_a_deterministic_kernel_passes(nondeterministic, pytester: pytest.Pytester, run_dump) -> None:
    pytester.makeini("[pytest]\nmsprobe_repeat = 3\n")
    nondeterministic("--msprobe-repeat=1").assert_outcomes(passed=4)  # the flag over the ini value
    result = run_dump(pytester.path / "dump" / "dump.json", "--msprobe-device=cpu", "--msprobe-repeat=3")
    assert set(result.by_outcome("passed")) == set(LINEAR + EXP)


@pytest.mark.parametrize(
    "args,says",
    [
        (["--msprobe-repeat=0"], "must be at least 1"),
        (["--msprobe-repeat=twice"], "expected a whole number of device runs"),
        (["--msprobe-repeat=2", "--msprobe-offline"], "--msprobe-offline runs no device"),
    ],
)
def test_bad_repeat_is_a_usage_error(args: list[str], says: str, pytester: pytest.Pytester) -> None:
    linear_dump(pytester.path / "dump")
    result = pytester.runpytest("--msprobe-dump=dump", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{says}*"])


def test_bits_not_values_are_compared() -> None:
    nan = torch.tensor([float("nan")])
    other_nan = nan.view(torch.int32).add(1).view(torch.float32)  # a NaN with another payload
    below_one = torch.nextafter(torch.tensor([1.0]), torch.tensor([0.0]))
    assert bit_differences((nan, torch.tensor([0.0])), [(nan.clone(), torch.tensor([0.0]))], 2) == []
    found = bit_differences(
        (nan, torch.tensor([0.0]), torch.tensor([1.0])), [(other_nan, torch.tensor([-0.0]), below_one)], 2
    )
    assert [finding.path for finding in found] == ["[0]", "[1]", "[2]"]
    assert "no finite value changed" in found[0].text and "no finite value changed" in found[1].text
    assert found[2].columns["nondeterministic_max_ulp_diff"] == 1
    across_zero = bit_differences(torch.tensor([2**-149]), [torch.tensor([-(2**-149)])], 2)[0]  # smallest subnormals
    assert across_zero.columns["nondeterministic_max_ulp_diff"] == 2
