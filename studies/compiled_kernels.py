"""A pytest plugin for the kernel-diversity harness: Inductor's generated kernels as one
more correct kernel family.

torch.compile turns each call into C++ kernels of its own (fused loops, its own
reduction order and vectorisation): a kernel family no CPU path of eager torch has, as
an accelerator's kernels are. Loaded with `-p compiled_kernels` (studies/ on
PYTHONPATH), it compiles, for every PyTorch call, the run that MSPROBE_COMPILED names:

  MSPROBE_COMPILED=device     single-run: the device under test is the compiled call
  MSPROBE_COMPILED=reference  offline: the reference that the dumped outputs are
                              compared with is the compiled call

The bench is never compiled. A call Inductor cannot compile runs eagerly (torch.compile
falls back on a graph break), so the compiled family covers what it compiles. Cost: the
first compilation of a process takes ~28 s, each further call's ~1.2-1.4 s (measured
here on layer_norm, softmax and gelu), against ~2 ms eagerly: a harness run, not CI.
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pytest_msprobe.run.replay import Run

WHICH = ("device", "reference")


def compiled(run: Run) -> Run:
    """The run with its function compiled by Inductor for the shapes it is given."""
    import torch

    return dataclasses.replace(run, function=torch.compile(run.function, dynamic=False))


def pytest_configure(config: pytest.Config) -> None:
    which = os.environ.get("MSPROBE_COMPILED", "device")
    if which not in WHICH:
        raise pytest.UsageError(f"MSPROBE_COMPILED={which!r}: use one of {', '.join(WHICH)}")
    from pytest_msprobe.judge.check import call

    if which == "device":
        runs = call.PytorchReplay.runs

        def compiled_device(self: Any, *args: Any, **kwargs: Any) -> Any:
            device, bench, reference = runs(self, *args, **kwargs)
            return compiled(device), bench, reference

        call.PytorchReplay.runs = compiled_device  # type: ignore[method-assign]  # the harness's device
    else:
        reference_of = call.PytorchReplay.reference_in_dump_dtype

        def compiled_reference(self: Any, *args: Any, **kwargs: Any) -> Any:
            return compiled(reference_of(self, *args, **kwargs))

        call.PytorchReplay.reference_in_dump_dtype = compiled_reference  # type: ignore[method-assign]  # the harness's reference
