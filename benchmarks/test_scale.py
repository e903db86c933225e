"""Scale: collecting a large dump, the harness cost of a call whose compute is
negligible, and -n 2 against -n 0 on a compute-bound dump (synthetic dumps made by
pytest_msprobe.testing.synthetic_dumps; the sizes of --bench-full in brackets).

  collection  a dump of 20,000 [200,000] llm-mix calls: json.load of it in this process;
              the plugin's first collection (no cache: it parses) and the cached one,
              and pytest's own floor (a conftest yielding as many bare items), each the
              collection time a probe in the process reports (tools/probe_plugin.py);
              two xdist workers collecting it (-k matching nothing), their collection
              times and RSS in extra_info
  overhead    500 [3,000] `Tensor.add` calls on 2x3 tensors, -n 0: the test phase, per
              call in extra_info; the same without pytest's logging plugin, and
              pytest's empty test
  speedup     200 [2,500] calls of the llm mix with every dimension x4: wall time of
              -n 0 and -n 2; -n 2's statuses and metrics must equal -n 0's
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from benchmarks.support import TOOLS, ReportedClock, Sizes

clock = ReportedClock()


def make_dump(folder: Path, calls: int, *knobs: str) -> Path:
    if not (folder / "dump.json").exists():
        command = [
            sys.executable,
            "-m",
            "pytest_msprobe.testing.synthetic_dumps",
            str(folder),
            "--calls",
            str(calls),
            *knobs,
        ]
        subprocess.run(command, check=True, capture_output=True)
    return folder / "dump.json"


def probed(work: Path, *args: str) -> list[dict[str, Any]]:
    """The probe's lines (one per process: controller, every xdist worker) of one run."""
    probe = work / f"probe-{time.monotonic_ns()}.jsonl"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(TOOLS), os.environ.get("PYTHONPATH")])),
        "MSPROBE_BENCH_PROBE": str(probe),
        "PYTEST_DEBUG_TEMPROOT": str(work),
    }
    command = [sys.executable, "-m", "pytest", "-p", "probe_plugin", "-p", "no:cacheprovider", "-q", "-c", os.devnull]
    done = subprocess.run([*command, "--rootdir", str(work), *args], cwd=work, env=env, capture_output=True, text=True)
    if done.returncode not in (0, 1, 5) or not probe.exists():
        raise AssertionError(
            f"pytest {' '.join(args)} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
    return [json.loads(line) for line in probe.read_text().splitlines()]


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


@pytest.fixture(scope="module")
def llm_dump(sizes: Sizes, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dump(tmp_path_factory.mktemp("llm"), sizes(20_000, 200_000))


@pytest.mark.benchmark(group="scale: collection")
def test_json_load(benchmark, llm_dump: Path) -> None:
    def load() -> object:
        with open(llm_dump, encoding="utf-8") as handle:
            return json.load(handle)

    benchmark.pedantic(load, rounds=2, iterations=1)
    benchmark.extra_info["mib"] = round(llm_dump.stat().st_size / 2**20)


@pytest.mark.benchmark(group="scale: collection", timer=clock)
@pytest.mark.parametrize("collection", ["first", "cached", "pytest floor"])
def test_collection(benchmark, sizes: Sizes, llm_dump: Path, tmp_path: Path, collection: str) -> None:
    calls = sizes(20_000, 200_000)
    args = (f"--msprobe-dump={llm_dump}", f"--msprobe-out={tmp_path / 'out'}", "--co", "-qq")
    if collection == "pytest floor":
        args = ("-p", "no:msprobe", "--co", "-qq", str(write_floor_items(tmp_path / "floor", calls)))
    elif collection == "cached":
        probed(tmp_path, *args)

    def collect() -> None:
        if collection == "first":
            shutil.rmtree(tmp_path / "out", ignore_errors=True)  # no cache: the first collection parses
        line = probed(tmp_path, *args)[0]
        clock.add(line["collect_s"])
        benchmark.extra_info.update(items=line["items"], rss_collected_mb=round(line["rss_collected_mb"]))

    benchmark.pedantic(collect, rounds=2, iterations=1)


@pytest.mark.benchmark(group="scale: worker collection")
def test_worker_collection(benchmark, llm_dump: Path, tmp_path: Path) -> None:
    args = (f"--msprobe-dump={llm_dump}", f"--msprobe-out={tmp_path / 'out'}", "-n", "2", "-k", "no_such_call")
    lines = benchmark.pedantic(probed, args=(tmp_path, *args), rounds=2, iterations=1)
    workers = [line for line in lines if line["worker"].startswith("gw")]
    benchmark.extra_info.update(
        worker_collection_s=[round(line["collect_s"], 2) for line in workers],
        worker_items_built_s=[round(line["items_built_s"], 2) for line in workers],
        worker_rss_mb=[round(line["rss_collected_mb"]) for line in workers],
    )


@pytest.mark.benchmark(group="scale: overhead per call", timer=clock)
@pytest.mark.parametrize("run", ["plugin", "plugin, no logging plugin", "pytest empty test"])
def test_overhead(benchmark, sizes: Sizes, tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, run: str) -> None:
    calls = sizes(500, 3000)
    dump = make_dump(tmp_path_factory.getbasetemp() / f"tiny-{calls}", calls, "--mix", "tiny")
    floor = tmp_path / "test_floor.py"  # pytest's own cost of a test that does nothing
    floor.write_text(
        f"import pytest\n\n@pytest.mark.parametrize('i', range({calls}))\ndef test_nothing(i):\n    pass\n"
    )
    plugin = (f"--msprobe-dump={dump}", f"--msprobe-out={tmp_path / 'out'}")
    args = {
        "plugin": plugin,
        "plugin, no logging plugin": (*plugin, "-p", "no:logging"),
        "pytest empty test": (str(floor), "-p", "no:msprobe"),
    }[run]

    def run_once() -> None:
        line = probed(tmp_path, *args)[0]
        clock.add(line["run_s"])
        benchmark.extra_info["ms_per_call"] = min(
            benchmark.extra_info.get("ms_per_call", float("inf")), round(1e3 * line["run_s"] / line["ran"], 3)
        )

    benchmark.pedantic(run_once, rounds=sizes(2, 3), iterations=1)
    benchmark.extra_info["calls"] = calls


@pytest.fixture(scope="module")
def speedup_outs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("speedup")


@pytest.mark.benchmark(group="scale: speedup")
@pytest.mark.parametrize("workers", ["0", "2"])
def test_speedup(benchmark, sizes: Sizes, speedup_outs: Path, workers: str) -> None:
    calls = sizes(200, 2500)
    dump = make_dump(speedup_outs / f"compute-{calls}", calls, "--scale", "4")
    args = (f"--msprobe-dump={dump}", f"--msprobe-out={speedup_outs / ('out-n' + workers)}", "-n", workers)
    lines = benchmark.pedantic(probed, args=(speedup_outs, *args), rounds=sizes(1, 2), iterations=1)
    tests = max(line["run_s"] for line in lines if workers == "0" or line["worker"].startswith("gw"))
    benchmark.extra_info.update(calls=calls, tests_s=round(tests, 2))
    if workers == "2" and (speedup_outs / "out-n0").exists():
        assert same_results(speedup_outs / "out-n0", speedup_outs / "out-n2"), "-n 2's results differ from -n 0's"


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
