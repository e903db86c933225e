"""Cost of the kernel verdicts (pytest_msprobe/judge/gate/kernel_verdicts.py; target: under 2% of a
run's time) on the 322-call transformer dumps of tests/dumps/models.

For each dump, one run of the plugin (a process of its own, single-run; offline too for
tensor dumps) gives the run's wall time and its journal. On that journal's records,
best of REPEATS:
- pooling: what the single writer adds per run: KernelPool.add of every record, the
  verdicts, their result CSV rows and metrics lines, and each kernel's message (the
  text of its pytest report);
- the sums' share of the per-call writing: Entry.to_json and the metrics rows of every
  record as they are, against the same records without the sums the bias tests now
  report (bias_n, *_signs, *_signs_sq), which every call writes to the journal and the
  metrics file.

    python benchmarks/bench_kernels.py [--markdown RESULTS.md]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench_verdicts import plugin_command

from pytest_msprobe.judge.gate.kernel_verdicts import KernelPool
from pytest_msprobe.judge.verdict.record import ResultRecord
from pytest_msprobe.results.run_files import (
    Entry,
    RunFiles,
    kernel_metrics_row,
    kernel_rows,
    metrics_rows,
    read_journal,
)

MODELS = Path(__file__).parents[1] / "tests" / "dumps" / "models"
DUMPS = [
    "transformer12_tensor_fp32",
    "transformer12_tensor_bf16",
    "transformer12_tensor_fp16",
    "transformer12_statistics_bf16",
]
REPEATS = 7
SUMS = ("_n", "_signs", "_signs_sq", "_signs_elements", "_signs_sq_elements")


def best(work: Callable[[], object]) -> float:
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return min(times)


def pooling(records: list[ResultRecord]) -> None:
    pool = KernelPool()
    for record in records:
        pool.add(record)
    verdicts = pool.verdicts()
    kernel_rows(verdicts)
    "".join(json.dumps(kernel_metrics_row(verdict)) for verdict in verdicts)
    [verdict.message() for verdict in verdicts]


def without_sums(entry: Entry) -> Entry:
    record = ResultRecord.from_dict(entry.record.to_dict())
    for output in record.outputs:
        output.metrics = {key: value for key, value in output.metrics.items() if not key.endswith(SUMS)}
    return Entry(record, entry.represents)


def writing(entries: list[Entry]) -> None:
    for entry in entries:
        entry.to_json()
        [json.dumps(row) for row in metrics_rows(entry)]


def measure(name: str, offline: bool, scratch: Path) -> dict[str, object]:
    dump = scratch / name
    shutil.copytree(MODELS / name, dump, dirs_exist_ok=True)
    out = scratch / f"out-{name}-{offline}"
    start = time.perf_counter()
    subprocess.run(
        plugin_command(dump / "dump.json", out, *(("--msprobe-offline",) if offline else ())),
        capture_output=True,
        check=False,
    )
    wall = time.perf_counter() - start
    files = RunFiles.latest(out)
    assert files is not None, f"{name}: the run wrote no results"
    entries = read_journal(files.journal)
    records = [entry.record for entry in entries]
    pool = KernelPool()
    for record in records:
        pool.add(record)
    stripped = [without_sums(entry) for entry in entries]
    pooled, with_sums, bare = (
        best(lambda: pooling(records)),
        best(lambda: writing(entries)),
        best(lambda: writing(stripped)),
    )
    return {
        "dump": name,
        "mode": "offline" if offline else "single",
        "calls": len(records),
        "kernels": len(pool.verdicts()),
        "wall_s": wall,
        "pooling_ms": pooled * 1e3,
        "sums_writing_ms": (with_sums - bare) * 1e3,
        "share": (pooled + max(with_sums - bare, 0.0)) / wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--markdown", type=Path, help="append the table here")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for name in DUMPS:
            for offline in (False, True) if "tensor" in name else (False,):
                rows.append(measure(name, offline, Path(scratch)))
                row = rows[-1]
                print(
                    f"{row['dump']:32} {row['mode']:8} calls {row['calls']} kernels {row['kernels']:3} run {row['wall_s']:.2f} s "
                    f"pooling {row['pooling_ms']:.2f} ms sums' writing {row['sums_writing_ms']:+.2f} ms = {row['share']:.3%} of the run"
                )
    if args.markdown:
        lines = [
            "| dump | mode | calls | kernels | run (s) | pooling (ms) | sums' writing (ms) | share of the run |",
            "|---|---|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {r['dump']} | {r['mode']} | {r['calls']} | {r['kernels']} | {r['wall_s']:.2f} | {r['pooling_ms']:.2f} | {r['sums_writing_ms']:+.2f} | {r['share']:.3%} |"
            for r in rows
        ]
        with open(args.markdown, "a", encoding="utf-8") as handle:
            handle.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
