"""Conditioning (Pair.terms) and the bias tests of every floating standard (bias.py).

Each correct case below failed before conditioning or the noise floor existed, each
fault passed before the bias tests existed; both directions are asserted.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pytest_msprobe.standards import check


def _generator(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _cancelling_bias_grad(dtype=torch.float32, rows: int = 4096, cols: int = 96):
    """A bias gradient: column sums of upstream gradients whose mean was removed (as a
    normalisation after the layer does), so each sum cancels far below its terms."""
    g = torch.randn(rows, cols, generator=_generator()) * 1e-3
    g = (g - g.mean(0)).to(dtype)
    return g.double().sum(0), g.sum(0), g.double().abs().sum(0)


def _round_toward_zero(exact: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    nearest = exact.to(dtype)
    overshoot = nearest.double().abs() > exact.abs()
    toward = torch.nextafter(nearest, torch.zeros_like(nearest))
    return torch.where(overshoot, toward, nearest)


def test_a_cancelled_sum_fails_at_its_own_magnitude_and_passes_at_its_terms():
    bench, device, terms = _cancelling_bias_grad()
    plain = check(bench, device, api="linear")
    conditioned = check(bench, device, api="linear", terms=terms)
    assert plain.status == "error" and plain.metrics["mean_ulp_err"] > 1e4
    assert conditioned.status == "pass", conditioned.message()
    # msprobe's metrics are reported unchanged, the conditioned ones beside them
    for key in ("max_ulp_err", "mean_ulp_err", "ulp_err_proportion"):
        assert conditioned.metrics[key] == plain.metrics[key]
    assert conditioned.metrics["cond_mean_ulp_err"] < 1


@pytest.mark.parametrize("factor", [1 + 2.0**-5, 1 + 2.0**-12])
def test_a_wrong_sum_still_fails_at_its_terms(factor):
    g = torch.randn(512, 64, generator=_generator(1))
    bench, terms = g.double().sum(0), g.double().abs().sum(0)
    device = (g.sum(0).double() * factor).float()
    assert check(bench, device, api="linear", terms=terms).status == "error"


@pytest.mark.parametrize("with_reference", [False, True], ids=["single-run", "reference"])
def test_conv_bias_grad_that_is_mathematically_zero(with_reference):
    """conv -> batch_norm: batch norm removes the mean, so the conv's bias gradient is 0
    plus rounding noise on both sides (device ~1e-9, bench ~1e-10): the thousandth
    standard failed it with and without a reference."""
    g = torch.randn(64, 8, 16, 16, generator=_generator(2))
    g = (g - g.mean(dim=(0, 2, 3), keepdim=True)).float() * 1e-2
    bench, device = g.double().sum(dim=(0, 2, 3)), g.sum(dim=(0, 2, 3))
    terms = g.double().abs().sum(dim=(0, 2, 3))
    reference = g.flip(0).sum(dim=(0, 2, 3)) if with_reference else None
    assert check(bench, device, api="conv2d", reference=reference).status == "error"
    verdict = check(bench, device, api="conv2d", reference=reference, terms=terms)
    assert verdict.status == "pass", verdict.message()
    lost = g[1:].sum(dim=(0, 2, 3))  # a kernel that drops one batch element's contributions
    assert check(bench, lost, api="conv2d", reference=reference, terms=terms).status == "error"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("api", ["mul", "add", "__truediv__"])
def test_truncating_elementwise_kernel_is_an_error_without_a_reference(api, dtype):
    """A float32 -> D conversion by truncation: every element within 1 ULP, no magnitude
    criterion sees it. In float32 the single-run limit is 1 ULP (a constant rounded to
    D shifts correct results by up to that, bias.py): truncation is seen with a reference."""
    a = torch.randn(4096, generator=_generator(3)).to(dtype)
    b = (torch.rand(4096, generator=_generator(4)) + 0.5).to(dtype)
    exact = getattr(torch.Tensor, api if api.startswith("__") else f"__{api}__")(a.double(), b.double())
    correct = getattr(torch.Tensor, api if api.startswith("__") else f"__{api}__")(a, b)
    assert check(exact, correct, api=api).status == "pass"
    verdict = check(exact, _round_toward_zero(exact, dtype), api=api)
    if dtype == torch.float32:
        assert verdict.status == "pass"  # the documented limit: bias.py, at_bias_ulp
        assert check(exact, _round_toward_zero(exact, dtype), api=api, reference=correct).status == "error"
    else:
        assert verdict.status == "error" and "scale (toward/away from zero) bias" in verdict.message()


def _dot_products(seed: int = 5):
    x = torch.randn(256, 512, generator=_generator(seed))
    w = torch.randn(64, 512, generator=_generator(seed + 1)) * 0.05
    return x, w, x.double() @ w.double().T


def _one_more_ulp_toward_zero(tensor: torch.Tensor) -> torch.Tensor:
    return torch.nextafter(tensor, torch.zeros_like(tensor))


@pytest.mark.parametrize("with_reference", [False, True], ids=["single-run", "reference"])
def test_float32_dot_toward_zero_is_within_the_accumulation_class_and_twice_is_not(with_reference):
    """Reclassified by the accuracy model (standards/tables/accuracy_model.csv,
    `accumulation`): a float32 matrix product whose exact accumulator is rounded toward
    zero once leans -0.5 ULP, within the 1 ULP a correct library's last product or
    addition and its conversion may take, so it passes (its lean stays in the metrics);
    rounded toward zero by two ULPs it leans -1.5 ULP, beyond any documented library."""
    x, w, bench = _dot_products()
    reference = x @ w.T if with_reference else None
    assert (
        check(bench, x @ w.T, api="matmul", reference=x.flip(1) @ w.flip(1).T if with_reference else None).status
        == "pass"
    )
    once = check(bench, _round_toward_zero(bench, torch.float32), api="matmul", reference=reference)
    assert once.status == "pass", once.message()
    assert once.metrics["scale_bias_ulp"] < -0.4
    twice = check(
        bench, _one_more_ulp_toward_zero(_round_toward_zero(bench, torch.float32)), api="matmul", reference=reference
    )
    assert twice.status == "error" and "scale (toward/away from zero) bias" in twice.message(), twice.message()
    assert "a correct library of its class may lean" in twice.message()


def _sequential_product(x: torch.Tensor, w: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """x @ w.T accumulated in `dtype` one term after another, each product and addition
    correctly rounded: the plainest correct kernel in float32, the same on every ATen
    kernel path (elementwise steps only)."""
    total = torch.zeros(x.shape[0], w.shape[0], dtype=dtype)
    for k in range(x.shape[1]):
        total = total + x[:, k : k + 1].to(dtype) * w[:, k].to(dtype)
    return total.float()


def _tf32(tensor: torch.Tensor) -> torch.Tensor:
    """float32 rounded to TF32's 10 mantissa bits (to nearest, ties away: no tie occurs
    in randn's values at this width often enough to matter)."""
    bits = tensor.view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)


