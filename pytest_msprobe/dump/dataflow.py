"""The dump's data flow: which forward output of which call a later call read.

msprobe records a composite call's backward at the autograd node that made its output:
for a linear on a batched input that is the reshape after the GEMM, and the recorded
"gradient" is the incoming one reshaped. The GEMM's own input gradient still reaches the
dump, as the incoming gradient (backward `input`) of the call that produced that input,
summed over every call that read it. To find it the dump's forward values are matched:
a call's input is a producer's output read through views the dump does not record
(reshape, transpose, split, chunk), recovered from the values themselves as a gather
index into the producer's flat output. Matching never guesses: an input found in
several unrelated outputs (constant tensors, repeated values) is named as ambiguous.

Only tensor dumps have the values; the flow is built once per dump and process, on the
first backward call that needs it, and reads each forward tensor once.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np
import torch

from pytest_msprobe.dump.tensors import TensorSpec, load_tensor, tensor_spec
from pytest_msprobe.errors import CallError, CallSkip

if TYPE_CHECKING:
    from pytest_msprobe.dump.index import DumpIndex, Record
    from pytest_msprobe.standards.dtypes import Array

#: positions in a producer's flat output, one per element of the tensor read from it
Gather: TypeAlias = "np.ndarray[Any, np.dtype[np.int64]]"

#: the integer type a floating dtype's bits are compared as, by element size
_BITS = {2: np.int16, 4: np.int32, 8: np.int64}
#: values of an input looked up in a candidate producer before the whole input is
_SAMPLES = 16


@dataclass(frozen=True)
class Port:
    """One floating tensor of a forward record: an input leaf or an output."""

    call: str  # the call's name without direction
    order: int  # the forward record's position among the dump's forward records
    data_name: str
    spec: TensorSpec
    output: int  # the position among the part's flattened values (outputs: the gradient's)


@dataclass(frozen=True)
class Read:
    """A forward input read from a producer's output: input = output.flatten()[gather]."""

    producer: Port
    consumer: Port
    gather: Gather  # the consumer's shape


@dataclass(frozen=True)
class Unsettled:
    """An input that may have read a producer's output through a view the values do
    not settle: `positions`, every element of the output holding one of its values."""

    consumer: Port
    positions: Array
    why: str


@dataclass
class _Values:
    """An output's bits, sorted once: lookups of another tensor's values in it."""

    flat: Array  # the output's bits, flat, int64
    unique: Array  # sorted distinct bits
    counts: Array
    first: Array  # each distinct value's position in `flat` (where unique)


class Ambiguous(CallSkip):
    """An input whose producer the values do not settle."""


class UnsettledView(Ambiguous):
    """An input holding values of one output, some of them held there once, that no
    strided view of it reads: a read (not a constant's coincidence) through a view the
    values do not fix."""


def _bits(tensor: torch.Tensor) -> Array:
    """The elements' bit patterns (bitwise equality: -0.0 is not 0.0, NaNs compare by
    payload), as int64. numpy: these are many small lookups, where a torch op's
    dispatch would cost more than the work."""
    flat = tensor.detach().contiguous().reshape(-1)
    width = flat.element_size()
    return flat.view(torch.uint8).numpy().view(_BITS[width]).astype(np.int64)


def _values(tensor: torch.Tensor) -> _Values:
    flat = _bits(tensor)
    unique, first, counts = np.unique(flat, return_index=True, return_counts=True)
    return _Values(flat, unique, counts, first)


def _holds(values: _Values, bits: Array) -> Array:
    """Where in `values.unique` each of `bits` is, -1 where it is absent."""
    if values.unique.size == 0:
        return np.full(bits.shape, -1)
    where = np.searchsorted(values.unique, bits).clip(max=values.unique.size - 1)
    return np.where(values.unique[where] == bits, where, -1)


def _prime_factors(size: int) -> list[int]:
    factors, divisor = [], 2
    while size > 1:
        while size % divisor == 0:
            factors.append(divisor)
            size //= divisor
        divisor += 1
    return factors


def _factor_dims(shape: tuple[int, ...], reverse: bool) -> list[int]:
    """The dims split into prime factors: a reshape of a permuted tensor is strided
    over them."""
    refined: list[int] = []
    for size in shape:
        refined += sorted(_prime_factors(size), reverse=reverse)
    return refined


