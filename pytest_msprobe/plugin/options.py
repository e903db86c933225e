"""The plugin's options read once, at configure, into one frozen, typed Options value
that every hook reads (`of`): a misspelt option is then a type error, not a silent
None, and every check of a value (alone, or with another: COMBINATIONS) is made once,
up front. Their declarations (flags, ini names, types, help) are plugin/option_table.py's.

A relative path means what pytest makes it mean where it was written: on the command
line, relative to the current folder; in an ini file (or `-o`), relative to that ini
file's folder, as pytest's own `paths` options are. So `msprobe_dump = step0` in a
project's pytest.ini works from any subfolder of the project. Every path option is
resolved by that one rule, in one place (`locate_path`)."""

from __future__ import annotations

import argparse
import functools
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_msprobe.plugin.option_table import OPTIONS_BY_NAME
from pytest_msprobe.plugin.scheduling import parse_shard

if TYPE_CHECKING:
    from pytest_msprobe.standards.verdict import Status


@dataclass(frozen=True)
class Options:
    """Every option's value, read once at configure from its flag or its ini setting,
    checked and typed: every hook reads these fields, never the options by name. A
    field is its option's name without `msprobe_` (tests/plugin/test_options.py holds the two
    to each other); a path is absolute (see `locate_path`)."""

    dump: tuple[Path, ...]  # every dump.json the option names (dump_files)
    device: str
    out: Path
    strict: bool
    known_defects: str  # "fail" or "xfail": how a call failing by a known library defect is reported
    max_elements: int
    standards: Path | None
    offline: bool
    overflow_mode: str
    baseline_save: Path | None
    baseline: Path | None
    baseline_update: bool
    gate: bool
    reference_csv: Path | None
    resume: bool
    config: Path | None
    white_list: tuple[str, ...]
    black_list: tuple[str, ...]
    dedup: bool
    save_failed: Path | None
    scripts: Path | None
    scripts_all: bool
    bug_reports: Path | None
    bug_report_tries: int
    html: Path | None
    html_all: bool
    devices: tuple[int, ...] | None  # None: every visible device
    shard: tuple[int, int] | None  # (I, N); None: no sharding
    explore: int
    repeat: int
    timeout: float
    # Not an option: --msprobe-baseline (else --msprobe-reference-csv) as the user wrote
    # it, which is what the HTML report names the recorded metrics by.
    reference_label: str | None

    @property
    def sample_statuses(self) -> frozenset[Status]:
        """The verdict statuses whose outputs keep an element sample for the HTML report
        (judge/check/samples.py): none without --msprobe-html, so a run without it costs nothing."""
        if self.html is None:
            return frozenset()
        return SAMPLED_EVERY if self.html_all else SAMPLED_FAILING

    @property
    def cache_folder(self) -> Path:
        """Where the dumps' index caches live: inside --msprobe-out."""
        from pytest_msprobe.dump.cache import CACHE_FOLDER

        return self.out / CACHE_FOLDER


SAMPLED_FAILING: frozenset[Status] = frozenset({"error", "warning"})
SAMPLED_EVERY: frozenset[Status] = frozenset({"error", "warning", "pass"})

# Options that need another, or cannot go with one: (broken, what to do), checked once
# the options are read, in this order.
COMBINATIONS: tuple[tuple[Callable[[Options], bool], str], ...] = (
    (
        lambda chosen: chosen.html_all and chosen.html is None,
        "--msprobe-html-all needs --msprobe-html=FILE, the report to write",
    ),
    (
        lambda chosen: chosen.repeat > 1 and chosen.offline,
        "--msprobe-repeat runs the device again on each call's inputs, and --msprobe-offline "
        "runs no device (the dumped outputs are the device's, one run): drop one of them",
    ),
    (
        lambda chosen: chosen.explore > 0 and chosen.offline,
        "--msprobe-explore replays inputs the dump has no outputs for, so it needs the device under "
        "test: drop --msprobe-offline (explore on the machine that has the device)",
    ),
    (
        lambda chosen: chosen.scripts_all and chosen.scripts is None,
        "--msprobe-scripts-all needs --msprobe-scripts=DIR, the folder to write the scripts in",
    ),
    (
        lambda chosen: chosen.baseline_update and chosen.baseline is None,
        "--msprobe-baseline-update needs --msprobe-baseline=DIR, the baseline to update "
        "(to record a new baseline of every call, use --msprobe-baseline-save=DIR)",
    ),
)

