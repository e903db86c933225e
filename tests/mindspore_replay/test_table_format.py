"""The table's shape is checked on load, so a bad edit fails here, not in a user's run."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_msprobe.run.mindspore.tables import mindspore_table, parse_table


def _table(entry: dict[str, Any]) -> dict[str, Any]:
    return {
        "Mint": {"owner": "mindspore.mint", "apis": {"exp": entry}},
        "unreplayable": {"Jit": "a graph"},
        "random": {"names": ["dropout"]},
    }


@pytest.mark.parametrize(
    "entry, complaint",
    [
        ({"torch": "torch.exp", "dims": {}}, "unknown keys ['dims']"),
        ({"torch": "numpy.exp"}, "is not a path under torch"),
        ({"torch": "torch.softmax", "defaults": {"dim": -1}}, "defaults need params"),
        ({"rename": {"axis": "dim"}}, "argument translation without a torch twin"),
    ],
)
def test_bad_rows_are_refused(entry: dict[str, Any], complaint: str) -> None:
    with pytest.raises(ValueError, match=complaint.replace("[", r"\[").replace("]", r"\]")):
        parse_table(_table(entry))


def test_shipped_table_loads() -> None:
    table = mindspore_table()
    assert set(table.apis) == {"Mint", "MintFunctional", "Functional", "Tensor"}
    assert set(table.unreplayable) == {"Primitive", "Jit"}
    assert table.apis["Functional"]["softmax"].rename == {"axis": "dim"}
