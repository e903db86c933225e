"""How long a baseline of a 200,000-call run takes to write and read, and its size.

Run by hand: `python benchmarks/bench_baseline.py [--calls N]`. The records mimic a real
mix: one output per call, the metrics each standard keeps (see baseline.KEY_METRICS).
"""

from __future__ import annotations

import argparse
import gzip
import random
import tempfile
import time
from pathlib import Path

from pytest_msprobe.judge.check.outcome import KEY_METRICS
from pytest_msprobe.judge.gate.baseline import FILE_NAME, Baseline, CallMetrics

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=200_000)
    calls = parser.parse_args().calls
    baseline = synthetic(calls)
    with tempfile.TemporaryDirectory() as folder:
        started = time.perf_counter()
        path = baseline.write(Path(folder))
        written = time.perf_counter() - started
        started = time.perf_counter()
        read = Baseline.read(Path(folder))
        reading = time.perf_counter() - started
        assert len(read.calls) == calls
        size = path.stat().st_size
        packed = len(gzip.compress(path.read_bytes(), 6))
    print(
        f"{calls} calls: write {written:.2f} s, read {reading:.2f} s, {FILE_NAME} {size / 2**20:.1f} MiB "
        f"({packed / 2**20:.1f} MiB gzip-compressed, about what git stores)"
    )


if __name__ == "__main__":
    main()
