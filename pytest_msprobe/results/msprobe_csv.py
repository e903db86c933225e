"""msprobe's two result CSV formats, cell for cell, so that msprobe's own
post-processing (`msprobe api_precision_compare`, users' spreadsheets) reads ours.

Pure functions from ResultRecord to rows: the writer decides when and where rows go.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from pytest_msprobe.judge.verdict.record import OutputResult, ResultRecord
from pytest_msprobe.standards.verdict import Status

RESULT_PREFIX = "accuracy_checking_result_"
DETAILS_PREFIX = "accuracy_checking_details_"
# The kernel verdicts (judge/gate/kernel_verdicts.py) in the result CSV's columns, in a file of their
# own: msprobe's result file has one row per dumped call, and tools count them so.
KERNELS_PREFIX = "accuracy_checking_kernels_"
ENCODING = "utf-8-sig"  # msprobe writes a byte-order mark: Excel then reads the Chinese headers

RESULT_HEADER = ("API name", "Forward Test Success", "Backward Test Success", "Message")

# Metric key (Verdict.metrics, spec "Metric names") -> msprobe's details column, in
# msprobe's column order.
METRIC_COLUMNS = (
    ("cosine", "余弦相似度"),
    ("max_abs_err", "最大绝对误差"),
    ("rel_err_hundredth", "双百指标"),
    ("rel_err_thousandth", "双千指标"),
    ("rel_err_ten_thousandth", "双万指标"),
    ("error_rate", "二进制一致错误率"),
    ("eb", "误差均衡性"),
    ("rmse", "均方根误差"),
    ("small_value_err_ratio", "小值域错误占比"),
    ("max_rel_err", "相对误差最大值"),
    ("mean_rel_err", "相对误差平均值"),
    ("inf_nan_error_ratio", "inf/nan错误率"),
    ("rel_err_ratio", "相对误差错误率"),
    ("abs_err_ratio", "绝对误差错误率"),
    ("max_ulp_err", "ULP误差最大值"),
    ("mean_ulp_err", "ULP误差平均值"),
    ("ulp_err_proportion", "ULP误差大于阈值占比"),
)
DETAILS_HEADER = (
    "API Name",
    "Bench Dtype",
    "DEVICE Dtype",
    "Shape",
    *(column for _, column in METRIC_COLUMNS),
    "Status",
    "Message",
)

SPACE = " "  # msprobe's mark for "does not apply"
STATUS_TEXT: dict[Status, str] = {"pass": "pass", "warning": "warning", "error": "error", "skip": "SKIP"}

# A spreadsheet runs a cell starting with one of these as a formula (OWASP "CSV
# injection"); full-width forms included because some spreadsheets fold them.
FORMULA_STARTS = tuple("=+-@\t\r＝＋－＠")
MAX_CELL = 32_000  # Excel shows at most 32,767 characters of a cell; keep a margin


def neutralise(text: str) -> str:
    """Text safe in any spreadsheet and on one line: a leading formula character is
    quoted with `'`, line breaks become ` | ` (a CSV row is then one line, which keeps
    torn-row recovery simple), and text past MAX_CELL is cut with a note."""
    flat = " | ".join(line for line in text.splitlines() if line.strip()) if ("\n" in text or "\r" in text) else text
    if len(flat) > MAX_CELL:
        flat = flat[:MAX_CELL] + f" ... ({len(flat) - MAX_CELL} more characters; see the metrics file)"
    return "'" + flat if flat.startswith(FORMULA_STARTS) else flat


def metric_text(value: float | None) -> str:
    """14 decimals as msprobe prints them; SPACE where the metric does not apply.
    Numbers are written by us, never neutralised: a negative cosine stays a number."""
    if value is None:
        return SPACE
    if math.isnan(value) or math.isinf(value):
        return str(value)
    return f"{value:.14f}"


def dtype_text(dtype: str) -> str:
    """msprobe spells dtypes as torch does (`torch.float16`): its api_precision_compare
    picks thresholds by that name."""
    return dtype if "." in dtype or not dtype else f"torch.{dtype}"


def status_text(status: Status) -> str:
    return STATUS_TEXT.get(status, status)


def output_name(call: str, output: OutputResult) -> str:
    """`Functional.linear.0.forward` + output 1 -> `Functional.linear.0.forward.output.1`."""
    return f"{call}.output.{output.index}"


def details_rows(record: ResultRecord) -> list[list[str]]:
    """One row per compared output; a call with no compared output (skipped, broken
    input) has none: its status lives in the result CSV."""
    return [
        [
            neutralise(output_name(record.call, output)),
            neutralise(dtype_text(output.bench_dtype)),
            neutralise(dtype_text(output.device_dtype)),
            neutralise(str(tuple(output.shape))),
            *(metric_text(output.metrics.get(key)) for key, _ in METRIC_COLUMNS),
            status_text(output.status),
            neutralise("; ".join([*output.reasons, *_known(record, output.status)])),
        ]
        for output in record.outputs
    ]


def _known(record: ResultRecord, status: Status) -> list[str]:
    """A failing output's mention of the known defect its call matches (judge/defects/table.py):
    msprobe's columns stay as they are, so it goes where the reasons are."""
    return [f"known defect {record.known_defect}"] if record.known_defect and status == "error" else []


def result_row(call: str, forward: Status | None, backward: Status | None, messages: Iterable[str]) -> list[str]:
    """One row per call (name without direction). A direction that was not run is a
    single space, as msprobe marks a call without backward."""
    return [
        neutralise(call),
        status_text(forward) if forward else SPACE,
        status_text(backward) if backward else SPACE,
        neutralise("; ".join(message for message in messages if message)),
    ]
