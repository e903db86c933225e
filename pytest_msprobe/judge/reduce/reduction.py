"""Reduce a failing call to a smaller input that fails the same way, for a bug report.

A kernel engineer's first step with a failing call is to cut its input down until the
failure is small enough to read. This module does that step with the plugin's own
verdict as the oracle: each candidate is the dumped call with some dimensions sliced
(halved, delta-debugging style) and then, where the failure does not depend on the
values, its inputs made constant. A candidate is written as a one-call tensor dump,
the form the bug report hands over, and judged exactly as a dumped call is
(judge/check/call.py: same sides, same standards, same re-judgements; offline its dumped
outputs sliced with it). It is accepted only where it fails with the same signature
(failure_signature): a reduction never changes what is reported.

Which dimensions of which tensors may be cut together is data (judge/reduce/cuts.py: the
`[reduce]` table of run/api_tables/pytorch.toml and its rules). Offline, an axis whose
slices have no dumped output (a matmul's inner dimension) is cut only where the device
here, judged single-run, fails alike (_on_the_device); the reduction says so.

Reproducible: the search draws nothing at random (axes largest first, the first half
before the second), and the reduced dump keeps the call's name, whose seeds the plugin
derives from it. Bounded: Plan's tries and seconds.
"""

from __future__ import annotations

import dataclasses
import math
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_msprobe.dump.index import CallName, DumpIndex, read_index
from pytest_msprobe.dump.tensor_dump import tensor_entry, write_tensor_dump
from pytest_msprobe.dump.tensors import load_tensor, tensor_spec
from pytest_msprobe.dump.values import TENSOR_TYPES
from pytest_msprobe.errors import CallError, CallSkip, DumpError
from pytest_msprobe.judge.check.call import CallResult, Settings, check_call
from pytest_msprobe.judge.reduce.cuts import Axis, CallShapes, Loc, call_axes
from pytest_msprobe.run.replay import DeviceFailed

if TYPE_CHECKING:
    import torch

    from pytest_msprobe.dump.index import Json, Record
    from pytest_msprobe.standards import Verdict

#: the backward record's tensors, by the forward tensor whose shape they have
BACKWARD_TWINS = {"input": "output", "output": "input_args"}


@dataclass(frozen=True)
class Signature:
    """How a call fails: what a reduction must keep. `kinds`: each failing output's
    path with each reason as a kind (numbers masked, their signs kept: the bias's
    direction; the words kept: the misrounding's side)."""

    status: str
    standard: str
    kinds: frozenset[tuple[str, str]]

    def __str__(self) -> str:
        return f"{self.status} by {self.standard}: " + "; ".join(f"{path}: {kind}" for path, kind in sorted(self.kinds))


_NUMBER = re.compile(r"(?<![A-Za-z_\d.])([+-]?)(?:\d+\.?\d*|\.\d+)(?:e[+-]?\d+)?|\b(?:inf|nan)\b")
_ASIDE = re.compile(r"\s*\([^()]*\)")
_KIND_END = re.compile(r"\s*[,;]")


def reason_kind(reason: str) -> str:
    """A reason without its magnitudes: numbers become '#' (a sign kept: a bias's
    direction), asides in parentheses go ('(limit ...)'), and the text stops at its
    first clause (', against ...')."""
    masked = _NUMBER.sub(lambda match: (match.group(1) or "") + "#", reason)
    while True:
        bare = _ASIDE.sub("", masked)
        if bare == masked:
            break
        masked = bare
    return _KIND_END.split(masked, maxsplit=1)[0].strip()


def failure_signature(verdict: Verdict) -> Signature:
    """The signature of a verdict: its status and standard, and the kind of every reason
    of each output that has the verdict's status."""
    leaves = verdict.outputs or (verdict,)
    kinds = frozenset(
        (leaf.path or "output", reason_kind(reason))
        for leaf in leaves
        if leaf.status == verdict.status
        for reason in leaf.reasons
    )
    return Signature(verdict.status, verdict.standard, kinds)


# --- the call and its candidates --------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """How far a reduction goes: at most `tries` candidates judged and `seconds` spent."""

    tries: int = 64
    seconds: float = 60.0
    progress: Callable[[str], None] | None = None  # told each accepted step


@dataclass(frozen=True)
class Cut:
    """A candidate: each axis's kept [start, stop) and the inputs made constant."""

    ranges: tuple[tuple[int, int], ...]
    constant: frozenset[Loc] = frozenset()


