"""Read msprobe's dump.json without keeping it in memory.

A real dump.json holds hundreds of thousands of calls. Collection needs only the
call names and a little metadata; a call's full record is read when it runs. So the
file is scanned once with the C JSON scanner, and each entry is remembered by its
byte span: a worker later reads just that slice.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

from pytest_msprobe.errors import CallError, DumpError

if TYPE_CHECKING:  # numpy is imported where the columns are made: the xdist controller names calls, needs no arrays
    from pytest_msprobe.standards.dtypes import Array

#: a value of dump.json as json.loads gives it. Any: JSON whose type depends on the field
#: and the record's kind (a tensor's {"type", "dtype", ...}, lists, numbers, strings);
#: the readers (dump/values.py, dump/tensors.py) check it where they use it
Json: TypeAlias = Any
#: one record of dump.json: {"input_args": [...], "input_kwargs": {...}, "output": [...]}
Record: TypeAlias = dict[str, Json]
#: a value made from the whole dump and kept with its index (DumpIndex.derived)
Derived = TypeVar("Derived")

TENSOR_FOLDER = "dump_tensor_data"
MODULE_PREFIXES = ("Module.", "Cell.")
DIRECTIONS = ("forward", "backward")

_WHITESPACE = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


def _after_whitespace(text: str, pos: int) -> int:
    match = _WHITESPACE.match(text, pos)
    assert match is not None  # a run of zero or more: it matches at any position
    return match.end()


@dataclass(frozen=True, slots=True)
class CallName:
    """`{api_type}.{api_name}.{index}.{direction}`, split from the right because
    api names may hold dots (`Tensor.__matmul__`, `Aten.add.Tensor`)."""

    api_type: str
    api_name: str
    index: int
    direction: str

    @property
    def call(self) -> str:
        """The name without its direction, as msprobe's result CSV spells it."""
        return f"{self.api_type}.{self.api_name}.{self.index}"

    @property
    def operator(self) -> str:
        """The API name the tables know it by: an Aten overload (`add.Tensor`) is its
        operator (`add`)."""
        return self.api_name.rsplit(".", 1)[0] if self.api_type == "Aten" else self.api_name

    def __str__(self) -> str:
        return f"{self.call}.{self.direction}"

    def sibling(self, direction: str) -> CallName:
        return CallName(self.api_type, self.api_name, self.index, direction)


def parse_call_name(name: str) -> CallName | None:
    """None for names that are not API calls (Module/Cell entries, odd keys)."""
    if name.startswith(MODULE_PREFIXES):
        return None
    parts = name.split(".")
    if len(parts) < 4 or parts[-1] not in DIRECTIONS or not parts[-2].isdigit():
        return None
    api_type, api_name = parts[0], ".".join(parts[1:-2])
    if not api_type or not api_name:
        return None
    return CallName(api_type, api_name, int(parts[-2]), parts[-1])


@dataclass(frozen=True, slots=True)
class IndexEntry:
    """What collection needs of one call: its name, where its record lies, and its
    size (elements of its tensors) for scheduling heavy calls first."""

    name: CallName
    start: int
    end: int
    numel: int


