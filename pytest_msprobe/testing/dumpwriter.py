"""Write small msprobe-format dumps from real tensors, for edge cases and custom ops:
the same layout and value encodings msprobe writes (see the shared dump spec)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch


class DumpWriter:
    def __init__(self, root: Path, task: str) -> None:
        self.root, self.task = root, task
        self.data: dict[str, Any] = {}
        (root / "dump_tensor_data").mkdir(parents=True, exist_ok=True)

    def value(self, value: Any, name: str) -> Any:
        """The recorded form of one argument or output; tensors saved as files in the
        tensor task."""
        if isinstance(value, torch.Tensor):
            return self._tensor(value, name)
        if isinstance(value, (list, tuple)):
            return [self.value(item, f"{name}.{i}") for i, item in enumerate(value)]
        if value is None:
            return None
        if isinstance(value, slice):
            return {"type": "slice", "value": [value.start, value.stop, value.step]}
        if value is Ellipsis:
            return {"type": "ellipsis", "value": "..."}
        if isinstance(value, torch.dtype):
            return {"type": "torch.dtype", "value": str(value)}
        kind = {bool: "bool", int: "int", float: "float", str: "str"}[type(value)]
        return {"type": kind, "value": value}

    def _tensor(self, tensor: torch.Tensor, name: str) -> dict[str, Any]:
        stats: dict[str, Any] = {"Max": None, "Min": None, "Mean": None, "Norm": None}
        if tensor.numel():
            if tensor.dtype == torch.bool:
                stats.update(Max=bool(tensor.any()), Min=bool(tensor.all()))
            elif tensor.dtype.is_floating_point:
                wide = tensor.double()
                stats.update(
                    Max=wide.max().item(), Min=wide.min().item(), Mean=wide.mean().item(), Norm=wide.norm().item()
                )
            else:
                stats.update(Max=int(tensor.max()), Min=int(tensor.min()))
        value = {
            "type": "torch.Tensor",
            "dtype": str(tensor.dtype),
            "shape": list(tensor.shape),
            **stats,
            "requires_grad": tensor.dtype.is_floating_point,
        }
        if self.task == "tensor":
            file_name = f"{name}.pt"
            torch.save(tensor.detach().clone(), self.root / "dump_tensor_data" / file_name)
            value["data_name"] = file_name
        return value

    def forward(self, call: str, args: list[Any], kwargs: dict[str, Any], output: Any) -> None:
        prefix = f"{call}.forward"
        outputs = list(output) if isinstance(output, tuple) else [output]
        self.data[prefix] = {
            "input_args": [self.value(arg, f"{prefix}.input.{i}") for i, arg in enumerate(args)],
            "input_kwargs": {
                key: self.value(arg, f"{prefix}.kwargs.{key}") for key, arg in kwargs.items()
            },  # msprobe: kwargs.<key>.pt
            "output": [self.value(out, f"{prefix}.output.{i}") for i, out in enumerate(outputs)],
        }

    def backward(self, call: str, grads_in: list[Any], grads_out: list[Any]) -> None:
        prefix = f"{call}.backward"
        self.data[prefix] = {
            "input": [self.value(g, f"{prefix}.input.{i}") for i, g in enumerate(grads_in)],
            "output": [self.value(g, f"{prefix}.output.{i}") for i, g in enumerate(grads_out)],
        }

    def write(self) -> Path:
        path = self.root / "dump.json"
        header = {"task": self.task, "level": "L1", "framework": "pytorch", "dump_data_dir": None}
        path.write_text(json.dumps({**header, "data": self.data}, indent=1))
        return path
