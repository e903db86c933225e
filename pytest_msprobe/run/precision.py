"""Where a call's raised-precision bench runs, and the strict float32 it needs there.

The bench of a float16/bfloat16 call is the call in float32. On the CPU that is the
dominant cost of a large call (a 1024-wide transformer layer's matmuls), while the
accelerator under test computes float32 tens to hundreds of times faster. Float32 on an
accelerator is as exact as on the CPU for the verdict -- the bench's own error (a few
float32 ULPs per operation, sqrt(K) of them in a K-term sum) is 2**13 (float16) to 2**16
(bfloat16) times finer than the D rounding the standards measure -- PROVIDED the
accelerator really computes in float32. It does not by default everywhere: TF32 (10
mantissa bits, float16's) in cuBLAS/cuDNN, HF32 on Ascend, reduced-precision reductions
inside float16/bfloat16 GEMMs.

The rule (PytorchReplay.runs in judge/check/call.py applies it per call); the bench runs on the
accelerator in float32 where all of 1-7 hold, else on the CPU as before:

1. The device under test is an accelerator (cuda or npu); on the CPU the bench is the
   CPU, as always.
2. The call's bench is raised and every floating value it gets is float32: its floating
   inputs are float16/bfloat16 (float32 ones allowed beside them: the mixed call's bench
   is float32 throughout, replay.bench_dtypes). A float32 call's bench is float64 and
   stays on the CPU (accelerators' float64 is slow, or absent on Ascend); so does the
   unraised bench of a `not_raised` API (the CPU's own kernel in D is the point there).
3. Not an NPU.* fused operator: its bench is a CPU reference from bench_functions.
4. Not an API the binary-consistency standard judges (abs, relu, max_pool2d, gather,
   sort, ...): those verdicts demand bit equality with the bench rounded to D, and an
   accelerator's float32 sums in their backward (a max-pool or index gradient summed by
   atomics, in an order that varies from run to run) may round to D differently from
   the exact value; they cost little on the CPU anyway.
5. The strict float32 switches are set and READ BACK before every accelerator bench run
   (`strict_float32`), and restored after it, so the device run keeps the user's own
   settings:
     cuda: torch.backends.cuda.matmul.allow_tf32 = False, torch.backends.cudnn.allow_tf32
       = False, torch.set_float32_matmul_precision("highest"),
       torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False,
       ...allow_bf16_reduced_precision_reduction = False, ...allow_fp16_accumulation =
       False (where this torch has it); where torch has the fp32_precision API
       (torch.backends.cuda.matmul / cudnn.conv / cudnn.rnn .fp32_precision), none of
       them may read "tf32" or "bf16" afterwards; and the environment must not override
       them: TORCH_ALLOW_TF32_CUBLAS_OVERRIDE (set in NGC containers: TF32 in cuBLAS
       whatever the flags say) must be unset or 0, NVIDIA_TF32_OVERRIDE unset or 0.
     npu: torch.npu.matmul.allow_hf32 = False and torch.npu.conv.allow_hf32 = False (HF32
       is on for convolutions by default), and the ACL precision mode must read
       must_keep_origin_dtype (`torch_npu._C._npu_getOption("ACL_PRECISION_MODE")`): on
       the Atlas training series its default, allow_fp32_to_fp16, runs float32 matrix
       operators in float16; it cannot be restored once set, so it is not set here --
       set it yourself (`torch_npu.npu.set_option({"ACL_PRECISION_MODE":
       "must_keep_origin_dtype"})` in a conftest.py) to get the accelerator bench on an NPU.
   Any switch that does not read back as set (a setter ignored, an override in the
   environment, an attribute this torch lacks and cannot be read) refuses the
   accelerator bench: the call's bench runs on the CPU, and its verdict says why.
6. The call is large enough for the move to pay: its floating inputs hold at least
   ACCELERATOR_MIN_ELEMENTS (2**16) elements. Below that the CPU bench takes tens of
   microseconds, about what copying the inputs over, setting and checking the switches
   (~0.1 ms) and copying the outputs back cost.
7. PYTEST_MSPROBE_BENCH=cpu keeps every bench on the CPU (the behaviour before).

Where the bench ran is in every accelerator run's verdict: its reference text (the
`msprobe_reference` property, the records' `reference`) ends with "bench on cuda:0 in
float32, TF32 and reduced-precision reductions off" or "bench on the CPU" and why.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

from pytest_msprobe.private_apis import npu_option

if TYPE_CHECKING:
    import torch

#: what reads a precision setting's owner: a torch.backends module or settings object,
#: whose attributes torch adds at run time. Any: no stub declares them
Owner: TypeAlias = Callable[[], Any]
#: a precision setting's value: a flag (allow_tf32) or a level ("highest", "ieee")
Setting: TypeAlias = bool | str

ENV_BENCH = "PYTEST_MSPROBE_BENCH"
#: rule 6: smaller calls keep the CPU bench
ACCELERATOR_MIN_ELEMENTS = 1 << 16
ACCELERATOR_LABEL = "float32, TF32 and reduced-precision reductions off"
_FALSE_ENV = ("", "0", "false", "off", "no", "n")
#: the reduced float32 modes of torch's fp32_precision API
_REDUCED = ("tf32", "bf16")


class StrictFloat32Refused(Exception):
    """The accelerator could not be made to compute in strict float32."""


@dataclass(frozen=True)
class Switch:
    """One precision setting of a backend: how to read and set it, and the value the
    bench needs."""

    name: str
    get: Callable[[], Setting]
    set: Callable[[Any], None]  # Any: each setter takes its own kind of value (a bool, a str)
    strict: Setting


def _attr_switch(owner: Owner, path: str, attribute: str, strict: Setting) -> Switch:
    return Switch(
        f"{path}.{attribute}",
        lambda: getattr(owner(), attribute),
        lambda value: setattr(owner(), attribute, value),
        strict,
    )


@functools.cache
def cuda_switches() -> list[Switch]:
    """(Cached: each switch reads and sets its attribute anew.)"""
    import torch

    matmul = lambda: torch.backends.cuda.matmul
    switches = [
        _attr_switch(matmul, "torch.backends.cuda.matmul", "allow_tf32", False),
        _attr_switch(lambda: torch.backends.cudnn, "torch.backends.cudnn", "allow_tf32", False),
        Switch(
            "torch.get_float32_matmul_precision()",
            torch.get_float32_matmul_precision,
            torch.set_float32_matmul_precision,
            "highest",
        ),
        _attr_switch(matmul, "torch.backends.cuda.matmul", "allow_fp16_reduced_precision_reduction", False),
        _attr_switch(matmul, "torch.backends.cuda.matmul", "allow_bf16_reduced_precision_reduction", False),
    ]
    if _has(matmul, "allow_fp16_accumulation"):
        switches.append(_attr_switch(matmul, "torch.backends.cuda.matmul", "allow_fp16_accumulation", False))
    return switches


@functools.cache
def _fp32_precision_api() -> list[tuple[str, Owner]]:
    """(name, owner) of each fp32_precision setting of torch's newer API, parents first
    (empty on a torch without it)."""
    import torch

    backends = torch.backends
    owners = [
        ("torch.backends", lambda: backends),
        ("torch.backends.cuda.matmul", lambda: backends.cuda.matmul),
        ("torch.backends.cudnn", lambda: backends.cudnn),
        # conv and rnn: torch's newer API, which its type stubs do not declare yet
        ("torch.backends.cudnn.conv", lambda: backends.cudnn.conv),  # type: ignore[attr-defined]
        ("torch.backends.cudnn.rnn", lambda: backends.cudnn.rnn),
    ]
    return [(name, owner) for name, owner in owners if _has(owner, "fp32_precision")]


@functools.cache
def npu_switches() -> list[Switch]:
    import torch

    return [
        # torch.npu: added to torch by torch_npu, which has no type information
        _attr_switch(lambda: torch.npu.matmul, "torch.npu.matmul", "allow_hf32", False),  # type: ignore[attr-defined]
        _attr_switch(lambda: torch.npu.conv, "torch.npu.conv", "allow_hf32", False),  # type: ignore[attr-defined]
    ]


def _npu_precision_mode() -> str:
    value = npu_option("ACL_PRECISION_MODE")
    return value.decode() if isinstance(value, bytes) else str(value)


SWITCHES: dict[str, Callable[[], list[Switch]]] = {"cuda": cuda_switches, "npu": npu_switches}


def _has(owner: Owner, attribute: str) -> bool:
    try:
        getattr(owner(), attribute)
    except Exception:  # noqa: BLE001 - absent, or unreadable in this state
        return False
    return True


def _fp32_precision_of(owner: Owner) -> Callable[[], Setting]:
    """A reader of the owner's fp32_precision setting (one reader per owner)."""
    return lambda: owner().fp32_precision


