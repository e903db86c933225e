"""Kernel verdicts: the bias tests of every call of one kernel, pooled.

A kernel (an API in one dtype and direction, in one dump) runs many times in a step: a
transformer's linear 49 times each way. Each call's sign test is judged alone, and a
call of a few hundred elements cannot make a rounding bias certain (z <= sqrt(n)),
though the step holds every call's evidence. The calls' sign tests are independent
(their elements, or their groups where run/groups.py names them, never span two calls),
so their sums add: z = |sum S| / sqrt(sum S**2) over every call's groups is the same
cluster-robust test that one call applies to its groups (standards/bias.py), and the
pooled mean is the calls' signed ULP sums over their element counts. The kernel fails
by standards.signs.bias_reasons with the limits its calls used: the pooled mean beyond
the standard's ULP limit (beyond the reference run's pooled mean, offline) AND the
pooled z beyond sr_bias_z. A correct kernel's mean stays within the limits each call
was calibrated on, so pooling adds certainty, never a looser or tighter size limit.

Only the sums the standards report (bias_n, *_signs, *_signs_sq: standards/bias.py
statistics) are pooled: every way of running that keeps the records (the xdist
controller, --msprobe-resume's journal, msprobe-merge's journals, offline, a baseline's
run) pools the same numbers. The sums are added in the order of the call names, so the
result does not depend on the order calls finished in.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from pytest_msprobe.dump.index import parse_call_name
from pytest_msprobe.judge.record import OutputResult, ResultRecord
from pytest_msprobe.standards.signs import bias_reasons, signs_z

#: a kernel's name: `{api}.{dtype}.kernel.{direction}` (never a call name: no index)
KERNEL_MARK = "kernel"
#: the ULP limit a call's bias test used, by what it was compared with: a reference
#: run's (offline), the standard's own without one (standards/bias.py)
LIMIT_KEYS = ("ref_bias_ulp", "ulp_bias_ulp", "at_bias_ulp", "sr_bias_ulp")
TESTS = ("bias", "scale_bias")
#: a kernel verdict needs this many calls: one call's pooled test is its own
MIN_CALLS = 2
#: the calls a kernel pools: those that did not fail on their own. A failing call is
#: reported already; the kernel verdict says what only the calls together show.
POOLED = ("pass", "warning")


@dataclass(frozen=True, order=True)
class KernelKey:
    dump: str
    api: str  # `Functional.softmax`: the call name without index and direction
    dtype: str  # the device dtype of the pooled outputs
    direction: str

    @property
    def name(self) -> str:
        return f"{self.api}.{self.dtype}.{KERNEL_MARK}.{self.direction}"

    @property
    def row_name(self) -> str:
        """The result CSV's API name: both directions in one row, as for a call."""
        return f"{self.api}.{self.dtype}.{KERNEL_MARK}"


@dataclass(frozen=True)
class Evidence:
    """One output of one call: the sums its bias test came from."""

    call: str
    output: str
    status: str
    sums: dict[str, float]
    limit: float
    z_limit: float
    reference: bool  # compared with a reference run (its ref_* sums are here too)

    def z(self, test: str) -> float:
        """This output's own z of the test, by groups where it has them, signed: its
        share of the pooled sum's direction."""
        total = self.sums[f"{test}_signs"]
        return math.copysign(signs_z(total, self.sums[f"{test}_signs_sq"]), total)


@dataclass(frozen=True)
class KernelVerdict:
    key: KernelKey
    status: str  # pass | error
    metrics: dict[str, float]
    thresholds: dict[str, float]
    reasons: list[str]
    evidence: list[Evidence]  # the calls' outputs, most evidence for the verdict first
    calls_failed: int  # the API's calls in this direction that failed on their own: not pooled

    @property
    def calls(self) -> list[str]:
        return sorted({item.call for item in self.evidence})

    def message(self) -> str:
        """What the kernel's test says: the pooled numbers, the calls carrying them."""
        calls = self.calls
        lines = [
            f"{self.key.name}: {self.status} by the pooled bias tests of {len(calls)} calls "
            f"({len(self.evidence)} outputs; not pooled: {self.calls_failed} calls of the API in this direction that failed on their own)"
        ]
        lines += [f"  reason: {reason}" for reason in self.reasons]
        lines += [f"  {key} = {value:.6g}" for key, value in self.metrics.items()]
        lines.append("  thresholds: " + ", ".join(f"{key}={value:.6g}" for key, value in self.thresholds.items()))
        test = self.leading_test
        lines.append(f"  calls, most evidence first ({test}_z of each alone, signed):")
        lines += [f"    {item.call} {item.output}: z {item.z(test):+.3g}" for item in self.evidence[:5]]
        return "\n".join(lines)

    @property
    def direction(self) -> float:
        """+1 or -1: the sign of the leading test's pooled sum of signs."""
        return 1.0 if sum(item.sums[f"{self.leading_test}_signs"] for item in self.evidence) >= 0 else -1.0

    @property
    def leading_test(self) -> str:
        """The test whose pooled z is largest: the one the evidence is ordered by."""
        return max(TESTS, key=lambda test: self.metrics[f"{test}_z"])


