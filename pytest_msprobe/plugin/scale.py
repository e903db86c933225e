"""Hooks of the scale-out layer: thin, over workers, scheduling, dump.cache and
isolation. Registered by plugin/__init__.py only when a dump is given."""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING

import pytest

from pytest_msprobe.dump.cache import ensure_cached
from pytest_msprobe.plugin import options, scheduling, workers
from pytest_msprobe.plugin.pytest_privates import bestrelpath
from pytest_msprobe.plugin.state import session_state
from pytest_msprobe.run import isolation

if TYPE_CHECKING:
    from collections.abc import Sequence

    from xdist.workermanage import WorkerController


SHARD_DROPPED_KEY = pytest.StashKey[int]()
RANKS_KEY = pytest.StashKey[workers.HostRanks]()
# what a worker tells the controller when it finishes (config.workeroutput)
ENVIRONMENT_OUTPUT = "msprobe_environment"


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):
        workers.prefer_worksteal(config)
    if workers.is_controller(config):
        config.stash[RANKS_KEY] = workers.HostRanks()
    else:
        isolation.exit_quickly()


def pytest_report_header(config: pytest.Config) -> list[str]:
    """Where this process runs the calls itself; the xdist controller says where its
    workers run once it has placed them (pytest_configure_node)."""
    state = session_state(config)
    if not state.runs_calls or state.problem is not None:
        return []
    return [workers.layout(config, state.settings().backend)]


# --- the xdist controller: where each worker runs (workers.HostRanks) ------------


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_setupnodes(config: pytest.Config, specs: Sequence[object]) -> None:
    if RANKS_KEY in config.stash:
        config.stash[RANKS_KEY].expected = len(specs)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: WorkerController) -> None:
    """Before the worker's session starts: its host and its rank there, in its
    workerinput; once every worker is placed, the line that says where they run."""
    config = node.config
    ranks = config.stash.get(RANKS_KEY, None)
    if ranks is None:
        return
    ranks.place(node)
    if ranks.complete():
        ranks.shown = True
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(workers.host_layout(config, ranks))


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: WorkerController, error: object) -> None:
    """A worker finished (its environment, for the run's record) or died (its rank
    goes to the worker that replaces it)."""
    config = node.config
    ranks = config.stash.get(RANKS_KEY, None)
    if ranks is not None:
        ranks.release(node.gateway.id)
    reported = getattr(node, "workeroutput", {}).get(ENVIRONMENT_OUTPUT)
    state = session_state(config)
    if reported and (state.worker_environment is None or workers.number_of(node.gateway.id) == 0):
        state.worker_environment = reported


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """No call runs any more: the hard deadline is disarmed. A worker tells the
    controller what it ran on (the controller imports no torch), and a worker in a
    process of its own, which ends with its session, freezes its objects now
    (isolation.exit_quickly): pytest's collections at unconfigure would traverse torch's
    objects while the controller waits for the worker to exit."""
    isolation.HARD_DEADLINE.disarm()
    config = session.config
    state = session_state(config)
    if hasattr(config, "workeroutput") and state.problem is None and state.settings_built:
        from pytest_msprobe.judge.gate.baseline import environment

        found = environment((), state.device_label())
        config.workeroutput[ENVIRONMENT_OUTPUT] = {"device": found["device"], "versions": found["versions"]}
    if getattr(config, "workerinput", {}).get(workers.OWN_PROCESS):
        import gc

        gc.freeze()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_unconfigure(config: pytest.Config) -> Generator[None, None, None]:
    """An xdist worker in a process of its own ends it once every plugin is unconfigured,
    its results sent (isolation.end_process): the controller waits for each worker's exit."""
    result = yield
    workerinput = getattr(config, "workerinput", None)
    if workerinput and workerinput.get(workers.OWN_PROCESS):
        isolation.end_process()
    return result


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    """The xdist controller parses each dump once, before its workers start (xdist's
    own sessionstart, trylast), so that they collect from the index cache."""
    if session.config.pluginmanager.has_plugin("dsession"):
        chosen = options.of(session.config)
        for dump in chosen.dump:
            ensure_cached(dump, chosen.cache_folder)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """After every other selection: this shard's calls, then (in xdist workers) the
    order that keeps the devices busy."""
    from pytest_msprobe.plugin.items import CallItem

    calls = [item for item in items if isinstance(item, CallItem)]
    others = [item for item in items if not isinstance(item, CallItem)]
    shard = options.of(config).shard
    if shard is not None:
        part, total = shard
        mine = [scheduling.shard_of(str(item.call), total) == part for item in calls]
        dropped = [item for item, keep in zip(calls, mine, strict=True) if not keep]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            calls = [item for item, keep in zip(calls, mine, strict=True) if keep]
        config.stash[SHARD_DROPPED_KEY] = len(dropped)
    dist = getattr(config.option, "dist", "no")
    if workers.worker_number(config) is not None and dist == "worksteal":
        calls = scheduling.worksteal_blocks(calls, workers.worker_count(config))
    elif workers.worker_number(config) is not None and dist == "load":
        calls = scheduling.heavy_first(calls)
    items[:] = [*others, *calls]


