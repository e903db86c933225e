"""Routing tables, user overrides, nested pairing and references."""

import dataclasses

import pytest
import torch

from pytest_msprobe.standards import Offender, Registry, Verdict, check
from pytest_msprobe.standards.verdict import DETAIL_METRICS


@pytest.mark.parametrize(
    "api,standard",
    [
        ("linear", "ulp"),
        ("__matmul__", "ulp"),
        ("baddbmm_", "ulp"),
        ("add_", "absolute_threshold"),
        ("__iadd__", "absolute_threshold"),
        ("__radd__", "absolute_threshold"),
        ("__rmul__", "absolute_threshold"),
        ("__truediv__", "absolute_threshold"),
        ("conv2d", "thousandth"),
        ("masked_fill_", "binary_consistency"),
        ("relu", "binary_consistency"),
        ("npu_fusion_attention", "benchmark"),
        ("unknown_api", "benchmark"),
    ],
)
def test_routing(api, standard):
    assert Registry.default().standard_for(api, torch.float16) == standard


def test_integer_output_is_always_binary():
    reg = Registry.default()
    assert reg.standard_for("linear", torch.int64) == "binary_consistency"
    assert reg.standard_for("linear", "bool") == "binary_consistency"


def test_grading_levels_and_absolute_table():
    reg = Registry.default()
    assert reg.thresholds_for("embedding", "float16")["max_rel_err_ratio"] == 5
    assert reg.thresholds_for("matmul", "float32")["rmse_ratio"] == 1.2
    assert reg.thresholds_for("exp", "float32")["mean_rel_err_ratio"] == 2
    assert reg.thresholds_for("__iadd__", "bfloat16")["rtol"] == 4e-3
    assert reg.thresholds_for("relu", "bfloat16")["rtol"] == 2**-8


def test_default_is_a_fresh_copy_and_user_file(tmp_path):
    reg = Registry.default()
    reg.set_api_standard("linear", "benchmark")
    assert Registry.default().standard_for("linear", "float32") == "ulp"
    f = tmp_path / "mine.csv"
    f.write_text(
        "api,standard,dtype,threshold,value\nmy_op,binary_consistency,,,\nexp,,float32,sr_max_scaled_ulp,0.25\n"
    )
    reg.load_file(f)
    assert reg.standard_for("my_op", "float32") == "binary_consistency"
    b = torch.linspace(0.5, 2, 100, dtype=torch.float64)
    assert reg.check(b, (b * (1 + 2**-23)).float(), api="exp").status == "error"
    assert check(b, (b * (1 + 2**-23)).float(), api="exp").status == "pass"


def test_register_user_standard():
    reg = Registry.default()

    def always_warn(pair, thresholds, reference):
        return pair.verdict("warning", "mine", {"n": float(pair.n)}, {}, ("mine",))

    reg.register_standard("mine", always_warn)
    reg.set_api_standard("foo", "mine")
    v = reg.check(torch.ones(3, dtype=torch.float64), torch.ones(3), api="foo")
    assert (v.status, v.standard, v.metrics["n"]) == ("warning", "mine", 3.0)
    assert "cosine" in v.metrics  # legacy metrics always reported


def test_nested_structure_and_mismatches():
    b = (torch.ones(2, dtype=torch.float64), {"k": torch.zeros(3), "n": None}, 3)
    d = (torch.ones(2), {"k": torch.zeros(3), "n": None}, 3)
    v = check(b, d, api="x")
    assert v.status == "pass" and [o.path for o in v.outputs] == ["[0]", "[1]['k']", "[1]['n']", "[2]"]
    assert v.outputs[2].status == "skip"
    bad = (torch.ones(2), {"k": torch.zeros(4), "n": None}, 3)
    v = check(b, bad, api="x")
    assert v.status == "error" and "[1]['k']" in v.reasons[0] and "shape" in v.reasons[0]
    assert check(b[:2], d, api="x").reasons[0].startswith("output: length mismatch")
    assert "keys differ" in check({"a": 1}, {"b": 1}, api="x").reasons[0]
    assert "dtype" in check(torch.ones(2, dtype=torch.int64), torch.ones(2), api="x").reasons[0]
    assert "narrower" in check(torch.ones(2, dtype=torch.float16), torch.ones(2), api="x").reasons[0]
    assert check(None, None, api="x").status == "skip"
    assert check(torch.float32, torch.float32, api="x").status == "skip"
    assert check(1.5, 1.5, api="x").status == "pass"
    v = check((torch.ones(2, dtype=torch.float64), 1), (torch.ones(2) * 2, 1), api="x")
    assert v.status == "error" and v.outputs[0].status == "error" and v.metrics == v.outputs[0].metrics
    assert "[0]" in v.message()


def test_reference_tensors_and_baseline():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, generator=g).half()
    bench = torch.exp(x.float())
    ref = torch.exp(x)
    good = ref.clone()
    v = check(bench, good, api="exp", reference=ref)
    assert v.status == "pass" and v.reference == "reference" and v.metrics["ref_rmse"] >= 0
    noisy = (bench.double() * (1 + 4 * 2.0**-10)).half()
    v = check(bench, noisy, api="exp", reference=ref)
    assert v.status == "error" and v.metrics["rmse_ratio"] > 2
    base = check(bench, good, api="exp")
    assert check(bench, noisy, api="exp", reference=base).reference == "baseline"
    assert check(bench, noisy, api="exp", reference=base).status == "error"
    assert check(bench, good, api="exp", reference={"": dict(base.metrics)}).status == "pass"
    # ULP with a reference: passes where the share is no worse than the reference's
    v = check(bench, good, api="matmul", reference=ref)
    assert v.status == "pass" and v.reference == "reference"


def test_verdict_is_frozen_and_message_readable():
    v = check(torch.tensor([1.0, 2.0], dtype=torch.float64), torch.tensor([1.0, 3.0]), api="add")
    with pytest.raises(dataclasses.FrozenInstanceError):
        v.status = "pass"
    msg = v.message()  # what failed: the scaled ratio, not the spec's ratios that passed
    assert "absolute_threshold" in msg and "scaled_err_ratio = 0.5  (limit 0)" in msg and "[1]: 3.0 vs 2.0" in msg
    assert "rel_err_ratio" not in msg and "rel_err_ratio = " in v.message(DETAIL_METRICS)
    assert isinstance(v.worst[0], Offender) and isinstance(v, Verdict)
