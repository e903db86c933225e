r"""Library families as devices: are the verdicts true between two correct libraries?

Why
---
Every real use of the plugin compares two libraries: CANN's (or cuDNN's) kernels on the
device against ATen's on the CPU. studies/kernel_diversity.py calibrated the rules on
ATen's own paths, which share ATen's formulas and math library. Here other real libraries
stand in for the device: for each tensor dump, a copy is written whose forward outputs are
recomputed by a library on the dumped inputs (and, where the library differentiates, whose
backward input-gradients are recomputed from the dumped incoming gradient), and the plugin
judges the copy with ``--msprobe-offline``: the copy's outputs are the device result, the
CPU bench and the reference run in the dump's dtype judge them. A correct library must get
0 errors and 0 warnings; every one it gets is a false alarm.

Families
--------
* ``jax``: JAX/XLA's CPU kernels (studies/families_jax.py: one jax function per API),
  forward and backward (jax.vjp);
* ``onnxruntime``: ONNX Runtime's CPU kernels (studies/families_onnx.py: one ONNX graph
  per API, built with onnx.helper), forward only;
* ``inductor``: torch.compile (Inductor's generated C++ kernels) of the single call,
  forward and backward (AOTAutograd);
* ATen's own paths (ATEN_CPU_CAPABILITY, OMP_NUM_THREADS): kernel_diversity.py runs them
  (``--aten`` runs it on the same dumps, offline, and adds its matrix).

16-bit calls are computed as correct accelerator kernels do: inputs raised to float32,
computed in float32, rounded once (to nearest) to the dump's dtype (jax, onnxruntime;
Inductor does so itself). An API a family has no equivalent for, a call it fails on, or
a backward whose dumped gradients are not the inputs' (msprobe records composite calls'
backward at an inner node: linear, cross_entropy, ...) keeps its dumped (ATen) output and
is counted as "not recomputed": no verdict mixes two libraries silently, and the errors
and warnings are split between recomputed and kept directions.

The copies are written by family_recompute.py. It reads each run's ``accuracy_checking_result_*.csv`` (counts, messages) and
``accuracy_checking_metrics_*.jsonl`` (bias_ulp, scale_bias_ulp and their z per output:
the measured biases of each family, per API and dtype).

Example::

    python studies/library_families.py --families jax onnxruntime inductor \
        --markdown studies/correct-kernels-of-other-libraries.md
    python studies/library_families.py --families jax --only Functional.gelu Torch.tanh \
        --write-dumps tests/dumps/families tests/dumps/models/apizoo_tensor_fp32
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from family_recompute import (
    FAMILIES,
    REPO,
    DumpCopy,
    Family,
    prune,
    recompute_dump,
)
from kernel_diversity import EXTRA_DUMPS, RunResult, count_statuses, pytest_command, result_csv, to_markdown

# --- judging a copy ---------------------------------------------------------------------


#: single-run: the plugin that makes the family the device under test (the dumped outputs
#: play no part: the device reruns each call); a family without one has no single-run mode
SINGLE_RUN_PLUGIN = {"jax": ["-p", "family_device"], "inductor": ["-p", "compiled_kernels"]}


def judge(copy: DumpCopy, label: str, mode: str, family: str) -> tuple[RunResult, pd.DataFrame]:
    """Run the plugin on the copy (offline or single-run) and count its result CSV; the
    metrics file's rows come back too."""
    out = copy.folder.parent / f"{copy.folder.name}.out.{mode}"
    shutil.rmtree(out, ignore_errors=True)
    result = RunResult(
        dump=label, mode=mode, device=family, reference="CPU in the dump's dtype" if mode == "offline" else "none"
    )
    started = time.perf_counter()
    command = pytest_command(copy.folder / "dump.json", out, mode == "offline") + (
        SINGLE_RUN_PLUGIN[family] if mode == "single" else []
    )
    env = {**os.environ, "PYTHONPATH": str(REPO / "studies"), "MSPROBE_COMPILED": "device"}
    proc = subprocess.run(command, check=False, cwd=copy.folder.parent, capture_output=True, text=True, env=env)
    result.seconds = time.perf_counter() - started
    result.exit_status = proc.returncode
    (out.parent / f"{copy.folder.name}.{mode}.log").write_text(proc.stdout + proc.stderr, encoding="utf-8")
    csv_path = result_csv(out)
    if csv_path is None:
        result.note = f"no result CSV (exit {proc.returncode}): {proc.stderr[-300:]}"
        return result, pd.DataFrame()
    frame = pd.read_csv(csv_path, encoding="utf-8-sig", dtype=str, keep_default_na=False)
    count_statuses(frame, result)
    metrics = sorted(out.glob("accuracy_checking_metrics_*.jsonl"))
    return result, (pd.read_json(metrics[-1], lines=True) if metrics and metrics[-1].stat().st_size else pd.DataFrame())


