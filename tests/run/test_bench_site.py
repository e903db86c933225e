"""Where the raised-precision bench runs (run/precision.py): float16/bfloat16 calls on an
accelerator get their float32 bench there, in strict float32 (TF32, HF32 and
reduced-precision reductions off, read back, restored after), everything else stays on
the CPU, and the verdict says which.

What needs no device is tested here on the CPU: which calls get the accelerator bench
(the placement is decided, nothing runs on it: an AcceleratorBackend object needs no
device until it is used), the switches set inside a bench run and restored after it
(torch's CPU build has the same flags), and the refusals -- a switch whose setter is
ignored, TF32 forced by the environment, the check failing at run time -- each shown
to change the outcome against a control that passes. What needs a device runs only
where one exists and is skipped with the reason elsewhere: no device is faked.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from pytest_msprobe.dump.values import TensorLeaf
from pytest_msprobe.errors import CallSkip
from pytest_msprobe.judge.check.call import PytorchReplay, Settings, check_call
from pytest_msprobe.run import precision
from pytest_msprobe.run.apis import Api
from pytest_msprobe.run.devices import ACCELERATORS, AcceleratorBackend, Backend, DeviceUnavailable, backend
from pytest_msprobe.run.replay import Inputs, Placement, Run, Sides, replay
from pytest_msprobe.standards import Registry

CUDA_LABEL = "bench on cuda:0 in float32, TF32 and reduced-precision reductions off"
REDUCTIONS = ("allow_fp16_reduced_precision_reduction", "allow_bf16_reduced_precision_reduction")


def _read(get):
    try:
        return get()
    except RuntimeError as exc:  # torch refusing a legacy read in a mixed legacy/new-API state
        return f"unreadable: {exc}"[:60]


def _flags() -> dict[str, object]:
    """Every precision setting the bench touches, as torch reports it now."""
    matmul = torch.backends.cuda.matmul
    out = {name: getattr(matmul, name) for name in REDUCTIONS + ("allow_fp16_accumulation",) if hasattr(matmul, name)}
    out.update({name: owner().fp32_precision for name, owner in precision._fp32_precision_api()})
    out.update(
        matmul_tf32=_read(lambda: matmul.allow_tf32),
        cudnn_tf32=_read(lambda: torch.backends.cudnn.allow_tf32),
        precision=_read(torch.get_float32_matmul_precision),
    )
    return out


def _set_user_tf32() -> None:
    """A user's production settings: TF32 and reduced-precision reductions on."""
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    for name in REDUCTIONS:
        setattr(torch.backends.cuda.matmul, name, True)


@pytest.fixture(autouse=True)
def _keep_flags():
    """No test leaves torch's precision settings changed: the legacy flags restored
    first, then the newer API's strings (which hold the state exactly)."""
    before = _flags()
    saved = {name: owner().fp32_precision for name, owner in precision._fp32_precision_api()}
    reductions = {name: getattr(torch.backends.cuda.matmul, name) for name in REDUCTIONS}
    legacy = (
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.get_float32_matmul_precision(),
    )
    yield
    for name, value in reductions.items():
        setattr(torch.backends.cuda.matmul, name, value)
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = legacy[:2]
    torch.set_float32_matmul_precision(legacy[2])
    for name, owner in precision._fp32_precision_api():
        owner().fp32_precision = saved[name]
    assert _flags() == before


class _Spec:
    requires_grad = True


def _inputs(*tensors: torch.Tensor) -> Inputs:
    leaves = [TensorLeaf(f"input_args[{i}]", _Spec(), t, "test") for i, t in enumerate(tensors)]
    return Inputs(list(tensors), {}, leaves)


def _settings(device: str = "cuda") -> Settings:
    chosen = Backend() if device == "cpu" else AcceleratorBackend(ACCELERATORS[device])
    return Settings(backend=chosen, device_index=0, max_elements=1 << 30, registry=Registry.default())


