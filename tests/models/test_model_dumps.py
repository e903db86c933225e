"""Calibration on real models: msprobe dumps of one training step (forward AND backward)
of a 12-block transformer (float32, bfloat16, float16, and a bfloat16 statistics dump), a
convnet with batch norm, a GRU, an LSTM, and a large-vocabulary embedding with masked
attention (tests/dumps/models/make_dumps.py made them; its fault table cites the real
defects the faults model).

- The CPU is a correct device: every call passes with no warning, single-run and
  offline (the dumped outputs judged against the CPU reference in the dump's dtype).
- A planted fault (pytest_msprobe/testing/model_faults.py) fails the faulty API's calls and nothing else:
  single-run, patched into the device run; offline, in a dump whose outputs the faulty
  kernel wrote while msprobe dumped (the maker checked the fault is in the dumped outputs).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_msprobe.testing.model_faults import FAULTS

MODELS = Path(__file__).parents[1] / "dumps" / "models"
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
# a model calling every API of the routing and [terms] tables (make_dumps.py)
APIZOO_DUMPS = ["apizoo_tensor_fp32", "apizoo_tensor_fp16", "apizoo_tensor_bf16"]
# rms_norm (msprobe records it once registered) and the APIs comparing two inputs: cosine_embedding_loss, ...
LOSSES_DUMPS = ["losses_tensor_fp32", "losses_tensor_fp16", "losses_tensor_bf16"]
STATISTICS_DUMPS = ["transformer12_statistics_bf16"]
MODES = {"single-run": (), "offline": ("--msprobe-offline",)}
RUNS = [(name, "single-run") for name in TENSOR_DUMPS + APIZOO_DUMPS + LOSSES_DUMPS + STATISTICS_DUMPS] + [
    (name, "offline") for name in TENSOR_DUMPS + APIZOO_DUMPS + LOSSES_DUMPS
]


def _calls(dump: Path) -> list[str]:
    return [name for name in json.loads(dump.read_text())["data"] if not name.startswith(("Module.", "Cell."))]


@pytest.mark.parametrize(("name", "mode"), [pytest.param(name, mode, id=f"{name}-{mode}") for name, mode in RUNS])
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
    if (
        mode == "offline" and name in TENSOR_DUMPS
    ):  # the GEMM backwards msprobe records at the reshape: judged through the data flow
        gemm = ("Functional.linear.", "Torch.matmul.", "Tensor.__matmul__.")
        skipped = [
            call for call in result.by_outcome("skipped") if call.startswith(gemm) and call.endswith(".backward")
        ]
        assert skipped == []


def _faulty_calls(fault, calls: list[str], judged: set[str]) -> set[str]:
    """The calls the fault makes wrong: the API's, in the directions it affects."""
    directions = tuple(fault.direction.split("+"))
    if fault.name == "softmax_low_precision_sum":
        directions = ("forward", "backward")  # its backward reads the stored (wrong) output
    return {
        call for call in calls if call.startswith(fault.call_prefix) and call.endswith(directions) and call in judged
    }


# Below the floor of what separates a correct kernel from these faults in one call, on
# these dumps' 8-element softmax rows (measured, make_dumps.py), in both modes:
# - the half-accumulator backward's errors reach 8-17 float16 ULPs where the correct
#   kernel's reach 3.3, on elements the single-run rule judges at the output's RMS scale
#   (limit 8 ULP); offline its ratios are 1.11-1.15x (limit 2x);
# - the low-precision sum moves the forward by up to 2.3 bfloat16 ULPs (mean 0.49 against
#   the correct kernel's 0.25): single-run limits are 8 / 1 ULP at the RMS scale, and
#   offline its mean_rel_err ratio was 2.14x against 2x before the reference noise floor
#   (standards/benchmark.py), which the offline checks of correct layer_norm gradients
#   need (ratios up to 3.7x between two correct summation orders).
# Their kernels pool the calls: test_a_softmax_fault_no_call_shows_fails_its_kernel.
BELOW_FLOOR = {"softmax_low_precision_sum", "softmax_backward_half_accumulator"}
#: the faults with a dump of their own (make_dumps.py FAULT_DUMPS) that are defects
DUMPED = sorted(name for name in FAULTS if (MODELS / "faults" / name).is_dir())
FAULT_RUNS = [
    (name, mode) for name in DUMPED if name not in BELOW_FLOOR and not FAULTS[name].within_model for mode in MODES
]
#: the faults the accuracy model says a correct library may produce (reclassified)
WITHIN_MODEL_RUNS = [(name, mode) for name in DUMPED if FAULTS[name].within_model for mode in MODES]


