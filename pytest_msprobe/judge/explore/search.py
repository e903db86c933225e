"""--msprobe-explore: search the inputs around a dumped call for one its kernel gets
wrong, with hypothesis, and shrink what it finds to a minimal input.

Each example is a variant of the dumped call (judge/explore/neighbourhood.py), replayed and judged
exactly as the dumped call is (judge/check/call.py: same sides, same standards, same
re-judgements). An example fails when its verdict is an error (a warning too under
--msprobe-strict) or the device raises where the bench does not; an input the bench
itself rejects is discarded, never reported. The search is deterministic: seeded from
the call's name, so reruns and every -n agree; its example database (under
--msprobe-out) replays a failure first on the next run, as `--lf` expects. A failure is
written as a one-call tensor dump: the test's message names it, and it is what
--msprobe-save-failed saves and --msprobe-scripts turns into a script.

What excuses or names an example lives beside it: the rounding a correct kernel's error
may reach on such inputs (judge/explore/rounding_excuses.py), the overflows no correct kernel avoids
(judge/explore/overflow_excuses.py, over the backwards' intermediates of judge/defects/intermediates.py), and the
known defects a failure's message names (judge/defects/table.py).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import math
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from hypothesis import HealthCheck, Phase, Verbosity, example, given, reject
from hypothesis import settings as hypothesis_settings
from hypothesis.database import DirectoryBasedExampleDatabase
from hypothesis.errors import FlakyFailure, Unsatisfiable

from pytest_msprobe.dump.index import CallName, DumpIndex
from pytest_msprobe.dump.tensor_dump import write_tensor_dump
from pytest_msprobe.dump.values import DecodeContext
from pytest_msprobe.errors import CallError, CallSkip
from pytest_msprobe.judge.check.call import CallResult, Resolved, Settings, read_inputs, replay_inputs, resolve_call
from pytest_msprobe.judge.defects.table import known_defect
from pytest_msprobe.judge.explore.neighbourhood import Neighbourhood, Variant
from pytest_msprobe.judge.explore.overflow_excuses import beyond_range
from pytest_msprobe.judge.explore.rounding_excuses import excused_by_rounding
from pytest_msprobe.judge.findings.finding import Finding
from pytest_msprobe.judge.verdict.judgement import Judgement, judge_and_rejudge
from pytest_msprobe.judge.verdict.record import EXPLORED_SUFFIX
from pytest_msprobe.private_apis import key_database, no_local_constants, seed_search
from pytest_msprobe.run.apis import fixed_shape_apis, paired_apis
from pytest_msprobe.run.replay import DeviceFailed, decode_inputs

if TYPE_CHECKING:
    from pytest_msprobe.dump.index import Record
    from pytest_msprobe.standards import Registry


VALUES_SHOWN = 8  # a tensor of at most this many elements is shown whole


@dataclass(frozen=True)
class Plan:
    """How one call is explored."""

    examples: int  # at most this many valid examples (hypothesis's max_examples)
    folder: Path  # failing examples are written under it as one-call dumps
    database: Path | None  # hypothesis's example database; None: none
    strict: bool = False  # a warning fails an example too


@dataclass
class _Search:
    """What the search saw besides its failure."""

    judged: int = 0
    discarded: Counter[str] = dataclasses.field(default_factory=Counter)  # by cause
    excused: Counter[str] = dataclasses.field(
        default_factory=Counter
    )  # judged examples that passed once excused, by cause
    first_discard: str = ""
    first: tuple[Variant, CallResult] | None = None  # the first judged example: the dumped call's inputs
    warning: tuple[Variant, CallResult] | None = None  # the first example judged warning


# Why an example is discarded where no overflow excuses it: the kernels refused its input.
REJECTED = "input rejected by the kernels"


class Beyond(CallSkip):
    """An example excused by an overflow no correct kernel avoids (EXCUSES)."""

    def __init__(self, cause: str) -> None:
        super().__init__(f"{cause}: an overflow no correct kernel of the API avoids, the input's fault")
        self.cause = cause


class ExampleFailed(Exception):
    """An example failed: hypothesis shrinks it and raises the minimal one's."""

    def __init__(self, variant: Variant, result: CallResult | None, device_error: DeviceFailed | None = None) -> None:
        super().__init__(repr(variant))
        self.variant, self.result, self.device_error = variant, result, device_error


