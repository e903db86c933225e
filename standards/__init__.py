"""Precision standards of pytest-msprobe: metrics, verdicts and routing, no pytest inside.

    from pytest_msprobe.standards import check
    verdict = check(bench, device, api="linear")          # single-run rule
    verdict = check(bench, device, api="linear", reference=cpu_out)   # ratios to a reference
    assert verdict.status in ("pass", "warning"), verdict.message()

Where things are: one module per standard (binary_consistency, absolute_threshold, ulp,
thousandth, accumulative_error, benchmark, legacy), the rule used when no reference
exists in single_run, shared quantities in metrics, per-dtype constants in dtypes,
API routing and thresholds in registry + tables/*.csv, nested outputs in pairing, the
fused chunked pass that judges large outputs quickly in fast.py (its metrics one
accumulator each in accumulators, what a pass computes and a chunk's shared quantities
in pass_plan, its results in pass_results, the chunk loop and threads in chunks, the
one-standard passes in scans); the sign tests' pure arithmetic in signs.

The package's names are imported on first use: the numerics import torch, and a
process that only reads results (the xdist controller pooling kernel verdicts through
signs) must not pay for it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from .dtypes import Array
    from .metrics import Pair
    from .reference import Reference
    from .registry import Registry
    from .verdict import Offender, Status, Verdict

#: each exported name's module, imported when the name is first used
_LAZY = {
    "Pair": "metrics",
    "Reference": "reference",
    "Registry": "registry",
    "Offender": "verdict",
    "Status": "verdict",
    "Verdict": "verdict",
}

__all__ = ["check", "Verdict", "Status", "Registry", "Offender", "Pair", "Reference"]


def check(  # noqa: PLR0913  the public API's keyword-only options (api, reference, terms, groups, rounded_once)
    bench: object,
    device: object,
    *,
    api: str,
    reference: object = None,
    terms: object = None,
    groups: Array | torch.Tensor | None = None,
    rounded_once: Array | torch.Tensor | None = None,
) -> Verdict:
    """Judge `device` against its raised-precision `bench` by the standard routed for `api`.

    Parameters
    ----------
    bench
        The raised-precision result: torch tensors, numpy arrays, Python scalars, None,
        or nested tuples/lists/dicts of them.
    device
        The result under test, structured like `bench`; its leaves' dtypes choose the
        standard's thresholds.
    api
        The API that made them (``"linear"``, ``"Functional.linear"``...): the registry
        routes it to a standard (reference/standards.md lists the routes).
    reference
        None for the single-run rule; a structure like `device` holding another
        implementation's outputs on the same inputs (the standards then judge ratios to
        its errors); or the metrics of a trusted run (a Verdict, or
        ``{path: {metric: value}}``).
    terms
        None, or a structure like `bench` holding each element's conditioning: the
        magnitude of the terms that made it (for a sum, the sum of the terms' absolute
        values). Where an element cancels far below its terms, a correct kernel's error
        is bounded by the terms, not by the element: the standards then judge it at that
        scale (see metrics.Pair.terms).
    groups
        None, or an integer tensor or array of the shape of the outputs it applies to (an
        output of another shape is not grouped): the id of the group of elements that
        share one rounded quantity (a softmax row's sum, a batch_norm channel's
        statistics): the bias sign tests then count groups, not elements
        (bias.grouped_z).
    rounded_once
        None, or a boolean tensor or array of the shape of the outputs it applies to: the
        elements a correct kernel computes in float32 and rounds to a 16-bit D once.
        Their far-misrounding test (bias.far_metrics) then fails an output where 8 or
        more of them lie beyond half an ULP (plus 1/16) of the bench, one way.

    Returns
    -------
    Verdict
        ``status`` one of "pass", "warning", "error", "skip"; ``metrics`` and
        ``thresholds`` of the standard; one Verdict per leaf in ``outputs`` where the
        results are nested. Outputs whose structure, shape or dtype kind differ are an
        error verdict (standard "structure"), not an exception.

    Raises
    ------
    KeyError
        `api` is routed to a standard no one registered (``Registry.set_api_standard``
        names it, ``Registry.register_standard`` adds it).
    """
    from .registry import shipped_registry

    return shipped_registry().check(
        bench, device, api=api, reference=reference, terms=terms, groups=groups, rounded_once=rounded_once
    )


def __getattr__(name: str) -> object:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
