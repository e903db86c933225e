"""Speed of each standard on 2**24 float32 elements vs a float64 bench, against msprobe.

Usage: python benchmarks/bench_standards.py [--n 16777216] [--repeat 5] [--warmup 3]
                                            [--first-repeat 3] [--no-first]
                                            [--msprobe-python PYTHON]
Both sides read the same arrays, saved once to .npy files and loaded by each process with
np.load. Two regimes, both reported, each on both sides:
  first touch   the FIRST call of the standard in a fresh process (ours: this venv's
                python; msprobe: its venv's), right after the arrays are loaded: what a
                one-off check pays (lazy imports and initialisation, the allocator and the
                kernel's page tables still cold). One fresh process per standard per side
                per round, --first-repeat rounds interleaved (ours, msprobe, next
                standard), best of them.
  steady state  in one persistent process per side, every standard first called
                --warmup times untimed (the arrays and the temporaries' memory already
                touched, the code warm: msprobe needs ~3 calls to settle, measured 1.2-3.6
                s, 0.3-1.5 s, 0.2-0.6 s, then flat), then --repeat rounds INTERLEAVED
                (ours alone, ours full, msprobe, per standard per round) so that both see
                the same machine load; best of --repeat.
Columns:
  alone    the standard by itself, as msprobe's per-standard class computes it: the pair
           is built from the tensors and the standard's function called (its metrics,
           verdict and worst elements; no legacy metrics)
  full     `Registry.check`, the public path: the standard plus the legacy metrics
           (cosine, max_abs_err, hundredth/thousandth/ten-thousandth shares) every
           floating verdict carries
  msprobe  mindstudio-probe's own precision_standard class for the standard, plus the
           rel_err that run_ut computes before calling it, in its own venv
Target: alone >= 5x faster than msprobe on every standard IN STEADY STATE
(reported with the first-touch and full-check factors too). Also: the per-call cost of
`check` on a tiny (3-element) output, the plugin's common case. If the msprobe venv is
absent, msprobe is skipped.

With a reference (second table; `--reference-only` runs just it; steady state, warmed up
as above): the benchmark and ulp standards judged by ratios to (a) a baseline's recorded
metrics {path: {metric: value}} and (b) a reference output (another implementation's
float32 output on the same inputs, whose metrics are computed against the same bench),
best of --repeat, interleaved with msprobe's class for the standard (which computes one
device's metrics: (a) is the like-for-like comparison; (b) computes the metrics of two
outputs). Columns:
  alone    the pair built and the standard called with a `Reference` (as above)
  full     `Registry.check(..., reference=...)`: plus the legacy metrics
  plain    `full` with the fused path switched off (fast.FAST_MIN_N raised): metrics.Pair
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import numpy as np
import torch

from pytest_msprobe.standards import Registry, fast
from pytest_msprobe.standards.dtypes import dtype_info
from pytest_msprobe.standards.pairing import pair_leaves
from pytest_msprobe.standards.reference import Reference
from pytest_msprobe.standards.registry import _make_pair

# api routed to each standard in the shipped tables
APIS = {
    "binary_consistency": "relu",
    "absolute_threshold": "add",
    "ulp": "matmul",
    "thousandth": "conv2d",
    "accumulative_error": "cumsum",
    "benchmark": "exp",
}

MSPROBE_SCRIPT = r"""
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
b = np.load(sys.argv[1]); d = np.load(sys.argv[2])
classes = {"binary_consistency": BinaryCompare, "absolute_threshold": AbsolutethdCompare,
           "ulp": UlpCompare, "thousandth": ThousandthStdCompare,
           "accumulative_error": AccumulativeErrorCompare, "benchmark": BenchmarkCompare}


def one(name):
    t = time.perf_counter()
    # what run_ut does per output before calling the standard
    _, abs_bench_with_eps = get_abs_bench_with_eps(b, torch.float32)
    rel = get_rel_err_origin(get_abs_err(b, d), abs_bench_with_eps)
    classes[name](CompareInput(b, d, CompareColumn(), torch.float32, rel)).compare()
    return time.perf_counter() - t


if len(sys.argv) > 3:                 # first touch: one call in this fresh process
    print(json.dumps({sys.argv[3]: one(sys.argv[3])}), flush=True)
    sys.exit(0)
print("ready", flush=True)
for line in sys.stdin:
    name = line.strip()
    if not name:
        break
    print(json.dumps({name: one(name)}), flush=True)
"""


@dataclass(frozen=True)
class _Tensors:
    """The tensors main made once: the float64 bench, the float32 device output and
    another implementation's float32 output (the reference)."""

    bench: torch.Tensor
    device: torch.Tensor
    reference: torch.Tensor


