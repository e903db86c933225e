"""Write a standalone script that reproduces one dumped call, for the kernel engineer
(the msprobe-script command is command.py).

The engineer who fixes an inaccurate kernel works on a bare machine with torch (and
torch_npu or MindSpore), far from the model and from this plugin, and reads the bug
report it came in. So a script is small and reads top to bottom: the call, every input
(tensors by dtype and shape, scalars by value), the verdict its test reached, the call's
records and the one line that calls the API, all editable. The dumped tensors it needs
travel beside it in `<call>.pt`; the judging code is not in it but in the installed
pytest-msprobe or in `_msprobe_judge.py`, written once per folder (scripts/shared.py),
so that the script reaches the very verdict and metrics of the test.

    msprobe-script step0/rank0/dump.json Functional.linear.0.forward -o scripts/
    python scripts/Functional.linear.0.forward.py --device npu --seeds 3
"""

from __future__ import annotations

import difflib
import json
import re
import textwrap
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_msprobe.dump import DEFAULT_MAX_ELEMENTS
from pytest_msprobe.dump.index import CallName, DumpIndex
from pytest_msprobe.dump.tensors import check_size, load_tensor, tensor_spec
from pytest_msprobe.dump.values import TENSOR_TYPES
from pytest_msprobe.errors import CallError, CallSkip
from pytest_msprobe.run.apis import resolve_pytorch
from pytest_msprobe.scripts.shared import identity, text_literal, write_shared
from pytest_msprobe.scripts.template import NOT_RUNNABLE_CALL, RESOLVED_CALL, SCRIPT, TORCH_CALL

if TYPE_CHECKING:
    import torch

    from pytest_msprobe.dump.index import Json, Record
    from pytest_msprobe.judge.verdict.record import ResultRecord

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
    reproduces (the same for every script of a run) and the test's own verdict."""

    max_elements: int = DEFAULT_MAX_ELEMENTS  # the largest tensor the script may create (--msprobe-max-elements)
    standards_csv: str | None = None  # the --msprobe-standards file's text it judges with; None: the shipped tables
    judged: str | None = None  # the test's verdict line, shown in the header; None: written without running the test
    file_name: str | None = None  # the file's name without .py; None: the call's
    offline: bool = False  # the run was --msprobe-offline: the script judges the dumped outputs, carried with it
    expected: Record | None = None  # the test's verdict the script compares with (expected_verdict)


DEFAULT_OPTIONS = WriteOptions()


def expected_verdict(record: ResultRecord) -> Record:
    """What a script's verdict is held to: the test's status, standard and reasons (the
    same summary as runtime.verdict_summary's of the script's own)."""
    reasons: list[Json] = [reason for output in record.outputs for reason in output.reasons]
    return {"status": record.status, "standard": record.standard, "reasons": reasons}


