"""Time the reduction of one failing call (judge/reduce/reduction.py, --msprobe-bug-reports) for
calls of 1e4, 1e5 and 1e6 input elements: a bfloat16 add whose dumped output is 2**-5
too large (offline: the dumped outputs sliced with the inputs), and a bfloat16 matmul
whose kernel is 2**-5 too large (online: patched into the device side, the inner
dimension cut too). Best of --repeat runs, each from the original call; the table
(markdown) goes to stdout and to --out.

    python benchmarks/bench_reduce.py --out benchmarks/RESULTS-reduce-time.md
"""

from __future__ import annotations

import argparse
import math
import platform
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from pytest_msprobe.dump.index import parse_call_name, read_index
from pytest_msprobe.dump.tensor_dump import tensor_entry, write_tensor_dump
from pytest_msprobe.judge.check.call import Settings
from pytest_msprobe.judge.reduce.reduction import Plan, Reduction, reduce_call
from pytest_msprobe.run.devices import Backend
from pytest_msprobe.standards import Registry

SIZES = (10_000, 100_000, 1_000_000)
FACTOR = 1 + 2**-5
BF16 = torch.bfloat16


def _dump(folder: Path, call: str, inputs: list[torch.Tensor], output: torch.Tensor) -> Path:
    names = [f"{call}.forward.input.{i}.pt" for i in range(len(inputs))]
    record = {
        "input_args": [tensor_entry(tensor, name) for tensor, name in zip(inputs, names, strict=True)],
        "input_kwargs": {},
        "output": [tensor_entry(output, f"{call}.forward.output.0.pt")],
    }
    tensors = {**dict(zip(names, inputs, strict=True)), f"{call}.forward.output.0.pt": output}
    return write_tensor_dump(folder, {f"{call}.forward": record}, tensors)


def elementwise(folder: Path, size: int) -> tuple[Path, str, bool]:
    """An add of two (rows, 1000) operands, its dumped output scaled: size elements in all."""
    generator = torch.Generator().manual_seed(0)
    columns = 1000 if size >= 100_000 else 100
    rows = size // (2 * columns)
    a, b = (torch.randn(rows, columns, generator=generator).to(BF16) for _ in range(2))
    output = ((a + b).float() * FACTOR).to(BF16)
    return _dump(folder, "Tensor.__add__.0", [a, b], output), "Tensor.__add__.0.forward", True


def matmul(folder: Path, size: int) -> tuple[Path, str, bool]:
    """A square matmul of two (k, k) operands, 2 k**2 = size, replayed on a scaled kernel."""
    generator = torch.Generator().manual_seed(1)
    k = round(math.sqrt(size / 2))
    a, b = (torch.randn(k, k, generator=generator).to(BF16) for _ in range(2))
    return _dump(folder, "Torch.matmul.0", [a, b], torch.matmul(a, b)), "Torch.matmul.0.forward", False


CASES: dict[str, Callable[[Path, int], tuple[Path, str, bool]]] = {"elementwise": elementwise, "matmul": matmul}


def _scaled(function: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def faulty(*args: torch.Tensor, **kwargs: object) -> torch.Tensor:
        out = function(*args, **kwargs)
        return out * FACTOR if out.dtype == BF16 else out

    return faulty


def measure(case: str, size: int, repeat: int, scratch: Path) -> tuple[float, Reduction]:
    dump, call, offline = CASES[case](scratch / f"{case}-{size}", size)
    settings = Settings(Backend(), 0, 1 << 30, Registry.default(), offline=offline)
    name = parse_call_name(call)
    assert name is not None
    original = torch.matmul
    torch.matmul = _scaled(original)  # the device's kernel; the bench runs in float32
    try:
        best, found = math.inf, None
        for attempt in range(repeat):
            started = time.perf_counter()
            found = reduce_call(read_index(dump), name, settings, scratch / f"out-{case}-{size}-{attempt}", Plan())
            best = min(best, time.perf_counter() - started)
    finally:
        torch.matmul = original
    assert found is not None
    return best, found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per size; the best is kept (default 3)")
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES), help="input elements per call")
    parser.add_argument("--out", type=Path, help="also write the markdown table here")
    args = parser.parse_args()
    rows = [
        f"| call | input elements | reduced to | kept | candidates judged (refused) | seconds, best of {args.repeat} |",
        "|---|---|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory() as scratch:
        for case in CASES:
            for size in args.sizes:
                seconds, found = measure(case, size, args.repeat, Path(scratch))
                rows.append(
                    f"| {case} | {found.elements_before} ({found.before}) | {found.elements_after} ({found.after}) | "
                    f"{found.elements_after / found.elements_before:.2%} | {found.tries} ({found.refused}) | {seconds:.2f} |"
                )
                print(rows[-1], flush=True)
    head = (
        f"# Reduction time of one failing call (benchmarks/bench_reduce.py)\n\n"
        f"torch {torch.__version__}, {platform.processor() or platform.machine()}, "
        f"{torch.get_num_threads()} threads; the default bounds (64 candidates, 60 s).\n\n"
    )
    text = head + "\n".join(rows) + "\n"
    print(text)
    if args.out is not None:
        args.out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
