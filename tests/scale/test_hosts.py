"""Workers on several hosts: xdist's `--tx` workers (popen, socket, ssh) each
pin a device of their own host, by their rank among that host's workers; the results
are those of a run without xdist. Here every host is this machine: `--tx 2*popen`, and
`--tx socket=` to an execnet socket server started on the loopback address, made another
host with MSPROBE_HOST."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_msprobe.plugin import workers

DUMPS = Path(__file__).parents[1] / "dumps"

# Each worker writes the host and rank the controller gave it, and the device it took.
PLACEMENT = """
import json
from pathlib import Path


def pytest_collection_finish(session):
    config = session.config
    if hasattr(config, "workerinput"):
        from pytest_msprobe.plugin.state import session_state

        given = config.workerinput
        found = {"host": given.get("msprobe_host_name"), "rank": given.get("msprobe_host_rank"),
                 "device_index": session_state(config).device_index}
        Path(__file__).parent.joinpath(f"placed-{given['workerid']}.json").write_text(json.dumps(found))
"""


# --- the controller's record of hosts and ranks --------------------------------------


@dataclass
class FakeChannel:
    answer: Any

    def receive(self, timeout: float | None = None) -> Any:
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer

    def waitclose(self, timeout: float | None = None) -> None:
        """The remote function has sent its one answer: nothing to wait for."""


@dataclass
class FakeSpec:
    popen: bool = False  # a gateway to another machine: asked who it is
    ssh: str | None = "user@host"


@dataclass
class FakeGateway:
    id: str
    host: Any  # (key, name), or the exception its remote_exec raises
    spec: FakeSpec = field(default_factory=FakeSpec)

    def remote_exec(self, source: Any) -> FakeChannel:
        assert source is workers.host_identity
        return FakeChannel(self.host)


@dataclass
class FakeNode:
    gateway: FakeGateway
    workerinput: dict[str, Any] = field(default_factory=dict)


def _place(ranks: workers.HostRanks, worker: str, host: Any) -> int:
    node = FakeNode(FakeGateway(worker, host))
    ranks.place(node)
    return node.workerinput[workers.HOST_RANK]


def test_a_workers_rank_counts_the_workers_of_its_own_host() -> None:
    ranks = workers.HostRanks(expected=5)
    a, b = ("a/1", "a"), ("b/2", "b")
    assert [_place(ranks, f"gw{k}", host) for k, host in enumerate((a, b, a, b, a))] == [0, 0, 1, 1, 2]
    assert ranks.complete()
    assert ranks.by_host() == [("a", [("gw0", 0), ("gw2", 1), ("gw4", 2)]), ("b", [("gw1", 0), ("gw3", 1)])]
    assert [workers.device_of([0, 1], rank) for rank in (0, 1, 2)] == [0, 1, 0]  # within each host's own ids


def test_only_a_process_of_its_own_is_ended_early() -> None:
    """A socket server runs its workers in its own process, one after another."""
    ranks = workers.HostRanks(expected=3)
    nodes = [
        FakeNode(FakeGateway(f"gw{k}", ("a/1", "a"), FakeSpec(*spec)))
        for k, spec in enumerate([(True, None), (False, "user@gpu-b"), (False, None)])
    ]
    for node in nodes:
        ranks.place(node)
    assert [node.workerinput[workers.OWN_PROCESS] for node in nodes] == [True, True, False]


def test_a_popen_worker_runs_on_the_controllers_host() -> None:
    """Not asked (no round trip before the next worker starts): it is this machine."""
    ranks = workers.HostRanks(expected=1)
    node = FakeNode(FakeGateway("gw0", OSError("not to be asked"), FakeSpec(popen=True, ssh=None)))
    ranks.place(node)
    assert node.workerinput[workers.HOST_KEY] == workers.host_identity()[0]


def test_a_replaced_worker_takes_the_rank_it_replaces() -> None:
    ranks = workers.HostRanks(expected=2)
    host = ("a/1", "a")
    assert [_place(ranks, "gw0", host), _place(ranks, "gw1", host)] == [0, 1]
    ranks.release("gw0")  # it died; xdist starts gw2 in its place
    assert _place(ranks, "gw2", host) == 0
    assert _place(ranks, "gw3", ("b/2", "b")) == 0


def test_a_host_that_cannot_answer_counts_as_the_controllers() -> None:
    ranks = workers.HostRanks(expected=2)
    here = workers.host_identity()
    assert _place(ranks, "gw0", here) == 0
    assert _place(ranks, "gw1", OSError("no answer")) == 1
    assert ranks.unanswered == {"gw1": "OSError: no answer"}  # said on the layout line, not taken silently
    assert "gw1 (OSError: no answer)" in ranks.unanswered_note()


def test_a_new_workers_host_answers_over_its_gateway() -> None:
    """What the controller runs in each new worker's interpreter (execnet refuses a
    function that names a non-builtin global, even in an annotation)."""
    import execnet

    gateway = execnet.makegateway("popen")
    try:
        assert tuple(gateway.remote_exec(workers.host_identity).receive(timeout=60)) == workers.host_identity()
    finally:
        gateway.exit()


def test_a_hosts_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    key, name = workers.host_identity()
    assert name == socket.gethostname() and key.startswith(f"{name}/") and len(key) > len(name) + 1
    monkeypatch.setenv("MSPROBE_HOST", "rack3-node7")
    assert workers.host_identity() == ("rack3-node7", "rack3-node7")


# --- runs: --tx popen and --tx socket against -n 0 ------------------------------------


@pytest.fixture
def dump_folder(pytester: pytest.Pytester) -> Path:
    shutil.copytree(DUMPS / "torch_mlpcnn_tensor_fp32", pytester.path / "dump")
    pytester.makeconftest(PLACEMENT)
    return pytester.path


def _options(folder: Path, out: str) -> list[str]:
    """Every path absolute and every option one argument: a socket worker runs in the
    socket server's folder, and xdist rewrites a separate path argument of a non-popen
    worker relative to its rsync roots."""
    return [
        f"--msprobe-dump={folder / 'dump'}",
        "--msprobe-device=cpu",
        f"--msprobe-out={folder / out}",
        f"--rootdir={folder}",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:randomly",
    ]


def _placed(folder: Path) -> dict[str, dict[str, Any]]:
    return {path.stem.removeprefix("placed-"): json.loads(path.read_text()) for path in folder.glob("placed-*.json")}


def test_tx_popen_workers_give_the_results_of_n0(
    pytester: pytest.Pytester, dump_folder: Path, comparable_records
) -> None:
    serial = pytester.runpytest_subprocess(*_options(dump_folder, "out0"), timeout=300)
    parallel = pytester.runpytest_subprocess(
        *_options(dump_folder, "outtx"), "--tx", "2*popen", "--dist", "load", timeout=300
    )
    assert serial.ret == parallel.ret == pytest.ExitCode.OK, parallel.stdout.str()[-3000:]
    assert comparable_records(dump_folder / "out0") == comparable_records(dump_folder / "outtx")
    host = socket.gethostname()
    parallel.stdout.fnmatch_lines(
        [f"msprobe: 2 workers, dist=load; host {host}: gw0->cpu, gw1->cpu; 1 CPU thread(s) each"]
    )
    placed = _placed(dump_folder)
    assert {worker: (found["host"], found["rank"]) for worker, found in placed.items()} == {
        "gw0": (host, 0),
        "gw1": (host, 1),
    }


@pytest.fixture
def socket_server(pytester: pytest.Pytester) -> Iterator[subprocess.Popen]:
    """An execnet socket server on a free loopback port, as another host (MSPROBE_HOST);
    stopped after the test."""
    env = {**os.environ, "MSPROBE_HOST": "socket-host"}
    env.pop("PYTEST_XDIST_WORKER", None)
    server = subprocess.Popen(
        [sys.executable, "-u", "-m", "execnet.script.socketserver", "127.0.0.1:0"],
        cwd=pytester.path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        port = None
        deadline = time.monotonic() + 30
        while port is None and time.monotonic() < deadline and server.poll() is None:
            line = server.stdout.readline()  # "... Entering Accept loop ('127.0.0.1', PORT)"
            if "Accept loop" in line:
                port = int(line.rsplit(",", 1)[1].strip(" )\n"))
        if port is None:
            pytest.skip(f"the execnet socket server did not start (exit status {server.poll()})")
        server.port = port  # type: ignore[attr-defined]
        yield server
    finally:
        server.kill()
        server.wait(timeout=30)
        server.stdout.close()


def test_tx_socket_workers_give_the_results_of_n0(
    pytester: pytest.Pytester, dump_folder: Path, socket_server: subprocess.Popen, comparable_records
) -> None:
    serial = pytester.runpytest_subprocess(*_options(dump_folder, "out0"), timeout=300)
    parallel = pytester.runpytest_subprocess(
        *_options(dump_folder, "outtx"),
        "--tx",
        f"socket=127.0.0.1:{socket_server.port}",
        "--tx",
        "popen",
        "--dist",
        "load",
        timeout=300,
    )
    assert serial.ret == parallel.ret == pytest.ExitCode.OK, parallel.stdout.str()[-3000:]
    assert comparable_records(dump_folder / "out0") == comparable_records(dump_folder / "outtx")
    host = socket.gethostname()
    parallel.stdout.fnmatch_lines(
        [f"msprobe: 2 workers, dist=load; host socket-host: gw0->cpu; host {host}: gw1->cpu; 1 CPU thread(s) each"]
    )
    placed = _placed(dump_folder)
    # each the first worker of its host: rank 0, device 0 of its host
    assert placed == {
        "gw0": {"host": "socket-host", "rank": 0, "device_index": 0},
        "gw1": {"host": host, "rank": 0, "device_index": 0},
    }, placed
    assert socket_server.poll() is None  # the server, which ran its worker in its own process, serves on
