"""Routing: which standard judges an API's output, with which thresholds.

Tables (CSV, shipped in standards/tables/, users add their own with `load_file`):
  api_standards.csv   `api,standard`                 API name -> standard name
  thresholds.csv      `api,dtype,threshold,value`    per-API, per-dtype threshold
                                                     (dtype "*" = every dtype)
  accuracy_model.csv, accuracy_classes.csv           the lean a correct library may
                      have (accuracy.py): `lib_bias_ulp` rows under thresholds.csv
A user file may hold either header, or all five columns `api,standard,dtype,threshold,
value` (a row routes when `standard` is filled and sets a threshold when `threshold` is).
Rules: bool/integer outputs -> binary_consistency always; an API not in the table ->
benchmark. Thresholds: dtype defaults (dtypes.py) < `*` rows < rows of the exact dtype,
later files overriding earlier ones.
"""

from __future__ import annotations

import copy
import csv
import dataclasses
import threading
from collections.abc import Callable, Mapping
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias, TypeGuard

import numpy as np

from .absolute_threshold import absolute_threshold
from .accumulative_error import accumulative_error
from .accuracy import allowances
from .benchmark import benchmark
from .binary_consistency import binary_consistency
from .dtypes import DtypeInfo, dtype_info, dtype_name, is_float_name
from .flush import judge_as_flushed
from .legacy import legacy, legacy_metrics
from .metrics import Pair
from .pairing import Leaf, Mismatch, pair_leaves
from .reference import Reference
from .thousandth import thousandth
from .ulp import ulp
from .verdict import Verdict, worst_status

if TYPE_CHECKING:
    import torch

    from .dtypes import Array, DtypeLike

#: a value per element of an output (terms, group ids, a mask), or None: not known
PerElement: TypeAlias = "Array | torch.Tensor | None"

__all__ = ["Registry", "StandardFunc"]

StandardFunc = Callable[[Pair, Mapping[str, float], "Reference | None"], Verdict]

SHIPPED_STANDARDS: dict[str, StandardFunc] = {
    "binary_consistency": binary_consistency,
    "absolute_threshold": absolute_threshold,
    "ulp": ulp,
    "thousandth": thousandth,
    "accumulative_error": accumulative_error,
    "benchmark": benchmark,
    "legacy": legacy,
}
FALLBACK = "benchmark"
_default_lock = threading.Lock()
_default: Registry | None = None


