"""Kernel verdicts: the bias tests and error ratios of every call of one kernel, pooled.

A kernel (an API in one dtype and direction, in one dump) runs many times in a step: a
transformer's linear 49 times each way. Each call's sign test is judged alone, and a
call of a few hundred elements cannot make a rounding bias certain (z <= sqrt(n)),
though the step holds every call's evidence. The calls' sign tests are independent
(their elements, or their groups where judge/verdict/groups.py names them, never span two calls),
so their sums add: z = |sum S| / sqrt(sum S**2) over every call's groups is the same
cluster-robust test that one call applies to its groups (standards/bias.py), and the
pooled mean is the calls' signed ULP sums over their element counts. The kernel fails
by standards.signs.bias_reasons with the limits its calls used: the pooled mean beyond
the standard's ULP limit (beyond the reference run's pooled mean, offline) AND the
pooled z beyond sr_bias_z AND, in float32/float64, the pooled mean certainly beyond the
lean the accuracy model allows the API's class (`lib_bias_ulp`, standards/accuracy.py;
the calls' mean squares pooled like their means give its standard error). A correct kernel's mean stays within the limits each call
was calibrated on, so pooling adds certainty, never a looser or tighter size limit.

Only the sums the standards report (bias_n, *_signs, *_signs_sq: standards/bias.py
statistics) are pooled: every way of running that keeps the records (the xdist
controller, --msprobe-resume's journal, msprobe-merge's journals, offline, a baseline's
run) pools the same numbers. The sums are added in the order of the call names, so the
result does not depend on the order calls finished in.

Magnitude. A kernel can be right on average and still too inaccurate: a softmax that
keeps its sum in bfloat16 has no bias, but twice the error of a correct one in every
call, under the per-call limit (2x, which leaves room for one call's reduction-order
noise). Where the calls were compared with a reference run on their inputs (offline,
or an accelerator's CPU reference), each carries its mean error and the reference's
(`mean_rel_err`, `ref_mean_rel_err`: standards/benchmark.py). The calls are
independent, so their log ratios x_i are a sample: the kernel fails where their mean
is above log(RATIO_LIMIT) with certainty -- Student's t on the calls, one-sided, as
unlikely as the sign tests' z `sr_bias_z` under the normal law. RATIO_LIMIT is what
two correct kernel families were measured to differ by, pooled, with room
(studies/kernel-verdict-limits.md): CPU kernels dumped under
ATEN_CPU_CAPABILITY=default/2 threads and referenced by avx2 or default/1 thread
pool to 0.83-1.23x (a float32 softmax backward 1.23x, 12 calls), single calls up to
3.6x; the bfloat16-sum softmax pools to 1.99x. Only in bfloat16 and float16
(MAGNITUDE_DTYPES): there a correct CPU kernel computes in float32 and rounds once, and
correct pairs pool to 0.93-1.12x on every path measured (the shipped dumps' avx512
writer among them). In float32 two correct families differ by more than any fault this
rule is for: the shipped dumps' avx512 gelu has 0.27x this avx2 CPU's mean_rel_err in
each of 12 calls (sd of log r 0.04), so a dump written by the avx2 kernel and checked
on an avx512 CPU pools to 3.75x, certain -- a correct kernel that the rule would fail.
Without a reference run (single-run on the CPU) no call has a ratio: the kernel is
then judged by its bias tests alone.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from pytest_msprobe.dump.index import parse_call_name
from pytest_msprobe.judge.verdict.record import OutputResult, ResultRecord
from pytest_msprobe.standards.signs import LIB_BIAS_KEY, bias_reasons, signs_z
from pytest_msprobe.standards.verdict import Status

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
POOLED: tuple[Status, ...] = ("pass", "warning")
#: a call's mean error, whose ratio to the reference run's (`ref_` + it) is pooled
MAGNITUDE = "mean_rel_err"
RATIO = f"{MAGNITUDE}_ratio"
#: the pooled error ratio a kernel must certainly exceed to fail (module docstring)
RATIO_LIMIT = 1.5
#: the dtypes whose calls' error ratios are pooled (module docstring: not float32)
MAGNITUDE_DTYPES = frozenset({"bfloat16", "float16"})


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
    """One output of one call: the sums its bias test came from, and its mean error and
    the reference run's where it had one (the metrics it reported)."""

    call: str
    output: str
    status: Status
    sums: dict[str, float]
    limit: float
    z_limit: float
    reference: bool  # compared with a reference run (its ref_* sums are here too)
    allowance: float = 0.0  # the lean its API's class may have (standards/accuracy.py)

    def z(self, test: str) -> float:
        """This output's own z of the test, by groups where it has them, signed: its
        share of the pooled sum's direction."""
        total = self.sums[f"{test}_signs"]
        return math.copysign(signs_z(total, self.sums[f"{test}_signs_sq"]), total)

    @property
    def log_ratio(self) -> float | None:
        """log(its mean error / the reference run's): None without a reference run,
        or where either is exact (no ratio to take a log of)."""
        error, reference = self.sums.get(MAGNITUDE, 0.0), self.sums.get(f"ref_{MAGNITUDE}", 0.0)
        return math.log(error / reference) if error > 0 and reference > 0 else None

    def value(self, test: str) -> float:
        """What this output adds to the test: its signed z, or its log error ratio."""
        return (self.log_ratio or 0.0) if test == RATIO else self.z(test)