def evidence_of(record: ResultRecord) -> list[tuple[KernelKey, Evidence]]:
    """The outputs of a judged call that carry a bias test's sums, by kernel."""
    name = parse_call_name(record.call)
    if name is None or record.status not in POOLED:
        return []
    api = f"{name.api_type}.{name.api_name}"
    return [
        (KernelKey(record.dump, api, output.device_dtype, name.direction), _evidence(record.call, output))
        for output in record.outputs
        if output.status in POOLED and "bias_signs" in output.metrics and _limit(output) is not None
    ]


def _limit(output: OutputResult) -> float | None:
    return next((output.thresholds[key] for key in LIMIT_KEYS if key in output.thresholds), None)


def _evidence(call: str, output: OutputResult) -> Evidence:
    reference = "ref_bias_signs" in output.metrics
    limit = _limit(output)
    assert limit is not None
    return Evidence(
        call=call,
        output=output.path or f"output {output.index}",
        status=output.status,
        sums=output.metrics,
        limit=limit,
        z_limit=output.thresholds.get("sr_bias_z", 0.0),
        reference=reference,
    )


def _pooled(items: list[Evidence], prefix: str) -> dict[str, float]:
    """The bias metrics of the pooled sums, as one call's would read (standards/bias.py)."""
    total_n = sum(item.sums[f"{prefix}bias_n"] for item in items)
    metrics: dict[str, float] = {}
    grouped = any(f"{prefix}bias_signs_elements" in item.sums for item in items)
    for test in TESTS:
        signed = sum(item.sums[f"{prefix}{test}_ulp"] * item.sums[f"{prefix}bias_n"] for item in items)
        metrics[f"{prefix}{test}_ulp"] = signed / total_n if total_n else 0.0
        for suffix in ("", "_elements") if grouped else ("",):
            keys = [f"{prefix}{test}_signs{suffix}", f"{prefix}{test}_signs_sq{suffix}"]
            total, spread = (sum(item.sums.get(key, item.sums[key.removesuffix(suffix)]) for item in items) for key in keys)
            metrics[f"{prefix}{test}_z{suffix}"] = signs_z(total, spread)
    metrics[f"{prefix}bias_n"] = total_n
    return metrics


def judge_kernel(key: KernelKey, items: list[Evidence], failed_calls: int) -> KernelVerdict:
    """The pooled verdict of one kernel's evidence (module docstring)."""
    items = sorted(items, key=lambda item: (item.call, item.output))
    with_reference = all(item.reference for item in items)
    metrics = _pooled(items, "")
    reference = _pooled(items, "ref_") if with_reference else None
    limit, z_limit = max(item.limit for item in items), max(item.z_limit for item in items)
    reasons = bias_reasons(metrics, z_limit, limit, reference)
    verdict = KernelVerdict(
        key,
        "error" if reasons else "pass",
        {**metrics, **(reference or {}), "calls": float(len({item.call for item in items}))},
        {("ref_bias_ulp" if with_reference else "bias_ulp"): limit, "sr_bias_z": z_limit},
        reasons,
        items,
        failed_calls,
    )
    test, direction = verdict.leading_test, verdict.direction
    ranked = sorted(items, key=lambda item: -direction * item.z(test))
    return KernelVerdict(**{**vars(verdict), "evidence": ranked})


@dataclass
class KernelPool:
    """The evidence of a run's calls as they arrive, judged at the end."""

    evidence: dict[KernelKey, dict[tuple[str, str], Evidence]] = field(default_factory=dict)
    failed: dict[tuple[str, str, str], set[str]] = field(default_factory=dict)  # (dump, api, direction) -> calls

    def add(self, record: ResultRecord) -> None:
        name = parse_call_name(record.call)
        if name is not None and record.status == "error":
            self.failed.setdefault((record.dump, f"{name.api_type}.{name.api_name}", name.direction), set()).add(record.call)
        for key, item in evidence_of(record):
            self.evidence.setdefault(key, {})[item.call, item.output] = item

    def verdicts(self) -> list[KernelVerdict]:
        """Every kernel of at least MIN_CALLS pooled calls, in the order of their keys."""
        return [
            judge_kernel(key, list(items.values()), len(self.failed.get((key.dump, key.api, key.direction), ())))
            for key, items in sorted(self.evidence.items())
            if len({call for call, _ in items}) >= MIN_CALLS
        ]


def is_kernel(name: str) -> bool:
    """Whether a test's name is a kernel's (`{api}.{dtype}.kernel.{direction}`)."""
    parts = name.rsplit(".", 2)
    return len(parts) == 3 and parts[1] == KERNEL_MARK


def kernel_verdicts(records: Iterable[ResultRecord]) -> list[KernelVerdict]:
    pool = KernelPool()
    for record in records:
        pool.add(record)
    return pool.verdicts()
