"""How a judged call reads to a person: the failure text and the test's properties."""

from __future__ import annotations

from typing import Any

# Metrics shown in JUnit properties, per standard: the ones its verdict turns on.
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


def failure_text(result: Any, *, strict: bool) -> str:
    verdict = result.verdict
    head = f"{result.name}: {verdict.status} by the {verdict.standard} standard on {result.device}"
    if strict:
        head += " (a warning fails under --msprobe-strict)"
    lines = [head, verdict.message().rstrip(), "inputs:"]
    lines += [f"  {origin}" for origin in result.origins] or ["  (none)"]
    return "\n".join(lines)


def properties(result: Any) -> list[tuple[str, Any]]:
    """Flat (name, value) pairs: pytest's JUnit XML writes each as a <property>."""
    verdict = result.verdict
    pairs: list[tuple[str, Any]] = [
        ("msprobe_status", verdict.status),
        ("msprobe_standard", verdict.standard),
        ("msprobe_reference", verdict.reference),
        ("msprobe_device", result.device),
    ]
    for key in KEY_METRICS.get(verdict.standard, ()):
        if key in verdict.metrics:
            pairs.append((f"msprobe_{key}", verdict.metrics[key]))
    return pairs
