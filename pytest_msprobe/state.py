"""What one pytest session of the plugin holds: its settings and the dump indexes."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_msprobe import options
from pytest_msprobe.dump import DumpIndex


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
        """Built once per process; a problem with the device or the standards file
        is a usage error that tells the user what to fix."""
        if self._settings is None:
            from pytest_msprobe.call import Settings
            from pytest_msprobe.devices import DeviceUnavailable, backend
            from pytest_msprobe.standards import Registry

            registry = Registry.default()
            standards_file = options.get(self.config, "msprobe_standards")
            if standards_file:
                try:
                    registry.load_file(Path(standards_file))
                except (OSError, ValueError, KeyError) as exc:
                    raise pytest.UsageError(f"--msprobe-standards {standards_file}: {exc}") from None
            self.config.hook.pytest_msprobe_register_standards(registry=registry)
            try:
                chosen = backend(options.get(self.config, "msprobe_device"))
                chosen.select(self.device_index)
            except DeviceUnavailable as exc:
                raise pytest.UsageError(f"--msprobe-device: {exc}") from None
            self._settings = Settings(chosen, self.device_index, options.max_elements(self.config), registry)
        return self._settings


STATE_KEY = pytest.StashKey[SessionState]()


def session_state(config: pytest.Config) -> SessionState:
    return config.stash[STATE_KEY]
