"""npu_apply_adam / npu_apply_adam_w against single steps of torch.optim.Adam / AdamW."""

import pytest
import torch

from pytest_msprobe.bench_functions import get

G = torch.Generator().manual_seed(0)


def state(n=64):
    var = torch.randn(n, generator=G, dtype=torch.float64)
    m = torch.randn(n, generator=G, dtype=torch.float64) * 0.1
    v = torch.rand(n, generator=G, dtype=torch.float64) * 0.01
    grad = torch.randn(n, generator=G, dtype=torch.float64)
    return var, m, v, grad


@pytest.mark.parametrize("t", [1, 7])
def test_apply_adam_is_torch_adam_with_epsilon_hat(t):
    var, m, v, grad = state()
    lr, b1, b2, eps = 1e-2, 0.9, 0.999, 1e-6
    p = torch.nn.Parameter(var.clone())
    p.grad = grad.clone()
    # TF/CANN ApplyAdam adds eps to sqrt(v_t) before bias correction: torch's eps is eps / sqrt(1 - b2^t)
    opt = torch.optim.Adam([p], lr=lr, betas=(b1, b2), eps=eps / (1 - b2**t) ** 0.5)
    opt.state[p] = {"step": torch.tensor(float(t - 1)), "exp_avg": m.clone(), "exp_avg_sq": v.clone()}
    opt.step()
    out = (var.clone(), m.clone(), v.clone())
    result = get("npu_apply_adam")(b1**t, b2**t, lr, b1, b2, eps, grad, False, False, out=out)
    assert all(r is o for r, o in zip(result, out, strict=True))  # updated in place and returned
    torch.testing.assert_close(result[0], p.detach(), rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(result[1], opt.state[p]["exp_avg"])
    torch.testing.assert_close(result[2], opt.state[p]["exp_avg_sq"])


def test_apply_adam_nesterov_formula():
    var, m, v, grad = state()
    lr, b1, b2, eps, t = 1e-3, 0.8, 0.99, 1e-8, 3
    out = get("npu_apply_adam")(
        torch.tensor(b1**t), b2**t, lr, b1, b2, eps, grad, None, True, out=(var.clone(), m.clone(), v.clone())
    )
    m_t = b1 * m + (1 - b1) * grad
    v_t = b2 * v + (1 - b2) * grad**2
    lr_t = lr * (1 - b2**t) ** 0.5 / (1 - b1**t)
    torch.testing.assert_close(out[0], var - lr_t * (m_t * b1 + (1 - b1) * grad) / (v_t.sqrt() + eps))


@pytest.mark.parametrize("maximize", [False, True])
@pytest.mark.parametrize("amsgrad", [False, True])
def test_apply_adam_w_is_torch_adamw(maximize, amsgrad):
    var, m, v, grad = state()
    max_v = v + torch.rand(v.shape, generator=G, dtype=torch.float64) * 0.02
    lr, wd, b1, b2, eps, t = 3e-3, 0.05, 0.9, 0.95, 1e-8, 5
    p = torch.nn.Parameter(var.clone())
    p.grad = grad.clone()
    opt = torch.optim.AdamW([p], lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd, amsgrad=amsgrad, maximize=maximize)
    st = {"step": torch.tensor(float(t - 1)), "exp_avg": m.clone(), "exp_avg_sq": v.clone()}
    if amsgrad:
        st["max_exp_avg_sq"] = max_v.clone()
    opt.state[p] = st
    opt.step()
    result = get("npu_apply_adam_w")(
        b1 ** (t - 1),
        b2 ** (t - 1),
        lr,
        wd,
        b1,
        b2,
        eps,
        grad,
        max_v if amsgrad else None,
        amsgrad,
        maximize,
        out=(var.clone(), m.clone(), v.clone()),
    )
    torch.testing.assert_close(result[0], p.detach(), rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(result[1], opt.state[p]["exp_avg"])
    torch.testing.assert_close(result[2], opt.state[p]["exp_avg_sq"])


def test_adam_low_precision_state_and_errors():
    var, m, v, grad = (t.half() for t in state())
    out = get("npu_apply_adam_w")(0.9, 0.999, 1e-3, 0.01, 0.9, 0.999, 1e-8, grad, None, False, False, out=(var, m, v))
    assert all(o.dtype == torch.float16 and torch.isfinite(o).all() for o in out)
    with pytest.raises(ValueError, match="out"):
        get("npu_apply_adam")(0.9, 0.999, 1e-3, 0.9, 0.999, 1e-8, grad, False, False)
    with pytest.raises(ValueError, match="max_grad_norm"):
        get("npu_apply_adam_w")(0.9, 0.999, 1e-3, 0.01, 0.9, 0.999, 1e-8, grad, None, True, False, out=(var, m, v))
