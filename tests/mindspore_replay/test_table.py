"""Every row of api_tables/mindspore.toml, run call by call: the same inputs through
MindSpore (the device run, CPU float32) and its torch twin (the float64 bench) must
agree within the precision standard, forward and backward."""

from __future__ import annotations

from typing import Any

import pytest
import torch

mindspore = pytest.importorskip("mindspore")

from pytest_msprobe.dump.index import CallName  # noqa: E402
from pytest_msprobe.errors import CallSkip  # noqa: E402
from pytest_msprobe.run.devices import Backend  # noqa: E402
from pytest_msprobe.run.mindspore.replay import MindsporeReplay  # noqa: E402
from pytest_msprobe.run.mindspore.tables import mindspore_table  # noqa: E402
from pytest_msprobe.run.replay import Inputs, tree_map  # noqa: E402
from pytest_msprobe.standards import check  # noqa: E402

GENERATOR = torch.Generator().manual_seed(0)


def t(*shape: int, positive: bool = False) -> torch.Tensor:
    values = torch.randn(*shape, generator=GENERATOR)
    return values.abs() + 0.5 if positive else values


def ints(high: int, *shape: int) -> torch.Tensor:
    return torch.randint(0, high, shape, generator=GENERATOR)


# "api type.name" -> (args, kwargs). Arguments a MindSpore default differs on are left
# out on purpose, so a missing `defaults` row fails here.
SAMPLES: dict[str, tuple[list[Any], dict[str, Any]]] = {
    **{f"Mint.{name}": ([t(3, 4), t(3, 4)], {}) for name in ("add", "sub", "mul", "eq", "ne", "gt", "ge", "lt", "le")},
    "Mint.div": ([t(3, 4), t(3, 4, positive=True)], {}),
    "Mint.pow": ([t(3, 4, positive=True), 1.5], {}),
    **{f"Mint.{name}": ([t(3, 4, positive=True)], {}) for name in ("sqrt", "rsqrt", "log")},
    **{f"Mint.{name}": ([t(3, 4)], {}) for name in ("exp", "abs", "neg", "sigmoid", "tanh", "max", "min")},
    "Mint.sum": ([t(3, 4)], {"dim": 1, "keepdim": True}),
    "Mint.mean": ([t(3, 4), 0], {}),
    "Mint.prod": ([t(3, 4, positive=True), 1], {}),
    "Mint.cumsum": ([t(3, 4), 1], {}),
    "Mint.matmul": ([t(3, 4), t(4, 5)], {}),
    "Mint.bmm": ([t(2, 3, 4), t(2, 4, 5)], {}),
    "Mint.softmax": ([t(3, 4), 1], {}),
    "Mint.cat": ([[t(3, 4), t(2, 4)]], {}),
    "Mint.concat": ([[t(3, 4), t(3, 2)]], {"dim": 1}),
    "Mint.stack": ([[t(3, 4), t(3, 4)], 1], {}),
    "Mint.split": ([t(5, 4), 2], {}),
    "Mint.reshape": ([t(3, 4), [2, 6]], {}),
    "Mint.transpose": ([t(2, 3, 4), 0, 2], {}),
    "Mint.permute": ([t(2, 3, 4), [2, 0, 1]], {}),
    "Mint.where": ([t(3, 4) > 0, t(3, 4), t(3, 4)], {}),
    **{f"MintFunctional.{name}": ([t(3, 4)], {}) for name in ("relu", "silu", "sigmoid", "tanh", "gelu", "leaky_relu")},
    "MintFunctional.softmax": ([t(2, 3, 4)], {"dim": -1}),
    "MintFunctional.log_softmax": ([t(3, 4)], {"dim": 1}),
    "MintFunctional.linear": ([t(3, 4), t(5, 4), t(5)], {}),
    "MintFunctional.layer_norm": ([t(3, 4), [4], t(4), t(4)], {}),
    "MintFunctional.embedding": ([ints(5, 2, 3), t(5, 4)], {}),
    "MintFunctional.conv2d": ([t(1, 2, 5, 5), t(3, 2, 3, 3), t(3)], {"padding": 1}),
    "Functional.softmax": ([t(3, 4)], {}),
    "Functional.log_softmax": ([t(3, 4)], {}),
    "Functional.leaky_relu": ([t(3, 4)], {}),
    "Functional.concat": ([[t(3, 4), t(3, 2)]], {"axis": 1}),
    "Functional.cat": ([[t(3, 4), t(2, 4)]], {}),
    "Functional.stack": ([[t(3, 4), t(3, 4)]], {"axis": 2}),
    "Functional.split": ([t(3, 5), [2, 3]], {"axis": 1}),
    "Functional.transpose": ([t(2, 3, 4), (2, 0, 1)], {}),
    "Functional.permute": ([t(2, 3, 4), (1, 2, 0)], {}),
    "Functional.reshape": ([t(3, 4), (4, 3)], {}),
    "Functional.sum": ([t(3, 4), 0], {}),
    "Functional.mean": ([t(3, 4)], {"axis": 1, "keep_dims": True}),
    "Functional.matmul": ([t(3, 4), t(4, 2)], {}),
    **{f"Functional.{name}": ([t(3, 4)], {}) for name in ("exp", "relu", "silu", "sigmoid", "tanh", "square", "gelu")},
    **{f"Functional.{name}": ([t(3, 4, positive=True)], {}) for name in ("sqrt", "rsqrt")},
    "Functional.addn": ([[t(3, 4), t(3, 4), t(3, 4)]], {}),
    **{f"Tensor.{name}": ([t(3, 4), t(3, 4)], {}) for name in ("__add__", "__sub__", "__mul__")},
    "Tensor.__radd__": ([t(3, 4), 2.5], {}),
    "Tensor.__rmul__": ([t(3, 4), 3.0], {}),
    "Tensor.__truediv__": ([t(3, 4), 2.83], {}),
    "Tensor.__matmul__": ([t(2, 3, 4), t(4, 2)], {}),
    "Tensor.__neg__": ([t(3, 4)], {}),
    "Tensor.__pow__": ([t(3, 4), 2], {}),
    "Tensor.__getitem__": ([t(4, 3), slice(1, None, 2)], {}),
    "Tensor.reshape": ([t(3, 4), 6, 2], {}),
    "Tensor.permute": ([t(2, 3, 4), 2, 0, 1], {}),
    "Tensor.exp": ([t(3, 4)], {}),
}

