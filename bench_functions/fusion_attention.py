"""CPU reference of ``torch_npu.npu_fusion_attention`` and ``npu_fusion_attention_grad``.

Sources: torch_npu's API page ``torch_npu.npu_fusion_attention`` (Ascend/op-plugin
docs/context), CANN's ``aclnnFlashAttentionScore`` page and its "sparseMode introduction"
(hicann/ops-transformer docs), and the ``npu_fusion_attention_grad`` schema in op-plugin.

The computation is exact attention, chunked over blocks of query rows so that no more than
``score_block_elements`` scores exist at once: for each block the full softmax over all
keys is computed (two passes over one row block, no online rescaling error), and the
backward recomputes each block from q, k, v (flash-attention style), so autograd keeps only
the inputs, never the Sq x Skv probability matrix. A (1, 32, 4096, 128) attention therefore
needs a few hundred MB, not the 4 GB of a float64 score matrix.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, cast

import torch

from ._common import Unsupported, compute_dtype

# How many attention scores one row block may hold (each block keeps ~4 tensors of this
# size alive: scores, probabilities, their gradient, a mask). 2**24 float64 = 128 MiB.
score_block_elements = 2**24

_LAYOUTS = ("BSH", "SBH", "BSND", "BNSD", "TND")
_INT_MAX = 2147483647


# --------------------------------------------------------------------------- masks


@dataclass
class _MaskRules:
    """Which (query i, key j) pairs are masked out, as a union of rules.

    Shapes are those of the grouped-query view (B, N2, G, Sq, Skv): ``given`` is a bool
    tensor broadcastable to it; bands and prefixes are generated per row block.
    """

    sq: int
    skv: int
    given: torch.Tensor | None = None  # (Bm, N2|1, G|1, Sq, Skv) bool
    bands: list[tuple[int, int, int]] = field(default_factory=list)  # (pre, next, offset)
    prefix_causal: tuple[torch.Tensor, int] | None = None  # (prefix per batch, offset)

    def add_band(self, pre: int, nxt: int, offset: int) -> None:
        """Keep only keys j with i + offset - pre <= j <= i + offset + next."""
        never_masks = offset - pre <= -(self.sq - 1) and offset + nxt >= self.skv - 1
        if not never_masks:
            self.bands.append((int(pre), int(nxt), int(offset)))

    def block(self, r0: int, r1: int, device: torch.device) -> torch.Tensor | None:
        """The mask of query rows [r0, r1) (True = masked out), or None if none is."""
        masked: torch.Tensor | None = None
        if self.given is not None:
            masked = self.given[..., r0:r1, :]
        if self.bands or self.prefix_causal is not None:
            i = torch.arange(r0, r1, device=device).unsqueeze(-1)
            j = torch.arange(self.skv, device=device).unsqueeze(0)
            for pre, nxt, offset in self.bands:
                band = (j > i + offset + nxt) | (j < i + offset - pre)
                masked = band if masked is None else masked | band
            if self.prefix_causal is not None:
                prefix, offset = self.prefix_causal
                rule = (j > i + offset) & (j >= prefix.to(device).view(-1, 1, 1, 1, 1))
                masked = rule if masked is None else masked | rule
        return masked


def _group_queries(t: torch.Tensor, n1: int, n2: int, what: str) -> torch.Tensor:
    """A (B|1, N1|1, S|1, Skv) tensor as (B|1, N2|1, G|1, S|1, Skv) for grouped queries."""
    if t.dim() != 4:
        raise ValueError(f"{what} must be 4-D here, got shape {tuple(t.shape)}")
    if t.shape[1] == 1:
        return t.unsqueeze(1)
    if t.shape[1] != n1:
        raise ValueError(f"{what} has {t.shape[1]} heads, expected 1 or {n1}")
    return t.reshape(t.shape[0], n2, n1 // n2, t.shape[2], t.shape[3])


def _check_4d(t: torch.Tensor, b: int, n1: int, rows: tuple[int, ...], skv: int, what: str) -> None:
    ok = t.dim() == 4 and t.shape[0] in (1, b) and t.shape[1] in (1, n1) and t.shape[2] in rows and t.shape[3] == skv
    if not ok:
        raise ValueError(f"{what} shape {tuple(t.shape)} does not fit B={b}, N={n1}, Sq in {rows}, Skv={skv}")


def _given_mask(atten_mask: torch.Tensor, b: int, n1: int, n2: int, sq: int, skv: int) -> torch.Tensor:
    mask = atten_mask.to(torch.bool) if atten_mask.dtype != torch.bool else atten_mask
    if mask.dim() == 2:
        mask = mask.view(1, 1, *mask.shape)
    _check_4d(mask, b, n1, (sq,), skv, "atten_mask")
    return _group_queries(mask, n1, n2, "atten_mask")


def _mask_rules(
    sparse_mode: int,
    atten_mask: torch.Tensor | None,
    pre: int,
    nxt: int,
    prefix: Sequence[int] | None,
    b: int,
    n1: int,
    n2: int,
    sq: int,
    skv: int,
    device: torch.device,
) -> _MaskRules | None:
    """The masking of one (non-varlen) attention, following the sparse_mode table."""
    if atten_mask is None:  # docs: no atten_mask -> sparse_mode/pre/next ignored, full compute
        return None
    rules = _MaskRules(sq, skv)
    right_down = skv - sq
    if sparse_mode == 0:
        rules.given = _given_mask(atten_mask, b, n1, n2, sq, skv)
        rules.add_band(pre, nxt, 0)
    elif sparse_mode in (1, 5):
        rules.given = _given_mask(atten_mask, b, n1, n2, sq, skv)
    elif sparse_mode == 2:
        rules.add_band(_INT_MAX, 0, 0)
    elif sparse_mode == 3:
        rules.add_band(_INT_MAX, 0, right_down)
    elif sparse_mode == 4:
        rules.add_band(pre, nxt, right_down)
    elif sparse_mode == 6:
        if prefix is None or len(prefix) < b:
            raise ValueError(f"sparse_mode=6 needs prefix with one N per batch (B={b}), got {prefix!r}")
        rules.prefix_causal = (torch.tensor([int(p) for p in prefix[:b]], device=device), right_down)
    elif sparse_mode in (7, 8):
        raise ValueError(f"sparse_mode={sparse_mode} is only defined for the varlen layout TND")
    else:
        raise ValueError(f"sparse_mode must be one of 0..8, got {sparse_mode}")
    return rules


# --------------------------------------------------------------------------- core


def _row_block(b: int, n1: int, sq: int, skv: int) -> int:
    return max(1, min(sq, score_block_elements // max(1, b * n1 * skv)))


def _scores(
    q: torch.Tensor,
    k: torch.Tensor,
    pse: torch.Tensor | None,
    r0: int,
    r1: int,
    scale: float,
    masked: torch.Tensor | None,
) -> torch.Tensor:
    """scale * (q k^T + pse) with masked entries at -inf, for query rows [r0, r1).

    Works in place on the fresh score block (never on autograd-tracked tensors: callers run
    inside the custom Function)."""
    s = torch.matmul(q[..., r0:r1, :], k.transpose(-1, -2))
    if pse is not None:
        s += pse if pse.shape[-2] == 1 else pse[..., r0:r1, :]
    s *= scale
    if masked is not None:
        s.masked_fill_(masked, float("-inf"))
    return s


def _softmax_stats(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(exp(s - row max), row max, row sum of exp(s - max)), overwriting ``s``; rows with
    no visible key give exp 0, max -inf and sum 0. Probabilities are exp / sum."""
    m = s.amax(dim=-1, keepdim=True)
    m_safe = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    e = s.sub_(m_safe).exp_()
    l = e.sum(dim=-1, keepdim=True)
    return e, m, l


