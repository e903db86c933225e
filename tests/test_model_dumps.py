"""Calibration on real models: msprobe dumps of one training step (forward AND backward)
of a 12-block transformer (float32, bfloat16, float16, and a bfloat16 statistics dump), a
convnet with batch norm, a GRU, an LSTM, and a large-vocabulary embedding with masked
attention (tests/dumps/models/make_dumps.py made them; its fault table cites the real
defects the faults model).

- The CPU is a correct device: every call passes with no warning, single-run and
  offline (the dumped outputs judged against the CPU reference in the dump's dtype).
- A planted fault (tests/model_faults.py) fails the faulty API's calls and nothing else:
  single-run, patched into the device run; offline, in a dump whose outputs the faulty
  kernel wrote while msprobe dumped (the maker checked the fault is in the dumped outputs).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from model_faults import FAULTS

MODELS = Path(__file__).parent / "dumps" / "models"
TENSOR_DUMPS = [
    "transformer12_tensor_fp32",
    "transformer12_tensor_bf16",
    "transformer12_tensor_fp16",
    "convbn_tensor_fp32",
    "gru_tensor_fp32",
    "lstm_tensor_fp32",
    "embedattn_tensor_fp32",
    "embedattn_tensor_bf16",
]
STATISTICS_DUMPS = ["transformer12_statistics_bf16"]
MODES = {"single-run": (), "offline": ("--msprobe-offline",)}
RUNS = [(name, "single-run") for name in TENSOR_DUMPS + STATISTICS_DUMPS] + [(name, "offline") for name in TENSOR_DUMPS]


def _calls(dump: Path) -> list[str]:
    return [name for name in json.loads(dump.read_text())["data"] if not name.startswith(("Module.", "Cell."))]


@pytest.mark.parametrize(("name", "mode"), RUNS, ids=[f"{name}-{mode}" for name, mode in RUNS])
def test_correct_cpu_passes_every_call_of_a_real_model(name, mode, copy_dump, run_dump):
    dump = copy_dump(f"models/{name}")
    result = run_dump(dump, "--msprobe-device=cpu", *MODES[mode])
    assert result.collection_errors == []
    assert sorted(result.calls) == sorted(_calls(dump))
    assert {call: outcome.text for call, outcome in result.calls.items() if outcome.outcome == "failed"} == {}
    assert {call: outcome.warnings for call, outcome in result.calls.items() if outcome.warnings} == {}
    assert {kernel: outcome.text for kernel, outcome in result.kernels.items() if outcome.outcome != "passed"} == {}
    judged = [call for call, outcome in result.calls.items() if outcome.outcome == "passed"]
    assert any(call.endswith(".backward") for call in judged) and any(call.endswith(".forward") for call in judged)
    if mode == "offline":  # the GEMM backwards msprobe records at the reshape: judged through the data flow
        gemm = ("Functional.linear.", "Torch.matmul.", "Tensor.__matmul__.")
        skipped = [call for call in result.by_outcome("skipped") if call.startswith(gemm) and call.endswith(".backward")]
        assert skipped == []


def _faulty_calls(fault, calls: list[str], judged: set[str]) -> set[str]:
    """The calls the fault makes wrong: the API's, in the directions it affects."""
    directions = tuple(fault.direction.split("+"))
    if fault.name == "softmax_low_precision_sum":
        directions = ("forward", "backward")  # its backward reads the stored (wrong) output
    return {call for call in calls if call.startswith(fault.call_prefix) and call.endswith(directions) and call in judged}


# Below the floor of what separates a correct kernel from these faults on these dumps'
# 8-element softmax rows (measured, make_dumps.py), in both modes:
# - the half-accumulator backward's errors reach 8-17 float16 ULPs where the correct
#   kernel's reach 3.3, on elements the single-run rule judges at the output's RMS scale
#   (limit 8 ULP); offline its ratios are 1.11-1.15x (limit 2x);
# - the low-precision sum moves the forward by up to 2.3 bfloat16 ULPs (mean 0.49 against
#   the correct kernel's 0.25): single-run limits are 8 / 1 ULP at the RMS scale, and
#   offline its mean_rel_err ratio was 2.14x against 2x before the reference noise floor
#   (standards/benchmark.py), which the offline checks of correct layer_norm gradients
#   need (ratios up to 3.7x between two correct summation orders).
BELOW_FLOOR = {"softmax_low_precision_sum", "softmax_backward_half_accumulator"}
FAULT_RUNS = [
    pytest.param(name, mode, marks=pytest.mark.xfail(strict=True, reason="below the measured floor: see BELOW_FLOOR"))
    if name in BELOW_FLOOR
    else (name, mode)
    for name in sorted(FAULTS)
    for mode in MODES
]


@pytest.mark.parametrize(("fault_name", "mode"), FAULT_RUNS)
def test_planted_fault_fails_exactly_the_faulty_calls(fault_name, mode, copy_dump, run_dump, monkeypatch):
    fault = FAULTS[fault_name]
    dump = copy_dump(f"models/faults/{fault_name}")
    if mode == "single-run":
        fault.patch(monkeypatch)
    result = run_dump(dump, "--msprobe-device=cpu", *MODES[mode])
    failed = set(result.by_outcome("failed"))
    judged = failed | set(result.by_outcome("passed"))
    expected = _faulty_calls(fault, _calls(dump), judged)
    assert expected, f"no judged call of {fault.call_prefix} in the fault's direction"
    assert failed - {call for call in failed if call.startswith(fault.call_prefix)} == set(), "a clean API failed"
    assert {
        kernel for kernel, outcome in result.kernels.items() if outcome.outcome == "failed" and not kernel.startswith(fault.call_prefix)
    } == set()
    assert expected <= failed, f"missed: {sorted(expected - failed)}"


@pytest.mark.parametrize("name", ["gru_tensor_fp32", "lstm_tensor_fp32"])
def test_a_recurrent_layers_backward_is_judged_though_msprobe_dropped_h_n(name, copy_dump, run_dump):
    """msprobe records one incoming gradient for torch.gru's two outputs (the output
    sequence's; h_n got none): paired by shape, the backward is judged, not skipped."""
    call = f"Torch.{name.split('_')[0]}.0.backward"
    result = run_dump(copy_dump(f"models/{name}"), "--msprobe-device=cpu", "-k", call)
    assert result.calls[call].outcome == "passed", result.calls[call].text


def test_gradients_pair_by_shape_only_where_the_choice_is_unique():
    import torch

    from pytest_msprobe.errors import CallSkip
    from pytest_msprobe.run.replay import _grads_by_shape

    sequence, state, grad = torch.zeros(2, 6, 16), torch.zeros(2, 2, 16), torch.ones(2, 6, 16)
    assert _grads_by_shape([sequence, state], [grad])[0] is grad
    assert _grads_by_shape([sequence, state], [grad])[1] is None
    with pytest.raises(CallSkip, match="cannot pair them by shape"):
        _grads_by_shape([sequence, torch.zeros(2, 6, 16)], [grad])  # two outputs of its shape
