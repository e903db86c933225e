"""An operator upgrade judged on two dumps: which calls and kernels got less accurate.

Before an upgrade of CANN or torch_npu the user dumps one training step (dump A) and
records its baseline; after it, the same step again (dump B: same model, seed and
data). Both dumps hold the device's own outputs, so each call of B is judged offline
against its own bench; its inputs moved wherever an upstream kernel now rounds
otherwise, so B's calls cannot be found in A's baseline by content (judge/gate/baseline.py
matches the same dump replayed, by SHA-256). They are found as msprobe's `compare`
pairs two dumps:

- each API's calls in one direction by signature (API, direction, dtypes, shapes,
  non-tensor arguments: dump/filters.py's signature, a backward's its forward's) in dump
  order: where both dumps have the same sequence, by name; where a call was inserted or
  removed (every later call's index shifted), along the longest common subsequence of
  the signatures, so that the later calls pair with the calls they were;
- what is left is new (in B only) or vanished (in A only). Where fewer than
  SAME_MODEL_SHARE of B's calls pair, the dumps are of different models: nothing is
  compared, and the run says so.

A paired call is a regression where its verdict got worse (pass -> warning -> error),
or where its key metric against its own bench (KEY_METRIC: the benchmark standard's
mean relative error, the ULP standard's mean ULP error) grew by more than two correct
runs of one kernel differ by: CALL_LIMIT, derived from correct dump pairs written
under other ATen kernel paths and thread counts (studies/upgrade_spread.py,
studies/upgrade-gate-limits.md). A kernel (an API in one dtype and direction) pools
its paired calls: a regression where one of them is, or where the geometric mean of
their growths exceeds KERNEL_LIMIT (the same measurement, pooled). Improvements (a
better verdict, or a metric shrunk by as much) and unchanged calls are counted too.

Everything here is a pure function of the two dumps' records and verdicts, never of
which calls ran where: the gate's verdicts are the same under -n, -k and shards.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import hashlib
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pytest_msprobe.dump.filters import signature
from pytest_msprobe.dump.index import parse_call_name
from pytest_msprobe.errors import CallError, DumpError
from pytest_msprobe.judge.gate.baseline import KERNEL_STANDARD, Baseline, CallMetrics, compare
from pytest_msprobe.standards.verdict import STATUS_ORDER

if TYPE_CHECKING:
    from pytest_msprobe.dump.index import DumpIndex
    from pytest_msprobe.standards.verdict import Status

#: a dump's calls: name -> (position in the dump, signature digest)
Signatures = dict[str, tuple[int, str]]

#: the metric a paired call's growth is measured by, per standard; the other standards'
#: metrics are shares of elements beyond a tolerance, 0 for a correct kernel, whose
#: growth the verdict already says (any share over 0 is an error)
KEY_METRIC = {"benchmark": "mean_rel_err", "ulp": "mean_ulp_err"}
#: no metric is compared below this many ULPs of its dtype (a relative error below it
#: times 2**-mantissa): half the mean error of a result correctly rounded to D (0.25
#: ULP), so that an exact result (0) is no infinite growth, while every correctly
#: rounded output stays above it and its growth is measured
FLOOR_ULPS = 0.125
MANTISSA = {"float16": 10, "bfloat16": 7, "float32": 23, "float64": 52}
#: the growth of one call's key metric beyond which it regressed, by its dtype: twice
#: the largest growth of any call of a correct pair measured, rounded up to a power of
#: two (studies/upgrade-gate-limits.md: float32 4.04x, AVX512 against AVX2 gelu; float16
#: 1.99x and bfloat16 1.55x, layer_norm backward across thread counts). The doubling is
#: room for kernel families this machine cannot run (an NPU's), as the standards' own
#: ratio bands give a device twice its reference's error
CALL_LIMIT = {"float32": 16.0, "float16": 4.0, "bfloat16": 4.0}
#: a kernel's pooled growth (geometric mean over its paired calls) beyond which it
#: regressed, derived as CALL_LIMIT from the kernels of the same pairs (float32 3.75x,
#: float16 1.34x, bfloat16 1.30x)
KERNEL_LIMIT = {"float32": 8.0, "float16": 4.0, "bfloat16": 4.0}
DEFAULT_DTYPE = "float32"  # a dtype with no limit of its own (float64) is judged as float32
#: the share of B's calls that must pair for two dumps to be of one model: an upgrade
#: changes kernels, not the model, and the calls it adds or removes (a fusion split or
#: joined) are a few; a dump of another model pairs by chance at most
SAME_MODEL_SHARE = 0.5
#: what a comparison found, worst first (the order of the regression sections)
KINDS = ("regression", "improvement", "unchanged", "not compared")


def call_signatures(index: DumpIndex) -> Signatures:
    """Each call's position in the dump and a digest of its signature (API, direction,
    and its forward's arguments without their values; a backward without a forward record
    its own gradients' shapes and dtypes)."""
    found = {}
    for position, name in enumerate(index.names):
        parsed = parse_call_name(name)
        if parsed is None:
            continue
        forward = index.entry(str(parsed.sibling("forward")))
        try:
            record = index.read_record(forward if forward is not None else index.entry_of(name))
        except CallError:  # a record that does not parse: no signature, the call is new (its own test says why)
            continue
        text = signature(record) if forward is not None else signature([record.get("input"), record.get("output")])
        key = f"{parsed.api_type}.{parsed.api_name}.{parsed.direction}|{text}"
        found[name] = (position, hashlib.sha256(key.encode()).hexdigest()[:16])
    return found


