r"""Another real library family as the device: JAX/XLA's CPU kernels.

The dumps under tests/dumps/families/ are calibration dumps (tests/dumps/models/apizoo_*,
transformer12_*) whose forward outputs and input gradients JAX recomputed on the dumped
inputs (float32 in float32; bfloat16 raised to float32, computed there, rounded once to
nearest, as correct accelerator kernels do), made by

    python studies/library_families.py --families jax --write-dumps tests/dumps/families \
        --only Functional.gelu Torch.tanh Functional.hardswish Functional.layer_norm \
        Functional.linear Torch.sigmoid Functional.silu Torch.erf Functional.batch_norm \
        Functional.softmax --max-index 1 tests/dumps/models/apizoo_tensor_fp32 \
        tests/dumps/models/apizoo_tensor_bf16 tests/dumps/models/transformer12_tensor_fp32 \
        tests/dumps/models/transformer12_tensor_bf16

(jax is needed to make them, not to run these tests). A linear's backward is msprobe's
record of an inner node and stays ATen's (the harness never recomputes it).

- A correct library passes every call offline with no warning: that is the expectation of
  every case. Before the accuracy model, XLA's float32 gelu of the apizoo dump
  failed here (max_rel_err 3.0x the reference's on 16 elements near x = -1.8, where
  x/2 + x/2 erf(x / sqrt 2) cancels erff's documented error into ULPs of the output); it
  passes now on its terms' magnitudes (judge/verdict/terms.py).
- Faults planted in a family-made dump stay errors: a float32 gelu 5 ULP away from zero
  everywhere and a float32 layer_norm 10 ULP away (beyond what the accuracy model allows
  their classes: 3 and 7 ULP), a bfloat16 layer_norm rounded toward zero (its float32
  value truncated) on 512 elements, in 64 rows or in 8.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from pytest_msprobe.testing.dumpwriter import DumpWriter

FAMILIES = Path(__file__).parents[1] / "dumps" / "families"
DUMPS = sorted(p.name for p in FAMILIES.iterdir() if (p / "dump.json").exists())

#: (dump, call) -> the skip reason's words: a linear's input gradient is neither at the call
#: (msprobe records the reshape after the GEMM) nor recoverable in this excerpt of the dump
SKIPPED = {
    ("jax_apizoo_tensor_fp32", "Functional.linear.0.backward"): "neither at the call nor elsewhere in the dump",
    ("jax_apizoo_tensor_bf16", "Functional.linear.0.backward"): "neither at the call nor elsewhere in the dump",
    ("jax_transformer12_tensor_fp32", "Functional.linear.0.backward"): "neither at the call nor elsewhere in the dump",
}

_RUNS: dict[str, object] = {}


def _calls(dump: str) -> list[str]:
    return [
        name
        for name in json.loads((FAMILIES / dump / "dump.json").read_text())["data"]
        if not name.startswith(("Module.", "Cell."))
    ]


CASES = [pytest.param(dump, call, id=f"{dump}-{call}") for dump in DUMPS for call in _calls(dump)]


@pytest.fixture
def offline_run(run_dump):
    """The dump's offline run, once per dump in this process."""

    def run(dump: str):
        if dump not in _RUNS:
            _RUNS[dump] = run_dump(FAMILIES / dump / "dump.json", "--msprobe-device=cpu", "--msprobe-offline")
        return _RUNS[dump]

    return run


def test_the_family_dumps_are_small_and_jax_made():
    size = sum(f.stat().st_size for f in FAMILIES.rglob("*") if f.is_file())
    assert size < 1_000_000
    assert DUMPS == [
        "jax_apizoo_tensor_bf16",
        "jax_apizoo_tensor_fp32",
        "jax_transformer12_tensor_bf16",
        "jax_transformer12_tensor_fp32",
    ]
    # JAX's outputs, not ATen's: the gelu the families dump holds differs from the calibration dump's
    made = torch.load(FAMILIES / "jax_transformer12_tensor_fp32/dump_tensor_data/Functional.gelu.0.forward.output.0.pt")
    aten = torch.load(
        FAMILIES.parent / "models/transformer12_tensor_fp32/dump_tensor_data/Functional.gelu.0.forward.output.0.pt"
    )
    assert made.shape == aten.shape and not torch.equal(made, aten)


@pytest.mark.parametrize(("dump", "call"), CASES)
def test_a_correct_library_passes_every_call_offline(dump, call, offline_run):
    result = offline_run(dump)
    assert result.collection_errors == []
    outcome = result.calls[call]
    skipped = SKIPPED.get((dump, call))
    if skipped:
        assert outcome.outcome == "skipped" and skipped in outcome.text
        return
    assert outcome.outcome == "passed", outcome.text
    assert outcome.warnings == []


