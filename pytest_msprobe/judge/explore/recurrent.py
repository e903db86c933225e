"""The recurrent APIs whose gates saturate, written out cell by cell as their definitions
(torch.nn.GRU, LSTM, RNN's documented equations) compute them, with a hook on every
gate's activated result: what exploration perturbs to measure a recurrent backward's
sensitivity to the rounding of its gates (judge/explore/rounding_excuses.py).

derivatives.yaml differentiates these definitions: every kernel forms a gate's
derivative from its result as D holds it, (1 - z) and 1 - n**2 for GRU's sigmoid and
tanh gates (as sigmoid_backward and tanh_backward do), and where a gate saturates
(z = 1 - 1e-8 in float32 is 1) that difference is the rounding itself. torch's fused
kernels are these definitions: in float64 the cell-by-cell GRU equals torch.gru to 5e-20.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F

#: applied to each gate's activated result (the identity: the definition itself)
Gate = Callable[[torch.Tensor], torch.Tensor]
State = tuple[torch.Tensor, ...]
Weights = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]  # w_ih, w_hh, b_ih, b_hh
Cell = Callable[[torch.Tensor, State, Weights, Gate], State]


def _identity(value: torch.Tensor) -> torch.Tensor:
    return value


class _Gate(torch.autograd.Function):
    """A gate's activation, its result moved by `gate`, and its derivative formed from the
    moved result as derivatives.yaml's sigmoid_backward(grad, result) and
    tanh_backward(grad, result) form it (autograd through `gate` alone would take the
    derivative from the unmoved result)."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx, value: torch.Tensor, sigmoid: bool, gate: Gate
    ) -> torch.Tensor:
        result = gate(torch.sigmoid(value) if sigmoid else torch.tanh(value))
        ctx.save_for_backward(result)
        ctx.sigmoid = sigmoid  # type: ignore[attr-defined]
        return result

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (result,) = ctx.saved_tensors  # type: ignore[attr-defined]
        derivative = torch.ops.aten.sigmoid_backward if ctx.sigmoid else torch.ops.aten.tanh_backward  # type: ignore[attr-defined]
        return derivative(grad, result), None, None


def _sigmoid(value: torch.Tensor, gate: Gate) -> torch.Tensor:
    return cast("torch.Tensor", _Gate.apply(value, True, gate))  # type: ignore[no-untyped-call]


def _tanh(value: torch.Tensor, gate: Gate) -> torch.Tensor:
    return cast("torch.Tensor", _Gate.apply(value, False, gate))  # type: ignore[no-untyped-call]


def _gru_cell(x: torch.Tensor, state: State, weights: Weights, gate: Gate) -> State:
    """r, z = sigmoid(.), n = tanh(W_in x + b_in + r (W_hn h + b_hn)), h' = (1 - z) n + z h."""
    (h,), (w_ih, w_hh, b_ih, b_hh) = state, weights
    i_r, i_z, i_n = F.linear(x, w_ih, b_ih).chunk(3, -1)
    h_r, h_z, h_n = F.linear(h, w_hh, b_hh).chunk(3, -1)
    r, z = _sigmoid(i_r + h_r, gate), _sigmoid(i_z + h_z, gate)
    n = _tanh(i_n + r * h_n, gate)
    return ((1 - z) * n + z * h,)


def _lstm_cell(x: torch.Tensor, state: State, weights: Weights, gate: Gate) -> State:
    """i, f, o = sigmoid(.), g = tanh(.), c' = f c + i g, h' = o tanh(c')."""
    (h, c), (w_ih, w_hh, b_ih, b_hh) = state, weights
    i, f, g, o = (F.linear(x, w_ih, b_ih) + F.linear(h, w_hh, b_hh)).chunk(4, -1)
    c = _sigmoid(f, gate) * c + _sigmoid(i, gate) * _tanh(g, gate)
    return _sigmoid(o, gate) * _tanh(c, gate), c


def _tanh_cell(x: torch.Tensor, state: State, weights: Weights, gate: Gate) -> State:
    """h' = tanh(W_ih x + b_ih + W_hh h + b_hh)."""
    (h,), (w_ih, w_hh, b_ih, b_hh) = state, weights
    return (_tanh(F.linear(x, w_ih, b_ih) + F.linear(h, w_hh, b_hh), gate),)


@dataclass(frozen=True)
class _Pass:
    """One direction of one layer: its cell and weights, whether it runs back in time,
    and the gate applied to its activations."""

    cell: Cell
    weights: Weights
    reverse: bool
    gate: Gate

    def over(self, x: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        """Its outputs over x (time, batch, features) from `state`, and its final state."""
        outputs: list[torch.Tensor] = [x[0]] * x.shape[0]
        for step in reversed(range(x.shape[0])) if self.reverse else range(x.shape[0]):
            state = self.cell(x[step], state, self.weights, self.gate)
            outputs[step] = state[0]
        return torch.stack(outputs), state


def _sequence(cell: Cell, states: int) -> Callable[..., tuple[torch.Tensor, ...]]:
    """torch.<api>(input, hx, params, has_biases, num_layers, dropout, train, bidirectional,
    batch_first) over `cell`; raises where the call is not that overload or its result
    is not deterministic (dropout in training), so no sensitivity is measured there."""

    def definition(  # noqa: PLR0913  torch's _VF.lstm/gru/rnn signature, which it replaces
        input: torch.Tensor,
        hx: torch.Tensor | Sequence[torch.Tensor],
        params: Sequence[torch.Tensor],
        has_biases: bool,
        num_layers: int,
        dropout: float,
        train: bool,
        bidirectional: bool,
        batch_first: bool,
        *,
        gate: Gate = _identity,
    ) -> tuple[torch.Tensor, ...]:
        hidden = [hx] if isinstance(hx, torch.Tensor) else list(hx)
        if dropout and train and num_layers > 1:
            raise ValueError("dropout between layers: the result is random")
        per, directions = (4 if has_biases else 2), (2 if bidirectional else 1)
        if len(hidden) != states or len(params) != per * num_layers * directions:
            raise ValueError("another overload (packed input, projections): no definition here")
        x = input.transpose(0, 1) if batch_first else input
        finals: list[list[torch.Tensor]] = [[] for _ in range(states)]
        for layer in range(num_layers):
            outputs = []
            for direction in range(directions):
                k = layer * directions + direction
                w_ih, w_hh, *biases = params[per * k : per * (k + 1)]
                weights: Weights = (w_ih, w_hh, biases[0], biases[1]) if biases else (w_ih, w_hh, None, None)
                output, state = _Pass(cell, weights, direction == 1, gate).over(x, tuple(h[k] for h in hidden))
                outputs.append(output)
                for final, value in zip(finals, state, strict=True):
                    final.append(value)
            x = torch.cat(outputs, -1)
        return (x.transpose(0, 1) if batch_first else x, *(torch.stack(final) for final in finals))

    return definition


#: api -> its definition, the same arguments as torch.<api> and a `gate` keyword
DEFINITIONS: dict[str, Callable[..., tuple[torch.Tensor, ...]]] = {
    "gru": _sequence(_gru_cell, 1),
    "lstm": _sequence(_lstm_cell, 2),
    "rnn_tanh": _sequence(_tanh_cell, 1),
}