def explore_call(index: DumpIndex, name: CallName, settings: Settings, plan: Plan) -> CallResult:
    """The exploration's result, as judge_call reads a dumped call's. Raises CallSkip
    where the dumped call cannot be explored, replay.DeviceFailed where the device
    raised on an example (its message shows the minimal one)."""
    exploration = _Exploration.of(index, name, settings, plan)
    search = exploration.search
    test = _hypothesis_test(exploration)
    try:
        with no_local_constants():
            test()
    except ExampleFailed as failure:
        return _add_counts(_report_failure(failure, index, name, plan), search)
    except FlakyFailure as flaky:
        return _add_counts(_flaky(flaky, index, name, plan), search)
    except Unsatisfiable:
        raise CallSkip(
            f"no valid input found around the call: every example it was given was discarded "
            f"({_by_cause(search.discarded)}), e.g. {search.first_discard}"
        ) from None
    return _add_counts(_conclude_passing(search), search)


@dataclass(frozen=True)
class _Exploration:
    """One call's search: the call resolved, its dumped backward record (None: a forward
    call), the neighbourhood its examples are drawn from, the settings they are judged
    by (without_bias_tests) and what the search saw so far."""

    index: DumpIndex
    call: Resolved
    settings: Settings
    plan: Plan
    backward: Record | None
    space: Neighbourhood
    search: _Search = dataclasses.field(default_factory=_Search)

    @classmethod
    def of(cls, index: DumpIndex, name: CallName, settings: Settings, plan: Plan) -> _Exploration:
        call = resolve_call(index, name, settings)
        dumped = read_inputs(index, name, settings.max_elements)
        forward = index.read_record(index.entry_of(str(name.sibling("forward"))))
        backward = index.read_record(index.entry_of(str(name))) if name.direction == "backward" else None
        space = Neighbourhood(
            forward,
            backward,
            dumped.leaves,
            settings.max_elements,
            resizable=name.operator not in fixed_shape_apis(),
            smallest_size=call.framework.smallest_size,
        )
        settings = dataclasses.replace(settings, registry=without_bias_tests(settings.registry, name.operator))
        return cls(index, call, settings, plan, backward, space)

    @property
    def label(self) -> str:
        return f"{self.call.name}{EXPLORED_SUFFIX}"

    def example_result(self, variant: Variant) -> CallResult:
        """The example judged as the dumped call is; raises Beyond where an overflow no
        correct kernel avoids excuses it."""
        index, name, settings = self.index, self.call.name, self.settings
        ctx = DecodeContext(
            index.tensor_dir, "tensor", name.call, settings.max_elements, provided=variant.provided_tensors()
        )
        inputs = decode_inputs(variant.forward, None if self.backward is None else variant.backward or {}, ctx)
        replayed = replay_inputs(self.call, inputs, settings)
        judgement = judge_and_rejudge(
            Judgement(settings.registry, name, replayed.results, replayed.bench, index.framework)
        )
        if judgement.error:
            cause = beyond_range(name, replayed, index.framework)
            if cause is not None:
                raise Beyond(cause)
            judgement, excused = excused_by_rounding(judgement)
            if excused is not None:
                self.search.excused[excused] += 1
        verdict = judgement.require_verdict()
        known = known_defect(judgement, settings.backend.name) if judgement.error else None
        return CallResult(self.label, verdict, replayed.label, describe(variant), known=known)

    def probe(self, variant: Variant) -> None:
        """hypothesis's test: an example fails (ExampleFailed) or is counted; one the
        kernels refuse is discarded (hypothesis's reject)."""
        search = self.search
        try:
            result = self.example_result(variant)
        except (CallSkip, CallError) as exc:
            search.discarded[exc.cause if isinstance(exc, Beyond) else REJECTED] += 1
            search.first_discard = search.first_discard or str(exc)
            reject()
        except DeviceFailed as exc:
            raise ExampleFailed(variant, None, exc) from exc
        search.judged += 1
        status = result.verdict.status
        search.first = search.first or (variant, result)
        if status == "error" or (status == "warning" and self.plan.strict):
            raise ExampleFailed(variant, result)
        if status == "warning" and search.warning is None:
            search.warning = (variant, result)