@dataclass(frozen=True)
class Pairing:
    """B's calls paired with A's: B's call name -> A's."""

    pairs: dict[str, str]
    new: tuple[str, ...]
    vanished: tuple[str, ...]
    by_signature: int  # pairs found by signature in order (their names differ)

    @property
    def same_model(self) -> bool:
        total = len(self.pairs) + len(self.new)
        return total > 0 and len(self.pairs) >= SAME_MODEL_SHARE * total

    def line(self, dump: str, recorded: str) -> str:
        """What the summary says of this pairing."""
        if not self.same_model:
            return (
                f"{dump} and the baseline's {recorded} are dumps of different models: "
                f"{len(self.pairs)} of {len(self.pairs) + len(self.new)} calls pair by signature "
                f"(at least {SAME_MODEL_SHARE:.0%} for one model): nothing was compared"
            )
        shifted = f" ({self.by_signature} of them by signature: their names shifted)" if self.by_signature else ""
        return (
            f"{dump} paired with the baseline's {recorded}: {len(self.pairs)} calls by name and signature{shifted}, "
            f"{len(self.new)} new, {len(self.vanished)} vanished"
        )


def pair_calls(recorded: Mapping[str, tuple[int, str]], current: Mapping[str, tuple[int, str]]) -> Pairing:
    """Each API's calls (one direction) of B aligned with A's by signature in dump
    order: where the two sequences agree the calls pair by name (the same index); where a
    call was inserted or removed the alignment (the longest common subsequence of their
    signatures) skips it and pairs the later calls, whose names shifted. Calls of one
    signature left over pair in order."""
    ours, theirs = _by_api(current), _by_api(recorded)
    pairs: dict[str, str] = {}
    for api, sequence in ours.items():
        pairs.update(_align_names(theirs.get(api, []), sequence))
    waiting: dict[str, list[str]] = defaultdict(list)
    taken = set(pairs.values())
    for name, (_, digest) in sorted(recorded.items(), key=lambda item: item[1][0]):
        if name not in taken:
            waiting[digest].append(name)
    for name, (_, digest) in sorted(current.items(), key=lambda item: item[1][0]):
        if name not in pairs and waiting[digest]:
            pairs[name] = waiting[digest].pop(0)
    paired = set(pairs.values())
    new = tuple(name for name in current if name not in pairs)
    vanished = tuple(name for name in recorded if name not in paired)
    return Pairing(pairs, new, vanished, sum(ours != theirs for ours, theirs in pairs.items()))


