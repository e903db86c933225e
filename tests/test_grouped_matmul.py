"""npu_grouped_matmul dumps in msprobe's record format (TensorList arguments, list
outputs), judged offline: outputs correctly rounded from a float64 truth computed here,
group by group, independently of bench_functions, pass in every mode; each planted
fault fails exactly its call; garbage and NaN past group_list's total change nothing,
and the report names those rows."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from dumpwriter import DumpWriter

from pytest_msprobe import bench_functions

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
K, N, M = 96, 16, 40
CUMULATIVE = [6, 15, 15, 31]  # one empty group; 31 of the 40 rows written
COUNTS = [6, 9, 0, 16]
BIAS_DTYPE = {torch.float16: torch.float16, torch.bfloat16: torch.float32, torch.float32: torch.float32}


def rand(*shape: int, seed: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)


def spans(cumulative: list[int]) -> list[tuple[int, int]]:
    return list(zip([0, *cumulative[:-1]], cumulative, strict=True))


def truth_rows(x: torch.Tensor, ws: list[torch.Tensor], bias: list[torch.Tensor] | None, cumulative: list[int]) -> torch.Tensor:
    """float64 truth of a single x split by rows: group i's rows times weight i (+ bias i);
    rows past the total are left NaN (the kernel does not write them)."""
    out = torch.full((x.shape[0], ws[0].shape[1]), float("nan"), dtype=torch.float64)
    for i, (start, end) in enumerate(spans(cumulative)):
        out[start:end] = x[start:end].double() @ ws[i].double() + (bias[i].double() if bias else 0)
    return out


@dataclass
class Case:
    """One call: its arguments, its float64 truth per output, and how many leading
    rows of each output the kernel writes (None: all)."""

    name: str
    args: list
    kwargs: dict
    truth: list[torch.Tensor]
    written: list[int | None] = field(default_factory=list)


def cases(dtype: torch.dtype, seed: int) -> list[Case]:
    """Every documented floating mode of npu_grouped_matmul."""
    e = len(CUMULATIVE)
    x = rand(M, K, seed=seed, dtype=dtype)
    ws = [rand(K, N, seed=seed + 1 + i, dtype=dtype) / K**0.5 for i in range(e)]
    bias = [rand(N, seed=seed + 10 + i, dtype=BIAS_DTYPE[dtype]) for i in range(e)]
    xs = [rand(rows, K, seed=seed + 20 + i, dtype=dtype) for i, rows in enumerate(COUNTS)]
    x3 = rand(2, 3, K, seed=seed + 30, dtype=dtype)  # split_item 0 takes 2-6-D x
    cat_truth = torch.cat([xi.double() @ wi.double() for xi, wi in zip(xs, ws, strict=True)])
    rows = truth_rows(x, ws, bias, CUMULATIVE)
    stacked = torch.stack(ws)
    xt = rand(K, M, seed=seed + 40, dtype=dtype).t()  # MindSpeed's grad_w: [x.T] and [grad] split along the tokens
    grad_out = rand(M, N, seed=seed + 41, dtype=dtype)
    k_split = torch.stack([xt[:, s:t].double() @ grad_out[s:t].double() for s, t in spans(CUMULATIVE)])
    return [
        Case(
            "multi_x_split0",
            [[x3, *xs[:1]], ws[:2]],
            {"bias": bias[:2], "split_item": 0, "group_type": -1},
            [x3.double() @ ws[0].double() + bias[0].double(), xs[0].double() @ ws[1].double() + bias[1].double()],
        ),
        Case(
            "list_group_list_split1",
            [[x], ws],
            {"group_list": CUMULATIVE, "split_item": 1},
            [x[s:t].double() @ w.double() for (s, t), w in zip(spans(CUMULATIVE), ws, strict=True)],
        ),
        Case(
            "cumulative_split2_bias",
            [[x], ws],
            {"bias": bias, "group_list": torch.tensor(CUMULATIVE), "split_item": 2, "group_type": 0, "group_list_type": 0},
            [rows],
            [CUMULATIVE[-1]],
        ),
        Case(
            "counts_split3_3d_weight",
            [[x], [stacked]],
            {"group_list": torch.tensor(COUNTS), "split_item": 3, "group_type": 0, "group_list_type": 1},
            [truth_rows(x, ws, None, CUMULATIVE)],
            [CUMULATIVE[-1]],
        ),
        Case(
            "multi_x_single_out",
            [xs, ws],
            {"group_list": torch.tensor(COUNTS), "split_item": 2, "group_type": 0, "group_list_type": 1, "output_dtype": dtype},
            [cat_truth],
        ),
        Case(
            "k_grouped_weight_grad",
            [[xt], [grad_out]],
            {"group_list": torch.tensor(COUNTS), "split_item": 3, "group_type": 2, "group_list_type": 1},
            [k_split],
        ),
    ]


def quantised_cases(seed: int) -> list[Case]:
    """int8 x and weight with an int32 bias, a per-channel scale packed as int64 (float32
    bits in the low word) and a per-token scale, bfloat16 out (formula 3); float16 x with
    int8 weights dequantised per channel (formula 4)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-16, 16, (M, K), generator=g, dtype=torch.int8)
    w = torch.randint(-16, 16, (len(COUNTS), K, N), generator=g, dtype=torch.int8)
    bias = torch.randint(-100, 100, (len(COUNTS), N), generator=g, dtype=torch.int32)
    scale = torch.rand(len(COUNTS), N, generator=g) * 1e-3
    packed = scale.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    per_token = torch.rand(M, generator=g)
    truth = torch.full((M, N), float("nan"), dtype=torch.float64)
    for i, (start, end) in enumerate(spans(CUMULATIVE)):
        acc = x[start:end].double() @ w[i].double() + bias[i].double()
        truth[start:end] = acc * scale[i].double() * per_token[start:end, None].double()
    xa = rand(M, K, seed=seed + 1, dtype=torch.float16)
    wa = [torch.randint(-8, 8, (K, N), generator=g, dtype=torch.int8) for _ in COUNTS]
    a_scale = [(torch.rand(N, generator=g) * 0.02).half() for _ in COUNTS]
    a_offset = [torch.randn(N, generator=g).half() for _ in COUNTS]
    antiquant = torch.cat(
        [
            xa[s:t].double() @ ((wi.double() + o.double()) * sc.double())
            for (s, t), wi, sc, o in zip(spans(CUMULATIVE), wa, a_scale, a_offset, strict=True)
        ]
    )
    return [
        Case(
            "int8_per_token",
            [[x], [w]],
            {
                "bias": [bias],
                "scale": [packed],
                "per_token_scale": [per_token],
                "group_list": torch.tensor(CUMULATIVE),
                "split_item": 3,
                "group_type": 0,
                "output_dtype": torch.bfloat16,
            },
            [truth],
            [CUMULATIVE[-1]],
        ),
        Case(
            "antiquant_int8_weight",
            [[xa], wa],
            {
                "antiquant_scale": a_scale,
                "antiquant_offset": a_offset,
                "group_list": torch.tensor(COUNTS),
                "split_item": 2,
                "group_type": 0,
                "group_list_type": 1,
            },
            [antiquant],
            [CUMULATIVE[-1]],
        ),
    ]


