r"""Time per call on a dump of LARGE calls, the CPU as the device: the plugin against
msprobe's own runner (acc_check) on the same dump, same machine, same run.

    python benchmarks/bench_large_calls.py [--dump DIR/dump.json] [--repeat 3] [--workers 0 2]
                                           [--msprobe-python PYTHON]

The dump: one training step of a 2-block transformer with hidden size 1024, 16 heads, MLP
4096 and sequence 512 (tests/dumps/models/make_dumps.py's `transformer_large`), float32,
tensor task: 62 dumped calls (31 APIs, forward and backward), ~0.9 GB, so it is not in
git. Without --dump it is made (once) under /tmp/msprobe-large/ with the msprobe venv:
    $MSPROBE_PYTHON tests/dumps/models/make_dumps.py transformer_large float32 \
        /tmp/msprobe-large/transformer_large_tensor_fp32

Per round, interleaved so that every side sees the same machine load:
  plugin -n N  `pytest --msprobe-dump=... --msprobe-device=cpu -n N` in a fresh process,
               for each N of --workers (0: no xdist): wall time of the process, and the
               test phase from the summary ("N run here in X s")
  msprobe      its acc_check in a fresh process of its venv on the CPU (msprobe assumes an
               NPU or a GPU: torch.cuda.set_device is made a no-op and its device is "cpu",
               nothing else changes), wall time of the process and of acc_check itself
Both judge float32 on the CPU against a float64 CPU bench. Best of --repeat per side;
outcomes are compared too (our passed/failed per dumped call; msprobe's forward and
backward pass/warning/error per API).
"""

from __future__ import annotations

import argparse
import csv
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_verdicts import plugin_command  # benchmarks/ is on the path of a script run from it

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DUMP = Path("/tmp/msprobe-large/transformer_large_tensor_fp32/dump.json")

MSPROBE_CPU = r"""
import sys, time
import torch
torch.cuda.set_device = lambda *args, **kwargs: None       # no GPU/NPU: run its "device" side on the CPU
import msprobe.pytorch.api_accuracy_checker.acc_check.acc_check as acc_check
import msprobe.pytorch.api_accuracy_checker.acc_check.acc_check_utils as acc_check_utils
acc_check.current_device = acc_check_utils.current_device = "cpu"
from msprobe.core.acc_check.acc_check_cli import acc_check_cli
start = time.perf_counter()
acc_check_cli(["-api_info", sys.argv[1], "-o", sys.argv[2]])
print("ACC_CHECK_SECONDS", time.perf_counter() - start)
"""


def make_dump(msprobe_python: str, dump: Path) -> None:
    print(f"making {dump.parent} (once; ~1 min)", flush=True)
    subprocess.run(
        [
            msprobe_python,
            str(ROOT / "tests/dumps/models/make_dumps.py"),
            "transformer_large",
            "float32",
            str(dump.parent),
        ],
        check=True,
        capture_output=True,
    )


def run_plugin(dump: Path, workers: int, out: Path) -> dict:
    command = plugin_command(dump, out, "--rootdir", str(dump.parent), "-c", os.devnull, "-W", "ignore")
    if workers:
        command += ["-n", str(workers)]
    start = time.perf_counter()
    result = subprocess.run(command, cwd=dump.parent, capture_output=True, text=True)
    wall = time.perf_counter() - start
    match = re.search(r"(\d+) run here in ([0-9.]+) s", result.stdout)
    counts = {
        k: int(v) for v, k in re.findall(r"(\d+) (passed|failed|skipped|errors?)", result.stdout.splitlines()[-1])
    }
    if match is None:
        raise RuntimeError(result.stdout[-3000:] + result.stderr[-3000:])
    return {"wall": wall, "tests": float(match.group(2)), "ran": int(match.group(1)), "counts": counts}


