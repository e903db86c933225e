"""What a checked call amounts to: a ResultRecord whatever happened (judged, skipped,
broken input, device failure), its failure text, and the test's properties."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from pytest_msprobe.dump.index import CallName, DumpIndex
from pytest_msprobe.errors import CallError, CallSkip
from pytest_msprobe.judge.findings.finding import annotate, message_with, status_with
from pytest_msprobe.judge.verdict.record import ResultRecord, output_results
from pytest_msprobe.run import isolation
from pytest_msprobe.standards.verdict import DETAIL_ALL, DETAIL_METRICS

if TYPE_CHECKING:
    from pytest_msprobe.judge.check.call import CallResult, Settings
    from pytest_msprobe.judge.verdict.record import OutputResult

# The metrics each standard's verdict turns on: shown in JUnit properties, kept in baselines.
KEY_METRICS = {
    "binary_consistency": ("error_rate",),
    "absolute_threshold": ("inf_nan_error_ratio", "rel_err_ratio", "abs_err_ratio"),
    "ulp": ("max_ulp_err", "mean_ulp_err", "ulp_err_proportion"),
    "thousandth": ("rel_err_thousandth",),
    "accumulative_error": ("inf_nan_error_ratio", "rel_err_ratio", "abs_err_ratio", "eb"),
    "benchmark": ("small_value_err_ratio", "rmse", "max_rel_err", "mean_rel_err", "eb"),
}


class AccuracyWarning(UserWarning):
    """A call judged `warning`: passes, unless --msprobe-strict."""


class CallFailed(Exception):
    """A call judged `error` (or a broken call): the message is the whole report."""


def judge_call(
    index: DumpIndex,
    name: CallName,
    settings: Settings,
    check: Callable[[], CallResult] | None = None,
    suffix: str = "",
) -> ResultRecord:
    """Check one call and describe the result, whatever happened. `check` replaces
    the check of the dumped call (judge/explore/search.py's search around it); its record is
    named with `suffix` (`.explore`)."""
    from pytest_msprobe.judge.check.call import check_call
    from pytest_msprobe.run.replay import DeviceFailed

    started = time.perf_counter()
    label = f"{name}{suffix}"
    device = settings.backend.describe(settings.device_index)
    dump = str(index.path)
    try:
        result = check() if check is not None else check_call(index, name, settings)
    except CallSkip as exc:
        record = ResultRecord(
            status="skip", standard="", reference="", message=f"{label}: {exc}", dump=dump, call=label, device=device
        )
    except CallError as exc:
        record = ResultRecord(
            status="error",
            standard="",
            reference="",
            message=f"{label}: bad input: {exc}",
            dump=dump,
            call=label,
            device=device,
        )
    except DeviceFailed as exc:
        message = (
            isolation.out_of_memory_text(index, name, exc, device)
            if isolation.is_out_of_memory(exc, settings.backend)
            else f"{label}: {exc}"
        )
        record = ResultRecord(
            status="error", standard="", reference="", message=message, dump=dump, call=label, device=device
        )
    else:
        verdict = result.verdict
        record = ResultRecord(
            status=status_with(verdict.status, result.findings),
            standard=verdict.standard,
            reference=verdict.reference,
            message=message_with(str(name), _verdict_text(result, DETAIL_ALL), result.findings),
            outputs=annotate(output_results(verdict), result.findings),
            origins=result.origins,
            samples=result.samples,
            dump=dump,
            call=label,
            device=result.device,
            known_defect=result.known.id if result.known is not None else "",
        )
        if record.status in ("error", "warning") and settings.detail < DETAIL_ALL:
            record.shown = message_with(str(name), _verdict_text(result, settings.detail), result.findings)
    record.duration = time.perf_counter() - started
    return record


def _verdict_text(result: CallResult, detail: int) -> str:
    """The call's text: a failure's at `detail` (Verdict.message), a pass's headline."""
    verdict = result.verdict
    notes = [f"  {note}" for note in result.notes]
    if verdict.status == "skip":
        return "\n".join([f"{result.name}: " + ("; ".join(verdict.reasons) or "nothing comparable"), *notes])
    head = f"{result.name}: {verdict.status} by the {verdict.standard} standard on {result.device}"
    if verdict.status == "pass":  # its metrics are in the record's outputs; the text is read for failures
        return "\n".join([head, *notes])
    known = [result.known.note()] if result.known is not None else []
    lines = [head, *known, verdict.message(detail).rstrip(), "inputs:"]
    described = result.inputs.describe_arguments() if result.inputs is not None else result.origins
    lines += [f"  {line}" for line in described] or ["  (none)"]
    if detail < DETAIL_METRICS:
        lines.append("(every metric with its threshold: -v; the sign tests' sums too: -vv)")
    return "\n".join(lines + notes)


def properties(record: ResultRecord) -> list[tuple[str, object]]:
    """Flat (name, value) pairs: pytest's JUnit XML writes each as a <property>."""
    pairs: list[tuple[str, object]] = [
        ("msprobe_status", record.status),
        ("msprobe_standard", record.standard),
        ("msprobe_reference", record.reference),
        ("msprobe_device", record.device),
    ]
    worst = _worst_output(record)
    if worst is not None:
        for key in KEY_METRICS.get(worst.standard, ()):
            if key in worst.metrics:
                pairs.append((f"msprobe_{key}", worst.metrics[key]))
    return pairs


def _worst_output(record: ResultRecord) -> OutputResult | None:
    order = {"skip": 0, "pass": 1, "warning": 2, "error": 3}
    return max(record.outputs, key=lambda output: order.get(output.status, 0), default=None)


def crash_record(dump: str, call: str, device: str, worker: str, timeout: float) -> ResultRecord:
    """The error record of a call whose process died while running it."""
    hang = (
        f", or it hung in a kernel past the hard deadline ({isolation.HARD_DEADLINE_FACTOR} x --msprobe-timeout={timeout:g} s)"
        if timeout > 0
        else ""
    )
    return ResultRecord(
        dump=dump,
        call=call,
        status="error",
        standard="",
        reference="",
        device=device,
        message=(
            f"{call}: the process replaying it (xdist worker {worker}) died: a crash such as a segfault or "
            f"abort{hang}. The run went on in a new worker. Rerun this call alone (-n 0 -k) to see its output."
        ),
    )