def _alone(reg: Registry, name: str, bench: torch.Tensor, device: torch.Tensor):
    """The standard by itself: build the pair from the tensors, call the standard (with
    the thresholds of the API routed to it: APIS)."""
    leaf = next(pair_leaves(bench, device))
    pair = _make_pair(leaf, dtype_info(leaf.device_dtype))
    return reg.standards[name](pair, reg.thresholds_for(APIS[name], leaf.device_dtype), None)


def _alone_ref(reg: Registry, name: str, bench, device, reference):
    """The standard by itself with a reference: a baseline's metrics or an output."""
    leaf = next(pair_leaves(bench, device))
    pair = _make_pair(leaf, dtype_info(leaf.device_dtype))
    if isinstance(reference, dict):
        ref = Reference("baseline", metrics=reference[""])
    else:
        rleaf = next(pair_leaves(bench, reference))
        ref = Reference("reference", pair=_make_pair(rleaf, dtype_info(rleaf.device_dtype)))
    return reg.standards[name](pair, reg.thresholds_for(APIS[name], leaf.device_dtype), ref)


def _plain_check(reg: Registry, bench, device, api, reference):
    """`check` with the fused path off: the plain path (metrics.Pair)."""
    saved = fast.FAST_MIN_N
    fast.FAST_MIN_N = 1 << 62
    try:
        return reg.check(bench, device, api=api, reference=reference)
    finally:
        fast.FAST_MIN_N = saved


REF_STANDARDS = ("benchmark", "ulp")


