"""Planted faults that a dumped step does not trigger: numerically naive kernels, right
for the moderate values of one training step, wrong at the edges exploration searches.

Each replaces one torch function (patched with monkeypatch) and is wrong only in its
dtypes: the bench, which raises the call's precision (float64 for float32, float32 for
float16 and bfloat16), still computes the truth (so no fault is wrong in float32 and in
a 16-bit type at once). Each names a public report of the same
defect class in a real kernel, and the calls of the real dumps it is looked for on
(`where`: dump folder under tests/dumps/ or examples/ -> calls; the tests explore those,
studies/explore_faults_catalogue.py every call of the API in every dump of tests/dumps/models/).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from pytest_msprobe.testing.faults import TorchFunction

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16


def _naive_softmax(x: torch.Tensor, dim: int) -> torch.Tensor:
    """exp(x) / sum(exp(x)) in x's dtype: inf / inf = NaN once a logit passes ln(max)."""
    e = torch.exp(x)
    return e / e.sum(dim, keepdim=True)


def _softmax_without_max(original: TorchFunction, dtypes: tuple[torch.dtype, ...]) -> TorchFunction:
    def softmax(x: torch.Tensor, dim: Any = None, *args: Any, **kwargs: Any) -> torch.Tensor:
        if x.dtype not in dtypes:
            return original(x, dim, *args, **kwargs)
        return _naive_softmax(x, dim)

    return softmax


def _log_softmax_without_max(original: TorchFunction, dtypes: tuple[torch.dtype, ...]) -> TorchFunction:
    """x - log(sum(exp(x))): inf once a logit passes ln(max)."""

    def log_softmax(x: torch.Tensor, dim: Any = None, *args: Any, **kwargs: Any) -> torch.Tensor:
        if x.dtype not in dtypes:
            return original(x, dim, *args, **kwargs)
        return x - torch.log(torch.exp(x).sum(dim, keepdim=True))

    return log_softmax


def _logsumexp_without_max(original: TorchFunction, dtypes: tuple[torch.dtype, ...]) -> TorchFunction:
    def logsumexp(x: torch.Tensor, dim: Any, keepdim: bool = False, **kwargs: Any) -> torch.Tensor:
        if x.dtype not in dtypes:
            return original(x, dim, keepdim, **kwargs)
        return torch.log(torch.exp(x).sum(dim, keepdim=keepdim))

    return logsumexp


