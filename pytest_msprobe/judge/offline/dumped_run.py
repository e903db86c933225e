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

Where the dumped gradient is not the input's (a linear or matmul on a batched input
records the reshape after the GEMM: the incoming gradient, reshaped), the input's
gradient is recovered from the rest of the dump (recovered_gradients): at levels mix
and L0 from the records of the module that made the call alone (its backward's input
gradients, its parameters' gradients); else from the dump's data flow, as the incoming
gradient of the call that produced the input (dump/dataflow.py), which autograd summed
over every call that read that output: the bench then sums those calls' gradients too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from pytest_msprobe.dump.cache import DumpSummary
from pytest_msprobe.dump.dataflow import Ambiguous, Gather, Read, dataflow_of
from pytest_msprobe.dump.index import CallName, DumpIndex
from pytest_msprobe.dump.module_records import ModuleRecords, module_of
from pytest_msprobe.dump.values import DecodeContext, TensorLeaf, decode
from pytest_msprobe.errors import CallError, CallSkip, DumpError, MissingTensorFile
from pytest_msprobe.run.replay import Inputs, Run, flat_outputs, in_place_copies, tensors_in, tree_map, writes_in_place

if TYPE_CHECKING:
    from collections.abc import Callable

    from pytest_msprobe.dump.values import Nested
    from pytest_msprobe.run.replay import Gradients

DEVICE_LABEL = "dump (offline: the dumped outputs are the device result)"


def require_tensor_task(index: DumpIndex | DumpSummary) -> None:
    """One message for the whole dump when it cannot be checked offline."""
    if index.task != "tensor":
        raise DumpError(
            f"{index.path} is a statistics dump: it records only Max/Min/Mean/Norm of the outputs, "
            'so --msprobe-offline has no device result to check; dump with task "tensor", '
            "or run without --msprobe-offline to replay the calls on a device"
        )


#: what a user can do about a backward whose gradients the dump does not hold
OFFLINE_BACKWARD_REMEDY = (
    "to judge it, run without --msprobe-offline on the device: its backward is then replayed there, "
    "the gradients computed rather than read from the dump"
)


@dataclass
class DumpedRun:
    """Stands in for the device run: returns what the dump recorded."""

    index: DumpIndex
    name: CallName
    max_elements: int
    graph_run: Run  # the call on the CPU in the dump's dtypes, to read its autograd node
    evidence: Evidence | None = None  # set by backward where gradients came from elsewhere in the dump

    def _decode_recorded(self, key: str) -> list[Nested]:
        record = self.index.read_record(self.index.entry_of(str(self.name)))
        values = record.get(key)
        if not isinstance(values, list):
            raise CallError(f"{self.name}: the record's {key!r} is not a list of outputs")
        ctx = DecodeContext(self.index.tensor_dir, self.index.task, self.name.call, self.max_elements)
        try:
            return [decode(value, ctx, f"{self.name.direction}.{key}[{i}]") for i, value in enumerate(values)]
        except MissingTensorFile as exc:
            what = "output" if self.name.direction == "forward" else "gradient"
            raise CallError(
                f"the dumped {what} file {exc.data_name!r} is missing from {exc.folder}: offline (--msprobe-offline) "
                f"the dumped {what}s are the device's result, so this call has none to judge. Copy the dump's "
                "dump_tensor_data/ folder whole, or run without --msprobe-offline to replay the call on a device"
            ) from exc

    def forward(self, inputs: Inputs) -> Nested:
        outputs = self._decode_recorded("output")
        if all(output is None for output in outputs):
            raise CallSkip(
                "the dump records no output of this call (msprobe records null for a call that returns nothing, such as "
                "__setitem__, whose effect is on the tensor it writes): offline there is no device result; "
                "run without --msprobe-offline to judge it on a device"
            )
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def recorded_gradients(
        self, inputs: Inputs, needs_grad: list[bool]
    ) -> tuple[list[Nested], list[torch.Tensor | None], list[int | None]]:
        """The dumped gradients, those of them that are the inputs' own (by the node's
        edges; None elsewhere), and the edges."""
        dumped = self._decode_recorded("output")
        edges = node_edges(self.graph_run, inputs, needs_grad)
        matched: list[torch.Tensor | None] = [None] * sum(needs_grad)
        if len(edges) == len(dumped):
            for edge, grad in zip(edges, dumped, strict=False):
                if edge is not None and isinstance(grad, torch.Tensor):
                    matched[edge] = grad
        return dumped, matched, edges

    def direct_gradient(self, inputs: Inputs, needs_grad: list[bool], slot: int) -> torch.Tensor | None:
        """The device's gradient of gradient-receiving input `slot` where the call's
        record holds it as the input's own; None where it is not, or where an in-place
        call's record is the incoming gradient passed through (backward says why)."""
        grad = self.recorded_gradients(inputs, needs_grad)[1][slot]
        if not isinstance(grad, torch.Tensor):
            return None
        passed = _passed_through(grad, inputs.grads)
        return (
            None
            if passed and writes_in_place(self.graph_run.api, self.graph_run.function, inputs.args, inputs.kwargs)
            else grad
        )

    def backward(self, inputs: Inputs, needs_grad: list[bool]) -> Gradients:
        dumped, matched, edges = self.recorded_gradients(inputs, needs_grad)
        passed = [_passed_through(grad, inputs.grads) for grad in matched]
        if any(passed) and writes_in_place(self.graph_run.api, self.graph_run.function, inputs.args, inputs.kwargs):
            own = self.graph_run.backward(inputs, needs_grad)
            matched = [
                None if through and not _passed_through(mine, inputs.grads) else grad
                for grad, through, mine in zip(matched, passed, own, strict=True)
            ]
        missing = [position for position, grad in enumerate(matched) if grad is None]
        if missing and self.index.task == "tensor":
            self.evidence = recovered_gradients(self, inputs, needs_grad, missing)
            for position, grad in self.evidence.grads.items():
                matched[position] = grad
        if all(grad is None for grad in matched):
            why = (
                "; ".join(self.evidence.left_out)
                if self.evidence is not None and self.evidence.left_out
                else "no tensor dump"
            )
            if len(edges) != len(dumped):
                raise CallSkip(
                    f"the inputs' gradients are neither at the call nor elsewhere in the dump ({why}): the dump holds "
                    f"{len(dumped)} gradients where the node producing the output has {len(edges)} inputs; "
                    + OFFLINE_BACKWARD_REMEDY
                )
            raise CallSkip(
                f"the inputs' gradients are neither at the call nor elsewhere in the dump ({why}): msprobe recorded the "
                "gradients of an autograd node inside the call (a composite API); " + OFFLINE_BACKWARD_REMEDY
            )
        return tuple(matched)


def _passed_through(grad: Nested, incoming: list[Nested] | None) -> bool:
    """Whether a gradient is an incoming gradient, bit for bit. At levels mix and L0
    msprobe also hooks the module of an in-place call (`nn.ReLU(inplace=True)`), and
    what it then records as the call's input gradient is the incoming one passed through
    the hook's identity node (resnet's relu: passed where the input was negative). Where
    the call's own gradient on the CPU is not the incoming one (an `__iadd__`'s is), the
    record is no kernel result: the gradient is recovered from the data flow, as a
    composite call's is (a device kernel that really passes the gradient through is
    still judged there, through its producer's incoming gradient)."""
    if not isinstance(grad, torch.Tensor):
        return False
    return any(
        isinstance(other, torch.Tensor)
        and other.dtype == grad.dtype
        and other.numel() == grad.numel()
        and torch.equal(other.reshape(grad.shape), grad)
        for other in incoming or []
    )


@dataclass
class Shared:
    """A recovered input gradient that autograd summed over several calls reading the
    same output: the bench adds the other calls' gradients to this call's."""

    position: int  # which gradient-receiving input of the call
    own: Gather  # the input as a gather from the producer's flat output
    producer_numel: int
    producer: str  # the call whose output's recorded gradient is the sum
    others: list[Read]  # the other calls' inputs read from that output (overlapping this one)


@dataclass
class Evidence:
    """Input gradients of a call recovered from the dump, and how."""

    grads: dict[int, torch.Tensor]  # gradient-receiving input -> the device's gradient
    origins: list[str]  # what each recovered gradient is, for the verdict's reference
    left_out: list[str]  # why the others were not recovered
    shared: list[Shared]

    @property
    def how(self) -> str:
        return "; ".join(self.origins)


def recovered_gradients(run: DumpedRun, inputs: Inputs, needs_grad: list[bool], missing: list[int]) -> Evidence:
    """The device's gradients of the inputs `missing`, from the module records where
    the module made the call alone, else from the data flow; the rest named."""
    forward_leaves = [leaf for leaf in inputs.leaves if not leaf.path.startswith("backward.")]
    wanted = [leaf for leaf, flag in zip(forward_leaves, needs_grad, strict=False) if flag]
    recovery = _Recovery(run.index, run.max_elements, wanted, Evidence({}, [], [], []))
    module = module_of(run.index, str(run.name.sibling("forward")))
    if module is not None:
        _from_module(recovery, module, missing)
    for position in missing:
        if position not in recovery.evidence.grads:
            _from_dataflow(recovery, position)
    return recovery.evidence


@dataclass(frozen=True)
class _Recovery:
    """One call's recovery: the dump its tensors are read from (as the call's own are,
    within --msprobe-max-elements), its gradient-receiving inputs (`wanted`, by
    position) and the evidence filled in."""

    index: DumpIndex
    max_elements: int
    wanted: list[TensorLeaf]
    evidence: Evidence

    def tensor_at(self, value: object, where: str) -> torch.Tensor | None:
        """A recorded tensor outside the call's own record, read as the call's are (inside
        dump_tensor_data/, within --msprobe-max-elements); None for anything else."""
        if not isinstance(value, dict) or value.get("type") != "torch.Tensor":
            return None
        return DecodeContext(self.index.tensor_dir, self.index.task, where, self.max_elements).tensor(value, where)


def _from_module(recovery: _Recovery, module: ModuleRecords, missing: list[int]) -> None:
    """Module input i's gradient is its backward output i; parameter p's its
    parameters_grad[p]: each paired with the call's input holding the same bits."""
    evidence = recovery.evidence
    pairs: list[tuple[object, object, str]] = []  # (forward value, gradient value, what)
    args = module.forward.get("input_args")
    grads = (module.backward or {}).get("output")
    if isinstance(args, list) and isinstance(grads, list):
        pairs += [
            (arg, grad, f"{module.name.replace('.forward.', '.backward.')} output[{i}]")
            for i, (arg, grad) in enumerate(zip(args, grads, strict=False))
        ]
    parameters, parameter_grads = module.forward.get("parameters"), module.parameters_grad
    if isinstance(parameters, dict) and isinstance(parameter_grads, dict):
        for key, value in parameters.items():
            grad = parameter_grads.get(key)
            grad = grad[0] if isinstance(grad, list) and grad else grad
            pairs.append((value, grad, f"{module.name.replace('.forward.', '.parameters_grad.')} {key}"))
    for value, grad_value, what in pairs:
        try:
            held = recovery.tensor_at(value, module.name)
            grad = recovery.tensor_at(grad_value, what)
        except (CallError, CallSkip) as exc:
            evidence.left_out.append(f"{what}: {exc}")
            continue
        if held is None or grad is None:
            continue
        for position in missing:
            leaf = recovery.wanted[position]
            if position not in evidence.grads and _same_bits(leaf.tensor, held) and grad.shape == leaf.tensor.shape:
                evidence.grads[position] = grad
                evidence.origins.append(f"{leaf.path}'s gradient from the module's record {what}")
                break


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and bool((a.contiguous().view(torch.uint8) == b.contiguous().view(torch.uint8)).all())
    )