def rounded(truth: torch.Tensor, dtype: torch.dtype, written: int | None, seed: int) -> torch.Tensor:
    """The truth correctly rounded; rows past `written` are leftover memory: huge
    values, inf and NaN."""
    out = truth.to(dtype)
    if written is not None and written < out.shape[0]:
        garbage = rand(out.shape[0] - written, *out.shape[1:], seed=seed, dtype=torch.float64) * 6e4
        garbage[0, 0], garbage[-1, -1] = float("nan"), float("inf")
        out[written:] = garbage.to(dtype)
    return out


def write(writer: DumpWriter, call: str, case: Case, outputs: list[torch.Tensor]) -> None:
    writer.forward(call, case.args, case.kwargs, outputs)


def correct_outputs(case: Case, dtype: torch.dtype, seed: int) -> list[torch.Tensor]:
    written = case.written or [None] * len(case.truth)
    return [rounded(t, dtype, w, seed + i) for i, (t, w) in enumerate(zip(case.truth, written, strict=True))]


def correct_dump(root: Path, task: str = "tensor") -> tuple[Path, dict[str, Case]]:
    writer = DumpWriter(root, task)
    names: dict[str, Case] = {}
    number = 0
    for d, dtype in enumerate(DTYPES):
        for case in cases(dtype, seed=100 * d):
            call = f"NPU.npu_grouped_matmul.{number}"
            write(writer, call, case, correct_outputs(case, dtype, seed=1000 + number))
            names[f"{call}.forward"] = case
            number += 1
    for case, dtype in zip(quantised_cases(seed=500), (torch.bfloat16, torch.float16), strict=True):
        call = f"NPU.npu_grouped_matmul.{number}"
        write(writer, call, case, correct_outputs(case, dtype, seed=1000 + number))
        names[f"{call}.forward"] = case
        number += 1
    return writer.write(), names


