"""What a fused pass learns about a pair (all finite, its sign counts, its legacy sums,
its bench's sum of squares) reaches the Pair through declared fields and methods: no
module but metrics.py reaches into a Pair's `_cache` or `__dict__`, where a cached
property could be shadowed behind its back."""

import ast
from pathlib import Path

import torch

from pytest_msprobe.standards.dtypes import dtype_info
from pytest_msprobe.standards.metrics import Pair

STANDARDS = Path(__file__).resolve().parents[2] / "standards"


def _private_reaches(source: str) -> list[str]:
    """Attribute reads and writes of `__dict__` or `_cache` on anything but `self`."""
    return sorted(
        f"line {node.lineno}: .{node.attr}"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Attribute)
        and node.attr in ("__dict__", "_cache")
        and not (isinstance(node.value, ast.Name) and node.value.id == "self")
    )


def test_no_module_reaches_into_a_pairs_internals():
    reaches = {
        path.name: _private_reaches(path.read_text("utf-8"))
        for path in sorted(STANDARDS.glob("*.py"))
        if path.name != "metrics.py"
    }
    assert {name: found for name, found in reaches.items() if found} == {}


def test_the_check_finds_a_planted_reach():
    assert _private_reaches('pair.__dict__.setdefault("sign_counts", (1, 2))\nx = pair._cache["k"]\n') == [
        "line 1: .__dict__",
        "line 2: ._cache",
    ]


def test_what_a_pass_recorded_spares_the_float64_copies():
    bench = torch.randn(1000, dtype=torch.float64)
    pair = Pair(bench, bench.to(torch.float32), dtype_info("float32"), bench_dtype="float64", device_dtype="float32")
    pair.mark_all_finite()
    pair.keep_sign_counts(3, 4)
    assert (pair.all_finite, pair.n_finite, pair.n_inf_nan, pair.finite_index) == (True, 1000, 0, None)
    assert pair.sign_counts == (3, 4)
    assert "d" not in vars(pair) and "b" not in vars(pair)  # neither float64 copy was made
