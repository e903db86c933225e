"""npu_fusion_attention / npu_fusion_attention_grad against independent formulations:
torch's scaled_dot_product_attention where it applies, a naive float64
softmax(scale * (QK^T + pse), masked) V with masks drawn from the documented pictures
elsewhere, and gradcheck in float64."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pytest_msprobe.bench_functions import Unsupported, get
from pytest_msprobe.bench_functions import fusion_attention as fa_module

fa = get("npu_fusion_attention")
fa_grad = get("npu_fusion_attention_grad")
COMPRESSED = torch.ones(2048, 2048, dtype=torch.bool).triu(1)  # the documented 2048x2048 template


def naive(q, k, v, *, scale=1.0, mask=None, pse=None):
    """float64 softmax(scale * (q k^T + pse) masked) v on BNSD tensors; GQA by repeating k/v."""
    q, k, v = q.double(), k.double(), v.double()
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    s = q @ k.transpose(-1, -2)
    if pse is not None:
        s = s + pse.double()
    s = s * scale
    if mask is not None:
        s = s.masked_fill(mask, -math.inf)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # rows with no visible key -> 0
    return p @ v, s


def band_mask(sq, skv, pre, nxt, origin="upper_left"):
    """The docs' construction: triu(ones, next+1) | tril(ones, -pre-1), shifted by Skv-Sq
    when the band starts at the lower-right corner."""
    shift = skv - sq if origin == "lower_right" else 0
    upper = np.triu(np.ones((sq, skv)), k=nxt + 1 + shift)
    lower = np.tril(np.ones((sq, skv)), k=-pre - 1 + shift)
    return torch.from_numpy((upper + lower) > 0)


def qkv(b=2, n1=4, n2=2, sq=24, skv=24, d=16, dv=16, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(b, n1, sq, d, generator=g, dtype=dtype),
        torch.randn(b, n2, skv, d, generator=g, dtype=dtype),
        torch.randn(b, n2, skv, dv, generator=g, dtype=dtype),
    )


def to_layout(x, layout):
    if layout == "BNSD":
        return x
    if layout == "BSND":
        return x.transpose(1, 2).contiguous()
    if layout == "BSH":
        return x.transpose(1, 2).reshape(x.shape[0], x.shape[2], -1)
    if layout == "SBH":
        return x.permute(2, 0, 1, 3).reshape(x.shape[2], x.shape[0], -1)
    raise ValueError(layout)


@pytest.fixture
def small_blocks(monkeypatch):
    """Force many row blocks so the chunking itself is under test."""
    monkeypatch.setattr(fa_module, "score_block_elements", 300)


def test_matches_sdpa_without_mask(small_blocks):
    q, k, v = qkv(n2=4)
    out = fa(q, k, v, 4, "BNSD", scale=0.25)[0]
    expected = F.scaled_dot_product_attention(q, k, v, scale=0.25)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)


def test_matches_sdpa_gqa_causal(small_blocks):
    q, k, v = qkv(n1=8, n2=2)
    out = fa(q, k, v, 8, "BNSD", scale=0.3, atten_mask=COMPRESSED, sparse_mode=2)[0]
    expected = F.scaled_dot_product_attention(q, k, v, scale=0.3, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)


def test_matches_sdpa_with_bool_mask_and_default_scale():
    q, k, v = qkv(n2=4, sq=20, skv=28)
    mask = torch.rand(2, 1, 20, 28, generator=torch.Generator().manual_seed(1)) < 0.3
    out = fa(q, k, v, 4, "BNSD", atten_mask=mask, sparse_mode=1)[0]
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=~mask, scale=1.0)  # docs: scale defaults to 1
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("layout", ["BSH", "SBH", "BSND", "BNSD"])
def test_layouts(layout, small_blocks):
    q, k, v = qkv(sq=12, skv=20, dv=8)
    out = fa(to_layout(q, layout), to_layout(k, layout), to_layout(v, layout), 4, layout, scale=0.2)[0]
    expected, _ = naive(q, k, v, scale=0.2)
    torch.testing.assert_close(out, to_layout(expected, layout), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("sq,skv", [(24, 24), (16, 30), (30, 16)])
@pytest.mark.parametrize(
    "mode,pre,nxt", [(0, 5, 3), (0, 2147483647, 0), (0, 9, -3), (0, -3, 7), (2, 0, 0), (3, 0, 0), (4, 6, 2), (4, 6, -2)]
)
def test_sparse_modes(mode, pre, nxt, sq, skv, small_blocks):
    q, k, v = qkv(sq=sq, skv=skv)
    if mode == 0:
        mask = band_mask(sq, skv, pre, nxt)
        given = mask  # defaultMask: the mask passed must agree with pre/next
    elif mode == 2:
        mask, given = band_mask(sq, skv, sq, 0), COMPRESSED
    elif mode == 3:
        mask, given = band_mask(sq, skv, max(sq, skv), 0, "lower_right"), COMPRESSED
    else:
        mask, given = band_mask(sq, skv, pre, nxt, "lower_right"), COMPRESSED
    out, smax, ssum = fa(
        q, k, v, 4, "BNSD", scale=0.2, atten_mask=given, sparse_mode=mode, pre_tockens=pre, next_tockens=nxt
    )[:3]
    expected, s = naive(q, k, v, scale=0.2, mask=mask)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    visible = ~mask.all(dim=-1)  # rows with at least one key
    row_max = s.amax(dim=-1)
    torch.testing.assert_close(smax[..., 0][..., visible], row_max[..., visible])
    torch.testing.assert_close(ssum[..., 0][..., visible], torch.exp(s - row_max.unsqueeze(-1)).sum(-1)[..., visible])
    assert torch.all(out[..., ~visible, :] == 0)


def test_prefix_compressed_mode6():
    q, k, v = qkv(b=2, sq=10, skv=16)
    prefix = [3, 7]
    out = fa(q, k, v, 4, "BNSD", atten_mask=torch.ones(3072, 2048, dtype=torch.bool), sparse_mode=6, prefix=prefix)[0]
    i = torch.arange(10).view(-1, 1)
    j = torch.arange(16).view(1, -1)
    masks = torch.stack([(j > i + 6) & (j >= p) for p in prefix]).unsqueeze(1)  # rightDownCausal + prefix columns
    torch.testing.assert_close(out, naive(q, k, v, mask=masks)[0], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("shape", [(2, 4, 12, 20), (2, 4, 1, 20), (1, 4, 12, 20)])
def test_pse_shapes(shape):
    q, k, v = qkv(sq=12, skv=20)
    pse = torch.randn(shape, dtype=torch.float64)
    out = fa(q, k, v, 4, "BNSD", pse=pse, scale=0.3)[0]
    torch.testing.assert_close(out, naive(q, k, v, scale=0.3, pse=pse)[0], rtol=1e-12, atol=1e-12)


def test_stats_shape_and_dtype():
    q, k, v = (t.float() for t in qkv())
    out, smax, ssum, sout, seed, offset, numels = fa(q, k, v, 4, "BNSD")
    assert out.dtype == torch.float32 and smax.shape == (2, 4, 24, 8) and ssum.dtype == torch.float32
    assert torch.equal(smax[..., 0:1].expand_as(smax), smax)
    assert sout.numel() == 0 and (seed, offset, numels) == (0, 0, 0)


@pytest.mark.parametrize("mode", [0, 2, 3, 7, 8])
def test_tnd_varlen(mode):
    qlen, kvlen = [3, 5, 4], [6, 5, 7]
    n1, n2, d = 4, 2, 8
    g = torch.Generator().manual_seed(3)
    q = torch.randn(sum(qlen), n1, d, generator=g, dtype=torch.float64)
    k = torch.randn(sum(kvlen), n2, d, generator=g, dtype=torch.float64)
    v = torch.randn(sum(kvlen), n2, d, generator=g, dtype=torch.float64)
    pre, nxt = 4, 1
    mask_arg = None if mode == 0 else COMPRESSED
    out, smax = fa(
        q,
        k,
        v,
        n1,
        "TND",
        atten_mask=mask_arg,
        sparse_mode=mode,
        pre_tockens=pre,
        next_tockens=nxt,
        actual_seq_qlen=np.cumsum(qlen).tolist(),
        actual_seq_kvlen=np.cumsum(kvlen).tolist(),
    )[:2]
    assert smax.shape == (n1, sum(qlen), 8)  # documented default NTD
    q0 = k0 = 0
    for batch, (sq, skv) in enumerate(zip(qlen, kvlen, strict=True)):
        if mode == 0:
            mask = None
        elif mode == 2 or (mode == 8 and batch > 0):
            mask = band_mask(sq, skv, sq, 0)
        elif mode == 3 or (mode == 7 and batch < 2):
            mask = band_mask(sq, skv, max(sq, skv), 0, "lower_right")
        else:  # the last (mode 7) / first (mode 8) batch is a lower-right band
            mask = band_mask(sq, skv, pre, nxt, "lower_right")
        qb, kb, vb = (t.transpose(0, 1).unsqueeze(0) for t in (q[q0 : q0 + sq], k[k0 : k0 + skv], v[k0 : k0 + skv]))
        expected = naive(qb, kb, vb, mask=mask)[0][0].transpose(0, 1)
        torch.testing.assert_close(out[q0 : q0 + sq], expected, rtol=1e-12, atol=1e-12)
        q0, k0 = q0 + sq, k0 + skv


def test_unsupported_cases_raise_valueerror_subclass():
    q, k, v = qkv()
    with pytest.raises(Unsupported, match="keep_prob"):
        fa(q, k, v, 4, "BNSD", keep_prob=0.9)
    with pytest.raises(ValueError, match="padding_mask"):
        fa(q, k, v, 4, "BNSD", padding_mask=torch.zeros(1))
    q, k, v = qkv(sq=2000, skv=8, d=4, dv=4, b=1, n1=1, n2=1)
    with pytest.raises(Unsupported, match="ALiBi"):
        fa(q, k, v, 1, "BNSD", pse=torch.zeros(1, 1, 1024, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match="input_layout"):
        fa(q, k, v, 1, "NSD")


def test_gradcheck_float64(small_blocks):
    q, k, v = (t.requires_grad_() for t in qkv(b=1, n1=4, n2=2, sq=5, skv=7, d=3, dv=2))
    pse = torch.randn(1, 4, 5, 7, dtype=torch.float64, requires_grad=True)
    mask = band_mask(5, 7, 3, 1)

    def f(q, k, v, pse):
        return fa(
            to_layout(q, "BSH"),
            to_layout(k, "BSH"),
            to_layout(v, "BSH"),
            4,
            "BSH",
            pse=pse,
            atten_mask=mask,
            scale=0.7,
            pre_tockens=3,
            next_tockens=1,
        )[0]

    assert torch.autograd.gradcheck(f, (q, k, v, pse))


@pytest.mark.parametrize("layout", ["BSH", "BNSD"])
def test_grad_op_matches_autograd_of_naive(layout):
    q, k, v = (t.requires_grad_() for t in qkv(sq=12, skv=16, dv=8))
    pse = torch.randn(1, 4, 1, 16, dtype=torch.float64, requires_grad=True)
    mask = band_mask(12, 16, 16, 0, "lower_right")
    expected, _ = naive(q, k, v, scale=0.4, mask=mask, pse=pse)
    dy = torch.randn_like(expected)
    grads = torch.autograd.grad(expected, (q, k, v, pse), dy)
    dq, dk, dv, dpse = fa_grad(
        to_layout(q.detach(), layout),
        to_layout(k.detach(), layout),
        to_layout(v.detach(), layout),
        to_layout(dy, layout),
        4,
        layout,
        pse=pse.detach(),
        atten_mask=COMPRESSED,
        sparse_mode=3,
        scale_value=0.4,
    )
    for got, want in zip((dq, dk, dv), grads[:3], strict=True):
        torch.testing.assert_close(got, to_layout(want, layout), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(dpse, grads[3], rtol=1e-10, atol=1e-12)
    assert fa_grad(q.detach(), k.detach(), v.detach(), expected.detach(), 4, "BNSD")[3].numel() == 0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_smoke(dtype):
    q, k, v = qkv(sq=32, skv=32)
    out, smax = fa(q.to(dtype), k.to(dtype), v.to(dtype), 4, "BNSD", scale=0.25, atten_mask=COMPRESSED, sparse_mode=2)[
        :2
    ]
    assert out.dtype == dtype and smax.dtype == torch.float32 and torch.isfinite(out).all()
    expected = naive(q.to(dtype), k.to(dtype), v.to(dtype), scale=0.25, mask=band_mask(32, 32, 32, 0))[0]
    torch.testing.assert_close(out.double(), expected, rtol=0, atol=0.02)


def test_1024_tokens_chunked_never_builds_the_full_score_matrix(monkeypatch):
    """Forward and backward of a 1024-token attention: every score block stays within the
    budget (far below the 8 x 1024 x 1024 scores), and the result matches SDPA."""
    monkeypatch.setattr(fa_module, "score_block_elements", 2**20)
    largest = []
    real_scores = fa_module._scores

    def spy(*args, **kwargs):
        s = real_scores(*args, **kwargs)
        largest.append(s.numel())
        return s

    monkeypatch.setattr(fa_module, "_scores", spy)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 8, 1024, 64, generator=g, requires_grad=True) for _ in range(3))
    out = fa(q, k, v, 8, "BNSD", scale=0.125, atten_mask=COMPRESSED, sparse_mode=3)[0]
    out.sum().backward()
    assert max(largest) <= 2**20 < 8 * 1024 * 1024 and len(largest) >= 16
    q2, k2, v2 = (t.detach().clone().requires_grad_() for t in (q, k, v))
    expected = F.scaled_dot_product_attention(q2, k2, v2, scale=0.125, is_causal=True)
    expected.sum().backward()
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(q.grad, q2.grad, rtol=1e-4, atol=1e-4)
