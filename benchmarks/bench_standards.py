"""Speed of each standard on 2**24 float32 elements vs a float64 bench, against msprobe.

Usage: python benchmarks/bench_standards.py [--n 16777216] [--msprobe-python /tmp/msprobe-venv/bin/python]
Each standard is timed through the public path (`Registry.check`, which also computes
the legacy metrics) and through msprobe's own implementation of the same standard
(mindstudio-probe's precision_standard classes, run in their own venv from a subprocess
on the same arrays saved to disk). If the msprobe venv is absent, msprobe is skipped.
Target: ours at least 5x faster per standard.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

from pytest_msprobe.standards import Registry

# api routed to each standard in the shipped tables
APIS = {"binary_consistency": "relu", "absolute_threshold": "add", "ulp": "matmul",
        "thousandth": "conv2d", "accumulative_error": "cumsum", "benchmark": "exp"}

MSPROBE_SCRIPT = r'''
import json, sys, time
import numpy as np, torch
from msprobe.pytorch.api_accuracy_checker.compare.compare_input import CompareInput
from msprobe.pytorch.api_accuracy_checker.compare.compare_column import CompareColumn
from msprobe.pytorch.api_accuracy_checker.compare.algorithm import get_abs_bench_with_eps, get_abs_err, get_rel_err_origin
from msprobe.pytorch.api_accuracy_checker.precision_standard.absolute_threshold import AbsolutethdCompare
from msprobe.pytorch.api_accuracy_checker.precision_standard.accumulative_error_compare import AccumulativeErrorCompare
from msprobe.pytorch.api_accuracy_checker.precision_standard.benchmark_compare import BenchmarkCompare
from msprobe.pytorch.api_accuracy_checker.precision_standard.binary_consistency import BinaryCompare
from msprobe.pytorch.api_accuracy_checker.precision_standard.thousandth_standard import ThousandthStdCompare
from msprobe.pytorch.api_accuracy_checker.precision_standard.ulp_compare import UlpCompare
b = np.load(sys.argv[1]); d = np.load(sys.argv[2]); repeat = int(sys.argv[3])
classes = {"binary_consistency": BinaryCompare, "absolute_threshold": AbsolutethdCompare,
           "ulp": UlpCompare, "thousandth": ThousandthStdCompare,
           "accumulative_error": AccumulativeErrorCompare, "benchmark": BenchmarkCompare}
out = {}
for name, cls in classes.items():
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        # what run_ut does per output before calling the standard
        _, abs_bench_with_eps = get_abs_bench_with_eps(b, torch.float32)
        rel = get_rel_err_origin(get_abs_err(b, d), abs_bench_with_eps)
        cls(CompareInput(b, d, CompareColumn(), torch.float32, rel)).compare()
        best = min(best, time.perf_counter() - t)
    out[name] = best
print(json.dumps(out))
'''


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2 ** 24)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--msprobe-python", default=os.environ.get(
        "MSPROBE_PYTHON", "/tmp/msprobe-venv/bin/python"))
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    bench = rng.standard_normal(args.n) * 10.0
    device = (bench * (1 + rng.standard_normal(args.n) * 2 ** -24)).astype(np.float32)
    bench_t, device_t = torch.from_numpy(bench), torch.from_numpy(device)
    reg = Registry.default()
    ours = {}
    for name, api in APIS.items():
        assert reg.standard_for(api, torch.float32) == name
        best = float("inf")
        for _ in range(args.repeat):
            t = time.perf_counter()
            reg.check(bench_t, device_t, api=api)
            best = min(best, time.perf_counter() - t)
        ours[name] = best
    theirs = None
    if os.path.exists(args.msprobe_python):
        with tempfile.TemporaryDirectory() as tmp:
            bp, dp = os.path.join(tmp, "b.npy"), os.path.join(tmp, "d.npy")
            np.save(bp, bench)
            np.save(dp, device)
            res = subprocess.run([args.msprobe_python, "-c", MSPROBE_SCRIPT, bp, dp,
                                  str(args.repeat)], capture_output=True, text=True)
            if res.returncode == 0:
                theirs = json.loads(res.stdout.strip().splitlines()[-1])
            else:
                print("msprobe run failed, skipped:\n" + res.stderr[-2000:])
    else:
        print(f"msprobe venv not found at {args.msprobe_python}: msprobe timings skipped")
    print(f"n = {args.n} float32 elements vs float64 bench, best of {args.repeat}, "
          f"{os.cpu_count()} CPUs, torch {torch.__version__}, numpy {np.__version__}")
    print(f"{'standard':20s} {'ours (s)':>10s} {'msprobe (s)':>12s} {'speed-up':>9s}")
    ok = True
    for name in APIS:
        if theirs:
            speed = theirs[name] / ours[name]
            ok &= speed >= 5
            print(f"{name:20s} {ours[name]:10.3f} {theirs[name]:12.3f} {speed:8.1f}x")
        else:
            print(f"{name:20s} {ours[name]:10.3f} {'-':>12s} {'-':>9s}")
    if theirs:
        print("target (>= 5x on every standard):", "met" if ok else "NOT met")


if __name__ == "__main__":
    sys.exit(main())
