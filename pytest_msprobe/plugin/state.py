"""What one pytest session of the plugin holds: its settings and the dump indexes.

Two kinds of process hold one. The xdist controller runs no call: it checks what it
can tell without torch (options, the baseline, a user's standards routes) and never
imports torch, so that a run with -n starts its workers at once. Every process that
runs calls (an xdist worker, or the lone process of a run without xdist) builds the
full Settings, the device included, once, before collection. A worker that cannot use
its device does not raise (every worker would print its own traceback): it keeps the
reason, and its collection fails with it (SessionState.problem), which xdist shows once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pytest_msprobe.dump.index import Record
    from pytest_msprobe.judge.check.call import Settings
    from pytest_msprobe.judge.gate.baseline import Baseline
    from pytest_msprobe.judge.gate.upgrade import Change, Counterparts
    from pytest_msprobe.judge.verdict.record import ResultRecord
    from pytest_msprobe.plugin.options import Options
    from pytest_msprobe.run.devices import Backend
    from pytest_msprobe.standards import Registry

if TYPE_CHECKING:  # the index (numpy) is imported only when a dump is collected
    from pytest_msprobe.dump.index import DumpIndex

_UNREAD = object()


@dataclass
class SessionState:
    config: pytest.Config
    options: Options  # read once at configure (plugin/options.py)
    indexes: dict[Path, DumpIndex] = field(default_factory=dict)
    module_entries: int = 0
    unparsed_names: list[str] = field(default_factory=list)
    device_index: int = 0
    # why this worker cannot run calls (its device): its collection fails with it
    problem: str | None = None
    # the session's tests are all dump calls (None: not known yet); see plugin.pytest_sessionfinish
    only_dump_calls: bool | None = None
    # the xdist controller: each worker's device label and environment, as reported
    worker_devices: dict[str, str] = field(default_factory=dict)
    worker_environment: Record | None = None
    _settings: Settings | None = None
    _counterparts: Counterparts | None = None
    _baseline: Any = _UNREAD  # Any: a Baseline, None, or _UNREAD until read (see baseline)

    @property
    def runs_calls(self) -> bool:
        """False in the xdist controller, which hands calls to its workers."""
        from pytest_msprobe.plugin.workers import is_controller

        return not is_controller(self.config)

    @property
    # Any: a Baseline or None, whose str-typed dump keys plugin/baselines.py calls with the
    # None key of calls outside any dump
    def baseline(self) -> Any:
        """The recorded metrics to judge against (judge.baseline.Baseline), or None;
        read once per process."""
        if self._baseline is _UNREAD:
            self._baseline = _recorded_metrics(self.config, self.options)
        return self._baseline

    def counterparts(self) -> Counterparts | None:
        """The baseline's record of each call (judge/gate/upgrade.py), None without a baseline;
        one per process, each dump paired once."""
        if self._counterparts is None and self.baseline is not None:
            from pytest_msprobe.judge.gate.upgrade import Counterparts

            self._counterparts = Counterparts(self.baseline)
        return self._counterparts

    def gate_change(self, index: DumpIndex, record: ResultRecord) -> Change | None:
        """Under --msprobe-gate, the call's change against its record in the baseline;
        None without the gate or where it has no record (new, a dump of another model)."""
        counterparts = self.counterparts() if self.options.gate else None
        if counterparts is None or record.status == "skip":
            return None
        from pytest_msprobe.judge.gate.baseline import CallMetrics

        return counterparts.change(index.key, lambda: index, record.call, CallMetrics.of(record))

    def check(self) -> None:
        """At configure, after the options were read (and checked): what they name. The
        device's name, the baseline; where calls run, the device too (Settings); an xdist
        worker keeps a device problem as `problem` instead of raising (see the module's
        docstring)."""
        from pytest_msprobe.run.devices import DeviceUnavailable, check_name

        try:
            check_name(self.options.device)
        except DeviceUnavailable as exc:
            raise pytest.UsageError(f"--msprobe-device: {exc}") from None
        self.baseline  # noqa: B018 - a baseline that cannot be read is a usage error here
        if self.options.gate and self.baseline is None:
            raise pytest.UsageError(
                "--msprobe-gate needs --msprobe-baseline=DIR, the baseline recorded before the upgrade"
            )
        if not self.runs_calls:
            if _custom_routes(self.config, self.options):  # the shipped tables are checked by the project's tests
                _registry(self.config, self.options)
            return
        try:
            self.settings()
        except pytest.UsageError as exc:
            if not hasattr(self.config, "workerinput"):
                raise
            self.problem = str(exc)

    @property
    def settings_built(self) -> bool:
        """This process built its Settings: it ran calls, on a device it could use."""
        return self._settings is not None

    def settings(self) -> Settings:
        """Built once per process that runs calls; a problem with the device or an
        option's file is a usage error that tells the user what to fix."""
        if self._settings is None:
            from pytest_msprobe.judge.check.call import Settings
            from pytest_msprobe.judge.findings.overflow_modes import stated_mode

            _register_bench_functions(self.config)
            backend, self.device_index = _backend(self.config, self.options.device)
            self._settings = Settings(
                backend=backend,
                device_index=self.device_index,
                max_elements=self.options.max_elements,
                registry=_registry(self.config, self.options),
                device_request=self.options.device,
                offline=self.options.offline,
                baseline=self.baseline,
                sample_statuses=self.options.sample_statuses,
                repeat=self.options.repeat,
                detail=min(max(self.config.get_verbosity(), 0), 2),  # -v, -vv: Verdict.message's detail
                overflow_mode=stated_mode(self.options.overflow_mode, backend.name, self.options.offline),
            )
        return self._settings

    def device_label(self) -> str:
        """What the run's environment names as its device (device 0 of the backend):
        this process's where it runs calls; in the xdist controller, what a worker
        reported (the device asked for when none did)."""
        if self.runs_calls:
            return self.settings().backend.describe(0)
        if self.worker_environment is not None:
            return str(self.worker_environment.get("device", ""))
        return self.options.device

    def environment_versions(self) -> dict[str, str] | None:
        """The versions a worker ran with (the controller imports no torch to ask);
        None where this process ran the calls itself."""
        if self.runs_calls or self.worker_environment is None:
            return None
        return dict(self.worker_environment.get("versions", {}))


