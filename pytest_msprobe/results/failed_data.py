"""Save what a failed call saw, so it can be replayed without the dump or the run:

    <folder>/<call name>/call.json     the call, its verdict and its dump records
    <folder>/<call name>/inputs.pt     {"input_args.0": tensor, "input_kwargs.weight": tensor, "grads.0": ...}
    <folder>/<call name>/device.pt     the device's outputs, {"output.0": tensor, ...}
    <folder>/<call name>/bench.pt      the bench's outputs
    <folder>/<call name>/reference.pt  the CPU reference's outputs, where there is one

Every .pt is a flat dict of plain CPU tensors: `torch.load(path, weights_only=True)`
reads it, so a saved folder is as safe to open as the dump. Non-tensor arguments live
in the records in call.json. The call is decoded and replayed once more here (its inputs
come from its own seed, so they are the ones its test saw): the hot path keeps no
tensors, and only failed calls pay for a second replay.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_msprobe.dump.index import CallName, DumpIndex
from pytest_msprobe.errors import CallError, CallSkip
from pytest_msprobe.judge.verdict.record import ResultRecord

if TYPE_CHECKING:
    import torch

    from pytest_msprobe.judge.check.call import Settings


def flat_tensors(value: object, prefix: str = "") -> dict[str, torch.Tensor]:
    """Every tensor in a nested structure, by its path (`prefix.0.weight`), as a
    detached contiguous CPU torch tensor. Any value: numpy arrays and MindSpore tensors
    are read too, anything else left out."""

    def join(path: str, key: object) -> str:
        return f"{path}.{key}" if path else str(key)

    import numpy
    import torch

    found: dict[str, torch.Tensor] = {}
    stack: list[tuple[str, object]] = [(prefix, value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, (list, tuple)):
            stack.extend((join(path, i), element) for i, element in enumerate(item))
        elif isinstance(item, dict):
            stack.extend((join(path, key), element) for key, element in item.items())
        elif isinstance(item, torch.Tensor):
            found[path] = item.detach().to("cpu").contiguous().clone()
        elif isinstance(item, numpy.ndarray) or hasattr(item, "asnumpy"):  # MindSpore tensors
            found[path] = torch.from_numpy(
                numpy.ascontiguousarray(item if isinstance(item, numpy.ndarray) else item.asnumpy())
            )
    return dict(sorted(found.items()))


@dataclass(frozen=True)
class FailedCall:
    """A call whose test failed, as save_failed_call saves it: the dump and call that
    reproduce it (a test's `replayable`), its record, and its folder's name (None: the
    call's)."""

    index: DumpIndex
    name: CallName
    record: ResultRecord
    label: str | None = None


def save_failed_call(folder: Path, failed: FailedCall, settings: Settings) -> Path:
    """Write the call's folder under `folder` and return it. A call that cannot be
    decoded or run again still gets its call.json, with the reason its tensors are
    missing."""
    index, name, record, label = failed.index, failed.name, failed.record, failed.label
    import torch

    from pytest_msprobe.judge.check.call import replay_call
    from pytest_msprobe.run.replay import DeviceFailed

    target = folder / (label or str(name))
    target.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, dict[str, torch.Tensor]] = {}
    missing = ""
    try:
        results = replay_call(index, name, settings).results  # offline: the dump's outputs are the device's
        inputs = results.inputs
        tensors["inputs"] = flat_tensors(
            {"input_args": inputs.args, "input_kwargs": inputs.kwargs, "grads": inputs.grads or []}
        )
        sides = {"device": results.device, "bench": results.bench, "reference": results.reference}
        tensors.update({side: flat_tensors(value, "output") for side, value in sides.items() if value is not None})
    except (CallSkip, CallError, DeviceFailed) as exc:
        missing = f"{type(exc).__name__}: {exc}"
    for side, flat in tensors.items():
        torch.save(flat, target / f"{side}.pt")
    forward = index.entry(str(name.sibling("forward")))
    backward = index.entry(str(name.sibling("backward")))
    description = {
        "call": str(name),
        "api_type": name.api_type,
        "api_name": name.api_name,
        "direction": name.direction,
        "dump": str(index.path),
        "framework": index.framework,
        "task": index.task,
        "status": record.status,
        "standard": record.standard,
        "reference": record.reference,
        "device": record.device,
        "message": record.message,
        "files": sorted(f"{side}.pt" for side in tensors),
        "not_saved": missing,
        "forward_record": index.read_record(forward) if forward else None,
        "backward_record": index.read_record(backward) if backward and name.direction == "backward" else None,
    }
    (target / "call.json").write_text(json.dumps(description, indent=1, default=str), encoding="utf-8")
    return target
