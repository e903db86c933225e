"""Overflow modes (judge/findings/overflow_modes.py): where the bench overflows an output's dtype,
a device in CANN's saturation mode gives the dtype's largest finite value (and 0 for
NaN), one in INF/NaN mode gives +-inf. Either is a finding of that mode (a note, counted
apart), not an accuracy error; a stated mode (--msprobe-overflow-mode) makes the other
one an error.

Planted devices: torch's CPU kernels whose float16/bfloat16 results are saturated as
CANN documents it (`saturating`), single-run (the planted function is the device) and
offline (a tensor dump whose dumped outputs were saturated so). The calls: exp of inputs
whose e**x overflows the dtype, x * 2 and x + x of inputs in [max/2, max], and sqrt of
negative inputs (the bench's NaN)."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from pytest_msprobe.judge.findings.overflow_modes import (
    INF_NAN,
    SATURATION,
    UNKNOWN,
    StatedMode,
    for_judgement,
    mode_findings,
    shown_modes,
    stated_mode,
)
from pytest_msprobe.run.replay import Inputs, Results
from pytest_msprobe.testing.dumpwriter import DumpWriter

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}
EXP, MUL, ADD, SQRT, CORRECT = (
    "Torch.exp.0.forward",
    "Torch.mul.0.forward",
    "Torch.add.0.forward",
    "Torch.sqrt.0.forward",
    "Torch.exp.1.forward",
)
OVERFLOWING = (EXP, MUL, ADD)


def saturating(dtype: torch.dtype, bias: float = 1.0) -> Callable[[Callable], Callable]:
    """The function as a saturating device computes it in `dtype`: +-inf results as
    +-max finite, NaN as 0; `bias` scales the finite results (a kernel biased elsewhere)."""
    largest = torch.finfo(dtype).max

    def wrap(function: Callable) -> Callable:
        def saturated(*args, **kwargs):
            out = function(*args, **kwargs)
            if not isinstance(out, torch.Tensor) or out.dtype != dtype:
                return out
            finite = torch.isfinite(out)
            out = torch.where(finite, out * bias, out) if bias != 1.0 else out
            return out.nan_to_num(nan=0.0, posinf=largest, neginf=-largest)

        return saturated

    return wrap


def inputs(dtype: torch.dtype) -> dict[str, list]:
    generator = torch.Generator().manual_seed(7)
    largest = torch.finfo(dtype).max
    top = 13.0 if dtype == torch.float16 else 95.0  # e**11.09 overflows float16, e**88.7 bfloat16
    exponents = (torch.rand(8, 32, generator=generator) * top).to(dtype)
    large = ((torch.rand(8, 32, generator=generator) * 0.5 + 0.5) * largest).to(dtype)
    signed = (torch.rand(8, 32, generator=generator) * 4 - 1).to(dtype)  # sqrt of the negative ones: NaN
    small = (torch.rand(8, 32, generator=generator) * 4).to(dtype)
    return {
        "Torch.exp.0": [exponents],
        "Torch.mul.0": [large, 2.0],
        "Torch.add.0": [large, large],
        "Torch.sqrt.0": [signed],
        "Torch.exp.1": [small],
    }


FUNCTIONS = ("exp", "mul", "add", "sqrt")


def write_dump(root: Path, dtype: torch.dtype, device: Callable[[str], Callable] | None) -> Path:
    """A tensor dump of the calls; `device(api)` gives the dumped outputs (offline), else torch's."""
    writer = DumpWriter(root, "tensor")
    for call, args in inputs(dtype).items():
        api = call.split(".")[1]
        function = device(api) if device is not None else getattr(torch, api)
        writer.forward(call, args, {}, function(*args))
    return writer.write()


def plant(monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, bias: float = 1.0) -> None:
    for api in FUNCTIONS:
        monkeypatch.setattr(torch, api, saturating(dtype, bias)(getattr(torch, api)))


def records(folder: Path) -> dict[str, dict]:
    [journal] = folder.glob("msprobe_records_*.jsonl")
    return {record["call"]: record for record in map(json.loads, journal.read_text().splitlines())}


