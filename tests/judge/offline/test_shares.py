"""The allowance of a summed gradient for shares the dump does not hold (judge/offline/missing_shares.py):
a bound a correct device's other grouping stays within, zero where no rerun share reaches."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pytest_msprobe.dump.values import TensorLeaf
from pytest_msprobe.judge.offline.missing_shares import Kind, Share, accumulate_shares, beyond
from pytest_msprobe.judge.verdict.summed import gradient_pieces
from pytest_msprobe.run.apis import Api
from pytest_msprobe.run.replay import RAISED, Inputs, Placement, Run


def _device_sum(shares: list[Share], numel: int, dtype: torch.dtype) -> torch.Tensor:
    """What autograd adds: a rerun share as its pieces, each rounded to D, one by one."""
    total = torch.zeros(numel, dtype=dtype)
    for share in shares:
        index = torch.from_numpy(np.ascontiguousarray(share.gather.reshape(-1)))
        for piece in share.pieces if share.kind is Kind.RERUN else [share.bench]:
            total.index_add_(0, index, piece.reshape(-1).to(dtype))
    return total


def _shares(generator: torch.Generator, numel: int, composites: int) -> list[Share]:
    """25 readers of a 4096-element output, shares of mixed scales and signs (they cancel);
    `composites` of them rerun, each two or three pieces that cancel against each other."""
    shares = []
    for reader in range(25):
        gather = np.arange(numel) if reader % 3 else np.arange(0, numel, 2)
        scale = 10.0 ** torch.randint(-3, 1, (1,), generator=generator).item()
        value = torch.randn(gather.size, generator=generator, dtype=torch.float64) * scale
        if reader < composites and reader % 3:
            spread = [
                torch.randn(gather.size, generator=generator, dtype=torch.float64) * scale
                for _ in range(1 + reader % 2)
            ]
            pieces = [*spread, value - sum(spread)]
            shares.append(Share(gather, value, value, Kind.RERUN, pieces))
        else:
            shares.append(Share(gather, value, value, Kind.RECORDED))
    order = torch.randperm(len(shares), generator=generator).tolist()
    return [shares[i] for i in order]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_the_device_s_other_grouping_stays_within_the_allowance(dtype: torch.dtype) -> None:
    """Sums of 25 shares, two of them composite, added as autograd adds them: the
    composite ones in pieces. Against the bench's sum (each share one D value) the
    device is off by up to several ULPs, never beyond the allowance; without the
    composites both sums are bit for bit the same and the allowance is zero."""
    generator = torch.Generator().manual_seed(29)
    numel, off, widest = 4096, 0, 0.0
    for _ in range(3):
        shares = _shares(generator, numel, composites=4)
        summed = accumulate_shares(shares, numel, dtype, "bench")
        distance = (_device_sum(shares, numel, dtype).double() - summed.total.double()).abs()
        assert bool((distance <= summed.allowance).all()), float((distance / summed.allowance).max())
        off += int((distance > 0).sum())
        widest = max(widest, float((distance / summed.allowance)[distance > 0].max()))
    assert off > 1000 and widest > 0.1  # the groupings do differ, and the allowance is not loose everywhere
    plain = _shares(generator, numel, composites=0)
    summed = accumulate_shares(plain, numel, dtype, "bench")
    assert torch.equal(_device_sum(plain, numel, dtype), summed.total) and not bool(summed.allowance.any())


def test_only_the_elements_a_rerun_share_reaches_get_an_allowance() -> None:
    numel = 8
    first = Share(np.arange(numel), torch.ones(numel), torch.ones(numel), Kind.RECORDED)
    rerun = Share(
        np.arange(2, 4),
        torch.full((2,), 0.3),
        torch.full((2,), 0.3),
        Kind.RERUN,
        [torch.full((2,), 0.1), torch.full((2,), 0.2)],
    )
    own = Share(np.arange(numel), torch.full((numel,), 0.7), torch.full((numel,), 0.7), Kind.OWN)
    summed = accumulate_shares([first, rerun, own], numel, torch.float16, "bench")
    assert summed.allowance.nonzero().reshape(-1).tolist() == [2, 3]


def test_a_value_is_judged_beyond_its_allowance() -> None:
    bench = torch.tensor([1.0, 1.0, 1.0, 1.0], dtype=torch.float16)
    device = torch.tensor([1.0, 1.00390625, 0.9951171875, 1.0078125], dtype=torch.float16)
    # off by 0, 4, -10 and 8 ULPs; allowed 0, 4, 4 and 0 ULPs (2**-10 above 1, 2**-11 below)
    kept = beyond(device, bench, torch.tensor([0.0, 0.00390625, 0.001953125, 0.0], dtype=torch.float64))
    assert kept.tolist() == [1.0, 1.0, 0.9970703125, 1.0078125]


@pytest.mark.parametrize(
    ("function", "count"), [(lambda x, w: F.normalize(x, dim=1), 2), (lambda x, w: F.linear(x, w), 1)]
)
def test_a_composite_call_s_gradient_comes_in_pieces(function, count: int) -> None:
    """F.normalize's graph reaches x along the division and the norm: two pieces that sum
    to x's gradient; a linear's one."""
    x, w, g = (
        torch.randn(4, 8, dtype=torch.float16),
        torch.randn(8, 8, dtype=torch.float16),
        torch.randn(4, 8, dtype=torch.float16),
    )
    leaves = [TensorLeaf(f"input_args[{i}]", None, t, "test") for i, t in enumerate((x, w))]
    inputs = Inputs([x, w], {}, leaves, grads=[g])
    run = Run(
        Api("f", function, function, in_place=False, raise_bench=True),
        function,
        Placement(torch.device("cpu"), dict(RAISED)),
    )
    pieces = gradient_pieces(run, inputs, [True, False], 0)
    assert len(pieces) == count and all(piece.dtype == torch.float32 for piece in pieces)
    torch.testing.assert_close(sum(pieces), run.backward(inputs, [True, False])[0])
