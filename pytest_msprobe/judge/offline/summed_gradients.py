"""Offline, a recovered input gradient that autograd summed over several calls reading
the same output (judge/offline/dumped_run.py Shared): the bench and the reference sum those calls'
gradients too (judge/offline/missing_shares.py: the arithmetic, and the allowance for another grouping).

The shares are the device's, where a call's record holds its input's gradient, else
each call run on its own dumped inputs and incoming gradients (judge/check/call.py
_share_of). Both sides accumulate them as autograd does: each gradient in the dump's
dtype D (the bench's rounded to D, as a correct kernel returns it), added in D in the
order the dump recorded the calls' backwards. That rounding is autograd's, not the
kernel's: against an exact sum, the sum's cancellation would count it as the kernel's
error (on a bfloat16 dump, 12% of a correct linear's input gradient over 1 ULP). A
composite reader's rerun share the device added in pieces, another grouping: the device
and the reference are judged beyond each element's allowance for that (judge/offline/missing_shares.py),
as where this call's own graph adds its share in pieces. A call that cannot be run
leaves the input out of the comparison, named; so does a sum the reference cannot
rebuild within rounding of the dumped one (judge/offline/missing_shares.py rebuild_check: a reader the
dump does not hold).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias, cast

import numpy as np
import torch

from pytest_msprobe.errors import CallError, CallSkip
from pytest_msprobe.judge.offline.dumped_run import OFFLINE_BACKWARD_REMEDY
from pytest_msprobe.judge.offline.missing_shares import (
    Kind,
    Share,
    accumulate_shares,
    beyond,
    rebuild_bound,
    rebuild_check,
    ulp,
)
from pytest_msprobe.judge.verdict.summed import gradient_pieces
from pytest_msprobe.judge.verdict.terms import term_counts, term_magnitudes
from pytest_msprobe.run.replay import Run, needs_grad

if TYPE_CHECKING:
    from pytest_msprobe.dump.dataflow import Read
    from pytest_msprobe.dump.index import CallName, DumpIndex
    from pytest_msprobe.judge.offline.dumped_run import Evidence, Shared
    from pytest_msprobe.run.replay import Gradients, Inputs, Results, Side

#: per gradient-receiving input, how many terms the call's own share sums and their magnitude (_own_spread)
Spread: TypeAlias = Callable[[int], tuple[torch.Tensor, torch.Tensor] | None]


@dataclass(frozen=True)
class SummingCall:
    """The judged call whose recovered input gradients are sums over its output's readers."""

    index: DumpIndex
    name: CallName
    bench: Side  # its bench run: its graph's pieces, its own share's terms
    inputs: Inputs
    framework: str
    share_of: Callable[
        [Read], Share
    ]  # another reader's share (judge/check/call.py _share_of); raises CallSkip, CallError


@dataclass
class _Columns:
    """Each side's input gradients by position, as the sums replace them (None: left out)."""

    device: list[torch.Tensor | None]
    bench: list[torch.Tensor | None]
    reference: list[torch.Tensor | None] | None  # None: no reference run


@dataclass(frozen=True)
class _Sums:
    """The bench's sum of one input's shares: each element's allowance and rounding (judge/offline/missing_shares.py Summed)."""

    allowance: torch.Tensor
    rounding: torch.Tensor


def add_shared(results: Results, evidence: Evidence, call: SummingCall) -> None:
    """The bench's and the reference's gradient of each shared input summed over its
    readers (module docstring); the inputs left out named in `evidence.left_out`, each
    allowance in `evidence.origins`. Raises CallSkip where no input gradient is left."""
    # a backward's results: each side's Gradients (run/replay.py Side.backward)
    columns = _Columns(
        list(cast("Gradients", results.device)),
        list(cast("Gradients", results.bench)),
        list(cast("Gradients", results.reference)) if isinstance(results.reference, tuple) else None,
    )
    spread = _own_spread(call.name, call.bench, call.inputs, call.framework)
    for shared in evidence.shared:
        _sum_shared(columns, shared, call, spread, evidence)
    if all(grad is None for grad in columns.device):
        raise CallSkip(f"no input gradient could be judged: {'; '.join(evidence.left_out)}; {OFFLINE_BACKWARD_REMEDY}")
    results.device, results.bench = tuple(columns.device), tuple(columns.bench)
    if columns.reference is not None:
        results.reference = tuple(columns.reference)