def _affine_gather(shape: list[int], known: Array, single: Array, numel: int) -> Array | None:
    """The index of a strided view over `shape` that agrees with the positions `known`
    where `single` (values the producer holds once); None if those do not fix one."""
    count = known.size
    coords = np.stack(np.unravel_index(np.arange(count), shape), 1) if shape else np.zeros((count, 0), dtype=np.int64)
    step = np.ones(len(shape), dtype=np.int64)
    for axis in range(len(shape) - 2, -1, -1):
        step[axis] = step[axis + 1] * shape[axis + 1]
    strides = []
    for axis, size in enumerate(shape):
        base = np.arange(count - step[axis])
        pairs = np.flatnonzero(single[base] & single[base + step[axis]] & (coords[base, axis] < size - 1))
        if pairs.size == 0:
            return None
        first = int(base[pairs[0]])
        strides.append(int(known[first + step[axis]] - known[first]))
    anchor = int(np.flatnonzero(single)[0])
    stride = np.array(strides, dtype=np.int64)
    offset = int(known[anchor]) - int((coords[anchor] * stride).sum())
    gather: Array = offset + (coords * stride).sum(1)
    if gather.size and (int(gather.min()) < 0 or int(gather.max()) >= numel):
        return None
    return gather


def view_gather(producer: _Values, consumer: torch.Tensor) -> Array | None:
    """The gather index that reads `consumer` out of the producer's flat values, or None
    if the consumer's values are not all the producer's. Values the producer holds once
    fix their element; repeated ones are placed by the strided view that the unique
    ones span. Raises Ambiguous when repeated values leave it open."""
    bits = _bits(consumer)
    if bits.size == 0:
        return None
    where = _holds(producer, bits)
    if bool((where < 0).any()):
        return None
    single = producer.counts[where] == 1
    known: Array = producer.first[where]
    if not bool(single.all()):
        if not bool(single.any()):
            raise Ambiguous("every value it holds is repeated in the producer's output")
        first = known
        fits = (
            _affine_gather(_factor_dims(tuple(consumer.shape), reverse), first, single, producer.flat.size)
            for reverse in (False, True)
        )
        found = next(
            (gather for gather in fits if gather is not None and bool((producer.flat[gather] == bits).all())), None
        )
        if found is None:
            raise UnsettledView("it holds repeated values and no strided view of the producer's output reads it")
        known = found
    if np.unique(known).size != known.size:
        raise Ambiguous("it reads elements of the producer's output more than once (a constant or broadcast tensor)")
    gathered: Array = known.reshape(tuple(consumer.shape))
    return gathered


