"""--msprobe-explore: search the inputs around a dumped call for one its kernel gets
wrong, with hypothesis, and shrink what it finds to a minimal input.

Each example is a variant of the dumped call (run/neighbourhood.py), replayed and judged
exactly as the dumped call is (judge/call.py: same sides, same standards, same
re-judgements). An example fails when its verdict is an error (a warning too under
--msprobe-strict) or the device raises where the bench does not; an input the bench
itself rejects is discarded, never reported. The search is deterministic: seeded from
the call's name, so reruns and every -n agree; its example database (under
--msprobe-out) replays a failure first on the next run, as `--lf` expects. A failure is
written as a one-call tensor dump: the test's message names it, and it is what
--msprobe-save-failed saves and --msprobe-scripts turns into a script.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import math
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

import torch
from hypothesis import HealthCheck, Phase, Verbosity, example, given, reject
from hypothesis import settings as hypothesis_settings
from hypothesis.database import DirectoryBasedExampleDatabase
from hypothesis.errors import FlakyFailure, Unsatisfiable

from pytest_msprobe.compat import key_database, no_local_constants, seed_search
from pytest_msprobe.dump.index import CallName, DumpIndex
from pytest_msprobe.dump.values import DecodeContext
from pytest_msprobe.dump.writer import write_tensor_dump
from pytest_msprobe.errors import CallError, CallSkip
from pytest_msprobe.judge.call import FRAMEWORKS, CallResult, Replayed, Settings, read_inputs, replay_inputs
from pytest_msprobe.judge.findings import Finding
from pytest_msprobe.judge.judgement import Judgement, Rejudgement, judge, judged, relabelled
from pytest_msprobe.judge.record import EXPLORED_SUFFIX
from pytest_msprobe.run.apis import fixed_shape_apis, normed_arguments, paired_apis, summing_apis
from pytest_msprobe.run.neighbourhood import Neighbourhood, Variant
from pytest_msprobe.run.recurrent import DEFINITIONS as RECURRENT_DEFINITIONS
from pytest_msprobe.run.replay import (
    DeviceFailed,
    Placement,
    Run,
    decode_backward,
    decode_forward,
    evaluated,
    flat_outputs,
    tree_map,
)
from pytest_msprobe.run.terms import has_terms, term_magnitudes

if TYPE_CHECKING:
    from pytest_msprobe.dump.values import Nested
    from pytest_msprobe.run.replay import Inputs, Results, Side
    from pytest_msprobe.standards import Registry

#: how exploration moves a floating input: (original, raised to the bench's dtype) -> moved
Move: TypeAlias = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
#: what _pairwise applies to each pair of floating tensors of one shape
Pairwise: TypeAlias = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

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
# Why a judged example passes only once its errors are conditioned (EXCUSED_ROUNDINGS).
WITHIN_ROUNDING = "errors within 16x the inputs' rounding (and flushed subnormals)"
# Why a recurrent backward passes only once its gates' rounding joins that (EXCUSED_ROUNDINGS).
GATES_ROUNDED = "errors within 16x the rounding of its saturating gates' results (recurrent backward)"


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


def explore_call(index: DumpIndex, name: CallName, settings: Settings, plan: Plan) -> CallResult:  # noqa: C901, PLR0915  the exploration's steps (plan, search, minimal example, verdict) read top-down; its skips name the step
    """The exploration's result, as judge_call reads a dumped call's. Raises CallSkip
    where the dumped call cannot be explored, replay.DeviceFailed where the device
    raised on an example (its message shows the minimal one)."""
    framework = FRAMEWORKS[index.framework]()
    api = framework.resolve(name, settings.backend)
    dumped = read_inputs(index, name, settings.max_elements)
    forward = index.read_record(index.entry_of(str(name.sibling("forward"))))
    backward = index.read_record(index.entry_of(str(name))) if name.direction == "backward" else None
    space = Neighbourhood(
        forward,
        backward,
        dumped.leaves,
        settings.max_elements,
        resizable=name.operator not in fixed_shape_apis(),
        smallest_size=framework.smallest_size,
    )
    label = f"{name}{EXPLORED_SUFFIX}"
    search = _Search()
    settings = dataclasses.replace(settings, registry=without_bias_tests(settings.registry, name.operator))

    def example_result(variant: Variant) -> CallResult:
        ctx = DecodeContext(index.tensor_dir, "tensor", name.call, settings.max_elements, provided=variant.provided())
        inputs = (
            decode_forward(variant.forward, ctx)
            if backward is None
            else decode_backward(variant.forward, variant.backward or {}, ctx)
        )
        replayed = replay_inputs(index.framework, framework, name, api, inputs, settings)
        judgement = judged(Judgement(settings.registry, name, replayed.results, replayed.bench, index.framework))
        if judgement.error:
            cause = beyond_range(name, replayed, index.framework)
            if cause is not None:
                raise Beyond(cause)
            judgement, excused = _excused(judgement)
            if excused is not None:
                search.excused[excused] += 1
        verdict = judgement.reached()
        documented = documented_defect(name, replayed) if verdict.status == "error" else None
        return CallResult(label, verdict, replayed.label, describe(variant), notes=[documented] if documented else [])

    def probe(variant: Variant) -> None:
        try:
            result = example_result(variant)
        except (CallSkip, CallError) as exc:
            search.discarded[exc.cause if isinstance(exc, Beyond) else REJECTED] += 1
            search.first_discard = search.first_discard or str(exc)
            reject()
        except DeviceFailed as exc:
            raise ExampleFailed(variant, None, exc) from exc
        search.judged += 1
        status = result.verdict.status
        search.first = search.first or (variant, result)
        if status == "error" or (status == "warning" and plan.strict):
            raise ExampleFailed(variant, result)
        if status == "warning" and search.warning is None:
            search.warning = (variant, result)

    test = _hypothesis_test(probe, space, plan, f"{index.key}::{label}", label, _small_angles(name, space))
    try:
        with no_local_constants():
            test()
    except ExampleFailed as failure:
        return _counted(_failed(failure, index, name, plan), search)
    except FlakyFailure as flaky:
        return _counted(_flaky(flaky, index, name, plan), search)
    except Unsatisfiable:
        raise CallSkip(
            f"no valid input found around the call: every example it was given was discarded "
            f"({_by_cause(search.discarded)}), e.g. {search.first_discard}"
        ) from None
    if search.first is None:
        raise CallSkip(
            f"no valid input found around the call ({_by_cause(search.discarded)} discarded), e.g. {search.first_discard}"
        )
    if search.warning is not None:
        _, result = search.warning
        return _counted(dataclasses.replace(result, notes=["the first warning is shown"]), search)
    _, first = search.first
    return _counted(dataclasses.replace(first, origins=[], notes=["none failed"]), search)


def _by_cause(counts: Counter[str]) -> str:
    return "; ".join(f"{cause}: {count}" for cause, count in sorted(counts.items())) or "none"


def _counted(result: CallResult, search: _Search) -> CallResult:
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


def _hypothesis_test(  # noqa: PLR0913  hypothesis' test is built from the probe, the space and the plan's seeds and label
    probe: Callable[[Variant], None], space: Neighbourhood, plan: Plan, key: str, label: str, first: list[Variant]
) -> Callable[[], None]:
    """The search as a hypothesis test: seeded from the call, quiet, no deadline (a call's
    cost is its own), its database keyed by the dump and the call; `first`, then the edges
    (run/neighbourhood.py EDGES) as its explicit examples, tried first."""
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
    # hypothesis.seed() would also switch the database off (its deterministic modes do):
    # the seed is set where seed() sets it, the database kept, so a failure found once
    # is replayed first the next time.
    seed_search(probe, int.from_bytes(hashlib.sha256(label.encode()).digest()[:8], "big"))
    test = given(space.variants())(probe)
    for variant in reversed(edges):  # run in this order, before any generated example
        test = example(variant)(test)
    test = chosen(test)
    key_database(test, key.encode())
    return test


def _small_angles(name: CallName, space: Neighbourhood) -> list[Variant]:
    """The 'small angles' edge (Neighbourhood.near_variants) for the APIs defined by the
    angle or difference of two arguments ([explore] angles): 1 - cos(x1, x2) cancels only
    where x2 nears x1, which no draw of two independent moves reaches."""
    return space.near_variants() if name.operator in paired_apis() else []


def _failed(failure: ExampleFailed, index: DumpIndex, name: CallName, plan: Plan) -> CallResult:
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
        raise _device_failed(failure.device_error, lines) from None
    return dataclasses.replace(failure.result, notes=[*failure.result.notes, _how_minimal(failure.variant), reproduce])


def _how_minimal(variant: Variant) -> str:
    if variant.explicit:
        return "(an edge tried first: the dumped call with one input moved to an extreme, as minimal as an example at that edge gets)"
    return "(inputs shrunk by hypothesis to a minimal failing example)"


def _device_failed(error: DeviceFailed, lines: str) -> DeviceFailed:
    failed = DeviceFailed(error.cause)
    failed.args = (f"{failed.args[0]} on an explored input\n{lines}",)
    return failed


def _flaky(flaky: FlakyFailure, index: DumpIndex, name: CallName, plan: Plan) -> CallResult:
    """An example failed once and passed when replayed: the kernel is not deterministic."""
    failures = [error for error in flaky.exceptions if isinstance(error, ExampleFailed)]
    if not failures or failures[0].result is None:
        raise CallError(f"an explored example failed once and passed when replayed: {flaky}") from flaky
    result = _failed(failures[0], index, name, plan)
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


# How many times the inputs' rounding sensitivity a correct kernel's error may be: a few
# roundings of intermediates, each comparable to one of an input.
EXCUSED_SENSITIVITY = 16


def _excused(judgement: Judgement) -> tuple[Judgement, str | None]:
    """The example judged error, excused by the first row of EXCUSED_ROUNDINGS that
    applies and passes it, and that row's cause; the error and None where none does."""
    for row in EXCUSED_ROUNDINGS:
        if row.applies(judgement):
            again = row.run(judgement)
            if not again.error:
                return again, row.name
    return judgement, None


