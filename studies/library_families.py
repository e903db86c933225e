r"""Library families as devices: are the verdicts true between two correct libraries?

Why
---
Every real use of the plugin compares two libraries: CANN's (or cuDNN's) kernels on the
device against ATen's on the CPU. studies/kernel_diversity.py calibrated the rules on
ATen's own paths, which share ATen's formulas and math library. Here other real libraries
stand in for the device: for each tensor dump, a copy is written whose forward outputs are
recomputed by a library on the dumped inputs (and, where the library differentiates, whose
backward input-gradients are recomputed from the dumped incoming gradient), and the plugin
judges the copy with ``--msprobe-offline``: the copy's outputs are the device result, the
CPU bench and the reference run in the dump's dtype judge them. A correct library must get
0 errors and 0 warnings; every one it gets is a false alarm.

Families
--------
* ``jax``: JAX/XLA's CPU kernels (studies/families_jax.py: one jax function per API),
  forward and backward (jax.vjp);
* ``onnxruntime``: ONNX Runtime's CPU kernels (studies/families_onnx.py: one ONNX graph
  per API, built with onnx.helper), forward only;
* ``inductor``: torch.compile (Inductor's generated C++ kernels) of the single call,
  forward and backward (AOTAutograd);
* ATen's own paths (ATEN_CPU_CAPABILITY, OMP_NUM_THREADS): kernel_diversity.py runs them
  (``--aten`` runs it on the same dumps, offline, and adds its matrix).

16-bit calls are computed as correct accelerator kernels do: inputs raised to float32,
computed in float32, rounded once (to nearest) to the dump's dtype (jax, onnxruntime;
Inductor does so itself). An API a family has no equivalent for, a call it fails on, or
a backward whose dumped gradients are not the inputs' (msprobe records composite calls'
backward at an inner node: linear, cross_entropy, ...) keeps its dumped (ATen) output and
is counted as "not recomputed": no verdict mixes two libraries silently, and the errors
and warnings are split between recomputed and kept directions.

It reads each run's ``accuracy_checking_result_*.csv`` (counts, messages) and
``accuracy_checking_metrics_*.jsonl`` (bias_ulp, scale_bias_ulp and their z per output:
the measured biases of each family, per API and dtype).

Example::

    python studies/library_families.py --families jax onnxruntime inductor \
        --markdown studies/correct-kernels-of-other-libraries.md
    python studies/library_families.py --families jax --only Functional.gelu Torch.tanh \
        --write-dumps tests/dumps/families tests/dumps/models/apizoo_tensor_fp32
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from kernel_diversity import EXTRA_DUMPS, RunResult, count_statuses, pytest_command, result_csv, to_markdown

from pytest_msprobe.dump.values import DecodeContext, decode

REPO = Path(__file__).resolve().parent.parent
MAX_ELEMENTS = 1 << 30
SIXTEEN_BIT = (torch.float16, torch.bfloat16)

#: APIs whose backward msprobe records at an inner autograd node of a composite (the
#: offline judge recovers their inputs' gradients elsewhere): their dumped gradients are not
#: the inputs', so no family recomputes them (judge/offline/dumped_run.py, README "Offline backward")
INNER_NODE_BACKWARD = frozenset(
    {
        "Functional.linear",
        "Functional.cross_entropy",
        "Functional.rms_norm",
        "Functional.normalize",
        "Functional.cosine_similarity",
        "Functional.pairwise_distance",
        "Functional.cosine_embedding_loss",
        "Functional.instance_norm",
        "Functional.max_pool1d",
        "Torch.einsum",
        "Torch.gru",
        "Torch.lstm",
    }
)


# --- the families -----------------------------------------------------------------------


@dataclass(frozen=True)
class Family:
    """A library that recomputes calls: its API table, forward, and backward where it
    differentiates. `raised`: it is given 16-bit tensors raised to float32 (numpy) and its
    results are rounded once to the dump's dtype; else it runs on torch tensors itself."""

    name: str
    table: Callable[[], frozenset[str]]
    forward: Callable[[str, list[Any], dict[str, Any]], tuple[Any, ...]]
    backward: Callable[[str, list[Any], dict[str, Any], list[tuple[str, Any]], list[Any]], list[Any]] | None
    raised: bool


