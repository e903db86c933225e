"""The engine of a generated standalone script, run from the installed package or from
`_msprobe_judge.py` beside the script (scripts/shared.py).

A script is one dumped call taken away from the model, the dump and pytest. It must
judge the call exactly as its test did, so it runs the plugin's own code: the same
decoding and seeds, the same replay (offline: the dumped outputs as the device's), the
same registry of standards and the same checks beside them. What lives here is only what
a script adds: its options, where its tensors come from, its printout and exit status.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_msprobe.dump.index import DIRECTIONS, TENSOR_FOLDER, DumpIndex, parse_call_name, read_index
from pytest_msprobe.dump.values import DecodeContext
from pytest_msprobe.errors import CallError, CallSkip, DumpError
from pytest_msprobe.judge.check.call import FRAMEWORKS, Resolved, Settings, call_findings, offline_runs, replay_inputs
from pytest_msprobe.judge.findings.finding import Finding, annotate, status_with
from pytest_msprobe.judge.verdict.judgement import Judgement, judge_and_rejudge, relabel
from pytest_msprobe.judge.verdict.record import output_results
from pytest_msprobe.run.devices import Backend, DeviceUnavailable, backend
from pytest_msprobe.run.replay import DeviceFailed, Inputs, decode_inputs
from pytest_msprobe.standards import Registry
from pytest_msprobe.standards.verdict import STATUS_ORDER

if TYPE_CHECKING:
    import torch

    from pytest_msprobe.dump.index import Json, Record
    from pytest_msprobe.dump.values import Nested
    from pytest_msprobe.standards import Verdict
    from pytest_msprobe.standards.verdict import Status

# A script's exit status, as its test's outcome: 0 passed (warnings too), 1 failed, 2 skipped.
EXIT_STATUS: dict[Status, int] = {"pass": 0, "warning": 0, "error": 1, "skip": 2}


@dataclass(frozen=True)
class ScriptCall:
    """The call a script reproduces, as the script's readable top part defines it."""

    name: str  # the dumped call name, direction included
    framework: str
    task: str
    offline: bool  # the dumped outputs are the device result (--msprobe-offline)
    folder: Path  # the script's own folder, where its tensor file is
    tensors: str | None  # the file of the call's dumped tensors, in folder (None: none)
    dump_dir: str  # the folder of dump.json when the script was written
    forward_record: Record | None
    backward_record: Record | None
    max_elements: int
    call_api: Callable[..., Nested] | None  # None: resolved as the plugin does (NPU and MindSpore calls)
    build_inputs: Callable[[str, Inputs], Inputs]  # (direction, decoded inputs): the script's own edits
    standards_csv: str | None = None  # the --msprobe-standards file in force, if any
    cannot_run: str | None = None  # why the generator could not make this call runnable
    expected: Record | None = None  # the test's verdict: status, standard, reasons (writer.expected_verdict)


@dataclass
class Outcome:
    """One run of the call: a verdict, or why there is none (as the test's status)."""

    variant: int
    status: Status
    message: str
    verdict: Verdict | None = None
    findings: list[Finding] = dataclasses.field(default_factory=list)


