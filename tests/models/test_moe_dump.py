"""A MoE layer's training step recorded as MindSpeed runs it on an NPU (pytest_msprobe/testing/moe_dump.py):
every call, forward and backward, in bfloat16 and float16, is judged, none skipped,
with no error and no warning."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pytest_msprobe import bench_functions
from pytest_msprobe.testing.moe_dump import write_moe_dump

EXPECTED = {
    "Functional.linear.0.forward",
    "Functional.linear.0.backward",
    "NPU.npu_moe_gating_top_k_softmax.0.forward",
    "NPU.npu_moe_gating_top_k_softmax.0.backward",
    "NPU.npu_moe_init_routing.0.forward",
    "NPU.npu_moe_init_routing.0.backward",
    "NPU.npu_moe_compute_expert_tokens.0.forward",
    "NPU.npu_swiglu.0.forward",
    "NPU.npu_swiglu.0.backward",
    "NPU.npu_moe_finalize_routing.0.forward",
    "NPU.npu_moe_finalize_routing.0.backward",
    *{f"NPU.npu_grouped_matmul.{n}.forward" for n in range(6)},  # up, down, and two per backward
}


@pytest.mark.parametrize("task", ["tensor", "statistics"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_every_call_of_the_moe_step_is_judged_and_passes(
    dtype: torch.dtype, task: str, tmp_path: Path, run_dump
) -> None:
    """Statistics: inputs drawn anew, so bfloat16 gating rows where two experts'
    probabilities round alike are common; the reference's choice must not depend on the
    precision it ran in (bench_functions/moe_gating.py)."""
    result = run_dump(write_moe_dump(tmp_path / "dump", dtype, task), "--msprobe-device=cpu")
    assert set(result.calls) == EXPECTED
    assert {call: o.outcome for call, o in result.calls.items() if o.outcome != "passed"} == {}
    assert {call: o.warnings for call, o in result.calls.items() if o.warnings} == {}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_offline_the_dumped_outputs_pass_forward_and_backward(dtype: torch.dtype, tmp_path: Path, run_dump) -> None:
    """The dump judged offline (its recorded outputs and gradients as the device): every
    call passes, the backward ones too: each fused reference is one autograd node, as
    torch_npu's op is, so the dumped gradients pair with the call's inputs."""
    result = run_dump(write_moe_dump(tmp_path / "dump", dtype), "--msprobe-offline")
    assert {call: o.outcome for call, o in result.calls.items()} == dict.fromkeys(EXPECTED, "passed")
    assert {call: o.warnings for call, o in result.calls.items() if o.warnings} == {}


def test_offline_a_faulty_grouped_kernel_fails_its_calls(tmp_path: Path, run_dump, monkeypatch) -> None:
    """Made with a grouped kernel that multiplies each group's rows by the next group's
    weight, exactly the group_type 0 calls fail offline (forward up and down, and the
    input gradients of MindSpeed's backward); the k-grouped weight gradients, correct
    for their inputs, pass."""
    reference = bench_functions.get("npu_grouped_matmul")

    def next_weight(x, weight, **kwargs):
        shifted = list(weight[1:]) + list(weight[:1]) if kwargs.get("group_type") == 0 else weight
        return reference(x, shifted, **kwargs)

    registry = bench_functions.default_registry.copy()
    registry.register("npu_grouped_matmul", next_weight, replace=True)
    monkeypatch.setattr(bench_functions, "default_registry", registry)
    dump = write_moe_dump(tmp_path / "faulty", torch.bfloat16)
    monkeypatch.undo()
    faulty = run_dump(dump, "--msprobe-offline", "-k", "forward")
    assert set(faulty.by_outcome("failed")) == {f"NPU.npu_grouped_matmul.{n}.forward" for n in (0, 1, 2, 4)}


def test_gating_top_k_norm_out_without_out_flag_is_not_judged(tmp_path: Path, run_dump, pytester) -> None:
    """npu_moe_gating_top_k writes normOut only with out_flag=True: without it the dumped
    normOut (leftover memory: NaN here) is left out, the other outputs judged."""
    from pytest_msprobe.testing.dumpwriter import DumpWriter

    reference = bench_functions.get("npu_moe_gating_top_k")
    x, bias = (
        torch.randn(8, 16, dtype=torch.float64).bfloat16(),
        (torch.randn(16, dtype=torch.float64) * 0.1).bfloat16(),
    )
    kwargs = {
        "bias": bias,
        "k_group": 2,
        "group_count": 4,
        "group_select_mode": 1,
        "norm_type": 1,
        "routed_scaling_factor": 2.5,
    }
    y, idx, _ = reference(x.double(), 3, **{**kwargs, "bias": bias.double()})
    writer = DumpWriter(tmp_path / "dump", "tensor")
    writer.forward("NPU.npu_moe_gating_top_k.0", [x, 3], kwargs, (y.bfloat16(), idx, torch.full((8, 16), float("nan"))))
    writer.forward(
        "NPU.npu_moe_gating_top_k.1", [x, 3], kwargs, ((y * 1.05).bfloat16(), idx, torch.full((8, 16), float("nan")))
    )
    result = run_dump(writer.write(), "--msprobe-offline")
    assert {call: o.outcome for call, o in result.calls.items()} == {
        "NPU.npu_moe_gating_top_k.0.forward": "passed",
        "NPU.npu_moe_gating_top_k.1.forward": "failed",
    }
    assert not result.calls["NPU.npu_moe_gating_top_k.0.forward"].warnings


def test_init_routing_v2_judges_only_the_available_pairs(tmp_path: Path, run_dump) -> None:
    """npu_moe_init_routing_v2 writes the pairs of the active experts only: leftover memory
    (NaN, garbage indices) past them is not judged; two gathered rows swapped fail."""
    from pytest_msprobe.testing.dumpwriter import DumpWriter

    reference = bench_functions.get("npu_moe_init_routing_v2")
    x = torch.randn(6, 8, generator=torch.Generator().manual_seed(3)).bfloat16()
    expert_idx = torch.randint(0, 6, (6, 2), generator=torch.Generator().manual_seed(4), dtype=torch.int32)
    kwargs = {
        "expert_num": 6,
        "active_expert_range": [1, 4],
        "expert_tokens_num_flag": True,
        "expert_tokens_num_type": 2,
        "quant_mode": -1,
        "row_idx_type": 1,
    }
    expanded_x, row_idx, counts, scale = reference(x, expert_idx, **kwargs)
    available = reference.companions.written_rows(x, expert_idx, **kwargs)[0]
    garbage_x, garbage_idx, garbage_counts = expanded_x.clone(), row_idx.clone(), counts.clone()
    garbage_x[available[0] :] = float("nan")
    garbage_idx[available[1] :] = 12345
    garbage_counts[available[2] :] = -7
    swapped = garbage_x.clone()
    swapped[[0, 1]] = garbage_x[[1, 0]]
    writer = DumpWriter(tmp_path / "dump", "tensor")
    writer.forward(
        "NPU.npu_moe_init_routing_v2.0", [x, expert_idx], kwargs, (garbage_x, garbage_idx, garbage_counts, scale)
    )
    writer.forward(
        "NPU.npu_moe_init_routing_v2.1", [x, expert_idx], kwargs, (swapped, garbage_idx, garbage_counts, scale)
    )
    result = run_dump(writer.write(), "--msprobe-offline")
    assert {call: o.outcome for call, o in result.calls.items()} == {
        "NPU.npu_moe_init_routing_v2.0.forward": "passed",
        "NPU.npu_moe_init_routing_v2.1.forward": "failed",
    }
    assert 0 < available[0] < 12 and not result.calls["NPU.npu_moe_init_routing_v2.0.forward"].warnings