def run_msprobe(python: str, dump: Path, out: Path) -> dict:
    start = time.perf_counter()
    result = subprocess.run([python, "-c", MSPROBE_CPU, str(dump), str(out)], capture_output=True, text=True)
    wall = time.perf_counter() - start
    match = re.search(r"ACC_CHECK_SECONDS ([0-9.]+)", result.stdout)
    if match is None:
        raise RuntimeError(result.stdout[-3000:] + result.stderr[-3000:])
    with open(glob.glob(str(out / "accuracy_checking_result_*.csv"))[0], encoding="utf-8-sig") as table:
        rows = list(csv.DictReader(table))
    counts: dict[str, int] = {}
    for row in rows:
        for side in ("Forward Test Success", "Backward Test Success"):
            key = f"{side.split()[0].lower()} {row[side] or '-'}"
            counts[key] = counts.get(key, 0) + 1
    return {"wall": wall, "acc_check": float(match.group(1)), "apis": len(rows), "counts": counts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dump", type=Path, default=DEFAULT_DUMP)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument(
        "--msprobe-python",
        default=os.environ.get("MSPROBE_PYTHON", ""),
        help="msprobe's venv python (default: $MSPROBE_PYTHON; unset: msprobe is not run)",
    )
    args = parser.parse_args()
    if not args.dump.exists():
        if args.dump != DEFAULT_DUMP:
            sys.exit(f"{args.dump} does not exist")
        make_dump(args.msprobe_python, args.dump)
    data = json.loads(args.dump.read_text())["data"]
    calls = [name for name in data if not name.startswith(("Module.", "Cell."))]
    apis = {name.rsplit(".", 1)[0] for name in calls}
    size = sum(p.stat().st_size for p in args.dump.parent.rglob("*") if p.is_file())
    print(
        f"dump {args.dump}: {len(calls)} calls ({len(apis)} APIs, forward and backward), {size / 1e9:.2f} GB; "
        f"{os.cpu_count()} CPUs; load average before {os.getloadavg()}",
        flush=True,
    )
    ours: dict[int, list[dict]] = {n: [] for n in args.workers}
    theirs: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.repeat):
            for n in args.workers:
                out = Path(tmp) / f"ours{n}_{round_}"
                ours[n].append(run_plugin(args.dump, n, out))
                shutil.rmtree(out, ignore_errors=True)
                print(f"round {round_ + 1}: plugin -n {n}: {ours[n][-1]}", flush=True)
            if args.msprobe_python and os.path.exists(args.msprobe_python):
                out = Path(tmp) / f"msprobe_{round_}"
                theirs.append(run_msprobe(args.msprobe_python, args.dump, out))
                shutil.rmtree(out, ignore_errors=True)
                print(f"round {round_ + 1}: msprobe: {theirs[-1]}", flush=True)
    print(f"load average after {os.getloadavg()}")
    print(
        f"\nbest of {args.repeat} (interleaved); per call = per dumped call ({len(calls)}), "
        f"per API = per forward+backward pair ({len(apis)})"
    )
    print(f"{'side':14s} {'wall (s)':>9s} {'checking (s)':>13s} {'per call (ms)':>14s} {'per API (ms)':>13s}  outcomes")
    best_m = min(theirs, key=lambda r: r["wall"]) if theirs else None
    for n in args.workers:
        best = min(ours[n], key=lambda r: r["wall"])
        print(
            f"{'plugin -n ' + str(n):14s} {best['wall']:9.1f} {best['tests']:13.1f} {best['wall'] / len(calls) * 1e3:14.0f} "
            f"{best['wall'] / len(apis) * 1e3:13.0f}  {best['counts']}"
        )
    if best_m is not None:
        print(
            f"{'msprobe':14s} {best_m['wall']:9.1f} {best_m['acc_check']:13.1f} {best_m['wall'] / len(calls) * 1e3:14.0f} "
            f"{best_m['wall'] / len(apis) * 1e3:13.0f}  {best_m['counts']}"
        )
        for n in args.workers:
            best = min(ours[n], key=lambda r: r["wall"])
            print(
                f"msprobe / plugin -n {n}: wall {best_m['wall'] / best['wall']:.1f}x, checking {best_m['acc_check'] / best['tests']:.1f}x"
            )


if __name__ == "__main__":
    main()
