"""CPU references of ``torch_npu.npu_apply_adam`` and ``torch_npu.npu_apply_adam_w``.

Both update the optimizer state ``out=(var, m, v)`` in place and return it, as the NPU ops
do. They share the moment update and the state handling; they differ where the documented
formulas differ: ApplyAdam is TensorFlow's ApplyAdam (beta powers of the current step,
epsilon added to sqrt(v) before the bias correction), ApplyAdamW is torch.optim.AdamW's step
(beta powers of the previous step, epsilon added after the bias correction, decoupled weight
decay, amsgrad and maximize).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ._common import as_float, to_compute


def _state(out: Sequence[torch.Tensor] | None, op: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if out is None or len(out) != 3:
        raise ValueError(f"{op} updates the optimizer state passed as out=(var, m, v); got out={out!r}")
    return out[0], out[1], out[2]


def _moments(
    m: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta1: float, beta2: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """m_t = beta1 m + (1 - beta1) g;  v_t = beta2 v + (1 - beta2) g^2."""
    return beta1 * m + (1 - beta1) * g, beta2 * v + (1 - beta2) * g * g


Tensors3 = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
#: An NPU ``Scalar`` argument, as dumps record it: a number or a one-element tensor.
Scalar = float | torch.Tensor


def _write_back(state: Tensors3, new: Tensors3) -> Tensors3:
    with torch.no_grad():
        for old, value in zip(state, new, strict=True):
            old.copy_(value.to(old.dtype))
    return state


def npu_apply_adam(
    beta1_power: Scalar,
    beta2_power: Scalar,
    lr: Scalar,
    beta1: Scalar,
    beta2: Scalar,
    epsilon: Scalar,
    grad: torch.Tensor,
    use_locking: bool | None,
    use_nesterov: bool | None,
    out: Sequence[torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One Adam step: lr_t = lr sqrt(1 - beta2_power) / (1 - beta1_power); m_t, v_t as usual;
    var -= lr_t m_t / (sqrt(v_t) + epsilon), or with Nesterov
    var -= lr_t (beta1 m_t + (1 - beta1) grad) / (sqrt(v_t) + epsilon). Returns (var, m, v).

    Facts:
    - torch_npu docs: npu_apply_adam(beta1_power, beta2_power, lr, beta1, beta2, epsilon, grad, use_locking, use_nesterov, out=(var, m, v)); beta1_power/beta2_power are "the powers of beta1/beta2"; scalars are Scalars.
    - CANN ApplyAdam follows TensorFlow's ApplyAdam (same inputs and attributes): lr_t = lr * sqrt(1 - beta2^t) / (1 - beta1^t), m_t = beta1 m + (1 - beta1) g, v_t = beta2 v + (1 - beta2) g^2, var -= m_t lr_t / (sqrt(v_t) + eps), Nesterov var -= (m_t beta1 + g (1 - beta1)) lr_t / (sqrt(v_t) + eps).
    - torch_npu docs: "planned for deprecation, replace with torch.optim.Adam" (equal to one Adam step with eps' = eps / sqrt(1 - beta2^t)).

    Choices:
    - use_locking has no meaning off the device and is ignored; the state is updated in place (like the op) and returned.
    - Arithmetic in float32 (float64 for float64 state), written back in the state's dtype.
    """
    var, m, v = _state(out, "npu_apply_adam")
    b1p, b2p = as_float(beta1_power, "beta1_power"), as_float(beta2_power, "beta2_power")
    lr_, b1, b2, eps = (
        as_float(s, n) for s, n in ((lr, "lr"), (beta1, "beta1"), (beta2, "beta2"), (epsilon, "epsilon"))
    )
    g = to_compute(grad).detach()
    m_t, v_t = _moments(to_compute(m).detach(), to_compute(v).detach(), g, b1, b2)
    lr_t = lr_ * (1 - b2p) ** 0.5 / (1 - b1p)
    step = b1 * m_t + (1 - b1) * g if use_nesterov else m_t
    var_t = to_compute(var).detach() - lr_t * step / (v_t.sqrt() + eps)
    return _write_back((var, m, v), (var_t, m_t, v_t))


def npu_apply_adam_w(
    beta1_power: Scalar,
    beta2_power: Scalar,
    lr: Scalar,
    weight_decay: Scalar,
    beta1: Scalar,
    beta2: Scalar,
    epsilon: Scalar,
    grad: torch.Tensor,
    max_grad_norm: torch.Tensor | None,
    amsgrad: bool | None,
    maximize: bool | None,
    out: Sequence[torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One AdamW step from the state of step t-1:

    g = -grad if maximize; m_t, v_t as usual; beta^t = beta_power * beta;
    v_hat = max(max_grad_norm, v_t) if amsgrad else v_t;
    var = var (1 - lr wd) - lr (m_t / (1 - beta1^t)) / (sqrt(v_hat / (1 - beta2^t)) + epsilon).
    Returns (var, m, v) with v = v_t.

    Facts:
    - torch_npu docs: npu_apply_adam_w(beta1_power, beta2_power, lr, weight_decay, beta1, beta2, epsilon, grad, max_grad_norm, amsgrad, maximize, out=(var, m, v)).
    - CANN ApplyAdamW docs: g = -g if maximize; m_t = beta1 m + (1 - beta1) g; v_t = beta2 v + (1 - beta2) g^2; beta1^t = beta1^(t-1) * beta1 (the inputs are the previous step's powers); v_t = max(maxGradNorm, v_t) if amsgrad; m_hat = m_t / (1 - beta1^t); v_hat = v_t / (1 - beta2^t); theta -= lr m_hat / (sqrt(v_hat) + eps) + lr * lambda * theta_(t-1).

    Choices:
    - The returned v is the moving average v_t, not max(maxGradNorm, v_t) (op-plugin's own CPU test does so; the docs reuse the name v_t); max_grad_norm itself is not updated.
    - amsgrad=True without max_grad_norm raises ValueError; None for amsgrad/maximize means False.
    - The state is updated in place (like the op) and returned; arithmetic in float32 (float64 for float64 state).
    """
    var, m, v = _state(out, "npu_apply_adam_w")
    b1p, b2p = as_float(beta1_power, "beta1_power"), as_float(beta2_power, "beta2_power")
    lr_, wd, b1, b2, eps = (
        as_float(s, n)
        for s, n in (
            (lr, "lr"),
            (weight_decay, "weight_decay"),
            (beta1, "beta1"),
            (beta2, "beta2"),
            (epsilon, "epsilon"),
        )
    )
    g = to_compute(grad).detach()
    if maximize:
        g = -g
    m_t, v_t = _moments(to_compute(m).detach(), to_compute(v).detach(), g, b1, b2)
    v_hat = v_t
    if amsgrad:
        if max_grad_norm is None:
            raise ValueError("npu_apply_adam_w with amsgrad=True needs max_grad_norm (the running max of v)")
        v_hat = torch.maximum(to_compute(max_grad_norm).detach(), v_t)
    bias1, bias2 = 1 - b1p * b1, 1 - b2p * b2
    var_t = to_compute(var).detach() * (1 - lr_ * wd) - lr_ * (m_t / bias1) / ((v_hat / bias2).sqrt() + eps)
    return _write_back((var, m, v), (var_t, m_t, v_t))