@dataclass
class DataFlow:
    """Producers and consumers of a tensor dump's forward values."""

    index: DumpIndex
    max_elements: int
    inputs: dict[str, Port]  # data_name -> input port, in dump order
    outputs: list[Port]  # in dump order
    by_call: dict[str, list[Port]]  # call -> its input ports
    _values: dict[str, _Values] = dataclasses.field(default_factory=dict)
    _probes: dict[str, Array] = dataclasses.field(default_factory=dict)
    _sources: dict[str, Read | Ambiguous | None] = dataclasses.field(default_factory=dict)
    _consumers: dict[str, tuple[list[Read], list[Unsettled]]] = dataclasses.field(default_factory=dict)
    _owners: dict[torch.dtype, tuple[Array, Array]] = dataclasses.field(default_factory=dict)
    _firsts: dict[torch.dtype, tuple[list[Port], Array]] = dataclasses.field(default_factory=dict)

    def tensor(self, port: Port) -> torch.Tensor:
        where = f"{port.call} {port.data_name}"
        if port.spec.numel > self.max_elements:
            raise CallSkip(
                f"{where}: {port.spec.numel:,} elements, above --msprobe-max-elements: the data flow cannot read it"
            )
        return load_tensor(self.index.tensor_dir, port.spec, where)

    def values(self, port: Port) -> _Values:
        found = self._values.get(port.data_name)
        if found is None:
            found = self._values[port.data_name] = _values(self.tensor(port))
        return found

    def _probe(self, port: Port) -> Array:
        """Values the input holds, which its producer must hold too: its recorded Max and
        Min where they are finite and non-zero (no file read; a zero's sign is not in
        the statistics), else a few of its elements spread over it; empty where it
        cannot be read (its own call names why)."""
        if port.data_name not in self._probes:
            self._probes[port.data_name] = _recorded_extremes(port.spec)
            if self._probes[port.data_name].size == 0:
                try:
                    bits = _bits(self.tensor(port))
                except (CallError, CallSkip):
                    bits = np.zeros(0, dtype=np.int64)
                spread = np.linspace(0, bits.size - 1, min(bits.size, _SAMPLES)).astype(np.int64)
                self._probes[port.data_name] = bits[spread]
        return self._probes[port.data_name]

    def _holders(self, dtype: torch.dtype, probe: Array) -> list[Port]:
        """The outputs of that dtype holding all the probe's values: its first value
        looked up in a table of every output's distinct values (made once per dtype)."""
        table = self._owners.get(dtype)
        if table is None:
            held = sum(port.spec.numel for port in self.outputs if port.spec.dtype == dtype)
            if held > self.max_elements:
                raise CallSkip(
                    f"the dump's {dtype} forward outputs hold {held:,} elements, above --msprobe-max-elements "
                    f"({self.max_elements:,}): the data flow that recovers this gradient keeps them all in memory at once; "
                    "raise the limit where the memory allows"
                )
            parts, owners = [], []
            for i, port in enumerate(self.outputs):
                if port.spec.dtype != dtype:
                    continue
                try:
                    unique = self.values(port).unique
                except (CallError, CallSkip):
                    continue  # unreadable: its own call names it
                parts.append(unique)
                owners.append(np.full(unique.size, i, dtype=np.int64))
            keys = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
            who = np.concatenate(owners) if owners else np.zeros(0, dtype=np.int64)
            order = np.argsort(keys, kind="stable")
            table = self._owners[dtype] = (keys[order], who[order])
        keys, who = table
        low, high = np.searchsorted(keys, probe[0]), np.searchsorted(keys, probe[0], side="right")
        holders = [self.outputs[int(i)] for i in who[low:high]]
        return [port for port in holders if bool((_holds(self.values(port), probe) >= 0).all())]

    def _reads(self, producer: Port, consumer: Port) -> Array | None:
        if producer.spec.dtype != consumer.spec.dtype or producer.order >= consumer.order:
            return None
        if bool((_holds(self.values(producer), self._probe(consumer)) < 0).any()):
            return None
        return view_gather(self.values(producer), self.tensor(consumer))

    def source(self, data_name: str) -> Read | None:
        """The output a forward input was read from; None where no dumped call made it
        (the model's input, a parameter, an op the dump does not hold). Raises
        Ambiguous where several unrelated outputs hold its values."""
        if data_name not in self._sources:
            try:
                self._sources[data_name] = self._source(data_name)
            except Ambiguous as exc:
                self._sources[data_name] = exc
        found = self._sources[data_name]
        if isinstance(found, Ambiguous):
            raise found
        return found

    def _source(self, data_name: str) -> Read | None:
        consumer = self.inputs.get(data_name)
        if consumer is None:
            raise CallError(f"{data_name} is not a forward input of {self.index.path}")
        probe = self._probe(consumer)
        holders = self._holders(consumer.spec.dtype, probe) if probe.size else []
        candidates = sorted((port for port in holders if port.order < consumer.order), key=lambda port: -port.order)
        found: list[tuple[Port, Array]] = []
        unsettled: list[tuple[Port, Ambiguous]] = []
        for port in candidates:
            try:
                gather = self._reads(port, consumer)
            except Ambiguous as exc:
                unsettled.append((port, exc))
                continue
            if gather is not None:
                found.append((port, gather))
        if not found and not unsettled:
            return None
        if not found:
            first, why = unsettled[0]
            raise Ambiguous(f"{consumer.call}'s input {data_name} in the output of {first.call}: {why}")
        latest, gather = found[0]
        unrelated = [port.call for port, _ in found[1:] if not self._passes_on(latest, port)]
        unrelated += [port.call for port, _ in unsettled if port.order > latest.order]
        if unrelated:
            raise Ambiguous(
                f"{consumer.call}'s input {data_name} is in the outputs of {latest.call} and of {', '.join(unrelated)}: "
                "which one it was read from is not settled by the values"
            )
        return Read(latest, consumer, gather)

    def _passes_on(self, later: Port, earlier: Port) -> bool:
        """Whether `later`'s call read `earlier`'s output (a copy, a cast to its own
        dtype: both hold the same values, and the latest one is the one read)."""
        for port in self.by_call.get(later.call, []):
            try:
                if self._reads(earlier, port) is not None:
                    return True
            except Ambiguous:
                continue
        return False

    def consumers(self, producer: Port) -> list[Read]:
        """Every forward input read from `producer` (through views), in dump order."""
        return self._readers(producer)[0]

    def find_unsettled(self, producer: Port) -> list[Unsettled]:
        """The inputs that may have read `producer` through a view the values do not
        settle: a sum of the settled readers' gradients lacks their share wherever they
        may have read."""
        return self._readers(producer)[1]

    def _readers(self, producer: Port) -> tuple[list[Read], list[Unsettled]]:
        found = self._consumers.get(producer.data_name)
        if found is None:
            found = self._consumers[producer.data_name] = self._find_consumers(producer)
        return found

    def _unsettled_view(self, producer: Port, consumer: Port) -> Unsettled | None:
        """`consumer` as an unsettled reader where it holds only the producer's values,
        one of them held there once, and no view of the producer reads it (bfloat16's
        few values repeat within h[:, 4] of a (2, 32, 8) output). A constant (every
        value repeated) or a tensor reading an element twice (a bfloat16 layer_norm
        weight whose values the output holds) is no evidence of a read."""
        try:
            self._reads(producer, consumer)
        except UnsettledView as exc:
            return Unsettled(
                consumer, np.flatnonzero(np.isin(self.values(producer).flat, _bits(self.tensor(consumer)))), str(exc)
            )
        except Ambiguous:
            return None
        return None

    def _first_probes(self, dtype: torch.dtype) -> tuple[list[Port], Array]:
        """The inputs of that dtype with a probe, and each probe's first value: one
        lookup in a producer's values picks the inputs that may read it (a deep model
        has hundreds of inputs, each looked up one by one for every producer before)."""
        found = self._firsts.get(dtype)
        if found is None:
            ports = [port for port in self.inputs.values() if port.spec.dtype == dtype and self._probe(port).size]
            firsts = np.array([self._probe(port)[0] for port in ports], dtype=np.int64)
            found = self._firsts[dtype] = (ports, firsts)
        return found

    def _find_consumers(self, producer: Port) -> tuple[list[Read], list[Unsettled]]:
        values = self.values(producer)
        ports, firsts = self._first_probes(producer.spec.dtype)
        found, unsettled = [], []
        for at in np.flatnonzero(_holds(values, firsts) >= 0):
            consumer = ports[int(at)]
            if consumer.order <= producer.order or bool((_holds(values, self._probe(consumer)) < 0).any()):
                continue
            try:
                read = self.source(consumer.data_name)
            except Ambiguous:
                maybe = self._unsettled_view(producer, consumer)
                if maybe is not None:
                    unsettled.append(maybe)
                continue  # otherwise several outputs hold its values: the latest, not this one, is its source
            if read is not None and read.producer == producer:
                found.append(read)
        return found, unsettled


