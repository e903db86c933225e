"""Write a standalone script that reproduces one dumped call, for the kernel engineer.

The engineer who fixes an inaccurate kernel works on a bare machine with torch (and
torch_npu or MindSpore), far from the model and from this plugin. So a script is one
file: on top, the call's records, how its inputs are built and the one line that calls
the API, all editable; at the bottom, this plugin's own decoding, replay and standards
embedded verbatim (renamed to a private package), so that the script reaches the very
verdict and metrics of the test.

    msprobe-script step0/rank0/dump.json Functional.linear.0.forward -o scripts/
    python scripts/Functional.linear.0.forward.py --device npu --seeds 3
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import importlib.metadata
import json
import re
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_msprobe.dump import DEFAULT_MAX_ELEMENTS
from pytest_msprobe.dump.index import CallName, DumpIndex, read_index
from pytest_msprobe.errors import CallError, CallSkip, DumpError
from pytest_msprobe.run.apis import resolve_pytorch
from pytest_msprobe.scripts.template import NOT_RUNNABLE_CALL, RESOLVED_CALL, SCRIPT, TORCH_CALL

if TYPE_CHECKING:
    from pytest_msprobe.dump.index import Json, Record

SUPPORT_PACKAGE = "_msprobe_support"

# Support files every script embeds: (package, path inside it, file patterns). Its
# root __init__.py is written by _support_literal (the real one describes every stage).
CORE_SUPPORT = (
    ("pytest_msprobe", "", ("errors.py", "compat.py")),
    ("pytest_msprobe.dump", "dump", ("__init__.py", "index.py", "tensors.py", "values.py")),
    (
        "pytest_msprobe.run",
        "run",
        (
            "__init__.py",
            "apis.py",
            "replay.py",
            "terms.py",
            "summed.py",
            "dropout.py",
            "groups.py",
            "rounding.py",
            "devices.py",
            "precision.py",
            "api_tables/pytorch.toml",
        ),
    ),
    (
        "pytest_msprobe.judge",
        "judge",
        ("__init__.py", "call.py", "judgement.py", "record.py", "findings.py", "repeat.py", "written.py"),
    ),
    ("pytest_msprobe.scripts", "scripts", ("__init__.py", "runtime.py")),
    ("pytest_msprobe.standards", "standards", ("*.py", "tables/*.csv")),
)
# ... and what some calls need besides.
NPU_SUPPORT = (("pytest_msprobe.bench_functions", "bench_functions", ("*.py",)),)
MINDSPORE_SUPPORT = (
    ("pytest_msprobe.run.mindspore", "run/mindspore", ("*.py",)),
    ("pytest_msprobe.run", "run", ("api_tables/mindspore.toml",)),
)
SUPPORT_INIT = '"""pytest-msprobe\'s stages that this script runs, embedded."""\n'

# api type of a PyTorch call -> the attribute path the script calls (names are checked
# against the API tables first: a dump's names never reach the code unchecked).
TORCH_EXPRESSIONS = {
    "Functional": "torch.nn.functional.{}",
    "Torch": "torch.{}",
    "Tensor": "torch.Tensor.{}",
    "VF": "torch._VF.{}",
    "Aten": "torch.ops.aten.{}",
}
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_UNSAFE_FILE_CHARACTERS = re.compile(r"[^A-Za-z0-9_.-]")


class ScriptError(Exception):
    """A script cannot be written (an unknown call name): the message says why."""


@dataclass(frozen=True)
class WriteOptions:
    """How write_script writes a script besides its call: what it takes from the run it
    reproduces (the same for every script of a run) and the test's own label."""

    max_elements: int = DEFAULT_MAX_ELEMENTS  # the largest tensor the script may create (--msprobe-max-elements)
    standards_csv: str | None = None  # the --msprobe-standards file's text it judges with; None: the shipped tables
    judged: str | None = None  # the test's verdict line, shown in the header; None: written without running the test
    file_name: str | None = None  # the file's name without .py; None: the call's