@dataclass(eq=False)
class DumpIndex:
    """A dump's calls as columns, in dump order: a name and a few numbers each. One
    object per call would cost each xdist worker about 50 MB more for 200,000 calls;
    IndexEntry/CallName objects are made for the calls that are asked for."""

    path: Path
    task: str
    level: str
    framework: str
    names: list[str]  # `{api_type}.{api_name}.{index}.{direction}` of each call
    apis: list[tuple[str, str]]  # the distinct (api_type, api_name) pairs
    api: Array  # int32: each call's pair, as a position in `apis`
    number: Array  # int64: each call's index, the number in its name
    backward: Array  # bool: each call's direction
    start: Array  # int64: each record's byte span in the file
    end: Array
    numel: Array  # int64: elements of each record's tensors (the cost estimate)
    modules: int = 0
    skipped_names: list[str] = field(default_factory=list)
    key: str = ""  # the dump's name in test ids (its path from the rootdir): stable across machines
    _derived: dict[type, object] = field(default_factory=dict, init=False, repr=False)  # see derive()

    def __len__(self) -> int:
        return len(self.names)

    @property
    def tensor_dir(self) -> Path:
        return self.path.parent / TENSOR_FOLDER

    def call_at(self, position: int) -> CallName:
        api_type, api_name = self.apis[self.api[position]]
        return CallName(api_type, api_name, int(self.number[position]), DIRECTIONS[int(self.backward[position])])

    def entry_at(self, position: int) -> IndexEntry:
        return IndexEntry(
            self.call_at(position), int(self.start[position]), int(self.end[position]), int(self.numel[position])
        )

    @property
    def entries(self) -> list[IndexEntry]:
        return [self.entry_at(position) for position in range(len(self))]

    def entry(self, name: str) -> IndexEntry | None:
        position = self._positions.get(name)
        return None if position is None else self.entry_at(position)

    def position_of(self, name: str) -> int:
        """Where a call the index holds lies in dump order (KeyError for a name it does not)."""
        return self._positions[name]

    @functools.cached_property
    def _positions(self) -> dict[str, int]:
        """Name -> position, made on the first lookup by name (a backward call finding
        its forward), not while collecting."""
        return {name: position for position, name in enumerate(self.names)}

    def derive(self, kind: type[Derived], make: Callable[[DumpIndex], Derived]) -> Derived:
        """The one value of `kind` a later module makes from the whole dump (dump/dataflow.py's
        data flow, dump/module_records.py's module tree), made on its first use and kept with the index for
        every call that follows; keyed by its type, so each is typed where it is read."""
        found = self._derived.get(kind)
        if found is None:
            found = self._derived[kind] = make(self)
        assert isinstance(found, kind)
        return found

    def entry_of(self, name: str) -> IndexEntry:
        """The entry of a call the index holds (KeyError for a name it does not)."""
        entry = self.entry(name)
        if entry is None:
            raise KeyError(name)
        return entry

    def read_record(self, entry: IndexEntry) -> Record:
        """One call's full record, read from its byte span of the file."""
        with open(self.path, "rb") as handle:
            handle.seek(entry.start)
            raw = handle.read(entry.end - entry.start)
        try:
            record = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CallError(
                f"{self.path}: the record of {entry.name} no longer parses ({exc}); was the file changed during the run?"
            ) from exc
        if not isinstance(record, dict):
            raise CallError(f"{self.path}: the record of {entry.name} is a {type(record).__name__}, not an object")
        return record


def read_index(path: Path) -> DumpIndex:
    """Scan dump.json once; raise DumpError naming the file and the problem."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DumpError(f"{path}: cannot be read: {exc.strerror or exc}") from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DumpError(f"{path}: is not UTF-8 text ({exc})") from exc
    offsets = _ByteOffsets(text, raw)
    header: Record = {}
    calls = _Calls()

    def visit(key: str, pos: int) -> int:
        if key == "data":
            header["data"] = True
            return _index_data(text, pos, offsets, calls)
        header[key], end = _decode(text, pos, key)
        return end

    try:
        _walk_object(text, 0, visit)
    except _ScanError as exc:
        raise DumpError(f"{path}: is not a valid dump.json: {exc}") from exc
    if "data" not in header:
        raise DumpError(f'{path}: has no "data" object; is it msprobe\'s dump.json?')
    if not calls.names:
        raise DumpError(
            f"{path}: holds no API calls ({calls.modules} Module/Cell entries, {len(calls.skipped_names)} other keys); "
            "dump with level L1 or mix to check API calls"
        )
    task = _header_str(path, header, "task", None)
    if task not in ("tensor", "statistics"):
        raise DumpError(f'{path}: "task" is {header.get("task")!r}; expected "tensor" or "statistics"')
    framework = _header_str(path, header, "framework", "pytorch")
    if framework not in ("pytorch", "mindspore"):
        raise DumpError(f'{path}: "framework" is {framework!r}; expected "pytorch" or "mindspore"')
    return calls.index(path, task, _header_str(path, header, "level", "L1"), framework)


def _header_str(path: Path, header: Record, key: str, default: str | None) -> str:
    value = header.get(key, default)
    if value is None and default is not None:
        return default
    if not isinstance(value, str):
        raise DumpError(f'{path}: "{key}" is {value!r}; expected a string')
    return value


class _Calls:
    """The columns of a DumpIndex, as the scan finds its calls."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.apis: dict[tuple[str, str], int] = {}
        self.columns: tuple[list[int], ...] = ([], [], [], [], [], [])  # api, number, backward, start, end, numel
        self.modules = 0
        self.skipped_names: list[str] = []

    def add(self, name: CallName, start: int, end: int, numel: int) -> None:
        self.names.append(str(name))
        api = self.apis.setdefault((name.api_type, name.api_name), len(self.apis))
        for column, value in zip(
            self.columns, (api, name.index, name.direction == "backward", start, end, numel), strict=True
        ):
            column.append(value)

    def index(self, path: Path, task: str, level: str, framework: str) -> DumpIndex:
        import numpy as np

        api, number, backward, start, end, numel = self.columns
        return DumpIndex(
            path=path,
            task=task,
            level=level,
            framework=framework,
            names=self.names,
            apis=list(self.apis),
            api=np.array(api, dtype=np.int32),
            number=np.array(number, dtype=np.int64),
            backward=np.array(backward, dtype=bool),
            start=np.array(start, dtype=np.int64),
            end=np.array(end, dtype=np.int64),
            numel=np.array(numel, dtype=np.int64),
            modules=self.modules,
            skipped_names=self.skipped_names,
        )


