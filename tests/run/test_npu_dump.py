"""Dumps with torch_npu fused operators (NPU.* calls) run end to end on the CPU: the
bench_functions references stand in on the device (in the dump's dtype) and serve as
the bench (raised). A fault planted in one reference's device-side run fails exactly
that operator's calls."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pytest_msprobe import bench_functions
from pytest_msprobe.testing.dumpwriter import DumpWriter
from pytest_msprobe.testing.faults import scaled_in

DTYPE = torch.float16


def make(*shape: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator).to(DTYPE)


def calls() -> list[tuple[str, list, dict, bool]]:
    """(op, args, kwargs, has_backward): realistic small calls of each operator."""
    q, k, v = make(2, 16, 64, seed=1), make(2, 16, 64, seed=2), make(2, 16, 64, seed=3)
    causal = torch.ones(16, 16, dtype=torch.bool).triu(1)
    cos, sin = make(1, 16, 1, 32, seed=4).cos(), make(1, 16, 1, 32, seed=5).sin()
    return [
        ("npu_rms_norm", [make(4, 32, seed=6), make(32, seed=7).abs() + 0.5], {"epsilon": 1e-6}, True),
        ("npu_rotary_mul", [make(2, 16, 4, 32, seed=8), cos, sin], {}, True),
        ("npu_swiglu", [make(4, 64, seed=9)], {"dim": -1}, True),
        ("npu_fusion_attention", [q, k, v, 4, "BSH"], {"atten_mask": causal, "scale": 0.25, "sparse_mode": 0}, True),
        ("fast_gelu", [make(8, 16, seed=10)], {}, True),
        (
            "npu_scaled_masked_softmax",
            [make(2, 2, 8, 8, seed=11), torch.rand(2, 2, 8, 8, generator=torch.Generator().manual_seed(12)) > 0.8],
            {"scale": 0.5},
            False,
        ),
        (
            "npu_layer_norm_eval",
            [make(4, 32, seed=13), [32], make(32, seed=14), make(32, seed=15)],
            {"eps": 1e-5},
            False,
        ),
        ("npu_mish", [make(8, 16, seed=16)], {}, False),
        ("npu_linear", [make(4, 32, seed=17), make(16, 32, seed=18), make(16, seed=19)], {}, False),
        ("npu_moe_gating_top_k_softmax", [make(8, 6, seed=20)], {"k": 2}, False),
        ("npu_sort_v2", [make(4, 32, seed=21)], {"dim": -1, "descending": True}, False),
    ]


def write_npu_dump(root: Path, task: str) -> Path:
    writer = DumpWriter(root, task)
    for number, (op, args, kwargs, has_backward) in enumerate(calls()):
        call = f"NPU.{op}.{number}"
        reference = bench_functions.get(op)
        leaves = [
            a.clone().requires_grad_(a.dtype.is_floating_point) if isinstance(a, torch.Tensor) else a for a in args
        ]
        output = reference(*leaves, **kwargs)
        writer.forward(call, args, kwargs, output)
        if has_backward:
            first = output[0] if isinstance(output, tuple) else output
            grad = make(*first.shape, seed=100 + number)
            first.backward(grad)
            extra = [None] * (len(output) - 1) if isinstance(output, tuple) else []
            writer.backward(
                call, [grad, *extra], [a.grad for a in leaves if isinstance(a, torch.Tensor) and a.grad is not None]
            )
    return writer.write()


@pytest.mark.parametrize("task", ["tensor", "statistics"])
def test_npu_calls_are_judged_on_the_cpu(task: str, tmp_path: Path, run_dump) -> None:
    dump = write_npu_dump(tmp_path / task, task)
    result = run_dump(dump, "--msprobe-device=cpu")
    assert result.collection_errors == []
    assert len(result.calls) == len(calls()) + sum(c[3] for c in calls())
    assert result.by_outcome("failed") == {}
    assert result.by_outcome("skipped") == {}
    assert not any(outcome.warnings for outcome in result.calls.values())


def test_planted_fault_in_a_reference_fails_exactly_that_op(tmp_path: Path, run_dump, monkeypatch) -> None:
    dump = write_npu_dump(tmp_path / "tensor", "tensor")
    registry = bench_functions.default_registry.copy()
    registry.register("npu_rms_norm", scaled_in(DTYPE, 1 + 2**-6)(bench_functions.get("npu_rms_norm")), replace=True)
    monkeypatch.setattr(bench_functions, "default_registry", registry)
    result = run_dump(dump, "--msprobe-device=cpu")
    assert set(result.by_outcome("failed")) == {"NPU.npu_rms_norm.0.forward", "NPU.npu_rms_norm.0.backward"}


def test_conftest_hook_registers_a_custom_op(tmp_path: Path, pytester: pytest.Pytester) -> None:
    writer = DumpWriter(pytester.path / "dump", "statistics")
    x = make(4, 8, seed=1)
    writer.forward("NPU.my_fused_scale.0", [x], {}, x * 2)
    dump = writer.write()
    pytester.makeconftest(
        "def pytest_msprobe_register_bench_functions(registry):\n    registry.register('my_fused_scale', lambda x: x * 2, replace=True)\n"
    )
    pytester.runpytest(f"--msprobe-dump={dump}", "--msprobe-device=cpu", "-q").assert_outcomes(passed=1)


def test_op_without_reference_skips_saying_how_to_add_one(tmp_path: Path, run_dump) -> None:
    writer = DumpWriter(tmp_path / "dump", "statistics")
    x = make(4, 8, seed=1)
    writer.forward("NPU.npu_not_a_known_op.0", [x], {}, x)
    result = run_dump(writer.write(), "--msprobe-device=cpu")
    (outcome,) = result.calls.values()
    assert outcome.outcome == "skipped" and "pytest_msprobe_register_bench_functions" in outcome.text
