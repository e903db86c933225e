"""Kernel diversity: the plugin's verdicts on correct kernels must not depend on the kernel path.

Why
---
torch picks its CPU kernels at run time: ``ATEN_CPU_CAPABILITY`` selects the vectorised code
(``default`` = no vectorisation, ``avx2``, ``avx512``) and ``OMP_NUM_THREADS`` how a reduction
is split across threads. Each path is a different *correct* kernel -- it sums in another
order and rounds differently. A rule calibrated on one path that calls another path's
rounding an error (or a warning) would flag healthy hardware. So every correct dump,
whatever path wrote it (the device) and whatever path replays the reference, must give
0 errors and 0 warnings.

How
---
For every dump folder and every path in the matrix ATEN_CPU_CAPABILITY x OMP_NUM_THREADS,
this script copies the dump to a scratch folder and runs, in a subprocess with that
environment::

    python -m pytest -p no:cacheprovider -q --msprobe-dump=<copy>/dump.json \
        --msprobe-device=cpu --msprobe-out=<out> [--msprobe-offline]

in two modes:

* ``single``  -- no reference: the subprocess's path is the device, the calibrated single-run
  rules judge (tensor and statistics dumps);
* ``offline`` -- ``--msprobe-offline``: the dumped outputs are the device (written by the path
  that made the dump; the shipped dumps: torch, one thread, avx512 CPU) and the subprocess's
  path is the reference. Tensor dumps only: statistics dumps have no outputs to judge.

The default dumps include the two MindSpore dumps under tests/dumps/ (mindspore_small_*):
single-run runs MindSpore's CPU kernels as the device and torch's twins as the bench (the
path's ATEN_CPU_CAPABILITY/OMP_NUM_THREADS reach torch; MindSpore's kernels keep their own);
offline judges the dumped MindSpore outputs against MindSpore's CPU kernel. The plugin venv
needs MindSpore for them (2.10 there); calls MindSpore's CPU build lacks skip.

It reads ``<out>/accuracy_checking_result_*.csv`` (UTF-8 with BOM; columns ``API name``,
``Forward Test Success``, ``Backward Test Success``, ``Message``) and counts, forward and
backward together, the statuses judged (pass/warning/error), errors, warnings and SKIPs per
(dump, mode, path). A nonzero pytest exit status is data (a call errored), not a harness
failure; a run that leaves no result CSV is reported as such. Every error and warning is
kept with its call name and Message and printed. ``--csv``/``--markdown`` write the table,
``--events`` the errors/warnings.

More device paths: ``--make MODEL:DTYPE:CAP:THREADS[:LEVEL]`` (repeatable; THREADS defaults to
1, LEVEL to L1; mix adds msprobe's Module.* records, the evidence offline reads a linear's
weight gradient from) first makes a new tensor dump of MODEL in DTYPE with msprobe itself, by
``tests/dumps/models/make_dumps.py MODEL DTYPE OUTDIR --threads THREADS --level LEVEL`` under
ATEN_CPU_CAPABILITY=CAP, using ``--maker-python`` (a separate venv with ``torch==2.13.0`` and
``mindstudio-probe``), and adds it to the dumps to judge; its device path is then
"CAP/THREADSt (dump writer)". ``--make-dump CAP`` is the older short form of
``--make MAKE_MODEL:MAKE_DTYPE:CAP:1``. A made dump is judged offline under every path;
single-run does not depend on who wrote the dump (the device is the subprocess's path), so
``--single-made first`` (default) runs it only on the first dump of each (model, dtype,
task) in the run -- a shipped dump of the same model and dtype comes first, else the first
made one; ``all`` runs it on every made dump, ``none`` on none. Each made dump's tensor
files are compared bitwise with the first made dump of its model and dtype (are they other
kernels' outputs?), and torch's own report of the maker's path is printed.

Example::

    python studies/kernel_diversity.py --markdown /tmp/kd/table.md
    python studies/kernel_diversity.py --caps default avx512 --threads 1 \
        --modes offline tests/dumps/models/gru_tensor_fp32
    python studies/kernel_diversity.py --only-made --make widenorm:bfloat16:avx2:2 \
        --make transformer12:float16:default:1 --events /tmp/kd/events.csv
"""

from __future__ import annotations

import argparse
import filecmp
import glob
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from pytest_msprobe.testing.commands import plugin_command