def _conditioned(judgement: Judgement, sensitivity: Nested, excused: str) -> Judgement:
    """The judgement again, with each element's error excused up to EXCUSED_SENSITIVITY
    times its sensitivity to the rounding of the inputs (`sensitivity`); where that is
    still an error, the error stands.

    Explored inputs can be as ill-conditioned as inputs get (a large common offset under
    a normalisation): there a correct kernel in D errs by the condition number times D's
    rounding, far beyond the result's own ULP. That error is what the bench shows when
    the inputs move as a correct kernel may move them (input_sensitivity): Delta. The
    device's error within 16 Delta, plus D's smallest normal value times the longest
    dimension of the inputs (a kernel that flushes subnormal results to zero, as the
    CPU's bfloat16 GEMM and many accelerators do, loses up to that much on each term of
    a sum; measured: the CPU's bfloat16 matmul of 13 terms scaled into the subnormals,
    2.3e-38 = 2 smallest normals) times the largest incoming gradient of a backward
    (_largest_incoming), is taken off, the rest judged as before, with the
    terms' magnitudes where the call sums products: a NaN, an inf, or an error of a
    naive algorithm (a variance as E[x^2] - E[x]^2 loses u mean^2, hundreds of Delta)
    still fails. `excused` names the cause."""
    results = judgement.results
    longest = max((size for leaf in results.inputs.leaves for size in leaf.tensor.shape), default=1)
    flushed = longest * _largest_incoming(results.inputs)
    allowed = _pairwise(
        lambda delta, device: EXCUSED_SENSITIVITY * delta + flushed * torch.finfo(device.dtype).smallest_normal,
        sensitivity,
        results.device,
    )
    device = _excused_device(results.device, results.bench, allowed)
    terms = term_magnitudes(judgement.name, judgement.bench, results.inputs, judgement.framework)
    again = Judgement(
        judgement.registry,
        judgement.name,
        dataclasses.replace(results, device=device),
        judgement.bench,
        judgement.framework,
        terms=terms,
    )
    verdict = judge(again)
    return (
        judgement
        if verdict.status == "error"
        else dataclasses.replace(again, verdict=relabelled(verdict, f"{excused} excused"))
    )


def _within_inputs_rounding(judgement: Judgement) -> Judgement:
    """_conditioned on input_sensitivity; the judgement as it was where that cannot be measured."""
    sensitivity = input_sensitivity(judgement)
    return judgement if sensitivity is None else _conditioned(judgement, sensitivity, WITHIN_ROUNDING)


def _recurrent_backward(judgement: Judgement) -> bool:
    return judgement.name.direction == "backward" and judgement.name.operator in RECURRENT_DEFINITIONS


def _within_gates_rounding(judgement: Judgement) -> Judgement:
    """_conditioned with the sensitivity to the rounding of the gates' results besides
    the inputs' (gate_sensitivity): a recurrent backward's (1 - z) and 1 - n**2 are
    formed from gates that D holds rounded, and cancel where the gates saturate
    (measured: torch's fused float32 GRU backward and the GRU's definition run cell by
    cell in float32 err alike, 659 to 8e5 scaled ULP of the weight gradient as inputs
    and state grow). The judgement as it was where either cannot be measured."""
    inputs, gates = input_sensitivity(judgement), gate_sensitivity(judgement)
    if inputs is None or gates is None:
        return judgement
    return _conditioned(judgement, _pairwise(torch.maximum, inputs, gates), GATES_ROUNDED)


#: How an explored example judged error is judged again, in order (_excused): its
#: errors excused within a rounding a correct kernel's error may reach on such inputs.
#: Each row's name is its cause, counted in the message and the metrics file.
EXCUSED_ROUNDINGS = (
    Rejudgement(WITHIN_ROUNDING, lambda judgement: True, _within_inputs_rounding),
    Rejudgement(GATES_ROUNDED, _recurrent_backward, _within_gates_rounding),
)


