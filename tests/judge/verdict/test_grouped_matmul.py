"""npu_grouped_matmul dumps in msprobe's record format (TensorList arguments, list
outputs), judged offline: outputs correctly rounded from a float64 truth computed here,
group by group, independently of bench_functions, pass in every mode; each planted
fault fails exactly its call; garbage and NaN past group_list's total change nothing,
and the report names those rows."""

from __future__ import annotations

import functools
import itertools
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from pytest_msprobe import bench_functions
from pytest_msprobe.bench_functions import Companions
from pytest_msprobe.testing.dumpwriter import DumpWriter

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
K, N, M = 96, 16, 40
CUMULATIVE = [6, 15, 15, 31]  # one empty group; 31 of the 40 rows written
COUNTS = [6, 9, 0, 16]
BIAS_DTYPE = {torch.float16: torch.float16, torch.bfloat16: torch.float32, torch.float32: torch.float32}


def rand(*shape: int, seed: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)


def spans(cumulative: list[int]) -> list[tuple[int, int]]:
    return list(zip([0, *cumulative[:-1]], cumulative, strict=True))


def truth_rows(
    x: torch.Tensor, ws: list[torch.Tensor], bias: list[torch.Tensor] | None, cumulative: list[int]
) -> torch.Tensor:
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
            {
                "bias": bias,
                "group_list": torch.tensor(CUMULATIVE),
                "split_item": 2,
                "group_type": 0,
                "group_list_type": 0,
            },
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
            {
                "group_list": torch.tensor(COUNTS),
                "split_item": 2,
                "group_type": 0,
                "group_list_type": 1,
                "output_dtype": dtype,
            },
            [cat_truth],
        ),
        Case(
            "k_grouped_weight_grad",
            [[xt], [grad_out]],
            {"group_list": torch.tensor(COUNTS), "split_item": 3, "group_type": 2, "group_list_type": 1},
            [k_split],
        ),
    ]


