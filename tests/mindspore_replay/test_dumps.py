"""MindSpore dumps through the plugin, as a user runs them: the shipped dumps pass,
a planted fault fails exactly its calls, and every skip says why."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy
import pytest
import torch  # noqa: F401  (loaded before the inline runs, which unload what they import)

from pytest_msprobe.errors import DumpError
from pytest_msprobe.run.mindspore.tables import INSTALL_HINT, require_mindspore

try:
    import mindspore
except ImportError:
    mindspore = None

needs_mindspore = pytest.mark.skipif(mindspore is None, reason=f"MindSpore is not installed: {INSTALL_HINT}")

SHIPPED = ["mindspore_small_tensor_fp32", "mindspore_small_statistics_fp32"]


def _tensor(shape: list[int], dtype: str = "Float32", **stats: Any) -> dict[str, Any]:
    return {
        "type": "mindspore.Tensor",
        "dtype": dtype,
        "shape": shape,
        "Max": 1.0,
        "Min": -1.0,
        "Mean": 0.0,
        "Norm": 1.0,
        **stats,
    }


def _forward(*args: Any, **kwargs: Any) -> dict[str, Any]:
    return {"input_args": list(args), "input_kwargs": kwargs, "output": []}


@needs_mindspore
@pytest.mark.parametrize("dump", SHIPPED)
def test_shipped_dump_passes_on_the_cpu(
    dump: str, copy_dump: Callable[[str], Path], run_dump: Callable[..., Any]
) -> None:
    result = run_dump(copy_dump(dump), "--msprobe-device=cpu")
    assert result.collection_errors == []
    assert len(result.calls) == 12
    assert {name: call.text for name, call in result.calls.items() if call.outcome != "passed"} == {}
    assert {name: call.warnings for name, call in result.calls.items() if call.warnings} == {}
    assert result.ret == 0


@needs_mindspore
@pytest.mark.parametrize("dump", SHIPPED)
def test_planted_fault_fails_exactly_its_calls(
    dump: str, copy_dump: Callable[[str], Path], run_dump: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    exp = mindspore.mint.exp
    monkeypatch.setattr(mindspore.mint, "exp", lambda input: exp(input) * 1.001)
    result = run_dump(copy_dump(dump), "--msprobe-device=cpu")
    failed = result.by_outcome("failed")
    assert sorted(failed) == ["Mint.exp.0.backward", "Mint.exp.0.forward"]
    assert all("error by" in call.text for call in failed.values())
    assert len(result.by_outcome("passed")) == 10


@needs_mindspore
def test_offline_judges_as_online_against_mindspores_own_cpu_kernel(
    copy_dump: Callable[[str], Path], run_dump: Callable[..., Any]
) -> None:
    """The dumped outputs are MindSpore's: offline, the reference is MindSpore's CPU
    kernel, not the torch twin (whose exp and softmax round differently: 4 calls erred
    offline that pass online, with the same device metrics); a perturbed output still
    fails exactly its call."""
    dump = copy_dump(SHIPPED[0])
    online = run_dump(dump, "--msprobe-device=cpu")
    offline = run_dump(dump, "--msprobe-device=cpu", "--msprobe-offline")
    judged = {name: call.outcome for name, call in offline.calls.items() if call.outcome != "skipped"}
    assert len(judged) == 11 and judged == {name: online.calls[name].outcome for name in judged}
    assert {call.properties["msprobe_reference"] for call in offline.calls.values() if call.outcome == "passed"} >= {
        "reference"
    }
    output = dump.parent / "dump_tensor_data" / "Mint.exp.0.forward.output.0.npy"
    numpy.save(output, numpy.load(output) * numpy.float32(1 + 2**-10))
    assert sorted(run_dump(dump, "--msprobe-device=cpu", "--msprobe-offline").by_outcome("failed")) == [
        "Mint.exp.0.forward"
    ]


@needs_mindspore
def test_device_raising_is_the_calls_error(
    copy_dump: Callable[[str], Path], run_dump: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A genuinely wrong MindSpore call is an error, not a missing-kernel skip."""

    def broken(input: Any) -> Any:
        raise RuntimeError("For 'Exp', the input is not what the kernel expects")

    monkeypatch.setattr(mindspore.mint, "exp", broken)
    result = run_dump(copy_dump(SHIPPED[0]), "--msprobe-device=cpu", "-k", "exp and forward")
    assert list(result.calls) == ["Mint.exp.0.forward"]
    assert result.calls["Mint.exp.0.forward"].outcome == "failed"
    assert "the device raised RuntimeError: For 'Exp'" in result.calls["Mint.exp.0.forward"].text


@needs_mindspore
def test_every_skip_says_why(write_dump: Callable[..., Path], run_dump: Callable[..., Any]) -> None:
    dump = write_dump(
        {
            "MintFunctional.gelu.0.forward": _forward(_tensor([3, 4])),
            "Mint.not_an_api.0.forward": _forward(_tensor([3, 4])),
            "MintFunctional.dropout.0.forward": _forward(_tensor([3, 4]), p={"type": "float", "value": 0.1}),
            "Primitive.MatMul.0.forward": _forward(_tensor([3, 4]), _tensor([4, 2])),
            "Nope.exp.0.forward": _forward(_tensor([3, 4])),
            "Mint.exp.0.forward": _forward(_tensor([3, 4])),
        },
        framework="mindspore",
    )
    result = run_dump(dump, "--msprobe-device=cpu")
    reasons = {name: call.text for name, call in result.by_outcome("skipped").items()}
    assert set(reasons) == set(result.calls) - {"Mint.exp.0.forward"}
    assert "has no GeluExt kernel on CPU" in reasons["MintFunctional.gelu.0.forward"]
    assert "Mint.not_an_api is not in the MindSpore->torch table" in reasons["Mint.not_an_api.0.forward"]
    assert "draws random numbers" in reasons["MintFunctional.dropout.0.forward"]
    assert "cannot be rebuilt" in reasons["Primitive.MatMul.0.forward"]
    assert "api type 'Nope' is not known to MindSpore dumps" in reasons["Nope.exp.0.forward"]
    assert result.calls["Mint.exp.0.forward"].outcome == "passed"


