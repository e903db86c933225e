"""The private APIs of torch, torch_npu, hypothesis and Python that the plugin uses, in
one place: a new release may move any of them without notice, and then this module is
the one to change, and tests/repository/test_compat.py the test that says which API moved in which
installed version.

Why here, at the top of the package: the stages that need these (dump/ reads torch's
tensor files, run/ replays and ends processes, judge/ searches with hypothesis) come
before one another in a call's path, and a module at the top is what every stage may
import (tests/repository/test_package_layout.py). pytest's private APIs cannot live here: only the pytest
layer imports pytest, so they are in plugin/pytest_privates.py, which reuses `PrivateApi`.

Nothing is imported at module level: the xdist controller names calls without torch,
and a session that explores nothing never imports hypothesis (tests/scale/test_startup.py);
each function imports what it reaches into. `PRIVATE_APIS` lists every private name
used here, where it lives and what the plugin does without it, for the tests.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING
from unittest import mock

if TYPE_CHECKING:
    from types import ModuleType

    import torch
    from torch._C import PyTorchFileReader as PyTorchFileReader


@dataclass(frozen=True)
class PrivateApi:
    """One private name of another project, as the plugin reaches it."""

    name: str  # its dotted path: the module, then attributes ("torch.autograd.graph._engine_run_backward")
    distribution: str  # the installed distribution whose version a moved API is reported with
    use: str  # what the plugin does with it, and what it does where it is gone
    # for an attribute the plugin sets for the project to read: the module that reads it
    # (`name` is then the attribute's bare name)
    read_by: str = ""


PRIVATE_APIS = (
    PrivateApi(
        "torch.autograd.graph._engine_run_backward",
        "torch",
        "run/replay.py run_backward: autograd's engine without torch.autograd.backward's symbolic shape checks (sympy "
        "imported, 0.8 s a process); without it, torch.autograd.backward",
    ),
    PrivateApi(
        "torch._VF",
        "torch",
        "run/apis.py: the `VF` API type's functions (lstm, gru), as generated scripts call them too",
    ),
    PrivateApi(
        "torch._C.PyTorchFileReader",
        "torch",
        "dump/tensors.py: reads a plain torch.save(tensor) file without torch.load; without it, torch.load",
    ),
    PrivateApi(
        "torch.Tensor._typed_storage",
        "torch",
        "dump/tensors.py: the storage under the tensor a file record is read into, as torch.serialization takes it",
    ),
    PrivateApi("torch.storage.TypedStorage._untyped_storage", "torch", "dump/tensors.py: that storage, untyped"),
    PrivateApi(
        "torch._utils._rebuild_tensor_v2",
        "torch",
        "dump/tensors.py: the global torch.save pickles a plain tensor as; a file naming another is read by torch.load",
    ),
    PrivateApi(
        "torch_npu._C._npu_getOption", "torch_npu", "run/precision.py: the NPU's ACL_PRECISION_MODE, for the report"
    ),
    PrivateApi(
        "_hypothesis_internal_use_seed",
        "hypothesis",
        "judge/explore/search.py: seeds a search from its call, as hypothesis.seed() does, without seed()'s switching the database off",
        read_by="hypothesis.core",
    ),
    PrivateApi(
        "_hypothesis_internal_add_digest",
        "hypothesis",
        "judge/explore/search.py: keys the example database by the dump and the call, not only the test function",
        read_by="hypothesis.internal.reflection",
    ),
    PrivateApi(
        "hypothesis.internal.conjecture.providers._get_local_constants",
        "hypothesis",
        "judge/explore/search.py: patched to the global constants only; a hypothesis without it (before 6.131) draws none",
    ),
    PrivateApi(
        "hypothesis.internal.conjecture.providers.Constants",
        "hypothesis",
        "judge/explore/search.py: the global constants' type",
    ),
    PrivateApi(
        "hypothesis.internal.conjecture.providers.CONSTANTS_CACHE",
        "hypothesis",
        "judge/explore/search.py: emptied for a search",
    ),
    PrivateApi(
        "torch.ops.aten._scaled_dot_product_attention_math",
        "torch",
        "judge/defects/explored_reproducers.py: torch's math attention kernel (the definition) beside the flash kernel; without it, "
        "that reproducer fails",
    ),
    PrivateApi(
        "threading._shutdown", "python", "run/isolation.py end_process: waits for the other threads as an exit does"
    ),
    PrivateApi(
        "atexit._run_exitfuncs", "python", "run/isolation.py end_process: runs every exit handler before os._exit"
    ),
)


def engine_run_backward() -> Callable[..., tuple[torch.Tensor, ...]] | None:
    """torch.autograd.backward's call into autograd's engine, None where this torch has none."""
    import torch

    found: Callable[..., tuple[torch.Tensor, ...]] | None = getattr(torch.autograd.graph, "_engine_run_backward", None)
    return found


def torch_vf() -> ModuleType:
    """torch's module of the recurrent kernels (torch._VF.lstm, torch._VF.gru)."""
    import torch

    return torch._VF


