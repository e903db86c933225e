"""--msprobe-explore on real dumps: how many explored calls fail on the CPU's own kernels
(the target is none), and what an explored example costs.

    python benchmarks/bench_explore.py --examples 50 [--dedup] DUMP.json [DUMP.json ...]

Each dump runs in its own pytest session (`-m explore`, CPU device, -n 0), in a fresh
--msprobe-out (no example database: every search starts from nothing). Per dump it
prints the explored tests by status, the examples judged and discarded (from each
record's note), the wall time, and examples per second. Failing calls are listed with
their first line and first reason.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

COUNTS = re.compile(r"(\d+) examples around the call judged, (\d+) discarded")


def _first_lines(message: str) -> str:
    """The message's first line and its first reason: what classifies a failure."""
    lines = message.splitlines()
    reason = next((line.strip() for line in lines if line.strip().startswith("reason:")), "")
    return f"{lines[0]} {reason}".strip() if lines else ""


def explore(dump: Path, examples: int, dedup: bool) -> dict:
    with tempfile.TemporaryDirectory() as out:
        command = [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--msprobe-dump={dump}",
            "--msprobe-device=cpu",
            f"--msprobe-explore={examples}",
            "-m",
            "explore",
            f"--msprobe-out={out}",
            "--rootdir",
            out,
        ] + (["--msprobe-dedup"] if dedup else [])
        started = time.perf_counter()
        finished = subprocess.run(command, cwd=out, capture_output=True, text=True)
        wall = time.perf_counter() - started
        records = [json.loads(line) for journal in Path(out).glob("msprobe_records_*.jsonl") for line in journal.open()]
    if not records:  # the session itself failed: say why instead of reporting an empty dump
        raise SystemExit(
            f"{dump}: no explored test ran (exit {finished.returncode}):\n{finished.stdout[-2000:]}{finished.stderr[-2000:]}"
        )
    statuses = Counter(record["status"] for record in records)
    judged = discarded = 0
    for record in records:
        found = COUNTS.search(record["message"])
        if found:
            judged, discarded = judged + int(found[1]), discarded + int(found[2])
    failing = [_first_lines(record["message"]) for record in records if record["status"] in ("error", "warning")]
    return {
        "dump": str(dump),
        "tests": len(records),
        "statuses": dict(statuses),
        "judged": judged,
        "discarded": discarded,
        "wall_s": round(wall, 1),
        "examples_per_s": round(judged / wall, 1) if wall else 0.0,
        "failing": failing,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dumps", nargs="+", type=Path)
    parser.add_argument("--examples", type=int, default=50)
    parser.add_argument("--dedup", action="store_true", help="explore one call per API and signature")
    args = parser.parse_args()
    for dump in args.dumps:
        print(json.dumps(explore(dump.resolve(), args.examples, args.dedup)), flush=True)


if __name__ == "__main__":
    main()