def default_dumps() -> list[Path]:
    """The calibration tensor dumps (tests/dumps/models/*_tensor_*) and examples/."""
    models = sorted(p for p in (REPO / "tests/dumps/models").glob("*_tensor_*") if (p / "dump.json").exists())
    return models + [REPO / extra for extra in EXTRA_DUMPS if extra.startswith("examples/")]


def bias_rows(metrics: pd.DataFrame, copy: DumpCopy, family: str, dump: str) -> pd.DataFrame:
    """The measured biases of the recomputed outputs (kernel rows and kept calls left out)."""
    if metrics.empty or "bias_ulp" not in metrics:
        return pd.DataFrame()
    recomputed = {(e.call, e.direction) for e in copy.entries if e.recomputed}
    rows = metrics[[(c, d) in recomputed for c, d in zip(metrics["call"], metrics["direction"], strict=True)]].copy()
    rows = rows[rows["bias_ulp"].notna()]
    rows["family"], rows["dump"] = family, dump
    rows["api"] = rows["call"].str.rsplit(".", n=1).str[0]
    keep = [
        "family",
        "dump",
        "api",
        "call",
        "direction",
        "name",
        "device_dtype",
        "status",
        "bias_ulp",
        "bias_z",
        "scale_bias_ulp",
        "scale_bias_z",
    ]
    keep += [c for c in ("ref_bias_ulp", "ref_bias_z", "ref_scale_bias_ulp", "ref_scale_bias_z") if c in rows]
    return rows[keep]