@dataclass(frozen=True)
class KernelVerdict:
    key: KernelKey
    status: Status  # pass | error
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
            f"{self.key.name}: {self.status} by the pooled tests of {len(calls)} calls "
            f"({len(self.evidence)} outputs; not pooled: {self.calls_failed} calls of the API in this direction that failed on their own)"
        ]
        lines += [f"  reason: {reason}" for reason in self.reasons]
        lines += [f"  {key} = {value:.6g}" for key, value in self.metrics.items()]
        lines.append("  thresholds: " + ", ".join(f"{key}={value:.6g}" for key, value in self.thresholds.items()))
        test = self.leading_test
        if test == RATIO:
            lines.append(f"  calls, most evidence first ({MAGNITUDE} of each over the reference run's):")
            lines += [f"    {item.call} {item.output}: {math.exp(item.value(test)):.3g}x" for item in self.evidence[:5]]
        else:
            lines.append(f"  calls, most evidence first ({test}_z of each alone, signed):")
            lines += [f"    {item.call} {item.output}: z {item.z(test):+.3g}" for item in self.evidence[:5]]
        return "\n".join(lines)

    @property
    def direction(self) -> float:
        """+1 or -1: the sign of the leading test's pooled sum of signs (a larger error
        ratio is always +1)."""
        if self.leading_test == RATIO:
            return 1.0
        return 1.0 if sum(item.sums[f"{self.leading_test}_signs"] for item in self.evidence) >= 0 else -1.0

    @property
    def leading_test(self) -> str:
        """The test the evidence is ordered by: the error ratio where only it failed,
        else the bias test whose pooled z is largest."""
        if self.reasons and all(reason.startswith(RATIO) for reason in self.reasons):
            return RATIO
        return max(TESTS, key=lambda test: self.metrics[f"{test}_z"])

    @property
    def pooled(self) -> float:
        """The leading test's pooled statistic, as each output's value reads: its z, or
        the log of the calls' geometric mean ratio."""
        test = self.leading_test
        return math.log(self.metrics[RATIO]) if test == RATIO else self.metrics[f"{test}_z"]


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
        allowance=output.thresholds.get(LIB_BIAS_KEY, 0.0),
    )


def _pool_bias(items: list[Evidence], prefix: str) -> dict[str, float]:
    """The bias metrics of the pooled sums, as one call's would read (standards/bias.py)."""
    total_n = sum(item.sums[f"{prefix}bias_n"] for item in items)
    metrics: dict[str, float] = {}
    grouped = any(f"{prefix}bias_signs_elements" in item.sums for item in items)
    for test in TESTS:
        signed = sum(item.sums[f"{prefix}{test}_ulp"] * item.sums[f"{prefix}bias_n"] for item in items)
        metrics[f"{prefix}{test}_ulp"] = signed / total_n if total_n else 0.0
        for suffix in ("", "_elements") if grouped else ("",):
            keys = [f"{prefix}{test}_signs{suffix}", f"{prefix}{test}_signs_sq{suffix}"]
            total, spread = (
                sum(item.sums.get(key, item.sums[key.removesuffix(suffix)]) for item in items) for key in keys
            )
            metrics[f"{prefix}{test}_z{suffix}"] = signs_z(total, spread)
    squares = sum(item.sums.get(f"{prefix}bias_ulp_ms", 0.0) * item.sums[f"{prefix}bias_n"] for item in items)
    if all(f"{prefix}bias_ulp_ms" in item.sums for item in items):
        metrics[f"{prefix}bias_ulp_ms"] = squares / total_n if total_n else 0.0
    metrics[f"{prefix}bias_n"] = total_n
    return metrics


def judge_kernel(key: KernelKey, items: list[Evidence], failed_calls: int) -> KernelVerdict:
    """The pooled verdict of one kernel's evidence (module docstring)."""
    items = sorted(items, key=lambda item: (item.call, item.output))
    with_reference = all(item.reference for item in items)
    metrics = _pool_bias(items, "")
    reference = _pool_bias(items, "ref_") if with_reference else None
    limit, z_limit = max(item.limit for item in items), max(item.z_limit for item in items)
    allowance = max(item.allowance for item in items)
    reasons = bias_reasons(metrics, z_limit, limit, reference, allowance)
    magnitude = _pooled_ratio(items) if key.dtype in MAGNITUDE_DTYPES else {}
    if magnitude:
        reasons += ratio_reasons(magnitude, z_limit)
    verdict = KernelVerdict(
        key,
        "error" if reasons else "pass",
        {**metrics, **(reference or {}), **magnitude, "calls": float(len({item.call for item in items}))},
        {
            ("ref_bias_ulp" if with_reference else "bias_ulp"): limit,
            "sr_bias_z": z_limit,
            **({LIB_BIAS_KEY: allowance} if allowance else {}),
            **({RATIO: RATIO_LIMIT} if magnitude else {}),
        },
        reasons,
        items,
        failed_calls,
    )
    test, direction = verdict.leading_test, verdict.direction
    ranked = sorted(items, key=lambda item: -direction * item.value(test))
    return KernelVerdict(**{**vars(verdict), "evidence": ranked})


