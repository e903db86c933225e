"""Planted faults modelled on defects that real accelerator kernels have shown.

Each fault is a wrapper `fault.wrap(original) -> faulty` for one torch API, wrong only
when the call runs in one of the fault's dtypes, so the bench (which raises float16 and
bfloat16 to float32 and float32 to float64) still computes the truth. Two uses:

- in-process (single-run mode), as `faults.py`'s `scaled_in` is used: patch the
  API on the device side only, e.g.
  `monkeypatch.setattr(fault.owner, fault.attr, fault.wrap(getattr(fault.owner, fault.attr)))`
  (or `fault.patch(monkeypatch)`), then run the dump through the plugin;
- while dumping (`tests/dumps/models/make_dumps.py MODEL DTYPE OUT --fault NAME`): the API
  is patched before msprobe wraps it, so the dumped outputs carry the fault (offline mode).

The faulty functions keep the autograd node of the correct kernel wherever the fault is
in the forward only: the correct kernel runs, then its output's values are overwritten
(through `.data`, so autograd keeps the node and what it saved). msprobe records a call's
backward from the node that produced its output, so a fault dump's backward entries look
like those of a real dump. Where the fault is in the backward only, a custom autograd
node with the same inputs as the native one (same tensor edges, in the same order)
computes the wrong gradients.

Sources (read, not copied) are in the fault table of `tests/dumps/models/make_dumps.py`
and in `FAULTS[name].citation` below.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from pytest_msprobe.testing.backward_faults import (
    einsum_backward_scaled,
    embedding_backward_lost_duplicates,
    linear_backward_bf16,
    maxpool_backward_all_ties,
    softmax_backward_half_accumulator,
)
from pytest_msprobe.testing.faults import TorchFunction


class Patcher(Protocol):
    """What patch() needs of pytest's monkeypatch fixture (this package imports no pytest)."""

    def setattr(self, target: object, name: str, value: object) -> None: ...


# --- rounding helpers -----------------------------------------------------------


def truncate_to_bfloat16(value: torch.Tensor) -> torch.Tensor:
    """float32 -> bfloat16 by dropping the low 16 bits: round toward zero (NaN kept)."""
    value = value.to(torch.float32).contiguous()
    bits = value.view(torch.int32) & ~0xFFFF
    truncated = bits.view(torch.float32)
    truncated = torch.where(torch.isnan(value), value, truncated)
    return truncated.to(torch.bfloat16)  # exact: the low bits are zero


