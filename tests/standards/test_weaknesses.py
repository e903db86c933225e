"""The spec's known weaknesses: each shown on msprobe's legacy rules, and fixed here."""

import torch
import torch.nn.functional as F

from pytest_msprobe.standards import check
from pytest_msprobe.standards.legacy import msprobe_legacy_status


def test_masked_minus_inf_is_agreement():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 64, generator=g)
    mask = torch.rand(8, 64, generator=g) > 0.5
    bench = x.double().masked_fill(mask, float("-inf"))
    device = x.masked_fill(mask, float("-inf"))
    assert msprobe_legacy_status(bench.numpy(), device.numpy(), "float32") == "error"
    for api in ("masked_fill", "softmax_scores", "add"):
        assert check(bench, device, api=api).status == "pass"


def test_correct_bfloat16_is_not_a_warning():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 512, generator=g).bfloat16()
    bench, device = F.gelu(x.float()), F.gelu(x)
    assert msprobe_legacy_status(bench.numpy(), device.float().numpy(), "bfloat16") == "warning"
    v = check(bench, device, api="gelu")
    assert v.status == "pass" and "rel_err_thousandth" in v.metrics  # reported, not judged
    assert check(bench, device, api="conv2d").status == "pass"  # thousandth fixed too
    assert check(bench, device, api="legacy_only_x").status == "pass"


def test_lone_nan_is_an_error():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(20000, generator=g)
    bench, device = torch.tanh(x.double()), torch.tanh(x)
    device[7] = float("nan")
    assert msprobe_legacy_status(bench.numpy(), device.numpy(), "float32") in ("pass", "warning")
    v = check(bench, device, api="tanh")
    assert v.status == "error" and "NaN" in v.reasons[0] and v.worst[0].index == (7,)


def test_systematic_bias_is_an_error():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4096, generator=g) * 3
    bench = torch.exp(x.double())
    device = (bench * (1 + 30 * 2.0**-23)).float()  # every element ~30 ulp too large
    assert msprobe_legacy_status(bench.numpy(), device.numpy(), "float32") == "pass"
    v = check(bench, device, api="exp")
    assert v.status == "error" and any("bias" in r for r in v.reasons)
    xh = x.half()
    bh = torch.exp(xh.float())
    dh = (bh.double() * (1 + 3 * 2.0**-10)).half()  # 3 ulp in fp16
    assert msprobe_legacy_status(bh.numpy(), dh.float().numpy(), "float16") != "error"
    assert check(bh, dh, api="exp").status == "error"