def _api(name: str, function=None, raise_bench: bool = True) -> Api:
    function = function or (lambda *args: args[0])
    return Api(name, function, function, in_place=False, raise_bench=raise_bench)


H, L = torch.float16, torch.bfloat16
BIG, SMALL = (256, 256), (8, 8)
#: a float16 linear of 2**20 elements that the ULP standard judges: rules 2, 3, 4 and 6 hold
LARGE_LINEAR = precision.BenchCall("Functional.linear", {H: torch.float32}, {H}, "ulp", 1 << 20)
CASES = [
    # api, input dtypes (and shape), raised?, accelerator bench?, the label says
    ("Functional.linear", [H, H], BIG, True, True, CUDA_LABEL),
    ("Functional.linear", [L, L], BIG, True, True, CUDA_LABEL),
    ("Torch.matmul", [L, torch.float32], BIG, True, True, CUDA_LABEL),  # mixed: float32 throughout
    ("Aten.mm.default", [H, H], BIG, True, True, CUDA_LABEL),
    ("Functional.linear", [torch.float32, torch.float32], BIG, True, False, "bench on the CPU in float64"),
    ("Torch.matmul", [H, torch.float64], BIG, True, False, "bench on the CPU in float64"),
    ("Functional.relu", [H], BIG, True, False, "bench on the CPU (binary consistency)"),
    ("Tensor.type_as", [H, H], BIG, False, False, "bench on the CPU (not raised)"),
    ("NPU.npu_rotary_mul", [H, H], BIG, True, False, "an NPU fused operator's reference"),
    ("Functional.linear", [H, H], SMALL, True, False, "bench on the CPU (a small call)"),
]


@pytest.mark.parametrize(
    ("name", "dtypes", "shape", "raised", "accelerator", "label"),
    CASES,
    ids=[f"{c[0]}-{'-'.join(str(d).removeprefix('torch.') for d in c[1])}-{c[2][0]}" for c in CASES],
)
def test_which_calls_get_the_accelerator_bench(name, dtypes, shape, raised, accelerator, label) -> None:
    inputs = _inputs(*(torch.ones(shape, dtype=dtype) for dtype in dtypes))
    device, bench, reference = PytorchReplay().runs(_api(name, raise_bench=raised), inputs, _settings("cuda"))
    assert bench.site.startswith(label) or label in bench.site, bench.site
    assert (bench.placement.device == torch.device("cuda", 0)) is accelerator
    assert (bench.context is not precision.contextlib.nullcontext) is accelerator
    if accelerator:
        assert bench.context.func is precision.strict_float32 and bench.context.args == ("cuda",)
        assert {bench.placement.dtypes.get(dtype, dtype) for dtype in dtypes} == {torch.float32}
    # the device runs where it is tested, the reference (the call in D) on the CPU, as before
    assert device.placement.device == torch.device("cuda", 0) and reference.placement.device.type == "cpu"


def test_the_cpu_as_device_keeps_the_cpu_bench_and_says_nothing_more() -> None:
    inputs = _inputs(torch.ones(BIG, dtype=H), torch.ones(BIG, dtype=H))
    _, bench, reference = PytorchReplay().runs(_api("Functional.linear"), inputs, _settings("cpu"))
    assert bench.placement.device.type == "cpu" and bench.site == "" and reference is None


def test_an_npu_that_cannot_be_checked_keeps_the_cpu_bench_and_says_why() -> None:
    """Here torch has no NPU module: its HF32 switches and precision mode cannot be read,
    which refuses the accelerator bench as any unverifiable switch does. (The rule
    itself: torch cannot even name an npu device without torch_npu.)"""
    site = precision.bench_site("npu", "npu:0", LARGE_LINEAR)
    assert not site.accelerator
    assert site.label.startswith("bench on the CPU: strict float32 refused on npu:0: ")
    assert "torch.npu.matmul.allow_hf32 cannot be read" in site.label and "torch.npu.conv.allow_hf32" in site.label
    assert "ACL precision mode is unreadable" in site.label


