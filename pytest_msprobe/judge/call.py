"""Check one dumped call end to end: read its record, decode its inputs, replay it on
every side and judge it. The pytest item only turns the result into an outcome."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeAlias

from pytest_msprobe.dump.index import CallName, DumpIndex, parse_call_name
from pytest_msprobe.dump.values import DecodeContext
from pytest_msprobe.errors import CallError, CallSkip
from pytest_msprobe.judge.written import Written, cut, cut_results, written
from pytest_msprobe.run.apis import Api, resolve_pytorch
from pytest_msprobe.run.devices import Backend
from pytest_msprobe.run.groups import groups_of
from pytest_msprobe.run.precision import BenchSite, bench_site, lowered_precision, strict_float32
from pytest_msprobe.run.replay import (
    Inputs,
    Placement,
    Results,
    Run,
    Side,
    bench_dtypes,
    decode_backward,
    decode_forward,
    evaluated,
    replay,
    saved_in_device_dtype,
)
from pytest_msprobe.run.summed import summed_route, sums_contributions
from pytest_msprobe.run.terms import term_counts, term_magnitudes

if TYPE_CHECKING:
    import torch

    from pytest_msprobe.dump.dataflow import Read
    from pytest_msprobe.dump.index import Record
    from pytest_msprobe.dump.values import Value
    from pytest_msprobe.judge.findings import Finding
    from pytest_msprobe.judge.layouts import LayoutReferences
    from pytest_msprobe.judge.offline import Evidence
    from pytest_msprobe.judge.shares import Share
    from pytest_msprobe.run.mindspore.replay import MindsporeReplay
    from pytest_msprobe.standards import Registry, Verdict


@dataclass(frozen=True)
class Settings:
    """Everything a call's check depends on besides its record."""

    backend: Backend
    device_index: int
    max_elements: int
    registry: Registry
    device_request: str = "auto"  # --msprobe-device as given (MindSpore picks its own target on auto)
    offline: bool = False  # the dumped outputs are the device result
    baseline: BaselineMetrics | None = None  # recorded metrics to judge against
    # verdict statuses whose outputs keep a sample of elements for the HTML report
    # (judge/samples.py); empty: none is taken and nothing is computed
    sample_statuses: frozenset[str] = frozenset()
    repeat: int = 1  # --msprobe-repeat: device runs compared bit for bit (judge/repeat.py); 1: one run


SUMMED_LABEL = "a backward that sums overlapping contributions (run/summed.py)"

#: a baseline's recorded metrics of a call: {output path: {metric: value}} (standards' reference=)
Recorded: TypeAlias = dict[str, dict[str, float]]


class BaselineMetrics(Protocol):
    """The recorded metrics calls are judged against: judge/baseline.py's Baseline."""

    def reference_for(self, dump: str, call: str) -> Recorded | None: ...

    def labelled(self, verdict: Verdict, dump: str, call: str) -> Verdict: ...


class Framework(Protocol):
    """How a dump's framework resolves and runs its calls: PytorchReplay below, MindSpore's
    MindsporeReplay (run/mindspore/replay.py)."""

    smallest_size: int  # the smallest size its kernels take (exploration's neighbourhood)

    def resolve(self, name: CallName, backend: Backend) -> Api: ...

    def runs(self, api: Api, inputs: Inputs, settings: Settings) -> tuple[Side, Side, Side | None]: ...

    def reference_in_dump_dtype(self, api: Api, settings: Settings) -> Side: ...


@dataclass
class CallResult:
    name: CallName | str  # a str names what was judged besides a dumped call (`<call>.explore`)
    verdict: Verdict
    device: str
    origins: list[str]
    samples: list[Record] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)  # lines the report adds after the inputs
    findings: list[Finding] = dataclasses.field(default_factory=list)  # repeat, overflow


def read_inputs(index: DumpIndex, name: CallName, max_elements: int) -> Inputs:
    """Decode the inputs of a call (a backward call needs its forward's record)."""
    ctx = DecodeContext(index.tensor_dir, index.task, name.call, max_elements)
    entry = index.entry(str(name))
    if entry is None:
        raise CallError(f"{name} is not in {index.path}")
    record = index.read_record(entry)
    if name.direction == "forward":
        return decode_forward(record, ctx)
    forward_entry = index.entry(str(name.sibling("forward")))
    if forward_entry is None:
        raise CallSkip(f"{name} has no forward record {name.sibling('forward')} in the dump: its inputs are unknown")
    return decode_backward(index.read_record(forward_entry), record, ctx)


