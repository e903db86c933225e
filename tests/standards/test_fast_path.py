"""The fused path (standards/fast.py) gives the plain path's verdicts and metrics.

Large outputs (n >= fast.FAST_MIN_N) are judged by one chunked pass; small ones by
metrics.Pair. Here FAST_MIN_N is lowered to 0 so the calibration corpus (correct
kernels, gradients, planted faults) is judged both ways under every shipped standard,
and larger synthetic outputs exercise the two-thread split, the last partial chunk,
small elements, inf/NaN (which falls back to the plain path) and every dtype.
Counts, statuses, reasons and thresholds must be identical; sums (means, rmse, bias)
may differ by summation order only.
"""

import dataclasses
import math

import numpy as np
import pytest
import torch
from kernels import backward_cases, correct_cases, faults, valid_rewrites

from pytest_msprobe.standards import check, fast
from pytest_msprobe.standards.dtypes import dtype_info
from pytest_msprobe.standards.metrics import Pair
from pytest_msprobe.standards.pass_results import SignCounts, ThresholdCounts, UlpSums

APIS = ("relu", "add", "matmul", "conv2d", "cumsum", "exp")


def _judge_both(monkeypatch, bench, device, api):
    monkeypatch.setattr(fast, "FAST_MIN_N", 1 << 62)
    plain = check(bench, device, api=api)
    monkeypatch.setattr(fast, "FAST_MIN_N", 0)
    fused = check(bench, device, api=api)
    return plain, fused


def _same(plain, fused):
    for a, c in zip(plain.outputs or (plain,), fused.outputs or (fused,), strict=True):
        where = (a.path, a.standard)
        assert a.status == c.status, where
        assert list(a.metrics) == list(c.metrics), where
        for key, x in a.metrics.items():
            y = c.metrics[key]
            assert x == y or (math.isfinite(x) and math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12)), (where, key, x, y)
        assert a.thresholds == c.thresholds, where
        assert len(a.reasons) == len(c.reasons), where
        assert len(a.worst) == len(c.worst), where


CORPUS = list(correct_cases(seeds=(0,))) + list(valid_rewrites()) + list(backward_cases(seeds=(0,))) + list(faults())


@pytest.mark.parametrize("api", APIS)
def test_corpus_same_verdicts_both_paths(monkeypatch, api):
    for _name, _api, bench, device in CORPUS:
        _same(*_judge_both(monkeypatch, bench, device, api))