def test_pytest_msprobe_bench_cpu_keeps_every_bench_on_the_cpu(monkeypatch) -> None:
    inputs = _inputs(torch.ones(BIG, dtype=H), torch.ones(BIG, dtype=H))
    monkeypatch.setenv(precision.ENV_BENCH, "cpu")
    _, bench, _ = PytorchReplay().runs(_api("Functional.linear"), inputs, _settings("cuda"))
    assert bench.placement.device.type == "cpu" and bench.site == "bench on the CPU (PYTEST_MSPROBE_BENCH=cpu)"


def _recording(seen: list[dict[str, object]]):
    def function(x, w):
        seen.append(
            {
                "matmul_tf32": torch.backends.cuda.matmul.allow_tf32,
                "cudnn_tf32": torch.backends.cudnn.allow_tf32,
                "precision": torch.get_float32_matmul_precision(),
                **{name: getattr(torch.backends.cuda.matmul, name) for name in REDUCTIONS},
            }
        )
        return F.linear(x, w)

    return function


STRICT = {"matmul_tf32": False, "cudnn_tf32": False, "precision": "highest", **dict.fromkeys(REDUCTIONS, False)}


def test_switches_are_strict_inside_a_bench_run_and_restored_after_it() -> None:
    """A bench Run with the accelerator bench's context, placed on the CPU (the flags are
    the same objects in torch's CPU build): forward and backward both run in strict
    float32, and the user's TF32 settings are back afterwards, also after a raise."""
    _set_user_tf32()
    user = _flags()
    assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    seen: list[dict[str, object]] = []
    function = _recording(seen)
    run = Run(
        _api("Functional.linear", function),
        function,
        Placement(torch.device("cpu"), {H: torch.float32}),
        context=functools.partial(precision.strict_float32, "cuda"),
    )
    x, w = torch.randn(4, 8).half(), torch.randn(3, 8).half()
    inputs = _inputs(x, w)
    inputs.grads = [torch.randn(4, 3).half()]
    out = run.forward(inputs)
    grads = run.backward(inputs, [True, True])
    assert out.dtype == torch.float32 and [g.dtype for g in grads] == [torch.float32] * 2
    assert seen == [STRICT, STRICT]
    assert _flags() == user

    def raising(*args):
        assert torch.get_float32_matmul_precision() == "highest"
        raise RuntimeError("the bench kernel failed")

    failing = dataclasses.replace(run, function=raising)
    with pytest.raises(RuntimeError, match="the bench kernel failed"):
        failing.forward(inputs)
    assert _flags() == user
    # control: without the context the same run sees the user's settings
    seen.clear()
    dataclasses.replace(run, context=precision.contextlib.nullcontext).forward(inputs)
    assert seen[0]["matmul_tf32"] is True and seen[0]["precision"] != "highest"


@pytest.mark.skipif(not precision._fp32_precision_api(), reason="this torch has no fp32_precision API")
def test_settings_made_with_torch_s_newer_api_are_restored_exactly() -> None:
    """A user who set TF32 per backend with the fp32_precision API (cuBLAS and cuDNN
    convolutions in TF32, cuDNN RNNs not: a state in which torch refuses the legacy
    reads) gets exactly that back after a strict bench run."""
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    torch.backends.cudnn.conv.fp32_precision = "tf32"
    torch.backends.cudnn.rnn.fp32_precision = "ieee"
    user = _flags()
    assert str(user["cudnn_tf32"]).startswith("unreadable") and str(user["matmul_tf32"]).startswith("unreadable")
    with precision.strict_float32("cuda"):
        inside = _flags()
    assert inside["matmul_tf32"] is False and inside["cudnn_tf32"] is False and inside["precision"] == "highest"
    assert _flags() == user


def _ignoring(*attributes: str):
    """cuda_switches whose setters of these do nothing: what a torch build or a wrapper
    that drops the setting would do."""

    def switches() -> list[precision.Switch]:
        return [
            dataclasses.replace(s, set=lambda value: None) if s.name.endswith(attributes) else s
            for s in precision.cuda_switches()
        ]

    return switches