class PytorchReplay:
    """How a PyTorch call runs: torch functions on the device under test, on the CPU
    bench at raised precision and, where the device is an accelerator, on the CPU in
    the device dtype as an independent reference."""

    smallest_size = 0  # torch's kernels take empty tensors (exploration may make one)

    def resolve(self, name: CallName, backend: Backend) -> Api:
        return resolve_pytorch(name, backend.find_op if backend.name == "npu" else None)

    def runs(self, api: Api, inputs: Inputs, settings: Settings) -> tuple[Run, Run, Run | None]:
        import torch

        backend = settings.backend
        cpu = torch.device("cpu")
        device = Run(api, api.device_fn, Placement(backend.torch_device(settings.device_index)), backend.synchronize)
        dtypes = bench_dtypes(inputs, api.raise_bench)
        site = self.bench_site(api, inputs, settings, dtypes)
        if site.accelerator:  # float16/bfloat16 in strict float32 on the accelerator (run/precision.py)
            bench = Run(
                api,
                api.raised_bench_fn,
                Placement(backend.torch_device(settings.device_index), dtypes),
                backend.synchronize,
                context=functools.partial(strict_float32, backend.name),
                site=site.label,
            )
        else:
            bench = Run(api, api.raised_bench_fn, Placement(cpu, dtypes), site=site.label)
        reference = Run(api, api.bench_fn, Placement(cpu)) if backend.name != "cpu" else None
        return device, bench, reference

    def bench_site(self, api: Api, inputs: Inputs, settings: Settings, dtypes: dict[torch.dtype, torch.dtype]) -> BenchSite:
        """Where this call's bench runs: run/precision.py's rule."""
        import torch

        if settings.backend.name == "cpu":
            return BenchSite(False, "")
        leaves = [leaf.tensor for leaf in inputs.leaves if leaf.tensor.dtype.is_floating_point]
        floating = {tensor.dtype for tensor in leaves}
        low = sorted(floating & {torch.float16, torch.bfloat16}, key=str)
        api_type, api_name = api.name.split(".", 1)
        standard = settings.registry.standard_for(CallName(api_type, api_name, 0, "forward").operator, low[0]) if low else ""
        return bench_site(
            settings.backend.name,
            f"{settings.backend.name}:{settings.device_index}",
            api.name,
            dtypes,
            floating,
            standard,
            sum(tensor.numel() for tensor in leaves),
        )

    def reference_in_dump_dtype(self, api: Api, settings: Settings) -> Run:
        """Offline, the reference: torch's CPU kernel in the dump's dtypes."""
        import torch

        return Run(api, api.bench_fn, Placement(torch.device("cpu")))


def _mindspore_replay() -> MindsporeReplay:
    from pytest_msprobe.run.mindspore.replay import MindsporeReplay

    return MindsporeReplay()


# framework of a dump -> how its calls are resolved and run (created on first use).
FRAMEWORKS: dict[str, Callable[[], Framework]] = {"pytorch": PytorchReplay, "mindspore": _mindspore_replay}


@dataclass
class Replayed:
    """A call run on every side, as its test judges it."""

    results: Results
    bench: Side  # the bench run (its re-judgements run it again)
    label: str  # what the device was
    device: Side  # the device run (--msprobe-repeat runs it again); offline the dump's outputs
    written: Written | None = None  # the rows the kernel wrote, where it wrote part of an output (judge/written.py)
    notes: list[str] = dataclasses.field(default_factory=list)  # the rows left out of the judgement
    layouts: LayoutReferences | None = None  # offline: the reference in the other layouts (judge/layouts.py)


def replay_call(index: DumpIndex, name: CallName, settings: Settings) -> Replayed:
    """Decode the call and run it on the device (offline: the dump's outputs), the bench
    and the reference. Raises CallSkip, CallError or replay.DeviceFailed."""
    framework = FRAMEWORKS[index.framework]()
    api = framework.resolve(name, settings.backend)
    inputs = read_inputs(index, name, settings.max_elements)
    dumped = offline_runs(index, name, api, settings, framework) if settings.offline else None
    return replay_inputs(index.framework, framework, name, api, inputs, settings, dumped)