def _by_api(calls: Mapping[str, tuple[int, str]]) -> dict[str, list[tuple[str, str]]]:
    """(name, signature) of each API's calls in one direction, in dump order."""
    found: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for name, (_, digest) in sorted(calls.items(), key=lambda item: item[1][0]):
        api, _, direction = name.rsplit(".", 2) if name.count(".") >= 2 else (name, "", "")
        found[f"{api}.{direction}"].append((name, digest))
    return found


def _align_names(recorded: list[tuple[str, str]], current: list[tuple[str, str]]) -> dict[str, str]:
    """current name -> recorded name along the longest common subsequence of signatures
    (difflib's; the sequences alike, as they mostly are, pair at once)."""
    if [digest for _, digest in recorded] == [digest for _, digest in current]:
        return {ours: theirs for (ours, _), (theirs, _) in zip(current, recorded, strict=True)}
    matcher = difflib.SequenceMatcher(None, [d for _, d in recorded], [d for _, d in current], autojunk=False)
    return {current[j + k][0]: recorded[i + k][0] for i, j, size in matcher.get_matching_blocks() for k in range(size)}


def best_pairing(
    recorded: Mapping[str, Mapping[str, tuple[int, str]]], current: Mapping[str, tuple[int, str]]
) -> tuple[str, Pairing] | None:
    """The recorded dump B's calls pair best with (most pairs; the first key on a tie)."""
    pairings = [(key, pair_calls(calls, current)) for key, calls in sorted(recorded.items())]
    return max(pairings, key=lambda item: len(item[1].pairs), default=None)


@dataclass(frozen=True)
class Change:
    """A paired call (or a kernel) of B against its record in A."""

    kind: str  # KINDS
    name: str  # B's call (or kernel)
    recorded_as: str  # A's
    was: Status  # A's status
    now: Status  # B's status
    metric: str = ""  # the key metric compared ("" where none was)
    before: float | None = None
    after: float | None = None
    growth: float | None = None  # after / before, both floored
    limit: float | None = None
    dump: str = ""  # B's dump, where a run has several
    dtype: str = ""  # B's outputs' device dtype: the kernel a call belongs to

    def severity(self) -> tuple[int, float]:
        """Worst first: the most verdict ranks lost, then the largest growth."""
        return (STATUS_ORDER.get(self.now, 1) - STATUS_ORDER.get(self.was, 1), self.growth or 0.0)

    def describe(self) -> str:
        """Before and after, for the failing test and the summary."""
        named = "" if self.recorded_as == self.name else f" (the baseline's {self.recorded_as})"
        growth = self.growth_text()
        return f"{self.name}{named}: {self.was} -> {self.now}" + (f", {growth}" if growth else "")

    def growth_text(self) -> str:
        """The key metric before and after ("" where none was compared)."""
        if not self.metric or self.growth is None:
            return ""
        if self.limit is None:  # the same dump, judged against its record (judge/gate/baseline.py compare)
            return f"{self.metric} {self.growth:.3g}x the baseline"
        return (
            f"{self.metric} {_number(self.before)} -> {_number(self.after)} ({self.growth:.3g}x, limit {self.limit:g}x)"
        )


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _floor(metric: str, dtype: str) -> float:
    """FLOOR_ULPS in the metric's unit: ULPs, or relative (ULPs x 2**-mantissa)."""
    return FLOOR_ULPS * (1.0 if metric == "mean_ulp_err" else 2.0 ** -MANTISSA.get(dtype, MANTISSA[DEFAULT_DTYPE]))


def growth(now: CallMetrics, was: CallMetrics, dtype: str) -> tuple[str, float, float, float] | None:
    """The key metric's largest growth over the outputs both have: (output and metric,
    before, after, after / before with both floored), None where no key metric applies."""
    metric = KEY_METRIC.get(now.standard)
    if metric is None or was.standard != now.standard:
        return None
    floor = _floor(metric, dtype)
    found = []
    for path, metrics in sorted(now.outputs.items()):
        before = was.outputs.get(path, {}).get(metric)
        after = metrics.get(metric)
        if before is None or after is None or not (math.isfinite(before) and math.isfinite(after)):
            continue
        found.append((f"{path} {metric}" if path else metric, before, after, max(after, floor) / max(before, floor)))
    return max(found, key=lambda item: item[3], default=None)