# cuBLAS's TF32 has two setters, each of which turns it off: both must be lost
IGNORED = {
    "matmul.allow_tf32": ("matmul.allow_tf32", "get_float32_matmul_precision()"),
    "cudnn.allow_tf32": ("cudnn.allow_tf32",),
    "allow_bf16_reduced_precision_reduction": ("allow_bf16_reduced_precision_reduction",),
}


@pytest.mark.parametrize("attribute", list(IGNORED))
def test_a_switch_that_does_not_take_refuses_the_accelerator_bench(attribute, monkeypatch) -> None:
    """Planted fault: TF32 (or a reduced-precision reduction) cannot be switched off. The
    accelerator bench is refused, the call is benched on the CPU and the verdict's text
    names the switch; the control (the real switches) gets the accelerator bench."""
    _set_user_tf32()
    user = _flags()
    inputs = _inputs(torch.ones(BIG, dtype=H), torch.ones(BIG, dtype=H))
    _, control, _ = PytorchReplay().runs(_api("Functional.linear"), inputs, _settings("cuda"))
    assert control.placement.device == torch.device("cuda", 0) and control.site == CUDA_LABEL
    monkeypatch.setitem(precision.SWITCHES, "cuda", _ignoring(*IGNORED[attribute]))
    _, bench, _ = PytorchReplay().runs(_api("Functional.linear"), inputs, _settings("cuda"))
    assert bench.placement.device.type == "cpu"
    assert bench.site.startswith("bench on the CPU: strict float32 refused on cuda:0: ")
    assert f"{attribute} is True after setting it to False" in bench.site
    with pytest.raises(precision.StrictFloat32Refused, match=attribute), precision.strict_float32("cuda"):
        pass
    assert _flags() == user


def test_a_check_that_fails_at_run_time_skips_the_call_instead_of_judging_it(monkeypatch) -> None:
    """The switches are checked again when the bench runs: if they no longer take (the
    placement was decided before), the call is a skip with the reason, never a verdict
    against a bench that was not strict; the control run is judged."""
    x, w = torch.randn(4, 8).half(), torch.randn(3, 8).half()
    api = _api("Functional.linear", F.linear)
    cpu = torch.device("cpu")
    device = Run(api, F.linear, Placement(cpu))
    bench = Run(
        api, F.linear, Placement(cpu, {H: torch.float32}), context=functools.partial(precision.strict_float32, "cuda")
    )
    results = replay("forward", api, _inputs(x, w), Sides(device, bench, None), framework="pytorch")
    assert results.bench.dtype == torch.float32
    _set_user_tf32()
    monkeypatch.setitem(precision.SWITCHES, "cuda", _ignoring(*IGNORED["matmul.allow_tf32"]))
    with pytest.raises(CallSkip, match="StrictFloat32Refused: torch.backends.cuda.matmul.allow_tf32 is True"):
        replay("forward", api, _inputs(x, w), Sides(device, bench, None), framework="pytorch")


