"""Planted faults in the backward only: a custom autograd node with the same inputs as the
native one (the same tensor edges, in the same order) computes the wrong gradients while
the forward stays the correct kernel's, so a fault dump's forward records are a real
dump's. The faults' table and their use are in model_faults.py.
"""

from __future__ import annotations

import torch

from pytest_msprobe.testing.faults import TorchFunction

aten = torch.ops.aten  # the backward nodes below use ATen ops only: msprobe wraps none of them,
# so a fault dump records no extra calls from inside a faulty backward.


class _SoftmaxBackwardHalfAccumulator(torch.autograd.Function):
    """softmax whose backward dx = y * (g - sum(g * y)) forms each product g * y in the
    input dtype and adds them up in an accumulator of the input dtype (fp16 += fp16 * fp16)."""

    @staticmethod
    def forward(ctx, input, packed):
        dim, original = packed
        output = original(input, dim)
        ctx.save_for_backward(output)
        ctx.dim = dim
        return output

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        low, f32 = y.dtype, torch.float32
        dim = ctx.dim % y.dim()
        products = aten._to_copy(
            aten.mul.Tensor(aten._to_copy(grad, dtype=f32), aten._to_copy(y, dtype=f32)), dtype=low
        )
        total = aten.select.int(products, dim, 0)
        for j in range(1, y.shape[dim]):  # the fault: the running sum is stored in the input dtype
            total = aten._to_copy(
                aten.add.Tensor(
                    aten._to_copy(total, dtype=f32), aten._to_copy(aten.select.int(products, dim, j), dtype=f32)
                ),
                dtype=low,
            )
        total = aten.unsqueeze(aten._to_copy(total, dtype=f32), dim)
        dx = aten.mul.Tensor(aten._to_copy(y, dtype=f32), aten.sub.Tensor(aten._to_copy(grad, dtype=f32), total))
        return aten._to_copy(dx, dtype=low), None


def softmax_backward_half_accumulator(original: TorchFunction) -> TorchFunction:
    """float16/bfloat16 softmax whose backward accumulates sum(g * y) in the input dtype
    (the forward is correct)."""

    def faulty_softmax(input, dim=None, _stacklevel=3, dtype=None):
        if input.dtype not in (torch.float16, torch.bfloat16) or dtype is not None or dim is None:
            return original(input, dim, _stacklevel, dtype)
        if not (torch.is_grad_enabled() and input.requires_grad):
            return original(input, dim, _stacklevel, dtype)
        return _SoftmaxBackwardHalfAccumulator.apply(input, (dim, original))

    return faulty_softmax


class _EmbeddingLostDuplicatesBackward(torch.autograd.Function):
    """embedding whose backward writes each row's gradient instead of adding it: of
    several lookups of the same index only the last one's gradient survives (the native
    backward kernel, given only the last lookup of each index)."""

    @staticmethod
    def forward(ctx, weight, packed):
        indices, original = packed
        flat = indices.reshape(-1).tolist()
        last = sorted({index: position for position, index in enumerate(flat)}.values())  # the last write wins
        ctx.save_for_backward(indices, torch.tensor(last, dtype=torch.long))
        ctx.num_weights = weight.shape[0]
        return original(indices, weight)

    @staticmethod
    def backward(ctx, grad):
        indices, last = ctx.saved_tensors
        rows = aten.reshape(grad, [-1, grad.shape[-1]])
        kept_rows = aten.index_select(rows, 0, last)
        kept_indices = aten.index_select(aten.reshape(indices, [-1]), 0, last)
        return aten.embedding_dense_backward(kept_rows, kept_indices, ctx.num_weights, -1, False), None


def embedding_backward_lost_duplicates(original: TorchFunction) -> TorchFunction:
    """float32 embedding backward that loses the contributions of repeated indices (a
    lost update / unsynchronised write): the forward is correct."""

    def faulty_embedding(
        input, weight, padding_idx=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False, sparse=False
    ):
        plain = padding_idx is None and max_norm is None and not scale_grad_by_freq and not sparse
        if weight.dtype != torch.float32 or not plain or not (torch.is_grad_enabled() and weight.requires_grad):
            return original(input, weight, padding_idx, max_norm, norm_type, scale_grad_by_freq, sparse)
        return _EmbeddingLostDuplicatesBackward.apply(weight, (input, original))

    return faulty_embedding


class _MaxPoolBackwardAllTies(torch.autograd.Function):
    """max_pool2d whose backward gives a window's gradient to every element equal to the
    window's maximum (each tied maximum gets all of it) instead of to the one the native
    kernel picks (the first): windows read as columns (im2col), the mask `column == max`
    times the gradient summed back into place (col2im)."""

    @staticmethod
    def forward(ctx, input, packed):
        kernel, stride, padding, dilation, original = packed
        output = original(input, kernel, stride, padding, dilation)
        ctx.save_for_backward(input, output)
        ctx.geometry = kernel, dilation, padding, stride
        return output

    @staticmethod
    def backward(ctx, grad):
        x, y = ctx.saved_tensors
        kernel, dilation, padding, stride = ctx.geometry
        n, c, h, w = x.shape
        cols = aten.reshape(aten.im2col(x, kernel, dilation, padding, stride), [n, c, kernel[0] * kernel[1], -1])
        tied = aten.eq.Tensor(cols, aten.reshape(y, [n, c, 1, -1]))  # the fault: every tie, not the first
        routed = aten.mul.Tensor(tied, aten.reshape(grad, [n, c, 1, -1]))
        dx = aten.col2im(
            aten.reshape(routed, [n, c * kernel[0] * kernel[1], -1]), [h, w], kernel, dilation, padding, stride
        )
        return dx, None


