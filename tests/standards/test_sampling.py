"""The single-run rule on outputs larger than its statistical sample (single_run.py, 4.).

Its bias statistics and mean scaled ULP error are computed on every
sample_step(n)-th block of fast.CHUNK elements (about STAT_SAMPLE elements); its maxima
and the spec's metrics on every element. Here, on an output twice the sample: a
correct output passes, faults that only the bias statistics catch are still errors, both
paths take the same sample (same verdicts and metrics), and an RMS guessed in the wrong
binade makes the fused pass repeat itself rather than change a result.
"""

import pytest
import torch
from kernels import round_toward_zero

from pytest_msprobe.standards import check, fast, single_run

N = 2 * single_run.STAT_SAMPLE + 12345


def _both(monkeypatch, bench, device, api):
    """(plain path's verdict, fused path's verdict)."""
    saved = fast.FAST_MIN_N
    monkeypatch.setattr(fast, "FAST_MIN_N", 1 << 62)
    plain = check(bench, device, api=api)
    monkeypatch.setattr(fast, "FAST_MIN_N", saved)
    return plain, check(bench, device, api=api)


def _assert_same(plain, fused):
    assert plain.status == fused.status
    assert plain.reasons == fused.reasons
    for key, x in plain.metrics.items():
        assert x == pytest.approx(fused.metrics[key], rel=1e-9, abs=1e-12), key


def _bench(seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.exp(torch.randn(N, generator=g))  # a raised (float32) bench


def test_sample_is_a_strict_subset():
    blocks = single_run.sample_blocks(N)
    sampled = sum(s.stop - s.start for s in blocks)
    assert single_run.sample_step(N) == 2
    assert single_run.STAT_SAMPLE <= sampled < N


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("api", ["exp", "matmul", "conv2d", "mul"])  # benchmark, ulp, thousandth, absolute threshold
def test_correct_output_passes_and_bias_faults_fail(monkeypatch, dtype, api):
    bench = _bench()
    correct = bench.to(dtype)
    plain, fused = _both(monkeypatch, bench, correct, api)
    _assert_same(plain, fused)
    assert fused.status == "pass", fused.message()

    # rounding toward zero: every error within 1 ULP, so no maximum sees it
    rtz = round_toward_zero(bench, dtype)
    plain, fused = _both(monkeypatch, bench, rtz, api)
    _assert_same(plain, fused)
    assert fused.status == "error"
    assert any("systematic scale" in r for r in fused.reasons), fused.reasons

    # an additive bias of half an ULP at the output's RMS, rounded to nearest
    ulp_rms = float(
        2.0 ** torch.floor(torch.log2(bench.double().square().mean().sqrt()))
        * 2.0 ** -{torch.float16: 10, torch.bfloat16: 7}[dtype]
    )
    shifted = (bench.double() + 0.5 * ulp_rms).to(dtype)
    plain, fused = _both(monkeypatch, bench, shifted, api)
    _assert_same(plain, fused)
    assert fused.status == "error"
    assert any("systematic additive" in r for r in fused.reasons), fused.reasons


def test_rms_guess_in_another_binade_repeats_the_pass(monkeypatch):
    bench = torch.randn(N, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    # large elements between the quantile sample's: the sample's RMS is ~1, the output's ~8
    step = N // fast.QUANTILE_SAMPLE
    bench[step // 2 :: step] = 200.0
    device = bench.to(torch.float32)
    passes = []
    real_run = fast.run
    monkeypatch.setattr(fast, "run", lambda pair, spec: passes.append(spec) or real_run(pair, spec))
    plain, fused = _both(monkeypatch, bench, device, "exp")
    _assert_same(plain, fused)
    assert fused.status == "pass"
    assert [spec.sumsq for spec in passes] == [True, False]  # guessed, then exact
