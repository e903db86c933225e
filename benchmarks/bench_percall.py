"""Where a small call's time goes: the test phase per call of a real dump with
-n 0, before and after, and one call's parts measured in-process.

    python benchmarks/bench_percall.py [--dump DUMP.json] [--before REV] [--repeats 5] [--offline]

  per call     the test phase of `pytest --msprobe-dump=DUMP --msprobe-device=cpu -n 0`
               (from collection's end to the session's: tools/probe_plugin.py's
               run_s) over the calls, best of --repeats;
               with --before REV, the same for REV (a git worktree of it, imported with
               this environment's packages), the runs interleaved
  floor        pytest's own cost of an empty test in a process that imported torch:
               (wall of N empty tests - wall of 1) / (N - 1), best of --repeats
  --offline    the runs with --msprobe-offline (a tensor dump): the dumped outputs are
               the device; the parts then give judge_call's total only
  parts        judge.outcome.judge_call on every call of the dump in this process, CPU
               time per call, best of --repeats, split into reading the inputs, the
               replay (device and bench runs), the judgement (standards), and the rest
               (the record, the verdict's text)

Default dump: tests/dumps/models/transformer12_tensor_fp32 (float32, forward and backward).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_verdicts import worktree  # benchmarks/ is on the path of a script run from it

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SHIPPED = ROOT / "tests" / "dumps" / "models" / "transformer12_tensor_fp32" / "dump.json"


def load() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def test_phase(dump: Path, out: Path, source: Path | None, work: Path, mode: list[str]) -> tuple[float, int]:
    probe = work / f"probe-{time.monotonic_ns()}.jsonl"
    paths = [str(source)] if source is not None else []
    env = {
        **os.environ,
        "PYTEST_DEBUG_TEMPROOT": str(work / "tmp"),
        "MSPROBE_BENCH_PROBE": str(probe),
        "PYTHONPATH": os.pathsep.join([*paths, str(ROOT / "tools")]),
    }
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "probe_plugin",
            "-c",
            os.devnull,
            "--rootdir",
            str(dump.parent),
            f"--msprobe-dump={dump}",
            "--msprobe-device=cpu",
            f"--msprobe-out={out}",
            *mode,
        ],
        cwd=dump.parent,
        env=env,
        capture_output=True,
        text=True,
    )
    if not probe.exists():
        raise SystemExit(done.stdout[-3000:] + done.stderr[-3000:])
    found = json.loads(probe.read_text().splitlines()[0])
    return float(found["run_s"]), int(found["ran"])


def floor_ms(work: Path, calls: int, repeats: int) -> float:
    folder = work / "floor"
    folder.mkdir(exist_ok=True)
    (folder / "test_many.py").write_text(
        f"import pytest, torch\n\n@pytest.mark.parametrize('i', range({calls}))\ndef test_nothing(i):\n    pass\n"
    )
    (folder / "test_one.py").write_text("import torch\n\ndef test_nothing():\n    pass\n")

    def wall(name: str) -> float:
        started = time.perf_counter()
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "-c",
                os.devnull,
                "--rootdir",
                str(folder),
                str(folder / name),
            ],
            cwd=folder,
            capture_output=True,
            check=True,
        )
        return time.perf_counter() - started

    many, one = [], []
    for _ in range(repeats):
        many.append(wall("test_many.py"))
        one.append(wall("test_one.py"))
    return 1000 * (min(many) - min(one)) / (calls - 1)


PARTS = r"""
import sys, time
from pathlib import Path
import torch
torch.set_num_threads(1)
from pytest_msprobe.plugin.workers import set_blas_threads
set_blas_threads(1)
from pytest_msprobe.dump.index import read_index
from pytest_msprobe.judge.check import call as C
from pytest_msprobe.judge.verdict.judgement import Judgement, judged
from pytest_msprobe.judge.check.outcome import judge_call
from pytest_msprobe.run.devices import Backend
from pytest_msprobe.run.replay import Sides, replay
from pytest_msprobe.standards import Registry
index = read_index(Path(sys.argv[1]))
repeats, offline = int(sys.argv[2]), sys.argv[3] == "offline"
settings = C.Settings(backend=Backend(), device_index=0, max_elements=2**28, registry=Registry.default(), offline=offline)
names = [index.call_at(i) for i in range(len(index))]
framework = C.PytorchReplay()
for name in names:
    judge_call(index, name, settings)
def best(step):
    fastest = float("inf")
    for _ in range(repeats):
        started = time.process_time()
        for name in names:
            step(name)
        fastest = min(fastest, time.process_time() - started)
    return 1000 * fastest / len(names)
if offline:
    total = best(lambda n: judge_call(index, n, settings))
    print(f"  {'judge_call, all of it':26s} {total:6.3f} ms")
    raise SystemExit
inputs = {str(n): C.read_inputs(index, n, settings.max_elements) for n in names}
apis = {str(n): framework.resolve(n, settings.backend) for n in names}
replayed = {str(n): C.replay_call(index, n, settings) for n in names}
def run(name):
    api, given = apis[str(name)], inputs[str(name)]
    device, bench, reference = framework.runs(api, given, settings)
    replay(name.direction, api, given, Sides(device, bench, reference), framework="pytorch")
def judgement_of(name):
    done = replayed[str(name)]
    judged(Judgement(settings.registry, name, done.results, done.bench, "pytorch"))
parts = {"read the inputs": best(lambda n: C.read_inputs(index, n, settings.max_elements)), "replay": best(run),
         "judgement (standards)": best(judgement_of)}
total = best(lambda n: judge_call(index, n, settings))
parts["the rest (record, text)"] = total - sum(parts.values())
for part, ms in parts.items():
    print(f"  {part:26s} {ms:6.3f} ms")
print(f"  {'judge_call, all of it':26s} {total:6.3f} ms")
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dump", type=Path, default=SHIPPED)
    parser.add_argument("--before", help="a git revision to measure too (e.g. f934085)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--offline", action="store_true", help="run with --msprobe-offline")
    args = parser.parse_args()
    mode = ["--msprobe-offline"] if args.offline else []
    dump = args.dump.resolve()
    work = Path(tempfile.mkdtemp(prefix="msprobe-percall-"))
    (work / "tmp").mkdir()
    sides = {"after": None}
    if args.before:
        sides = {"before": worktree(args.before), **sides}
    print(f"load average before {load()}; dump {dump}")
    phases: dict[str, list[float]] = {side: [] for side in sides}
    calls = 0
    try:
        for _ in range(args.repeats):
            for side, source in sides.items():
                seconds, calls = test_phase(dump, work / f"out-{side}", source, work, mode)
                phases[side].append(seconds)
    finally:
        if sides.get("before") is not None:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(sides["before"])], capture_output=True
            )
    for side, values in phases.items():
        print(
            f"per call, -n 0 ({side}): {1000 * min(values) / calls:.2f} ms  (test phase {min(values):.3f} s for {calls} "
            f"calls; all runs {', '.join(f'{value:.3f}' for value in values)} s)"
        )
    print(f"pytest's empty test, torch imported: {floor_ms(work, calls, args.repeats):.2f} ms")
    print("one call's parts, in-process (CPU time per call, this tree):")
    subprocess.run(
        [sys.executable, "-c", PARTS, str(dump), str(args.repeats), "offline" if args.offline else "single"], check=True
    )
    print(f"load average after {load()}")


if __name__ == "__main__":
    main()
