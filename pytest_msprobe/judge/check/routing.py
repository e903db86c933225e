"""Checks of a standards registry before any call is judged: every route leads to a
registered standard, every overridden threshold is one a standard reads, for a
floating dtype.

The registry itself accepts anything (a route is resolved, a threshold looked up, only
when a call is judged), so a typo in a --msprobe-standards file used to surface as a
traceback in every routed test, or not at all: a misspelt threshold name was simply
never read. Checked once at start-up, a problem is one message that names it.
"""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING

from pytest_msprobe.standards.dtypes import DTYPES
from pytest_msprobe.standards.registry import FALLBACK, SHIPPED_STANDARDS

if TYPE_CHECKING:
    from pytest_msprobe.standards import Registry

#: every threshold name a shipped standard reads (each floating dtype has all of them)
SHIPPED_THRESHOLDS = frozenset(name for info in DTYPES.values() for name in info.defaults)


def routing_problems(registry: Registry) -> list[str]:
    """What in the registry's routes and threshold overrides cannot work, one line each.

    A threshold of an API routed to a standard registered by a conftest.py may have any
    name (that standard reads its own); one of an API judged by a shipped standard must
    be a shipped threshold's name."""
    problems = []
    for api, standard in sorted(registry.routes.items()):
        if standard not in registry.standards:
            problems.append(
                f"API {api!r} is routed to standard {standard!r}, which is not registered "
                f"(registered: {', '.join(sorted(registry.standards))})"
            )
    for (api, dtype), thresholds in sorted(registry.overrides.items()):
        if dtype != "*" and dtype not in DTYPES:
            problems.append(
                f"threshold of {api!r} for dtype {dtype!r}: not a floating dtype (use one of {', '.join(sorted(DTYPES))}, or * for all)"
            )
        if registry.routes.get(api, FALLBACK) not in SHIPPED_STANDARDS:
            continue
        for name in sorted(set(thresholds) - SHIPPED_THRESHOLDS):
            close = difflib.get_close_matches(name, SHIPPED_THRESHOLDS, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"known: {', '.join(sorted(SHIPPED_THRESHOLDS))}"
            problems.append(f"threshold {name!r} of {api!r} is read by no standard ({hint})")
    return problems