def _recorded_extremes(spec: TensorSpec) -> Array:
    """The bits of the recorded Max and Min in the tensor's dtype; empty unless both are
    finite, non-zero and exactly representable there (the statistics are elements)."""
    extremes = [
        value
        for value in (spec.stats.get("Max"), spec.stats.get("Min"))
        if isinstance(value, (int, float)) and not isinstance(value, bool)
    ]
    if len(extremes) != 2 or not all(math.isfinite(value) and value for value in extremes):
        return np.zeros(0, dtype=np.int64)
    as_dtype = torch.tensor(extremes, dtype=torch.float64).to(spec.dtype)
    if as_dtype.to(torch.float64).tolist() != [float(value) for value in extremes]:
        return np.zeros(0, dtype=np.int64)
    return _bits(as_dtype)


def _ports(record: Record, call: str, order: int, key: str) -> list[Port]:
    """The floating tensors of one part of a forward record, flattened in order; each
    port's `output` is its position among all the part's flattened values."""
    found: list[Port] = []
    position = 0

    def visit(value: object, path: str) -> None:
        nonlocal position
        if isinstance(value, list):
            for i, item in enumerate(value):
                visit(item, f"{path}[{i}]")
            return
        if isinstance(value, dict) and value.get("type") is None:
            for name, item in value.items():
                visit(item, f"{path}[{name!r}]")
            return
        at, position = position, position + 1
        if isinstance(value, dict) and value.get("type") == "torch.Tensor" and value.get("data_name"):
            try:
                spec = tensor_spec(value, f"{call} {path}")
            except (CallError, CallSkip):
                return  # an unreadable record: that call's own test says so
            if spec.dtype.is_floating_point:
                found.append(Port(call, order, spec.data_name, spec, at))

    visit(record.get(key), key)
    return found


def build(index: DumpIndex, max_elements: int) -> DataFlow:
    inputs: dict[str, Port] = {}
    outputs: list[Port] = []
    by_call: dict[str, list[Port]] = {}
    order = 0
    for position, name in enumerate(index.names):
        if index.backward[position]:
            continue
        call = name.rsplit(".", 1)[0]
        record = index.read_record(index.entry_at(position))
        leaves = _ports(record, call, order, "input_args") + _ports(record, call, order, "input_kwargs")
        by_call[call] = leaves
        inputs.update((leaf.data_name, leaf) for leaf in leaves)
        outputs += _ports(record, call, order, "output")
        order += 1
    return DataFlow(index, max_elements, inputs, outputs, by_call)


def dataflow_of(index: DumpIndex, max_elements: int) -> DataFlow:
    """The dump's data flow, made on first use and kept with the index."""
    return index.derive(DataFlow, lambda index: build(index, max_elements))