def _conclude_passing(search: _Search) -> CallResult:
    """The search's result where no example failed: its first warning, else the dumped
    call's inputs judged (none failed); a CallSkip where no example was valid."""
    if search.first is None:
        raise CallSkip(
            f"no valid input found around the call ({_by_cause(search.discarded)} discarded), e.g. {search.first_discard}"
        )
    if search.warning is not None:
        _, result = search.warning
        return dataclasses.replace(result, notes=["the first warning is shown"])
    _, first = search.first
    return dataclasses.replace(first, origins=[], notes=["none failed"])


def _by_cause(counts: Counter[str]) -> str:
    return "; ".join(f"{cause}: {count}" for cause, count in sorted(counts.items())) or "none"


def _add_counts(result: CallResult, search: _Search) -> CallResult:
    """The result with the search's counts: a note first in its message, and the
    columns of its first output in the metrics file (a finding that fails nothing)."""
    excused = sum(search.excused.values())
    count = (
        f"{search.judged} examples around the call judged, {sum(search.discarded.values())} discarded "
        f"({_by_cause(search.discarded)}), {excused} passed once excused ({_by_cause(search.excused)})"
    )
    leaves = result.verdict.outputs or (result.verdict,)
    columns = {
        "explore_judged": search.judged,
        "explore_discarded": dict(search.discarded),
        "explore_excused": dict(search.excused),
    }
    counts = Finding(
        "explored", leaves[0].path, False, "the examples by cause are in the metrics file's explore_* columns", columns
    )
    return dataclasses.replace(result, notes=[count, *result.notes], findings=[*result.findings, counts])


def _hypothesis_test(exploration: _Exploration) -> Callable[[], None]:
    """The search as a hypothesis test: seeded from the call, quiet, no deadline (a call's
    cost is its own), its database keyed by the dump and the call; the small angles
    (_small_angles), then the edges (judge/explore/neighbourhood.py EDGES) as its explicit
    examples, tried first."""
    plan, space, label = exploration.plan, exploration.space, exploration.label
    first = _small_angles(exploration.call.name, space)
    database = DirectoryBasedExampleDatabase(plan.database) if plan.database is not None else None
    # The edges are part of the budget, and never all of it: N = 1 judges the dumped call alone.
    edges = [*first, *space.edge_variants()][: max(plan.examples - 1, 0)]
    chosen = hypothesis_settings(
        max_examples=max(plan.examples - len(edges), 1),
        deadline=None,
        database=database,
        derandomize=False,
        suppress_health_check=list(HealthCheck),
        report_multiple_bugs=False,
        verbosity=Verbosity.quiet,
        phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink),
        print_blob=False,
    )

    def probe(variant: Variant) -> None:  # a function: hypothesis sets its seed and digest on it
        exploration.probe(variant)

    # hypothesis.seed() would also switch the database off (its deterministic modes do):
    # the seed is set where seed() sets it, the database kept, so a failure found once
    # is replayed first the next time.
    seed_search(probe, int.from_bytes(hashlib.sha256(label.encode()).digest()[:8], "big"))
    test = given(space.variants())(probe)
    for variant in reversed(edges):  # run in this order, before any generated example
        test = example(variant)(test)
    test = chosen(test)
    key_database(test, f"{exploration.index.key}::{label}".encode())
    return test


def _small_angles(name: CallName, space: Neighbourhood) -> list[Variant]:
    """The 'small angles' edge (Neighbourhood.near_variants) for the APIs defined by the
    angle or difference of two arguments ([explore] angles): 1 - cos(x1, x2) cancels only
    where x2 nears x1, which no draw of two independent moves reaches."""
    return space.near_variants() if name.operator in paired_apis() else []


def _report_failure(failure: ExampleFailed, index: DumpIndex, name: CallName, plan: Plan) -> CallResult:
    path = write_example(failure.variant, index, name, plan.folder)
    reproduce = (
        f"reproduce: pytest --msprobe-dump={path} --msprobe-explore=1 -m explore  (the minimal failing example as a "
        "one-call dump, judged as exploration judges it: with its errors within the inputs' rounding excused)"
    )
    if failure.result is None:
        assert failure.device_error is not None
        lines = "\n".join(
            [
                f"inputs {_how_minimal(failure.variant)}:",
                *(f"  {line}" for line in describe(failure.variant)),
                f"  {reproduce}",
            ]
        )
        raise _device_failure(failure.device_error, lines) from None
    return dataclasses.replace(failure.result, notes=[*failure.result.notes, _how_minimal(failure.variant), reproduce])