REPO = Path(__file__).resolve().parent.parent
EXTRA_DUMPS = (
    "examples/mlpcnn_tensor_fp32",
    "tests/dumps/torch_mlpcnn_tensor_fp32",
    "tests/dumps/torch_mlpcnn_mix_tensor_fp16",
    "tests/dumps/torch_mlpcnn_statistics_bf16",
    "tests/dumps/mindspore_small_tensor_fp32",
    "tests/dumps/mindspore_small_statistics_fp32",
)
SHIPPED_WRITER = "avx512/1t (dump writer)"
MINDSPORE_WRITER = "MindSpore (shipped dump writer)"
SHORT_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
JUDGED = ("pass", "warning", "error")
DIRECTIONS = {"Forward Test Success": "forward", "Backward Test Success": "backward"}


@dataclass(frozen=True)
class KernelPath:
    """One CPU kernel path: a vectorisation level, a thread count and, where given, a cap
    on the instruction set oneDNN's GEMM and convolution kernels may use (ONEDNN_MAX_CPU_ISA:
    on an avx512_bf16 CPU, AVX512_CORE changes bfloat16 linear results and AVX2 float32
    and bfloat16 convolutions too)."""

    cap: str
    threads: int
    onednn_isa: str = ""

    @property
    def label(self) -> str:
        return f"{self.cap}/{self.threads}t" + (f"/onednn={self.onednn_isa}" if self.onednn_isa else "")

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["ATEN_CPU_CAPABILITY"] = self.cap
        env["OMP_NUM_THREADS"] = str(self.threads)
        if self.onednn_isa:
            env["ONEDNN_MAX_CPU_ISA"] = self.onednn_isa
        env.pop("PYTEST_ADDOPTS", None)
        return env


@dataclass(frozen=True)
class Dump:
    """A dump folder to judge and the path that wrote its outputs."""

    folder: Path
    name: str
    task: str
    writer: str = SHIPPED_WRITER
    model: str = ""  # with dtype: the single-run key of --single-made first
    dtype: str = ""
    made: bool = False


@dataclass
class RunResult:
    """The counts of one (dump, mode, path) run and its errors/warnings."""

    dump: str
    mode: str
    device: str
    reference: str
    rows: int = 0
    judged: int = 0
    errors: int = 0
    warnings: int = 0
    skips: int = 0
    exit_status: int = 0
    seconds: float = 0.0
    note: str = ""
    events: list[dict[str, str]] = field(default_factory=list)


def default_dumps() -> list[Path]:
    """Every tensor/statistics dump under tests/dumps/models/ but faults/, plus EXTRA_DUMPS."""
    models = sorted(
        Path(p).parent
        for p in glob.glob(str(REPO / "tests/dumps/models/*/dump.json"))
        if Path(p).parent.name != "faults"
    )
    return models + [REPO / extra for extra in EXTRA_DUMPS]


def read_dump(folder: Path, writer: str = SHIPPED_WRITER) -> Dump:
    """The dump's task (tensor/statistics), read from the head of dump.json."""
    with open(folder / "dump.json", encoding="utf-8") as handle:
        head = handle.read(4096)
    task = "statistics" if '"statistics"' in head.split('"data"')[0] else "tensor"
    if '"mindspore"' in head.split('"data"')[0]:
        writer = MINDSPORE_WRITER
    try:
        name = str(folder.resolve().relative_to(REPO))
    except ValueError:
        name = str(folder)
    parsed = re.fullmatch(r"(\w+?)_(?:tensor|statistics)_(fp32|bf16|fp16)", folder.resolve().name)
    model, dtype = (parsed[1], SHORT_DTYPES[parsed[2]]) if parsed else (name, "")
    return Dump(folder=folder, name=name, task=task, writer=writer, model=model, dtype=dtype)


def pytest_command(dump_json: Path, out: Path, offline: bool) -> list[str]:
    """The plugin run of one dump."""
    return plugin_command(dump_json, out, *(["--msprobe-offline"] if offline else []))


def result_csv(out: Path) -> Path | None:
    """The run's accuracy_checking_result_*.csv, if it wrote one."""
    found = sorted(out.glob("accuracy_checking_result_*.csv"))
    return found[-1] if found else None


