"""How far two correct runs of one kernel differ: the spread the upgrade gate's limits
(pytest_msprobe/judge/gate/upgrade.py CALL_LIMIT, KERNEL_LIMIT) are derived from.

Why
---
After an operator upgrade a call's key metric against its own bench (mean relative error,
mean ULP error) is compared with the one recorded before it. Two correct kernels round
otherwise, and the second dump's inputs moved where upstream kernels did: the metric
moves without any defect. A limit that a correct pair can exceed would fail healthy
upgrades; so the limit is the largest growth measured on correct pairs.

How
---
One training step of pytest_msprobe/testing/upgrade_dumps.py's model is dumped (tensor task) in each dtype
under every CPU kernel path this machine has: ATEN_CPU_CAPABILITY default and this CPU's
own, x 1 and 2 threads (a subprocess each: torch reads the capability when it starts).
Each dump is checked offline (`--msprobe-offline`, the dumped outputs are the device
result) with `--msprobe-baseline-save`, which records every call's verdict and key
metrics. Every ordered pair of distinct paths (A before, B after) is then paired as the
gate pairs it (judge/gate/upgrade.py: by name and signature) and each paired call's growth
(B's key metric over A's, both floored) is taken, and each kernel's pooled growth
(geometric mean over its calls). The planted faults of pytest_msprobe/testing/upgrade_dumps.py are
measured the same way (A correct, B faulty, both on this CPU's path), only to show where
they lie: they take no part in the limits.

    python studies/upgrade_spread.py [--markdown FILE]
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from pytest_msprobe.testing.commands import plugin_command

MAKER = ("-m", "pytest_msprobe.testing.upgrade_dumps")
DTYPES = ("float32", "bfloat16", "float16")
PATHS = (("default", 1), ("default", 2), ("native", 1), ("native", 2))  # native: this CPU's own
#: correct families this machine cannot run, measured elsewhere: (largest call growth,
#: largest kernel growth). float32 gelu written by AVX512 and checked against AVX2 (the
#: shipped dumps' writer against this CPU): mean_rel_err 3.58-4.04x per call, 3.75x pooled
#: over 12 calls (studies/kernel-verdict-limits.md)
ELSEWHERE = {"float32": (4.04, 3.75)}
FAULTS = {
    "float32": ("gelu_scaled",),
    "bfloat16": ("gelu_scaled", "softmax_low_precision_sum"),
    "float16": ("gelu_scaled", "softmax_low_precision_sum"),
}


def make(folder: Path, dtype: str, capability: str, threads: int, fault: str | None = None) -> Path:
    env = {key: value for key, value in os.environ.items() if key != "ATEN_CPU_CAPABILITY"}
    if capability != "native":
        env["ATEN_CPU_CAPABILITY"] = capability
    extra = ["--fault", fault] if fault else []
    command = [sys.executable, *MAKER, str(folder), "--dtype", dtype, "--threads", str(threads), *extra]
    subprocess.run(command, check=True, env=env, capture_output=True)
    return folder / "dump.json"


def record(dump: Path, folder: Path) -> Path:
    """The dump checked offline, its baseline saved (a nonzero exit status is data)."""
    command = plugin_command(
        dump, folder / "out", "--msprobe-offline", f"--msprobe-baseline-save={folder / 'baseline'}"
    )
    subprocess.run(command, cwd=folder, capture_output=True, check=False)
    return folder / "baseline"


def changes(before: tuple[Path, Path], after: tuple[Path, Path]) -> tuple[list, list]:
    """The paired calls' and kernels' changes of dump `after` against `before`
    ((dump, baseline folder) each), as the gate computes them."""
    from pytest_msprobe.dump.index import read_index
    from pytest_msprobe.judge.gate.baseline import Baseline
    from pytest_msprobe.judge.gate.upgrade import call_change, call_signatures, kernel_changes, pair_calls

    was, now = (Baseline.read(folder) for _, folder in (before, after))
    was_calls = {call: metrics for (_, call), metrics in was.calls.items()}
    now_calls = {call: metrics for (_, call), metrics in now.calls.items()}
    pairing = pair_calls(call_signatures(read_index(before[0])), call_signatures(read_index(after[0])))
    calls = [
        call_change(now_calls[b], was_calls[a], b, a, now_calls[b].dtype)
        for b, a in pairing.pairs.items()
        if b in now_calls and a in was_calls
    ]
    return calls, kernel_changes(calls)


def spread_row(label: str, calls: list, kernels: list) -> dict[str, object]:
    grown = [c.growth for c in calls if c.growth is not None]
    pooled = [k.growth for k in kernels if k.growth is not None]
    worst = max((c for c in calls if c.growth is not None), key=lambda c: c.growth, default=None)
    logs = [math.log(g) for g in grown]
    return {
        "pair": label,
        "calls": len(calls),
        "max call growth": f"{max(grown):.3f}" if grown else "-",
        "worst call": worst.name if worst else "-",
        "rms log growth": f"{(sum(x * x for x in logs) / len(logs)) ** 0.5:.3f}" if logs else "-",
        "max kernel growth": f"{max(pooled):.3f}" if pooled else "-",
        "regressions": ", ".join(c.name for c in calls + kernels if c.kind == "regression") or "none",
    }


def derived(largest: float) -> float:
    """The limit a largest correct growth gives: twice it, rounded up to a power of two."""
    return 2.0 ** math.ceil(math.log2(2 * largest))


def derivation(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    """Per dtype: the largest growth of a call and of a kernel over the correct pairs (and,
    in float32, the AVX512 family measured elsewhere), the limits they give, and whether
    those are the shipped ones."""
    from pytest_msprobe.judge.gate.upgrade import CALL_LIMIT, KERNEL_LIMIT

    found = []
    for dtype in DTYPES:
        mine = [row for row in rows if str(row["pair"]).startswith(dtype + " ")]
        elsewhere = ELSEWHERE.get(dtype, (0.0, 0.0))
        call = max([float(str(row["max call growth"])) for row in mine] + [elsewhere[0]])
        kernel = max([float(str(row["max kernel growth"])) for row in mine] + [elsewhere[1]])
        shipped = (derived(call), derived(kernel)) == (CALL_LIMIT[dtype], KERNEL_LIMIT[dtype])
        found.append(
            {
                "dtype": dtype,
                "largest call growth": f"{call:.3f}",
                "largest kernel growth": f"{kernel:.3f}",
                "call limit": f"{derived(call):g}",
                "kernel limit": f"{derived(kernel):g}",
                "the shipped limits": "yes" if shipped else "NO",
            }
        )
    return found


def to_markdown(rows: list[dict[str, object]]) -> str:
    head = list(rows[0])
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    lines += ["| " + " | ".join(str(row[key]) for key in head) + " |" for row in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--markdown", type=Path, help="write the tables here too")
    args = parser.parse_args(argv)
    rows, fault_rows = [], []
    with tempfile.TemporaryDirectory() as scratch:
        for dtype in DTYPES:
            made = {}
            for capability, threads in PATHS:
                folder = Path(scratch) / f"{dtype}-{capability}-{threads}"
                folder.mkdir()
                dump = make(folder / "dump", dtype, capability, threads)
                made[(capability, threads)] = (dump, record(dump, folder))
            for a, b in itertools.permutations(made, 2):
                rows.append(spread_row(f"{dtype} {a[0]}/{a[1]}t -> {b[0]}/{b[1]}t", *changes(made[a], made[b])))
                print(to_markdown([rows[-1]]).splitlines()[-1], flush=True)
            for fault in FAULTS[dtype]:
                folder = Path(scratch) / f"{dtype}-{fault}"
                folder.mkdir()
                dump = make(folder / "dump", dtype, "native", 1, fault)
                fault_rows.append(
                    spread_row(
                        f"{dtype} native/1t -> {fault}", *changes(made[("native", 1)], (dump, record(dump, folder)))
                    )
                )
                print(to_markdown([fault_rows[-1]]).splitlines()[-1], flush=True)
    text = (
        "## correct pairs\n\n" + to_markdown(rows) + "\n\n## the limits they give\n\n" + to_markdown(derivation(rows))
    )
    text += "\n\n## planted faults (not used for the limits)\n\n" + to_markdown(fault_rows) + "\n"
    print(text)
    if args.markdown:
        args.markdown.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