def _backend(config: pytest.Config, device: str) -> tuple[Backend, int]:
    """The backend, with this process's device (its xdist worker's share) selected."""
    from pytest_msprobe.plugin.workers import place_worker
    from pytest_msprobe.run.devices import DeviceUnavailable, backend

    try:
        chosen = backend(device)
        device_index = place_worker(config, chosen)
        chosen.select(device_index)
    except DeviceUnavailable as exc:
        raise pytest.UsageError(f"--msprobe-device: {exc}") from None
    return chosen, device_index


def _custom_routes(config: pytest.Config, chosen: Options) -> bool:
    """A --msprobe-standards file or a conftest's pytest_msprobe_register_standards."""
    return chosen.standards is not None or bool(config.hook.pytest_msprobe_register_standards.get_hookimpls())


def _registry(config: pytest.Config, chosen: Options) -> Registry:
    """The shipped standards tables, the user's file over them, then conftest hooks;
    checked before any call is judged (judge.routing)."""
    from pytest_msprobe.judge.check.routing import routing_problems
    from pytest_msprobe.standards import Registry

    registry = Registry.default()
    standards_file = chosen.standards
    if standards_file:
        try:
            registry.load_file(standards_file)
        except (OSError, ValueError, KeyError) as exc:
            raise pytest.UsageError(f"--msprobe-standards {standards_file}: {exc}") from None
    config.hook.pytest_msprobe_register_standards(registry=registry)
    problems = routing_problems(registry)
    if problems:
        source = f"--msprobe-standards {standards_file}" if standards_file else "pytest_msprobe_register_standards"
        raise pytest.UsageError(f"{source}: the standards cannot judge as routed:\n  " + "\n  ".join(problems))
    return registry


def _register_bench_functions(config: pytest.Config) -> None:
    """Conftest hooks add references for custom operators before any call resolves.
    Without such a hook the references (NPU.* calls only) load when a call needs them."""
    hook = config.hook.pytest_msprobe_register_bench_functions
    if not hook.get_hookimpls():
        return
    from pytest_msprobe import bench_functions

    hook(registry=bench_functions.default_registry)


def _recorded_metrics(config: pytest.Config, chosen: Options) -> Baseline | None:
    """A baseline folder and/or an msprobe details CSV: metrics to judge against. The
    baseline's dumps are matched with this run's by identity; the controller warns
    about a dump the baseline does not know (judge.baseline.DumpMatch)."""
    folder, imported = chosen.baseline, chosen.reference_csv
    if not folder and not imported:
        return None
    from pytest_msprobe.judge.gate.baseline import Baseline, BaselineError, read_msprobe_details
    from pytest_msprobe.plugin.pytest_privates import bestrelpath

    updating = chosen.baseline_update
    try:
        recorded = Baseline.read(folder) if folder and folder.exists() else Baseline()
        if folder and not folder.exists() and not updating:
            raise BaselineError(
                f"{folder}: no baseline there; record one with --msprobe-baseline-save or create it with --msprobe-baseline-update"
            )
        if imported:
            recorded.calls.update(read_msprobe_details(imported).calls)  # keyed (None, call): after the baseline's own
    except BaselineError as exc:
        raise pytest.UsageError(str(exc)) from None
    if folder and folder.exists():
        matches = recorded.match_dumps([(bestrelpath(config.rootpath, dump), dump) for dump in chosen.dump])
        if not hasattr(config, "workerinput"):
            for match in matches:
                note = match.note(f"--msprobe-baseline {folder}")
                if note and not (updating and match.recorded_as is None):  # updating adds the dumps it lacks
                    config.issue_config_time_warning(pytest.PytestWarning(note), stacklevel=2)
    return recorded


STATE_KEY = pytest.StashKey[SessionState]()


def session_state(config: pytest.Config) -> SessionState:
    return config.stash[STATE_KEY]
