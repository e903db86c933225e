"""Synthetic msprobe dumps of any size, for the scale benchmarks and tests.

    python -m pytest_msprobe.testing.synthetic_dumps OUT_FOLDER --calls 200000 [--task tensor] [--mix llm|compute|tiny] [--scale 1]

A dump is a sequence of transformer-layer-like calls (linear, matmul, softmax, silu,
layer_norm, add, mul, cat, embedding...) with shapes drawn from a few realistic
families, in fp16/bf16/fp32, forward and (for most) backward, written the way msprobe
writes dump.json (indent 1, statistics per tensor; tensor task: one .npy per tensor).
The same arguments always give the same file: a benchmark is repeatable.
"""

from __future__ import annotations

import argparse
import json
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

Shape = list[int]


@dataclass(frozen=True)
class ApiKind:
    """One API of the mix: how its inputs and output shapes follow from (tokens, hidden)."""

    api_type: str
    api_name: str
    inputs: Callable[[int, int], list[Any]]  # tensors as shapes, other arguments as recorded values
    output: Callable[[int, int], Shape]
    backward: bool = True


def _int(value: int) -> dict[str, Any]:
    return {"type": "int", "value": value}


# The APIs and their share of a large language model's step (by call count).
LLM_MIX: list[tuple[ApiKind, int]] = [
    (ApiKind("Functional", "linear", lambda t, h: [[t, h], [h, h]], lambda t, h: [t, h]), 20),
    (ApiKind("Torch", "matmul", lambda t, h: [[t, h], [h, t]], lambda t, h: [t, t]), 6),
    (ApiKind("Functional", "softmax", lambda t, h: [[t, t], _int(-1)], lambda t, h: [t, t]), 6),
    (ApiKind("Functional", "silu", lambda t, h: [[t, h]], lambda t, h: [t, h]), 6),
    (
        ApiKind(
            "Functional",
            "layer_norm",
            lambda t, h: [[t, h], {"type": "torch.Size", "value": [h]}, [h]],
            lambda t, h: [t, h],
        ),
        8,
    ),
    (ApiKind("Tensor", "add", lambda t, h: [[t, h], [t, h]], lambda t, h: [t, h]), 20),
    (ApiKind("Tensor", "mul", lambda t, h: [[t, h], [t, h]], lambda t, h: [t, h]), 16),
    (ApiKind("Torch", "cat", lambda t, h: [[[t, h], [t, h]], _int(0)], lambda t, h: [2 * t, h], backward=False), 8),
    (ApiKind("Tensor", "exp", lambda t, h: [[t, h]], lambda t, h: [t, h]), 6),
    (ApiKind("Torch", "sum", lambda t, h: [[t, h]], lambda t, h: [], backward=False), 4),
]
# Compute-bound: few, large matrix products (the -n speed-up benchmark).
COMPUTE_MIX: list[tuple[ApiKind, int]] = [
    (ApiKind("Torch", "matmul", lambda t, h: [[t, h], [h, t]], lambda t, h: [t, t], backward=False), 1),
]
# Negligible compute: the harness's own cost per call.
TINY_MIX: list[tuple[ApiKind, int]] = [
    (ApiKind("Tensor", "add", lambda t, h: [[2, 3], [2, 3]], lambda t, h: [2, 3], backward=False), 1),
]
MIXES = {"llm": LLM_MIX, "compute": COMPUTE_MIX, "tiny": TINY_MIX}
# (tokens, hidden) families and their weights: mostly small activations, some large.
SHAPES = [((8, 64), 6), ((32, 128), 3), ((64, 256), 1)]
DTYPES = [("torch.float16", 2), ("torch.bfloat16", 2), ("torch.float32", 1)]


