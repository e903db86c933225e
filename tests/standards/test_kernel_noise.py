"""Two correct kernels against each other: the noise a reference comparison allows."""

import torch

from pytest_msprobe.standards import check

SMALL = [3, 9, 17, 25]


def _with_small_values():
    """A float16 output of 32 elements, 4 of them small (|b| <= 2**-10, each exact in
    float16): the device is a float16 spacing off on 3 of those 4, the reference on 1, as
    two correct kernels' summation orders may be (a float16 layer_norm bias gradient
    written by torch's non-vectorised path on 2 threads, against every other path)."""
    bench = (torch.linspace(-2.0, 2.0, 32, dtype=torch.float32) + 0.01).half().float()
    bench[SMALL] = torch.tensor([2.0**-12, -3 * 2.0**-13, 5 * 2.0**-14, -(2.0**-11)])

    def off(indices: list[int]) -> torch.Tensor:
        bits = bench.half().view(torch.int16)
        bits[indices] += 1  # the next float16 away from zero
        return bits.view(torch.float16)

    return bench, off(SMALL[:3]), off(SMALL[:1])


def test_small_values_a_rounding_apart_are_noise_between_two_kernels():
    bench, device, reference = _with_small_values()
    verdict = check(bench, device, api="layer_norm", reference=reference)
    assert verdict.metrics["small_value_err_ratio"] == 0.75
    assert verdict.metrics["ref_small_value_err_ratio"] == 0.25
    assert verdict.status == "pass", verdict.message()