def messages(pytester: pytest.Pytester) -> dict[str, str]:
    """Each call's report text, passes included (the run's record journal)."""
    [journal] = (pytester.path / "msprobe-out").glob("msprobe_records_*.jsonl")
    return {record["call"]: record["message"] for record in map(json.loads, journal.read_text().splitlines())}


UNWRITTEN = "rows 31-39 (9 of 40) past group_list's total: not written by the kernel, not judged"


def test_every_mode_passes_offline_and_unwritten_rows_are_named(tmp_path: Path, run_dump, pytester: pytest.Pytester) -> None:
    dump, names = correct_dump(tmp_path / "dump")
    result = run_dump(dump, "--msprobe-offline")
    assert set(result.calls) == set(names)
    assert result.by_outcome("failed") == {} and result.by_outcome("skipped") == {}
    assert not any(outcome.warnings for outcome in result.calls.values())
    text = messages(pytester)
    for call, case in names.items():
        assert (UNWRITTEN in text[call]) == bool(case.written), call


def test_statistics_dump_replays_every_mode(tmp_path: Path, run_dump) -> None:
    """A statistics dump records only a tensor group_list's statistics: the group_list
    generated within them is made one the kernel can read (sorted where cumulative,
    sizes within the rows), so every mode replays and passes on the CPU."""
    dump, names = correct_dump(tmp_path / "dump", "statistics")
    result = run_dump(dump, "--msprobe-device=cpu")
    assert {call: o.outcome for call, o in result.calls.items()} == dict.fromkeys(names, "passed")
    assert not any(outcome.warnings for outcome in result.calls.values())


def next_weight(case: Case) -> torch.Tensor:
    """Each group's rows multiplied by the next group's weight."""
    x, ws = case.args[0][0], case.args[1]
    bias = case.kwargs["bias"]
    out = torch.full((x.shape[0], N), float("nan"), dtype=torch.float64)
    for i, (start, end) in enumerate(spans(CUMULATIVE)):
        j = (i + 1) % len(ws)
        out[start:end] = x[start:end].double() @ ws[j].double() + bias[i].double()
    return out


def counts_read_as_cumulative(case: Case) -> torch.Tensor:
    """group_list [6, 15, 15, 31] (cumulative) read as counts [6, 15, 15, 31]: the groups
    run past the rows, which the kernel cuts at M."""
    x, ws = case.args[0][0], case.args[1]
    bias = case.kwargs["bias"]
    out = torch.full((x.shape[0], N), float("nan"), dtype=torch.float64)
    start = 0
    for i, count in enumerate(CUMULATIVE):
        end = min(start + count, x.shape[0])
        out[start:end] = x[start:end].double() @ ws[i].double() + bias[i].double()
        start = end
    return out


def float16_accumulation(case: Case) -> torch.Tensor:
    """The products summed one term at a time in float16."""
    x, ws = case.args[0][0], case.args[1]
    bias = case.kwargs["bias"]
    out = torch.full((x.shape[0], N), float("nan"), dtype=torch.float64)
    for i, (start, end) in enumerate(spans(CUMULATIVE)):
        acc = torch.zeros(end - start, N, dtype=torch.float16)
        for k in range(K):
            acc = acc + x[start:end, k : k + 1].half() * ws[i][k : k + 1].half()
        out[start:end] = acc.double() + bias[i].double()
    return out


def nan_inside(case: Case) -> torch.Tensor:
    out = case.truth[0].clone()
    out[CUMULATIVE[-1] - 1, 3] = float("nan")
    return out


FAULTS = {
    "next_weight": next_weight,
    "counts_read_as_cumulative": counts_read_as_cumulative,
    "float16_accumulation": float16_accumulation,
    "nan_inside_written_rows": nan_inside,
}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_each_planted_fault_fails_its_call_and_only_it(dtype: torch.dtype, tmp_path: Path, run_dump) -> None:
    (case,) = [c for c in cases(dtype, seed=7) if c.name == "cumulative_split2_bias"]
    writer = DumpWriter(tmp_path / "dump", "tensor")
    write(writer, "NPU.npu_grouped_matmul.0", case, correct_outputs(case, dtype, seed=1))
    faulty = {}
    for number, (fault, make) in enumerate(FAULTS.items(), start=1):
        call = f"NPU.npu_grouped_matmul.{number}"
        write(writer, call, case, [rounded(make(case), dtype, CUMULATIVE[-1], seed=number)])
        faulty[f"{call}.forward"] = fault
    result = run_dump(writer.write(), "--msprobe-offline")
    assert set(result.by_outcome("failed")) == set(faulty), {c: o.outcome for c, o in result.calls.items()}
    assert result.calls["NPU.npu_grouped_matmul.0.forward"].outcome == "passed"


