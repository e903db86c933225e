"""Tensor files are read as torch.load(weights_only=True) reads them, faster: every
shipped .pt gives the same tensor bit for bit, and a file that is not a plain saved
tensor is left to torch (tests/dump/test_bad_input.py: hostile files are refused)."""

from __future__ import annotations

import io
import pickle
import zipfile
from pathlib import Path

import pytest
import torch

from pytest_msprobe.dump import tensors

DUMPS = Path(__file__).parents[1] / "dumps"
SHIPPED = sorted(DUMPS.rglob("*.pt"))


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        type(a) is type(b)
        and a.dtype == b.dtype
        and a.shape == b.shape
        and a.stride() == b.stride()
        and a.storage_offset() == b.storage_offset()
        and a.requires_grad == b.requires_grad
        and torch.equal(_bytes(a), _bytes(b))
    )


def _bytes(tensor: torch.Tensor) -> torch.Tensor:
    """The whole storage under a tensor, as bytes."""
    return torch.empty(0, dtype=torch.uint8).set_(tensor.untyped_storage())


def test_every_shipped_tensor_file_reads_as_torch_reads_it() -> None:
    assert len(SHIPPED) > 1000
    for path in SHIPPED:
        fast = tensors._saved_tensor(path)
        assert fast is not None, path  # msprobe's files take the fast path
        assert _same(fast, torch.load(path, map_location="cpu", weights_only=True)), path


@pytest.mark.parametrize(
    "value",
    [
        torch.arange(12.0).reshape(3, 4)[:, 1:3],
        torch.tensor(2.5, dtype=torch.bfloat16),
        torch.zeros(0, 3, dtype=torch.float16),
        torch.tensor([True, False]),
        torch.arange(6, dtype=torch.int64).reshape(2, 3).t(),
        torch.ones(2, requires_grad=True),
    ],
    ids=["view", "scalar_bf16", "empty_fp16", "bool", "transposed_int64", "requires_grad"],
)
def test_views_dtypes_and_empty_tensors(tmp_path: Path, value: torch.Tensor) -> None:
    path = tmp_path / "t.pt"
    torch.save(value, path)
    fast = tensors._saved_tensor(path)
    assert fast is not None and _same(fast, torch.load(path, weights_only=True))


def _rewritten(path: Path, record: str, change) -> None:
    """The archive with one record's bytes changed."""
    with zipfile.ZipFile(path) as archive:
        entries = [(info, archive.read(info)) for info in archive.infolist()]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        for info, data in entries:
            archive.writestr(info, change(data) if info.filename.endswith(record) else data)


def test_a_storage_shorter_than_its_tensor_is_left_to_torch(tmp_path: Path) -> None:
    path = tmp_path / "short.pt"
    torch.save(torch.arange(8.0), path)
    _rewritten(path, "data/0", lambda data: data[:8])
    assert tensors._saved_tensor(path) is None


def test_a_pickle_naming_another_global_is_left_to_torch(tmp_path: Path) -> None:
    path = tmp_path / "other.pt"
    torch.save(torch.arange(4.0), path)
    _rewritten(path, "data.pkl", lambda data: pickle.dumps(io.BytesIO(b"x"), protocol=2))
    assert tensors._saved_tensor(path) is None
    with pytest.raises(Exception, match="Weights only load failed"):
        torch.load(path, weights_only=True)


def test_not_a_zip_is_left_to_torch(tmp_path: Path) -> None:
    path = tmp_path / "legacy.pt"
    torch.save(torch.arange(4.0), path, _use_new_zipfile_serialization=False)
    assert tensors._saved_tensor(path) is None
    assert torch.equal(tensors._load_pt(path, None), torch.arange(4.0))  # torch.load reads the old format
