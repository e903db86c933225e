"""Inputs near a dumped call's: the hypothesis strategy that judge/explore/search.py searches.

A dump holds one training step's inputs; a kernel that is wrong only for large logits,
a large common offset, tiny or huge magnitudes, other lengths or masked rows passes
that step. A variant keeps what makes the call the same call (the API, the structure of
its arguments, every non-tensor argument, every dtype) and moves its tensors:

- values: the dumped ones, resampled from them, scaled by a power of two (up to the
  dtype's largest finite value, down into its subnormals), near the largest finite
  value, near the smallest normal one, shifted by a large common offset, with signed
  zeros, and, for tensors whose dumped values hold -inf/+inf/NaN (masks), whole rows
  of those (judge/explore/moves.py REGIMES; its EDGES are the extremes tried first);
- shapes: every dimension of one dumped size becomes another size (0 where the
  framework's kernels take empty tensors, 1, shorter, longer) in every tensor at once, and in the shape arguments (a torch.Size, a list of
  sizes), so tensors that had to agree still agree;
- integer and boolean tensors keep their dumped values, or are resampled from them
  where the shape changed: indexes stay within the dumped ones' range, masks stay masks.

A variant is a record of the call (the dump's, its tensors renamed) plus its tensors in
memory: decoded as any record is (dump/values.py), and, when it fails, written as a
one-call dump (dump/tensor_dump.py) that reproduces it exactly. Hypothesis shrinks toward the
dumped call: the first regime is "dumped", sizes toward 0 and 1, exponents toward 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch
from hypothesis import reject
from hypothesis import strategies as st

from pytest_msprobe.dump.tensor_dump import tensor_entry
from pytest_msprobe.dump.values import TENSOR_TYPES, TensorLeaf
from pytest_msprobe.errors import CallSkip
from pytest_msprobe.judge.explore.moves import EDGES, REGIMES, Regime, dtype_name, mantissa_bits, spread_of
from pytest_msprobe.standards.dtypes import Array

if TYPE_CHECKING:
    from hypothesis.vendor.pretty import RepresentationPrinter

    from pytest_msprobe.dump.index import Json, Record

# An explored call may grow to this many times its dumped elements (or this floor).
GROWTH, FLOOR_ELEMENTS = 4, 1 << 14


@dataclass(frozen=True)
class Variant:
    """One explored input: the records to decode and the tensors they name."""

    forward: Record
    backward: Record | None
    tensors: dict[str, torch.Tensor]
    described: dict[str, str]  # data_name -> how its values were made
    explicit: bool = False  # an explicit example (Neighbourhood.edge_variants): hypothesis does not shrink it

    def provided_tensors(self) -> dict[str, tuple[torch.Tensor, str]]:
        """What dump.values.DecodeContext takes as in-memory tensors."""
        return {name: (tensor, self.described[name]) for name, tensor in self.tensors.items()}

    def __repr__(self) -> str:  # hypothesis names examples by repr: short, no tensors
        return "Variant(" + "; ".join(self.described.values()) + ")"

    def _repr_pretty_(self, printer: RepresentationPrinter, cycle: bool) -> None:
        """hypothesis prints a dataclass field by field, not by its __repr__, and prints
        every explicit example (the edges) as it runs it: the tensors' reprs cost as much
        as judging the example did."""
        printer.text(repr(self))


# identity and the default repr, as any object: hypothesis holds the bound _draw, and a
# field-by-field repr would print the tensors
@dataclass(eq=False, repr=False)
class Neighbourhood:
    """The variants of one call: built from its records and its decoded dumped inputs
    (their leaves, in the order decoding found them)."""

    forward: Record
    backward: Record | None
    leaves: list[TensorLeaf]
    max_elements: int  # the run's limit (--msprobe-max-elements)
    resizable: bool = True  # False: every shape as dumped (the [explore] table's fixed_shapes)
    smallest_size: int = 0  # 0 where the framework's kernels take empty tensors
    # made from the above:
    sizes: list[int] = field(init=False)  # the dumped sizes a variant may change
    limit: int = field(init=False)  # the most elements a variant may hold
    regimes: tuple[Regime, ...] = field(init=False)
    edged: int | None = field(init=False)  # the leaf the edges move: the first floating one

    def __post_init__(self) -> None:
        leaves = self.leaves
        found = _count_tensors(self._recorded_inputs())
        if found != len(leaves):
            raise CallSkip(f"cannot explore: the records hold {found} tensors, decoding found {len(leaves)}")
        self.sizes = (
            sorted({size for leaf in leaves for size in leaf.tensor.shape if size > 1}) if self.resizable else []
        )
        dumped = sum(leaf.tensor.numel() for leaf in leaves)
        self.limit = min(self.max_elements, max(GROWTH * dumped, FLOOR_ELEMENTS))
        floats = [leaf for leaf in leaves if leaf.tensor.is_floating_point()]
        has_specials = any(not torch.isfinite(leaf.tensor).all() for leaf in floats)
        self.regimes = tuple(regime for regime in REGIMES if regime.name != "specials" or has_specials)
        self.edged = next((position for position, leaf in enumerate(leaves) if leaf.tensor.is_floating_point()), None)

    def _recorded_inputs(self) -> list[Json]:
        recorded: list[Json] = [self.forward.get("input_args", []), self.forward.get("input_kwargs", {})]
        return recorded + ([self.backward.get("input", [])] if self.backward is not None else [])

    def variants(self) -> st.SearchStrategy[Variant]:
        return st.composite(self._draw)()

    def _draw(self, draw: st.DrawFn) -> Variant:
        sizes = self._draw_sizes(draw)
        seed = draw(st.integers(0, 2**16 - 1))
        shared = draw(st.sampled_from(self.regimes))
        separate = draw(st.booleans())
        tensors: dict[str, torch.Tensor] = {}
        described: dict[str, str] = {}
        for position, leaf in enumerate(self.leaves):
            shape = tuple(sizes.get(size, size) for size in leaf.tensor.shape)
            rng = np.random.default_rng([seed, position])
            regime = draw(st.sampled_from(self.regimes)) if separate else shared
            tensor, how = _leaf_values(draw, leaf, _Move(shape, seed, regime, rng))
            name = f"explore.{position}.pt"
            tensors[name], described[name] = tensor, f"{leaf.path}: {dtype_name(tensor.dtype)} {list(shape)}, {how}"
        total = sum(tensor.numel() for tensor in tensors.values())
        if total > self.limit:
            reject()  # larger than exploring this call may make it
        return self._variant(tensors, described, sizes)

    def edge_variants(self) -> list[Variant]:
        """The dumped call with its first floating tensor at each edge (EDGES), the other
        tensors and every shape as dumped: hypothesis's explicit examples, run first.
        Each is the smallest variant at its edge (hypothesis shrinks toward the dumped
        shapes and values), so one that fails is already minimal."""
        if self.edged is None:
            return []
        masked = not bool(torch.isfinite(self.leaves[self.edged].tensor).all())
        # a mask only where the dumped tensor holds one: -inf means nothing to a matmul
        edges = [edge for edge in EDGES if edge != "masked rows" or masked]
        return [self._move_leaves({self.edged: _move_to_edge(self.leaves[self.edged], edge)}) for edge in edges]

    def near_variants(self) -> list[Variant]:
        """The dumped call with its second floating tensor moved near its first (of the
        same shape): x2 = x1 + 2**-k spread(x1) z, z a fixed standard normal draw, for k =
        half D's mantissa bits and all of them. The angle between them is then about
        sqrt(eps) or eps, where 1 - cos(x1, x2) is ~eps or ~eps**2: computed as 1 - cos
        in D it keeps no bit. Explicit examples, as the edges are (none where the call
        has no such pair)."""
        floats = [position for position, leaf in enumerate(self.leaves) if leaf.tensor.is_floating_point()]
        if len(floats) < 2 or self.leaves[floats[0]].tensor.shape != self.leaves[floats[1]].tensor.shape:
            return []
        first, second = (self.leaves[position] for position in floats[:2])
        values = first.tensor.double().numpy()
        noise = np.random.default_rng(0).standard_normal(values.shape) * spread_of(values)
        bits = mantissa_bits(first.tensor.dtype)
        variants = []
        for k in (bits // 2, bits):
            near = _tensor(values + noise * 2.0**-k, tuple(values.shape), second.tensor.dtype)
            how = f"as dumped, at the edge 'small angles': the first argument plus 2**-{k} of its spread times a normal draw"
            variants.append(self._move_leaves({floats[1]: (near, how)}))
        return variants

    def _move_leaves(self, moved: dict[int, tuple[torch.Tensor, str]]) -> Variant:
        """The dumped call with the leaves at `moved`'s positions replaced: an explicit example."""
        tensors, described = {}, {}
        for position, leaf in enumerate(self.leaves):
            name = f"explore.{position}.pt"
            tensor, how = moved.get(position, (leaf.tensor, "as dumped"))
            tensors[name], described[name] = (
                tensor,
                f"{leaf.path}: {dtype_name(tensor.dtype)} {list(tensor.shape)}, {how}",
            )
        return self._variant(tensors, described, {}, explicit=True)

    def _variant(
        self, tensors: dict[str, torch.Tensor], described: dict[str, str], sizes: dict[int, int], explicit: bool = False
    ) -> Variant:
        """The records of the call with `tensors` in place of its own, in decoding order."""
        rename = iter(tensors)

        def replace(value: Record) -> Record:
            name = next(rename)
            return tensor_entry(
                tensors[name], name, kind=value["type"], requires_grad=bool(value.get("requires_grad", False))
            )

        forward = {
            **self.forward,
            "input_args": _replace_tensors(self.forward.get("input_args", []), replace, sizes),
            "input_kwargs": _replace_tensors(self.forward.get("input_kwargs", {}), replace, sizes),
        }
        backward = None
        if self.backward is not None:
            backward = {**self.backward, "input": _replace_tensors(self.backward.get("input", []), replace, sizes)}
        return Variant(forward, backward, tensors, described, explicit)

    def _draw_sizes(self, draw: st.DrawFn) -> dict[int, int]:
        """Dumped size -> its size in this variant (every dimension of that size)."""
        if not self.sizes or not draw(st.booleans()):
            return {}
        return {size: draw(st.integers(self.smallest_size, 2 * size)) for size in self.sizes}