def replay_inputs(
    framework_name: str,
    framework: Framework,
    name: CallName,
    api: Api,
    inputs: Inputs,
    settings: Settings,
    dumped: tuple[Side, Side, str] | None = None,
) -> Replayed:
    """Run decoded inputs on every side: the dumped call's, or inputs made near them
    (judge/explore.py). `dumped`: offline_runs' device, reference and label."""
    device, bench, reference = framework.runs(api, inputs, settings)
    label = settings.backend.describe(settings.device_index)
    if dumped is not None:
        device, reference, label = dumped
    try:
        results = replay(name.direction, api, inputs, device, bench, reference, framework=framework_name)
    finally:
        settings.backend.free()
    layouts = None
    if dumped is not None:
        from pytest_msprobe.judge.layouts import LayoutReferences, other_layouts
        from pytest_msprobe.judge.offline import DumpedRun

        if isinstance(device, DumpedRun) and device.evidence is not None and device.evidence.shared:
            _add_shared(results, device.evidence, device.index, name, framework_name, framework, settings, bench)
        elif isinstance(reference, Run):
            others = other_layouts(api, (leaf.tensor for leaf in results.inputs.leaves))
            layouts = LayoutReferences(reference, results.inputs, name.direction, framework_name, others) if others else None
    where = written(name, inputs, framework_name)
    results, notes = cut_results(align_offline(results) if dumped is not None else results, where)
    return Replayed(results, bench, label, device, where, notes, layouts)


def check_call(index: DumpIndex, name: CallName, settings: Settings) -> CallResult:
    """Raises CallSkip, CallError or replay.DeviceFailed; otherwise the verdict."""
    replayed = replay_call(index, name, settings)
    results, bench, label, inputs = replayed.results, replayed.bench, replayed.label, replayed.results.inputs
    recorded = settings.baseline.reference_for(index.key, str(name)) if settings.baseline is not None else None
    verdict, judged = judged_results(
        settings.registry, name, results, bench=bench, framework=index.framework, recorded=recorded, layouts=replayed.layouts
    )
    if recorded is not None and settings.baseline is not None:  # recorded: read from the baseline
        verdict = settings.baseline.labelled(verdict, index.key, str(name))
    site = getattr(bench, "site", "")  # where the bench ran, on an accelerator (run/precision.py)
    if site:
        verdict = relabelled(verdict, site)
    samples: list[Record] = []
    if settings.sample_statuses:  # only for the HTML report: no cost without it
        from pytest_msprobe.judge.samples import element_samples

        try:
            samples = element_samples(judged.bench, judged.device, verdict, settings.sample_statuses)
        except Exception as exc:  # noqa: BLE001 - the report says so; the verdict stands
            samples = [{"error": f"no element sample: {type(exc).__name__}: {exc}"}]
    findings = call_findings(replayed, name, index.framework, settings)
    notes = replayed.notes
    evidence = getattr(replayed.device, "evidence", None)
    if evidence is not None and evidence.origins:  # gradients recovered from the dump (judge/offline.py)
        verdict = relabelled(verdict, f"gradients recovered from the dump: {evidence.how}")
        notes = [*notes, *(f"not judged: {why}" for why in evidence.left_out)]
    if verdict.status == "error" and not settings.offline:  # offline, the device's run is the dump's
        lowered = lowered_precision(settings.backend.name, failing_dtypes(verdict))
        if lowered:
            notes = [*notes, "the device computed in lowered precision, by its own settings: " + "; ".join(lowered)]
    return CallResult(name, verdict, label, inputs.origins, samples, notes=notes, findings=findings)


def failing_dtypes(verdict: Verdict) -> set[str]:
    """The device dtypes of the outputs judged error."""
    return {leaf.device_dtype for leaf in verdict.outputs or (verdict,) if leaf.status == "error"}


def call_findings(replayed: Replayed, name: CallName, framework: str, settings: Settings) -> list[Finding]:
    """The checks beside the standards: the overflow re-check and a dropout's dropped
    share (every run) and, with
    --msprobe-repeat, the device's bits over several runs (then its memory is freed)."""
    from pytest_msprobe.judge.findings import dropout_findings
    from pytest_msprobe.judge.overflow import overflow_findings
    from pytest_msprobe.judge.repeat import repeat_findings

    cut_outputs = replayed.written.rows if replayed.written is not None else {}
    found = overflow_findings(replayed.results, replayed.bench, name.direction, framework, cut_outputs)
    found += dropout_findings(replayed.results, name)
    if settings.repeat > 1:
        try:
            found += repeat_findings(replayed.device, replayed.results, name.direction, framework, settings.repeat, replayed.written)
        finally:
            settings.backend.free()
    return found


