"""A bug report folder per failing call: what a kernel engineer needs, whole.

The call reduced to its smallest input that fails the same way (judge/reduce/reduction.py), as a
one-call dump the plugin judges (`dump/`), the standalone script that runs it on the
device and the bench without the plugin (scripts/standalone.py: tensors in a side `.pt`), the
verdicts before and after the reduction, the environment it failed in, the known defect
it matches where one does, and a README.md that says in three lines what fails and how
to run it:

    FOLDER/README.md
    FOLDER/dump/dump.json, dump/dump_tensor_data/...   the reduced call
    FOLDER/<call>.py, <call>.pt, _msprobe_judge.py      its standalone script
    FOLDER/report.json                                  verdicts, sizes, steps, environment
"""

from __future__ import annotations

import json
import platform
import re
import sys
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from pytest_msprobe.dump.index import CallName, DumpIndex, read_index
from pytest_msprobe.judge.gate.baseline import environment
from pytest_msprobe.judge.reduce.reduction import Plan, Reduction, reduce_call
from pytest_msprobe.judge.verdict.record import output_results
from pytest_msprobe.scripts.shared import version
from pytest_msprobe.scripts.standalone import WriteOptions, expected_verdict, write_script

if TYPE_CHECKING:
    from pytest_msprobe.dump.index import Record
    from pytest_msprobe.judge.check.call import CallResult, Settings
    from pytest_msprobe.judge.verdict.record import ResultRecord

#: files whose first line names a driver's version, where that driver is installed
DRIVER_FILES = {
    "Ascend NPU driver": Path("/usr/local/Ascend/driver/version.info"),
    "NVIDIA driver": Path("/proc/driver/nvidia/version"),
}
#: the libraries whose versions a report states (absent ones said absent)
LIBRARIES = ("torch", "torch_npu", "mindspore", "numpy")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


@dataclass(frozen=True)
class BugReport:
    """A written folder, and the reduction it holds."""

    folder: Path
    reduction: Reduction
    script: Path

    @property
    def line(self) -> str:
        """The one line a run's report shows: the sizes and the folder."""
        return f"reduced {self.reduction.summary}; bug report: {self.folder}"

    @property
    def fields(self) -> Record:
        """What the call's result record says of it (ResultRecord.reduction)."""
        reduction = self.reduction
        return {
            "size": f"{reduction.before} -> {reduction.after}",
            "elements": f"{reduction.elements_after}/{reduction.elements_before}",
            "folder": str(self.folder),
        }


def report_folder(root: Path, index: DumpIndex, name: CallName | str) -> Path:
    """`root/<dump>/<call>`: a dump's names are not trusted to stay inside root. A dump
    outside the rootdir is named by its path without the `..` that lead out of it
    (`work/dumps/resnet`, not `../../work/dumps/resnet`)."""
    parts = [part for part in PurePosixPath(str(index.key)).parts if part not in ("..", ".", "/")]
    dump = "/".join(parts).removesuffix("dump.json").strip("/") or index.path.parent.name
    return root / _safe(dump) / _safe(str(name))


def write_bug_report(
    index: DumpIndex, name: CallName, settings: Settings, folder: Path, plan: Plan | None = None
) -> BugReport:
    """Reduce the failing call and write its folder. Raises CallSkip where the call does
    not fail or cannot be reduced (judge/reduce/reduction.py)."""
    reduction = reduce_call(index, name, settings, folder / "dump", plan)
    reduced_index = read_index(reduction.dump)
    record = _record(reduction.reduced, reduced_index)
    options = WriteOptions(
        max_elements=settings.max_elements,
        judged=reduction.reduced.verdict.message().splitlines()[0],
        offline=reduction.offline,
        expected=expected_verdict(record),
    )
    script = write_script(reduced_index, name, folder, options)
    device = settings.backend.describe(settings.device_index)
    known = known_defect_of(reduction)
    report = {
        "call": str(name),
        "dump": str(index.path),
        "reduced": reduction.summary,
        "shape_before": reduction.before,
        "shape_after": reduction.after,
        "signature": str(reduction.signature),
        "verdict_before": reduction.original.verdict.message(),
        "verdict_after": reduction.reduced.verdict.message(),
        "steps": reduction.steps,
        "tries": reduction.tries,
        "refused": reduction.refused,
        "seconds": round(reduction.seconds, 3),
        "notes": reduction.notes,
        "mode": "offline: the dumped outputs, sliced with the inputs"
        if reduction.offline
        else f"single-run on {device}",
        "known_defect": known,
        "environment": bug_environment(device),
    }
    (folder / "report.json").write_text(json.dumps(report, indent=1), encoding="utf-8")
    (folder / "README.md").write_text(readme(reduction, script, known, reduction.offline), encoding="utf-8")
    return BugReport(folder, reduction, script)


def _record(result: CallResult, index: DumpIndex) -> ResultRecord:
    from pytest_msprobe.judge.verdict.record import ResultRecord

    verdict = result.verdict
    return ResultRecord(
        str(index.path), str(result.name), verdict.status, verdict.standard, verdict.reference, result.device,
        verdict.message(), output_results(verdict),
    )  # fmt: skip


def known_defect_of(reduction: Reduction) -> str | None:
    """The known-defects table's row the failure matches, by its measured symptom, as
    the failure's message names it (None: none matches; the reduction kept the match)."""
    known = reduction.reduced.known
    return known.note() if known is not None else None


def bug_environment(device: str) -> Record:
    """Versions (absent ones said absent), CANN and drivers where installed, the device
    and the plugin's version."""
    found = environment([], device)
    versions = found.get("versions")
    known = versions if isinstance(versions, dict) else {}
    return {
        "pytest-msprobe": version(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        **{name: known.get(name) or "absent (not loaded)" for name in LIBRARIES},
        "CANN": found.get("cann") or "absent (no ASCEND_TOOLKIT_HOME)",
        **{name: _first_line(path) or f"absent (no {path})" for name, path in DRIVER_FILES.items()},
        "device": device,
    }


def _first_line(path: Path) -> str:
    try:
        return path.read_text(errors="replace").strip().splitlines()[0][:200]
    except (OSError, IndexError):
        return ""


def readme(reduction: Reduction, script: Path, known: str | None, offline: bool) -> str:
    """Three lines: what fails, how small, how to run it."""
    verdict = reduction.reduced.verdict
    reasons = [
        reason for leaf in verdict.outputs or (verdict,) if leaf.status == verdict.status for reason in leaf.reasons
    ]
    lead = f"{reduction.call} fails: {verdict.status} by the {verdict.standard} standard: " + "; ".join(reasons) + "."
    if known:
        lead += f" Not a new fault: a {known}."
    return (
        f"{lead}\n\n"
        f"Reduced from {reduction.summary}; report.json has the verdicts before and after, the environment and the steps.\n\n"
        f"Run it: `python {script.name}` (torch only; `--device npu` on an NPU), "
        f"or under the plugin: `pytest --msprobe-dump=dump/dump.json{' --msprobe-offline' if offline else ''}`.\n"
    )


def _safe(text: str) -> str:
    return _UNSAFE.sub("_", text).strip(".") or "_"


def write_named(index: DumpIndex, call: str, root: Path, settings: Settings) -> BugReport:
    """msprobe-script --bug-report: one named call's folder under `root`, each accepted
    step told on stderr."""
    entry = index.entry(call)
    if entry is None:
        raise KeyError(call)
    folder = report_folder(root, index, entry.name)
    return write_bug_report(
        index, entry.name, settings, folder, Plan(progress=lambda line: print(line, file=sys.stderr))
    )