def parse_args(call: ScriptCall, argv: list[str] | None) -> argparse.Namespace:
    default_direction = call.name.rsplit(".", 1)[-1]
    parser = argparse.ArgumentParser(
        description=f"Reproduce {call.name} of an msprobe dump: run it on the device "
        "and on the raised-precision CPU bench, and judge it as pytest-msprobe does."
    )
    parser.add_argument(
        "--device", default="auto", help="auto (npu, else cuda, else cpu), cpu, cuda or npu (default: auto)"
    )
    parser.add_argument(
        "--direction",
        choices=DIRECTIONS,
        default=default_direction,
        help=f"replay the forward call or its backward (default: {default_direction}, as the test)",
    )
    parser.add_argument(
        "--dump-dir",
        type=Path,
        help=f"read the tensors from this dump folder (dump.json and dump_tensor_data/) instead of {call.tensors}; "
        f"offline, its other records then serve too, as in the test (the dump was at {call.dump_dir})",
    )
    parser.add_argument(
        "--generate",
        action="store_true",
        help="generate every input from its recorded statistics, even where the dump saved the tensor",
    )
    parser.add_argument(
        "--seeds",
        type=int,
        default=0,
        metavar="N",
        help="also run N other seeds of the generated inputs (the first run is always the test's)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        metavar="K",
        help="run the device K times on the same inputs and fail if its outputs differ bitwise between "
        "runs (a nondeterministic kernel), as --msprobe-repeat does (default: 1, once)",
    )
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write every run's verdict and metrics to FILE")
    parser.add_argument("--traceback", action="store_true", help="show the traceback of an unexpected exception")
    args = parser.parse_args(argv)
    if args.seeds < 0:
        parser.error("--seeds must be 0 or more")
    if args.repeat < 1:
        parser.error("--repeat must be 1 or more")
    if call.offline and (args.generate or args.seeds):
        parser.error("offline, the device result is the dumped outputs of the dumped inputs: no --generate or --seeds")
    return args


def main(call: ScriptCall, argv: list[str] | None = None) -> int:
    """Run the call as the options say, print what happened, return the exit status."""
    args = parse_args(call, argv)
    if call.cannot_run:
        print(f"{call.name}: cannot be replayed: {call.cannot_run}")
        return EXIT_STATUS["skip"]
    if args.direction == "backward" and call.backward_record is None:
        print(f"{call.name}: the dump has no backward record of this call; run it with --direction forward")
        return EXIT_STATUS["skip"]
    try:
        chosen = backend(args.device)
        chosen.select(0)
    except DeviceUnavailable as exc:
        print(f"--device {args.device}: {exc}")
        return EXIT_STATUS["skip"]
    generated = args.generate or call.task == "statistics"
    if args.seeds and not generated:
        print("note: the inputs are the dumped tensors; --seeds needs generated inputs (add --generate)")
    variants = range(1 + (args.seeds if generated else 0))
    name = f"{call.name.rsplit('.', 1)[0]}.{args.direction}"
    mode = "offline: the dumped outputs are the device result" if call.offline else f"device {chosen.describe(0)}"
    print(f"{name}  ({call.framework}, {call.task} dump, {mode})")
    print(f"judged by {judging_library()}")
    with tempfile.TemporaryDirectory(prefix="msprobe-script-") as scratch:
        try:
            source = tensor_source(call, args.dump_dir, Path(scratch))
        except (CallError, DumpError, OSError) as exc:
            print(f"  bad input: {exc}\n\nverdict: error")
            return EXIT_STATUS["error"]
        script = _Script(call, name, chosen, _registry(call), args, source)
        outcomes = [_run(script, variant) for variant in variants]
    if len(outcomes) > 1:
        print("\nseeds: " + ", ".join(f"variant {o.variant} {o.status}" for o in outcomes))
    worst = max(outcomes, key=lambda o: STATUS_ORDER[o.status]).status
    print(f"\nverdict: {worst}")
    if call.expected is not None and args.direction == default_direction(call) and not args.generate:
        line = describe_agreement(call.expected, outcomes[0])
        print(line)
        if call.offline and args.dump_dir is None and args.direction == "backward" and line.startswith("differs"):
            print(
                "  offline, the test may have recovered this call's gradients from the dump's other records: "
                f"give the dump with --dump-dir (it was at {call.dump_dir})"
            )
    if args.json:
        args.json.write_text(json.dumps([_as_json(name, o) for o in outcomes], indent=1, default=str), encoding="utf-8")
    return EXIT_STATUS[worst]


def judging_library() -> str:
    """Where this code was imported from: the installed package, or the copy a script
    unpacked from _msprobe_judge.py (its stages renamed to _msprobe_support)."""
    if __name__.startswith("_msprobe_support."):
        return "_msprobe_judge.py beside the script"
    return f"the installed pytest-msprobe ({Path(__file__).parent.parent})"