def _jax_family() -> Family:
    import families_jax

    return Family(
        "jax", lambda: frozenset(families_jax.TABLE), families_jax.forward, families_jax.backward, raised=True
    )


def _onnx_family() -> Family:
    import families_onnx

    return Family("onnxruntime", lambda: frozenset(families_onnx.TABLE), families_onnx.forward, None, raised=True)


def _inductor_family() -> Family:
    return Family("inductor", _pytorch_apis, inductor_forward, inductor_backward, raised=False)


def _dumped_family() -> Family:
    """The control: recomputes nothing, so the copy is the shipped dump (ATen's outputs)."""

    def nothing(*_: Any) -> Any:
        raise AssertionError("the control recomputes nothing")

    return Family("dumped", frozenset, nothing, None, raised=False)


FAMILIES: dict[str, Callable[[], Family]] = {
    "jax": _jax_family,
    "onnxruntime": _onnx_family,
    "inductor": _inductor_family,
    "dumped": _dumped_family,
}


def _pytorch_apis() -> frozenset[str]:
    """Inductor compiles any PyTorch API (a graph break runs eagerly)."""
    return frozenset({"*"})


@functools.cache
def _compiled(api: str) -> Callable[..., Any]:
    """The call's torch function, compiled by Inductor once per API (recompiled per shape)."""
    import torch._dynamo

    from pytest_msprobe.dump.index import parse_call_name
    from pytest_msprobe.run.apis import resolve_pytorch

    torch._dynamo.config.cache_size_limit = 256
    name = parse_call_name(f"{api}.0.forward")
    if name is None:
        raise ValueError(f"not a call name: {api}")
    return torch.compile(own_code(resolve_pytorch(name, None).device_fn, api), dynamic=False, fullgraph=True)


def own_code(function: Callable[..., Any], api: str) -> Callable[..., Any]:
    """function behind a wrapper with a code object of its own. Dynamo keeps its compiled
    graphs on the code object it is given; torch.compile of a builtin (torch.Tensor.sum,
    torch.erf) wraps it in one shared code object, so in one process a second builtin reused
    the first one's graphs: Tensor.sum ran as Tensor.mean (measured: relative error 1 - 1/32)."""

    def call(*args: Any, **kwargs: Any) -> Any:
        return function(*args, **kwargs)

    call.__code__ = call.__code__.replace(co_name=re.sub(r"\W", "_", api), co_filename=f"<inductor {api}>")
    return call


