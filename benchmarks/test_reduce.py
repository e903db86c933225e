"""Time the reduction of one failing call (judge/reduce/reduction.py, --msprobe-bug-reports) for
calls of 1e4 and 1e5 input elements (--bench-full: 1e6 too): a bfloat16 add whose
dumped output is 2**-5 too large (offline: the dumped outputs sliced with the inputs),
and a bfloat16 matmul whose kernel is 2**-5 too large (online: patched into the device
side, the inner dimension cut too). Each round reduces from the original call, with
the default bounds (64 candidates, 60 s).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from benchmarks.support import Sizes
from pytest_msprobe.dump.index import parse_call_name, read_index
from pytest_msprobe.dump.tensor_dump import tensor_entry, write_tensor_dump
from pytest_msprobe.judge.check.call import Settings
from pytest_msprobe.judge.reduce.reduction import Plan, Reduction, reduce_call
from pytest_msprobe.run.devices import Backend
from pytest_msprobe.standards import Registry

pytestmark = pytest.mark.benchmark(group="reduce")

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


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("case", CASES)
def test_reduce(benchmark, sizes: Sizes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str, size: int) -> None:
    if size > 100_000 and not sizes.full:
        pytest.skip("1e6 elements: --bench-full")
    dump, call, offline = CASES[case](tmp_path / "dump", size)
    settings = Settings(Backend(), 0, 1 << 30, Registry.default(), offline=offline)
    name = parse_call_name(call)
    assert name is not None
    monkeypatch.setattr(torch, "matmul", _scaled(torch.matmul))  # the device's kernel; the bench runs in float32
    attempts = itertools.count()

    def reduce() -> Reduction:
        return reduce_call(read_index(dump), name, settings, tmp_path / f"out-{next(attempts)}", Plan())

    found = benchmark.pedantic(reduce, rounds=3, iterations=1)
    benchmark.extra_info.update(
        elements_before=found.elements_before,
        shape_before=str(found.before),
        elements_after=found.elements_after,
        shape_after=str(found.after),
        kept=f"{found.elements_after / found.elements_before:.2%}",
        candidates=found.tries,
        refused=found.refused,
    )