def default_direction(call: ScriptCall) -> str:
    return call.name.rsplit(".", 1)[-1]


@dataclass(frozen=True)
class TensorSource:
    """Where a run's tensors are: a dump folder, and the dump to read offline outputs
    from (the one-call dump made of the script's own records and tensor file, or the
    whole dump of --dump-dir)."""

    tensor_dir: Path
    dump_json: Path

    def index(self) -> DumpIndex:
        return read_index(self.dump_json)


def tensor_source(call: ScriptCall, dump_dir: Path | None, scratch: Path) -> TensorSource:
    """The script's tensors as a one-call dump in `scratch`, read back by the plugin's
    own loader (shape and dtype checked against the records), or --dump-dir's dump."""
    if dump_dir is not None:
        return TensorSource(dump_dir / TENSOR_FOLDER, dump_dir / "dump.json")
    from pytest_msprobe.dump.tensor_dump import write_tensor_dump

    records = {
        f"{call.name.rsplit('.', 1)[0]}.{direction}": record
        for direction, record in (("forward", call.forward_record), ("backward", call.backward_record))
        if record is not None
    }
    dump_json = write_tensor_dump(scratch, records, {}, call.framework)
    tensor_dir = scratch / TENSOR_FOLDER
    for data_name, tensor in side_tensors(call).items():
        _saver(data_name)(tensor, tensor_dir / data_name)
    return TensorSource(tensor_dir, dump_json)


def side_tensors(call: ScriptCall) -> dict[str, torch.Tensor]:
    """The script's tensor file: a dict of dumped file name -> tensor, loaded safely
    (it travels with a bug report: as untrusted as a dump)."""
    if call.tensors is None:
        return {}
    import torch

    path = call.folder / call.tensors
    if not path.is_file():
        raise CallError(f"{call.tensors} is not beside the script ({call.folder}): copy it there, or give --dump-dir")
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CallError(f"cannot load {call.tensors}: {type(exc).__name__}: {exc}") from exc
    if not isinstance(loaded, dict) or not all(
        isinstance(key, str) and _plain_file_name(key) and isinstance(value, torch.Tensor)
        for key, value in loaded.items()
    ):
        raise CallError(f"{call.tensors} is not a dict of dumped file names to tensors, as the script wrote it")
    return loaded


def _plain_file_name(name: str) -> bool:
    return bool(name) and "/" not in name and "\\" not in name and not name.startswith(".")


def _saver(data_name: str) -> Callable[[torch.Tensor, Path], None]:
    import numpy as np
    import torch

    def save_npy(tensor: torch.Tensor, path: Path) -> None:
        # as MindSpore saves bfloat16: float32, read back as bfloat16 by the record's dtype
        wide = tensor.float() if tensor.dtype == torch.bfloat16 else tensor
        np.save(path, wide.numpy(), allow_pickle=False)

    return save_npy if data_name.endswith(".npy") else lambda tensor, path: torch.save(tensor, path)


def _registry(call: ScriptCall) -> Registry:
    registry = Registry.default()
    if call.standards_csv:
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "standards.csv"
            path.write_text(call.standards_csv, encoding="utf-8")
            registry.load_file(path)
    return registry


@dataclass(frozen=True)
class _Script:
    """What every input variant of a script's run shares."""

    call: ScriptCall
    name: str
    chosen: Backend
    registry: Registry
    args: argparse.Namespace
    source: TensorSource


