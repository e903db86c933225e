"""The device under test: cpu, cuda or npu behind one small interface.

cuda and npu differ only in the torch module that drives them, the package that
provides it and the environment variable that restricts visible devices, so they
are one class over a table, not two copies.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from types import ModuleType

    import torch

    from pytest_msprobe.dump.values import Nested

AUTOLOAD_HINT = (
    "torch_npu is installed but cannot be imported (it needs Ascend's CANN libraries). "
    "On a machine without an NPU set TORCH_DEVICE_BACKEND_AUTOLOAD=0 so that torch does "
    "not load it, or uninstall torch_npu."
)


class DeviceUnavailable(Exception):
    """The chosen device cannot be used: a usage error that tells the user why."""


def import_torch() -> ModuleType:
    """torch, or a usage error that names the torch_npu autoload trap."""
    try:
        import torch
    except Exception as exc:  # torch_npu auto-loaded by torch raises all sorts
        if "torch_npu" in repr(exc) or "ascend" in repr(exc).lower() or "cann" in repr(exc).lower():
            raise DeviceUnavailable(f"import torch failed: {exc}. {AUTOLOAD_HINT}") from exc
        raise DeviceUnavailable(f"import torch failed: {type(exc).__name__}: {exc}") from exc
    return torch


@dataclass(frozen=True)
class Accelerator:
    """What distinguishes one accelerator family from another."""

    name: str
    package: str | None  # imported first: it registers the torch module
    visible_env: str
    install_hint: str  # what to do when the package (or the backend) is not installed
    broken_hint: str = ""  # what to do when the package is installed but fails to import

    def module(self) -> ModuleType:
        torch = import_torch()
        if self.package:
            try:
                importlib.import_module(self.package)
            except ModuleNotFoundError as exc:
                if exc.name != self.package:  # the package is there; something it needs is not
                    raise DeviceUnavailable(f"{self.package} cannot be imported: {exc}. {self.broken_hint}") from exc
                raise DeviceUnavailable(f"{self.package} is not installed. {self.install_hint}") from exc
            except Exception as exc:
                raise DeviceUnavailable(
                    f"{self.package} cannot be imported: {type(exc).__name__}: {exc}. {self.broken_hint}"
                ) from exc
        module: ModuleType = getattr(torch, self.name)
        return module


ACCELERATORS = {
    "npu": Accelerator(
        "npu",
        "torch_npu",
        "ASCEND_RT_VISIBLE_DEVICES",
        "Install pytest-msprobe[npu] (torch_npu) with Ascend's CANN set up (source set_env.sh).",
        AUTOLOAD_HINT,
    ),
    "cuda": Accelerator("cuda", None, "CUDA_VISIBLE_DEVICES", "Install a CUDA build of torch."),
}


class Backend:
    """One device family. `index` is relative to what the caller made visible."""

    name = "cpu"

    def check(self) -> None:
        """Raise DeviceUnavailable with the reason when this backend cannot run."""

    def device_count(self) -> int:
        return 1

    def torch_device(self, index: int = 0) -> torch.device:
        device: torch.device = import_torch().device("cpu")
        return device

    def select(self, index: int) -> None:
        """Make `index` the current device of this process, before any tensor exists."""

    def synchronize(self) -> None:
        """Wait for queued kernels, so errors and timings belong to the call that made them."""

    def free(self) -> None:
        """Return cached memory after a call, so the next one starts clean."""

    def describe(self, index: int = 0) -> str:
        return "cpu"

    def find_op(self, api_name: str) -> Callable[..., Nested] | None:
        """A device-specific fused operator (NPU.* calls); None where the device has none."""
        return None

    def is_out_of_memory(self, exc: BaseException) -> bool:
        """Python's MemoryError, or torch's CPU allocator giving up (a RuntimeError)."""
        return isinstance(exc, MemoryError) or "can't allocate memory" in str(exc)


class AcceleratorBackend(Backend):
    def __init__(self, accelerator: Accelerator) -> None:
        self.accelerator = accelerator
        self.name = accelerator.name

    def _module(self) -> ModuleType:
        return self.accelerator.module()

    def check(self) -> None:
        module = self._module()
        if not module.is_available() or module.device_count() == 0:
            visible = os.environ.get(self.accelerator.visible_env)
            extra = f" ({self.accelerator.visible_env}={visible!r})" if visible is not None else ""
            raise DeviceUnavailable(f"no {self.name} device is available{extra}")

    def device_count(self) -> int:
        return int(self._module().device_count())

    def torch_device(self, index: int = 0) -> torch.device:
        device: torch.device = import_torch().device(self.name, index)
        return device

    def select(self, index: int) -> None:
        self._module().set_device(index)

    def synchronize(self) -> None:
        self._module().synchronize()

    def free(self) -> None:
        self._module().empty_cache()

    def describe(self, index: int = 0) -> str:
        try:
            label = self._module().get_device_name(index)
        except Exception:  # noqa: BLE001 - a name is decoration; never fail a call for it
            label = ""
        return f"{self.name}:{index}" + (f" ({label})" if label else "")

    def find_op(self, api_name: str) -> Callable[..., Nested] | None:
        if self.name != "npu":
            return None
        torch_npu = importlib.import_module("torch_npu")
        op = getattr(torch_npu, api_name, None)
        if op is None:
            op = getattr(import_torch().ops.npu, api_name, None)
        return op if callable(op) else None

    def is_out_of_memory(self, exc: BaseException) -> bool:
        return isinstance(exc, MemoryError) or "out of memory" in str(exc).lower()


def check_name(name: str) -> None:
    """A device name `backend` knows, told without importing torch."""
    if name not in ("auto", "cpu", *ACCELERATORS):
        raise DeviceUnavailable(f"unknown device {name!r}: choose auto, cpu, cuda or npu")


def backend(name: str) -> Backend:
    """The backend for `--msprobe-device` (auto: npu, else cuda, else cpu)."""
    check_name(name)
    if name == "auto":
        for candidate in ("npu", "cuda"):
            chosen = AcceleratorBackend(ACCELERATORS[candidate])
            try:
                chosen.check()
            except DeviceUnavailable:
                continue
            return chosen
        return Backend()
    if name == "cpu":
        return Backend()
    chosen = AcceleratorBackend(ACCELERATORS[name])
    chosen.check()
    return chosen
