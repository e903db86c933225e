"""The GEMM backward judged offline through the dump's data flow: which are judged, which
skipped and why, on real msprobe dumps (the time an offline check takes is the timing
benchmark benchmarks/test_dataflow.py).

    python studies/dataflow_coverage.py DIR [--make] [--msprobe-python PATH]

Real msprobe dumps of a 4-block transformer with residual connections
(tests/dumps/models/make_dumps.py transformer4), levels L1 and mix, float32, bfloat16 and
float16, and the fault linear_backward_bf16 (planted inside the call) at L1 and mix, made
under DIR with --make (in msprobe's Python; ~1-2 MB each, so not shipped). Each is checked
offline; printed per dump: the outcomes, the statuses of the result CSV (forward and
backward: warnings are passes there), the GEMM backwards (linear, matmul) judged and
skipped with their reasons and where their gradients came from (a module's record, the
data flow), which calls failed and, for a linear, which gradients ([0] input, [1] weight).
"""

from __future__ import annotations

import argparse
import collections
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MAKER = ROOT / "tests" / "dumps" / "models" / "make_dumps.py"
GEMM = ("Functional.linear.", "Torch.matmul.", "Tensor.__matmul__.")
DUMPS = {
    f"t4_{level}_{dtype}{'_fault' if fault else ''}": (dtype, level, fault)
    for level in ("L1", "mix")
    for dtype, fault in (("float32", False), ("bfloat16", False), ("float16", False), ("float32", True))
}


def offline(
    dump: Path, env: dict[str, str], *extra: str, out: Path | None = None
) -> tuple[float, subprocess.CompletedProcess]:
    with tempfile.TemporaryDirectory() as scratch:
        command = [
            sys.executable,
            "-m",
            "pytest",
            f"--msprobe-dump={dump}",
            "--msprobe-offline",
            "--msprobe-device=cpu",
        ]
        command += [
            "-n",
            "0",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--basetemp={scratch}/bt",
            f"--msprobe-out={out or Path(scratch) / 'out'}",
            *extra,
        ]
        start = time.perf_counter()
        done = subprocess.run(command, cwd=scratch, env=env, capture_output=True, text=True)
        return time.perf_counter() - start, done


def make(folder: Path, python: str) -> None:
    for name, (dtype, level, fault) in DUMPS.items():
        command = [python, str(MAKER), "transformer4", dtype, str(folder / name), "--level", level]
        command += ["--fault", "linear_backward_bf16"] if fault else []
        subprocess.run(command, check=True, capture_output=True)
        print(f"made {folder / name}", flush=True)


def outcomes(junit: Path) -> dict[str, tuple[str, str]]:
    """call -> (outcome, message) from pytest's junit XML."""
    found = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        call = case.get("name", "")
        outcome, message = "passed", ""
        for kind in ("failure", "skipped", "error"):
            node = case.find(kind)
            if node is not None:
                outcome, message = kind, node.get("message", "")
        found[call] = (outcome, message)
    return found


def result_rows(out: Path) -> list[dict[str, str]]:
    """The rows of the run's accuracy_checking_result_*.csv (UTF-8 with BOM)."""
    found = sorted(out.glob("accuracy_checking_result_*.csv"))
    if not found:
        return []
    with open(found[-1], encoding="utf-8-sig", newline="") as handle:
        return list(csv.DictReader(handle))


def statuses(rows: list[dict[str, str]]) -> dict[str, int]:
    """pass/warning/error/SKIP counts, forward and backward together."""
    counts = collections.Counter(
        row[column].strip() for row in rows for column in ("Forward Test Success", "Backward Test Success")
    )
    return {status: counts[status] for status in ("pass", "warning", "error", "SKIP")}


def origins(junit: Path) -> collections.Counter[str]:
    """Where the GEMM backwards' recovered gradients came from (their msprobe_reference
    property): per gradient, a module's record or a producer's incoming gradient (the data flow)."""
    found: collections.Counter[str] = collections.Counter()
    for case in ET.parse(junit).getroot().iter("testcase"):
        if not case.get("name", "").startswith(GEMM):
            continue
        for prop in case.iter("property"):
            how = prop.get("value", "") if prop.get("name") == "msprobe_reference" else ""
            found["module record"] += how.count("from the module's record")
            found["data flow"] += how.count("(the gradient of the output it read)")
    return found


def faulty_gradients(rows: list[dict[str, str]]) -> str:
    """Of the linear backwards in error, how many erred on the input gradient [0] and the weight gradient [1]."""
    linears = [
        row["Message"]
        for row in rows
        if row["API name"].startswith("Functional.linear.") and row["Backward Test Success"] == "error"
    ]
    return f"{len(linears)} linear backward errors: [0] in {sum('reason: [0]:' in m for m in linears)}, [1] in {sum('reason: [1]:' in m for m in linears)}"


def coverage(args: argparse.Namespace) -> None:
    if args.make:
        make(args.dir, args.msprobe_python)
    for name in DUMPS:
        dump = args.dir / name / "dump.json"
        if not dump.exists():
            print(f"{name}: missing (run with --make)")
            continue
        with tempfile.TemporaryDirectory() as scratch:
            junit = Path(scratch) / "junit.xml"
            seconds, _ = offline(dump, dict(os.environ), f"--junitxml={junit}", out=Path(scratch) / "out")
            calls = outcomes(junit)
            rows = result_rows(Path(scratch) / "out")
            recovered = origins(junit)
        counts = collections.Counter(outcome for outcome, _ in calls.values())
        gemm = {call: result for call, result in calls.items() if call.startswith(GEMM) and call.endswith(".backward")}
        linears = sorted(json.loads(dump.read_text())["data"])
        linears = [call for call in linears if call.startswith("Functional.linear.") and call.endswith(".backward")]
        failed = sorted(call for call, (outcome, _) in calls.items() if outcome == "failure")
        print(
            f"{name}: {len(calls)} calls, {dict(counts)} in {seconds:.1f} s; GEMM backwards {len(gemm)}: "
            f"{sum(o == 'passed' for o, _ in gemm.values())} pass, {sum(o == 'failure' for o, _ in gemm.values())} error, "
            f"{sum(o == 'skipped' for o, _ in gemm.values())} skipped; failed: "
            f"{'every linear backward (' + str(len(linears)) + ')' if failed == sorted(linears) and failed else failed}"
        )
        print(
            f"    statuses {statuses(rows)}; GEMM gradients recovered from {dict(recovered)}; {faulty_gradients(rows)}"
        )
        for call, (outcome, message) in calls.items():
            if outcome == "skipped":
                print(f"    skipped {call}: {message[:220]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dir", type=Path, help="the folder of the dumps (made there with --make)")
    parser.add_argument("--make", action="store_true", help="make the dumps first (needs mindstudio-probe)")
    parser.add_argument(
        "--msprobe-python",
        default=os.environ.get("MSPROBE_PYTHON", ""),
        help="msprobe's venv python, for --make (default: $MSPROBE_PYTHON)",
    )
    coverage(parser.parse_args())


if __name__ == "__main__":
    main()
