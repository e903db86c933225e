"""Check one dumped call end to end: read its record, decode its inputs, replay it on
every side and judge it (judge/verdict/judgement.py: the verdict and its re-judgements). The
pytest item only turns the result into an outcome."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from pytest_msprobe.dump.index import CallName, DumpIndex, parse_call_name
from pytest_msprobe.dump.values import DecodeContext
from pytest_msprobe.errors import CallError, CallSkip
from pytest_msprobe.judge.verdict.judgement import Judgement, Recorded, judge_and_rejudge, relabel
from pytest_msprobe.judge.verdict.written_rows import Written, cut_results, written
from pytest_msprobe.run.apis import Api, resolve_pytorch
from pytest_msprobe.run.devices import Backend
from pytest_msprobe.run.precision import BenchCall, BenchSite, bench_site, lowered_precision, strict_float32
from pytest_msprobe.run.replay import (
    Inputs,
    Placement,
    Results,
    Run,
    Side,
    Sides,
    bench_dtypes,
    decode_inputs,
    replay,
)

if TYPE_CHECKING:
    import torch

    from pytest_msprobe.dump.dataflow import Read
    from pytest_msprobe.dump.index import Record
    from pytest_msprobe.judge.defects.table import KnownDefect
    from pytest_msprobe.judge.findings.finding import Finding
    from pytest_msprobe.judge.findings.overflow_modes import StatedMode
    from pytest_msprobe.judge.offline.dumped_run import DumpedRun
    from pytest_msprobe.judge.offline.layouts import LayoutReferences
    from pytest_msprobe.judge.offline.missing_shares import Share
    from pytest_msprobe.judge.verdict.record import Sample
    from pytest_msprobe.run.mindspore.replay import MindsporeReplay
    from pytest_msprobe.run.replay import Inputs
    from pytest_msprobe.standards import Registry, Verdict
    from pytest_msprobe.standards.verdict import Status


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
    # (judge/check/samples.py); empty: none is taken and nothing is computed
    sample_statuses: frozenset[Status] = frozenset()
    repeat: int = 1  # --msprobe-repeat: device runs compared bit for bit (judge/findings/repeat.py); 1: one run
    detail: int = 0  # how much a failure's text shows in the terminal: Verdict.message's detail (-v, -vv)
    overflow_mode: StatedMode | None = None  # the device's overflow mode where known (judge/findings/overflow_modes.py)


class BaselineMetrics(Protocol):
    """The recorded metrics calls are judged against: judge/gate/baseline.py's Baseline."""

    def reference_for(self, dump: str, call: str) -> Recorded | None: ...

    def label_verdict(self, verdict: Verdict, dump: str, call: str) -> Verdict: ...


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
    samples: list[Sample] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)  # lines the report adds after the inputs
    findings: list[Finding] = dataclasses.field(default_factory=list)  # repeat, overflow
    known: KnownDefect | None = None  # the known library defect an error matches (judge/defects/table.py)
    inputs: Inputs | None = None  # the decoded arguments, every one of which a failure's message lists


@dataclass
class Replayed:
    """A call run on every side, as its test judges it."""

    results: Results
    bench: Side  # the bench run (its re-judgements run it again)
    label: str  # what the device was
    device: Side  # the device run (--msprobe-repeat runs it again); offline the dump's outputs
    written: Written | None = (
        None  # the rows the kernel wrote, where it wrote part of an output (judge/verdict/written_rows.py)
    )
    notes: list[str] = dataclasses.field(default_factory=list)  # the rows left out of the judgement
    layouts: LayoutReferences | None = None  # offline: the reference in the other layouts (judge/offline/layouts.py)


def check_call(index: DumpIndex, name: CallName, settings: Settings) -> CallResult:
    """Raises CallSkip, CallError or replay.DeviceFailed; otherwise the verdict."""
    from pytest_msprobe.judge.findings.overflow_modes import UNKNOWN, for_judgement, mode_findings, shown_modes

    replayed = replay_call(index, name, settings)
    results, bench = replayed.results, replayed.bench
    recorded = settings.baseline.reference_for(index.key, str(name)) if settings.baseline is not None else None
    stated, shown = settings.overflow_mode or UNKNOWN, shown_modes(results)
    judgement = judge_and_rejudge(
        Judgement(
            settings.registry,
            name,
            for_judgement(results, shown, stated),
            bench,
            index.framework,
            recorded,
            replayed.layouts,
        )
    )
    verdict = judgement.require_verdict()
    if recorded is not None and settings.baseline is not None:  # recorded: read from the baseline
        verdict = settings.baseline.label_verdict(verdict, index.key, str(name))
    site = getattr(bench, "site", "")  # where the bench ran, on an accelerator (run/precision.py)
    if site:
        verdict = relabel(verdict, site)
    samples = _samples(judgement, verdict, settings)
    known = known_of(judgement, settings)
    findings = call_findings(replayed, name, index.framework, settings) + mode_findings(shown, stated)
    notes = replayed.notes
    evidence = getattr(replayed.device, "evidence", None)
    if evidence is not None and evidence.origins:  # gradients recovered from the dump (judge/offline/dumped_run.py)
        verdict = relabel(verdict, f"gradients recovered from the dump: {evidence.how}")
        notes = [*notes, *(f"not judged: {why}" for why in evidence.left_out)]
    if verdict.status == "error" and not settings.offline:  # offline, the device's run is the dump's
        lowered = lowered_precision(settings.backend.name, failing_dtypes(verdict))
        if lowered:
            notes = [*notes, "the device computed in lowered precision, by its own settings: " + "; ".join(lowered)]
    return CallResult(
        name,
        verdict,
        replayed.label,
        results.inputs.origins,
        samples,
        notes=notes,
        findings=findings,
        known=known,
        inputs=results.inputs,
    )