def backward_truth(x: torch.Tensor, ws: list[torch.Tensor], grad: torch.Tensor, group_of_rows: list[tuple[int, int]]) -> list[torch.Tensor]:
    """grad_x rows of group i = grad_i @ w_i^T (NaN past the total); grad_w_i = x_i^T @ grad_i."""
    grad_x = torch.full(x.shape, float("nan"), dtype=torch.float64)
    grad_ws = []
    for (start, end), w in zip(group_of_rows, ws, strict=True):
        grad_x[start:end] = grad[start:end].double() @ w.double().t()
        grad_ws.append(x[start:end].double().t() @ grad[start:end].double())
    return [grad_x, *grad_ws]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_backward_input_and_per_group_weight_gradients(dtype: torch.dtype, tmp_path: Path, run_dump, pytester: pytest.Pytester) -> None:
    """A dumped backward of npu_grouped_matmul: the gradients of x and of each group's
    weight, correctly rounded, pass; rows of x's gradient past the total are garbage and
    not judged; a weight gradient made from the next group's rows fails."""
    x = rand(M, K, seed=3, dtype=dtype)
    ws = [rand(K, N, seed=4 + i, dtype=dtype) / K**0.5 for i in range(len(CUMULATIVE))]
    grad = rand(M, N, seed=9, dtype=dtype)
    kwargs = {"group_list": torch.tensor(CUMULATIVE), "split_item": 2, "group_type": 0, "group_list_type": 0}
    forward = [rounded(truth_rows(x, ws, None, CUMULATIVE), dtype, CUMULATIVE[-1], seed=1)]
    truth = backward_truth(x, ws, grad, spans(CUMULATIVE))
    shifted = spans(CUMULATIVE)[1:] + spans(CUMULATIVE)[:1]
    wrong = [truth[0], *[x[s:t].double().t() @ grad[s:t].double() for s, t in shifted]]
    writer = DumpWriter(tmp_path / "dump", "tensor")
    for number, grads in enumerate((truth, wrong)):
        call = f"NPU.npu_grouped_matmul.{number}"
        writer.forward(call, [[x], ws], kwargs, forward)
        writer.backward(call, [grad], [rounded(grads[0], dtype, CUMULATIVE[-1], seed=2), *[g.to(dtype) for g in grads[1:]]])
    result = run_dump(writer.write(), "--msprobe-offline")
    outcomes = {call: outcome.outcome for call, outcome in result.calls.items()}
    assert outcomes == {
        "NPU.npu_grouped_matmul.0.forward": "passed",
        "NPU.npu_grouped_matmul.0.backward": "passed",
        "NPU.npu_grouped_matmul.1.forward": "passed",
        "NPU.npu_grouped_matmul.1.backward": "failed",
    }
    assert "past group_list's total: not written by the kernel" in messages(pytester)["NPU.npu_grouped_matmul.0.backward"]


def test_repeat_compares_only_the_written_rows(tmp_path: Path, run_dump, monkeypatch) -> None:
    """--msprobe-repeat on a kernel that leaves different leftover memory past the total
    at each run (as an NPU does): the written rows agree bit for bit, so no finding."""
    (case,) = [c for c in cases(torch.float16, seed=5) if c.name == "cumulative_split2_bias"]
    writer = DumpWriter(tmp_path / "dump", "tensor")
    write(writer, "NPU.npu_grouped_matmul.0", case, correct_outputs(case, torch.float16, seed=1))
    dump = writer.write()
    reference = bench_functions.get("npu_grouped_matmul")

    def leftover_memory(x, weight, **kwargs):
        [y] = reference(x, weight, **kwargs)
        y[CUMULATIVE[-1] :] = torch.randn(y.shape[0] - CUMULATIVE[-1], y.shape[1]).to(y.dtype)
        return [y]

    leftover_memory.written_rows = reference.func.written_rows
    registry = bench_functions.default_registry.copy()
    registry.register("npu_grouped_matmul", leftover_memory, replace=True)
    monkeypatch.setattr(bench_functions, "default_registry", registry)
    result = run_dump(dump, "--msprobe-device=cpu", "--msprobe-repeat=3")
    assert {call: o.outcome for call, o in result.calls.items()} == {"NPU.npu_grouped_matmul.0.forward": "passed"}
