"""The repository's own test setup: the shipped dumps, and a runner that replays a dump
through the plugin as a user would and returns each call's outcome.

pytest also loads this file when a user, from any folder, names a dump inside the
repository (`--msprobe-dump=<repo>/examples/.../dump.json`): it is then the conftest of
a folder being collected, not the rootdir's. So it defines fixtures only; pytester,
which the fixtures need, is enabled by pyproject.toml's `-p pytester` for the
repository's own runs (`pytest_plugins` here would stop the user's run: pytest refuses
it in a conftest that is not the rootdir's).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_msprobe.judge.gate.kernel_verdicts import is_kernel

DUMPS = Path(__file__).parent / "tests" / "dumps"


@dataclass
class CallOutcome:
    outcome: str  # "passed", "failed", "skipped"
    text: str  # the failure text or the skip reason
    properties: dict[str, Any]
    warnings: list[str]


@dataclass
class DumpRun:
    calls: dict[str, CallOutcome]  # call name -> outcome
    collection_errors: list[str]
    ret: int
    kernels: dict[str, CallOutcome]  # kernel name -> outcome (pytest_msprobe/judge/gate/kernel_verdicts.py)

    def by_outcome(self, outcome: str) -> dict[str, CallOutcome]:
        return {name: call for name, call in self.calls.items() if call.outcome == outcome}


@pytest.fixture
def dumps() -> Path:
    return DUMPS


@pytest.fixture
def copy_dump(tmp_path: Path) -> Callable[[str], Path]:
    """A private copy of a shipped dump, for tests that edit it."""

    def copy(name: str) -> Path:
        target = tmp_path / name
        shutil.copytree(DUMPS / name, target)
        return target / "dump.json"

    return copy


@pytest.fixture
def write_dump(tmp_path: Path) -> Callable[..., Path]:
    """Write a small dump.json (and its tensors) for an edge case."""

    def write(
        data: dict[str, Any],
        *,
        task: str = "statistics",
        framework: str | None = "pytorch",
        tensors: dict[str, Any] | None = None,
        folder: str = "dump",
    ) -> Path:
        root = tmp_path / folder
        (root / "dump_tensor_data").mkdir(parents=True, exist_ok=True)
        header: dict[str, Any] = {"task": task, "level": "L1", "dump_data_dir": None}
        if framework is not None:
            header["framework"] = framework
        (root / "dump.json").write_text(json.dumps({**header, "data": data}, indent=1))
        import torch

        for name, tensor in (tensors or {}).items():
            torch.save(tensor, root / "dump_tensor_data" / name)
        return root / "dump.json"

    return write


@pytest.fixture
def run_dump(pytester: pytest.Pytester) -> Callable[..., DumpRun]:
    """Run pytest with --msprobe-dump in-process and collect every call's outcome."""

    def run(dump: Path, *args: str) -> DumpRun:
        reprec = pytester.inline_run(f"--msprobe-dump={dump}", "-p", "no:cacheprovider", "-W", "default", *args)
        calls: dict[str, CallOutcome] = {}
        warned: dict[str, list[str]] = {}
        for call in reprec.getcalls("pytest_warning_recorded"):
            warned.setdefault(call.nodeid.rsplit("::", 1)[-1], []).append(str(call.warning_message.message))
        for report in reprec.getreports("pytest_runtest_logreport"):
            name = report.nodeid.rsplit("::", 1)[-1]
            if report.when == "call" or (report.when == "setup" and not report.passed):
                text = (
                    report.longreprtext
                    if not report.skipped
                    else getattr(report, "wasxfail", None) or str(report.longrepr[2])
                )
                calls[name] = CallOutcome(report.outcome, text, dict(report.user_properties), warned.get(name, []))
        errors = [report.longreprtext for report in reprec.getreports("pytest_collectreport") if report.failed]
        kernels = {name: calls.pop(name) for name in list(calls) if is_kernel(name)}
        return DumpRun(calls, errors, reprec.ret, kernels)

    return run