def gate_sensitivity(judgement: Judgement) -> Nested | None:
    """Element by element, the largest change of the bench's gradients when every gate's
    result of the API's definition (run/recurrent.py) moves by a rounding in D, y (1 +- u)
    under SENSITIVITY_PATTERNS random sign patterns; None where the definition cannot
    run the call."""
    name, bench, inputs = judgement.name, judgement.bench, judgement.results.inputs
    definition = RECURRENT_DEFINITIONS.get(name.operator)
    floats = [leaf.tensor.dtype for leaf in inputs.leaves if leaf.tensor.is_floating_point()]
    if definition is None or not floats or not isinstance(bench, Run):
        return None
    unit = max(torch.finfo(dtype).eps for dtype in floats) / 2

    def gradients(gate: Callable[[torch.Tensor], torch.Tensor] | None) -> Nested | None:
        function = definition if gate is None else functools.partial(definition, gate=gate)
        return evaluated(dataclasses.replace(bench, function=function), name.direction, inputs, judgement.framework)

    plain = gradients(None)
    moved = [gradients(_rounded_gate(unit, seed)) for seed in range(SENSITIVITY_PATTERNS)]
    if plain is None or any(change is None for change in moved):
        return None
    changes = [_pairwise(lambda a, b: (a.double() - b.double()).abs(), change, plain) for change in moved]
    return functools.reduce(lambda merged, change: _pairwise(torch.maximum, merged, change), changes)