@pytest.mark.parametrize(("fault_name", "mode"), WITHIN_MODEL_RUNS)
def test_a_fault_within_the_accuracy_model_is_no_error(fault_name, mode, copy_dump, run_dump, monkeypatch):
    """Reclassified: the lean such a kernel has is within what the accuracy model says a
    correct library of the API's class may have (ModelFault.within_model says which row),
    so every call and kernel passes; the lean stays in the metrics."""
    fault = FAULTS[fault_name]
    dump = copy_dump(f"models/faults/{fault_name}")
    if mode == "single-run":
        fault.patch(monkeypatch)
    result = run_dump(dump, "--msprobe-device=cpu", *MODES[mode], "-k", fault.call_prefix.rstrip("."))
    assert result.by_outcome("passed") and not result.by_outcome("failed"), result.by_outcome("failed")
    assert all(outcome.outcome == "passed" for outcome in result.kernels.values())


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
        kernel
        for kernel, outcome in result.kernels.items()
        if outcome.outcome == "failed" and not kernel.startswith(fault.call_prefix)
    } == set()
    assert expected <= failed, f"missed: {sorted(expected - failed)}"


def _write_faulty_softmax(dump: Path, fault) -> None:
    """The dump as msprobe writes it with `fault` in the softmax: each call's forward
    output and input gradient recomputed by the faulty kernel on the call's dumped
    inputs (offline, each call is judged on its own inputs, so the upstream calls the
    fault would have moved do not matter)."""
    import torch
    import torch.nn.functional as F

    softmax, data = fault.wrap(F.softmax), dump.parent / "dump_tensor_data"

    def load(name: str) -> torch.Tensor:
        return torch.load(data / name, weights_only=True)

    for call in sorted({name.rsplit(".", 1)[0] for name in _calls(dump) if name.startswith(fault.call_prefix)}):
        x = load(f"{call}.forward.input.0.pt").requires_grad_()
        y = softmax(x, dim=-1)
        y.backward(load(f"{call}.backward.input.0.pt"))
        torch.save(y.detach(), data / f"{call}.forward.output.0.pt")
        torch.save(x.grad, data / f"{call}.backward.output.0.pt")


# single-run: neither reference-free floor holds across kernel families (studies/kernel-verdict-limits.md):
# the bench rounded to D (correct bfloat16/float16 kernels pool to 2.65x its scaled-ULP
# error, the faults 2.0-3.1x) nor the dumped output (the shipped dumps' avx512 float32 gelu
# is 3.2x more accurate than this CPU's correct one, in each of 12 calls)
NO_REFERENCE = (
    "single-run on the CPU has no reference run, and no reference-free floor separates the kernel's pooled calls "
    "(studies/kernel-verdict-limits.md); the 16-bit forward fault's softmax.7 and .8 fail alone (the far-misrounding test)"
)
# offline, the half-accumulator backward pools to 1.20x the reference's mean_rel_err
# (correct pairs up to 1.23x) and to 1.70x its scaled-ULP error (correct 16-bit pairs up
# to 1.15x), but its 12 calls spread too widely (1.23-2.46x, sd of log 0.19) for Student's
# t to make it certain over any limit above 1 at z 5: studies/kernel-verdict-limits.md
NOT_SEPARABLE = "12 calls at 1.23-2.46x the reference's scaled-ULP error: not certain over correct pairs' 1.15x at z 5"
#: calls of a softmax fault that fail on their own, and the test that says so: a bfloat16
#: softmax whose row sum is rounded to D shifts its rows' elements alike; a correct 16-bit
#: kernel forms the sum in float32, so the sign tests count elements there (judge/verdict/groups.py):
#: of the 12 calls of 256 elements, softmax.8's is certain alone (z 6.0 by elements, -0.27
#: ULP), and softmax.7's by the far-misrounding test (63 elements below and over half an
#: ULP from the bench against 29: a correct kernel rounds softmax once, judge/verdict/rounding.py);
#: the others stay under both tests' limits and their kernel pools them
CAUGHT_ALONE = {
    ("softmax_low_precision_sum", "offline"): {
        "Functional.softmax.7.forward": "misrounding",
        "Functional.softmax.8.forward": "systematic scale (toward/away from zero) bias",
    }
}
SOFTMAX_RUNS = [
    pytest.param(fault, dump, mode, marks=[pytest.mark.xfail(strict=True, reason=why)] if why else [])
    for fault, dump, mode, why in [
        ("softmax_low_precision_sum", "transformer12_tensor_bf16", "offline", ""),
        ("softmax_low_precision_sum", "transformer12_tensor_bf16", "single-run", NO_REFERENCE),
        ("softmax_backward_half_accumulator", "transformer12_tensor_fp16", "offline", NOT_SEPARABLE),
        ("softmax_backward_half_accumulator", "transformer12_tensor_fp16", "single-run", NO_REFERENCE),
    ]
]