@pytest.mark.parametrize(
    ("variable", "value", "refused"),
    [
        ("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "1", True),  # NGC containers: TF32 in cuBLAS whatever the flags say
        ("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "0", False),
        ("NVIDIA_TF32_OVERRIDE", "0", False),  # disables TF32 everywhere: fine
        ("NVIDIA_TF32_OVERRIDE", "1", True),
    ],
)
def test_tf32_forced_by_the_environment_refuses_the_accelerator_bench(variable, value, refused, monkeypatch) -> None:
    monkeypatch.setenv(variable, value)
    site = precision.bench_site("cuda", "cuda:0", LARGE_LINEAR)
    assert site.accelerator is not refused
    assert (f"{variable}={value} overrides the TF32 switches" in site.label) is refused


def test_the_verdict_and_the_record_say_where_the_bench_ran(write_dump, monkeypatch) -> None:
    """check_call carries the bench's site into the verdict's reference text (every
    output's too, so the records and msprobe_reference show it). Shown with a CPU
    bench labelled as one, on the CPU device; the label of a real accelerator run is
    checked by test_cuda_bench_end_to_end where a GPU exists."""
    from pytest_msprobe.dump.index import CallName, read_index
    from pytest_msprobe.judge.verdict.record import output_results

    x, w = torch.randn(64, 32), torch.randn(16, 32)
    dump = write_dump(
        {
            "Functional.linear.0.forward": {
                "input_args": [_stats(x), _stats(w)],
                "input_kwargs": {},
                "output": [_stats(F.linear(x, w))],
            }
        }
    )
    index = read_index(dump)
    name = CallName("Functional", "linear", 0, "forward")
    plain = check_call(index, name, _settings("cpu"))
    original = PytorchReplay.runs

    def labelled(self, api, inputs, settings):
        device, bench, reference = original(self, api, inputs, settings)
        return device, dataclasses.replace(bench, site="bench on the CPU (labelled by the test)"), reference

    monkeypatch.setattr(PytorchReplay, "runs", labelled)
    result = check_call(index, name, _settings("cpu"))
    assert result.verdict.status == plain.verdict.status == "pass"
    assert result.verdict.reference == f"{plain.verdict.reference}, bench on the CPU (labelled by the test)"
    assert all(
        o.reference.endswith(", bench on the CPU (labelled by the test)") for o in output_results(result.verdict)
    )


def _stats(t: torch.Tensor) -> dict[str, object]:
    return {
        "type": "torch.Tensor",
        "dtype": str(t.dtype),
        "shape": list(t.shape),
        "Max": t.max().item(),
        "Min": t.min().item(),
        "Mean": t.mean().item(),
        "Norm": t.norm().item(),
        "requires_grad": True,
    }


# --- on a device ------------------------------------------------------------------


def _cuda_or_skip() -> None:
    try:
        backend("cuda")
    except DeviceUnavailable as exc:
        pytest.skip(f"needs a CUDA device: {exc}")


def test_cuda_bench_is_as_exact_as_the_cpu_bench_and_tf32_is_not() -> None:
    """The float16 linear's float32 bench on the GPU under strict_float32 is within a few
    float32 ULPs of the exact (float64) result at the terms' scale, as the CPU's float32
    bench is; with TF32 left on (Ampere and later) a float32 linear is hundreds of times
    worse -- why the switches are set and checked. TF32 keeps 10 mantissa bits, as float16
    does: float16 inputs pass through it exactly (an H200 gave 6.5e-7 with TF32 on them
    against 1.1e-7 strict), so its cost shows on float32 inputs (6.8e-5: 650x)."""
    _cuda_or_skip()
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(512, 1024, generator=g).half(), torch.randn(1024, 1024, generator=g).half()
    cpu_err, gpu_err = _scaled_linear_errors(x.float(), w.float(), F.linear, _strict_cuda_linear)
    eps32 = 2.0**-24
    assert cpu_err < 64 * eps32 and gpu_err < 64 * eps32, (cpu_err, gpu_err)
    if torch.cuda.get_device_capability()[0] >= 8:
        x32, w32 = torch.randn(512, 1024, generator=g), torch.randn(1024, 1024, generator=g)
        strict, _ = _scaled_linear_errors(x32, w32, _strict_cuda_linear, _strict_cuda_linear)
        _set_user_tf32()
        torch.set_float32_matmul_precision("high")
        tf32, _ = _scaled_linear_errors(x32, w32, lambda a, b: F.linear(a.cuda(), b.cuda()).cpu(), _strict_cuda_linear)
        assert tf32 > 100 * max(strict, eps32), (tf32, strict)


def _strict_cuda_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    with precision.strict_float32("cuda"):
        return F.linear(x.cuda(), w.cuda()).cpu()


def _scaled_linear_errors(
    x: torch.Tensor, w: torch.Tensor, *linears: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
) -> list[float]:
    """Each linear's largest error against the float64 result, at the terms' scale."""
    exact, scale = F.linear(x.double(), w.double()), F.linear(x.double().abs(), w.double().abs())
    return [float(((linear(x, w).double() - exact).abs() / scale).max()) for linear in linears]


def test_cuda_bench_end_to_end(tmp_path) -> None:
    """A float16 linear large enough for the accelerator bench, dumped, checked on the GPU:
    it passes, its verdict says the bench ran on cuda:0 in strict float32, and the user's
    TF32 settings are unchanged afterwards."""
    _cuda_or_skip()
    from pytest_msprobe.dump.index import CallName, read_index
    from pytest_msprobe.testing.dumpwriter import DumpWriter

    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(256, 1024, generator=g).half(), torch.randn(512, 1024, generator=g).half()
    writer = DumpWriter(tmp_path, "tensor")
    writer.forward("Functional.linear.0", [x, w], {}, F.linear(x.cuda(), w.cuda()).cpu())
    dump = writer.write()
    _set_user_tf32()
    user = _flags()
    index = read_index(dump)
    settings = dataclasses.replace(_settings("cuda"), backend=backend("cuda"))
    result = check_call(index, CallName("Functional", "linear", 0, "forward"), settings)
    assert result.verdict.status == "pass", result.verdict.message()
    assert result.verdict.reference.endswith(CUDA_LABEL)
    assert _flags() == user


# --- the device's own lowered precision, named in a failing call's message ----------


def test_torch_s_defaults_are_named_per_dtype() -> None:
    """torch's defaults, read as a device run leaves them (every torch build has these
    settings): TF32 for cuDNN's float32 convolutions and RNNs, reduced-precision
    reductions for 16-bit GEMMs -- what made an H200's correct float32 LSTM 2.7e-4 off."""
    _set_user_tf32()  # the fixture restores every setting
    float32 = precision.lowered_precision("cuda", {"float32"})
    assert "torch.backends.cudnn.allow_tf32 is True where strict is False" in float32
    assert not any("reduced_precision_reduction" in line for line in float32)
    bfloat16 = precision.lowered_precision("cuda", {"bfloat16"})
    assert bfloat16 == [
        "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction is True where strict is False"
    ]
    assert precision.lowered_precision("cpu", {"float32", "bfloat16"}) == []


def test_strict_settings_name_nothing() -> None:
    with precision.strict_float32("cuda"):
        assert precision.lowered_precision("cuda", {"float32", "float16", "bfloat16"}) == []


def test_only_the_failing_outputs_dtypes_are_asked_about() -> None:
    from pytest_msprobe.judge.check.call import failing_dtypes
    from pytest_msprobe.standards import Verdict

    outputs = (
        Verdict("error", "benchmark", device_dtype="float32"),
        Verdict("pass", "benchmark", device_dtype="bfloat16"),
    )
    assert failing_dtypes(Verdict("error", "benchmark", outputs=outputs)) == {"float32"}
    assert failing_dtypes(Verdict("error", "ulp", device_dtype="float16")) == {"float16"}


def test_a_float32_lstm_failing_on_cuda_names_the_tf32_it_ran_in(copy_dump, run_dump) -> None:
    """On an H200 under torch's defaults the calibration LSTM's forward was 1365x the CPU
    reference's mean_rel_err (cuDNN's RNN in TF32): its message names the setting."""
    _cuda_or_skip()
    _set_user_tf32()
    result = run_dump(copy_dump("models/lstm_tensor_fp32"), "--msprobe-device=cuda", "-k", "lstm.0.forward")
    outcome = result.calls["Torch.lstm.0.forward"]
    assert outcome.outcome == "failed"
    assert "the device computed in lowered precision, by its own settings:" in outcome.text
    assert "torch.backends.cudnn.allow_tf32 is True where strict is False" in outcome.text
