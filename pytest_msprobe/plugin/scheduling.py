"""The order calls run in and the share of them a run takes.

Order: dump calls differ in cost by orders of magnitude; a heavy call started last
leaves every other device idle while it runs. So under xdist the heaviest calls (by
the element count of their tensors, from the index) go first. xdist's `load` mode
hands tests out from the front, so a heavy-first list is all it needs; `worksteal`
first splits the list into one contiguous block per worker (then steals from the
tails), so there the list is laid out as blocks of equal weight, each heavy-first.

Share: --msprobe-shard=I/N keeps the calls whose name hashes to I, so that N hosts or
CI jobs with the same arguments run disjoint sets that together cover the dump, and
msprobe-merge joins their results.
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Sequence
from typing import Protocol, TypeVar

import pytest

# A call's fixed cost in elements (decode, device, bench and reference runs,
# comparison: about a millisecond), so that many small calls weigh something too.
CALL_OVERHEAD_ELEMENTS = 100_000


class Weighed(Protocol):
    """A scheduled item: a call with its elements (plugin/items.py's CallItem)."""

    @property
    def numel(self) -> int: ...


_W = TypeVar("_W", bound=Weighed)


def weight(item: Weighed) -> int:
    return item.numel + CALL_OVERHEAD_ELEMENTS


def heavy_first(items: Sequence[_W]) -> list[_W]:
    """Heaviest first; equal weights keep the dump's order."""
    return [item for _, item in _by_weight(items)]


def worksteal_blocks(items: Sequence[_W], workers: int) -> list[_W]:
    """One block per worker, of the sizes xdist's worksteal gives them (len // workers
    for the first, the remainder spread over the last), filled greedily heaviest call
    to lightest block; each block heavy-first, so what is stolen from its tail is light."""
    sizes, left = [], len(items)
    for remaining in range(max(workers, 1), 0, -1):
        sizes.append(left // remaining)
        left -= sizes[-1]
    blocks: list[list[_W]] = [[] for _ in sizes]
    open_blocks = [(0, block) for block, size in enumerate(sizes) if size]
    heapq.heapify(open_blocks)
    for cost, item in _by_weight(items):
        load, block = heapq.heappop(open_blocks)
        blocks[block].append(item)
        if len(blocks[block]) < sizes[block]:
            heapq.heappush(open_blocks, (load + cost, block))
    return [item for block in blocks for item in block]


def _by_weight(items: Sequence[_W]) -> list[tuple[int, _W]]:
    weighted = [(weight(item), item) for item in items]
    weighted.sort(key=lambda pair: -pair[0])  # stable: equal weights keep the dump's order
    return weighted


def parse_shard(raw: str | None) -> tuple[int, int] | None:
    """`I/N` (1 <= I <= N) -> (I, N); None when not sharding."""
    if not raw:
        return None
    try:
        part, total = (int(number) for number in str(raw).split("/"))
    except ValueError:
        raise pytest.UsageError(f"--msprobe-shard {raw!r}: expected I/N, e.g. 1/4 ... 4/4") from None
    if total < 1 or not 1 <= part <= total:
        raise pytest.UsageError(
            f"--msprobe-shard {raw!r}: I must be between 1 and N, e.g. 1/{max(total, 1)} ... {max(total, 1)}/{max(total, 1)}"
        )
    return part, total


def shard_of(call_name: str, total: int) -> int:
    """1..total from the call's name only (not its path): hosts that keep the dump in
    different folders still agree; every rank's copy of a call lands in one shard."""
    return int.from_bytes(hashlib.blake2b(call_name.encode("utf-8"), digest_size=8).digest(), "big") % total + 1
