"""The plugin on real msprobe dumps of model code from the libraries users train with:
every verdict, skip, error and warning, single-run and offline, in one table.

    python studies/real_models.py                      # judge $REAL_DUMPS, write the table
    python studies/real_models.py --make               # make the dumps first (msprobe's Python)

The dumps (tools/make_real_model_dumps.py, run with --maker-python: torch,
mindstudio-probe, transformers, timm) are one training step of small, randomly initialised
Hugging Face transformers decoders, encoders and encoder-decoders (eager and sdpa
attention) and timm CNNs, in float32, bfloat16 and float16, levels L1 and mix. They were
written by this machine's own CPU kernels, so every error is a false alarm unless a
plain-torch reproducer against float64 shows the kernel really is inaccurate
(python -m pytest_msprobe.judge.defects.reproduce reproduces the ones that are). KNOWN names each error class
found so far; an error or warning no class matches is listed as "unclassified", the first
thing to look at after a change.

The plugin runs once per mode over the whole dump folder (--msprobe-dump=ROOT: one suite
per dump.json), with -n workers: `single` (the CPU is the device, the calibrated single-run
rules judge) and `offline` (--msprobe-offline: the dumped outputs are the device, this
machine's CPU kernel the reference). It reads each run's journal (msprobe_records_*.jsonl
in --msprobe-out: one record per test, with its dump, call, status and message) and
writes the Markdown table (--markdown): verdicts per dump and mode, skips by reason and by
API, and every error and warning with its API and message.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_msprobe.results.merge import journal_of
from pytest_msprobe.results.run_files import ResultFilesError, read_journal
from pytest_msprobe.testing.commands import plugin_command

REPO = Path(__file__).resolve().parent.parent
MAKER = REPO / "tools" / "make_real_model_dumps.py"
MODES = {"single": (), "offline": ("--msprobe-offline",)}
STATUSES = ("pass", "warning", "error", "skip")
MESSAGE_CHARS = 230


@dataclass(frozen=True)
class Verdict:
    """One test of one mode: its dump.json, the call (direction included)."""

    mode: str
    dump_json: str
    call: str
    status: str
    message: str

    @property
    def dump(self) -> str:
        return Path(self.dump_json).parent.name

    @property
    def api(self) -> str:
        """`Functional.max_pool2d.0.backward` -> `Functional.max_pool2d`."""
        return re.sub(r"\.\d+\.(forward|backward)$", "", self.call)

    @property
    def direction(self) -> str:
        return self.call.rpartition(".")[2]

    @property
    def dtype(self) -> str:
        return self.dump.rpartition("_")[2]

    @property
    def reason(self) -> str:
        """The message without the call's name and its numbers: one line per kind of skip."""
        text = self.message.removeprefix(self.call).lstrip(": ")
        text = re.sub(r"\bskip(ped)?:?\s*", "", text, count=1)
        return re.sub(r"-?\d+(\.\d+)?(e-?\d+)?", "N", text)[:MESSAGE_CHARS]


@dataclass(frozen=True)
class Known:
    """An error class already decided: a torch defect (a row of pytest_msprobe/judge/defects/table.py, reproduced by python -m pytest_msprobe.judge.defects.reproduce)
    or a false alarm of the plugin (the kernel is correct; the fix is the plugin's)."""

    label: str
    matches: Callable[[Verdict], bool]


def _api(
    *names: str, mode: str = "", direction: str = "", dtypes: tuple[str, ...] = (), text: str = ""
) -> Callable[[Verdict], bool]:
    def matches(verdict: Verdict) -> bool:
        return (
            verdict.api in names
            and (not mode or verdict.mode == mode)
            and (not direction or verdict.direction == direction)
            and (not dtypes or verdict.dtype in dtypes)
            and (not text or re.search(text, verdict.message) is not None)
        )

    return matches


@functools.cache
def _entries(dump_json: str) -> dict[str, Any]:
    return json.loads(Path(dump_json).read_text(encoding="utf-8"))["data"]


def _argument(verdict: Verdict, name: str) -> object:
    """A keyword argument's dumped value (None where absent) of the call's forward."""
    forward = verdict.call.rsplit(".", 1)[0] + ".forward"
    value = _entries(verdict.dump_json).get(forward, {}).get("input_kwargs", {}).get(name)
    return value.get("value") if isinstance(value, dict) else None


def _random_attention(verdict: Verdict) -> bool:
    return verdict.api == "Functional.scaled_dot_product_attention" and bool(_argument(verdict, "dropout_p"))


