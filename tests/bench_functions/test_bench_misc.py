"""sort_v2 and moe_gating_top_k_softmax against torch.sort/topk; linear, confusion_transpose
and matmul_backward against explicit formulations."""

import itertools

import pytest
import torch

from pytest_msprobe.bench_functions import get

G = torch.Generator().manual_seed(0)


def rand(*shape, dtype=torch.float64):
    return torch.randn(*shape, generator=G, dtype=torch.float64).to(dtype)


@pytest.mark.parametrize("dim,descending", [(-1, False), (-1, True), (0, False), (1, True)])
def test_sort_v2_is_torch_sort_values(dim, descending):
    x = rand(5, 7, 3)
    x[0, 0, 0] = x[1, 1, 1]  # a tie
    assert torch.equal(get("npu_sort_v2")(x, dim, descending), torch.sort(x, dim=dim, descending=descending).values)
    out = torch.empty_like(x)
    assert get("npu_sort_v2")(x, dim=dim, descending=descending, out=out) is out
    assert torch.equal(get("npu_sort_v2")(x.half()), torch.sort(x.half()).values)


def test_moe_gating_top_k_softmax():
    x = rand(6, 8)
    finished = torch.tensor([False, True, False, False, True, False])
    y, idx, row_idx = get("npu_moe_gating_top_k_softmax")(x, finished, k=3)
    probs = torch.softmax(x, dim=-1)
    top = torch.topk(probs, 3, dim=-1)
    torch.testing.assert_close(y, top.values)
    expected_idx = torch.where(finished.unsqueeze(-1), torch.full_like(top.indices, 8), top.indices)
    assert idx.dtype == row_idx.dtype == torch.int32 and torch.equal(idx.long(), expected_idx)
    # docs: rowIdx = arange(rows * k).reshape(k, rows).transpose(1, 0)
    assert row_idx.tolist() == [[r + 6 * s for s in range(3)] for r in range(6)]
    y16, idx16, _ = get("npu_moe_gating_top_k_softmax")(x.half())
    assert y16.dtype == torch.float16 and y16.shape == (6, 1) and torch.equal(idx16.long().squeeze(-1), x.argmax(-1))
    with pytest.raises(ValueError, match="k must be"):
        get("npu_moe_gating_top_k_softmax")(x, None, 9)


def test_moe_gating_3d_and_ties():
    x = torch.zeros(2, 3, 4)
    y, idx, row_idx = get("npu_moe_gating_top_k_softmax")(x, None, 2)
    assert torch.equal(idx, torch.tensor([0, 1], dtype=torch.int32).expand(2, 3, 2))  # ties -> lower expert
    assert row_idx.shape == (2, 3, 2) and sorted(row_idx.flatten().tolist()) == list(range(12))


def test_linear_matches_einsum_and_gradcheck():
    x, w, b = rand(5, 4), rand(3, 4), rand(3)
    torch.testing.assert_close(get("npu_linear")(x, w, b), torch.einsum("ni,oi->no", x, w) + b)
    torch.testing.assert_close(get("npu_linear")(x, w), torch.einsum("ni,oi->no", x, w))
    args = tuple(t.clone().requires_grad_() for t in (x, w, b))
    assert torch.autograd.gradcheck(get("npu_linear"), args)
    assert get("npu_linear")(x.bfloat16(), w.bfloat16()).dtype == torch.bfloat16


def test_confusion_transpose_documented_examples():
    f = get("npu_confusion_transpose")
    x = rand(2, 3, 4, 6)
    y = f(x, (0, 2, 1, 3), (2, 4, 18), True)
    assert y.shape == (2, 4, 18)
    assert y[1, 2, 6 * 1 + 5] == x[1, 1, 2, 5]  # transpose first, then reshape
    y2 = f(x, (0, 2, 1), (2, 12, 6), False)
    assert y2.shape == (2, 6, 12)
    assert y2[1, 5, 7] == x.reshape(2, 12, 6)[1, 7, 5]  # reshape first, then transpose
    assert torch.autograd.gradcheck(lambda t: f(t, (1, 0, 2), (3, 2, 4), True), (rand(2, 3, 4).requires_grad_(),))


SHAPES = [
    ((4,), (4,)),
    ((3, 4), (4,)),
    ((4,), (4, 5)),
    ((3, 4), (4, 5)),
    ((2, 3, 4), (4, 5)),
    ((2, 3, 4), (4,)),
    ((4,), (2, 4, 5)),
    ((3, 4), (2, 4, 5)),
    ((2, 1, 3, 4), (5, 4, 2)),
    ((2, 3, 4), (2, 4, 5)),
]


@pytest.mark.parametrize("a_shape,b_shape", SHAPES)
def test_matmul_backward_matches_autograd(a_shape, b_shape):
    a, b = rand(*a_shape).requires_grad_(), rand(*b_shape).requires_grad_()
    out = torch.matmul(a, b)
    grad = torch.randn(out.shape, generator=G, dtype=torch.float64)
    ga, gb = torch.autograd.grad(out, (a, b), grad)
    for mask in itertools.product([True, False], repeat=2):
        got_a, got_b = get("matmul_backward")(grad, a.detach(), b.detach(), list(mask))
        if mask[0]:
            torch.testing.assert_close(got_a, ga)
        else:
            assert got_a is None
        if mask[1]:
            torch.testing.assert_close(got_b, gb)
        else:
            assert got_b is None
