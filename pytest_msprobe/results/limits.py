"""What a metric was held to, and which metrics a failing output failed on: the report
shows a failing call by those (its "key metrics" and the marked rows of its metrics
table) and orders failing calls by how far past their limits they are.

The standards mark the metrics each failing test judged (standards.verdict.Reason, kept
as OutputResult.failed; a record written before that field names them in its reasons:
`rel_err_ratio 0.14 > 0: ...`, `scale_bias_ulp -0.45 ULP ...`); the test statistic
that made the failure certain (a sign test's z, a ratio to the reference run) is the
named metric's companion. Listing every metric past a threshold of its name instead
would be wrong where a reference run moved the limit: offline, a bfloat16 add's
rel_err_ratio is 0.14 against a threshold of 0 and passes, because the reference run's
own ratio is as large. `failed_metrics` is the one place that decides.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING

from pytest_msprobe.judge.check.outcome import KEY_METRICS

if TYPE_CHECKING:
    from pytest_msprobe.judge.verdict.record import OutputResult, ResultRecord

# metric -> (the threshold keys that may limit it, first found wins; how): "max" a value
# must not exceed it, "min" must reach it, "abs" its magnitude must not exceed it, "ref"
# its distance from the reference run's value (metric `ref_<key>`) must not exceed it.
# A metric not listed is limited by a threshold of its own name, "max".
LIMITS: dict[str, tuple[tuple[str, ...], str]] = {
    "mean_ulp_err": (("ulp_mean_max",), "max"),
    "ulp_err_proportion": (("ulp_prop_max",), "max"),
    "max_scaled_ulp_err": (("sr_max_scaled_ulp",), "max"),
    "mean_scaled_ulp_err": (("sr_mean_scaled_ulp",), "max"),
    "max_top_ulp_err": (("sr_max_top_ulp",), "max"),
    "bias_ulp": (("sr_bias_ulp", "at_bias_ulp", "ulp_bias_ulp"), "abs"),
    "scale_bias_ulp": (("sr_bias_ulp", "at_bias_ulp", "ulp_bias_ulp"), "abs"),
    "bias_z": (("sr_bias_z",), "max"),
    "scale_bias_z": (("sr_bias_z",), "max"),
    "eb": (("eb_max",), "max"),
    "scale_eb": (("eb_max",), "max"),
    "rel_err_thousandth": (("rel_err_thousandth",), "min"),
    "scaled_thousandth": (("scaled_thousandth",), "min"),
}
# a bias mean judged against a reference run: limited in its distance from the run's
REFERENCE_LIMITS: dict[str, tuple[tuple[str, ...], str]] = {
    "bias_ulp": (("ref_bias_ulp",), "ref"),
    "scale_bias_ulp": (("ref_bias_ulp",), "ref"),
}
_REFERENCE_THRESHOLDS = frozenset(name for names, _ in REFERENCE_LIMITS.values() for name in names)
# with no-break spaces: a limit never wraps inside itself
SIGNS = {"max": "≤", "min": "≥", "abs": "|.|\u00a0≤", "ref": "|Δ\u00a0ref|\u00a0≤"}
# a named metric's test statistics, which fail with it: its name with the suffix replaced
COMPANIONS = (("_ulp", "_z"), ("", "_ratio"), ("", "_z"))
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def number(value: float) -> str:
    return f"{value:.3g}" if isinstance(value, (int, float)) else str(value)


def metric_limit(output: OutputResult, key: str) -> tuple[float | None, str]:
    """The threshold applied to a metric and how (LIMITS), None where none was."""
    found = limit_name(output, key)
    return (output.thresholds[found[0]], found[1]) if found is not None else (None, "max")


def limit_name(output: OutputResult, key: str) -> tuple[str, str] | None:
    """The name of the threshold applied to a metric, and how; None where none was.
    (Called for every key metric of every row: the common case first.)"""
    thresholds = output.thresholds
    rule = LIMITS.get(key)
    if rule is None and key not in REFERENCE_LIMITS:  # a threshold of its name, if any ...
        # ... but a reference limit is no limit of the reference run's own metric (ref_bias_ulp)
        return (key, "max") if key in thresholds and key not in _REFERENCE_THRESHOLDS else None
    for names, how in (rule or ((), "max"), REFERENCE_LIMITS.get(key, ((), "ref"))):
        for name in names:
            if name in thresholds and (how != "ref" or f"ref_{key}" in output.metrics):
                return name, how
    return None


def beyond(output: OutputResult, key: str) -> bool:
    """Whether the metric is past its limit (False without one, or not finite)."""
    limit, how = metric_limit(output, key)
    value = output.metrics.get(key)
    if limit is None or value is None or not math.isfinite(value):
        return False
    return past(value, limit, how, output.metrics.get(f"ref_{key}", 0.0))


def past(value: float, limit: float, how: str, reference: float = 0.0) -> bool:
    return abs(value - reference) > limit if how == "ref" else PAST[how](value, limit)


PAST = {
    "max": lambda value, limit: value > limit,
    "min": lambda value, limit: value < limit,
    "abs": lambda value, limit: abs(value) > limit,
}


def failed_metrics(output: OutputResult) -> list[str]:
    """The metrics a failing or warning output failed on, as its standard marked them
    (OutputResult.failed; in a record written before that field, the metrics its reasons
    name), each with its companions past their limits, in the reasons' order; where none
    is named, those past their limits. None for a pass or skip."""
    if output.status not in ("error", "warning"):
        return []
    marked = list(output.failed) or [
        word for reason in output.reasons for word in _WORD.findall(reason) if word in output.metrics
    ]
    named: list[str] = []
    for word in marked:
        if word in output.metrics and word not in named:
            named.append(word)
            named += [
                companion
                for old, new in COMPANIONS
                if word.endswith(old)
                and (companion := word.removesuffix(old) + new) in output.metrics
                and companion not in named
                and beyond(output, companion)
            ]
    return named or [key for key in output.metrics if beyond(output, key)]


def overshoot(output: OutputResult) -> float:
    """How far past its limit the output's worst failed metric is, as a factor (>= 1
    for a failure; inf past a limit of 0): what orders failing calls of one status."""
    worst = 0.0
    for key in failed_metrics(output):
        limit, how = metric_limit(output, key)
        value = output.metrics[key]
        if limit is None or not math.isfinite(value):
            worst = max(worst, math.inf if limit is not None else 1.0)
            continue
        if how == "min":  # a share that must reach its limit: the limit over the share
            worst = max(worst, limit / abs(value) if value else math.inf)
            continue
        distance = abs(value - output.metrics.get(f"ref_{key}", 0.0)) if how == "ref" else abs(value)
        worst = max(worst, distance / limit if limit else (math.inf if distance else 1.0))
    return worst


def worst_output(record: ResultRecord) -> OutputResult | None:
    """The first output with the call's status (the one its status comes from)."""
    return next(
        (output for output in record.outputs if output.status == record.status),
        record.outputs[0] if record.outputs else None,
    )


def key_metrics(record: ResultRecord) -> str:
    """A failing or warning call: the metrics its worst output failed on, each with its
    limit. Else the metrics the output's standard turns on (KEY_METRICS)."""
    output = worst_output(record)
    if output is None:
        return ""
    shown = (
        failed_metrics(output)
        or [key for key in KEY_METRICS.get(output.standard, ()) if key in output.metrics]
        or list(output.metrics)[:3]
    )
    return ", ".join(against(output, key) for key in shown)


def against(output: OutputResult, key: str) -> str:
    """`key value (≤ limit)`; the limit left out where none applied."""
    limit, how = metric_limit(output, key)
    shown = f" ({SIGNS[how]}\u00a0{number(limit)})" if limit is not None else ""
    return f"{key} {number(output.metrics[key])}{shown}"
