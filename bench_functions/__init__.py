"""CPU references of torch_npu fused operators (installed as ``pytest_msprobe.bench_functions``).

``get(name)`` returns the reference of the torch_npu op ``name`` (as dumps write it after
``NPU.``) or None; ``register(name, func, replace=False)`` adds a user's own; ``names()``
lists them. Each reference takes the op's exact arguments and returns what the op returns;
it works in any floating dtype (see ``_common`` for the dtype policy) on the inputs' device.
Cases no CPU reference can reproduce raise ``Unsupported`` (a ``ValueError``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import dequant_swiglu_quant, grouped_matmul, moe_routing
from ._common import Unsupported
from .adam import npu_apply_adam, npu_apply_adam_w
from .confusion_transpose import npu_confusion_transpose
from .dequant_swiglu_quant import npu_dequant_swiglu_quant
from .fusion_attention import npu_fusion_attention, npu_fusion_attention_grad
from .gelu import fast_gelu, npu_fast_gelu
from .group_norm_silu import npu_group_norm_silu
from .grouped_matmul import npu_grouped_matmul
from .layer_norm import npu_layer_norm_eval
from .linear import npu_linear
from .matmul_backward import matmul_backward
from .mish import npu_mish
from .moe_gating import npu_moe_gating_top_k_softmax
from .moe_routing import (
    npu_moe_compute_expert_tokens,
    npu_moe_finalize_routing,
    npu_moe_gating_top_k,
    npu_moe_init_routing,
    npu_moe_init_routing_v2,
)
from .registry import BenchFunction, Companions, Registry
from .rms_norm import npu_rms_norm
from .rotary import npu_rotary_mul
from .softmax import npu_scaled_masked_softmax
from .sort import npu_sort_v2
from .swiglu import npu_swiglu

BUILTIN: dict[str, Callable[..., Any]] = {
    "npu_fusion_attention": npu_fusion_attention,
    "npu_fusion_attention_grad": npu_fusion_attention_grad,
    "npu_rms_norm": npu_rms_norm,
    "npu_rotary_mul": npu_rotary_mul,
    "npu_swiglu": npu_swiglu,
    "npu_scaled_masked_softmax": npu_scaled_masked_softmax,
    "fast_gelu": fast_gelu,
    "npu_fast_gelu": npu_fast_gelu,
    "npu_linear": npu_linear,
    "npu_confusion_transpose": npu_confusion_transpose,
    "npu_layer_norm_eval": npu_layer_norm_eval,
    "npu_apply_adam": npu_apply_adam,
    "npu_apply_adam_w": npu_apply_adam_w,
    "npu_group_norm_silu": npu_group_norm_silu,
    "npu_mish": npu_mish,
    "npu_moe_gating_top_k_softmax": npu_moe_gating_top_k_softmax,
    "npu_moe_gating_top_k": npu_moe_gating_top_k,
    "npu_moe_init_routing": npu_moe_init_routing,
    "npu_moe_init_routing_v2": npu_moe_init_routing_v2,
    "npu_moe_compute_expert_tokens": npu_moe_compute_expert_tokens,
    "npu_moe_finalize_routing": npu_moe_finalize_routing,
    "npu_grouped_matmul": npu_grouped_matmul,
    "npu_dequant_swiglu_quant": npu_dequant_swiglu_quant,
    "npu_sort_v2": npu_sort_v2,
    "matmul_backward": matmul_backward,
}

#: what the references that have more to say about their ops say (registry.Companions)
BUILTIN_COMPANIONS: dict[str, Companions] = {
    **grouped_matmul.COMPANIONS,
    **dequant_swiglu_quant.COMPANIONS,
    **moe_routing.COMPANIONS,
}

default_registry = Registry(BUILTIN, builtin=True, companions=BUILTIN_COMPANIONS)


def get(name: str) -> BenchFunction | None:
    """The reference of a torch_npu op in the default registry.

    Parameters
    ----------
    name
        The op's name as dumps write it after ``NPU.`` (``"npu_rms_norm"``).

    Returns
    -------
    BenchFunction or None
        The reference, callable like the op; None for an op no reference is registered
        for.
    """
    return default_registry.get(name)


def register(
    name: str, func: Callable[..., Any], *, replace: bool = False, companions: Companions | None = None
) -> None:
    """Register ``func`` as the reference of op ``name`` in the default registry, the one
    the plugin replays ``NPU.<name>`` calls on the bench with.

    Parameters
    ----------
    name
        The op's name as dumps write it after ``NPU.`` (``"npu_my_fused_op"``).
    func
        The reference: takes the op's exact arguments and returns what the op returns,
        in any floating dtype, on the inputs' device. Cases it cannot reproduce raise
        ``Unsupported`` (the call is then skipped with its message).
    replace
        Replace a reference already registered under `name` (a shipped one included).
    companions
        What else it says about the op (``Companions``), such as the rows its kernel
        writes.

    Raises
    ------
    ValueError
        `name` is registered already and `replace` is false.
    """
    default_registry.register(name, func, replace=replace, companions=companions)


def names() -> list[str]:
    """The op names the default registry knows.

    Returns
    -------
    list[str]
        Sorted; the shipped references and every one registered since.
    """
    return default_registry.names()


__all__ = [
    "BUILTIN",
    "BUILTIN_COMPANIONS",
    "BenchFunction",
    "Companions",
    "Registry",
    "Unsupported",
    "default_registry",
    "get",
    "names",
    "register",
]
