"""Time per call on a dump of LARGE calls, the CPU as the device: the plugin against
msprobe's own runner (acc_check) on the same dump, same machine (--bench-full only).

The dump: one training step of a 2-block transformer with hidden size 1024, 16 heads, MLP
4096 and sequence 512 (tests/dumps/models/make_dumps.py's `transformer_large`), float32,
tensor task: 62 dumped calls (31 APIs, forward and backward), ~0.9 GB, so it is not in
git: made once under .benchmarks/dumps/ with $MSPROBE_PYTHON (skipped without it).

Group "large calls", each the wall time of a fresh process:
  plugin -n N  `pytest --msprobe-dump=... --msprobe-device=cpu -n N` (0: no xdist), the
               test phase from the summary ("N run here in X s") in extra_info
  msprobe      its acc_check in a fresh process of its venv on the CPU
               (tools/msprobe_acc_check_cpu.py), its time inside acc_check in extra_info
Both judge float32 on the CPU against a float64 CPU bench. Outcomes go into extra_info
too (ours passed/failed per dumped call; msprobe's forward and backward
pass/warning/error per API).
"""

from __future__ import annotations

import csv
import subprocess
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from benchmarks.support import MODELS, TOOLS, PluginRun, Sizes, timed_process

pytestmark = pytest.mark.benchmark(group="large calls")


@pytest.fixture(scope="module")
def large_dump(sizes: Sizes, msprobe_python: Path, dumps_cache: Path) -> Path:
    if not sizes.full:
        pytest.skip("a 0.9 GB dump made with msprobe: --bench-full")
    folder = dumps_cache / "transformer_large_tensor_fp32"
    if not (folder / "dump.json").exists():
        maker = [str(msprobe_python), str(MODELS / "make_dumps.py"), "transformer_large", "float32", str(folder)]
        subprocess.run(maker, check=True, capture_output=True)
    return folder / "dump.json"


@pytest.mark.parametrize("workers", [0, 2])
def test_plugin(
    benchmark, run_plugin: Callable[..., PluginRun], large_dump: Path, tmp_path: Path, workers: int
) -> None:
    extra = ("-W", "ignore", *(("-n", str(workers)) if workers else ()))
    runs: list[PluginRun] = []

    def run() -> None:
        runs.append(run_plugin(large_dump, tmp_path / f"out-{len(runs)}", *extra))

    benchmark.pedantic(run, rounds=3, iterations=1)
    best = min(runs, key=lambda found: found.wall_s)
    benchmark.extra_info.update(calls=best.ran, tests_s=best.tests_s, counts=best.counts)


def test_msprobe(benchmark, msprobe_python: Path, large_dump: Path, tmp_path: Path) -> None:
    inside: list[float] = []
    outs: list[Path] = []

    def run() -> None:
        outs.append(tmp_path / f"out-{len(outs)}")
        command = [str(msprobe_python), str(TOOLS / "msprobe_acc_check_cpu.py"), "-api_info", str(large_dump)]
        _, stdout = timed_process([*command, "-o", str(outs[-1])], tmp_path)
        inside.extend(float(line.split()[1]) for line in stdout.splitlines() if line.startswith("msprobe-seconds"))

    benchmark.pedantic(run, rounds=3, iterations=1)
    with open(next(outs[-1].glob("accuracy_checking_result_*.csv")), encoding="utf-8-sig") as table:
        rows = list(csv.DictReader(table))
    counts = Counter(
        f"{side.split()[0].lower()} {row[side] or '-'}"
        for row in rows
        for side in ("Forward Test Success", "Backward Test Success")
    )
    benchmark.extra_info.update(acc_check_s=min(inside) if inside else None, apis=len(rows), counts=dict(counts))
