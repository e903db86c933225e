"""The offline check of a tensor dump, the GEMM backward judged through the dump's data
flow: `pytest --msprobe-dump=DUMP --msprobe-offline --msprobe-device=cpu -n 0`, the wall
time of a fresh process.

The dump: --bench-dump, else the shipped tests/dumps/models/transformer12_tensor_fp32
(322 calls; RESULTS.md's deeper one: `tools/make_transformer_dump.py OUT --blocks 16`,
430 calls, given with --bench-dump). Before/after a change: --benchmark-save on both
commits, then --benchmark-compare (benchmarks/README.md). What the offline check judges
and skips on real msprobe dumps (the coverage half of the old script) is
studies/dataflow_coverage.py's `coverage`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from benchmarks.support import PluginRun, Sizes


@pytest.mark.benchmark(group="dataflow")
def test_offline_check(
    benchmark, sizes: Sizes, run_plugin: Callable[..., PluginRun], bench_dump: Path, tmp_path: Path
) -> None:
    runs: list[PluginRun] = []

    def check() -> PluginRun:
        runs.append(run_plugin(bench_dump, tmp_path / f"out-{len(runs)}", "--msprobe-offline", "-n", "0"))
        return runs[-1]

    found = benchmark.pedantic(check, rounds=sizes(2, 5), iterations=1)
    benchmark.extra_info.update(calls=found.ran, counts=found.counts, tests_s=found.tests_s)