REDUCED = ("bf16", "fp16")
KNOWN: tuple[Known, ...] = (
    Known(
        "torch defect: batch_norm with bfloat16/float16 weights keeps its statistics in that dtype (known defect torch-cpu-batch-norm-statistics)",
        _api("Functional.batch_norm", dtypes=REDUCED),
    ),
    Known(
        "torch defect: cross_entropy's gradient from the log_softmax rounded to bfloat16/float16 (known defect torch-cpu-cross-entropy-rounded-log-softmax)",
        _api("Functional.cross_entropy", direction="backward", dtypes=REDUCED, text="systematic"),
    ),
    Known(
        "false alarm: max_pool2d backward with overlapping windows (stride < kernel) sums gradients, judged as exact",
        _api("Functional.max_pool2d", direction="backward", text="must be exact"),
    ),
    Known(
        "false alarm: an in-place call's backward replayed on the dumped leaf (offline): the device raised",
        _api("Tensor.__iadd__", mode="offline", direction="backward", text="leaf Variable .* in-place"),
    ),
    Known(
        "false alarm: scaled_dot_product_attention with dropout_p > 0 draws random numbers, judged as deterministic",
        _random_attention,
    ),
)


def classify(verdict: Verdict) -> str:
    return next((known.label for known in KNOWN if known.matches(verdict)), "unclassified")


def dump_folders(root: Path) -> list[Path]:
    return sorted(path.parent for path in root.glob("*/dump.json"))


def make_dumps(maker_python: str, root: Path) -> None:
    subprocess.run([maker_python, str(MAKER), str(root)], check=True)