def _run(script: _Script, variant: int) -> Outcome:
    """One replay and verdict, with every way it can fail turned into a status, as
    outcome.judge_call does for the test."""
    print(f"\n--- inputs: {'as in the test' if variant == 0 else f'seed variant {variant}'}")
    try:
        verdict, findings = _check(script, variant)
    except CallSkip as exc:
        return _said(Outcome(variant, "skip", f"skipped: {exc}"))
    except (CallError, DumpError) as exc:
        return _said(Outcome(variant, "error", f"bad input: {exc}"))
    except DeviceFailed as exc:
        return _said(Outcome(variant, "error", str(exc)))
    except Exception as exc:  # noqa: BLE001 - the script explains; --traceback shows the rest
        if script.args.traceback:
            traceback.print_exc()
        return _said(
            Outcome(variant, "error", f"the check raised {type(exc).__name__}: {exc} (--traceback shows where)")
        )
    _print_verdict(verdict)
    for finding in findings:
        print(f"  {finding.path or 'output'}: {finding.reason}")
    status = status_with(verdict.status, findings)
    return Outcome(
        variant,
        status,
        f"{verdict.status} by the {verdict.standard} standard"
        + "".join(f"; error: {finding.kind}" for finding in findings if finding.fails),
        verdict,
        findings,
    )


def _check(script: _Script, variant: int) -> tuple[Verdict, list[Finding]]:
    """check_call's steps (judge/check/call.py), with the script's own inputs and API
    function: the verdict, and the checks beside the standards."""
    call, name, chosen, registry, args = script.call, script.name, script.chosen, script.registry, script.args
    call_name = parse_call_name(name)
    assert call_name is not None, name  # msprobe-script writes scripts of API calls only
    framework = FRAMEWORKS[call.framework]()
    api = framework.resolve(call_name, chosen)
    if call.call_api is not None:
        # a bench told the device's draw (a dropout's mask: run/dropout.py) keeps its own function
        own = call.call_api if api.reveal is None else api.bench_fn
        api = dataclasses.replace(api, device_fn=call.call_api, bench_fn=own, raised_fn=None)
    resolved = Resolved(call_name, call.framework, framework, api)
    inputs = call.build_inputs(args.direction, _decode_inputs(script, variant))
    for line in input_lines(inputs):
        print(f"  {line}")
    settings = Settings(chosen, 0, call.max_elements, registry, offline=call.offline, repeat=args.repeat)
    dumped = offline_runs(script.source.index(), resolved, settings) if call.offline else None
    replayed = replay_inputs(resolved, inputs, settings, dumped)
    for note in replayed.notes:
        print(f"  {note}")
    verdict = judge_and_rejudge(
        Judgement(registry, call_name, replayed.results, replayed.bench, call.framework, None, replayed.layouts)
    ).require_verdict()
    site = getattr(replayed.bench, "site", "")  # where the bench ran, on an accelerator (run/precision.py)
    if site:
        verdict = relabel(verdict, site)
    evidence = getattr(replayed.device, "evidence", None)
    if evidence is not None and evidence.origins:  # gradients recovered from the dump (judge/offline/dumped_run.py)
        verdict = relabel(verdict, f"gradients recovered from the dump: {evidence.how}")
    return verdict, call_findings(replayed, call_name, call.framework, settings)


def _decode_inputs(script: _Script, variant: int) -> Inputs:
    """The call's arguments, decoded from the records exactly as the test decoded them:
    the dumped tensors, or tensors generated from the statistics with the test's seed
    (the call id and the argument's place decide it; a variant > 0 draws others)."""
    call, args = script.call, script.args
    call_id = call.name.rsplit(".", 1)[0] + (f" (seed variant {variant})" if variant else "")
    task = "statistics" if args.generate else call.task
    ctx = DecodeContext(script.source.tensor_dir, task, call_id, call.max_elements)
    if call.forward_record is None:
        raise CallSkip(f"the dump has no forward record of {call.name}: its inputs are unknown")
    assert args.direction == "forward" or call.backward_record is not None  # main: no backward is a skip
    inputs = decode_inputs(call.forward_record, None if args.direction == "forward" else call.backward_record, ctx)
    if args.dump_dir is None and call.tensors is not None:
        for leaf in inputs.leaves:
            if leaf.origin.startswith("file "):  # read back from the one-call dump of tensor_source
                leaf.origin = f"{leaf.origin.removeprefix('file ')} in {call.tensors}"
    return inputs