def _rounded_gate(unit: float, seed: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """y (1 +- unit), signs at random, for each gate's result in turn."""
    generator = torch.Generator().manual_seed(seed)

    def gate(value: torch.Tensor) -> torch.Tensor:
        signs = torch.randint(0, 2, value.shape, generator=generator).to(value.dtype) * 2 - 1
        return value * (1 + unit * signs)

    return gate


def _largest_incoming(inputs: Inputs) -> float:
    """max(1, the largest |incoming gradient|): a backward multiplies its intermediates by
    it, a flushed one among them too (layer_norm's weight gradient sums g x_hat, and x_hat
    of subnormal inputs is subnormal itself)."""
    grads = [g for g in inputs.grads or [] if isinstance(g, torch.Tensor) and g.is_floating_point() and g.numel()]
    return max([1.0, *(float(g.double().abs().nan_to_num(posinf=0.0, neginf=0.0).max()) for g in grads)])


def _excused_device(device: Nested, bench: Nested, allowed: Nested) -> Nested:
    """The device's outputs with the error within `allowed` taken off (NaN stays NaN)."""
    if isinstance(device, (list, tuple)) and isinstance(bench, (list, tuple)) and isinstance(allowed, (list, tuple)):
        return tuple(_excused_device(d, b, a) for d, b, a in zip(device, bench, allowed, strict=False))
    if not (
        isinstance(device, torch.Tensor)
        and isinstance(bench, torch.Tensor)
        and isinstance(allowed, torch.Tensor)
        and device.is_floating_point()
        and device.shape == bench.shape == allowed.shape
    ):
        return device
    error = device.double() - bench.double()
    kept = error - torch.maximum(torch.minimum(error, allowed), -allowed)
    return (bench.double() + kept).to(device.dtype)


def input_sensitivity(judgement: Judgement) -> Nested | None:
    """Element by element, in the bench's structure, the largest change of the bench's
    result when its inputs move as a correct kernel in D may move them: by a rounding,
    x (1 +- u) (u: D's unit roundoff) under a few random sign patterns, with D's
    subnormals flushed to zero (kernels that treat subnormal inputs as zero), and, for a
    backward defined from the forward's result (RESULT_BACKWARDS), that result rounded to
    D. None where the bench cannot run it."""
    inputs, bench = judgement.results.inputs, judgement.bench
    floats = [leaf.tensor.dtype for leaf in inputs.leaves if leaf.tensor.is_floating_point()]
    if not floats or not isinstance(bench, Run):
        return None
    unit = max(torch.finfo(dtype).eps for dtype in floats) / 2
    moves = [_rounded(unit, seed) for seed in range(SENSITIVITY_PATTERNS)] + [_flushed]
    changes = [_change(judgement, bench, move) for move in moves]
    if any(change is None for change in changes):
        return None
    changes += [
        _result_rounded(judgement, unit, seed)
        for seed in range(SENSITIVITY_PATTERNS)
        if judgement.name.operator in RESULT_BACKWARDS
    ]
    merged = changes[0]
    for change in changes[1:]:
        merged = merged if change is None else _pairwise(torch.maximum, merged, change)
    return merged


#: The backwards derivatives.yaml defines from the forward's result, not its input:
#: sigmoid_backward(grad, result) = grad (1 - y) y, tanh_backward(grad, result) =
#: grad (1 - y**2). Every kernel of that definition reads y rounded to D, and 1 - y
#: cancels where y nears 1 (from x the same derivative is accurate: measured 0.28 ULP
#: where torch's is 2e5 at x = 15.6).
RESULT_BACKWARDS = {"sigmoid": "sigmoid_backward", "tanh": "tanh_backward"}


def _result_rounded(judgement: Judgement, unit: float, seed: int) -> Nested | None:
    """|backward(g, y (1 +- u)) - backward(g, y)| (y: the forward's exact result), as the
    bench's one input gradient; None where the call is not that backward's."""
    name, inputs = judgement.name, judgement.results.inputs
    grad = next((g for g in inputs.grads or [] if isinstance(g, torch.Tensor) and g.is_floating_point()), None)
    result = _forward_result(judgement.bench, inputs, judgement.framework)
    if name.direction != "backward" or grad is None or result is None or grad.shape != result.shape:
        return None
    backward = getattr(torch.ops.aten, RESULT_BACKWARDS[name.operator])
    y, g = result.double(), grad.double()
    moved = _rounded(unit, seed)(y, y)
    return (torch.as_tensor(backward(g, moved) - backward(g, y)).abs(),)


def _forward_result(bench: Side, inputs: Inputs, framework: str) -> torch.Tensor | None:
    """A backward's forward result on the bench (its first floating output), None where
    the bench cannot run it."""
    forward = evaluated(bench, "forward", dataclasses.replace(inputs, grads=None), framework)
    return next((y for y in flat_outputs(forward) if isinstance(y, torch.Tensor) and y.is_floating_point()), None)


# Random sign patterns the sensitivity is the largest over: a row of two elements moved
# the same way by one pattern keeps x - mean(x) as it was (probability 1/2 each).
SENSITIVITY_PATTERNS = 4


def _rounded(unit: float, seed: int) -> Move:
    """x (1 +- unit), signs at random: a rounding of every input."""
    generator = torch.Generator().manual_seed(seed)

    def move(original: torch.Tensor, raised: torch.Tensor) -> torch.Tensor:
        signs = torch.randint(0, 2, raised.shape, generator=generator).to(raised.dtype) * 2 - 1
        return raised * (1 + unit * signs)

    return move


def _flushed(original: torch.Tensor, raised: torch.Tensor) -> torch.Tensor:
    """The input with what is subnormal in its own dtype set to zero."""
    return torch.where(original.abs() < torch.finfo(original.dtype).smallest_normal, torch.zeros_like(raised), raised)


def _change(judgement: Judgement, bench: Run, move: Move) -> Nested | None:
    """|bench(moved inputs) - bench(inputs)|, the inputs moved in the bench's precision."""
    inputs = judgement.results.inputs

    def moved(value: Nested) -> Nested:
        if not (isinstance(value, torch.Tensor) and value.is_floating_point()):
            return value
        return move(value, value.to(bench.placement.dtypes.get(value.dtype, value.dtype)))

    perturbed = dataclasses.replace(
        inputs,
        args=tree_map(moved, inputs.args),
        kwargs=tree_map(moved, inputs.kwargs),
        grads=tree_map(moved, inputs.grads) if inputs.grads is not None else None,
    )
    again = evaluated(
        dataclasses.replace(bench, placement=Placement(bench.placement.device)),
        judgement.name.direction,
        perturbed,
        judgement.framework,
    )
    if again is None:
        return None
    return _pairwise(lambda a, b: (a.double() - b.double()).abs(), again, judgement.results.bench)


def _pairwise(function: Pairwise, left: Nested, right: Nested) -> Nested:
    """function(l, r) over two outputs of one structure (None where a side is not a
    floating tensor of the same shape)."""
    if isinstance(left, (list, tuple)) and isinstance(right, (list, tuple)) and len(left) == len(right):
        return tuple(_pairwise(function, l, r) for l, r in zip(left, right, strict=True))
    if (
        isinstance(left, torch.Tensor)
        and isinstance(right, torch.Tensor)
        and left.is_floating_point()
        and right.is_floating_point()
        and left.shape == right.shape
    ):
        return function(left, right)
    return None


# The dtype a correct kernel accumulates D's sums in: 16-bit floats in float32 (torch's
# opmath type, and what accelerators' reductions use for them); others in D itself.
ACCUMULATOR = {torch.float16: torch.float32, torch.bfloat16: torch.float32}


@dataclass(frozen=True)
class Excuse:
    """An overflow no correct kernel of an API avoids: an intermediate that the API's
    definition computes (`computes`), beyond the range it is computed in (`beyond`)."""

    cause: str  # named in the counts of the message and the metrics file
    computes: Callable[[CallName], bool]
    beyond: Callable[[CallName, Replayed, str], bool]


def beyond_range(name: CallName, replayed: Replayed, framework: str) -> str | None:
    """The cause that excuses an example the device got wrong, None where none does.

    Each intermediate (EXCUSES) counts only for the APIs that compute it: a softmax
    computes no sum of squares, so its large or masked logits excuse nothing. Masked
    positions (inf/NaN in an input) are left out of each: an infinity counts only
    where every input is finite (the bench's range holds D's: rsqrt's derivative
    -x**-1.5 / 2 at a bfloat16 subnormal overflows float32 too), and a sum of squares
    sums the finite elements."""
    return next(
        (excuse.cause for excuse in EXCUSES if excuse.computes(name) and excuse.beyond(name, replayed, framework)), None
    )


def _largest(results: Results) -> float | None:
    """The largest finite value of the device outputs' dtypes; None: no floating output."""
    outputs = [d for d in flat_outputs(results.device) if isinstance(d, torch.Tensor) and d.is_floating_point()]
    return max(torch.finfo(d.dtype).max for d in outputs) if outputs else None


def _beyond(values: Nested, results: Results) -> bool:
    """Whether a value of `values` is beyond the device dtype's range (see beyond_range)."""
    largest = _largest(results)
    if largest is None:
        return False
    finite = all(
        bool(torch.isfinite(leaf.tensor).all()) for leaf in results.inputs.leaves if leaf.tensor.is_floating_point()
    )
    return any(_magnitude(value, finite) > largest for value in flat_outputs(values) if isinstance(value, torch.Tensor))


def _result_beyond(name: CallName, replayed: Replayed, framework: str) -> bool:
    return _beyond(replayed.results.bench, replayed.results)


def _sum_beyond(power: int) -> Callable[[CallName, Replayed, str], bool]:
    """Whether the sum of the first argument's finite |elements|**power lies above the
    accumulator's largest value, or, for squares, so far below its smallest normal
    one that the sum keeps fewer bits than the accumulator has (the squares of tiny
    inputs underflow)."""

    def beyond(name: CallName, replayed: Replayed, framework: str) -> bool:
        first = next(
            (arg for arg in replayed.results.inputs.args if isinstance(arg, torch.Tensor) and arg.is_floating_point()),
            None,
        )
        if first is None or _largest(replayed.results) is None:
            return False
        info = torch.finfo(ACCUMULATOR.get(first.dtype, first.dtype))
        wide = first.double()
        total = float(wide[torch.isfinite(wide)].abs().pow(power).sum())
        return total > info.max or (power == 2 and 0 < total < info.smallest_normal / info.eps)

    return beyond


def _group_norm_groups(args: list[Nested], kwargs: dict[str, Nested]) -> torch.Tensor | None:
    """group_norm's input as (sample, group, elements of the group)."""
    x, groups = args[0] if args else kwargs.get("input"), args[1] if len(args) > 1 else kwargs.get("num_groups")
    if not isinstance(x, torch.Tensor) or not isinstance(groups, int) or x.dim() < 2 or not groups:
        return None
    return x.reshape(x.shape[0], groups, -1)


#: How each API of the [explore] centred table groups its input for the mean and variance
#: its definition forms: the input reshaped to (..., the elements of one group).
CENTRED_GROUPS: dict[str, Callable[[list[Nested], dict[str, Nested]], torch.Tensor | None]] = {
    "group_norm": _group_norm_groups
}


def _centred_beyond(name: CallName, replayed: Replayed, framework: str) -> bool:
    """A group's sum of (x - mean)**2 (its finite elements) beyond the accumulator's range
    or so far below its smallest normal value that it keeps fewer bits than it has: the
    definition's variance. x**2 itself is no intermediate of the definition: under a large
    common offset it overflows where the centred squares fit (issue 39: a variance by
    E[x**2] - E[x]**2 must still fail there)."""
    inputs = replayed.results.inputs
    grouped = CENTRED_GROUPS[name.operator](list(inputs.args), dict(inputs.kwargs))
    if grouped is None or not grouped.is_floating_point() or _largest(replayed.results) is None:
        return False
    info = torch.finfo(ACCUMULATOR.get(grouped.dtype, grouped.dtype))
    wide = grouped.double()
    finite = torch.isfinite(wide)
    count = finite.sum(-1, keepdim=True).clamp_min(1)
    mean = wide.where(finite, torch.zeros_like(wide)).sum(-1, keepdim=True) / count
    totals = (wide - mean).square().where(finite, torch.zeros_like(wide)).sum(-1)
    positive = totals[totals > 0]
    return float(totals.max()) > info.max or (
        bool(positive.numel()) and float(positive.min()) < info.smallest_normal / info.eps
    )


def _floats(replayed: Replayed) -> list[torch.Tensor]:
    """The forward's floating tensors, their finite elements only (masked positions left out)."""
    tensors = [leaf.tensor for leaf in replayed.results.inputs.leaves if leaf.tensor.is_floating_point()]
    return [tensor.double()[torch.isfinite(tensor)] for tensor in tensors]


def _shifted_beyond(name: CallName, replayed: Replayed, framework: str) -> bool:
    """x - max(x) of the first argument beyond the dtype's range (its finite elements)."""
    first = next(
        (arg for arg in replayed.results.inputs.args if isinstance(arg, torch.Tensor) and arg.is_floating_point()), None
    )
    largest = _largest(replayed.results)
    if first is None or largest is None:
        return False
    finite = first.double()[torch.isfinite(first)]
    return finite.numel() > 0 and float(finite.max() - finite.min()) > largest


def _products_beyond(name: CallName, replayed: Replayed, framework: str) -> bool:
    """A gate's sum of products beyond the dtype's range: the largest |weight| times the
    largest |input| (at least 1: a state is bounded by 1) times the longest dimension."""
    largest = _largest(replayed.results)
    magnitudes = sorted((float(tensor.abs().max()) for tensor in _floats(replayed) if tensor.numel()), reverse=True)
    if largest is None or not magnitudes:
        return False
    longest = max(int(size) for leaf in replayed.results.inputs.leaves for size in [*leaf.tensor.shape, 1])
    return bool(magnitudes[0] * max([1.0, *magnitudes[1:2]]) * longest > largest)


def _scores_beyond(name: CallName, replayed: Replayed, framework: str) -> bool:
    """An attention's scores beyond the dtype's range: their terms' sums |q| |k|^T scale,
    or a query row's x - max(x) (the finite scores only: masked positions left out). In
    float32, q and k of 1e19 overflow every correct kernel's scores; the bench in float64
    does not (issue 39: 14 inf on the device)."""
    inputs = replayed.results.inputs
    q, k = (next(iter(inputs.args[i : i + 1]), None) for i in (0, 1))
    largest = _largest(replayed.results)
    if (
        not isinstance(q, torch.Tensor)
        or not isinstance(k, torch.Tensor)
        or largest is None
        or q.dim() < 2
        or k.dim() < 2
    ):
        return False
    given = inputs.kwargs.get("scale")
    scale = float(given) if isinstance(given, (int, float)) else 1 / math.sqrt(q.shape[-1])
    wide_q, wide_k = (tensor.double().nan_to_num(0.0, 0.0, 0.0) for tensor in (q, k))  # masked positions left out
    try:
        terms = (wide_q.abs() @ wide_k.abs().transpose(-2, -1)) * abs(scale)
        scores = (wide_q @ wide_k.transpose(-2, -1)) * scale
    except RuntimeError:  # shapes that do not broadcast: no evidence
        return False
    spread = scores.amax(-1) - scores.amin(-1) if scores.numel() else scores
    return _beyond((terms, spread), replayed.results)


def _terms_beyond(name: CallName, replayed: Replayed, framework: str) -> bool:
    terms = term_magnitudes(name, replayed.bench, replayed.results.inputs, framework)
    return terms is not None and _beyond(terms, replayed.results)


def _shifted_gradient_beyond(name: CallName, replayed: Replayed, framework: str) -> bool:
    """A softmax-like backward's shifted gradient beyond the dtype's range (finite
    elements only): softmax's and softmin's gradient is defined as y * (g - sum(g * y))
    along dim, log_softmax's as g - exp(y) * sum(g): g - sum(g * y) is up to twice the
    largest |g| (the backward's x - max(x)), and sum(g)'s partial sums up to sum(|g|)."""
    inputs = replayed.results.inputs
    first = next((arg for arg in inputs.args if isinstance(arg, torch.Tensor) and arg.is_floating_point()), None)
    grad = next((g for g in inputs.grads or [] if isinstance(g, torch.Tensor) and g.is_floating_point()), None)
    largest = _largest(replayed.results)
    if first is None or grad is None or largest is None or grad.shape != first.shape or not first.dim():
        return False
    dim = inputs.kwargs.get("dim", inputs.args[1] if len(inputs.args) > 1 else None)
    dim = dim if isinstance(dim, int) else -1
    g = grad.double().nan_to_num(0.0, 0.0, 0.0)  # masked positions left out
    if name.operator == "log_softmax":
        return float(g.abs().sum(dim).max()) > largest
    x = first.double()
    y = torch.softmax(-x if name.operator == "softmin" else x, dim).nan_to_num(0.0, 0.0, 0.0)
    return _magnitude(g - (g * y).sum(dim, keepdim=True), False) > largest


def _norm_beyond(name: CallName, replayed: Replayed, framework: str) -> bool:
    """A norm the API divides by ([explore.norms]: its arguments, along `dim`, argument 2,
    default 1) beyond the dtype's range, or its sum of |x|**p beyond the accumulator's
    (finite elements only)."""
    args, kwargs = replayed.results.inputs.args, replayed.results.inputs.kwargs
    largest = _largest(replayed.results)
    dim = kwargs.get(
        "dim", args[2] if len(args) > 2 and isinstance(args[2], int) else 1
    )  # cosine_embedding_loss's is a target
    power = kwargs.get("p", args[1] if len(args) > 1 and isinstance(args[1], (int, float)) else 2)
    if largest is None or not isinstance(dim, int) or not isinstance(power, (int, float)) or power <= 0:
        return False
    for position in normed_arguments(name.operator):
        tensor = args[position] if position < len(args) else None
        if not (
            isinstance(tensor, torch.Tensor)
            and tensor.is_floating_point()
            and -tensor.dim() <= dim < max(tensor.dim(), 1)
        ):
            continue
        wide = tensor.double()
        powers = (
            wide.abs().pow(power).where(torch.isfinite(wide), torch.zeros_like(wide)).sum(dim)
            if wide.dim()
            else wide.abs() ** power
        )
        accumulator = torch.finfo(ACCUMULATOR.get(tensor.dtype, tensor.dtype)).max
        if float(powers.max()) > accumulator or float(powers.max()) ** (1 / power) > largest:
            return True
    return False


def _atan2_backward(call: Arguments) -> list[torch.Tensor]:
    """atan2_backward (FunctionsManual.cpp): grad * other * recip, grad * -self * recip,
    recip = 1 / (self * self + other * other)."""
    y, x, g = call.tensor(0, "input"), call.tensor(1, "other"), call.grads[0]
    return [] if y is None or x is None else [y * y + x * x, g * x, g * y]


def _std_backward(call: Arguments) -> list[torch.Tensor]:
    """std_backward (FunctionsManual.cpp): var_backward(grad / (result * 2))."""
    return [call.result * 2]


def _layer_norm_backward(call: Arguments) -> list[torch.Tensor]:
    """The input gradient rstd (g w - mean(g w) - x_hat mean(g w x_hat)): the row sums of
    g w (their partial sums bounded by sum |g w|)."""
    shape, weight = (
        call.args[1] if len(call.args) > 1 else call.kwargs.get("normalized_shape"),
        call.tensor(2, "weight"),
    )
    if not isinstance(shape, (list, tuple)) or weight is None:
        return []
    products = (call.grads[0] * weight).abs()
    return [products.sum(tuple(range(-len(shape), 0)))]


def _rms_norm_backward(call: Arguments) -> list[torch.Tensor]:
    """rms_norm is composite (x rsqrt(mean(x**2) + eps) w): its backward chains
    derivatives.yaml's formulas, rsqrt's -grad result**3 / 2 (rstd**3) with grad the row
    sums of g w x."""
    shape, x, weight = (
        call.args[1] if len(call.args) > 1 else call.kwargs.get("normalized_shape"),
        call.tensor(0, "input"),
        call.tensor(2, "weight"),
    )
    eps = call.args[3] if len(call.args) > 3 else call.kwargs.get("eps")
    if not isinstance(shape, (list, tuple)) or x is None:
        return []
    dims = tuple(range(-len(shape), 0))
    rstd = (x.square().mean(dims) + (eps if isinstance(eps, float) else torch.finfo(torch.float32).eps)).rsqrt()
    products = call.grads[0] * x * (weight if weight is not None else 1)
    return [rstd**3, products.abs().sum(dims)]


def _pairwise_distance_backward(call: Arguments) -> list[torch.Tensor]:
    """pairwise_distance is norm(x1 - x2 + eps): norm_backward (derivatives.yaml) divides
    by the norm, the forward's result, which sums the squares of x1 - x2."""
    x1, x2 = call.tensor(0, "x1"), call.tensor(1, "x2")
    return [] if x1 is None or x2 is None else [x1 - x2, (x1 - x2).square().sum(-1), call.result]


def _cosine_embedding_loss_backward(call: Arguments) -> list[torch.Tensor]:
    """cosine_embedding_loss is composite (aten's Loss.cpp: cos = x1 . x2 / sqrt(m1 m2),
    m = sum(x**2) + 1e-12): its backward chains div's and sqrt's formulas, the product
    m1 m2, x1 . x2's gradient g / sqrt(m1 m2) and the denominator's g (x1 . x2) / (m1 m2)
    over 2 sqrt(m1 m2)."""
    x1, x2, target = (
        call.tensor(0, "input1"),
        call.tensor(1, "input2"),
        call.args[2] if len(call.args) > 2 else call.kwargs.get("target"),
    )
    if x1 is None or x2 is None or not isinstance(target, torch.Tensor):
        return []
    dim = target.dim()
    squares = ((x1 * x1).sum(dim) + 1e-12) * ((x2 * x2).sum(dim) + 1e-12)
    return [squares, call.grads[0] / squares.sqrt(), call.grads[0] * (x1 * x2).sum(dim) / squares / squares.sqrt()]


def _group_norm_backward(call: Arguments) -> list[torch.Tensor]:
    """layer_norm's over each (sample, group of channels), the weight per channel: the
    group sums of |g w| (the definition's mean(g w) and mean(g w x_hat))."""
    x, groups, weight = (
        call.args[0],
        call.args[1] if len(call.args) > 1 else call.kwargs.get("num_groups"),
        call.tensor(2, "weight"),
    )
    if not isinstance(x, torch.Tensor) or not isinstance(groups, int) or weight is None:
        return []
    products = (call.grads[0] * weight.reshape([1, -1] + [1] * (x.dim() - 2))).abs()
    return [products.reshape(x.shape[0], groups, -1).sum(-1)]


@dataclass(frozen=True)
class Arguments:
    """A backward's forward arguments, incoming gradients and forward result, floating
    tensors in float64: what BACKWARD_INTERMEDIATES' formulas read."""

    args: list[Nested]
    kwargs: dict[str, Nested]
    grads: list[torch.Tensor]
    result: torch.Tensor

    def tensor(self, position: int, keyword: str) -> torch.Tensor | None:
        value = self.args[position] if position < len(self.args) else self.kwargs.get(keyword)
        return value if isinstance(value, torch.Tensor) and value.is_floating_point() else None


def _widened(value: Nested) -> Nested:
    return value.double() if isinstance(value, torch.Tensor) and value.is_floating_point() else value


#: A backward's definition is derivatives.yaml's formula: the intermediates it computes in
#: the dtype, from the forward's arguments, the incoming gradients and the forward's exact
#: result (float64), per API. Each excuses an example where it overflows the dtype or
#: falls below its smallest normal value.
BACKWARD_INTERMEDIATES: dict[str, Callable[[Arguments], list[torch.Tensor]]] = {
    "atan2": _atan2_backward,
    "std": _std_backward,
    "layer_norm": _layer_norm_backward,
    "rms_norm": _rms_norm_backward,
    "pairwise_distance": _pairwise_distance_backward,
    "cosine_embedding_loss": _cosine_embedding_loss_backward,
    "group_norm": _group_norm_backward,
}


# Where exploration's failures that match no excuse are reproduced without the plugin.
REPRODUCERS = "benchmarks/explore_findings.py"


@dataclass(frozen=True)
class Documented:
    """A torch defect that exploration finds in torch's own CPU kernel and the README's
    policy counts as the kernel's (an intermediate the kernel chose, which the API's
    definition does not form): `reproducer`, a function of REPRODUCERS, shows it against
    float64 beside a formula of the same cost in the same dtype. An example of the API in
    `dtypes` whose inputs lie where the defect shows (`regime`) still fails (the device
    is wrong there), and its message names the defect and the reproducer, so that a user
    can tell torch's known defect from a new one and deselect it where it is known."""

    operator: str
    direction: str
    dtypes: tuple[torch.dtype, ...]
    regime: Callable[[Arguments], bool]  # the example's inputs (float64) lie where the defect shows
    defect: str
    reproducer: str


def _gelu_tail(call: Arguments) -> bool:
    """gelu (exact) of an x below -4, where 1 + erf(x / sqrt 2) cancels."""
    x = call.tensor(0, "input")
    exact = call.kwargs.get("approximate", "none") == "none"
    return exact and x is not None and bool((x.nan_to_num(0.0, 0.0, 0.0) < -4).any())


def _gelu_tanh_gradient(call: Arguments) -> bool:
    """gelu(tanh)'s gradient where its inner derivative beta (1 + 3 kappa x**2) overflows
    float32 (|x| past ~5e19) while 1 - tanh**2 is already 0: 0 * inf."""
    x = call.tensor(0, "input")
    tanh = call.kwargs.get("approximate") == "tanh"
    return tanh and x is not None and _magnitude(3 * 0.044715 * x.square(), False) > torch.finfo(torch.float32).max


def _hardswish_product(call: Arguments) -> bool:
    """hardswish where x * relu6(x + 3) overflows float32 before the division by 6."""
    x = call.tensor(0, "input")
    return x is not None and _magnitude(x * (x + 3).clamp(0, 6), False) > torch.finfo(torch.float32).max


def _softplus_gradient(call: Arguments) -> bool:
    """softplus's gradient where g exp(beta x) overflows float32 below the threshold (the
    kernel's g z / (z + 1), z = exp(beta x), where the definition's g sigmoid(beta x) does not)."""
    x = call.tensor(0, "input")
    beta, threshold = (
        call.args[i] if len(call.args) > i else call.kwargs.get(key, default)
        for i, key, default in ((1, "beta", 1.0), (2, "threshold", 20.0))
    )
    if x is None or not call.grads or not isinstance(beta, (int, float)) or not isinstance(threshold, (int, float)):
        return False
    products = call.grads[0].abs() * torch.exp(beta * x).where(beta * x <= threshold, torch.zeros_like(x))
    return _magnitude(products, False) > torch.finfo(torch.float32).max


def _group_norm_squares(call: Arguments) -> bool:
    """group_norm (forward, and the backward from its forward's statistics) where an x**2
    overflows float32 (|x| past 1.84e19): torch's CPU kernel forms it (NaN from there on,
    measured; 1.2e-4 off at 1.83e19), the definition's (x - mean)**2 does not."""
    x = call.tensor(0, "input")
    return x is not None and _magnitude(x.square(), False) > torch.finfo(torch.float32).max


def _group_norm_gradient(call: Arguments) -> bool:
    """group_norm's input gradient where the CPU backward's fused rstd * weight, or its
    moment form's (mean sum(g w) - sum(g w x)) rstd**3, overflows float32 (per sample and
    group) while the definition's rstd (g w - mean(g w) - x_hat mean(g w x_hat)) is finite."""
    x, groups, weight = (
        call.tensor(0, "input"),
        call.args[1] if len(call.args) > 1 else call.kwargs.get("num_groups"),
        call.tensor(2, "weight"),
    )
    eps = call.args[4] if len(call.args) > 4 else call.kwargs.get("eps", 1e-5)
    if (
        x is None
        or weight is None
        or not call.grads
        or not isinstance(groups, int)
        or not isinstance(eps, float)
        or x.dim() < 2
    ):
        return False
    grouped = x.reshape(x.shape[0], groups, -1)
    mean, rstd = grouped.mean(-1), (grouped.var(-1, unbiased=False) + eps).rsqrt()
    products = (call.grads[0] * weight.reshape([1, -1] + [1] * (x.dim() - 2))).reshape(grouped.shape)
    moments = (products.sum(-1) * mean - (products * grouped).sum(-1)) * rstd**3
    fused = rstd.repeat_interleave(x.shape[1] // groups, 1) * weight.abs()
    return max(_magnitude(moments, False), _magnitude(fused, False)) > torch.finfo(
        torch.float32
    ).max or _group_norm_squares(call)


def _batch_norm_weight(call: Arguments) -> bool:
    """batch_norm where the CPU kernel's fused weight * rstd overflows float32 (rstd from the
    batch's statistics in training, the running variance otherwise) while the
    definition's weight * x_hat fits (the exact result is checked first: EXCUSES)."""
    x, running, weight = call.tensor(0, "input"), call.tensor(2, "running_var"), call.tensor(3, "weight")
    training = call.args[5] if len(call.args) > 5 else call.kwargs.get("training", False)
    eps = call.args[7] if len(call.args) > 7 else call.kwargs.get("eps", 1e-5)
    if x is None or weight is None or x.dim() < 2 or not isinstance(eps, float):
        return False
    variance = x.transpose(0, 1).reshape(x.shape[1], -1).var(-1, unbiased=False) if training is True else running
    if variance is None:
        return False
    return _magnitude((variance + eps).rsqrt() * weight.abs(), False) > torch.finfo(torch.float32).max


def _layer_norm_gradient(call: Arguments) -> bool:
    """layer_norm's backward where the CPU kernel's moment form leaves float32: its
    rstd**3 among the subnormals (sigma past ~4e12), its sums of g w x (x, not x_hat) or
    (mean sum(g w) - sum(g w x)) rstd**3 beyond the largest value, or a fused rstd * w,
    rstd * sum(g w) (rows of one element) beyond it; the definition's rstd (g w - mean(g w)
    - x_hat mean(g w x_hat)) forms none of them."""
    x, shape, weight = (
        call.tensor(0, "input"),
        call.args[1] if len(call.args) > 1 else call.kwargs.get("normalized_shape"),
        call.tensor(2, "weight"),
    )
    eps = call.args[4] if len(call.args) > 4 else call.kwargs.get("eps", 1e-5)
    if x is None or not call.grads or not isinstance(shape, (list, tuple)) or not shape or not isinstance(eps, float):
        return False
    dims = tuple(range(-len(shape), 0))
    mean, rstd = x.mean(dims), (x.var(dims, unbiased=False) + eps).rsqrt()
    products = call.grads[0] * (weight if weight is not None else 1.0)
    sums, moments = (products * x).sum(dims), products.sum(dims)
    largest, info = torch.finfo(torch.float32).max, torch.finfo(torch.float32)
    beyond = [
        (products * x).abs().sum(dims),
        (moments * mean - sums) * rstd**3,
        rstd * moments,
        rstd * _magnitude(products, False),
    ]
    return any(_magnitude(value, False) > largest for value in beyond) or _underflows(rstd**3, info.smallest_normal)


def _attention_scores(call: Arguments) -> torch.Tensor | None:
    """q k^T scale with the causal or boolean mask's positions at -inf (an additive mask
    added), float64; None where the shapes do not broadcast."""
    q, k = call.tensor(0, "query"), call.tensor(1, "key")
    mask = call.args[3] if len(call.args) > 3 else call.kwargs.get("attn_mask")
    causal, given = (
        call.args[5] if len(call.args) > 5 else call.kwargs.get("is_causal", False),
        call.kwargs.get("scale"),
    )
    if q is None or k is None or q.dim() < 2:
        return None
    scale = float(given) if isinstance(given, (int, float)) else 1 / math.sqrt(q.shape[-1])
    try:
        scores = (q @ k.transpose(-2, -1)) * scale
        if causal is True:
            scores = scores.masked_fill(torch.ones(scores.shape[-2:], dtype=torch.bool).tril().logical_not(), -math.inf)
        if isinstance(mask, torch.Tensor):
            scores = (
                scores.masked_fill(mask.logical_not(), -math.inf)
                if mask.dtype == torch.bool
                else scores + mask.double()
            )
    except RuntimeError:
        return None
    return scores


def _attention_accumulator(call: Arguments) -> bool:
    """The CPU flash forward's unnormalised sum of exp(s - max(s)) v along a query's row
    beyond float32, which the definition (softmax first, then P V) never forms."""
    scores, v = _attention_scores(call), call.tensor(2, "value")
    if scores is None or v is None:
        return False
    weights = (scores - scores.amax(-1, keepdim=True)).exp().nan_to_num(0.0, 0.0, 0.0)
    try:
        return _magnitude(weights @ v.abs().nan_to_num(0.0, 0.0, 0.0), False) > torch.finfo(torch.float32).max
    except RuntimeError:
        return False


def _attention_saturated(call: Arguments) -> bool:
    """Every query row of two keys or more saturated: its two largest scores further
    apart than ln(1 / eps) of float32, so that its softmax rounds to one-hot (a large
    offset of q): the CPU flash backward's key gradient is then nonzero where the exact
    one is 0, and torch's math kernel (the definition) is exact."""
    scores = _attention_scores(call)
    if scores is None or scores.shape[-1] < 2:
        return False
    top = scores.topk(2, -1).values
    rows = torch.isfinite(top[..., 1])
    gaps = (top[..., 0] - top[..., 1])[rows]
    return bool(gaps.numel()) and float(gaps.min()) > -math.log(torch.finfo(torch.float32).eps)


F32 = (torch.float32,)

#: The torch defects exploration finds (README, benchmarks/RESULTS-explore.md): an example
#: that fails where one's regime holds names it and its reproducer (documented).
DOCUMENTED = (
    Documented(
        "gelu",
        "forward",
        F32,
        _gelu_tail,
        "1 + erf(x / sqrt 2) cancels below x = -4 (pytorch/pytorch#187806)",
        "gelu_tail",
    ),
    Documented(
        "gelu",
        "backward",
        F32,
        _gelu_tail,
        "its gradient's 1 + erf(x / sqrt 2) cancels below x = -4: 0 from x ~ -6 on",
        "gelu_tail_gradient",
    ),
    Documented(
        "gelu",
        "backward",
        F32,
        _gelu_tanh_gradient,
        "gelu(tanh)'s gradient: beta (1 + 3 kappa x**2) overflows where 1 - tanh**2 is 0, 0 * inf = NaN",
        "gelu_tanh_gradient",
    ),
    Documented(
        "softplus",
        "backward",
        F32,
        _softplus_gradient,
        "g * exp(x) overflows before the division by 1 + exp(x)",
        "softplus_gradient",
    ),
    Documented(
        "layer_norm",
        "backward",
        F32,
        _layer_norm_gradient,
        "the CPU backward's moment form (rstd**3, sums of g w x, fused rstd * g w) leaves float32's normal range",
        "layer_norm_scale, layer_norm_one_element",
    ),
    Documented(
        "batch_norm",
        "forward",
        F32,
        _batch_norm_weight,
        "the CPU kernel's fused weight * rstd overflows where weight * x_hat fits",
        "batch_norm_weight",
    ),
    Documented(
        "hardswish",
        "forward",
        F32,
        _hardswish_product,
        "x * relu6(x + 3) overflows before the division by 6",
        "hardswish_large",
    ),
    Documented(
        "group_norm",
        "forward",
        F32,
        _group_norm_squares,
        "the CPU kernel forms x**2, which overflows where the definition's (x - mean)**2 fits",
        "group_norm_squares",
    ),
    Documented(
        "group_norm",
        "backward",
        F32,
        _group_norm_gradient,
        "the CPU backward's fused rstd * weight, its rstd**3 sums or its forward's x**2 overflows",
        "group_norm_backward_weight",
    ),
    Documented(
        "scaled_dot_product_attention",
        "forward",
        F32,
        _attention_accumulator,
        "the CPU flash kernel sums exp(s - max) v before dividing by the row's sum",
        "attention_flash",
    ),
    Documented(
        "scaled_dot_product_attention",
        "backward",
        F32,
        _attention_saturated,
        "the CPU flash backward gives a key gradient where saturated rows' exact one is 0 (torch's math kernel is exact)",
        "attention_flash",
    ),
)


def documented_defect(name: CallName, replayed: Replayed) -> str | None:
    """The note naming the documented torch defect (DOCUMENTED) whose regime the example's
    inputs lie in, None where none matches: the example still fails."""
    inputs = replayed.results.inputs
    dtypes = {leaf.tensor.dtype for leaf in inputs.leaves if leaf.tensor.is_floating_point()}
    call = Arguments(
        [_widened(arg) for arg in inputs.args],
        {key: _widened(value) for key, value in inputs.kwargs.items()},
        [g.double() for g in inputs.grads or [] if isinstance(g, torch.Tensor) and g.is_floating_point()],
        torch.empty(0),  # the forward's result: no regime reads it
    )
    for entry in DOCUMENTED:
        if (
            entry.operator == name.operator
            and entry.direction == name.direction
            and dtypes <= set(entry.dtypes)
            and entry.regime(call)
        ):
            return (
                f"a documented torch defect: {entry.defect}; reproduced without the plugin by {REPRODUCERS} "
                f"({entry.reproducer}): deselect it where it is known"
            )
    return None


def _backward_intermediate_beyond(name: CallName, replayed: Replayed, framework: str) -> bool:
    inputs = replayed.results.inputs
    grads = [g.double() for g in inputs.grads or [] if isinstance(g, torch.Tensor) and g.is_floating_point()]
    result = _forward_result(replayed.bench, inputs, framework)
    if not grads or result is None:
        return False
    call = Arguments(
        [_widened(arg) for arg in inputs.args],
        {key: _widened(value) for key, value in inputs.kwargs.items()},
        grads,
        result.double(),
    )
    try:
        intermediates = BACKWARD_INTERMEDIATES[name.operator](call)
    except (IndexError, RuntimeError):  # another overload, shapes that do not broadcast: no evidence
        return False
    floats = [
        d.dtype for d in flat_outputs(replayed.results.device) if isinstance(d, torch.Tensor) and d.is_floating_point()
    ]
    tiny = min((torch.finfo(dtype).smallest_normal for dtype in floats), default=0.0)
    return _beyond(tuple(intermediates), replayed.results) or any(_underflows(value, tiny) for value in intermediates)


def _underflows(values: torch.Tensor, tiny: float) -> bool:
    """Whether a finite nonzero value lies below `tiny` (the dtype's smallest normal value):
    there it keeps fewer bits than the dtype has, or none."""
    magnitudes = values.abs()[torch.isfinite(values) & (values != 0)]
    return bool(magnitudes.numel()) and float(magnitudes.min()) < tiny


def _derivative_beyond(name: CallName, replayed: Replayed, framework: str) -> bool:
    return _beyond(_derivative(replayed, framework), replayed.results)


#: The intermediates a correct kernel cannot avoid, and which calls compute them: the
#: exact result (every call), a sum of squares (norms, variances, distances: the
#: [explore] squares table; for the centred table a group's (x - mean)**2), a sum before a division (means, average pools: sums),
#: x - max(x) (softmax and its kin: shifted), a softmax-like backward's g - sum(g * y)
#: (shifted_gradient), an attention's scores q k^T scale (scores), a recurrent gate's products (products), the terms of a sum of
#: products (the [terms] table, which bound a partial sum, not the result), a norm it
#: divides by ([explore.norms]), an intermediate of a backward's formula
#: (BACKWARD_INTERMEDIATES), and a backward's derivative (computed before it is
#: multiplied by the incoming gradient).
EXCUSES = (
    Excuse("exact result beyond the dtype's range", lambda name: True, _result_beyond),
    Excuse(
        "sum of squares beyond its accumulator's range",
        lambda name: name.operator in summing_apis("squares"),
        _sum_beyond(2),
    ),
    Excuse(
        "a group's centred squares (x - mean)**2 beyond its accumulator's range",
        lambda name: name.operator in summing_apis("centred"),
        _centred_beyond,
    ),
    Excuse("sum beyond its accumulator's range", lambda name: name.operator in summing_apis("sums"), _sum_beyond(1)),
    Excuse(
        "x - max(x) beyond the dtype's range", lambda name: name.operator in summing_apis("shifted"), _shifted_beyond
    ),
    Excuse(
        "a gate's products beyond the dtype's range",
        lambda name: name.operator in summing_apis("products"),
        _products_beyond,
    ),
    Excuse(
        "attention scores q k^T scale beyond the dtype's range",
        lambda name: name.operator in summing_apis("scores"),
        _scores_beyond,
    ),
    Excuse("terms of its sums of products beyond the dtype's range", has_terms, _terms_beyond),
    Excuse(
        "g - sum(g * y) of a softmax-like backward beyond the dtype's range",
        lambda name: name.direction == "backward" and name.operator in summing_apis("shifted_gradient"),
        _shifted_gradient_beyond,
    ),
    Excuse(
        "a norm it divides by beyond the dtype's range",
        lambda name: bool(normed_arguments(name.operator)),
        _norm_beyond,
    ),
    Excuse(
        "an intermediate of its backward's formula (derivatives.yaml) beyond the dtype's range or below its normal values",
        lambda name: name.direction == "backward" and name.operator in BACKWARD_INTERMEDIATES,
        _backward_intermediate_beyond,
    ),
    Excuse("derivative beyond the dtype's range", lambda name: name.direction == "backward", _derivative_beyond),
)


def _derivative(replayed: Replayed, framework: str) -> tuple[Nested, ...]:
    """The gradients for unit incoming gradients: the derivative itself (a correct
    kernel computes it before it multiplies by the incoming gradient)."""
    inputs = replayed.results.inputs
    unit = dataclasses.replace(inputs, grads=[None if g is None else torch.ones_like(g) for g in inputs.grads or []])
    return tuple(evaluated(replayed.bench, "backward", unit, framework) or ())


def _magnitude(values: torch.Tensor, with_infinities: bool) -> float:
    """The largest |value|, infinities counted or left out; NaN never counts (0 where
    nothing does)."""
    if not values.is_floating_point():
        return float(values.abs().max()) if values.numel() else 0.0
    counted = values[~torch.isnan(values) if with_infinities else torch.isfinite(values)]
    return float(counted.abs().max()) if counted.numel() else 0.0


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
