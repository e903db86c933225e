"""Faults of one call stay that call's: a hang, a device out of memory, a crash.

- Timeout: SIGALRM raises CallTimeout in the call's Python code when --msprobe-timeout
  passes. A call stuck inside a C kernel never returns to Python, so a second, hard
  deadline (faulthandler's watchdog thread, at 2 to 2.5 times the timeout) dumps the stacks and
  ends the process: under xdist the controller reports that call as crashed and starts
  a new worker for the rest. Arming and cancelling faulthandler's watchdog starts and
  joins a thread, which costs milliseconds on a busy machine (every -n worker busy): so
  it is armed for a stretch of calls, not per call (HardDeadline).
- Out of memory: the call errors with the sizes of its tensors and the failed
  allocation, the memory is released, and the next call starts clean.
- Crash (segfault, abort, the hard deadline): the controller makes the call's error
  record from xdist's crash report (judge.outcome.crash_record, plugin.scale).
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import gc
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from pytest_msprobe.dump.index import CallName, DumpIndex
from pytest_msprobe.private_apis import join_threads, run_exit_handlers

if TYPE_CHECKING:
    from types import FrameType

    from pytest_msprobe.dump.index import Json
    from pytest_msprobe.run.devices import Backend

HARD_DEADLINE_FACTOR = 2


class CallTimeout(BaseException):
    """Raised in the call's own code at its deadline. A BaseException, so that the
    replay's `except Exception` (a device failing is a finding) does not absorb it and
    run the bench for a call whose time is up."""


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Bound the block to `seconds` (0: no bound). Needs SIGALRM and the main thread;
    without them (Windows, a test run from a thread) the call is unbounded."""
    if seconds <= 0 or not hasattr(signal, "SIGALRM") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum: int, frame: FrameType | None) -> None:
        raise CallTimeout(f"still running after --msprobe-timeout={seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    HARD_DEADLINE.enter(seconds * HARD_DEADLINE_FACTOR)
    try:
        yield
    finally:
        HARD_DEADLINE.leave()
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class HardDeadline:
    """faulthandler's watchdog (a C thread: it fires even while the call holds the GIL
    inside a kernel) ends the process when a call runs `hard` seconds past its start.

    Armed for a stretch of calls rather than per call: a call starts it only when less
    than `hard` is left on it, and then sets it to `hard` plus a slack of a quarter of
    `hard`; so a stuck call ends the process between `hard` and 1.25 x `hard` after it
    started, and the watchdog is re-armed once every slack's worth of calls. Between
    calls the process may wait for work far longer (an xdist worker waits for the others
    at the end), so a Python thread of ours disarms it once no call has run for a
    moment (polling at most every second; idle means waiting, so the thread gets the
    GIL), and the next call arms it again. Arming and disarming are done under one lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.expires = 0.0  # monotonic time faulthandler's watchdog fires; 0: not armed
        self.idle_since: float | None = None  # when the last call ended; None while one runs
        self.poll = 1.0
        self.thread: threading.Thread | None = None

    def enter(self, hard: float) -> None:
        now = time.monotonic()
        with self.lock:
            self.idle_since = None
            if self.expires < now + hard:
                slack = hard / 4
                # sys.__stderr__ is None only in an interpreter started without one (pythonw), never a test run's
                faulthandler.dump_traceback_later(hard + slack, exit=True, file=sys.__stderr__)  # type: ignore[arg-type]
                self.expires = now + hard + slack
                self.poll = min(1.0, slack / 2)
        if self.thread is None or not self.thread.is_alive():
            self.thread = threading.Thread(target=self._disarm_when_idle, name="msprobe-hard-deadline", daemon=True)
            self.thread.start()

    def leave(self) -> None:
        self.idle_since = time.monotonic()

    def disarm(self) -> None:
        """No call runs any more (the session ends)."""
        with self.lock:
            if self.expires:
                faulthandler.cancel_dump_traceback_later()
                self.expires = 0.0

    def _disarm_when_idle(self) -> None:
        while True:
            time.sleep(self.poll)
            with self.lock:
                idle_since = self.idle_since
                if self.expires and idle_since is not None and time.monotonic() - idle_since >= self.poll:
                    faulthandler.cancel_dump_traceback_later()
                    self.expires = 0.0


HARD_DEADLINE = HardDeadline()


_EXIT_QUICKLY: list[bool] = []


def exit_quickly() -> None:
    """When this process exits, its final garbage collections skip what it holds then.

    A process that imported torch spends 0.5-1 s in the interpreter's final collections
    (the whole of torch's object graph, traversed to find cycles that the exit frees
    anyway): every xdist worker's exit, which the controller waits for, and a run
    without xdist. An exit handler freezes the objects instead (gc.freeze, at exit only:
    a session run inside a longer-lived process changes nothing for it). Every other
    exit handler still runs and every module is still torn down; as in any Python
    process, an object left in a reference cycle at exit may go unfinalized."""
    if not _EXIT_QUICKLY:
        _EXIT_QUICKLY.append(True)
        atexit.register(gc.freeze)


def end_process() -> None:
    """End this process now, as multiprocessing ends its children: other (non-daemon)
    threads waited for, every exit handler run (coverage's, logging's, the user's),
    streams flushed, then os._exit, without the interpreter's teardown of its modules
    (0.1-0.3 s with torch loaded, more on a busy machine). Only for a process whose work
    is over: an xdist worker of its own process after its session (its results sent, its
    session unconfigured)."""
    join_threads()
    run_exit_handlers()
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        with contextlib.suppress(Exception):
            if stream is not None:
                stream.flush()
    os._exit(0)


def is_out_of_memory(exc: BaseException, backend: Backend) -> bool:
    """The device (or the host, for the CPU backend) ran out of memory, directly or as
    the cause the replay wrapped (replay.DeviceFailed)."""
    cause = getattr(exc, "cause", None)
    return backend.is_out_of_memory(exc) or (cause is not None and backend.is_out_of_memory(cause))


def out_of_memory_text(index: DumpIndex, name: CallName, exc: BaseException, device: str) -> str:
    """What failed, how big the call is, and what the user can do about it."""
    cause = getattr(exc, "cause", None) or exc
    failure = (str(cause).strip().splitlines() or [""])[0][:300]
    sizes = tensor_sizes(index, name)
    total = sum(size for _, size in sizes)
    largest = "; ".join(f"{where} {_size(size)}" for where, size in sizes[:4])
    return (
        f"{name}: out of memory on {device}: {type(cause).__name__}: {failure}\n"
        f"the call's tensors take {_size(total)} (largest: {largest or 'none recorded'}); the memory was released "
        "and the run went on. Run this call alone or on a device with more free memory (fewer workers per device: "
        "--msprobe-devices), or skip calls this large with a lower --msprobe-max-elements."
    )


def tensor_sizes(index: DumpIndex, name: CallName) -> list[tuple[str, int]]:
    """(`path dtype shape`, bytes) of every tensor the call's records name, largest
    first; a backward call's forward inputs included. Empty when the records cannot be
    read (the size is decoration of an error that already happened)."""
    from pytest_msprobe.dump.tensors import torch_dtype

    sizes: list[tuple[str, int]] = []
    for direction in dict.fromkeys((name.direction, "forward")):
        entry = index.entry(str(name.sibling(direction)))
        try:
            record = index.read_record(entry) if entry is not None else {}
        except Exception:  # noqa: BLE001 - see the docstring
            continue
        stack: list[tuple[str, Json]] = [(direction, record)]
        while stack:
            path, value = stack.pop()
            if isinstance(value, dict) and isinstance(value.get("shape"), list) and "dtype" in value:
                shape = [int(n) for n in value["shape"] if isinstance(n, int)]
                try:
                    itemsize = torch_dtype(value["dtype"]).itemsize
                except Exception:  # noqa: BLE001 - an unknown dtype counts one byte per element
                    itemsize = 1
                sizes.append((f"{path} {value['dtype']} {shape}", math.prod(shape) * itemsize))
            elif isinstance(value, dict):
                stack.extend((f"{path}.{key}", item) for key, item in value.items())
            elif isinstance(value, list):
                stack.extend((f"{path}[{i}]", item) for i, item in enumerate(value))
    return sorted(sizes, key=lambda pair: -pair[1])


def release_memory(backend: Backend) -> None:
    """After a failed call: drop what its frames held, then the device's cache."""
    gc.collect()
    backend.free()


def _size(size: int) -> str:
    if size < 1024:
        return f"{size} B"
    exponent = min(int(math.log(size, 1024)), 3)
    return f"{size / 1024**exponent:.1f} {('KiB', 'MiB', 'GiB')[exponent - 1]}"
