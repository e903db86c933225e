"""The known defects of the libraries the plugin runs (DEFECTS: torch's CPU kernels
today; CANN's, torch_npu's and cuDNN's take rows of their own), one row each: what it
is, the library and the regime where it shows, the measured symptom that identifies it
(judge/defects/symptoms.py), a public tracker and a reproducer shipped with the package
(`python -m pytest_msprobe.judge.defects.reproduce <row>`), and the torch versions it was seen on.

A call judged error names the row it matches (`known_defect`): in its message, the
result files and the HTML report; --msprobe-known-defects=xfail makes it an expected
failure. The status never changes here: a known defect is still the device's error,
and a new fault in the same API fails against the recomputed bench, so it matches no row.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from pytest_msprobe.judge.defects import regimes
from pytest_msprobe.judge.defects.symptoms import (
    REDUCED,
    Failure,
    batch_norm_statistics_in_dtype,
    cross_entropy_from_rounded_log_softmax,
    float_scalar,
    in_regime,
    layer_norm_summed_in_dtype,
    scalar_rounded,
)

if TYPE_CHECKING:
    from pytest_msprobe.judge.defects.intermediates import Arguments
    from pytest_msprobe.judge.verdict.judgement import Judgement

#: how a message cites a row's reproducer
REPRODUCE = "python -m pytest_msprobe.judge.defects.reproduce"
#: the device kind whose kernels a torch CPU row describes (an offline run's device is
#: the dump's outputs, of a device the run does not know: no row of a library matches it)
TORCH_CPU = "cpu"


@dataclass(frozen=True)
class KnownDefect:
    """One known defect of a library's kernel, and how a failing call is recognised as it."""

    id: str  # the row's name: the reproducer's argument, the result files' `known_defect`
    library: str  # whose kernel: "torch CPU"; room for "CANN", "torch_npu", "cuDNN"
    devices: tuple[str, ...]  # the device kinds (--msprobe-device) that run that library's kernel
    operators: tuple[str, ...]  # the APIs' operator names (CallName.operator)
    direction: str
    dtypes: tuple[torch.dtype, ...]  # every floating input of the call is of one of these
    where: str  # the regime, in words
    regime: Callable[[Arguments], bool]  # the call's inputs (float64) lie where it shows
    symptom: Callable[[Failure], bool]  # the failure looks like it (measured)
    what: str
    tracker: str  # a public issue, "" where none is known: the reproducer shows it
    reproducer: str  # a function of pytest_msprobe.judge.defects.explored_reproducers
    seen_on: tuple[str, ...]  # torch versions it was measured on

    def note(self) -> str:
        """The failure message's line about it."""
        where = f"{self.tracker}; " if self.tracker else ""
        return (
            f"known defect {self.id} of {self.library}: {self.what} ({self.where}); {where}"
            f"reproduce: {REPRODUCE} {self.id}; seen on torch {', '.join(self.seen_on)}"
        )


def _everywhere(call: Arguments) -> bool:
    """No regime beyond the API, direction and dtypes: the symptom decides."""
    return True


F32 = (torch.float32,)
CPU = (TORCH_CPU,)
SEEN = ("2.13",)
GELU_TRACKER = "https://github.com/pytorch/pytorch/issues/187806"


def _define_explored(  # noqa: PLR0913 - a row's own fields, as KnownDefect takes them
    id: str,
    operator: str,
    direction: str,
    regime: Callable[[Arguments], bool],
    what: str,
    reproducer: str,
    tracker: str = "",
) -> KnownDefect:
    """A float32 defect exploration found: its regime, where an intermediate of the kernel
    leaves float32's range, is the evidence (regimes.py)."""
    where = "float32, " + " ".join((regime.__doc__ or regime.__name__).split(":")[0].split())
    return KnownDefect(
        id, "torch CPU", CPU, (operator,), direction, F32, where, regime, in_regime, what, tracker, reproducer, SEEN
    )