def _read_rows(path: str | Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8-sig") as fh:
        return [
            {(k or "").strip(): (v or "").strip() for k, v in row.items()}
            for row in csv.DictReader(fh)
            if any((v or "").strip() for v in row.values())
        ]


class Registry:
    """API -> standard routing, per-API per-dtype thresholds, and the standards themselves."""

    def __init__(self) -> None:
        self.standards: dict[str, StandardFunc] = dict(SHIPPED_STANDARDS)
        self.routes: dict[str, str] = {}
        self.overrides: dict[tuple[str, str], dict[str, float]] = {}
        self._threshold_cache: dict[tuple[str, str], dict[str, float]] = {}

    # ----------------------------------------------------------------- construction
    @classmethod
    def default(cls) -> Registry:
        """A fresh copy of the shipped tables (parsed once), safe for the caller to mutate.

        Returns
        -------
        Registry
            The shipped standards, routes and thresholds; changing it changes no other
            registry.
        """
        return copy.deepcopy(_load_shipped())

    def __deepcopy__(self, memo: dict[int, object]) -> Registry:
        new = Registry.__new__(Registry)
        new.standards = dict(self.standards)
        new.routes = dict(self.routes)
        new.overrides = {k: dict(v) for k, v in self.overrides.items()}
        new._threshold_cache = {}
        return new

    def load_file(self, path: str | Path) -> None:
        """Add a user's table: routing rows and/or threshold rows (see module docstring).

        Parameters
        ----------
        path
            A CSV file with the columns ``api`` and ``standard`` (a route), or ``api``,
            ``dtype`` (empty or ``*``: every dtype), ``threshold`` and ``value`` (a
            threshold), or both on one row.

        Raises
        ------
        OSError
            The file cannot be read.
        ValueError
            A row names no ``api``, or a threshold without its ``value`` (or a value
            that is not a number).
        """
        for row in _read_rows(path):
            api = row.get("api", "")
            if not api:
                raise ValueError(f"{path}: a row without an api: {row}")
            if row.get("standard"):
                self.set_api_standard(api, row["standard"])
            if row.get("threshold"):
                if not row.get("value"):
                    raise ValueError(f"{path}: threshold {row['threshold']!r} of {api} has no value")
                self.set_threshold(api, row.get("dtype") or "*", row["threshold"], float(row["value"]))

    # ----------------------------------------------------------------- mutation
    def register_standard(self, name: str, func: StandardFunc) -> None:
        """Add (or replace) a standard that APIs can be routed to.

        Parameters
        ----------
        name
            The standard's name, as routes and ``Verdict.standard`` name it.
        func
            ``func(pair, thresholds, reference) -> Verdict``: the output pair
            (metrics.Pair), the thresholds of its API and dtype (``thresholds_for``) and
            the reference to judge against (None: the single-run rule).

        Raises
        ------
        TypeError
            `func` is not callable.
        """
        if not callable(func):
            raise TypeError(f"standard {name!r} must be callable")
        self.standards[name] = func

    def set_api_standard(self, api: str, standard: str) -> None:
        """Route `api` to `standard` (which must be registered by the time it is used).

        Parameters
        ----------
        api
            The API name as dumps write it after their prefix (``"linear"`` for
            ``Functional.linear.0``).
        standard
            A registered standard's name (``"ulp"``, ``"absolute_threshold"``...).
        """
        self.routes[api] = standard

    def set_threshold(self, api: str, dtype: DtypeLike, name: str, value: float) -> None:
        """Override one threshold for `api` in `dtype`.

        Parameters
        ----------
        api
            The API whose threshold changes.
        dtype
            A torch or numpy dtype or its name; ``"*"`` for every dtype (an exact dtype's
            row wins over it).
        name
            The threshold's name, as reference/standards.md lists them
            (``"ulp_threshold"``, ``"small"``...).
        value
            Its new value.
        """
        key = (api, "*" if dtype == "*" else dtype_name(dtype))
        self.overrides.setdefault(key, {})[name] = float(value)
        self._threshold_cache.clear()

    # ----------------------------------------------------------------- lookup
    def standard_for(self, api: str, dtype: DtypeLike) -> str:
        """Name of the standard judging `api` outputs of `dtype`.

        Parameters
        ----------
        api
            The API name.
        dtype
            The device output's dtype (torch, numpy or a name).

        Returns
        -------
        str
            The routed standard; ``"binary_consistency"`` for integer and bool outputs,
            ``"benchmark"`` for an API no route names.
        """
        name = dtype_name(dtype)
        if not is_float_name(name):
            return "binary_consistency"
        return self.routes.get(api, FALLBACK)

    def thresholds_for(self, api: str, dtype: DtypeLike) -> dict[str, float]:
        """The thresholds `api` outputs of `dtype` are judged by.

        Parameters
        ----------
        api, dtype
            As :meth:`standard_for` takes them.

        Returns
        -------
        dict[str, float]
            The dtype's defaults overlaid with the table's ``*`` rows of `api`, then its
            exact-dtype rows (shared: copy it before changing it).
        """
        name = dtype_name(dtype)
        key = (api, name)
        cached = self._threshold_cache.get(key)
        if cached is None:
            cached = dict(dtype_info(name).defaults) if is_float_name(name) else {}
            cached.update(self.overrides.get((api, "*"), {}))
            cached.update(self.overrides.get((api, name), {}))
            self._threshold_cache[key] = cached
        return cached

    # ----------------------------------------------------------------- judging
    def check(  # noqa: PLR0913  the public API's keyword-only options (api, reference, terms, groups, rounded_once)
        self,
        bench: object,
        device: object,
        *,
        api: str,
        reference: object = None,
        terms: object = None,
        groups: PerElement = None,
        rounded_once: PerElement = None,
    ) -> Verdict:
        """Judge a (possibly nested) device output against its bench by this registry's
        routes and thresholds.

        Parameters
        ----------
        bench, device, api, reference, terms, groups, rounded_once
            As :func:`pytest_msprobe.standards.check` takes them.

        Returns
        -------
        Verdict
            As :func:`pytest_msprobe.standards.check` returns it.

        Raises
        ------
        KeyError
            `api` is routed to a standard this registry lacks.
        """
        baseline, ref_leaves, ref_problem = _parse_reference(bench, reference)
        term_leaves = (
            {}
            if terms is None
            else {
                leaf.path: leaf.device
                for leaf in pair_leaves(bench, terms, any_precision=True)
                if isinstance(leaf, Leaf)
            }
        )
        verdicts = []
        for item in pair_leaves(bench, device):
            if isinstance(item, Mismatch):
                verdicts.append(
                    Verdict(
                        status=item.status,
                        standard="structure",
                        reasons=(item.reason,),
                        path=item.path,
                        device_dtype=item.device_dtype,
                        bench_dtype=item.bench_dtype,
                        shape=item.shape,
                    )
                )
                continue
            ref: Reference | Leaf | None = None
            if ref_problem is not None:
                verdicts.append(
                    Verdict(
                        status="error",
                        standard="structure",
                        reasons=(ref_problem,),
                        path=item.path,
                        reference="reference",
                        device_dtype=item.device_dtype,
                        bench_dtype=item.bench_dtype,
                        shape=tuple(item.device.shape),
                    )
                )
                continue
            if baseline is not None:
                if item.path in baseline:
                    ref = Reference("baseline", metrics=baseline[item.path])
            elif ref_leaves is not None:
                ref_leaf = ref_leaves.get(item.path)
                if ref_leaf is not None:
                    ref = ref_leaf
            facts = _ElementFacts(term_leaves.get(item.path), groups, rounded_once)
            verdicts.append(self._judge_leaf(item, api, ref, facts))
        if len(verdicts) == 1 and not verdicts[0].path:
            return verdicts[0]
        return _combine(verdicts)

    def _judge_leaf(self, leaf: Leaf, api: str, ref: Reference | Leaf | None, facts: _ElementFacts) -> Verdict:
        name = self.standard_for(api, leaf.device_dtype)
        func = self.standards.get(name)
        if func is None:
            raise KeyError(f"API {api!r} is routed to unknown standard {name!r}")
        floating = is_float_name(leaf.device_dtype)
        info = dtype_info(leaf.device_dtype if floating else "float64")
        pair = _make_pair(leaf, info)
        pair.want_legacy = floating  # lets a fused pass compute the legacy sums too
        thresholds = self.thresholds_for(api, leaf.device_dtype)
        if floating:
            pair.terms_src, pair.groups_src, pair.rounded_once_src = facts.of(tuple(leaf.device.shape))
            pair.near_zero_limits = thresholds["small"], thresholds["small_atol"]
        reference = None
        if isinstance(ref, Reference):
            reference = ref
        elif isinstance(ref, Leaf):
            if ref.device.shape != leaf.device.shape:
                return Verdict(
                    status="error",
                    standard=name,
                    path=leaf.path,
                    reasons=(
                        f"{leaf.path or 'output'}: reference shape "
                        f"{tuple(ref.device.shape)} differs from the device's "
                        f"{tuple(leaf.device.shape)}",
                    ),
                    reference="reference",
                    device_dtype=leaf.device_dtype,
                    bench_dtype=leaf.bench_dtype,
                    shape=tuple(leaf.device.shape),
                )
            ref_info = dtype_info(ref.device_dtype) if is_float_name(ref.device_dtype) else info
            reference_pair = _make_pair(
                Leaf(leaf.path, leaf.bench, ref.device, leaf.bench_dtype, ref.device_dtype), ref_info
            )
            reference_pair.terms_src = pair.terms_src
            reference_pair.groups_src = pair.groups_src
            reference = Reference("reference", pair=reference_pair)
        with np.errstate(all="ignore"):
            verdict = func(pair, thresholds, reference)
            if floating:
                verdict = judge_as_flushed(pair, verdict, lambda flushed: func(flushed, thresholds, reference))
            if floating and pair.n:
                extra = {k: v for k, v in legacy_metrics(pair).items() if k not in verdict.metrics}
                if extra:
                    verdict = dataclasses.replace(verdict, metrics={**verdict.metrics, **extra})
        return verdict


@dataclasses.dataclass(frozen=True)
class _ElementFacts:
    """What the caller knows of each element of an output (package docs: check's terms,
    groups and rounded_once), each applied where it has the output's shape."""

    terms: PerElement
    groups: PerElement
    rounded_once: PerElement

    def of(self, shape: tuple[int, ...]) -> tuple[PerElement, PerElement, PerElement]:
        """(terms, groups, rounded_once) for an output of `shape`: None where another shape."""
        return tuple(  # type: ignore[return-value]  # three facts in, three out
            fact if fact is not None and tuple(fact.shape) == shape else None
            for fact in (self.terms, self.groups, self.rounded_once)
        )


def _make_pair(leaf: Leaf, info: DtypeInfo) -> Pair:
    floating = is_float_name(leaf.device_dtype)
    if floating:
        pair = Pair(
            leaf.bench, leaf.device, info, bench_dtype=leaf.bench_dtype, device_dtype=leaf.device_dtype, path=leaf.path
        )
    else:
        assert isinstance(leaf.bench, np.ndarray) and isinstance(
            leaf.device, np.ndarray
        )  # integers and bools: numpy (to_array)
        pair = Pair(
            leaf.bench.astype(np.float64),
            leaf.device.astype(np.float64),
            info,
            bench_dtype=leaf.bench_dtype,
            device_dtype=leaf.device_dtype,
            path=leaf.path,
        )
        pair.exact = (leaf.bench, leaf.device)
    return pair


def _looks_like_baseline(reference: object) -> TypeGuard[Mapping[str, Mapping[str, float]]]:
    return (
        isinstance(reference, Mapping)
        and len(reference) > 0
        and all(
            isinstance(k, str)
            and isinstance(v, Mapping)
            and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v.values())
            for k, v in reference.items()
        )
    )