OPTIONS_KEY = pytest.StashKey[Options]()


def read(config: pytest.Config) -> Options | None:
    """The options, read, checked and kept in the config's stash for every hook (`of`);
    None where no dump is named: the plugin then does nothing, and checks nothing."""
    dumps = dump_files(config)
    if not dumps:
        return None
    from pytest_msprobe.dump.filters import split_names

    flag, text, path, whole = (
        functools.partial(_flag, config),
        functools.partial(_text, config),
        functools.partial(locate_path, config),
        functools.partial(_whole, config),
    )
    chosen = Options(
        dump=tuple(dumps),
        device=str(text("msprobe_device")),
        out=_out(config),
        strict=flag("msprobe_strict"),
        known_defects=_choice(config, "msprobe_known_defects"),
        max_elements=whole("msprobe_max_elements"),
        standards=path("msprobe_standards"),
        offline=flag("msprobe_offline"),
        overflow_mode=_chosen(config, "msprobe_overflow_mode"),
        baseline_save=path("msprobe_baseline_save"),
        baseline=path("msprobe_baseline"),
        baseline_update=flag("msprobe_baseline_update"),
        gate=flag("msprobe_gate"),
        reference_csv=path("msprobe_reference_csv"),
        resume=flag("msprobe_resume"),
        config=path("msprobe_config"),
        white_list=split_names(text("msprobe_white_list")),
        black_list=split_names(text("msprobe_black_list")),
        dedup=flag("msprobe_dedup"),
        save_failed=path("msprobe_save_failed"),
        scripts=path("msprobe_scripts"),
        scripts_all=flag("msprobe_scripts_all"),
        bug_reports=path("msprobe_bug_reports"),
        bug_report_tries=whole("msprobe_bug_report_tries"),
        html=path("msprobe_html"),
        html_all=flag("msprobe_html_all"),
        devices=device_list(text("msprobe_devices")),
        shard=parse_shard(text("msprobe_shard")),
        explore=whole("msprobe_explore"),
        repeat=whole("msprobe_repeat"),
        timeout=float(_number(config, "msprobe_timeout")),
        reference_label=text("msprobe_baseline") or text("msprobe_reference_csv"),
    )
    for broken, message in COMBINATIONS:
        if broken(chosen):
            raise pytest.UsageError(message)
    config.stash[OPTIONS_KEY] = chosen
    return chosen


def of(config: pytest.Config) -> Options:
    """The options `read` at configure (only where a dump is named)."""
    return config.stash[OPTIONS_KEY]


def _given(config: pytest.Config, name: str) -> Any:  # Any: of the option's kind (a str, bool, number or list of paths)
    """The flag when given, else the ini value (whose default is the option's)."""
    value = config.getoption(name)
    return value if value is not None else config.getini(name)


def _flag(config: pytest.Config, name: str) -> bool:
    return bool(_given(config, name))


def _choice(config: pytest.Config, name: str) -> str:
    """An option of a few values: the ini setting is checked as argparse checks the flag."""
    from pytest_msprobe.plugin.option_table import OPTIONS

    value = str(_text(config, name))
    (choices,) = (option.choices for option in OPTIONS if option.name == name)
    if choices and value not in choices:
        raise pytest.UsageError(f"{name} = {value!r}: expected one of {', '.join(choices)}")
    return value


def _text(config: pytest.Config, name: str) -> str | None:
    value = _given(config, name)
    return str(value) if value else None


def locate_path(config: pytest.Config, name: str) -> Path | None:
    """A path option, absolute, by the one rule every path option follows: the flag
    relative to the current folder, the ini value (or -o) relative to the ini file's
    folder, else the option's default (relative to the current folder); None where the
    option is not set (or set to nothing) and has no default."""
    given = config.getoption(name)
    if given:
        return Path(config.invocation_params.dir) / str(given)
    written = config.getini(name)
    if written:
        return ini_folder(config) / str(written)
    default = OPTIONS_BY_NAME[name].default
    return Path(config.invocation_params.dir) / default if default else None