def verdict_for(
    registry: Registry, name: CallName, results: Results, *, bench: Side, framework: str, recorded: Recorded | None = None
) -> Verdict:
    """judged_results' verdict."""
    return judged_results(registry, name, results, bench=bench, framework=framework, recorded=recorded)[0]


def judged_results(
    registry: Registry,
    name: CallName,
    results: Results,
    *,
    bench: Side,
    framework: str,
    recorded: Recorded | None = None,
    layouts: LayoutReferences | None = None,
) -> tuple[Verdict, Results]:
    """_judged_against_reference(); a call it judges error against the contiguous
    reference run is judged again against the reference in each other memory layout the
    device may have run (judge/layouts.py), and the least severe verdict stands (one
    layout's reference at a time: their metrics are never mixed); where every layout's
    is an error, the contiguous one's does, saying so."""
    verdict, judged = _judged_against_reference(registry, name, results, bench, framework, recorded)
    if verdict.status != "error" or layouts is None or recorded is not None or results.reference is None:
        return verdict, judged
    from pytest_msprobe.standards.verdict import STATUS_ORDER

    others = {
        layout: _judged_against_reference(registry, name, dataclasses.replace(results, reference=reference), bench, framework, None)
        for layout, reference in layouts.outputs(results.reference).items()
    }
    least = min(others, key=lambda layout: STATUS_ORDER[others[layout][0].status], default=None)
    if least is None:
        return verdict, judged
    again, on = others[least]
    if STATUS_ORDER[again.status] < STATUS_ORDER[verdict.status]:
        return relabelled(again, f"against the reference run in {least} layout (the device may have run it)"), on
    return relabelled(verdict, f"an error against the reference run in {' and '.join(others)} layout too"), judged


def _judged_against_reference(
    registry: Registry, name: CallName, results: Results, bench: Side, framework: str, recorded: Recorded | None
) -> tuple[Verdict, Results]:
    """judge(); a call judged error whose outputs are sums of products is judged again
    with each element's terms' magnitude (run/terms.py: one more bench evaluation, only
    here); and a backward call still judged error without a reference run (by the
    single-run rule, or against a baseline whose metrics may come from the same
    re-judgement) is judged again against the bench that saves its forward results in
    the device dtype. -> the verdict, and the results it was reached on (their bench is
    the re-judgement's where that verdict stands): what the report's samples show."""
    groups = groups_of(name, bench, results.inputs)
    verdict = judge(registry, name, results, recorded, groups=groups)
    if verdict.status != "error":
        return verdict, results
    route = name.operator
    if sums_contributions(name, bench, results.inputs, framework):  # run/summed.py
        route = summed_route(name)
        verdict = relabelled(judge(registry, name, results, recorded, groups=groups, route=route), SUMMED_LABEL)
        if verdict.status != "error":
            return verdict, results
    where = written(name, results.inputs, framework)  # re-evaluations are cut as the results were
    terms = _aligned(term_magnitudes(name, bench, results.inputs, framework), results.bench)
    if terms is not None and where is not None:
        terms = cut(terms, where)
    if terms is not None:
        conditioned = judge(registry, name, results, recorded, terms, groups, route)
        if conditioned.status != "error":
            return relabelled(conditioned, "conditioned on the terms' magnitudes"), results
    if name.direction == "backward" and results.reference is None:
        again = _against_saved_in_device_dtype(registry, name, results, bench, framework, recorded, terms, groups, route)
        if again is not None:
            return again
    return verdict, results


def _aligned(terms: Value, bench: Value) -> Value:
    """The terms with the bench's structure: None where offline alignment left a
    gradient out of the comparison."""
    if isinstance(terms, tuple) and isinstance(bench, tuple) and len(terms) == len(bench):
        return tuple(None if b is None else t for t, b in zip(terms, bench, strict=True))
    return terms


def relabelled(verdict: Verdict, how: str) -> Verdict:
    """The verdict, its reference (and its outputs') saying how it was reached."""
    outputs = tuple(relabelled(output, how) for output in verdict.outputs)
    return dataclasses.replace(verdict, reference=f"{verdict.reference}, {how}", outputs=outputs)


