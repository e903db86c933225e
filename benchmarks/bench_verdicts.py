"""Cost of the conditioned verdicts and bias tests against the code before them.

Usage: python benchmarks/bench_verdicts.py --before REV --dump DIR/dump.json [--repeat 3] [--offline] [--skip-output]

REV is checked out into a temporary git worktree and imported from there (its own
standards and plugin, with this venv's torch), so both sides run on the same machine in
the same run, interleaved, best of --repeat:
  dump     the plugin on a real dump with the CPU as device (-n 0): the time of the test
           phase from the plugin's summary ("N run here in X s"), per call
  output   `check()` on one 2**24-element float32 output against a float64 bench, per
           standard (the API routed to it), correct device output (the common case: the
           cheap verdict passes and nothing more is computed)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from pytest_msprobe.testing.commands import plugin_command

ROOT = Path(__file__).resolve().parents[1]
APIS = {
    "absolute_threshold": "mul",
    "ulp": "matmul",
    "thousandth": "conv2d",
    "benchmark": "exp",
    "accumulative_error": "cumsum",
    "binary_consistency": "relu",
}

OUTPUT_SCRIPT = r"""
import json, sys, time
import torch
from pytest_msprobe.standards import check
torch.manual_seed(0)
n = int(sys.argv[1]); repeat = int(sys.argv[2]); apis = json.loads(sys.argv[3])
x = torch.randn(n)
bench = (x.double() * 1.0001)
device = bench.float()
out = {}
for standard, api in apis.items():
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        check(bench, device, api=api)
        best = min(best, time.perf_counter() - start)
    out[standard] = best
print(json.dumps(out))
"""


def worktree(rev: str) -> Path:
    """REV in a worktree, its standards and bench_functions reachable as installed."""
    folder = Path(tempfile.mkdtemp(prefix="msprobe-before-"))
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(folder), rev], check=True, capture_output=True
    )
    for package in ("standards", "bench_functions"):
        (folder / "pytest_msprobe" / package).symlink_to(folder / package)
    return folder


def _env(tree: Path | None) -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    return env


def _dump_seconds(tree: Path | None, dump: Path, out: Path, extra: list[str]) -> tuple[float, int]:
    result = subprocess.run(
        plugin_command(dump, out, "--rootdir", str(dump.parent), "-c", os.devnull, *extra),
        cwd=dump.parent,
        env=_env(tree),
        capture_output=True,
        text=True,
    )
    match = re.search(r"(\d+) run here in ([0-9.]+) s", result.stdout)
    if match is None:
        raise RuntimeError(result.stdout[-2000:] + result.stderr[-2000:])
    return float(match.group(2)), int(match.group(1))


def _output_seconds(tree: Path | None, n: int, repeat: int) -> dict[str, float]:
    result = subprocess.run(
        [sys.executable, "-c", OUTPUT_SCRIPT, str(n), str(repeat), json.dumps(APIS)],
        env=_env(tree),
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(result.stdout)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", required=True)
    parser.add_argument("--dump", type=Path, required=True)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--n", type=int, default=2**24)
    parser.add_argument(
        "--offline",
        dest="plugin_args",
        action="store_const",
        const=["--msprobe-offline"],
        default=[],
        help="the dump's own outputs as the device (--msprobe-offline)",
    )
    parser.add_argument("--skip-output", action="store_true", help="only the dump")
    args = parser.parse_args()
    tree = worktree(args.before)
    try:
        with tempfile.TemporaryDirectory() as out:
            dump = {"before": [], "after": []}
            for _ in range(args.repeat):
                for side, where in (("before", tree), ("after", None)):
                    dump[side].append(_dump_seconds(where, args.dump.resolve(), Path(out) / side, args.plugin_args))
            calls = dump["after"][0][1]
            print(f"dump {args.dump} ({calls} calls), test phase, best of {args.repeat}:")
            best = {side: min(seconds for seconds, _ in runs) for side, runs in dump.items()}
            for side in ("before", "after"):
                print(f"  {side:7s} {best[side]:.2f} s  {1000 * best[side] / calls:.2f} ms per call")
            print(f"  after / before: {best['after'] / best['before']:.3f}")
        if args.skip_output:
            return
        outputs = {"before": [], "after": []}
        for _ in range(args.repeat):
            for side, where in (("before", tree), ("after", None)):
                outputs[side].append(_output_seconds(where, args.n, 1))
        print(f"one {args.n}-element float32 output, check(), best of {args.repeat}:")
        for standard in APIS:
            before = min(run[standard] for run in outputs["before"])
            after = min(run[standard] for run in outputs["after"])
            print(f"  {standard:20s} before {before:.3f} s  after {after:.3f} s  after/before {after / before:.3f}")
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], capture_output=True)


if __name__ == "__main__":
    main()