@dataclass(frozen=True)
class _Move:
    """How one variant moves one leaf: its shape there, the variant's seed, and the
    leaf's regime and random generator."""

    shape: tuple[int, ...]
    seed: int
    regime: Regime
    rng: np.random.Generator


def _leaf_values(draw: st.DrawFn, leaf: TensorLeaf, move: _Move) -> tuple[torch.Tensor, str]:
    """The leaf's tensor in this variant: the dumped one where nothing moves it."""
    dumped, shape, rng = leaf.tensor, move.shape, move.rng
    same = shape == tuple(dumped.shape) and move.seed == 0
    floating = dumped.is_floating_point()
    if same and (move.regime.name == "dumped" or not floating):
        return dumped, "as dumped"
    source = "as dumped" if same else f"resampled from the dumped values (seed {move.seed})"
    if not floating:
        return _tensor(_resample(dumped.numpy(), shape, rng), shape, dumped.dtype), source
    wide = dumped.double().numpy()
    moved, how = move.regime.make(draw, wide if same else _resample(wide, shape, rng), dumped.dtype, rng)
    return _tensor(moved, shape, dumped.dtype), ", ".join(filter(None, (source, how)))


def _move_to_edge(leaf: TensorLeaf, edge: str) -> tuple[torch.Tensor, str]:
    """The leaf's floating tensor moved to an edge (EDGES)."""
    dumped = leaf.tensor
    moved, how = EDGES[edge](dumped.double().numpy(), dumped.dtype)
    return _tensor(
        moved, tuple(dumped.shape), dumped.dtype
    ), f"as dumped, at the edge {edge!r}: {how or 'nothing to move'}"


