"""Verdicts at the edges: elements near zero (standards/near_zero.py) and subnormal
results flushed to zero (standards/flush.py).

A softmax that clamps `x - max` at -64 (or at -88, float32's underflow) before `exp`
gives e^-64 / sum where the exact result is 0, and a device in flush-to-zero mode gives 0
where the exact result is subnormal: both are correct within what libraries document, and
both were failed by the tests that count in ULPs of each element's own magnitude.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from kernels import round_toward_zero

from pytest_msprobe.standards import check, fast
from pytest_msprobe.standards.dtypes import dtype_info
from pytest_msprobe.standards.flush import FLUSHED_KEY
from pytest_msprobe.standards.metrics import ulp_of
from pytest_msprobe.standards.registry import Registry

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
FLOORS = [-64.0, -88.0]
#: the masked attention scores (causal: -inf above the diagonal) of a real dump
MASKED_SCORES = (
    Path(__file__).parents[1]
    / "dumps/models/embedattn_tensor_fp32/dump_tensor_data/Tensor.softmax.0.forward.input.0.pt"
)


def clamped_softmax(x: torch.Tensor, floor: float) -> torch.Tensor:
    """softmax as a library that clamps `x - max` at `floor` before exp computes it: in
    float32, rounded to x's dtype once."""
    z = x.float() - x.float().amax(-1, keepdim=True)
    e = torch.exp(z.clamp(min=floor))
    return (e / e.sum(-1, keepdim=True)).to(x.dtype)


def dump_scores() -> torch.Tensor:
    return torch.load(MASKED_SCORES, weights_only=True)


def padded_scores() -> torch.Tensor:
    """A padded batch: every row attends to its first 20 of 64 keys (more than half of
    each row is masked, so its zeros reach the bias tests' upper half)."""
    scores = torch.randn(16, 64, 64, generator=torch.Generator().manual_seed(0))
    scores[..., 20:] = -float("inf")
    return scores


def _judge(scores: torch.Tensor, dtype: torch.dtype, device: Callable[[torch.Tensor], torch.Tensor], **kwargs):
    x = scores.to(dtype)
    bench = torch.softmax(x.double(), -1)
    once = (
        torch.ones(x.shape, dtype=torch.bool) if dtype != torch.float32 else None
    )  # as judge/verdict/rounding.py says
    return check(bench, device(x), api="softmax", rounded_once=once, **kwargs)


