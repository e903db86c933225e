"""The fused path (standards/fast.py) gives the plain path's verdicts and metrics.

Large outputs (n >= fast.FAST_MIN_N) are judged by one chunked pass; small ones by
metrics.Pair. Here FAST_MIN_N is lowered to 0 so the calibration corpus (correct
kernels, gradients, planted faults) is judged both ways under every shipped standard,
and larger synthetic outputs exercise the two-thread split, the last partial chunk,
small elements, inf/NaN (which falls back to the plain path) and every dtype.
Counts, statuses, reasons and thresholds must be identical; sums (means, rmse, bias)
may differ by summation order only.
"""
import math

import numpy as np
import pytest
import torch

from pytest_msprobe.standards import check, fast

from kernels import backward_cases, correct_cases, faults, valid_rewrites

APIS = ("relu", "add", "matmul", "conv2d", "cumsum", "exp")


def _judge_both(monkeypatch, bench, device, api):
    monkeypatch.setattr(fast, "FAST_MIN_N", 1 << 62)
    plain = check(bench, device, api=api)
    monkeypatch.setattr(fast, "FAST_MIN_N", 0)
    fused = check(bench, device, api=api)
    return plain, fused


def _same(plain, fused):
    for a, c in zip(plain.outputs or (plain,), fused.outputs or (fused,)):
        where = (a.path, a.standard)
        assert a.status == c.status, where
        assert list(a.metrics) == list(c.metrics), where
        for key, x in a.metrics.items():
            y = c.metrics[key]
            assert x == y or (math.isfinite(x) and math.isclose(x, y, rel_tol=1e-9,
                                                                abs_tol=1e-12)), (where, key, x, y)
        assert a.thresholds == c.thresholds, where
        assert len(a.reasons) == len(c.reasons), where
        assert len(a.worst) == len(c.worst), where


CORPUS = (list(correct_cases(seeds=(0,))) + list(valid_rewrites())
          + list(backward_cases(seeds=(0,))) + list(faults()))


@pytest.mark.parametrize("api", APIS)
def test_corpus_same_verdicts_both_paths(monkeypatch, api):
    for _name, _api, bench, device in CORPUS:
        _same(*_judge_both(monkeypatch, bench, device, api))


def _synthetic(dtype, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    b = torch.randn(n, generator=g, dtype=torch.float64) * 3
    b[::97] *= 1e-7                                   # small elements
    b[5] = 0.0
    d = b.to(dtype).clone()
    d[n // 3] = d[n // 3] * 1.01                      # one wrong element
    return b, d


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_large_outputs_same_verdicts_and_worst(monkeypatch, dtype):
    n = 4 * fast.CHUNK + 1234                         # two threads and a partial chunk
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
    k = bad[::10].numel()                             # every standard fails: worst named
    bad[::10] = (bad[::10].double() * torch.linspace(1.1, 1.3, k, dtype=torch.float64)
                 ).to(dtype)                          # distinct errors: no ties in the top 5
    for api in APIS:
        plain, fused = _judge_both(monkeypatch, b, bad, api)
        _same(plain, fused)
        assert fused.status == "error", api
        if api != "relu":
            assert fused.worst and fused.worst[0] == plain.worst[0], api
    assert calls                                      # the fused pass did run
    for api in APIS:                                  # a correct output passes both ways
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
    d[11] = b[11] = float("nan")                      # NaN matches NaN
    plain, fused = _judge_both(monkeypatch, b, d, "relu")
    _same(plain, fused)
    assert [o.index for o in fused.worst] == [(7,), (3 * fast.CHUNK + 1,), (n - 3,)]
    assert fused.metrics["error_rate"] == 3 / n


def test_kth_values_exact():
    x = np.random.default_rng(0).standard_normal(300_000) ** 2
    ks = [0, 12345, 150_000, 299_999]
    assert fast._kth_values(x, ks) == [np.sort(x)[k] for k in ks]
    sorted_x = np.sort(x)                             # adversarial order for the subsample
    assert fast._kth_values(sorted_x, ks) == [sorted_x[k] for k in ks]
