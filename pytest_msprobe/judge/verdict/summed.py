"""Backwards that sum overlapping contributions: floating-point arithmetic, not copies.

The gradients of the `[summed_backward]` APIs (api_tables/pytorch.toml: pools' selection,
gathers, copies, broadcasts) move the incoming gradient's values into the inputs' shape:
exact where each input element receives one value, but where a max_pool's windows
overlap (kernel 3, stride 2, as in ResNet's stem), an index repeats (gather,
index_select) or an input is broadcast (expand, where), an element receives several,
summed in an order no standard fixes (a float32 max_pool2d backward measured 0.5% of
its elements an ULP from the float64 sum). Whether it does is read from the call
itself: its backward evaluated on an incoming gradient of ones counts each input
element's contributions exactly (sums of ones in the bench's precision); a count above
1 routes the call as `<api>.summed` (standards/tables/api_standards.csv).

A composite call's input gradient is a sum too: autograd adds the gradient of each edge
of the call's graph that leads to the input (F.normalize's x / norm(x): the division's
and the norm's) into the input's buffer one by one, in the dtype D. gradient_pieces
returns those pieces, for the allowance of a sum whose pieces the dump does not hold
(judge/offline/missing_shares.py).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING

import torch

from pytest_msprobe.run.apis import summed_backward_table
from pytest_msprobe.run.replay import Inputs, Run, evaluate, tensors_in, tree_map

if TYPE_CHECKING:
    from pytest_msprobe.dump.index import CallName
    from pytest_msprobe.dump.values import Nested
    from pytest_msprobe.run.replay import Side

SUMMED = ".summed"


def summed_route(name: CallName) -> str:
    """The routing name of the call's backward where it sums contributions."""
    return f"{name.operator}{SUMMED}"


def sums_contributions(name: CallName, bench: Side, inputs: Inputs, framework: str) -> bool:
    """Whether some input element of this backward receives more than one incoming
    gradient value. One more bench evaluation: the caller asks only where the call's
    own standard judged an error."""
    if name.direction != "backward" or name.operator not in summed_backward_table() or not isinstance(bench, Run):
        return False
    ones = tree_map(ones_for, inputs.grads or [])
    counts = evaluate(bench, "backward", dataclasses.replace(inputs, grads=ones), framework)
    return counts is not None and any(count.abs().max() > 1 for count in tensors_in(counts) if count.numel())


def ones_for(value: Nested) -> Nested:
    """A floating tensor's ones (anything else kept): evaluated on them, a sum of
    products counts its terms."""
    return torch.ones_like(value) if isinstance(value, torch.Tensor) and value.is_floating_point() else value


def gradient_pieces(run: Run, inputs: Inputs, needs_grad: list[bool], slot: int) -> list[torch.Tensor]:
    """The gradients the call's graph adds into gradient-receiving input `slot`, one per
    graph edge that ends at the input (in the run's precision); the input's gradient is
    their sum. An input the graph reaches along one edge has one piece."""
    pieces: list[torch.Tensor] = []

    def observe(wanted: list[torch.Tensor], outputs: list[torch.Tensor]) -> None:
        target = wanted[slot]
        seen: set[int] = set()
        stack = [output.grad_fn for output in outputs]
        while stack:
            node = stack.pop()
            if node is None or id(node) in seen:
                continue
            seen.add(id(node))
            for edge, (following, _) in enumerate(node.next_functions):
                if following is not None and getattr(following, "variable", None) is target:
                    node.register_hook(functools.partial(_keep, pieces, edge))
                stack.append(following)

    run.observed_backward(inputs, needs_grad, observe)
    return pieces


def _keep(pieces: list[torch.Tensor], edge: int, grad_inputs: tuple[torch.Tensor | None, ...], _: object) -> None:
    grad = grad_inputs[edge]
    if grad is not None:
        pieces.append(grad.detach().cpu())
