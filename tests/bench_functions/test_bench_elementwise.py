"""rotary_mul (complex-number form), swiglu, fast_gelu, mish and scaled_masked_softmax."""

import math

import pytest
import torch
import torch.nn.functional as F

from pytest_msprobe.bench_functions import get

G = torch.Generator().manual_seed(0)


def rand(*shape):
    return torch.randn(*shape, generator=G, dtype=torch.float64)


def angles(s, d):
    pos = torch.arange(s, dtype=torch.float64).unsqueeze(-1)
    return pos / (10000 ** (torch.arange(d // 2, dtype=torch.float64) * 2 / d))  # (S, D/2)


def test_rotary_half_is_complex_rotation():
    x = rand(2, 3, 5, 8)  # BNSD
    theta = angles(5, 8)
    r1 = torch.cat((theta.cos(), theta.cos()), -1).view(1, 1, 5, 8)
    r2 = torch.cat((theta.sin(), theta.sin()), -1).view(1, 1, 5, 8)
    out = get("npu_rotary_mul")(x, r1, r2)
    z = torch.complex(x[..., :4], x[..., 4:]) * torch.polar(torch.ones_like(theta), theta)
    torch.testing.assert_close(out, torch.cat((z.real, z.imag), -1), rtol=1e-13, atol=1e-14)


def test_rotary_interleave_is_complex_rotation():
    x = rand(2, 5, 3, 8)  # BSND
    theta = angles(5, 8)
    r1 = theta.cos().repeat_interleave(2, -1).view(1, 5, 1, 8)
    r2 = theta.sin().repeat_interleave(2, -1).view(1, 5, 1, 8)
    out = get("npu_rotary_mul")(x, r1, r2, rotary_mode="interleave")
    z = torch.view_as_complex(x.reshape(2, 5, 3, 4, 2).contiguous()) * torch.polar(torch.ones_like(theta), theta).view(
        1, 5, 1, 4
    )
    torch.testing.assert_close(out, torch.view_as_real(z).reshape(2, 5, 3, 8), rtol=1e-13, atol=1e-14)


@pytest.mark.parametrize("mode", ["half", "interleave"])
def test_rotary_gradcheck(mode):
    args = (rand(1, 2, 3, 4).requires_grad_(), rand(1, 1, 3, 4).requires_grad_(), rand(1, 1, 3, 4).requires_grad_())
    assert torch.autograd.gradcheck(lambda *a: get("npu_rotary_mul")(*a, mode), args)
    with pytest.raises(ValueError, match="rotary_mode"):
        get("npu_rotary_mul")(*args, "full")


@pytest.mark.parametrize("dim", [-1, 0, 1])
def test_swiglu_textbook(dim):
    x = rand(4, 6, 8)
    a, b = x.chunk(2, dim=dim)
    torch.testing.assert_close(get("npu_swiglu")(x, dim=dim), a / (1 + torch.exp(-a)) * b, rtol=1e-13, atol=1e-14)
    assert torch.autograd.gradcheck(lambda t: get("npu_swiglu")(t, dim), (rand(2, 4, 2).requires_grad_(),))


def test_fast_gelu_documented_forms():
    x = rand(1000) * 6
    doc_form = x / (1 + torch.exp(-1.702 * x.abs())) * torch.exp(0.851 * (x - x.abs()))
    for name in ("fast_gelu", "npu_fast_gelu"):
        torch.testing.assert_close(get(name)(x), doc_form, rtol=1e-13, atol=1e-15)
    doc_example = get("fast_gelu")(torch.tensor([0.5991, 0.4094]))
    torch.testing.assert_close(doc_example, torch.tensor([0.4403, 0.2733]), rtol=0, atol=1e-4)
    big = get("npu_fast_gelu")(torch.tensor([-200.0, 200.0], dtype=torch.float16))
    assert torch.isfinite(big).all() and big.dtype == torch.float16
    assert torch.autograd.gradcheck(get("fast_gelu"), (rand(8).requires_grad_(),))


def test_mish_textbook_and_extremes():
    x = rand(1000) * 8
    expected = x * torch.tanh(torch.log(1 + torch.exp(x)))
    torch.testing.assert_close(get("npu_mish")(x), expected, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(get("npu_mish")(x.float()), F.mish(x.float()), rtol=1e-5, atol=1e-6)
    extreme = get("npu_mish")(torch.tensor([-1e4, 1e4, 0.0]))
    assert torch.equal(extreme, torch.tensor([-0.0, 1e4, 0.0]))
    assert torch.autograd.gradcheck(get("npu_mish"), (rand(8).requires_grad_(),))


def naive_masked_softmax(x, mask, scale):
    s = (x * scale).masked_fill(mask, -math.inf)
    e = torch.exp(s - s.amax(-1, keepdim=True))
    return e / e.sum(-1, keepdim=True)


def test_scaled_masked_softmax():
    f = get("npu_scaled_masked_softmax")
    x = rand(2, 3, 32, 32)
    mask = torch.rand(2, 1, 32, 32, generator=G) < 0.4
    mask[..., 0] = False  # every row keeps a key
    torch.testing.assert_close(f(x, mask, 0.5), naive_masked_softmax(x, mask, 0.5), rtol=1e-13, atol=1e-15)
    triu = torch.ones(32, 32, dtype=torch.bool).triu(1)
    torch.testing.assert_close(f(x, torch.zeros_like(mask), 2.0, True), naive_masked_softmax(x, triu, 2.0))
    full = torch.zeros(1, 1, 32, 32, dtype=torch.bool)
    full[..., 5, :] = True  # a fully masked row
    out = f(x, full, 1.0)
    torch.testing.assert_close(out[:, :, 5], torch.full((2, 3, 32), 1 / 32, dtype=torch.float64))
    y = f(x.half(), mask)
    assert y.dtype == torch.float16 and torch.isfinite(y).all()
    small = rand(1, 1, 3, 4).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: f(t, mask[:1, :1, :3, :4], 0.7), (small,))