def count_statuses(frame: pd.DataFrame, result: RunResult) -> None:
    """Fill result's counts and events from a result CSV, forward and backward together."""
    result.rows = len(frame)
    for column, direction in DIRECTIONS.items():
        statuses = frame[column].str.strip()
        result.judged += int(statuses.isin(JUDGED).sum())
        result.errors += int((statuses == "error").sum())
        result.warnings += int((statuses == "warning").sum())
        result.skips += int((statuses == "SKIP").sum())
        flagged = frame[statuses.isin(("error", "warning"))]
        for _, row in flagged.iterrows():
            result.events.append(
                {
                    "dump": result.dump,
                    "mode": result.mode,
                    "device": result.device,
                    "reference": result.reference,
                    "call": row["API name"],
                    "direction": direction,
                    "status": row[column].strip(),
                    "message": row["Message"],
                }
            )


def run_one(dump: Dump, mode: str, path: KernelPath, scratch: Path) -> RunResult:
    """Copy the dump, run the plugin under path's environment, count the result CSV."""
    offline = mode == "offline"
    result = RunResult(
        dump=dump.name,
        mode=mode,
        device=dump.writer if offline else path.label,
        reference=path.label if offline else "none (single-run rules)",
    )
    folder = dump.name.replace("/", "__").replace(":", "_").replace("@", "_")
    work = scratch / folder / f"{mode}_{path.cap}_{path.threads}t"
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(dump.folder, work / "dump")
    out = work / "out"
    started = time.perf_counter()
    proc = subprocess.run(
        pytest_command(work / "dump" / "dump.json", out, offline),
        check=False,
        cwd=work,
        env=path.env(),
        capture_output=True,
        text=True,
    )
    result.seconds = time.perf_counter() - started
    result.exit_status = proc.returncode
    (work / "pytest.log").write_text(proc.stdout + proc.stderr, encoding="utf-8")
    csv_path = result_csv(out)
    if csv_path is None:
        result.note = f"no result CSV (exit {proc.returncode}): see {work / 'pytest.log'}"
        return result
    frame = pd.read_csv(csv_path, encoding="utf-8-sig", dtype=str, keep_default_na=False)
    count_statuses(frame, result)
    return result


def probe_path(path: KernelPath, python: str = sys.executable, threads_call: bool = False) -> str:
    """What torch itself reports under path's environment: capability and thread count
    (threads_call: after torch.set_num_threads(path.threads), as make_dumps.py does)."""
    set_threads = f"torch.set_num_threads({path.threads}); " if threads_call else ""
    code = f"import torch; {set_threads}print(torch.backends.cpu.get_cpu_capability(), torch.get_num_threads())"
    proc = subprocess.run([python, "-c", code], check=False, env=path.env(), capture_output=True, text=True)
    return proc.stdout.strip() or proc.stderr.strip()[-200:]


@dataclass(frozen=True)
class MakeSpec:
    """A dump to make: MODEL:DTYPE:CAP[:THREADS[:LEVEL]]."""

    model: str
    dtype: str
    cap: str
    threads: int = 1
    level: str = "L1"

    @classmethod
    def parse(cls, text: str) -> MakeSpec:
        parts = text.split(":")
        if len(parts) not in (3, 4, 5) or not all(parts) or (len(parts) == 5 and parts[4] not in ("L1", "mix")):
            raise argparse.ArgumentTypeError(
                f"--make wants MODEL:DTYPE:CAP[:THREADS[:LEVEL]] (LEVEL L1 or mix), not {text!r}"
            )
        return cls(
            parts[0], parts[1], parts[2], int(parts[3]) if len(parts) >= 4 else 1, parts[4] if len(parts) == 5 else "L1"
        )

    @property
    def stem(self) -> str:
        """The made dump's name: the model, its level where not L1, and its dtype."""
        return f"{self.model}{'_' + self.level if self.level != 'L1' else ''}_tensor_{self.dtype}"


