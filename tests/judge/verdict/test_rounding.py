"""judge/verdict/rounding.py: which 16-bit elements the far-misrounding test reads. Each row of its
table is checked against ATen's own kernels here (studies/rounded_once.py's
measurement, on random inputs): a correct kernel of a listed API and direction makes
fewer than FAR_MIN far misroundings, one way; and the directions left out are left out
for a reason this machine still shows."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pytest_msprobe.dump.index import parse_call_name
from pytest_msprobe.judge.verdict.rounding import ROUNDED_ONCE, rounded_once_of
from pytest_msprobe.run.replay import Inputs
from pytest_msprobe.standards.misrounding import FAR_MIN
from pytest_msprobe.testing.script_modules import load_script

HALF = (torch.bfloat16, torch.float16)


MEASURE = load_script(Path(__file__).parents[3] / "studies" / "rounded_once.py", "rounded_once_measurement")
KERNELS = {**MEASURE.ELEMENTWISE, **MEASURE.ROWS}


def _api(kernel: str) -> str:
    """The API a measured kernel calls: `layer_norm(16-bit weight)` -> layer_norm."""
    return kernel.split("(")[0]


def _far(kernel: str, dtype: torch.dtype, direction: str) -> tuple[int, int]:
    """(toward, away from zero) far misroundings of ATen's kernel on 64 x 256 random
    inputs, over the elements the table names (every element for a kernel not in it)."""
    x = (torch.randn(64, 256, generator=torch.Generator().manual_seed(0)) * 2 + 0.5).to(dtype)
    once = None
    if kernel in MEASURE.ELEMENTWISE and _api(kernel) in ROUNDED_ONCE:
        kwargs = {"approximate": "tanh"} if kernel == "gelu(tanh)" else {}
        once = rounded_once_of(
            parse_call_name(f"Functional.{_api(kernel)}.0.{direction}"), None, Inputs([x], kwargs, [])
        )
    toward, away, _, _ = MEASURE.far(x, *MEASURE.outputs(KERNELS[kernel], x, direction, 1), once)
    return toward, away


LISTED = sorted(
    (kernel, direction)
    for kernel in KERNELS
    for direction in ROUNDED_ONCE.get(_api(kernel), {})
    if kernel not in ("batch_norm(training)",)
)
LEFT_OUT = [("tanh", "backward"), ("exp", "backward"), ("softmax", "backward"), ("layer_norm", "backward")]
LEFT_OUT += [("log_softmax", "forward"), ("softsign", "forward"), ("instance_norm", "forward")]


@pytest.mark.parametrize("dtype", HALF, ids=["bfloat16", "float16"])
@pytest.mark.parametrize(("kernel", "direction"), LISTED)
def test_aten_rounds_each_listed_api_once(kernel, direction, dtype):
    toward, away = _far(kernel, dtype, direction)
    assert max(toward, away) < FAR_MIN, f"ATen's {dtype} {kernel} {direction}: {toward} toward, {away} away from zero"


@pytest.mark.parametrize(("kernel", "direction"), LEFT_OUT)
def test_what_is_left_out_is_farther_on_aten_itself(kernel, direction):
    """A left-out direction: ATen's correct kernel rounds an intermediate at D (or its
    float32 formula cancels), so the test would fail it."""
    assert _api(kernel) not in ROUNDED_ONCE or direction not in ROUNDED_ONCE[_api(kernel)]
    toward, away = _far(kernel, torch.bfloat16, direction)
    assert toward + away >= 10 * FAR_MIN


def _once(call: str, *args: object, **kwargs: object) -> torch.Tensor | None:
    return rounded_once_of(parse_call_name(call), None, Inputs(list(args), kwargs, []))


def test_only_16bit_first_arguments_get_a_mask():
    x = torch.randn(4, 8)
    assert _once("Functional.layer_norm.0.forward", x, [8]) is None
    mask = _once("Functional.layer_norm.0.forward", x.bfloat16(), [8])
    assert mask is not None and mask.shape == x.shape and bool(mask.all())
    assert _once("Functional.layer_norm.0.backward", x.half(), [8]) is None
    assert _once("Functional.log_softmax.0.forward", x.half(), -1) is None


def test_gelu_masks_its_cancelled_tail():
    x = torch.tensor([-4.0, -2.6, -2.5, -1.0, -0.4, 0.0, 3.0]).bfloat16()
    assert _once("Functional.gelu.0.forward", x).tolist() == [False, False, True, True, True, True, True]
    assert _once("Functional.gelu.0.backward", x).tolist() == [False, False, False, False, True, True, True]


def test_batch_norm_is_rounded_once_with_running_statistics_only():
    x, stats = torch.randn(4, 3, 5).half(), torch.ones(3).half()
    assert _once("Functional.batch_norm.0.forward", x, stats, stats, None, None, False) is not None
    assert _once("Functional.batch_norm.0.forward", x, None, None, None, None, True) is None
    assert _once("Functional.batch_norm.0.forward", x, None, None, training=True) is None


def test_in_place_forms_share_the_kernel_and_a_bad_argument_gets_no_mask():
    assert _once("Tensor.sigmoid_.0.forward", torch.randn(3).bfloat16()) is not None
    assert _once("Functional.gelu.0.forward", "not a tensor") is None
