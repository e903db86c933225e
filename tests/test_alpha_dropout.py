"""SELU's alpha dropouts judged through the randomness the dump reveals (run/dropout.py):
a kept element is a x + b, a dropped one the constant a alpha' + b; the device's result
shows which is which, the bench computes both with torch's SELU constants, and the
dropped share is judged against p by the binomial bound. They used to skip ("draws
random numbers"). The dumps are laid out as msprobe 26.2 records these calls (checked on
a real dump): the backward's recorded gradient is the incoming one passed through the
kernel's final add, so offline the input's gradient comes from the producer (a selu)."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from dumpwriter import DumpWriter

ALPHA_DROPOUT, FEATURE_ALPHA_DROPOUT = F.alpha_dropout, F.feature_alpha_dropout
SELU_ALPHA = 1.7580993408473766  # torch's Dropout.cpp

# call -> (arguments after the input, shape of the input)
CALLS: dict[str, tuple[tuple[object, ...], tuple[int, ...]]] = {
    "Functional.alpha_dropout.0": ((0.2, True), (64, 256)),
    "Functional.alpha_dropout.1": ((0.0, True), (16, 64)),  # p = 0: the identity
    "Functional.alpha_dropout.2": ((0.2, False), (16, 64)),  # eval: the identity
    "Functional.feature_alpha_dropout.0": ((0.25, True), (8, 64, 6, 6)),
}


def faulty(drop: float, a_of: Callable[[float], float], channels: bool = False) -> Callable[..., torch.Tensor]:
    """A float32 alpha dropout that drops a share `drop` (whatever its p) with the scale
    a_of(p), torch's b; other dtypes and the identities: the correct kernel."""
    correct = FEATURE_ALPHA_DROPOUT if channels else ALPHA_DROPOUT

    def dropout(x: torch.Tensor, p: float = 0.5, training: bool = False, inplace: bool = False) -> torch.Tensor:
        if x.dtype != torch.float32 or not training or p == 0:
            return correct(x, p, training, inplace)
        shape = (*x.shape[:2], *[1] * (x.dim() - 2)) if channels else x.shape
        kept = (torch.rand(shape) >= drop).to(x.dtype)
        a = a_of(p)
        return x * (kept * a) + (kept - 1) * SELU_ALPHA * a + SELU_ALPHA * a * p

    return dropout


def _torch_a(p: float) -> float:
    return 1 / math.sqrt((SELU_ALPHA**2 * p + 1) * (1 - p))


def alpha_dump(
    root: Path, dtypes: tuple[torch.dtype, ...] = (torch.float32,), kernels: dict[str, Callable[..., torch.Tensor]] | None = None
) -> Path:
    """Each call after a selu that makes its input, forward and backward, in each dtype
    (the second dtype's calls numbered 10 on); `kernels` replaces an API's kernel."""
    writer = DumpWriter(root, "tensor")
    torch.manual_seed(3)
    number = 0
    for offset, dtype in zip((0, 10), dtypes, strict=False):
        for named, (extra, shape) in CALLS.items():
            api, index = named.rsplit(".", 1)
            call = f"{api}.{int(index) + offset}"
            function = (kernels or {}).get(api) or {
                "Functional.alpha_dropout": ALPHA_DROPOUT,
                "Functional.feature_alpha_dropout": FEATURE_ALPHA_DROPOUT,
            }[api]
            x = torch.randn(shape).to(dtype).requires_grad_()
            h = F.selu(x)
            h.retain_grad()
            y = function(h, *extra)
            producer = f"Functional.selu.{number}"
            number += 1
            writer.forward(producer, [x.detach()], {}, h.detach())
            writer.forward(call, [h.detach(), *extra], {}, y.detach())
            upstream = torch.randn(shape).to(dtype)
            y.backward(upstream)
            if y is not h:  # the identity returns its input: no backward record of its own
                writer.backward(call, [upstream], [upstream, None])  # msprobe: the final add's two edges
            writer.backward(producer, [h.grad], [x.grad])
    return writer.write()


MODES = pytest.mark.parametrize("mode", [(), ("--msprobe-offline",)], ids=["single-run", "offline"])


@MODES
def test_correct_alpha_dropouts_pass(mode: tuple[str, ...], tmp_path: Path, run_dump) -> None:
    result = run_dump(alpha_dump(tmp_path / "dump", (torch.float32, torch.bfloat16)), "--msprobe-device=cpu", *mode)
    assert sorted(result.by_outcome("passed")) == sorted(result.calls), {
        k: v.text for k, v in result.calls.items() if v.outcome != "passed"
    }
    judged = [name for name in result.calls if "alpha_dropout" in name]
    assert len(judged) == 12  # 4 calls x 2 dtypes forward, the 2 drawn x 2 dtypes backward


def _faulty_run(mode: tuple[str, ...], fault: Callable[..., torch.Tensor], tmp_path: Path, run_dump, monkeypatch: pytest.MonkeyPatch):
    """The fault on the device (single-run) or in the dumped results (offline)."""
    if mode:
        dump = alpha_dump(tmp_path / "dump", kernels={"Functional.alpha_dropout": fault})
    else:
        dump = alpha_dump(tmp_path / "dump")
        monkeypatch.setattr(F, "alpha_dropout", fault)
    return run_dump(dump, "--msprobe-device=cpu", *mode)


@MODES
def test_a_wrong_scale_fails(mode: tuple[str, ...], tmp_path: Path, run_dump, monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted: a = 1 / sqrt(p alpha'^2 + 1), without the (1 - p) that keeps the variance."""
    result = _faulty_run(mode, faulty(0.2, lambda p: 1 / math.sqrt(SELU_ALPHA**2 * p + 1)), tmp_path, run_dump, monkeypatch)
    failed = sorted(name for name in result.by_outcome("failed") if "alpha" in name)
    assert failed == ["Functional.alpha_dropout.0.backward", "Functional.alpha_dropout.0.forward"], failed


@MODES
def test_a_dropped_share_far_from_p_fails(mode: tuple[str, ...], tmp_path: Path, run_dump, monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted: 40% of the elements dropped where p = 0.2, the constants right."""
    result = _faulty_run(mode, faulty(0.4, _torch_a), tmp_path, run_dump, monkeypatch)
    failed = sorted(name for name in result.by_outcome("failed") if "alpha" in name)
    assert "Functional.alpha_dropout.0.forward" in failed, failed
    assert "dropout rate" in result.calls["Functional.alpha_dropout.0.forward"].text
