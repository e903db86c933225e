"""The far-misrounding test (standards/misrounding.py): a 16-bit kernel that rounds
otherwise than to nearest fails on the elements the caller names as rounded once, and
nowhere else."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from kernels import round_toward_zero

from pytest_msprobe.standards import check
from pytest_msprobe.standards.dtypes import dtype_info
from pytest_msprobe.standards.fast import FAST_MIN_N
from pytest_msprobe.standards.misrounding import FAR_MIN, far_ulp


def _bench(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).float() * 3 + 0.5


def _moved(bench: torch.Tensor, dtype: torch.dtype, count: int, ulps: float) -> torch.Tensor:
    """b_D with its first `count` elements moved `ulps` ULPs of D away from zero."""
    d = bench.to(dtype).double()
    ulp = torch.from_numpy(np.ldexp(1.0, np.frexp(d.abs().numpy())[1] - 1 - dtype_info(dtype).mantissa_bits))
    d[:count] += torch.sign(d[:count]) * ulps * ulp[:count]
    return d.to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_truncation_of_64_elements_rounded_once_fails_and_names_the_test(dtype):
    bench = _bench(64)
    once = torch.ones(64, dtype=torch.bool)
    verdict = check(bench, round_toward_zero(bench, dtype), api="layer_norm", rounded_once=once)
    assert verdict.status == "error", verdict.message()
    assert "scale misrounding" in verdict.message()
    assert verdict.metrics["far_toward_zero"] >= FAR_MIN and verdict.metrics["far_away_from_zero"] == 0
    assert check(bench, bench.to(dtype), api="layer_norm", rounded_once=once).status == "pass"


def test_a_result_one_ulp_off_on_eight_elements_fails_and_on_seven_passes():
    """FAR_MIN one way: 8 elements a whole ULP away from zero fail, 7 do not (by this test;
    the sign tests need 26)."""
    bench, once = _bench(256, 3), torch.ones(256, dtype=torch.bool)
    eight = check(bench, _moved(bench, torch.bfloat16, FAR_MIN, 1.0), api="layer_norm", rounded_once=once)
    assert eight.status == "error" and "misrounding" in eight.message()
    seven = check(bench, _moved(bench, torch.bfloat16, FAR_MIN - 1, 1.0), api="layer_norm", rounded_once=once)
    assert seven.status == "pass", seven.message()


def test_only_the_elements_rounded_once_are_read():
    """The same fault outside the mask (gelu's cancelled tail, say) is no far misrounding;
    without a mask the test does not run at all."""
    bench = _bench(256, 4)
    device = _moved(bench, torch.bfloat16, 32, 1.0)
    inside = torch.zeros(256, dtype=torch.bool)
    inside[:32] = True
    assert check(bench, device, api="layer_norm", rounded_once=inside).metrics["far_away_from_zero"] == 32
    outside = check(bench, device, api="layer_norm", rounded_once=~inside)
    assert outside.metrics["far_away_from_zero"] == 0
    assert "far_away_from_zero" not in check(bench, device, api="layer_norm").metrics


def test_not_applied_to_float32_nor_to_outputs_the_sign_tests_decide():
    """float32's own result is what a kernel rounds: no opmath margin to test against.
    From fast.FAST_MIN_N elements on the sign tests alone are certain of truncation."""
    bench = _bench(4096, 5).double()
    verdict = check(
        bench,
        round_toward_zero(bench, torch.float32),
        api="layer_norm",
        rounded_once=torch.ones(4096, dtype=torch.bool),
    )
    assert "far_toward_zero" not in verdict.metrics
    large = _bench(FAST_MIN_N, 6)
    truncated = check(
        large,
        round_toward_zero(large, torch.bfloat16),
        api="layer_norm",
        rounded_once=torch.ones(FAST_MIN_N, dtype=torch.bool),
    )
    assert "far_toward_zero" not in truncated.metrics
    assert truncated.status == "error" and "scale (toward/away from zero) bias" in truncated.message()


def test_the_margin_is_half_an_ulp_and_64_float32_ulps():
    assert far_ulp(dtype_info(torch.bfloat16)) == 0.5 + 2.0**-10
    assert far_ulp(dtype_info(torch.float16)) == 0.5 + 2.0**-7


def test_against_a_reference_run_too():
    """The test needs no reference, and a reference run that rounds correctly does not
    excuse a device that truncates."""
    bench = _bench(64, 7)
    once = torch.ones(64, dtype=torch.bool)
    verdict = check(
        bench, round_toward_zero(bench, torch.bfloat16), api="layer_norm", reference=bench.bfloat16(), rounded_once=once
    )
    assert verdict.status == "error" and "scale misrounding" in verdict.message()