def _index_data(text: str, pos: int, offsets: _ByteOffsets, calls: _Calls) -> int:
    def visit(key: str, value_start: int) -> int:
        value, value_end = _decode(text, value_start, key)
        name = parse_call_name(key)
        if name is not None:
            calls.add(name, offsets.byte(value_start), offsets.byte(value_end), _numel(value))
        elif key.startswith(MODULE_PREFIXES):
            calls.modules += 1
        else:
            calls.skipped_names.append(key)
        return value_end

    if not text.startswith("{", _after_whitespace(text, pos)):
        raise _ScanError('"data" is not an object')
    return _walk_object(text, pos, visit)


def _numel(record: Json) -> int:
    """Elements of every tensor in a record: the cost estimate used to schedule."""
    total = 0
    stack = [record]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            shape = value.get("shape")
            if isinstance(shape, list) and "dtype" in value:
                total += math.prod(s for s in shape if isinstance(s, int) and s > 0)
            else:
                stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return total


class _ScanError(Exception):
    """Where the JSON stops making sense; read_index names the file around it."""


def _decode(text: str, pos: int, key: str) -> tuple[Json, int]:
    try:
        return _DECODER.raw_decode(text, pos)
    except json.JSONDecodeError as exc:
        if exc.msg.startswith("Unterminated") or exc.pos >= len(text.rstrip()):
            raise _ScanError(f"the file ends early (truncated?) in the value of {key!r}") from exc
        raise _ScanError(f"in the value of {key!r}: {exc.msg} at line {exc.lineno} column {exc.colno}") from exc


def _walk_object(text: str, pos: int, visit: Callable[[str, int], int]) -> int:
    """Walk the JSON object at `pos`, calling visit(key, value_start) -> value_end for
    each member, and return the end of the object."""
    pos = _after_whitespace(text, pos)
    if not text.startswith("{", pos):
        raise _ScanError(f"expected an object at character {pos}")
    pos = _after_whitespace(text, pos + 1)
    if text.startswith("}", pos):
        return pos + 1
    while True:
        if not text.startswith('"', pos):
            raise _ScanError(_describe_unexpected(text, pos, "a key"))
        try:
            # json.decoder.scanstring is the decoder's own string scanner (C where built);
            # typeshed does not declare it
            key, pos = json.decoder.scanstring(text, pos + 1)  # type: ignore[attr-defined]
        except json.JSONDecodeError as exc:
            raise _ScanError(exc.msg) from exc
        pos = _after_whitespace(text, pos)
        if not text.startswith(":", pos):
            raise _ScanError(_describe_unexpected(text, pos, f"':' after key {key!r}"))
        pos = _after_whitespace(text, visit(key, _after_whitespace(text, pos + 1)))
        if text.startswith(",", pos):
            pos = _after_whitespace(text, pos + 1)
        elif text.startswith("}", pos):
            return pos + 1
        else:
            raise _ScanError(_describe_unexpected(text, pos, f"',' or '}}' after the value of {key!r}"))


def _describe_unexpected(text: str, pos: int, wanted: str) -> str:
    if pos >= len(text):
        return f"the file ends early (truncated?) where {wanted} was expected"
    return f"expected {wanted} at character {pos}"


class _ByteOffsets:
    """Character offsets -> byte offsets. Free for ASCII files (the usual case)."""

    def __init__(self, text: str, raw: bytes) -> None:
        self._ascii = len(text) == len(raw)
        self._text = text
        self._last_char = 0
        self._last_byte = 0

    def byte(self, char: int) -> int:
        if self._ascii:
            return char
        if char < self._last_char:
            self._last_char = self._last_byte = 0
        self._last_byte += len(self._text[self._last_char : char].encode("utf-8"))
        self._last_char = char
        return self._last_byte
