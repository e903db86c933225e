"""In-place calls replay on copies in both modes: a dunder (`__iadd__`), a method (`mul_`)
and an `inplace` argument by keyword or position (`relu(x, inplace=True)`, `hardtanh(x,
-1, 1, True)`). Their backward used to raise "a leaf Variable that requires grad is being
used in an in-place operation": on the device offline (an error), on the bench for the
`inplace` argument (a skip)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from dumpwriter import DumpWriter

# call -> (the call on a copy of its first argument, its other arguments, its kwargs)
CALLS: dict[str, tuple[Callable[..., torch.Tensor], tuple[object, ...], dict[str, object]]] = {
    "Tensor.__iadd__.0": (torch.Tensor.__iadd__, ("other",), {}),
    "Tensor.mul_.0": (torch.Tensor.mul_, ("other",), {}),
    "Functional.relu.0": (F.relu, (), {"inplace": True}),
    "Functional.hardtanh.0": (F.hardtanh, (-1.0, 1.0, True), {}),
}


def in_place_dump(root: Path, gradient_scale: float = 1.0) -> Path:
    """Each call on a copy of a leaf, as a model writes into an activation; the inputs
    recorded before the write (as msprobe does). `gradient_scale`: a planted fault in
    the dumped gradients of relu (offline, they are the device result)."""
    writer = DumpWriter(root, "tensor")
    generator = torch.Generator().manual_seed(3)
    for call, (function, extra, kwargs) in CALLS.items():
        x = (torch.randn(16, 32, generator=generator) * 2).requires_grad_()
        other = torch.randn(16, 32, generator=generator).requires_grad_()
        args = [other if item == "other" else item for item in extra]
        y = function(x.clone(), *args, **kwargs)
        upstream = torch.randn(16, 32, generator=generator)
        y.backward(upstream)
        writer.forward(call, [x.detach(), *(a.detach() if isinstance(a, torch.Tensor) else a for a in args)], kwargs, y.detach())
        grads = [x.grad] + [a.grad for a in args if isinstance(a, torch.Tensor)]
        scale = gradient_scale if call.startswith("Functional.relu") else 1.0
        writer.backward(call, [upstream], [g * scale for g in grads])
    return writer.write()


@pytest.mark.parametrize("mode", [(), ("--msprobe-offline",)], ids=["single-run", "offline"])
def test_in_place_calls_are_judged(mode: tuple[str, ...], tmp_path: Path, run_dump) -> None:
    result = run_dump(in_place_dump(tmp_path / "dump"), "--msprobe-device=cpu", *mode)
    assert sorted(result.by_outcome("passed")) == sorted(f"{call}.{d}" for call in CALLS for d in ("forward", "backward"))


def test_a_wrong_in_place_gradient_fails_offline(tmp_path: Path, run_dump) -> None:
    """Planted: relu(inplace=True)'s dumped input gradient 2**-10 too large."""
    result = run_dump(in_place_dump(tmp_path / "dump", 1 + 2**-10), "--msprobe-device=cpu", "--msprobe-offline")
    assert sorted(result.by_outcome("failed")) == ["Functional.relu.0.backward"]
