"""A nondeterministic kernel, planted for --msprobe-repeat's tests (`-p split_k_linear`,
or first thing in a script's interpreter): float32 torch.nn.functional.linear whose sums
land in a random order each run, as atomic adds make them on an accelerator. The
forward splits K into chunks accumulated in a random order (split-K); the backward adds
each batch row's share of the weight gradient in a random order. Every result is as
accurate as the true kernel's; only its bits vary. The float64 bench gets the true
function."""

import torch

_linear = torch.nn.functional.linear


class _SplitK(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        chunks = torch.randperm(weight.shape[1]).split(4)
        out = x[..., chunks[0]] @ weight[:, chunks[0]].T
        for chunk in chunks[1:]:
            out = out + x[..., chunk] @ weight[:, chunk].T
        return out + bias if ctx.has_bias else out

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        rows, grad_rows = x.reshape(-1, x.shape[-1]), grad.reshape(-1, grad.shape[-1])
        grad_weight = torch.zeros_like(weight)
        for row in torch.randperm(rows.shape[0]).tolist():
            grad_weight += torch.outer(grad_rows[row], rows[row])
        return grad @ weight, grad_weight, grad_rows.sum(0) if ctx.has_bias else None


def _nondeterministic_linear(x, weight, bias=None):
    return _SplitK.apply(x, weight, bias) if x.dtype == torch.float32 else _linear(x, weight, bias)


torch.nn.functional.linear = _nondeterministic_linear
