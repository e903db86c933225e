"""Each metric against hand-computed values (spec definitions), per dtype, edge cases."""

import math

import numpy as np
import pytest
import torch

from pytest_msprobe.standards import check
from pytest_msprobe.standards.dtypes import dtype_info
from pytest_msprobe.standards.metrics import Pair, ulp_of


def pair(b, d, dtype="float32", bench_dtype=None):
    info = dtype_info(dtype)
    bd = bench_dtype or ("float64" if dtype in ("float32", "float64") else "float32")
    return Pair(np.asarray(b, float), np.asarray(d, float), info, bench_dtype=bd, device_dtype=dtype)


def test_ulp_of_follows_spec_exponent_rule():
    info = dtype_info("float16")
    assert list(ulp_of(np.array([1.0, 1.5, 2.0, 0.0, 2.0**-20]), info)) == [
        2.0**-10,
        2.0**-10,
        2.0**-9,
        2.0**-24,
        2.0**-24,
    ]
    assert ulp_of(np.array([1.0]), dtype_info("bfloat16"))[0] == 2.0**-7
    assert ulp_of(np.array([0.0]), dtype_info("float32"))[0] == 2.0 ** (-126 - 23)


@pytest.mark.parametrize("dtype,tiny", [("float32", 2.0**-52), ("float16", 2.0**-23), ("bfloat16", 2.0**-8)])
def test_rel_err_tiny_per_dtype(dtype, tiny):
    p = pair([2.0, 0.0], [2.5, 1.0], dtype)
    assert p.rel_err[0] == pytest.approx(0.5 / (2.0 + tiny))
    assert p.rel_err[1] == 1.0 / tiny


def test_ulp_metrics_hand_computed():
    # fp16: b = 1.0 (ulp 2**-10), d = 1 + 3*2**-10 -> 3 ulp; b = 4, d = 4 -> 0
    v = check(torch.tensor([1.0, 4.0]), torch.tensor([1 + 3 * 2**-10, 4.0], dtype=torch.float16), api="matmul")
    assert v.standard == "ulp"
    assert v.metrics["max_ulp_err"] == 3.0 and v.metrics["mean_ulp_err"] == 1.5
    assert v.metrics["ulp_err_proportion"] == 0.5 and v.status == "error"


def test_absolute_threshold_ratios_hand_computed():
    b = torch.tensor([1.0, 2.0, 1e-9, 3.0, float("inf"), float("nan")], dtype=torch.float64)
    d = torch.tensor([1.0, 2.0 * (1 + 2e-6), 1e-9 + 1e-8, 3.0, float("inf"), 0.0])
    v = check(b, d, api="add")
    assert v.metrics["inf_nan_error_ratio"] == 0.5  # nan vs 0 disagrees, inf==inf
    assert v.metrics["rel_err_ratio"] == pytest.approx(1 / 3)
    assert v.metrics["abs_err_ratio"] == 1.0  # small: 1e-8 > 1e-9 (table)
    assert v.status == "error"


def test_binary_consistency_error_rate_and_ints():
    v = check(torch.tensor([1, 2, 3, 2**62]), torch.tensor([1, 2, 4, 2**62 + 1]), api="add")
    assert v.standard == "binary_consistency" and v.metrics["error_rate"] == 0.5
    assert v.worst[0].index == (2,)
    assert check(torch.tensor([True]), torch.tensor([True]), api="x").status == "pass"


def test_benchmark_metrics_hand_computed():
    b = np.array([1.0, 2.0, 1e-7, 4.0])
    d = np.array([1.0 + 2**-20, 2.0, 1e-7 + 1e-8, 4.0], dtype=np.float32)
    p_metrics = check(b, d, api="exp").metrics
    abs1 = abs(float(np.float32(1.0 + 2**-20)) - 1.0)
    assert p_metrics["small_value_err_ratio"] == 1.0  # 1e-8-ish > 2**-30
    assert p_metrics["rmse"] == pytest.approx(math.sqrt(abs1**2 / 3))
    assert p_metrics["max_rel_err"] == pytest.approx(abs1 / (1 + 2**-52))
    assert p_metrics["mean_rel_err"] == pytest.approx(abs1 / 3, rel=1e-9)
    assert p_metrics["eb"] == 0.25 or p_metrics["eb"] == 0.5


def test_error_balance_counts_against_bench_rounded():
    b = np.array([1.0 + 2**-30, 2.0, 3.0, 4.0])  # rounds to 1.0 in fp32: no error
    d = np.array([1.0, 2.0 + 2**-22, 3.0, 4.0], dtype=np.float32)
    assert check(b, d, api="exp").metrics["eb"] == 0.25


def test_thousandth_and_legacy_shares():
    b = np.ones(1000)
    d = np.ones(1000, dtype=np.float32)
    d[0] = 1.02  # rel err 0.02
    d[1] = 1.002
    v = check(b, d, api="conv2d")
    assert v.standard == "thousandth"
    assert v.metrics["rel_err_thousandth"] == pytest.approx(0.998, abs=1e-12)
    assert v.metrics["rel_err_hundredth"] == pytest.approx(0.999, abs=1e-12)  # only 1.02 is off by 1%
    assert v.metrics["cosine"] < 1 and v.status == "error"


def test_accumulative_error_bound_and_eb():
    b = np.linspace(-5, 5, 4000)
    v = check(b, (b * (1 + 2**-9)).astype(np.float16), api="cumsum")
    assert v.standard == "accumulative_error" and v.status == "error"
    assert v.metrics["eb"] == 0 and v.metrics["scale_eb"] > 0.3  # spec eb is blind to it


@pytest.mark.parametrize(
    "dtype",
    [torch.float32, torch.float16, torch.bfloat16, torch.float64]
    + [getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n)],
)
@pytest.mark.parametrize("api", ["exp", "matmul", "add", "conv2d", "cumsum", "relu"])
def test_edge_cases_every_dtype(dtype, api):
    bench_dtype = torch.float64 if dtype in (torch.float32, torch.float64) else torch.float32
    vals = torch.tensor([0.0, -0.0, 1.0, -2.0, float("-inf"), float("inf"), float("nan"), 2**-30])
    b, d = vals.to(bench_dtype), vals.to(dtype)
    v = check(b.to(dtype).to(bench_dtype), d, api=api)
    assert v.status == "pass", v.message()
    for key in ("cosine", "max_abs_err", "rel_err_thousandth"):
        assert key in v.metrics and not math.isnan(v.metrics[key])
    # empty and 0-d
    assert check(b[:0], d[:0], api=api).status == "pass"
    assert check(b[2], d[2], api=api).status == "pass"
    bad = d.clone()
    bad[2] = float("nan")
    assert check(b, bad, api=api).status == "error"


def test_fp8_has_constants():
    info = dtype_info("float8_e4m3fn")
    assert info.mantissa_bits == 3 and info.defaults["rtol"] == 2**-3
    b = torch.randn(256).to(torch.float8_e4m3fn).float()
    assert check(b, b.to(torch.float8_e4m3fn), api="gelu").status == "pass"
