"""The registry that maps a torch_npu op name (as dumps write it after ``NPU.``) to its
CPU reference.

The plugin asks ``get(name)`` for every ``NPU.*`` call; users add references for their own
custom ops with ``register`` (directly, or through the plugin's
``pytest_msprobe_register_bench_functions(registry)`` hook, which hands them a
``Registry``) without editing this package.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

#: the op's arguments -> (output position -> rows written, gradient position -> rows
#: written, why): the rows past those are left as the device memory held them
WrittenRows: TypeAlias = Callable[..., tuple[dict[int, int], dict[int, int], str]]
#: the op's arguments, generated from a statistics dump -> (the argument changed in
#: place to one the op can read, or None; how): a tensor, `object` here (no torch import)
FitGenerated: TypeAlias = Callable[..., tuple[object, str]]


@dataclass(frozen=True)
class Companions:
    """What a reference says about its op besides computing it, where it has more to say.

    Attributes:
        written_rows: the rows its kernel writes, where it leaves some unwritten (the
            plugin judges only those: pytest_msprobe/judge/verdict/written_rows.py).
        fit_generated: how arguments generated from a statistics dump are made ones the
            kernel can read, such as row indices (pytest_msprobe/run/replay.py).
    """

    written_rows: WrittenRows | None = None
    fit_generated: FitGenerated | None = None


def _section(doc: str, heading: str) -> tuple[str, ...]:
    """The ``- `` bullet lines under ``heading:`` in a docstring, joined across wrapped
    lines, until the next blank line."""
    lines = doc.splitlines()
    out: list[str] = []
    inside = False
    for line in lines:
        stripped = line.strip()
        if not inside:
            inside = stripped.lower().startswith(heading.lower())
            continue
        if not stripped:
            break
        if stripped.startswith("- "):
            out.append(stripped[2:])
        elif out:
            out[-1] += " " + stripped
    return tuple(re.sub(r"\s+", " ", item) for item in out)


class BenchFunction:
    """A reference implementation: callable exactly like the NPU op it stands for.

    Attributes:
        name: the registry name (the torch_npu op name).
        func: the underlying plain function.
        doc: its docstring.
        source: ``module.qualname`` of the implementation.
        builtin: True for the references shipped in this package.
        facts: the documented facts the reference follows (its docstring's "Facts:"
            bullets), for reports and generated scripts.
        choices: the behaviours it had to choose where the documentation is silent
            (its docstring's "Choices:" bullets).
        companions: its ``Companions`` (none by default; a ``BenchFunction`` given as
            ``func`` keeps its own unless others are given).
    """

    companions: Companions

    def __init__(
        self, name: str, func: Callable[..., Any], *, builtin: bool = False, companions: Companions | None = None
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"a bench function name must be a non-empty string, got {name!r}")
        if not callable(func):
            raise TypeError(f"bench function {name!r} must be callable, got {type(func).__name__}")
        if isinstance(func, BenchFunction):
            companions = companions or func.companions
            func = func.func
        self.companions = companions or Companions()
        functools.update_wrapper(self, func)  # __doc__, __wrapped__ -> inspect.signature works
        self.name = name
        self.func: Callable[..., Any] = func
        self.doc = inspect.getdoc(func) or ""
        module = getattr(func, "__module__", None) or "?"
        self.source = f"{module}.{getattr(func, '__qualname__', type(func).__name__)}"
        self.builtin = builtin
        self.facts = _section(self.doc, "Facts")
        self.choices = _section(self.doc, "Choices")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.func(*args, **kwargs)

    @property
    def signature(self) -> inspect.Signature:
        return inspect.signature(self.func)

    def __repr__(self) -> str:
        return f"<BenchFunction {self.name} -> {self.source}>"


class Registry:
    """Name -> ``BenchFunction``. ``get`` of an unknown name is ``None``."""

    def __init__(
        self,
        functions: Mapping[str, Callable[..., Any]] | None = None,
        *,
        builtin: bool = False,
        companions: Mapping[str, Companions] | None = None,
    ) -> None:
        self._functions: dict[str, BenchFunction] = {}
        for name, func in (functions or {}).items():
            self._functions[name] = BenchFunction(name, func, builtin=builtin, companions=(companions or {}).get(name))

    def register(
        self, name: str, func: Callable[..., Any], *, replace: bool = False, companions: Companions | None = None
    ) -> None:
        """Add the reference ``func`` for the op ``name``.

        Parameters
        ----------
        name, func, replace, companions
            As :func:`pytest_msprobe.bench_functions.register` takes them.

        Raises
        ------
        ValueError
            `name` is registered already and `replace` is false.
        """
        if name in self._functions and not replace:
            raise ValueError(
                f"a bench function for {name!r} is already registered "
                f"({self._functions[name].source}); pass replace=True to replace it, e.g. "
                f"register({name!r}, func, replace=True)"
            )
        self._functions[name] = BenchFunction(name, func, companions=companions)

    def get(self, name: str) -> BenchFunction | None:
        """The reference of op `name`.

        Parameters
        ----------
        name
            The op's name as dumps write it after ``NPU.``.

        Returns
        -------
        BenchFunction or None
            None where no reference is registered for it.
        """
        return self._functions.get(name)

    def names(self) -> list[str]:
        """The op names this registry knows.

        Returns
        -------
        list[str]
            Sorted.
        """
        return sorted(self._functions)

    def copy(self) -> Registry:
        """A registry of the same references that registering in leaves this one as it is.

        Returns
        -------
        Registry
            The copy (the references themselves are shared, not copied).
        """
        new = Registry()
        new._functions = dict(self._functions)
        return new

    def __contains__(self, name: object) -> bool:
        return name in self._functions

    def __len__(self) -> int:
        return len(self._functions)

    def __iter__(self) -> Iterable[str]:
        return iter(self.names())

    def __repr__(self) -> str:
        return f"<Registry of {len(self)} bench functions>"