def _pooled_ratio(items: list[Evidence]) -> dict[str, float]:
    """The calls' error ratios to the reference run, pooled (module docstring): their
    geometric mean, the one-sided p of Student's t of the mean log ratio against
    log(RATIO_LIMIT), and the share of calls over the limit. Empty with fewer than
    MIN_CALLS calls with a ratio. A call's outputs share its inputs: a call's log ratio
    is their mean."""
    logs = list(call_log_ratios(items).values())
    if len(logs) < MIN_CALLS:
        return {}
    mean = sum(logs) / len(logs)
    spread = math.sqrt(sum((value - mean) ** 2 for value in logs) / (len(logs) - 1) / len(logs))
    excess = mean - math.log(RATIO_LIMIT)
    # calls that agree exactly (spread 0) are certain either way, or exactly at the limit
    t = excess / spread if spread else math.copysign(math.inf, excess) if excess else 0.0
    return {
        RATIO: math.exp(mean),
        f"{RATIO}_p": t_tail(t, len(logs) - 1),
        f"{RATIO}_over": sum(value > math.log(RATIO_LIMIT) for value in logs) / len(logs),
        f"{RATIO}_calls": float(len(logs)),
    }


def call_log_ratios(items: Iterable[Evidence]) -> dict[str, float]:
    """Each call's log error ratio to the reference run: its outputs' mean (they share
    its inputs); calls without one are left out."""
    by_call: dict[str, list[float]] = {}
    for item in items:
        if item.log_ratio is not None:
            by_call.setdefault(item.call, []).append(item.log_ratio)
    return {call: sum(values) / len(values) for call, values in by_call.items()}


def ratio_reasons(magnitude: dict[str, float], z_limit: float) -> list[str]:
    """The pooled error ratio's reason to fail: certainly above RATIO_LIMIT, i.e. its
    one-sided p below the normal tail at z_limit."""
    p, p_limit, calls = (
        magnitude[f"{RATIO}_p"],
        0.5 * math.erfc(z_limit / math.sqrt(2)),
        int(magnitude[f"{RATIO}_calls"]),
    )
    if p >= p_limit:
        return []
    return [
        f"{RATIO} {magnitude[RATIO]:.3g}: the calls' {MAGNITUDE} is {magnitude[RATIO]:.3g}x the reference run's "
        f"(geometric mean of {calls} calls, {magnitude[f'{RATIO}_over']:.0%} of them over {RATIO_LIMIT:g}x), "
        f"certainly over {RATIO_LIMIT:g}x: one-sided p {p:.2g} by Student's t on {calls - 1} degrees of freedom < {p_limit:.2g} (z {z_limit:g})"
    ]


def t_tail(t: float, df: int) -> float:
    """P(T > t) for Student's t with an integer df >= 1, from the closed forms of its
    distribution (Abramowitz & Stegun 26.7.3, 26.7.4): no scipy in the xdist controller."""
    if math.isinf(t):
        return 0.0 if t > 0 else 1.0
    theta = math.atan(t / math.sqrt(df))
    cos2 = math.cos(theta) ** 2
    # the series sum_k c_k cos^{2k}(theta), c_0 = 1, c_k = c_{k-1} (2k - 1 + odd) / (2k + odd)
    odd = df % 2
    term, series = 1.0, 1.0
    for k in range(1, (df - 1) // 2 if odd else df // 2):
        term *= cos2 * (2 * k - 1 + odd) / (2 * k + odd)
        series += term
    if odd:
        inside = (2 * theta + (2 * math.sin(theta) * math.cos(theta) * series if df > 1 else 0.0)) / math.pi
    else:
        inside = math.sin(theta) * series
    return (1.0 - inside) / 2


@dataclass
class KernelPool:
    """The evidence of a run's calls as they arrive, judged at the end."""

    evidence: dict[KernelKey, dict[tuple[str, str], Evidence]] = field(default_factory=dict)
    failed: dict[tuple[str, str, str], set[str]] = field(default_factory=dict)  # (dump, api, direction) -> calls

    def add(self, record: ResultRecord) -> None:
        name = parse_call_name(record.call)
        if name is not None and record.status == "error":
            self.failed.setdefault((record.dump, f"{name.api_type}.{name.api_name}", name.direction), set()).add(
                record.call
            )
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