def _incoming(recovery: _Recovery, read: Read) -> torch.Tensor:
    """The producer's incoming gradient of the output that was read (its backward
    record's `input`), flat."""
    call = f"{read.producer.call}.backward"
    entry = recovery.index.entry(call)
    if entry is None:
        raise CallSkip(f"{read.producer.call} has no backward record: the gradient of its output is not in the dump")
    values = recovery.index.read_record(entry).get("input")
    value = values[read.producer.output] if isinstance(values, list) and read.producer.output < len(values) else None
    grad = recovery.tensor_at(value, f"{call} input[{read.producer.output}]")
    if grad is None or grad.numel() != read.producer.spec.numel:
        raise CallSkip(f"{call} records no gradient of the shape of output {read.producer.output}")
    return grad.reshape(-1)


def _from_dataflow(recovery: _Recovery, position: int) -> None:
    """The input's gradient as the incoming gradient of the output it read, where every
    reader of that output is settled (their sum is the bench's: Shared)."""
    leaf, evidence = recovery.wanted[position], recovery.evidence
    data_name = leaf.spec.data_name
    try:
        flow = dataflow_of(recovery.index, recovery.max_elements)
        read = flow.source(data_name) if data_name else None
        if read is None:
            evidence.left_out.append(
                f"{leaf.path} was made by no dumped call (the model's input, a parameter, or an op the dump does not hold)"
            )
            return
        incoming = _incoming(recovery, read)
        readers = flow.consumers(read.producer)
        unsettled = flow.find_unsettled(read.producer)
    except (Ambiguous, CallSkip, CallError) as exc:
        evidence.left_out.append(f"{leaf.path}: {exc}")
        return
    covered = np.zeros(read.producer.spec.numel, dtype=bool)
    own = np.zeros_like(covered)
    own[read.gather.reshape(-1)] = True
    others = []
    for other in readers:
        covered[other.gather.reshape(-1)] = True
        if other.consumer.data_name != data_name and bool(own[other.gather.reshape(-1)].any()):
            others.append(other)
    unsettled = [maybe for maybe in unsettled if bool(own[maybe.positions].any())]
    if unsettled:
        evidence.left_out.append(
            f"{leaf.path}: {unsettled[0].consumer.call} may have read the same elements of {read.producer.call}'s output "
            f"({unsettled[0].why}): the sum of the settled readers' gradients would lack its share"
        )
        return
    unread = ~covered & (incoming != 0).numpy()
    if bool(unread.any()):
        evidence.left_out.append(
            f"{leaf.path}: {int(unread.sum())} elements of {read.producer.call}'s output carry a gradient although no dumped call "
            "read them: an op the dump does not hold read that output, and its share of the gradient cannot be separated"
        )
        return
    evidence.grads[position] = (
        incoming[torch.from_numpy(read.gather.reshape(-1))].reshape(leaf.tensor.shape).to(leaf.tensor.dtype)
    )
    origin = f"{leaf.path}'s gradient from {read.producer.call}.backward input[{read.producer.output}] (the gradient of the output it read)"
    if others:
        evidence.shared.append(
            Shared(position, read.gather, read.producer.spec.numel, f"{read.producer.call}.backward", others)
        )
        origin += f", judged together with {', '.join(sorted({o.consumer.call for o in others}))}: the bench sums their gradients as autograd did"
    evidence.origins.append(origin)


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

    def leaf_of(node: torch.autograd.graph.Node) -> int | None:
        variable = getattr(node, "variable", None)
        return copies.get(id(node), None if variable is None else id(variable))

    edges = [node for node, _ in node_of_output.next_functions]
    reached = [_find_reached_leaves(node, leaf_of) for node in edges]
    return [
        None
        if node is None or any(leaf_of(node) in other for j, other in enumerate(reached) if j != i)
        else position.get(leaf_of(node) or 0)
        for i, node in enumerate(edges)
    ]


def _find_reached_leaves(
    node: torch.autograd.graph.Node | None, leaf_of: Callable[[torch.autograd.graph.Node], int | None]
) -> set[int]:
    """The inputs an edge's gradient flows on to, through the call's own graph. An input
    the node reaches directly AND through another edge gets the sum of both: the direct
    edge's gradient is part of it (F.normalize's x / norm(x): msprobe records DivBackward's
    g / norm for x, whose full gradient also flows through the norm, 1.7x away)."""
    found: set[int] = set()
    stack, seen = [node], set()
    while stack:
        current = stack.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        leaf = leaf_of(current)
        if leaf is not None:
            found.add(leaf)
        stack += [following for following, _ in current.next_functions]
    return found