def _synthetic(dtype, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    b = torch.randn(n, generator=g, dtype=torch.float64) * 3
    b[::97] *= 1e-7  # small elements
    b[5] = 0.0
    d = b.to(dtype).clone()
    d[n // 3] = d[n // 3] * 1.01  # one wrong element
    return b, d


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_large_outputs_same_verdicts_and_worst(monkeypatch, dtype):
    n = 4 * fast.CHUNK + 1234  # two threads and a partial chunk
    b, d = _synthetic(dtype, n)
    calls = []
    real_run = fast.run
    monkeypatch.setattr(fast, "run", lambda *a, **k: calls.append(1) or real_run(*a, **k))
    for api in APIS:
        plain, fused = _judge_both(monkeypatch, b, d, api)
        _same(plain, fused)
        if api != "relu" and fused.status != "pass":
            assert fused.worst and fused.worst[0] == plain.worst[0], api
        if fused.status == "pass" and api in ("matmul", "conv2d", "exp"):
            # ulp, thousandth and benchmark name them only for a failure message
            assert fused.worst == plain.worst == (), api
    bad = d.clone()
    k = bad[::10].numel()  # every standard fails: worst named
    bad[::10] = (bad[::10].double() * torch.linspace(1.1, 1.3, k, dtype=torch.float64)).to(
        dtype
    )  # distinct errors: no ties in the top 5
    for api in APIS:
        plain, fused = _judge_both(monkeypatch, b, bad, api)
        _same(plain, fused)
        assert fused.status == "error", api
        if api != "relu":
            assert fused.worst and fused.worst[0] == plain.worst[0], api
    assert calls  # the fused pass did run
    for api in APIS:  # a correct output passes both ways
        plain, fused = _judge_both(monkeypatch, b, b.to(dtype).clone(), api)
        _same(plain, fused)


def test_nonfinite_falls_back_to_plain_path(monkeypatch):
    b, d = _synthetic(torch.float32, 3 * fast.CHUNK + 7, seed=1)
    b[10], d[10] = float("inf"), float("inf")
    d[20] = float("nan")
    b[30] = d[30] = float("nan")
    for api in APIS:
        plain, fused = _judge_both(monkeypatch, b, d, api)
        _same(plain, fused)
        assert plain.status == "error"


def test_binary_offenders_are_the_first_differing(monkeypatch):
    n = 4 * fast.CHUNK + 5
    b = torch.arange(n, dtype=torch.float64)
    d = b.to(torch.float32).clone()
    for i in (7, n - 3, 3 * fast.CHUNK + 1):
        d[i] += 1
    d[11] = b[11] = float("nan")  # NaN matches NaN
    plain, fused = _judge_both(monkeypatch, b, d, "relu")
    _same(plain, fused)
    assert [o.index for o in fused.worst] == [(7,), (3 * fast.CHUNK + 1,), (n - 3,)]
    assert fused.metrics["error_rate"] == 3 / n


def test_kth_values_exact():
    x = np.random.default_rng(0).standard_normal(300_000) ** 2
    ks = [0, 12345, 150_000, 299_999]
    assert fast._kth_values(x, ks) == [np.sort(x)[k] for k in ks]
    sorted_x = np.sort(x)  # adversarial order for the subsample
    assert fast._kth_values(sorted_x, ks) == [sorted_x[k] for k in ks]


# ------------------------------------------------------------------ with a reference
def _judge_both_ref(monkeypatch, bench, device, api, reference):
    monkeypatch.setattr(fast, "FAST_MIN_N", 1 << 62)
    plain = check(bench, device, api=api, reference=reference)
    monkeypatch.setattr(fast, "FAST_MIN_N", 0)
    fused = check(bench, device, api=api, reference=reference)
    return plain, fused


def _same_ref(plain, fused):
    _same(plain, fused)
    for a, c in zip(plain.outputs or (plain,), fused.outputs or (fused,), strict=True):
        assert a.reference == c.reference, a.path
        assert a.reasons == c.reasons, (a.path, a.reasons, c.reasons)


def _noisy(b, dtype, ulps, seed):
    """b rounded to dtype, then moved by up to `ulps` ULP-ish relative noise (in dtype)."""
    g = torch.Generator().manual_seed(seed)
    eps = torch.finfo(dtype).eps
    noise = (torch.rand(b.numel(), generator=g, dtype=torch.float64) - 0.5) * (2 * ulps * eps)
    return (b * (1 + noise)).to(dtype)


REF_APIS = ("exp", "matmul")  # benchmark, ulp


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_reference_outputs_and_baseline_same_verdicts(monkeypatch, dtype):
    n = 4 * fast.CHUNK + 1234  # two threads and a partial chunk
    b, _ = _synthetic(dtype, n, seed=2)
    ref = _noisy(b, dtype, 2.0, seed=3)  # another implementation
    good = _noisy(b, dtype, 1.0, seed=4)  # better than the reference
    # far worse: fails every ratio (fp32 ULP: also msprobe's mean < 64 ULP rule)
    bad = _noisy(b, dtype, 400.0 if dtype == torch.float32 else 40.0, seed=5)
    calls = []
    real_run = fast.run
    monkeypatch.setattr(fast, "run", lambda pair, spec: calls.append(spec) or real_run(pair, spec))
    for api in APIS:
        monkeypatch.setattr(fast, "FAST_MIN_N", 1 << 62)
        base = {"": dict(check(b, ref, api=api).metrics)}  # a baseline's recorded metrics
        for reference, kind in ((ref, "reference"), (base, "baseline")):
            statuses = []
            for device in (good, bad):
                plain, fused = _judge_both_ref(monkeypatch, b, device, api, reference)
                _same_ref(plain, fused)
                assert fused.reference == kind, (api, kind)
                if fused.status != "pass":
                    assert fused.worst and fused.worst[0] == plain.worst[0], (api, kind)
                statuses.append(fused.status)
            if api in REF_APIS:
                assert statuses == ["pass", "error"], (api, kind, statuses)
    assert any(spec.benchmark_ideal for spec in calls) and any(spec.ulp_threshold is not None for spec in calls)
    # a baseline lacking the judged metrics: the single-run rule, both ways
    for api in REF_APIS:
        plain, fused = _judge_both_ref(monkeypatch, b, bad, api, {"": {"eb": 0.0}})
        _same_ref(plain, fused)


def test_reference_structure_and_nonfinite_fall_back(monkeypatch):
    n = 3 * fast.CHUNK + 7
    b, _ = _synthetic(torch.float32, n, seed=6)
    ref = _noisy(b, torch.float32, 2.0, seed=7)
    dev = _noisy(b, torch.float32, 3.0, seed=8)
    for api in REF_APIS:  # a structure of outputs
        bench = {"a": b, "b": [b * 2]}
        plain, fused = _judge_both_ref(monkeypatch, bench, {"a": dev, "b": [dev * 2]}, api, {"a": ref, "b": [ref * 2]})
        _same_ref(plain, fused)
    nan_ref = ref.clone()
    nan_ref[17] = float("nan")  # the reference's pass declines
    inf_dev = dev.clone()
    inf_dev[3] = float("inf")  # the device's pass declines
    for api in REF_APIS:
        for device, reference in ((dev, nan_ref), (inf_dev, ref), (inf_dev, nan_ref)):
            plain, fused = _judge_both_ref(monkeypatch, b, device, api, reference)
            _same_ref(plain, fused)


# ------------------------------------------------------------------ the pass's spec and results
def _pair(n=3 * fast.CHUNK + 7):
    b, d = _synthetic(torch.float32, n, seed=9)
    return Pair(b, d, dtype_info("float32"), bench_dtype="float64", device_dtype="float32")


def test_a_misspelt_metric_is_refused_by_name():
    """The spec is typed: a keyword no metric has raises, naming it, where a dict of
    keywords once ignored it."""
    with pytest.raises(TypeError, match="ulp_treshold"):
        fast.PassSpec(ulp_treshold=1.0)
    with pytest.raises(TypeError, match="ulp_treshold"):
        fast.run(_pair(), ulp_treshold=1.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.PassSpec().sumsq = True
    with pytest.raises(ValueError, match="offend='scaled' needs scaled_rms"):
        fast.PassSpec(offend="scaled")  # its offenders would be scored by nothing


def test_results_name_their_metrics_and_refuse_one_not_asked():
    pair = _pair()
    res = fast.run(pair, fast.PassSpec(ulp_threshold=1.0, signs="balance"))
    assert res is not None
    ulp = res.of(UlpSums)
    err = np.abs(pair.d - pair.b) / (2.0 ** (np.floor(np.log2(np.abs(pair.b) + (pair.b == 0))) - 23))
    assert ulp.max == pytest.approx(err.max()) and ulp.count == int(np.count_nonzero(err > 1.0))
    signs = res.of(SignCounts)
    assert (signs.up, signs.down) == pair.sign_counts
    with pytest.raises(KeyError, match="ThresholdCounts"):
        res.of(ThresholdCounts)
