"""--msprobe-explore on a real dump: what an explored example costs, and how many
explored calls fail on the CPU's own kernels (the target is none).

One pytest session (`-m explore`, CPU device, -n 0) in a fresh --msprobe-out (no
example database: every search starts from nothing) on the shipped
tests/dumps/models/embedattn_tensor_fp32 with 5 examples per call (--bench-full: 20, as
RESULTS.md's examples-per-second tables), or on --bench-dump. The number is the
session's wall time; extra_info: the explored tests by status, the examples judged and
discarded (from each record's note), examples per second, and each failing call's
first line and first reason.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from benchmarks.support import MODELS, SHIPPED, PluginRun, Sizes, fastest

COUNTS = re.compile(r"(\d+) examples around the call judged, (\d+) discarded")


def _first_lines(message: str) -> str:
    """The message's first line and its first reason: what classifies a failure."""
    lines = message.splitlines()
    reason = next((line.strip() for line in lines if line.strip().startswith("reason:")), "")
    return f"{lines[0]} {reason}".strip() if lines else ""


@pytest.mark.benchmark(group="explore")
def test_explore(
    benchmark, sizes: Sizes, run_plugin: Callable[..., PluginRun], bench_dump: Path, tmp_path: Path
) -> None:
    dump = MODELS / "embedattn_tensor_fp32" / "dump.json" if bench_dump == SHIPPED else bench_dump
    examples = sizes(5, 20)
    outs: list[Path] = []

    def explore() -> PluginRun:
        outs.append(tmp_path / f"out-{len(outs)}")
        return run_plugin(dump, outs[-1], f"--msprobe-explore={examples}", "-m", "explore", "-n", "0")

    benchmark.pedantic(explore, rounds=1, iterations=1)
    records = [json.loads(line) for journal in outs[-1].glob("msprobe_records_*.jsonl") for line in journal.open()]
    assert records, f"{dump}: no explored test ran"
    found = [COUNTS.search(record["message"]) for record in records]
    judged = sum(int(match[1]) for match in found if match)
    benchmark.extra_info.update(
        dump=dump.parent.name,
        examples=examples,
        tests=len(records),
        statuses=dict(Counter(record["status"] for record in records)),
        judged=judged,
        discarded=sum(int(match[2]) for match in found if match),
        examples_per_s=round(judged / fastest(benchmark), 1),
        failing=[_first_lines(record["message"]) for record in records if record["status"] in ("error", "warning")],
    )
