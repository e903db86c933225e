"""The overflow re-check, part of every run: a dumped output that holds inf or NaN while
the call's inputs are finite is either the inputs' overflow or the kernel's.

msprobe answers this with a separate command that runs the call again on the CPU. Here
the bench already ran the call in raised precision on the same inputs, so its result
decides, at no extra run:

- the bench, rounded to the dumped output's dtype, overflows too (or the bench itself
  gives inf/NaN): any correct kernel overflows on these inputs. The model's range is
  the problem (a loss scale too large, logits past float16's range), not the kernel; a
  note, not an error. The message gives the bench's largest magnitude against the
  dtype's largest finite value.
- the bench stays within the dtype's range: the kernel overflowed inside (an exp
  without the max subtracted, a sum of squares in a narrow type): an error, whatever
  the device replayed here did.

Where the inputs already hold inf/NaN (a mask's -inf, a diverged step), the output's
inf/NaN may be theirs: no claim is made. Whether a dumped output holds inf/NaN is read
from its recorded Max and Min (msprobe records them in tensor dumps too, so no file is
read again); a non-finite Mean or Norm beside a finite Max and Min is msprobe's own sum
overflowing while every element is finite, so it counts only where Max and Min are not
recorded. A backward's dumped gradients are paired with the bench's through the call's
autograd graph, as --msprobe-offline pairs them (offline.node_edges); a gradient that
cannot be paired is not re-checked.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterator
from typing import TYPE_CHECKING

import torch

from pytest_msprobe.dump.tensors import DTYPES
from pytest_msprobe.errors import CallSkip
from pytest_msprobe.judge.findings.finding import Finding
from pytest_msprobe.judge.offline.dumped_run import node_edges
from pytest_msprobe.run.replay import Inputs, Results, Run, flat_outputs, needs_grad, tree_map
from pytest_msprobe.standards.pairing import Leaf, pair_leaves

if TYPE_CHECKING:
    from pytest_msprobe.dump.index import Json
    from pytest_msprobe.dump.values import Nested
    from pytest_msprobe.run.replay import Side

# Recorded statistics that say an output holds inf/NaN, in the order they are trusted.
EXTREMES = ("Max", "Min")
SUMS = ("Mean", "Norm")


def overflow_findings(
    results: Results, bench: Side, direction: str, framework: str, cut: Collection[int] = ()
) -> list[Finding]:
    """A finding per dumped output that holds inf/NaN while every input is finite.

    `cut`: positions of outputs whose unwritten rows were left out of the judgement
    (judge/verdict/written_rows.py): their recorded statistics cover leftover memory, so what they
    hold is read from the written rows instead."""
    dumped = list(_flat(results.inputs.recorded_outputs or []))
    overflowed = {position: stats for position, stats in enumerate(map(_non_finite_stats, dumped)) if stats}
    if cut:
        device = flat_outputs(results.device)
        for position in set(cut) & set(overflowed):
            written = device[position] if position < len(device) else None
            if isinstance(written, torch.Tensor) and bool(torch.isfinite(written).all()):
                del overflowed[position]
    if not overflowed or not finite_inputs(results.inputs):
        return []
    paired = _bench_outputs(results, bench, direction, framework, len(dumped))
    generated = any(leaf.origin.startswith("generated") for leaf in results.inputs.leaves)
    inputs = "finite inputs generated from the recorded statistics" if generated else "the same finite inputs"
    findings = []
    for position, stats in overflowed.items():
        spelled = dumped[position].get("dtype")
        dtype = DTYPES.get(spelled) if isinstance(spelled, str) else None
        if position in paired and dtype is not None and dtype.is_floating_point:
            path, value = paired[position]
            if isinstance(value, torch.Tensor) and value.is_floating_point():
                findings.append(_classify(path, value, dtype, stats, inputs))
    return findings


def _flat(recorded: Json) -> Iterator[Json]:
    """The recorded outputs in the order pair_leaves flattens the outputs."""
    if isinstance(recorded, list):
        for item in recorded:
            yield from _flat(item)
    elif isinstance(recorded, dict) and "type" not in recorded:
        for item in recorded.values():
            yield from _flat(item)
    else:
        yield recorded


def _non_finite_stats(value: Json) -> str:
    """The recorded statistics of an output that say it holds inf/NaN ("Max=inf,
    Min=-inf"), or "" where it is finite (or not a recorded tensor)."""
    if not isinstance(value, dict) or not str(value.get("type", "")).endswith("Tensor"):
        return ""
    keys = EXTREMES if any(isinstance(value.get(key), (int, float)) for key in EXTREMES) else SUMS
    found = [
        f"{key}={value[key]}"
        for key in keys
        if isinstance(value.get(key), (int, float))
        and not isinstance(value.get(key), bool)
        and not math.isfinite(value[key])
    ]
    return ", ".join(found)


def finite_inputs(inputs: Inputs) -> bool:
    """Every floating input (incoming gradients included) and float argument finite."""
    if any(
        not bool(torch.isfinite(leaf.tensor).all())
        for leaf in inputs.leaves
        if leaf.tensor.is_floating_point() or leaf.tensor.is_complex()
    ):
        return False
    scalars: list[float] = []
    tree_map(lambda value: scalars.append(value) if isinstance(value, float) else None, (inputs.args, inputs.kwargs))
    return all(math.isfinite(value) for value in scalars)


def _bench_outputs(
    results: Results, bench: Side, direction: str, framework: str, count: int
) -> dict[int, tuple[str, Nested]]:
    """Dumped output position -> (path, bench value). Forward outputs pair in order
    where their count matches; a backward's gradients through the autograd graph."""
    if direction == "forward":
        leaves = list(pair_leaves(results.bench, results.bench))  # a None output is a Mismatch: no value
        return (
            {
                position: (leaf.path, leaf.device if isinstance(leaf, Leaf) else None)
                for position, leaf in enumerate(leaves)
            }
            if len(leaves) == count
            else {}
        )
    if not isinstance(bench, Run) or not isinstance(results.bench, tuple):
        return {}  # a MindSpore bench without a torch twin has no torch graph to read
    try:
        edges = node_edges(bench, results.inputs, needs_grad(results.inputs, framework))
    except CallSkip:  # the output has no autograd node: nothing pairs
        return {}
    if len(edges) != count:
        return {}
    return {position: (f"[{edge}]", results.bench[edge]) for position, edge in enumerate(edges) if edge is not None}


def _classify(path: str, bench: torch.Tensor, dtype: torch.dtype, stats: str, inputs: str) -> Finding:
    """Input overflow (a note) where the bench overflows too once rounded to the dtype,
    else kernel overflow (an error)."""
    largest = torch.finfo(dtype).max
    finite = torch.isfinite(bench)
    max_abs = float(bench.abs().max()) if bool(finite.all()) else math.inf if bool(bench.isinf().any()) else math.nan
    raised = str(bench.dtype).removeprefix("torch.")
    name = str(dtype).removeprefix("torch.")
    columns = {"overflow_bench_max_abs": max_abs, "overflow_dtype_max": largest}
    if not bool(finite.all()):
        why = f"the bench itself gives {'NaN' if bool(bench.isnan().any()) else 'inf'} in {raised}"
    elif not bool(torch.isfinite(bench.to(dtype)).all()):
        why = f"max |bench| = {max_abs:.5g} in {raised}, beyond {name}'s largest finite value {largest:.5g}"
    else:
        text = (
            f"the dumped output holds inf/NaN ({stats}) where the bench on {inputs} stays within "
            f"{name}'s range (max |bench| = {max_abs:.5g} in {raised}, largest finite {largest:.5g}): the kernel "
            "overflowed inside (an intermediate in a narrow type: an exp without the max subtracted, a sum of "
            "squares); an error whatever the replay here gave"
        )
        return Finding("kernel overflow", path, True, text, {"overflow": "kernel", **columns})
    text = (
        f"the dumped output holds inf/NaN ({stats}) and so does any correct kernel on {inputs}: {why}. "
        "The inputs' range is the problem (the model's: a loss scale or logits too large for the dtype), not the "
        "kernel's"
    )
    return Finding("input overflow", path, False, text, {"overflow": "input", **columns})
