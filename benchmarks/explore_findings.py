"""The two failures exploration finds in torch's own float32 CPU kernels (RESULTS-explore.md),
reproduced without the plugin: the kernel against float64, and a float32 formula without
the defect against float64. Both failures are the kernel's, not the check's.

    python benchmarks/explore_findings.py

- gelu's left tail: torch computes 0.5 x (1 + erf(x / sqrt(2))), whose sum cancels below
  x = -4 (pytorch/pytorch#187806); 0.5 x erfc(-x / sqrt(2)) does not.
- layer_norm's input gradient at a large input scale: torch's CPU backward multiplies by
  rstd**3, which falls among float32's subnormals once |x| reaches ~1e13 (sigma**3 past
  1e38); applying rstd to x_hat first keeps every intermediate normal.

Torch's bfloat16/float16 defects that real models' dumps show (batch_norm's statistics,
layer_norm's affine gradients, cross_entropy's gradient) are in benchmarks/torch_findings.py.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def _worst_relative(device: torch.Tensor, exact: torch.Tensor) -> float:
    return float(((device.double() - exact) / exact.abs().clamp_min(1e-300)).abs().max())


def gelu_tail() -> None:
    x = torch.linspace(-10.0, -4.0, 25, dtype=torch.float32)
    exact = 0.5 * x.double() * torch.special.erfc(-x.double() / math.sqrt(2))
    erfc_form = 0.5 * x * torch.special.erfc(-x / math.sqrt(2))
    print("gelu, float32, x in [-10, -4]: worst relative error against float64")
    print(f"  torch F.gelu             {_worst_relative(F.gelu(x), exact):.3g}")
    print(f"  0.5 x erfc(-x / sqrt 2)  {_worst_relative(erfc_form, exact):.3g}")
    for value in (-4.5, -5.0, -5.8, -6.0):
        point = torch.tensor([value])
        print(f"    x = {value}: torch {float(F.gelu(point)):.6g}, exact {float(0.5 * value * math.erfc(-value / math.sqrt(2))):.6g}")


def _layer_norm_input_grad(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """float32, no rstd**3: rstd (g - mean(g) - x_hat mean(g x_hat)), weight 1."""
    mean = x.mean(-1, keepdim=True)
    rstd = torch.rsqrt((x - mean).square().mean(-1, keepdim=True) + 1e-5)
    x_hat = (x - mean) * rstd
    return rstd * (g - g.mean(-1, keepdim=True) - x_hat * (g * x_hat).mean(-1, keepdim=True))


def layer_norm_scale() -> None:
    generator = torch.Generator().manual_seed(0)
    g = torch.randn(8, 32, generator=generator) * 2.0**-22
    print("layer_norm input gradient, float32, rows of 32: worst error in ULPs of float32 at max |exact| of the row")
    for exponent in (0, 20, 40, 50, 53, 56, 59):
        x = torch.randn(8, 32, generator=generator) * 2.0**exponent
        wide = x.double().requires_grad_()
        F.layer_norm(wide, [32], eps=1e-5).backward(g.double())
        exact = wide.grad
        kernel = x.clone().requires_grad_()
        F.layer_norm(kernel, [32], eps=1e-5).backward(g)
        scale = exact.abs().amax(-1, keepdim=True) * torch.finfo(torch.float32).eps
        ulps = lambda found, exact=exact, scale=scale: float(((found.double() - exact).abs() / scale).max())  # noqa: E731
        print(f"  |x| ~ 2**{exponent:<2}: torch {ulps(kernel.grad):10.1f}   without rstd**3 {ulps(_layer_norm_input_grad(x, g)):6.1f}")


if __name__ == "__main__":
    gelu_tail()
    layer_norm_scale()