def _cross_entropy_without_max(original: TorchFunction, dtypes: tuple[torch.dtype, ...]) -> TorchFunction:
    """cross_entropy with log(sum(exp(x))) unshifted: inf once a logit passes ln(max)."""

    def cross_entropy(x: torch.Tensor, target: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if x.dtype not in dtypes:
            return original(x, target, *args, **kwargs)
        return F.nll_loss(x - torch.log(torch.exp(x).sum(1, keepdim=True)), target, *args, **kwargs)

    return cross_entropy


def _attention_without_max(original: TorchFunction, dtypes: tuple[torch.dtype, ...]) -> TorchFunction:
    """scaled_dot_product_attention by its formula, the softmax unshifted (in q's dtype)."""

    def attention(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        if q.dtype not in dtypes or dropout_p:
            return original(q, k, v, attn_mask, dropout_p, is_causal, scale=scale, **kwargs)
        scores = torch.matmul(q, k.transpose(-2, -1)) * (scale if scale is not None else q.shape[-1] ** -0.5)
        if is_causal:
            scores = scores.masked_fill(torch.ones(scores.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
        if attn_mask is not None:
            scores = (
                scores.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else scores + attn_mask
            )
        return torch.matmul(_naive_softmax(scores, -1), v)

    return attention


def _by_moments(x: torch.Tensor, dims: tuple[int, ...], eps: float) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps), var = E[x^2] - E[x]^2: cancels under a common offset."""
    mean = x.mean(dims, keepdim=True)
    var = (x * x).mean(dims, keepdim=True) - mean * mean
    return (x - mean) / torch.sqrt(var + eps)


def _affine(
    y: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, shape: tuple[int, ...]
) -> torch.Tensor:
    y = y * weight.reshape(shape) if weight is not None else y
    return y + bias.reshape(shape) if bias is not None else y


def _layer_norm_by_moments(original: TorchFunction, dtypes: tuple[torch.dtype, ...]) -> TorchFunction:
    def layer_norm(
        x: torch.Tensor, normalized_shape: Any, weight: Any = None, bias: Any = None, eps: float = 1e-5
    ) -> torch.Tensor:
        if x.dtype not in dtypes:
            return original(x, normalized_shape, weight, bias, eps)
        y = _by_moments(x, tuple(range(-len(normalized_shape), 0)), eps)
        return _affine(y, weight, bias, tuple(normalized_shape))

    return layer_norm


def _batch_norm_by_moments(original: TorchFunction, dtypes: tuple[torch.dtype, ...]) -> TorchFunction:
    """Training mode only (batch statistics); the running statistics are updated by the
    original kernel, so only the output is wrong."""

    def batch_norm(
        x: torch.Tensor,
        running_mean: Any,
        running_var: Any,
        weight: Any = None,
        bias: Any = None,
        training: bool = False,
        momentum: float = 0.1,
        eps: float = 1e-5,
    ) -> torch.Tensor:
        correct = original(x, running_mean, running_var, weight, bias, training, momentum, eps)
        if x.dtype not in dtypes or not training:
            return correct
        channels = (1, x.shape[1]) + (1,) * (x.dim() - 2)
        return _affine(_by_moments(x, tuple(d for d in range(x.dim()) if d != 1), eps), weight, bias, channels)

    return batch_norm


def _group_norm_by_moments(original: TorchFunction, dtypes: tuple[torch.dtype, ...]) -> TorchFunction:
    def group_norm(
        x: torch.Tensor, num_groups: int, weight: Any = None, bias: Any = None, eps: float = 1e-5
    ) -> torch.Tensor:
        if x.dtype not in dtypes:
            return original(x, num_groups, weight, bias, eps)
        grouped = x.reshape(x.shape[0], num_groups, -1)
        y = _by_moments(grouped, (2,), eps).reshape(x.shape)
        return _affine(y, weight, bias, (1, x.shape[1]) + (1,) * (x.dim() - 2))

    return group_norm


def _elementwise(
    formula: Callable[[torch.Tensor], torch.Tensor],
) -> Callable[[TorchFunction, tuple[torch.dtype, ...]], TorchFunction]:
    """A unary API computed by `formula` in its dtype."""

    def wrap(original: TorchFunction, dtypes: tuple[torch.dtype, ...]) -> TorchFunction:
        def unary(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            if not isinstance(x, torch.Tensor) or x.dtype not in dtypes or args or kwargs:
                return original(x, *args, **kwargs)
            return formula(x)

        return unary

    return wrap


def _mean_as_sum(original: TorchFunction, dtypes: tuple[torch.dtype, ...]) -> TorchFunction:
    """mean = sum / n with the sum rounded to x's dtype: overflows before the division."""

    def mean(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if x.dtype not in dtypes:
            return original(x, *args, **kwargs)
        total = x.sum(*args, **kwargs)
        return total / (x.numel() // max(total.numel(), 1))

    return mean


def _reciprocal_then_root(original: TorchFunction, dtypes: tuple[torch.dtype, ...]) -> TorchFunction:
    """rsqrt(x) as sqrt(1 / x): 1 / x overflows for small (subnormal) x."""
    return _elementwise(lambda x: torch.sqrt(torch.reciprocal(x)))(original, dtypes)


def _log_of_softmax(original: TorchFunction, dtypes: tuple[torch.dtype, ...]) -> TorchFunction:
    """cross_entropy as nll(log(softmax(x))): log(0) = -inf once a probability underflows."""

    def cross_entropy(x: torch.Tensor, target: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if x.dtype not in dtypes:
            return original(x, target, *args, **kwargs)
        return F.nll_loss(torch.log(torch.softmax(x, -1)), target, *args, **kwargs)

    return cross_entropy


def _squares_in_dtype(original: TorchFunction, dtypes: tuple[torch.dtype, ...]) -> TorchFunction:
    """rms_norm with the mean of squares kept in x's dtype: every x**2 rounded to it (float16
    overflows past 255.9) and summed term by term in it. Planted in float16 only: in
    bfloat16 the squares overflow where float32's do, and the sum's rounding over rows of
    16 to 64 stays at 1.8 to 3 ULP of the output (torch 0.6-0.7), within the standards
    (studies/exploration-excuses-and-defects.md)."""

    def rms_norm(x: torch.Tensor, normalized_shape: Any, weight: Any = None, eps: float | None = None) -> torch.Tensor:
        if x.dtype not in dtypes:
            return original(x, normalized_shape, weight, eps)
        squares = (x * x).flatten(x.dim() - len(normalized_shape))
        total = squares.new_zeros(squares.shape[:-1])
        for position in range(squares.shape[-1]):
            total = total + squares[..., position]
        mean = (total / max(squares.shape[-1], 1)).reshape(
            *x.shape[: x.dim() - len(normalized_shape)], *[1] * len(normalized_shape)
        )
        y = x * torch.rsqrt(
            mean + (torch.finfo(torch.float32).eps if eps is None else eps)
        )  # torch's default: float32's
        return y * weight if weight is not None else y

    return rms_norm


def _embedding_loss(cos: torch.Tensor, target: torch.Tensor, margin: float, reduction: str) -> torch.Tensor:
    """cosine_embedding_loss from cos (aten's Loss.cpp): 1 - cos where y = 1, max(0, cos - margin) where y = -1."""
    losses = torch.where(
        target == 1, 1 - cos, torch.where(target == -1, (cos - margin).clamp_min(0), torch.zeros_like(cos))
    )
    return {"none": losses, "sum": losses.sum()}.get(reduction, losses.mean())


def _one_minus_cos(original: TorchFunction, dtypes: tuple[torch.dtype, ...]) -> TorchFunction:
    """cosine_embedding_loss as 1 - cos with cos rounded to x1's dtype: for x2 near x1, cos
    rounds to 1 or 1 - eps and 1 - cos keeps no bit of its result (torch's own kernel, Loss.cpp)."""

    def loss(
        x1: torch.Tensor, x2: torch.Tensor, target: torch.Tensor, margin: float = 0.0, *args: Any, **kwargs: Any
    ) -> torch.Tensor:
        if x1.dtype not in dtypes or args or set(kwargs) - {"reduction"}:
            return original(x1, x2, target, margin, *args, **kwargs)
        dim = target.dim()
        squares = ((x1 * x1).sum(dim) + 1e-12) * ((x2 * x2).sum(dim) + 1e-12)
        return _embedding_loss(
            (x1 * x2).sum(dim) / torch.sqrt(squares), target, margin, kwargs.get("reduction", "mean")
        )

    return loss


def _rounded_once(original: TorchFunction, dtypes: tuple[torch.dtype, ...]) -> TorchFunction:
    """The API computed in float64 and rounded once to its dtype: a correct kernel where
    torch's own in that dtype has the catalogued defect (ExploreFault.correct)."""

    def widened(value: Any) -> Any:
        return value.double() if isinstance(value, torch.Tensor) and value.is_floating_point() else value

    def api(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if x.dtype not in dtypes:
            return original(x, *args, **kwargs)
        return original(x.double(), *map(widened, args), **{key: widened(value) for key, value in kwargs.items()}).to(
            x.dtype
        )

    return api


@dataclass(frozen=True)
class ExploreFault:
    owner: Any
    attr: str
    wrap: Callable[[TorchFunction, tuple[torch.dtype, ...]], TorchFunction]
    dtypes: tuple[torch.dtype, ...]
    citation: str  # a public report of the same defect in a real kernel ("": none found)
    where: dict[str, tuple[str, ...]]  # dump folder -> the calls exploration must fail on
    # a correct kernel patched in under the fault, and alone without it, where torch's own
    # kernel in the fault's dtypes has the fault (a known defect: python -m pytest_msprobe.judge.defects.reproduce)
    correct: Callable[[TorchFunction, tuple[torch.dtype, ...]], TorchFunction] | None = None

    def patch(self, monkeypatch: Any) -> None:
        original = getattr(self.owner, self.attr)
        base = self.correct(original, self.dtypes) if self.correct is not None else original
        monkeypatch.setattr(self.owner, self.attr, self.wrap(base, self.dtypes))

    def patch_correct(self, monkeypatch: Any) -> None:
        """The kernel the fault is judged against: the correct one where torch's own has the fault."""
        if self.correct is not None:
            monkeypatch.setattr(self.owner, self.attr, self.correct(getattr(self.owner, self.attr), self.dtypes))

    @property
    def api(self) -> str:
        """The dumped calls' prefix: `Functional.softmax`."""
        return next(iter(self.where.values()))[0].rsplit(".", 2)[0]


EXAMPLE = "examples/mlpcnn_tensor_fp32"
MODELS = "tests/dumps/models/"
SOFTMAX_WITHOUT_MAX = (
    "NVIDIA/FasterTransformer#43 'fastertransformer nan error' (the attention softmax did not subtract the max)"
)
LOSSES = MODELS + "losses_tensor_"
MOMENTS = "tracel-ai/burn#5607 'fused f32 layer_norm loses precision for rows with large mean (E[x^2]-E[x]^2)'"

FAULTS = {
    "softmax_without_max": ExploreFault(
        torch.Tensor,
        "softmax",
        _softmax_without_max,
        (F32,),
        SOFTMAX_WITHOUT_MAX,
        {
            EXAMPLE: ("Tensor.softmax.0.forward",),
            MODELS + "embedattn_tensor_fp32": ("Tensor.softmax.0.forward",),
        },  # masked: causal -inf
    ),
    "half_softmax_without_max": ExploreFault(
        torch.Tensor,
        "softmax",
        _softmax_without_max,
        (F16, BF16),
        SOFTMAX_WITHOUT_MAX,
        {MODELS + "embedattn_tensor_bf16": ("Tensor.softmax.0.forward",)},  # masked: causal -inf
    ),
    "functional_softmax_without_max": ExploreFault(
        torch.nn.functional,
        "softmax",
        _softmax_without_max,
        (F16, BF16),
        SOFTMAX_WITHOUT_MAX,
        {
            MODELS + "transformer12_tensor_fp16": ("Functional.softmax.0.forward", "Functional.softmax.11.forward"),
            MODELS + "transformer12_tensor_bf16": ("Functional.softmax.5.forward",),
        },
    ),
    "log_softmax_without_max": ExploreFault(
        torch.nn.functional,
        "log_softmax",
        _log_softmax_without_max,
        (F16, BF16),
        "intel/xFasterTransformer#326 'Fix numeric overflow when calculate softmax' (exp before the max is subtracted)",
        {
            MODELS + "apizoo_tensor_fp16": ("Functional.log_softmax.0.forward",),
            MODELS + "apizoo_tensor_bf16": ("Functional.log_softmax.0.forward",),
        },
    ),
    "attention_without_max": ExploreFault(
        torch.nn.functional,
        "scaled_dot_product_attention",
        _attention_without_max,
        (F16, BF16),
        SOFTMAX_WITHOUT_MAX,
        {
            MODELS + "apizoo_tensor_fp16": (
                "Functional.scaled_dot_product_attention.0.forward",
                "Functional.scaled_dot_product_attention.1.forward",
            ),
            MODELS + "apizoo_tensor_bf16": ("Functional.scaled_dot_product_attention.1.forward",),
        },
    ),
    "logsumexp_without_max": ExploreFault(
        torch,
        "logsumexp",
        _logsumexp_without_max,
        (F32,),
        "lzx1413/PytorchSSD#22 (log_sum_exp's max: 'in order to handle the overflow problem')",
        {MODELS + "apizoo_tensor_fp32": ("Torch.logsumexp.0.forward",)},
    ),
    "cross_entropy_without_max": ExploreFault(
        torch.nn.functional,
        "cross_entropy",
        _cross_entropy_without_max,
        (F32,),
        "lzx1413/PytorchSSD#22 (log_sum_exp's max: 'in order to handle the overflow problem')",
        {MODELS + "transformer12_tensor_fp32": ("Functional.cross_entropy.0.forward",)},
    ),
    "variance_by_moments": ExploreFault(
        torch.nn.functional,
        "layer_norm",
        _layer_norm_by_moments,
        (F32,),
        MOMENTS,
        {
            EXAMPLE: ("Functional.layer_norm.0.forward",),
            MODELS + "transformer12_tensor_fp32": (
                "Functional.layer_norm.3.forward",
                "Functional.layer_norm.24.forward",
            ),
        },
    ),
    "half_variance_by_moments": ExploreFault(
        torch.nn.functional,
        "layer_norm",
        _layer_norm_by_moments,
        (F16, BF16),
        MOMENTS,
        {
            MODELS + "transformer12_tensor_fp16": ("Functional.layer_norm.12.forward",),
            MODELS + "transformer12_tensor_bf16": (
                "Functional.layer_norm.0.forward",
            ),  # bfloat16's draws keep 4 bits: too few
            MODELS + "apizoo_tensor_bf16": ("Functional.layer_norm.0.forward",),
        },
    ),
    "batch_norm_by_moments": ExploreFault(
        torch.nn.functional,
        "batch_norm",
        _batch_norm_by_moments,
        (F32,),
        "tenstorrent/tt-metal#45968 'batch_norm (training): catastrophic variance cancellation (E[x^2] - E[x]^2)'",
        {MODELS + "convbn_tensor_fp32": ("Functional.batch_norm.0.forward", "Functional.batch_norm.1.forward")},
    ),
    "group_norm_by_moments": ExploreFault(
        torch.nn.functional,
        "group_norm",
        _group_norm_by_moments,
        (F32,),
        MOMENTS,
        {MODELS + "apizoo_tensor_fp32": ("Functional.group_norm.0.forward",)},
    ),
    "expm1_as_exp_minus_one": ExploreFault(
        torch,
        "expm1",
        _elementwise(lambda x: torch.exp(x) - 1),
        (F32,),
        "ggml-org/ggml#1515 'fix op_expm1 to use expm1f instead of expf(x) - 1'",
        {MODELS + "apizoo_tensor_fp32": ("Torch.expm1.0.forward",)},
    ),
    "log1p_as_log_of_sum": ExploreFault(
        torch,
        "log1p",
        _elementwise(lambda x: torch.log(1 + x)),
        (F32,),
        "CE-Programming/toolchain#515 'log1pf is inaccurate for small x' (logf(1.0f + x))",
        {MODELS + "apizoo_tensor_fp32": ("Torch.log1p.0.forward",)},
    ),
    "sigmoid_via_tanh": ExploreFault(
        torch,
        "sigmoid",
        _elementwise(lambda x: 0.5 * (1 + torch.tanh(0.5 * x))),
        (F32,),
        "tenstorrent/tt-metal#26211 'ttnn.sigmoid returns zero-valued tensor for moderately large negative values'",
        {MODELS + "apizoo_tensor_fp32": ("Torch.sigmoid.0.forward",)},
    ),
    "mean_as_sum_over_n": ExploreFault(
        torch.Tensor,
        "mean",
        _mean_as_sum,
        (F16,),
        "pytorch/pytorch#91597 'torch.mean(cpu) is implemented as torch.sum(x)/x.numel() which overflows on float16'",
        {MODELS + "apizoo_tensor_fp16": ("Tensor.mean.0.forward", "Tensor.mean.2.forward")},
    ),
    "log_of_softmax": ExploreFault(
        torch.nn.functional,
        "cross_entropy",
        _log_of_softmax,
        (F32,),
        "",  # no public report found
        {EXAMPLE: ("Functional.cross_entropy.0.forward",)},
    ),
    "reciprocal_then_root": ExploreFault(
        torch,
        "rsqrt",
        _reciprocal_then_root,
        (F32,),
        "",  # no public report found
        {EXAMPLE: ("Torch.rsqrt.0.forward",)},
    ),
    "rms_norm_squares_in_dtype": ExploreFault(
        torch.nn.functional,
        "rms_norm",
        _squares_in_dtype,
        (F16,),
        "nntrainer/nntrainer#3935 'FP16 Overflow in rms_norm_wrt_width_fp16_intrinsic' (the sum of squares accumulated in FP16)",
        {LOSSES + "fp16": ("Functional.rms_norm.0.forward", "Functional.rms_norm.1.forward")},
    ),
    "one_minus_cos": ExploreFault(
        torch.nn.functional,
        "cosine_embedding_loss",
        _one_minus_cos,
        (F32,),
        "pytorch/pytorch#14173 'CosineEmbeddingLoss loss does not make sense' (loss(x, x) = 4.17e-7 from 1 - cos, not 0)",
        {
            LOSSES + dtype: ("Functional.cosine_embedding_loss.0.forward", "Functional.cosine_embedding_loss.1.forward")
            for dtype in ("fp32", "fp16", "bf16")
        },
        correct=_rounded_once,
    ),
}
