"""Speed of each standard on 2**20 (--bench-full: 2**24) float32 elements against a
float64 bench, against msprobe's own class for the standard.

Both sides read the same arrays, saved once to .npy files and loaded with np.load.
Two regimes:
  first touch   the FIRST call of the standard in a fresh process (ours: this venv's
                python; msprobe: $MSPROBE_PYTHON's), right after the arrays are loaded:
                what a one-off check pays (lazy imports and initialisation, cold
                memory); the number is the call's time as the process reports it
  steady state  in one persistent process per side, 3 untimed calls first (msprobe needs
                ~3 calls to settle), then the timed rounds
Benchmarks (steady state unless said):
  alone    the standard by itself, as msprobe's per-standard class computes it: the pair
           built from the tensors and the standard's function called (its metrics,
           verdict and worst elements; no legacy metrics)
  full     `Registry.check`, the public path: the standard plus the legacy metrics
           every floating verdict carries; a correct device output, the common case
  msprobe  mindstudio-probe's precision_standard class for the standard, plus the
           rel_err that run_ut computes before calling it (its reported seconds)
  tiny     `check` on a 3-element output, the plugin's common case (per call)
  reference  benchmark and ulp judged by ratios to (a) a baseline's recorded metrics
           and (b) a reference output (another implementation's float32 output):
           alone, full, and plain (full with the fused path off: metrics.Pair)
Target: alone >= 5x faster than msprobe on every standard in steady state.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from benchmarks.support import ROOT, ReportedClock, Sizes
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
WARMUP, ROUNDS = 2, 3  # steady state: untimed calls first, then the timed rounds
clock = ReportedClock()

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


FIRST_CALL = r"""
import json, sys, time
import numpy as np, torch
from benchmarks.test_standards import Registry, _alone
name, bench, device = sys.argv[1], torch.from_numpy(np.load(sys.argv[2])), torch.from_numpy(np.load(sys.argv[3]))
reg = Registry.default()
started = time.perf_counter()
_alone(reg, name, bench, device)
print(json.dumps({name: time.perf_counter() - started}))
"""


@dataclass(frozen=True)
class Arrays:
    """The float64 bench and the float32 device output, as tensors and as .npy files;
    another implementation's float32 output (the reference)."""

    bench: torch.Tensor
    device: torch.Tensor
    reference: torch.Tensor
    bench_file: Path
    device_file: Path


@pytest.fixture(scope="module")
def arrays(sizes: Sizes, tmp_path_factory: pytest.TempPathFactory) -> Arrays:
    n = sizes(2**20, 2**24)
    rng = np.random.default_rng(0)
    bench = rng.standard_normal(n) * 10.0
    device = (bench * (1 + rng.standard_normal(n) * 2**-24)).astype(np.float32)
    reference = (bench * (1 + rng.standard_normal(n) * 2**-24)).astype(np.float32)
    folder = tmp_path_factory.mktemp("standards")
    np.save(folder / "b.npy", bench)
    np.save(folder / "d.npy", device)
    loaded = (torch.from_numpy(np.load(folder / name)) for name in ("b.npy", "d.npy"))
    return Arrays(*loaded, torch.from_numpy(reference), folder / "b.npy", folder / "d.npy")


@pytest.fixture(scope="module")
def registry() -> Registry:
    return Registry.default()


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


@pytest.mark.benchmark(group="standards: alone")
@pytest.mark.parametrize("name", APIS)
def test_alone(benchmark, registry: Registry, arrays: Arrays, name: str) -> None:
    verdict = benchmark.pedantic(
        _alone, args=(registry, name, arrays.bench, arrays.device), rounds=ROUNDS, warmup_rounds=WARMUP, iterations=1
    )
    benchmark.extra_info.update(elements=arrays.device.numel(), verdict=verdict.status)


@pytest.mark.benchmark(group="standards: full check")
@pytest.mark.parametrize("name", APIS)
def test_full(benchmark, registry: Registry, arrays: Arrays, name: str) -> None:
    assert registry.standard_for(APIS[name], torch.float32) == name
    args = (arrays.bench, arrays.device)
    benchmark.pedantic(
        registry.check, args=args, kwargs={"api": APIS[name]}, rounds=ROUNDS, warmup_rounds=WARMUP, iterations=1
    )
    benchmark.extra_info["elements"] = arrays.device.numel()


