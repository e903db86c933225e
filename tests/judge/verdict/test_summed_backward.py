"""A backward that sums overlapping contributions is floating-point arithmetic: max_pool2d
with overlapping windows (kernel 3, stride 2, as in ResNet's stem), gather and
index_select with a repeated index, expand. Their tables' standard is binary consistency,
which called a correct float32 kernel's sums in another order an error ("this op must be
exact"); they are judged again as `<api>.summed` where the call's own backward sums
(judge/verdict/summed.py). A max_pool2d without overlap stays exact."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from pytest_msprobe.testing.dumpwriter import DumpWriter

SUMMED_LABEL = "sums overlapping contributions"
MAX_POOL2D = F.max_pool2d  # the correct kernel, kept while a planted fault stands in for it


def _calls(generator: torch.Generator) -> dict[str, tuple[Callable[..., torch.Tensor], list[object]]]:
    """call -> (function, arguments; the first is the input that gets a gradient)."""
    x = torch.randn(2, 4, 17, 17, generator=generator)
    index = torch.randint(0, 50, (800,), generator=generator)
    return {
        "Functional.max_pool2d.0": (MAX_POOL2D, [x, 3, 2, 1]),
        "Functional.max_pool2d.1": (MAX_POOL2D, [x, 2, 2]),
        "Torch.index_select.0": (torch.index_select, [torch.randn(50, 16, generator=generator), 0, index]),
        "Torch.gather.0": (
            torch.gather,
            [torch.randn(50, 16, generator=generator), 0, torch.randint(0, 50, (400, 16), generator=generator)],
        ),
        "Tensor.expand.0": (torch.Tensor.expand, [torch.randn(64, 1, generator=generator), 64, 300]),
    }


def summed_dump(
    root: Path,
    dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16),
    max_pool2d: Callable[..., torch.Tensor] = MAX_POOL2D,
) -> Path:
    """Each call in each dtype (the first numbered as named, the second from 10 on)."""
    writer = DumpWriter(root, "tensor")
    generator = torch.Generator().manual_seed(0)
    for offset, dtype in zip((0, 10), dtypes, strict=False):
        _write_calls(writer, generator, dtype, offset, max_pool2d)
    return writer.write()


def _write_calls(
    writer: DumpWriter,
    generator: torch.Generator,
    dtype: torch.dtype,
    offset: int,
    max_pool2d: Callable[..., torch.Tensor],
) -> None:
    for named, (function, args) in _calls(generator).items():
        api, number = named.rsplit(".", 1)
        call = f"{api}.{int(number) + offset}"
        x = args[0].to(dtype, copy=True).requires_grad_()  # type: ignore[union-attr]
        y = (max_pool2d if function is MAX_POOL2D else function)(x, *args[1:])
        upstream = torch.randn(y.shape, generator=generator).to(dtype)
        y.backward(upstream)
        writer.forward(call, [x.detach(), *args[1:]], {}, y.detach())
        writer.backward(call, [upstream], [x.grad])


class _DropsOne(torch.autograd.Function):
    """max_pool2d whose backward leaves out one contribution to an element that
    receives several (float32 only: the bench runs in float64)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, *pool: object) -> torch.Tensor:  # type: ignore[override]
        y, indices = MAX_POOL2D(x, *pool, return_indices=True)
        ctx.save_for_backward(indices)
        ctx.shape = x.shape
        return y

    @staticmethod
    def backward(ctx, g: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        (indices,) = ctx.saved_tensors
        flat_indices, flat_g = indices.flatten(2), g.flatten(2).clone()
        if g.dtype == torch.float32:
            counts = (
                torch.zeros(ctx.shape, dtype=g.dtype).flatten(2).scatter_add_(2, flat_indices, torch.ones_like(flat_g))
            )
            shared = (counts.gather(2, flat_indices) > 1).view(-1).nonzero()
            if shared.numel():  # windows that overlap
                flat_g.view(-1)[int(shared[0])] = 0
        grad = torch.zeros(ctx.shape, dtype=g.dtype).flatten(2).scatter_add_(2, flat_indices, flat_g)
        return (grad.reshape(ctx.shape), *([None] * 3))


def drops_one(x: torch.Tensor, *pool: object) -> torch.Tensor:
    return _DropsOne.apply(x, *pool)


@pytest.mark.parametrize("mode", [(), ("--msprobe-offline",)], ids=["single-run", "offline"])
def test_correct_summed_backwards_pass(mode: tuple[str, ...], tmp_path: Path, run_dump) -> None:
    result = run_dump(summed_dump(tmp_path / "dump"), "--msprobe-device=cpu", *mode)
    assert len(result.calls) == 20
    assert sorted(result.by_outcome("passed")) == sorted(result.calls)
    assert SUMMED_LABEL not in result.calls["Functional.max_pool2d.1.backward"].properties["msprobe_reference"]


@pytest.mark.parametrize("mode", [(), ("--msprobe-offline",)], ids=["single-run", "offline"])
def test_a_dropped_contribution_fails(
    mode: tuple[str, ...], tmp_path: Path, run_dump, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Planted: one of the overlapping contributions left out of a float32 max_pool2d
    gradient, on the device (single-run) or in the dumped gradient (offline)."""
    if mode:
        dump = summed_dump(tmp_path / "dump", (torch.float32,), drops_one)
    else:  # float32 only: the fault stands in for the bench's kernel too, which a bfloat16 call runs in float32
        dump = summed_dump(tmp_path / "dump", (torch.float32,))
        monkeypatch.setattr(F, "max_pool2d", drops_one)
    result = run_dump(dump, "--msprobe-device=cpu", *mode)
    assert sorted(result.by_outcome("failed")) == ["Functional.max_pool2d.0.backward"]
    assert SUMMED_LABEL in result.calls["Functional.max_pool2d.0.backward"].properties["msprobe_reference"]
