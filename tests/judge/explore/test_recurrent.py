"""The recurrent definitions that exploration perturbs (judge/explore/recurrent.py) are torch's
kernels: equal to them in float64 over every argument form they accept, their
derivatives included; other forms raise (no sensitivity is measured there)."""

from __future__ import annotations

import itertools

import pytest
import torch

from pytest_msprobe.judge.explore.recurrent import DEFINITIONS, _sigmoid

GATES = {"gru": 3, "lstm": 4, "rnn_tanh": 1}
FORMS = list(itertools.product(GATES, (1, 2), (False, True), (False, True), (False, True)))


def _call(api: str, layers: int, bidirectional: bool, batch_first: bool, bias: bool) -> tuple:
    generator = torch.Generator().manual_seed(0)
    size, hidden, steps, batch, directions = 3, 4, 5, 2, 1 + bidirectional

    def tensor(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, dtype=torch.float64).requires_grad_()

    params = []
    for layer in range(layers):
        for _ in range(directions):
            rows = GATES[api] * hidden
            params += [tensor(rows, size if layer == 0 else hidden * directions), tensor(rows, hidden)]
            params += [tensor(rows), tensor(rows)] if bias else []
    x = tensor(batch, steps, size) if batch_first else tensor(steps, batch, size)
    states = [tensor(layers * directions, batch, hidden) for _ in range(2 if api == "lstm" else 1)]
    return x, tuple(states) if api == "lstm" else states[0], params, bias, layers, 0.0, True, bidirectional, batch_first


@pytest.mark.parametrize(("api", "layers", "bidirectional", "batch_first", "bias"), FORMS)
def test_a_definition_is_torch_s_kernel_with_its_gradients(api, layers, bidirectional, batch_first, bias):
    call = _call(api, layers, bidirectional, batch_first, bias)
    leaves = [call[0], *([*call[1]] if api == "lstm" else [call[1]]), *call[2]]
    expected, found = getattr(torch, api)(*call), DEFINITIONS[api](*call)
    assert len(found) == len(expected)
    for mine, theirs in zip(found, expected, strict=True):
        assert torch.allclose(mine, theirs, rtol=1e-12, atol=1e-12)
    weights = [
        torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64) for out in expected
    ]
    wanted = torch.autograd.grad([(w * out).sum() for w, out in zip(weights, expected, strict=True)], leaves)
    got = torch.autograd.grad([(w * out).sum() for w, out in zip(weights, found, strict=True)], leaves)
    assert all(torch.allclose(a, b, rtol=1e-10, atol=1e-12) for a, b in zip(got, wanted, strict=True))


def test_a_moved_gate_moves_the_result_and_the_derivative_taken_from_it():
    """The gate's derivative is formed from its moved result, as D's kernels form it from
    the result D holds: a sigmoid moved to 0.5 has the derivative 0.25 (at x = 10 its
    own is 4.5e-5, and autograd through the move alone would give 0)."""
    call = _call("gru", 1, False, False, True)
    plain = DEFINITIONS["gru"](*call)[0]
    moved = DEFINITIONS["gru"](*call, gate=lambda result: result * (1 + 1e-6))[0]
    assert 0 < float((moved - plain).detach().abs().max()) < 1e-4
    x = torch.full((3,), 10.0, dtype=torch.float64, requires_grad=True)
    (gradient,) = torch.autograd.grad(_sigmoid(x, lambda result: torch.full_like(result, 0.5)).sum(), [x])
    assert torch.equal(gradient, torch.full((3,), 0.25, dtype=torch.float64))


def test_forms_without_a_definition_raise():
    x, hx, params, *rest = _call("gru", 2, False, False, True)
    with pytest.raises(ValueError, match="another overload"):
        DEFINITIONS["gru"](x, hx, params[:4], *rest)
    with pytest.raises(ValueError, match="dropout"):
        DEFINITIONS["gru"](x, hx, params, True, 2, 0.5, True, False, False)