def away_from_zero(tensor: torch.Tensor, ulps: int) -> torch.Tensor:
    """Each element moved `ulps` representable values away from zero."""
    for _ in range(ulps):
        tensor = torch.nextafter(tensor, torch.where(tensor >= 0, torch.inf, -torch.inf).to(tensor.dtype))
    return tensor


def truncated_bfloat16(value: torch.Tensor) -> torch.Tensor:
    """A float32 tensor rounded toward zero to bfloat16 (its low 16 bits dropped)."""
    return (value.float().contiguous().view(torch.int32) & -65536).view(torch.float32).to(torch.bfloat16)


def _plant(copy_dump, dump: str, call: str, change) -> Path:
    path = copy_dump(f"families/{dump}")
    tensors = path.parent / "dump_tensor_data"
    output = tensors / f"{call}.forward.output.0.pt"
    torch.save(change(torch.load(output), tensors), output)
    return path


def _layer_norm_truncated(_: torch.Tensor, tensors: Path) -> torch.Tensor:
    """The bfloat16 layer_norm of the dumped inputs computed in float32 and truncated."""
    x, weight, bias = (torch.load(tensors / f"Functional.layer_norm.0.forward.input.{i}.pt").float() for i in (0, 2, 3))
    return truncated_bfloat16(torch.nn.functional.layer_norm(x, [x.shape[-1]], weight, bias))


#: beyond the accuracy model's lean for the class (standards/tables/accuracy_model.csv):
#: gelu 3 ULP, normalisation 7 ULP; the JAX output's own lean (gelu -0.4..-0.6) added
PLANTED = [
    pytest.param(
        "jax_transformer12_tensor_fp32",
        "Functional.gelu.0",
        lambda t, _: away_from_zero(t, 5),
        id="float32-gelu-5-ulp-away-from-zero",
    ),
    pytest.param(
        "jax_apizoo_tensor_fp32",
        "Functional.layer_norm.0",
        lambda t, _: away_from_zero(t, 10),
        id="float32-layer_norm-10-ulp-away-from-zero",
    ),
    pytest.param(
        "jax_apizoo_tensor_bf16",
        "Functional.layer_norm.0",
        _layer_norm_truncated,
        id="bfloat16-layer_norm-truncated-64-rows",
    ),
    pytest.param(
        "jax_transformer12_tensor_bf16",
        "Functional.layer_norm.0",
        _layer_norm_truncated,
        id="bfloat16-layer_norm-truncated-8-rows",  # caught since 16-bit groups count elements (judge/verdict/groups.py)
    ),
]


@pytest.mark.parametrize(("dump", "call", "change"), PLANTED)
def test_a_fault_planted_in_a_family_made_dump_is_an_error(dump, call, change, copy_dump, run_dump):
    result = run_dump(_plant(copy_dump, dump, call, change), "--msprobe-device=cpu", "--msprobe-offline")
    outcome = result.calls[f"{call}.forward"]
    assert outcome.outcome == "failed"
    assert "error" in outcome.text


def _library_gelu(x: torch.Tensor, erf_ulps: int) -> torch.Tensor:
    """A float32 gelu as a math library computes it, 0.5 x (1 + erf(x / sqrt 2)) in float32
    steps, its erff `erf_ulps` ULPs nearer zero than the correctly rounded value."""
    s = torch.erf(x.double() / math.sqrt(2)).float()
    for _ in range(erf_ulps):
        s = torch.nextafter(s, torch.zeros_like(s))
    return 0.5 * x * (1 + s)


def _gelu_dump(root: Path, erf_ulps: int) -> Path:
    """16 float32 inputs where gelu's two halves cancel (x from -2.5 to -1)."""
    writer = DumpWriter(root, "tensor")
    x = torch.linspace(-2.5, -1.0, 16)
    writer.forward("Functional.gelu.0", [x], {}, _library_gelu(x, erf_ulps))
    return writer.write()


@pytest.mark.parametrize(
    ("erf_ulps", "outcome"),
    [
        pytest.param(2, "passed", id="erff-at-cuda-s-documented-2-ulp"),
        pytest.param(16, "failed", id="erff-16-ulp-off"),
    ],
)
def test_a_library_gelu_is_judged_by_its_erf_s_documented_error(tmp_path: Path, run_dump, erf_ulps: int, outcome: str):
    """erff's documented 2 ULP become a relative error of up to 2e-3 of gelu's output
    here, where x/2 and x/2 erf(x / sqrt 2) cancel: without gelu's terms (judge/verdict/terms.py)
    that was 4.3x the max_rel_err of this machine's kernel (limit 2x), an error. A
    correct library within its document passes on the terms' magnitudes; 16 ULP of erff
    is beyond any document and fails."""
    result = run_dump(_gelu_dump(tmp_path / "dump", erf_ulps), "--msprobe-device=cpu", "--msprobe-offline")
    call = result.calls["Functional.gelu.0.forward"]
    assert call.outcome == outcome, call.text