#: Every known defect, in the order they are tried (the first that matches names a call).
DEFECTS = (
    KnownDefect(
        "torch-cpu-scalar-rounded",
        "torch CPU",
        CPU,
        ("__add__", "__radd__", "__iadd__", "__sub__", "__rsub__", "__isub__", "add", "sub", "rsub", "subtract"),
        "forward",
        REDUCED,
        "bfloat16/float16 add or subtract of a Python float the dtype does not hold",
        float_scalar,
        scalar_rounded,
        "the Python scalar is rounded to the tensor's dtype before the operation (x + 0.79788456 adds 0.796875 "
        "in bfloat16); mul and div keep it in float32",
        "https://github.com/pytorch/pytorch/issues/185517",
        "scalar_rounded",
        SEEN,
    ),
    KnownDefect(
        "torch-cpu-layer-norm-affine-sums",
        "torch CPU",
        CPU,
        ("layer_norm",),
        "backward",
        REDUCED,
        "bfloat16/float16 input, weight and bias: the weight and bias gradients summed over many rows",
        _everywhere,
        layer_norm_summed_in_dtype,
        "the weight and bias gradients are summed over the rows in the dtype (per thread), not in float32",
        "",
        "layer_norm_reduced",
        SEEN,
    ),
    KnownDefect(
        "torch-cpu-cross-entropy-rounded-log-softmax",
        "torch CPU",
        CPU,
        ("cross_entropy",),
        "backward",
        REDUCED,
        "bfloat16/float16 logits, class-index targets, no label smoothing",
        _everywhere,
        cross_entropy_from_rounded_log_softmax,
        "the gradient is computed from the log_softmax rounded to the dtype: whole rows shift by 1-2 ULPs",
        "",
        "cross_entropy_reduced",
        SEEN,
    ),
    KnownDefect(
        "torch-cpu-batch-norm-statistics",
        "torch CPU",
        CPU,
        ("batch_norm",),
        "forward",
        REDUCED,
        "bfloat16/float16 input with weight and bias of that dtype, training (the batch's statistics)",
        _everywhere,
        batch_norm_statistics_in_dtype,
        "the batch's mean and inverse std are kept in the dtype and the input is normalised with the rounded ones",
        "",
        "batch_norm_reduced",
        SEEN,
    ),
    _define_explored(
        "torch-cpu-gelu-tail",
        "gelu",
        "forward",
        regimes.gelu_tail,
        "1 + erf(x / sqrt 2) cancels below x = -4",
        "gelu_tail",
        GELU_TRACKER,
    ),
    _define_explored(
        "torch-cpu-gelu-tail-gradient",
        "gelu",
        "backward",
        regimes.gelu_tail,
        "its gradient's 1 + erf(x / sqrt 2) cancels below x = -4: 0 from x ~ -6 on",
        "gelu_tail_gradient",
        GELU_TRACKER,
    ),
    _define_explored(
        "torch-cpu-gelu-tanh-gradient",
        "gelu",
        "backward",
        regimes.gelu_tanh_gradient,
        "gelu(tanh)'s gradient: beta (1 + 3 kappa x**2) overflows where 1 - tanh**2 is 0, 0 * inf = NaN",
        "gelu_tanh_gradient",
    ),
    _define_explored(
        "torch-cpu-softplus-gradient",
        "softplus",
        "backward",
        regimes.softplus_gradient,
        "g * exp(x) overflows before the division by 1 + exp(x)",
        "softplus_gradient",
    ),
    _define_explored(
        "torch-cpu-layer-norm-moments",
        "layer_norm",
        "backward",
        regimes.layer_norm_gradient,
        "the CPU backward's moment form (rstd**3, sums of g w x, fused rstd * g w) leaves float32's normal range",
        "layer_norm_scale",
    ),
    _define_explored(
        "torch-cpu-batch-norm-fused-weight",
        "batch_norm",
        "forward",
        regimes.batch_norm_weight,
        "the CPU kernel's fused weight * rstd overflows where weight * x_hat fits",
        "batch_norm_weight",
    ),
    _define_explored(
        "torch-cpu-hardswish-product",
        "hardswish",
        "forward",
        regimes.hardswish_product,
        "x * relu6(x + 3) overflows before the division by 6",
        "hardswish_large",
    ),
    _define_explored(
        "torch-cpu-group-norm-squares",
        "group_norm",
        "forward",
        regimes.group_norm_squares,
        "the CPU kernel forms x**2, which overflows where the definition's (x - mean)**2 fits",
        "group_norm_squares",
    ),
    _define_explored(
        "torch-cpu-group-norm-gradient",
        "group_norm",
        "backward",
        regimes.group_norm_gradient,
        "the CPU backward's fused rstd * weight, its rstd**3 sums or its forward's x**2 overflows",
        "group_norm_backward_weight",
    ),
    _define_explored(
        "torch-cpu-attention-flash-accumulator",
        "scaled_dot_product_attention",
        "forward",
        regimes.attention_accumulator,
        "the CPU flash kernel sums exp(s - max) v before dividing by the row's sum",
        "attention_flash",
    ),
    _define_explored(
        "torch-cpu-attention-flash-saturated",
        "scaled_dot_product_attention",
        "backward",
        regimes.attention_saturated,
        "the CPU flash backward gives a key gradient where saturated rows' exact one is 0 (torch's math kernel is exact)",
        "attention_flash",
    ),
)

BY_ID = {row.id: row for row in DEFECTS}


def known_defect(judgement: Judgement, device: str) -> KnownDefect | None:
    """The row a call judged error matches on `device` (its backend's kind), None where
    none does (a call not judged error, or judged against a baseline's metrics, matches
    none). Its regime is tested first (cheap), then its measured symptom."""
    if not judgement.error or judgement.recorded is not None:
        return None
    failure = Failure(judgement)
    name, dtypes = judgement.name, failure.dtypes
    candidates = [
        row
        for row in DEFECTS
        if device in row.devices
        and name.operator in row.operators
        and name.direction == row.direction
        and dtypes
        and dtypes <= set(row.dtypes)
    ]
    if not candidates:
        return None
    call = failure.arguments()
    for row in candidates:
        try:
            if row.regime(call) and row.symptom(failure):
                return row
        except Exception:  # noqa: BLE001 - a symptom that cannot be measured on these inputs: not this row
            continue
    return None
