"""judge/reduce/reduction.py: a failing call reduced to a smaller input that fails the same way.

Planted faults of every kind the suite has (a biased kernel, a truncating add, a linear
rounding toward zero, a wrong backward) are patched into the device side in this
process, as pytest_msprobe/testing/model_faults.py patches them; an offline fault is written into the
dumped outputs. Each reduction keeps the verdict's signature, reaches at most 1/8 of the
input elements where the fault is elementwise, and a candidate that passes is refused.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch

from pytest_msprobe.dump.index import parse_call_name, read_index
from pytest_msprobe.errors import CallSkip
from pytest_msprobe.judge.check.call import Settings
from pytest_msprobe.judge.reduce.cuts import CallShapes, call_axes
from pytest_msprobe.judge.reduce.reduction import (
    Cut,
    Plan,
    Search,
    failure_signature,
    judge_dump,
    read_call,
    reason_kind,
    reduce_call,
)
from pytest_msprobe.run.devices import Backend
from pytest_msprobe.standards import Registry, Verdict
from pytest_msprobe.testing.dumpwriter import DumpWriter
from pytest_msprobe.testing.faults import scaled_in
from pytest_msprobe.testing.model_faults import FAULTS

BF16 = torch.bfloat16


def _settings(offline: bool = False) -> Settings:
    return Settings(
        backend=Backend(), device_index=0, max_elements=1 << 30, registry=Registry.default(), offline=offline
    )


def _forward_dump(folder: Path, call: str, function, args: list, kwargs: dict | None = None) -> Path:
    writer = DumpWriter(folder, "tensor")
    writer.forward(call, args, kwargs or {}, function(*args, **(kwargs or {})))
    return writer.write()


def _backward_dump(folder: Path, call: str, function, args: list, kwargs: dict | None = None) -> Path:
    """A forward and its backward record, the incoming gradient seeded."""
    writer = DumpWriter(folder, "tensor")
    leaves = [
        arg.detach().clone().requires_grad_(arg.is_floating_point()) if isinstance(arg, torch.Tensor) else arg
        for arg in args
    ]
    output = function(*leaves, **(kwargs or {}))
    grad = torch.randn(output.shape, generator=torch.Generator().manual_seed(1)).to(output.dtype)
    wanting = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor) and leaf.requires_grad]
    grads = torch.autograd.grad(output, wanting, grad)
    writer.forward(
        call,
        [leaf.detach() if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves],
        kwargs or {},
        output.detach(),
    )
    writer.backward(call, [grad], list(grads))
    return writer.write()


def _random(*shape: int, seed: int = 0, dtype: torch.dtype = BF16) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _reduce(dump: Path, call: str, tmp_path: Path, offline: bool = False):
    index = read_index(dump)
    name = parse_call_name(call)
    assert name is not None
    return reduce_call(index, name, _settings(offline), tmp_path / "reduced", Plan(tries=48, seconds=120))


# --- the signature ----------------------------------------------------------------


def test_a_reasons_kind_keeps_its_signs_and_words_not_its_magnitudes():
    plus = "systematic additive bias: bias_ulp +0.31 ULP, against the bench rounded to D (limit 0.05)"
    assert reason_kind(plus) == reason_kind(plus.replace("0.31", "0.52").replace("0.05", "0.07"))
    assert reason_kind(plus) != reason_kind(plus.replace("+0.31", "-0.31"))  # the other direction
    scale = (
        "systematic scale (toward/away from zero) bias: scale_bias_ulp +0.336 ULP, +0.336 ULP beyond the "
        "reference run's -0.000589 (limit 0.25), with sign-test z 32 > 5"
    )
    assert reason_kind(scale) == "systematic scale bias: scale_bias_ulp +# ULP"
    assert reason_kind(scale) != reason_kind(scale.replace("+0.336", "-0.336"))
    toward = "scale misrounding: 63 elements toward zero and over half an ULP (and 2 float32 ULPs) from the bench"
    assert reason_kind(toward) != reason_kind(toward.replace("toward zero", "away from zero"))
    assert (
        reason_kind("max_scaled_ulp_err 12.5 > 4 ULP of bfloat16 (at max)")
        == "max_scaled_ulp_err # > # ULP of bfloat16"
    )


def test_the_signature_reads_the_failing_outputs_only():
    failing = Verdict("error", "ulp", reasons=("max_ulp_err 9 > 4",), path="output[0]")
    passing = Verdict("pass", "ulp", reasons=(), path="output[1]")
    verdict = Verdict("error", "ulp", outputs=(failing, passing))
    assert failure_signature(verdict).kinds == frozenset({("output[0]", "max_ulp_err # > #")})
    other = Verdict("error", "ulp", outputs=(dataclasses.replace(failing, path="output[1]"), passing))
    assert failure_signature(other) != failure_signature(verdict)
    assert failure_signature(dataclasses.replace(verdict, standard="benchmark")) != failure_signature(verdict)


# --- planted faults, online -------------------------------------------------------

#: name -> (patch it, the dumped call, its function, its arguments, elementwise); the biased silu
#: fails by a scale bias and a far misrounding away from zero, the linear by a bias toward zero
ONLINE = {
    "biased-silu": (
        lambda mp: mp.setattr(torch.nn.functional, "silu", scaled_in(BF16, 1 + 2**-6)(torch.nn.functional.silu)),
        "Functional.silu.0",
        torch.nn.functional.silu,
        lambda: [_random(16, 32, 64)],
        True,
    ),
    "truncating-add": (
        FAULTS["bf16_truncation"].patch,
        "Tensor.__add__.0",
        torch.Tensor.__add__,
        lambda: [_random(64, 512, seed=1), _random(64, 512, seed=2)],
        True,
    ),
    "toward-zero-linear": (
        FAULTS["bf16_dot_toward_zero"].patch,
        "Functional.linear.0",
        torch.nn.functional.linear,
        lambda: [_random(8, 32, 64, seed=3), _random(48, 64, seed=4)],
        False,
    ),
}


@pytest.mark.parametrize("fault", sorted(ONLINE))
def test_a_planted_fault_reduces_and_keeps_its_signature(fault, tmp_path, monkeypatch):
    patch, call, function, arguments, elementwise = ONLINE[fault]
    dump = _forward_dump(tmp_path / "dump", call, function, arguments())
    patch(monkeypatch)
    reduction = _reduce(dump, f"{call}.forward", tmp_path)
    assert reduction.original.verdict.status == "error"
    assert failure_signature(reduction.reduced.verdict) == reduction.signature
    assert reduction.elements_after < reduction.elements_before
    if elementwise:
        assert reduction.elements_after * 8 <= reduction.elements_before, reduction.summary
    again = judge_dump(reduction.dump, parse_call_name(f"{call}.forward"), _settings())
    assert failure_signature(again.verdict) == reduction.signature  # the written dump fails alike


def test_a_wrong_backward_reduces_and_keeps_its_signature(tmp_path, monkeypatch):
    """A float32 linear whose backward GEMMs lose precision to bfloat16: its rows and
    output features cut, the inner dim where the failure survives it."""
    fault = FAULTS["linear_backward_bf16"]
    x, weight = _random(8, 16, 64, seed=5, dtype=torch.float32), _random(32, 64, seed=6, dtype=torch.float32)
    dump = _backward_dump(tmp_path / "dump", "Functional.linear.0", torch.nn.functional.linear, [x, weight])
    fault.patch(monkeypatch)
    reduction = _reduce(dump, "Functional.linear.0.backward", tmp_path)
    assert reduction.original.verdict.status == "error"
    assert failure_signature(reduction.reduced.verdict) == reduction.signature
    assert reduction.elements_after * 8 <= reduction.elements_before, reduction.summary


# --- offline: the dumped outputs sliced with the inputs -----------------------------


def _rows_biased_dump(folder: Path, rows: int = 4) -> Path:
    """A bfloat16 add whose dumped output is 2**-5 too large on its first `rows` rows."""
    a, b = _random(64, 256, seed=6), _random(64, 256, seed=7)
    out = a + b
    out[:rows] = (out[:rows].float() * (1 + 2**-5)).to(BF16)
    writer = DumpWriter(folder, "tensor")
    writer.forward("Tensor.__add__.0", [a, b], {}, out)
    return writer.write()


def test_a_fault_on_some_rows_reduces_to_a_slice_of_those_rows(tmp_path):
    dump = _rows_biased_dump(tmp_path / "dump")
    reduction = _reduce(dump, "Tensor.__add__.0.forward", tmp_path, offline=True)
    assert failure_signature(reduction.reduced.verdict) == reduction.signature
    assert reduction.elements_after * 8 <= reduction.elements_before, reduction.summary
    start, stop = reduction.kept["dim 0"]
    assert stop <= 4, reduction.kept  # rows 4.. pass: a slice of them is refused
    assert reduction.refused > 0


def test_a_candidate_that_passes_is_refused(tmp_path):
    dump = _rows_biased_dump(tmp_path / "dump")
    index, name = read_index(dump), parse_call_name("Tensor.__add__.0.forward")
    settings = _settings(offline=True)
    call = read_call(index, name, settings)
    wanted = failure_signature(judge_dump(dump, name, settings).verdict)
    search = Search(call, settings, Plan(), wanted, tmp_path / "scratch")
    sizes = [axis.size for axis in call.axes]
    assert search.fails_alike(Cut(((0, 4), (0, sizes[1]))))
    assert not search.fails_alike(Cut(((8, 64), (0, sizes[1]))))  # the same call without the biased rows passes
    assert search.refused == 1


def test_a_passing_call_is_never_reduced(tmp_path):
    dump = _forward_dump(tmp_path / "dump", "Functional.silu.0", torch.nn.functional.silu, [_random(16, 64)])
    with pytest.raises(CallSkip, match="does not fail"):
        _reduce(dump, "Functional.silu.0.forward", tmp_path)
    assert not (tmp_path / "reduced").exists()


REAL = Path(__file__).parents[1] / "dumps" / "real" / "llama_tiny_sdpa_L1_tensor_bf16"


#: a fault written into the real dump's output -> the share of the elements it reduces to at most
REAL_FAULTS = {
    "biased": (scaled_in(BF16, 1 + 2**-4)(torch.Tensor.__add__), 1 / 8),
    # a rounding bias, a statistical symptom: the sign test needs its elements
    "truncating": (FAULTS["bf16_truncation"].wrap(torch.Tensor.__add__), 1 / 2),
}


@pytest.mark.parametrize("fault", sorted(REAL_FAULTS))
def test_a_real_dumps_planted_failure_reduces_offline(fault, tmp_path):
    """A copy of the shipped Llama dump whose largest bfloat16 add is wrong in its dumped output."""
    faulty, share = REAL_FAULTS[fault]
    folder = shutil.copytree(REAL, tmp_path / "real")
    dump = folder / "dump.json"
    index = read_index(dump)
    adds = [name for name in index.names if name.startswith("Tensor.__add__.") and name.endswith(".forward")]
    records = {name: index.read_record(index.entry_of(name)) for name in adds}
    bf16 = [name for name in adds if records[name]["output"][0]["dtype"] == "torch.bfloat16"]
    call = max(bf16, key=lambda name: torch.Size(records[name]["output"][0]["shape"]).numel())
    entry = records[call]
    data = folder / "dump_tensor_data"
    args = [torch.load(data / arg["data_name"], weights_only=True) for arg in entry["input_args"]]
    torch.save(faulty(*args), data / entry["output"][0]["data_name"])
    reduction = _reduce(dump, call, tmp_path, offline=True)
    assert reduction.original.verdict.status == "error"
    assert failure_signature(reduction.reduced.verdict) == reduction.signature
    assert reduction.elements_after <= reduction.elements_before * share, reduction.summary


def test_an_api_without_a_rule_is_reported_whole_and_said_so(tmp_path):
    x = _random(8, 64, seed=8)
    out = (torch.cumsum(x.float(), dim=1) * (1 + 2**-4)).to(BF16)
    writer = DumpWriter(tmp_path / "dump", "tensor")
    writer.forward("Torch.cumsum.0", [x, 1], {}, out)
    reduction = _reduce(writer.write(), "Torch.cumsum.0.forward", tmp_path, offline=True)
    assert reduction.before == reduction.after == "8x64" and reduction.tries == 0
    assert any("no rule for it" in note for note in reduction.notes)
    assert failure_signature(reduction.reduced.verdict) == reduction.signature


def test_the_search_stops_at_its_bound_and_says_so(tmp_path):
    dump = _rows_biased_dump(tmp_path / "dump")
    index, name = read_index(dump), parse_call_name("Tensor.__add__.0.forward")
    reduction = reduce_call(index, name, _settings(offline=True), tmp_path / "reduced", Plan(tries=2))
    assert reduction.tries == 2 and any("stopped at its bound (2 tries" in note for note in reduction.notes)
    assert failure_signature(reduction.reduced.verdict) == reduction.signature


def _matmul_dump(folder: Path) -> Path:
    """A bfloat16 matmul whose dumped output is 2**-4 too large."""
    a, b = _random(32, 64, seed=9), _random(64, 16, seed=10)
    writer = DumpWriter(folder, "tensor")
    writer.forward("Torch.matmul.0", [a, b], {}, (torch.matmul(a.float(), b.float()) * (1 + 2**-4)).to(BF16))
    return writer.write()


def test_offline_a_matmuls_inner_dim_stays_whole_where_the_device_does_not_fail(tmp_path):
    reduction = _reduce(_matmul_dump(tmp_path / "dump"), "Torch.matmul.0.forward", tmp_path, offline=True)
    assert reduction.after.endswith("x64") and reduction.kept["inner"] == (0, 64) and reduction.offline
    assert any("kept whole: inner" in note and "does not fail alike" in note for note in reduction.notes)
    assert reduction.elements_after < reduction.elements_before


def test_offline_a_matmuls_inner_dim_is_cut_single_run_where_the_device_fails_alike(tmp_path, monkeypatch):
    """The device here has the dump's fault too: past the sliced outputs, the reduced call
    is judged single-run on it, its inner dim cut, and the reduction says so."""
    monkeypatch.setattr(torch, "matmul", scaled_in(BF16, 1 + 2**-4)(torch.matmul))
    reduction = _reduce(_matmul_dump(tmp_path / "dump"), "Torch.matmul.0.forward", tmp_path, offline=True)
    assert reduction.kept["inner"] != (0, 64) and not reduction.offline
    assert any("judged single-run on the device" in note for note in reduction.notes)
    assert failure_signature(reduction.reduced.verdict) == reduction.signature
    assert failure_signature(reduction.original.verdict).kinds <= reduction.signature.kinds
    assert json.loads(reduction.dump.read_text())["data"]["Torch.matmul.0.forward"]["output"] == []


def test_a_statistics_dump_is_not_reduced(tmp_path, monkeypatch):
    writer = DumpWriter(tmp_path / "dump", "statistics")
    x = _random(16, 64)
    writer.forward("Functional.silu.0", [x], {}, torch.nn.functional.silu(x))
    monkeypatch.setattr(torch.nn.functional, "silu", scaled_in(BF16, 1 + 2**-4)(torch.nn.functional.silu))
    with pytest.raises(CallSkip, match="only a tensor dump is reduced"):
        _reduce(writer.write(), "Functional.silu.0.forward", tmp_path)


# --- the [reduce] table's rules (judge/reduce/cuts.py) ---------------------------------------


def _axes(operator: str, shapes: dict, values: dict | None = None) -> dict[str, tuple]:
    call = CallShapes({loc: tuple(shape) for loc, shape in shapes.items()}, values or {})
    return {axis.name: (axis.members, axis.maps_outputs) for axis in call_axes(operator, call)}


def test_a_softmax_keeps_its_reduced_dim_and_a_norm_its_normalized_dims():
    shapes = {("input_args", 0): (4, 8, 16), ("output", 0): (4, 8, 16)}
    assert set(_axes("softmax", shapes, {("input_kwargs", "dim"): {"type": "int", "value": -1}})) == {"dim 0", "dim 1"}
    assert set(_axes("softmax", shapes, {("input_args", 1): {"type": "int", "value": 1}})) == {"dim 0", "dim 2"}
    assert _axes("softmax", shapes) == {}  # an implicit dim: nothing is cut
    norm = {**shapes, ("input_args", 2): (8, 16)}
    assert set(_axes("layer_norm", norm, {("input_args", 1): [8, 16]})) == {"dim 0"}


def test_a_broadcast_operand_is_cut_only_where_it_spans_the_dim():
    shapes = {("input_args", 0): (4, 8), ("input_args", 1): (1, 8), ("output", 0): (4, 8)}
    axes = _axes("add", shapes)
    assert (("input_args", 1), 0) not in axes["dim 0"][0] and (("input_args", 0), 0) in axes["dim 0"][0]
    assert (("input_args", 1), 1) in axes["dim 1"][0]


def test_a_linears_rows_and_features_map_the_output_and_its_inner_dim_does_not():
    shapes = {
        ("input_args", 0): (2, 3, 16),
        ("input_args", 1): (5, 16),
        ("input_args", 2): (5,),
        ("output", 0): (2, 3, 5),
    }
    axes = _axes("linear", shapes)
    assert set(axes) == {"rows dim 0", "rows dim 1", "features", "inner"}
    assert (("input_args", 2), 0) in axes["features"][0] and (("output", 0), 2) in axes["features"][0]
    assert axes["inner"][1] is False and all(maps for name, (_, maps) in axes.items() if name != "inner")
