"""Dump pairs for the upgrade gate: one training step of a small model, dumped as msprobe
does (every API call's forward and backward, tensor task), by whichever ATen kernel path
runs this process. Run it twice, the second time under another path or with a planted
fault, and the two dumps are "before" and "after" an operator upgrade: same model, seed
and data, the inputs of the second moved only where an upstream kernel rounded otherwise.

    python -m pytest_msprobe.testing.upgrade_dumps OUTDIR [--model mlp|mlp_shifted|mlp_deep|wide] [--dtype float32|bfloat16|float16]
                                         [--fault NAME] [--threads N]

Run under ATEN_CPU_CAPABILITY=default|avx2|avx512 for another kernel path (torch reads it
when it starts: a subprocess). --fault NAME (FAULTS) makes that API's kernel wrong in
every call, forward and backward (its backward is autograd's through the wrong forward).

Each call is run where the model runs it (its inputs are the outputs of the calls before
it); its backward record holds the gradient that reached its outputs in loss.backward()
and the gradients it produced for its own inputs, recomputed on the same inputs by the
same kernel (a CPU kernel is deterministic for a given path and thread count); a linear's
backward is not written (NO_BACKWARD).
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from pytest_msprobe.testing.dumpwriter import DumpWriter

SEED = 38
#: calls whose backward is not written: msprobe records a 2-D linear's backward at torch's
#: addmm node, gradients in its order (the plugin pairs them through the graph), not the
#: call's input order this writer would use
NO_BACKWARD = ("Functional.linear.",)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class Model:
    rows: int
    width: int
    hidden: int
    blocks: int
    softmax: bool  # each block ends in a softmax (mlp) or not (wide)
    gelu_first: bool = False  # a gelu of the input before the blocks: every later gelu's index shifts


MODELS = {
    "mlp": Model(rows=32, width=64, hidden=256, blocks=4, softmax=True),
    "mlp_shifted": Model(rows=32, width=64, hidden=256, blocks=4, softmax=True, gelu_first=True),
    "wide": Model(rows=24, width=40, hidden=160, blocks=2, softmax=False),
    # mlp's blocks, then as many again and more: its first 40 calls pair with mlp's, its
    # other 60 are new (40% paired, below the share of one model)
    "mlp_deep": Model(rows=32, width=64, hidden=256, blocks=10, softmax=True),
}


def scaled(
    factor: Callable[[torch.dtype], float],
) -> Callable[[Callable[..., torch.Tensor]], Callable[..., torch.Tensor]]:
    """A kernel whose every result is `factor(dtype)` times the correct one."""

    def wrap(function: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        return lambda *args, **kwargs: (lambda out: out * factor(out.dtype))(function(*args, **kwargs))

    return wrap


def _times(sixteen_bit: float, single: float) -> Callable[[torch.dtype], float]:
    """1 + this relative error: `single` in float32, `sixteen_bit` in bfloat16/float16."""
    return lambda dtype: 1 + (single if dtype == torch.float32 else sixteen_bit)


def low_precision_sum(function: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """softmax whose row sum is kept in the input dtype (model_faults.py)."""
    from pytest_msprobe.testing.model_faults import softmax_low_precision_sum

    return softmax_low_precision_sum(function)


#: fault name -> (the API whose kernel it replaces, the wrapper)
FAULTS: dict[str, tuple[str, Callable[[Callable[..., torch.Tensor]], Callable[..., torch.Tensor]]]] = {
    "gelu_scaled": ("Functional.gelu", scaled(_times(2**-6, 2**-16))),
    "gelu_scaled_more": ("Functional.gelu", scaled(_times(2**-2, 2**-10))),  # 16x (64x in float32) gelu_scaled's error
    "softmax_low_precision_sum": ("Functional.softmax", low_precision_sum),
}


class Recorder:
    """Runs each API call of the step, the faulty kernel where one is planted, and
    remembers what its dump records need."""

    def __init__(self, root: Path, fault: str | None) -> None:
        self.writer = DumpWriter(root, "tensor")
        self.fault = FAULTS[fault] if fault else None
        self.counts: Counter[str] = Counter()
        self.calls: list[tuple[str, Callable[..., torch.Tensor], list[Any], dict[str, Any], torch.Tensor]] = []

    def __call__(self, api: str, function: Callable[..., torch.Tensor], *args: Any, **kwargs: Any) -> torch.Tensor:
        name = f"{api}.{self.counts[api]}"
        self.counts[api] += 1
        kernel = self.fault[1](function) if self.fault is not None and self.fault[0] == api else function
        output = kernel(*args, **kwargs)
        output.retain_grad()
        self.writer.forward(name, list(args), kwargs, output.detach())
        self.calls.append((name, kernel, list(args), kwargs, output))
        return output

    def write_backward(self) -> Path:
        for name, kernel, args, kwargs, output in self.calls:
            if name.startswith(NO_BACKWARD):
                continue
            inputs = [arg.detach().requires_grad_() if isinstance(arg, torch.Tensor) else arg for arg in args]
            local = kernel(*inputs, **kwargs)
            wanted = [arg for arg in inputs if isinstance(arg, torch.Tensor)]
            grads = torch.autograd.grad(local, wanted, output.grad)
            self.writer.backward(name, [output.grad], list(grads))
        return self.writer.write()


def step(root: Path, model: str, dtype: torch.dtype, fault: str | None) -> Path:
    """One training step of `model` in `dtype`, dumped to root/dump.json."""
    shape = MODELS[model]
    generator = torch.Generator().manual_seed(SEED)

    def parameter(*size: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*size, generator=generator) * scale).to(dtype).requires_grad_()

    call = Recorder(root, fault)
    x = (torch.randn(shape.rows, shape.width, generator=generator)).to(dtype).requires_grad_()
    if shape.gelu_first:
        x = call("Functional.gelu", F.gelu, x)
    for _ in range(shape.blocks):
        ln_w, ln_b = 1 + parameter(shape.width, scale=0.1).detach(), parameter(shape.width, scale=0.1)
        ln_w.requires_grad_()
        w1, b1 = parameter(shape.hidden, shape.width, scale=shape.width**-0.5), parameter(shape.hidden, scale=0.1)
        w2, b2 = parameter(shape.width, shape.hidden, scale=shape.hidden**-0.5), parameter(shape.width, scale=0.1)
        h = call("Functional.layer_norm", F.layer_norm, x, [shape.width], ln_w, ln_b)
        h = call("Functional.linear", F.linear, h, w1, b1)
        h = call("Functional.gelu", F.gelu, h)
        h = call("Functional.linear", F.linear, h, w2, b2)
        if shape.softmax:
            h = call("Functional.softmax", F.softmax, h, dim=-1)
        x = call("Tensor.__add__", torch.Tensor.__add__, h, x)
    loss_weights = torch.randn(shape.rows, shape.width, generator=generator)
    torch.autograd.backward((x.float() * loss_weights).sum())
    return call.write_backward()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--model", choices=sorted(MODELS), default="mlp")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--fault", choices=sorted(FAULTS))
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(step(args.out, args.model, DTYPES[args.dtype], args.fault), torch.backends.cpu.get_cpu_capability())


if __name__ == "__main__":
    main()
