"""Which 16-bit kernels of ATen's CPU round a float32 result once: the measurement behind
pytest_msprobe/judge/verdict/rounding.py's table (results: studies/sixteen-bit-kernels-rounded-once.md).

    python studies/rounded_once.py [KERNEL ...]

For each API and direction, in bfloat16 and float16, on the CPU's ATen kernels (or
another device's: --device cuda), it counts the elements that differ
from the exact result rounded to D *and* lie farther than misrounding.far_ulp from it (the
far-misrounding test of standards/misrounding.py: half an ULP of D and 64 float32 ULPs), toward and away from zero, and the input
range they come from. Elementwise functions: every finite 16-bit input, its gradient a
random 16-bit N(0, 1) (a gradient of one hides a backward that multiplies by a rounded
output: exp's is g * exp(x) rounded at D). Normalisations: 3 x 64 x 256 inputs
N(0.5, 2), weights and statistics 16-bit values given to both sides. The exact result is
the float64 function of the same 16-bit inputs.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from pytest_msprobe.standards.dtypes import dtype_info
from pytest_msprobe.standards.metrics import ulp_of
from pytest_msprobe.standards.misrounding import far_ulp

HALF = (torch.bfloat16, torch.float16)


def _sixteen(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """16-bit parameters: the same values on the kernel's side and the exact side."""
    return values.to(torch.bfloat16).to(dtype)


def _params(x: torch.Tensor, n: int, low: float, high: float) -> torch.Tensor:
    """n 16-bit parameters from low to high, on x's device in x's dtype."""
    return _sixteen(torch.linspace(low, high, n), x.dtype if x.dtype in HALF else torch.bfloat16).to(x.device, x.dtype)


ELEMENTWISE: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu,
    "gelu(tanh)": lambda x: F.gelu(x, approximate="tanh"),
    **{name: getattr(F, name) for name in ("silu", "mish", "hardswish", "hardsigmoid", "softplus", "elu", "selu")},
    **{name: getattr(F, name) for name in ("celu", "leaky_relu", "relu", "relu6", "hardtanh", "logsigmoid")},
    **{name: getattr(F, name) for name in ("softsign", "tanhshrink")},
    **{name: getattr(torch, name) for name in ("tanh", "sigmoid", "exp", "expm1", "erf", "sin", "cos", "atan")},
    **{name: getattr(torch, name) for name in ("sinh", "cosh", "asinh", "log", "log1p", "sqrt", "rsqrt")},
    **{name: getattr(torch, name) for name in ("reciprocal", "square")},
}
ROWS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "layer_norm": lambda x: F.layer_norm(x, x.shape[-1:]),
    "layer_norm(16-bit weight)": lambda x: F.layer_norm(
        x, x.shape[-1:], _params(x, x.shape[-1], 0.5, 1.5), _params(x, x.shape[-1], -0.2, 0.2)
    ),
    "rms_norm": lambda x: F.rms_norm(x, x.shape[-1:]),
    "rms_norm(16-bit weight)": lambda x: F.rms_norm(x, x.shape[-1:], _params(x, x.shape[-1], 0.5, 1.5)),
    "softmax": lambda x: F.softmax(x, -1),
    "softmin": lambda x: F.softmin(x, -1),
    "log_softmax": lambda x: F.log_softmax(x, -1),
    "group_norm": lambda x: F.group_norm(x.reshape(8, 16, -1), 4, _params(x, 16, 0.5, 1.5), _params(x, 16, -0.2, 0.2)),
    "batch_norm(eval)": lambda x: F.batch_norm(
        x.reshape(8, 16, -1), _params(x, 16, -0.1, 0.1), _params(x, 16, 0.8, 1.3), _params(x, 16, 0.5, 1.5),
        _params(x, 16, -0.2, 0.2), training=False,
    ),
    "batch_norm(training)": lambda x: F.batch_norm(x.reshape(8, 16, -1), None, None, training=True),
    "instance_norm": lambda x: F.instance_norm(x.reshape(8, 16, -1)),
}  # fmt: skip


def every_finite(dtype: torch.dtype) -> torch.Tensor:
    """Every finite value of a 16-bit dtype."""
    x = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(dtype)
    return x[torch.isfinite(x)]


def outputs(
    fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, direction: str, seed: int, device: str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """(the 16-bit kernel's output or input gradient on `device`, the float64 one on the
    CPU) on the same inputs, both on the CPU."""
    if direction == "forward":
        return fn(x.to(device)).cpu(), fn(x.double())
    g = torch.randn(fn(x).shape, generator=torch.Generator().manual_seed(seed)).to(x.dtype)
    kernel, exact = x.to(device).clone().requires_grad_(), x.double().requires_grad_()
    fn(kernel).backward(g.to(device))
    fn(exact).backward(g.double())
    assert kernel.grad is not None and exact.grad is not None
    return kernel.grad.cpu(), exact.grad


def far(
    x: torch.Tensor, d: torch.Tensor, b: torch.Tensor, once: torch.Tensor | None = None
) -> tuple[int, int, int, str]:
    """(toward zero, away from zero, elements judged, the range of x they come from),
    over the elements `once` names (all where None)."""
    info = dtype_info(d.dtype)
    dd, bb = d.detach().double().numpy().ravel(), b.detach().double().numpy().ravel()
    judged = np.isfinite(dd) & np.isfinite(bb) & (np.abs(bb) <= float(torch.finfo(d.dtype).max))
    if once is not None:
        judged &= once.numpy().ravel()
    rounded = torch.from_numpy(bb).to(d.dtype).double().numpy()
    with np.errstate(all="ignore"):
        off = judged & (dd != rounded) & (np.abs(dd - bb) > far_ulp(info) * ulp_of(np.abs(bb), info))
    toward = off & ((dd < rounded) == (bb > 0))
    xs = x.double().numpy().ravel() if x.numel() == dd.size else np.zeros(dd.size)
    where = f" x in [{xs[off].min():.3g}, {xs[off].max():.3g}]" if off.any() else ""
    return int(toward.sum()), int((off & ~toward).sum()), int(judged.sum()), where


def row(name: str, fn: Callable[[torch.Tensor], torch.Tensor], exhaustive: bool, device: str) -> str:
    cells = [name]
    for direction in ("forward", "backward"):
        for dtype in HALF:
            toward = away = judged = 0
            where = ""
            for seed in range(1 if exhaustive else 3):
                x = (
                    every_finite(dtype)
                    if exhaustive
                    else (torch.randn(64, 256, generator=torch.Generator().manual_seed(seed)) * 2 + 0.5).to(dtype)
                )
                t, a, n, w = far(x, *outputs(fn, x, direction, seed + 1, device))
                toward, away, judged, where = toward + t, away + a, judged + n, where or w
            cells.append(f"{direction} {dtype_info(dtype).name}: {toward}/{away} of {judged}{where}")
    return " | ".join(cells)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kernels", nargs="*", help="the kernels to measure, by the names printed (default: all)")
    parser.add_argument("--device", default="cpu", help="where the 16-bit kernels run (cuda: a GPU's; default cpu)")
    options = parser.parse_args()
    only = options.kernels
    print("API | direction dtype: farther toward/away zero of elements judged, x range")
    for table, exhaustive in ((ELEMENTWISE, True), (ROWS, False)):
        for name, fn in table.items():
            if not only or name in only:
                print(row(name, fn, exhaustive, options.device), flush=True)


if __name__ == "__main__":
    main()
