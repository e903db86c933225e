"""Where a small call's time goes: the test phase per call of a real dump with -n 0,
pytest's own floor, and one call's parts measured in-process.

  per call     the test phase of `pytest --msprobe-dump=DUMP --msprobe-device=cpu -n 0`
               (the plugin's summary, "N run here in X s"): the number is the test
               phase of the whole dump, extra_info its per-call milliseconds; single-run
               and --msprobe-offline (the dumped outputs are the device)
  floor        pytest's own cost of an empty test in a process that imported torch:
               (wall of N empty tests - wall of 1) / (N - 1), in extra_info
  parts        judge.outcome.judge_call on every call of the dump in this process, one
               thread, split into reading the inputs, the replay (device and bench runs),
               the judgement (standards), and judge_call all of it

The dump: --bench-dump, else tests/dumps/models/transformer12_tensor_fp32 (float32,
forward and backward, 322 calls). Before/after a change: --benchmark-save on both
commits and --benchmark-compare (benchmarks/README.md).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from benchmarks.support import PluginRun, ReportedClock, Sizes, fastest, timed_process
from pytest_msprobe.dump.index import CallName, DumpIndex, read_index
from pytest_msprobe.judge.check import call as C
from pytest_msprobe.judge.check.outcome import judge_call
from pytest_msprobe.judge.verdict.judgement import Judgement, judge_and_rejudge
from pytest_msprobe.run.devices import Backend
from pytest_msprobe.run.replay import Sides, replay
from pytest_msprobe.standards import Registry

clock = ReportedClock()
MODES = {"single": (), "offline": ("--msprobe-offline",)}


@pytest.mark.benchmark(group="per call: test phase", timer=clock)
@pytest.mark.parametrize("mode", MODES)
def test_test_phase(
    benchmark, sizes: Sizes, run_plugin: Callable[..., PluginRun], bench_dump: Path, tmp_path: Path, mode: str
) -> None:
    runs: list[PluginRun] = []

    def run() -> None:
        runs.append(run_plugin(bench_dump, tmp_path / f"out-{len(runs)}", *MODES[mode]))
        clock.add(runs[-1].tests_s)

    benchmark.pedantic(run, rounds=sizes(2, 5), iterations=1)
    best = min(runs, key=lambda found: found.tests_s)
    benchmark.extra_info.update(calls=best.ran, ms_per_call=round(1e3 * best.tests_s / best.ran, 3), wall_s=best.wall_s)


def test_pytest_floor(benchmark, sizes: Sizes, tmp_path: Path) -> None:
    calls = 322
    (tmp_path / "test_many.py").write_text(
        f"import pytest, torch\n\n@pytest.mark.parametrize('i', range({calls}))\ndef test_nothing(i):\n    pass\n"
    )
    (tmp_path / "test_one.py").write_text("import torch\n\ndef test_nothing():\n    pass\n")

    def command(name: str) -> list[str]:
        pytest_ = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", os.devnull]
        return [*pytest_, "--rootdir", str(tmp_path), str(tmp_path / name)]

    rounds = sizes(2, 5)
    one = min(timed_process(command("test_one.py"), tmp_path)[0] for _ in range(rounds))
    benchmark.pedantic(timed_process, args=(command("test_many.py"), tmp_path), rounds=rounds, iterations=1)
    benchmark.extra_info["ms_per_empty_test"] = round(1e3 * (fastest(benchmark) - one) / (calls - 1), 3)


@pytest.fixture
def one_thread() -> Iterator[None]:
    """The parts as a worker runs them: one thread (plugin/workers.set_blas_threads)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _parts(index: DumpIndex, settings: C.Settings) -> dict[str, Callable[[CallName], object]]:
    framework = C.PytorchReplay()
    offline = dataclasses.replace(settings, offline=True)
    names = [index.call_at(i) for i in range(len(index))]
    inputs = {str(n): C.read_inputs(index, n, settings.max_elements) for n in names}
    apis = {str(n): framework.resolve(n, settings.backend) for n in names}
    replayed = {str(n): C.replay_call(index, n, settings) for n in names}

    def run(name: CallName) -> None:
        api, given = apis[str(name)], inputs[str(name)]
        device, bench, reference = framework.runs(api, given, settings)
        replay(name.direction, api, given, Sides(device, bench, reference), framework="pytorch")

    def judgement(name: CallName) -> None:
        done = replayed[str(name)]
        judge_and_rejudge(Judgement(settings.registry, name, done.results, done.bench, "pytorch"))

    return {
        "read the inputs": lambda name: C.read_inputs(index, name, settings.max_elements),
        "replay": run,
        "judgement (standards)": judgement,
        "judge_call, all of it": lambda name: judge_call(index, name, settings),
        "judge_call offline": lambda name: judge_call(index, name, offline),
    }


@pytest.mark.benchmark(group="per call: parts")
@pytest.mark.parametrize(
    "part", ["read the inputs", "replay", "judgement (standards)", "judge_call, all of it", "judge_call offline"]
)
def test_parts(benchmark, sizes: Sizes, bench_dump: Path, one_thread: None, part: str) -> None:
    index = read_index(bench_dump)
    settings = C.Settings(
        backend=Backend(), device_index=0, max_elements=2**28, registry=Registry.default(), offline=False
    )
    names = [index.call_at(i) for i in range(len(index))]
    step = _parts(index, settings)[part]

    def every_call() -> None:
        for name in names:
            step(name)

    benchmark.pedantic(every_call, rounds=sizes(2, 5), warmup_rounds=1, iterations=1)
    benchmark.extra_info.update(calls=len(names), ms_per_call=round(1e3 * fastest(benchmark) / len(names), 3))
