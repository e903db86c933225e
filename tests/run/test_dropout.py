"""Dropout judged through the randomness the dump reveals (run/dropout.py): p = 0 and
training=False replay as the identity; for p > 0 the device's result shows the mask
(offline: the dumped output or gradient; single-run: the device run's own), the bench
scales the kept elements by 1 / (1 - p) and a binomial bound judges the dropped share
against p. Every dropout call used to skip ("draws random numbers")."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from pytest_msprobe.testing.dumpwriter import DumpWriter

DROPOUT = F.dropout  # the correct kernel, kept while a planted fault stands in for it

# call -> (arguments after the input, shape of the input)
CALLS: dict[str, tuple[tuple[object, ...], tuple[int, ...]]] = {
    "Functional.dropout.0": ((0.0, True), (16, 64)),
    "Functional.dropout.1": ((0.3, False), (16, 64)),
    "Functional.dropout.2": ((0.3, True), (32, 64)),
    "Functional.dropout2d.0": ((0.25, True), (8, 64, 4, 4)),
    "Torch.dropout.0": ((0.2, True), (16, 64)),
}


def faulty_dropout(drop: float, scale: Callable[[float], float]) -> Callable[..., torch.Tensor]:
    """A float32 dropout that drops a share `drop` (whatever its p) and scales the kept
    elements by scale(p); in other dtypes (the bench's float64) the correct kernel."""

    def dropout(x: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> torch.Tensor:
        if x.dtype != torch.float32 or not training or p == 0:
            return DROPOUT(x, p, training, inplace)
        kept = torch.rand(x.shape) >= drop
        return x * kept.to(x.dtype) * scale(p)

    return dropout


def dropout_dump(
    root: Path,
    dtypes: tuple[torch.dtype, ...] = (torch.float32,),
    kernels: dict[str, Callable[..., torch.Tensor]] | None = None,
) -> Path:
    """Forward and backward of each call, in each dtype (the second numbered 10 on);
    `kernels` may replace Functional.dropout's kernel."""
    writer = DumpWriter(root, "tensor")
    torch.manual_seed(11)
    for offset, dtype in zip((0, 10), dtypes, strict=False):
        _write_calls(writer, dtype, offset, (kernels or {}).get("Functional.dropout", DROPOUT))
    return writer.write()


def _write_calls(writer: DumpWriter, dtype: torch.dtype, offset: int, dropout: Callable[..., torch.Tensor]) -> None:
    for named, (extra, shape) in CALLS.items():
        api, number = named.rsplit(".", 1)
        call = f"{api}.{int(number) + offset}"
        function = {"Functional.dropout": dropout, "Functional.dropout2d": F.dropout2d, "Torch.dropout": torch.dropout}[
            call.rsplit(".", 1)[0]
        ]
        x = torch.randn(shape).to(dtype).requires_grad_()
        y = function(x, *extra)
        writer.forward(call, [x.detach(), *extra], {}, y.detach())
        if y is x:  # the identity returns its input: no autograd node, no backward record
            continue
        upstream = torch.randn(shape).to(dtype)
        y.backward(upstream)
        writer.backward(call, [upstream], [x.grad, None])  # as msprobe: the mul node's two edges


MODES = pytest.mark.parametrize("mode", [(), ("--msprobe-offline",)], ids=["single-run", "offline"])


@MODES
def test_correct_dropouts_pass(mode: tuple[str, ...], tmp_path: Path, run_dump) -> None:
    result = run_dump(dropout_dump(tmp_path / "dump", (torch.float32, torch.bfloat16)), "--msprobe-device=cpu", *mode)
    assert sorted(result.by_outcome("passed")) == sorted(result.calls), {
        k: v.text for k, v in result.calls.items() if v.outcome != "passed"
    }
    assert len(result.calls) == 16  # the identities have no backward


def _faulty_run(
    mode: tuple[str, ...],
    fault: Callable[..., torch.Tensor],
    tmp_path: Path,
    run_dump,
    monkeypatch: pytest.MonkeyPatch,
    api: str = "dropout",
    make: Callable[..., Path] = dropout_dump,
):
    """The fault in F.<api> on the device (single-run) or in the dumped results (offline)."""
    if mode:
        dump = make(tmp_path / "dump", kernels={f"Functional.{api}": fault})
    else:
        dump = make(tmp_path / "dump")
        monkeypatch.setattr(F, api, fault)
    return run_dump(dump, "--msprobe-device=cpu", *mode)


@MODES
def test_kept_elements_scaled_by_1_over_p_fail(
    mode: tuple[str, ...], tmp_path: Path, run_dump, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Planted: the kept elements scaled by 1 / p instead of 1 / (1 - p) (p = 0.3)."""
    result = _faulty_run(mode, faulty_dropout(0.3, lambda p: 1 / p), tmp_path, run_dump, monkeypatch)
    assert sorted(result.by_outcome("failed")) == ["Functional.dropout.2.backward", "Functional.dropout.2.forward"]


@MODES
def test_a_dropped_share_far_from_p_fails(
    mode: tuple[str, ...], tmp_path: Path, run_dump, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Planted: half of the elements dropped where p = 0.3, the kept ones scaled right."""
    result = _faulty_run(mode, faulty_dropout(0.5, lambda p: 1 / (1 - p)), tmp_path, run_dump, monkeypatch)
    assert sorted(result.by_outcome("failed")) == ["Functional.dropout.2.backward", "Functional.dropout.2.forward"]
    assert "dropout rate" in result.calls["Functional.dropout.2.forward"].text


def test_attention_with_dropout_skips_and_without_is_judged(tmp_path: Path, run_dump) -> None:
    """scaled_dot_product_attention draws its dropout inside the call: with dropout_p > 0
    it skips with the reason (it was judged as deterministic: a false alarm on every
    real sdpa dump with attention dropout), with dropout_p = 0 it is judged."""
    writer = DumpWriter(tmp_path / "dump", "tensor")
    torch.manual_seed(5)
    q, k, v = (torch.randn(2, 4, 8, 16) for _ in range(3))
    for number, p in enumerate((0.1, 0.0)):
        writer.forward(
            f"Functional.scaled_dot_product_attention.{number}",
            [q, k, v, None, p],
            {},
            F.scaled_dot_product_attention(q, k, v, None, p),
        )
    result = run_dump(writer.write(), "--msprobe-device=cpu")
    assert (
        "dropout_p=0.1 draws random numbers"
        in result.by_outcome("skipped")["Functional.scaled_dot_product_attention.0.forward"].text
    )
    assert list(result.by_outcome("passed")) == ["Functional.scaled_dot_product_attention.1.forward"]


def test_repeat_leaves_dropout_alone(tmp_path: Path, run_dump) -> None:
    """--msprobe-repeat compares the device's bits over runs: a dropout draws anew each
    run by design (and its bench's revealed mask is no argument of the device's call)."""
    result = run_dump(dropout_dump(tmp_path / "dump"), "--msprobe-device=cpu", "--msprobe-repeat=2")
    assert sorted(result.by_outcome("passed")) == sorted(result.calls), {
        k: v.text for k, v in result.calls.items() if v.outcome != "passed"
    }


# --- SELU's alpha dropouts ---------------------------------------------------------
# SELU's alpha dropouts judged through the randomness the dump reveals (run/dropout.py):
# a kept element is a x + b, a dropped one the constant a alpha' + b; the device's result
# shows which is which, the bench computes both with torch's SELU constants, and the
# dropped share is judged against p by the binomial bound. They used to skip ("draws
# random numbers"). The dumps are laid out as msprobe 26.2 records these calls (checked on
# a real dump): the backward's recorded gradient is the incoming one passed through the
# kernel's final add, so offline the input's gradient comes from the producer (a selu).

ALPHA_DROPOUT, FEATURE_ALPHA_DROPOUT = F.alpha_dropout, F.feature_alpha_dropout
SELU_ALPHA = 1.7580993408473766  # torch's Dropout.cpp

# call -> (arguments after the input, shape of the input)
ALPHA_CALLS: dict[str, tuple[tuple[object, ...], tuple[int, ...]]] = {
    "Functional.alpha_dropout.0": ((0.2, True), (64, 256)),
    "Functional.alpha_dropout.1": ((0.0, True), (16, 64)),  # p = 0: the identity
    "Functional.alpha_dropout.2": ((0.2, False), (16, 64)),  # eval: the identity
    "Functional.feature_alpha_dropout.0": ((0.25, True), (8, 64, 6, 6)),
}


def faulty_alpha_dropout(drop: float, a_of: Callable[[float], float]) -> Callable[..., torch.Tensor]:
    """A float32 alpha dropout that drops a share `drop` (whatever its p) with the scale
    a_of(p) and torch's b; other dtypes and the identities: the correct kernel."""

    def dropout(x: torch.Tensor, p: float = 0.5, training: bool = False, inplace: bool = False) -> torch.Tensor:
        if x.dtype != torch.float32 or not training or p == 0:
            return ALPHA_DROPOUT(x, p, training, inplace)
        kept = (torch.rand(x.shape) >= drop).to(x.dtype)
        a = a_of(p)
        return x * (kept * a) + (kept - 1) * SELU_ALPHA * a + SELU_ALPHA * a * p

    return dropout


def _torch_a(p: float) -> float:
    return 1 / math.sqrt((SELU_ALPHA**2 * p + 1) * (1 - p))


def alpha_dump(
    root: Path,
    dtypes: tuple[torch.dtype, ...] = (torch.float32,),
    kernels: dict[str, Callable[..., torch.Tensor]] | None = None,
) -> Path:
    """Each call after a selu that makes its input, forward and backward, in each dtype
    (the second dtype's calls numbered 10 on); `kernels` replaces an API's kernel."""
    writer = DumpWriter(root, "tensor")
    torch.manual_seed(3)
    number = 0
    for offset, dtype in zip((0, 10), dtypes, strict=False):
        for named, (extra, shape) in ALPHA_CALLS.items():
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


@MODES
def test_correct_alpha_dropouts_pass(mode: tuple[str, ...], tmp_path: Path, run_dump) -> None:
    result = run_dump(alpha_dump(tmp_path / "dump", (torch.float32, torch.bfloat16)), "--msprobe-device=cpu", *mode)
    assert sorted(result.by_outcome("passed")) == sorted(result.calls), {
        k: v.text for k, v in result.calls.items() if v.outcome != "passed"
    }
    judged = [name for name in result.calls if "alpha_dropout" in name]
    assert len(judged) == 12  # 4 calls x 2 dtypes forward, the 2 drawn x 2 dtypes backward


@MODES
def test_an_alpha_dropout_with_a_wrong_scale_fails(
    mode: tuple[str, ...], tmp_path: Path, run_dump, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Planted: a = 1 / sqrt(p alpha'^2 + 1), without the (1 - p) that keeps the variance."""
    result = _faulty_run(
        mode,
        faulty_alpha_dropout(0.2, lambda p: 1 / math.sqrt(SELU_ALPHA**2 * p + 1)),
        tmp_path,
        run_dump,
        monkeypatch,
        "alpha_dropout",
        alpha_dump,
    )
    failed = sorted(name for name in result.by_outcome("failed") if "alpha" in name)
    assert failed == ["Functional.alpha_dropout.0.backward", "Functional.alpha_dropout.0.forward"], failed


@MODES
def test_an_alpha_dropout_dropping_far_from_p_fails(
    mode: tuple[str, ...], tmp_path: Path, run_dump, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Planted: 40% of the elements dropped where p = 0.2, the constants right."""
    result = _faulty_run(
        mode, faulty_alpha_dropout(0.4, _torch_a), tmp_path, run_dump, monkeypatch, "alpha_dropout", alpha_dump
    )
    failed = sorted(name for name in result.by_outcome("failed") if "alpha" in name)
    assert "Functional.alpha_dropout.0.forward" in failed, failed
    assert "dropout rate" in result.calls["Functional.alpha_dropout.0.forward"].text