TABLE_APIS = sorted(f"{api_type}.{name}" for api_type, names in mindspore_table().apis.items() for name in names)


def test_every_table_row_has_a_sample() -> None:
    assert sorted(SAMPLES) == TABLE_APIS


def _tensors(value: Any) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    tree_map(lambda item: found.append(item) if isinstance(item, torch.Tensor) else None, value)
    return found


def _flat(value: Any) -> list[Any]:
    return [item for part in value for item in _flat(part)] if isinstance(value, (tuple, list)) else [value]


def _settings() -> Any:
    from pytest_msprobe.judge.check.call import Settings
    from pytest_msprobe.standards import Registry

    return Settings(
        backend=Backend(), device_index=0, max_elements=1 << 24, registry=Registry.default(), device_request="cpu"
    )


def _judge(api: str, bench: Any, device: Any) -> None:
    verdict = check(bench, device, api=api.split(".", 1)[1])
    assert verdict.status == "pass", verdict.message()


@pytest.mark.parametrize("api", TABLE_APIS)
def test_mindspore_and_torch_twin_agree(api: str) -> None:
    api_type, name = api.split(".", 1)
    replay = MindsporeReplay()
    resolved = replay.resolve(CallName(api_type, name, 0, "forward"), Backend())
    args, kwargs = SAMPLES[api]
    inputs = Inputs(args, kwargs, [])
    device, bench, reference = replay.runs(resolved, inputs, _settings())
    assert reference is None  # the device is the CPU: no independent reference there
    try:
        device_out = device.forward(inputs)
    except CallSkip as skip:
        assert "kernel" in str(skip)
        pytest.skip(str(skip))
    bench_out = bench.forward(inputs)
    _judge(api, bench_out, device_out)

    flags = [tensor.is_floating_point() for tensor in _tensors((args, kwargs))]
    inputs.grads = [
        torch.randn(out.shape, generator=GENERATOR) if out.is_floating_point() else None for out in _flat(bench_out)
    ]
    if not any(flags) or not any(grad is not None for grad in inputs.grads):
        return
    _judge(api, bench.backward(inputs, flags), device.backward(inputs, flags))
