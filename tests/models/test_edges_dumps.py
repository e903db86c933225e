"""The edges on real dumps, as users run the plugin: a softmax that clamps its exp
argument, and one run in flush-to-zero mode, on the masked attention rows of the shipped
dumps, single-run (the device patched) and offline (the dumped output rewritten); and the
kernel verdict that pools such calls (standards/near_zero.py, standards/flush.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from pytest_msprobe.testing.dumpwriter import DumpWriter

CALL = "Tensor.softmax.0.forward"
#: the shipped dumps whose attention softmax has masked (-inf) scores, by dtype
MASKED = {torch.float32: "models/embedattn_tensor_fp32", torch.bfloat16: "models/embedattn_tensor_bf16"}
MODES = {"single-run": (), "offline": ("--msprobe-offline",)}


def clamped(floor: float) -> Callable[[torch.Tensor], torch.Tensor]:
    """softmax with `x - max` clamped at `floor` before exp, in float32, rounded once."""

    def softmax(x: torch.Tensor) -> torch.Tensor:
        z = x.float() - x.float().amax(-1, keepdim=True)
        e = torch.exp(z.clamp(min=floor))
        return (e / e.sum(-1, keepdim=True)).to(x.dtype)

    return softmax


def flushing(x: torch.Tensor) -> torch.Tensor:
    """softmax in flush-to-zero mode (restored after)."""
    torch.set_flush_denormal(True)
    try:
        return torch.softmax(x, -1)
    finally:
        torch.set_flush_denormal(False)


def thousandth_at_zero(x: torch.Tensor) -> torch.Tensor:
    """A wrong softmax: 1e-3 where the exact result is 0."""
    right = torch.softmax(x.float(), -1)
    return torch.where(right == 0, 1e-3, right).to(x.dtype)


DEVICES = {"clamp-64": clamped(-64.0), "clamp-88": clamped(-88.0), "ftz": flushing}


def _plant(monkeypatch, dtype: torch.dtype, device: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Tensor.softmax runs `device` whenever its input is in `dtype` (the bench, raised,
    still runs torch's own)."""
    original = torch.Tensor.softmax

    def softmax(self, *args, **kwargs):
        return device(self) if self.dtype == dtype else original(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "softmax", softmax)


def _rewrite_output(dump: Path, device: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """The dumped output of CALL replaced by `device` on the dumped input (offline: the
    dump is the device's)."""
    data = dump.parent / "dump_tensor_data"
    x = torch.load(data / f"{CALL}.input.0.pt", weights_only=True)
    torch.save(device(x), data / f"{CALL}.output.0.pt")


def _run(dtype, device, mode, copy_dump, run_dump, monkeypatch, *extra: str):
    dump = copy_dump(MASKED[dtype])
    if mode == "offline":
        _rewrite_output(dump, device)
    else:
        _plant(monkeypatch, dtype, device)
    result = run_dump(dump, "--msprobe-device=cpu", *MODES[mode], "-k", "softmax and forward", *extra)
    return result.calls[CALL]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", MASKED, ids=str)
def test_a_clamped_or_flushing_softmax_passes_on_masked_rows_of_a_real_dump(
    dtype, device, mode, copy_dump, run_dump, monkeypatch
):
    """No error and no warning. Fails on main's code in bfloat16 with the clamp: "additive
    misrounding: 132 elements above and over half an ULP (and 64 float32 ULPs) from the
    bench" (the far-misrounding test, single-run)."""
    outcome = _run(dtype, DEVICES[device], mode, copy_dump, run_dump, monkeypatch)
    assert outcome.outcome == "passed", outcome.text
    assert not outcome.warnings, outcome.warnings


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", MASKED, ids=str)
def test_a_softmax_that_gives_a_thousandth_where_the_exact_is_zero_fails(dtype, mode, copy_dump, run_dump, monkeypatch):
    outcome = _run(dtype, thousandth_at_zero, mode, copy_dump, run_dump, monkeypatch)
    assert outcome.outcome == "failed", outcome.text


CALLS = 6


def _masked_softmax_dump(root: Path) -> Path:
    """CALLS float32 softmax calls of 4 rows of 8 scores, 5 of each row masked, their
    outputs written by the softmax that clamps at -64: each call's 20 masked elements are
    too few for its own sign test (z <= sqrt(20) < 5), the kernel's 120 are not."""
    writer = DumpWriter(root, "tensor")
    generator = torch.Generator().manual_seed(0)
    for index in range(CALLS):
        x = torch.randn(4, 8, generator=generator)
        x[:, 3:] = -float("inf")
        writer.forward(f"Functional.softmax.{index}", [x], {"dim": -1}, clamped(-64.0)(x))
    return writer.write()


def test_a_kernel_of_clamped_softmax_calls_pools_no_near_zero_element(tmp_path, run_dump):
    """Fails on main's code: every call passes, the pooled kernel fails as "systematic
    additive bias" (its masked elements, all e^-64 / sum above 0, pooled)."""
    dump = _masked_softmax_dump(tmp_path / "dump")
    result = run_dump(dump, "--msprobe-device=cpu", "--msprobe-offline")
    assert {outcome.outcome for outcome in result.calls.values()} == {"passed"}
    kernel = result.kernels["Functional.softmax.float32.kernel.forward"]
    assert kernel.outcome == "passed", kernel.text