class _Writer:
    def __init__(self, root: Path, task: str, rng: random.Random) -> None:
        self.root, self.task, self.rng = root, task, rng
        self.tensors = root / "dump_tensor_data"
        if task == "tensor":
            self.tensors.mkdir(parents=True, exist_ok=True)

    def tensor(self, shape: Shape, dtype: str, name: str, requires_grad: bool) -> dict[str, Any]:
        scale = self.rng.uniform(0.5, 2.0)
        numel = math.prod(shape)
        value: dict[str, Any] = {
            "type": "torch.Tensor",
            "dtype": dtype,
            "shape": shape,
            "Max": scale,
            "Min": -scale,
            "Mean": round(self.rng.uniform(-0.1, 0.1), 6),
            "Norm": round(scale * math.sqrt(numel) / 2, 4),
            "requires_grad": requires_grad,
        }
        if self.task == "tensor":
            array = np.random.default_rng(self.rng.getrandbits(32)).uniform(-scale, scale, shape)
            file_name = f"{name}.npy"
            np.save(self.tensors / file_name, array.astype(np.float16 if dtype == "torch.float16" else np.float32))
            value["data_name"] = file_name
        return value

    def value(self, spec: Any, dtype: str, name: str, requires_grad: bool) -> Any:
        """A shape (list of ints) is a tensor; a list of shapes a tensor list; else as is."""
        if isinstance(spec, list) and spec and isinstance(spec[0], list):
            return [self.value(item, dtype, f"{name}.{i}", requires_grad) for i, item in enumerate(spec)]
        if isinstance(spec, list):
            return self.tensor(spec, dtype, name, requires_grad)
        return spec


@dataclass(frozen=True)
class Knobs:
    """What a synthetic dump is made of besides its size: msprobe's task (statistics, or
    tensor: one .npy per tensor), the mix of APIs (MIXES), a factor on every tensor
    dimension, and the seed (the same knobs always give the same file)."""

    task: str = "statistics"
    mix: str = "llm"
    scale: int = 1
    seed: int = 0


DEFAULT_KNOBS = Knobs()


def make_dump(root: Path, calls: int, knobs: Knobs = DEFAULT_KNOBS) -> Path:
    """Write `root/dump.json` with `calls` entries (forward and backward records each
    count one). Returns the file's path."""
    task, mix, scale, seed = knobs.task, knobs.mix, knobs.scale, knobs.seed
    if task == "tensor" and calls > 20_000:
        raise ValueError(
            "tensor dumps are for small sizes (one .npy per tensor); use the statistics task for large ones"
        )
    rng = random.Random(seed)
    writer = _Writer(root, task, rng)
    kinds = [kind for kind, _ in MIXES[mix]]
    kind_weights = [weight for _, weight in MIXES[mix]]
    data: dict[str, Any] = {}
    counters: dict[str, int] = {}
    while len(data) < calls:
        kind = rng.choices(kinds, kind_weights)[0]
        tokens, hidden = rng.choices([s for s, _ in SHAPES], [w for _, w in SHAPES])[0]
        tokens, hidden = tokens * scale, hidden * scale
        dtype = rng.choices([d for d, _ in DTYPES], [w for _, w in DTYPES])[0]
        key = f"{kind.api_type}.{kind.api_name}"
        index = counters[key] = counters.get(key, -1) + 1
        prefix = f"{key}.{index}"
        out_shape = kind.output(tokens, hidden)
        data[f"{prefix}.forward"] = {
            "input_args": [
                writer.value(spec, dtype, f"{prefix}.forward.input.{i}", True)
                for i, spec in enumerate(kind.inputs(tokens, hidden))
            ],
            "input_kwargs": {},
            "output": [writer.tensor(out_shape, dtype, f"{prefix}.forward.output.0", True)],
        }
        if kind.backward and len(data) < calls:
            data[f"{prefix}.backward"] = {
                "input": [writer.tensor(out_shape, dtype, f"{prefix}.backward.input.0", False)],
                "output": [
                    writer.value(spec, dtype, f"{prefix}.backward.output.{i}", False)
                    for i, spec in enumerate(kind.inputs(tokens, hidden))
                    if isinstance(spec, list)
                ],
            }
    root.mkdir(parents=True, exist_ok=True)
    path = root / "dump.json"
    header = {
        "task": task,
        "level": "L1",
        "framework": "pytorch",
        "dump_data_dir": str(writer.tensors) if task == "tensor" else None,
    }
    with open(path, "w", encoding="utf-8") as handle:
        json.dump({**header, "data": data}, handle, indent=1)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="folder for dump.json (and dump_tensor_data/)")
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--task", choices=("statistics", "tensor"), default="statistics")
    parser.add_argument("--mix", choices=sorted(MIXES), default="llm")
    parser.add_argument("--scale", type=int, default=1, help="multiply every tensor dimension")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    path = make_dump(args.out, args.calls, Knobs(task=args.task, mix=args.mix, scale=args.scale, seed=args.seed))
    print(f"{path}: {args.calls} calls, {path.stat().st_size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