@pytest.mark.parametrize("scores", [dump_scores, padded_scores], ids=["dump-rows", "padded"])
@pytest.mark.parametrize("floor", FLOORS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_clamped_softmax_is_no_error_on_masked_rows(scores, floor, dtype):
    """Fails on main's code: bfloat16 "additive misrounding: 132 elements above ..." on
    the dump's rows, float32 and bfloat16 "systematic additive bias: bias_ulp +44 ULP"
    on the padded batch. Single-run and against a reference run in D (offline)."""
    single = _judge(scores(), dtype, lambda x: clamped_softmax(x, floor))
    assert single.status == "pass", single.message()
    if dtype != torch.float16:  # float16: e^-64 / sum rounds to 0, nothing is left out
        assert single.metrics["near_zero_n"] > 0
    x = scores().to(dtype)
    offline = _judge(scores(), dtype, lambda x: clamped_softmax(x, floor), reference=torch.softmax(x, -1))
    assert offline.status == "pass", offline.message()


@pytest.mark.parametrize("scores", [dump_scores, padded_scores], ids=["dump-rows", "padded"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_softmax_that_gives_a_thousandth_where_the_exact_is_zero_is_an_error(scores, dtype):
    def wrong(x: torch.Tensor) -> torch.Tensor:
        right = torch.softmax(x.float(), -1)
        return torch.where(right == 0, 1e-3, right).to(x.dtype)

    for reference in (None, torch.softmax(scores().to(dtype), -1)):
        verdict = _judge(scores(), dtype, wrong, reference=reference)
        assert verdict.status == "error", verdict.message()


@pytest.mark.parametrize(
    ("scores", "dtype"),
    [(dump_scores, torch.bfloat16), (dump_scores, torch.float16), (padded_scores, torch.bfloat16)],
    ids=["dump-rows-bf16", "dump-rows-fp16", "padded-bf16"],
)
def test_a_clamped_softmax_truncated_to_16_bits_is_still_an_error(scores, dtype):
    """Truncation moves elements by an ULP or so of their own magnitude, never past the
    clip: with the clamp's near-zero elements left out, the sign and far-misrounding tests
    still see it. (The padded batch in float16 passes on main's code too: its clamped
    entries round to exact zeros, 69% of the output, which dilute the bias mean to -0.16
    ULP, under the 0.2 limit; the far test does not run on 2**16 elements.)"""

    def truncated(x: torch.Tensor) -> torch.Tensor:
        z = x.float() - x.float().amax(-1, keepdim=True)
        e = torch.exp(z.clamp(min=-64.0))
        return round_toward_zero(e / e.sum(-1, keepdim=True), dtype)

    verdict = _judge(scores(), dtype, truncated)
    assert verdict.status == "error", verdict.message()
    assert "misrounding" in verdict.message() or "systematic scale" in verdict.message()


def test_a_bias_of_an_output_all_below_the_small_value_threshold_is_still_an_error():
    """Every element of a float32 output of 1e-8 is below small (2**-20) and its error
    within small_atol (2**-30), but a 30-ULP bias is an error relative to |b| far inside
    the clip: the elements stay in the sign tests, which fail it as on main."""
    bench = 1e-8 * (1.0 + torch.rand(4096, generator=torch.Generator().manual_seed(2), dtype=torch.float64))
    assert check(bench, bench.float(), api="exp").status == "pass"
    biased = (bench * (1 + 30 * 2.0**-23)).float()
    verdict = check(bench, biased, api="exp")
    assert verdict.status == "error" and "systematic additive bias" in verdict.message(), verdict.message()
    assert "near_zero_n" not in verdict.metrics


def test_the_api_s_own_small_value_threshold_is_the_one_applied():
    """Where a threshold table lowers `small` for the API, the clamped elements (scores
    masked with -100, not -inf: their exact results are e^-100 / sum, not 0) are no
    longer near zero, and the bias test judges them in ULPs again (as on main)."""
    registry = Registry.default()
    registry.set_threshold("softmax", "float32", "small", 2.0**-200)
    x = torch.where(padded_scores().isinf(), -100.0, padded_scores())
    bench, device = torch.softmax(x.double(), -1), clamped_softmax(x, -64.0)
    assert check(bench, device, api="softmax").status == "pass"
    verdict = registry.check(bench, device, api="softmax")
    assert verdict.status == "error" and "systematic additive bias" in verdict.message()


@pytest.mark.parametrize("dtype", DTYPES)
def test_both_paths_split_the_same_elements(monkeypatch, dtype):
    """The fused chunked pass (fast.py) and the plain path leave out the same near-zero
    elements and reach the same verdict, clamped or a thousandth off."""
    x = padded_scores().repeat(2, 1, 1).to(dtype)  # 2**17 elements: over FAST_MIN_N
    assert x.numel() >= fast.FAST_MIN_N
    bench = torch.softmax(x.double(), -1)
    for device in (clamped_softmax(x, -64.0), torch.where(bench == 0, 1e-3, bench).to(dtype)):
        verdicts = []
        for least in (1 << 62, 0):
            monkeypatch.setattr(fast, "FAST_MIN_N", least)
            verdicts.append(check(bench, device, api="softmax"))
        plain, fused = verdicts
        assert plain.status == fused.status
        assert plain.metrics.get("near_zero_n") == fused.metrics.get("near_zero_n")
        assert {key: plain.metrics[key] for key in ("bias_n", "bias_signs", "scale_bias_signs")} == {
            key: fused.metrics[key] for key in ("bias_n", "bias_signs", "scale_bias_signs")
        }


def test_groups_count_no_near_zero_element():
    """The sign tests by group (a softmax row's shared sum) leave the near-zero elements
    out as the element counts do."""
    x = padded_scores()
    bench, device = torch.softmax(x.double(), -1), clamped_softmax(x, -64.0)
    rows = torch.arange(x.numel() // x.shape[-1]).repeat_interleave(x.shape[-1]).reshape(x.shape)
    verdict = check(bench, device, api="softmax", groups=rows)
    assert verdict.status == "pass", verdict.message()
    assert abs(verdict.metrics["bias_signs"]) < verdict.metrics["near_zero_n"]


def test_the_ulp_standard_keeps_msprobe_s_metrics():
    """msprobe's ULP metrics stay as the spec defines them, near zero too: e =
    max(floor(log2|b|), e_min)."""
    generator = torch.Generator().manual_seed(1)
    a, w = torch.randn(32, 64, generator=generator), torch.randn(16, 64, generator=generator)
    w[:4] = 0.0  # four output columns exactly 0
    bench, device = a.double() @ w.double().T, a @ w.T + 2.0**-60 * (w.sum(1) == 0)
    verdict = check(bench, device, api="matmul")
    b, d = bench.numpy().ravel(), device.double().numpy().ravel()
    ulp_err = np.abs(d - b) / ulp_of(np.abs(b), dtype_info(torch.float32))
    assert verdict.metrics["mean_ulp_err"] == pytest.approx(ulp_err.mean(), rel=1e-12)
    assert verdict.metrics["max_ulp_err"] == ulp_err.max()


# ---------------------------------------------------------------------------- flush to zero


@pytest.fixture
def flush_denormal() -> Iterator[Callable[..., torch.Tensor]]:
    """Run a function on its arguments with torch's flush-to-zero (and
    denormals-are-zero) mode on; it is off again after each run and after the test,
    whatever happens."""

    def run(function: Callable[..., torch.Tensor], *args: torch.Tensor) -> torch.Tensor:
        if not torch.set_flush_denormal(True):
            pytest.skip("this CPU has no flush-to-zero mode (torch.set_flush_denormal)")
        try:
            return function(*args)
        finally:
            torch.set_flush_denormal(False)

    yield run
    torch.set_flush_denormal(False)


#: per dtype, a scale s whose square is subnormal in it, and exp arguments whose result is
SUBNORMAL = {
    torch.float32: (2.0**-70, (-100.0, -88.0)),
    torch.bfloat16: (2.0**-64, (-100.0, -88.0)),
    torch.float16: (2.0**-8, (-16.0, -10.0)),
}


def _uniform(seed: int) -> torch.Tensor:
    return 0.5 + torch.rand(64, 64, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, -1)


#: API -> (how the inputs are made from the dtype's scale and exp range, the function)
FLUSH_CASES: dict[str, tuple[Callable[[float, tuple[float, float]], tuple[torch.Tensor, ...]], Callable]] = {
    "mul": (lambda s, r: (s * _uniform(0), s * _uniform(1)), torch.mul),
    "matmul": (lambda s, r: (s * _uniform(0) / 8, s * _uniform(1) / 8), lambda a, b: a @ b.T),
    "exp": (lambda s, r: (r[0] + (r[1] - r[0]) * _uniform(2),), torch.exp),
    "softmax": (
        lambda s, r: (torch.cat([torch.zeros(64, 1), r[0] + (r[1] - r[0]) * _uniform(3)[:, 1:]], 1),),
        _softmax,
    ),
    "conv2d": (
        lambda s, r: (s * _uniform(4).reshape(1, 1, 64, 64), s * _uniform(5)[:1, :9].reshape(1, 1, 3, 3) / 4),
        F.conv2d,
    ),
}


def _flushed(out: torch.Tensor) -> torch.Tensor:
    """The flush planted where the CPU's mode leaves the dtype alone (float16 here: its
    conversions ignore it)."""
    return torch.where(out.abs() < torch.finfo(out.dtype).smallest_normal, 0.0, out).to(out.dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_device_that_flushes_subnormal_results_is_no_error(dtype, flush_denormal):
    """Each API's results subnormal in D, the device in flush-to-zero mode: every verdict
    passes (no warning), and those the flush would have failed (main's code: the ULP
    standard's matmul, exp's and softmax's single-run rule, float16's absolute threshold)
    say how many elements were flushed."""
    scale, exp_range = SUBNORMAL[dtype]
    noted = []
    for api, (make, function) in FLUSH_CASES.items():
        inputs = [x.to(dtype) for x in make(scale, exp_range)]
        bench = function(*(x.double() for x in inputs))
        device = _flushed(flush_denormal(function, *inputs))
        b_d = bench.to(dtype).double()
        flushed = (device == 0) & (b_d != 0)
        assert flushed.any(), f"{api}: no result flushed"
        verdict = check(bench, device, api=api)
        assert verdict.status == "pass", verdict.message()
        if FLUSHED_KEY in verdict.metrics:
            assert verdict.metrics[FLUSHED_KEY] == int(flushed.sum())
            noted.append(api)
    assert noted, "the flush made no difference to any verdict"


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_flushing_device_s_other_faults_are_still_errors(dtype, flush_denormal):
    """A flush excuses only the flushed elements: zeroing normal values, or a bias of
    the elements it did not flush, is still an error."""
    scale, exp_range = SUBNORMAL[dtype]
    (x,) = (v.to(dtype) for v in FLUSH_CASES["exp"][0](scale, exp_range))
    x = torch.cat([x, (8.0 * _uniform(6) - 12.0).to(dtype)])  # half the results from e^-8 to 1
    bench = torch.exp(x.double())
    device = _flushed(flush_denormal(torch.exp, x))
    assert check(bench, device, api="exp").status == "pass"
    zeroed = torch.where(device.abs() < 2.0**-9, 0.0, device).to(dtype)  # normal values too
    assert check(bench, zeroed, api="exp").status == "error"
    biased = (device.double() * (1 + 2.0 ** -(dtype_info(dtype).mantissa_bits - 3))).to(dtype)
    verdict = check(bench, biased, api="exp")
    assert verdict.status == "error" and FLUSHED_KEY not in verdict.metrics, verdict.message()
