"""Baselines that gate an upgrade: record a clean run, plant a regression in one API,
and the rerun fails exactly that API's calls, named as regressions with the ratio."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from faults import scaled_in

from pytest_msprobe.judge.baseline import Baseline, CallMetrics, FILE_NAME, compare, read_msprobe_details

STATS = "torch_mlpcnn_statistics_bf16"


@pytest.fixture
def clean_baseline(copy_dump, run_dump, tmp_path: Path) -> tuple[Path, Path]:
    dump = copy_dump(STATS)
    run = run_dump(dump, f"--msprobe-baseline-save={tmp_path / 'baseline'}")
    assert run.by_outcome("failed") == {}
    return dump, tmp_path / "baseline"


def test_baseline_is_versioned_sorted_and_names_its_environment(clean_baseline) -> None:
    _, folder = clean_baseline
    lines = (folder / FILE_NAME).read_text().splitlines()
    header = json.loads(lines[0])
    assert header["format"] == "pytest-msprobe-baseline" and header["version"] == 1
    assert header["environment"]["versions"]["torch"] == torch.__version__
    assert header["environment"]["device"] == "cpu"
    (identity,) = header["environment"]["dumps"].values()
    assert len(identity["sha256"]) == 64
    calls = [json.loads(line)["call"] for line in lines[1:]]
    assert calls == sorted(calls) and len(calls) == 49


def test_rerun_without_change_passes(clean_baseline, run_dump, pytester: pytest.Pytester) -> None:
    dump, folder = clean_baseline
    result = run_dump(dump, f"--msprobe-baseline={folder}")
    assert result.ret == 0 and result.by_outcome("failed") == {}
    assert {o.properties["msprobe_reference"] for o in result.by_outcome("passed").values()} >= {"baseline"}


def test_planted_regression_fails_exactly_that_api(clean_baseline, run_dump, monkeypatch, capsys) -> None:
    dump, folder = clean_baseline
    monkeypatch.setattr(torch.nn.functional, "silu", scaled_in(torch.bfloat16, 1 + 2**-6)(torch.nn.functional.silu))
    result = run_dump(dump, f"--msprobe-baseline={folder}")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert set(result.by_outcome("failed")) == {"Functional.silu.0.forward", "Functional.silu.0.backward"}
    summary = capsys.readouterr().out
    assert "2 regression" in summary
    assert "regression Functional.silu.0.forward: pass -> error" in summary
    assert "x the baseline" in summary


def test_update_rewrites_only_the_calls_that_ran(clean_baseline, run_dump, monkeypatch) -> None:
    dump, folder = clean_baseline
    before = Baseline.read(folder)
    monkeypatch.setattr(torch.nn.functional, "silu", scaled_in(torch.bfloat16, 1 + 2**-6)(torch.nn.functional.silu))
    run_dump(dump, f"--msprobe-baseline={folder}", "--msprobe-baseline-update", "-k", "silu.0.forward")
    after = Baseline.read(folder)
    changed = {key for key in after.calls if after.calls[key] != before.calls.get(key)}
    assert [call for _, call in changed] == ["Functional.silu.0.forward"]
    assert after.calls[next(iter(changed))].status == "error"


def test_comparison_names_regressions_improvements_and_new() -> None:
    good = CallMetrics("pass", "benchmark", {"": {"max_rel_err": 0.001, "rmse": 0.01}})
    worse = CallMetrics("error", "benchmark", {"": {"max_rel_err": 0.05, "rmse": 0.01}})
    better = CallMetrics("pass", "benchmark", {"": {"max_rel_err": 0.0004, "rmse": 0.004}})
    regression = compare(worse, good, "x")
    assert (regression.kind, regression.ratio, regression.metric) == ("regression", pytest.approx(50.0), "max_rel_err")
    assert compare(better, good, "x").kind == "improvement"
    assert compare(good, good, "x").kind == "unchanged"
    assert compare(good, None, "x").kind == "new"


def test_bad_baseline_is_a_usage_error(copy_dump, pytester: pytest.Pytester, tmp_path: Path) -> None:
    folder = tmp_path / "old"
    folder.mkdir()
    (folder / FILE_NAME).write_text(json.dumps({"format": "pytest-msprobe-baseline", "version": 99}) + "\n")
    result = pytester.runpytest(f"--msprobe-dump={copy_dump('npu_rope_statistics_fp16')}", f"--msprobe-baseline={folder}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*baseline format version 99*"])


def test_msprobe_details_csv_becomes_the_reference(copy_dump, run_dump, tmp_path: Path) -> None:
    dump = copy_dump(STATS)
    out = tmp_path / "first"
    run_dump(dump, f"--msprobe-out={out}")
    (details,) = out.glob("accuracy_checking_details_*.csv")
    imported = read_msprobe_details(details)
    linear = imported.get("", "Functional.linear.0.forward")
    assert linear is not None and "max_ulp_err" in linear.outputs[""]
    result = run_dump(dump, f"--msprobe-reference-csv={details}", "-k", "linear.0.forward or softmax.0.forward")
    assert {o.properties["msprobe_reference"] for o in result.calls.values()} == {"baseline"}
    assert result.by_outcome("failed") == {}
