"""A real 12-block transformer tensor dump, float32, on the CPU: this plugin with
-n 0 and -n 2 against msprobe's own runner, on the same dump, same machine, same run.

    python benchmarks/bench_transformer.py [--dump DUMP.json] [--repeats 5] [--msprobe-repeats 3]
                                           [--msprobe-python PYTHON] [--work DIR]

The dump: --dump, else one made now with the shared maker (tools/make_transformer_dump.py,
in msprobe's Python), else the shipped tests/dumps/models/transformer12_tensor_fp32.

Every figure is the wall time of a whole fresh process, start-up and exit included, best
of the runs (all runs printed); the runs are interleaved (ours -n 0, ours -n 2, msprobe,
then again) so that all see the same machine load, which is printed before and after:
  -n 0      pytest --msprobe-dump=DUMP --msprobe-device=cpu
  -n 2      the same with two xdist workers
  msprobe   msprobe acc_check -api_info DUMP -o OUT, its device set to the CPU
            (tools/msprobe_acc_check_cpu.py); its time inside acc_check printed too
Targets: -n 0 at least 30x faster than msprobe; -n 2 faster than -n 0; the result files of
-n 0 and -n 2 identical (every file of the run, rows sorted, durations and timestamps
aside). Private temporary roots and no cache provider, as in bench_startup.py.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SHIPPED = ROOT / "tests" / "dumps" / "models" / "transformer12_tensor_fp32" / "dump.json"
# msprobe's venv python (torch, mindstudio-probe): None where MSPROBE_PYTHON is unset (msprobe not run)
MSPROBE_PYTHON = Path(os.environ["MSPROBE_PYTHON"]) if os.environ.get("MSPROBE_PYTHON") else None


def load() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


SPIN = "import time\nt = time.perf_counter()\ns = 0\nfor i in range(6_000_000):\n    s += i * i\n"


def cpu_scaling() -> str:
    """A pure-Python loop's time alone (the machine's speed now: the same loop took 0.6 s
    on a quiet day here, 1.1 s on a slow one), and how much two at once get done against
    one (2.0: two free cores; about 1 when other work holds one): what -n 2 can gain."""
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", SPIN], check=True)
    alone = time.perf_counter() - started
    started = time.perf_counter()
    both = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(2)]
    for process in both:
        process.wait()
    return f"loop {alone:.2f} s, two at once {2 * alone / (time.perf_counter() - started):.2f}x"


def the_dump(args: argparse.Namespace) -> tuple[Path, str]:
    if args.dump:
        return args.dump.resolve(), "given"
    made = args.work / "transformer12_tensor_fp32"
    if (made / "dump.json").exists():
        return made / "dump.json", "made with the shared maker (tools/make_transformer_dump.py)"
    if args.msprobe_python is not None and args.msprobe_python.exists():
        done = subprocess.run(
            [str(args.msprobe_python), str(ROOT / "tools" / "make_transformer_dump.py"), str(made)],
            capture_output=True,
            text=True,
        )
        if done.returncode == 0 and (made / "dump.json").exists():
            return made / "dump.json", "made with the shared maker (tools/make_transformer_dump.py)"
        print(f"the shared maker failed ({done.returncode}): {done.stderr[-500:]}; the shipped dump is used")
    return SHIPPED, "shipped (tests/dumps/models/transformer12_tensor_fp32)"


def timed(command: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess]:
    started = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    return time.perf_counter() - started, done


def normalized(folder: Path) -> dict[str, Any]:
    """The newest run's result files, comparable across runs: rows sorted (xdist writes
    them as they arrive), durations, timestamps and the command left out."""

    def newest(pattern: str) -> Path:
        return sorted(folder.glob(pattern))[-1]

    found: dict[str, Any] = {}
    for pattern in ("accuracy_checking_result_*.csv", "accuracy_checking_details_*.csv"):
        with open(newest(pattern), encoding="utf-8-sig", newline="") as handle:
            rows = list(csv.reader(handle))
        found[pattern] = [rows[0], *sorted(rows[1:])]
    for pattern in ("accuracy_checking_metrics_*.jsonl", "msprobe_records_*.jsonl"):
        lines = []
        for line in newest(pattern).read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            record.pop("duration", None)
            lines.append(json.dumps(record, sort_keys=True))
        found[pattern] = sorted(lines)
    run = json.loads(newest("msprobe_run_*.json").read_text(encoding="utf-8"))
    for session in run["sessions"]:
        for key in ("started", "duration", "command"):
            session.pop(key, None)
        session["environment"].pop("created", None)
    found["msprobe_run_*.json"] = run
    return found


@dataclass(frozen=True)
class _Commands:
    """What each run is: ours -n 0 and -n 2 (by name), msprobe's runner (without its
    output folder), and where and how they run."""

    ours: dict[str, list[str]]
    msprobe: list[str]
    root: Path
    env: dict[str, str]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dump", type=Path, help="dump.json, or a folder of them (ranks: ours only)")
    parser.add_argument("--repeats", type=int, default=5, help="runs of ours, each way")
    parser.add_argument("--msprobe-repeats", type=int, default=3, help="runs of msprobe's runner (0: none)")
    parser.add_argument("--msprobe-python", type=Path, default=MSPROBE_PYTHON)
    parser.add_argument("--work", type=Path)
    args = parser.parse_args()
    args.work = (args.work or Path(tempfile.mkdtemp(prefix="msprobe-transformer-"))).resolve()
    args.work.mkdir(parents=True, exist_ok=True)
    dump, origin = the_dump(args)
    files = sorted(dump.rglob("dump.json")) if dump.is_dir() else [dump]  # a folder: one dump per rank
    calls = sum(len(json.loads(path.read_text())["data"]) for path in files)
    commands = _commands(args, dump)
    before, scaling_before = load(), cpu_scaling()
    times, inside = _interleaved(args, dump, commands)
    print(f"dump: {dump} ({calls} calls, {origin})")
    print(f"load average before {before}, after {load()}; machine before: {scaling_before}; after: {cpu_scaling()}")
    _report(args, times, inside, calls)


def _commands(args: argparse.Namespace, dump: Path) -> _Commands:
    root = dump if dump.is_dir() else dump.parent
    (args.work / "tmp").mkdir(exist_ok=True)
    env = {**os.environ, "PYTEST_DEBUG_TEMPROOT": str(args.work / "tmp")}
    ours = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-c",
        os.devnull,
        "--rootdir",
        str(root),
        f"--msprobe-dump={dump}",
        "--msprobe-device=cpu",
    ]
    runs = {
        "-n 0": [*ours, f"--msprobe-out={args.work / 'out-n0'}"],
        "-n 2": [*ours, f"--msprobe-out={args.work / 'out-n2'}", "-n", "2"],
    }
    msprobe = [str(args.msprobe_python), str(ROOT / "tools" / "msprobe_acc_check_cpu.py"), "-api_info", str(dump)]
    return _Commands(runs, msprobe, root, env)


def _interleaved(
    args: argparse.Namespace, dump: Path, commands: _Commands
) -> tuple[dict[str, list[float]], list[float]]:
    """Each run's seconds (ours -n 0, ours -n 2, msprobe, then again), and msprobe's own
    time inside acc_check."""
    times: dict[str, list[float]] = {name: [] for name in commands.ours}
    times["msprobe"], inside = [], []
    for repeat in range(max(args.repeats, args.msprobe_repeats)):
        if repeat < args.repeats:
            for name, command in commands.ours.items():
                seconds, done = timed(command, commands.root, commands.env)
                if done.returncode not in (0, 1):
                    raise SystemExit(
                        f"{name} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
                    )
                times[name].append(seconds)
        if (
            repeat < args.msprobe_repeats
            and args.msprobe_python is not None
            and args.msprobe_python.exists()
            and not dump.is_dir()
        ):
            out = args.work / f"out-msprobe-{repeat}"
            shutil.rmtree(out, ignore_errors=True)
            seconds, done = timed([*commands.msprobe, "-o", str(out)], args.work, commands.env)
            if done.returncode != 0:
                raise SystemExit(f"msprobe failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
            times["msprobe"].append(seconds)
            inside.extend(
                float(line.split()[1]) for line in done.stdout.splitlines() if line.startswith("msprobe-seconds")
            )
    return times, inside


def _report(args: argparse.Namespace, times: dict[str, list[float]], inside: list[float], calls: int) -> None:
    print("wall time of each process, best of its runs (all runs), s:")
    for name, values in times.items():
        if values:
            print(f"  {name:8s} {min(values):7.2f}   ({', '.join(f'{value:.2f}' for value in values)})")
    if inside:
        print(f"  msprobe's time inside acc_check: best {min(inside):.2f} s")
    identical = normalized(args.work / "out-n0") == normalized(args.work / "out-n2")
    n0, n2 = min(times["-n 0"]), min(times["-n 2"])
    print(
        f"-n 2 / -n 0: {n2 / n0:.2f} ({'faster' if n2 < n0 else 'NOT faster'}); result files of -n 0 and -n 2 "
        f"{'identical' if identical else 'DIFFERENT'}"
    )
    if times["msprobe"]:
        ratio = min(times["msprobe"]) / n0
        print(
            f"msprobe / -n 0: {ratio:.1f}x (target >= 30x: {'met' if ratio >= 30 else 'NOT met'}); "
            f"per call: ours {1000 * n0 / calls:.1f} ms, msprobe {1000 * min(times['msprobe']) / calls:.0f} ms"
        )


if __name__ == "__main__":
    main()
