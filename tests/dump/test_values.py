"""Decoding recorded values, and generating tensors from statistics."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from pytest_msprobe.dump.tensors import generate_tensor, seed_for, tensor_spec
from pytest_msprobe.dump.values import DecodeContext, RecordedDevice, decode
from pytest_msprobe.errors import CallError, CallSkip


def ctx(tmp_path: Path, task: str = "statistics") -> DecodeContext:
    return DecodeContext(tmp_path, task, "Torch.op.0", max_elements=10**6)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"type": "int", "value": 3}, 3),
        ({"type": "float", "value": float("-inf")}, float("-inf")),
        ({"type": "float", "value": 2}, 2.0),
        ({"type": "bool", "value": False}, False),
        ({"type": "str", "value": "mean"}, "mean"),
        ({"type": "slice", "value": [0, None, 2]}, slice(0, None, 2)),
        ({"type": "ellipsis", "value": "..."}, Ellipsis),
        ({"type": "torch.Size", "value": [4, 8]}, torch.Size([4, 8])),
        ({"type": "torch.dtype", "value": "torch.float16"}, torch.float16),
        ({"type": "mindspore.dtype", "value": "BFloat16"}, torch.bfloat16),
        ({"type": "torch.device", "value": "npu:0"}, RecordedDevice("npu:0")),
        ({"type": "torch.memory_format", "format": "contiguous_format"}, torch.contiguous_format),
        (None, None),
        ([{"type": "int", "value": 1}, [{"type": "int", "value": 2}]], [1, [2]]),
        ({"dim": {"type": "int", "value": -1}}, {"dim": -1}),
    ],
)
def test_value_types(value, expected, tmp_path: Path) -> None:
    assert decode(value, ctx(tmp_path), "input_args[0]") == expected


def test_numpy_scalars_keep_their_type(tmp_path: Path) -> None:
    decoded = decode({"type": "numpy.float32", "value": 1.5}, ctx(tmp_path), "x")
    assert isinstance(decoded, np.float32) and decoded == 1.5


@pytest.mark.parametrize(
    ("value", "error", "says"),
    [
        ({"type": "torch.ProcessGroup", "group_ranks": [0, 1]}, CallSkip, "process group"),
        ({"type": "torch.Generator"}, CallSkip, "unsupported value type 'torch.Generator'"),
        ({"type": "numpy.object_", "value": 1}, CallSkip, "unsupported value type"),
        ({"type": "int", "value": 1.5}, CallError, "is not a int"),
        ({"type": "bool", "value": 1}, CallError, "is not a bool"),
        ({"type": "slice", "value": [0, 1]}, CallError, "not [start, stop, step]"),
        (7, CallError, "bare int"),
    ],
)
def test_bad_values_name_the_problem(value, error, says, tmp_path: Path) -> None:
    with pytest.raises(error, match=re.escape(says)):
        decode(value, ctx(tmp_path), "input_args[0]")


def spec(dtype="torch.float32", shape=(64, 32), **stats):
    return tensor_spec({"type": "torch.Tensor", "dtype": dtype, "shape": list(shape), **stats}, "x")


@pytest.mark.parametrize("dtype", ["torch.float32", "torch.float16", "torch.bfloat16", "torch.float64"])
def test_generated_floats_hit_max_min_and_follow_mean(dtype: str) -> None:
    wanted = spec(dtype, Max=3.0, Min=-1.0, Mean=0.25)
    tensor = generate_tensor(wanted, seed=1, where="x")
    assert tensor.dtype == getattr(torch, dtype.split(".")[1]) and tuple(tensor.shape) == (64, 32)
    assert tensor.max().item() == 3.0 and tensor.min().item() == -1.0
    assert abs(tensor.double().mean().item() - 0.25) < 0.1


def test_generation_is_a_function_of_the_seed() -> None:
    wanted = spec(Max=1.0, Min=0.0, Mean=0.5)
    seed = seed_for("Torch.op.0", "input_args[0]")
    assert torch.equal(generate_tensor(wanted, seed, "x"), generate_tensor(wanted, seed, "x"))
    assert not torch.equal(
        generate_tensor(wanted, seed, "x"), generate_tensor(wanted, seed_for("Torch.op.1", "input_args[0]"), "x")
    )


def test_inf_and_nan_statistics_are_honoured() -> None:
    tensor = generate_tensor(spec(Max=float("inf"), Min=float("nan"), Mean=float("nan")), 3, "x")
    assert torch.isinf(tensor).sum() >= 1 and torch.isnan(tensor).sum() >= 1
    assert torch.isfinite(tensor).sum() == tensor.numel() - 2


@pytest.mark.parametrize("dtype", ["torch.int64", "torch.int32", "torch.uint8", "torch.int8"])
def test_integer_ranges_are_kept(dtype: str) -> None:
    tensor = generate_tensor(spec(dtype, (100,), Max=49, Min=3, Mean=None), 5, "x")
    assert tensor.dtype == getattr(torch, dtype.split(".")[1])
    assert tensor.max().item() == 49 and tensor.min().item() == 3


def test_bools_follow_their_statistics() -> None:
    assert generate_tensor(spec("torch.bool", (10,), Max=True, Min=True), 1, "x").all()
    mixed = generate_tensor(spec("torch.bool", (10,), Max=True, Min=False), 1, "x")
    assert mixed.any() and not mixed.all()


def test_zero_d_and_empty_tensors() -> None:
    scalar = generate_tensor(spec(shape=(), Max=2.0, Min=2.0, Mean=2.0), 1, "x")
    assert scalar.shape == () and scalar.item() == 2.0
    assert generate_tensor(spec(shape=(0, 3)), 1, "x").shape == (0, 3)


def test_size_limit_refuses_before_allocating(tmp_path: Path) -> None:
    small = DecodeContext(tmp_path, "statistics", "Torch.op.0", max_elements=100)
    with pytest.raises(CallSkip, match="above the limit of 100"):
        decode({"type": "torch.Tensor", "dtype": "torch.float32", "shape": [1 << 30, 1 << 30]}, small, "input_args[0]")


def test_mindspore_bfloat16_npy_is_read_back_as_bfloat16(tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.array([1.0, 2.5], dtype=np.float32))
    value = {"type": "mindspore.Tensor", "dtype": "BFloat16", "shape": [2], "data_name": "x.npy"}
    decoded = decode(value, ctx(tmp_path, "tensor"), "input_args[0]")
    assert decoded.dtype == torch.bfloat16 and decoded.tolist() == [1.0, 2.5]


def test_statistics_generation_stays_finite_for_finite_stats() -> None:
    tensor = generate_tensor(spec("torch.float16", Max=65504.0, Min=-65504.0, Mean=0.0), 9, "x")
    assert torch.isfinite(tensor).all() and not math.isnan(tensor.float().mean().item())
