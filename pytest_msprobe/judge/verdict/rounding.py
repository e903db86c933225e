"""Which elements of a 16-bit call's output a correct kernel rounds once: the domain of
the standards' far-misrounding test (standards/misrounding.py).

The accuracy model's 16-bit rows (standards/tables/accuracy_model.csv): ATen, CUDA and
CANN compute a float16 or bfloat16 operator in float32 and round the result to nearest
once. Where that float32 result is accurate to a few float32 ULPs, it is 2**-13 (float16)
to 2**-16 (bfloat16) of an ULP of D from the exact value, so a correct result is never
farther than half an ULP of D (and 64 float32 ULPs) from the bench; a kernel that
truncates lands farther on nearly every element it moves, and the test catches it on 64
elements, where the sign tests alone fell short 5.2% of the time. It holds only where
the float32 formula is well-conditioned: a float32 result that cancels (gelu's 1 + erf(x / sqrt 2) below x
of -3) or a kernel that rounds an intermediate at D (ATen's CPU log_softmax, a
normalisation's backward row sums) is correct and still farther. So the test reads the
elements this table names, per API and direction: where ATen's CPU kernels, the
reference family of every check, round once on both of this machine's kernel paths (AVX2
and ATEN_CPU_CAPABILITY=default), measured by studies/rounded_once.py (results in
studies/sixteen-bit-kernels-rounded-once.md): every finite input of float16 and bfloat16 for
the elementwise functions, with a random 16-bit gradient; 3 x 64 x 256 random inputs for
the normalisations. There a device that rounds otherwise is less accurate than both the
model's correct kernel and the reference, and fails. An API or direction not here gets no
such test: its elements are judged by the sign tests alone. rsqrt's forward is left out:
0 farther on AVX2, 8906 of 32639 bfloat16 inputs farther on the default path, both ways.
An H200's CUDA kernels (torch 2.11, studies/verdicts-on-a-cuda-gpu.md) round every row once but
group_norm's forward (17379 of 49152 bfloat16 elements farther; its apizoo float16 call,
83 toward zero against 11, fails: a finding, as TF32 is); they also round once the
forward of log_softmax, instance_norm and batch_norm in training and layer_norm's
backward, which the CPU does not.

The masks have the shape of the first argument, as judge/verdict/groups.py's ids: the forward
output of these APIs and the gradient of that input have it; another output (a
normalisation's weight gradient) gets no mask.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeAlias

import torch

from pytest_msprobe.judge.verdict.groups import HALF_DTYPES, torch_arguments
from pytest_msprobe.judge.verdict.terms import Param, argument

if TYPE_CHECKING:
    from pytest_msprobe.dump.index import CallName
    from pytest_msprobe.run.replay import Inputs, Side

#: (args, kwargs) -> whether each element of the first argument's shape is rounded once
Once: TypeAlias = "Callable[[list[Param], dict[str, Param]], torch.Tensor | None]"


def _every(args: list[Param], kwargs: dict[str, Param]) -> torch.Tensor:
    """Every element: 0 of every finite 16-bit input (or of 49152 random ones) farther."""
    return torch.ones(args[0].shape, dtype=torch.bool)


def _gelu_above(lowest: float) -> Once:
    """gelu where x >= lowest: below, 1 + erf(x / sqrt 2) (or its tanh form) cancels in
    float32 and ATen's kernel is correct and farther (judge/verdict/terms.py's gelu)."""

    def once(args: list[Param], kwargs: dict[str, Param]) -> torch.Tensor:
        x: torch.Tensor = args[0]
        return x >= lowest

    return once


def _in_eval(args: list[Param], kwargs: dict[str, Param]) -> torch.Tensor | None:
    """batch_norm with running statistics (eval): rounded once forward and backward (0
    of 49152 farther); with batch statistics ATen rounds each channel's at D (judge/verdict/groups.py)."""
    return None if argument(args, kwargs, 5, "training") else _every(args, kwargs)


def _with_inplace(names: tuple[str, ...]) -> tuple[str, ...]:
    """Each API and its in-place form (`relu_`): the same kernel, the same rounding."""
    return tuple(name + suffix for name in names for suffix in ("", "_"))


#: rounded once forward and backward: every finite float16 and bfloat16 input, with a
#: random 16-bit gradient, 0 farther for hardswish, hardsigmoid, softplus, elu, selu,
#: celu, leaky_relu, relu, relu6, hardtanh, log, square; silu and mish 0 in float16 and
#: 17-18 in bfloat16, all at x of -98 to -89, where float32's exp(-x) overflows and the
#: output (about 1e-40) is flushed. rms_norm: 0-1 of 49152, 16-bit weight or none.
BOTH_DIRECTIONS = (
    *_with_inplace(
        (
            "hardswish", "hardsigmoid", "softplus", "elu", "selu", "celu", "leaky_relu", "relu", "relu6",
            "hardtanh", "log", "square", "silu", "mish",
        )
    ),
    "rms_norm",
)  # fmt: skip
#: rounded once forward only: tanh, sigmoid, exp, expm1, sin, cos, atan, sinh, cosh,
#: asinh, log1p, sqrt, reciprocal, logsigmoid (every finite input, 0 farther;
#: sigmoid 8 in bfloat16 at x of -92 to -89, as silu); softmax, softmin, layer_norm and
#: group_norm, 16-bit weights or none (49152 random elements: 0-6 farther, of either
#: sign). Their backward is not: ATen rounds the derivative or the output it reuses
#: (1 - tanh**2, g * exp(x), a row's sums) at D first: tanh 1142 (bfloat16) and 6929
#: (float16) farther, exp 1119 and 8638, softmax 16208 and 12949, layer_norm 13488 and
#: 13567.
FORWARD_ONLY = (
    *_with_inplace(
        (
            "tanh", "sigmoid", "exp", "expm1", "sin", "cos", "atan", "sinh", "cosh", "asinh", "log1p", "sqrt",
            "reciprocal",
        )
    ),
    "logsigmoid", "softmax", "_softmax", "softmin", "layer_norm", "group_norm",
)  # fmt: skip

#: API -> {direction: which elements are rounded once}
ROUNDED_ONCE: dict[str, dict[str, Once]] = {
    **{name: {"forward": _every, "backward": _every} for name in BOTH_DIRECTIONS},
    **{name: {"forward": _every} for name in FORWARD_ONLY},
    # every finite input: farther only below x of -2.8 forward (float16; -3.14 bfloat16,
    # -3.2 approximate='tanh'), backward below -0.75 (float16, where (1 + s) / 2 + x phi(x)
    # cancels; -3.08 approximate='tanh')
    "gelu": {"forward": _gelu_above(-2.5), "backward": _gelu_above(-0.5)},
    "batch_norm": {"forward": _in_eval, "backward": _in_eval},
}


def rounded_once_of(name: CallName, bench: Side, inputs: Inputs) -> torch.Tensor | None:
    """Which elements of the call's 16-bit outputs a correct kernel rounds once, None
    where its API and direction are not in the table, its first argument is not a
    16-bit tensor, or its arguments are of a form the table does not read."""
    once = ROUNDED_ONCE.get(name.operator, {}).get(name.direction)
    if once is None or not inputs.args or not isinstance(inputs.args[0], torch.Tensor):
        return None
    if inputs.args[0].dtype not in HALF_DTYPES:
        return None
    args, kwargs = torch_arguments(bench, inputs)
    try:
        return once(args, kwargs)
    except (TypeError, ValueError, IndexError, RuntimeError, AttributeError):
        return None
