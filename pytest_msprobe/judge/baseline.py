"""Baselines: the metrics of an earlier trusted run, to judge a new run against.

The CI that gates a CANN or torch_npu upgrade asks: did any operator get less
accurate than before? A baseline records every call's metrics (not tensors) with the
environment that produced them, one JSON line per call, sorted, so that a git diff of
two baselines reads call by call. A run with `--msprobe-baseline` hands each call's
recorded metrics to the standards as its reference (benchmark and ULP judge ratios to
them), then compares statuses and metrics to name regressions and improvements.

msprobe's own `accuracy_checking_details_*.csv` (from run_ut on another device) is
read into the same shape, so existing results become a one-run reference.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from pytest_msprobe.judge.outcome import KEY_METRICS
from pytest_msprobe.judge.record import ResultRecord

FORMAT = "pytest-msprobe-baseline"
VERSION = 1
FILE_NAME = "msprobe-baseline.jsonl"
STATUS_RANK = {"skip": -1, "pass": 0, "warning": 1, "error": 2}
IMPROVED_BELOW = 0.5  # every judged metric at most half the baseline's: an improvement

# Metrics where larger is better (a share of good elements): compared inverted.
HIGHER_IS_BETTER = {"rel_err_thousandth"}


class BaselineError(Exception):
    """A baseline file that cannot be used: a usage error naming the file."""


@dataclass(frozen=True)
class CallMetrics:
    """What a baseline holds of one call."""

    status: str
    standard: str
    outputs: dict[str, dict[str, float]]  # output path -> metric -> value

    def to_json(self, dump: str, call: str) -> str:
        return json.dumps({"dump": dump, "call": call, "status": self.status, "standard": self.standard,
                           "outputs": self.outputs}, sort_keys=True, separators=(",", ":"))

    @classmethod
    def of(cls, record: ResultRecord) -> "CallMetrics":
        outputs = {}
        for output in record.outputs:
            kept = KEY_METRICS.get(output.standard, ())  # the metrics its verdict turns on
            outputs[output.path] = {key: _short(output.metrics[key]) for key in kept if key in output.metrics}
        return cls(record.status, record.standard, outputs)


def _short(value: float) -> float:
    """Six significant digits: enough to judge ratios, small enough for git."""
    return float(f"{value:.6g}")


@dataclass
class Baseline:
    """Recorded metrics by (dump key, call name); `dump` is None for calls imported
    from an msprobe CSV, which names no dump."""

    environment: dict[str, Any] = field(default_factory=dict)
    calls: dict[tuple[str | None, str], CallMetrics] = field(default_factory=dict)

    def get(self, dump: str, call: str) -> CallMetrics | None:
        return self.calls.get((dump, call)) or self.calls.get((None, call))

    def reference_for(self, dump: str, call: str) -> dict[str, dict[str, float]] | None:
        """The standards' `reference=` for this call, or None for a call it lacks."""
        found = self.get(dump, call)
        return found.outputs if found is not None and found.outputs else None

    def update(self, records: Iterable[tuple[str, ResultRecord]]) -> None:
        for dump, record in records:
            self.calls[(dump, record.call)] = CallMetrics.of(record)

    def write(self, folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / FILE_NAME
        header = {"format": FORMAT, "version": VERSION, "environment": self.environment}
        lines = [json.dumps(header, sort_keys=True)]
        lines += [metrics.to_json(dump or "", call) for (dump, call), metrics in sorted(self.calls.items(), key=_order)]
        temporary = path.with_suffix(".tmp")
        temporary.write_text("\n".join(lines) + "\n", encoding="utf-8")
        os.replace(temporary, path)  # a crash mid-write never leaves half a baseline
        return path

    @classmethod
    def read(cls, folder: Path) -> "Baseline":
        path = folder / FILE_NAME if folder.is_dir() else folder
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise BaselineError(f"{path}: cannot be read ({exc.strerror or exc}); record one with --msprobe-baseline-save") from None
        try:
            header = json.loads(lines[0]) if lines else {}
        except json.JSONDecodeError:
            header = {}
        if header.get("format") != FORMAT:
            raise BaselineError(f"{path}: is not a pytest-msprobe baseline (no {FORMAT!r} header line)")
        if header.get("version") != VERSION:
            raise BaselineError(f"{path}: baseline format version {header.get('version')!r}; this pytest-msprobe reads version {VERSION}")
        baseline = cls(environment=header.get("environment", {}))
        for number, line in enumerate(lines[1:], start=2):
            try:
                item = json.loads(line)
                baseline.calls[(item["dump"], item["call"])] = CallMetrics(item["status"], item["standard"], item["outputs"])
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise BaselineError(f"{path}:{number}: not a baseline line ({exc})") from None
        return baseline


def _order(item: tuple[tuple[str | None, str], CallMetrics]) -> tuple[str, str]:
    (dump, call), _ = item
    return dump or "", call


# --- comparing a run with its baseline ---------------------------------------------


@dataclass(frozen=True)
class Change:
    kind: str  # "regression", "improvement", "unchanged", "new"
    call: str
    was: str
    now: str
    ratio: float | None  # the largest growth of a judged metric (now / baseline)
    metric: str


def compare(current: CallMetrics, recorded: CallMetrics | None, call: str) -> Change:
    if recorded is None:
        return Change("new", call, "", current.status, None, "")
    ratio, metric = largest_growth(current, recorded)
    was, now = STATUS_RANK.get(recorded.status, 0), STATUS_RANK.get(current.status, 0)
    if now > was:
        kind = "regression"
    elif now < was or (ratio is not None and ratio <= IMPROVED_BELOW and _any_error(recorded)):
        kind = "improvement"
    else:
        kind = "unchanged"
    return Change(kind, call, recorded.status, current.status, ratio, metric)


def largest_growth(current: CallMetrics, recorded: CallMetrics) -> tuple[float | None, str]:
    """max over outputs and shared metrics of now / baseline (inverted for shares of
    good elements); a metric that was 0 and is not now counts as infinite growth."""
    worst: tuple[float | None, str] = (None, "")
    for path, metrics in current.outputs.items():
        before = recorded.outputs.get(path, {})
        for key, now in metrics.items():
            if key not in before or key == "eb":
                continue
            was = before[key]
            if key in HIGHER_IS_BETTER:
                now, was = 1.0 - now, 1.0 - was
            growth = (now / was) if was else (float("inf") if now else 1.0)
            if worst[0] is None or growth > worst[0]:
                worst = (growth, f"{path}{key}" if path else key)
    return worst


def _any_error(recorded: CallMetrics) -> bool:
    return any(value for metrics in recorded.outputs.values() for key, value in metrics.items()
               if key not in HIGHER_IS_BETTER and key != "eb")


# --- the environment a baseline was recorded in ------------------------------------


def environment(dumps: Iterable[tuple[str, Path]], device: str) -> dict[str, Any]:
    """What produced the metrics: versions, device, and which dumps (by content)."""
    versions = {name: _version(name) for name in ("torch", "torch_npu", "mindspore", "numpy")}
    return {
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "versions": {name: version for name, version in versions.items() if version},
        "cann": _cann_version(),
        "device": device,
        "dumps": {key: _identity(path) for key, path in dumps},
    }


def _version(module: str) -> str | None:
    loaded = sys.modules.get(module)  # never import torch_npu or MindSpore just to ask
    if loaded is None:
        return None
    return str(getattr(loaded, "__version__", "")) or None


def _cann_version() -> str | None:
    home = os.environ.get("ASCEND_TOOLKIT_HOME") or os.environ.get("ASCEND_HOME_PATH")
    if not home:
        return None
    for name in ("version.cfg", "version.info"):
        candidate = Path(home) / name
        if candidate.is_file():
            return candidate.read_text(errors="replace").strip()[:200]
    return home


def _identity(path: Path) -> dict[str, Any]:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return {"size": path.stat().st_size, "sha256": digest.hexdigest()}


# --- msprobe's details CSV as a reference ---------------------------------------------

# msprobe's details columns -> our metric keys (the spec's "msprobe's result files").
MSPROBE_COLUMNS = {
    "二进制一致错误率": "error_rate",
    "误差均衡性": "eb",
    "均方根误差": "rmse",
    "小值域错误占比": "small_value_err_ratio",
    "相对误差最大值": "max_rel_err",
    "相对误差平均值": "mean_rel_err",
    "inf/nan错误率": "inf_nan_error_ratio",
    "相对误差错误率": "rel_err_ratio",
    "绝对误差错误率": "abs_err_ratio",
    "ULP误差最大值": "max_ulp_err",
    "ULP误差平均值": "mean_ulp_err",
    "ULP误差大于阈值占比": "ulp_err_proportion",
    "双千指标": "rel_err_thousandth",
}


def read_msprobe_details(path: Path) -> Baseline:
    """msprobe's `accuracy_checking_details_*.csv` as recorded metrics per output.

    Its rows name outputs `Functional.linear.0.forward.output.1`; our paths are ""
    for a single output and "[i]" inside a tuple, so output 0 is filed under both.
    """
    try:
        with open(path, encoding="utf-8-sig", newline="") as handle:
            rows = list(csv.DictReader(handle))
    except OSError as exc:
        raise BaselineError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if rows and "API Name" not in rows[0]:
        raise BaselineError(f"{path}: not an msprobe details CSV (no 'API Name' column)")
    baseline = Baseline(environment={"imported_from": str(path)})
    for row in rows:
        name, _, position = row["API Name"].rpartition(".output.")
        if not name or not position.isdigit():
            continue
        metrics = {key: float(row[column]) for column, key in MSPROBE_COLUMNS.items() if _is_number(row.get(column))}
        previous = baseline.calls.get((None, name))
        outputs = dict(previous.outputs) if previous else {}
        outputs[f"[{position}]"] = metrics
        if position == "0":
            outputs[""] = metrics
        status = str(row.get("Status", "")).strip().lower()
        baseline.calls[(None, name)] = CallMetrics(_worse(previous.status if previous else "pass", status), "", outputs)
    return baseline


def _is_number(text: Any) -> bool:
    try:
        float(text)
    except (TypeError, ValueError):
        return False
    return True


def _worse(first: str, second: str) -> str:
    return max((first, second), key=lambda status: STATUS_RANK.get(status, -1))