def quantised_cases(seed: int) -> list[tuple[Case, torch.dtype]]:
    """(call, its output dtype): int8 x and weight with an int32 bias, a per-channel scale
    packed as int64 (float32 bits in the low word) and a per-token scale, bfloat16 out
    (formula 3); int8 out with an offset, group_list [[weight index, count], ...] (formula
    2); the bare int32 product of a list of x; float16 x with int8 weights dequantised per
    channel and bfloat16 x per group of K rows (formula 4); an activation (act_type)."""
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
    pairs = [[2, 6], [0, 9], [3, 16]]  # weight index, rows: 31 of the 40 written
    offset = torch.randn(len(COUNTS), N, generator=g)
    int8_scale = torch.rand(len(COUNTS), N, generator=g) * 0.04 + 0.01
    int8_out = torch.full((M, N), float("nan"), dtype=torch.float64)
    for (start, end), (index, _) in zip(spans(list(itertools.accumulate(c for _, c in pairs))), pairs, strict=True):
        acc = x[start:end].double() @ w[index].double() + bias[index].double()
        int8_out[start:end] = acc * int8_scale[index].double() + offset[index].double()
    xs = [torch.randint(-16, 16, (rows, K), generator=g, dtype=torch.int8) for rows in (5, 7)]
    xb = rand(M, K, seed=seed + 2, dtype=torch.bfloat16)
    wb = torch.randint(-8, 8, (len(COUNTS), K, N), generator=g, dtype=torch.int8)
    g_scale = (torch.rand(len(COUNTS), 4, N, generator=g) * 0.02).bfloat16()  # 4 groups of 24 rows of K
    g_offset = torch.randn(len(COUNTS), 4, N, generator=g).bfloat16()
    b_bias = torch.randn(len(COUNTS), N, generator=g)
    per_group = torch.cat(
        [
            xb[s:t].double()
            @ (
                (wb[i].double() + g_offset[i].double().repeat_interleave(24, 0))
                * g_scale[i].double().repeat_interleave(24, 0)
            )
            + b_bias[i].double()
            for i, (s, t) in enumerate(spans(CUMULATIVE))
        ]
    )
    xg = rand(M, K, seed=seed + 3, dtype=torch.float16)
    wg = [rand(K, N, seed=seed + 4 + i, dtype=torch.float16) / K**0.5 for i in range(len(COUNTS))]
    products = torch.cat([xg[s:t].double() @ wi.double() for (s, t), wi in zip(spans(CUMULATIVE), wg, strict=True)])
    gelu_tanh = 0.5 * products * (1 + torch.tanh(math.sqrt(2 / math.pi) * (products + 0.044715 * products**3)))
    return [
        (
            Case(
                "int8_out_index_count",
                [[x], [w]],
                {
                    "bias": [bias],
                    "scale": [int8_scale.view(torch.int32).to(torch.int64) & 0xFFFFFFFF],
                    "offset": [offset],
                    "group_list": torch.tensor(pairs),
                    "split_item": 2,
                    "group_type": 0,
                    "group_list_type": 2,
                    "output_dtype": torch.int8,
                },
                [int8_out],
                [CUMULATIVE[-1]],
            ),
            torch.int8,
        ),
        (
            Case(
                "int32_out_multi_x",
                [xs, [w[0], w[1]]],
                {"split_item": 0, "group_type": -1, "output_dtype": torch.int32},
                [xs[0].double() @ w[0].double(), xs[1].double() @ w[1].double()],
            ),
            torch.int32,
        ),
        (
            Case(
                "antiquant_per_group_bfloat16",
                [[xb], [wb]],
                {
                    "bias": [b_bias],
                    "antiquant_scale": [g_scale],
                    "antiquant_offset": [g_offset],
                    "group_list": torch.tensor(CUMULATIVE),
                    "split_item": 3,
                    "group_type": 0,
                },
                [torch.cat([per_group, per_group.new_full((M - CUMULATIVE[-1], N), float("nan"))])],
                [CUMULATIVE[-1]],
            ),
            torch.bfloat16,
        ),
        (
            Case(
                "act_gelu_tanh",
                [[xg], wg],
                {"group_list": torch.tensor(CUMULATIVE), "split_item": 2, "group_type": 0, "act_type": 2},
                [torch.cat([gelu_tanh, gelu_tanh.new_full((M - CUMULATIVE[-1], N), float("nan"))])],
                [CUMULATIVE[-1]],
            ),
            torch.float16,
        ),
        (
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
            torch.bfloat16,
        ),
        (
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
            torch.float16,
        ),
    ]


def rounded(truth: torch.Tensor, dtype: torch.dtype, written: int | None, seed: int) -> torch.Tensor:
    """The truth correctly rounded (integers: half to even, saturated); rows past
    `written` are leftover memory: huge values, inf and NaN (integers: any)."""
    if dtype.is_floating_point:
        out = truth.to(dtype)
    else:
        info = torch.iinfo(dtype)
        out = truth.nan_to_num().round().clamp(info.min, info.max).to(dtype)
    if written is not None and written < out.shape[0]:
        garbage = rand(out.shape[0] - written, *out.shape[1:], seed=seed, dtype=torch.float64) * 6e4
        garbage[0, 0], garbage[-1, -1] = float("nan"), float("inf")
        out[written:] = garbage.to(dtype) if dtype.is_floating_point else garbage.nan_to_num().to(torch.int64).to(dtype)
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
    for case, dtype in quantised_cases(seed=500):
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


def test_every_mode_passes_offline_and_unwritten_rows_are_named(
    tmp_path: Path, run_dump, pytester: pytest.Pytester
) -> None:
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