def _read(get: Callable[[], Setting]) -> tuple[bool, object]:
    try:
        return True, get()
    except Exception as exc:  # noqa: BLE001 - e.g. torch refusing a legacy read after a mixed new-API setting
        return False, exc


def problems(
    backend_name: str, switches: list[Switch], strict: str = "after setting it to", float32: bool = True
) -> list[str]:
    """Why the accelerator does not compute in strict float32 now ([] : it does): each of
    `switches` that departs from its strict value (worded `<name> is <value> <strict>
    <its strict value>`) and, with `float32`, the settings beside them that lower
    float32 alone (the fp32_precision API, the TF32 override variables, the ACL
    precision mode)."""
    found = [problem for switch in switches for problem in _departs(switch, strict)]
    if float32:
        found += _FLOAT32_ALONE.get(backend_name, list)()
    return found


def _departs(switch: Switch, strict: str) -> list[str]:
    """The switch's departure from its strict value ([] : none), or why it cannot be read."""
    ok, value = _read(switch.get)
    if not ok:
        return [f"{switch.name} cannot be read ({type(value).__name__}: {value})"]
    if value != switch.strict:
        return [f"{switch.name} is {value!r} {strict} {switch.strict!r}"]
    return []


def _cuda_float32() -> list[str]:
    """CUDA's settings that lower float32 alone: the fp32_precision API and the TF32
    override variables."""
    found = []
    for name, owner in _fp32_precision_api():
        ok, value = _read(_fp32_precision_of(owner))
        if not ok or value in _REDUCED:
            found.append(f"{name}.fp32_precision is {value!r}")
    for variable in ("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "NVIDIA_TF32_OVERRIDE"):
        value = os.environ.get(variable)
        if value is not None and value.strip().lower() not in _FALSE_ENV:
            found.append(f"{variable}={value} overrides the TF32 switches")
    return found


def _npu_float32() -> list[str]:
    """The NPU's setting that lowers float32 alone: the ACL precision mode."""
    ok, mode = _read(_npu_precision_mode)
    if ok and mode == "must_keep_origin_dtype":
        return []
    return [
        f"the ACL precision mode is {mode if ok else 'unreadable'}, not must_keep_origin_dtype "
        "(float32 matrix operators may run in float16): set torch_npu.npu.set_option("
        "{'ACL_PRECISION_MODE': 'must_keep_origin_dtype'}) for the accelerator bench"
    ]


#: The settings beside the switches that lower float32 alone, by backend (others: none).
_FLOAT32_ALONE: dict[str, Callable[[], list[str]]] = {"cuda": _cuda_float32, "npu": _npu_float32}


#: The dtype whose results each switch lowers (by the last part of its name): TF32 and
#: HF32 round float32 inputs to 10 mantissa bits; a reduced-precision reduction keeps a
#: float16/bfloat16 GEMM's partial sums in that type.
LOWERS: dict[str, str] = {
    "allow_tf32": "float32",
    "get_float32_matmul_precision()": "float32",
    "allow_hf32": "float32",
    "allow_fp16_reduced_precision_reduction": "float16",
    "allow_fp16_accumulation": "float16",
    "allow_bf16_reduced_precision_reduction": "bfloat16",
}


def lowered_precision(backend_name: str, dtypes: set[str]) -> list[str]:
    """The device's own settings that compute `dtypes` below their precision, as its run
    had them (the device run keeps the user's settings; torch's defaults turn TF32 on for
    cuDNN's float32 convolutions and RNNs and reduced-precision reductions on for 16-bit
    GEMMs). A failing call names them: measured on an H200 under the defaults, a float32
    LSTM was 2.7e-4 off on average, 5.9e-6 with TF32 off (studies/verdicts-on-a-cuda-gpu.md)."""
    switches = SWITCHES.get(backend_name)
    if switches is None:
        return []
    chosen = [switch for switch in switches() if LOWERS[switch.name.rsplit(".", 1)[-1]] in dtypes]
    return problems(backend_name, chosen, "where strict is", float32="float32" in dtypes)


@contextlib.contextmanager
def strict_float32(backend_name: str) -> Iterator[None]:
    """Inside: the accelerator computes float32 in float32 (rule 5), checked on entry
    (StrictFloat32Refused otherwise). Every setting is restored on exit, the newer
    fp32_precision API's last (it holds the TF32 state exactly where legacy reads may
    raise)."""
    switches = SWITCHES[backend_name]()
    saved = [(switch, _read(switch.get)) for switch in switches]
    saved_api = [
        (owner, _read(_fp32_precision_of(owner)))
        for _, owner in (_fp32_precision_api() if backend_name == "cuda" else [])
    ]
    try:
        for switch in switches:
            with contextlib.suppress(Exception):  # a setter that fails is reported by the read-back below
                switch.set(switch.strict)
        found = problems(backend_name, switches)
        if found:
            raise StrictFloat32Refused("; ".join(found))
        yield
    finally:
        for switch, (ok, value) in saved:
            if ok:
                with contextlib.suppress(Exception):
                    switch.set(value)
        for owner, (ok, value) in saved_api:
            if ok:
                with contextlib.suppress(Exception):
                    owner().fp32_precision = value


def float32_bench(dtypes: dict[torch.dtype, torch.dtype], floating_inputs: set[torch.dtype]) -> bool:
    """Rule 2: the raised bench gets float32 for every floating input (and float16 or
    bfloat16 is among them)."""
    import torch

    low = {torch.float16, torch.bfloat16}
    return (
        bool(dtypes)
        and bool(floating_inputs & low)
        and all(dtypes.get(dtype, dtype) == torch.float32 for dtype in floating_inputs)
    )


@dataclass(frozen=True)
class BenchSite:
    """Where one call's bench runs: the accelerator (`accelerator` True: run it inside
    strict_float32) or the CPU; `label` goes into the verdict's reference text ('' on a
    CPU device, where the bench is always the CPU)."""

    accelerator: bool
    label: str


@dataclass(frozen=True)
class BenchCall:
    """What rules 2, 3, 4 and 6 read of one call."""

    api_name: str  # as the verdict names it (`NPU.` for a fused operator)
    dtypes: dict[torch.dtype, torch.dtype]  # input dtype -> the bench's (replay.bench_dtypes)
    floating_inputs: set[torch.dtype]
    standard: str  # the standard judging its float16/bfloat16 outputs ("" where it has none)
    elements: int  # how many its floating inputs hold


def bench_site(backend_name: str, device: str, call: BenchCall) -> BenchSite:
    """Rules 1-7 for one call (device: the accelerator as the verdict names it)."""
    if backend_name not in SWITCHES:
        return BenchSite(False, "")
    cpu = "bench on the CPU"
    if os.environ.get(ENV_BENCH, "").strip().lower() == "cpu":
        return BenchSite(False, f"{cpu} ({ENV_BENCH}=cpu)")
    if not float32_bench(call.dtypes, call.floating_inputs):
        import torch

        raised = {call.dtypes.get(dtype, dtype) for dtype in call.floating_inputs}
        return BenchSite(
            False, f"{cpu} in float64" if torch.float64 in raised else cpu if call.dtypes else f"{cpu} (not raised)"
        )
    if call.api_name.startswith("NPU."):
        return BenchSite(False, f"{cpu} (an NPU fused operator's reference)")
    if call.standard == "binary_consistency":
        return BenchSite(False, f"{cpu} (binary consistency)")
    if call.elements < ACCELERATOR_MIN_ELEMENTS:
        return BenchSite(False, f"{cpu} (a small call)")
    refused = strict_float32_refusal(backend_name)
    if refused is not None:
        return BenchSite(False, f"{cpu}: strict float32 refused on {device}: {refused}")
    return BenchSite(True, f"bench on {device} in {ACCELERATOR_LABEL}")


def strict_float32_refusal(backend_name: str) -> str | None:
    """Why the accelerator cannot compute strict float32 now (None: it can): every
    switch set, read back and restored, as around a bench run."""
    try:
        with strict_float32(backend_name):
            return None
    except StrictFloat32Refused as exc:
        return str(exc)
