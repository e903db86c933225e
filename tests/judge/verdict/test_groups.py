"""judge/verdict/groups.py: which elements of a call share one rounded quantity, per API."""

import pytest
import torch

from pytest_msprobe.dump.index import parse_call_name
from pytest_msprobe.judge.verdict.groups import collapse, groups_of
from pytest_msprobe.run.replay import Inputs


def _groups(call: str, *args, **kwargs):
    return groups_of(parse_call_name(call), None, Inputs(list(args), kwargs, []))


def _sizes(ids: torch.Tensor) -> list[int]:
    return torch.bincount(ids.reshape(-1)).tolist()


def test_collapsed_numbers_the_kept_dimensions():
    ids = collapse((2, 3, 4), (-1,))
    assert ids.shape == (2, 3, 4) and _sizes(ids) == [4] * 6
    assert ids[1, 2].tolist() == [5] * 4


X = torch.randn(2, 3, 4, 5)


@pytest.mark.parametrize(
    ("call", "args", "kwargs", "sizes"),
    [
        ("Functional.softmax.0.forward", (X,), {"dim": 1}, [3] * 40),
        ("Functional.softmax.0.forward", (X, -1), {}, [5] * 24),
        ("Torch.log_softmax.0.backward", (X, 2), {}, [4] * 30),
        ("Functional.layer_norm.0.forward", (X, (4, 5)), {}, [20] * 6),
        ("Functional.rms_norm.0.forward", (X, [5]), {}, [5] * 24),
        ("Functional.batch_norm.0.backward", (X, None, None), {}, [40] * 3),
        ("Functional.instance_norm.0.forward", (X,), {}, [20] * 6),
        ("Functional.group_norm.0.forward", (torch.randn(2, 6, 4), 3), {}, [8] * 6),
        ("Functional.cross_entropy.0.backward", (torch.randn(6, 10), torch.arange(6)), {}, [10] * 6),
        ("Functional.cross_entropy.0.backward", (X, torch.zeros(2, 4, 5, dtype=torch.long)), {}, [3] * 40),
        ("Functional.cross_entropy.0.backward", (torch.randn(10), torch.tensor(3)), {}, [10]),
        ("Functional.scaled_dot_product_attention.0.forward", (X, X, X), {}, [5] * 24),
        ("Tensor.__truediv__.0.forward", (X, 3.0), {}, [120]),
        ("Torch.div.0.forward", (X, torch.tensor(2.0)), {}, [120]),
    ],
)
def test_groups_per_api(call, args, kwargs, sizes):
    ids = _groups(call, *args, **kwargs)
    assert ids.shape == args[0].shape
    assert _sizes(ids) == sizes


@pytest.mark.parametrize(
    ("call", "args"),
    [
        ("Torch.div.0.forward", (X, torch.rand(2, 3, 4, 5) + 1)),  # a tensor divisor: independent
        ("Functional.linear.0.forward", (X, torch.randn(3, 5))),  # not in the table
        ("Functional.softmax.0.forward", (3.0,)),  # not a tensor
        ("Functional.group_norm.0.forward", (X, "three")),  # a form the table does not read
        # 16-bit: correct kernels form the log-sum-exp (softmax sum) in float32
        ("Functional.cross_entropy.0.backward", (torch.randn(6, 10).bfloat16(), torch.arange(6))),
        ("Functional.scaled_dot_product_attention.0.forward", (X.half(), X.half(), X.half())),
    ],
)
def test_no_groups(call, args):
    assert _groups(call, *args) is None