def exact(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.double() @ b.double()


def float16_accumulated(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The products summed one term at a time in float16."""
    acc = torch.zeros(*a.shape[:-1], b.shape[-1], dtype=torch.float16)
    for k in range(a.shape[-1]):
        acc = acc + a[..., k : k + 1].half() * b[k].half()
    return acc.double()


def group_ends(group_list: torch.Tensor | list[int], group_list_type: int, length: int, fault: str) -> list[int]:
    """Where each group ends along the grouped axis; under that fault a cumulative
    group_list (a Python list, or a tensor with group_list_type 0) is read as counts,
    the groups cut at the axis' end."""
    values = group_list.tolist() if isinstance(group_list, torch.Tensor) else list(group_list)
    cumulative = not isinstance(group_list, torch.Tensor) or group_list_type == 0
    if cumulative and fault != "cumulative_read_as_counts":
        return values
    return [min(end, length) for end in itertools.accumulate(values)]


#: act_type -> the activation, written here from torch_npu's documented formulas
TEST_ACTIVATIONS: dict[int, Callable[[torch.Tensor], torch.Tensor]] = {
    0: lambda y: y,
    1: lambda y: y.clamp(min=0),
    2: lambda y: 0.5 * y * (1 + torch.tanh(math.sqrt(2 / math.pi) * (y + 0.044715 * y**3))),
    4: lambda y: y / (1 + torch.exp(-1.702 * y.abs())) * torch.exp(0.851 * (y - y.abs())),
    5: lambda y: y / (1 + torch.exp(-y)),
}


def unbound(values: list[torch.Tensor] | None, count: int) -> list[torch.Tensor | None]:
    """One tensor per weight: a list of them, or one tensor stacked over the weights."""
    if not values:
        return [None] * count
    return list(values[0].unbind(0)) if len(values) == 1 and count > 1 else list(values)


def low_word_float(scale: torch.Tensor) -> torch.Tensor:
    """An int64 quantisation scale carries float32 bits in its low word (torch_npu's packing)."""
    return (
        (scale & 0xFFFFFFFF).to(torch.int32).view(torch.float32).double()
        if scale.dtype == torch.int64
        else scale.double()
    )


def dequantised(w: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor | None) -> torch.Tensor:
    """Formula 4's (weight + antiquant_offset) * antiquant_scale, per channel or per group of K rows."""
    step = w.shape[0] // scale.shape[0] if scale.dim() == 2 else w.shape[0]
    rows = lambda t: t.double().repeat_interleave(step, 0) if t.dim() == 2 else t.double()
    return (w.double() + (rows(offset) if offset is not None else 0)) * rows(scale)


def to_output(y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if dtype.is_floating_point:
        return y.to(dtype)
    info = torch.iinfo(dtype)
    return y.nan_to_num().round().clamp(info.min, info.max).to(dtype)


def planted_kernel(
    fault: str,
    x: list[torch.Tensor],
    weight: list[torch.Tensor],
    *,
    bias: list[torch.Tensor] | None = None,
    scale: list[torch.Tensor] | None = None,
    offset: list[torch.Tensor] | None = None,
    antiquant_scale: list[torch.Tensor] | None = None,
    antiquant_offset: list[torch.Tensor] | None = None,
    per_token_scale: list[torch.Tensor] | None = None,
    group_list: torch.Tensor | list[int] | None = None,
    split_item: int = 0,
    group_type: int = -1,
    group_list_type: int = 0,
    act_type: int = 0,
    output_dtype: torch.dtype | None = None,
    **_: object,
) -> list[torch.Tensor]:
    """An npu_grouped_matmul kernel written here, independently of bench_functions, in
    every documented mode (formulas 1 to 4, act_type): float64 results rounded once to the
    output dtype (integers half to even, saturated), with `fault` planted (each group's
    rows times the next group's weight, a cumulative group_list read as counts, or
    floating products accumulated in float16; any other name: none). int8 products are
    exact: float16 accumulation is no fault of theirs (the kernel accumulates int32)."""
    ws = list(weight[0].unbind(0)) if len(weight) == 1 and weight[0].dim() == 3 else list(weight)
    product = float16_accumulated if fault == "float16_accumulation" else exact
    act = TEST_ACTIVATIONS[act_type]
    out_dtype = x[0].dtype if x[0].is_floating_point() else output_dtype or (torch.int8 if scale else torch.int32)
    if group_type == 2:  # k-axis: x [M, K] and weight [K, N] split along K
        assert group_list is not None
        (a,), (b,) = x, ws
        bounds = spans(group_ends(group_list, group_list_type, a.shape[1], fault))
        return [torch.stack([act(product(a[:, s:t], b[s:t])) for s, t in bounds]).to(out_dtype)]
    n = len(ws)
    biases, scales, offsets, a_scales, a_offsets = (
        unbound(v, n) for v in (bias, scale, offset, antiquant_scale, antiquant_offset)
    )
    single = len(x) == 1 and group_list is not None
    if single and group_list_type == 2:  # [[weight index, count], ...]
        assert isinstance(group_list, torch.Tensor)
        indices = group_list[:, 0].tolist()
        bounds = spans(group_ends(group_list[:, 1], 1, x[0].shape[0], fault))
    elif single:
        assert group_list is not None
        bounds = spans(group_ends(group_list, group_list_type, x[0].shape[0], fault))
        indices = list(range(len(bounds)))
    if single:
        parts = [x[0][s:t] for s, t in bounds]
        tokens = [per_token_scale[0][s:t] for s, t in bounds] if per_token_scale else [None] * len(bounds)
    else:
        parts, indices, tokens = list(x), list(range(len(x))), list(per_token_scale or [None] * len(x))
    shift = 1 if fault == "next_weight" else 0
    ys = []
    for part, i, token in zip(parts, indices, tokens, strict=True):
        j, b = (i + shift) % n, biases[i]
        if part.is_floating_point():
            w = ws[j] if ws[j].is_floating_point() else dequantised(ws[j], a_scales[j], a_offsets[j])  # type: ignore[arg-type]
            y = product(part, w) + (b.double() if b is not None else 0)
        else:
            integer_bias = b is not None and not b.is_floating_point()
            y = part.double() @ ws[j].double() + (b.double() if integer_bias else 0)
            if scales[j] is not None:
                y = y * low_word_float(scales[j]) * (token.double()[:, None] if token is not None else 1)
                y = (
                    y
                    + (b.double() if b is not None and not integer_bias else 0)
                    + (offsets[j].double() if offsets[j] is not None else 0)
                )
        ys.append(act(y))
    if split_item in (0, 1):
        return [to_output(y, out_dtype) for y in ys]
    y = torch.cat(ys)
    if single:  # rows past the groups: leftover memory
        y = torch.cat([y, y.new_full((x[0].shape[0] - y.shape[0], y.shape[1]), float("nan"))])
    return [to_output(y, out_dtype)]


#: fault -> the modes of cases() and quantised_cases() it changes: every mode with more
#: than one weight, every cumulative group_list (a Python list, or group_list_type 0),
#: every mode with floating products (int8 products are exact in int32: no float16 sum)
SEVERAL_WEIGHTS = {
    "multi_x_split0",
    "list_group_list_split1",
    "cumulative_split2_bias",
    "counts_split3_3d_weight",
    "multi_x_single_out",
}
QUANTISED = {
    "int8_out_index_count",
    "int32_out_multi_x",
    "antiquant_per_group_bfloat16",
    "act_gelu_tanh",
    "int8_per_token",
    "antiquant_int8_weight",
}
FLOATING_PRODUCTS = {"antiquant_per_group_bfloat16", "act_gelu_tanh", "antiquant_int8_weight"}
FAULTS = {
    "next_weight": SEVERAL_WEIGHTS | QUANTISED,
    "cumulative_read_as_counts": {
        "list_group_list_split1",
        "cumulative_split2_bias",
        "antiquant_per_group_bfloat16",
        "act_gelu_tanh",
        "int8_per_token",
    },
    "float16_accumulation": SEVERAL_WEIGHTS | {"k_grouped_weight_grad"} | FLOATING_PRODUCTS,
}
FAULT_DTYPES = (torch.float16, torch.bfloat16)


def test_the_planted_kernel_is_the_truth_but_for_its_fault() -> None:
    """Without a fault the planted kernel gives the float64 truth of every mode; each
    fault changes exactly the modes FAULTS names."""
    for case in [*cases(torch.float32, seed=3), *(case for case, _ in quantised_cases(seed=4))]:
        clean = planted_kernel("none", *case.args, **case.kwargs)
        for out, truth, rows in zip(clean, case.truth, case.written or [None] * len(clean), strict=True):
            assert torch.equal(out[:rows], to_output(truth[:rows], out.dtype)), case.name
        for fault, modes in FAULTS.items():
            faulty = planted_kernel(fault, *case.args, **case.kwargs)
            same = all(
                f.shape == c.shape and torch.equal(f.nan_to_num(), c.nan_to_num())
                for f, c in zip(faulty, clean, strict=True)
            )
            assert same == (case.name not in modes), (fault, case.name)


def nan_inside(case: Case) -> torch.Tensor:
    out = case.truth[0].clone()
    out[CUMULATIVE[-1] - 1, 3] = float("nan")
    return out


@pytest.mark.parametrize("dtype", FAULT_DTYPES)
def test_each_planted_fault_fails_its_calls_and_only_them(dtype: torch.dtype, tmp_path: Path, run_dump) -> None:
    """Tensor task, offline: every mode's correct call passes; each fault's outputs
    (garbage past the total, as a kernel leaves it) fail exactly the modes it changes;
    a NaN inside the written rows fails."""
    writer = DumpWriter(tmp_path / "dump", "tensor")
    expected: dict[str, str] = {}
    number = itertools.count()

    def add(case: Case, outputs: list[torch.Tensor], outcome: str) -> None:
        call = f"NPU.npu_grouped_matmul.{next(number)}"
        write(writer, call, case, outputs)
        expected[f"{call}.forward"] = outcome

    for case in cases(dtype, seed=7):
        written = case.written or [None] * len(case.truth)
        add(case, correct_outputs(case, dtype, seed=1), "passed")
        for fault in (fault for fault, modes in FAULTS.items() if case.name in modes):
            faulty = planted_kernel(fault, *case.args, **case.kwargs)
            add(
                case,
                [rounded(y.double(), dtype, rows, seed=2) for y, rows in zip(faulty, written, strict=True)],
                "failed",
            )
        if case.name == "cumulative_split2_bias":
            add(case, [rounded(nan_inside(case), dtype, CUMULATIVE[-1], seed=3)], "failed")
    result = run_dump(writer.write(), "--msprobe-offline")
    assert {call: o.outcome for call, o in result.calls.items()} == expected


def test_each_planted_fault_fails_the_quantised_modes(tmp_path: Path, run_dump) -> None:
    """Tensor task, offline, the quantised modes (int8 x and weight with scale, offset,
    per_token_scale; int32, int8 and bfloat16 outputs; antiquant_scale/offset) and the
    activation: each correct call passes, each fault that applies to a mode fails it.
    float16 accumulation is planted only where the products are floating (antiquant,
    float16 x): an int8 product accumulates in int32, exactly, so it has no such fault."""
    writer = DumpWriter(tmp_path / "dump", "tensor")
    expected: dict[str, str] = {}
    for number, (case, dtype) in enumerate(quantised_cases(seed=11)):
        faults = [fault for fault, modes in FAULTS.items() if case.name in modes]
        written = case.written or [None] * len(case.truth)
        for variant, fault in enumerate(["none", *faults]):
            outputs = (
                correct_outputs(case, dtype, seed=1)
                if fault == "none"
                else planted_kernel(fault, *case.args, **case.kwargs)
            )
            call = f"NPU.npu_grouped_matmul.{10 * number + variant}"
            write(
                writer,
                call,
                case,
                [rounded(y.double(), dtype, rows, seed=2) for y, rows in zip(outputs, written, strict=True)],
            )
            expected[f"{call}.forward"] = "passed" if fault == "none" else "failed"
    result = run_dump(writer.write(), "--msprobe-offline")
    assert {call: o.outcome for call, o in result.calls.items()} == expected


def in_dump_dtypes(x: list[torch.Tensor], kwargs: dict[str, object]) -> bool:
    """The device-side run: floating x in the dump's float16/bfloat16, or int8 x with no
    float64 argument (the bench raises a float32 scale or offset to float64)."""
    if x[0].is_floating_point():
        return x[0].dtype in FAULT_DTYPES
    values = [v for value in kwargs.values() for v in (value if isinstance(value, list) else [value])]
    return not any(isinstance(v, torch.Tensor) and v.dtype == torch.float64 for v in values)


def test_act_type_in_every_mode_the_reference_accepts(tmp_path: Path, run_dump, pytester: pytest.Pytester) -> None:
    """act_type (torch_npu 7.0.0 / op-plugin 7.3.0 docs: 1 RELU, 2 GELU_TANH, 4 FAST_GELU,
    5 SILU, applied to each group's result) in every mode, each documented activation in
    turn, truth from the test's own kernel: the activated outputs pass, the same outputs
    without the activation fail; on the bare int32 product (int8 x, no scale), where no
    documented formula says how an int32 accumulator is activated, the call skips and
    says why."""
    writer = DumpWriter(tmp_path / "dump", "tensor")
    expected: dict[str, str] = {}
    modes = [(case, torch.float16) for case in cases(torch.float16, seed=21)] + quantised_cases(seed=22)
    for number, ((case, dtype), act_type) in enumerate(zip(modes, itertools.cycle([1, 2, 4, 5]))):
        kwargs = {**case.kwargs, "act_type": case.kwargs.get("act_type") or act_type}
        activated = Case(case.name, case.args, kwargs, case.truth, case.written)
        written = case.written or [None] * len(case.truth)
        if case.name == "int32_out_multi_x":
            write(writer, f"NPU.npu_grouped_matmul.{10 * number}", activated, correct_outputs(case, dtype, seed=1))
            expected[f"NPU.npu_grouped_matmul.{10 * number}.forward"] = "skipped"
            continue
        bare = {key: value for key, value in kwargs.items() if key != "act_type"}
        for variant, outputs in enumerate(
            [planted_kernel("none", *case.args, **kwargs), planted_kernel("none", *case.args, **bare)]
        ):
            call = f"NPU.npu_grouped_matmul.{10 * number + variant}"
            write(
                writer,
                call,
                activated,
                [rounded(y.double(), dtype, rows, seed=2) for y, rows in zip(outputs, written, strict=True)],
            )
            expected[f"{call}.forward"] = ("passed", "failed")[variant]
    result = run_dump(writer.write(), "--msprobe-offline")
    assert {call: o.outcome for call, o in result.calls.items()} == expected
    skipped = [call for call, outcome in expected.items() if outcome == "skipped"]
    assert all("on the bare int32 product" in messages(pytester)[call] for call in skipped)


def on_the_device(kernel: Callable[..., list[torch.Tensor]]) -> Callable[..., list[torch.Tensor]]:
    """`kernel` where x comes in a dump's dtype (the device-side run), the reference
    elsewhere (the bench, raised to float32); registered with the reference's row and
    generation rules (its companions)."""
    reference = bench_functions.get("npu_grouped_matmul")
    assert reference is not None

    def run(x: list[torch.Tensor], weight: list[torch.Tensor], **kwargs: object) -> list[torch.Tensor]:
        return kernel(x, weight, **kwargs) if in_dump_dtypes(x, kwargs) else reference(x, weight, **kwargs)

    return run


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_statistics_dump_with_a_planted_kernel_fails_exactly_its_modes(
    fault: str, tmp_path: Path, run_dump, monkeypatch
) -> None:
    """Statistics task, replayed on the CPU with the planted kernel as the device (the
    reference stays the bench), every floating mode in float16 and bfloat16 and every
    quantised mode but the bare int32 product (its call has no floating argument, so
    the bench runs in the device's dtypes and this replay cannot tell the two apart;
    the offline test shows its fault): exactly the modes the fault changes fail, the
    others pass with no warning."""
    writer = DumpWriter(tmp_path / "dump", "statistics")
    modes: dict[str, str] = {}
    number = itertools.count()
    floating = [(case, dtype) for d, dtype in enumerate(FAULT_DTYPES) for case in cases(dtype, seed=100 * d)]
    quantised = [(case, dtype) for case, dtype in quantised_cases(seed=500) if case.name != "int32_out_multi_x"]
    for case, dtype in floating + quantised:
        call = f"NPU.npu_grouped_matmul.{next(number)}"
        write(writer, call, case, correct_outputs(case, dtype, seed=1))
        modes[f"{call}.forward"] = case.name
    registry = bench_functions.default_registry.copy()
    planted, rules = (
        on_the_device(functools.partial(planted_kernel, fault)),
        bench_functions.BUILTIN_COMPANIONS["npu_grouped_matmul"],
    )
    registry.register("npu_grouped_matmul", planted, replace=True, companions=rules)
    monkeypatch.setattr(bench_functions, "default_registry", registry)
    result = run_dump(writer.write(), "--msprobe-device=cpu")
    expected = {call: "failed" if mode in FAULTS[fault] else "passed" for call, mode in modes.items()}
    assert {call: o.outcome for call, o in result.calls.items()} == expected
    assert not any(o.warnings for o in result.calls.values() if o.outcome == "passed")


def backward_truth(
    x: torch.Tensor, ws: list[torch.Tensor], grad: torch.Tensor, group_of_rows: list[tuple[int, int]]
) -> list[torch.Tensor]:
    """grad_x rows of group i = grad_i @ w_i^T (NaN past the total); grad_w_i = x_i^T @ grad_i."""
    grad_x = torch.full(x.shape, float("nan"), dtype=torch.float64)
    grad_ws = []
    for (start, end), w in zip(group_of_rows, ws, strict=True):
        grad_x[start:end] = grad[start:end].double() @ w.double().t()
        grad_ws.append(x[start:end].double().t() @ grad[start:end].double())
    return [grad_x, *grad_ws]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_backward_input_and_per_group_weight_gradients(
    dtype: torch.dtype, tmp_path: Path, run_dump, pytester: pytest.Pytester
) -> None:
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
        writer.backward(
            call, [grad], [rounded(grads[0], dtype, CUMULATIVE[-1], seed=2), *[g.to(dtype) for g in grads[1:]]]
        )
    result = run_dump(writer.write(), "--msprobe-offline")
    outcomes = {call: outcome.outcome for call, outcome in result.calls.items()}
    assert outcomes == {
        "NPU.npu_grouped_matmul.0.forward": "passed",
        "NPU.npu_grouped_matmul.0.backward": "passed",
        "NPU.npu_grouped_matmul.1.forward": "passed",
        "NPU.npu_grouped_matmul.1.backward": "failed",
    }
    assert (
        "past group_list's total: not written by the kernel" in messages(pytester)["NPU.npu_grouped_matmul.0.backward"]
    )


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

    registry = bench_functions.default_registry.copy()
    registry.register(
        "npu_grouped_matmul",
        leftover_memory,
        replace=True,
        companions=Companions(written_rows=reference.companions.written_rows),
    )
    monkeypatch.setattr(bench_functions, "default_registry", registry)
    result = run_dump(dump, "--msprobe-device=cpu", "--msprobe-repeat=3")
    assert {call: o.outcome for call, o in result.calls.items()} == {"NPU.npu_grouped_matmul.0.forward": "passed"}