def known_of(judgement: Judgement, settings: Settings) -> KnownDefect | None:
    """The known library defect a call judged error matches (judge/defects/table.py); none,
    and nothing imported or measured, for any other call. Offline the device is the
    dump's outputs, of a device the run does not know: no library's row matches them."""
    if not judgement.error:
        return None
    from pytest_msprobe.judge.defects.table import known_defect

    return known_defect(judgement, "dumped" if settings.offline else settings.backend.name)


def _samples(judgement: Judgement, verdict: Verdict, settings: Settings) -> list[Sample]:
    """The elements the HTML report plots, of the results the verdict was reached on;
    none without the report (no cost)."""
    if not settings.sample_statuses:
        return []
    from pytest_msprobe.judge.check.samples import element_samples

    try:
        return [*element_samples(judgement.results.bench, judgement.results.device, verdict, settings.sample_statuses)]
    except Exception as exc:  # noqa: BLE001 - the report says so; the verdict stands
        return [{"error": f"no element sample: {type(exc).__name__}: {exc}"}]


def failing_dtypes(verdict: Verdict) -> set[str]:
    """The device dtypes of the outputs judged error."""
    return {leaf.device_dtype for leaf in verdict.outputs or (verdict,) if leaf.status == "error"}


def call_findings(replayed: Replayed, name: CallName, framework: str, settings: Settings) -> list[Finding]:
    """The checks beside the standards: the overflow re-check and a dropout's dropped
    share (every run) and, with
    --msprobe-repeat, the device's bits over several runs (then its memory is freed)."""
    from pytest_msprobe.judge.findings.finding import dropout_findings
    from pytest_msprobe.judge.findings.overflow import overflow_findings
    from pytest_msprobe.judge.findings.repeat import DeviceRun, repeat_findings

    cut_outputs = replayed.written.rows if replayed.written is not None else {}
    found = overflow_findings(replayed.results, replayed.bench, name.direction, framework, cut_outputs)
    found += dropout_findings(replayed.results, name)
    if settings.repeat > 1:
        try:
            run = DeviceRun(replayed.device, name.direction, framework)
            found += repeat_findings(run, replayed.results, settings.repeat, replayed.written)
        finally:
            settings.backend.free()
    return found


@dataclass(frozen=True)
class Resolved:
    """A dumped call resolved in its dump's framework: what every replay of it runs, on
    its dumped inputs or on inputs made near them (judge/explore/search.py)."""

    name: CallName
    framework_name: str  # the dump's framework, a key of FRAMEWORKS
    framework: Framework
    api: Api


def resolve_call(index: DumpIndex, name: CallName, settings: Settings) -> Resolved:
    framework = FRAMEWORKS[index.framework]()
    return Resolved(name, index.framework, framework, framework.resolve(name, settings.backend))


def replay_call(index: DumpIndex, name: CallName, settings: Settings) -> Replayed:
    """Decode the call and run it on the device (offline: the dump's outputs), the bench
    and the reference. Raises CallSkip, CallError or replay.DeviceFailed."""
    call = resolve_call(index, name, settings)
    inputs = read_inputs(index, name, settings.max_elements)
    dumped = offline_runs(index, call, settings) if settings.offline else None
    return replay_inputs(call, inputs, settings, dumped)


def replay_inputs(
    call: Resolved, inputs: Inputs, settings: Settings, dumped: tuple[Side, Side, str] | None = None
) -> Replayed:
    """Run decoded inputs on every side: the dumped call's, or inputs made near them
    (judge/explore/search.py). `dumped`: offline_runs' device, reference and label."""
    device, bench, reference = call.framework.runs(call.api, inputs, settings)
    label = settings.backend.describe(settings.device_index)
    if dumped is not None:
        device, reference, label = dumped
    try:
        results = replay(
            call.name.direction, call.api, inputs, Sides(device, bench, reference), framework=call.framework_name
        )
    finally:
        settings.backend.free()
    layouts = None
    if dumped is not None:
        from pytest_msprobe.judge.offline.dumped_run import DumpedRun
        from pytest_msprobe.judge.offline.layouts import LayoutReferences, other_layouts

        if isinstance(device, DumpedRun) and device.evidence is not None and device.evidence.shared:
            _add_shared(results, device, bench, call.framework, settings)
        elif isinstance(reference, Run):
            others = other_layouts(call.api, (leaf.tensor for leaf in results.inputs.leaves))
            layouts = (
                LayoutReferences(reference, results.inputs, call.name.direction, call.framework_name, others)
                if others
                else None
            )
    where = written(call.name, inputs, call.framework_name)
    results, notes = cut_results(align_offline(results) if dumped is not None else results, where)
    return Replayed(results, bench, label, device, where, notes, layouts)


