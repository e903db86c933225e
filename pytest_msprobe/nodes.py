"""The pytest nodes: a dump.json is a File, each dumped call an Item."""

from __future__ import annotations

import warnings
from typing import Any, Iterator

import pytest

from pytest_msprobe.dump import CallName, DumpIndex, read_index
from pytest_msprobe.errors import CallError, CallSkip, DumpError
from pytest_msprobe.outcome import AccuracyWarning, CallFailed, failure_text, properties
from pytest_msprobe.state import session_state


class DumpFile(pytest.File):
    """One dump.json: read once into an index of call names, records left on disk."""

    def collect(self) -> Iterator["CallItem"]:
        try:
            index = read_index(self.path)
        except DumpError as exc:
            raise self.CollectError(str(exc)) from None
        state = session_state(self.config)
        state.indexes[self.path] = index
        state.module_entries += index.modules
        state.unparsed_names.extend(index.skipped_names)
        for entry in index.entries:
            yield CallItem.from_parent(self, name=str(entry.name), call=entry.name)


class CallItem(pytest.Item):
    def __init__(self, *, call: CallName, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.call = call
        self.add_marker(call.direction)
        self.add_marker("api_" + call.api_type.lower())

    @property
    def index(self) -> DumpIndex:
        return session_state(self.config).indexes[self.path]

    def runtest(self) -> None:
        from pytest_msprobe.call import check_call
        from pytest_msprobe.replay import DeviceFailed

        state = session_state(self.config)
        try:
            result = check_call(self.index, self.call, state.settings())
        except CallSkip as exc:
            self.user_properties.append(("msprobe_status", "skip"))
            pytest.skip(str(exc))
        except CallError as exc:
            self.user_properties.append(("msprobe_status", "error"))
            raise CallFailed(f"{self.call}: bad input: {exc}") from None
        except DeviceFailed as exc:
            self.user_properties.append(("msprobe_status", "error"))
            raise CallFailed(f"{self.call}: {exc}") from None
        self.user_properties.extend(properties(result))
        status = result.verdict.status
        if status == "skip":
            pytest.skip(f"{self.call}: " + "; ".join(result.verdict.reasons))
        if status == "error" or (status == "warning" and state.strict):
            raise CallFailed(failure_text(result, strict=status == "warning"))
        if status == "warning":
            warnings.warn(AccuracyWarning(failure_text(result, strict=False)), stacklevel=1)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, CallFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, None, str(self.call)