# tryfirst: pytest prints these lines in the reverse order of the calls, so the shard's
# comes after the report plugin's.
@pytest.hookimpl(tryfirst=True)
def pytest_report_collectionfinish(config: pytest.Config) -> list[str]:
    shard = options.of(config).shard
    if shard is None:
        return []
    return [
        f"msprobe: shard {shard[0]}/{shard[1]}: deselected {config.stash.get(SHARD_DROPPED_KEY, 0)} calls of the other shards"
    ]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    """A call past its timeout, or out of memory outside the device run (decoding its
    inputs, the bench), errors with its own record; the run goes on."""
    from pytest_msprobe.judge.check import outcome
    from pytest_msprobe.judge.verdict.record import ResultRecord
    from pytest_msprobe.plugin.items import RESULT_KEY, CallItem

    if not isinstance(item, CallItem):
        return (yield)
    settings = session_state(item.config).settings()
    try:
        with isolation.deadline(options.of(item.config).timeout * item.timeout_factor):
            return (yield)
    except outcome.CallFailed:
        raise
    except isolation.CallTimeout as exc:
        device = settings.backend.describe(settings.device_index)
        message = f"{item.record_name}: {exc}; the call was stopped and the run went on"
    except Exception as exc:
        if not isolation.is_out_of_memory(exc, settings.backend):
            raise
        device = settings.backend.describe(settings.device_index)
        message = isolation.out_of_memory_text(item.index, item.call, exc, device)
    isolation.release_memory(settings.backend)
    item.stash[RESULT_KEY] = ResultRecord(
        dump=str(item.path),
        call=item.record_name,
        status="error",
        standard="",
        reference="",
        device=device,
        message=message,
    )
    raise outcome.CallFailed(message)


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem: str, report: pytest.TestReport, sched: object) -> None:
    """xdist reports a call whose worker died with when="???" and no record; give it
    the call's error record, so that the result files hold it like any other."""
    from pytest_msprobe.judge.check import outcome
    from pytest_msprobe.plugin.items import headline
    from pytest_msprobe.plugin.reports import attach_record

    config = report.node.config  # the crashed WorkerController
    state = session_state(config)
    relpath, _, call = crashitem.partition("::")
    dumps = {bestrelpath(config.rootpath, dump): dump for dump in state.options.dump}
    if relpath not in dumps:
        return
    worker = report.node.gateway.id
    device = state.worker_devices.get(worker) or _planned_device(config, worker)
    record = outcome.crash_record(str(dumps[relpath]), call, device, worker, options.of(config).timeout)
    report.when = "call"  # the call phase is where it died
    report.location = (relpath, None, headline(crashitem, call))  # as the item names itself
    report.longrepr = record.message
    report.user_properties.append(("msprobe_device", device))
    attach_record(report, record.to_dict(), serialized=False)


def _planned_device(config: pytest.Config, worker: str) -> str:
    """The device a worker that died before any result was to use, as the controller
    knows it (without torch): `cpu`, or the device kind and id."""
    chosen = options.of(config)
    request = chosen.device
    if request == "cpu":
        return "cpu"
    ranks = config.stash.get(RANKS_KEY, None)
    rank = ranks.ranks.get(worker) if ranks is not None else None
    ids = chosen.devices
    index = workers.device_of(ids, rank) if ids else (rank or 0)
    return f"{request if request in ('cuda', 'npu') else 'device'}:{index} (worker {worker})"