def input_lines(inputs: Inputs) -> list[str]:
    """Every argument of the call: tensors by dtype, shape and origin, the others
    (a scalar operand, a dim, a dtype) by value."""
    tensors = [
        f"{leaf.path:<28} {str(leaf.tensor.dtype).removeprefix('torch.'):<9} {list(leaf.tensor.shape)}  {leaf.origin}"
        for leaf in inputs.leaves
    ]
    values = [f"{path:<28} {type(value).__name__:<9} {value!r}" for path, value in _plain_arguments(inputs)]
    return tensors + values


def _plain_arguments(inputs: Inputs) -> Iterator[tuple[str, Nested]]:
    import torch

    def walk(value: Nested, path: str) -> Iterator[tuple[str, Nested]]:
        if isinstance(value, torch.Tensor):
            return
        if isinstance(value, (list, tuple)) and not isinstance(value, torch.Size):
            for i, item in enumerate(value):
                yield from walk(item, f"{path}[{i}]")
        elif isinstance(value, dict):
            for key, item in value.items():
                yield from walk(item, f"{path}[{key!r}]")
        else:
            yield path, value

    for i, value in enumerate(inputs.args):
        yield from walk(value, f"input_args[{i}]")
    for key, value in inputs.kwargs.items():
        yield from walk(value, f"input_kwargs[{key!r}]")


def verdict_summary(status: Status, verdict: Verdict | None, findings: list[Finding]) -> Record:
    """What a verdict is compared by: its status, standard and failing reasons (the
    same for the test's record: writer.expected_verdict)."""
    reasons: list[Json] = []
    if verdict is not None:
        for output in annotate(output_results(verdict), findings):
            reasons += output.reasons
    return {"status": status, "standard": verdict.standard if verdict is not None else "", "reasons": reasons}


def describe_agreement(expected: Record, outcome: Outcome) -> str:
    """One line: whether the script reached its test's verdict, and what differs."""
    mine = verdict_summary(outcome.status, outcome.verdict, outcome.findings)
    differ = [key for key in ("status", "standard", "reasons") if mine[key] != expected.get(key)]
    if not differ:
        return f"as the test: {expected['status']} by the {expected['standard'] or '(no)'} standard"
    return "differs from the test: " + "; ".join(f"{key} {expected.get(key)!r} in the test" for key in differ)


def _said(outcome: Outcome) -> Outcome:
    print(f"  {outcome.message}")
    return outcome


def _print_verdict(verdict: Verdict) -> None:
    leaves = verdict.outputs or (verdict,)
    for leaf, result in zip(leaves, output_results(verdict), strict=False):
        print(
            f"  {result.path or 'output'}: {result.status} by the {result.standard} standard ({result.reference}); "
            f"shape {result.shape}, device {result.device_dtype}, bench {result.bench_dtype}"
        )
        for key, value in result.metrics.items():
            limit = result.thresholds.get(key)
            print(f"      {key:<24} {value:.8g}" + (f"  (threshold {limit:.6g})" if limit is not None else ""))
        extra = {key: limit for key, limit in result.thresholds.items() if key not in result.metrics}
        if extra:
            print("      thresholds: " + ", ".join(f"{key}={limit:.6g}" for key, limit in extra.items()))
        for reason in result.reasons:
            print(f"      reason: {reason}")
        if result.status != "pass":
            for offender in leaf.worst:
                print(f"      worst {list(offender.index)}: device {offender.device!r} vs bench {offender.bench!r}")


def _as_json(name: str, outcome: Outcome) -> Record:
    results = annotate(output_results(outcome.verdict), outcome.findings) if outcome.verdict is not None else []
    outputs = [dataclasses.asdict(o) for o in results]
    return {
        "call": name,
        "variant": outcome.variant,
        "status": outcome.status,
        "message": outcome.message,
        "outputs": outputs,
        "verdict": verdict_summary(outcome.status, outcome.verdict, outcome.findings),
    }