def _tensor(values: Json, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """numpy values (a 0-d result may be a numpy scalar) as a tensor of `shape`."""
    return torch.from_numpy(np.array(values).reshape(shape)).to(dtype)


def _resample(values: Array, shape: tuple[int, ...], rng: np.random.Generator) -> Array:
    """Elements drawn with replacement from the dumped ones (zeros if it had none)."""
    flat = values.reshape(-1)
    if not flat.size:
        return np.zeros(shape, dtype=values.dtype)
    return flat[rng.integers(0, flat.size, size=shape)] if math.prod(shape) else np.zeros(shape, dtype=values.dtype)


def _count_tensors(value: Json) -> int:
    if isinstance(value, list):
        return sum(_count_tensors(item) for item in value)
    if isinstance(value, dict):
        return 1 if value.get("type") in TENSOR_TYPES else sum(_count_tensors(item) for item in value.values())
    return 0


def _replace_tensors(value: Json, replace: Callable[[Record], Record], sizes: dict[int, int]) -> Json:
    """The recorded value with its tensors replaced (in decoding order) and its shape
    arguments resized."""
    if isinstance(value, list):
        if sizes and value and all(_is_int(item) for item in value):
            return [{**item, "value": sizes.get(item["value"], item["value"])} for item in value]
        return [_replace_tensors(item, replace, sizes) for item in value]
    if not isinstance(value, dict):
        return value
    kind = value.get("type")
    if kind in TENSOR_TYPES:
        return replace(value)
    if kind == "torch.Size" and isinstance(value.get("value"), list):
        return {**value, "value": [sizes.get(size, size) for size in value["value"]]}
    if kind is None:
        return {key: _replace_tensors(item, replace, sizes) for key, item in value.items()}
    return value


def _is_int(item: object) -> bool:
    return isinstance(item, dict) and item.get("type") == "int" and isinstance(item.get("value"), int)
