"""The plugin's options as declared: one row per option (OPTIONS), each a command-line
flag and the same setting as an ini option, with its type, default and documentation
(docs/ renders this table as the options reference), and their declaration to pytest
(`add_options`). Reading them into one typed value is plugin/options.py's."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

import pytest

from pytest_msprobe.dump import DEFAULT_MAX_ELEMENTS


@dataclass(frozen=True)
class Number:
    """A number an option takes: argparse's `type` for its flag, and the same check of its
    ini value, so that both say alike what is wrong."""

    unit: str  # what it counts: "elements", "seconds", ...
    minimum: int
    whole: bool = True

    def __call__(self, raw: str | float) -> int | float:
        try:
            value = int(raw) if self.whole else float(raw)
        except (TypeError, ValueError):
            what = f"a whole number of {self.unit}" if self.whole else f"{self.unit}, e.g. 300"
            raise argparse.ArgumentTypeError(f"{raw!r}: expected {what}") from None
        if value < self.minimum:
            raise argparse.ArgumentTypeError(f"{raw!r}: must be at least {self.minimum}")
        return value

    @property
    def described(self) -> str:
        """The type as the reference states it."""
        return f"{'integer' if self.whole else 'number'} >= {self.minimum} ({self.unit})"


@dataclass(frozen=True)
class Option:
    """One option: its flag, its ini setting and its documentation (docs/ renders this
    table as the options reference, so an option documents itself where it is declared)."""

    name: str  # the ini name; the flag is --msprobe-<name with dashes>
    help: str  # pytest's style: a capitalised phrase, no trailing period
    kind: str = "string"  # "string", "bool", "path" (one file or folder), "paths" (repeatable)
    default: Any = None  # Any: of the option's kind (a str, a bool, a list), as parser.addini takes it
    metavar: str | None = None  # the value's name in --help (argparse's default: the dest in capitals)
    number: Number | None = None  # a typed number: checked by argparse, and read back as one
    choices: tuple[str, ...] | None = None
    details: str = ""  # what --help has no room for: the reference's paragraph (MyST Markdown)

    @property
    def described(self) -> str:
        """The help text, with the default where there is one to state."""
        return self.help if self.default in (None, False, ()) else f"{self.help} (default: {self.default})"

    @property
    def flag(self) -> str:
        return "--msprobe-" + self.name.removeprefix("msprobe_").replace("_", "-")

    @property
    def type_name(self) -> str:
        """What the option takes, in words (the reference's Type)."""
        if self.number is not None:
            return self.number.described
        if self.choices:
            return "one of " + ", ".join(self.choices)
        return {"bool": "flag", "path": "path", "paths": "path, repeatable"}.get(self.kind, "text")


DEVICES = ("auto", "cpu", "cuda", "npu")

OPTIONS = (
    Option(
        "msprobe_dump",
        "A dump.json, or a folder searched for dump.json files (repeatable)",
        "paths",
        (),
        details="A folder of ranks or steps gives one suite per dump.json. Without other paths on the command line only "
        "the dump's tests run.",
    ),
    Option(
        "msprobe_device",
        "Device under test: auto (npu, else cuda, else cpu), cpu, cuda or npu",
        default="auto",
        choices=DEVICES,
        details="`auto` takes npu where torch_npu works, else cuda, else the CPU.",
    ),
    Option(
        "msprobe_out",
        "Folder for the result files",
        "path",
        default="msprobe-out",
        details="One run at a time: a run started into a folder another run is writing is refused (give concurrent "
        "shards their own folders and merge them with `msprobe-merge`).",
    ),
    Option("msprobe_strict", "Accuracy warnings fail the test too", "bool", False),
    Option(
        "msprobe_known_defects",
        "A call failing by a known library defect fails, or is an expected failure (xfail)",
        default="fail",
        choices=("fail", "xfail"),
        details="A call judged error whose failure matches a row of the known defects (torch's CPU kernels: "
        "{doc}`../explanation/findings`) names the row in its message, the result files (`known_defect`) and the "
        "HTML report. `xfail` reports it as an expected failure with the row in the reason (`-rx` lists them); it "
        "never passes. The summary counts known defects apart either way.",
    ),
    Option(
        "msprobe_max_elements",
        "Largest tensor (elements) a call may create; larger calls skip",
        default=str(DEFAULT_MAX_ELEMENTS),
        metavar="N",
        number=Number("elements", 1),
        details="A larger call skips before allocating anything.",
    ),
    Option(
        "msprobe_standards",
        "A CSV file that routes APIs to standards or overrides thresholds",
        "path",
        metavar="FILE",
        details="Columns `api,standard` and/or `api,dtype,threshold,value` (dtype `*` for all). Checked at start-up: an "
        "unregistered standard, a threshold no standard reads or a dtype that is not floating is a usage error.",
    ),
    Option(
        "msprobe_offline",
        "Tensor dumps: the dumped outputs are the device result; only the bench runs here",
        "bool",
        False,
        details="Checks a dump on any machine, with the CPU running the call in the dump's dtype as the reference.",
    ),
    Option(
        "msprobe_overflow_mode",
        "The device's float overflow mode: auto (read from torch_npu on an NPU, else unknown), saturation "
        "(an overflow gives +-max finite, NaN gives 0) or inf-nan (IEEE 754: +-inf and NaN)",
        default="auto",
        choices=("auto", "saturation", "inf-nan"),
        metavar="MODE",
        details="Where the bench overflows an output's dtype, an output whose device gives the largest finite value "
        "(CANN's saturation mode) or +-inf (INF/NaN mode) gets a finding of that mode, counted apart in the summary "
        "and the report; saturated elements are judged as the bench's inf/NaN, not as accuracy errors. A stated mode "
        "(or, on auto, the one torch_npu reads from the NPU under test; never with `--msprobe-offline`) makes an "
        "output that shows the other mode an error. See {doc}`../explanation/accuracy-model`.",
    ),
    Option(
        "msprobe_baseline_save",
        "Record every call's and kernel's metrics, and the environment, as a baseline in this folder (the summary "
        "says where)",
        "path",
        metavar="DIR",
        details="Written to `DIR/msprobe-baseline.jsonl`, one sorted line per call: diffable. The msprobe summary "
        "says where (`baseline saved: DIR/msprobe-baseline.jsonl (49 calls, 8 kernels of 1 dump)`).",
    ),
    Option(
        "msprobe_baseline",
        "Judge every call against the baseline recorded in this folder; report regressions",
        "path",
        metavar="DIR",
        details="The summary names regressions (with the ratio), improvements, new and vanished calls. The same dump "
        "(found by its content from any folder: SHA-256 of dump.json and of every tensor file it names) is judged "
        "against its recorded metrics, its kernels pooled and compared with the recorded ones. Another dump of the "
        "model, as after an operator upgrade (dump A recorded before it, this run's dump B after it), has its calls "
        "paired with the baseline's by name and signature (API, direction, dtypes, shapes, non-tensor arguments; by "
        "signature in order where names shifted), each judged against its own bench; unpaired calls are listed as new "
        "or vanished, and a dump of another model compares nothing. A dump of which nothing was compared is a "
        "`WARNING` line in the summary and a pytest warning (with `--msprobe-gate`, a failed run). See "
        "{doc}`../how-to/upgrade-gate`.",
    ),
    Option(
        "msprobe_baseline_update",
        "With --msprobe-baseline: rewrite the baseline records of the calls that ran",
        "bool",
        False,
        details="Choose the calls to rewrite with `-k`.",
    ),
    Option(
        "msprobe_gate",
        "With --msprobe-baseline: the run's outcome gates an operator upgrade (exit 1: a regression; 4: nothing "
        "was compared)",
        "bool",
        False,
        details="A call that fails now and failed the same way in the baseline is an expected failure (xfail); a "
        "regression (a worse verdict, or a key metric grown beyond what two correct kernels differ by, as the "
        "docs' study of the upgrade gate's limits measured) fails, naming before and after, as does a kernel that regressed "
        "(`<api>.<dtype>.kernel.<direction>.regression`). The baseline may be of another dump of the model "
        "(see `--msprobe-baseline`). A gate that compared nothing of a dump whose calls ran (a baseline of other "
        "dumps, a dump of another model or paired below half its calls) fails the run with exit status 4, "
        "pytest's usage error, and one `ERROR: --msprobe-gate:` line saying why; regressions exit 1.",
    ),
    Option(
        "msprobe_reference_csv",
        "An msprobe accuracy_checking_details CSV (run_ut on another device) used as each call's reference",
        "path",
        metavar="FILE",
        details="Each test's `msprobe_reference` then says `reference CSV`.",
    ),
    Option(
        "msprobe_resume",
        "Skip calls whose results are already in --msprobe-out's newest run, append the rest to its files",
        "bool",
        False,
        details="The exit status is the whole result set's: errors of the resumed run fail it too.",
    ),
    Option(
        "msprobe_config",
        "The config.json of msprobe: its acc_check (run_ut) white_list, black_list and error_data_path apply",
        "path",
        metavar="FILE",
    ),
    Option(
        "msprobe_white_list",
        "Check only these APIs, comma separated (linear,conv2d or Functional.linear)",
        metavar="A,B",
        details="An entry that matches no API of the dumps is a usage error naming the closest API names.",
    ),
    Option(
        "msprobe_black_list",
        "Never check these APIs, comma separated",
        metavar="A,B",
        details="An entry that matches no API of the dumps is a usage error naming the closest API names.",
    ),
    Option(
        "msprobe_dedup",
        "Check one call per API and argument signature (dtypes, shapes, non-tensor arguments)",
        "bool",
        False,
        details="One test per API, direction and argument signature; the summary says how many dumped tests the tests "
        "stand for and lists those that stand for the most; each test's count is its `msprobe_represents` JUnit property "
        "and the metrics file's `represents` column.",
    ),
    Option(
        "msprobe_save_failed",
        "Folder for the inputs and outputs of failed calls (.pt for torch.load(weights_only=True) + call.json)",
        "path",
        metavar="DIR",
    ),
    Option(
        "msprobe_scripts",
        "Folder for a standalone script reproducing every failed call: DIR/<call name>.py, its tensors in "
        "DIR/<call name>.pt, and DIR/_msprobe_judge.py, the judging library for machines without pytest-msprobe",
        "path",
        metavar="DIR",
    ),
    Option(
        "msprobe_scripts_all",
        "Write a script for every selected call, not only the failed ones (needs --msprobe-scripts)",
        "bool",
        False,
    ),
    Option(
        "msprobe_bug_reports",
        "Write a bug report folder for every failing call under this folder: the call reduced to the smallest "
        "input that fails the same way, as a one-call dump and a standalone script, with the verdicts and the "
        "environment (tensor dumps)",
        "path",
        metavar="DIR",
        details="Each failing call gets `DIR/<dump>/<call name>/`: `README.md` (what fails, how small, how to run "
        "it), `dump/dump.json` with `dump/dump_tensor_data/` (the reduced call, judged by "
        "`pytest --msprobe-dump=dump/dump.json`), the call's standalone script with its tensors in a `.pt` file, and "
        "`report.json` (the verdicts before and after the reduction, its steps, the environment's versions and "
        "device, the known defect it matches). The reduction slices the dimensions the API allows (the `[reduce]` "
        "table of `api_tables/pytorch.toml`: a softmax's reduced dimension, a norm's normalized ones stay whole), "
        "halving first, then makes inputs constant where the failure does not depend on them; a candidate is kept "
        "only where the plugin's own verdict on it fails with the same standard and the same reasons (a bias in "
        "the same direction). Offline, the dumped outputs are sliced with the inputs. At most "
        "`--msprobe-bug-report-tries` candidates are judged per call; nothing runs for passing calls or without "
        "this option. `msprobe-script DUMP CALL --bug-report -o DIR` writes one call's folder.",
    ),
    Option(
        "msprobe_bug_report_tries",
        "At most this many reduced candidates judged per failing call (needs --msprobe-bug-reports)",
        default=64,
        number=Number("candidates", 1),
    ),
    Option(
        "msprobe_html",
        "Write a self-contained HTML report of the run to this file, failures first: counts, environment, "
        "failing kernels, a sortable table of every call with the metrics that failed and their limits, "
        "and plots of each failing or warning call's elements",
        "path",
        metavar="FILE",
    ),
    Option(
        "msprobe_html_all",
        "The HTML report plots every call's outputs, not only failing and warning ones (needs --msprobe-html)",
        "bool",
        False,
    ),
    Option(
        "msprobe_devices",
        "Device ids the xdist workers are spread over round robin, e.g. 0,1,2,3 (they index into "
        "CUDA_VISIBLE_DEVICES / ASCEND_RT_VISIBLE_DEVICES when those are set); default: every visible device",
        metavar="IDS",
    ),
    Option(
        "msprobe_shard",
        "Run a deterministic 1/N of the calls: I/N with I in 1..N (a CI matrix or several hosts; join their results with msprobe-merge)",
        metavar="I/N",
        details="Calls are assigned to shards by their name, so every host and every rank agree.",
    ),
    Option(
        "msprobe_explore",
        "Explore every selected call with up to N hypothesis examples around its dumped inputs "
        "(larger, smaller, offset, extreme and special values, other sizes): one more test per call, "
        "<call name>.explore; a failure is shrunk to a minimal input (0: off)",
        default="0",
        metavar="N",
        number=Number("examples", 0),
        details="Not with `--msprobe-offline` (the dump has no outputs for new inputs).",
    ),
    Option(
        "msprobe_repeat",
        "Run the device this many times on each call's inputs and fail a call whose outputs differ "
        "bitwise between runs (nondeterministic kernels); online only",
        default="1",
        metavar="K",
        number=Number("device runs", 1),
        details="Not with `--msprobe-offline`, whose device result is the dump's one run.",
    ),
    Option(
        "msprobe_timeout",
        "Seconds one call may run (0: no limit): past it the call errors and the run goes on; a call "
        "stuck inside a kernel for 2 to 2.5 times as long ends its process (under -n, xdist replaces the worker)",
        default="300",
        metavar="SECONDS",
        number=Number("seconds", 0, whole=False),
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
            group.addoption(
                option.flag, action="append", default=None, dest=option.name, metavar="PATH", help=option.help
            )
            parser.addini(option.name, option.help, type="paths", default=[])
        elif option.kind == "path":
            # No ini default: a value read back from the ini came from a file (or -o), and is relative to it.
            group.addoption(
                option.flag, default=None, dest=option.name, metavar=option.metavar or "PATH", help=option.described
            )
            parser.addini(option.name, option.described, default=None)
        else:
            group.addoption(
                option.flag,
                default=None,
                dest=option.name,
                help=option.described,
                metavar=option.metavar,
                type=option.number,
                choices=option.choices,
            )
            parser.addini(option.name, option.described, default=option.default)
