"""The pytest nodes: a dump.json is a File, each dumped call an Item, and a dump that
cannot be checked one failing Item of its own.

A dump that cannot be checked (unreadable, MindSpore's without MindSpore, a statistics
dump under --msprobe-offline) is not a collection error: pytest stops a run at the first
collection error, and one broken rank must not keep every other dump from running."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, overload

import pytest

from pytest_msprobe.dump.cache import cached_summary, load_index
from pytest_msprobe.dump.index import DIRECTIONS, CallName, DumpIndex
from pytest_msprobe.errors import DumpError
from pytest_msprobe.judge.check.outcome import AccuracyWarning, CallFailed, judge_call, properties
from pytest_msprobe.judge.verdict.record import EXPLORED_SUFFIX, ResultRecord
from pytest_msprobe.plugin import options
from pytest_msprobe.plugin.state import session_state
from pytest_msprobe.run.mindspore.tables import require_mindspore

if TYPE_CHECKING:
    import os

    from pytest_msprobe.dump.cache import DumpSummary
    from pytest_msprobe.judge.explore.search import Plan
    from pytest_msprobe.plugin.pytest_privates import TerminalRepr, TracebackStyle

RESULT_KEY = pytest.StashKey[ResultRecord]()
#: the name of the one test a dump that cannot be checked gets: `<dump.json>::collection`
UNCHECKED_NAME = "collection"
# inside --msprobe-out: failing explored examples (one-call dumps), hypothesis's database
EXPLORED_FOLDER, HYPOTHESIS_FOLDER = "explored", "hypothesis"


@functools.cache
def _mark(name: str) -> pytest.MarkDecorator:
    """One decorator per marker name: `pytest.mark.<name>` costs as much as the rest of
    an item's creation, and a dump has hundreds of thousands of items."""
    mark: pytest.MarkDecorator = getattr(pytest.mark, name)
    return mark


@overload
def open_dump(config: pytest.Config, path: Path, summary: Literal[False] = False) -> DumpIndex: ...


@overload
def open_dump(config: pytest.Config, path: Path, summary: bool) -> DumpIndex | DumpSummary: ...


def open_dump(config: pytest.Config, path: Path, summary: bool = False) -> DumpIndex | DumpSummary:
    """The dump's index (with `summary`: what its current cache says of it, where it has
    one: the xdist controller's summary line needs no columns), or DumpError saying why
    this run cannot check the dump."""
    chosen = options.of(config)
    index = (summary and cached_summary(path, chosen.cache_folder)) or load_index(path, chosen.cache_folder)
    if index.framework == "mindspore":
        require_mindspore()
    if chosen.offline and index.task != "tensor":
        from pytest_msprobe.judge.offline.dumped_run import require_tensor_task  # torch: not in the xdist controller

        require_tensor_task(index)
    return index


class DumpFile(pytest.File):
    """One dump.json: read once into an index of call names, records left on disk."""

    def collect(self) -> Iterator[pytest.Item]:
        state = session_state(self.config)
        if state.problem is not None:
            # An xdist worker that cannot run calls (its device): every worker fails its
            # collection with the same text, which xdist shows once, and the run stops.
            raise self.CollectError(state.problem)
        try:
            index = open_dump(self.config, self.path)
        except DumpError as exc:
            yield UncheckedDump.from_parent(self, name=UNCHECKED_NAME, problem=str(exc))
            return
        index.key = self.nodeid
        state.indexes[self.path] = index
        state.module_entries += index.modules
        state.unparsed_names.extend(index.skipped_names)
        api_types = [api_type.lower() for api_type, _ in index.apis]
        explore = options.of(self.config).explore
        for position, (name, api, backward) in enumerate(
            zip(index.names, index.api.tolist(), index.backward.tolist(), strict=True)
        ):
            markers = (DIRECTIONS[backward], "api_" + api_types[api])
            yield CallItem.from_parent(self, name=name, index=index, position=position, markers=markers)
            if explore:
                yield ExploreItem.from_parent(
                    self,
                    name=name + EXPLORED_SUFFIX,
                    index=index,
                    position=position,
                    markers=(*markers, "explore"),
                    examples=explore,
                )