@dataclass
class ReducibleCall:
    """The dumped call: its records, its tensors by location, and its axes."""

    name: CallName
    framework: str
    records: dict[str, Record]  # "forward", and "backward" for a backward call
    tensors: dict[tuple[str, Loc], torch.Tensor]  # (record, location) -> the dumped tensor
    axes: list[Axis]

    def elements(self, cut: Cut) -> int:
        """The elements of the forward inputs a cut keeps."""
        return sum(
            math.prod(self.shape(loc, cut))
            for (record, loc) in self.tensors
            if record == "forward" and loc[0] != "output"
        )

    def shape(self, loc: Loc, cut: Cut, record: str = "forward") -> tuple[int, ...]:
        return tuple(self.slice_tensor(record, loc, cut).shape)

    def slice_tensor(self, record: str, loc: Loc, cut: Cut) -> torch.Tensor:
        tensor = self.tensors[(record, loc)]
        twin = loc if record == "forward" else (BACKWARD_TWINS[loc[0]], loc[1])
        for axis, (start, stop) in zip(self.axes, cut.ranges, strict=True):
            for member, dim in axis.members:
                if member == twin and (start, stop) != (0, axis.size) and tensor.shape[dim] == axis.size:
                    tensor = tensor.narrow(dim, start, stop - start)
        if loc in cut.constant and record == "forward":
            tensor = tensor.flatten()[:1].expand(tensor.shape).clone() if tensor.numel() else tensor
        return tensor

    def size(self, cut: Cut) -> str:
        """The first tensor argument's shape, as `4x8x128`."""
        loc = next((loc for (record, loc) in self.tensors if record == "forward" and loc[0] != "output"), None)
        return "x".join(map(str, self.shape(loc, cut))) if loc is not None else "?"


def _arguments(record: Record, key: str) -> Iterator[tuple[Loc, Json]]:
    """A record's field's top-level values by location (a list's by position, a dict's by key)."""
    value = record.get(key)
    items = enumerate(value) if isinstance(value, list) else value.items() if isinstance(value, dict) else ()
    return (((key, where), item) for where, item in items)


def _locations(record: Record, key: str) -> Iterator[tuple[Loc, Record]]:
    for loc, item in _arguments(record, key):
        if isinstance(item, dict) and item.get("type") in TENSOR_TYPES:
            yield loc, item


def read_call(index: DumpIndex, name: CallName, settings: Settings) -> ReducibleCall:
    """The call's records and dumped tensors, and its axes (none where the [reduce]
    table has no rule for its API). Raises CallSkip where it cannot be reduced."""
    if index.task != "tensor":
        raise CallSkip("a statistics dump's inputs are generated from their statistics: only a tensor dump is reduced")
    records: dict[str, Record] = {}
    for direction in ("forward", "backward") if name.direction == "backward" else ("forward",):
        entry = index.entry(str(name.sibling(direction)))
        if entry is None:
            raise CallSkip(f"the dump has no {direction} record of {name.call}")
        records[direction] = index.read_record(entry)
    tensors: dict[tuple[str, Loc], torch.Tensor] = {}
    values: dict[Loc, Json] = {}
    keys = {"forward": ("input_args", "input_kwargs", "output"), "backward": ("input", "output")}
    for direction, record in records.items():
        for key in keys[direction]:
            for loc, value in _locations(record, key):
                where = f"{name.call} {direction}.{key}[{loc[1]!r}]"
                spec = tensor_spec(value, where)
                if spec.data_name:
                    tensors[(direction, loc)] = load_tensor(index.tensor_dir, spec, where)
    for key in ("input_args", "input_kwargs"):
        values.update(_arguments(records["forward"], key))
    shapes = {loc: tuple(tensor.shape) for (record, loc), tensor in tensors.items() if record == "forward"}
    return ReducibleCall(name, index.framework, records, tensors, call_axes(name.operator, CallShapes(shapes, values)))


def write_candidate(call: ReducibleCall, cut: Cut, folder: Path) -> Path:
    """The candidate as a one-call tensor dump in `folder` (its dump.json path). Its
    outputs are sliced with it where every cut axis maps them; else left out (online,
    the device computes them)."""
    outputs_follow = (
        all(axis.maps_outputs or kept == (0, axis.size) for axis, kept in zip(call.axes, cut.ranges, strict=True))
        and not cut.constant
    )
    tensors: dict[str, torch.Tensor] = {}
    records: dict[str, Record] = {}
    for direction, record in call.records.items():
        written = dict(record)
        for key in ("input_args", "input_kwargs", "input", "output"):
            if key not in record:
                continue
            is_output = (direction, key) in (("forward", "output"), ("backward", "output"))
            written[key] = (
                [] if is_output and not outputs_follow else _entries(call, (direction, key), record[key], cut, tensors)
            )
        records[str(call.name.sibling(direction))] = written
    shutil.rmtree(folder, ignore_errors=True)
    return write_tensor_dump(folder, records, tensors, call.framework)


