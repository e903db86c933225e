"""The measured symptoms of known library defects (judge/defects/table.py's rows read them): a
call judged error shows a defect only where the failure disappears once the bench is
recomputed the way the defective kernel computes (the scalar operand rounded to the
dtype, the rows summed in the dtype, the gradient taken from the rounded log_softmax).
A new fault in the same API (a truncating or biased kernel, a NaN) still fails against
that bench, so it is never taken for the known defect.

Each symptom runs only for a call already judged error: a passing call costs nothing.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from pytest_msprobe.judge.defects.intermediates import Arguments, widen
from pytest_msprobe.judge.verdict.judgement import judge
from pytest_msprobe.run.replay import evaluate, run_backward

if TYPE_CHECKING:
    from pytest_msprobe.dump.values import Nested
    from pytest_msprobe.judge.verdict.judgement import Judgement

#: the reduced-precision dtypes whose kernels round what float32 would keep
REDUCED = (torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class Failure:
    """A call judged error, and what its symptom is measured on."""

    judgement: Judgement

    @property
    def args(self) -> list[Nested]:
        return self.judgement.results.inputs.args

    def argument(self, position: int, keyword: str, default: Nested = None) -> Nested:
        inputs = self.judgement.results.inputs
        return inputs.args[position] if position < len(inputs.args) else inputs.kwargs.get(keyword, default)

    @property
    def dtypes(self) -> set[torch.dtype]:
        """The floating dtypes of the call's tensors (a backward's incoming gradients too)."""
        return {leaf.tensor.dtype for leaf in self.judgement.results.inputs.leaves if leaf.tensor.is_floating_point()}

    def arguments(self) -> Arguments:
        """The call's arguments in float64, as the regimes read them."""
        inputs = self.judgement.results.inputs
        return Arguments(
            [widen(arg) for arg in inputs.args],
            {key: widen(value) for key, value in inputs.kwargs.items()},
            [g.double() for g in inputs.grads or [] if isinstance(g, torch.Tensor) and g.is_floating_point()],
            torch.empty(0),  # the forward's result: no regime reads it
        )

    def passes_against(self, bench: Nested) -> bool:
        """Whether the device passes against `bench` (the same standard, route and
        groups; not conditioned on the terms' magnitudes, whose allowance for a correct
        kernel's rounding would take in a biased one): the failure is then all the
        recomputed way's."""
        results = dataclasses.replace(self.judgement.results, bench=bench)
        strict = dataclasses.replace(self.judgement, results=results, terms=None)
        return judge(strict).status != "error"


def _dtype_of(value: Nested) -> torch.dtype | None:
    return value.dtype if isinstance(value, torch.Tensor) and value.is_floating_point() else None


def _rounded_scalar(value: Nested, dtype: torch.dtype) -> Nested:
    """A Python float as `dtype` holds it (a wrapped number takes the tensor's dtype)."""
    return float(torch.tensor(value, dtype=dtype)) if isinstance(value, float) else value


def float_scalar(call: Arguments) -> bool:
    """A Python float operand beside the tensor (not the `alpha` keyword)."""
    return any(isinstance(arg, float) for arg in call.args) or isinstance(call.kwargs.get("other"), float)


def scalar_rounded(failure: Failure) -> bool:
    """The device equals, up to the standard, the bench given the Python scalar rounded
    to the tensor's dtype first (torch's CPU add/sub wrap the scalar as a 0-dim tensor
    of the tensor's dtype; mul and div keep it in float32, measured on torch 2.13)."""
    dtypes = failure.dtypes
    dtype = next(iter(dtypes)) if len(dtypes) == 1 else None
    if dtype not in REDUCED:
        return False
    inputs = failure.judgement.results.inputs
    args = [_rounded_scalar(arg, dtype) for arg in inputs.args]
    kwargs = {key: _rounded_scalar(value, dtype) if key == "other" else value for key, value in inputs.kwargs.items()}
    if args == inputs.args and kwargs == inputs.kwargs:
        return False  # every scalar is a number of the dtype: nothing was rounded
    judgement = failure.judgement
    rounded = dataclasses.replace(inputs, args=args, kwargs=kwargs)
    bench = evaluate(judgement.bench, judgement.name.direction, rounded, judgement.framework)
    return bench is not None and failure.passes_against(bench)