def _out(config: pytest.Config) -> Path:
    """--msprobe-out, which has a default."""
    folder = locate_path(config, "msprobe_out")
    assert folder is not None
    return folder


def ini_folder(config: pytest.Config) -> Path:
    """What an ini value's relative path is relative to (pytest's rule for `paths`)."""
    return config.inipath.parent if config.inipath is not None else Path(config.invocation_params.dir)


def dump_files(config: pytest.Config) -> list[Path]:
    """Every dump.json the options name, in a stable order; a named path that does not
    exist or holds no dump.json is a usage error."""
    found: list[Path] = []
    base = Path(config.invocation_params.dir)
    given = config.getoption("msprobe_dump")
    # ini paths arrive absolute (pytest resolves `paths` against the ini file's folder)
    for raw in given if given is not None else config.getini("msprobe_dump"):
        path = Path(raw) if Path(raw).is_absolute() else (base / raw).resolve()
        if path.is_file():
            found.append(path)
        elif path.is_dir():
            inside = sorted(path.rglob("dump.json"))
            if not inside:
                raise pytest.UsageError(f"--msprobe-dump {raw}: no dump.json found in this folder")
            found.extend(inside)
        else:
            where = "" if given is not None else f" (msprobe_dump in {config.inipath}, relative to its folder)"
            raise pytest.UsageError(f"--msprobe-dump {raw}: no such file or folder{where}")
    return list(dict.fromkeys(found))


def _chosen(config: pytest.Config, name: str) -> str:
    """A choice option's value: the flag's, which argparse checked, or the ini value,
    checked here against the same choices."""
    option = OPTIONS_BY_NAME[name]
    value = str(_given(config, name))
    if option.choices and value not in option.choices:
        raise pytest.UsageError(f"{option.flag} {value!r}: expected one of {', '.join(option.choices)}")
    return value


def _number(config: pytest.Config, name: str) -> int | float:
    """A number option's value: the flag's, which argparse checked, or the ini value,
    checked here the same way (an ini file is read after the command line is parsed)."""
    option = OPTIONS_BY_NAME[name]
    assert option.number is not None, f"{option.flag} takes no number"
    try:
        return option.number(_given(config, name))
    except argparse.ArgumentTypeError as exc:
        raise pytest.UsageError(f"{option.flag} {exc}") from None


def _whole(config: pytest.Config, name: str) -> int:
    return int(_number(config, name))


def device_list(raw: str | None) -> tuple[int, ...] | None:
    """The ids of --msprobe-devices as written (None: every visible device); a list
    that is not one is a usage error, told without asking any device."""
    if not raw:
        return None
    try:
        ids = tuple(int(part) for part in str(raw).split(",") if part.strip())
    except ValueError:
        raise pytest.UsageError(
            f"--msprobe-devices {raw!r}: expected device ids separated by commas, e.g. 0,1,2,3"
        ) from None
    if not ids:
        raise pytest.UsageError(f"--msprobe-devices {raw!r}: name at least one device id")
    return ids


#: the options that decide a call's verdict, which a command rerunning one test repeats
#: (not those choosing the calls, such as the lists or a shard, or writing files)
VERDICT_OPTIONS = (
    "msprobe_device",
    "msprobe_strict",
    "msprobe_max_elements",
    "msprobe_standards",
    "msprobe_offline",
    "msprobe_baseline",
    "msprobe_gate",
    "msprobe_reference_csv",
    "msprobe_config",
    "msprobe_explore",
    "msprobe_repeat",
    "msprobe_timeout",
)


def reproduce_command(config: pytest.Config, dump: Path, test: str) -> str:
    """`pytest --msprobe-dump=DUMP <the options given> 'DUMP::TEST'`: run from the folder
    this run was started in, the one test of `dump` named `test`, judged as here."""
    from pytest_msprobe.plugin.pytest_privates import bestrelpath

    where = bestrelpath(Path(config.invocation_params.dir), dump)
    words = ["pytest", f"--msprobe-dump={where}"]
    for name in VERDICT_OPTIONS:
        value = config.getoption(name)
        if value is True:
            words.append(OPTIONS_BY_NAME[name].flag)
        elif value not in (None, False):
            words.append(f"{OPTIONS_BY_NAME[name].flag}={value}")
    words.append(f"{where}::{test}")
    return shlex.join(words)
