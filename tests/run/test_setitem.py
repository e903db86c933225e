"""Tensor.__setitem__ is judged by its effect on the tensor it writes: replayed on a copy,
the copy is its output (run/apis.py writes_first), with every kind of index msprobe
records (int, slice, Ellipsis, bool and int tensors, tuples, which it records as lists).
It used to skip ("output: None on both sides"). Offline it skips with the reason:
msprobe records its output as null."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pytest_msprobe.testing.dumpwriter import DumpWriter

SETITEM = torch.Tensor.__setitem__  # the correct kernel, kept while a planted fault stands in for it


def setitem_dump(root: Path) -> Path:
    """Writes into a 4x5x6 float32 tensor, as msprobe records them: the target before
    the write, the index (a tuple as a list), the value; the output null."""
    generator = torch.Generator().manual_seed(2)
    target = torch.randn(4, 5, 6, generator=generator)
    value = lambda *shape: torch.randn(*shape, generator=generator)
    writes = [
        (2, value(5, 6)),
        ([slice(1, 3), slice(None), slice(None, None, 2)], value(2, 5, 3)),
        ([Ellipsis, 0], 1.5),
        (target > 1, 0.0),
        (torch.tensor([1, 3]), value(2, 5, 6)),
        ([0, 2], value(5, 6)),  # x[[0, 2]]: the tuple reading x[0, 2] does not fit a 5x6 value
        (1, value(5, 6).double()),  # a float64 value rounded into float32
        ([0, 1], value(6)),  # x[0, 1] or x[[0, 1]]: both fit
    ]
    writer = DumpWriter(root, "tensor")
    for number, (index, written) in enumerate(writes):
        writer.forward(f"Tensor.__setitem__.{number}", [target, index, written], {}, None)
    return writer.write()


@pytest.mark.parametrize("mode", [(), ("--msprobe-offline",)], ids=["single-run", "offline"])
def test_setitem_is_judged_by_what_it_writes(mode: tuple[str, ...], tmp_path: Path, run_dump) -> None:
    result = run_dump(setitem_dump(tmp_path / "dump"), "--msprobe-device=cpu", *mode)
    if mode:
        assert not result.by_outcome("passed") and all(
            "records no output" in call.text for call in result.calls.values()
        )
        return
    assert sorted(result.by_outcome("passed")) == [f"Tensor.__setitem__.{number}.forward" for number in range(7)]
    assert "ambiguous" in result.calls["Tensor.__setitem__.7.forward"].text


def test_a_wrong_write_fails(tmp_path: Path, run_dump, monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted: a float32 write of a tensor value 2**-10 too large (the bench writes float64)."""

    def faulty(target: torch.Tensor, index: object, value: object) -> None:
        if target.dtype == torch.float32 and isinstance(value, torch.Tensor) and value.is_floating_point():
            value = value * (1 + 2**-10)
        SETITEM(target, index, value)

    dump = setitem_dump(tmp_path / "dump")
    monkeypatch.setattr(torch.Tensor, "__setitem__", faulty)
    result = run_dump(dump, "--msprobe-device=cpu")
    assert sorted(result.by_outcome("failed")) == [f"Tensor.__setitem__.{number}.forward" for number in (0, 1, 4, 5, 6)]
