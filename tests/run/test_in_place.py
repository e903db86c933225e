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

from pytest_msprobe.testing.dumpwriter import DumpWriter

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
        writer.forward(
            call, [x.detach(), *(a.detach() if isinstance(a, torch.Tensor) else a for a in args)], kwargs, y.detach()
        )
        grads = [x.grad] + [a.grad for a in args if isinstance(a, torch.Tensor)]
        scale = gradient_scale if call.startswith("Functional.relu") else 1.0
        writer.backward(call, [upstream], [g * scale for g in grads])
    return writer.write()


@pytest.mark.parametrize("mode", [(), ("--msprobe-offline",)], ids=["single-run", "offline"])
def test_in_place_calls_are_judged(mode: tuple[str, ...], tmp_path: Path, run_dump) -> None:
    result = run_dump(in_place_dump(tmp_path / "dump"), "--msprobe-device=cpu", *mode)
    assert sorted(result.by_outcome("passed")) == sorted(
        f"{call}.{d}" for call in CALLS for d in ("forward", "backward")
    )


def test_a_wrong_in_place_gradient_fails_offline(tmp_path: Path, run_dump) -> None:
    """Planted: relu(inplace=True)'s dumped input gradient 2**-10 too large."""
    result = run_dump(in_place_dump(tmp_path / "dump", 1 + 2**-10), "--msprobe-device=cpu", "--msprobe-offline")
    assert sorted(result.by_outcome("failed")) == ["Functional.relu.0.backward"]


def module_hooked_relu_dump(root: Path, faulty: bool = False) -> Path:
    """`relu(inplace=True)` on the output of a dumped `__mul__`, recorded as msprobe does at
    level mix, where it also hooks the `nn.ReLU` module: the relu's input gradient in the
    dump is the incoming gradient passed through (the hook's identity node), and the
    relu's true gradient is the `__mul__`'s incoming one. `faulty`: a device relu whose
    backward passes the gradient through where the input was negative."""
    writer = DumpWriter(root, "tensor")
    generator = torch.Generator().manual_seed(5)
    a = torch.randn(16, 32, generator=generator).requires_grad_()
    scale = torch.randn(16, 32, generator=generator)
    x = a * scale
    upstream = torch.randn(16, 32, generator=generator)
    writer.forward("Tensor.__mul__.0", [a.detach(), scale], {}, x.detach())
    writer.forward("Functional.relu.0", [x.detach()], {"inplace": True}, torch.relu(x.detach()))
    through_relu = upstream if faulty else upstream * (x.detach() > 0)
    writer.backward("Functional.relu.0", [upstream], [upstream])
    writer.backward("Tensor.__mul__.0", [through_relu], [through_relu * scale, None])
    return writer.write()


@pytest.mark.parametrize("faulty", [False, True], ids=["correct", "passes-through"])
def test_a_passed_through_in_place_gradient_is_recovered_from_the_data_flow(
    faulty: bool, tmp_path: Path, run_dump
) -> None:
    """Real: resnet's ReLU(inplace=True) at level mix (studies/verdicts-on-real-models.md), 5
    false errors offline before. The relu's own gradient comes from its producer's record:
    correct, it passes; a device relu that passes the gradient through fails there."""
    result = run_dump(module_hooked_relu_dump(tmp_path / "dump", faulty), "--msprobe-device=cpu", "--msprobe-offline")
    outcome = result.calls["Functional.relu.0.backward"]
    assert outcome.outcome == ("failed" if faulty else "passed"), outcome.text
    assert "Tensor.__mul__.0" in outcome.properties["msprobe_reference"]
