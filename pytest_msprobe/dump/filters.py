"""Which calls a run checks: msprobe's white/black lists (its config.json `run_ut`
section, `acc_check` since msprobe 26, or the same as options) and the dedup of
repeated calls with identical argument signatures (msprobe run_ut's `filter_api`).

Plain functions over call names and records; the hook module turns their answers into
deselected tests.
"""

from __future__ import annotations

import difflib
import json
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from pytest_msprobe.dump.index import CallName, Json

CONFIG_SECTIONS = ("acc_check", "run_ut")  # msprobe 26 renamed run_ut to acc_check
# Keys of a tensor's record that describe its values, not its signature.
VALUE_KEYS = frozenset({"Max", "Min", "Mean", "Norm", "data_name", "md5"})


class FilterConfigError(Exception):
    """A config.json or list option that cannot be used: the message says why."""


@dataclass(frozen=True)
class AccCheckConfig:
    """The `acc_check`/`run_ut` section of msprobe's config.json."""

    white_list: tuple[str, ...] = ()
    black_list: tuple[str, ...] = ()
    error_data_path: str | None = None


def read_config(path: Path) -> AccCheckConfig:
    """msprobe's config.json; a file without either section filters nothing."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise FilterConfigError(f"--msprobe-config {path}: cannot be read as JSON ({exc})") from exc
    section: object = next((data[name] for name in CONFIG_SECTIONS if isinstance(data, dict) and name in data), {})
    if not isinstance(section, dict):
        raise FilterConfigError(f"--msprobe-config {path}: the {'/'.join(CONFIG_SECTIONS)} section must be an object")
    lists = {}
    for key in ("white_list", "black_list"):
        value = section.get(key) or []
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise FilterConfigError(
                f'--msprobe-config {path}: {key} must be a list of API names, e.g. ["conv2d", "linear"]'
            )
        lists[key] = tuple(value)
    error_data_path = section.get("error_data_path")
    if error_data_path is not None and not isinstance(error_data_path, str):
        raise FilterConfigError(f"--msprobe-config {path}: error_data_path must be a folder path")
    return AccCheckConfig(lists["white_list"], lists["black_list"], error_data_path)


def split_names(raw: str | None) -> tuple[str, ...]:
    """`linear, conv2d` -> ('linear', 'conv2d')."""
    return tuple(name.strip() for name in (raw or "").split(",") if name.strip())


def is_listed(name: CallName, names: Sequence[str]) -> bool:
    """msprobe matches lists on the API name (`linear` for `Functional.linear.0`); the
    full `Functional.linear` form is accepted too, to tell torch.x from Tensor.x."""
    return name.api_name in names or f"{name.api_type}.{name.api_name}" in names


def find_unmatched(entries: Sequence[str], apis: Iterable[tuple[str, str]], which: str) -> list[str]:
    """What is wrong with each list entry that matches no API of the dumps (`is_listed`'s
    rule): a typo would deselect every call (a white list) or none (a black list)
    without a word. Each names the closest API names (difflib), as msprobe-script does."""
    known = {form for api_type, api_name in apis for form in (api_name, f"{api_type}.{api_name}")}
    problems = []
    for entry in entries:
        if entry in known:
            continue
        close = difflib.get_close_matches(entry, sorted(known), n=3)
        hint = (
            f"did you mean {', '.join(close)}?" if close else f"the dumps' APIs include {', '.join(sorted(known)[:5])}"
        )
        problems.append(f"{which} entry {entry!r} matches no API of the dumps: {hint}")
    return problems


def list_reason(name: CallName, white_list: Sequence[str], black_list: Sequence[str]) -> str | None:
    """Why a call is left out by the lists, None if it is checked."""
    if white_list and not is_listed(name, white_list):
        return "not in the white list"
    if black_list and is_listed(name, black_list):
        return "in the black list"
    return None


def signature(record: Json) -> str:
    """A call's arguments without their values: types, dtypes, shapes, requires_grad
    and every non-tensor argument. Two calls of one API with equal signatures check the
    same kernel on the same kind of input."""

    def strip(value: Json) -> Json:
        if isinstance(value, dict):
            return {key: strip(item) for key, item in value.items() if key not in VALUE_KEYS}
        if isinstance(value, list):
            return [strip(item) for item in value]
        return value

    arguments = {key: record.get(key) for key in ("input_args", "input_kwargs")} if isinstance(record, dict) else record
    return json.dumps(strip(arguments), sort_keys=True, default=str)


DumpKey = TypeVar("DumpKey", bound=Hashable)  # how the caller names a dump (its path)


def dedup(
    calls: Iterable[tuple[DumpKey, CallName]], read_signature: Callable[[DumpKey, CallName], str]
) -> dict[tuple[DumpKey, str], int]:
    """Keep the first test of each (dump, API, direction, signature): kept test (dump,
    test name) -> how many tests it stands for, itself included, so that the counts
    add up to the tests given. A backward test's signature is its call's forward's (the
    arguments it differentiates), so a call's two directions are kept or dropped
    together, except where the call kept for a forward has no backward: then the first
    backward of that signature is kept on its own (every dumped direction is checked)."""
    by_call: dict[tuple[DumpKey, str], list[CallName]] = {}
    for dump, name in calls:
        by_call.setdefault((dump, name.call), []).append(name)
    keepers: dict[tuple[DumpKey, str, str, str, str], tuple[DumpKey, str]] = {}
    counts: Counter[tuple[DumpKey, str]] = Counter()
    for (dump, _call), names in by_call.items():
        first = min(names, key=lambda name: name.direction != "forward")
        signature = read_signature(dump, first)
        for name in names:
            counts[
                keepers.setdefault((dump, name.api_type, name.api_name, name.direction, signature), (dump, str(name)))
            ] += 1
    return dict(counts)