def run(where: str, dtype: torch.dtype, tmp_path: Path, run_dump, monkeypatch, *args: str, device: str = "saturating"):
    """The dump's calls on a `device` ("saturating", "biased": saturating and 1+2**-5
    off elsewhere, "ieee": torch's own), single-run or offline."""
    bias = 1 + 2**-5 if device == "biased" else 1.0
    planted = device != "ieee"
    if where == "offline":
        dumped = (lambda api: saturating(dtype, bias)(getattr(torch, api))) if planted else None
        return run_dump(write_dump(tmp_path / "dump", dtype, dumped), "--msprobe-offline", *args)
    dump = write_dump(tmp_path / "dump", dtype, None)
    if planted:
        plant(monkeypatch, dtype, bias)
    return run_dump(dump, "--msprobe-device=cpu", *args)


WHERE = ("single-run", "offline")


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_saturating_device_is_a_saturation_finding_not_an_accuracy_error(
    dtype: str, where: str, tmp_path: Path, run_dump, monkeypatch, pytester: pytest.Pytester, capsys
) -> None:
    """Mode unknown (auto on the CPU): every call passes, the saturating ones with a
    note naming the mode and the elements; sqrt's NaN given as 0 (an error on the main
    branch before: an unexpected inf/NaN disagreement) is the mode's too."""
    result = run(where, DTYPES[dtype], tmp_path, run_dump, monkeypatch, "--msprobe-html=report.html")
    assert set(result.by_outcome("passed")) == {*OVERFLOWING, SQRT, CORRECT}, {
        name: call.text[:400] for name, call in result.calls.items()
    }
    out = pytester.path / "msprobe-out"
    journal = records(out)
    for call in OVERFLOWING:
        [output] = journal[call]["outputs"]
        assert output["findings"]["overflow_mode"] == SATURATION and output["findings"]["overflow_mode_elements"] > 0
        assert (
            f"saturation mode: {output['findings']['overflow_mode_elements']} elements where the bench overflows {dtype} give +-max finite"
            in journal[call]["message"]
        )
        assert "not an accuracy error of the kernel" in journal[call]["message"]
    [sqrt] = journal[SQRT]["outputs"]
    assert sqrt["status"] == "pass" and sqrt["findings"]["overflow_mode_nan_elements"] > 0
    assert "elements where the bench gives NaN give 0" in journal[SQRT]["message"]
    assert journal[CORRECT]["outputs"][0]["findings"] == {}
    [details] = out.glob("accuracy_checking_details_*.csv")
    with open(details, encoding="utf-8-sig", newline="") as handle:
        rows = {row["API Name"]: row for row in csv.DictReader(handle)}
    assert rows[f"{EXP}.output.0"]["Status"] == "pass" and "saturation mode: " in rows[f"{EXP}.output.0"]["Message"]
    summary = capsys.readouterr().out
    assert "overflow modes, calls whose outputs overflow their dtype on the bench: 4 saturation" in summary
    assert "contradict" not in summary
    report = (pytester.path / "report.html").read_text()
    assert (
        '<table class="overflow-modes"><tr><th>overflow mode</th><th>calls</th></tr><tr><td>saturation</td><td class="n">4</td></tr></table>'
        in report
    )


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_device_stated_inf_nan_that_saturates_is_an_error(
    dtype: str, where: str, tmp_path: Path, run_dump, monkeypatch, capsys
) -> None:
    result = run(where, DTYPES[dtype], tmp_path, run_dump, monkeypatch, "--msprobe-overflow-mode=inf-nan")
    assert set(result.by_outcome("failed")) == {*OVERFLOWING, SQRT}
    assert set(result.by_outcome("passed")) == {CORRECT}
    for call in OVERFLOWING:
        text = result.calls[call].text
        assert text.startswith(f"{call}: error: saturation mode (the accuracy standards' verdict follows)")
        assert "contradicts the device's stated inf/nan mode (--msprobe-overflow-mode=inf-nan)" in text
    summary = capsys.readouterr().out
    assert "4 saturation; 4 contradict the device's stated mode (errors)" in summary


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_device_stated_saturating_that_gives_inf_is_an_error(
    dtype: str, where: str, tmp_path: Path, run_dump, monkeypatch, pytester: pytest.Pytester, capsys
) -> None:
    """torch's CPU kernels (IEEE 754) stated to saturate: every call whose bench
    overflows (or gives NaN) contradicts it; the same kernels with the mode unknown
    pass, with a note of the INF/NaN mode."""
    result = run(
        where, DTYPES[dtype], tmp_path, run_dump, monkeypatch, "--msprobe-overflow-mode=saturation", device="ieee"
    )
    assert set(result.by_outcome("failed")) == {*OVERFLOWING, SQRT}
    assert set(result.by_outcome("passed")) == {CORRECT}
    text = result.calls[EXP].text
    assert text.startswith(f"{EXP}: error: inf/nan mode")
    assert f"elements where the bench overflows {dtype} give +-inf" in text
    assert "contradicts the device's stated saturation mode (--msprobe-overflow-mode=saturation)" in text
    summary = capsys.readouterr().out
    assert (
        "overflow modes, calls whose outputs overflow their dtype on the bench: 4 inf-nan; 4 contradict the device's stated mode (errors)"
        in summary
    )
    [metrics] = (pytester.path / "msprobe-out").glob("accuracy_checking_metrics_*.jsonl")
    rows = {row["name"]: row for row in map(json.loads, metrics.read_text().splitlines())}
    assert rows[f"{EXP}.output.0"]["overflow_mode"] == INF_NAN and rows[f"{EXP}.output.0"]["overflow_mode_contradicts"]
    assert rows[f"{EXP}.output.0"]["overflow_mode_stated"] == SATURATION


