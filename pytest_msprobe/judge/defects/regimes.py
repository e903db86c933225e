"""Where exploration's float32 defects of torch's CPU kernels show (judge/defects/table.py's
rows read them): each predicate says whether a call's inputs, in float64, reach the
intermediate the kernel forms and the API's definition does not (an overflow, an
underflow, a cancellation).
"""

from __future__ import annotations

import math

import torch

from pytest_msprobe.judge.defects.intermediates import Arguments, magnitude, underflows


def gelu_tail(call: Arguments) -> bool:
    """gelu (exact) of an x below -4, where 1 + erf(x / sqrt 2) cancels."""
    x = call.tensor(0, "input")
    exact = call.kwargs.get("approximate", "none") == "none"
    return exact and x is not None and bool((x.nan_to_num(0.0, 0.0, 0.0) < -4).any())


def gelu_tanh_gradient(call: Arguments) -> bool:
    """gelu(tanh)'s gradient where its inner derivative beta (1 + 3 kappa x**2) overflows
    float32 (|x| past ~5e19) while 1 - tanh**2 is already 0: 0 * inf."""
    x = call.tensor(0, "input")
    tanh = call.kwargs.get("approximate") == "tanh"
    return tanh and x is not None and magnitude(3 * 0.044715 * x.square(), False) > torch.finfo(torch.float32).max


def hardswish_product(call: Arguments) -> bool:
    """hardswish where x * relu6(x + 3) overflows float32 before the division by 6."""
    x = call.tensor(0, "input")
    return x is not None and magnitude(x * (x + 3).clamp(0, 6), False) > torch.finfo(torch.float32).max


def softplus_gradient(call: Arguments) -> bool:
    """softplus's gradient where g exp(beta x) overflows float32 below the threshold (the
    kernel's g z / (z + 1), z = exp(beta x), where the definition's g sigmoid(beta x) does not)."""
    x = call.tensor(0, "input")
    beta, threshold = (
        call.args[i] if len(call.args) > i else call.kwargs.get(key, default)
        for i, key, default in ((1, "beta", 1.0), (2, "threshold", 20.0))
    )
    if x is None or not call.grads or not isinstance(beta, (int, float)) or not isinstance(threshold, (int, float)):
        return False
    products = call.grads[0].abs() * torch.exp(beta * x).where(beta * x <= threshold, torch.zeros_like(x))
    return magnitude(products, False) > torch.finfo(torch.float32).max


def group_norm_squares(call: Arguments) -> bool:
    """group_norm (forward, and the backward from its forward's statistics) where an x**2
    overflows float32 (|x| past 1.84e19): torch's CPU kernel forms it (NaN from there on,
    measured; 1.2e-4 off at 1.83e19), the definition's (x - mean)**2 does not."""
    x = call.tensor(0, "input")
    return x is not None and magnitude(x.square(), False) > torch.finfo(torch.float32).max


