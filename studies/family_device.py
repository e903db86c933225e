"""A pytest plugin for studies/library_families.py: JAX/XLA as the device under test in
a single run (no reference: the single-run rules judge), as Inductor is in
compiled_kernels.py.

Loaded with `-p family_device` (studies/ on PYTHONPATH), it replaces the device run of
every PyTorch call whose API studies/families_jax.py has by that JAX function, wrapped
in a torch.autograd.Function: the forward raises 16-bit inputs to float32, computes in
XLA and rounds once to the input's dtype; the backward is jax.vjp of the same function,
rounded once to each input's dtype. Other calls (and the bench) run as they do. Needs
jax[cpu]. Each process compiles XLA's kernels afresh for every API and shape (about
0.5 s each): a harness run, not CI.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pytest_msprobe.run.replay import Run


def _float_dtype(tensors: list[Any]) -> Any:
    """The dtype a call's floating outputs take: its first floating input's."""
    import torch

    floats = [t.dtype for t in tensors if isinstance(t, torch.Tensor) and t.dtype.is_floating_point]
    return floats[0] if floats else torch.float32


def jax_function(api: str) -> Any:
    """The call's JAX equivalent as a torch function (differentiable through jax.vjp)."""
    import families_jax
    import torch
    from family_recompute import raised, rounded

    class JaxCall(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, spec: Any, *tensors: torch.Tensor) -> Any:  # type: ignore[override]
            args, kwargs = spec.rebuild(tensors)
            ctx.spec, ctx.tensors = spec, tensors
            outputs = families_jax.forward(api, raised(args), raised(kwargs))
            dtype = _float_dtype(list(tensors))
            results = tuple(
                rounded(o, dtype if o.dtype.kind == "f" else torch.from_numpy(o[:0]).dtype) for o in outputs
            )
            ctx.dtypes = [r.dtype for r in results]
            return results if len(results) > 1 else results[0]

        @staticmethod
        def backward(ctx: Any, *grads: torch.Tensor) -> Any:
            spec, tensors = ctx.spec, ctx.tensors
            args, kwargs = spec.rebuild(tensors)
            wanted = [i for i, t in enumerate(tensors) if t.dtype.is_floating_point and ctx.needs_input_grad[i + 1]]
            wrt = [spec.where[i] for i in wanted]
            cotangents = [
                g if g is not None else torch.zeros((), dtype=d) for g, d in zip(grads, ctx.dtypes, strict=True)
            ]
            computed = families_jax.backward(api, raised(args), raised(kwargs), wrt, raised(cotangents))
            result: list[Any] = [None] * (len(tensors) + 1)
            for i, grad in zip(wanted, computed, strict=True):
                result[i + 1] = rounded(grad, tensors[i].dtype)
            return tuple(result)

    def call(*args: Any, **kwargs: Any) -> Any:
        spec = Spec.of(args, kwargs)
        return JaxCall.apply(spec, *spec.tensors)

    return call


@dataclasses.dataclass
class Spec:
    """A call's arguments with its top-level tensors taken out (autograd.Function's inputs)."""

    args: list[Any]
    kwargs: dict[str, Any]
    where: list[tuple[str, Any]]
    tensors: list[Any]

    @classmethod
    def of(cls, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Spec:
        import torch

        where = [("args", i) for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        where += [("kwargs", k) for k, v in kwargs.items() if isinstance(v, torch.Tensor)]
        tensors = [args[k] if w == "args" else kwargs[k] for w, k in where]
        return cls(list(args), dict(kwargs), where, tensors)

    def rebuild(self, tensors: tuple[Any, ...]) -> tuple[list[Any], dict[str, Any]]:
        args, kwargs = list(self.args), dict(self.kwargs)
        for (w, k), t in zip(self.where, tensors, strict=True):
            (args if w == "args" else kwargs)[k] = t.detach()
        return args, kwargs


def on_device(run: Run) -> Run:
    import families_jax

    if run.api.name not in families_jax.TABLE or run.api.in_place:
        return run
    return dataclasses.replace(run, function=jax_function(run.api.name))


def pytest_configure(config: pytest.Config) -> None:
    from pytest_msprobe.judge.check import call

    runs = call.PytorchReplay.runs

    def jax_device(self: Any, *args: Any, **kwargs: Any) -> Any:
        device, bench, reference = runs(self, *args, **kwargs)
        return on_device(device), bench, reference

    call.PytorchReplay.runs = jax_device  # type: ignore[method-assign]  # the harness's device