@pytest.mark.parametrize("where", WHERE)
def test_an_ieee_device_with_the_mode_unknown_passes_with_a_note(
    where: str, tmp_path: Path, run_dump, monkeypatch, pytester: pytest.Pytester
) -> None:
    result = run(where, torch.float16, tmp_path, run_dump, monkeypatch, device="ieee")
    assert result.by_outcome("failed") == {}
    journal = records(pytester.path / "msprobe-out")
    assert "inf/nan mode: " in journal[EXP]["message"] and "the device follows IEEE 754" in journal[EXP]["message"]
    assert "elements where the bench gives NaN give NaN" in journal[SQRT]["message"]
    assert journal[MUL]["outputs"][0]["findings"]["overflow_mode"] == INF_NAN


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_saturating_kernel_biased_elsewhere_still_fails(
    dtype: str, where: str, tmp_path: Path, run_dump, monkeypatch
) -> None:
    """The saturated elements are left out; the finite ones, 1+2**-5 off, are judged."""
    result = run(where, DTYPES[dtype], tmp_path, run_dump, monkeypatch, device="biased")
    failure = result.calls[EXP].text
    assert result.calls[EXP].outcome == "failed" and result.calls[CORRECT].outcome == "failed"
    assert failure.startswith(f"{EXP}: error by the benchmark standard")
    assert "saturation mode: " in failure


def _results(bench: list[float], device: list[float], dtype: torch.dtype) -> Results:
    return Results(
        torch.tensor(device, dtype=dtype),
        torch.tensor(bench, dtype=torch.float32),
        None,
        Inputs([], {}, []),
    )


def test_the_borderline_of_a_stated_inf_nan_mode() -> None:
    """A correct IEEE kernel whose float32 result lies a rounding lower gives 65504
    where the bench (65530, which rounds to inf) barely overflows: no contradiction;
    past 2 ULPs (64) beyond 65504 it is saturation."""
    stated = StatedMode(INF_NAN, "test")
    [borderline] = mode_findings(shown_modes(_results([65530.0, 1.0], [65504.0, 1.0], torch.float16)), stated)
    assert borderline.kind == "saturation mode" and not borderline.fails
    [clear] = mode_findings(shown_modes(_results([65600.0, 1.0], [65504.0, 1.0], torch.float16)), stated)
    assert clear.fails and "1 elements (saturated beyond 2 ULPs" in clear.text