def run_mode(mode: str, root: Path, out: Path, workers: int) -> tuple[list[Verdict], float]:
    """One plugin run over every dump under root; its verdicts and wall seconds."""
    shutil.rmtree(out, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    command = plugin_command(root, out, *MODES[mode], "-n", str(workers))
    env = {key: value for key, value in os.environ.items() if key != "PYTEST_ADDOPTS"}
    started = time.perf_counter()
    proc = subprocess.run(command, check=False, cwd=out.parent, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    (out.parent / f"{mode}.log").write_text(proc.stdout + proc.stderr, encoding="utf-8")
    try:
        entries = read_journal(journal_of(out))
    except ResultFilesError as exc:
        raise SystemExit(
            f"{mode}: the plugin wrote no results (exit {proc.returncode}): {exc}; see {out.parent / f'{mode}.log'}"
        ) from exc
    return [
        Verdict(mode, entry.record.dump, entry.record.call, entry.record.status, entry.record.message)
        for entry in entries
    ], seconds


# --- the Markdown -------------------------------------------------------------------


def _table(header: Iterable[str], rows: Iterable[Iterable[object]]) -> list[str]:
    header = list(header)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += [
        "| " + " | ".join(str(cell).replace("|", "\\|").replace("\n", " ") for cell in row) + " |" for row in rows
    ]
    return lines + [""]


def _share(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def totals(verdicts: list[Verdict], modes: list[str], seconds: dict[str, float]) -> list[str]:
    rows = []
    for mode in modes:
        counts = Counter(verdict.status for verdict in verdicts if verdict.mode == mode)
        whole = sum(counts.values())
        rows.append(
            [
                mode,
                whole,
                *(counts[status] for status in STATUSES),
                _share(counts["skip"], whole),
                f"{seconds[mode]:.0f}",
            ]
        )
    return _table(["mode", "verdicts", *STATUSES, "skipped share", "wall s"], rows)


def per_dump(verdicts: list[Verdict], modes: list[str]) -> list[str]:
    counts = Counter((verdict.dump, verdict.mode, verdict.status) for verdict in verdicts)
    rows = []
    for dump in sorted({verdict.dump for verdict in verdicts}):
        cells: list[object] = [dump]
        for mode in modes:
            cells.append(" / ".join(str(counts[dump, mode, status]) for status in STATUSES))
        rows.append(cells)
    return _table(["dump", *(f"{mode}: pass / warning / error / skip" for mode in modes)], rows)


def skips(verdicts: list[Verdict], modes: list[str]) -> list[str]:
    skipped = [verdict for verdict in verdicts if verdict.status == "skip"]
    by_reason = Counter((verdict.api, verdict.direction, verdict.reason) for verdict in skipped)
    per_mode = Counter((verdict.api, verdict.direction, verdict.reason, verdict.mode) for verdict in skipped)
    rows = [
        [api, direction, *(per_mode[api, direction, reason, mode] for mode in modes), reason]
        for (api, direction, reason), _ in by_reason.most_common()
    ]
    return _table(["API", "direction", *modes, "reason (numbers as N)"], rows)


def events(verdicts: list[Verdict]) -> list[str]:
    flagged = sorted(
        (verdict for verdict in verdicts if verdict.status in ("error", "warning")),
        key=lambda v: (classify(v), v.mode, v.dump, v.call),
    )
    rows = [
        [classify(v), v.mode, v.status, v.dump, v.call, v.message.removeprefix(v.call).lstrip(": ")[:MESSAGE_CHARS]]
        for v in flagged
    ]
    return _table(["class", "mode", "status", "dump", "call", "message (start)"], rows)


def event_classes(verdicts: list[Verdict], modes: list[str]) -> list[str]:
    counts = Counter((classify(v), v.mode) for v in verdicts if v.status in ("error", "warning"))
    labels = sorted({label for label, _ in counts})
    return _table(["class", *modes], [[label, *(counts[label, mode] for mode in modes)] for label in labels])


def plugin_commit() -> str:
    proc = subprocess.run(
        ["git", "-C", str(REPO), "log", "-1", "--format=%h (%cs)"], check=False, capture_output=True, text=True
    )
    return proc.stdout.strip() or "unknown (not a git checkout)"


def markdown(verdicts: list[Verdict], seconds: dict[str, float], args: argparse.Namespace) -> str:
    """The results file: the run's verdicts and each mode's seconds, under the options
    that made them (`--modes`, `--dumps`, `--workers`, `--label`)."""
    modes, root, workers, label = args.modes, args.dumps, args.workers, args.label
    dumps = sorted({verdict.dump for verdict in verdicts})
    lines = [
        "# The plugin on real models from model libraries",
        "",
        f"**{label}**: the plugin at `{plugin_commit()}`." if label else f"The plugin at `{plugin_commit()}`.",
        "",
        f"`python studies/real_models.py` ({len(dumps)} dumps under `{root}`, made by",
        "`tools/make_real_model_dumps.py`; the plugin with "
        f"`-n {workers}`, one run per mode over every dump). Written by the script: rerun it, do not edit.",
        "",
        "## Totals",
        "",
        *totals(verdicts, modes, seconds),
        "## Errors and warnings by class",
        "",
        "A class names a torch defect (reproduced against float64 by `python -m pytest_msprobe.judge.defects.reproduce`: the error is",
        "right) or a false alarm of the plugin (the kernel is correct); `unclassified` is new.",
        "",
        *event_classes(verdicts, modes),
        "## Per dump",
        "",
        *per_dump(verdicts, modes),
        "## Skips by API and reason",
        "",
        *skips(verdicts, modes),
        "## Every error and warning",
        "",
        *events(verdicts),
    ]
    return "\n".join(lines)


#: the heading under which the results file holds notes written by hand, kept on a rerun
NOTES = "## Not written by the script"


def kept_notes(path: Path) -> str:
    """A rerun rewrites the tables; what a person wrote about them (why an error is a torch
    defect, a run before a fix) is the part no rerun can make again."""
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    start = text.find(NOTES)
    return "\n" + text[start:] if start >= 0 else ""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--dumps",
        type=Path,
        default=Path(os.environ["REAL_DUMPS"]) if os.environ.get("REAL_DUMPS") else None,
        required=not os.environ.get("REAL_DUMPS"),
        help="the folder of real-model dumps (make_real_model_dumps.py's OUT_ROOT; default: $REAL_DUMPS)",
    )
    parser.add_argument("--make", action="store_true", help="make the dumps first, with --maker-python")
    parser.add_argument(
        "--maker-python",
        default=os.environ.get("MSPROBE_PYTHON"),
        help="a Python with torch, mindstudio-probe, transformers, timm (default: $MSPROBE_PYTHON)",
    )
    parser.add_argument(
        "--scratch", type=Path, default=Path("/tmp/real-models-runs"), help="where the runs' result files go"
    )
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("-n", "--workers", type=int, default=2, help="pytest-xdist workers per run (default 2)")
    parser.add_argument("--markdown", type=Path, default=REPO / "studies" / "verdicts-on-real-models.md")
    parser.add_argument("--label", default="", help='what the run measures, e.g. "before" or "after the layouts"')
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.make or not dump_folders(args.dumps):
        if args.maker_python is None:
            raise SystemExit(f"no dumps in {args.dumps}: make them with --make and --maker-python (or MSPROBE_PYTHON)")
        make_dumps(args.maker_python, args.dumps)
    verdicts: list[Verdict] = []
    seconds: dict[str, float] = {}
    for mode in args.modes:
        found, seconds[mode] = run_mode(mode, args.dumps.resolve(), args.scratch.resolve() / mode, args.workers)
        verdicts += found
        print(
            f"{mode}: {len(found)} verdicts in {seconds[mode]:.0f} s",
            Counter(verdict.status for verdict in found),
            flush=True,
        )
    table = markdown(verdicts, seconds, args)
    args.markdown.write_text(table + "\n" + kept_notes(args.markdown), encoding="utf-8")
    unclassified = [v for v in verdicts if v.status in ("error", "warning") and classify(v) == "unclassified"]
    print(f"{args.markdown}: {len(unclassified)} unclassified errors/warnings")
    return 0


if __name__ == "__main__":
    sys.exit(main())