@pytest.mark.parametrize(("fault_name", "name", "mode"), SOFTMAX_RUNS)
def test_a_softmax_fault_no_call_shows_fails_its_kernel(fault_name, name, mode, copy_dump, run_dump, monkeypatch):
    """The softmax faults below every call's floor, planted in the calibration transformer:
    no call fails but those CAUGHT_ALONE, and the softmax kernel in the fault's direction
    does (the other calls' error ratios pooled). Only the softmax calls run: the fault changes no other call's
    inputs or outputs (offline) or kernel (single-run). Fails without the pooled error
    ratio: the kernel passes (its bias tests pool to z <= 1.93)."""
    fault = FAULTS[fault_name]
    dump = copy_dump(f"models/{name}")
    if mode == "offline":
        _write_faulty_softmax(dump, fault)
    else:
        fault.patch(monkeypatch)
    result = run_dump(dump, "--msprobe-device=cpu", *MODES[mode], "-k", "Functional.softmax")
    caught_alone = CAUGHT_ALONE.get((fault_name, mode), {})
    assert {call: outcome.outcome for call, outcome in result.calls.items()} == {
        call: "failed" if call in caught_alone else "passed" for call in _calls(dump) if "softmax" in call
    }
    for call, why in caught_alone.items():
        assert why in result.calls[call].text
    failed = {kernel: outcome.text for kernel, outcome in result.kernels.items() if outcome.outcome == "failed"}
    dtype = "bfloat16" if name.endswith("bf16") else "float16"
    assert list(failed) == [f"Functional.softmax.{dtype}.kernel.{fault.direction}"], sorted(failed)
    assert "mean_rel_err_ratio" in "".join(failed.values()) and f"of {12 - len(caught_alone)} calls" in "".join(
        failed.values()
    )


@pytest.mark.parametrize("name", ["gru_tensor_fp32", "lstm_tensor_fp32"])
def test_a_recurrent_layers_backward_is_judged_though_msprobe_dropped_h_n(name, copy_dump, run_dump):
    """msprobe records one incoming gradient for torch.gru's two outputs (the output
    sequence's; h_n got none): paired by shape, the backward is judged, not skipped."""
    call = f"Torch.{name.split('_')[0]}.0.backward"
    result = run_dump(copy_dump(f"models/{name}"), "--msprobe-device=cpu", "-k", call)
    assert result.calls[call].outcome == "passed", result.calls[call].text


def _instance_norm_parameters_from_the_first_sample(original):
    """float16 instance_norm whose weight and bias gradients reduce over the first sample
    only (a batch reduction that drops the tail); its input gradient stays correct."""
    import torch

    def faulty_instance_norm(input, running_mean=None, running_var=None, weight=None, bias=None, *args, **kwargs):
        if input.dtype != torch.float16 or weight is None or bias is None:
            return original(input, running_mean, running_var, weight, bias, *args, **kwargs)
        x_hat = original(input, running_mean, running_var, None, None, *args, **kwargs)
        w, b = weight.reshape(1, -1, *[1] * (input.dim() - 2)), bias.reshape(1, -1, *[1] * (input.dim() - 2))
        return torch.cat([x_hat[:1] * w + b, x_hat[1:] * w.detach() + b.detach()])

    return faulty_instance_norm


def test_instance_norm_parameter_gradients_missing_a_sample_fail(copy_dump, run_dump, monkeypatch):
    """The terms that excuse a correct kernel's cancelled weight and bias gradients
    (judge/verdict/terms.py) still fail one that drops a sample's share of their sums (about 8% of
    the terms' magnitude on this dump)."""
    import torch.nn.functional as F

    monkeypatch.setattr(F, "instance_norm", _instance_norm_parameters_from_the_first_sample(F.instance_norm))
    call = "Functional.instance_norm.0.backward"
    result = run_dump(copy_dump("models/apizoo_tensor_fp16"), "--msprobe-device=cpu", "-k", call)
    assert result.calls[call].outcome == "failed"
    assert "[1]" in result.calls[call].text and "[2]" in result.calls[call].text, result.calls[call].text


def test_gradients_pair_by_shape_only_where_the_choice_is_unique():
    import torch

    from pytest_msprobe.errors import CallSkip
    from pytest_msprobe.run.replay import _grads_by_shape

    sequence, state, grad = torch.zeros(2, 6, 16), torch.zeros(2, 2, 16), torch.ones(2, 6, 16)
    assert _grads_by_shape([sequence, state], [grad])[0] is grad
    assert _grads_by_shape([sequence, state], [grad])[1] is None
    with pytest.raises(CallSkip, match="cannot pair them by shape"):
        _grads_by_shape([sequence, torch.zeros(2, 6, 16)], [grad])  # two outputs of its shape
