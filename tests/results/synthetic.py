"""Synthetic statistics dumps for the results tests: many tiny calls, so a run is long
enough to be killed mid-way yet a whole run takes a second or two."""

from __future__ import annotations

from typing import Any


def tensor(shape: list[int], dtype: str = "torch.float32", requires_grad: bool = True) -> dict[str, Any]:
    return {
        "type": "torch.Tensor",
        "dtype": dtype,
        "shape": shape,
        "Max": 1.0,
        "Min": -1.0,
        "Mean": 0.0,
        "Norm": 1.0,
        "requires_grad": requires_grad,
    }


def many_calls(count: int, shape: list[int] | None = None) -> dict[str, Any]:
    """`count` calls cycling through four APIs of four standards; silu calls have a
    backward too, so the result CSV has both directions and lone forwards."""
    shape = shape or [2, 3]
    data: dict[str, Any] = {}
    for i in range(count):
        kind = i % 4
        if kind == 0:
            data[f"Torch.add.{i}.forward"] = {
                "input_args": [tensor(shape), tensor(shape)],
                "input_kwargs": {},
                "output": [tensor(shape)],
            }
        elif kind == 1:
            data[f"Functional.silu.{i}.forward"] = {
                "input_args": [tensor(shape)],
                "input_kwargs": {},
                "output": [tensor(shape)],
            }
            data[f"Functional.silu.{i}.backward"] = {
                "input": [tensor(shape, requires_grad=False)],
                "output": [tensor(shape, requires_grad=False)],
            }
        elif kind == 2:
            data[f"Torch.matmul.{i}.forward"] = {
                "input_args": [tensor([shape[0], 4]), tensor([4, shape[1]])],
                "input_kwargs": {},
                "output": [tensor(shape)],
            }
        else:
            data[f"Tensor.abs.{i}.forward"] = {
                "input_args": [tensor(shape)],
                "input_kwargs": {},
                "output": [tensor(shape)],
            }
    return data
