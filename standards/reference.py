"""What a device's errors are measured against, besides the bench.

A `Reference` is either another implementation's output on the same inputs (kind
"reference": its metrics are computed against the same bench) or the metrics recorded
by an earlier trusted run (kind "baseline"). Standards ask it for the reference value of
their metrics with `metrics_for(compute)`, where `compute(pair) -> dict` is the
standard's own metric function, so a reference is judged exactly like the device.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .metrics import Pair

__all__ = ["Reference"]


@dataclass
class Reference:
    kind: str  # "reference" | "baseline"
    pair: Pair | None = None  # reference output vs the same bench
    metrics: Mapping[str, float] | None = None  # recorded metrics (baseline)

    def metrics_for(self, compute: Callable[[Pair], dict[str, float]]) -> dict[str, float]:
        """The reference's values of the metrics `compute` produces for the device."""
        if self.pair is not None:
            return compute(self.pair)
        return {k: float(v) for k, v in (self.metrics or {}).items()}