def offline_runs(index: DumpIndex, call: Resolved, settings: Settings) -> tuple[Side, Side, str]:
    """The dump's own outputs as the device; as the reference, the dump's framework on
    the CPU in the dump's dtypes (a MindSpore kernel is held to MindSpore's CPU kernel,
    not to torch's, as online). Which inputs a dumped gradient belongs to is read from
    torch's autograd graph of the call (offline.node_edges)."""
    import torch

    from pytest_msprobe.judge.offline.dumped_run import DEVICE_LABEL, DumpedRun

    graph_run = Run(call.api, call.api.bench_fn, Placement(torch.device("cpu")))
    return (
        DumpedRun(index, call.name, settings.max_elements, graph_run),
        call.framework.reference_in_dump_dtype(call.api, settings),
        DEVICE_LABEL,
    )


def _add_shared(results: Results, device: DumpedRun, bench: Side, framework: Framework, settings: Settings) -> None:
    """The bench's and the reference's sums of the recovered input gradients autograd
    summed over several readers (judge/offline/summed_gradients.py); another reader's share rerun
    here (_share_of)."""
    from pytest_msprobe.judge.offline.summed_gradients import SummingCall, add_shared

    assert device.evidence is not None  # replay_inputs: its gradients were recovered
    index, name, framework_name = device.index, device.name, device.index.framework  # the dump's call
    call = SummingCall(
        index,
        name,
        bench,
        results.inputs,
        framework_name,
        lambda read: _share_of(index, read, framework_name, framework, settings),
    )
    add_shared(results, device.evidence, call)


def _share_of(index: DumpIndex, read: Read, framework_name: str, framework: Framework, settings: Settings) -> Share:
    """Another call's share of a summed gradient, for the bench's and the reference's
    sums: the device's own gradient of its input where that call's record holds it (the
    share autograd added on the device: that call's own test judges it, and its kernel's
    rounding in D, several ULPs of a cancelled sum, is not this call's error; fp16 and
    bf16 apizoo matmuls failed at ratio 1 to a reference with the same rounding); else
    its bench and reference gradients, with the pieces the bench's graph added (the
    device added them one by one: judge/offline/missing_shares.py); none (no share in the sum) where the
    dump has no backward of it: no gradient reached its output."""
    import torch

    from pytest_msprobe.judge.offline.dumped_run import DumpedRun
    from pytest_msprobe.judge.offline.missing_shares import Kind, Share
    from pytest_msprobe.judge.offline.summed_gradients import pieces_of
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
    except Exception as exc:
        raise CallSkip(f"{call}'s backward does not run on the bench: {type(exc).__name__}: {exc}") from exc
    return Share(
        read.gather,
        bench_grads[slot],
        reference_grads[slot],
        Kind.RERUN,
        pieces_of(bench, inputs, framework_name, slot),
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


def read_inputs(index: DumpIndex, name: CallName, max_elements: int) -> Inputs:
    """Decode the inputs of a call, once its records are read."""
    forward, backward = read_records(index, name)
    return decode_inputs(forward, backward, DecodeContext(index.tensor_dir, index.task, name.call, max_elements))


def read_records(index: DumpIndex, name: CallName) -> tuple[Record, Record | None]:
    """A call's forward record, and a backward call's own record (its inputs are its
    forward's)."""
    entry = index.entry(str(name))
    if entry is None:
        raise CallError(f"{name} is not in {index.path}")
    record = index.read_record(entry)
    if name.direction == "forward":
        return record, None
    forward_entry = index.entry(str(name.sibling("forward")))
    if forward_entry is None:
        raise CallSkip(f"{name} has no forward record {name.sibling('forward')} in the dump: its inputs are unknown")
    return index.read_record(forward_entry), record


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

    def bench_site(
        self, api: Api, inputs: Inputs, settings: Settings, dtypes: dict[torch.dtype, torch.dtype]
    ) -> BenchSite:
        """Where this call's bench runs: run/precision.py's rule."""
        import torch

        if settings.backend.name == "cpu":
            return BenchSite(False, "")
        leaves = [leaf.tensor for leaf in inputs.leaves if leaf.tensor.dtype.is_floating_point]
        floating = {tensor.dtype for tensor in leaves}
        low = sorted(floating & {torch.float16, torch.bfloat16}, key=str)
        api_type, api_name = api.name.split(".", 1)
        standard = (
            settings.registry.standard_for(CallName(api_type, api_name, 0, "forward").operator, low[0]) if low else ""
        )
        return bench_site(
            settings.backend.name,
            f"{settings.backend.name}:{settings.device_index}",
            BenchCall(api.name, dtypes, floating, standard, sum(tensor.numel() for tensor in leaves)),
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
