"""Write records and tensors as an msprobe tensor dump: the form every tool of ours
already reads (pytest --msprobe-dump, msprobe-script, --msprobe-save-failed).

An explored example that fails (judge/explore/search.py) is written as a dump of its one call,
so that reproducing it needs nothing new: `pytest --msprobe-dump=<its dump.json>`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from pytest_msprobe.dump.index import TENSOR_FOLDER

if TYPE_CHECKING:
    from pytest_msprobe.dump.index import Record


def tensor_entry(
    tensor: torch.Tensor, data_name: str, *, kind: str = "torch.Tensor", requires_grad: bool = False
) -> Record:
    """A tensor's record as msprobe writes it: dtype, shape, Max/Min/Mean/Norm (JSON
    Infinity/NaN where the tensor holds them) and the file holding its data."""
    stats: Record = {"Max": None, "Min": None, "Mean": None, "Norm": None}
    if tensor.numel() and tensor.dtype == torch.bool:
        stats.update(Max=bool(tensor.any()), Min=bool(tensor.all()))
    elif tensor.numel() and (tensor.dtype.is_floating_point or tensor.dtype.is_complex):
        wide = tensor.detach().to(torch.complex128 if tensor.dtype.is_complex else torch.float64)
        real = wide.real if tensor.dtype.is_complex else wide
        stats.update(Max=real.max().item(), Min=real.min().item(), Mean=real.mean().item(), Norm=wide.norm().item())
    elif tensor.numel():
        stats.update(
            Max=int(tensor.max()),
            Min=int(tensor.min()),
            Mean=tensor.double().mean().item(),
            Norm=tensor.double().norm().item(),
        )
    return {
        "type": kind,
        "dtype": str(tensor.dtype),
        "shape": list(tensor.shape),
        **stats,
        "requires_grad": requires_grad,
        "data_name": data_name,
    }


def write_tensor_dump(
    folder: Path, records: dict[str, Record], tensors: dict[str, torch.Tensor], framework: str = "pytorch"
) -> Path:
    """`folder/dump.json` holding `records` (call name -> record) and every tensor as
    `folder/dump_tensor_data/<data_name>` (torch.save: loaded with weights_only=True);
    returns the dump.json path."""
    data_folder = folder / TENSOR_FOLDER
    data_folder.mkdir(parents=True, exist_ok=True)
    for data_name, tensor in tensors.items():
        torch.save(tensor.detach().cpu().contiguous().clone(), data_folder / data_name)
    path = folder / "dump.json"
    header = {"task": "tensor", "level": "L1", "framework": framework, "dump_data_dir": str(data_folder)}
    path.write_text(json.dumps({**header, "data": records}, indent=1), encoding="utf-8")
    return path
