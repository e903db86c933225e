"""The real msprobe dumps, replayed as users run them: the CPU is a correct device, so
every call that can run is judged pass with no warning; a fault planted in one API
fails exactly that API's calls, on every device this machine has."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from pytest_msprobe.run.devices import DeviceUnavailable, backend
from pytest_msprobe.testing.faults import scaled_in

TORCH_DUMPS = [
    "torch_mlpcnn_tensor_fp32",
    "torch_mlpcnn_statistics_bf16",
    "torch_mlpcnn_mix_tensor_fp16",
    "npu_rope_statistics_fp16",
]


def _device_param(name: str) -> object:
    try:
        backend(name)
    except DeviceUnavailable as exc:
        return pytest.param(name, marks=pytest.mark.skip(reason=f"{name}: {exc}"))
    return name


DEVICES = [_device_param(name) for name in ("cpu", "cuda", "npu")]


def api_calls(dump: Path) -> list[str]:
    data = json.loads(dump.read_text())["data"]
    return [name for name in data if not name.startswith(("Module.", "Cell."))]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", TORCH_DUMPS)
def test_correct_device_passes_every_call_without_warning(name: str, device: str, copy_dump, run_dump) -> None:
    dump = copy_dump(name)
    result = run_dump(dump, f"--msprobe-device={device}")
    assert result.collection_errors == []
    assert sorted(result.calls) == sorted(api_calls(dump))
    failed = {call: outcome.text for call, outcome in result.calls.items() if outcome.outcome == "failed"}
    assert failed == {}
    warned = {call: outcome.warnings for call, outcome in result.calls.items() if outcome.warnings}
    assert warned == {}
    for call, outcome in result.by_outcome("skipped").items():
        assert call in outcome.text and len(outcome.text) > len(call) + 10, outcome.text


FAULTS = [
    ("torch_mlpcnn_tensor_fp32", torch.nn.functional, "linear", torch.float32, "Functional.linear."),
    ("torch_mlpcnn_statistics_bf16", torch, "exp", torch.bfloat16, "Torch.exp."),
    ("torch_mlpcnn_mix_tensor_fp16", torch.nn.functional, "silu", torch.float16, "Functional.silu."),
    ("npu_rope_statistics_fp16", torch, "cat", torch.float16, "Torch.cat."),
]


@pytest.mark.parametrize(("name", "owner", "api", "dtype", "prefix"), FAULTS, ids=[f[0] for f in FAULTS])
def test_planted_fault_fails_exactly_that_api(
    name, owner, api, dtype, prefix, copy_dump, run_dump, monkeypatch
) -> None:
    dump = copy_dump(name)
    monkeypatch.setattr(owner, api, scaled_in(dtype, 1 + 2**-5)(getattr(owner, api)))
    result = run_dump(dump, "--msprobe-device=cpu")
    failed = set(result.by_outcome("failed"))
    expected = {call for call in api_calls(dump) if call.startswith(prefix)}
    assert expected and failed == expected
    for call in failed:
        assert "error by the" in result.calls[call].text


def test_a_statistics_calls_verdict_does_not_depend_on_its_index(write_dump, run_dump) -> None:
    """Generated inputs differ per index (their seed is the call's name), the verdict on a
    correct kernel must not: 200 copies of the bfloat16 Tensor.__mul__.1 (its backward is
    a broadcast product summed over the batch, which cancels) were 19 errors before the
    conditioned verdicts (scaled_err_ratio 0.25 > 0)."""
    data = json.loads((Path(__file__).parents[1] / "dumps" / "torch_mlpcnn_statistics_bf16" / "dump.json").read_text())[
        "data"
    ]
    copies = {
        f"Tensor.__mul__.{1000 + k}.{direction}": data[f"Tensor.__mul__.1.{direction}"]
        for k in range(200)
        for direction in ("forward", "backward")
    }
    result = run_dump(write_dump(copies), "--msprobe-device=cpu")
    assert len(result.by_outcome("passed")) == 400, {
        call: o.text for call, o in result.calls.items() if o.outcome != "passed"
    }
