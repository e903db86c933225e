"""Scale benchmarks of pytest-msprobe (results: benchmarks/RESULTS-scale.md).

    python benchmarks/bench_scale.py collection [--calls 200000]   # json.load vs first/cached collection, 2 workers' time and RSS
    python benchmarks/bench_scale.py overhead [--calls 3000]       # harness cost of a call whose compute is negligible
    python benchmarks/bench_scale.py speedup [--calls 400]         # -n 2 against -n 0 on a compute-bound dump, results compared
    python benchmarks/bench_scale.py all

Every run prints the machine's load average before and after: other work on the
machine slows everything measured here.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pytest_msprobe.testing.synthetic_dumps import Knobs, make_dump

HERE = Path(__file__).resolve().parent


def load() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def pytest_run(work: Path, *args: str) -> tuple[float, list[dict[str, Any]], subprocess.CompletedProcess]:
    """Wall time, the probe's lines (one per process) and the process of one pytest run."""
    probe = work / f"probe-{time.monotonic_ns()}.jsonl"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE.parent / "tools"), os.environ.get("PYTHONPATH")])),
        "MSPROBE_BENCH_PROBE": str(probe),
    }
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "probe_plugin", "-p", "no:cacheprovider", "-q", *args],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - started
    lines = [json.loads(line) for line in probe.read_text().splitlines()] if probe.exists() else []
    if done.returncode not in (0, 1, 5):
        raise SystemExit(
            f"pytest {' '.join(args)} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
    return wall, lines, done


def bench_collection(work: Path, calls: int, repeats: int) -> dict[str, Any]:
    dump = work / f"llm-{calls}" / "dump.json"
    if not dump.exists():
        make_dump(dump.parent, calls)
    json_load = []
    for _ in range(repeats):
        started = time.perf_counter()
        with open(dump, encoding="utf-8") as handle:
            json.load(handle)
        json_load.append(time.perf_counter() - started)
    tiny = work / "tiny" / "dump.json"
    if not tiny.exists():
        make_dump(tiny.parent, 2)
    floor = write_floor_items(work / "floor-items", calls)
    first, cached, workers, empty, bare, floor_main, floor_workers = [], [], [], [], [], [], []
    for _ in range(repeats):
        shutil.rmtree(work / "out", ignore_errors=True)  # no cache: the first collection parses
        first.append(pytest_run(work, f"--msprobe-dump={dump}", "--msprobe-out=out", "--co", "-qq")[1][0])
        cached.append(pytest_run(work, f"--msprobe-dump={dump}", "--msprobe-out=out", "--co", "-qq")[1][0])
        # -k matching nothing: both workers collect everything, run nothing.
        _, lines, _ = pytest_run(work, f"--msprobe-dump={dump}", "--msprobe-out=out", "-n", "2", "-k", "no_such_call")
        workers.extend(line for line in lines if line["worker"].startswith("gw"))
        _, lines, _ = pytest_run(work, f"--msprobe-dump={tiny}", "--msprobe-out=out", "-n", "2", "-k", "no_such_call")
        empty.extend(line for line in lines if line["worker"].startswith("gw"))
        _, lines, _ = pytest_run(work, "-n", "2", "-k", "no_such_call", str(work / "no_tests_here"))
        bare.extend(line for line in lines if line["worker"].startswith("gw"))
        floor_main.append(pytest_run(floor, "-p", "no:msprobe", "--co", "-qq")[1][0])
        _, lines, _ = pytest_run(floor, "-p", "no:msprobe", "-n", "2", "-k", "no_such_call")
        floor_workers.extend(line for line in lines if line["worker"].startswith("gw"))
    size_mb = dump.stat().st_size / 2**20
    return {
        "dump": f"{calls} calls, {size_mb:.0f} MiB",
        "json_load_s": min(json_load),
        "first_collection_s": min(line["collect_s"] for line in first),
        "cached_collection_s": min(line["collect_s"] for line in cached),
        "worker_collection_s": [round(line["collect_s"], 2) for line in workers],
        "worker_items_built_s": [round(line["items_built_s"], 2) for line in workers],
        "worker_rss_mb": [round(line["rss_collected_mb"]) for line in workers],
        "worker_rss_one_call_dump_mb": [round(line["rss_collected_mb"]) for line in empty],
        "worker_rss_no_dump_mb": [round(line["rss_collected_mb"]) for line in bare],
        "pytest_floor_collection_s": min(line["collect_s"] for line in floor_main),
        "pytest_floor_worker_collection_s": [round(line["collect_s"], 2) for line in floor_workers],
        "pytest_floor_worker_rss_mb": [round(line["rss_collected_mb"]) for line in floor_workers],
    }


FLOOR_CONFTEST = """import pytest


class Bare(pytest.Item):
    '''An item that tests nothing: only its collection is measured.'''

    def runtest(self):
        return None


class Calls(pytest.File):
    def collect(self):
        for number in range(int(self.path.read_text())):
            yield Bare.from_parent(self, name=f"Functional.linear.{number}.forward")


def pytest_collect_file(file_path, parent):
    if file_path.name == "calls.txt":
        return Calls.from_parent(parent, path=file_path)
"""


def write_floor_items(folder: Path, calls: int) -> Path:
    """pytest's own cost of `calls` items: a conftest yielding that many bare items
    (no plugin, no index, no markers), the floor under any one-item-per-call plugin."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "conftest.py").write_text(FLOOR_CONFTEST)
    (folder / "calls.txt").write_text(str(calls))
    return folder


def bench_overhead(work: Path, calls: int, repeats: int) -> dict[str, Any]:
    dump = work / f"tiny-{calls}" / "dump.json"
    if not dump.exists():
        make_dump(dump.parent, calls, Knobs(mix="tiny"))
    floor_tests = work / "floor" / "test_floor.py"  # pytest's own cost of a test that does nothing
    floor_tests.parent.mkdir(exist_ok=True)
    floor_tests.write_text(
        f"import pytest\n\n@pytest.mark.parametrize('i', range({calls}))\ndef test_nothing(i):\n    pass\n"
    )

    def per_call_ms(*args: str) -> float:
        runs = [pytest_run(work, *args)[1][0] for _ in range(repeats)]
        return min(1000 * line["run_s"] / line["ran"] for line in runs)

    return {
        "calls": calls,
        "per_call_ms": per_call_ms(f"--msprobe-dump={dump}", "--msprobe-out=out-overhead"),
        "per_call_ms_no_logging_plugin": per_call_ms(
            f"--msprobe-dump={dump}", "--msprobe-out=out-overhead", "-p", "no:logging"
        ),
        "pytest_empty_test_ms": per_call_ms(str(floor_tests), "-p", "no:msprobe"),
    }


def bench_speedup(work: Path, calls: int, repeats: int) -> dict[str, Any]:
    dump = work / f"compute-{calls}" / "dump.json"
    if not dump.exists():
        make_dump(dump.parent, calls, Knobs(scale=4))
    serial, parallel, serial_tests, parallel_tests = [], [], [], []
    for _ in range(repeats):
        wall, lines, _ = pytest_run(work, f"--msprobe-dump={dump}", "--msprobe-out=out-n0")
        serial.append(wall)
        serial_tests.append(lines[0]["run_s"])
        wall, lines, _ = pytest_run(work, f"--msprobe-dump={dump}", "--msprobe-out=out-n2", "-n", "2")
        parallel.append(wall)
        parallel_tests.append(max(line["run_s"] for line in lines if line["worker"].startswith("gw")))
    return {
        "calls": calls,
        "n0_wall_s": [round(t, 1) for t in serial],
        "n2_wall_s": [round(t, 1) for t in parallel],
        "wall_speedup_median": statistics.median(serial) / statistics.median(parallel),
        "n0_tests_s": [round(t, 1) for t in serial_tests],
        "n2_tests_s": [round(t, 1) for t in parallel_tests],
        "tests_speedup_median": statistics.median(serial_tests) / statistics.median(parallel_tests),
        "identical_results": same_results(work / "out-n0", work / "out-n2"),
    }


def same_results(first: Path, second: Path) -> bool:
    """Every call's status and metrics equal in the newest run of both folders."""
    from pytest_msprobe.results.merge import journal_of
    from pytest_msprobe.results.run_files import read_journal

    def table(folder: Path) -> dict[str, Any]:
        return {
            entry.record.call: (entry.record.status, [(o.status, o.metrics) for o in entry.record.outputs])
            for entry in read_journal(journal_of(folder))
        }

    return table(first) == table(second)


BENCHES = {"collection": bench_collection, "overhead": bench_overhead, "speedup": bench_speedup}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bench", choices=[*BENCHES, "all"])
    parser.add_argument("--calls", type=int, help="size of the synthetic dump (default per benchmark)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--work", type=Path, help="folder for dumps and runs (kept; default a temporary one)")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="msprobe-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    (work / "no_tests_here").mkdir(exist_ok=True)
    defaults = {"collection": 200_000, "overhead": 3000, "speedup": 2500}
    for name in BENCHES if args.bench == "all" else [args.bench]:
        before = load()
        result = BENCHES[name](work, args.calls or defaults[name], args.repeats)
        print(json.dumps({"bench": name, **result, "load_before": before, "load_after": load()}), flush=True)


if __name__ == "__main__":
    main()
