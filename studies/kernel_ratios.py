"""The calls' error ratios to the reference run, pooled per kernel, from runs' journals.

Why: the kernel verdicts' magnitude rule (pytest_msprobe/judge/gate/kernel_verdicts.py) pools each
call's mean_rel_err over the reference run's, and its limit and its dtypes come from
what correct kernel families pool to. This prints, for the offline runs given (their
--msprobe-out folders), every kernel's pooled ratio (the geometric mean over its calls),
the spread of its calls' log ratios and its largest and smallest call, in every dtype --
float32 too, which the rule leaves out (studies/kernel-verdict-limits.md) -- and the range per dtype.

Example::

    python studies/kernel_ratios.py /tmp/out/offline_avx2 /tmp/out/offline_default --top 5
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from pytest_msprobe.judge.gate.kernel_verdicts import KernelPool, call_log_ratios
from pytest_msprobe.results.run_files import read_journal


def pooled_rows(out: Path) -> list[tuple[str, str, int, float, float, float, float]]:
    """(dump, kernel, calls, pooled ratio, sd of the log ratios, largest, smallest call)."""
    pool = KernelPool()
    for journal in sorted(out.glob("msprobe_records_*.jsonl")):
        for entry in read_journal(journal):
            pool.add(entry.record)
    rows = []
    for key, items in sorted(pool.evidence.items()):
        logs = list(call_log_ratios(items.values()).values())
        if len(logs) < 2:
            continue
        mean = sum(logs) / len(logs)
        spread = math.sqrt(sum((value - mean) ** 2 for value in logs) / (len(logs) - 1))
        rows.append(
            (
                Path(key.dump).parent.name,
                key.name,
                len(logs),
                math.exp(mean),
                spread,
                math.exp(max(logs)),
                math.exp(min(logs)),
            )
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("outs", nargs="+", type=Path, help="--msprobe-out folders of offline runs")
    parser.add_argument("--top", type=int, default=3, help="kernels furthest from 1x printed per dtype (default 3)")
    args = parser.parse_args(argv)
    rows = [(out.name, *row) for out in args.outs for row in pooled_rows(out)]
    for dtype in sorted({row[2].rsplit(".", 3)[1] for row in rows}):
        chosen = [row for row in rows if row[2].rsplit(".", 3)[1] == dtype]
        print(
            f"{dtype}: {len(chosen)} kernels, pooled {min(row[4] for row in chosen):.3f}-{max(row[4] for row in chosen):.3f}x"
        )
        for run, dump, name, calls, ratio, spread, largest, smallest in sorted(
            chosen, key=lambda row: -abs(math.log(row[4]))
        )[: args.top]:
            print(
                f"  {run} {dump} {name}: {calls} calls, {ratio:.3f}x (sd of log {spread:.3f}; calls {smallest:.2f}-{largest:.2f}x)"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
