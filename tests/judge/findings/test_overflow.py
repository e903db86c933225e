"""The overflow re-check (judge/findings/overflow.py), part of every run: a dumped output holding
inf/NaN while the inputs are finite is the kernel's overflow (an error) where the bench
stays within the dtype's range, the inputs' (a note) where the bench overflows too.

Planted dumps, as a device would have written them: a float16 softmax computed without
subtracting the max (exp overflows past 11.09: NaN outputs, a kernel overflow), exp of
float16 inputs up to 13 (e**13 = 442413 overflows float16 in any kernel: an input
overflow), exp of inputs already holding inf (no claim), and beside them the correct
softmax, whose output is finite (nothing to re-check)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

from pytest_msprobe.results.msprobe_csv import DETAILS_HEADER
from pytest_msprobe.testing.dumpwriter import DumpWriter

KERNEL, INPUT, NON_FINITE_INPUTS, CORRECT = (
    "Functional.softmax.0.forward",
    "Torch.exp.0.forward",
    "Torch.exp.1.forward",
    "Functional.softmax.1.forward",
)


def overflow_dump(root: Path, task: str) -> Path:
    writer = DumpWriter(root, task)
    generator = torch.Generator().manual_seed(3)
    logits = (torch.rand(8, 32, generator=generator) * 14).to(torch.float16)
    no_max_subtracted = torch.exp(logits) / torch.exp(logits).sum(-1, keepdim=True)
    assert no_max_subtracted.isnan().any()  # the premise: the planted kernel overflows
    writer.forward("Functional.softmax.0", [logits], {"dim": -1}, no_max_subtracted)
    writer.forward("Functional.softmax.1", [logits], {"dim": -1}, torch.softmax(logits, -1))
    large = (torch.rand(8, 32, generator=generator) * 13).to(torch.float16)
    writer.forward("Torch.exp.0", [large], {}, torch.exp(large))
    with_inf = torch.rand(8, 32, generator=generator).to(torch.float16)
    with_inf[2, 5] = float("inf")
    writer.forward("Torch.exp.1", [with_inf], {}, torch.exp(with_inf))
    return writer.write()


def metrics_rows(folder: Path) -> dict[str, dict]:
    [path] = folder.glob("accuracy_checking_metrics_*.jsonl")
    return {row["name"]: row for row in map(json.loads, path.read_text().splitlines())}


def details_rows(folder: Path) -> tuple[list[str], dict[str, dict]]:
    [path] = folder.glob("accuracy_checking_details_*.csv")
    with open(path, encoding="utf-8-sig", newline="") as handle:
        rows = list(csv.reader(handle))
    return rows[0], {row[0]: dict(zip(rows[0], row, strict=False)) for row in rows[1:]}


@pytest.mark.parametrize("task,mode", [("statistics", "online"), ("tensor", "online"), ("tensor", "offline")])
def test_kernel_overflow_fails_and_input_overflow_is_a_note(
    task: str, mode: str, tmp_path: Path, run_dump, pytester: pytest.Pytester
) -> None:
    extra = ["--msprobe-offline"] if mode == "offline" else ["--msprobe-device=cpu"]
    result = run_dump(overflow_dump(tmp_path / task, task), *extra)
    assert set(result.by_outcome("failed")) == {KERNEL}
    failure = result.calls[KERNEL].text
    assert failure.startswith(f"{KERNEL}: error: kernel overflow")
    assert "max |bench| = " in failure and "float16's range" in failure and "largest finite 65504" in failure
    assert set(result.by_outcome("passed")) == {INPUT, NON_FINITE_INPUTS, CORRECT}

    out = pytester.path / "msprobe-out"
    metrics = metrics_rows(out)
    assert metrics[f"{KERNEL}.output.0"]["overflow"] == "kernel" and metrics[f"{KERNEL}.output.0"]["status"] == "error"
    assert metrics[f"{KERNEL}.output.0"]["overflow_bench_max_abs"] <= 1.0
    assert metrics[f"{INPUT}.output.0"]["overflow"] == "input" and metrics[f"{INPUT}.output.0"]["status"] == "pass"
    assert (
        metrics[f"{INPUT}.output.0"]["overflow_bench_max_abs"]
        > metrics[f"{INPUT}.output.0"]["overflow_dtype_max"]
        == 65504
    )
    assert "overflow" not in metrics[f"{NON_FINITE_INPUTS}.output.0"]  # its inputs hold inf: no claim
    assert "overflow" not in metrics[f"{CORRECT}.output.0"]

    [journal] = out.glob("msprobe_records_*.jsonl")
    records = {record["call"]: record for record in map(json.loads, journal.read_text().splitlines())}
    assert records[KERNEL]["status"] == "error"
    note = records[INPUT]["message"]
    assert records[INPUT]["status"] == "pass" and "input overflow" in note
    assert "beyond float16's largest finite value 65504" in note and "not the kernel's" in note
    assert "overflow" not in records[NON_FINITE_INPUTS]["message"]

    header, details = details_rows(out)
    assert tuple(header) == DETAILS_HEADER  # msprobe's columns, no new one
    assert (
        details[f"{KERNEL}.output.0"]["Status"] == "error"
        and "kernel overflow" in details[f"{KERNEL}.output.0"]["Message"]
    )
    assert (
        details[f"{INPUT}.output.0"]["Status"] == "pass" and "input overflow" in details[f"{INPUT}.output.0"]["Message"]
    )


def test_statistics_dump_says_its_inputs_were_generated(tmp_path: Path, run_dump) -> None:
    result = run_dump(overflow_dump(tmp_path / "dump", "statistics"), "--msprobe-device=cpu", "-k", "softmax.0")
    assert "on finite inputs generated from the recorded statistics" in result.calls[KERNEL].text


def test_a_mean_or_norm_overflowing_alone_is_no_overflow_of_the_output(tmp_path: Path, run_dump) -> None:
    """msprobe sums Mean and Norm: they overflow for large finite elements. A finite Max
    and Min say every element is finite; a non-finite Max says otherwise."""
    writer = DumpWriter(tmp_path / "dump", "statistics")
    x = torch.full((4, 64), 0.5, dtype=torch.float16)
    writer.forward("Torch.exp.0", [x], {}, torch.exp(x))
    writer.forward("Torch.exp.1", [x], {}, torch.exp(x))
    writer.data["Torch.exp.0.forward"]["output"][0].update(Norm=float("inf"), Mean=float("nan"))
    writer.data["Torch.exp.1.forward"]["output"][0].update(Max=float("inf"))
    result = run_dump(writer.write(), "--msprobe-device=cpu")
    assert result.calls["Torch.exp.0.forward"].outcome == "passed"
    assert result.calls["Torch.exp.1.forward"].outcome == "failed"
    assert (
        "kernel overflow" in result.calls["Torch.exp.1.forward"].text
        and "(Max=inf)" in result.calls["Torch.exp.1.forward"].text
    )


def test_a_gradient_is_re_checked_against_the_bench_gradient_of_its_input(tmp_path: Path, run_dump) -> None:
    """A backward's dumped gradients pair with the bench's through the autograd graph:
    msprobe records linear's as addmm's (bias, input, weight transposed). An inf in the
    first is the bias gradient's (output [2] of the call's gradients); the last is the
    gradient of a transpose inside the call, which no bench gradient is: not re-checked."""
    writer = DumpWriter(tmp_path / "dump", "tensor")
    generator = torch.Generator().manual_seed(5)
    for call in ("Functional.linear.0", "Functional.linear.1"):
        x, w, b, upstream = (
            torch.randn(*shape, generator=generator).to(torch.float16) for shape in ((4, 8), (5, 8), (5,), (4, 5))
        )
        writer.forward(call, [x, w, b], {}, torch.nn.functional.linear(x, w, b))
        grads = [upstream.sum(0), upstream @ w, x.T @ upstream]
        grads[0 if call.endswith("0") else 2][1] = float("inf")
        writer.backward(call, [upstream], grads)
    result = run_dump(writer.write(), "--msprobe-device=cpu")
    failure = result.calls["Functional.linear.0.backward"].text
    assert failure.startswith("Functional.linear.0.backward: error: kernel overflow")
    assert "[2]: kernel overflow" in failure and "[0]: kernel overflow" not in failure
    assert result.calls["Functional.linear.1.backward"].outcome == "passed"
