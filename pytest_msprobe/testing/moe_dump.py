"""Write the msprobe dump of one training step of a small MoE layer, as MindSpeed runs it
on an NPU: router linear, npu_moe_gating_top_k_softmax, npu_moe_init_routing,
npu_moe_compute_expert_tokens, npu_grouped_matmul up, npu_swiglu, npu_grouped_matmul
down, npu_moe_finalize_routing; then the backward, where MindSpeed's grouped-matmul
autograd function calls npu_grouped_matmul again (grad input: group_type 0 with the
weights untransposed; grad weight: group_type 2 over the tokens), which msprobe records
as forward calls, and the other ops' backward records.

No NPU here: the torch_npu operators are their bench_functions references, run in the
dump's dtype (a correct kernel's float32 accumulation rounded once), so every recorded
output is a correct one. Usage: ``python -m pytest_msprobe.testing.moe_dump OUT_DIR bfloat16|float16``.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from pytest_msprobe import bench_functions
from pytest_msprobe.testing.dumpwriter import DumpWriter

TOKENS, HIDDEN, EXPERTS, TOP_K, FFN = 24, 32, 4, 2, 48


def flat(value: Any) -> list[Any]:
    if isinstance(value, (list, tuple)):
        return [item for part in value for item in flat(part)]
    return [value]


def tree(function: Callable[[Any], Any], value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return type(value)(tree(function, item) for item in value)
    if isinstance(value, dict):
        return {key: tree(function, item) for key, item in value.items()}
    return function(value)


@dataclass
class Entry:
    """One recorded call on the tape: its input leaves (with the tensors they stand
    for upstream) and its outputs as the leaves downstream calls received."""

    call: str
    sources: list[tuple[torch.Tensor, torch.Tensor]]
    outputs: list[Any]
    detached: list[Any]
    backward: Callable[[list[torch.Tensor | None]], list[torch.Tensor | None]] | None = None
    recorded: bool = True


@dataclass
class Tape:
    """Runs each call on leaves of its own, records it, and plays the backward in reverse
    call by call, so each call's incoming and produced gradients are known."""

    writer: DumpWriter
    counts: Counter[str] = field(default_factory=Counter)
    entries: list[Entry] = field(default_factory=list)

    def name(self, api: str) -> str:
        number = self.counts[api]
        self.counts[api] += 1
        return f"{api}.{number}"

    def call(
        self, api: str, function: Callable[..., Any], args: list[Any], kwargs: dict[str, Any], *, grads: bool = True
    ) -> Any:
        call = self.name(api)
        sources: list[tuple[torch.Tensor, torch.Tensor]] = []

        def leaf(value: Any) -> Any:
            if isinstance(value, torch.Tensor) and value.is_floating_point() and grads and value.requires_grad:
                made = value.detach().requires_grad_()
                sources.append((value, made))
                return made
            return value.detach() if isinstance(value, torch.Tensor) else value

        with torch.enable_grad():
            output = function(*tree(leaf, args), **tree(leaf, kwargs))
        self.writer.forward(
            call, tree(lambda v: v.detach() if isinstance(v, torch.Tensor) else v, args), kwargs, _detached(output)
        )
        detached = tree(
            lambda v: (
                v.detach().requires_grad_(grads and v.is_floating_point() and v.requires_grad)
                if isinstance(v, torch.Tensor)
                else v
            ),
            output,
        )
        self.entries.append(Entry(call, sources, flat(output), flat(detached)))
        return detached

    def backward(self, output: torch.Tensor, grad: torch.Tensor) -> None:
        output.grad = grad
        for entry in reversed(self.entries):
            incoming = [d.grad if isinstance(d, torch.Tensor) and d.requires_grad else None for d in entry.detached]
            if all(g is None for g in incoming):
                continue
            if entry.backward is not None:
                produced = entry.backward(incoming)
            else:
                pairs = [
                    (o, g) for o, g in zip(entry.outputs, incoming, strict=True) if g is not None and o.requires_grad
                ]
                torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
                produced = [made.grad for _, made in entry.sources]
                self.writer.backward(entry.call, incoming, produced)
            for (source, _), grad_in in zip(entry.sources, produced, strict=True):
                if grad_in is not None and source.requires_grad:
                    source.grad = grad_in.detach() if source.grad is None else source.grad + grad_in.detach()


