"""A run killed with SIGKILL at any point resumes to the files a clean run writes; a
resumed run's exit status is its whole result set's; runs that check nothing leave no
files to resume from; two runs never write into one folder at once; and the result
files of several runs merge into one set, saying what was read."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch  # noqa: F401 - imported before the in-process runs: pytester's runs then never unload it
from synthetic import many_calls

from pytest_msprobe.judge.gate.kernel_verdicts import is_kernel
from pytest_msprobe.results.merge import main as merge_main
from pytest_msprobe.results.run_files import ResultFilesError, RunFiles, read_journal

CALLS = 120  # 150 tests: a lone run takes a few seconds after startup


def write(folder: Path, data: dict) -> Path:
    (folder / "dump_tensor_data").mkdir(parents=True, exist_ok=True)
    dump = folder / "dump.json"
    dump.write_text(json.dumps({"task": "statistics", "level": "L1", "framework": "pytorch", "data": data}))
    return dump


def pytest_command(dump: Path, out: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "pytest",
        f"--msprobe-dump={dump}",
        "--msprobe-device=cpu",
        f"--msprobe-out={out}",
        "-q",
        "-p",
        "no:cacheprovider",
        *extra,
    ]


def run(dump: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        pytest_command(dump, out, *extra), cwd=dump.parent, capture_output=True, text=True, timeout=120
    )


def kill_midway(dump: Path, out: Path, *extra: str, rows: int = 20) -> None:
    """Start a run and SIGKILL it (workers included) once its details file has rows."""
    process = subprocess.Popen(
        pytest_command(dump, out, *extra),
        cwd=dump.parent,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 90
    try:
        while time.monotonic() < deadline and process.poll() is None:
            details = list(out.glob("accuracy_checking_details_*.csv"))
            if details and details[0].read_bytes().count(b"\n") > rows:
                break
            time.sleep(0.01)
        assert process.poll() is None, "the run ended before it could be killed: make the dump larger"
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def files_by_call(out: Path) -> dict[str, object]:
    """Every file of the newest run, as {row name: row}, timestamps excluded; asserts
    each name occurs once."""
    files = RunFiles.latest(out)
    assert files is not None
    tables: dict[str, object] = {}
    for label, path in (("result", files.result), ("details", files.details)):
        with open(path, encoding="utf-8-sig", newline="") as handle:
            rows = list(csv.reader(handle))
        names = [row[0] for row in rows[1:]]
        assert len(names) == len(set(names)), f"{label}: a call appears twice"
        tables[label] = {row[0]: row for row in rows[1:]}
    metrics = [json.loads(line) for line in files.metrics.read_text().splitlines()]
    tables["metrics"] = {row["name"]: {k: v for k, v in row.items() if k != "duration"} for row in metrics}
    assert len(tables["metrics"]) == len(metrics)
    journal = read_journal(files.journal)
    tables["journal"] = {entry.record.call: (entry.record.status, len(entry.record.outputs)) for entry in journal}
    return tables


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, object]]:
    folder = tmp_path_factory.mktemp("clean")
    dump = write(folder / "dump", many_calls(CALLS))
    result = run(dump, folder / "out", "--msprobe-resume")  # nothing to resume from: runs every call
    assert result.returncode == 0 and "150 calls, 150 pass" in result.stdout, result.stdout[-3000:]
    return dump, files_by_call(folder / "out")


@pytest.mark.parametrize("workers", [(), ("-n", "2")], ids=["lone", "xdist"])
def test_a_killed_run_resumes_to_the_clean_runs_files(clean, tmp_path: Path, workers: tuple[str, ...]) -> None:
    dump, expected = clean
    out = tmp_path / "out"
    kill_midway(dump, out, *workers)
    killed = read_journal(RunFiles.latest(out).journal)
    assert 0 < len(killed) < len(expected["journal"])
    resumed = run(dump, out, "--msprobe-resume", *workers)
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    assert f"deselected {len(killed)} calls: already in" in resumed.stdout or workers
    assert files_by_call(out) == expected
    assert len(list(out.glob("msprobe_records_*.jsonl"))) == 1  # resumed into the same files


def test_a_torn_last_line_is_dropped_and_other_damage_named(tmp_path: Path) -> None:
    journal = tmp_path / "msprobe_records_1.jsonl"
    line = json.dumps(
        {
            "dump": "d",
            "call": "Torch.add.0.forward",
            "status": "pass",
            "standard": "",
            "reference": "",
            "device": "cpu",
            "message": "",
        }
    )
    journal.write_text(line + "\n" + line[:25])
    assert [entry.record.call for entry in read_journal(journal)] == ["Torch.add.0.forward"]
    journal.write_text(line[:25] + "\n" + line + "\n")
    with pytest.raises(ResultFilesError, match="line 1 is not a result record"):
        read_journal(journal)


class AddErrs:
    """A plugin (passed to in-process runs) under which every Torch.add call errors."""

    def pytest_msprobe_register_standards(self, registry) -> None:
        registry.register_standard(
            "always_error",
            lambda pair, thresholds, reference=None: pair.verdict("error", "always_error", {}, {}, ["planted error"]),
        )
        registry.set_api_standard("add", "always_error")


def inline(pytester: pytest.Pytester, dump: Path, *args: str, plugins: tuple = ()) -> pytest.HookRecorder:
    return pytester.inline_run(
        f"--msprobe-dump={dump}",
        "--msprobe-device=cpu",
        "--msprobe-out=out",
        "-p",
        "no:cacheprovider",
        *args,
        plugins=list(plugins),
    )


def call_reports(recorded: pytest.HookRecorder) -> list[pytest.TestReport]:
    """The reports of the calls' tests (not of the kernels', judge/gate/kernel_verdicts.py)."""
    return [
        report
        for report in recorded.getreports("pytest_runtest_logreport")
        if not is_kernel(report.nodeid.rsplit("::", 1)[-1])
    ]


def test_a_run_that_checks_nothing_leaves_nothing_to_resume_from(pytester: pytest.Pytester, tmp_path: Path) -> None:
    dump = write(tmp_path / "dump", many_calls(8))  # 10 tests, 2 of them Torch.add
    assert inline(pytester, dump, "-k", "add").ret == 0
    assert inline(pytester, dump, "--collect-only").ret == 0
    assert inline(pytester, dump, "-k", "nothing_matches").ret == pytest.ExitCode.NO_TESTS_COLLECTED
    assert len(list((pytester.path / "out").glob("msprobe_records_*.jsonl"))) == 1  # neither started a run of its own
    resumed = inline(pytester, dump, "--msprobe-resume")
    assert len(call_reports(resumed)) == 3 * 8  # the 8 calls left, three phases each
    assert len(read_journal(RunFiles.latest(pytester.path / "out").journal)) == 10


def test_a_resumed_runs_exit_status_is_its_whole_result_sets(pytester: pytest.Pytester, tmp_path: Path) -> None:
    dump = write(tmp_path / "dump", many_calls(8))
    assert inline(pytester, dump, "-k", "add", plugins=(AddErrs(),)).ret == pytest.ExitCode.TESTS_FAILED
    rest = inline(pytester, dump, "--msprobe-resume")
    assert [r.outcome for r in call_reports(rest) if r.when == "call"] == ["passed"] * 8
    assert rest.ret == pytest.ExitCode.TESTS_FAILED  # the 2 errors of the resumed run are in the result set
    assert inline(pytester, dump, "--msprobe-resume").ret == pytest.ExitCode.TESTS_FAILED  # nothing left to run
    clean = write(tmp_path / "clean", many_calls(8))
    assert inline(pytester, clean, "--msprobe-out=clean-out").ret == 0
    assert inline(pytester, clean, "--msprobe-out=clean-out", "--msprobe-resume").ret == pytest.ExitCode.OK  # was 5


def test_a_second_run_into_a_folder_in_use_is_refused(tmp_path: Path) -> None:
    """Two shards started into one --msprobe-out: the second is refused while the first
    runs (each call of which waits until the test releases it, so that it surely is: a
    fixed 0.1 s per call ended the first run before a loaded machine had started the
    second), and the first run's files are whole (two runs appending there at once left
    merge one run's records)."""
    dump = write(tmp_path / "slow", many_calls(CALLS))
    release = dump.parent / "release"
    (dump.parent / "conftest.py").write_text(
        "import time\nfrom pathlib import Path\n\n"
        "def pytest_runtest_setup(item):\n"
        "    deadline = time.monotonic() + 120\n"
        f"    while not Path({str(release)!r}).exists() and time.monotonic() < deadline:\n"
        "        time.sleep(0.02)\n"
    )
    out = tmp_path / "out"
    first = subprocess.Popen(
        pytest_command(dump, out), cwd=dump.parent, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        deadline = time.monotonic() + 90
        while (
            not list(out.glob("accuracy_checking_details_*.csv"))
            and time.monotonic() < deadline
            and first.poll() is None
        ):
            time.sleep(0.01)
        second = run(dump, out, "--msprobe-shard=2/2")
        assert first.poll() is None, "the first run ended before the second was refused"
        assert second.returncode == pytest.ExitCode.USAGE_ERROR, second.stdout[-2000:]
        assert "is in use by another run (pid" in second.stderr and "its own --msprobe-out" in second.stderr
    finally:
        release.touch()
        output, _ = first.communicate(timeout=120)
    assert first.returncode == 0, output[-3000:]
    files = files_by_call(out)  # the first run's files, whole: every call once
    assert len(files["journal"]) == 150 and {status for status, _ in files["journal"].values()} == {"pass"}
    assert len(list(out.glob("msprobe_records_*.jsonl"))) == 1


def test_merge_joins_shards_and_keeps_the_last_record_of_a_repeat(tmp_path: Path, capsys) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    for folder, calls in ((first, ["Torch.add.0.forward", "Torch.add.1.forward"]), (second, ["Torch.add.1.forward"])):
        folder.mkdir()
        records = [
            {
                "dump": "d",
                "call": call,
                "status": "error" if folder == second else "pass",
                "standard": "",
                "reference": "",
                "device": "cpu",
                "message": "",
            }
            for call in calls
        ]
        (folder / "msprobe_records_20250101000000.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (first / "msprobe_records_20240101000000.jsonl").write_text("")  # an older run in the same folder
    assert merge_main(["-o", str(tmp_path / "merged"), str(first), str(second)]) == 0
    said = capsys.readouterr().out
    assert "1 tests found in several sources" in said
    assert (
        f"read 2 records from {first / 'msprobe_records_20250101000000.jsonl'} (the newest of 2 runs in {first}; "
        "not read: msprobe_records_20240101000000.jsonl" in said
    )
    assert f"read 1 records from {second / 'msprobe_records_20250101000000.jsonl'}\n" in said
    assert "wrote 2 records to" in said
    merged = files_by_call(tmp_path / "merged")
    assert merged["journal"] == {"Torch.add.0.forward": ("pass", 0), "Torch.add.1.forward": ("error", 0)}
    assert merged["result"]["Torch.add.1"][1:3] == ["error", " "]
    assert merge_main(["-o", str(tmp_path / "x"), str(tmp_path / "nothing-here")]) == 2


def test_each_record_is_in_the_journal_on_disk_when_added(tmp_path: Path) -> None:
    """What resume trusts: a record whose add() returned survives a SIGKILL (the journal
    is flushed per record; the details and metrics files may lag up to a second)."""
    from pytest_msprobe.judge.verdict.record import ResultRecord
    from pytest_msprobe.results.run_files import Entry, ResultWriter

    writer = ResultWriter(RunFiles.new(tmp_path))
    for number in range(3):
        writer.add(
            Entry(
                ResultRecord(
                    dump="dump.json",
                    call=f"Torch.add.{number}.forward",
                    status="pass",
                    standard="absolute_threshold",
                    reference="single-run",
                    device="cpu",
                    message="pass",
                ),
                1,
            )
        )
        on_disk = read_journal(writer.files.journal)  # another handle: sees only what was flushed
        assert [entry.record.call for entry in on_disk] == [f"Torch.add.{n}.forward" for n in range(number + 1)]
    writer.close()
