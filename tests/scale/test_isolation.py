"""Faults stay with their call: a hang, an out-of-memory call, a call that aborts its
process and one stuck where no signal reaches Python are each reported against that
call alone, while every other call still runs and passes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

# rows of a float32 Torch.exp input -> the fault planted there (the bench runs in
# float64, so it stays healthy and only the device run is hit).
PLANTED = """
import os, signal, time
from pathlib import Path

import numpy as np
import pytest
import torch

_exp = torch.exp


def planted_exp(x, *args, **kwargs):
    if x.dtype == torch.float32:
        rows = x.shape[0]
        if rows == 3:  # a hang in Python code
            while True:
                time.sleep(0.05)
        if rows == 5:  # an allocation no machine can satisfy
            np.ones(2**50)
        if rows == 7:  # a kernel that kills its process
            os.abort()
        if rows == 9:  # stuck in C: the timeout's signal never reaches Python
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
            time.sleep(600)
    return _exp(x, *args, **kwargs)


torch.exp = planted_exp

from pytest_msprobe.dump import values

_generate = values.generate_tensor


def planted_generate(spec, seed, where):
    if spec.shape[0] == 13:  # the host runs out while making the call's inputs
        raise MemoryError("planted: cannot allocate the inputs")
    return _generate(spec, seed, where)


values.generate_tensor = planted_generate


def pytest_collection_finish(session):
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    Path(f"threads-{worker}.txt").write_text(str(torch.get_num_threads()))
"""
HEALTHY = (2, 4, 6, 8, 10, 11)


def tensor(shape: list[int]) -> dict[str, Any]:
    return {
        "type": "torch.Tensor",
        "dtype": "torch.float32",
        "shape": shape,
        "Max": 1.0,
        "Min": -1.0,
        "Mean": 0.0,
        "Norm": 1.0,
        "requires_grad": False,
    }


def exp_dump(folder: Path, rows: tuple[int, ...]) -> Path:
    """Torch.exp.{rows}.forward for each number of rows."""
    data = {
        f"Torch.exp.{n}.forward": {"input_args": [tensor([n, 4])], "input_kwargs": {}, "output": [tensor([n, 4])]}
        for n in rows
    }
    (folder / "dump").mkdir()
    path = folder / "dump" / "dump.json"
    path.write_text(json.dumps({"task": "statistics", "level": "L1", "framework": "pytorch", "data": data}))
    return path


def test_faults_stay_with_their_calls_under_xdist(pytester: pytest.Pytester, records) -> None:
    pytester.makeconftest(PLANTED)
    exp_dump(pytester.path, (3, 5, 7, 9, *HEALTHY))
    result = pytester.runpytest_subprocess(
        "--msprobe-dump=dump",
        "-n",
        "2",
        "--msprobe-timeout=2",
        "-p",
        "no:cacheprovider",
        "--msprobe-out=out",
        timeout=240,
    )
    found = records(pytester.path / "out")
    assert set(found) == {f"Torch.exp.{n}.forward" for n in (3, 5, 7, 9, *HEALTHY)}, result.stdout.str()
    assert all(found[f"Torch.exp.{n}.forward"].status == "pass" for n in HEALTHY)
    assert "still running after --msprobe-timeout=2 s" in found["Torch.exp.3.forward"].message
    oom = found["Torch.exp.5.forward"].message
    assert "out of memory on cpu" in oom and "Unable to allocate 8.00 PiB" in oom
    assert "forward.input_args[0] torch.float32 [5, 4] 80 B" in oom
    for crashed in ("Torch.exp.7.forward", "Torch.exp.9.forward"):
        assert found[crashed].status == "error" and "died" in found[crashed].message, found[crashed]
        assert found[crashed].device == "cpu"
    result.stdout.fnmatch_lines(
        ["*4 failed, 7 passed*"]
    )  # the 6 healthy calls and their kernel's test (judge/gate/kernel_verdicts.py)
    threads = {path.name: int(path.read_text()) for path in pytester.path.glob("threads-gw*.txt")}
    assert threads and all(count == 1 for count in threads.values()), threads  # the CPU backend: one each


def test_timeout_and_out_of_memory_without_xdist(pytester: pytest.Pytester, records) -> None:
    pytester.makeconftest(PLANTED)
    exp_dump(pytester.path, (3, 5, 13, 2, 4))
    result = pytester.runpytest_subprocess(
        "--msprobe-dump=dump", "--msprobe-timeout=2", "-p", "no:cacheprovider", "--msprobe-out=out", timeout=120
    )
    result.assert_outcomes(
        failed=3, passed=3
    )  # the 2 healthy calls and their kernel's test (judge/gate/kernel_verdicts.py)
    found = records(pytester.path / "out")
    assert "still running after --msprobe-timeout=2 s" in found["Torch.exp.3.forward"].message
    assert "out of memory on cpu" in found["Torch.exp.5.forward"].message
    inputs = found["Torch.exp.13.forward"].message  # out of memory outside the device run
    assert "out of memory on cpu: MemoryError: planted" in inputs and "[13, 4] 208 B" in inputs


@pytest.mark.parametrize("value", ["soon", "-1"])
def test_a_bad_timeout_is_a_usage_error(pytester: pytest.Pytester, value: str) -> None:
    exp_dump(pytester.path, (2,))
    result = pytester.runpytest("--msprobe-dump=dump", f"--msprobe-timeout={value}")
    result.stderr.fnmatch_lines([f"*--msprobe-timeout: {value!r}*"])
    assert result.ret == pytest.ExitCode.USAGE_ERROR


def test_the_hard_deadline_is_armed_per_stretch_of_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    """faulthandler's watchdog is started once for many short calls (starting and joining
    its thread per call costs milliseconds on a busy machine), and disarmed once no call
    has run for a moment, so that a process waiting for work is never ended."""
    import time

    from pytest_msprobe.run import isolation

    armed, cancelled = [], []
    monkeypatch.setattr(isolation.faulthandler, "dump_traceback_later", lambda seconds, **kwargs: armed.append(seconds))
    monkeypatch.setattr(isolation.faulthandler, "cancel_dump_traceback_later", lambda: cancelled.append(1))
    monkeypatch.setattr(isolation, "HARD_DEADLINE", isolation.HardDeadline())
    for _ in range(200):
        with isolation.deadline(0.8):
            pass
    assert armed == [pytest.approx(2.0)]  # 2 x the timeout, and a quarter of that as slack
    time.sleep(0.8)  # idle: polled every 0.2 s
    assert cancelled == [1]
    with isolation.deadline(0.8):  # the next call arms it again
        pass
    assert len(armed) == 2
    isolation.HARD_DEADLINE.disarm()
    assert len(cancelled) == 2