def _safe(l: torch.Tensor) -> torch.Tensor:
    return torch.where(l > 0, l, torch.ones_like(l))


def _reduce_to(t: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Sum a broadcast gradient back to ``shape`` (same number of dims)."""
    dims = [d for d, (have, want) in enumerate(zip(t.shape, shape, strict=True)) if want == 1 and have != 1]
    return t.sum(dim=dims, keepdim=True) if dims else t


def _attention_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    pse: torch.Tensor | None,
    scale: float,
    rules: _MaskRules | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q (B,N2,G,Sq,D), k (B,N2,1,Skv,D), v (B,N2,1,Skv,Dv), pse (..,Sq|1,Skv) or None.
    Returns out (B,N2,G,Sq,Dv), row max and row sum (B,N2,G,Sq,1)."""
    b, n2, g, sq, _ = q.shape
    skv = k.shape[-2]
    step = _row_block(b, n2 * g, sq, skv)
    outs: list[torch.Tensor] = []
    maxes: list[torch.Tensor] = []
    sums: list[torch.Tensor] = []
    for r0 in range(0, sq, step):
        r1 = min(sq, r0 + step)
        masked = rules.block(r0, r1, q.device) if rules is not None else None
        e, m, l = _softmax_stats(_scores(q, k, pse, r0, r1, scale, masked))
        outs.append(torch.matmul(e, v) / _safe(l))  # normalise the small output, not e
        maxes.append(m)
        sums.append(l)
    return torch.cat(outs, dim=-2), torch.cat(maxes, dim=-2), torch.cat(sums, dim=-2)


def _attention_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    pse: torch.Tensor | None,
    dout: torch.Tensor,
    scale: float,
    rules: _MaskRules | None,
    need_pse_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Gradients of sum(dout * attention(q, k, v, pse)), recomputing each row block."""
    b, n2, g, sq, _ = q.shape
    skv = k.shape[-2]
    step = _row_block(b, n2 * g, sq, skv)
    dq_blocks: list[torch.Tensor] = []
    dpse_blocks: list[torch.Tensor] = []
    pse_grad = pse if need_pse_grad else None  # the pse whose gradient is asked for
    dk = torch.zeros_like(k)
    dv = torch.zeros_like(v)
    for r0 in range(0, sq, step):
        r1 = min(sq, r0 + step)
        masked = rules.block(r0, r1, q.device) if rules is not None else None
        p, _, l = _softmax_stats(_scores(q, k, pse, r0, r1, scale, masked))
        p /= _safe(l)
        do = dout[..., r0:r1, :]
        dp = torch.matmul(do, v.transpose(-1, -2))
        row = (p * dp).sum(dim=-1, keepdim=True)
        ds = dp.sub_(row).mul_(p)  # d loss / d (scaled scores) = P * (dP - rowsum(P * dP))
        dq_blocks.append(torch.matmul(ds, k) * scale)
        dk += (torch.matmul(ds.transpose(-1, -2), q[..., r0:r1, :]) * scale).sum(dim=2, keepdim=True)
        dv += torch.matmul(p.transpose(-1, -2), do).sum(dim=2, keepdim=True)
        if pse_grad is not None:  # d (scale * (qk + pse)) / d pse = scale, summed over broadcast dims
            d = _reduce_to(ds * scale, pse_grad.shape[:-2] + ds.shape[-2:])
            dpse_blocks.append(d.sum(dim=-2, keepdim=True) if pse_grad.shape[-2] == 1 else d)
    dpse: torch.Tensor | None = None
    if pse_grad is not None:  # sum() of one block or more: a tensor
        dpse = cast(torch.Tensor, sum(dpse_blocks)) if pse_grad.shape[-2] == 1 else torch.cat(dpse_blocks, dim=-2)
    return torch.cat(dq_blocks, dim=-2), dk, dv, dpse


class _AttentionContext(Protocol):
    """What _BlockedAttention's context holds: torch's FunctionCtx declares none of
    what autograd gives its backward (the saved tensors, which inputs need a gradient),
    and the constants are this function's own."""

    saved_tensors: tuple[torch.Tensor | None, ...]
    needs_input_grad: tuple[bool, ...]
    scale: float
    rules: _MaskRules | None

    def save_for_backward(self, *tensors: torch.Tensor | None) -> None: ...

    def mark_non_differentiable(self, *tensors: torch.Tensor) -> None: ...


class _BlockedAttention(torch.autograd.Function):
    """Exact attention whose backward recomputes row blocks instead of saving them."""

    @staticmethod
    def forward(
        ctx: _AttentionContext,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        pse: torch.Tensor | None,
        scale: float,
        rules: _MaskRules | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        out, m, l = _attention_forward(q, k, v, pse, scale, rules)
        ctx.save_for_backward(q, k, v, pse)
        ctx.scale, ctx.rules = scale, rules
        ctx.mark_non_differentiable(m, l)
        return out, m, l

    @staticmethod
    def backward(
        ctx: _AttentionContext, dout: torch.Tensor, _dm: torch.Tensor, _dl: torch.Tensor
    ) -> tuple[torch.Tensor | None, ...]:
        q, k, v, pse = ctx.saved_tensors
        assert q is not None and k is not None and v is not None  # saved as forward's tensors
        need_pse = pse is not None and ctx.needs_input_grad[3]
        dq, dk, dv, dpse = _attention_backward(q, k, v, pse, dout, ctx.scale, ctx.rules, need_pse)
        return dq, dk, dv, dpse, None, None


# --------------------------------------------------------------------------- layouts


@dataclass
class _Dims:
    b: int
    n1: int
    n2: int
    sq: int
    skv: int
    d: int
    dv: int


def _to_bnsd(x: torch.Tensor, layout: str, heads: int) -> torch.Tensor:
    if layout == "BNSD":
        return x
    if layout == "BSND":
        return x.transpose(1, 2)
    if layout == "BSH":
        return x.reshape(x.shape[0], x.shape[1], heads, -1).transpose(1, 2)
    if layout == "SBH":
        return x.reshape(x.shape[0], x.shape[1], heads, -1).permute(1, 2, 0, 3)
    raise AssertionError(layout)


def _from_bnsd(x: torch.Tensor, layout: str) -> torch.Tensor:
    b, n, s, d = x.shape
    if layout == "BNSD":
        return x.contiguous()
    if layout == "BSND":
        return x.transpose(1, 2).contiguous()
    if layout == "BSH":
        return x.transpose(1, 2).reshape(b, s, n * d)
    if layout == "SBH":
        return x.permute(2, 0, 1, 3).reshape(s, b, n * d)
    raise AssertionError(layout)


def _dims(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, head_num: int, layout: str) -> _Dims:
    if layout not in _LAYOUTS:
        raise ValueError(f"input_layout must be one of {_LAYOUTS}, got {layout!r}")
    want = 3 if layout in ("BSH", "SBH", "TND") else 4
    for name, t in (("query", query), ("key", key), ("value", value)):
        if t.dim() != want:
            raise ValueError(f"{name} must be {want}-D for input_layout {layout}, got shape {tuple(t.shape)}")
    b, n1, n2, sq, skv, d, dv = _LAYOUT_DIMS[layout](query, key, value, head_num)
    if n1 != head_num:
        raise ValueError(f"query has {n1} heads but head_num={head_num}")
    if n2 <= 0 or n1 % n2:
        raise ValueError(f"heads of query ({n1}) must be a multiple of heads of key/value ({n2})")
    if key.shape[-1] != d and layout not in ("BSH", "SBH"):
        raise ValueError(f"query and key head dims differ: {d} vs {key.shape[-1]}")
    return _Dims(b, n1, n2, sq, skv, d, dv)


def _hidden_dims(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, head_num: int, layout: str
) -> tuple[int, ...]:
    """(b, n1, n2, sq, skv, d, dv) of BSH/SBH, whose heads are folded into the hidden size."""
    (b, sq) = (query.shape[0], query.shape[1]) if layout == "BSH" else (query.shape[1], query.shape[0])
    skv = key.shape[1] if layout == "BSH" else key.shape[0]
    if head_num <= 0 or query.shape[2] % head_num:
        raise ValueError(f"hidden size {query.shape[2]} of query is not a multiple of head_num={head_num}")
    d = query.shape[2] // head_num
    if key.shape[2] % d:
        raise ValueError(f"hidden size {key.shape[2]} of key is not a multiple of head dim {d}")
    n1, n2 = head_num, key.shape[2] // d
    if value.shape[2] % n2:
        raise ValueError(f"hidden size {value.shape[2]} of value is not a multiple of N2={n2}")
    return b, n1, n2, sq, skv, d, value.shape[2] // n2


def _tnd_dims(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, head_num: int) -> tuple[int, ...]:
    return 0, query.shape[1], key.shape[1], query.shape[0], key.shape[0], query.shape[2], value.shape[2]


def _bnsd_dims(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, head_num: int) -> tuple[int, ...]:
    b, n1, sq, d = query.shape
    return b, n1, key.shape[1], sq, key.shape[2], d, value.shape[3]


def _bsnd_dims(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, head_num: int) -> tuple[int, ...]:
    b, sq, n1, d = query.shape
    return b, n1, key.shape[2], sq, key.shape[1], d, value.shape[3]


#: (b, n1, n2, sq, skv, d, dv) of each input_layout, from the shapes of query, key and value.
_LAYOUT_DIMS: dict[str, Callable[..., tuple[int, ...]]] = {
    "BSH": functools.partial(_hidden_dims, layout="BSH"),
    "SBH": functools.partial(_hidden_dims, layout="SBH"),
    "TND": _tnd_dims,
    "BNSD": _bnsd_dims,
    "BSND": _bsnd_dims,
}


def _check_common(
    keep_prob: float, padding_mask: torch.Tensor | None, sparse_mode: int, softmax_layout: str, layout: str
) -> None:
    if keep_prob != 1:
        raise Unsupported(
            f"npu_fusion_attention with keep_prob={keep_prob}: dropout draws its mask from the NPU's "
            "Philox stream (seed/offset), which a CPU reference cannot reproduce; only keep_prob=1.0 "
            "can be checked"
        )
    if padding_mask is not None:
        raise Unsupported("npu_fusion_attention: padding_mask is documented as not supported by the op")
    if not isinstance(sparse_mode, int) or not 0 <= sparse_mode <= 8:
        raise ValueError(f"sparse_mode must be an int in 0..8, got {sparse_mode!r}")
    if softmax_layout not in ("", "TND"):
        raise ValueError(f"softmax_layout must be '' or 'TND', got {softmax_layout!r}")
    if softmax_layout == "TND" and layout != "TND":
        raise ValueError("softmax_layout='TND' is only defined for input_layout='TND'")


def _pse5(pse: torch.Tensor | None, dims: _Dims, dtype: torch.dtype) -> torch.Tensor | None:
    if pse is None:
        return None
    if pse.dim() == 4 and pse.shape[2] == 1024 and dims.sq not in (1024, 1):
        raise Unsupported(
            "npu_fusion_attention: pse holds only the last 1024 rows (compressed ALiBi); the full "
            "position bias cannot be rebuilt from them without knowing the ALiBi slopes"
        )
    _check_4d(pse, dims.b, dims.n1, (1, dims.sq), dims.skv, "pse")
    return _group_queries(pse.to(dtype), dims.n1, dims.n2, "pse")


def _run(
    q4: torch.Tensor,
    k4: torch.Tensor,
    v4: torch.Tensor,
    dims: _Dims,
    pse5: torch.Tensor | None,
    scale: float,
    rules: _MaskRules | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Attention of BNSD tensors (already in compute dtype): out (B,N1,Sq,Dv), max, sum."""
    g = dims.n1 // dims.n2
    q5 = q4.reshape(q4.shape[0], dims.n2, g, q4.shape[2], q4.shape[3])
    # torch's Function.apply is unannotated
    blocked = _BlockedAttention.apply(  # type: ignore[no-untyped-call]
        q5, k4.unsqueeze(2), v4.unsqueeze(2), pse5, float(scale), rules
    )
    out, m, l = cast("tuple[torch.Tensor, torch.Tensor, torch.Tensor]", blocked)
    b, sq = q4.shape[0], q4.shape[2]
    return out.reshape(b, dims.n1, sq, -1), m.reshape(b, dims.n1, sq, 1), l.reshape(b, dims.n1, sq, 1)


def _varlen_segments(cumulative: Sequence[int] | None, total: int, what: str) -> list[tuple[int, int]]:
    """[(start, end)] per batch from cumulative lengths; trailing zeros (documented as
    "batches that take no part") end the list."""
    if cumulative is None:
        raise ValueError(f"input_layout TND needs {what} (cumulative sequence lengths)")
    segs: list[tuple[int, int]] = []
    start = 0
    for end in (int(c) for c in cumulative):
        if end == 0 and start > 0:
            break
        if end < start or end > total:
            raise ValueError(f"{what}={list(cumulative)} is not cumulative within T={total}")
        segs.append((start, end))
        start = end
    return segs


def _varlen_rules(
    sparse_mode: int,
    atten_mask: torch.Tensor | None,
    pre: int,
    nxt: int,
    prefix: Sequence[int] | None,
    batch: int,
    n_batches: int,
    first: int,
    last: int,
    n1: int,
    n2: int,
    sq: int,
    skv: int,
    device: torch.device,
) -> _MaskRules | None:
    if atten_mask is None:
        return None
    rules = _MaskRules(sq, skv)
    right_down = skv - sq
    if sparse_mode in (0, 1):
        mask = atten_mask.to(torch.bool)
        if mask.dim() != 2 or mask.shape[0] < sq or mask.shape[1] < skv:
            raise ValueError(f"varlen atten_mask must be 2-D (maxSq, maxSkv), got shape {tuple(mask.shape)}")
        rules.given = mask[:sq, :skv].view(1, 1, 1, sq, skv)
        if sparse_mode == 0:
            rules.add_band(pre, nxt, 0)
    elif sparse_mode == 2 or (sparse_mode == 8 and batch != first):
        rules.add_band(_INT_MAX, 0, 0)
    elif sparse_mode == 3 or (sparse_mode == 7 and batch != last):
        rules.add_band(_INT_MAX, 0, right_down)
    elif sparse_mode in (4, 7, 8):
        rules.add_band(pre, nxt, right_down)
    elif sparse_mode == 6:
        if prefix is None or len(prefix) < n_batches:
            raise ValueError(f"sparse_mode=6 needs prefix with one N per batch, got {prefix!r}")
        rules.prefix_causal = (torch.tensor([int(prefix[batch])], device=device), right_down)
    else:  # 5
        raise ValueError("sparse_mode=5 (uncompressed prefix) is documented as unsupported for TND")
    return rules


def _attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    head_num: int,
    input_layout: str,
    pse: torch.Tensor | None,
    atten_mask: torch.Tensor | None,
    scale: float,
    pre_tockens: int,
    next_tockens: int,
    prefix: Sequence[int] | None,
    actual_seq_qlen: Sequence[int] | None,
    actual_seq_kvlen: Sequence[int] | None,
    sparse_mode: int,
    softmax_layout: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Shared forward: (out in query's layout, softmax_max, softmax_sum) in compute dtype."""
    dims = _dims(query, key, value, head_num, input_layout)
    dtype = compute_dtype(query)
    q, k, v = query.to(dtype), key.to(dtype), value.to(dtype)
    if input_layout != "TND":
        rules = _mask_rules(
            sparse_mode,
            atten_mask,
            pre_tockens,
            next_tockens,
            prefix,
            dims.b,
            dims.n1,
            dims.n2,
            dims.sq,
            dims.skv,
            q.device,
        )
        out, m, l = _run(
            _to_bnsd(q, input_layout, dims.n1),
            _to_bnsd(k, input_layout, dims.n2),
            _to_bnsd(v, input_layout, dims.n2),
            dims,
            _pse5(pse, dims, dtype),
            scale,
            rules,
        )
        return _from_bnsd(out, input_layout), m, l
    if pse is not None:
        raise Unsupported(
            "npu_fusion_attention: pse with input_layout TND (varlen) is only "
            "documented in its compressed ALiBi form, which cannot be rebuilt"
        )
    qsegs = _varlen_segments(actual_seq_qlen, dims.sq, "actual_seq_qlen")
    kvsegs = _varlen_segments(actual_seq_kvlen, dims.skv, "actual_seq_kvlen")
    if len(qsegs) != len(kvsegs):
        raise ValueError(f"actual_seq_qlen and actual_seq_kvlen describe {len(qsegs)} and {len(kvsegs)} batches")
    active = [i for i, (a, e) in enumerate(qsegs) if e > a]
    first, last = (active[0], active[-1]) if active else (-1, -1)
    outs: list[torch.Tensor] = []
    maxes: list[torch.Tensor] = []
    sums: list[torch.Tensor] = []
    covered = 0
    for batch, ((q0, q1), (k0, k1)) in enumerate(zip(qsegs, kvsegs, strict=False)):
        if q1 == q0:
            continue
        sq_b, skv_b = q1 - q0, k1 - k0
        bd = _Dims(1, dims.n1, dims.n2, sq_b, skv_b, dims.d, dims.dv)
        rules = _varlen_rules(
            sparse_mode,
            atten_mask,
            pre_tockens,
            next_tockens,
            prefix,
            batch,
            len(qsegs),
            first,
            last,
            dims.n1,
            dims.n2,
            sq_b,
            skv_b,
            q.device,
        )
        o, m, l = _run(
            q[q0:q1].transpose(0, 1).unsqueeze(0),
            k[k0:k1].transpose(0, 1).unsqueeze(0),
            v[k0:k1].transpose(0, 1).unsqueeze(0),
            bd,
            None,
            scale,
            rules,
        )
        outs.append(o[0].transpose(0, 1))  # (sq_b, N1, Dv)
        maxes.append(m[0, :, :, 0])  # (N1, sq_b)
        sums.append(l[0, :, :, 0])
        covered = q1
    rest = dims.sq - covered  # rows of T no batch covers: output 0, as no key is visible
    if rest:
        outs.append(q.new_zeros(rest, dims.n1, dims.dv))
        maxes.append(q.new_full((dims.n1, rest), float("-inf")))
        sums.append(q.new_zeros(dims.n1, rest))
    out = torch.cat(outs, dim=0)
    m = torch.cat(maxes, dim=1).unsqueeze(-1)  # (N1, T, 1): documented default NTD
    l = torch.cat(sums, dim=1).unsqueeze(-1)
    if softmax_layout == "TND":
        m, l = m.transpose(0, 1), l.transpose(0, 1)
    return out, m, l


def npu_fusion_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    head_num: int,
    input_layout: str,
    pse: torch.Tensor | None = None,
    padding_mask: torch.Tensor | None = None,
    atten_mask: torch.Tensor | None = None,
    scale: float = 1.0,
    keep_prob: float = 1.0,
    pre_tockens: int = 2147483647,
    next_tockens: int = 2147483647,
    inner_precise: int = 0,
    prefix: Sequence[int] | None = None,
    actual_seq_qlen: Sequence[int] | None = None,
    actual_seq_kvlen: Sequence[int] | None = None,
    sparse_mode: int = 0,
    gen_mask_parallel: bool = True,
    sync: bool = False,
    softmax_layout: str = "",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int, int, int]:
    """attention_out = Softmax(Mask(scale * (pse + query @ key^T), atten_mask)) @ value.

    Returns ``(attention_out, softmax_max, softmax_sum, softmax_out, seed, offset, numels)``.
    Computes in float32 (float64 for float64 inputs); attention_out has query's dtype and
    layout (with value's head dim), softmax_max/softmax_sum are float32 (float64 for float64
    inputs) of shape (B, N, Sq, 8) — (N, T, 8) for TND, (T, N, 8) with softmax_layout="TND".
    Differentiable in query, key, value and pse (autograd, recomputing row blocks).

    Facts:
    - torch_npu docs: formula attention_out = Dropout(Softmax(Mask(scale*(pse + query*key^T), atten_mask)), keep_prob) * value (aclnnFlashAttentionScore).
    - torch_npu docs: input_layout BSH, SBH, BSND, BNSD, TND (TND needs actual_seq_qlen/actual_seq_kvlen, cumulative lengths).
    - torch_npu docs: Nq may be a multiple of Nkv (GQA/MQA); query head i uses key/value head i // (Nq/Nkv).
    - torch_npu docs: scale defaults to 1 (it is not 1/sqrt(D) unless the caller passes it).
    - torch_npu docs: atten_mask 1/True means "does not take part"; shapes BNSS, B1SS, 11SS, SS; bool or uint8; varlen only SS (maxSq, maxSkv).
    - torch_npu docs: atten_mask None -> sparse_mode, pre_tockens, next_tockens have no effect, everything is computed.
    - torch_npu docs: sparse_mode 0 defaultMask (mask plus band pre/next from the upper-left corner), 1 allMask (mask as given), 2 leftUpCausal, 3 rightDownCausal, 4 band from the lower-right corner, 5 prefix uncompressed (full BNSS/B1SS mask given), 6 prefix compressed (rightDownCausal plus the first prefix[b] keys visible), 7/8 varlen outer-split (rightDownCausal/leftUpCausal with the last/first batch a lower-right band); for 2,3,4,6,7,8 the mask passed is a compressed 2048x2048 (3072x2048) template, not used as data.
    - torch_npu docs: pse shapes BNSS, BN1Skv, 1NSS; compressed ALiBi (last 1024 rows) is a memory optimisation.
    - torch_npu docs: outputs 2 and 3 are the softmax Max and Sum intermediates (float), shape [B,N,Sq,8] (aclnn); output 4 is reserved and unused; outputs 5-7 are the dropout Philox seed, offset and mask length.
    - torch_npu docs: padding_mask is not supported by the op.

    Choices:
    - keep_prob < 1 raises Unsupported (a ValueError): the dropout mask comes from the NPU's random stream.
    - Rows with no visible key (e.g. sparse_mode 3 with Sq > Skv) give attention_out 0, softmax_max -inf, softmax_sum 0 (the docs only say such "invalid rows" are handled).
    - sparse_mode 0 with both a mask and a band: the union of both is masked (the docs require them to agree).
    - The 8 copies of softmax_max/softmax_sum along the last axis are identical.
    - softmax_out is an empty tensor of query's dtype; seed, offset, numels are 0 (no dropout).
    - TND: rows of query beyond the last actual_seq_qlen are output as 0; a varlen mode-0/1 mask is cut to [:Sq_b, :Skv_b] per batch.
    - pse with TND, compressed ALiBi pse, and padding_mask raise Unsupported.
    """
    _check_common(keep_prob, padding_mask, sparse_mode, softmax_layout, input_layout)
    out, m, l = _attention(
        query,
        key,
        value,
        head_num,
        input_layout,
        pse,
        atten_mask,
        scale,
        pre_tockens,
        next_tockens,
        prefix,
        actual_seq_qlen,
        actual_seq_kvlen,
        sparse_mode,
        softmax_layout,
    )
    stats_dtype = torch.float64 if query.dtype == torch.float64 else torch.float32
    softmax_max = m.to(stats_dtype).expand(*m.shape[:-1], 8).contiguous()
    softmax_sum = l.to(stats_dtype).expand(*l.shape[:-1], 8).contiguous()
    softmax_out = query.new_empty(0)
    return out.to(query.dtype), softmax_max, softmax_sum, softmax_out, 0, 0, 0


def npu_fusion_attention_grad(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    dy: torch.Tensor,
    head_num: int,
    input_layout: str,
    *,
    pse: torch.Tensor | None = None,
    padding_mask: torch.Tensor | None = None,
    atten_mask: torch.Tensor | None = None,
    softmax_max: torch.Tensor | None = None,
    softmax_sum: torch.Tensor | None = None,
    softmax_in: torch.Tensor | None = None,
    attention_in: torch.Tensor | None = None,
    scale_value: float = 1.0,
    keep_prob: float = 1.0,
    pre_tockens: int = 2147483647,
    next_tockens: int = 2147483647,
    inner_precise: int = 0,
    seed: int = 0,
    offset: int = 0,
    numels: int = 0,
    prefix: Sequence[int] | None = None,
    actual_seq_qlen: Sequence[int] | None = None,
    actual_seq_kvlen: Sequence[int] | None = None,
    sparse_mode: int = 0,
    gen_mask_parallel: bool = True,
    sync: bool = False,
    softmax_layout: str = "",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients (dq, dk, dv, dpse) of npu_fusion_attention's attention_out, given dy.

    The explicit backward of the same blocked computation (the code autograd uses for
    ``npu_fusion_attention``): dV = P^T dY, dP = dY V^T, dS = P * (dP - rowsum(P * dP)),
    dQ = scale dS K, dK = scale dS^T Q (summed over the query heads of a group), dpse =
    scale dS summed to pse's shape. Each is in its input's dtype and layout; dpse is an empty
    tensor when pse is None.

    Facts:
    - op-plugin schema: npu_fusion_attention_grad(query, key, value, dy, head_num, input_layout, *, pse, padding_mask, atten_mask, softmax_max, softmax_sum, softmax_in, attention_in, scale_value=1., keep_prob=1., pre_tockens, next_tockens, inner_precise, seed, offset, numels, prefix, actual_seq_qlen, actual_seq_kvlen, sparse_mode, gen_mask_parallel, sync) -> (Tensor, Tensor, Tensor, Tensor).
    - Masking, layouts, scale and GQA follow npu_fusion_attention's documentation (see that reference).

    Choices:
    - softmax_max, softmax_sum, softmax_in and attention_in are accepted and ignored: the reference recomputes the softmax from query/key at its own precision instead of trusting the device's intermediates.
    - keep_prob < 1 raises Unsupported, as for the forward.
    """
    _check_common(keep_prob, padding_mask, sparse_mode, softmax_layout, input_layout)
    dtype = compute_dtype(query)
    with torch.enable_grad():
        leaves = [t.detach().to(dtype).requires_grad_(True) for t in (query, key, value)]
        pse_leaf = pse.detach().to(dtype).requires_grad_(True) if pse is not None else None
        q_leaf, k_leaf, v_leaf = leaves
        out, _, _ = _attention(
            q_leaf,
            k_leaf,
            v_leaf,
            head_num,
            input_layout,
            pse_leaf,
            atten_mask,
            scale_value,
            pre_tockens,
            next_tockens,
            prefix,
            actual_seq_qlen,
            actual_seq_kvlen,
            sparse_mode,
            softmax_layout,
        )
        inputs = leaves + ([pse_leaf] if pse_leaf is not None else [])
        grads = torch.autograd.grad(out, inputs, dy.to(dtype), allow_unused=True)
    filled = [torch.zeros_like(t) if gr is None else gr for t, gr in zip(inputs, grads, strict=True)]
    dq, dk, dv = (gr.to(t.dtype) for gr, t in zip(filled[:3], (query, key, value), strict=True))
    dpse = filled[3].to(pse.dtype) if pse is not None else query.new_empty(0)
    return dq, dk, dv, dpse
