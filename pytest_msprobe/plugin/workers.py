"""xdist workers and devices: which device a worker replays on, how many CPU threads
it may use, and which distribution mode a run gets when the user only said `-n`.

A worker's device is chosen before any tensor exists (SessionState.settings() asks
here first), from the ids of --msprobe-devices or every visible device, round robin
over the workers; its CPU thread count is the same in every process (replay_threads).
The ids are the backend's own indexes: they count within what the caller left visible
(CUDA_VISIBLE_DEVICES, ASCEND_RT_VISIBLE_DEVICES), so a worker can never reach a
device the caller excluded.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from pytest_msprobe.plugin import options


def worker_number(config: pytest.Config) -> int | None:
    """0 for gw0, 1 for gw1...; None in the controller or a run without xdist."""
    workerinput = getattr(config, "workerinput", None)
    return number_of(workerinput["workerid"]) if workerinput else None


def number_of(worker: str) -> int:
    """xdist's worker id -> its number: gw3 -> 3."""
    return int(worker.removeprefix("gw"))


def worker_count(config: pytest.Config) -> int:
    workerinput = getattr(config, "workerinput", None)
    return int(workerinput["workercount"]) if workerinput else 1


def device_ids(config: pytest.Config, backend: Any) -> list[int]:
    return parse_device_ids(options.get(config, "msprobe_devices"), backend)


def parse_device_ids(raw: str | None, backend: Any) -> list[int]:
    """The ids of --msprobe-devices, checked against the devices the backend sees;
    every visible device by default."""
    from pytest_msprobe.run.devices import ACCELERATORS

    count = backend.device_count()
    if not raw:
        return list(range(count))
    try:
        ids = [int(part) for part in str(raw).split(",") if part.strip()]
    except ValueError:
        raise pytest.UsageError(f"--msprobe-devices {raw!r}: expected device ids separated by commas, e.g. 0,1,2,3") from None
    accelerator = ACCELERATORS.get(backend.name)
    visible = os.environ.get(accelerator.visible_env) if accelerator else None
    for device in ids:
        if not 0 <= device < count:
            where = f" ({accelerator.visible_env}={visible!r}: ids count within that list)" if visible is not None else ""
            raise pytest.UsageError(f"--msprobe-devices {raw!r}: there is no {backend.name} device {device}; "
                                    f"{count} {'is' if count == 1 else 'are'} visible, numbered 0..{count - 1}{where}")
    if not ids:
        raise pytest.UsageError(f"--msprobe-devices {raw!r}: name at least one device id")
    return ids


def device_of(ids: list[int], number: int | None) -> int:
    """Round robin: worker k replays on the k-th id (modulo their number)."""
    return ids[(number or 0) % len(ids)]


def place_worker(config: pytest.Config, backend: Any) -> int:
    """This process's device index, and its torch and BLAS threads, set before torch
    starts its pools (see replay_threads)."""
    import torch

    ids = device_ids(config, backend)
    threads = replay_threads(backend.name == "cpu", len(ids))
    previous_torch, previous_blas = torch.get_num_threads(), set_blas_threads(threads)
    torch.set_num_threads(threads)
    # The counts are the process's, not the session's: a session run inside another
    # (pytester, an IDE) gives them back when it ends, even if its configure failed.
    config.add_cleanup(lambda: torch.set_num_threads(previous_torch))
    if previous_blas is not None:
        config.add_cleanup(lambda: set_blas_threads(previous_blas))
    return device_of(ids, worker_number(config))


def replay_threads(cpu_only: bool, devices: int) -> int:
    """torch's (and BLAS's) thread count in every process of a run, with or without
    xdist, whatever -n.

    CPU kernels' results depend on the thread count (a reduction split over 2 threads
    rounds differently from one over 1), and every run computes on the CPU: the bench,
    and, on an accelerator or offline, the reference in the device dtype whose errors
    the standards' ratios are taken against. A count that followed -n (the cores' share
    of each xdist worker, all cores without xdist) made offline verdicts depend on -n.
    Where the CPU is all there is (it is the device, or the run is offline there) the
    count is one: the -n workers are the parallelism, one thread is also the faster
    choice for a dump's mostly small tensors, and results then depend on no machine's
    core count either. On an accelerator it is the cores' share of one device of those
    in use, so that a worker per device does not oversubscribe the cores."""
    return 1 if cpu_only else thread_share(devices)


# (get, set) C functions of a BLAS library's thread count (what threadpoolctl calls).
BLAS_THREAD_FUNCTIONS = (("openblas_get_num_threads64_", "openblas_set_num_threads64_"),
                         ("openblas_get_num_threads", "openblas_set_num_threads"),
                         ("MKL_Get_Max_Threads", "MKL_Set_Num_Threads"))


def set_blas_threads(threads: int) -> int | None:
    """Set numpy's BLAS (the standards' dot products) to `threads`; returns its previous
    count (None where no BLAS library could be told).

    BLAS starts a thread per core in every process, whatever torch was told: -n
    workers would oversubscribe the cores, and a dot product split over 2 threads
    rounds differently from one over 1. The count is set through the library's own C
    functions, found among the libraries this process loaded (Linux only)."""
    import ctypes

    import numpy  # noqa: F401 - loads the BLAS library to be found

    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            libraries = {line.split()[-1] for line in maps if "blas" in line.lower() or "mkl_rt" in line.lower()}
    except OSError:
        return None
    previous = None
    for library in sorted(libraries):
        try:
            loaded = ctypes.CDLL(library)
        except OSError:
            continue
        for getter, setter in BLAS_THREAD_FUNCTIONS:
            if hasattr(loaded, getter) and hasattr(loaded, setter):
                previous = getattr(loaded, getter)()
                getattr(loaded, setter)(threads)
                break
    return previous


def thread_share(shares: int) -> int:
    """This machine's cores (those this process may use) split into `shares` equal
    shares, at least one core each."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // shares)


def prefer_worksteal(config: pytest.Config) -> None:
    """`-n` alone means xdist's `load`; dump calls differ in cost by orders of
    magnitude, so a run without an explicit --dist steals work instead. Called before
    xdist makes its scheduler (at session start)."""
    given = config.known_args_namespace
    if getattr(config.option, "numprocesses", None) and getattr(given, "dist", None) == "no" and not getattr(given, "distload", False):
        config.option.dist = "worksteal"


def layout(config: pytest.Config, backend: Any) -> str:
    """The report header's line: which worker replays on which device."""
    workers = int(getattr(config.option, "numprocesses", 0) or 0)
    ids = device_ids(config, backend)
    if not workers:
        return f"msprobe: replaying on {backend.describe(ids[0])}"
    pairs = ", ".join(f"gw{k}->{backend.describe(device_of(ids, k))}" for k in range(min(workers, 8)))
    more = ", ..." if workers > 8 else ""
    threads = f"; {replay_threads(backend.name == 'cpu', len(ids))} CPU thread(s) each"
    return f"msprobe: {workers} workers, dist={config.option.dist}: {pairs}{more}{threads}"