def inductor_forward(api: str, args: list[Any], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    with torch.no_grad():
        result = _compiled(api)(*args, **kwargs)
    return tuple(result) if isinstance(result, (tuple, list)) else (result,)


def inductor_backward(
    api: str, args: list[Any], kwargs: dict[str, Any], wrt: list[tuple[str, Any]], cotangents: list[Any]
) -> list[Any]:
    args, kwargs = list(args), dict(kwargs)
    leaves = []
    for where, key in wrt:
        holder: Any = args if where == "args" else kwargs
        holder[key] = holder[key].detach().requires_grad_(True)
        leaves.append(holder[key])
    result = _compiled(api)(*args, **kwargs)
    outputs = list(result) if isinstance(result, (tuple, list)) else [result]
    pairs = [
        (o, c) for o, c in zip(outputs, cotangents, strict=True) if isinstance(o, torch.Tensor) and o.requires_grad
    ]
    grads = torch.autograd.grad([o for o, _ in pairs], leaves, [c for _, c in pairs], allow_unused=True)
    return [torch.zeros_like(leaf) if g is None else g for g, leaf in zip(grads, leaves, strict=True)]


# --- tensors in and out -----------------------------------------------------------------


def raised(value: Any) -> Any:
    """torch tensors (nested in lists/dicts) as numpy arrays, 16-bit ones raised to float32."""
    if isinstance(value, torch.Tensor):
        tensor = value.detach()
        return (tensor.float() if tensor.dtype in SIXTEEN_BIT else tensor).numpy()
    if isinstance(value, (list, tuple)):
        return type(value)(raised(item) for item in value)
    if isinstance(value, dict):
        return {key: raised(item) for key, item in value.items()}
    if isinstance(value, torch.dtype | torch.Size):
        return list(value) if isinstance(value, torch.Size) else value
    return value


def rounded(result: Any, dtype: torch.dtype) -> torch.Tensor:
    """A family's result as a torch tensor of the dump's dtype: rounded once, to nearest."""
    tensor = result if isinstance(result, torch.Tensor) else torch.from_numpy(np.array(result))  # a copy: 0-d stays 0-d
    return tensor.detach().to(dtype).contiguous()


def statistics(tensor: torch.Tensor) -> dict[str, Any]:
    """msprobe's Max/Min/Mean/Norm of a tensor, as dump.json records them."""
    if tensor.numel() == 0:
        return {"Max": None, "Min": None, "Mean": None, "Norm": None}
    if tensor.dtype == torch.bool:
        return {"Max": bool(tensor.any()), "Min": bool(tensor.all()), "Mean": None, "Norm": None}
    if not tensor.dtype.is_floating_point:
        return {"Max": int(tensor.max()), "Min": int(tensor.min()), "Mean": None, "Norm": None}
    wide = tensor.double()
    return {"Max": wide.max().item(), "Min": wide.min().item(), "Mean": wide.mean().item(), "Norm": wide.norm().item()}


def is_tensor_record(value: Any) -> bool:
    return isinstance(value, dict) and value.get("type") == "torch.Tensor" and bool(value.get("data_name"))


def grad_slots(forward: dict[str, Any], backward: dict[str, Any]) -> list[tuple[tuple[str, Any], int]] | None:
    """Which recorded gradient (backward "output" index) is which input's (("args", i) or
    ("kwargs", key)): the floating inputs that required gradients, in order, paired with the
    recorded gradients that are not null, where their count, shapes and dtypes all agree;
    None where they do not (the record is an inner node's)."""
    inputs = [(("args", i), v) for i, v in enumerate(forward.get("input_args", []))]
    inputs += [(("kwargs", k), v) for k, v in forward.get("input_kwargs", {}).items()]
    wanted = [(key, v) for key, v in inputs if is_tensor_record(v) and v.get("requires_grad") and "float" in v["dtype"]]
    recorded = [(i, g) for i, g in enumerate(backward.get("output", [])) if g is not None]
    if not wanted or len(wanted) != len(recorded) or not all(is_tensor_record(g) for _, g in recorded):
        return None
    if any(
        v["shape"] != g["shape"] or v["dtype"] != g["dtype"] for (_, v), (_, g) in zip(wanted, recorded, strict=True)
    ):
        return None
    return [(key, i) for (key, _), (i, _) in zip(wanted, recorded, strict=True)]


# --- recomputing one dump ---------------------------------------------------------------


@dataclass
class Recomputed:
    """One direction of one call in a family's copy: recomputed, or kept and why."""

    call: str
    direction: str
    api: str
    dtype: str
    recomputed: bool
    reason: str = ""


@dataclass
class DumpCopy:
    """A dump's copy whose outputs a family recomputed."""

    folder: Path
    entries: list[Recomputed] = field(default_factory=list)

    def recomputed(self, call: str, direction: str) -> bool:
        return any(e.recomputed for e in self.entries if e.call == call and e.direction == direction)


def api_of(name: str) -> tuple[str, str, str] | None:
    """(api, call, direction) of a dump.json key; None for Module./Cell. entries."""
    if name.startswith(("Module.", "Cell.")):
        return None
    call, direction = name.rsplit(".", 1)
    return call.rsplit(".", 1)[0], call, direction


def output_dtype(forward: dict[str, Any]) -> str:
    """The dtype of a forward record's first floating output (else its first tensor's), short:
    the dtype a call's rows are reported under."""
    tensors = [v for v in forward.get("output", []) if is_tensor_record(v)]
    floats = [v for v in tensors if "float" in v["dtype"]]
    chosen = (floats or tensors or [{"dtype": "none"}])[0]
    return str(chosen["dtype"]).removeprefix("torch.")


def write_all(folder: Path, results: list[tuple[str, dict[str, Any], Any]]) -> str:
    """Round each (label, record, result) to its record's dtype and write them over the
    dumped tensors, with their statistics into the records: all of them, or none where a
    shape differs ('' or why not)."""
    written = []
    for label, record, result in results:
        tensor = rounded(result, torch_dtype_of(record))
        if list(tensor.shape) != list(record["shape"]):
            return f"{label}: shape {list(tensor.shape)}, the dump's {record['shape']}"
        written.append((record, tensor))
    for record, tensor in written:
        torch.save(tensor.clone(), folder / "dump_tensor_data" / record["data_name"])
        record.update(statistics(tensor))
    return ""


def family_inputs(family: Family, value: Any) -> Any:
    return raised(value) if family.raised else value


def recompute_forward(family: Family, folder: Path, entry: Recomputed, record: dict[str, Any]) -> str:
    """Recompute a forward call's outputs in place (folder is the copy); '' or why not."""
    api, call = entry.api, entry.call
    outputs = record.get("output", [])
    targets = [(i, v) for i, v in enumerate(outputs) if is_tensor_record(v)]
    if not targets:
        return "no tensor output"
    ctx = DecodeContext(folder / "dump_tensor_data", "tensor", call, MAX_ELEMENTS)
    args = [decode(v, ctx, f"input_args[{i}]") for i, v in enumerate(record.get("input_args", []))]
    kwargs = {k: decode(v, ctx, f"input_kwargs[{k!r}]") for k, v in record.get("input_kwargs", {}).items()}
    results = family.forward(api, family_inputs(family, args), family_inputs(family, kwargs))
    if len(results) <= targets[-1][0]:
        return f"the family returned {len(results)} outputs, the dump records {len(outputs)}"
    return write_all(folder, [(f"output {i}", value, results[i]) for i, value in targets])


def torch_dtype_of(value: dict[str, Any]) -> torch.dtype:
    from pytest_msprobe.dump.tensors import torch_dtype

    return torch_dtype(value["dtype"])


def recompute_backward(
    family: Family, folder: Path, entry: Recomputed, forward: dict[str, Any], record: dict[str, Any]
) -> str:
    """Recompute a backward call's input gradients in place; '' or why not."""
    api, call = entry.api, entry.call
    if family.backward is None:
        return "the family does not differentiate"
    if api in INNER_NODE_BACKWARD:
        return "msprobe records an inner node's gradients (a composite call)"
    slots = grad_slots(forward, record)
    if slots is None:
        return "the recorded gradients are not the inputs' (count, shape or dtype differ)"
    ctx = DecodeContext(folder / "dump_tensor_data", "tensor", call, MAX_ELEMENTS)
    args = [decode(v, ctx, f"input_args[{i}]") for i, v in enumerate(forward.get("input_args", []))]
    kwargs = {k: decode(v, ctx, f"input_kwargs[{k!r}]") for k, v in forward.get("input_kwargs", {}).items()}
    incoming = [decode(v, ctx, f"backward.input[{i}]") for i, v in enumerate(record.get("input", []))]
    outputs = forward.get("output", [])
    if any(g is not None for g in incoming[len(outputs) :]):
        return "incoming gradients for outputs the forward record lacks"
    cotangents = [cotangent(out, incoming[i] if i < len(incoming) else None) for i, out in enumerate(outputs)]
    wrt = [key for key, _ in slots]
    grads = family.backward(
        api, family_inputs(family, args), family_inputs(family, kwargs), wrt, family_inputs(family, cotangents)
    )
    return write_all(
        folder,
        [(f"gradient {index}", record["output"][index], grad) for (_, index), grad in zip(slots, grads, strict=True)],
    )


def cotangent(output: Any, grad: Any) -> Any:
    """The incoming gradient of one forward output: the dumped one, else zeros of its shape."""
    if isinstance(grad, torch.Tensor):
        return grad
    if is_tensor_record(output) and "float" in output["dtype"]:
        return torch.zeros(output["shape"], dtype=torch_dtype_of(output))
    return None


def recompute_dump(family: Family, source: Path, target: Path, only: frozenset[str] = frozenset()) -> DumpCopy:
    """Copy source to target and recompute every call the family can (only: those APIs)."""
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(source, target)
    document = json.loads((target / "dump.json").read_text(encoding="utf-8"))
    data = document["data"]
    table = family.table()
    copy = DumpCopy(target)
    for name, record in data.items():
        parsed = api_of(name)
        if parsed is None:
            continue
        api, call, direction = parsed
        entry = Recomputed(call, direction, api, output_dtype(data.get(f"{call}.forward", record)), False)
        copy.entries.append(entry)
        if only and api not in only:
            entry.reason = "not selected (--only)"
            continue
        if api not in table and "*" not in table:
            entry.reason = f"no {family.name} equivalent"
            continue
        if api.endswith("_") and not api.endswith("__"):
            entry.reason = "in place"
            continue
        try:
            if direction == "forward":
                entry.reason = recompute_forward(family, target, entry, record)
            else:
                entry.reason = recompute_backward(family, target, entry, data.get(f"{call}.forward", {}), record)
        except Exception as exc:  # a family that cannot compute the call: it keeps the dump's output
            entry.reason = (
                f"{family.name} failed: {type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
            )
        entry.recomputed = entry.reason == ""
    (target / "dump.json").write_text(json.dumps(document, indent=1), encoding="utf-8")
    return copy


def prune(copy: DumpCopy, only: frozenset[str], max_index: int) -> None:
    """Keep only the entries of the selected APIs whose call index is below max_index, and
    their tensor files: a small family-made dump to ship in tests/."""
    path = copy.folder / "dump.json"
    document = json.loads(path.read_text(encoding="utf-8"))
    kept = {}
    for name, record in document["data"].items():
        parsed = api_of(name)
        if parsed and (not only or parsed[0] in only) and int(parsed[1].rsplit(".", 1)[1]) < max_index:
            kept[name] = record
    document["data"] = kept
    path.write_text(json.dumps(document, indent=1), encoding="utf-8")
    text = path.read_text(encoding="utf-8")
    for file in (copy.folder / "dump_tensor_data").iterdir():
        if f'"{file.name}"' not in text:
            file.unlink()
    for extra in ("construct.json", "stack.json"):
        (copy.folder / extra).unlink(missing_ok=True)
    copy.entries = [e for e in copy.entries if f"{e.call}.{e.direction}" in kept]


# --- judging a copy ---------------------------------------------------------------------


#: single-run: the plugin that makes the family the device under test (the dumped outputs
#: play no part: the device reruns each call); a family without one has no single-run mode
SINGLE_RUN_PLUGIN = {"jax": ["-p", "family_device"], "inductor": ["-p", "compiled_kernels"]}


def judge(copy: DumpCopy, label: str, mode: str, family: str) -> tuple[RunResult, pd.DataFrame]:
    """Run the plugin on the copy (offline or single-run) and count its result CSV; the
    metrics file's rows come back too."""
    out = copy.folder.parent / f"{copy.folder.name}.out.{mode}"
    shutil.rmtree(out, ignore_errors=True)
    result = RunResult(
        dump=label, mode=mode, device=family, reference="CPU in the dump's dtype" if mode == "offline" else "none"
    )
    started = time.perf_counter()
    command = pytest_command(copy.folder / "dump.json", out, mode == "offline") + (
        SINGLE_RUN_PLUGIN[family] if mode == "single" else []
    )
    env = {**os.environ, "PYTHONPATH": str(REPO / "benchmarks"), "MSPROBE_COMPILED": "device"}
    proc = subprocess.run(command, check=False, cwd=copy.folder.parent, capture_output=True, text=True, env=env)
    result.seconds = time.perf_counter() - started
    result.exit_status = proc.returncode
    (out.parent / f"{copy.folder.name}.{mode}.log").write_text(proc.stdout + proc.stderr, encoding="utf-8")
    csv_path = result_csv(out)
    if csv_path is None:
        result.note = f"no result CSV (exit {proc.returncode}): {proc.stderr[-300:]}"
        return result, pd.DataFrame()
    frame = pd.read_csv(csv_path, encoding="utf-8-sig", dtype=str, keep_default_na=False)
    count_statuses(frame, result)
    metrics = sorted(out.glob("accuracy_checking_metrics_*.jsonl"))
    return result, (pd.read_json(metrics[-1], lines=True) if metrics and metrics[-1].stat().st_size else pd.DataFrame())


def default_dumps() -> list[Path]:
    """The calibration tensor dumps (tests/dumps/models/*_tensor_*) and examples/."""
    models = sorted(p for p in (REPO / "tests/dumps/models").glob("*_tensor_*") if (p / "dump.json").exists())
    return models + [REPO / extra for extra in EXTRA_DUMPS if extra.startswith("examples/")]


def bias_rows(metrics: pd.DataFrame, copy: DumpCopy, family: str, dump: str) -> pd.DataFrame:
    """The measured biases of the recomputed outputs (kernel rows and kept calls left out)."""
    if metrics.empty or "bias_ulp" not in metrics:
        return pd.DataFrame()
    recomputed = {(e.call, e.direction) for e in copy.entries if e.recomputed}
    rows = metrics[[(c, d) in recomputed for c, d in zip(metrics["call"], metrics["direction"], strict=True)]].copy()
    rows = rows[rows["bias_ulp"].notna()]
    rows["family"], rows["dump"] = family, dump
    rows["api"] = rows["call"].str.rsplit(".", n=1).str[0]
    keep = [
        "family",
        "dump",
        "api",
        "call",
        "direction",
        "name",
        "device_dtype",
        "status",
        "bias_ulp",
        "bias_z",
        "scale_bias_ulp",
        "scale_bias_z",
    ]
    keep += [c for c in ("ref_bias_ulp", "ref_bias_z", "ref_scale_bias_ulp", "ref_scale_bias_z") if c in rows]
    return rows[keep]


def bias_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Per family, API, dtype and direction: outputs, and the range of each bias and z."""
    if rows.empty:
        return rows
    grouped = rows.groupby(["family", "api", "device_dtype", "direction"])
    table = grouped.agg(
        outputs=("bias_ulp", "size"),
        bias_ulp_min=("bias_ulp", "min"),
        bias_ulp_max=("bias_ulp", "max"),
        bias_z_max=("bias_z", lambda z: z.abs().max()),
        scale_bias_ulp_min=("scale_bias_ulp", "min"),
        scale_bias_ulp_max=("scale_bias_ulp", "max"),
        scale_bias_z_max=("scale_bias_z", lambda z: z.abs().max()),
    ).reset_index()
    return table.round(3)


CALL_NAME = re.compile(r"\b(?:Functional|Tensor|Torch|VF|Aten|NPU)\.[A-Za-z_][\w]*\.\d+\b")


def provenance(copy: DumpCopy, call: str, direction: str, message: str) -> str:
    """recomputed: the family wrote the judged outputs; kept: ATen's dumped ones; mixed: a
    kept direction judged through the dump's data flow with gradients the family recomputed
    (the offline judge sums other calls' recorded gradients with it)."""
    if copy.recomputed(call, direction):
        return "recomputed"
    others = {name for name in CALL_NAME.findall(message) if name != call}
    return "mixed" if any(copy.recomputed(other, "backward") for other in others) else "kept"


def events_frame(results: list[tuple[RunResult, DumpCopy]]) -> pd.DataFrame:
    """Every error/warning, with who wrote the outputs it judged (provenance)."""
    rows = []
    for result, copy in results:
        by_key = {(e.call, e.direction): e for e in copy.entries}
        for event in result.events:
            entry = by_key.get((event["call"], event["direction"]))
            rows.append(
                {
                    "family": result.device,
                    "dump": result.dump,
                    "mode": result.mode,
                    "call": event["call"],
                    "direction": event["direction"],
                    "dtype": entry.dtype if entry else "",
                    "outputs": provenance(copy, event["call"], event["direction"], event["message"]),
                    "status": event["status"],
                    "message": event["message"],
                }
            )
    return pd.DataFrame(
        rows, columns=["family", "dump", "mode", "call", "direction", "dtype", "outputs", "status", "message"]
    )


def matrix_row(result: RunResult, copy: DumpCopy) -> dict[str, Any]:
    """One (family, dump, mode) row: directions recomputed and the verdicts."""
    forward = [e for e in copy.entries if e.direction == "forward"]
    backward = [e for e in copy.entries if e.direction == "backward"]
    recomputed_errors = sum(
        1 for e in result.events if copy.recomputed(e["call"], e["direction"]) and e["status"] == "error"
    )
    recomputed_warnings = sum(
        1 for e in result.events if copy.recomputed(e["call"], e["direction"]) and e["status"] == "warning"
    )
    return {
        "family": result.device,
        "dump": result.dump,
        "mode": result.mode,
        "fwd recomputed": f"{sum(e.recomputed for e in forward)}/{len(forward)}",
        "bwd recomputed": f"{sum(e.recomputed for e in backward)}/{len(backward)}",
        "judged": result.judged,
        "passed": result.judged - result.errors - result.warnings,
        "errors": result.errors,
        "warnings": result.warnings,
        "errors/warnings on recomputed": f"{recomputed_errors}/{recomputed_warnings}",
        "skips": result.skips,
        "exit": result.exit_status,
        "seconds": round(result.seconds, 1),
        "note": result.note,
    }


def not_recomputed(copies: list[tuple[str, DumpCopy]]) -> pd.DataFrame:
    """Why directions were kept, per family, API and reason."""
    rows = [
        {"family": family, "api": e.api, "direction": e.direction, "reason": e.reason}
        for family, copy in copies
        for e in copy.entries
        if not e.recomputed
    ]
    frame = pd.DataFrame(rows, columns=["family", "api", "direction", "reason"])
    return frame.groupby(["family", "api", "direction", "reason"]).size().reset_index(name="directions")


def run_aten(dumps: list[Path], scratch: Path) -> pd.DataFrame:
    """kernel_diversity.py's offline matrix on the same dumps under ATen's paths."""
    table = scratch / "aten.csv"
    command = [
        sys.executable,
        str(REPO / "studies/kernel_diversity.py"),
        "--caps",
        "default",
        "avx2",
        "--threads",
        "1",
        "2",
    ]
    command += [
        "--modes",
        "offline",
        "--scratch",
        str(scratch / "aten"),
        "--csv",
        str(table),
        *(str(d.resolve()) for d in dumps),
    ]
    proc = subprocess.run(command, check=False, capture_output=True, text=True, cwd=REPO / "benchmarks")
    (scratch / "aten.log").write_text(proc.stdout + proc.stderr, encoding="utf-8")
    return (
        pd.read_csv(table)
        if table.exists()
        else pd.DataFrame({"note": [f"kernel_diversity.py exit {proc.returncode}: {proc.stderr[-300:]}"]})
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Recompute dumps' outputs with other real libraries (JAX/XLA, ONNX Runtime, Inductor) and judge them offline.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__,
    )
    parser.add_argument(
        "dumps", nargs="*", type=Path, help="tensor dump folders; default: tests/dumps/models/*_tensor_* and examples/"
    )
    parser.add_argument("--families", nargs="+", choices=sorted(FAMILIES), default=["jax", "onnxruntime", "inductor"])
    parser.add_argument(
        "--modes",
        nargs="+",
        choices=["offline", "single"],
        default=["offline"],
        help="single: the copy's bench-side replay (no family as device)",
    )
    parser.add_argument("--only", nargs="+", default=[], help="recompute only these APIs (e.g. Functional.gelu)")
    parser.add_argument(
        "--scratch", type=Path, default=Path("/tmp/library_families"), help="where the copies and runs go"
    )
    parser.add_argument(
        "--write-dumps", type=Path, help="keep the copies here (e.g. tests/dumps/families) and do not judge them"
    )
    parser.add_argument(
        "--max-index", type=int, default=1 << 30, help="with --write-dumps: keep only calls whose index is below this"
    )
    parser.add_argument(
        "--aten",
        action="store_true",
        help="also run kernel_diversity.py offline (ATen paths default/avx2 x 1/2 threads)",
    )
    parser.add_argument("--markdown", type=Path, help="write the matrix, events and bias table as markdown")
    parser.add_argument(
        "--csv-prefix", type=Path, help="write <prefix>matrix.csv, events.csv, biases.csv, bias_rows.csv"
    )
    return parser.parse_args(argv)


def dump_label(folder: Path) -> str:
    try:
        return str(folder.resolve().relative_to(REPO))
    except ValueError:
        return str(folder)


@dataclass
class _Runs:
    """What the families' copies gave: each judged run with its copy, every copy (by
    family) and the biases measured on them."""

    judged: list[tuple[RunResult, DumpCopy]] = field(default_factory=list)
    copies: list[tuple[str, DumpCopy]] = field(default_factory=list)
    biases: list[pd.DataFrame] = field(default_factory=list)


@dataclass(frozen=True)
class _Tables:
    """The report's tables: the matrix, the errors and warnings, the biases (table and
    rows), the directions not recomputed and kernel_diversity.py's ATen paths (--aten)."""

    matrix: pd.DataFrame
    events: pd.DataFrame
    biases: pd.DataFrame
    bias_rows: pd.DataFrame
    kept: pd.DataFrame
    aten: pd.DataFrame


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    dumps = args.dumps or default_dumps()
    wall = time.perf_counter()
    runs = _Runs()
    for name in args.families:
        family = FAMILIES[name]()
        for folder in dumps:
            _recompute_and_judge(args, name, family, folder, runs)
    if args.write_dumps:
        return 0
    tables = _tables(args, dumps, runs)
    wall = time.perf_counter() - wall
    _print_tables(tables, wall)
    if args.csv_prefix:
        _write_csv(args.csv_prefix, tables)
    if args.markdown:
        _write_markdown(args.markdown, tables)
    return 0 if not tables.matrix["note"].astype(bool).any() else 2


def _recompute_and_judge(args: argparse.Namespace, name: str, family: Family, folder: Path, runs: _Runs) -> None:
    """The family's copy of one dump, and (unless --write-dumps keeps it) its runs in
    each mode."""
    only = frozenset(args.only)
    root = args.write_dumps if args.write_dumps else args.scratch / name
    started = time.perf_counter()
    copy = recompute_dump(family, folder, root / f"{name}_{folder.resolve().name}", only)
    runs.copies.append((name, copy))
    done = sum(e.recomputed for e in copy.entries)
    print(
        f"{name:12s} {dump_label(folder):45s} recomputed {done}/{len(copy.entries)} directions in {time.perf_counter() - started:.1f}s",
        flush=True,
    )
    if args.write_dumps:
        prune(copy, only, args.max_index)
        return
    for mode in [m for m in args.modes if m == "offline" or name in SINGLE_RUN_PLUGIN]:
        result, metrics = judge(copy, dump_label(folder), mode, name)
        runs.judged.append((result, copy))
        runs.biases.append(bias_rows(metrics, copy, name, dump_label(folder)))
        row = matrix_row(result, copy)
        print("   ", " ".join(f"{k}={v}" for k, v in row.items() if k not in ("family", "dump")), flush=True)


def _tables(args: argparse.Namespace, dumps: list[Path], runs: _Runs) -> _Tables:
    rows = (
        pd.concat([b for b in runs.biases if not b.empty], ignore_index=True)
        if any(not b.empty for b in runs.biases)
        else pd.DataFrame()
    )
    return _Tables(
        matrix=pd.DataFrame([matrix_row(r, c) for r, c in runs.judged]),
        events=events_frame(runs.judged),
        biases=bias_table(rows),
        bias_rows=rows,
        kept=not_recomputed(runs.copies),
        aten=run_aten(dumps, args.scratch) if args.aten else pd.DataFrame(),
    )


def _print_tables(tables: _Tables, wall: float) -> None:
    with pd.option_context(
        "display.max_rows", None, "display.width", 250, "display.max_columns", None, "display.max_colwidth", 80
    ):
        print(tables.matrix.drop(columns=["note"]).to_string(index=False))
        print(f"\n{len(tables.events)} errors/warnings")
        for event in tables.events.itertuples(index=False):
            print(
                f"- [{event.status}] {event.family} {event.dump} {event.mode} {event.call} {event.direction} {event.dtype} ({event.outputs}): {event.message}"
            )
        if not tables.aten.empty:
            print(tables.aten.to_string(index=False))
    print(f"\nwall {wall:.1f}s")


def _write_csv(prefix: Path, tables: _Tables) -> None:
    """<prefix>matrix.csv, events.csv, biases.csv, bias_rows.csv, kept.csv, aten.csv."""
    for label in ("matrix", "events", "biases", "bias_rows", "kept", "aten"):
        getattr(tables, label).to_csv(f"{prefix}{label}.csv", index=False)


def _write_markdown(path: Path, tables: _Tables) -> None:
    parts = [
        "## Matrix",
        to_markdown(tables.matrix),
        "## Errors and warnings",
        to_markdown(tables.events) if not tables.events.empty else "none",
    ]
    parts += [
        "## Biases measured on recomputed outputs",
        to_markdown(tables.biases) if not tables.biases.empty else "none",
    ]
    parts += ["## Not recomputed", to_markdown(tables.kept)]
    if not tables.aten.empty:
        parts += ["## ATen paths (kernel_diversity.py, offline)", to_markdown(tables.aten)]
    path.write_text("\n\n".join(parts) + "\n", encoding="utf-8")


if __name__ == "__main__":
    raise SystemExit(main())
