"""The msprobe-script command: standalone scripts of named calls (standalone.py), or with
--bug-report a bug report folder per call (bug_report.py: the call reduced to the
smallest input that fails the same way, its script, verdicts and environment).

    msprobe-script step0/rank0/dump.json Functional.linear.0.forward -o scripts/
    msprobe-script step0/rank0/dump.json Functional.linear.0.forward --bug-report -o reports/
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_msprobe.dump import DEFAULT_MAX_ELEMENTS
from pytest_msprobe.dump.index import DumpIndex, read_index
from pytest_msprobe.errors import CallError, CallSkip, DumpError
from pytest_msprobe.scripts.standalone import ScriptError, WriteOptions, write_script

if TYPE_CHECKING:
    from pytest_msprobe.judge.check.call import Settings


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="msprobe-script",
        description="Write standalone scripts that reproduce calls of an msprobe dump: DIR/<call>.py, its tensors "
        "in DIR/<call>.pt and, once per folder, the judging library DIR/_msprobe_judge.py for machines without "
        "pytest-msprobe.",
    )
    parser.add_argument("dump", type=Path, help="dump.json, or the folder holding it")
    parser.add_argument("calls", nargs="+", metavar="CALL", help="call names, e.g. Functional.linear.0.forward")
    parser.add_argument(
        "-o", "--out", type=Path, default=Path("."), help="folder for the scripts (default: the current one)"
    )
    parser.add_argument(
        "--standards", type=Path, metavar="CSV", help="the --msprobe-standards file the scripts judge with"
    )
    parser.add_argument(
        "--max-elements", type=int, default=DEFAULT_MAX_ELEMENTS, help="largest tensor a call may create"
    )
    parser.add_argument(
        "--offline",
        action="store_true",
        help="the scripts judge the dumped outputs as the device result, as --msprobe-offline does (tensor dumps)",
    )
    parser.add_argument(
        "--bug-report",
        action="store_true",
        help="judge each call here and, where it fails, write a bug report folder OUT/<dump>/<call>/: the call "
        "reduced to the smallest input that fails the same way (a one-call dump), its script, the verdicts "
        "before and after, the environment (tensor dumps)",
    )
    parser.add_argument(
        "--device", default="cpu", help="with --bug-report: the device the calls are judged on (default: cpu)"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """`msprobe-script DUMP CALL... -o DIR`: write scripts without running pytest."""
    args = _parser().parse_args(argv)
    dump = args.dump / "dump.json" if args.dump.is_dir() else args.dump
    try:
        index = read_index(dump)
        standards_csv = args.standards.read_text("utf-8") if args.standards else None
    except (DumpError, OSError) as exc:
        print(f"msprobe-script: {exc}", file=sys.stderr)
        return 2
    if (args.offline or args.bug_report) and index.task != "tensor":
        flag = "--offline" if args.offline else "--bug-report"
        print(f"msprobe-script: {flag} needs a tensor dump; {dump} is a {index.task} dump", file=sys.stderr)
        return 2
    if args.bug_report:
        return _bug_reports(index, args)
    options = WriteOptions(max_elements=args.max_elements, standards_csv=standards_csv, offline=args.offline)
    status = 0
    for call in args.calls:
        try:
            print(write_script(index, call, args.out, options))
        except ScriptError as exc:
            print(f"msprobe-script: {exc}", file=sys.stderr)
            status = 2
    return status


def _bug_reports(index: DumpIndex, args: argparse.Namespace) -> int:
    """One folder per failing call; a call that passes or cannot be judged is said so
    (exit status 1 where any did not fail, 2 where a name is unknown)."""
    from pytest_msprobe.scripts.bug_report import write_named

    settings = _settings(args)
    status = 0
    for call in args.calls:
        try:
            print(write_named(index, call, args.out, settings).line)
        except KeyError:
            print(f"msprobe-script: {call!r} is not a call of {index.path}", file=sys.stderr)
            status = 2
        except (CallSkip, CallError) as exc:
            print(f"msprobe-script: {call}: no bug report: {exc}", file=sys.stderr)
            status = max(status, 1)
    return status


def _settings(args: argparse.Namespace) -> Settings:
    """The settings a test of the run would judge with: the shipped standards (and the
    given file over them) on the chosen device."""
    from pytest_msprobe.judge.check.call import Settings
    from pytest_msprobe.run.devices import backend
    from pytest_msprobe.standards import Registry

    registry = Registry.default()
    if args.standards is not None:
        registry.load_file(args.standards)
    chosen = backend(args.device)
    chosen.select(0)
    return Settings(chosen, 0, args.max_elements, registry, device_request=args.device, offline=args.offline)


if __name__ == "__main__":
    sys.exit(main())
