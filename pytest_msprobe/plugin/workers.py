"""xdist workers and devices: which device a worker replays on, how many CPU threads
it may use, and which distribution mode a run gets when the user only said `-n`.

A worker's device is its rank among the workers of its own host, within that host's
ids (--msprobe-devices, or every device it sees), round robin: workers may run on
several hosts (xdist's `--tx ssh=.../socket=.../popen`), and each host numbers its own
devices. The controller asks each new worker's host who it is (host_identity, over
the worker's gateway, before the worker's session starts: no torch, milliseconds),
gives it the lowest rank no live worker of that host holds (a replaced worker takes
the rank of the one it replaces) and passes host and rank in its workerinput
(HostRanks). The worker picks its device before any tensor exists
(SessionState.settings() asks here first); its CPU thread count is the same in every
process (replay_threads). The ids are the backend's own indexes: they count within
what the caller left visible (CUDA_VISIBLE_DEVICES, ASCEND_RT_VISIBLE_DEVICES), so a
worker can never reach a device the caller excluded.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pytest

from pytest_msprobe.plugin import options

if TYPE_CHECKING:
    from collections.abc import Sequence

    from xdist.workermanage import WorkerController

    from pytest_msprobe.run.devices import Backend

# workerinput keys the controller sets for each worker (HostRanks.place)
HOST_KEY, HOST_NAME, HOST_RANK = "msprobe_host", "msprobe_host_name", "msprobe_host_rank"
# ... and whether the worker's process is its own (a popen or ssh gateway's interpreter,
# which ends with the worker; a socket server runs one worker after another in its own)
OWN_PROCESS = "msprobe_own_process"


def is_controller(config: pytest.Config) -> bool:
    """This process is xdist's controller: it hands the calls to workers and runs none.
    (`--collect-only` with -n collects in the controller itself.)"""
    if hasattr(config, "workerinput") or config.option.collectonly:
        return False
    return getattr(config.option, "dist", "no") != "no" and config.pluginmanager.has_plugin("xdist")


def worker_number(config: pytest.Config) -> int | None:
    """0 for gw0, 1 for gw1...; None in the controller or a run without xdist."""
    workerinput = getattr(config, "workerinput", None)
    return number_of(workerinput["workerid"]) if workerinput else None


def number_of(worker: str) -> int:
    """xdist's worker id -> its number: gw3 -> 3 (0 for an id a --tx spec named)."""
    digits = worker.removeprefix("gw")
    return int(digits) if digits.isdigit() else 0


def worker_count(config: pytest.Config) -> int:
    workerinput = getattr(config, "workerinput", None)
    return int(workerinput["workercount"]) if workerinput else 1


def device_ids(config: pytest.Config, backend: Backend) -> list[int]:
    return parse_device_ids(options.of(config).devices, backend)


def parse_device_ids(ids: Sequence[int] | None, backend: Backend) -> list[int]:
    """The ids of --msprobe-devices (options.device_list), checked against the devices
    the backend sees; every visible device by default."""
    from pytest_msprobe.run.devices import ACCELERATORS

    count = backend.device_count()
    if ids is None:
        return list(range(count))
    accelerator = ACCELERATORS.get(backend.name)
    visible_env = accelerator.visible_env if accelerator else None
    visible = os.environ.get(visible_env) if visible_env else None
    for device in ids:
        if not 0 <= device < count:
            where = f" ({visible_env}={visible!r}: ids count within that list)" if visible is not None else ""
            raise pytest.UsageError(
                f"--msprobe-devices {','.join(map(str, ids))!r}: there is no {backend.name} device {device}; "
                f"{count} {'is' if count == 1 else 'are'} visible, numbered 0..{count - 1}{where}"
            )
    return list(ids)


def device_of(ids: Sequence[int], rank: int | None) -> int:
    """Round robin: the worker of rank k on its host replays on the k-th id (modulo
    their number)."""
    return ids[(rank or 0) % len(ids)]