def write_script(
    index: DumpIndex, call_name: str | CallName, out_dir: Path, options: WriteOptions = DEFAULT_OPTIONS
) -> Path:
    """Write `out_dir/<call name>.py` (`<options.file_name>.py` where given), its
    dumped tensors as `<same name>.pt` and, once per folder, the judging library
    `_msprobe_judge.py`; return the script's path. A call that cannot run (unknown API,
    no forward record) still gets a script, one that explains why.
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
    write_shared(out_dir)
    path = out_dir / script_file_name(options.file_name or name)
    records = {"forward": forward, "backward": backward}
    tensors = _side_tensors(index, name, records, options)
    side = path.with_suffix(".pt") if tensors else None
    if side is not None:
        _save(tensors, side)
    elif path.with_suffix(".pt").exists():
        path.with_suffix(".pt").unlink()  # a script written again: no stale tensors beside it
    text = SCRIPT.substitute(
        call_comment=_comment(str(name)),
        dump_comment=_comment(str(index.path.resolve())),
        expected_comment=_expected_comment(options),
        inputs_comment=_inputs_comment(name, records, tensors.keys(), side, index.task),
        file_comment=_comment(path.name),
        needs_comment="and torch_npu on an NPU" if index.framework == "pytorch" else "and MindSpore",
        library_comment=_comment(identity()),
        call=repr(str(name)),
        framework=repr(index.framework),
        task=repr(index.task),
        offline=repr(options.offline),
        tensors=repr(side.name) if side is not None else "None",
        dump_dir=repr(str(index.path.parent.resolve())),
        max_elements=repr(options.max_elements),
        standards_csv=text_literal(options.standards_csv) if options.standards_csv else "None",
        cannot_run=repr(cannot_run),
        expected=_expected_literal(options.expected),
        library=repr(identity()),
        forward=_record_literal(forward),
        backward=_record_literal(backward),
        call_api=call_api,
    )
    path.write_text(text, encoding="utf-8")
    return path


def _side_tensors(
    index: DumpIndex, name: CallName, records: dict[str, Record | None], options: WriteOptions
) -> dict[str, torch.Tensor]:
    """The dumped tensors the script decodes (and offline, the outputs it judges), by
    their file names, read as the test read them. One that cannot be read (missing,
    outside the dump, too large) stays out: the script then says so as the test did."""
    if index.task != "tensor":
        return {}
    wanted = ["input_args", "input_kwargs", "input"] + (["output"] if options.offline else [])
    found: dict[str, torch.Tensor] = {}
    for direction, record in records.items():
        for key in wanted:
            for path, value in _tensor_values(record.get(key) if record is not None else None, f"{direction}.{key}"):
                where = f"{name.call} {path}"
                try:
                    spec = tensor_spec(value, where)
                    check_size(spec, where, options.max_elements)
                    if spec.data_name and spec.data_name not in found:
                        found[spec.data_name] = load_tensor(index.tensor_dir, spec, where)
                except (CallError, CallSkip):
                    continue
    return found


def _tensor_values(value: Json, path: str) -> Iterator[tuple[str, Record]]:
    if isinstance(value, list):
        for i, item in enumerate(value):
            yield from _tensor_values(item, f"{path}[{i}]")
    elif isinstance(value, dict):
        if value.get("type") in TENSOR_TYPES:
            yield path, value
        elif "type" not in value:
            for key, item in value.items():
                yield from _tensor_values(item, f"{path}[{key!r}]")


def _save(tensors: dict[str, torch.Tensor], path: Path) -> None:
    import torch

    torch.save({data_name: tensor.contiguous().clone() for data_name, tensor in tensors.items()}, path)


def _expected_comment(options: WriteOptions) -> str:
    if options.expected is None:
        return _comment(options.judged or "(written without running the test)")
    expected = options.expected
    reasons = expected.get("reasons")
    lines = [_comment(options.judged or f"{expected.get('status')} by the {expected.get('standard')} standard")]
    lines += [f"#   reason:  {_comment(str(reason))}" for reason in reasons] if isinstance(reasons, list) else []
    return "\n".join(lines)


def _expected_literal(expected: Record | None) -> str:
    return "None" if expected is None else f"json.loads({text_literal(json.dumps(expected, indent=1))})"


def _inputs_comment(
    name: CallName, records: dict[str, Record | None], carried: Collection[str], side: Path | None, task: str
) -> str:
    """The header's list of every input: tensors by dtype, shape and where their values
    come from; the other arguments (a scalar operand, a dim, a dtype) by value."""
    keys = {"forward": ("input_args", "input_kwargs"), "backward": ("input",)}
    rows = []
    for direction in ("forward", "backward") if name.direction == "backward" else ("forward",):
        record = records[direction]
        for key in keys[direction]:
            value = record.get(key) if record is not None else None
            rows += list(
                _argument_rows(value, f"backward.{key}" if direction == "backward" else key, carried, side, task)
            )
    if not rows:
        return "# inputs:    none recorded"
    width = max(len(path) for path, _ in rows)
    return "# inputs:\n" + "\n".join(f"#   {path:<{width}}  {_comment(what)}" for path, what in rows)


def _argument_rows(
    value: Json, path: str, carried: Collection[str], side: Path | None, task: str
) -> Iterator[tuple[str, str]]:
    if isinstance(value, list):
        for i, item in enumerate(value):
            yield from _argument_rows(item, f"{path}[{i}]", carried, side, task)
    elif isinstance(value, dict) and "type" not in value:
        for key, item in value.items():
            yield from _argument_rows(item, f"{path}[{key!r}]", carried, side, task)
    elif isinstance(value, dict) and value.get("type") in TENSOR_TYPES:
        dtype = str(value.get("dtype", "?")).split(".")[-1]
        data_name = value.get("data_name")
        if side is not None and data_name in carried:
            where = f"in {side.name}"
        elif data_name and task == "tensor":
            where = f"dumped file {data_name}: not carried (unreadable when the script was written)"
        else:
            where = "generated from its Max/Min/Mean"
        yield path, f"tensor {dtype} {value.get('shape')}  {where}"
    elif isinstance(value, dict):
        yield path, f"{str(value.get('type')).split('.')[-1]} {_json(value.get('value'))}"
    else:
        yield path, _json(value)


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
        return RESOLVED_CALL.substitute(call_comment=_comment(f"{name.api_type}.{name.api_name}"), how=_wrap(how))
    resolve_pytorch(name, None)
    if name.api_type == "NPU":
        how = f"torch_npu.{name.api_name} on an NPU, the CPU reference bench_functions.{name.api_name} on the bench (and on the device elsewhere)"
        return RESOLVED_CALL.substitute(call_comment=f"NPU.{name.api_name}", how=_wrap(how))
    if not all(_IDENTIFIER.match(part) for part in name.api_name.split(".")):
        raise CallSkip(f"{name.api_type}.{name.api_name} is not a Python attribute name")
    return TORCH_CALL.substitute(expression=TORCH_EXPRESSIONS[name.api_type].format(name.api_name))


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
    return f"json.loads({text_literal('{' + chr(10) + (',' + chr(10)).join(lines) + chr(10) + '}' + chr(10))})"


def _json(value: Json) -> str:
    return json.dumps(value, ensure_ascii=True)


def _wrap(text: str) -> str:
    return textwrap.fill(text + ".", 88, initial_indent="#   ", subsequent_indent="#   ")


def _comment(text: str) -> str:
    """Text safe inside a # comment: no line breaks, ASCII only."""
    return text.encode("unicode_escape").decode("ascii")
