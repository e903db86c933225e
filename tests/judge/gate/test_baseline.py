"""Baselines that gate an upgrade: record a clean run, plant a regression in one API,
and the rerun fails exactly that API's calls, named as regressions with the ratio."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from pytest_msprobe.judge.gate.baseline import (
    FILE_NAME,
    Baseline,
    CallMetrics,
    compare,
    dump_identity,
    environment,
    read_msprobe_details,
)
from pytest_msprobe.judge.gate.kernel_verdicts import is_kernel
from pytest_msprobe.testing.faults import scaled_in

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
    names = [json.loads(line)["call"] for line in lines[1:]]
    assert (
        names == sorted(names) and len([name for name in names if not is_kernel(name)]) == 49
    )  # and the kernels' verdicts


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
    result = pytester.runpytest(
        f"--msprobe-dump={copy_dump('npu_rope_statistics_fp16')}", f"--msprobe-baseline={folder}"
    )
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
    assert {o.properties["msprobe_reference"] for o in result.calls.values()} == {"reference CSV"}
    assert result.by_outcome("failed") == {}


def test_the_baseline_finds_its_dump_from_another_folder_and_place(
    clean_baseline, run_dump, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """Saved in one folder, used from another with the dump copied elsewhere: the calls
    are found by the dump's identity, not by their path from the rootdir."""
    dump, folder = clean_baseline
    moved = tmp_path / "elsewhere" / "step0"
    shutil.copytree(dump.parent, moved)
    monkeypatch.chdir(moved.parent)
    capsys.readouterr()
    result = run_dump(moved / "dump.json", f"--msprobe-baseline={folder}")
    summary = capsys.readouterr().out
    assert "0 regression, 0 improvement, 49 unchanged, 0 new, 0 vanished" in summary
    assert "WARNING" not in summary and result.ret == 0


def test_a_baseline_of_other_dumps_is_said_loudly(copy_dump, run_dump, tmp_path: Path, capsys) -> None:
    other = tmp_path / "other-baseline"
    run_dump(copy_dump("npu_rope_statistics_fp16"), f"--msprobe-baseline-save={other}")
    capsys.readouterr()
    run_dump(copy_dump(STATS), f"--msprobe-baseline={other}")
    summary = capsys.readouterr().out
    # its section, and a warning that the final line counts: 49 calls ran, none was compared
    assert "WARNING: " in summary and "are dumps of different models: 0 of 49 calls pair" in summary
    # counted in the final line (pytest may add its own warnings, e.g. on assertion rewriting)
    assert "nothing was compared" in summary and re.search(r"53 passed, \d+ warnings", summary), summary
    assert "nothing was compared" in summary.split("warnings summary", 1)[1].split("msprobe baseline", 1)[0]
    assert f"--msprobe-baseline {other} has no record of the dump" in summary  # the warnings summary


def test_a_changed_dump_is_compared_by_its_path_and_said_to_have_changed(clean_baseline, run_dump, capsys) -> None:
    dump, folder = clean_baseline
    dump.write_text(dump.read_text() + "\n")
    capsys.readouterr()
    run_dump(dump, f"--msprobe-baseline={folder}")
    summary = capsys.readouterr().out
    assert "49 unchanged, 0 new" in summary
    assert "is not the one the baseline was recorded with" in summary


def test_the_summary_says_where_the_baseline_was_saved(copy_dump, run_dump, tmp_path: Path, capsys) -> None:
    """One line of the msprobe summary: the file, relative to where pytest was invoked,
    and what it holds; also for --msprobe-baseline-update. Said nothing before."""
    dump = copy_dump(STATS)
    run_dump(dump, f"--msprobe-out={tmp_path / 'out'}", f"--msprobe-baseline-save={tmp_path / 'saved'}")
    summary = capsys.readouterr().out
    (line,) = (line for line in summary.splitlines() if line.startswith("baseline saved: "))
    written = Path.cwd() / line.split(": ", 1)[1].split(" (")[0]
    assert not Path(line.split(": ", 1)[1]).is_absolute() and written.samefile(tmp_path / "saved" / FILE_NAME), line
    kernels = sum(is_kernel(name) for _, name in Baseline.read(tmp_path / "saved").calls)
    assert line.endswith(f"(49 calls, {kernels} kernels of 1 dump)") and kernels > 0, line
    assert summary.index("msprobe summary") < summary.index(line)
    run_dump(dump, f"--msprobe-baseline={tmp_path / 'saved'}", "--msprobe-baseline-update", "-k", "silu")
    assert "baseline updated: " in capsys.readouterr().out


def test_a_dumps_identity_covers_its_tensor_files(copy_dump, tmp_path: Path) -> None:
    """The same dump.json beside another tensor file is another dump (its `content`);
    a baseline recorded before tensors were hashed (no `content`) still finds the dump
    by its dump.json. Before, the identity was the dump.json's SHA-256 alone."""
    dump = copy_dump("torch_mlpcnn_tensor_fp32")
    other = tmp_path / "other" / "dump.json"
    shutil.copytree(dump.parent, other.parent)
    first = dump_identity(dump)
    assert first == dump_identity(other) and first["tensor_files"] > 0
    tensor = sorted((other.parent / "dump_tensor_data").iterdir())[0]
    tensor.write_bytes(tensor.read_bytes()[:-1] + bytes([tensor.read_bytes()[-1] ^ 1]))
    changed = dump_identity(other)
    assert changed["sha256"] == first["sha256"] and changed["content"] != first["content"]
    recorded = Baseline(environment([("a/dump.json", dump)], "cpu"))
    recorded.calls[("a/dump.json", "Functional.linear.0.forward")] = CallMetrics("pass", "benchmark", {})
    assert [match.recorded_as for match in recorded.match_dumps([("b/dump.json", other)])] == [None]
    older = Baseline(
        {"dumps": {"a/dump.json": {"size": first["size"], "sha256": first["sha256"]}}}, dict(recorded.calls)
    )
    assert [match.recorded_as for match in older.match_dumps([("b/dump.json", other)])] == ["a/dump.json"]
