"""tools/compare_records.py, the check that a refactor left every verdict
unchanged: two real runs of the same code compare equal (though their files differ byte
for byte), and a planted change of one status, one metric or one CSV cell is found, named
by its test and field, and turns the exit status to 1."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_msprobe.testing.script_modules import load_script

compare_records = load_script(Path(__file__).resolve().parents[2] / "tools" / "compare_records.py")

DUMP = Path(__file__).resolve().parents[1] / "dumps" / "models" / "gru_tensor_fp32"


def _run(root: Path) -> Path:
    """The plugin on a copy of the dump inside root, as kernel_diversity.py lays it out
    (so the records name a path inside root)."""
    shutil.copytree(DUMP, root / "dump")
    env = {key: value for key, value in os.environ.items() if key != "PYTEST_ADDOPTS"}
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--msprobe-device=cpu"]
    command += [f"--msprobe-dump={root / 'dump' / 'dump.json'}", f"--msprobe-out={root / 'out'}"]
    proc = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert list((root / "out").glob("msprobe_records_*.jsonl")), proc.stdout[-2000:] + proc.stderr[-2000:]
    return root


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two runs of the plugin, one second apart at least (other timestamps)."""
    base = tmp_path_factory.mktemp("runs")
    return _run(base / "before"), _run(base / "after")


@pytest.fixture
def changed(runs: tuple[Path, Path], tmp_path: Path) -> Path:
    """A copy of the second run, to plant a change in: its paths moved along, as if it had run there."""
    copy = Path(shutil.copytree(runs[1], tmp_path / "changed"))
    for path in (copy / "out").glob("*_*.*"):
        path.write_bytes(path.read_bytes().replace(str(runs[1]).encode(), str(copy).encode()))
    return copy


def _one(root: Path, pattern: str) -> Path:
    (path,) = (root / "out").glob(pattern)
    return path


def _rewrite_jsonl(path: Path, change: dict[str, object] | None = None, metric: str = "") -> str:
    """Change the first line: its fields in change, or its metric nudged by one ulp; the line's test."""
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    first = rows[0]
    first.update(change or {})
    if metric:
        first[metric] = math.nextafter(first[metric], math.inf)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return str(first["call"])


def test_two_runs_of_the_same_code_compare_equal_though_their_files_differ(runs):
    before, after = runs
    result = compare_records.compare(before, after)
    assert result.differences == []
    assert result.files == 5 and result.tests > 20 and result.random_tests == 0
    assert compare_records.main([str(before), str(after)]) == 0
    # what it ignores is there: other timestamps, durations and output folders
    records = [_one(root, "msprobe_records_*.jsonl") for root in runs]
    assert records[0].name != records[1].name
    assert records[0].read_bytes() != records[1].read_bytes()


def test_a_changed_status_is_found_and_named(runs, changed, capsys):
    call = _rewrite_jsonl(_one(changed, "msprobe_records_*.jsonl"), {"status": "error"})
    differences = compare_records.compare(runs[0], changed).differences
    assert len(differences) == 1
    assert differences[0].file == "out/msprobe_records.jsonl" and call in differences[0].test
    assert 'status: "pass" -> "error"' in differences[0].detail
    assert compare_records.main([str(runs[0]), str(changed)]) == 1
    assert "1 differences" in capsys.readouterr().out


def test_a_metric_moved_by_one_ulp_is_found(runs, changed):
    path = _one(changed, "accuracy_checking_metrics_*.jsonl")
    first = json.loads(path.read_text(encoding="utf-8").splitlines()[0])
    metric = next(key for key in ("rmse", "max_abs_err", "cosine") if first.get(key))
    _rewrite_jsonl(path, metric=metric)
    differences = compare_records.compare(runs[0], changed).differences
    assert [d.file for d in differences] == ["out/accuracy_checking_metrics.jsonl"]
    assert differences[0].detail.startswith(f"{metric}: ")


def test_a_changed_message_in_the_result_csv_is_found(runs, changed):
    path = _one(changed, "accuracy_checking_result_*.csv")
    text = path.read_text(encoding="utf-8-sig").splitlines()
    assert text[1].endswith(",")  # a pass: no message
    text[1] += "now a message"
    path.write_text("\ufeff" + "\n".join(text) + "\n", encoding="utf-8")
    differences = compare_records.compare(runs[0], changed).differences
    assert [d.file for d in differences] == ["out/accuracy_checking_result.csv"]
    assert "Message" in differences[0].detail


def test_a_result_file_on_one_side_only_is_a_difference(runs, changed):
    _one(changed, "accuracy_checking_details_*.csv").unlink()
    differences = compare_records.compare(runs[0], changed).differences
    assert [str(d) for d in differences] == ["out/accuracy_checking_details.csv: only in BEFORE"]


def test_folders_without_result_files_are_no_comparison(tmp_path):
    assert compare_records.main([str(tmp_path), str(tmp_path)]) == 2


def _dropout_run(root: Path, dropped: int, status: str) -> Path:
    """A single-run journal and metrics file of one dropout call, as the plugin writes them."""
    call, dump = "Functional.dropout.0.forward", str(root / "dump.json")
    message = (
        f"{call}: {status} by the benchmark standard on cpu\n  output: dropout rate: {dropped} of 512 elements dropped"
    )
    output = {"index": 0, "path": "", "status": status, "standard": "benchmark", "metrics": {"rmse": dropped * 1e-12}}
    record = {"dump": dump, "call": call, "status": status, "reference": "single-run", "message": message}
    record["outputs"] = [{**output, "findings": {"dropped": dropped}}]
    metrics = {
        "dump": dump,
        "call": "Functional.dropout.0",
        "direction": "forward",
        "name": f"{call}.output.0",
        "status": status,
    }
    (root / "out").mkdir(parents=True)
    (root / "out" / "msprobe_records_20261127000000.jsonl").write_text(json.dumps(record) + "\n", encoding="utf-8")
    (root / "out" / "accuracy_checking_metrics_20261127000000.jsonl").write_text(
        json.dumps({**metrics, "rmse": dropped * 1e-12, "dropped": dropped}) + "\n", encoding="utf-8"
    )
    return root


def test_a_single_run_dropout_is_compared_by_its_verdict_only(tmp_path):
    before = _dropout_run(tmp_path / "before", 56, "pass")
    other_mask = _dropout_run(tmp_path / "other_mask", 50, "pass")
    result = compare_records.compare(before, other_mask)
    assert (result.random_tests, result.differences) == (2, [])
    other_status = _dropout_run(tmp_path / "other_status", 50, "error")
    differences = compare_records.compare(before, other_status).differences
    assert [d.file for d in differences] == ["out/accuracy_checking_metrics.jsonl", "out/msprobe_records.jsonl"]
    assert all('status: "pass" -> "error"' in d.detail and "rmse" not in d.detail for d in differences)


def test_an_offline_dropout_is_compared_in_full(tmp_path):
    """Offline the mask is the dumped one: the same in every run, so every field counts."""
    before, after = (
        _dropout_run(tmp_path / side, dropped, "pass") for side, dropped in (("before", 56), ("after", 50))
    )
    for root in (before, after):
        journal = root / "out" / "msprobe_records_20261127000000.jsonl"
        journal.write_text(journal.read_text(encoding="utf-8").replace('"single-run"', '"cpu"'), encoding="utf-8")
    result = compare_records.compare(before, after)
    assert result.random_tests == 0 and len(result.differences) == 2
