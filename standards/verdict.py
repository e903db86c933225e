"""The result of judging one output: Verdict and the offending elements it names.

A Verdict is plain data (frozen) so it can be pickled across xdist workers, written to
CSV rows and compared in tests; `message()` renders the failure text users read.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final, Literal, NamedTuple, TypeAlias

__all__ = ["Verdict", "Offender", "Status", "STATUS_ORDER", "worst_status"]

#: what a verdict can be: every status field, parameter and result of the plugin is one
Status: TypeAlias = Literal["pass", "warning", "error", "skip"]

#: severity used to combine verdicts: a structure is as bad as its worst leaf (the one
#: order of the plugin and of the standalone scripts, which embed this module)
STATUS_ORDER: Final[dict[Status, int]] = {"skip": 0, "pass": 1, "warning": 2, "error": 3}


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

    @property
    def passed(self) -> bool:
        """True for pass and warning (a warning is not a failure unless the user is strict)."""
        return self.status in ("pass", "warning")

    def message(self) -> str:
        """Readable multi-line text: standard, each metric vs threshold, reasons, worst elements."""
        where = self.path or "output"
        lines = [
            f"{where}: {self.status} by {self.standard} standard "
            f"({self.reference}; device {self.device_dtype or '?'}, "
            f"bench {self.bench_dtype or '?'}, shape {tuple(self.shape)})"
        ]
        for reason in self.reasons:
            lines.append(f"  reason: {reason}")
        if self.outputs:  # a structure: its leaves carry the numbers
            for out in self.outputs:
                if out.status in ("error", "warning"):
                    lines.append("")
                    lines.extend("  " + line for line in out.message().splitlines())
            return "\n".join(lines)
        for key, value in self.metrics.items():
            limit = self.thresholds.get(key)
            suffix = f"  (threshold {limit:.6g})" if limit is not None else ""
            lines.append(f"  {key} = {value:.6g}{suffix}")
        extra = [k for k in self.thresholds if k not in self.metrics]
        if extra:
            lines.append("  thresholds: " + ", ".join(f"{k}={self.thresholds[k]:.6g}" for k in extra))
        if self.worst:
            lines.append("  worst elements (index: device vs bench):")
            for off in self.worst:
                lines.append(f"    {list(off.index)}: {off.device!r} vs {off.bench!r}")
        return "\n".join(lines)