def worker_rank(config: pytest.Config) -> int | None:
    """This worker's rank among the workers of its host (HostRanks); without the
    controller's word (a controller without this plugin's hooks) its xdist number.
    None in a run without xdist."""
    workerinput = getattr(config, "workerinput", None)
    if not workerinput:
        return None
    rank = workerinput.get(HOST_RANK)
    return int(rank) if rank is not None else number_of(workerinput["workerid"])


def host_identity(channel: object = None) -> tuple[str, str]:
    """(key, name) of the machine this runs on: its host name, and its boot id (else
    machine id, else MAC address) so that two machines of one name stay two.
    MSPROBE_HOST, where set, is both: machines (or containers) that share devices can
    say they are one host, and ones whose names and ids collide that they are two.

    execnet runs this function in each new worker's interpreter (HostRanks), so it is
    self-contained: it imports what it needs, names no global but builtins (not even in
    its annotations) and sends its answer on `channel`."""
    import os
    import socket
    import uuid

    given = os.environ.get("MSPROBE_HOST", "").strip()
    if given:
        found = (given, given)
    else:
        name, machine = socket.gethostname(), ""
        for path in ("/proc/sys/kernel/random/boot_id", "/etc/machine-id", "/var/lib/dbus/machine-id"):
            try:
                with open(path, encoding="ascii") as handle:
                    machine = handle.read().strip()
            except (OSError, UnicodeDecodeError):
                continue
            if machine:
                break
        found = (f"{name}/{machine or format(uuid.getnode(), '012x')}", name)
    if channel is not None:
        channel.send(found)  # type: ignore[attr-defined]  # an execnet channel
    return found


@dataclass
class HostRanks:
    """The controller's record of which host each worker runs on and its rank there."""

    expected: int = 0  # workers xdist is setting up (pytest_xdist_setupnodes)
    hosts: dict[str, tuple[str, str]] = field(default_factory=dict)  # worker id -> (host key, name)
    ranks: dict[str, int] = field(default_factory=dict)  # worker id -> its rank on its host
    down: set[str] = field(default_factory=set)  # workers that finished or died
    unanswered: dict[str, str] = field(default_factory=dict)  # worker id -> why its host could not say who it is
    shown: bool = False

    def place(self, node: WorkerController) -> None:
        """Ask the new worker's host who it is (a popen worker's is the controller's own)
        and give the worker the lowest rank free on that host, in its workerinput. A
        gateway that cannot answer is taken to run on the controller's host (one machine
        is the common case), and the line that says where workers run names it and why
        (`unanswered`)."""
        worker, spec = node.gateway.id, node.gateway.spec
        key, name = host_identity()
        if not getattr(spec, "popen", False):
            try:
                channel = node.gateway.remote_exec(host_identity)
                key, name = channel.receive(timeout=60)
                channel.waitclose(timeout=60)
            except Exception as exc:  # noqa: BLE001 - an exotic gateway: the worker is taken to run here, said so
                self.unanswered[worker] = f"{type(exc).__name__}: {exc}"
        taken = {rank for other, rank in self.ranks.items() if self.hosts[other][0] == key and other not in self.down}
        rank = next(candidate for candidate in range(len(taken) + 1) if candidate not in taken)
        self.hosts[worker], self.ranks[worker] = (key, name), rank
        own = bool(getattr(spec, "popen", False) or getattr(spec, "ssh", None))
        node.workerinput.update({HOST_KEY: key, HOST_NAME: name, HOST_RANK: rank, OWN_PROCESS: own})

    def unanswered_note(self) -> str:
        """What the layout line adds for workers whose host could not say who it is."""
        if not self.unanswered:
            return ""
        named = ", ".join(f"{worker} ({why})" for worker, why in self.unanswered.items())
        return f"; taken to run on this host, their host not asked: {named}"

    def release(self, worker: str) -> None:
        """A worker went down: a replacement on its host takes its rank."""
        self.down.add(worker)

    def complete(self) -> bool:
        """Every worker xdist set up has been placed (the first time only)."""
        return not self.shown and len(self.hosts) >= self.expected > 0

    def by_host(self) -> list[tuple[str, list[tuple[str, int]]]]:
        """(host name, [(worker, rank), ...]) in the order the hosts first appeared."""
        grouped: dict[tuple[str, str], list[tuple[str, int]]] = {}
        live = [(worker, rank) for worker, rank in self.ranks.items() if worker not in self.down]
        for worker, rank in sorted(live, key=lambda pair: (number_of(pair[0]), pair[0])):
            grouped.setdefault(self.hosts[worker], []).append((worker, rank))
        return [(name, workers) for (_, name), workers in grouped.items()]