def call_change(now: CallMetrics, was: CallMetrics, name: str, recorded_as: str, dtype: str) -> Change:
    """A paired call's change: a regression where its verdict got worse or its key
    metric grew beyond CALL_LIMIT; an improvement where the verdict got better or the
    metric shrank by as much; else unchanged; not compared where either side skipped."""
    if "skip" in (now.status, was.status):
        return Change("not compared", name, recorded_as, was.status, now.status, dtype=dtype)
    limit = CALL_LIMIT.get(dtype, CALL_LIMIT[DEFAULT_DTYPE])
    grown = growth(now, was, dtype)
    metric, before, after, ratio = grown if grown is not None else ("", None, None, None)
    rank = STATUS_ORDER.get(now.status, 1) - STATUS_ORDER.get(was.status, 1)
    if rank > 0 or (ratio is not None and ratio > limit):
        kind = "regression"
    elif rank < 0 or (ratio is not None and ratio < 1 / limit):
        kind = "improvement"
    else:
        kind = "unchanged"
    return Change(
        kind,
        name,
        recorded_as,
        was.status,
        now.status,
        metric,
        before,
        after,
        ratio,
        limit if metric else None,
        dtype=dtype,
    )


@dataclass
class KernelChanges:
    """The paired calls of one kernel (API, dtype, direction), pooled."""

    name: str
    dtype: str
    calls: list[Change] = field(default_factory=list)

    def change(self) -> Change:
        """A regression where a call is, or where the geometric mean of the calls'
        growths exceeds KERNEL_LIMIT; its statuses are the worst of its calls'. A call
        exact on either side (a metric of 0) is judged alone: a mean of logs has no room
        for it."""
        worst_was = max((c.was for c in self.calls), key=lambda status: STATUS_ORDER.get(status, 1))
        worst_now = max((c.now for c in self.calls), key=lambda status: STATUS_ORDER.get(status, 1))
        measured = [c for c in self.calls if c.growth is not None and c.before and c.after]
        pooled, before, after = (
            _geometric_mean([getattr(c, key) for c in measured]) for key in ("growth", "before", "after")
        )
        limit = KERNEL_LIMIT.get(self.dtype, KERNEL_LIMIT[DEFAULT_DTYPE])
        kinds = {c.kind for c in self.calls}
        if "regression" in kinds or (pooled is not None and pooled > limit):
            kind = "regression"
        elif (pooled is not None and pooled < 1 / limit) or kinds == {"improvement"}:
            kind = "improvement"
        else:
            kind = "unchanged"
        metric = f"{measured[0].metric.split(' ')[-1]} (geometric mean of {len(measured)} calls)" if measured else ""
        return Change(
            kind, self.name, self.name, worst_was, worst_now, metric, before, after, pooled, limit if measured else None
        )


def _geometric_mean(values: list[float]) -> float | None:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def kernel_name(call: str, dtype: str) -> str | None:
    """`Functional.gelu.float32.kernel.forward` for `Functional.gelu.3.forward` (the name
    of judge/gate/kernel_verdicts.py's kernels)."""
    parsed = parse_call_name(call)
    if parsed is None:
        return None
    return f"{parsed.api_type}.{parsed.api_name}.{dtype}.kernel.{parsed.direction}"


def kernel_changes(changes: Iterable[Change]) -> list[Change]:
    """Each kernel's pooled change, from its compared calls' (of one dump)."""
    kernels: dict[str, KernelChanges] = {}
    for change in changes:
        dtype = change.dtype
        name = kernel_name(change.name, dtype)
        if name is None or change.kind == "not compared":
            continue
        kernels.setdefault(name, KernelChanges(name, dtype)).calls.append(change)
    return [dataclasses.replace(kernels[name].change(), dump=kernels[name].calls[0].dump) for name in sorted(kernels)]


