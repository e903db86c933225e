"""The plugin's options: each one a command-line flag and the same setting as an ini
option, declared once in a table.

A relative path means what pytest makes it mean where it was written: on the command
line, relative to the current folder; in an ini file (or `-o`), relative to that ini
file's folder, as pytest's own `paths` options are. So `msprobe_dump = step0` in a
project's pytest.ini works from any subfolder of the project."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_msprobe.dump import DEFAULT_MAX_ELEMENTS


@dataclass(frozen=True)
class Option:
    name: str  # the ini name; the flag is --msprobe-<name with dashes>
    help: str
    kind: str = "string"  # "string", "bool", "path" (one file or folder), "paths" (repeatable)
    default: Any = None  # Any: of the option's kind (a str, a bool, a list), as parser.addini takes it

    @property
    def described(self) -> str:
        """The help text, with the default where there is one to state."""
        return self.help if self.default in (None, False, ()) else f"{self.help} (default: {self.default})"

    @property
    def flag(self) -> str:
        return "--msprobe-" + self.name.removeprefix("msprobe_").replace("_", "-")


OPTIONS = (
    Option("msprobe_dump", "dump.json, or a folder searched for dump.json files (repeatable)", "paths", ()),
    Option("msprobe_device", "device under test: auto (npu, else cuda, else cpu), cpu, cuda or npu", default="auto"),
    Option("msprobe_out", "folder for result files", "path", default="msprobe-out"),
    Option("msprobe_strict", "accuracy warnings fail the test too", "bool", False),
    Option("msprobe_max_elements", "largest tensor (elements) a call may create; larger calls skip", default=str(DEFAULT_MAX_ELEMENTS)),
    Option("msprobe_standards", "a CSV file that routes APIs to standards or overrides thresholds (see README)", "path"),
    Option("msprobe_offline", "tensor dumps: the dumped outputs are the device result; only the bench runs here", "bool", False),
    Option("msprobe_baseline_save", "record every call's metrics, and the environment, as a baseline in this folder", "path"),
    Option(
        "msprobe_baseline",
        "judge every call against the baseline recorded in this folder (the same dump: against its recorded "
        "metrics; another dump of the model, as after an upgrade: its calls paired by name and signature, each "
        "against its own bench); report regressions",
        "path",
    ),
    Option("msprobe_baseline_update", "with --msprobe-baseline: rewrite the baseline records of the calls that ran", "bool", False),
    Option(
        "msprobe_gate",
        "with --msprobe-baseline: the run's outcome gates an operator upgrade: a call that fails now and failed "
        "the same way in the baseline is an expected failure (xfail); a regression (a worse verdict, or a key "
        "metric grown beyond what two correct kernels differ by) fails, naming before and after; the baseline "
        "may be of another dump of the model (dump A before the upgrade, this run's dump B after it: calls are "
        "paired by name and signature)",
        "bool",
        False,
    ),
    Option(
        "msprobe_reference_csv", "an msprobe accuracy_checking_details CSV (run_ut on another device) used as each call's reference", "path"
    ),
    Option(
        "msprobe_resume", "skip calls whose results are already in --msprobe-out's newest run, append the rest to its files", "bool", False
    ),
    Option("msprobe_config", "msprobe's config.json: its acc_check (run_ut) white_list, black_list and error_data_path apply", "path"),
    Option("msprobe_white_list", "check only these APIs, comma separated (linear,conv2d or Functional.linear)"),
    Option("msprobe_black_list", "never check these APIs, comma separated"),
    Option("msprobe_dedup", "check one call per API and argument signature (dtypes, shapes, non-tensor arguments)", "bool", False),
    Option(
        "msprobe_save_failed",
        "folder for the inputs and outputs of failed calls (.pt for torch.load(weights_only=True) + call.json)",
        "path",
    ),
    Option("msprobe_scripts", "folder for a standalone script (DIR/<call name>.py) reproducing every failed call", "path"),
    Option(
        "msprobe_scripts_all", "write a script for every selected call, not only the failed ones (needs --msprobe-scripts)", "bool", False
    ),
    Option(
        "msprobe_html",
        "write a self-contained HTML report of the run to this file: counts, environment, a sortable "
        "table of every call, and plots of each failing or warning call's elements",
    ),
    Option(
        "msprobe_html_all",
        "the HTML report plots every call's outputs, not only failing and warning ones (needs --msprobe-html)",
        "bool",
        False,
    ),
    Option(
        "msprobe_devices",
        "device ids the xdist workers are spread over round robin, e.g. 0,1,2,3 (they index into "
        "CUDA_VISIBLE_DEVICES / ASCEND_RT_VISIBLE_DEVICES when those are set); default: every visible device",
    ),
    Option(
        "msprobe_shard",
        "run a deterministic 1/N of the calls: I/N with I in 1..N (a CI matrix or several hosts; join their results with msprobe-merge)",
    ),
    Option(
        "msprobe_explore",
        "explore every selected call with up to N hypothesis examples around its dumped inputs "
        "(larger, smaller, offset, extreme and special values, other sizes): one more test per call, "
        "<call name>.explore; a failure is shrunk to a minimal input (0: off)",
        default="0",
    ),
    Option(
        "msprobe_repeat",
        "run the device this many times on each call's inputs and fail a call whose outputs differ "
        "bitwise between runs (nondeterministic kernels); online only",
        default="1",
    ),
    Option(
        "msprobe_timeout",
        "seconds one call may run (0: no limit): past it the call errors and the run goes on; a call "
        "stuck inside a kernel for 2 to 2.5 times as long ends its process (under -n, xdist replaces the worker)",
        default="300",
    ),
)

OPTIONS_BY_NAME = {option.name: option for option in OPTIONS}


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("msprobe", "msprobe dump replay (pytest-msprobe)")
    for option in OPTIONS:
        if option.kind == "bool":
            group.addoption(option.flag, action="store_true", default=None, dest=option.name, help=option.help)
            parser.addini(option.name, option.help, type="bool", default=option.default)
        elif option.kind == "paths":
            group.addoption(option.flag, action="append", default=None, dest=option.name, metavar="PATH", help=option.help)
            parser.addini(option.name, option.help, type="paths", default=[])
        elif option.kind == "path":
            # No ini default: a value read back from the ini came from a file (or -o), and is relative to it.
            group.addoption(option.flag, default=None, dest=option.name, metavar="PATH", help=option.described)
            parser.addini(option.name, option.described, default=None)
        else:
            group.addoption(option.flag, default=None, dest=option.name, help=option.described)
            parser.addini(option.name, option.described, default=option.default)


def get(config: pytest.Config, name: str) -> Any:  # Any: of the option's kind (a str, bool or list of paths)
    """The flag when given, else the ini value (whose default is the option's)."""
    value = config.getoption(name)
    return value if value is not None else config.getini(name)


def path(config: pytest.Config, name: str) -> Path | None:
    """A path option, absolute: the flag relative to the current folder, the ini value
    relative to the ini file's folder, else the option's default (relative to the
    current folder); None where the option is not set and has no default."""
    given = config.getoption(name)
    if given is not None:
        return Path(config.invocation_params.dir) / given
    written = config.getini(name)
    if written:
        return ini_folder(config) / written
    default = OPTIONS_BY_NAME[name].default
    return Path(config.invocation_params.dir) / default if default else None


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


def whole_number(config: pytest.Config, name: str, what: str, minimum: int) -> int:
    """An option that counts something, checked: at least `minimum`."""
    raw, flag = get(config, name), OPTIONS_BY_NAME[name].flag
    try:
        value = int(raw)
    except (TypeError, ValueError):
        raise pytest.UsageError(f"{flag} {raw!r}: expected a whole number of {what}") from None
    if value < minimum:
        raise pytest.UsageError(f"{flag} {raw!r}: must be at least {minimum}")
    return value


def max_elements(config: pytest.Config) -> int:
    return whole_number(config, "msprobe_max_elements", "elements", 1)


def explore_examples(config: pytest.Config) -> int:
    """--msprobe-explore's examples per call (0: no exploration). Exploring replays new
    inputs, which a dump has no outputs for: it needs the device, not --msprobe-offline."""
    examples = whole_number(config, "msprobe_explore", "examples", 0)
    if examples and get(config, "msprobe_offline"):
        raise pytest.UsageError(
            "--msprobe-explore replays inputs the dump has no outputs for, so it needs the device under "
            "test: drop --msprobe-offline (explore on the machine that has the device)"
        )
    return examples


def repeat(config: pytest.Config) -> int:
    """--msprobe-repeat: how many times the device runs each call (1: once, no check)."""
    value = whole_number(config, "msprobe_repeat", "device runs", 1)
    if value > 1 and get(config, "msprobe_offline"):
        raise pytest.UsageError(
            "--msprobe-repeat runs the device again on each call's inputs, and --msprobe-offline "
            "runs no device (the dumped outputs are the device's, one run): drop one of them"
        )
    return value


def out_folder(config: pytest.Config) -> Path:
    """--msprobe-out, absolute."""
    folder = path(config, "msprobe_out")
    assert folder is not None  # it has a default
    return folder


def cache_folder(config: pytest.Config) -> Path:
    """Where the dumps' index caches live: inside --msprobe-out."""
    from pytest_msprobe.dump.cache import CACHE_FOLDER

    return out_folder(config) / CACHE_FOLDER


SAMPLED_FAILING = frozenset({"error", "warning"})
SAMPLED_EVERY = frozenset({"error", "warning", "pass"})


def sample_statuses(config: pytest.Config) -> frozenset[str]:
    """The verdict statuses whose outputs keep an element sample for the HTML report
    (judge/samples.py): none without --msprobe-html, so a run without it costs nothing."""
    wanted, every = get(config, "msprobe_html"), bool(get(config, "msprobe_html_all"))
    if every and not wanted:
        raise pytest.UsageError("--msprobe-html-all needs --msprobe-html=FILE, the report to write")
    return (SAMPLED_EVERY if every else SAMPLED_FAILING) if wanted else frozenset()