def place_worker(config: pytest.Config, backend: Backend) -> int:
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

        def restore_blas_threads() -> None:
            set_blas_threads(previous_blas)

        config.add_cleanup(restore_blas_threads)
    return device_of(ids, worker_rank(config))


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
BLAS_THREAD_FUNCTIONS = (
    ("openblas_get_num_threads64_", "openblas_set_num_threads64_"),
    ("openblas_get_num_threads", "openblas_set_num_threads"),
    ("MKL_Get_Max_Threads", "MKL_Set_Num_Threads"),
)


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
    if (
        getattr(config.option, "numprocesses", None)
        and getattr(given, "dist", None) == "no"
        and not getattr(given, "distload", False)
    ):
        config.option.dist = "worksteal"


SHOWN_PER_HOST = 8


def layout(config: pytest.Config, backend: Backend) -> str:
    """The report header's line where this process knows the backend (a run without
    xdist, or `--collect-only` with -n): which worker would replay on which device, all
    on this host."""
    workers = int(getattr(config.option, "numprocesses", 0) or 0)
    ids = device_ids(config, backend)
    if not workers:
        return f"msprobe: replaying on {backend.describe(ids[0])}"
    placed = [(f"gw{k}", backend.describe(device_of(ids, k))) for k in range(workers)]
    threads = f"{replay_threads(backend.name == 'cpu', len(ids))} CPU thread(s) each"
    return _line(workers, config.option.dist, [(host_identity()[1], placed)], threads)


def host_layout(config: pytest.Config, ranks: HostRanks) -> str:
    """The controller's line once its workers are placed: per host, which worker
    replays on which of that host's devices (the controller imports no torch: a device
    is named by the id it gets, `#k` where the host's own count decides)."""
    chosen = options.of(config)
    request, ids = chosen.device, chosen.devices
    kind = request if request in ("cuda", "npu") else "device"

    def device(rank: int) -> str:
        if request == "cpu":
            return "cpu"
        return f"{kind}:{device_of(ids, rank)}" if ids else f"{kind} #{rank}"

    hosts = [(name, [(worker, device(rank)) for worker, rank in placed]) for name, placed in ranks.by_host()]
    if request == "cpu":
        threads = "1 CPU thread(s) each"
    else:
        threads = (
            "#k: the k-th device its host sees; " if not ids else ""
        ) + "CPU threads: a host's cores over its devices in use"
    return _line(sum(len(placed) for _, placed in hosts), config.option.dist, hosts, threads) + ranks.unanswered_note()


def _line(workers: int, dist: str, hosts: list[tuple[str, list[tuple[str, str]]]], threads: str) -> str:
    parts = []
    for name, placed in hosts:
        pairs = ", ".join(f"{worker}->{device}" for worker, device in placed[:SHOWN_PER_HOST])
        parts.append(f"host {name}: {pairs}{', ...' if len(placed) > SHOWN_PER_HOST else ''}")
    return f"msprobe: {workers} workers, dist={dist}; {'; '.join(parts)}; {threads}"
