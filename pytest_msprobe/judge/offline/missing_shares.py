"""A gradient autograd summed over several calls, and how far a correct device's sum
may lie from the bench's where the dump does not hold a composite reader's share.

Offline, an input gradient recovered from the data flow (judge/offline/dumped_run.py) is the sum of
every reader's share, added by autograd in the dtype D in the order of the readers'
backwards. The bench and the reference add the same shares in the same order
(judge/offline/summed_gradients.py): the device's own where a reader's record holds it, so those
additions are the device's, bit for bit; else the reader rerun, its bench and reference
values standing in for the device's (that reader's kernel is judged in its own test).
A composite reader's share the device added differently: in pieces, one per edge of its
graph into the input (F.normalize's x / norm(x): the division's and the norm's;
judge/verdict/summed.py gradient_pieces), each rounded to D and added on its own, where the bench
adds one D value. On the float16 apizoo dump that alone put a correct qkv linear's input
gradient 2 ULPs off in 116 of 512 elements (ulp_err_proportion 0.109, 1.8x the
reference's); adding the CPU's own float16 pieces in their place reproduced the device's
sum bit for bit.

The allowance bounds what that other grouping may cost an element; the standards then
judge the device's and the reference's distance to the bench beyond it. It is the
standard bound of a float sum of k terms, (k - 1) u sum|terms| (Higham, Accuracy and
Stability of Numerical Algorithms, 2002, 4.2), in its running form u sum|partial sums|,
applied only where the two sums can differ:
- before the first composite share both sides add the same D values in the same order:
  no allowance (an element no composite share reaches gets none);
- at a composite share with q pieces (a rerun reader's, or the judged call's own where
  its own graph adds it in pieces: F.normalize judged through the sum), the device's sum
  of k = q + 1 terms (the partial sum S and the pieces p) costs q u (|S| + sum|p|), the
  pieces' rounding to D u sum|p|; the bench's addition of its share c (k = 2) costs
  u |S + c|, and c's rounding to D u |c|;
- after it the sums differ, but adding the same D value to both moves them by the same
  grid steps: rounding to nearest commutes with a shift by whole ULPs inside a binade.
  An addition can change the difference only by one ULP of its result, and only where
  the bench's rounding was a tie (ties go to even, and the shifted sum's parity
  differs), where the partial sum rose into a coarser binade, or where the two sides
  added different values (the judged call's own share).
The allowance therefore grows with the composite shares and the additions after them,
never with the sum's length before them, and is zero on every element no composite share
reaches. What a piece's kernel gets wrong beyond its rounding is that reader's own
test's business.

The rebuild itself is checked before anything is judged (rebuild_check): the sum holds
every reader's share only where every reader is in the dump, and msprobe does not record
every op (26.2 records no cast such as `.float()`, no slice or `repeat`, no unregistered
`F.rms_norm`). A reader it does not record added its share to the gradient the dump holds
and to no sum rebuilt here: on a bfloat16 model whose einsum input was also read by a
`.float()`, the einsum's correct backward was judged 23% mean relative error off with the
reference at 0 (tests/dumps/models/make_dumps.py's `shared` model); a slice read by `repeat` put a matmul's 49% of elements (its half of the
columns) up to 15,632 ULP off. So the reference's sum is compared with the dumped one,
element by element, within what two correct sums of the same shares may differ by, each
side's: the judged call's own share, a sum of K products (K and sum|terms| evaluated on
the bench: judge/verdict/terms.py), within K u sum|terms| of the exact value in any order and any
accumulator at least as wide as D (Higham's bound again, with the final rounding); each
rerun share's rounding to D, u |share|; each addition, u |partial sum|; and the composite
allowance above. Beyond that no correct kernel of the judged call that sums its K
products in D or wider explains the dumped sum: the call is not judged on that input,
and the message names the readers summed. A defect of the judged kernel within that
bound (an einsum's gradient 12.5% too large, of 16 terms: pytest_msprobe/testing/model_faults.py) is still
judged, and fails; one beyond it (a GEMM whose gradient is not a sum of its products) is
indistinguishable from a missing share here, and skips, named. Only calls whose
gradients are sums of products are checked (judge/verdict/terms.py term_counts: K is their count);
another API's share (normalize's) bounds nothing, and a fault there still fails.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from pytest_msprobe.dump.dataflow import Gather


class Kind(enum.Enum):
    OWN = "the judged call's"  # differs between the sides: the device's is what is judged
    RECORDED = "the device's own, from the reader's record"  # the same D value on every side
    RERUN = "not in the dump, rerun on the bench"  # the bench's and the reference's stand in for the device's


@dataclass
class Share:
    """One reader's gradient in the sum: where it lies in the producer's flat output, the
    values the bench and the reference add, and for a rerun share its pieces."""

    gather: Gather
    bench: torch.Tensor | None  # None: no gradient reached that reader
    reference: torch.Tensor | None
    kind: Kind
    # what the reader's graph added into the input, one per edge (judge/verdict/summed.py): several
    # make the share composite (RERUN or OWN)
    pieces: list[torch.Tensor] = field(default_factory=list)


@dataclass
class Summed:
    total: torch.Tensor  # flat, in D, over the producer's output
    allowance: torch.Tensor  # flat, float64: 0 where every addition is the device's own
    rounding: torch.Tensor  # flat, float64: u |partial sum| per addition, u |share| per rerun share


def accumulate_shares(shares: list[Share], numel: int, dtype: torch.dtype, side: str) -> Summed:
    """The shares of side `side` ("bench" or "reference") added in `dtype` in the order
    given, and each element's allowance (module docstring)."""
    total = torch.zeros(numel, dtype=dtype)
    allowance = torch.zeros(numel, dtype=torch.float64)
    rounding = torch.zeros(numel, dtype=torch.float64)
    reached = torch.zeros(numel, dtype=torch.bool)  # by any share: the next one is an addition
    started = torch.zeros(numel, dtype=torch.bool)
    unit = torch.finfo(dtype).eps / 2
    for share in shares:
        grad = share.bench if side == "bench" else share.reference
        if grad is None:
            continue  # no gradient reached that call: no share in the sum
        flat = np.ascontiguousarray(share.gather.reshape(-1))
        index = torch.from_numpy(flat)
        term = grad.reshape(-1).to(dtype)
        before = total.double()
        total.index_add_(0, index, term)
        after = total.double()
        touched = torch.zeros(numel, dtype=torch.bool)
        touched[index] = True
        rounding += unit * (torch.where(reached & touched, after.abs(), 0.0) + _rounded_share(share, index, numel))
        reached |= touched
        carried = started & touched
        composite = len(share.pieces) > 1
        if bool(carried.any()) and not composite:  # a composite share's local term bounds its additions
            step = ulp(after, dtype)
            # the same D value added once to each side (an element a gather reads twice
            # is added twice: the second addition's partial sums are not shifted alike)
            if share.kind is not Kind.OWN and np.unique(flat).size == flat.size:
                exact = before.index_add(0, index, term.double())
                tie = (exact - after).abs() == step / 2
                carried &= tie | (_exponent(after, dtype) > _exponent(before, dtype))
            allowance += torch.where(carried, step, 0.0)
        if composite:
            pieces = torch.zeros(numel, dtype=torch.float64)
            for piece in share.pieces:
                pieces.index_add_(0, index, piece.reshape(-1).double().abs())
            whole = torch.zeros(numel, dtype=torch.float64).index_add_(0, index, grad.reshape(-1).double().abs())
            local = unit * (len(share.pieces) * (before.abs() + pieces) + pieces + after.abs() + whole)
            allowance += torch.where(touched, local, 0.0)
            started |= touched
    return Summed(total, allowance, rounding)