def group_norm_gradient(call: Arguments) -> bool:
    """group_norm's input gradient where the CPU backward's fused rstd * weight, or its
    moment form's (mean sum(g w) - sum(g w x)) rstd**3, overflows float32 (per sample and
    group) while the definition's rstd (g w - mean(g w) - x_hat mean(g w x_hat)) is finite."""
    x, groups, weight = (
        call.tensor(0, "input"),
        call.args[1] if len(call.args) > 1 else call.kwargs.get("num_groups"),
        call.tensor(2, "weight"),
    )
    eps = call.args[4] if len(call.args) > 4 else call.kwargs.get("eps", 1e-5)
    if (
        x is None
        or weight is None
        or not call.grads
        or not isinstance(groups, int)
        or not isinstance(eps, float)
        or x.dim() < 2
    ):
        return False
    grouped = x.reshape(x.shape[0], groups, -1)
    mean, rstd = grouped.mean(-1), (grouped.var(-1, unbiased=False) + eps).rsqrt()
    products = (call.grads[0] * weight.reshape([1, -1] + [1] * (x.dim() - 2))).reshape(grouped.shape)
    moments = (products.sum(-1) * mean - (products * grouped).sum(-1)) * rstd**3
    fused = rstd.repeat_interleave(x.shape[1] // groups, 1) * weight.abs()
    return max(magnitude(moments, False), magnitude(fused, False)) > torch.finfo(
        torch.float32
    ).max or group_norm_squares(call)


def batch_norm_weight(call: Arguments) -> bool:
    """batch_norm where the CPU kernel's fused weight * rstd overflows float32 (rstd from the
    batch's statistics in training, the running variance otherwise) while the
    definition's weight * x_hat fits (the exact result is checked first: EXCUSES)."""
    x, running, weight = call.tensor(0, "input"), call.tensor(2, "running_var"), call.tensor(3, "weight")
    training = call.args[5] if len(call.args) > 5 else call.kwargs.get("training", False)
    eps = call.args[7] if len(call.args) > 7 else call.kwargs.get("eps", 1e-5)
    if x is None or weight is None or x.dim() < 2 or not isinstance(eps, float):
        return False
    variance = x.transpose(0, 1).reshape(x.shape[1], -1).var(-1, unbiased=False) if training is True else running
    if variance is None:
        return False
    return magnitude((variance + eps).rsqrt() * weight.abs(), False) > torch.finfo(torch.float32).max


def layer_norm_gradient(call: Arguments) -> bool:
    """layer_norm's backward where the CPU kernel's moment form leaves float32: its
    rstd**3 among the subnormals (sigma past ~4e12), its sums of g w x (x, not x_hat) or
    (mean sum(g w) - sum(g w x)) rstd**3 beyond the largest value, or a fused rstd * w,
    rstd * sum(g w) (rows of one element) beyond it; the definition's rstd (g w - mean(g w)
    - x_hat mean(g w x_hat)) forms none of them."""
    x, shape, weight = (
        call.tensor(0, "input"),
        call.args[1] if len(call.args) > 1 else call.kwargs.get("normalized_shape"),
        call.tensor(2, "weight"),
    )
    eps = call.args[4] if len(call.args) > 4 else call.kwargs.get("eps", 1e-5)
    if x is None or not call.grads or not isinstance(shape, (list, tuple)) or not shape or not isinstance(eps, float):
        return False
    dims = tuple(range(-len(shape), 0))
    mean, rstd = x.mean(dims), (x.var(dims, unbiased=False) + eps).rsqrt()
    products = call.grads[0] * (weight if weight is not None else 1.0)
    sums, moments = (products * x).sum(dims), products.sum(dims)
    largest, info = torch.finfo(torch.float32).max, torch.finfo(torch.float32)
    beyond = [
        (products * x).abs().sum(dims),
        (moments * mean - sums) * rstd**3,
        rstd * moments,
        rstd * magnitude(products, False),
    ]
    return any(magnitude(value, False) > largest for value in beyond) or underflows(rstd**3, info.smallest_normal)


def _attention_scores(call: Arguments) -> torch.Tensor | None:
    """q k^T scale with the causal or boolean mask's positions at -inf (an additive mask
    added), float64; None where the shapes do not broadcast."""
    q, k = call.tensor(0, "query"), call.tensor(1, "key")
    mask = call.args[3] if len(call.args) > 3 else call.kwargs.get("attn_mask")
    causal, given = (
        call.args[5] if len(call.args) > 5 else call.kwargs.get("is_causal", False),
        call.kwargs.get("scale"),
    )
    if q is None or k is None or q.dim() < 2:
        return None
    scale = float(given) if isinstance(given, (int, float)) else 1 / math.sqrt(q.shape[-1])
    try:
        scores = (q @ k.transpose(-2, -1)) * scale
        if causal is True:
            scores = scores.masked_fill(torch.ones(scores.shape[-2:], dtype=torch.bool).tril().logical_not(), -math.inf)
        if isinstance(mask, torch.Tensor):
            scores = (
                scores.masked_fill(mask.logical_not(), -math.inf)
                if mask.dtype == torch.bool
                else scores + mask.double()
            )
    except RuntimeError:
        return None
    return scores


def attention_accumulator(call: Arguments) -> bool:
    """The CPU flash forward's unnormalised sum of exp(s - max(s)) v along a query's row
    beyond float32, which the definition (softmax first, then P V) never forms."""
    scores, v = _attention_scores(call), call.tensor(2, "value")
    if scores is None or v is None:
        return False
    weights = (scores - scores.amax(-1, keepdim=True)).exp().nan_to_num(0.0, 0.0, 0.0)
    try:
        return magnitude(weights @ v.abs().nan_to_num(0.0, 0.0, 0.0), False) > torch.finfo(torch.float32).max
    except RuntimeError:
        return False


def attention_saturated(call: Arguments) -> bool:
    """Every query row of two keys or more saturated: its two largest scores further
    apart than ln(1 / eps) of float32, so that its softmax rounds to one-hot (a large
    offset of q): the CPU flash backward's key gradient is then nonzero where the exact
    one is 0, and torch's math kernel (the definition) is exact."""
    scores = _attention_scores(call)
    if scores is None or scores.shape[-1] < 2:
        return False
    top = scores.topk(2, -1).values
    rows = torch.isfinite(top[..., 1])
    gaps = (top[..., 0] - top[..., 1])[rows]
    return bool(gaps.numel()) and float(gaps.min()) > -math.log(torch.finfo(torch.float32).eps)