@pytest.fixture(scope="module")
def msprobe(msprobe_python: Path, arrays: Arrays) -> Iterator[subprocess.Popen[str]]:
    """msprobe's persistent process of the steady state: a standard's name in, its
    seconds out."""
    command = [str(msprobe_python), "-c", MSPROBE_SCRIPT, str(arrays.bench_file), str(arrays.device_file)]
    process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert process.stdin is not None and process.stdout is not None
    if process.stdout.readline().strip() != "ready":
        pytest.skip("msprobe's standards did not start in MSPROBE_PYTHON")
    yield process
    process.stdin.write("\n")
    process.stdin.close()
    process.wait()


@pytest.mark.benchmark(group="standards: msprobe", timer=clock)
@pytest.mark.parametrize("name", APIS)
def test_msprobe(benchmark, msprobe: subprocess.Popen[str], name: str) -> None:
    assert msprobe.stdin is not None and msprobe.stdout is not None
    stdin, stdout = msprobe.stdin, msprobe.stdout

    def one() -> None:
        stdin.write(name + "\n")
        stdin.flush()
        clock.add(json.loads(stdout.readline())[name])

    benchmark.pedantic(one, rounds=ROUNDS, warmup_rounds=WARMUP, iterations=1)


@pytest.mark.benchmark(group="standards: first touch", timer=clock)
@pytest.mark.parametrize("side", ["ours", "msprobe"])
@pytest.mark.parametrize("name", APIS)
def test_first_touch(benchmark, request: pytest.FixtureRequest, arrays: Arrays, name: str, side: str) -> None:
    files = [str(arrays.bench_file), str(arrays.device_file)]
    if side == "ours":
        command = [sys.executable, "-c", FIRST_CALL, name, *files]
    else:
        python = request.getfixturevalue("msprobe_python")
        command = [str(python), "-c", MSPROBE_SCRIPT, *files, name]

    def fresh() -> None:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True)
        clock.add(json.loads(done.stdout.strip().splitlines()[-1])[name])

    benchmark.pedantic(fresh, rounds=2, iterations=1)


@pytest.mark.benchmark(group="standards: tiny output")
@pytest.mark.parametrize("name", APIS)
def test_tiny(benchmark, registry: Registry, name: str) -> None:
    bench, device = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64), torch.tensor([1.0, 2.0, 3.0])
    benchmark.pedantic(
        registry.check, args=(bench, device), kwargs={"api": APIS[name]}, rounds=5, warmup_rounds=1, iterations=400
    )


def _plain_check(reg: Registry, bench: torch.Tensor, device: torch.Tensor, api: str, reference: object) -> object:
    """`check` with the fused path off: the plain path (metrics.Pair)."""
    saved = fast.FAST_MIN_N
    fast.FAST_MIN_N = 1 << 62
    try:
        return reg.check(bench, device, api=api, reference=reference)
    finally:
        fast.FAST_MIN_N = saved


@pytest.mark.benchmark(group="standards: with a reference")
@pytest.mark.parametrize("path", ["alone", "full", "plain"])
@pytest.mark.parametrize("kind", ["a baseline", "b output"])
@pytest.mark.parametrize("name", ["benchmark", "ulp"])
def test_reference(benchmark, registry: Registry, arrays: Arrays, name: str, kind: str, path: str) -> None:
    api = APIS[name]
    reference: object = arrays.reference
    if kind == "a baseline":
        reference = {"": dict(registry.check(arrays.bench, arrays.reference, api=api).metrics)}
    functions = {
        "alone": lambda: _alone_ref(registry, name, arrays.bench, arrays.device, reference),
        "full": lambda: registry.check(arrays.bench, arrays.device, api=api, reference=reference),
        "plain": lambda: _plain_check(registry, arrays.bench, arrays.device, api, reference),
    }
    benchmark.pedantic(functions[path], rounds=ROUNDS, warmup_rounds=WARMUP, iterations=1)