def file_reader() -> type[PyTorchFileReader] | None:
    """The reader of torch.save's zip files, None where this torch has none."""
    import torch

    found: type[PyTorchFileReader] | None = getattr(torch._C, "PyTorchFileReader", None)
    return found


def attention_math() -> Callable[..., tuple[torch.Tensor, ...]]:
    """torch's math kernel of scaled_dot_product_attention (softmax, then matmul)."""
    import torch

    found: Callable[..., tuple[torch.Tensor, ...]] = torch.ops.aten._scaled_dot_product_attention_math
    return found


def record_storage(record: torch.Tensor) -> torch.UntypedStorage:
    """The storage under the tensor a file record was read into (PyTorchFileReader's
    get_storage_from_record), as torch.serialization hands it on."""
    # torch leaves this private accessor unannotated
    storage: torch.UntypedStorage = record._typed_storage()._untyped_storage  # type: ignore[no-untyped-call]
    return storage


def npu_option(name: str) -> object:
    """One of torch_npu's ACL options (bytes or str, as torch_npu returns it)."""
    import torch_npu

    return torch_npu._C._npu_getOption(name)


def seed_search(test: Callable[..., None], seed: int) -> None:
    """Seed the hypothesis test made from `test` (before @given wraps it), as
    hypothesis.seed(seed) does, but with its example database left on."""
    test._hypothesis_internal_use_seed = seed  # type: ignore[attr-defined]


def key_database(test: Callable[..., None], key: bytes) -> None:
    """Add `key` to the digest hypothesis keys a given test's example database by."""
    # hypothesis's handle on the wrapped test, which its type stubs do not declare
    test.hypothesis.inner_test._hypothesis_internal_add_digest = key  # type: ignore[attr-defined]


@contextlib.contextmanager
def no_local_constants() -> Iterator[None]:
    """hypothesis (6.131 on) draws some values from the constants in the source of every
    local module the process has imported (not site-packages, not the standard library),
    and caches them per process: the examples would depend on which test modules,
    conftest files and plugins ran before, so an in-process run and an xdist worker
    explored a call differently. Inside this, hypothesis sees its global constants only:
    a search's examples depend on its call alone."""
    from hypothesis.internal.conjecture import providers

    if not hasattr(providers, "_get_local_constants"):  # a hypothesis without local constants
        yield
        return
    with (
        mock.patch.object(providers, "_get_local_constants", providers.Constants),
        mock.patch.object(providers, "CONSTANTS_CACHE", {}),
    ):
        yield


def join_threads() -> None:
    """Wait for every other non-daemon thread, as the interpreter does at exit."""
    import threading

    shutdown: Callable[[], None] | None = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        shutdown()


def run_exit_handlers() -> None:
    """Run (and clear) every atexit handler, as the interpreter does at exit."""
    import atexit

    atexit._run_exitfuncs()