def _how_minimal(variant: Variant) -> str:
    if variant.explicit:
        return "(an edge tried first: the dumped call with one input moved to an extreme, as minimal as an example at that edge gets)"
    return "(inputs shrunk by hypothesis to a minimal failing example)"


def _device_failure(error: DeviceFailed, lines: str) -> DeviceFailed:
    failed = DeviceFailed(error.cause)
    failed.args = (f"{failed.args[0]} on an explored input\n{lines}",)
    return failed


def _flaky(flaky: FlakyFailure, index: DumpIndex, name: CallName, plan: Plan) -> CallResult:
    """An example failed once and passed when replayed: the kernel is not deterministic."""
    failures = [error for error in flaky.exceptions if isinstance(error, ExampleFailed)]
    if not failures or failures[0].result is None:
        raise CallError(f"an explored example failed once and passed when replayed: {flaky}") from flaky
    result = _report_failure(failures[0], index, name, plan)
    return dataclasses.replace(
        result,
        notes=[
            "the example failed once and PASSED when replayed on the same input: the device is not deterministic (see --msprobe-repeat)",
            *result.notes,
        ],
    )


# The dtypes whose rounding-bias tests exploration leaves out (standards/bias.py).
BIAS_TESTED = ("float16", "bfloat16", "float32", "float64")


def without_bias_tests(registry: Registry, api: str) -> Registry:
    """The registry with `api`'s rounding-bias sign tests off (their z limit infinite).

    Those tests count element errors as independent. Explored inputs make them
    dependent: a common offset turns every row of a product into one repeated sum, whose
    correct rounding error then repeats row after row (measured: linear's weight
    gradient on x + 2**24, the CPU's own kernel, bias_ulp +0.26 at z 7.8). A bias is a
    property of the kernel's rounding, which the dumped call's own test judges; the
    search is for inputs where the kernel is wrong by more than rounding."""
    explored = copy.deepcopy(registry)
    for dtype in BIAS_TESTED:
        explored.set_threshold(api, dtype, "sr_bias_z", math.inf)
    return explored


def example_path(folder: Path, index: DumpIndex, name: CallName) -> Path:
    """Where the call's failing example is written: `folder/<dump>/<call>/dump.json`."""
    return folder / _safe(str(index.key or index.path)) / _safe(str(name)) / "dump.json"


def write_example(variant: Variant, index: DumpIndex, name: CallName, folder: Path) -> Path:
    """The example as a one-call tensor dump, at example_path."""
    where = example_path(folder, index, name).parent
    records = {str(name.sibling("forward")): {**variant.forward, "output": []}}
    if variant.backward is not None:
        records[str(name)] = {**variant.backward, "output": []}
    return write_tensor_dump(where, records, variant.tensors, index.framework)


def describe(variant: Variant) -> list[str]:
    """Each tensor of the example: how it was made, and the values that matter."""
    return [f"{variant.described[name]}; {_values(tensor)}" for name, tensor in variant.tensors.items()]


def _values(tensor: torch.Tensor) -> str:
    if not tensor.numel():
        return "empty"
    if tensor.numel() <= VALUES_SHOWN:
        return f"values {tensor.reshape(-1).tolist()}"
    if not (tensor.is_floating_point() or tensor.is_complex()):
        return f"min {tensor.min().item()}, max {tensor.max().item()}"
    wide = tensor.double()
    finite = wide[torch.isfinite(wide)]
    parts = [
        f"max |x| {finite.abs().max().item():.6g}, mean {finite.mean().item():.6g}"
        if finite.numel()
        else "no finite value"
    ]
    zeros, special = int((wide == 0).sum()), wide.numel() - finite.numel()
    parts += [f"{zeros} zeros"] * bool(zeros) + [f"{special} non-finite"] * bool(special)
    return ", ".join(parts)


_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def _safe(text: str) -> str:
    return _UNSAFE.sub("_", text).strip(".") or "_"
