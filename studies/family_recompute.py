"""Recomputing a dump by a library family: the copy of a tensor dump whose outputs (and,
where the family differentiates, input gradients) a real library computed on the dumped
inputs, for studies/library_families.py, which judges the copies.

Kept apart from the harness so that its single-run plugin (family_device.py) takes the
same raising and rounding of 16-bit values as the copies do.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

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
        except Exception as exc:  # noqa: BLE001 - a family that cannot compute the call: it keeps the dump's output
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