def _reference_table(args, reg, tensors: _Tensors, theirs) -> None:
    """Benchmark and ulp with (a) a baseline's metrics, (b) a reference output."""
    bench_t, device_t, ref_t = tensors.bench, tensors.device, tensors.reference
    refs = {}
    for name in REF_STANDARDS:
        base = {"": dict(reg.check(bench_t, ref_t, api=APIS[name]).metrics)}
        refs[name] = {"a": base, "b": ref_t}
    cols = ("a alone", "a full", "a plain", "b alone", "b full", "b plain", "msprobe")
    times = {name: {c: [] for c in cols} for name in REF_STANDARDS}
    statuses: dict = {}
    for _ in range(args.warmup):  # steady state: ours warmed up like msprobe's
        for name in REF_STANDARDS:
            for k in ("a", "b"):
                _alone_ref(reg, name, bench_t, device_t, refs[name][k])
                reg.check(bench_t, device_t, api=APIS[name], reference=refs[name][k])
    load_before = os.getloadavg()
    for _ in range(args.repeat):
        for name in REF_STANDARDS:
            api = APIS[name]
            for k in ("a", "b"):
                r = refs[name][k]
                times[name][f"{k} alone"].append(
                    _timed(
                        lambda name=name, k=k, api=api, r=r: statuses.__setitem__(
                            (name, k), _alone_ref(reg, name, bench_t, device_t, r).status
                        )
                    )
                )
                times[name][f"{k} full"].append(
                    _timed(lambda api=api, r=r: reg.check(bench_t, device_t, api=api, reference=r))
                )
                times[name][f"{k} plain"].append(
                    _timed(lambda api=api, r=r: _plain_check(reg, bench_t, device_t, api, r))
                )
            if theirs is not None:
                times[name]["msprobe"].append(theirs(name))
    load_after = os.getloadavg()
    print()
    print(
        f"with a reference: (a) a baseline's metrics, (b) a reference float32 output; "
        f"steady state ({args.warmup} untimed calls first), best of {args.repeat} "
        f"(interleaved)"
    )
    print(
        f"load average (1/5/15 min) before {', '.join(f'{x:.2f}' for x in load_before)}; after {', '.join(f'{x:.2f}' for x in load_after)}"
    )
    print(
        f"{'standard':12s} {'verdict a/b':>11s} "
        + " ".join(f"{c:>8s}" for c in cols)
        + f" {'a alone x':>9s} {'a full x':>8s} {'b full x':>8s}"
    )
    for name in REF_STANDARDS:
        t = {c: min(v) if v else float("nan") for c, v in times[name].items()}
        st = f"{statuses[(name, 'a')]}/{statuses[(name, 'b')]}"
        m = t["msprobe"]
        print(
            f"{name:12s} {st:>11s} "
            + " ".join(f"{t[c]:8.4f}" for c in cols)
            + f" {m / t['a alone']:8.1f}x {m / t['a full']:7.1f}x {m / t['b full']:7.1f}x"
        )


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _tiny_cost(reg: Registry, calls: int = 2000) -> dict:
    """Seconds per `check` call on a 3-element output, best of 5 batches."""
    b = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    d = torch.tensor([1.0, 2.0, 3.0])
    out = {}
    for name, api in APIS.items():
        reg.check(b, d, api=api)
        best = min(_timed(lambda api=api: [reg.check(b, d, api=api) for _ in range(calls // 5)]) for _ in range(5))
        out[name] = best / (calls // 5)
    return out


def _first_child(name: str, bench_path: str, device_path: str) -> None:
    """First touch, ours: one call of the standard in this fresh process."""
    reg = Registry.default()
    bench_t = torch.from_numpy(np.load(bench_path))
    device_t = torch.from_numpy(np.load(device_path))
    t = _timed(lambda: _alone(reg, name, bench_t, device_t))
    print(json.dumps({name: t}), flush=True)


def _first_touch(args, bp: str, dp: str, with_msprobe: bool) -> dict:
    """{standard: {"ours": [s...], "msprobe": [s...]}}: a fresh process per call."""
    out = {name: {"ours": [], "msprobe": []} for name in APIS}
    for _ in range(args.first_repeat):
        for name in APIS:
            res = subprocess.run(
                [sys.executable, os.path.abspath(__file__), "--first-child", name, bp, dp],
                capture_output=True,
                text=True,
                check=True,
            )
            out[name]["ours"].append(json.loads(res.stdout.strip().splitlines()[-1])[name])
            if with_msprobe:
                res = subprocess.run(
                    [args.msprobe_python, "-c", MSPROBE_SCRIPT, bp, dp, name],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                out[name]["msprobe"].append(json.loads(res.stdout.strip().splitlines()[-1])[name])
    return out


def _arguments() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2**24)
    ap.add_argument("--repeat", type=int, default=5, help="steady state: timed rounds")
    ap.add_argument(
        "--warmup", type=int, default=3, help="steady state: untimed calls of every standard on each side first"
    )
    ap.add_argument("--first-repeat", type=int, default=3, help="first touch: fresh processes per standard per side")
    ap.add_argument("--no-first", action="store_true", help="skip the first-touch table")
    ap.add_argument(
        "--msprobe-python",
        default=os.environ.get("MSPROBE_PYTHON", ""),
        help="msprobe's venv python (default: $MSPROBE_PYTHON; unset: msprobe is not run)",
    )
    ap.add_argument("--reference-only", action="store_true", help="only the with-a-reference table (benchmark and ulp)")
    ap.add_argument("--first-child", nargs=3, help=argparse.SUPPRESS)
    return ap.parse_args()


class _Msprobe:
    """msprobe's persistent process of the steady state: a standard's name in, its
    seconds out."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc

    @classmethod
    def start(cls, python: str, bp: str, dp: str) -> _Msprobe | None:
        """The process, once it said it is ready; None (and why, printed) where it did not."""
        proc = subprocess.Popen(
            [python, "-c", MSPROBE_SCRIPT, bp, dp],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        if proc.stdout.readline().strip() != "ready":
            print("msprobe start failed: msprobe timings skipped")
            return None
        return cls(proc)

    def __call__(self, name: str) -> float:
        self.proc.stdin.write(name + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())[name]

    def close(self) -> None:
        self.proc.stdin.write("\n")
        self.proc.stdin.close()
        self.proc.wait()


@dataclass(frozen=True)
class _Steady:
    """The steady state's timed rounds: seconds per standard and column, each standard's
    verdict, and the load average around the rounds."""

    times: dict[str, dict[str, list[float]]]
    statuses: dict[str, str]
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float] = (0.0, 0.0, 0.0)


def main() -> None:
    args = _arguments()
    if args.first_child:
        return _first_child(*args.first_child)
    rng = np.random.default_rng(0)
    bench = rng.standard_normal(args.n) * 10.0
    device = (bench * (1 + rng.standard_normal(args.n) * 2**-24)).astype(np.float32)
    # another implementation's output: the same kind of rounding noise
    ref = (bench * (1 + rng.standard_normal(args.n) * 2**-24)).astype(np.float32)
    reg = Registry.default()
    have_msprobe = bool(args.msprobe_python) and os.path.exists(args.msprobe_python)
    if not have_msprobe:
        print(f"msprobe's python not found ({args.msprobe_python or 'MSPROBE_PYTHON unset'}): msprobe skipped")
    with tempfile.TemporaryDirectory() as tmp:
        bp, dp = os.path.join(tmp, "b.npy"), os.path.join(tmp, "d.npy")
        np.save(bp, bench)
        np.save(dp, device)
        del bench, device
        first = None
        load_first = os.getloadavg()
        if not (args.no_first or args.reference_only):
            first = _first_touch(args, bp, dp, have_msprobe)
        # the same provenance on both sides: loaded from the files
        tensors = _Tensors(torch.from_numpy(np.load(bp)), torch.from_numpy(np.load(dp)), torch.from_numpy(ref))
        theirs = _Msprobe.start(args.msprobe_python, bp, dp) if have_msprobe else None
        steady = _steady_state(args, reg, tensors, theirs)
        if theirs is not None:
            theirs.close()
    if args.reference_only:
        return
    tiny = _tiny_cost(reg)
    print(
        f"n = {args.n} float32 elements vs float64 bench, {os.cpu_count()} CPUs, torch {torch.__version__}, numpy {np.__version__}"
    )
    if first is not None:
        _print_first_touch(args, first, load_first)
    _print_steady_state(args, steady)
    print(
        "tiny output (3 elements), check() per call: "
        + ", ".join(f"{name} {sec * 1e6:.0f} us" for name, sec in tiny.items())
    )


def _steady_state(args, reg: Registry, tensors: _Tensors, theirs: _Msprobe | None) -> _Steady:
    """Every standard called --warmup times on each side, untimed, then --repeat rounds
    interleaved (ours alone, ours full, msprobe), and the with-a-reference table (alone
    with --reference-only)."""
    for _ in range(args.warmup):
        for name, api in APIS.items():
            if not args.reference_only:
                _alone(reg, name, tensors.bench, tensors.device)
                reg.check(tensors.bench, tensors.device, api=api)
            if theirs is not None:
                theirs(name)
    steady = _Steady({name: {"alone": [], "full": [], "msprobe": []} for name in APIS}, {}, os.getloadavg())
    if args.reference_only:
        _reference_table(args, reg, tensors, theirs)
    for _ in range(0 if args.reference_only else args.repeat):
        for name, api in APIS.items():
            _timed_round(reg, name, api, tensors, steady)
            if theirs is not None:
                steady.times[name]["msprobe"].append(theirs(name))
    steady = dataclasses.replace(steady, load_after=os.getloadavg())
    if not args.reference_only:
        _reference_table(args, reg, tensors, theirs)
    return steady


def _timed_round(reg: Registry, name: str, api: str, tensors: _Tensors, steady: _Steady) -> None:
    """One round of ours on one standard: alone (its verdict kept), then the full check."""
    assert reg.standard_for(api, torch.float32) == name
    bench_t, device_t = tensors.bench, tensors.device
    steady.times[name]["alone"].append(
        _timed(lambda: steady.statuses.__setitem__(name, _alone(reg, name, bench_t, device_t).status))
    )
    steady.times[name]["full"].append(_timed(lambda: reg.check(bench_t, device_t, api=api)))


def _fmt(xs, p=2) -> str:
    return ", ".join(f"{x:.{p}f}" for x in xs)


def _print_first_touch(args, first: dict, load_first) -> None:
    print(
        f"\nFIRST TOUCH: the first call in a fresh process, best of {args.first_repeat} "
        f"processes per side (load average before {_fmt(load_first)})"
    )
    print(f"{'standard':20s} {'ours alone (s)':>15s} {'msprobe (s)':>12s} {'alone x':>8s}   all ours / all msprobe")
    for name in APIS:
        o, m = min(first[name]["ours"]), (min(first[name]["msprobe"]) if first[name]["msprobe"] else float("nan"))
        print(
            f"{name:20s} {o:15.4f} {m:12.4f} {m / o:7.1f}x   {_fmt(first[name]['ours'], 4)} / {_fmt(first[name]['msprobe'], 3)}"
        )


def _print_steady_state(args, steady: _Steady) -> None:
    times, statuses = steady.times, steady.statuses
    print(
        f"\nSTEADY STATE: {args.warmup} untimed calls of every standard on each side, then best of {args.repeat} (interleaved)"
    )
    print(f"load average (1/5/15 min) before {_fmt(steady.load_before)}; after {_fmt(steady.load_after)}")
    print(
        f"{'standard':20s} {'verdict':>7s} {'alone (s)':>10s} {'full (s)':>9s} {'msprobe (s)':>12s} {'alone x':>8s} {'full x':>7s}"
    )
    ok = True
    for name in APIS:
        t = {k: min(v) if v else float("nan") for k, v in times[name].items()}
        if times[name]["msprobe"]:
            fa, ff = t["msprobe"] / t["alone"], t["msprobe"] / t["full"]
            ok &= fa >= 5
            print(
                f"{name:20s} {statuses[name]:>7s} {t['alone']:10.4f} {t['full']:9.4f} {t['msprobe']:12.4f} {fa:7.1f}x {ff:6.1f}x"
            )
        else:
            print(f"{name:20s} {statuses[name]:>7s} {t['alone']:10.4f} {t['full']:9.4f} {'-':>12s} {'-':>8s} {'-':>7s}")
    if any(times[name]["msprobe"] for name in APIS):
        print(
            "target (steady state, standard alone >= 5x faster than msprobe on every standard):",
            "met" if ok else "NOT met",
        )


if __name__ == "__main__":
    sys.exit(main())
