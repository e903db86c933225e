"""Planted faults that a dumped step does not trigger: numerically naive kernels, right
for the moderate values of one training step, wrong at the edges exploration searches.
Each is wrong only in float32 (the example dump's dtype), so the float64 bench still
computes the truth; each replaces one torch function (patched with monkeypatch)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


def _softmax_without_max(original: Callable) -> Callable:
    """exp(x) / sum(exp(x)): overflows to inf/inf = NaN once a logit passes ~88."""

    def softmax(x: torch.Tensor, dim: Any = None, *args: Any, **kwargs: Any) -> torch.Tensor:
        if x.dtype != torch.float32:
            return original(x, dim, *args, **kwargs)
        e = torch.exp(x)
        return e / e.sum(dim, keepdim=True)

    return softmax


def _variance_by_moments(original: Callable) -> Callable:
    """layer_norm with var = E[x^2] - E[x]^2: cancels catastrophically under an offset."""

    def layer_norm(x: torch.Tensor, normalized_shape: Any, weight: Any = None, bias: Any = None, eps: float = 1e-5) -> torch.Tensor:
        if x.dtype != torch.float32:
            return original(x, normalized_shape, weight, bias, eps)
        dims = tuple(range(-len(normalized_shape), 0))
        mean = x.mean(dims, keepdim=True)
        var = (x * x).mean(dims, keepdim=True) - mean * mean
        y = (x - mean) / torch.sqrt(var + eps)
        return y * (weight if weight is not None else 1) + (bias if bias is not None else 0)

    return layer_norm


def _log_of_softmax(original: Callable) -> Callable:
    """cross_entropy as nll(log(softmax(x))): log(0) = -inf once a probability underflows."""

    def cross_entropy(x: torch.Tensor, target: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if x.dtype != torch.float32:
            return original(x, target, *args, **kwargs)
        return torch.nn.functional.nll_loss(torch.log(torch.softmax(x, -1)), target, *args, **kwargs)

    return cross_entropy


def _reciprocal_then_root(original: Callable) -> Callable:
    """rsqrt(x) as sqrt(1 / x): 1 / x overflows for small (subnormal) x."""

    def rsqrt(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if x.dtype != torch.float32:
            return original(x, *args, **kwargs)
        return torch.sqrt(torch.reciprocal(x))

    return rsqrt


@dataclass(frozen=True)
class ExploreFault:
    owner: Any
    attr: str
    wrap: Callable[[Callable], Callable]
    call: str  # the example dump's call it breaks

    def patch(self, monkeypatch: Any) -> None:
        monkeypatch.setattr(self.owner, self.attr, self.wrap(getattr(self.owner, self.attr)))


FAULTS = {
    "softmax_without_max": ExploreFault(torch.Tensor, "softmax", _softmax_without_max, "Tensor.softmax.0.forward"),
    "variance_by_moments": ExploreFault(torch.nn.functional, "layer_norm", _variance_by_moments, "Functional.layer_norm.0.forward"),
    "log_of_softmax": ExploreFault(torch.nn.functional, "cross_entropy", _log_of_softmax, "Functional.cross_entropy.0.forward"),
    "reciprocal_then_root": ExploreFault(torch, "rsqrt", _reciprocal_then_root, "Torch.rsqrt.0.forward"),
}
