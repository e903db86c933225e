"""The engine of a generated standalone script (embedded in every script as support code).

A script is one dumped call taken away from the model, the dump and pytest. It must
judge the call exactly as its test did, so it runs the plugin's own code: the same
decoding and seeds, the same Run/replay, the same registry of standards. What lives
here is only what a script adds: its options, its printout and its exit status.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_msprobe.dump.index import DIRECTIONS, parse_call_name
from pytest_msprobe.errors import CallError, CallSkip
from pytest_msprobe.judge.call import FRAMEWORKS, Settings
from pytest_msprobe.judge.findings import Finding, annotated, dropout_findings, status_with
from pytest_msprobe.judge.judgement import Judgement, judged
from pytest_msprobe.judge.record import output_results
from pytest_msprobe.judge.repeat import DeviceRun, repeat_findings
from pytest_msprobe.judge.written import cut_results, written
from pytest_msprobe.run.devices import Backend, DeviceUnavailable, backend
from pytest_msprobe.run.replay import DeviceFailed, Inputs, Sides, replay
from pytest_msprobe.standards import Registry
from pytest_msprobe.standards.verdict import STATUS_ORDER

if TYPE_CHECKING:
    from pytest_msprobe.dump.index import Record
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
    dump_dir: str  # the folder of dump.json when the script was written
    has_backward: bool
    max_elements: int
    build_inputs: Callable[[str, Path, bool, int], Inputs]  # (direction, dump_dir, generate, variant)
    call_api: Callable[..., Nested] | None  # None: resolved as the plugin does (NPU and MindSpore calls)
    standards_csv: str | None = None  # the --msprobe-standards file in force, if any
    cannot_run: str | None = None  # why the generator could not make this call runnable


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
        default=Path(call.dump_dir),
        help="the folder holding dump.json and dump_tensor_data/ (default: where the dump was)",
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
    return args


def main(call: ScriptCall, argv: list[str] | None = None) -> int:
    """Run the call as the options say, print what happened, return the exit status."""
    args = parse_args(call, argv)
    if call.cannot_run:
        print(f"{call.name}: cannot be replayed: {call.cannot_run}")
        return EXIT_STATUS["skip"]
    if args.direction == "backward" and not call.has_backward:
        print(f"{call.name}: the dump has no backward record of this call; run it with --direction forward")
        return EXIT_STATUS["skip"]
    try:
        chosen = backend(args.device)
        chosen.select(0)
    except DeviceUnavailable as exc:
        print(f"--device {args.device}: {exc}")
        return EXIT_STATUS["skip"]
    registry = _registry(call)
    generated = args.generate or call.task == "statistics"
    if args.seeds and not generated:
        print("note: the inputs are the dumped tensors; --seeds needs generated inputs (add --generate)")
    variants = range(1 + (args.seeds if generated else 0))
    name = f"{call.name.rsplit('.', 1)[0]}.{args.direction}"
    print(f"{name}  ({call.framework}, {call.task} dump, device {chosen.describe(0)})")
    script = _Script(call, name, chosen, registry, args)
    outcomes = [_run(script, variant) for variant in variants]
    if len(outcomes) > 1:
        print("\nseeds: " + ", ".join(f"variant {o.variant} {o.status}" for o in outcomes))
    worst = max(outcomes, key=lambda o: STATUS_ORDER[o.status]).status
    print(f"\nverdict: {worst}")
    if args.json:
        args.json.write_text(json.dumps([_as_json(name, o) for o in outcomes], indent=1, default=str), encoding="utf-8")
    return EXIT_STATUS[worst]


def _registry(call: ScriptCall) -> Registry:
    registry = Registry.default()
    if call.standards_csv:
        import tempfile

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


def _run(script: _Script, variant: int) -> Outcome:
    """One replay and verdict, with every way it can fail turned into a status, as
    outcome.judge_call does for the test."""
    print(f"\n--- inputs: {'as in the test' if variant == 0 else f'seed variant {variant}'}")
    try:
        verdict, findings = _check(script, variant)
    except CallSkip as exc:
        return _said(Outcome(variant, "skip", f"skipped: {exc}"))
    except CallError as exc:
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
    """check_call's steps, with the script's own inputs and API function: the verdict,
    and what --repeat found."""
    call, name, chosen, registry, args = script.call, script.name, script.chosen, script.registry, script.args
    call_name = parse_call_name(name)
    assert call_name is not None, name  # msprobe-script writes scripts of API calls only
    framework = FRAMEWORKS[call.framework]()
    api = framework.resolve(call_name, chosen)
    if call.call_api is not None:
        # a bench told the device's draw (a dropout's mask: run/dropout.py) keeps its own function
        own = call.call_api if api.reveal is None else api.bench_fn
        api = dataclasses.replace(api, device_fn=call.call_api, bench_fn=own, raised_fn=None)
    inputs = call.build_inputs(args.direction, args.dump_dir, args.generate, variant)
    for leaf in inputs.leaves:
        print(
            f"  {leaf.path:<28} {str(leaf.tensor.dtype).removeprefix('torch.'):<9} {list(leaf.tensor.shape)}  {leaf.origin}"
        )
    settings = Settings(chosen, 0, call.max_elements, registry)
    device, bench, reference = framework.runs(api, inputs, settings)
    try:
        results = replay(args.direction, api, inputs, Sides(device, bench, reference), framework=call.framework)
        where = written(call_name, inputs, call.framework)  # the rows a grouped kernel wrote, as the test judged
        results, notes = cut_results(results, where)
        for note in notes:
            print(f"  {note}")
        run = DeviceRun(device, args.direction, call.framework)
        findings = dropout_findings(results, call_name) + repeat_findings(run, results, args.repeat, where)
    finally:
        chosen.free()
    return judged(Judgement(registry, call_name, results, bench, call.framework)).reached(), findings


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
    results = annotated(output_results(outcome.verdict), outcome.findings) if outcome.verdict is not None else []
    outputs = [dataclasses.asdict(o) for o in results]
    return {
        "call": name,
        "variant": outcome.variant,
        "status": outcome.status,
        "message": outcome.message,
        "outputs": outputs,
    }
