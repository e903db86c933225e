"""The MoE references against the documented formulas, evaluated here element by element
in float64: routing (init, expert tokens, finalize, grouped top-k gating), the quantised
forms of npu_grouped_matmul and npu_dequant_swiglu_quant, and the rows each says it writes."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from pytest_msprobe.bench_functions import get

G = torch.Generator().manual_seed(0)


def rand(*shape: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return torch.randn(*shape, generator=G, dtype=torch.float64).to(dtype)


def test_init_routing_follows_the_documented_example() -> None:
    x = torch.tensor([[0.1] * 4, [0.2] * 4, [0.3] * 4])
    row_idx = torch.tensor([[0, 3], [1, 4], [2, 5]], dtype=torch.int32)
    expert_idx = torch.tensor([[1, 2], [0, 1], [0, 2]], dtype=torch.int32)
    expanded_x, expanded_row_idx, expanded_expert_idx = get("npu_moe_init_routing")(x, row_idx, expert_idx, 3)
    # keyValueSort by expert, stable over (token, slot): sorted row_idx = [1, 2, 0, 4, 3, 5]
    assert expanded_expert_idx.tolist() == [0, 0, 1, 1, 2, 2]
    assert expanded_row_idx.tolist() == [2, 0, 1, 4, 3, 5]  # expanded_row_idx[sorted[i]] = i
    assert torch.equal(expanded_x, x[[1, 2, 0, 1, 0, 2]])  # x[sorted[i] % rows]
    assert expanded_row_idx.dtype == expanded_expert_idx.dtype == torch.int32
    assert get("npu_moe_init_routing")(x, row_idx, expert_idx, 1)[0].shape == (2, 4)  # min(rows, active_num) * k


def test_compute_expert_tokens_is_the_cumulative_count_per_expert() -> None:
    sorted_experts = torch.tensor([3, 3, 4, 5, 6, 7], dtype=torch.int32)
    tokens = get("npu_moe_compute_expert_tokens")(sorted_experts, 5)
    assert tokens.tolist() == [sum(int(e) <= expert for e in sorted_experts) for expert in range(5)] == [0, 0, 0, 2, 3]
    assert tokens.dtype == torch.int32


@pytest.mark.parametrize("drop_pad_mode", [0, 2])
def test_finalize_routing_sums_the_scaled_rows(drop_pad_mode: int) -> None:
    rows, k, h, e = 5, 3, 4, 6
    permuted, skip1, skip2, bias, scales = rand(rows * k, h), rand(rows, h), rand(rows, h), rand(e, h), rand(rows, k)
    src_to_dst = torch.randperm(rows * k, generator=G).to(torch.int32)
    experts = torch.randint(0, e, (rows, k), generator=G, dtype=torch.int32)
    out = get("npu_moe_finalize_routing")(permuted, skip1, skip2, bias, scales, src_to_dst, experts, drop_pad_mode)
    expected = torch.zeros(rows, h, dtype=torch.float64)
    for i, j in itertools.product(range(rows), range(h)):
        total = float(skip1[i, j] + skip2[i, j])
        for slot in range(k):
            dst = int(src_to_dst[i + slot * rows] if drop_pad_mode == 0 else src_to_dst[i * k + slot])
            total += float(scales[i, slot]) * (float(permuted[dst, j]) + float(bias[experts[i, slot], j]))
        expected[i, j] = total
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    half = get("npu_moe_finalize_routing")(
        permuted.half(), None, None, None, scales.half(), src_to_dst, experts, drop_pad_mode
    )
    assert half.dtype == torch.float16


def test_finalize_routing_drop_pad_skips_dropped_pairs() -> None:
    permuted, scales = rand(2, 3, 4), rand(2, 2)  # (E, C, H)
    src_to_dst = torch.tensor([4, -1, 0, 2], dtype=torch.int32)  # column-major: (row 0, slot 0), (row 1, slot 0), ...
    out = get("npu_moe_finalize_routing")(permuted, None, None, None, scales, src_to_dst, None, 1)
    flat = permuted.reshape(6, 4)
    expected = torch.stack([scales[0, 0] * flat[4] + scales[0, 1] * flat[0], scales[1, 1] * flat[2]])
    torch.testing.assert_close(out, expected)


def gating_truth(
    x: torch.Tensor,
    k: int,
    bias: torch.Tensor,
    k_group: int,
    group_count: int,
    mode: int,
    norm_type: int,
    factor: float,
    eps: float,
):
    """The docs' equivalent computation, one row at a time in float64."""
    ys, idx = [], []
    per_group = x.shape[1] // group_count
    for row in x.double():
        norm = (
            [math.exp(v) / sum(math.exp(u) for u in row.tolist()) for v in row.tolist()]
            if norm_type == 0
            else [1 / (1 + math.exp(-v)) for v in row.tolist()]
        )
        score = [n + float(b) for n, b in zip(norm, bias, strict=True)]
        groups = [score[g * per_group : (g + 1) * per_group] for g in range(group_count)]
        group_score = [max(g) if mode == 0 else sum(sorted(g)[-2:]) for g in groups]
        kept = sorted(range(group_count), key=lambda g: -group_score[g])[:k_group]
        masked = [s if i // per_group in kept else -math.inf for i, s in enumerate(score)]
        chosen = sorted(range(len(masked)), key=lambda i: -masked[i])[:k]
        y = [norm[i] for i in chosen]
        if norm_type == 1:
            y = [v / (sum(y) + eps) for v in y]
        ys.append([v * factor for v in y])
        idx.append(chosen)
    return torch.tensor(ys, dtype=torch.float64), torch.tensor(idx)


@pytest.mark.parametrize("norm_type,mode", [(0, 0), (1, 1), (1, 0)])
def test_gating_top_k_picks_groups_then_experts(norm_type: int, mode: int) -> None:
    x, bias = rand(6, 16), rand(16) * 0.1
    y, idx, norm = get("npu_moe_gating_top_k")(
        x,
        3,
        bias=bias,
        k_group=2,
        group_count=4,
        group_select_mode=mode,
        norm_type=norm_type,
        out_flag=True,
        routed_scaling_factor=2.5,
    )
    y_truth, idx_truth = gating_truth(x, 3, bias, 2, 4, mode, norm_type, 2.5, 1e-20)
    assert torch.equal(idx.long(), idx_truth) and idx.dtype == torch.int32
    torch.testing.assert_close(y, y_truth, rtol=1e-12, atol=1e-12)
    assert norm.shape == x.shape
    bf16 = get("npu_moe_gating_top_k")(
        x.bfloat16(), 3, bias=bias.bfloat16(), k_group=2, group_count=4, norm_type=norm_type
    )
    assert bf16[0].dtype == torch.bfloat16 and bf16[2].dtype == torch.float32


def test_gating_top_k_norm_out_is_unwritten_without_out_flag() -> None:
    reference = get("npu_moe_gating_top_k")
    assert reference.companions.written_rows(rand(4, 8), 2) == ({2: 0}, {}, "(out_flag=False)")
    assert reference.companions.written_rows(rand(4, 8), 2, out_flag=True)[0] == {}


def test_grouped_matmul_quantised_int8_with_packed_scale_and_per_token_scale() -> None:
    """Formula 3 with an int32 bias: (x @ w + bias) * scale * per_token_scale; the int64
    scale carries float32 bits in its low word."""
    m, k, n = 7, 16, 5
    x = torch.randint(-8, 8, (m, k), generator=G, dtype=torch.int8)
    w = torch.randint(-8, 8, (2, k, n), generator=G, dtype=torch.int8)
    bias = torch.randint(-50, 50, (2, n), generator=G, dtype=torch.int32)
    scale = torch.rand(2, n, generator=G, dtype=torch.float32) * 0.01
    packed = scale.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    per_token = torch.rand(m, generator=G, dtype=torch.float32)
    [y] = get("npu_grouped_matmul")(
        [x],
        [w],
        bias=[bias],
        scale=[packed],
        per_token_scale=[per_token],
        group_list=torch.tensor([3, 7]),
        split_item=3,
        group_type=0,
        output_dtype=torch.bfloat16,
    )
    truth = torch.empty(m, n, dtype=torch.float64)
    for g, (start, end) in enumerate([(0, 3), (3, 7)]):
        for i, j in itertools.product(range(start, end), range(n)):
            acc = sum(int(x[i, t]) * int(w[g, t, j]) for t in range(k)) + int(bias[g, j])
            truth[i, j] = acc * float(scale[g, j]) * float(per_token[i])
    assert y.dtype == torch.bfloat16 and torch.equal(y, truth.to(torch.bfloat16))


def test_grouped_matmul_antiquant_per_channel_and_int32_output() -> None:
    """Formula 4: x @ ((w + antiquant_offset) * antiquant_scale) + bias; int8 x without
    scale gives the int32 product."""
    x, w = rand(6, 8, dtype=torch.float16), torch.randint(-8, 8, (8, 3), generator=G, dtype=torch.int8)
    a_scale, a_offset, bias = (
        rand(3, dtype=torch.float16).abs(),
        rand(3, dtype=torch.float16),
        rand(3, dtype=torch.float16),
    )
    [y] = get("npu_grouped_matmul")(
        [x], [w], bias=[bias], antiquant_scale=[a_scale], antiquant_offset=[a_offset], split_item=0
    )
    truth = x.double() @ ((w.double() + a_offset.double()) * a_scale.double()) + bias.double()
    assert y.dtype == torch.float16 and torch.equal(y, truth.to(torch.float16))
    xi = torch.randint(-8, 8, (4, 8), generator=G, dtype=torch.int8)
    [yi] = get("npu_grouped_matmul")([xi], [w], output_dtype=torch.int32, split_item=0)
    assert yi.dtype == torch.int32 and torch.equal(yi, (xi.long() @ w.long()).int())


def test_grouped_matmul_rejects_what_it_cannot_replay() -> None:
    gmm = get("npu_grouped_matmul")
    x, w = rand(6, 4), rand(2, 4, 3)
    with pytest.raises(ValueError, match="not non-negative and non-decreasing"):
        gmm([x], [w], group_list=torch.tensor([4, 2]), split_item=2, group_type=0)
    with pytest.raises(ValueError, match="covers 9 rows"):
        gmm([x], [w], group_list=torch.tensor([4, 5]), split_item=2, group_type=0, group_list_type=1)
    with pytest.raises(ValueError, match="n-axis"):
        gmm([x], [w], group_list=torch.tensor([4, 6]), split_item=2, group_type=1)
    pairs = torch.tensor([[1, 2], [0, 4]])  # group_list_type 2: [weight index, count]
    [y] = gmm([x], [w], group_list=pairs, split_item=2, group_type=0, group_list_type=2)
    torch.testing.assert_close(y, torch.cat([x[:2] @ w[1], x[2:6] @ w[0]]))
    with pytest.raises(ValueError, match=r"names weights \[0, 2\] where the call has 2"):
        gmm([x], [w], group_list=torch.tensor([[2, 2], [0, 4]]), split_item=2, group_type=0, group_list_type=2)


def test_dequant_swiglu_quant_dynamic_per_group() -> None:
    tokens, h = 7, 4
    x = torch.randint(-100, 100, (tokens, 2 * h), generator=G, dtype=torch.int32)
    weight_scale, activation_scale = torch.rand(2, 2 * h, generator=G) * 0.05, torch.rand(tokens, generator=G)
    quant_scale = torch.rand(2, h, generator=G) + 0.5
    group_index = torch.tensor([2, 3])  # 5 of 7 tokens: rows 5-6 not written
    out, scale = get("npu_dequant_swiglu_quant")(
        x,
        weight_scale=weight_scale,
        activation_scale=activation_scale,
        quant_scale=quant_scale,
        group_index=group_index,
        quant_mode=1,
    )
    for i in range(5):
        g = 0 if i < 2 else 1
        deq = [float(x[i, j]) * float(weight_scale[g, j]) * float(activation_scale[i]) for j in range(2 * h)]
        act = [
            deq[h + j] / (1 + math.exp(-deq[h + j])) * deq[j] * float(quant_scale[g, j]) for j in range(h)
        ]  # right half activated
        row_scale = max(abs(v) for v in act) / 127
        assert float(scale[i]) == pytest.approx(row_scale, rel=1e-5)
        assert [int(v) for v in out[i]] == [round(v / row_scale) for v in act]
    assert out.dtype == torch.int8 and out.shape == (tokens, h)
    written = get("npu_dequant_swiglu_quant").companions.written_rows(x, group_index=group_index)
    assert written == ({0: 5, 1: 5}, {}, "past group_index's sum")


def test_generated_group_lists_are_made_readable_in_place() -> None:
    """What a statistics dump's replay does to a group_list generated at random."""
    fit = get("npu_grouped_matmul").companions.fit_generated
    x, w = [rand(10, 4)], [rand(3, 4, 2)]
    cumulative = torch.tensor([7, 2, 9])
    assert fit(x, w, group_list=cumulative, group_type=0) == (cumulative, "sorted into a cumulative group_list")
    assert cumulative.tolist() == [2, 7, 9]
    counts = torch.tensor([8, -1, 12])
    assert fit(x, w, group_list=counts, group_list_type=1)[0] is counts
    assert counts.tolist() == [4, 0, 6] and int(counts.sum()) <= 10
    multi = torch.tensor([1, 1])
    assert fit([rand(3, 4), rand(5, 4)], [rand(4, 2)] * 2, group_list=multi, group_list_type=0)[0] is multi
    assert multi.tolist() == [3, 8]
    pairs = torch.tensor([[7, 6], [-2, 9]])  # group_list_type 2: [weight index, count]
    assert fit(x, w, group_list=pairs, group_list_type=2)[0] is pairs
    assert pairs.tolist() == [[2, 4], [0, 6]]
    valid = torch.tensor([2, 5, 9])
    assert fit(x, w, group_list=valid) == (None, "") and valid.tolist() == [2, 5, 9]
    index = torch.tensor([9, 9])
    assert get("npu_dequant_swiglu_quant").companions.fit_generated(rand(10, 4), group_index=index)[0] is index
    assert index.tolist() == [5, 5]
    row_idx = torch.tensor([[5, 5], [0, 1], [2, 2]], dtype=torch.int32)
    assert get("npu_moe_init_routing").companions.fit_generated(rand(3, 4), row_idx, row_idx.clone(), 3)[0] is row_idx
    assert row_idx.tolist() == [[0, 3], [1, 4], [2, 5]]  # the gating's row_idx


V2_EXPERTS = torch.tensor([[1, 3], [0, 2], [2, 1], [1, 1]], dtype=torch.int32)  # pairs 0-7, token = pair // 2


def test_init_routing_v2_dropless_active_range() -> None:
    """Experts 1 and 2 active: pairs 0, 5, 6, 7 (expert 1) then 3, 4 (expert 2) in order;
    pair 1 (expert 3) and pair 2 (expert 0) are not available."""
    x, scale = rand(4, 3), rand(4)
    v2 = get("npu_moe_init_routing_v2")
    kwargs = {
        "scale": scale,
        "expert_num": 4,
        "active_expert_range": [1, 3],
        "expert_tokens_num_flag": True,
        "quant_mode": -1,
    }
    expanded_x, row_idx, counts, expanded_scale = v2(x, V2_EXPERTS, expert_tokens_num_type=1, **kwargs)
    tokens = [0, 2, 3, 3, 1, 2]
    assert torch.equal(expanded_x[:6], x[tokens]) and expanded_x.shape == (8, 3)
    assert row_idx.tolist() == [0, -1, -1, 4, 5, 1, 2, 3] and row_idx.dtype == torch.int32
    assert counts.tolist() == [4, 2] and counts.dtype == torch.int64
    assert torch.equal(expanded_scale[:6], scale[tokens])
    assert v2(x, V2_EXPERTS, expert_tokens_num_type=0, **kwargs)[2].tolist() == [4, 6]
    assert v2(x, V2_EXPERTS, expert_tokens_num_type=2, **kwargs)[2][:2].tolist() == [[1, 4], [2, 2]]
    assert v2(x, V2_EXPERTS, expert_tokens_num_type=1, row_idx_type=1, **kwargs)[1][:6].tolist() == [0, 5, 6, 7, 3, 4]
    written = v2.companions.written_rows(x, V2_EXPERTS, expert_tokens_num_type=2, row_idx_type=1, **kwargs)
    assert written[0] == {0: 6, 3: 6, 1: 6, 2: 2}


def test_init_routing_v2_dynamic_quant_with_smooth_scale() -> None:
    x, smooth = rand(4, 3), rand(2, 3).abs() + 0.5  # one smooth row per active expert (1, 2)
    out, _, _, scales = get("npu_moe_init_routing_v2")(
        x, V2_EXPERTS, scale=smooth, expert_num=4, active_expert_range=[1, 3], quant_mode=1
    )
    for i, (token, expert) in enumerate(zip([0, 2, 3, 3, 1, 2], [1, 1, 1, 1, 2, 2], strict=True)):
        values = [float(x[token, j]) * float(smooth[expert - 1, j]) for j in range(3)]
        step = max(abs(v) for v in values) / 127
        assert float(scales[i]) == pytest.approx(step, rel=1e-12)
        assert out[i].tolist() == [round(v / step) for v in values]
    assert out.dtype == torch.int8


def test_init_routing_v2_drop_pad_capacity() -> None:
    """Capacity 2: expert 1 keeps pairs 0 and 5 (6 and 7 are dropped); slot e * 2 + j."""
    x = rand(4, 3)
    out, row_idx, counts, _ = get("npu_moe_init_routing_v2")(
        x,
        V2_EXPERTS,
        expert_num=4,
        expert_capacity=2,
        drop_pad_mode=1,
        expert_tokens_num_flag=True,
        expert_tokens_num_type=1,
        quant_mode=-1,
    )
    slots = {0: 1, 2: 0, 3: 2, 4: 1, 5: 2, 6: 0}  # slot -> token (pair // 2)
    expected = torch.zeros(8, 3, dtype=torch.float64)
    for slot, token in slots.items():
        expected[slot] = x[token]
    assert out.shape == (4, 2, 3) and torch.equal(out.reshape(8, 3), expected)
    assert row_idx.tolist() == [2, 6, 0, 4, 5, 3, -1, -1]
    assert counts.tolist() == [1, 4, 2, 1]