def _sum_shared(columns: _Columns, shared: Shared, call: SummingCall, spread: Spread, evidence: Evidence) -> None:
    """One shared input: its shares in the dump's order, summed on the bench's and the
    reference's side, the dumped sum checked against the rebuilt one, the device and
    the reference judged beyond the allowance for the device's other grouping."""
    position = shared.position
    pieces = pieces_of(call.bench, call.inputs, call.framework, position)
    try:
        shares, composite = _ordered_shares(columns, shared, call, pieces)
    except (CallSkip, CallError) as exc:
        columns.device[position] = None
        evidence.left_out.append(f"the gradient shared with {', '.join(o.consumer.call for o in shared.others)}: {exc}")
        return
    dtype = _shared_device(columns, position).dtype
    sums = _sum_shares(columns, shared, shares, dtype)
    disagreement = _rebuild_disagreement(columns, shared, sums, spread(position), dtype)
    if disagreement is not None:
        columns.device[position] = None
        readers = ", ".join(sorted({call.name.call, *(o.consumer.call for o in shared.others)}))
        evidence.left_out.append(
            f"the gradient {shared.producer} recorded is not the sum of its readers' gradients ({readers}) as the reference "
            f"rebuilds it: {disagreement}; a reader the dump does not hold (an op msprobe "
            "does not record: a cast, a slice, a repeat) added a share no dumped call names, or a share is mapped wrongly"
        )
        return
    if sums is not None and bool((sums.allowance > 0).any()):
        centre = cast(torch.Tensor, columns.bench[position])  # summed: sums are the bench's (_summed)
        _beyond_allowance(columns, position, centre, sums.allowance)
        evidence.origins.append(_allowance_note(composite, len(pieces), sums.allowance, centre, dtype))


def _ordered_shares(
    columns: _Columns, shared: Shared, call: SummingCall, pieces: list[torch.Tensor]
) -> tuple[list[Share], list[str]]:
    """The call's own share and every other reader's, in the order the dump recorded
    their backwards; and the readers whose rerun share is composite (in pieces)."""
    position = shared.position
    reference = None if columns.reference is None else columns.reference[position]
    own = Share(shared.own, columns.bench[position], reference, Kind.OWN, pieces)
    parts = [(_backward_order(call.index, call.name.call), own)]
    composite: set[str] = set()
    for other in shared.others:
        share = call.share_of(other)
        parts.append((_backward_order(call.index, other.consumer.call), share))
        if len(share.pieces) > 1:
            composite.add(other.consumer.call)
    parts.sort(key=lambda part: part[0])
    return [share for _, share in parts], sorted(composite)


def _sum_shares(columns: _Columns, shared: Shared, shares: list[Share], dtype: torch.dtype) -> _Sums | None:
    """The bench's and the reference's gradient of the input replaced by their sums of
    the shares; the bench's allowance and rounding (the reference's partial sums are
    within its own rounding of these); None where the bench has no gradient there."""
    position = shared.position
    positions = torch.from_numpy(np.ascontiguousarray(shared.own.reshape(-1)))
    sums = None
    for side, column in (("bench", columns.bench), ("reference", columns.reference)):
        given = None if column is None else column[position]
        if column is not None and given is not None:
            summed = accumulate_shares(shares, shared.producer_numel, dtype, side)
            column[position] = summed.total[positions].reshape(shared.own.shape).to(given.dtype)
            if side == "bench":
                sums = _Sums(summed.allowance[positions], summed.rounding[positions])
    return sums


