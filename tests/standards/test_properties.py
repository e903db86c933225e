"""hypothesis properties of every standard (deterministic, small budget)."""

import typing

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_msprobe.standards import check
from pytest_msprobe.standards.verdict import STATUS_ORDER, Status, worst_status

settings.register_profile(
    "standards", max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("standards")

APIS = ["relu", "add", "matmul", "conv2d", "cumsum", "exp"]  # one per standard
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
RAISED = {torch.float32: torch.float64, torch.float16: torch.float32, torch.bfloat16: torch.float32}

values = st.lists(st.floats(-1e4, 1e4, allow_nan=False, width=32), min_size=1, max_size=64)


def bench_device(vals, dtype):
    d = torch.tensor(vals, dtype=torch.float64).to(dtype)
    return d.to(RAISED[dtype]), d


@given(values, st.sampled_from(DTYPES), st.sampled_from(APIS))
def test_identical_inputs_pass_with_zero_error(vals, dtype, api):
    b, d = bench_device(vals, dtype)
    v = check(b, d, api=api)
    assert v.status == "pass", v.message()
    for key in (
        "error_rate",
        "max_ulp_err",
        "rmse",
        "max_rel_err",
        "rel_err_ratio",
        "max_abs_err",
        "inf_nan_error_ratio",
        "eb",
    ):
        assert v.metrics.get(key, 0.0) == 0.0


@given(values, st.sampled_from(DTYPES), st.sampled_from(APIS), st.floats(1e-3, 1.0), st.integers(0, 63))
def test_adding_error_never_improves(vals, dtype, api, rel, where):
    b, d = bench_device(vals, dtype)
    i = where % len(vals)
    worse = d.clone()
    worse[i] = (d[i].double() * (1 + rel) + rel).to(dtype)
    assert STATUS_ORDER[check(b, worse, api=api).status] >= STATUS_ORDER[check(b, d, api=api).status]


@given(
    values,
    st.sampled_from(DTYPES),
    st.sampled_from(APIS),
    st.sampled_from([float("nan"), float("inf"), float("-inf")]),
    st.integers(0, 63),
)
def test_unexpected_nonfinite_is_always_error(vals, dtype, api, bad, where):
    b, d = bench_device(vals, dtype)
    i = where % len(vals)
    d = d.clone()
    d[i] = bad
    v = check(b, d, api=api)
    assert v.status == "error", v.message()


@given(values, st.sampled_from(DTYPES), st.sampled_from(APIS), st.booleans(), st.integers(0, 63))
def test_matching_infinities_agree(vals, dtype, api, negative, where):
    b, d = bench_device(vals, dtype)
    i = where % len(vals)
    b, d = b.clone(), d.clone()
    b[i] = d[i] = float("-inf") if negative else float("inf")
    assert check(b, d, api=api).status == "pass"


@given(values, st.sampled_from(DTYPES), st.sampled_from(APIS), st.floats(0, 0.05), st.randoms(use_true_random=False))
def test_permutation_does_not_change_verdict(vals, dtype, api, rel, rnd):
    b, d = bench_device(vals, dtype)
    d = (d.double() * (1 + rel)).to(dtype)
    perm = list(range(len(vals)))
    rnd.shuffle(perm)
    perm = torch.tensor(perm)
    v1, v2 = check(b, d, api=api), check(b[perm], d[perm], api=api)
    assert v1.status == v2.status
    for key, val in v1.metrics.items():
        if key in ("cosine",):
            assert v2.metrics[key] == pytest.approx(val, abs=1e-12)
        elif key not in ("rmse", "mean_rel_err", "mean_ulp_err", "mean_scaled_ulp_err", "bias_ulp", "scale_bias_ulp"):
            assert v2.metrics[key] == val, key
        else:
            assert v2.metrics[key] == pytest.approx(val, rel=1e-9, abs=1e-300)


def test_statuses_are_the_ordered_ones():
    """Status (the type every status field carries) and STATUS_ORDER name the same four
    statuses, so no status is typed that the plugin and the scripts cannot rank."""
    assert set(typing.get_args(Status)) == set(STATUS_ORDER)
    assert worst_status(["pass", "skip", "warning"]) == "warning"
    assert worst_status([]) == "skip"