class CallItem(pytest.Item):
    """One dumped call: its dump's index and its position there (scheduling reads its
    size from the index columns; no lookup by name while collecting)."""

    # Any: pytest.Item's own keyword arguments (name, parent, ...), passed on as they are
    def __init__(self, *, index: DumpIndex, position: int, markers: tuple[str, ...], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.index = index
        self.position = position
        for marker in markers:
            self.add_marker(_mark(marker))

    @property
    def call(self) -> CallName:  # not cached: 200,000 items would keep 200,000 CallNames
        return self.index.call_at(self.position)

    @property
    def numel(self) -> int:
        return int(self.index.numel[self.position])

    @property
    def record_name(self) -> str:
        """What its result record (and its row in the result files) is called."""
        return str(self.call)

    timeout_factor = 1  # --msprobe-timeout is per call: a test that runs the call N times gets N times that

    def replayable(self) -> tuple[DumpIndex, CallName] | None:
        """The dump and call that reproduce this test's result: what --msprobe-save-failed
        saves and --msprobe-scripts writes a script for."""
        return self.index, self.call

    def run_check(self) -> ResultRecord:
        return judge_call(self.index, self.call, session_state(self.config).settings())

    def runtest(self) -> None:
        state = session_state(self.config)
        record = self.run_check()
        self.stash[RESULT_KEY] = record
        if record.status != "skip":
            self.user_properties.extend(properties(record))
        if record.status == "skip":
            pytest.skip(record.message)
        change = state.gate_change(self.index, record)
        text = record.shown or record.message  # at the run's verbosity; the files keep everything
        if change is not None and change.kind == "regression":
            raise CallFailed(
                f"regression against the baseline (--msprobe-gate): {change.describe()}\n{text}\n{self.reproduce()}"
            )
        failing = record.status == "error" or (record.status == "warning" and options.of(self.config).strict)
        if failing and change is not None:
            pytest.xfail(f"failed the same way in the baseline, not a regression (--msprobe-gate): {change.describe()}")
        if failing and record.known_defect and options.of(self.config).known_defects == "xfail":
            # the headline only: -rx lists one line per test; the files keep the whole message
            headline = record.message.partition("\n")[0]
            pytest.xfail(f"known defect {record.known_defect} (--msprobe-known-defects=xfail): {headline}")
        if failing:
            strict = "\n(a warning fails under --msprobe-strict)" if record.status == "warning" else ""
            raise CallFailed(f"{text}{strict}\n{self.reproduce()}")
        if record.status == "warning":
            warnings.warn(AccuracyWarning(text), stacklevel=1)

    def reproduce(self) -> str:
        """The command that runs this test alone, as this run did: its node id, its dump
        and the options that decide a verdict (not those choosing calls or writing files)."""
        return "reproduce: " + options.reproduce_command(self.config, self.path, self.name)

    def repr_failure(
        self, excinfo: pytest.ExceptionInfo[BaseException], style: TracebackStyle | None = None
    ) -> str | TerminalRepr:
        if isinstance(excinfo.value, CallFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self) -> tuple[os.PathLike[str] | str, int | None, str]:
        return self.path, None, headline(self.nodeid, str(self.call))


class ExploreItem(CallItem):
    """`<call name>.explore`: the call's neighbourhood searched with hypothesis
    (judge/explore/search.py). Selected with its call: the lists, dedup, shards and -k see the
    same call."""

    def __init__(self, *, examples: int, **kwargs: Any) -> None:  # Any: CallItem's
        super().__init__(**kwargs)
        self.examples = examples

    @property
    def record_name(self) -> str:
        return self.name

    @property
    def timeout_factor(self) -> int:  # type: ignore[override]
        return 2 * self.examples  # each example, and as many again for shrinking a failure

    def plan(self) -> Plan:
        from pytest_msprobe.judge.explore.search import Plan

        chosen = options.of(self.config)
        return Plan(self.examples, chosen.out / EXPLORED_FOLDER, chosen.out / HYPOTHESIS_FOLDER, chosen.strict)

    def run_check(self) -> ResultRecord:
        from pytest_msprobe.judge.explore.search import explore_call

        settings = session_state(self.config).settings()
        return judge_call(
            self.index,
            self.call,
            settings,
            check=lambda: explore_call(self.index, self.call, settings, self.plan()),
            suffix=EXPLORED_SUFFIX,
        )

    def replayable(self) -> tuple[DumpIndex, CallName] | None:
        """The minimal failing example's one-call dump, once this test failed."""
        from pytest_msprobe.dump.index import read_index
        from pytest_msprobe.judge.explore.search import example_path

        path = example_path(self.plan().folder, self.index, self.call)
        record = self.stash.get(RESULT_KEY, None)
        if record is None or record.status not in ("error", "warning") or not path.is_file():
            return None
        return read_index(path), self.call


def headline(nodeid: str, call: str) -> str:
    """What names a call's report (a failure's headline): the call, then its dump.

    Never a suffix of the node id: where it is, `-v` prints the node id with that suffix's
    dots turned into `::` (as for Python's `Class.method`), an id `--deselect` ignores."""
    return f"{call} ({nodeid.split('::', 1)[0]})"


class UncheckedDump(pytest.Item):
    """The one test of a dump this run cannot check: it fails with the reason, and the
    other dumps of the run go on."""

    def __init__(self, *, problem: str, **kwargs: Any) -> None:  # Any: pytest.Item's
        super().__init__(**kwargs)
        self.problem = problem

    def runtest(self) -> None:
        raise CallFailed(f"{self.problem}\n(no call of this dump was checked; the other dumps of the run were)")

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: TracebackStyle | None = None) -> str:
        return str(excinfo.value)

    def reportinfo(self) -> tuple[os.PathLike[str] | str, int | None, str]:
        return self.path, None, f"{self.path.name}: not checked"


def dump_lines(config: pytest.Config, dumps: Sequence[Path]) -> Iterator[str]:
    """What each dump held besides the collected calls: Module/Cell entries (whole
    modules, outside an API-level check) and keys that are not call names."""
    from pytest_msprobe.plugin.pytest_privates import bestrelpath

    for dump in dumps:
        try:
            index = open_dump(config, dump, summary=True)
        except DumpError as exc:
            yield f"msprobe: {bestrelpath(config.rootpath, dump)}: not checked: {str(exc).splitlines()[0]}"
            continue
        left_out = (
            f", {index.modules} Module/Cell entries not collected (whole modules, not API calls)"
            if index.modules
            else ""
        )
        odd = f", {len(index.skipped_names)} keys that are not call names ignored" if index.skipped_names else ""
        yield f"msprobe: {bestrelpath(config.rootpath, dump)}: {len(index)} API calls{left_out}{odd}"