def make_dump(maker_python: str, spec: MakeSpec, scratch: Path) -> Dump:
    """A new msprobe dump made by tests/dumps/models/make_dumps.py under spec's path."""
    out = scratch / "made" / f"{spec.stem}_{spec.cap}_{spec.threads}t"
    shutil.rmtree(out, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    path = KernelPath(spec.cap, spec.threads)
    command = [
        maker_python,
        str(REPO / "tests/dumps/models/make_dumps.py"),
        spec.model,
        spec.dtype,
        str(out),
        "--threads",
        str(spec.threads),
        "--level",
        spec.level,
    ]
    proc = subprocess.run(command, check=False, cwd=out.parent, env=path.env(), capture_output=True, text=True)
    if proc.returncode != 0 or not (out / "dump.json").exists():
        raise RuntimeError(f"make_dumps.py under {path.label} failed:\n{proc.stdout}\n{proc.stderr}")
    return Dump(
        folder=out,
        name=f"made:{spec.stem}@{path.label}",
        task="tensor",
        writer=f"{path.label} (dump writer)",
        model=spec.model if spec.level == "L1" else f"{spec.model}_{spec.level}",
        dtype=spec.dtype,
        made=True,
    )


def differing_files(folder: Path, other: Path) -> str:
    """How many tensor files of folder differ bitwise from other's (same names)."""
    names = sorted(p.name for p in (folder / "dump_tensor_data").iterdir())
    outputs = [n for n in names if ".output." in n]
    _, diff, errors = filecmp.cmpfiles(folder / "dump_tensor_data", other / "dump_tensor_data", names, shallow=False)
    diff_outputs = sum(".output." in n for n in diff)
    return (
        f"{len(diff)}/{len(names)} tensor files ({diff_outputs}/{len(outputs)} outputs) differ bitwise from {other.name}"
        + (f", {len(errors)} missing" if errors else "")
    )


def modes_for(dump: Dump, modes: list[str]) -> list[str]:
    """Offline only for tensor dumps: statistics dumps have no outputs to judge."""
    return [m for m in modes if m == "single" or dump.task == "tensor"]


def single_run_wanted(dump: Dump, policy: str, seen: set[tuple[str, str, str]]) -> bool:
    """Single-run for a shipped dump always; for a made dump per --single-made."""
    key = (dump.model, dump.dtype, dump.task)
    first = key not in seen
    seen.add(key)
    if not dump.made:
        return True
    return policy == "all" or (policy == "first" and first)


def summary_table(results: list[RunResult]) -> pd.DataFrame:
    """One row per (dump, mode, path)."""
    columns = [
        "dump",
        "mode",
        "device",
        "reference",
        "rows",
        "judged",
        "errors",
        "warnings",
        "skips",
        "exit_status",
        "seconds",
        "note",
    ]
    frame = pd.DataFrame([{c: getattr(r, c) for c in columns} for r in results])
    frame["seconds"] = frame["seconds"].round(1)
    return frame


def to_markdown(frame: pd.DataFrame) -> str:
    """A GitHub markdown table (no tabulate dependency)."""
    header = "| " + " | ".join(frame.columns) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    body = ["| " + " | ".join(str(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([header, rule, *body])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Judge correct dumps under every CPU kernel path (ATEN_CPU_CAPABILITY x OMP_NUM_THREADS): expect 0 errors, 0 warnings.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__,
    )
    parser.add_argument(
        "dumps",
        nargs="*",
        type=Path,
        help="dump folders (holding dump.json); default: every shipped "
        "tensor/statistics dump under tests/dumps/models but faults/, "
        "plus the torch and MindSpore dumps of EXTRA_DUMPS",
    )
    parser.add_argument(
        "--caps",
        nargs="+",
        default=["default", "avx2", "avx512"],
        help="ATEN_CPU_CAPABILITY values (default: default avx2 avx512)",
    )
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2], help="OMP_NUM_THREADS values (default: 1 2)")
    parser.add_argument(
        "--onednn-isa",
        nargs="+",
        default=[""],
        help="ONEDNN_MAX_CPU_ISA caps, e.g. AVX512_CORE AVX2 ('' = no cap; default: no cap only)",
    )
    parser.add_argument(
        "--modes", nargs="+", choices=["single", "offline"], default=["single", "offline"], help="modes (default: both)"
    )
    parser.add_argument(
        "--scratch",
        type=Path,
        default=Path("/tmp/kd/runs"),
        help="where dump copies and outputs go (default /tmp/kd/runs)",
    )
    parser.add_argument(
        "--make",
        action="append",
        default=[],
        type=MakeSpec.parse,
        metavar="MODEL:DTYPE:CAP[:THREADS[:LEVEL]]",
        help="also make a tensor dump of MODEL (make_dumps.py --list) in DTYPE "
        "(float32, bfloat16, float16) with msprobe under "
        "ATEN_CPU_CAPABILITY=CAP and THREADS torch threads (default 1) at msprobe's LEVEL (L1, default, or mix), "
        "and judge it offline under every path (repeatable)",
    )
    parser.add_argument(
        "--make-dump",
        action="append",
        default=[],
        metavar="CAP",
        help="short form: --make MAKE_MODEL:MAKE_DTYPE:CAP:1 (repeatable)",
    )
    parser.add_argument(
        "--maker-python",
        default=os.environ.get("MSPROBE_PYTHON"),
        help="python with torch==2.13.0 and mindstudio-probe for --make (default: $MSPROBE_PYTHON)",
    )
    parser.add_argument("--make-model", default="transformer12", help="MODEL of --make-dump (default transformer12)")
    parser.add_argument("--make-dtype", default="float32", help="DTYPE of --make-dump (default float32)")
    parser.add_argument(
        "--single-made",
        choices=["first", "all", "none"],
        default="first",
        help="single-run of made dumps: on the first dump of each (model, dtype) in the run, shipped ones first (default); on all; none",
    )
    parser.add_argument("--only-made", action="store_true", help="judge only the dumps made by --make/--make-dump")
    parser.add_argument("--csv", type=Path, help="write the summary table here")
    parser.add_argument("--markdown", type=Path, help="write the summary table as markdown")
    parser.add_argument("--events", type=Path, help="write every error/warning here (CSV)")
    return parser.parse_args(argv)


def collect_dumps(args: argparse.Namespace) -> list[Dump]:
    """The shipped or given dumps, then the ones made under other paths."""
    dumps = [] if args.only_made else [read_dump(f) for f in (args.dumps or default_dumps())]
    specs = args.make + [MakeSpec(args.make_model, args.make_dtype, cap) for cap in args.make_dump]
    first_made: dict[tuple[str, str], Path] = {}
    if specs and args.maker_python is None:
        raise SystemExit("--make needs msprobe's python: --maker-python or MSPROBE_PYTHON")
    for spec in specs:
        started = time.perf_counter()
        made = make_dump(args.maker_python, spec, args.scratch)
        seconds = time.perf_counter() - started
        first = first_made.setdefault((spec.stem, spec.dtype), made.folder)
        compared = differing_files(made.folder, first) if first != made.folder else "first made"
        reported = probe_path(KernelPath(spec.cap, spec.threads), args.maker_python, True)
        print(
            f"made {made.name} in {seconds:.1f}s: {made.folder} (maker's torch reports {reported}; {compared})",
            flush=True,
        )
        dumps.append(made)
    return dumps


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.scratch.mkdir(parents=True, exist_ok=True)
    paths = [KernelPath(cap, threads, isa) for cap in args.caps for threads in args.threads for isa in args.onednn_isa]
    for path in paths:
        print(f"path {path.label}: torch reports {probe_path(path)}", flush=True)
    wall = time.perf_counter()
    dumps = collect_dumps(args)
    results: list[RunResult] = []
    seen: set[tuple[str, str, str]] = set()
    for dump in dumps:
        single = single_run_wanted(dump, args.single_made, seen)
        for mode in modes_for(dump, args.modes):
            if mode == "single" and not single:
                continue  # single-run does not depend on who wrote the dump
            for path in paths:
                result = run_one(dump, mode, path, args.scratch)
                results.append(result)
                print(
                    f"{dump.name:50s} {mode:8s} {path.label:11s} judged={result.judged:4d} "
                    f"errors={result.errors} warnings={result.warnings} skips={result.skips} "
                    f"exit={result.exit_status} {result.seconds:.1f}s {result.note}",
                    flush=True,
                )
    wall = time.perf_counter() - wall
    table = summary_table(results)
    events = pd.DataFrame(
        [e for r in results for e in r.events],
        columns=["dump", "mode", "device", "reference", "call", "direction", "status", "message"],
    )
    with pd.option_context(
        "display.max_rows", None, "display.width", 200, "display.max_columns", None, "display.max_colwidth", 60
    ):
        print(table.drop(columns=["note"]).to_string(index=False))
        print(f"\n{len(events)} errors/warnings")
    for event in events.itertuples(index=False):
        print(
            f"- [{event.status}] {event.dump} {event.mode} device={event.device} "
            f"reference={event.reference} {event.call} {event.direction}: {event.message}"
        )
    print(
        f"\ntotal: {len(results)} runs, {table['errors'].sum()} errors, {table['warnings'].sum()} warnings, wall {wall:.1f}s"
    )
    if args.csv:
        table.to_csv(args.csv, index=False)
    if args.markdown:
        args.markdown.write_text(to_markdown(table) + "\n", encoding="utf-8")
    if args.events:
        events.to_csv(args.events, index=False)
    return 0 if not table["note"].astype(bool).any() else 2


if __name__ == "__main__":
    raise SystemExit(main())
