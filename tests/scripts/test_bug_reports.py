"""Bug report folders (scripts/bug_report.py): msprobe-script --bug-report and
--msprobe-bug-reports. The folder's dump fails the same way under the plugin, its
script runs without pytest, and the run's results name the reduced size and the folder.

The failure is written into the dumped output (offline: a fault the subprocesses see
without a patched torch): a bfloat16 add 2**-5 too large on its first four rows.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pytest_msprobe.scripts.command import main as msprobe_script
from pytest_msprobe.testing.dumpwriter import DumpWriter

CALL = "Tensor.__add__.0.forward"
HERE = Path(__file__).parent


def _faulty_dump(folder: Path) -> Path:
    generator = torch.Generator().manual_seed(6)
    a, b = (torch.randn(64, 256, generator=generator).to(torch.bfloat16) for _ in range(2))
    out = a + b
    out[:4] = (out[:4].float() * (1 + 2**-5)).to(torch.bfloat16)
    writer = DumpWriter(folder, "tensor")
    writer.forward("Tensor.__add__.0", [a, b], {}, out)
    writer.forward("Tensor.__add__.1", [a, b], {}, a + b)  # a correct call beside it
    return writer.write()


@pytest.fixture(scope="module")
def bug_report(tmp_path_factory) -> Path:
    """msprobe-script --bug-report --offline of the failing call: its folder."""
    root = tmp_path_factory.mktemp("bug")
    dump = _faulty_dump(root / "dump")
    assert msprobe_script([str(dump), CALL, "--bug-report", "--offline", "-o", str(root / "reports")]) == 0
    (folder,) = (root / "reports").glob(f"*/{CALL}")
    return folder


def test_the_folder_holds_everything_a_kernel_engineer_needs(bug_report):
    names = {path.name for path in bug_report.iterdir()}
    assert {"README.md", "report.json", "dump", f"{CALL}.py", f"{CALL}.pt", "_msprobe_judge.py"} <= names
    readme = (bug_report / "README.md").read_text()
    assert len([line for line in readme.splitlines() if line.strip()]) == 3
    assert f"{CALL} fails: error by the" in readme and "64x256 -> " in readme
    report = json.loads((bug_report / "report.json").read_text())
    assert report["verdict_before"].startswith(report["verdict_after"].split("shape")[0])
    environment = report["environment"]
    assert environment["torch"] == torch.__version__
    assert environment["torch_npu"].startswith("absent") and environment["CANN"].startswith("absent")
    assert environment["pytest-msprobe"] and environment["device"]
    assert report["known_defect"] is None


def test_the_folders_dump_fails_the_same_way_under_the_plugin(bug_report, tmp_path):
    dump = bug_report / "dump" / "dump.json"
    records = json.loads(dump.read_text())["data"]
    assert list(records) == [CALL]
    shape = records[CALL]["input_args"][0]["shape"]
    assert shape[0] <= 4 and shape[0] * shape[1] * 8 <= 64 * 256
    done = subprocess.run(
        [sys.executable, "-m", "pytest", f"--msprobe-dump={dump}", "--msprobe-offline", "-p", "no:cacheprovider",
         f"--msprobe-out={tmp_path}", "-q", "-n", "0"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout[-3000:]
    report = json.loads((bug_report / "report.json").read_text())
    assert report["verdict_after"].splitlines()[0] in done.stdout


def test_the_folders_script_runs_without_pytest(bug_report):
    from test_standalone_scripts import bare_python  # this folder's, on sys.path

    done = bare_python(bug_report / f"{CALL}.py", "--device", "cpu")
    assert done.returncode == 1 and "verdict: error" in done.stdout, done.stdout + done.stderr
    assert "as the test: error by the" in done.stdout, done.stdout


def test_a_passing_call_gets_no_bug_report(tmp_path, capsys):
    dump = _faulty_dump(tmp_path / "dump")
    status = msprobe_script(
        [str(dump), "Tensor.__add__.1.forward", "--bug-report", "--offline", "-o", str(tmp_path / "r")]
    )
    assert status == 1
    assert "no bug report" in capsys.readouterr().err
    assert not list((tmp_path / "r").glob("*/*/dump"))


def test_the_run_writes_a_folder_per_failing_call_and_names_it(tmp_path):
    dump = _faulty_dump(tmp_path / "dump")
    reports, out = tmp_path / "reports", tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", f"--msprobe-dump={dump}", "--msprobe-offline", f"--msprobe-bug-reports={reports}",
         f"--msprobe-out={out}", f"--msprobe-html={tmp_path / 'report.html'}", "-p", "no:cacheprovider", "-n", "0", "-v"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout[-3000:]
    folders = list(reports.glob("*/*"))
    assert [folder.name for folder in folders] == [CALL]  # the passing call has none
    assert "64x256 -> " in done.stdout and str(folders[0]) in done.stdout
    assert "dim 0: kept [0, 32) -> 32x" in done.stdout  # -v: the accepted steps under the failure
    journal = next(out.glob("msprobe_records_*.jsonl")).read_text()
    records = [json.loads(line) for line in journal.splitlines() if line.strip()]
    failing = [record for record in records if record.get("call") == CALL]
    assert failing and failing[0]["reduction"]["size"].startswith("64x256 -> ")
    assert failing[0]["reduction"]["folder"] == str(folders[0])
    assert all("reduction" not in record for record in records if record.get("call") != CALL)
    assert str(folders[0]) in (tmp_path / "report.html").read_text()


def test_a_known_defect_keeps_its_label_through_the_reduction(tmp_path):
    """torch's CPU bfloat16 `0.79788456 + x` (the known-defects table's scalar row),
    reduced on the CPU: every candidate must still match the row, and the folder names it."""
    sys.path.insert(0, str(HERE.parent / "judge"))  # another test folder, which pytest may not have added
    try:
        from test_known_defects import ROWS, write_dump
    finally:
        sys.path.remove(str(HERE.parent / "judge"))

    dump = write_dump(tmp_path / "dump")
    assert msprobe_script([str(dump), "Tensor.__radd__.0.forward", "--bug-report", "-o", str(tmp_path / "r")]) == 0
    (folder,) = (tmp_path / "r").glob("*/Tensor.__radd__.0.forward")
    report = json.loads((folder / "report.json").read_text())
    assert report["known_defect"].startswith(f"known defect {ROWS['radd']} of torch CPU")
    assert f"Not a new fault: a known defect {ROWS['radd']}" in (folder / "README.md").read_text()
    assert report["shape_before"] == "64x64" and report["shape_after"] != "64x64"


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("rank3/dump.json", "rank3"),
        ("../../work/dumps/resnet/dump.json", "work_dumps_resnet"),
        ("./dumps/other.json", "dumps_other.json"),
        ("dump.json", "step0"),
    ],
)
def test_a_dumps_folder_is_named_by_its_path_without_the_way_out(key, expected, tmp_path):
    """A dump outside the rootdir (its key ../../work/...) named its folder
    `_.._work_...`: the `..` that lead out of the rootdir are no part of its name."""
    from types import SimpleNamespace

    from pytest_msprobe.scripts.bug_report import report_folder

    index = SimpleNamespace(key=key, path=tmp_path / "step0" / "dump.json")
    assert report_folder(tmp_path, index, "Tensor.add.0.forward") == tmp_path / expected / "Tensor.add.0.forward"
