"""Offline checks: the outputs saved in a tensor dump ARE the device result.

A dump made on an NPU is then checked on any machine: only the bench (and the CPU
reference in the device dtype) run here. Forward outputs pair with the replayed ones
directly. Backward is harder: msprobe records the gradients that the autograd node
producing the call's output passed on (its `grad_fn`'s inputs), which are the
gradients of the call's inputs only where that node takes them directly. `linear`
records addmm's (bias, input, weight transposed) gradients; `cross_entropy` records
nll_loss's gradient with respect to log_softmax's output, of the same shape as the
input's and yet another quantity. So the call's graph is rebuilt on the CPU and each
dumped gradient is paired with an input only where the node's edge leads straight to
that input; the rest are left out of the comparison, with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from pytest_msprobe.dump.cache import DumpSummary
from pytest_msprobe.dump.index import CallName, DumpIndex
from pytest_msprobe.dump.values import DecodeContext, decode
from pytest_msprobe.errors import CallError, CallSkip, DumpError
from pytest_msprobe.run.replay import Inputs, Run, flat_outputs, in_place_copies, tensors_in, tree_map

if TYPE_CHECKING:
    from pytest_msprobe.dump.values import Value

DEVICE_LABEL = "dump (offline: the dumped outputs are the device result)"


def require_tensor_task(index: DumpIndex | DumpSummary) -> None:
    """One message for the whole dump when it cannot be checked offline."""
    if index.task != "tensor":
        raise DumpError(
            f"{index.path} is a statistics dump: it records only Max/Min/Mean/Norm of the outputs, "
            'so --msprobe-offline has no device result to check; dump with task "tensor", '
            "or run without --msprobe-offline to replay the calls on a device"
        )


@dataclass
class DumpedRun:
    """Stands in for the device run: returns what the dump recorded."""

    index: DumpIndex
    name: CallName
    max_elements: int
    graph_run: Run  # the call on the CPU in the dump's dtypes, to read its autograd node

    def _recorded(self, key: str) -> list[Value]:
        record = self.index.read_record(self.index.entry_of(str(self.name)))
        values = record.get(key)
        if not isinstance(values, list):
            raise CallError(f"{self.name}: the record's {key!r} is not a list of outputs")
        ctx = DecodeContext(self.index.tensor_dir, self.index.task, self.name.call, self.max_elements)
        return [decode(value, ctx, f"{self.name.direction}.{key}[{i}]") for i, value in enumerate(values)]

    def forward(self, inputs: Inputs) -> Value:
        outputs = self._recorded("output")
        if all(output is None for output in outputs):
            raise CallSkip(
                "the dump records no output of this call (msprobe records null for a call that returns nothing, such as "
                "__setitem__, whose effect is on the tensor it writes): offline there is no device result; "
                "run without --msprobe-offline to judge it on a device"
            )
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def backward(self, inputs: Inputs, needs_grad: list[bool]) -> tuple[Value, ...]:
        dumped = self._recorded("output")
        edges = node_edges(self.graph_run, inputs, needs_grad)
        if len(edges) != len(dumped):
            raise CallSkip(
                f"the dump holds {len(dumped)} gradients where the node producing the output has "
                f"{len(edges)} inputs: they cannot be paired with the call's inputs"
            )
        wanted = sum(needs_grad)
        matched: list[Value] = [None] * wanted
        for edge, grad in zip(edges, dumped, strict=False):
            if edge is not None and isinstance(grad, torch.Tensor):
                matched[edge] = grad
        if all(grad is None for grad in matched):
            raise CallSkip(
                "no dumped gradient is a gradient of the call's inputs: msprobe recorded the gradients of an "
                "autograd node inside the call (a composite API), which the bench cannot reproduce"
            )
        return tuple(matched)


def node_edges(run: Run, inputs: Inputs, needs_grad: list[bool]) -> list[int | None]:
    """For each input of the autograd node that produced the call's output: which of
    the gradient-receiving inputs it is, or None where the edge goes elsewhere."""
    args, kwargs = tree_map(run.placement, inputs.args), tree_map(run.placement, inputs.kwargs)
    leaves = [t for t in tensors_in((args, kwargs))]
    wanted = [t for t, flag in zip(leaves, needs_grad, strict=False) if flag]
    for tensor in wanted:
        tensor.requires_grad_(True)
    with torch.enable_grad():
        copied_args, copied_kwargs = in_place_copies(run.api, run.function, args, kwargs)
        # an in-place call's edge leads to the copy it wrote: the copy's node is its leaf's
        copies = {
            id(copy.grad_fn): id(leaf)
            for leaf, copy in zip(leaves, tensors_in((copied_args, copied_kwargs)), strict=True)
            if copy is not leaf and copy.grad_fn is not None
        }
        output = run.function(*copied_args, **copied_kwargs)
    first = next((t for t in flat_outputs(output) if isinstance(t, torch.Tensor) and t.grad_fn is not None), None)
    if first is None:
        raise CallSkip("the call's output has no autograd node: no gradient to compare")
    position = {id(tensor): number for number, tensor in enumerate(wanted)}
    node_of_output = first.grad_fn
    assert node_of_output is not None  # first was chosen for having one
    return [
        None if node is None else position.get(copies.get(id(node), id(getattr(node, "variable", None))))
        for node, _ in node_of_output.next_functions
    ]