def bias_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Per family, API, dtype and direction: outputs, and the range of each bias and z."""
    if rows.empty:
        return rows
    grouped = rows.groupby(["family", "api", "device_dtype", "direction"])
    table = grouped.agg(
        outputs=("bias_ulp", "size"),
        bias_ulp_min=("bias_ulp", "min"),
        bias_ulp_max=("bias_ulp", "max"),
        bias_z_max=("bias_z", lambda z: z.abs().max()),
        scale_bias_ulp_min=("scale_bias_ulp", "min"),
        scale_bias_ulp_max=("scale_bias_ulp", "max"),
        scale_bias_z_max=("scale_bias_z", lambda z: z.abs().max()),
    ).reset_index()
    return table.round(3)


CALL_NAME = re.compile(r"\b(?:Functional|Tensor|Torch|VF|Aten|NPU)\.[A-Za-z_][\w]*\.\d+\b")


def provenance(copy: DumpCopy, call: str, direction: str, message: str) -> str:
    """recomputed: the family wrote the judged outputs; kept: ATen's dumped ones; mixed: a
    kept direction judged through the dump's data flow with gradients the family recomputed
    (the offline judge sums other calls' recorded gradients with it)."""
    if copy.recomputed(call, direction):
        return "recomputed"
    others = {name for name in CALL_NAME.findall(message) if name != call}
    return "mixed" if any(copy.recomputed(other, "backward") for other in others) else "kept"


def events_frame(results: list[tuple[RunResult, DumpCopy]]) -> pd.DataFrame:
    """Every error/warning, with who wrote the outputs it judged (provenance)."""
    rows = []
    for result, copy in results:
        by_key = {(e.call, e.direction): e for e in copy.entries}
        for event in result.events:
            entry = by_key.get((event["call"], event["direction"]))
            rows.append(
                {
                    "family": result.device,
                    "dump": result.dump,
                    "mode": result.mode,
                    "call": event["call"],
                    "direction": event["direction"],
                    "dtype": entry.dtype if entry else "",
                    "outputs": provenance(copy, event["call"], event["direction"], event["message"]),
                    "status": event["status"],
                    "message": event["message"],
                }
            )
    return pd.DataFrame(
        rows, columns=["family", "dump", "mode", "call", "direction", "dtype", "outputs", "status", "message"]
    )


def matrix_row(result: RunResult, copy: DumpCopy) -> dict[str, Any]:
    """One (family, dump, mode) row: directions recomputed and the verdicts."""
    forward = [e for e in copy.entries if e.direction == "forward"]
    backward = [e for e in copy.entries if e.direction == "backward"]
    recomputed_errors = sum(
        1 for e in result.events if copy.recomputed(e["call"], e["direction"]) and e["status"] == "error"
    )
    recomputed_warnings = sum(
        1 for e in result.events if copy.recomputed(e["call"], e["direction"]) and e["status"] == "warning"
    )
    return {
        "family": result.device,
        "dump": result.dump,
        "mode": result.mode,
        "fwd recomputed": f"{sum(e.recomputed for e in forward)}/{len(forward)}",
        "bwd recomputed": f"{sum(e.recomputed for e in backward)}/{len(backward)}",
        "judged": result.judged,
        "passed": result.judged - result.errors - result.warnings,
        "errors": result.errors,
        "warnings": result.warnings,
        "errors/warnings on recomputed": f"{recomputed_errors}/{recomputed_warnings}",
        "skips": result.skips,
        "exit": result.exit_status,
        "seconds": round(result.seconds, 1),
        "note": result.note,
    }


def not_recomputed(copies: list[tuple[str, DumpCopy]]) -> pd.DataFrame:
    """Why directions were kept, per family, API and reason."""
    rows = [
        {"family": family, "api": e.api, "direction": e.direction, "reason": e.reason}
        for family, copy in copies
        for e in copy.entries
        if not e.recomputed
    ]
    frame = pd.DataFrame(rows, columns=["family", "api", "direction", "reason"])
    return frame.groupby(["family", "api", "direction", "reason"]).size().reset_index(name="directions")


def run_aten(dumps: list[Path], scratch: Path) -> pd.DataFrame:
    """kernel_diversity.py's offline matrix on the same dumps under ATen's paths."""
    table = scratch / "aten.csv"
    command = [
        sys.executable,
        str(REPO / "studies/kernel_diversity.py"),
        "--caps",
        "default",
        "avx2",
        "--threads",
        "1",
        "2",
    ]
    command += [
        "--modes",
        "offline",
        "--scratch",
        str(scratch / "aten"),
        "--csv",
        str(table),
        *(str(d.resolve()) for d in dumps),
    ]
    proc = subprocess.run(command, check=False, capture_output=True, text=True, cwd=REPO / "studies")
    (scratch / "aten.log").write_text(proc.stdout + proc.stderr, encoding="utf-8")
    return (
        pd.read_csv(table)
        if table.exists()
        else pd.DataFrame({"note": [f"kernel_diversity.py exit {proc.returncode}: {proc.stderr[-300:]}"]})
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Recompute dumps' outputs with other real libraries (JAX/XLA, ONNX Runtime, Inductor) and judge them offline.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__,
    )
    parser.add_argument(
        "dumps", nargs="*", type=Path, help="tensor dump folders; default: tests/dumps/models/*_tensor_* and examples/"
    )
    parser.add_argument("--families", nargs="+", choices=sorted(FAMILIES), default=["jax", "onnxruntime", "inductor"])
    parser.add_argument(
        "--modes",
        nargs="+",
        choices=["offline", "single"],
        default=["offline"],
        help="single: the copy's bench-side replay (no family as device)",
    )
    parser.add_argument("--only", nargs="+", default=[], help="recompute only these APIs (e.g. Functional.gelu)")
    parser.add_argument(
        "--scratch", type=Path, default=Path("/tmp/library_families"), help="where the copies and runs go"
    )
    parser.add_argument(
        "--write-dumps", type=Path, help="keep the copies here (e.g. tests/dumps/families) and do not judge them"
    )
    parser.add_argument(
        "--max-index", type=int, default=1 << 30, help="with --write-dumps: keep only calls whose index is below this"
    )
    parser.add_argument(
        "--aten",
        action="store_true",
        help="also run kernel_diversity.py offline (ATen paths default/avx2 x 1/2 threads)",
    )
    parser.add_argument("--markdown", type=Path, help="write the matrix, events and bias table as markdown")
    parser.add_argument(
        "--csv-prefix", type=Path, help="write <prefix>matrix.csv, events.csv, biases.csv, bias_rows.csv"
    )
    return parser.parse_args(argv)


def dump_label(folder: Path) -> str:
    try:
        return str(folder.resolve().relative_to(REPO))
    except ValueError:
        return str(folder)


@dataclass
class _Runs:
    """What the families' copies gave: each judged run with its copy, every copy (by
    family) and the biases measured on them."""

    judged: list[tuple[RunResult, DumpCopy]] = field(default_factory=list)
    copies: list[tuple[str, DumpCopy]] = field(default_factory=list)
    biases: list[pd.DataFrame] = field(default_factory=list)


@dataclass(frozen=True)
class _Tables:
    """The report's tables: the matrix, the errors and warnings, the biases (table and
    rows), the directions not recomputed and kernel_diversity.py's ATen paths (--aten)."""

    matrix: pd.DataFrame
    events: pd.DataFrame
    biases: pd.DataFrame
    bias_rows: pd.DataFrame
    kept: pd.DataFrame
    aten: pd.DataFrame


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    dumps = args.dumps or default_dumps()
    wall = time.perf_counter()
    runs = _Runs()
    for name in args.families:
        family = FAMILIES[name]()
        for folder in dumps:
            _recompute_and_judge(args, name, family, folder, runs)
    if args.write_dumps:
        return 0
    tables = _tables(args, dumps, runs)
    wall = time.perf_counter() - wall
    _print_tables(tables, wall)
    if args.csv_prefix:
        _write_csv(args.csv_prefix, tables)
    if args.markdown:
        _write_markdown(args.markdown, tables)
    return 0 if not tables.matrix["note"].astype(bool).any() else 2


def _recompute_and_judge(args: argparse.Namespace, name: str, family: Family, folder: Path, runs: _Runs) -> None:
    """The family's copy of one dump, and (unless --write-dumps keeps it) its runs in
    each mode."""
    only = frozenset(args.only)
    root = args.write_dumps if args.write_dumps else args.scratch / name
    started = time.perf_counter()
    copy = recompute_dump(family, folder, root / f"{name}_{folder.resolve().name}", only)
    runs.copies.append((name, copy))
    done = sum(e.recomputed for e in copy.entries)
    print(
        f"{name:12s} {dump_label(folder):45s} recomputed {done}/{len(copy.entries)} directions in {time.perf_counter() - started:.1f}s",
        flush=True,
    )
    if args.write_dumps:
        prune(copy, only, args.max_index)
        return
    for mode in [m for m in args.modes if m == "offline" or name in SINGLE_RUN_PLUGIN]:
        result, metrics = judge(copy, dump_label(folder), mode, name)
        runs.judged.append((result, copy))
        runs.biases.append(bias_rows(metrics, copy, name, dump_label(folder)))
        row = matrix_row(result, copy)
        print("   ", " ".join(f"{k}={v}" for k, v in row.items() if k not in ("family", "dump")), flush=True)


def _tables(args: argparse.Namespace, dumps: list[Path], runs: _Runs) -> _Tables:
    rows = (
        pd.concat([b for b in runs.biases if not b.empty], ignore_index=True)
        if any(not b.empty for b in runs.biases)
        else pd.DataFrame()
    )
    return _Tables(
        matrix=pd.DataFrame([matrix_row(r, c) for r, c in runs.judged]),
        events=events_frame(runs.judged),
        biases=bias_table(rows),
        bias_rows=rows,
        kept=not_recomputed(runs.copies),
        aten=run_aten(dumps, args.scratch) if args.aten else pd.DataFrame(),
    )


def _print_tables(tables: _Tables, wall: float) -> None:
    with pd.option_context(
        "display.max_rows", None, "display.width", 250, "display.max_columns", None, "display.max_colwidth", 80
    ):
        print(tables.matrix.drop(columns=["note"]).to_string(index=False))
        print(f"\n{len(tables.events)} errors/warnings")
        for event in tables.events.itertuples(index=False):
            print(
                f"- [{event.status}] {event.family} {event.dump} {event.mode} {event.call} {event.direction} {event.dtype} ({event.outputs}): {event.message}"
            )
        if not tables.aten.empty:
            print(tables.aten.to_string(index=False))
    print(f"\nwall {wall:.1f}s")


def _write_csv(prefix: Path, tables: _Tables) -> None:
    """<prefix>matrix.csv, events.csv, biases.csv, bias_rows.csv, kept.csv, aten.csv."""
    for label in ("matrix", "events", "biases", "bias_rows", "kept", "aten"):
        getattr(tables, label).to_csv(f"{prefix}{label}.csv", index=False)


def _write_markdown(path: Path, tables: _Tables) -> None:
    parts = [
        "## Matrix",
        to_markdown(tables.matrix),
        "## Errors and warnings",
        to_markdown(tables.events) if not tables.events.empty else "none",
    ]
    parts += [
        "## Biases measured on recomputed outputs",
        to_markdown(tables.biases) if not tables.biases.empty else "none",
    ]
    parts += ["## Not recomputed", to_markdown(tables.kept)]
    if not tables.aten.empty:
        parts += ["## ATen paths (kernel_diversity.py, offline)", to_markdown(tables.aten)]
    path.write_text("\n\n".join(parts) + "\n", encoding="utf-8")


if __name__ == "__main__":
    raise SystemExit(main())
