"""The registry contract the plugin relies on, and a float16/bfloat16 smoke run of every
built-in reference (dtype preserved, finite)."""

import inspect

import pytest
import torch

from pytest_msprobe import bench_functions
from pytest_msprobe.bench_functions import BenchFunction, Companions, Registry

REQUIRED = [
    "npu_fusion_attention",
    "npu_fusion_attention_grad",
    "npu_rms_norm",
    "npu_rotary_mul",
    "npu_swiglu",
    "npu_scaled_masked_softmax",
    "fast_gelu",
    "npu_fast_gelu",
    "npu_linear",
    "npu_confusion_transpose",
    "npu_layer_norm_eval",
    "npu_apply_adam",
    "npu_apply_adam_w",
    "npu_group_norm_silu",
    "npu_mish",
    "npu_moe_gating_top_k_softmax",
    "npu_sort_v2",
    "matmul_backward",
]


def test_required_ops_present_with_attributes():
    assert set(REQUIRED) <= set(bench_functions.names())
    assert bench_functions.names() == sorted(bench_functions.names())
    for name in REQUIRED:
        f = bench_functions.get(name)
        assert isinstance(f, BenchFunction) and f.name == name and f.builtin
        assert f.facts, f"{name} cites no documented facts"
        assert f.doc and f.source.startswith("pytest_msprobe.bench_functions.")


def test_signatures_match_torch_npu():
    sig = inspect.signature(bench_functions.get("npu_fusion_attention"))
    assert list(sig.parameters)[:5] == ["query", "key", "value", "head_num", "input_layout"]
    assert sig.parameters["scale"].default == 1.0 and sig.parameters["sparse_mode"].default == 0
    assert sig.parameters["pre_tockens"].default == 2147483647
    grad_sig = inspect.signature(bench_functions.get("npu_fusion_attention_grad"))
    assert grad_sig.parameters["scale_value"].kind is inspect.Parameter.KEYWORD_ONLY
    assert str(inspect.signature(bench_functions.get("npu_rms_norm"))).startswith("(self: 'torch.Tensor', gamma")
    assert inspect.signature(bench_functions.get("npu_rms_norm")).parameters["epsilon"].default == 1e-6


def test_unknown_is_none():
    assert bench_functions.get("npu_no_such_op") is None
    assert bench_functions.get("NPU.npu_rms_norm") is None  # names are given without the api type


def test_register_duplicate_replace_on_a_registry():
    reg = Registry()
    reg.register("npu_my_op", lambda x: x + 1)
    assert reg.get("npu_my_op")(torch.tensor(1)) == 2 and "npu_my_op" in reg and len(reg) == 1
    with pytest.raises(ValueError, match="replace=True"):
        reg.register("npu_my_op", lambda x: x)
    reg.register("npu_my_op", lambda x: x * 10, replace=True)
    assert reg.get("npu_my_op")(torch.tensor(2)) == 20
    assert not reg.get("npu_my_op").builtin
    with pytest.raises(TypeError):
        reg.register("npu_other", 42)


def test_a_references_companions_are_kept_and_none_by_default():
    rows = Companions(written_rows=lambda x: ({0: 1}, {}, "first row only"))
    reg = Registry({"npu_plain": lambda x: x}, companions={"npu_rows": rows})
    reg.register("npu_rows", lambda x: x, companions=rows)
    assert reg.get("npu_rows").companions is rows and reg.get("npu_plain").companions == Companions()
    assert BenchFunction("npu_again", reg.get("npu_rows")).companions is rows  # a BenchFunction given keeps its own
    assert bench_functions.get("npu_grouped_matmul").companions.written_rows is not None
    assert bench_functions.get("npu_rms_norm").companions == Companions()


def test_module_level_register_uses_the_default_registry():
    def npu_custom_add(x, y, alpha=1.0):
        """User op.

        Facts:
        - mine: x + alpha * y
        """
        return x + alpha * y

    try:
        bench_functions.register("npu_custom_add", npu_custom_add)
        f = bench_functions.get("npu_custom_add")
        assert "npu_custom_add" in bench_functions.names() and f.facts == ("mine: x + alpha * y",)
        assert list(inspect.signature(f).parameters) == ["x", "y", "alpha"]
        with pytest.raises(ValueError, match="already registered"):
            bench_functions.register("npu_custom_add", npu_custom_add)
        copy = bench_functions.default_registry.copy()
        copy.register("npu_custom_add", lambda x, y: x, replace=True)
        assert bench_functions.get("npu_custom_add").func is npu_custom_add  # copies are independent
    finally:
        bench_functions.default_registry._functions.pop("npu_custom_add", None)


def _cases(dtype):
    g = torch.Generator().manual_seed(0)

    def r(*shape):
        return torch.randn(*shape, generator=g).to(dtype)

    mask = torch.ones(2048, 2048, dtype=torch.bool).triu(1)
    state = (r(8), r(8) * 0.1, r(8).abs() * 0.01)
    return {
        "npu_fusion_attention": (
            (r(1, 2, 16, 8), r(1, 2, 16, 8), r(1, 2, 16, 8), 2, "BNSD"),
            dict(atten_mask=mask, sparse_mode=2, scale=0.3),
        ),
        "npu_fusion_attention_grad": (
            (r(1, 16, 16), r(1, 16, 16), r(1, 16, 16), r(1, 16, 16), 2, "BSH"),
            dict(scale_value=0.3),
        ),
        "npu_rms_norm": ((r(4, 8), r(8)), {}),
        "npu_rotary_mul": ((r(1, 2, 4, 8), r(1, 1, 4, 8), r(1, 1, 4, 8)), {}),
        "npu_swiglu": ((r(4, 8),), {}),
        "npu_scaled_masked_softmax": ((r(1, 1, 4, 4), torch.zeros(1, 1, 4, 4, dtype=torch.bool)), {}),
        "fast_gelu": ((r(10),), {}),
        "npu_fast_gelu": ((r(10),), {}),
        "npu_linear": ((r(3, 4), r(5, 4), r(5)), {}),
        "npu_confusion_transpose": ((r(2, 3, 4), (1, 0, 2), (3, 8), True), {}),
        "npu_layer_norm_eval": ((r(3, 4), [4], r(4), r(4)), {}),
        "npu_apply_adam": ((0.9, 0.999, 1e-3, 0.9, 0.999, 1e-8, r(8), False, False), dict(out=state)),
        "npu_apply_adam_w": ((0.9, 0.999, 1e-3, 0.01, 0.9, 0.999, 1e-8, r(8), None, False, False), dict(out=state)),
        "npu_group_norm_silu": ((r(2, 4, 3), r(4), r(4), 2), {}),
        "npu_mish": ((r(10),), {}),
        "npu_moe_gating_top_k_softmax": ((r(4, 6),), dict(k=2)),
        "npu_sort_v2": ((r(3, 5),), {}),
        "matmul_backward": ((r(3, 5), r(3, 4), r(4, 5), [True, True]), {}),
    }


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", REQUIRED)
def test_low_precision_smoke(name, dtype):
    args, kwargs = _cases(dtype)[name]
    result = bench_functions.get(name)(*args, **kwargs)
    outputs = result if isinstance(result, tuple) else (result,)
    floats = [o for o in outputs if isinstance(o, torch.Tensor) and o.is_floating_point() and o.numel()]
    assert floats[0].dtype == dtype
    assert all(torch.isfinite(o).all() for o in floats)