def _against_saved_in_device_dtype(
    registry: Registry,
    name: CallName,
    results: Results,
    bench: Side,
    framework: str,
    recorded: Recorded | None,
    terms: Value = None,
    groups: torch.Tensor | None = None,
    route: str | None = None,
) -> tuple[Verdict, Results] | None:
    """The verdict against replay.saved_in_device_dtype's bench, with those results, if
    it is not an error there, else None (the error against the plain bench stands)."""
    inputs = results.inputs
    saved_in_d = saved_in_device_dtype(bench, inputs) if isinstance(bench, Run) else None
    if saved_in_d is None:
        return None
    grads = evaluated(saved_in_d, "backward", inputs, framework)
    if grads is None:
        return None  # the plain bench's error stands
    where = written(name, inputs, framework)
    if where is not None:
        grads = cut(grads, where)
    again = dataclasses.replace(results, bench=grads)
    verdict = judge(registry, name, again, recorded, terms, groups, route)
    if verdict.status == "error":
        return None
    saved_in = saved_in_d.saved_in
    assert saved_in is not None  # saved_in_device_dtype's bench saves in the device's dtype
    return relabelled(verdict, f"forward results saved in {str(saved_in[1]).removeprefix('torch.')}"), again


def offline_runs(index: DumpIndex, name: CallName, api: Api, settings: Settings, framework: Framework) -> tuple[Side, Side, str]:
    """The dump's own outputs as the device; as the reference, the dump's framework on
    the CPU in the dump's dtypes (a MindSpore kernel is held to MindSpore's CPU kernel,
    not to torch's, as online). Which inputs a dumped gradient belongs to is read from
    torch's autograd graph of the call (offline.node_edges)."""
    import torch

    from pytest_msprobe.judge.offline import DEVICE_LABEL, DumpedRun

    graph_run = Run(api, api.bench_fn, Placement(torch.device("cpu")))
    return DumpedRun(index, name, settings.max_elements, graph_run), framework.reference_in_dump_dtype(api, settings), DEVICE_LABEL


def _add_shared(
    results: Results,
    evidence: Evidence,
    index: DumpIndex,
    name: CallName,
    framework_name: str,
    framework: Framework,
    settings: Settings,
    bench_side: Side,
) -> None:
    """Where autograd summed a recovered input gradient over several calls reading the
    same output, the bench and the reference sum those calls' gradients too: the
    device's, where a call's record holds its input's gradient, else each run on its
    own dumped inputs and incoming gradients (_share_of). Both accumulate them as autograd
    does: each gradient in the dump's dtype D (the bench's rounded to D, as a correct
    kernel returns it), added in D in the order the dump recorded the calls' backwards.
    That rounding is autograd's, not the kernel's: against an exact sum, the sum's
    cancellation would count it as the kernel's error (on a bfloat16 dump, 12% of a
    correct linear's input gradient over 1 ULP). A composite reader's rerun share the
    device added in pieces, another grouping: the device and the reference are judged
    beyond each element's allowance for that (judge/shares.py), as where this call's own
    graph adds its share in pieces. A call that cannot be run leaves the input out of
    the comparison, named; so does a sum the reference cannot rebuild within rounding
    of the dumped one (judge/shares.py rebuild_check: a reader the dump does not hold)."""
    import numpy as np
    import torch

    from pytest_msprobe.judge.shares import Kind, Share, accumulated, beyond, rebuild_bound, rebuild_check

    device, bench = list(results.device), list(results.bench)
    reference = list(results.reference) if isinstance(results.reference, tuple) else None
    own_spread = _own_spread(name, bench_side, results.inputs, framework_name)
    for shared in evidence.shared:
        pieces = _pieces(bench_side, results.inputs, framework_name, shared.position)
        own = Share(shared.own, bench[shared.position], None if reference is None else reference[shared.position], Kind.OWN, pieces)
        parts = [(_backward_order(index, name.call), own)]
        composite: set[str] = set()
        try:
            for other in shared.others:
                share = _share_of(index, other, framework_name, framework, settings)
                parts.append((_backward_order(index, other.consumer.call), share))
                if len(share.pieces) > 1:
                    composite.add(other.consumer.call)
        except (CallSkip, CallError) as exc:
            device[shared.position] = None
            evidence.left_out.append(f"the gradient shared with {', '.join(o.consumer.call for o in shared.others)}: {exc}")
            continue
        parts.sort(key=lambda part: part[0])
        shares = [share for _, share in parts]
        dtype = device[shared.position].dtype
        positions = torch.from_numpy(np.ascontiguousarray(shared.own.reshape(-1)))
        allowance = None
        for side, column in (("bench", bench), ("reference", reference)):
            if column is not None and column[shared.position] is not None:
                summed = accumulated(shares, shared.producer_numel, dtype, side)
                column[shared.position] = summed.total[positions].reshape(shared.own.shape).to(column[shared.position].dtype)
                if side == "bench":  # the reference's partial sums are within its own rounding of these
                    allowance, rounding = summed.allowance[positions], summed.rounding[positions]
        rebuilt = reference if reference is not None and reference[shared.position] is not None else bench
        spread = own_spread(shared.position)
        if allowance is not None and rebuilt[shared.position] is not None and spread is not None:
            bound = rebuild_bound(rounding, allowance, spread[0].reshape(-1), spread[1].reshape(-1), dtype)
            disagreement = rebuild_check(device[shared.position], rebuilt[shared.position], bound)
            if disagreement is not None:
                device[shared.position] = None
                readers = ", ".join(sorted({name.call, *(o.consumer.call for o in shared.others)}))
                evidence.left_out.append(
                    f"the gradient {shared.producer} recorded is not the sum of its readers' gradients ({readers}) as the reference "
                    f"rebuilds it: {disagreement}; a reader the dump does not hold (an op msprobe "
                    "does not record: a cast, a slice, a repeat) added a share no dumped call names, or a share is mapped wrongly"
                )
                continue
        if allowance is not None and bool((allowance > 0).any()):
            centre = bench[shared.position]
            device[shared.position] = beyond(device[shared.position], centre, allowance)
            if reference is not None and reference[shared.position] is not None:
                reference[shared.position] = beyond(reference[shared.position], centre, allowance)
            evidence.origins.append(_allowance_note(sorted(composite), len(pieces), allowance, centre, dtype))
    if all(grad is None for grad in device):
        raise CallSkip(f"no input gradient could be judged: {'; '.join(evidence.left_out)}")
    results.device, results.bench = tuple(device), tuple(bench)
    if reference is not None:
        results.reference = tuple(reference)