def _parse_reference(
    bench: object, reference: object
) -> tuple[dict[str, dict[str, float]] | None, dict[str, Leaf] | None, str | None]:
    """-> (baseline {path: metrics} | None, reference leaves {path: Leaf} | None, problem)."""
    if reference is None:
        return None, None, None
    if isinstance(reference, Verdict):
        verdicts = reference.outputs or (reference,)
        return {v.path: dict(v.metrics) for v in verdicts}, None, None
    if _looks_like_baseline(reference):
        return {k: dict(v) for k, v in reference.items()}, None, None
    leaves: dict[str, Leaf] = {}
    for item in pair_leaves(bench, reference):
        if isinstance(item, Mismatch):
            if item.status == "error":
                return None, None, "reference output does not match the bench: " + item.reason
            continue
        leaves[item.path] = item
    return None, leaves, None


def _combine(verdicts: list[Verdict]) -> Verdict:
    status = worst_status(v.status for v in verdicts)
    worst = next((v for v in verdicts if v.status == status), verdicts[0]) if verdicts else None
    if worst is None:
        return Verdict(status="skip", standard="structure", reasons=("empty structure",))
    reasons = tuple(
        r if r.startswith(v.path or "\0") else f"{v.path or 'output'}: {r}"
        for v in verdicts
        if v.status == status
        for r in v.reasons
    )
    return Verdict(
        status=status,
        standard=worst.standard,
        metrics=dict(worst.metrics),
        thresholds=dict(worst.thresholds),
        reasons=reasons,
        worst=worst.worst,
        reference=worst.reference,
        path="",
        device_dtype=worst.device_dtype,
        bench_dtype=worst.bench_dtype,
        shape=worst.shape,
        outputs=tuple(verdicts),
    )


def _load_shipped() -> Registry:
    global _default
    with _default_lock:
        if _default is None:
            reg = Registry()
            tables = resources.files(__package__) / "tables"
            with resources.as_file(tables / "api_standards.csv") as p:
                reg.load_file(p)
            for api, dtype, threshold, value in allowances():
                reg.set_threshold(api, dtype, threshold, value)
            with resources.as_file(tables / "thresholds.csv") as p:
                reg.load_file(p)
            _default = reg
        return _default


def shipped_registry() -> Registry:
    """The shared read-only default registry used by `check` (do not mutate)."""
    return _load_shipped()
