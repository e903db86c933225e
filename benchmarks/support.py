"""What the timing benchmarks share besides fixtures: where the shipped dumps are, the
plugin's run of a dump in a fresh process, and a timer for times a process reports."""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_msprobe.testing import commands as testing_commands

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "tests" / "dumps" / "models"
SHIPPED = MODELS / "transformer12_tensor_fp32" / "dump.json"
TOOLS = ROOT / "tools"
SUMMARY = re.compile(r"(\d+) run here in ([0-9.]+) s")
COUNTS = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed)")

if TYPE_CHECKING:
    from pytest_msprobe.judge.verdict.record import ResultRecord


def load() -> list[float]:
    """The load average (1, 5, 15 minutes)."""
    return [round(value, 2) for value in os.getloadavg()]


@dataclass(frozen=True)
class Sizes:
    """Which size a benchmark runs: the default (quick) or the full one."""

    full: bool

    def __call__(self, default: int, full: int) -> int:
        return full if self.full else default


def fastest(benchmark: Any) -> float:
    """The best round's seconds; NaN where the run is --benchmark-disable'd (no stats)."""
    stats = getattr(benchmark, "stats", None)
    return float("nan") if stats is None else float(stats.stats.min)


class ReportedClock:
    """A benchmark timer that advances only by the seconds a measured process reports
    (the plugin's test phase, msprobe's time inside acc_check, a first call in a fresh
    process): `@pytest.mark.benchmark(timer=clock)`, and `clock.add(seconds)` in the
    measured function. What a whole process's wall time would drown is then the number."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def add(self, seconds: float) -> None:
        self.now += seconds


@dataclass(frozen=True)
class PluginRun:
    """One fresh `pytest --msprobe-dump` process: its wall time, the test phase from the
    plugin's summary ("N run here in X s"), and its outcome counts."""

    wall_s: float
    tests_s: float
    ran: int
    counts: dict[str, int]
    stdout: str


def plugin_command(dump: Path, out: Path, *extra: str) -> list[str]:
    """The plugin's run of one dump on the CPU in a process of its own, outside this
    repository's configuration (its own rootdir, no ini file)."""
    root = dump if dump.is_dir() else dump.parent
    return testing_commands.plugin_command(dump, out, "-c", os.devnull, "--rootdir", str(root), *extra)


def timed_process(command: list[str], cwd: Path, env: dict[str, str] | None = None) -> tuple[float, str]:
    """Wall time and stdout of a process that must succeed (pytest's 1: some tests failed)."""
    started = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode not in (0, 1):
        raise AssertionError(
            f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
    return seconds, done.stdout


def passing_record(call: str, small: Sequence[float], duration: float) -> ResultRecord:
    """A typical small call that passed: one float32 output judged single-run by the
    benchmark standard, its metrics and msprobe's legacy ones made from `small` (five
    values around 1e-7; varied ones pack into files as a real run's do)."""
    from pytest_msprobe.judge.verdict.record import OutputResult, ResultRecord

    metrics = {
        "small_value_err_ratio": 0.0,
        "rmse": small[0],
        "max_rel_err": small[1] * 10,
        "mean_rel_err": small[2],
        "eb": small[3] * 1e4,
        "cosine": 1.0 - small[4],
        "max_abs_err": small[0] * 3,
        "rel_err_hundredth": 1.0,
        "rel_err_thousandth": 1.0,
        "rel_err_ten_thousandth": 0.9999,
    }
    output = OutputResult(
        0,
        "",
        "pass",
        "benchmark",
        "single-run",
        "float32",
        "float64",
        [4, 16],
        metrics,
        {"small": 2**-20, "atol_bm": 2**-30},
        [],
    )
    inputs = ["input_args[0]: generated from statistics (seed 1)"]
    return ResultRecord(
        "/data/dump.json", call, "pass", "benchmark", "single-run", "cpu", "", [output], inputs, duration
    )
