"""How long a baseline of a large run takes to write and read, and its size (default
20,000 calls; --bench-full: 200,000). The records mimic a real mix: one output per
call, the metrics each standard keeps (see outcome.KEY_METRICS).
"""

from __future__ import annotations

import gzip
import random
from pathlib import Path

import pytest

from benchmarks.support import Sizes
from pytest_msprobe.judge.check.outcome import KEY_METRICS
from pytest_msprobe.judge.gate.baseline import FILE_NAME, Baseline, CallMetrics

pytestmark = pytest.mark.benchmark(group="baseline")

APIS = [
    ("Functional.linear", "ulp"),
    ("Tensor.__add__", "absolute_threshold"),
    ("Functional.softmax", "benchmark"),
    ("Torch.topk", "binary_consistency"),
    ("Functional.conv2d", "thousandth"),
    ("Torch.cumsum", "accumulative_error"),
]


def synthetic(calls: int, seed: int = 0) -> Baseline:
    rng = random.Random(seed)
    baseline = Baseline(environment={"device": "npu:0 (synthetic)"})
    for number in range(calls):
        api, standard = APIS[number % len(APIS)]
        direction = "forward" if number % 2 == 0 else "backward"
        path = "" if direction == "forward" else "[0]"
        metrics = {key: float(f"{rng.random() * 1e-3:.6g}") for key in KEY_METRICS[standard]}
        baseline.calls[("step0/rank0/dump.json", f"{api}.{number // 2}.{direction}")] = CallMetrics(
            "pass", standard, {path: metrics}
        )
    return baseline


def test_write(benchmark, sizes: Sizes, tmp_path: Path) -> None:
    calls = sizes(20_000, 200_000)
    baseline = synthetic(calls)
    path = benchmark.pedantic(baseline.write, args=(tmp_path,), rounds=3, iterations=1)
    assert path.name == FILE_NAME
    benchmark.extra_info.update(
        calls=calls,
        mib=round(path.stat().st_size / 2**20, 2),
        gzip_mib=round(len(gzip.compress(path.read_bytes(), 6)) / 2**20, 2),  # about what git stores
    )


def test_read(benchmark, sizes: Sizes, tmp_path: Path) -> None:
    calls = sizes(20_000, 200_000)
    synthetic(calls).write(tmp_path)
    read = benchmark.pedantic(Baseline.read, args=(tmp_path,), rounds=3, iterations=1)
    assert len(read.calls) == calls
    benchmark.extra_info["calls"] = calls
