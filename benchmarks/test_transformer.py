"""A real 12-block transformer tensor dump, float32, on the CPU: this plugin with -n 0
and -n 2 against msprobe's own runner, on the same dump, same machine, same run.

Every number is the wall time of a whole fresh process, start-up and exit included
(group "transformer"):
  -n 0      pytest --msprobe-dump=DUMP --msprobe-device=cpu
  -n 2      the same with two xdist workers; its result files must equal -n 0's (every
            file of the run, rows sorted, durations and timestamps aside)
  msprobe   msprobe acc_check -api_info DUMP -o OUT, its device set to the CPU
            (tools/msprobe_acc_check_cpu.py, in $MSPROBE_PYTHON; skipped without it);
            its time inside acc_check goes into extra_info
Targets: -n 0 at least 30x faster than msprobe; -n 2 faster than -n 0.

The dump: --bench-dump, else the shipped tests/dumps/models/transformer12_tensor_fp32
(tools/make_transformer_dump.py makes it afresh, in msprobe's Python).
"""

from __future__ import annotations

import csv
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from benchmarks.support import TOOLS, PluginRun, Sizes, timed_process

pytestmark = pytest.mark.benchmark(group="transformer")
WORKERS = {"-n 0": (), "-n 2": ("-n", "2")}


def normalized(folder: Path) -> dict[str, Any]:
    """The newest run's result files, comparable across runs: rows sorted (xdist writes
    them as they arrive), durations, timestamps and the command left out."""

    def newest(pattern: str) -> Path:
        return sorted(folder.glob(pattern))[-1]

    found: dict[str, Any] = {}
    for pattern in ("accuracy_checking_result_*.csv", "accuracy_checking_details_*.csv"):
        with open(newest(pattern), encoding="utf-8-sig", newline="") as handle:
            rows = list(csv.reader(handle))
        found[pattern] = [rows[0], *sorted(rows[1:])]
    for pattern in ("accuracy_checking_metrics_*.jsonl", "msprobe_records_*.jsonl"):
        lines = []
        for line in newest(pattern).read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            record.pop("duration", None)
            lines.append(json.dumps(record, sort_keys=True))
        found[pattern] = sorted(lines)
    run = json.loads(newest("msprobe_run_*.json").read_text(encoding="utf-8"))
    for session in run["sessions"]:
        for key in ("started", "duration", "command"):
            session.pop(key, None)
        session["environment"].pop("created", None)
    found["msprobe_run_*.json"] = run
    return found


@pytest.fixture(scope="module")
def outs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The runs' output folders, shared: -n 2's results are compared with -n 0's."""
    return tmp_path_factory.mktemp("transformer-out")


@pytest.mark.parametrize("workers", WORKERS)
def test_plugin(
    benchmark, sizes: Sizes, run_plugin: Callable[..., PluginRun], bench_dump: Path, outs: Path, workers: str
) -> None:
    out = outs / workers.replace(" ", "")
    shutil.rmtree(out, ignore_errors=True)
    found = benchmark.pedantic(run_plugin, args=(bench_dump, out, *WORKERS[workers]), rounds=sizes(2, 5), iterations=1)
    benchmark.extra_info.update(calls=found.ran, counts=found.counts, tests_s=found.tests_s)
    if workers == "-n 2" and (outs / "-n0").exists():
        assert normalized(outs / "-n0") == normalized(out), "the result files of -n 0 and -n 2 differ"


def test_msprobe(benchmark, sizes: Sizes, msprobe_python: Path, bench_dump: Path, tmp_path: Path) -> None:
    inside: list[float] = []

    def run() -> None:
        out = tmp_path / f"out-{len(inside)}"
        command = [str(msprobe_python), str(TOOLS / "msprobe_acc_check_cpu.py"), "-api_info", str(bench_dump)]
        _, stdout = timed_process([*command, "-o", str(out)], tmp_path)
        inside.extend(float(line.split()[1]) for line in stdout.splitlines() if line.startswith("msprobe-seconds"))

    benchmark.pedantic(run, rounds=sizes(1, 3), iterations=1)
    benchmark.extra_info["acc_check_s"] = min(inside) if inside else None