def test_inf_where_the_bench_reaches_the_largest_finite_value_is_the_inf_nan_mode() -> None:
    """The reverse: the bench at 65504 exactly (no overflow), the device inf: a device
    in INF/NaN mode rounding past it; the standards' clipped agreement let it pass
    silently, a stated saturation mode (which never gives inf) fails it."""
    results = _results([65504.0, 1.0], [float("inf"), 1.0], torch.float16)
    [note] = mode_findings(shown_modes(results), UNKNOWN)
    assert note.kind == "inf/nan mode" and not note.fails and note.columns["overflow_mode_elements"] == 1
    [error] = mode_findings(shown_modes(results), StatedMode(SATURATION, "test"))
    assert error.fails and "contradicts the device's stated saturation mode (test)" in error.text


def test_saturated_elements_are_judged_as_the_bench_gives_them() -> None:
    results = _results([1e6, -1e6, float("nan"), 3.0], [65504.0, -65504.0, 0.0, 3.0], torch.float16)
    shown = shown_modes(results)
    judged = for_judgement(results, shown, UNKNOWN)
    assert judged.device[:3].isinf().tolist() == [True, True, False] and judged.device[2].isnan()
    assert judged.device.tolist()[0] > 0 > judged.device.tolist()[1] and float(judged.device[3]) == 3.0
    assert results.device.isfinite().all()  # the device's own outputs stay as they were
    assert for_judgement(results, shown, StatedMode(INF_NAN, "test")) is results  # then an error, judged as it is
    without = _results([1.0, 2.0], [1.0, 2.0], torch.float16)
    assert shown_modes(without) == [] and for_judgement(without, [], UNKNOWN) is without


def test_a_saturated_cast_is_judged_as_the_bench_gives_it() -> None:
    """Binary consistency counted a saturated cast (float32 70000 to float16 65504 where
    the bench gives inf) as a differing element; judged as the bench's inf, it matches."""
    from pytest_msprobe.standards.registry import shipped_registry

    results = _results([7e4, -7e4, 2.0], [65504.0, -65504.0, 2.0], torch.float16)
    registry = shipped_registry()
    assert registry.standard_for("type_as", "float16") == "binary_consistency"
    assert registry.check(results.bench, results.device, api="type_as").status == "error"
    judged = for_judgement(results, shown_modes(results), UNKNOWN)
    assert registry.check(judged.bench, judged.device, api="type_as").status == "pass"


def test_inputs_holding_inf_make_no_claim() -> None:
    results = _results([1e6], [65504.0], torch.float16)
    results.inputs.leaves.append(type("Leaf", (), {"tensor": torch.tensor([float("inf")])})())
    assert shown_modes(results) == []


def test_the_stated_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stated by the option; on auto read from torch_npu on an NPU (never offline),
    else unknown."""
    import sys
    import types

    assert stated_mode("saturation", "cpu", False) == StatedMode(SATURATION, "--msprobe-overflow-mode=saturation")
    assert stated_mode("inf-nan", "npu", True).mode == INF_NAN
    assert stated_mode("auto", "cpu", False) == UNKNOWN
    fake = types.ModuleType("torch_npu")
    answer = {"inf_nan": False}
    fake.npu = types.SimpleNamespace(utils=types.SimpleNamespace(is_support_inf_nan=lambda: answer["inf_nan"]))
    monkeypatch.setitem(sys.modules, "torch_npu", fake)
    assert stated_mode("auto", "npu", False) == StatedMode(SATURATION, "torch_npu.npu.utils.is_support_inf_nan()")
    answer["inf_nan"] = True
    assert stated_mode("auto", "npu", False).mode == INF_NAN
    assert stated_mode("auto", "npu", True) == UNKNOWN
    fake.npu = types.SimpleNamespace(utils=types.SimpleNamespace())  # a torch_npu without it
    assert stated_mode("auto", "npu", False) == UNKNOWN


def test_an_unknown_mode_in_an_ini_file_is_a_usage_error(tmp_path: Path, pytester: pytest.Pytester) -> None:
    dump = write_dump(tmp_path / "dump", torch.float16, None)
    pytester.makeini("[pytest]\nmsprobe_overflow_mode = saturate\n")
    result = pytester.runpytest_inprocess(f"--msprobe-dump={dump}", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--msprobe-overflow-mode 'saturate': expected one of auto, saturation, inf-nan*"])
