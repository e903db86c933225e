"""JAX/XLA as a library family: each PyTorch API of the calibration dumps written with
jax.numpy / jax.lax / jax.nn, as a JAX user would write it, for
studies/library_families.py.

Why: XLA's CPU kernels are a second real library (its own elementwise approximations:
a rational tanh, its own erf, exp and log; its own reductions and dot kernels), as CANN's
or cuDNN's are to ATen. Each entry takes the API's arguments under torch's parameter names
(so a dumped call binds as it did in torch) with tensors as float32 (float64) arrays and
returns the output(s); the harness raises 16-bit inputs to float32 and rounds each result
once to the dump's dtype, as correct accelerator kernels do. jax.vjp of the same function
gives the backward. An API missing here keeps its dumped (ATen) output and is counted as
not recomputed. Needs `jax[cpu]` (imported with this module).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

jax.config.update("jax_enable_x64", True)  # int64 indices and float64 tensors stay what they are

Array = Any  # a jax array (jax.Array), or a Python scalar where torch takes one


def _axes(dim: int | Sequence[int] | None, ndim: int) -> tuple[int, ...] | None:
    """torch's dim (int, list, None) as jax's axis tuple."""
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return None
    dims = [dim] if isinstance(dim, int) else list(dim)
    return tuple(d % ndim for d in dims)


def _pair(value: int | Sequence[int], n: int) -> tuple[int, ...]:
    return tuple(value) if isinstance(value, (list, tuple)) else (value,) * n


# --- elementwise ------------------------------------------------------------------------


def gelu(input: Array, approximate: str = "none") -> Array:
    return jax.nn.gelu(input, approximate=approximate == "tanh")


def softplus(input: Array, beta: float = 1.0, threshold: float = 20.0) -> Array:
    scaled = input * beta
    return jnp.where(scaled > threshold, input, jax.nn.softplus(scaled) / beta)


def mish(input: Array, inplace: bool = False) -> Array:
    return input * jnp.tanh(jax.nn.softplus(input))


def elu(input: Array, alpha: float = 1.0, inplace: bool = False) -> Array:
    return jax.nn.elu(input, alpha)


def unary(function: Callable[[Array], Array]) -> Callable[..., Array]:
    """An API of one tensor (and torch's inplace flag, ignored: the harness never writes in place)."""

    def call(input: Array, *_: Any, **__: Any) -> Array:
        return function(input)

    return call


def pow_(input: Array, exponent: Array) -> Array:
    return jnp.power(input, exponent)


def add(input: Array, other: Array, alpha: float = 1) -> Array:
    return input + other * alpha if alpha != 1 else input + other


def radd(input: Array, other: Array) -> Array:
    return other + input


def sub(input: Array, other: Array, alpha: float = 1) -> Array:
    return input - other * alpha if alpha != 1 else input - other


def masked_fill(input: Array, mask: Array, value: Array) -> Array:
    return jnp.where(mask, jnp.asarray(value, dtype=input.dtype), input)


def where(condition: Array, input: Array, other: Array) -> Array:
    return jnp.where(condition, input, other)


# --- reductions -------------------------------------------------------------------------


def sum_(input: Array, dim: Any = None, keepdim: bool = False, dtype: Any = None) -> Array:
    return jnp.sum(input, axis=_axes(dim, input.ndim), keepdims=keepdim)


def mean(input: Array, dim: Any = None, keepdim: bool = False, dtype: Any = None) -> Array:
    return jnp.mean(input, axis=_axes(dim, input.ndim), keepdims=keepdim)


def amax(input: Array, dim: Any = (), keepdim: bool = False) -> Array:
    return jnp.max(input, axis=_axes(dim, input.ndim), keepdims=keepdim)


def var(
    input: Array, dim: Any = None, unbiased: bool = True, keepdim: bool = False, *, correction: Any = None
) -> Array:
    ddof = (1 if unbiased else 0) if correction is None else correction
    return jnp.var(input, axis=_axes(dim, input.ndim), ddof=ddof, keepdims=keepdim)


def std(
    input: Array, dim: Any = None, unbiased: bool = True, keepdim: bool = False, *, correction: Any = None
) -> Array:
    return jnp.sqrt(var(input, dim, unbiased, keepdim, correction=correction))


def norm(input: Array, p: Any = "fro", dim: Any = None, keepdim: bool = False, dtype: Any = None) -> Array:
    if p not in ("fro", 2, 2.0):
        raise NotImplementedError(f"norm p={p!r}")
    return jnp.sqrt(jnp.sum(input * input, axis=_axes(dim, input.ndim), keepdims=keepdim))


def logsumexp(input: Array, dim: Any, keepdim: bool = False) -> Array:
    return jax.nn.logsumexp(input, axis=_axes(dim, input.ndim), keepdims=keepdim)


def cumsum(input: Array, dim: int, dtype: Any = None) -> Array:
    return jnp.cumsum(input, axis=dim)


def softmax(input: Array, dim: int | None = None, _stacklevel: int = 3, dtype: Any = None) -> Array:
    return jax.nn.softmax(input, axis=-1 if dim is None else dim)


def log_softmax(input: Array, dim: int | None = None, _stacklevel: int = 3, dtype: Any = None) -> Array:
    return jax.nn.log_softmax(input, axis=-1 if dim is None else dim)


# --- normalisations ---------------------------------------------------------------------


def _affine(y: Array, weight: Array | None, bias: Array | None, shape: tuple[int, ...]) -> Array:
    if weight is not None:
        y = y * weight.reshape(shape)
    if bias is not None:
        y = y + bias.reshape(shape)
    return y


def layer_norm(
    input: Array, normalized_shape: Sequence[int], weight: Array = None, bias: Array = None, eps: float = 1e-5
) -> Array:
    axes = tuple(range(input.ndim - len(normalized_shape), input.ndim))
    centred = input - jnp.mean(input, axis=axes, keepdims=True)
    y = centred * lax.rsqrt(jnp.mean(centred * centred, axis=axes, keepdims=True) + eps)
    return _affine(y, weight, bias, tuple(normalized_shape))


def rms_norm(input: Array, normalized_shape: Sequence[int], weight: Array = None, eps: float | None = None) -> Array:
    axes = tuple(range(input.ndim - len(normalized_shape), input.ndim))
    eps = float(jnp.finfo(input.dtype).eps) if eps is None else eps  # torch: the compute type's epsilon
    y = input * lax.rsqrt(jnp.mean(input * input, axis=axes, keepdims=True) + eps)
    return y if weight is None else y * weight


def _standardise(input: Array, axes: tuple[int, ...], eps: float) -> Array:
    mu = jnp.mean(input, axis=axes, keepdims=True)
    centred = input - mu
    return centred * lax.rsqrt(jnp.mean(centred * centred, axis=axes, keepdims=True) + eps)


def group_norm(input: Array, num_groups: int, weight: Array = None, bias: Array = None, eps: float = 1e-5) -> Array:
    n, c = input.shape[:2]
    grouped = input.reshape(n, num_groups, -1)
    y = _standardise(grouped, (2,), eps).reshape(input.shape)
    return _affine(y, weight, bias, (1, c) + (1,) * (input.ndim - 2))


def batch_norm(
    input: Array,
    running_mean: Array,
    running_var: Array,
    weight: Array = None,
    bias: Array = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> Array:
    shape = (1, input.shape[1]) + (1,) * (input.ndim - 2)
    if training:
        y = _standardise(input, (0, *range(2, input.ndim)), eps)
    else:
        y = (input - running_mean.reshape(shape)) * lax.rsqrt(running_var.reshape(shape) + eps)
    return _affine(y, weight, bias, shape)


def instance_norm(
    input: Array,
    running_mean: Array = None,
    running_var: Array = None,
    weight: Array = None,
    bias: Array = None,
    use_input_stats: bool = True,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> Array:
    if not use_input_stats:
        raise NotImplementedError("instance_norm with running statistics")
    y = _standardise(input, tuple(range(2, input.ndim)), eps)
    return _affine(y, weight, bias, (1, input.shape[1]) + (1,) * (input.ndim - 2))


def normalize(input: Array, p: float = 2.0, dim: int = 1, eps: float = 1e-12, out: Any = None) -> Array:
    if p != 2:
        raise NotImplementedError(f"normalize p={p!r}")
    length = jnp.sqrt(jnp.sum(input * input, axis=dim, keepdims=True))
    return input / jnp.maximum(length, eps)


# --- products, convolutions, pooling ----------------------------------------------------


def linear(input: Array, weight: Array, bias: Array = None) -> Array:
    y = jnp.matmul(input, weight.T)
    return y if bias is None else y + bias


def matmul(input: Array, other: Array) -> Array:
    return jnp.matmul(input, other)


def addmm(input: Array, mat1: Array, mat2: Array, *, beta: float = 1, alpha: float = 1) -> Array:
    return beta * input + alpha * jnp.matmul(mat1, mat2)


def einsum(equation: str, *operands: Array) -> Array:
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    return jnp.einsum(equation, *operands)


def _conv(spatial: int) -> Callable[..., Array]:
    letters = "HWD"[:spatial]

    def conv(
        input: Array,
        weight: Array,
        bias: Array = None,
        stride: Any = 1,
        padding: Any = 0,
        dilation: Any = 1,
        groups: int = 1,
    ) -> Array:
        if isinstance(padding, str):
            raise NotImplementedError(f"conv padding={padding!r}")
        pads = [(p, p) for p in _pair(padding, spatial)]
        numbers = ("NC" + letters, "OI" + letters, "NC" + letters)
        y = lax.conv_general_dilated(
            input,
            weight,
            _pair(stride, spatial),
            pads,
            rhs_dilation=_pair(dilation, spatial),
            dimension_numbers=numbers,
            feature_group_count=groups,
        )
        return y if bias is None else y + bias.reshape((1, -1) + (1,) * spatial)

    return conv


def _pool(spatial: int, kind: str) -> Callable[..., Array]:
    def pool(
        input: Array,
        kernel_size: Any,
        stride: Any = None,
        padding: Any = 0,
        *rest: Any,
        **options: Any,
    ) -> Array:
        if any(_pair(padding, spatial)) or options.get("ceil_mode") or options.get("divisor_override") or any(rest):
            raise NotImplementedError("pooling with padding, ceil_mode or a divisor")
        kernel = _pair(kernel_size, spatial)
        strides = _pair(stride if stride not in (None, []) else kernel_size, spatial)
        window, step = (1, 1, *kernel), (1, 1, *strides)
        if kind == "max":
            return lax.reduce_window(input, -jnp.inf, lax.max, window, step, "VALID")
        return lax.reduce_window(input, 0.0, lax.add, window, step, "VALID") / math.prod(kernel)

    return pool


def interpolate(
    input: Array,
    size: Any = None,
    scale_factor: Any = None,
    mode: str = "nearest",
    align_corners: bool | None = None,
    recompute_scale_factor: Any = None,
    antialias: bool = False,
) -> Array:
    if mode not in ("bilinear", "linear") or align_corners or size is not None:
        raise NotImplementedError(f"interpolate mode={mode!r} align_corners={align_corners!r} size={size!r}")
    spatial = input.ndim - 2
    scales = _pair(scale_factor, spatial)
    shape = (*input.shape[:2], *(int(n * s) for n, s in zip(input.shape[2:], scales, strict=True)))
    return jax.image.resize(input, shape, method="linear", antialias=False)  # half-pixel centres: align_corners=False


def embedding(input: Array, weight: Array, padding_idx: Any = None, max_norm: Any = None, *_: Any, **__: Any) -> Array:
    if max_norm is not None:
        raise NotImplementedError("embedding with max_norm")
    return jnp.take(weight, input, axis=0)


# --- losses and attention ---------------------------------------------------------------


def cross_entropy(
    input: Array,
    target: Array,
    weight: Array = None,
    size_average: Any = None,
    ignore_index: int = -100,
    reduce: Any = None,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
) -> Array:
    if weight is not None or label_smoothing or not jnp.issubdtype(target.dtype, jnp.integer):
        raise NotImplementedError("cross_entropy with weights, label smoothing or probabilities")
    logp = jax.nn.log_softmax(input, axis=1)
    kept = target != ignore_index
    picked = jnp.take_along_axis(logp, jnp.expand_dims(jnp.where(kept, target, 0), 1), axis=1).squeeze(1)
    losses = jnp.where(kept, -picked, 0.0)
    if reduction == "none":
        return losses
    return jnp.sum(losses) if reduction == "sum" else jnp.sum(losses) / jnp.sum(kept)


def cosine_similarity(x1: Array, x2: Array, dim: int = 1, eps: float = 1e-8) -> Array:
    dot = jnp.sum(x1 * x2, axis=dim)
    squared = jnp.sum(x1 * x1, axis=dim) * jnp.sum(x2 * x2, axis=dim)
    return dot / jnp.sqrt(jnp.maximum(squared, eps * eps))


def pairwise_distance(x1: Array, x2: Array, p: float = 2.0, eps: float = 1e-6, keepdim: bool = False) -> Array:
    if p != 2:
        raise NotImplementedError(f"pairwise_distance p={p!r}")
    diff = x1 - x2 + eps
    return jnp.sqrt(jnp.sum(diff * diff, axis=-1, keepdims=keepdim))


def cosine_embedding_loss(
    input1: Array,
    input2: Array,
    target: Array,
    margin: float = 0.0,
    size_average: Any = None,
    reduce: Any = None,
    reduction: str = "mean",
) -> Array:
    tiny = 1e-12  # torch's EPSILON in cosine_embedding_loss
    dot = jnp.sum(input1 * input2, axis=-1)
    cos = dot / jnp.sqrt((jnp.sum(input1 * input1, axis=-1) + tiny) * (jnp.sum(input2 * input2, axis=-1) + tiny))
    losses = jnp.where(target == 1, 1 - cos, jnp.where(target == -1, jnp.maximum(cos - margin, 0.0), 0.0))
    if reduction == "none":
        return losses
    return jnp.sum(losses) if reduction == "sum" else jnp.mean(losses)


def scaled_dot_product_attention(
    query: Array,
    key: Array,
    value: Array,
    attn_mask: Array = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Array:
    if dropout_p:
        raise NotImplementedError("attention with dropout")
    scale = 1 / math.sqrt(query.shape[-1]) if scale is None else scale
    scores = jnp.matmul(query, jnp.swapaxes(key, -1, -2)) * scale
    length, source = scores.shape[-2:]
    if is_causal:
        scores = jnp.where(jnp.tril(jnp.ones((length, source), dtype=bool)), scores, -jnp.inf)
    if attn_mask is not None:
        scores = jnp.where(attn_mask, scores, -jnp.inf) if attn_mask.dtype == jnp.bool_ else scores + attn_mask
    return jnp.matmul(jax.nn.softmax(scores, axis=-1), value)


#: API (as dump.json names it, without its call index) -> its JAX equivalent
TABLE: dict[str, Callable[..., Any]] = {
    "Functional.gelu": gelu,
    "Functional.silu": unary(jax.nn.silu),
    "Functional.relu": unary(jax.nn.relu),
    "Functional.elu": elu,
    "Functional.mish": mish,
    "Functional.softplus": softplus,
    "Functional.hardswish": unary(jax.nn.hard_swish),
    "Functional.hardsigmoid": unary(jax.nn.hard_sigmoid),
    "Torch.tanh": unary(jnp.tanh),
    "Torch.sigmoid": unary(jax.nn.sigmoid),
    "Torch.exp": unary(jnp.exp),
    "Tensor.exp": unary(jnp.exp),
    "Torch.expm1": unary(jnp.expm1),
    "Torch.log1p": unary(jnp.log1p),
    "Torch.erf": unary(lax.erf),
    "Torch.sin": unary(jnp.sin),
    "Torch.cos": unary(jnp.cos),
    "Torch.rsqrt": unary(lax.rsqrt),
    "Tensor.abs": unary(jnp.abs),
    "Torch.pow": pow_,
    "Tensor.pow": pow_,
    "Torch.atan2": jnp.arctan2,
    "Tensor.__add__": add,
    "Tensor.__radd__": radd,
    "Tensor.__sub__": sub,
    "Tensor.__mul__": jnp.multiply,
    "Tensor.__truediv__": jnp.true_divide,
    "Tensor.__gt__": jnp.greater,
    "Tensor.masked_fill": masked_fill,
    "Torch.where": where,
    "Tensor.sum": sum_,
    "Tensor.mean": mean,
    "Tensor.amax": amax,
    "Torch.var": var,
    "Torch.std": std,
    "Torch.norm": norm,
    "Torch.logsumexp": logsumexp,
    "Torch.cumsum": cumsum,
    "Functional.softmax": softmax,
    "Tensor.softmax": softmax,
    "Functional.log_softmax": log_softmax,
    "Functional.layer_norm": layer_norm,
    "Functional.rms_norm": rms_norm,
    "Functional.group_norm": group_norm,
    "Functional.batch_norm": batch_norm,
    "Functional.instance_norm": instance_norm,
    "Functional.normalize": normalize,
    "Functional.linear": linear,
    "Torch.matmul": matmul,
    "Tensor.__matmul__": matmul,
    "Torch.bmm": matmul,
    "Torch.addmm": addmm,
    "Torch.einsum": einsum,
    "Functional.conv1d": _conv(1),
    "Functional.conv2d": _conv(2),
    "Functional.avg_pool1d": _pool(1, "avg"),
    "Functional.avg_pool2d": _pool(2, "avg"),
    "Functional.max_pool1d": _pool(1, "max"),
    "Functional.max_pool2d": _pool(2, "max"),
    "Functional.interpolate": interpolate,
    "Functional.embedding": embedding,
    "Functional.cross_entropy": cross_entropy,
    "Functional.cosine_similarity": cosine_similarity,
    "Functional.pairwise_distance": pairwise_distance,
    "Functional.cosine_embedding_loss": cosine_embedding_loss,
    "Functional.scaled_dot_product_attention": scaled_dot_product_attention,
}


def to_jax(value: Any) -> Any:
    """A numpy array or nested list of them as jax arrays; everything else as it is."""
    import numpy as np

    if isinstance(value, np.ndarray):
        return jnp.asarray(value)
    if isinstance(value, (list, tuple)):
        return type(value)(to_jax(item) for item in value)
    return value


def forward(api: str, args: list[Any], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """The outputs of api on numpy arguments, as numpy arrays."""
    import numpy as np

    result = TABLE[api](*to_jax(args), **{k: to_jax(v) for k, v in kwargs.items()})
    outputs = result if isinstance(result, tuple) else (result,)
    return tuple(np.asarray(out) for out in outputs)


def backward(
    api: str, args: list[Any], kwargs: dict[str, Any], wrt: list[tuple[str, Any]], cotangents: list[Any]
) -> list[Any]:
    """The gradients of api's outputs, weighted by cotangents (numpy, one per output), with
    respect to the arguments wrt names (("args", i) or ("kwargs", key)), as numpy arrays."""
    import numpy as np

    function = TABLE[api]
    fixed_args, fixed_kwargs = to_jax(list(args)), {k: to_jax(v) for k, v in kwargs.items()}

    def of(*chosen: Any) -> Any:
        call_args, call_kwargs = list(fixed_args), dict(fixed_kwargs)
        for (where, key), value in zip(wrt, chosen, strict=True):
            if where == "args":
                call_args[key] = value
            else:
                call_kwargs[key] = value
        result = function(*call_args, **call_kwargs)
        return result if isinstance(result, tuple) else (result,)

    primals = [fixed_args[key] if where == "args" else fixed_kwargs[key] for where, key in wrt]
    outputs, pullback = jax.vjp(of, *primals)
    cots = tuple(jnp.asarray(c, dtype=o.dtype) for c, o in zip(cotangents, outputs, strict=True))
    return [np.asarray(g) for g in pullback(cots)]