DEFAULT_OPTIONS = WriteOptions()


def write_script(
    index: DumpIndex, call_name: str | CallName, out_dir: Path, options: WriteOptions = DEFAULT_OPTIONS
) -> Path:
    """Write `out_dir/<call name>.py` (`<options.file_name>.py` where given) and return
    its path. A call that cannot run (unknown API, no forward record) still gets a
    script, one that explains why.
    """
    name = _known_call(index, str(call_name))
    forward = _record(index, name.sibling("forward"))
    backward = _record(index, name.sibling("backward"))
    cannot_run = (
        None
        if forward is not None
        else f"the dump has no forward record {name.sibling('forward')}: its inputs are unknown"
    )
    try:
        call_api = _call_api(index.framework, name)
    except CallSkip as exc:
        cannot_run, call_api = cannot_run or str(exc), NOT_RUNNABLE_CALL
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / script_file_name(options.file_name or name)
    version = _version()
    text = SCRIPT.substitute(
        call_comment=_comment(str(name)),
        dump_comment=_comment(str(index.path.resolve())),
        judged_comment=_comment(options.judged or "(written without running the test)"),
        file_comment=_comment(path.name),
        needs_comment="and torch_npu on an NPU" if index.framework == "pytorch" else "and MindSpore",
        version=version,
        call=repr(str(name)),
        framework=repr(index.framework),
        task=repr(index.task),
        dump_dir=repr(str(index.path.parent.resolve())),
        max_elements=repr(options.max_elements),
        standards_csv=_text_literal(options.standards_csv) if options.standards_csv else "None",
        cannot_run=repr(cannot_run),
        forward=_record_literal(forward),
        backward=_record_literal(backward),
        call_api=call_api,
        support_files=_support_literal(index.framework, name),
    )
    path.write_text(text, encoding="utf-8")
    return path


def script_file_name(name: CallName | str) -> str:
    """`<call name>.py`, with anything a file name should not hold replaced: a dump's
    names are not trusted to stay inside the scripts folder."""
    return _UNSAFE_FILE_CHARACTERS.sub("_", str(name)).lstrip(".") + ".py"


