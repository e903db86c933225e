"""Only what a grouped kernel wrote is judged.

``npu_grouped_matmul`` (and ``npu_dequant_swiglu_quant``) write only the rows their
``group_list`` (``group_index``) covers; the rest of the output is leftover device
memory. Judged, it gives false alarms, or a NaN there fails a correct call. The op's
reference says which rows are written (its ``written_rows``); every side's outputs are
cut to them before any standard, overflow re-check or report sample sees them, and the
call's report names the rows left out.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from pytest_msprobe.run.replay import Results, needs_grad, tree_map

if TYPE_CHECKING:
    from pytest_msprobe.dump.index import CallName
    from pytest_msprobe.dump.values import Nested
    from pytest_msprobe.run.replay import Inputs


@dataclass(frozen=True)
class Written:
    """Rows written per output position (positions over the flattened outputs; a
    position not named is written in full) and why the rest is not."""

    rows: dict[int, int]
    why: str


def written(name: CallName, inputs: Inputs, framework: str) -> Written | None:
    """What the kernel of this NPU call writes, None where it writes every output in
    full (or the reference cannot tell from these arguments: everything is judged)."""
    if name.api_type != "NPU":
        return None
    import pytest_msprobe.bench_functions as bench_functions  # only NPU calls need it (a script embeds it for them only)

    reference = bench_functions.get(name.api_name)
    rows_of = reference.companions.written_rows if reference is not None else None
    if rows_of is None:
        return None
    try:
        outputs, gradients, why = rows_of(*inputs.args, **inputs.kwargs)
    except (TypeError, ValueError, IndexError, RuntimeError):
        return None
    if name.direction == "forward":
        return Written(dict(outputs), why) if outputs else None
    flags = needs_grad(inputs, framework)
    wanted = [position for position, flag in enumerate(flags) if flag]  # backward outputs: the wanted inputs' grads
    rows = {wanted.index(position): count for position, count in gradients.items() if position in wanted}
    return Written(rows, why) if rows else None


def _number_leaves(value: Nested, function: Callable[[int, Nested], Nested]) -> Nested:
    """``value`` with ``function(position, leaf)`` applied to each leaf, positions counted
    over the flattened outputs (a single output is position 0)."""
    position = itertools.count()

    def one(item: Nested) -> Nested:
        return function(next(position), item)

    return tree_map(one, value) if isinstance(value, (list, tuple)) else one(value)


def cut(value: Nested, where: Written) -> Nested:
    """``value`` (a side's outputs) with each named output cut to its written rows."""

    def one(number: int, item: Nested) -> Nested:
        rows = where.rows.get(number)
        return item[:rows] if rows is not None and isinstance(item, torch.Tensor) and item.dim() else item

    return _number_leaves(value, one)


def cut_results(results: Results, where: Written | None) -> tuple[Results, list[str]]:
    """The results with every side cut to the written rows, and the lines that say what
    was left out of the judgement."""
    if where is None:
        return results, []
    notes: list[str] = []

    def note(number: int, item: Nested) -> Nested:
        if isinstance(item, torch.Tensor) and number in where.rows:
            notes.append(_note(number, item, where.rows[number], where.why))
        return item

    _number_leaves(results.bench, note)
    shortened = dataclasses.replace(
        results,
        device=cut(results.device, where),
        bench=cut(results.bench, where),
        reference=cut(results.reference, where),
    )
    return shortened, [line for line in notes if line]


def _note(number: int, tensor: torch.Tensor, rows: int, why: str) -> str:
    if tensor.dim() == 0 or rows >= tensor.shape[0]:
        return ""
    last = tensor.shape[0] - 1
    span = f"row {rows}" if rows == last else f"rows {rows}-{last}"
    return f"output {number}: {span} ({last + 1 - rows} of {last + 1}) {why}: not written by the kernel, not judged"