def test_a_correct_sequential_float32_accumulation_passes_in_a_single_run_without_terms():
    """msprobe's float32 rule reads ULPs of each element's own magnitude: a product of
    1024 terms that cancels to near zero puts 7.4% of its elements over 32 ULP, and the
    mean (71.1, limit 64) is carried by the few nearest zero. Judged beyond the
    accumulator's allowance at the output's scale (ulp.py) it is 0: a pass, with msprobe's
    metrics unchanged. Failed before the output-scale judgement existed. numpy draws the
    inputs: torch's randn draws otherwise under ATEN_CPU_CAPABILITY=default."""
    rng = np.random.default_rng(4)
    x = torch.from_numpy(rng.standard_normal((256, 1024), dtype=np.float32))
    w = torch.from_numpy(rng.standard_normal((64, 1024), dtype=np.float32))
    bench = x.double() @ w.double().T
    verdict = check(bench, _sequential_product(x, w), api="matmul")
    assert verdict.status == "pass", verdict.message()
    assert verdict.metrics["mean_ulp_err"] > 64 and verdict.metrics["ulp_err_proportion"] > 0.05
    assert verdict.metrics["accum_ulp_err_proportion"] < 0.05
    with_terms = check(bench, _sequential_product(x, w), api="matmul", terms=x.double().abs() @ w.double().abs().T)
    assert with_terms.status == "pass" and "accum_mean_ulp_err" not in with_terms.metrics  # the terms' rule decides


def test_a_fault_confined_to_rows_of_small_scale_is_an_error_at_the_output_scale():
    """The output's scale is estimated per row and column (ulp.product_scale): rows of
    inputs 2**-20 as large, accumulated in bfloat16, are 2**-22 of the output's RMS off,
    within an allowance at that RMS (a pass), and hundreds of thousands of ULPs at their
    rows' own scale (an error). The correct kernels on the same inputs pass."""
    rng = np.random.default_rng(4)
    x = torch.from_numpy(rng.standard_normal((256, 1024), dtype=np.float32))
    w = torch.from_numpy(rng.standard_normal((64, 1024), dtype=np.float32))
    x[128:] *= 2.0**-20
    w[32:] *= 2.0**-6
    bench = x.double() @ w.double().T
    correct = _sequential_product(x, w)
    assert check(bench, correct, api="matmul").status == "pass"
    assert check(bench, x @ w.T, api="matmul").status == "pass"
    faulty = torch.cat([correct[:128], _sequential_product(x[128:], w, torch.bfloat16)])
    verdict = check(bench, faulty, api="matmul")
    assert verdict.status == "error", verdict.message()
    assert verdict.metrics["accum_ulp_err_proportion"] > 0.4


