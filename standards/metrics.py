"""Shared quantities of all standards, computed once per (bench, device) pair.

Why a `Pair` object: every standard, the legacy metrics and the single-run rule read the
same masks and errors (both_finite, abs_err, rel_err, ULP error, the bench rounded to D).
`Pair` computes each lazily, once, vectorised in float64, so judging an output costs a
few passes over memory whatever the number of metrics. `Pair` keeps the inputs as given
(torch or numpy, own dtype) and makes the float64 copies `d`/`b` only when read: the
shipped standards judge large all-finite outputs without them, in one fused chunked
pass (fast.py), and fall back to the quantities below otherwise.

Definitions follow the spec ("Shared quantities"):
  both_finite = isfinite(d) & isfinite(b as D);  inf_nan = ~both_finite
  abs_err = |d - b|;  rel_err = abs_err / (|b| + tiny)
  tiny = eps of the bench dtype (2**-52 float64, 2**-23 float32), 2**-8 if D is bfloat16
  small_mask = both_finite & |b| <= small(D);  normal_mask = both_finite & ~small_mask
Errors are computed on the both_finite elements only (arrays `df`, `bf`); the inf/nan
elements are judged by agreement (`inf_nan_disagree`): NaN==NaN agrees, infinities of
the same sign agree, and otherwise both values are clipped to D's finite range and agree
when their relative error is <= rtol.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Mapping
from functools import cached_property
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import torch

from .chunks import BIAS_CLIP
from .dtypes import Array, DtypeInfo
from .near_zero import left_out
from .verdict import Offender, Status, Verdict

if TYPE_CHECKING:
    from .pass_results import PassResult

__all__ = ["Pair", "round_to_dtype", "ulp_of", "sign_balance_z"]

_T = TypeVar("_T")


def round_to_dtype(values: Array, info: DtypeInfo) -> Array:
    """`values` (float64) rounded to nearest-even in D and returned as float64."""
    if info.name == "float64":
        return values
    if info.name == "float32":
        with np.errstate(over="ignore"):
            return values.astype(np.float32).astype(np.float64)
    if info.name == "float16":
        with np.errstate(over="ignore"):
            return values.astype(np.float16).astype(np.float64)
    rounded = torch.from_numpy(values).to(info.torch_dtype).to(torch.float64).numpy()
    if info.name.startswith("float8"):
        # fp8 formats without inf saturate to NaN in torch; overflow is what matters to us
        over = np.isnan(rounded) & ~np.isnan(values)
        if over.any():
            rounded = rounded.copy()
            rounded[over] = np.copysign(np.inf, values[over])
    return rounded


def ulp_of(abs_values: Array, info: DtypeInfo) -> Array:
    """ULP of D at each |value| (spec): 2**(max(floor(log2|x|), e_min) - m), e_min where x==0."""
    _, exp = np.frexp(abs_values)  # x = f * 2**exp, f in [0.5, 1): floor(log2 x) = exp-1
    exp = np.maximum(exp - 1, info.e_min)  # x == 0 gives exp 0 -> -1 -> e_min for every D
    exp[abs_values == 0] = info.e_min
    ulp: Array = np.ldexp(1.0, exp - info.mantissa_bits)
    return ulp


def _flat64(x: Array | torch.Tensor) -> Array:
    if isinstance(x, torch.Tensor):
        t = x.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        return t.to(torch.float64).contiguous().reshape(-1).numpy()
    return np.ascontiguousarray(x, dtype=np.float64).reshape(-1)


def sign_balance_z(positive: float, negative: float) -> float:
    """Sign-test z-score of an imbalance: |p - n| / sqrt(p + n); 0 when nothing differs."""
    total = positive + negative
    return abs(positive - negative) / math.sqrt(total) if total else 0.0


class Pair:
    """A bench and a device output, flattened to float64, with lazily shared quantities.

    `device` and `bench` are float64 arrays of the same shape (the device values are
    exact: every D converts to float64 without rounding). `info` describes D.
    User standards receive a Pair: read `d`, `b`, `df`, `bf`, `abs_err`, `rel_err` ... and
    build the result with `pair.verdict(...)`.
    """

    def __init__(  # noqa: PLR0913  the pair's tensors, dtypes and path, keyword-only
        self,
        bench: Array | torch.Tensor,
        device: Array | torch.Tensor,
        info: DtypeInfo,
        *,
        bench_dtype: str,
        device_dtype: str,
        path: str = "",
    ) -> None:
        # bench/device: numpy arrays or torch tensors in their own dtypes; the float64
        # copies `d` and `b` are made only when read (the fused path never reads them)
        self.shape: tuple[int, ...] = tuple(device.shape)  # numpy 2 types a shape as tuple[Any, ...]
        self.device_src = device
        self.bench_src = bench
        self.info = info
        self.bench_dtype = bench_dtype
        self.device_dtype = device_dtype
        self.path = path
        self.n = math.prod(self.shape)
        self.exact: tuple[Array, Array] | None = None  # raw integer/bool values
        self.want_legacy = False  # set by the registry: fuse legacy sums into the pass
        self.terms_src: Array | torch.Tensor | None = None  # set by the registry: each element's terms' magnitude
        self.groups_src: Array | torch.Tensor | None = None  # set by the registry: each element's group (bias.py)
        # set by the registry: whether a correct kernel rounds each element once (bias.far_metrics)
        self.rounded_once_src: Array | torch.Tensor | None = None
        # (small, small_atol): the elements near zero and their absolute tolerance (near_zero.py);
        # the registry sets the API's own where a threshold table overrides them
        self.near_zero_limits: tuple[float, float] = (info.defaults["small"], info.defaults["small_atol"])
        if info.name == "bfloat16":
            self.tiny = 2.0**-8
        else:
            self.tiny = 2.0**-52 if bench_dtype == "float64" else 2.0**-23
        # Any: each entry is typed by the accessor that reads it (memoise(), small_mask ...)
        self._cache: dict[Hashable, Any] = {}
        # what a fused pass (fast.py, scans.py) learnt, for the standards judging it next
        self.fused_nonfinite = False  # a pass met an inf/NaN (or a bench past D's range): judge the plain way
        self.fused_legacy: PassResult | None = None  # a pass that summed the legacy metrics too (legacy.py)
        self.bench_square_sum: float | None = None  # sum(b**2) in float64 (fast.bench_sumsq)
        self._all_finite_by_pass = False  # mark_all_finite
        self._sign_counts_by_pass: tuple[int, int] | None = None  # keep_sign_counts

    @cached_property
    def d(self) -> Array:
        """The device values as a flat float64 array (exact)."""
        return _flat64(self.device_src)

    @cached_property
    def b(self) -> Array:
        """The bench values as a flat float64 array."""
        return _flat64(self.bench_src)

    def mark_all_finite(self) -> None:
        """Record that every element is both_finite (established by a fused pass): the
        finite counts then need no float64 copies."""
        self._all_finite_by_pass = True

    def keep_sign_counts(self, up: int, down: int) -> None:
        """Record (#(d > b_D), #(d < b_D)) counted by a fused pass: the error balance
        (sign_counts) then needs no float64 copies."""
        self._sign_counts_by_pass = up, down

    # ----------------------------------------------------------------- building verdicts
    def verdict(  # noqa: PLR0913  one argument per field of the Verdict it builds
        self,
        status: Status,
        standard: str,
        metrics: dict[str, float],
        thresholds: Mapping[str, float],
        reasons: Iterable[str] = (),
        worst: Iterable[Offender] = (),
        reference: str = "single-run",
    ) -> Verdict:
        """A Verdict about this pair (fills path, dtypes and shape)."""
        return Verdict(
            status=status,
            standard=standard,
            metrics=metrics,
            thresholds=dict(thresholds),
            reasons=tuple(reasons),
            worst=tuple(worst),
            reference=reference,
            path=self.path,
            device_dtype=self.device_dtype,
            bench_dtype=self.bench_dtype,
            shape=self.shape,
        )

    def offenders(self, score: Array, *, on_finite: bool = True, k: int = 5) -> tuple[Offender, ...]:
        """The k elements with the largest `score` (> 0), nonfinite disagreements first."""
        picked: list[int] = [int(i) for i in self.inf_nan_disagree_index[:k]]
        if len(picked) < k and score.size:
            m = min(k, score.size)
            top = np.argpartition(score, -m)[-m:] if m < score.size else np.arange(score.size)
            top = top[np.argsort(-score[top], kind="stable")]
            top = top[score[top] > 0]
            if on_finite and self.finite_index is not None:
                top = self.finite_index[top]
            picked.extend(int(i) for i in top[: k - len(picked)])
        shape = self.shape or ()
        return tuple(
            Offender(
                tuple(int(x) for x in np.unravel_index(i, shape)) if shape else (), float(self.d[i]), float(self.b[i])
            )
            for i in picked
        )

    # ----------------------------------------------------------------- masks
    @cached_property
    def b_rounded(self) -> Array:
        """The bench rounded to D: the best answer any kernel in D can give."""
        return round_to_dtype(self.b, self.info)

    @cached_property
    def both_finite(self) -> Array:
        mask: Array = np.isfinite(self.d) & np.isfinite(self.b_rounded)
        return mask

    @cached_property
    def all_finite(self) -> bool:
        return self._all_finite_by_pass or bool(self.both_finite.all())

    @cached_property
    def finite_index(self) -> Array | None:
        """Flat indices of both_finite elements; None when all are (no copy needed)."""
        return None if self.all_finite else np.flatnonzero(self.both_finite)

    @cached_property
    def df(self) -> Array:
        return self.d if self.all_finite else self.d[self.both_finite]

    @cached_property
    def bf(self) -> Array:
        return self.b if self.all_finite else self.b[self.both_finite]

    @cached_property
    def bf_rounded(self) -> Array:
        return self.b_rounded if self.all_finite else self.b_rounded[self.both_finite]

    @cached_property
    def n_finite(self) -> int:
        return self.n if self.all_finite else int(self.df.size)

    @cached_property
    def n_inf_nan(self) -> int:
        return self.n - self.n_finite

    # ----------------------------------------------------------------- errors
    @cached_property
    def diff(self) -> Array:
        """Signed d - b over both_finite elements."""
        return self.df - self.bf

    @cached_property
    def abs_err(self) -> Array:
        return np.abs(self.diff)

    @cached_property
    def abs_b(self) -> Array:
        return np.abs(self.bf)

    @cached_property
    def rel_err(self) -> Array:
        rel: Array = self.abs_err / (self.abs_b + self.tiny)
        return rel

    @cached_property
    def terms(self) -> Array | None:
        """Per finite element, the magnitude of the terms that made it, or None.

        A correct kernel's error in an element is bounded by what it combined: the sum
        sum(x_k) of terms rounded in D is off by up to a few ULPs of sum(|x_k|), however
        far the sum cancels below that (a bias gradient of 1e-11 from terms of 1e-3). The
        caller measures it (the plugin evaluates a multilinear op on |inputs|); never
        below |b|, and NaN/inf terms count as |b|."""
        if self.terms_src is None:
            return None
        terms = np.abs(_flat64(self.terms_src))
        terms = terms if self.all_finite else terms[self.both_finite]
        return np.fmax(np.where(np.isfinite(terms), terms, 0.0), self.abs_b)

    @cached_property
    def groups(self) -> Array | None:
        """Per finite element, the id of the group that shares its rounded normaliser
        (bias.grouped_z), or None: every element a group of its own."""
        if self.groups_src is None:
            return None
        ids = np.asarray(
            self.groups_src.cpu() if hasattr(self.groups_src, "cpu") else self.groups_src, dtype=np.int64
        ).reshape(-1)
        return ids if self.all_finite else ids[self.both_finite]

    @cached_property
    def rounded_once(self) -> Array | None:
        """Per finite element, whether a correct kernel rounds it once (bias.far_metrics),
        or None: not known."""
        if self.rounded_once_src is None:
            return None
        src = self.rounded_once_src
        mask = np.asarray(src.cpu() if hasattr(src, "cpu") else src, dtype=bool).reshape(-1)
        return mask if self.all_finite else mask[self.both_finite]

    @cached_property
    def near_zero(self) -> Array:
        """Per finite element, whether the tests that count in ULPs of its own magnitude
        leave it out (near_zero.left_out)."""
        return left_out(self.abs_b, self.abs_err, BIAS_CLIP * self.info.eps, self.near_zero_limits)

    @cached_property
    def ulp(self) -> Array:
        """ULP of D at each finite bench value (spec's ULP definition)."""
        return ulp_of(self.abs_b, self.info)

    @cached_property
    def ulp_err(self) -> Array:
        return self.abs_err / self.ulp

    def small_mask(self, small: float) -> Array:
        """|b| <= small over the finite elements (cached per threshold)."""
        key = ("small", small)
        if key not in self._cache:
            self._cache[key] = self.abs_b <= small
        mask: Array = self._cache[key]
        return mask

    # ----------------------------------------------------------------- inf / nan
    def inf_nan_agree(self, rtol: float) -> Array:
        """For each inf_nan element: do d and b agree? (spec's agreement rule)."""
        key = ("agree", rtol)
        if key not in self._cache:
            if self.n_inf_nan == 0:
                self._cache[key] = np.zeros(0, dtype=bool)
            else:
                mask = ~self.both_finite
                d, b = self.d[mask], self.b[mask]
                dn, bn = np.isnan(d), np.isnan(b)
                lim = self.info.max_finite
                dc, bc = np.clip(d, -lim, lim), np.clip(b, -lim, lim)
                with np.errstate(invalid="ignore"):
                    close = np.abs(dc - bc) / (np.abs(bc) + self.tiny) <= rtol
                self._cache[key] = (dn & bn) | (~dn & ~bn & close)
        agree: Array = self._cache[key]
        return agree

    @cached_property
    def inf_nan_disagree_index(self) -> Array:
        """Flat indices of inf/nan elements that disagree at D's own rtol."""
        if self.n_inf_nan == 0:
            return np.zeros(0, dtype=np.int64)
        agree = self.inf_nan_agree(self.info.defaults["rtol"])
        return np.flatnonzero(~self.both_finite)[~agree]

    def inf_nan_error_ratio(self, rtol: float) -> float:
        if self.n_inf_nan == 0:
            return 0.0
        agree = self.inf_nan_agree(rtol)
        return float((~agree).sum() / agree.size)

    def unexpected_nonfinite_reason(self) -> str | None:
        """A reason when some inf/NaN of the device (or of the bench) is not matched."""
        bad = self.inf_nan_disagree_index
        if bad.size == 0:
            return None
        d = self.d[bad]
        n_dev = int((~np.isfinite(d)).sum())
        return (
            f"{bad.size} inf/NaN element(s) disagree with the bench "
            f"({n_dev} non-finite on the device, {bad.size - n_dev} on the bench side only)"
            f"; an unexpected NaN/inf is always an error"
        )

    # ----------------------------------------------------------------- cached scalars
    def memoise(self, key: Hashable, compute: Callable[[], _T]) -> _T:
        """Memoise a scalar metric shared between standards."""
        if key not in self._cache:
            self._cache[key] = compute()
        value: _T = self._cache[key]
        return value

    def error_balance(self) -> float:
        """eb = |#(d > b_D) - #(d < b_D)| / N over the both_finite elements."""

        def compute() -> float:
            if self.n_finite == 0:
                return 0.0
            pos, neg = self.sign_counts
            return abs(pos - neg) / self.n_finite

        return self.memoise("eb", compute)

    @cached_property
    def sign_counts(self) -> tuple[int, int]:
        """(#(d > b_D), #(d < b_D)) over the both_finite elements."""
        if self._sign_counts_by_pass is not None:
            return self._sign_counts_by_pass
        pos = int(np.count_nonzero(self.df > self.bf_rounded))
        neg = int(np.count_nonzero(self.df < self.bf_rounded))
        return pos, neg

    def rel_err_share_below(self, limit: float) -> float:
        """Share of ALL elements with rel_err < limit; agreeing inf/nan count as 0 error."""

        def compute() -> float:
            if self.n == 0:
                return 1.0
            good = int(np.count_nonzero(self.rel_err < limit))
            if self.n_inf_nan:
                good += int(self.inf_nan_agree(self.info.defaults["rtol"]).sum())
            return good / self.n

        return self.memoise(("share", limit), compute)