def maxpool_backward_all_ties(original: TorchFunction) -> TorchFunction:
    """float32 max_pool2d whose backward routes the gradient to all the tied maxima of a
    window (a window of zeros after relu: to all its elements); the forward is correct."""

    def pair(value):
        return tuple(value) * (2 // len(value)) if isinstance(value, (tuple, list)) else (value, value)

    def faulty_max_pool2d(
        input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False
    ):
        plain = input.dim() == 4 and not ceil_mode and not return_indices
        if input.dtype != torch.float32 or not plain or not (torch.is_grad_enabled() and input.requires_grad):
            return original(
                input, kernel_size, stride, padding, dilation, ceil_mode=ceil_mode, return_indices=return_indices
            )
        kernel = pair(kernel_size)
        stride = kernel if stride is None or (isinstance(stride, (tuple, list)) and not stride) else pair(stride)
        return _MaxPoolBackwardAllTies.apply(input, (kernel, stride, pair(padding), pair(dilation), original))

    return faulty_max_pool2d


class _LinearBackwardBf16(torch.autograd.Function):
    """The 2-D GEMM below a linear's reshape (aten's linear on a 3-D input is a view of
    addmm on the rows): correct forward; backward with the input gradient computed from
    the weight rounded to bfloat16 and the weight gradient summed over split-K chunks of
    rows whose partial sums are kept in bfloat16."""

    @staticmethod
    def forward(ctx, rows, weight, bias):
        ctx.save_for_backward(rows, weight)
        ctx.has_bias = bias is not None
        out = aten.mm(rows, aten.t(weight))
        return out if bias is None else aten.add.Tensor(out, bias)

    @staticmethod
    def backward(ctx, grad):
        rows, weight = ctx.saved_tensors
        dx = aten.mm(grad, aten._to_copy(aten._to_copy(weight, dtype=torch.bfloat16), dtype=grad.dtype))
        dw = aten.zeros_like(weight)
        for start in range(0, rows.shape[0], SPLIT_K_ROWS):  # the fault: each partial sum rounded to bfloat16
            part = aten.mm(aten.t(grad[start : start + SPLIT_K_ROWS]), rows[start : start + SPLIT_K_ROWS])
            dw = aten._to_copy(aten._to_copy(aten.add.Tensor(dw, part), dtype=torch.bfloat16), dtype=weight.dtype)
        return dx, dw, (aten.sum.dim_IntList(grad, [0]) if ctx.has_bias else None)


SPLIT_K_ROWS = 2  # rows per split-K chunk of the weight gradient


def linear_backward_bf16(original: TorchFunction) -> TorchFunction:
    """float32 linear on a batched (3-D or more) input whose backward GEMMs lose precision
    to bfloat16 (input gradient from the bfloat16-rounded weight; weight gradient from
    bfloat16 split-K partial sums). The fault is INSIDE the call, below the reshape that
    torch's own linear does: msprobe records the view's gradient, as for a real kernel."""

    def faulty_linear(input, weight, bias=None):
        if input.dtype != torch.float32 or input.dim() < 3 or not torch.is_grad_enabled():
            return original(input, weight, bias)
        rows = input.reshape(-1, input.shape[-1])
        return _LinearBackwardBf16.apply(rows, weight, bias).view(*input.shape[:-1], weight.shape[0])

    return faulty_linear


class _EinsumBackwardScaled(torch.autograd.Function):
    """einsum with a correct forward and input gradients 2**-3 too large in magnitude (32
    bfloat16 ULPs): the exact (float64) gradients times 1 + 2**-3, rounded to the operands'
    dtype, as a backward that rescales by a wrong constant does."""

    @staticmethod
    def forward(ctx, original, equation, *operands):
        ctx.original, ctx.equation = original, equation
        ctx.save_for_backward(*operands)
        return original(equation, *operands)

    @staticmethod
    def backward(ctx, grad):
        operands = ctx.saved_tensors
        with torch.enable_grad():
            wide = [aten._to_copy(operand.detach(), dtype=torch.float64).requires_grad_() for operand in operands]
            exact = torch.autograd.grad(
                ctx.original(ctx.equation, *wide), wide, aten._to_copy(grad, dtype=torch.float64)
            )
        return (
            None,
            None,
            *(
                aten._to_copy(aten.mul.Scalar(value, 1 + 2**-3), dtype=operand.dtype)
                for value, operand in zip(exact, operands, strict=True)
            ),
        )


def einsum_backward_scaled(original: TorchFunction) -> TorchFunction:
    """bfloat16/float16 einsum whose input gradients are 2**-3 too large. The fault is
    INSIDE the call, below a view, as torch's own einsum ends in a reshape: msprobe records
    the view's gradient (the incoming one), so offline the input's gradient comes from the
    data flow, summed with the other readers' shares."""

    def faulty_einsum(equation, *operands):
        if not torch.is_grad_enabled() or not operands or operands[0].dtype not in (torch.bfloat16, torch.float16):
            return original(equation, *operands)
        output = _EinsumBackwardScaled.apply(original, equation, *operands)
        return output.view(output.shape)

    return faulty_einsum