def summed_in_chunks(terms: torch.Tensor, dtype: torch.dtype, threads: int) -> torch.Tensor:
    """The sum over the rows of `terms` (rows x N) as torch's CPU kernels of one dtype
    sum them: at::parallel_for splits the rows into min(threads, rows) chunks of
    ceil(rows / chunks), each summed row by row in `dtype` (a float32 add rounded to
    it), the chunks' sums then added in float32 and rounded once (measured: bit for bit
    on torch 2.13's layer_norm bias gradient, 1, 2 and 4 threads)."""
    rows = terms.shape[0]
    chunks = max(1, min(threads, rows))
    size = -(-rows // chunks)
    padded = torch.zeros(chunks * size, *terms.shape[1:], dtype=torch.float32)  # adding 0 leaves a sum as it is
    padded[:rows] = terms.float()
    blocks = padded.reshape(chunks, size, *terms.shape[1:])
    total = torch.zeros(chunks, *terms.shape[1:], dtype=dtype)
    for step in range(size):
        total = (total.float() + blocks[:, step]).to(dtype)
    return total.float().sum(0).to(dtype)


def layer_norm_summed_in_dtype(failure: Failure) -> bool:
    """The device passes against the bench whose weight and bias gradients are summed
    over the rows in the dtype, as torch's CPU layer_norm backward sums them where the
    weight and bias are of the input's dtype (its input gradient as the bench has it)."""
    x, shape, weight, bias = (
        failure.argument(0, "input"),
        failure.argument(1, "normalized_shape"),
        failure.argument(2, "weight"),
        failure.argument(3, "bias"),
    )
    grads, bench = failure.judgement.results.inputs.grads, failure.judgement.results.bench
    if not isinstance(x, torch.Tensor) or not isinstance(shape, (list, tuple)) or not grads or weight is None:
        return False
    sizes = [size for size in shape if isinstance(size, int)]
    if len(sizes) != len(shape):
        return False
    g = grads[0]
    if not isinstance(g, torch.Tensor) or _dtype_of(weight) != x.dtype or x.dtype not in REDUCED:
        return False
    if not isinstance(bench, tuple) or len(bench) != 2 + (bias is not None):
        return False
    width = math.prod(sizes)
    eps = failure.argument(4, "eps", 1e-5)
    # the row statistics the kernel saves (its forward's, in float32), applied as it applies them
    _, mean, rstd = torch.native_layer_norm(x.cpu(), sizes, None, None, float(eps))  # type: ignore[arg-type]
    rows, terms = x.reshape(-1, width).float(), g.reshape(-1, width).float()
    mean, rstd = mean.reshape(-1, 1).float(), rstd.reshape(-1, 1).float()
    x_hat = rows * rstd + (-rstd * mean)
    threads = torch.get_num_threads()
    sums = [summed_in_chunks(terms * x_hat, x.dtype, threads)]
    if bias is not None:
        sums.append(summed_in_chunks(terms, x.dtype, threads))
    return failure.passes_against((bench[0], *(s.float().reshape(sizes) for s in sums)))


def cross_entropy_from_rounded_log_softmax(failure: Failure) -> bool:
    """The device passes against the gradient taken, in float32, from the log_softmax in
    the dtype (what torch's CPU kernel saves and differentiates)."""
    x, target = failure.argument(0, "input"), failure.argument(1, "target")
    grads = failure.judgement.results.inputs.grads
    smoothing = failure.argument(7, "label_smoothing", 0.0)
    if not isinstance(x, torch.Tensor) or not isinstance(target, torch.Tensor) or target.is_floating_point():
        return False
    if x.dtype not in REDUCED or smoothing or not grads or not isinstance(grads[0], torch.Tensor):
        return False
    weight = failure.argument(2, "weight")
    dim = 1 if x.dim() > 1 else 0
    # the log_softmax in the dtype as torch's CPU kernel gives it (its own two roundings:
    # 784 of 1024 bfloat16 values equal float32's rounded once), which cross_entropy saves
    log_softmax = F.log_softmax(x.cpu(), dim).float().requires_grad_()
    loss = F.nll_loss(
        log_softmax,
        target,
        weight.float() if isinstance(weight, torch.Tensor) else None,
        ignore_index=int(failure.argument(4, "ignore_index", -100)),  # type: ignore[arg-type]
        reduction=str(failure.argument(6, "reduction", "mean")),
    )
    run_backward([loss], [grads[0].float()])  # autograd's engine as the replay runs it (no sympy import)
    incoming = log_softmax.grad
    if incoming is None:
        return False
    gradient = incoming - log_softmax.detach().exp() * incoming.sum(dim, keepdim=True)
    bench = failure.judgement.results.bench
    return failure.passes_against((gradient,) if isinstance(bench, tuple) else gradient)


def batch_norm_statistics_in_dtype(failure: Failure) -> bool:
    """The device passes against the normalisation by the batch's mean and inverse
    standard deviation rounded to the dtype, as torch's CPU kernel keeps them where the
    weight and bias are of the input's dtype (training: the batch's statistics)."""
    x, weight, bias = failure.argument(0, "input"), failure.argument(3, "weight"), failure.argument(4, "bias")
    training = failure.argument(5, "training", False)
    eps = failure.argument(7, "eps", 1e-5)
    if not isinstance(x, torch.Tensor) or x.dtype not in REDUCED or training is not True or x.dim() < 2:
        return False
    if _dtype_of(weight) != x.dtype or not isinstance(eps, float):
        return False
    dims = [0, *range(2, x.dim())]
    wide = x.float()
    mean = wide.mean(dims, keepdim=True)
    invstd = torch.rsqrt(wide.var(dims, unbiased=False, keepdim=True) + eps)
    normed = (wide - mean.to(x.dtype).float()) * invstd.to(x.dtype).float()
    view = [1, -1] + [1] * (x.dim() - 2)
    assert isinstance(weight, torch.Tensor)  # its dtype is the input's
    normed = normed * weight.float().reshape(view)
    if isinstance(bias, torch.Tensor):
        normed = normed + bias.float().reshape(view)
    return failure.passes_against(normed)


def in_regime(failure: Failure) -> bool:
    """For rows whose regime is the evidence (exploration's: an intermediate leaves the
    dtype's range there), any failure of the API in it."""
    return True