def _rebuild_disagreement(
    columns: _Columns,
    shared: Shared,
    sums: _Sums | None,
    spread: tuple[torch.Tensor, torch.Tensor] | None,
    dtype: torch.dtype,
) -> str | None:
    """How the dumped sum lies beyond what the reference's (else the bench's) rebuilt
    one allows (judge/offline/missing_shares.py rebuild_check); None where it does not, or where the
    call's own share's spread is unknown (no check there)."""
    position = shared.position
    reference = None if columns.reference is None else columns.reference[position]
    rebuilt = reference if reference is not None else columns.bench[position]
    if sums is None or rebuilt is None or spread is None:
        return None
    bound = rebuild_bound(sums.rounding, sums.allowance, spread[0].reshape(-1), spread[1].reshape(-1), dtype)
    return rebuild_check(_shared_device(columns, position), rebuilt, bound)


def _beyond_allowance(columns: _Columns, position: int, centre: torch.Tensor, allowance: torch.Tensor) -> None:
    """The device's and the reference's gradient judged beyond the allowance around the bench's."""
    columns.device[position] = beyond(_shared_device(columns, position), centre, allowance)
    reference = None if columns.reference is None else columns.reference[position]
    if columns.reference is not None and reference is not None:
        columns.reference[position] = beyond(reference, centre, allowance)


def _shared_device(columns: _Columns, position: int) -> torch.Tensor:
    """A shared input's device gradient: the one recovered from the dump (judge/offline/dumped_run.py
    _from_dataflow), never None while its sum is judged."""
    return cast(torch.Tensor, columns.device[position])


def _own_spread(name: CallName, bench: Side, inputs: Inputs, framework_name: str) -> Spread:
    """For the rebuild check (judge/offline/missing_shares.py): per gradient-receiving input, how many
    terms the call's own share sums and their magnitude, from the bench evaluated on ones
    and on absolute values; None where the API's gradients are not sums of products
    (judge/verdict/terms.py term_counts), which bounds no correct kernel's share: no check there."""
    counts, terms = (
        term_counts(name, bench, inputs, framework_name),
        term_magnitudes(name, bench, inputs, framework_name),
    )

    def spread(position: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        found = [
            value[position] if isinstance(value, tuple) and len(value) > position else None for value in (counts, terms)
        ]
        count, magnitude = found
        return (count, magnitude) if isinstance(count, torch.Tensor) and isinstance(magnitude, torch.Tensor) else None

    return spread


def _backward_order(index: DumpIndex, call: str) -> int:
    entry = index.entry(f"{call}.backward")
    return -1 if entry is None else index.position_of(f"{call}.backward")


def pieces_of(bench: Side, inputs: Inputs, framework_name: str, slot: int) -> list[torch.Tensor]:
    """The pieces a call's graph adds into its gradient-receiving input `slot`
    (judge/verdict/summed.py gradient_pieces); none where the bench is not a torch run or its graph
    cannot be read (the share then counts as one piece)."""
    if not isinstance(bench, Run):
        return []
    try:
        return gradient_pieces(bench, inputs, needs_grad(inputs, framework_name), slot)
    except Exception:  # noqa: BLE001 - the call's own backward ran; without its graph the share is one piece
        return []


def _allowance_note(
    composite: list[str], own_pieces: int, allowance: torch.Tensor, bench: torch.Tensor, dtype: torch.dtype
) -> str:
    """What the verdict's reference says of the allowance: whose shares, how many elements
    and how wide, in ULPs of D at the bench's value."""
    widths = (allowance / ulp(bench.reshape(-1).double(), dtype))[allowance > 0]
    whose = (
        [f"the composite shares of {', '.join(composite)} are not in the dump (rerun on the bench)"]
        if composite
        else []
    )
    whose += [f"this call's own graph adds its share in {own_pieces} pieces"] if own_pieces > 1 else []
    return (
        f"{' and '.join(whose)}: the device added them in another grouping; device and reference judged beyond each "
        f"element's rounding allowance for it ({int(widths.numel())} elements, median {float(torch.median(widths)):.2g} ULP, "
        f"max {float(widths.max()):.2g} ULP)"
    )