def _entries(
    call: ReducibleCall, field: tuple[str, str], value: Json, cut: Cut, tensors: dict[str, torch.Tensor]
) -> Json:
    """A record's field (`field`: its record and key) with each tensor's entry of its
    slice, the slice added to `tensors`."""
    direction, key = field

    def entry(where: int | str, item: Json) -> Json:
        loc = (key, where)
        if (direction, loc) not in call.tensors or not isinstance(item, dict):
            return item
        tensor = call.slice_tensor(direction, loc, cut)
        data_name = str(item["data_name"])
        tensors[data_name] = tensor
        return {
            **item,
            **tensor_entry(tensor, data_name, kind=str(item["type"]), requires_grad=bool(item.get("requires_grad"))),
        }

    if isinstance(value, list):
        return [entry(position, item) for position, item in enumerate(value)]
    if isinstance(value, dict):
        return {where: entry(where, item) for where, item in value.items()}
    return value


# --- the search ------------------------------------------------------------------


@dataclass
class Reduction:
    """What a reduction found: the reduced call as a one-call dump, its sizes before
    and after, the verdicts, the accepted steps and why it stopped where it did."""

    call: str
    dump: Path  # the reduced call's dump.json (the original's where nothing was cut)
    before: str  # the first tensor argument's shape, e.g. 4x8x128
    after: str
    elements_before: int
    elements_after: int
    signature: Signature  # the failure the reduced call keeps: the original's (single-run on the device: with its own reasons too)
    original: CallResult
    reduced: CallResult
    kept: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)  # axis -> the [start, stop) kept
    steps: list[str] = dataclasses.field(default_factory=list)
    tries: int = 0
    refused: int = 0  # candidates that passed or failed otherwise
    seconds: float = 0.0
    notes: list[str] = dataclasses.field(default_factory=list)
    offline: bool = False  # the reduced call is judged on its dumped outputs (else on the device)

    @property
    def summary(self) -> str:
        """`4x8x128 -> 1x1x8`, with the elements kept."""
        share = self.elements_after / self.elements_before if self.elements_before else 1.0
        return f"{self.before} -> {self.after} ({self.elements_after} of {self.elements_before} input elements, {share:.2%})"


@dataclass
class Search:
    """One reduction's candidates, judged against the signature they must keep."""

    call: ReducibleCall
    settings: Settings
    plan: Plan
    wanted: Signature
    scratch: Path
    started: float = dataclasses.field(default_factory=time.monotonic)
    tries: int = 0
    refused: int = 0
    steps: list[str] = dataclasses.field(default_factory=list)
    usable: frozenset[int] | None = None  # the axes it may cut (None: every one)
    known: str = ""  # the known defect (judge/defects/table.py) the original matches: a candidate matches it too

    def spent(self) -> bool:
        return self.tries >= self.plan.tries or time.monotonic() - self.started > self.plan.seconds

    def judge_cut(self, cut: Cut) -> CallResult | None:
        """The candidate judged as a dumped call (None: the kernels or the standards refuse its slice)."""
        self.tries += 1
        folder = self.scratch / f"try{self.tries}"
        try:
            return judge_dump(write_candidate(self.call, cut, folder), self.call.name, self.settings)
        except (CallSkip, CallError, DeviceFailed, DumpError, RuntimeError, ValueError, IndexError):
            return None
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def fails_alike(self, cut: Cut) -> bool:
        """The oracle: the candidate fails with the same signature (and known defect)."""
        result = self.judge_cut(cut)
        alike = (
            result is not None and failure_signature(result.verdict) == self.wanted and known_id(result) == self.known
        )
        self.refused += not alike
        return alike


def known_id(result: CallResult) -> str:
    """The known defect a result matches ("": none): a reduction keeps it, so that a
    known defect is never handed over as a new one, nor a new fault as a known one."""
    return result.known.id if result.known is not None else ""


def judge_dump(path: Path, name: CallName, settings: Settings) -> CallResult:
    """A one-call dump judged as the plugin judges its call."""
    return check_call(read_index(path), name, settings)


def _halves(cut: Cut, position: int) -> list[Cut]:
    start, stop = cut.ranges[position]
    middle = start + (stop - start) // 2
    ranges = list(cut.ranges)
    found = []
    for half in ((start, middle), (middle, stop)):
        ranges[position] = half
        found.append(dataclasses.replace(cut, ranges=tuple(ranges)))
    return found


def _halve(search: Search, cut: Cut) -> Cut:
    """Halve each axis (largest first) while a half fails alike, until nothing halves."""
    call = search.call
    progress = True
    while progress and not search.spent():
        progress = False
        usable = range(len(call.axes)) if search.usable is None else search.usable
        order = sorted(usable, key=lambda i: -(cut.ranges[i][1] - cut.ranges[i][0]))
        for position in order:
            start, stop = cut.ranges[position]
            if stop - start < 2 or search.spent():
                continue
            for half in _halves(cut, position):
                if search.spent():
                    break
                if search.fails_alike(half):
                    cut, progress = half, True
                    start, stop = half.ranges[position]
                    _told(search, f"{call.axes[position].name}: kept [{start}, {stop}) -> {call.size(half)}")
                    break
    return cut