def _own_spread(
    name: CallName, bench: Side, inputs: Inputs, framework_name: str
) -> Callable[[int], tuple[torch.Tensor, torch.Tensor] | None]:
    """For the rebuild check (judge/shares.py): per gradient-receiving input, how many
    terms the call's own share sums and their magnitude, from the bench evaluated on ones
    and on absolute values; None where the API's gradients are not sums of products
    (run/terms.py term_counts), which bounds no correct kernel's share: no check there."""
    import torch

    counts, terms = term_counts(name, bench, inputs, framework_name), term_magnitudes(name, bench, inputs, framework_name)

    def spread(position: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        found = [value[position] if isinstance(value, tuple) and len(value) > position else None for value in (counts, terms)]
        count, magnitude = found
        return (count, magnitude) if isinstance(count, torch.Tensor) and isinstance(magnitude, torch.Tensor) else None

    return spread


def _backward_order(index: DumpIndex, call: str) -> int:
    entry = index.entry(f"{call}.backward")
    return -1 if entry is None else index.position_of(f"{call}.backward")


def _share_of(index: DumpIndex, read: Read, framework_name: str, framework: Framework, settings: Settings) -> Share:
    """Another call's share of a summed gradient, for the bench's and the reference's
    sums: the device's own gradient of its input where that call's record holds it (the
    share autograd added on the device: that call's own test judges it, and its kernel's
    rounding in D, several ULPs of a cancelled sum, is not this call's error; fp16 and
    bf16 apizoo matmuls failed at ratio 1 to a reference with the same rounding); else
    its bench and reference gradients, with the pieces the bench's graph added (the
    device added them one by one: judge/shares.py); none (no share in the sum) where the
    dump has no backward of it: no gradient reached its output."""
    import torch

    from pytest_msprobe.judge.offline import DumpedRun
    from pytest_msprobe.judge.shares import Kind, Share
    from pytest_msprobe.run.replay import needs_grad

    call, data_name = read.consumer.call, read.consumer.data_name
    name = parse_call_name(f"{call}.backward")
    if name is None:
        raise CallSkip(f"{call} is not an API call's name")
    if index.entry(str(name)) is None:
        return Share(read.gather, None, None, Kind.RECORDED)
    inputs = read_inputs(index, name, settings.max_elements)
    api = framework.resolve(name, settings.backend)
    _, bench, _ = framework.runs(api, inputs, settings)
    reference = framework.reference_in_dump_dtype(api, settings)
    flags = needs_grad(inputs, framework_name)
    forward_leaves = [leaf for leaf in inputs.leaves if not leaf.path.startswith("backward.")]
    wanted = [leaf.spec.data_name for leaf, flag in zip(forward_leaves, flags, strict=False) if flag]
    if data_name not in wanted:
        raise CallSkip(f"{call} did not take a gradient for {data_name}")
    slot = wanted.index(data_name)
    try:
        recorded = DumpedRun(index, name, settings.max_elements, Run(api, api.bench_fn, Placement(torch.device("cpu"))))
        device = recorded.direct_gradient(inputs, flags, slot)
    except (CallSkip, CallError):
        device = None
    if device is not None:
        return Share(read.gather, device, device, Kind.RECORDED)
    try:
        bench_grads, reference_grads = bench.backward(inputs, flags), reference.backward(inputs, flags)
    except CallSkip:
        raise
    except Exception as exc:  # noqa: BLE001 - that call's own test reports it; here the sum cannot be made
        raise CallSkip(f"{call}'s backward does not run on the bench: {type(exc).__name__}: {exc}") from exc
    return Share(read.gather, bench_grads[slot], reference_grads[slot], Kind.RERUN, _pieces(bench, inputs, framework_name, slot))


def _pieces(bench: Side, inputs: Inputs, framework_name: str, slot: int) -> list[torch.Tensor]:
    """The pieces a call's graph adds into its gradient-receiving input `slot`
    (run/summed.py gradient_pieces); none where the bench is not a torch run or its graph
    cannot be read (the share then counts as one piece)."""
    from pytest_msprobe.run.replay import needs_grad
    from pytest_msprobe.run.summed import gradient_pieces

    if not isinstance(bench, Run):
        return []
    try:
        return gradient_pieces(bench, inputs, needs_grad(inputs, framework_name), slot)
    except Exception:  # noqa: BLE001 - the call's own backward ran; without its graph the share is one piece
        return []


def _allowance_note(composite: list[str], own_pieces: int, allowance: torch.Tensor, bench: torch.Tensor, dtype: torch.dtype) -> str:
    """What the verdict's reference says of the allowance: whose shares, how many elements
    and how wide, in ULPs of D at the bench's value."""
    import torch

    from pytest_msprobe.judge.shares import ulp

    widths = (allowance / ulp(bench.reshape(-1).double(), dtype))[allowance > 0]
    whose = [f"the composite shares of {', '.join(composite)} are not in the dump (rerun on the bench)"] if composite else []
    whose += [f"this call's own graph adds its share in {own_pieces} pieces"] if own_pieces > 1 else []
    return (
        f"{' and '.join(whose)}: the device added them in another grouping; device and reference judged beyond each "
        f"element's rounding allowance for it ({int(widths.numel())} elements, median {float(torch.median(widths)):.2g} ULP, "
        f"max {float(widths.max()):.2g} ULP)"
    )


def align_offline(results: Results) -> Results:
    """Leave out of the comparison what the dump could not pair (a gradient without a
    matching dumped one); give a single dumped output the bench's tuple shape."""
    device, bench = results.device, results.bench
    if isinstance(bench, tuple) and not isinstance(device, tuple):
        device = (device,)
    if isinstance(bench, tuple) and isinstance(device, tuple) and len(bench) == len(device):
        bench = tuple(None if d is None else b for b, d in zip(bench, device, strict=True))
        if isinstance(results.reference, tuple) and len(results.reference) == len(device):
            results.reference = tuple(None if d is None else r for r, d in zip(results.reference, device, strict=True))
    results.device, results.bench = device, bench
    return results


def judge(
    registry: Registry,
    name: CallName,
    results: Results,
    recorded: Recorded | None = None,
    terms: Value = None,
    groups: torch.Tensor | None = None,
    route: str | None = None,
) -> Verdict:
    """The verdict against the bench; against recorded baseline metrics when given,
    else against the reference run where there is one; conditioned on the elements'
    terms' magnitudes when given; the bias tests counting the groups of elements that
    share a rounded normaliser when given (run/groups.py); by the standard of `route`
    (default: the call's API)."""
    reference = recorded if recorded is not None else results.reference
    api = route or name.operator
    return registry.check(results.bench, results.device, api=api, reference=reference, terms=terms, groups=groups)
