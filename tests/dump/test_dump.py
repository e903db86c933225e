"""Reading dump.json: call names, the streaming index and reading one record back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_msprobe.dump.index import CallName, DumpIndex, parse_call_name, read_index
from pytest_msprobe.errors import CallError, DumpError


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("Functional.linear.0.forward", CallName("Functional", "linear", 0, "forward")),
        ("Tensor.__matmul__.12.backward", CallName("Tensor", "__matmul__", 12, "backward")),
        ("Aten.add.Tensor.3.forward", CallName("Aten", "add.Tensor", 3, "forward")),
        ("NPU.npu_fusion_attention.0.forward", CallName("NPU", "npu_fusion_attention", 0, "forward")),
        ("Module.fc1.Linear.forward.0", None),
        ("Cell.dense.Dense.backward.0", None),
        ("Functional.linear.x.forward", None),
        ("Functional.linear.0.sideways", None),
        ("linear.0.forward", None),
    ],
)
def test_call_names_split_from_the_right(name: str, expected: CallName | None) -> None:
    assert parse_call_name(name) == expected
    if expected is not None:
        assert str(expected) == name


def test_index_of_every_shipped_dump_matches_json_load(dumps: Path) -> None:
    for path in sorted(dumps.glob("*/dump.json")):
        loaded = json.loads(path.read_text())
        index = read_index(path)
        api_names = [name for name in loaded["data"] if parse_call_name(name)]
        assert [str(entry.name) for entry in index.entries] == api_names
        assert index.modules == sum(name.startswith(("Module.", "Cell.")) for name in loaded["data"])
        assert index.framework == loaded.get("framework", "pytorch")
        for entry in index.entries:
            assert index.read_record(entry) == loaded["data"][str(entry.name)]


def test_rope_dump_without_framework_defaults_to_pytorch(dumps: Path) -> None:
    index = read_index(dumps / "npu_rope_statistics_fp16" / "dump.json")
    assert (index.framework, index.level, len(index.entries)) == ("pytorch", "mix", 3)


def test_byte_offsets_survive_non_ascii_text(tmp_path: Path) -> None:
    data = {
        "Torch.exp.0.forward": {"input_args": [{"type": "str", "value": "温度 ✓"}], "input_kwargs": {}, "output": []},
        "Torch.exp.1.forward": {"input_args": [{"type": "str", "value": "après"}], "input_kwargs": {}, "output": []},
    }
    path = tmp_path / "dump.json"
    path.write_text(json.dumps({"task": "statistics", "data": data}, ensure_ascii=False, indent=2), encoding="utf-8")
    index = read_index(path)
    assert [index.read_record(entry) for entry in index.entries] == list(data.values())


def test_special_floats_are_read(tmp_path: Path) -> None:
    path = tmp_path / "dump.json"
    path.write_text(
        '{"task": "statistics", "data": {"Torch.exp.0.forward": {"input_args": [{"type": "float", "value": -Infinity}, {"type": "float", "value": NaN}]}}}'
    )
    record = read_index(path).read_record(read_index(path).entries[0])
    assert record["input_args"][0]["value"] == float("-inf")


def test_numel_counts_every_tensor(dumps: Path) -> None:
    index = read_index(dumps / "torch_mlpcnn_tensor_fp32" / "dump.json")
    linear = index.entry("Functional.linear.0.forward")
    assert linear.numel == 4 * 10 * 16 + 64 * 16 + 64 + 4 * 10 * 64


def test_a_call_is_found_by_name_and_a_name_the_index_lacks_is_a_key_error(dumps: Path) -> None:
    index = read_index(dumps / "torch_mlpcnn_tensor_fp32" / "dump.json")
    position = index.position_of("Functional.linear.0.forward")
    assert index.names[position] == "Functional.linear.0.forward" and index.entry_at(position) == index.entry_of(
        index.names[position]
    )
    with pytest.raises(KeyError):
        index.position_of("Functional.linear.999.forward")


def test_what_is_derived_from_a_dump_is_made_once_per_kind(dumps: Path) -> None:
    index = read_index(dumps / "torch_mlpcnn_tensor_fp32" / "dump.json")
    made: list[str] = []

    def calls(index: DumpIndex) -> list[str]:
        made.append("calls")
        return list(index.names)

    def count(index: DumpIndex) -> int:
        made.append("count")
        return len(index)

    first = index.derive(list, calls)
    assert index.derive(list, calls) is first and index.derive(int, count) == len(index)
    assert made == ["calls", "count"]
    assert (
        read_index(dumps / "torch_mlpcnn_tensor_fp32" / "dump.json").derive(int, lambda index: -1) == -1
    )  # kept per index


def test_record_changed_after_indexing_is_a_call_error(tmp_path: Path) -> None:
    path = tmp_path / "dump.json"
    path.write_text(json.dumps({"task": "statistics", "data": {"Torch.exp.0.forward": {"input_args": []}}}))
    index = read_index(path)
    path.write_text("{}" + " " * 100)
    with pytest.raises(CallError, match="no longer parses"):
        index.read_record(index.entries[0])


def test_unreadable_file_names_it(tmp_path: Path) -> None:
    with pytest.raises(DumpError, match="cannot be read"):
        read_index(tmp_path / "absent.json")
