"""A model from a model library in CI: the real msprobe tensor dump (L1, bfloat16) of one
training step of Hugging Face transformers' LlamaForCausalLM (one block, hidden size 16,
grouped-query sdpa attention, rotary embedding, RMSNorm written out in float32, SiLU MLP,
the library's own causal-LM loss), made by

    python tools/make_real_model_dumps.py tests/dumps/real --levels L1 --models llama_tiny_sdpa --dtypes bfloat16

(msprobe's Python, with transformers). studies/real_models.py runs the plugin on the
larger set (transformers decoders, encoders, encoder-decoders, timm CNNs) by hand.

- The CPU that wrote it is a correct device: every call passes single-run; offline every
  call passes but the backwards msprobe recorded inside a composite API (its linear and
  cross_entropy backwards), which skip saying so.
- A bfloat16 add that truncates (pytest_msprobe/testing/model_faults.py's bf16_truncation) fails the
  model's bfloat16 adds (the rotary embedding's and the residuals') and nothing else:
  single-run patched into the device, offline written into the dumped outputs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from pytest_msprobe.testing.model_faults import FAULTS

DUMP = "real/llama_tiny_sdpa_L1_tensor_bf16"
MODES = {"single-run": (), "offline": ("--msprobe-offline",)}
COMPOSITE = "a composite API"  # the offline skip of a backward recorded inside a composite call
FAULT = FAULTS["bf16_truncation"]


def _data(dump: Path) -> dict:
    return json.loads(dump.read_text())["data"]


def _bf16_adds(dump: Path) -> set[str]:
    """The forward calls of Tensor.__add__ whose output is bfloat16."""
    return {
        name
        for name, entry in _data(dump).items()
        if name.startswith(FAULT.call_prefix)
        and name.endswith(".forward")
        and entry["output"][0]["dtype"] == "torch.bfloat16"
    }


def _write_faulty_outputs(dump: Path, calls: set[str]) -> None:
    """Recompute each call's output from its dumped inputs with the faulty kernel, into
    the dumped output file: the dump a truncating device would have written."""
    faulty = FAULT.wrap(torch.Tensor.__add__)
    folder = dump.parent / "dump_tensor_data"
    for name in calls:
        entry = _data(dump)[name]
        args = [
            torch.load(folder / arg["data_name"], weights_only=True) if "data_name" in arg else arg["value"]
            for arg in entry["input_args"]
        ]
        torch.save(faulty(*args), folder / entry["output"][0]["data_name"])


@pytest.mark.parametrize("mode", MODES)
def test_a_transformers_llama_passes_on_the_cpu_that_dumped_it(mode, copy_dump, run_dump):
    dump = copy_dump(DUMP)
    result = run_dump(dump, "--msprobe-device=cpu", *MODES[mode])
    assert result.collection_errors == []
    assert sorted(result.calls) == sorted(_data(dump))
    assert {call: outcome.text for call, outcome in result.calls.items() if outcome.outcome == "failed"} == {}
    assert {call: outcome.warnings for call, outcome in result.calls.items() if outcome.warnings} == {}
    skipped = result.by_outcome("skipped")
    if mode == "single-run":
        assert skipped == {}
    assert {
        call: outcome.text
        for call, outcome in skipped.items()
        if not call.endswith(".backward") or COMPOSITE not in outcome.text
    } == {}
    forwards = [call for call in result.calls if call.endswith(".forward")]
    assert forwards and all(result.calls[call].outcome == "passed" for call in forwards)


@pytest.mark.parametrize("mode", MODES)
def test_a_truncating_bf16_add_fails_the_llamas_adds_and_nothing_else(mode, copy_dump, run_dump, monkeypatch):
    dump = copy_dump(DUMP)
    adds = _bf16_adds(dump)
    assert len(adds) >= 4  # the rotary embedding's two, the two residuals
    if mode == "single-run":
        FAULT.patch(monkeypatch)
    else:
        _write_faulty_outputs(dump, adds)
    result = run_dump(dump, "--msprobe-device=cpu", *MODES[mode])
    assert set(result.by_outcome("failed")) == adds