def worst_first(changes: Iterable[Change]) -> list[Change]:
    """Regressions, worst first, then by name (a stable order for any run)."""
    return sorted(
        (c for c in changes if c.kind == "regression"), key=lambda c: (-c.severity()[0], -c.severity()[1], c.name)
    )


# --- a run against a baseline: which record each call of this run is paired with ---------


def sign_calls(
    calls: Mapping[tuple[str | None, str], CallMetrics], signatures: Mapping[str, Signatures]
) -> dict[tuple[str | None, str], CallMetrics]:
    """The calls' metrics with their signature and position in their dump (`signatures`:
    dump key -> its calls'), what a later run pairs them by."""
    found = {}
    for (dump, call), metrics in calls.items():
        known = signatures.get(dump or "", {}).get(call)
        found[(dump, call)] = (
            metrics if known is None else dataclasses.replace(metrics, order=known[0], signature=known[1])
        )
    return found


def recorded_signatures(baseline: Baseline) -> dict[str, Signatures]:
    """The signed calls of each dump the baseline recorded."""
    found: dict[str, Signatures] = defaultdict(dict)
    for (dump, call), metrics in baseline.calls.items():
        if dump is not None and metrics.signature and metrics.standard != KERNEL_STANDARD:
            found[dump][call] = (metrics.order, metrics.signature)
    return dict(found)


class Counterparts:
    """Each dump of this run against the baseline, computed once per dump and process:
    a dump the baseline holds by content (judge/gate/baseline.py's aliases: the same dump
    replayed) is compared call by call by name, as ever; any other is paired by
    signature with the recorded dump it pairs best with. Every process computes the same
    pairing from the same two dumps, whichever calls it runs."""

    def __init__(self, baseline: Baseline) -> None:
        self.baseline = baseline
        self.signatures = recorded_signatures(baseline)
        self.pairings: dict[str, tuple[str, Pairing] | None] = {}

    def pairing(self, dump: str, index: Callable[[], DumpIndex]) -> tuple[str, Pairing] | None:
        """(the recorded dump, the pairing) of a dump not held by content; None for one
        that is, or where the baseline recorded no signatures (an older baseline)."""
        if dump not in self.pairings:
            self.pairings[dump] = None
            if dump not in self.baseline.aliases and self.signatures:
                with contextlib.suppress(DumpError):  # a dump that cannot be read: its one test says why; nothing pairs
                    self.pairings[dump] = best_pairing(self.signatures, call_signatures(index()))
        return self.pairings[dump]

    def change(self, dump: str, index: Callable[[], DumpIndex], call: str, now: CallMetrics) -> Change | None:
        """The call's change against its record; None for a call with none (new), or of
        a dump of another model."""
        found = self.pairing(dump, index)
        if found is None:
            recorded = self.baseline.get(dump, call)
            if recorded is None:
                return None
            same = compare(now, recorded, call)  # the same dump: judged against the record itself
            return Change(same.kind, call, call, recorded.status, same.now, same.metric, None, None, same.ratio)
        recorded_dump, pairing = found
        recorded_call = pairing.pairs.get(call)
        if not pairing.same_model or recorded_call is None:
            return None
        return call_change(now, self.baseline.calls[(recorded_dump, recorded_call)], call, recorded_call, now.dtype)


@dataclass
class RunComparison:
    """A run against its baseline: every call's change, worst first where it matters."""

    calls: list[Change] = field(default_factory=list)
    kernels: list[Change] = field(default_factory=list)  # of the dumps paired by signature
    new: list[str] = field(default_factory=list)
    vanished: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # how each dump paired
    paired: list[str] = field(default_factory=list)  # the dumps paired by signature (not held by content)
    # dump -> why none of its calls that ran was compared: a gate that compared nothing
    # cannot pass (the baseline of other dumps, of another model)
    uncompared: dict[str, str] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        counted = {kind: sum(c.kind == kind for c in self.calls) for kind in KINDS}
        return {**counted, "new": len(self.new), "vanished": len(self.vanished)}

    def regressions(self) -> list[Change]:
        """Calls' and kernels' regressions, worst first."""
        return worst_first([*self.calls, *self.kernels])


