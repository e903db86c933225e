"""A corpus of broken dumps: each gives one clear failure for the dump or a per-call
skip or error naming the problem; nothing crashes, no code runs, no file outside the
dump is read, the healthy calls of the same dump still run, and a dump that cannot be
read at all fails alone while the other dumps of the run are checked."""

from __future__ import annotations

import json
import os
import pickle
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

HEALTHY = "Torch.exp.0.forward"


def tensor(shape, dtype="torch.float32", data_name="", **extra):
    value = {
        "type": "torch.Tensor",
        "dtype": dtype,
        "shape": shape,
        "Max": 1.0,
        "Min": -1.0,
        "Mean": 0.0,
        "Norm": 1.0,
        "requires_grad": False,
    }
    if data_name:
        value["data_name"] = data_name
    value.update(extra)
    return value


def call(*args, **kwargs):
    return {"input_args": list(args), "input_kwargs": kwargs, "output": [tensor([2, 3])]}


def healthy() -> dict:
    return {HEALTHY: call(tensor([2, 3]))}


class Payload:
    """Unpickling this runs code: a safe loader must refuse it."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class Harmless:
    """A pickled object of a class torch does not allowlist: its refusal message (in
    torch 2.6+) carries terminal escapes and advice to load the file unsafely."""


@dataclass
class Case:
    name: str
    build: Callable[[Path], Path]  # writes the dump under the folder, returns dump.json
    expect: str  # "dump" (the whole dump fails as one test), "failed" or "skipped": for the broken call
    says: str  # a piece of the message that names the problem


def raw(text: bytes | str) -> Callable[[Path], Path]:
    def build(root: Path) -> Path:
        root.mkdir(parents=True, exist_ok=True)
        path = root / "dump.json"
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        return path

    return build


def dump(
    entries: dict, *, task="tensor", files: dict | None = None, header: dict | None = None
) -> Callable[[Path], Path]:
    def build(root: Path) -> Path:
        data_dir = root / "dump_tensor_data"
        data_dir.mkdir(parents=True, exist_ok=True)
        torch.save(torch.linspace(-1, 1, 6).reshape(2, 3), data_dir / "good.pt")
        for name, writer in (files or {}).items():
            writer(data_dir / name, root)
        body = {"task": task, "level": "L1", "framework": "pytorch", "dump_data_dir": "/elsewhere", **(header or {})}
        body["data"] = {**healthy_tensor(task), **entries}
        (root / "dump.json").write_text(json.dumps(body))
        return root / "dump.json"

    return build


def healthy_tensor(task: str) -> dict:
    if task == "tensor":
        return {HEALTHY: call(tensor([2, 3], data_name="good.pt"))}
    return healthy()


def broken(name="Torch.exp.1.forward", value=None) -> dict:
    return {name: value}


def save_tensor(value):
    return lambda path, root: torch.save(value, path)


def secret_outside(path: Path, root: Path) -> None:
    torch.save(torch.zeros(2, 3), root.parent / "secret.pt")


CASES = [
    Case(
        "truncated_json",
        lambda r: raw(json.dumps({"task": "tensor", "data": healthy()})[:-20])(r),
        "dump",
        "ends early",
    ),
    Case("invalid_json", raw('{"task": "tensor", "data": {oops}}'), "dump", "not a valid dump.json"),
    Case("empty_file", raw(""), "dump", "expected an object"),
    Case("top_level_array", raw("[1, 2]"), "dump", "expected an object"),
    Case("no_data", raw(json.dumps({"task": "tensor"})), "dump", 'no "data" object'),
    Case("data_not_object", raw(json.dumps({"task": "tensor", "data": [1]})), "dump", '"data" is not an object'),
    Case("task_missing", raw(json.dumps({"data": healthy()})), "dump", '"task"'),
    Case(
        "task_unknown",
        raw(json.dumps({"task": "everything", "data": healthy()})),
        "dump",
        'expected "tensor" or "statistics"',
    ),
    Case(
        "framework_unknown",
        raw(json.dumps({"task": "statistics", "framework": "jax", "data": healthy()})),
        "dump",
        '"framework"',
    ),
    Case("not_utf8", raw(b'{"task": "\xff\xfe"}'), "dump", "not UTF-8"),
    Case(
        "empty_dump",
        raw(json.dumps({"task": "statistics", "data": {"Module.fc.Linear.forward.0": {}}})),
        "dump",
        "holds no API calls",
    ),
    Case("record_not_object", dump(broken(value=[1, 2])), "failed", "not an object"),
    Case(
        "args_not_list",
        dump(broken(value={"input_args": {"a": 1}, "input_kwargs": {}})),
        "failed",
        "input_args must be a list",
    ),
    Case(
        "shape_not_list",
        dump(broken(value=call(tensor("2x3", data_name="good.pt")))),
        "failed",
        "is not a list of non-negative integers",
    ),
    Case("negative_shape", dump(broken(value=call(tensor([-1, 3], data_name="good.pt")))), "failed", "non-negative"),
    Case(
        "unknown_dtype",
        dump(broken(value=call(tensor([2, 3], dtype="torch.float128", data_name="good.pt")))),
        "skipped",
        "unknown dtype 'torch.float128'",
    ),
    Case(
        "unknown_value_type",
        dump(broken(value=call({"type": "torch.Generator", "value": 1}))),
        "skipped",
        "unsupported value type 'torch.Generator'",
    ),
    Case(
        "wrong_scalar_type",
        dump(broken("Torch.add.0.forward", call(tensor([2, 3], data_name="good.pt"), {"type": "int", "value": "3"}))),
        "failed",
        "is not a int",
    ),
    Case(
        "missing_tensor_file",
        dump(broken(value=call(tensor([2, 3], data_name="gone.pt")))),
        "failed",
        "'gone.pt' is missing",
    ),
    Case(
        "corrupt_tensor_file",
        dump(
            broken(value=call(tensor([2, 3], data_name="bad.pt"))),
            files={"bad.pt": lambda p, r: p.write_bytes(b"\x80\x02garbage" * 10)},
        ),
        "failed",
        "cannot load 'bad.pt'",
    ),
    Case(
        "data_name_escapes",
        dump(broken(value=call(tensor([2, 3], data_name="../../secret.pt"))), files={"x": secret_outside}),
        "failed",
        "points outside",
    ),
    Case(
        "data_name_absolute",
        dump(broken(value=call(tensor([2, 3], data_name="/etc/hostname.pt")))),
        "failed",
        "points outside",
    ),
    Case(
        "symlink_escapes",
        dump(
            broken(value=call(tensor([2, 3], data_name="link.pt"))),
            files={"link.pt": lambda p, r: (secret_outside(p, r), p.symlink_to(r.parent / "secret.pt"))},
        ),
        "failed",
        "points outside",
    ),
    Case(
        "not_a_tensor_file",
        dump(broken(value=call(tensor([2, 3], data_name="notes.txt")))),
        "failed",
        "is not a .pt or .npy file name",
    ),
    Case(
        "pickle_payload",
        dump(
            broken(value=call(tensor([2, 3], data_name="evil.pt"))),
            files={"evil.pt": lambda p, r: p.write_bytes(pickle.dumps(Payload(r / "PWNED")))},
        ),
        "failed",
        "cannot load 'evil.pt'",
    ),
    Case(
        "pickled_object",
        dump(broken(value=call(tensor([2, 3], data_name="obj.pt"))), files={"obj.pt": save_tensor(Harmless())}),
        "failed",
        "cannot load 'obj.pt': it is not a plain tensor file",
    ),
    Case(
        "npy_object_array",
        dump(
            broken(value=call(tensor([2, 3], data_name="obj.npy"))),
            files={
                "obj.npy": lambda p, r: np.save(
                    p, np.array([Payload(r / "PWNED")] * 6, dtype=object).reshape(2, 3), allow_pickle=True
                )
            },
        ),
        "failed",
        "cannot load 'obj.npy'",
    ),
    Case(
        "file_shape_mismatch",
        dump(broken(value=call(tensor([3, 2], data_name="good.pt")))),
        "failed",
        "holds shape [2, 3], the dump says [3, 2]",
    ),
    Case(
        "file_dtype_mismatch",
        dump(broken(value=call(tensor([2, 3], dtype="torch.float16", data_name="good.pt")))),
        "failed",
        "holds torch.float32, the dump says torch.float16",
    ),
    Case(
        "file_not_a_tensor",
        dump(
            broken(value=call(tensor([2, 3], data_name="dict.pt"))),
            files={"dict.pt": save_tensor({"a": torch.zeros(1)})},
        ),
        "failed",
        "not a tensor",
    ),
    Case(
        "huge_shape",
        dump(broken(value=call(tensor([1 << 20, 1 << 20]))), task="statistics"),
        "skipped",
        "above the limit",
    ),
    Case(
        "min_above_max",
        dump(broken(value=call(tensor([2, 3], Max=-1.0, Min=1.0))), task="statistics"),
        "failed",
        "Min=1.0 > Max=-1.0",
    ),
    Case(
        "statistic_not_number",
        dump(broken(value=call(tensor([2, 3], Max="big"))), task="statistics"),
        "failed",
        "statistic Max='big' is not a number",
    ),
    Case(
        "unknown_api",
        dump(broken("Torch.not_an_api.0.forward", call(tensor([2, 3], data_name="good.pt")))),
        "skipped",
        "not in the replay table",
    ),
    Case(
        "dangerous_api",
        dump(broken("Torch.load.0.forward", call({"type": "str", "value": "/etc/passwd"}))),
        "skipped",
        "not in the replay table",
    ),
    Case(
        "unknown_api_type",
        dump(broken("Jax.exp.0.forward", call(tensor([2, 3], data_name="good.pt")))),
        "skipped",
        "api type 'Jax'",
    ),
    Case(
        "distributed_call",
        dump(broken("Distributed.all_reduce.0.forward", call(tensor([2, 3], data_name="good.pt")))),
        "skipped",
        "communication",
    ),
    Case(
        "backward_without_forward",
        dump(broken("Torch.exp.7.backward", {"input": [tensor([2, 3], data_name="good.pt")], "output": []})),
        "skipped",
        "has no forward record",
    ),
    Case(
        "device_rejects_arguments",
        dump(broken("Torch.exp.2.forward", call(tensor([2, 3], data_name="good.pt"), {"type": "int", "value": 3}))),
        "skipped",
        "the bench cannot run this call",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_broken_dump_is_reported_not_crashed(case: Case, tmp_path: Path, run_dump) -> None:
    dump_json = case.build(tmp_path / "dump")
    result = run_dump(dump_json)
    assert not (tmp_path / "dump" / "PWNED").exists(), "a pickle payload was executed"
    assert result.collection_errors == []
    if case.expect == "dump":
        assert list(result.calls) == ["collection"], result.calls
        assert result.calls["collection"].outcome == "failed"
        assert case.says in result.calls["collection"].text
        assert str(dump_json.parent) in result.calls["collection"].text
        assert result.ret == pytest.ExitCode.TESTS_FAILED
        return
    broken_calls = {name: outcome for name, outcome in result.calls.items() if name != HEALTHY}
    assert len(broken_calls) == 1, result.calls
    (outcome,) = broken_calls.values()
    assert outcome.outcome == case.expect, outcome.text
    assert case.says in outcome.text
    assert (
        "\x1b" not in outcome.text and "weights_only` set to `False" not in outcome.text
    )  # never advise loading unsafely
    assert result.calls[HEALTHY].outcome == "passed", result.calls[HEALTHY].text


def test_a_dump_that_cannot_be_checked_fails_alone_and_the_others_run(
    tmp_path: Path, copy_dump, pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A truncated dump and a MindSpore dump without MindSpore, beside a good dump, with
    no --continue-on-collection-errors: each bad dump is one failed test, the good dump's
    calls all run, and the exit status says something failed."""
    truncated = raw(json.dumps({"task": "tensor", "data": healthy()})[:-20])(tmp_path / "truncated")
    monkeypatch.setitem(sys.modules, "mindspore", None)  # what find_spec sees when it is absent
    result = pytester.inline_run(
        f"--msprobe-dump={truncated}",
        f"--msprobe-dump={copy_dump('mindspore_small_statistics_fp32')}",
        f"--msprobe-dump={copy_dump('npu_rope_statistics_fp16')}",
        "--msprobe-device=cpu",
        "-p",
        "no:cacheprovider",
    )
    assert result.getfailedcollections() == []
    outcomes = {
        report.nodeid.split("/")[-2] + "::" + report.nodeid.rsplit("::", 1)[-1]: report
        for report in result.getreports("pytest_runtest_logreport")
        if report.when == "call"
    }
    failed = {name: report.longreprtext for name, report in outcomes.items() if report.failed}
    assert set(failed) == {"truncated::collection", "mindspore_small_statistics_fp32::collection"}
    assert "ends early" in failed["truncated::collection"]
    assert "MindSpore is not installed" in failed["mindspore_small_statistics_fp32::collection"]
    assert sorted(name for name, report in outcomes.items() if report.passed) == [
        "npu_rope_statistics_fp16::Tensor.__mul__.7.forward",
        "npu_rope_statistics_fp16::Torch.cat.8.forward",
        "npu_rope_statistics_fp16::Torch.chunk.4.forward",
    ]
    assert result.ret == pytest.ExitCode.TESTS_FAILED