def round_float64_toward_zero(value: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """float64 -> `dtype` rounded toward zero (instead of to nearest)."""
    nearest = value.to(dtype)
    overshoot = nearest.to(torch.float64).abs() > value.abs()
    return torch.where(overshoot, torch.nextafter(nearest, torch.zeros_like(nearest)), nearest)


def round_to_tf32(value: torch.Tensor) -> torch.Tensor:
    """float32 -> TF32 (10 explicit mantissa bits, round to nearest even), stored as float32."""
    value = value.to(torch.float32).contiguous()
    bits = value.view(torch.int32)
    rounded = (bits + 0xFFF + ((bits >> 13) & 1)) & ~0x1FFF
    out = rounded.view(torch.float32)
    return torch.where(torch.isfinite(value), out, value)


def _overwrite(output: torch.Tensor, wrong: torch.Tensor) -> torch.Tensor:
    """The output keeps its autograd node; only its values change."""
    output.data.copy_(wrong.to(output.dtype))
    return output


# --- the faulty kernels ---------------------------------------------------------


def bf16_truncation(original: TorchFunction) -> TorchFunction:
    """Elementwise add in bfloat16: computed in float32, then converted to bfloat16 by
    truncation (round toward zero) instead of round-to-nearest-even."""

    def faulty_add(self: torch.Tensor, other: torch.Tensor | float, *args: object, **kwargs: object) -> torch.Tensor:
        output = original(self, other, *args, **kwargs)
        if args or kwargs or not (isinstance(output, torch.Tensor) and output.dtype == torch.bfloat16):
            return output
        with torch.no_grad():
            a = self.detach().to(torch.float32)
            b = other.detach().to(torch.float32) if isinstance(other, torch.Tensor) else other
            exact = torch.add(a, b)
            return _overwrite(output, truncate_to_bfloat16(exact))

    return faulty_add


def dot_toward_zero(original: TorchFunction) -> TorchFunction:
    """float32 and bfloat16 linear whose result is the exact (float64) product rounded
    toward zero to the input's dtype."""

    def faulty_linear(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        output = original(input, weight, bias)
        if input.dtype not in (torch.float32, torch.bfloat16):
            return output
        with torch.no_grad():
            exact = original(
                input.detach().double(), weight.detach().double(), None if bias is None else bias.detach().double()
            )
            return _overwrite(output, round_float64_toward_zero(exact, input.dtype))

    return faulty_linear


def fp16_gemm_fp16_accumulation(original: TorchFunction) -> TorchFunction:
    """float16 linear that accumulates the dot products in float16 (every partial sum
    rounded to float16; the products themselves are exact), bias added at the end."""

    def faulty_linear(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        output = original(input, weight, bias)
        if input.dtype != torch.float16:
            return output
        with torch.no_grad():
            x, w = input.detach().to(torch.float32), weight.detach().to(torch.float32)
            acc = torch.zeros(output.shape, dtype=torch.float16)
            for k in range(x.shape[-1]):
                acc = (acc.to(torch.float32) + x[..., k : k + 1] * w[:, k]).to(torch.float16)
            if bias is not None:
                acc = (acc.to(torch.float32) + bias.detach().to(torch.float32)).to(torch.float16)
            return _overwrite(output, acc)

    return faulty_linear


def tf32_conv(original: TorchFunction) -> TorchFunction:
    """float32 conv2d run with TF32 inputs (10-bit mantissa), float32 accumulation."""

    def faulty_conv2d(
        input: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        stride: int | tuple[int, ...] = 1,
        padding: int | tuple[int, ...] | str = 0,
        dilation: int | tuple[int, ...] = 1,
        groups: int = 1,
    ) -> torch.Tensor:
        output = original(input, weight, bias, stride, padding, dilation, groups)
        if input.dtype != torch.float32:
            return output
        with torch.no_grad():
            wrong = original(
                round_to_tf32(input.detach()),
                round_to_tf32(weight.detach()),
                None if bias is None else bias.detach(),
                stride,
                padding,
                dilation,
                groups,
            )
            return _overwrite(output, wrong)

    return faulty_conv2d


def gelu_tanh_approximation(original: TorchFunction) -> TorchFunction:
    """float32 gelu that uses the tanh approximation when the exact (erf) GELU was asked
    for; its backward is the tanh approximation's too (autograd node GeluBackward0)."""

    def faulty_gelu(input: torch.Tensor, approximate: str = "none") -> torch.Tensor:
        if input.dtype == torch.float32 and approximate == "none":
            return original(input, approximate="tanh")
        return original(input, approximate=approximate)

    return faulty_gelu


def softmax_low_precision_sum(original: TorchFunction) -> TorchFunction:
    """bfloat16/float16 softmax that rounds exp(x - max) to the input dtype and sums it
    in that dtype, one element after another, before dividing (no float32 accumulator).
    The backward uses this (stored) output, as a device's softmax backward does."""

    def faulty_softmax(
        input: torch.Tensor, dim: int | None = None, _stacklevel: int = 3, dtype: torch.dtype | None = None
    ) -> torch.Tensor:
        output = original(input, dim, _stacklevel, dtype)
        low = input.dtype
        if low not in (torch.float16, torch.bfloat16) or dtype is not None or dim is None:
            return output
        with torch.no_grad():
            x = input.detach().to(torch.float32).movedim(dim, -1)
            e = torch.exp(x - x.amax(-1, keepdim=True)).to(low)
            total = e[..., 0]
            for j in range(1, e.shape[-1]):
                total = (total.to(torch.float32) + e[..., j].to(torch.float32)).to(low)
            wrong = (e.to(torch.float32) / total.to(torch.float32).unsqueeze(-1)).to(low).movedim(-1, dim)
            return _overwrite(output, wrong)

    return faulty_softmax


# --- the table ------------------------------------------------------------------


@dataclass(frozen=True)
class ModelFault:
    name: str
    owner: Any  # what holds the API: torch.nn.functional, torch.Tensor, ...
    attr: str
    call_prefix: str  # the dump's call names of this API, e.g. "Functional.linear."
    dtypes: tuple[torch.dtype, ...]
    direction: str  # where the wrong numbers are: "forward", "backward", "forward+backward"
    wrap: Callable[[TorchFunction], TorchFunction]
    citation: str
    size: str
    #: where the accuracy model (standards/tables/accuracy_model.csv) says a correct
    #: library may do the same: why it is no defect; empty for a defect
    within_model: str = ""

    def patch(self, monkeypatch: Patcher) -> None:
        """Patch the API (the device side: only calls in `dtypes` go wrong)."""
        monkeypatch.setattr(self.owner, self.attr, self.wrap(getattr(self.owner, self.attr)))


FAULTS: dict[str, ModelFault] = {
    fault.name: fault
    for fault in [
        ModelFault(
            "einsum_backward_scaled",
            torch,
            "einsum",
            "Torch.einsum.",
            (torch.bfloat16, torch.float16),
            "backward",
            einsum_backward_scaled,
            "an einsum's backward judged through the data flow's sum (a bfloat16 accumulator, pytorch/pytorch#123157, passes the standards there)",
            "+2**-3 relative (32 bfloat16 ulps) in the einsum's share of a summed input gradient: within the float sum bound of its 128 terms",
        ),
        ModelFault(
            "bf16_truncation",
            torch.Tensor,
            "__add__",
            "Tensor.__add__.",
            (torch.bfloat16,),
            "forward",
            bf16_truncation,
            "tenstorrent/tt-metal#19882 'Replace truncating fp32->bf16 with tie-to-even rounding rule'",
            "<= 1 bf16 ulp, always toward zero, in ~1/3 of the elements (mean 0.34 ulp vs 0.21 for round-to-nearest): a bias",
        ),
        ModelFault(
            "fp32_dot_toward_zero",
            torch.nn.functional,
            "linear",
            "Functional.linear.",
            (torch.float32,),
            "forward",
            dot_toward_zero,
            "Xilinx/mlir-aie#2983 'AIECoreToStandard: set conv_even rounding mode for bf16 matmul' (floor-rounded matmul: a bias; cf. ROCm/rocm-libraries#9176)",
            "<= 1 fp32 ulp of the exact product, always toward zero (mean 0.49 ulp; the CPU's own fp32 linear is off by 1.6-8 ulps on average): a bias",
            "the accuracy model's `accumulation` class: a correct library's last product or addition and its conversion to float32 "
            "may take 1 ulp from the correctly rounded accumulator, so a -0.5 ulp lean is within what libraries document",
        ),
        ModelFault(
            "bf16_dot_toward_zero",
            torch.nn.functional,
            "linear",
            "Functional.linear.",
            (torch.bfloat16,),
            "forward",
            dot_toward_zero,
            "Xilinx/mlir-aie#2983 'AIECoreToStandard: set conv_even rounding mode for bf16 matmul' (floor-rounded bf16 matmul)",
            "<= 1 bf16 ulp of the exact product, always toward zero: in 16-bit a correct kernel rounds its float32 result to nearest once",
        ),
        ModelFault(
            "fp16_gemm_fp16_accumulation",
            torch.nn.functional,
            "linear",
            "Functional.linear.",
            (torch.float16,),
            "forward",
            fp16_gemm_fp16_accumulation,
            "pytorch/pytorch#123157 'Add support for CUBLAS_COMPUTE_16F for gemm operations in cudaBLAS' (see also #144441)",
            "mean 2-37 fp16 ulps, up to 7e3 ulps where the sum cancels (the correct kernel: <= 0.5 ulp)",
        ),
        ModelFault(
            "tf32_conv",
            torch.nn.functional,
            "conv2d",
            "Functional.conv2d.",
            (torch.float32,),
            "forward",
            tf32_conv,
            "pytorch/pytorch#107514 'conv2d wrong results on 3090/3090ti' (cudnn.allow_tf32 on by default)",
            "relative ~1e-3: mean 1.2e4-1.7e4 fp32 ulps (the correct kernel: mean 2-7 ulps)",
        ),
        ModelFault(
            "gelu_tanh_approximation",
            torch.nn.functional,
            "gelu",
            "Functional.gelu.",
            (torch.float32,),
            "forward+backward",
            gelu_tanh_approximation,
            "uxlfoundation/oneDNN#1122 'precision difference between Mkldnn Gelu and Gelu's erf algorithm'",
            "forward mean 1.5e3 fp32 ulps (relative ~2e-4), backward mean 2.6e4-8.7e4 ulps",
        ),
        ModelFault(
            "softmax_low_precision_sum",
            torch.nn.functional,
            "softmax",
            "Functional.softmax.",
            (torch.bfloat16, torch.float16),
            "forward",
            softmax_low_precision_sum,
            "apache/mxnet#14072 'Fp16 support for softmax' (reduction in fp16; cf. huggingface/candle#3727)",
            "forward up to 2.3 bf16 ulps (mean 0.49 vs 0.25); its backward reads that output: mean 0.7-1.2 vs 0.5-0.6 ulp",
        ),
        ModelFault(
            "softmax_backward_half_accumulator",
            torch.nn.functional,
            "softmax",
            "Functional.softmax.",
            (torch.float16, torch.bfloat16),
            "backward",
            softmax_backward_half_accumulator,
            "ROCm/MIOpen#3427 'Softmax log backward : Increase precision of fp16's accumulator to fp32'",
            "backward up to 8-17 fp16 ulps, mean 0.7-1.1 (the correct kernel: up to 3.3, mean 0.45-0.49)",
        ),
        ModelFault(
            "embedding_backward_lost_duplicates",
            torch.nn.functional,
            "embedding",
            "Functional.embedding.",
            (torch.float32,),
            "backward",
            embedding_backward_lost_duplicates,
            "pytorch/pytorch#187687 'fix: aten embed bwd thread sync before proceeding to next batch' (cf. tenstorrent/tt-metal#6232)",
            "the rows of repeated tokens (2 of 5000, 32 of 80000 elements) lose all but one contribution: wrong by up to 100%+; the rest exact",
        ),
        ModelFault(
            "maxpool_backward_all_ties",
            torch.nn.functional,
            "max_pool2d",
            "Functional.max_pool2d.",
            (torch.float32,),
            "backward",
            maxpool_backward_all_ties,
            "Theano/Theano#5248 'Backpropagation on max-pooling' (the gradient goes to all inputs equal to the max, unlike cuDNN; cf. apache/mxnet#18563)",
            "the 39 of 512 windows of zeros (after relu) pass their gradient to all 4 elements: 117 of 2048 gradient elements are the window's gradient (up to 0.028, mean 0.0095) instead of 0, relative L2 error 0.46; the rest exact",
        ),
        ModelFault(
            "linear_backward_bf16",
            torch.nn.functional,
            "linear",
            "Functional.linear.",
            (torch.float32,),
            "backward",
            linear_backward_bf16,
            "the GEMM backward defects of accelerators (TF32/HF32 inputs, split-K partial sums kept in a low precision)",
            "input and weight gradients off by relative 2e-3 to 4e-3 (1e4-1e5 fp32 ulps); msprobe records only the view's gradient at the call",
        ),
    ]
}