def test_without_mindspore_the_dump_is_one_failed_test(
    copy_dump: Callable[[str], Path], run_dump: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "mindspore", None)  # what find_spec sees when it is absent
    result = run_dump(copy_dump(SHIPPED[0]))
    assert list(result.calls) == ["collection"] and result.calls["collection"].outcome == "failed"
    assert f"MindSpore is not installed: {INSTALL_HINT}" in result.calls["collection"].text


def test_a_folder_named_mindspore_is_not_mindspore(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A `mindspore/` folder on the path (dumps beside `python -m pytest`) imports as a
    namespace package: that is not MindSpore installed."""
    (tmp_path / "mindspore").mkdir()
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    monkeypatch.delitem(sys.modules, "mindspore", raising=False)
    with pytest.raises(DumpError, match="MindSpore is not installed"):
        require_mindspore()


@needs_mindspore
def test_numpy_2_is_refused_with_the_install_line(
    copy_dump: Callable[[str], Path], run_dump: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.metadata

    real_version = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "2.1.0" if name == "numpy" else real_version(name))
    result = run_dump(copy_dump(SHIPPED[0]))
    assert list(result.calls) == ["collection"]
    assert "numpy 2.1.0" in result.calls["collection"].text and INSTALL_HINT in result.calls["collection"].text


def test_pytorch_dumps_never_import_mindspore(write_dump: Callable[..., Path], tmp_path: Path) -> None:
    tensor = {
        "type": "torch.Tensor",
        "dtype": "torch.float32",
        "shape": [3, 4],
        "Max": 1.0,
        "Min": -1.0,
        "Mean": 0.0,
        "Norm": 1.0,
    }
    dump = write_dump({"Torch.exp.0.forward": {"input_args": [tensor], "input_kwargs": {}, "output": []}})
    script = (
        "import sys, pytest\n"
        f"code = pytest.main([{str(dump)!r}, '--msprobe-dump={dump}', '-q', '-p', 'no:cacheprovider', '--msprobe-out={tmp_path / 'out'}'])\n"
        "assert code == 0, code\n"
        "print('mindspore imported:', 'mindspore' in sys.modules)\n"
    )
    run = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert "mindspore imported: False" in run.stdout, run.stdout + run.stderr


def test_auto_takes_mindspores_own_device_target() -> None:
    """On `auto` MindSpore's target is its own finding (Ascend where it sees one), not
    only what torch_npu reports; here MindSpore sees no Ascend, so the CPU."""
    mindspore = pytest.importorskip("mindspore")
    from pytest_msprobe.run.devices import Backend
    from pytest_msprobe.run.mindspore.replay import device_target

    expected = "Ascend" if mindspore.hal.is_available("Ascend") else "CPU"
    assert device_target(Backend(), "auto") == expected
    assert device_target(Backend(), "cpu") == "CPU"


def _scaling_dump(write_dump: Callable[..., Path], toward_zero: bool) -> Path:
    """12 MindSpore calls x * 3 on float16 tensors of 28 elements (a sign test of 28 cannot
    reach z 5 on its own), the outputs rounded to nearest or toward zero."""
    generator = numpy.random.default_rng(0)
    data, tensors = {}, {}
    for index in range(12):
        name = f"Tensor.__mul__.{index}.forward"
        x = generator.standard_normal((4, 7)).astype(numpy.float16)
        exact = x.astype(numpy.float64) * 3
        output = exact.astype(numpy.float16)
        if toward_zero:
            output = numpy.where(
                numpy.abs(output) > numpy.abs(exact), numpy.nextafter(output, numpy.float16(0)), output
            )
        tensors |= {f"{name}.input.0.npy": x, f"{name}.output.0.npy": output}
        data[name] = {
            "input_args": [
                _tensor([4, 7], "Float16", data_name=f"{name}.input.0.npy"),
                {"type": "float", "value": 3.0},
            ],
            "input_kwargs": {},
            "output": [_tensor([4, 7], "Float16", data_name=f"{name}.output.0.npy")],
        }
    dump = write_dump(data, task="tensor", framework="mindspore")
    for file, array in tensors.items():
        numpy.save(dump.parent / "dump_tensor_data" / file, array)
    return dump


@needs_mindspore
@pytest.mark.parametrize("toward_zero", [False, True], ids=["nearest", "toward-zero"])
def test_a_mindspore_kernels_calls_are_pooled(
    write_dump: Callable[..., Path], run_dump: Callable[..., Any], toward_zero: bool
) -> None:
    """Kernel verdicts pool MindSpore calls as torch ones (judge/gate/kernel_verdicts.py): a float16
    multiplication rounded toward zero passes each of its 12 calls and fails its kernel
    offline; rounded to nearest, the kernel passes. Fails without the pooling: no kernel."""
    result = run_dump(_scaling_dump(write_dump, toward_zero), "--msprobe-device=cpu", "--msprobe-offline")
    assert {call.outcome for call in result.calls.values()} == {"passed"} and len(result.calls) == 12
    kernel = result.kernels["Tensor.__mul__.float16.kernel.forward"]
    assert kernel.outcome == ("failed" if toward_zero else "passed"), kernel.text
    if toward_zero:
        assert "systematic scale (toward/away from zero) bias" in kernel.text and "of 12 calls" in kernel.text