def _known_call(index: DumpIndex, call_name: str) -> CallName:
    entry = index.entry(call_name)
    if entry is None:
        names = index.names
        close = difflib.get_close_matches(call_name, names, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else f" (it has {len(names)} calls, e.g. {names[0]})"
        raise ScriptError(f"{call_name!r} is not a call of {index.path}{hint}")
    return entry.name


def _record(index: DumpIndex, name: CallName) -> Record | None:
    entry = index.entry(str(name))
    if entry is None:
        return None
    try:
        return index.read_record(entry)
    except CallError as exc:
        raise ScriptError(str(exc)) from exc


def _call_api(framework: str, name: CallName) -> str:
    """The script's call_api: the torch call itself, or a note on how the call is
    resolved (NPU fused ops, MindSpore). Raises CallSkip where the test would skip."""
    if framework == "mindspore":
        how = "the MindSpore API on MindSpore's device target, its torch twin from api_tables/mindspore.toml on the CPU bench"
        return RESOLVED_CALL.substitute(call_comment=_comment(f"{name.api_type}.{name.api_name}"), how=_wrapped(how))
    resolve_pytorch(name, None)
    if name.api_type == "NPU":
        how = f"torch_npu.{name.api_name} on an NPU, the CPU reference bench_functions.{name.api_name} on the bench (and on the device elsewhere)"
        return RESOLVED_CALL.substitute(call_comment=f"NPU.{name.api_name}", how=_wrapped(how))
    if not all(_IDENTIFIER.match(part) for part in name.api_name.split(".")):
        raise CallSkip(f"{name.api_type}.{name.api_name} is not a Python attribute name")
    return TORCH_CALL.substitute(expression=TORCH_EXPRESSIONS[name.api_type].format(name.api_name))


def _support_literal(framework: str, name: CallName) -> str:
    groups = (
        CORE_SUPPORT
        + (MINDSPORE_SUPPORT if framework == "mindspore" else ())
        + (NPU_SUPPORT if name.api_type == "NPU" else ())
    )
    files = {"__init__.py": SUPPORT_INIT} | {
        relative: text for group in groups for relative, text in _package_files(*group)
    }
    return "\n".join(f"    {relative!r}: {_text_literal(text)}," for relative, text in files.items())


def _package_files(package: str, prefix: str, patterns: tuple[str, ...]) -> list[tuple[str, str]]:
    """The package's files matching the patterns, as (path in the support package,
    text with the package renamed), read from wherever it is installed."""
    module_file = importlib.import_module(package).__file__
    assert module_file is not None, package  # a package on disk, never a namespace package
    root = Path(module_file).parent
    found = []
    for pattern in patterns:
        for path in sorted(root.glob(pattern)):
            relative = "/".join(filter(None, (prefix, path.relative_to(root).as_posix())))
            found.append((relative, re.sub(r"\bpytest_msprobe\b", SUPPORT_PACKAGE, path.read_text("utf-8"))))
    return found


def _record_literal(record: Record | None) -> str:
    """A record as json.loads of readable JSON: one line per argument, so a shape is
    found and edited at a glance. JSON, not a Python literal: Infinity and NaN stay."""
    if record is None:
        return "None"
    lines = []
    for key, value in record.items():
        if isinstance(value, list) and value:
            body = ",\n".join(f"  {_json(item)}" for item in value)
            lines.append(f" {_json(key)}: [\n{body}\n ]")
        elif isinstance(value, dict) and value:
            body = ",\n".join(f"  {_json(k)}: {_json(v)}" for k, v in value.items())
            lines.append(f" {_json(key)}: {{\n{body}\n }}")
        else:
            lines.append(f" {_json(key)}: {_json(value)}")
    return f"json.loads({_text_literal('{' + chr(10) + (',' + chr(10)).join(lines) + chr(10) + '}' + chr(10))})"


def _json(value: Json) -> str:
    return json.dumps(value, ensure_ascii=True)


def _text_literal(text: str) -> str:
    """A raw triple-quoted literal where the text allows one (readable), else repr:
    text from a dump must never be able to end the literal."""
    if "'''" not in text and not text.endswith(("\\", "'")) and all(c.isprintable() or c in "\n\t" for c in text):
        return f"r'''{text}'''"
    return repr(text)


def _wrapped(text: str) -> str:
    return textwrap.fill(text + ".", 88, initial_indent="#   ", subsequent_indent="#   ")


def _comment(text: str) -> str:
    """Text safe inside a # comment: no line breaks, ASCII only."""
    return text.encode("unicode_escape").decode("ascii")


def _version() -> str:
    try:
        return importlib.metadata.version("pytest-msprobe")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    """`msprobe-script DUMP CALL... -o DIR`: write scripts without running pytest."""
    parser = argparse.ArgumentParser(
        prog="msprobe-script", description="Write standalone scripts that reproduce calls of an msprobe dump."
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
    args = parser.parse_args(argv)
    dump = args.dump / "dump.json" if args.dump.is_dir() else args.dump
    try:
        index = read_index(dump)
        standards_csv = args.standards.read_text("utf-8") if args.standards else None
    except (DumpError, OSError) as exc:
        print(f"msprobe-script: {exc}", file=sys.stderr)
        return 2
    options = WriteOptions(max_elements=args.max_elements, standards_csv=standards_csv)
    status = 0
    for call in args.calls:
        try:
            print(write_script(index, call, args.out, options))
        except ScriptError as exc:
            print(f"msprobe-script: {exc}", file=sys.stderr)
            status = 2
    return status


if __name__ == "__main__":
    sys.exit(main())
