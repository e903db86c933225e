"""What one pytest session of the plugin holds: its settings and the dump indexes."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_msprobe.plugin import options

if TYPE_CHECKING:  # the index (numpy) is imported only when a dump is collected
    from pytest_msprobe.dump.index import DumpIndex


@dataclass
class SessionState:
    config: pytest.Config
    dumps: list[Path]
    strict: bool
    indexes: dict[Path, DumpIndex] = field(default_factory=dict)
    module_entries: int = 0
    unparsed_names: list[str] = field(default_factory=list)
    device_index: int = 0
    _settings: Any = None

    def settings(self) -> Any:
        """Built once per process; a problem with the device or an option's file is a
        usage error that tells the user what to fix."""
        if self._settings is None:
            from pytest_msprobe.judge.call import Settings

            _register_bench_functions(self.config)
            backend, self.device_index = _backend(self.config)
            self._settings = Settings(
                backend=backend,
                device_index=self.device_index,
                max_elements=options.max_elements(self.config),
                registry=_registry(self.config),
                device_request=options.get(self.config, "msprobe_device"),
                offline=bool(options.get(self.config, "msprobe_offline")),
                baseline=_recorded_metrics(self.config, self.dumps),
                sample_statuses=options.sample_statuses(self.config),
                repeat=options.repeat(self.config),
            )
        return self._settings


def _backend(config: pytest.Config) -> tuple[Any, int]:
    """The backend, with this process's device (its xdist worker's share) selected."""
    from pytest_msprobe.plugin.workers import place_worker
    from pytest_msprobe.run.devices import DeviceUnavailable, backend

    try:
        chosen = backend(options.get(config, "msprobe_device"))
        device_index = place_worker(config, chosen)
        chosen.select(device_index)
    except DeviceUnavailable as exc:
        raise pytest.UsageError(f"--msprobe-device: {exc}") from None
    return chosen, device_index


def _registry(config: pytest.Config) -> Any:
    """The shipped standards tables, the user's file over them, then conftest hooks;
    checked before any call is judged (judge.routing)."""
    from pytest_msprobe.judge.routing import routing_problems
    from pytest_msprobe.standards import Registry

    registry = Registry.default()
    standards_file = options.path(config, "msprobe_standards")
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
    """Conftest hooks add references for custom operators before any call resolves."""
    from pytest_msprobe import bench_functions

    config.hook.pytest_msprobe_register_bench_functions(registry=bench_functions.default_registry)


def _recorded_metrics(config: pytest.Config, dumps: list[Path]) -> Any:
    """A baseline folder and/or an msprobe details CSV: metrics to judge against. The
    baseline's dumps are matched with this run's by identity; the controller warns
    about a dump the baseline does not know (judge.baseline.DumpMatch)."""
    from _pytest.pathlib import bestrelpath

    from pytest_msprobe.judge.baseline import Baseline, BaselineError, read_msprobe_details

    folder, imported = options.path(config, "msprobe_baseline"), options.path(config, "msprobe_reference_csv")
    if not folder and not imported:
        return None
    updating = bool(options.get(config, "msprobe_baseline_update"))
    try:
        recorded = Baseline.read(folder) if folder and folder.exists() else Baseline()
        if folder and not folder.exists() and not updating:
            raise BaselineError(f"{folder}: no baseline there; record one with --msprobe-baseline-save "
                                "or create it with --msprobe-baseline-update")
        if imported:
            recorded.calls.update(read_msprobe_details(imported).calls)  # keyed (None, call): after the baseline's own
    except BaselineError as exc:
        raise pytest.UsageError(str(exc)) from None
    if folder and folder.exists():
        matches = recorded.match_dumps([(bestrelpath(config.rootpath, dump), dump) for dump in dumps])
        if not hasattr(config, "workerinput"):
            for match in matches:
                note = match.note(f"--msprobe-baseline {folder}")
                if note and not (updating and match.recorded_as is None):  # updating adds the dumps it lacks
                    config.issue_config_time_warning(pytest.PytestWarning(note), stacklevel=2)
    return recorded


STATE_KEY = pytest.StashKey[SessionState]()


def session_state(config: pytest.Config) -> SessionState:
    return config.stash[STATE_KEY]
