"""The result of judging one output: Verdict and the offending elements it names.

A Verdict is plain data (frozen) so it can be pickled across xdist workers, written to
CSV rows and compared in tests; `message()` renders the failure text users read, at
pytest's three levels of detail: what failed (the reasons, the metrics that crossed
their limits, the worst elements), then every metric with its threshold, then the sign
tests' sums too.

A standard marks the metrics a failure turns on where it writes the reason: a `Reason`
is the reason's text carrying those metrics' limits, and the Verdict collects them as
`failed`. The message and the report show those, never a passing metric, as the failure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final, Literal, NamedTuple, TypeAlias

__all__ = [
    "Verdict",
    "Offender",
    "Reason",
    "Status",
    "STATUS_ORDER",
    "worst_status",
    "DETAIL_FAILED",
    "DETAIL_METRICS",
    "DETAIL_ALL",
]

#: what a verdict can be: every status field, parameter and result of the plugin is one
Status: TypeAlias = Literal["pass", "warning", "error", "skip"]

#: severity used to combine verdicts: a structure is as bad as its worst leaf (the one
#: order of the plugin and of the standalone scripts, which embed this module)
STATUS_ORDER: Final[dict[Status, int]] = {"skip": 0, "pass": 1, "warning": 2, "error": 3}


#: message() levels, as pytest's verbosity: what failed (default), every metric with its
#: threshold (-v), and the sign tests' sums as well (-vv: everything the files hold)
DETAIL_FAILED, DETAIL_METRICS, DETAIL_ALL = 0, 1, 2


class Reason(str):
    """Why a verdict fails, as text, carrying the limit of each metric the text judges
    (`{metric: limit}`): the standard that writes the text knows which comparison
    failed, so no reader parses it back."""

    limits: dict[str, float]

    def __new__(cls, text: str, limits: Mapping[str, float] | None = None) -> Reason:
        reason = super().__new__(cls, text)
        reason.limits = dict(limits or {})
        return reason

    def __reduce__(self) -> tuple[type[Reason], tuple[str, dict[str, float]]]:
        return Reason, (str(self), self.limits)


def failed_limits(reasons: Iterable[str]) -> dict[str, float]:
    """The metrics the reasons name as failed, each with the limit it crossed (first
    reason first); a plain-str reason names none."""
    return {key: limit for reason in reasons for key, limit in getattr(reason, "limits", {}).items()}


def is_sign_sum(key: str) -> bool:
    """A sum the sign tests are computed from (counts and mean squares, bias.py): shown
    only with everything (-vv), as the z and the mean they make say what they mean."""
    key = key.removeprefix("ref_")
    return key in ("bias_n", "bias_ulp_ms") or "_signs" in key


class Offender(NamedTuple):
    """One badly matching element: its index in the output, device and bench values."""

    # the element's index: a field named as msprobe names it, which shadows tuple.index
    index: tuple[int, ...]  # type: ignore[assignment]
    device: float
    bench: float


def worst_status(statuses: Iterable[Status]) -> Status:
    """error > warning > pass > skip; no statuses (or all skip) -> skip."""
    worst: Status = "skip"
    for status in statuses:
        if STATUS_ORDER[status] > STATUS_ORDER[worst]:
            worst = status
    return worst


@dataclass(frozen=True)
class Verdict:
    """How one output (or a structure of outputs) compares with its bench."""

    status: Status
    standard: str
    metrics: dict[str, float] = field(default_factory=dict)
    thresholds: dict[str, float] = field(default_factory=dict)
    reasons: tuple[str, ...] = ()
    worst: tuple[Offender, ...] = ()  # Offenders, for a verdict that is not a pass: only failures show them
    reference: str = "single-run"
    path: str = ""
    device_dtype: str = ""
    bench_dtype: str = ""
    shape: tuple[int, ...] = ()
    outputs: tuple[Verdict, ...] = ()
    #: the metrics the reasons name as failed, each with the limit it crossed (from the
    #: reasons' `Reason.limits` where not given)
    failed: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.failed and self.reasons:
            object.__setattr__(self, "failed", failed_limits(self.reasons))

    @property
    def passed(self) -> bool:
        """True for pass and warning (a warning is not a failure unless the user is strict)."""
        return self.status in ("pass", "warning")

    def message(self, detail: int = DETAIL_FAILED) -> str:
        """The failure text: the output's standard, reasons and worst elements, with
        the metrics that failed against their limits (`detail` DETAIL_FAILED, pytest's
        default); every metric with its threshold from DETAIL_METRICS (-v); the sign
        tests' sums too from DETAIL_ALL (-vv)."""
        where = self.path or "output"
        lines = [
            f"{where}: {self.status} by {self.standard} standard "
            f"({self.reference}; device {self.device_dtype or '?'}, "
            f"bench {self.bench_dtype or '?'}, shape {tuple(self.shape)})"
        ]
        if self.outputs:  # a structure: its failing leaves carry the reasons and numbers
            if detail >= DETAIL_ALL:  # the leaves' reasons again, each prefixed with its path
                lines += [f"  reason: {reason}" for reason in self.reasons]
            for out in self.outputs:
                if out.status in ("error", "warning"):
                    lines.extend("  " + line for line in out.message(detail).splitlines())
            return "\n".join(lines)
        lines += [f"  reason: {reason}" for reason in self.reasons]
        lines += self._metric_lines(detail)
        if self.worst:
            lines.append("  worst elements (index: device vs bench):")
            lines += [f"    {list(off.index)}: {off.device!r} vs {off.bench!r}" for off in self.worst]
        return "\n".join(lines)

    def _metric_lines(self, detail: int) -> list[str]:
        if detail < DETAIL_METRICS:
            shown = {key: self.metrics[key] for key in self.failed if key in self.metrics}
            if not shown:
                return []
            return ["  failed metrics:"] + [
                f"    {key} = {value:.6g}  (limit {self.failed[key]:.6g})" for key, value in shown.items()
            ]
        lines = []
        for key, value in self.metrics.items():
            if detail < DETAIL_ALL and is_sign_sum(key):
                continue
            limit = self.failed.get(key, self.thresholds.get(key))
            mark = "  FAILED" if key in self.failed else ""
            suffix = f"  (threshold {limit:.6g})" if limit is not None else ""
            lines.append(f"  {key} = {value:.6g}{suffix}{mark}")
        extra = [k for k in self.thresholds if k not in self.metrics]
        if extra:
            lines.append("  thresholds: " + ", ".join(f"{k}={self.thresholds[k]:.6g}" for k in extra))
        if detail < DETAIL_ALL and any(is_sign_sum(key) for key in self.metrics):
            lines.append("  (the sign tests' sums: -vv)")
        return lines