def _detached(value: Any) -> Any:
    return tree(lambda v: v.detach() if isinstance(v, torch.Tensor) else v, value)


def grouped_matmul(tape: Tape, x: torch.Tensor, weights: list[torch.Tensor], group_list: torch.Tensor) -> torch.Tensor:
    """MindSpeed's grouped-matmul autograd function: the forward call, and a backward
    that calls npu_grouped_matmul for the input gradient and the weights' gradients."""
    gmm = bench_functions.get("npu_grouped_matmul")
    assert gmm is not None
    kwargs = {"bias": None, "group_list": group_list, "split_item": 2, "group_type": 0, "group_list_type": 0}
    outputs: list[torch.Tensor] = tape.call(
        "NPU.npu_grouped_matmul", gmm, [[x], [w.t() for w in weights]], kwargs, grads=False
    )
    [out] = outputs
    entry = tape.entries[-1]
    entry.detached = [out.requires_grad_()]
    entry.sources = [(x, x), *[(w, w) for w in weights]]

    def backward(incoming: list[torch.Tensor | None]) -> list[torch.Tensor | None]:
        (grad,) = incoming
        assert grad is not None
        [grad_x] = tape.call(
            "NPU.npu_grouped_matmul", gmm, [[grad], [w.detach() for w in weights]], kwargs, grads=False
        )
        weight_kwargs = {**kwargs, "split_item": 3, "group_type": 2}
        [grad_w] = tape.call("NPU.npu_grouped_matmul", gmm, [[x.detach().t()], [grad]], weight_kwargs, grads=False)
        return [grad_x, *[g.t() for g in grad_w.unbind(0)]]

    entry.backward = backward
    return out


def moe_layer(tape: Tape, dtype: torch.dtype, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)

    def param(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=generator) * scale).to(dtype).requires_grad_()

    hidden = param(TOKENS, HIDDEN)
    router = param(EXPERTS, HIDDEN, scale=HIDDEN**-0.5)
    up = [param(2 * FFN, HIDDEN, scale=HIDDEN**-0.5) for _ in range(EXPERTS)]
    down = [param(HIDDEN, FFN, scale=FFN**-0.5) for _ in range(EXPERTS)]

    def ref(name: str) -> Callable[..., Any]:
        """The operator's CPU reference: every one this layer calls is registered."""
        function = bench_functions.get(name)
        if function is None:
            raise LookupError(f"bench_functions has no reference of {name}")
        return function

    logits = tape.call("Functional.linear", torch.nn.functional.linear, [hidden, router], {})
    probs, expert_idx, row_idx = tape.call(
        "NPU.npu_moe_gating_top_k_softmax", ref("npu_moe_gating_top_k_softmax"), [logits, None, TOP_K], {}
    )
    expanded_x, expanded_row_idx, expanded_expert_idx = tape.call(
        "NPU.npu_moe_init_routing", ref("npu_moe_init_routing"), [hidden, row_idx, expert_idx, TOKENS], {}
    )
    tokens_per_expert = tape.call(
        "NPU.npu_moe_compute_expert_tokens", ref("npu_moe_compute_expert_tokens"), [expanded_expert_idx, EXPERTS], {}
    )
    group_list = tokens_per_expert.long()
    h = grouped_matmul(tape, expanded_x, up, group_list)
    act = tape.call("NPU.npu_swiglu", ref("npu_swiglu"), [h], {"dim": -1})
    out = grouped_matmul(tape, act, down, group_list)
    finalized: torch.Tensor = tape.call(
        "NPU.npu_moe_finalize_routing",
        ref("npu_moe_finalize_routing"),
        [out, None, None, None, probs, expanded_row_idx, expert_idx],
        {"drop_pad_mode": 0},
    )
    return finalized


def write_moe_dump(root: Path, dtype: torch.dtype, task: str = "tensor", seed: int = 0) -> Path:
    """One forward and backward step of the layer, recorded as msprobe records it."""
    tape = Tape(DumpWriter(root, task))
    y = moe_layer(tape, dtype, seed)
    grad = (torch.randn(y.shape, generator=torch.Generator().manual_seed(seed + 1)) * 0.1).to(dtype)
    tape.backward(y, grad)
    return tape.writer.write()


if __name__ == "__main__":
    print(write_moe_dump(Path(sys.argv[1]), getattr(torch, sys.argv[2])))
