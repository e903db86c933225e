"""Heavy calls first, blocks of equal weight for worksteal, and shards that split a
dump into disjoint parts covering it."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from pytest_msprobe.plugin import scheduling


def fake_item(name: str, numel: int) -> SimpleNamespace:
    return SimpleNamespace(call=name, numel=numel)


def test_heavy_calls_go_first_and_ties_keep_the_dump_order() -> None:
    items = [fake_item(name, numel) for name, numel in [("a", 10), ("b", 10**7), ("c", 10), ("d", 10**6)]]
    assert [item.call for item in scheduling.heavy_first(items)] == ["b", "d", "a", "c"]


@pytest.mark.parametrize("workers", [2, 3, 8])
def test_worksteal_blocks_are_balanced_and_heavy_first(workers: int) -> None:
    rng = random.Random(workers)
    items = [fake_item(str(i), int(rng.paretovariate(1.2) * 1000)) for i in range(101)]
    laid_out = scheduling.worksteal_blocks(items, workers)
    assert sorted(item.call for item in laid_out) == sorted(item.call for item in items)
    blocks, start, left = [], 0, len(items)
    for remaining in range(workers, 0, -1):  # the sizes xdist's worksteal cuts the list into
        size = left // remaining
        blocks.append(laid_out[start : start + size])
        start, left = start + size, left - size
    weights = [sum(scheduling.weight(item) for item in block) for block in blocks]
    heaviest_call = max(scheduling.weight(item) for item in items)
    assert max(weights) - min(weights) <= heaviest_call
    for block in blocks:
        assert [scheduling.weight(item) for item in block] == sorted(
            (scheduling.weight(item) for item in block), reverse=True
        )


@pytest.mark.parametrize(("raw", "expected"), [("1/4", (1, 4)), ("4/4", (4, 4)), (None, None), ("", None)])
def test_shard_option(raw, expected) -> None:
    assert scheduling.parse_shard(raw) == expected


@pytest.mark.parametrize("raw", ["0/4", "5/4", "1/0", "half", "1/2/3"])
def test_bad_shards_say_what_is_expected(raw: str) -> None:
    with pytest.raises(pytest.UsageError, match="--msprobe-shard"):
        scheduling.parse_shard(raw)


def test_shards_are_disjoint_and_cover_the_dump(pytester: pytest.Pytester, make_dump) -> None:
    make_dump(pytester.path / "dump", 120)
    args = ("--msprobe-dump=dump", "--co", "-q", "-p", "no:cacheprovider")
    every = {line for line in pytester.runpytest(*args).stdout.lines if "::" in line}
    shards = []
    for part in (1, 2, 3):
        result = pytester.runpytest(*args, f"--msprobe-shard={part}/3")
        shards.append({line for line in result.stdout.lines if "::" in line})
        result.stdout.fnmatch_lines(
            [f"msprobe: shard {part}/3: deselected {120 - len(shards[-1])} calls of the other shards"]
        )
    assert len(every) == 120 and set().union(*shards) == every
    assert sum(len(shard) for shard in shards) == 120 and all(20 < len(shard) < 60 for shard in shards)