def compare_run(
    counterparts: Counterparts,
    calls: Mapping[tuple[str, str], CallMetrics],
    indexes: Mapping[str, Callable[[], DumpIndex]],
) -> RunComparison:
    """Each call that ran (`calls`: (dump key, call) -> its metrics) against its record,
    each kernel of the dumps paired by signature pooled, and what vanished (`indexes`:
    dump key -> its index, read only where needed)."""
    found = RunComparison()
    by_dump: dict[str, list[tuple[str, CallMetrics]]] = defaultdict(list)
    for (dump, call), metrics in sorted(calls.items()):
        by_dump[dump].append((call, metrics))
    for dump in sorted(indexes):
        changes = []
        for call, metrics in by_dump[dump]:
            change = counterparts.change(dump, indexes[dump], call, metrics)
            if change is None:
                found.new.append(f"{dump}::{call}")
            else:
                changes.append(dataclasses.replace(change, dump=dump))
        found.calls += changes
        ran = len(by_dump[dump])
        compared = any(change.kind != "not compared" for change in changes)
        pairing = counterparts.pairing(dump, indexes[dump])
        if pairing is None:
            found.vanished += _find_vanished(counterparts.baseline, dump, indexes[dump])
            if ran and not compared:
                found.uncompared[dump] = _explain_unrecorded(counterparts.baseline, dump, ran, bool(changes))
            continue
        recorded_dump, paired = pairing
        found.paired.append(dump)
        if paired.same_model:
            found.notes.append(paired.line(dump, recorded_dump))
            found.vanished += [f"{recorded_dump}::{call}" for call in paired.vanished]
            found.kernels += kernel_changes(changes)
            if ran and not compared:
                found.uncompared[dump] = f"every paired call of {dump} was skipped before or now: nothing was compared"
        elif ran:
            found.uncompared[dump] = paired.line(dump, recorded_dump)
        else:
            found.notes.append(paired.line(dump, recorded_dump))
    return found


def _explain_unrecorded(baseline: Baseline, dump: str, ran: int, skipped: bool) -> str:
    """Why no call of a dump the baseline holds by content, or cannot pair (an older
    baseline, with no signatures), was compared."""
    if skipped:
        return f"every recorded call of {dump} that ran was skipped before or now: nothing was compared"
    held = (
        ""
        if dump in baseline.aliases
        else " (the baseline records no signatures to pair another dump's calls by: re-record it)"
    )
    return f"the baseline has a record of none of the {ran} calls that ran from {dump}{held}: nothing was compared"


def _find_vanished(baseline: Baseline, dump: str, index: Callable[[], DumpIndex]) -> list[str]:
    """The calls the baseline holds of a dump it holds by content that the dump lacks."""
    recorded = {
        call
        for (key, call), metrics in baseline.calls.items()
        if key == baseline.recorded_key(dump) and metrics.standard != KERNEL_STANDARD
    }
    try:
        present = set(index().names)
    except DumpError:  # a dump that cannot be read: its one test says why
        return []
    return sorted(f"{dump}::{call}" for call in recorded - present)


def merged_changes(runs: Iterable[Iterable[Change]]) -> tuple[list[Change], list[Change]]:
    """Several runs' (shards') compared calls joined, a call found in several taking the
    last run's, and each dump's kernels pooled again from the joined calls: what one run
    of every call would have found (msprobe-merge)."""
    calls: dict[tuple[str, str], Change] = {}
    for run in runs:
        calls.update(
            {(change.dump, change.name): change for change in run if kernel_name(change.name, change.dtype) is not None}
        )
    joined = [calls[key] for key in sorted(calls)]
    kernels = [
        kernel
        for dump in sorted({dump for dump, _ in calls})
        for kernel in kernel_changes(c for c in joined if c.dump == dump)
    ]
    return joined, kernels
