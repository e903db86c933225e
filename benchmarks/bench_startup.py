"""Start-up of a run as a user feels it: a dump of one call against the floor.

    python benchmarks/bench_startup.py [--repeats 7] [--work DIR]

Measured, as wall time of a fresh process, best of --repeats, the runs interleaved so that
all see the same machine load (the load average is printed before and after):

  import torch     `python -c "import torch"`
  bare pytest      a pytest session of one empty test, with this environment's plugins
                   (pytest-msprobe inactive without a dump, xdist, hypothesis)
  floor            the two added: what any run that replays a call under pytest pays
  1 call, -n 0     `pytest --msprobe-dump=<one call> --msprobe-device=cpu`
  1 call, -n 2     the same with two xdist workers (each imports torch; the controller does not)

Target: the 1-call run with -n 0 within 1 s of the floor. The one-call dump is
Functional.linear.0.forward of the shipped transformer dump
(tests/dumps/models/transformer12_tensor_fp32), copied with its tensor files.
Every process gets a private temporary root (PYTEST_DEBUG_TEMPROOT): an xdist run
otherwise deletes the oldest of the user's earlier pytest temporary folders first,
whatever other test suites left there (seconds, on a machine where they are large).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "tests" / "dumps" / "models" / "transformer12_tensor_fp32"
CALL = "Functional.linear.0.forward"


def load() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def one_call_dump(folder: Path) -> Path:
    """The shipped dump's first linear forward alone, with its tensor files."""
    dump = json.loads((SOURCE / "dump.json").read_text())
    record = dump["data"][CALL]
    dump["data"] = {CALL: record}
    (folder / "dump_tensor_data").mkdir(parents=True, exist_ok=True)
    for name in json.dumps(record).split('"data_name": "')[1:]:
        name = name.split('"', 1)[0]
        shutil.copy(SOURCE / "dump_tensor_data" / name, folder / "dump_tensor_data" / name)
    (folder / "dump.json").write_text(json.dumps(dump))
    return folder / "dump.json"


def wall(command: list[str], cwd: Path, env: dict[str, str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(
            f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--work", type=Path, help="folder for the dump and runs (default a temporary one)")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="msprobe-startup-"))
    work.mkdir(parents=True, exist_ok=True)
    dump = one_call_dump(work / "one")
    (work / "bare").mkdir(exist_ok=True)
    (work / "bare" / "test_bare.py").write_text("def test_nothing():\n    pass\n")
    (work / "tmp").mkdir(exist_ok=True)
    env = {**os.environ, "PYTEST_DEBUG_TEMPROOT": str(work / "tmp")}
    pytest = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", os.devnull]
    runs = {
        "import torch": [sys.executable, "-c", "import torch"],
        "bare pytest": [*pytest, "--rootdir", str(work / "bare"), str(work / "bare" / "test_bare.py")],
        "1 call, -n 0": [
            *pytest,
            "--rootdir",
            str(work / "one"),
            f"--msprobe-dump={dump}",
            "--msprobe-device=cpu",
            f"--msprobe-out={work / 'out'}",
        ],
        "1 call, -n 2": [
            *pytest,
            "--rootdir",
            str(work / "one"),
            f"--msprobe-dump={dump}",
            "--msprobe-device=cpu",
            f"--msprobe-out={work / 'out'}",
            "-n",
            "2",
        ],
    }
    before = load()
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", "s = 0\nfor i in range(6_000_000):\n    s += i * i\n"], check=True)
    loop = time.perf_counter() - started  # the machine's speed now (0.6 s on a quiet day here)
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.repeats):
        for name, command in runs.items():
            times[name].append(wall(command, work, env))
    best = {name: min(values) for name, values in times.items()}
    floor = best["import torch"] + best["bare pytest"]
    print(
        f"load average before {before}, after {load()}; a pure-Python loop took {loop:.2f} s; best of {args.repeats} (all runs, s):"
    )
    for name, values in times.items():
        print(f"  {name:14s} {best[name]:6.2f}   ({', '.join(f'{value:.2f}' for value in values)})")
    print(f"  {'floor':14s} {floor:6.2f}   (import torch + bare pytest)")
    gap = best["1 call, -n 0"] - floor
    print(f"1 call, -n 0 is {gap:+.2f} s from the floor: target within 1 s: {'met' if gap <= 1.0 else 'NOT met'}")


if __name__ == "__main__":
    main()