@pytest.mark.parametrize(
    "fault",
    [
        pytest.param(lambda x, w: _tf32(x) @ _tf32(w).T, id="tf32-inputs"),
        pytest.param(lambda x, w: _sequential_product(x, w, torch.bfloat16), id="bfloat16-accumulator"),
        pytest.param(lambda x, w: _sequential_product(x, w, torch.float16), id="float16-accumulator"),
        pytest.param(
            lambda x, w: (x.double() @ w.double().T * -15 + 16 * _sequential_product(x, w).double()).float(),
            id="sixteen-times-the-noise",
        ),
    ],
)
def test_a_float32_product_with_a_lower_precision_step_fails_at_the_output_scale(fault):
    """The output-scale judgement excuses an accumulator's rounding, not a lower precision:
    inputs rounded to TF32, a 16-bit accumulator, or sixteen times a correct kernel's
    error stay errors in a single run without terms."""
    x, w, bench = _dot_products()
    verdict = check(bench, fault(x, w), api="matmul")
    assert verdict.status == "error", verdict.message()
    assert "at the output's scale: accum_mean_ulp_err" in verdict.message()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_two_correct_kernels_differing_by_reduction_order_agree_with_a_reference(dtype):
    """The offline check of a real dump: the dump's kernel and the CPU reference sum in
    another order; their errors differ by noise that a 1.2x ratio of tiny metrics saw."""
    g = torch.randn(8, 32, generator=_generator(6)).to(dtype)
    x = torch.randn(8, 32, generator=_generator(7)).to(dtype)
    bench = (g.double() * x.double()).sum(0)
    device = (g * x).flip(0).cumsum(0)[-1]
    reference = (g * x).sum(0)
    verdict = check(bench, device, api="layer_norm", reference=reference, terms=(g.double() * x.double()).abs().sum(0))
    assert verdict.status == "pass", verdict.message()


def test_a_few_ulp_scale_fault_is_an_error_with_a_reference():
    x = torch.randn(4096, generator=_generator(8)).half()
    bench, reference = torch.exp(x.float()), torch.exp(x)
    faulty = (bench.double() * (1 + 2 * 2.0**-10)).half()
    verdict = check(bench, faulty, api="exp", reference=reference)
    assert verdict.status == "error" and "beyond the reference run" in verdict.message()


@pytest.mark.parametrize("size", [640, 2**17], ids=["small", "fast-path"])
def test_outputs_among_the_subnormals_are_judged_at_their_spacing(size, api="conv1d", dtype=torch.float16):
    """Below D's smallest normal value D's spacing stops shrinking: a correctly rounded
    output of subnormals (a float16 conv gradient from gradients scaled into them) is up
    to half a spacing off, 50% of a value one spacing large. It passes; one 8 spacings
    off in a tenth of its elements still fails."""
    info = torch.finfo(dtype)
    spacing = info.smallest_normal * info.eps
    bench = (torch.rand(size, generator=_generator(5), dtype=torch.float64) - 0.5) * 6 * spacing
    rounded = bench.to(dtype)
    assert check(bench, rounded, api=api).status == "pass", check(bench, rounded, api=api).message()
    off = rounded.double() + 8 * spacing * (torch.arange(size) % 10 == 0)
    assert check(bench, off.to(dtype), api=api).status == "error"


def test_terms_in_a_wider_dtype_than_the_bench_are_used():
    """Magnitudes given in float64 for a float32 bench (a float16 device) condition the
    verdict as float32 ones do; they were dropped without a word."""
    import torch

    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(16, 1024, generator=g).half(), torch.randn(8, 1024, generator=g).half()
    bench, device = x.float() @ w.float().T, x @ w.T
    terms = x.double().abs() @ w.double().abs().T
    wide = check(bench, device, api="linear", terms=terms)
    assert "cond_ulp_err_proportion" in wide.metrics
    narrow = check(bench, device, api="linear", terms=terms.float())
    assert wide.status == narrow.status
    assert wide.metrics == pytest.approx(narrow.metrics, rel=1e-6)