def _rounded_share(share: Share, index: torch.Tensor, numel: int) -> torch.Tensor:
    """|share| where the share is rerun (its rounding to D is the bench's, not the
    device's); zero for the device's own recorded values."""
    magnitude = torch.zeros(numel, dtype=torch.float64)
    if share.kind is Kind.RERUN and share.bench is not None:
        magnitude.index_add_(0, index, share.bench.reshape(-1).double().abs())
    return magnitude


def rebuild_bound(
    rounding: torch.Tensor,
    allowance: torch.Tensor,
    own_counts: torch.Tensor,
    own_terms: torch.Tensor,
    dtype: torch.dtype,
) -> torch.Tensor:
    """How far the dumped sum may lie from the reference's where both sums hold the same
    shares (module docstring), over the judged call's elements: both sides' additions and
    rerun roundings, the composite allowance, and two correct kernels' own shares, each
    within K u sum|terms| of the exact one."""
    unit = torch.finfo(dtype).eps / 2
    return 2 * rounding + allowance + 2 * unit * own_counts.double().abs() * own_terms.double().abs()


def rebuild_check(dumped: torch.Tensor, rebuilt: torch.Tensor, bound: torch.Tensor) -> str | None:
    """None where the dumped sum is within `bound` of the rebuilt one everywhere; else
    how many elements lie beyond it and how far (the worst, in multiples of its bound)."""
    off = (dumped.double().reshape(-1) - rebuilt.double().reshape(-1)).abs()
    limit = bound.reshape(-1)
    beyond_bound = off > limit
    if not bool(beyond_bound.any()):
        return None
    worst = float((off[beyond_bound] / limit[beyond_bound].clamp_min(torch.finfo(torch.float64).tiny)).max())
    return f"{int(beyond_bound.sum())} of {off.numel()} elements beyond what two correct sums of the same shares may differ by (up to {worst:.3g}x it)"


def _exponent(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """frexp's exponent of |x| (floor(log2 |x|) + 1), at least the smallest normal's
    (the subnormals share its spacing)."""
    return torch.frexp(values.abs().clamp_min(torch.finfo(dtype).tiny))[1]


def ulp(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The spacing of D's values at each value."""
    return torch.finfo(dtype).eps * torch.pow(2.0, (_exponent(values, dtype) - 1).double())


def beyond(values: torch.Tensor, bench: torch.Tensor, allowance: torch.Tensor) -> torch.Tensor:
    """Each value moved toward the bench by its allowance, at most onto it: the error a
    standard then judges is the part beyond what the sum's other grouping may cost."""
    wide, centre = values.double(), bench.double()
    off = wide - centre
    kept = centre + off.sign() * (off.abs() - allowance.reshape(off.shape)).clamp_min(0.0)
    return kept.to(values.dtype)
