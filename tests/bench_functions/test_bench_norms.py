"""rms_norm, layer_norm_eval and group_norm_silu against the textbook formulas in float64."""

import pytest
import torch
import torch.nn.functional as F

from pytest_msprobe.bench_functions import get

rms_norm = get("npu_rms_norm")
layer_norm_eval = get("npu_layer_norm_eval")
group_norm_silu = get("npu_group_norm_silu")
G = torch.Generator().manual_seed(0)


def rand(*shape, dtype=torch.float64):
    return torch.randn(*shape, generator=G, dtype=torch.float64).to(dtype)


@pytest.mark.parametrize("gamma_shape", [(16,), (3, 16)])
def test_rms_norm_textbook(gamma_shape):
    x, gamma = rand(2, 3, 16) * 3, rand(*gamma_shape)
    y, rstd = rms_norm(x, gamma, epsilon=1e-5)
    dims = tuple(range(3 - len(gamma_shape), 3))
    n = 1
    for s in gamma_shape:
        n *= s
    ms = (x * x).sum(dim=dims, keepdim=True) / n
    torch.testing.assert_close(rstd, 1 / torch.sqrt(ms + 1e-5), rtol=1e-13, atol=0)
    torch.testing.assert_close(y, x / torch.sqrt(ms + 1e-5) * gamma, rtol=1e-13, atol=1e-14)
    assert rstd.shape == (2, 3, 1)[: 3 - len(gamma_shape)] + (1,) * len(gamma_shape)


def test_rms_norm_default_epsilon_and_dtypes():
    x, gamma = rand(4, 8), rand(8)
    y, rstd = rms_norm(x.half(), gamma.half())
    assert y.dtype == torch.float16 and rstd.dtype == torch.float32  # IR: rstd is float
    expected = (
        x.half().double() / torch.sqrt((x.half().double() ** 2).mean(-1, keepdim=True) + 1e-6) * gamma.half().double()
    )
    torch.testing.assert_close(y.double(), expected, rtol=2e-3, atol=2e-3)
    with pytest.raises(ValueError, match="gamma"):
        rms_norm(x, rand(4))


def test_rms_norm_gradcheck():
    x, gamma = rand(3, 6).requires_grad_(), rand(6).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: rms_norm(a, b, 1e-3)[0], (x, gamma))


def test_layer_norm_eval_textbook():
    x, w, b = rand(4, 5, 6) * 2 + 1, rand(5, 6), rand(5, 6)
    y = layer_norm_eval(x, [5, 6], w, b, eps=1e-4)
    flat = x.reshape(4, -1)
    mean = flat.sum(-1, keepdim=True) / 30
    var = ((flat - mean) ** 2).sum(-1, keepdim=True) / 30
    expected = ((flat - mean) / torch.sqrt(var + 1e-4)).reshape(4, 5, 6) * w + b
    torch.testing.assert_close(y, expected, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(layer_norm_eval(x.float(), 6), F.layer_norm(x.float(), (6,)), rtol=1e-5, atol=1e-5)


def test_layer_norm_eval_gradcheck_and_smoke():
    x, w, b = rand(3, 4).requires_grad_(), rand(4).requires_grad_(), rand(4).requires_grad_()
    assert torch.autograd.gradcheck(lambda *a: layer_norm_eval(a[0], [4], a[1], a[2]), (x, w, b))
    y = layer_norm_eval(x.detach().bfloat16(), (4,))
    assert y.dtype == torch.bfloat16 and torch.isfinite(y).all()


@pytest.mark.parametrize("shape", [(2, 6, 4, 5), (3, 8, 7)])
def test_group_norm_silu_textbook(shape):
    x, w, b = rand(*shape) * 2, rand(shape[1]), rand(shape[1])
    out, mean, rstd = group_norm_silu(x, w, b, 2, 1e-5)
    n = x.shape[0]
    grouped = x.reshape(n, 2, -1)
    mu = grouped.mean(-1)
    var = ((grouped - mu.unsqueeze(-1)) ** 2).mean(-1)
    norm = ((grouped - mu.unsqueeze(-1)) / torch.sqrt(var.unsqueeze(-1) + 1e-5)).reshape(shape)
    affine = (1, shape[1]) + (1,) * (len(shape) - 2)
    gn = norm * w.reshape(affine) + b.reshape(affine)
    torch.testing.assert_close(out, gn / (1 + torch.exp(-gn)), rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(mean, mu)
    torch.testing.assert_close(rstd, 1 / torch.sqrt(var + 1e-5))
    assert mean.shape == (n, 2)


def test_group_norm_silu_gradcheck_and_smoke():
    x, w, b = rand(2, 4, 3).requires_grad_(), rand(4).requires_grad_(), rand(4).requires_grad_()
    assert torch.autograd.gradcheck(lambda *a: group_norm_silu(a[0], a[1], a[2], 2)[0], (x, w, b))
    out, mean, rstd = group_norm_silu(x.detach().half(), None, None, 4)
    assert out.dtype == mean.dtype == rstd.dtype == torch.float16 and torch.isfinite(out).all()
    with pytest.raises(ValueError, match="group"):
        group_norm_silu(x.detach(), None, None, 3)