def _constant(search: Search, cut: Cut) -> Cut:
    """Each floating input made one repeated value where the failure stays (online only:
    the dumped outputs are of the dumped values)."""
    if search.settings.offline:
        return cut
    for (record, loc), tensor in search.call.tensors.items():
        if search.spent() or record != "forward" or loc[0] == "output" or not tensor.is_floating_point():
            continue
        candidate = dataclasses.replace(cut, constant=cut.constant | {loc})
        if search.fails_alike(candidate):
            cut = candidate
            _told(search, f"{loc[0]}[{loc[1]!r}]: one repeated value")
    return cut


def _on_the_device(search: Search, cut: Cut) -> tuple[Cut, str]:
    """Offline, the axes whose slices have no dumped output (a matmul's inner dim): cut
    where the device here, judged single-run on the reduced call, fails by the same
    standard with every reason of the dump's (single-run may add its own, judged against
    the bench alone), which its candidates then keep; else kept whole. Says which."""
    call, offline, wanted = search.call, search.settings, search.wanted
    whole = [axis.name for axis in call.axes if not axis.maps_outputs]
    search.settings = dataclasses.replace(offline, offline=False)
    result = search.judge_cut(cut)
    online = failure_signature(result.verdict) if result is not None else None
    if (
        result is None
        or online is None
        or (online.status, online.standard) != (wanted.status, wanted.standard)
        or not online.kinds >= wanted.kinds
        or known_id(result) != search.known
    ):
        search.settings, search.refused = offline, search.refused + 1
        return cut, (
            f"kept whole: {', '.join(whole)} (offline its slices have no dumped output, and the device here, "
            "judged single-run, does not fail alike)"
        )
    search.usable, search.wanted = None, online
    label = offline.backend.describe(offline.device_index)
    return _halve(search, cut), (
        f"judged single-run on the device ({label}), not offline: {', '.join(whole)} cut, the outputs computed "
        "by the device (run the folder's dump without --msprobe-offline)"
    )


def _told(search: Search, step: str) -> None:
    search.steps.append(step)
    if search.plan.progress is not None:
        search.plan.progress(f"{search.call.name}: {step}")


def reduce_call(
    index: DumpIndex, name: CallName, settings: Settings, folder: Path, plan: Plan | None = None
) -> Reduction:
    """Reduce a failing call; its reduced form is written as a one-call dump at
    `folder/dump.json`, re-judged there with the full rules. Raises CallSkip where the
    call does not fail (a passing call is never reduced) or cannot be reduced."""
    plan = plan or Plan()
    settings = dataclasses.replace(settings, baseline=None, sample_statuses=frozenset(), repeat=1)
    original = check_call(index, name, settings)
    if original.verdict.status != "error":
        raise CallSkip(f"{name} does not fail ({original.verdict.status}): only a failing call is reduced")
    wanted = failure_signature(original.verdict)
    call = read_call(index, name, settings)
    whole = Cut(tuple((0, axis.size) for axis in call.axes))
    notes = [] if call.axes else [f"no dimension of {name.operator} is cut: the [reduce] table has no rule for it"]
    scratch = Path(tempfile.mkdtemp(prefix="msprobe-reduce-"))
    mapped = frozenset(i for i, axis in enumerate(call.axes) if axis.maps_outputs or not settings.offline)
    search = Search(call, settings, plan, wanted, scratch, usable=mapped, known=known_id(original))
    try:
        cut = _halve(search, whole)
        if len(mapped) < len(call.axes) and not search.spent():
            cut, note = _on_the_device(search, cut)
            notes.append(note)
        cut = _constant(search, cut)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    path = write_candidate(call, cut, folder)
    reduced = judge_dump(path, name, search.settings)
    if (failure_signature(reduced.verdict), known_id(reduced)) != (search.wanted, search.known):  # never another
        notes.append("the reduced call, re-judged, failed otherwise: the whole call is reported")
        cut, path, search.settings, search.wanted = whole, write_candidate(call, whole, folder), settings, wanted
        reduced = judge_dump(path, name, settings)
    if search.spent():
        notes.append(f"stopped at its bound ({plan.tries} tries, {plan.seconds:g} s)")
    return Reduction(
        str(name),
        path,
        call.size(whole),
        call.size(cut),
        call.elements(whole),
        call.elements(cut),
        search.wanted,
        original,
        reduced,
        kept={axis.name: kept for axis, kept in zip(call.axes, cut.ranges, strict=True)},
        steps=search.steps,
        tries=search.tries,
        refused=search.refused,
        seconds=time.monotonic() - search.started,
        notes=notes,
        offline=search.settings.offline,
    )
