"""hardswish and hardsigmoid (MobileNetV3, timm's CNNs) are replayed and judged: they were
"not in the replay table" (torch.overrides does not list them), so every such call of a
real model skipped."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from pytest_msprobe.testing.dumpwriter import DumpWriter
from pytest_msprobe.testing.faults import scaled_in

CALLS = ("Functional.hardswish.0", "Functional.hardsigmoid.0")


def activations_dump(root: Path, dtype: torch.dtype) -> Path:
    """A forward and a backward call of each, on inputs across their kinks at -3 and 3."""
    writer = DumpWriter(root, "tensor")
    generator = torch.Generator().manual_seed(5)
    for call in CALLS:
        x = (torch.randn(8, 64, generator=generator) * 4).to(dtype).requires_grad_()
        upstream = torch.randn(8, 64, generator=generator).to(dtype)
        y = getattr(F, call.split(".")[1])(x)  # looked up now: a planted fault writes the dump
        y.backward(upstream)
        writer.forward(call, [x.detach()], {}, y.detach())
        writer.backward(call, [upstream], [x.grad])
    return writer.write()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_correct_hard_activations_pass(dtype: torch.dtype, tmp_path: Path, run_dump) -> None:
    result = run_dump(activations_dump(tmp_path / "dump", dtype), "--msprobe-device=cpu")
    assert sorted(result.by_outcome("passed")) == sorted(
        f"{call}.{d}" for call in CALLS for d in ("forward", "backward")
    )


@pytest.mark.parametrize("mode", [(), ("--msprobe-offline",)], ids=["single-run", "offline"])
def test_a_scaled_hardswish_fails(
    mode: tuple[str, ...], tmp_path: Path, run_dump, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Planted: float32 hardswish 2**-10 too large, on the device (single-run) or in the
    dumped outputs (offline)."""
    faulty = scaled_in(torch.float32, 1 + 2**-10)(F.hardswish)
    if mode:
        monkeypatch.setattr(F, "hardswish", faulty)
        dump = activations_dump(tmp_path / "dump", torch.float32)
        monkeypatch.undo()
    else:
        dump = activations_dump(tmp_path / "dump", torch.float32)
        monkeypatch.setattr(F, "hardswish", faulty)
    result = run_dump(dump, "--msprobe-device=cpu", *mode)
    assert "Functional.hardswish.0.forward" in result.by_outcome("failed")
    assert not any(call.startswith("Functional.hardsigmoid") for call in result.by_outcome("failed"))
