"""Calibration of the single-run rule: correct CPU kernels pass, planted faults fail.

Measured (2 seeds x 31 forward kernels x 3 dtypes + 9 valid fp32 rewrites = 213 correct
outputs, plus 2 seeds x 20 autograd BACKWARD set-ups x 3 dtypes = 120 gradient calls;
60 planted faults over fp32/fp16/bf16): false alarms 0/333, detection 60/60.
"""
import pytest

from pytest_msprobe.standards import check

from kernels import backward_cases, correct_cases, faults, valid_rewrites

CORRECT = list(correct_cases())
REWRITES = list(valid_rewrites())
BACKWARD = list(backward_cases())
FAULTS = faults()


CORRECT_OUTPUTS = [("forward", *c) for c in CORRECT] + [("rewrite", *c) for c in REWRITES] + [("backward", *c) for c in BACKWARD]


@pytest.mark.parametrize("kind,name,api,bench,device", CORRECT_OUTPUTS, ids=[f"{c[0]}-{c[1]}" for c in CORRECT_OUTPUTS])
def test_correct_output_passes_without_warning(kind, name, api, bench, device):
    """A correct CPU kernel (forward or gradient) or a valid float32 rewrite."""
    verdict = check(bench, device, api=api)
    assert verdict.status == "pass", verdict.message()


@pytest.mark.parametrize("name,api,bench,device", FAULTS, ids=[c[0] for c in FAULTS])
def test_planted_fault_is_an_error(name, api, bench, device):
    verdict = check(bench, device, api=api)
    assert verdict.status == "error", verdict.message()
    assert verdict.reasons


def test_corpus_sizes_match_the_rates_in_the_docstring():
    """Each case is judged above; here the docstring's counts are kept honest."""
    assert (len(CORRECT_OUTPUTS), len(FAULTS)) == (333, 60)


def _softmax_grad(dtype, seed: int):
    """Softmax's input gradient on the CPU: in `dtype`, and in float32 from the same
    inputs, for an upstream gradient of 0.5 + 0.2 * U(0, 1) (near constant)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(4, 5, 5, generator=generator).to(dtype)
    upstream = (0.5 + 0.2 * torch.rand(4, 5, 5, generator=generator)).to(dtype)

    def grad(compute):
        leaf = x.detach().to(compute).requires_grad_()
        torch.softmax(leaf, dim=-1).backward(upstream.to(compute))
        return leaf.grad

    return grad(torch.float32), grad(dtype)


@pytest.mark.xfail(strict=True, reason="known limit (single_run.py, 'Known limits'): the gradient cancels "
                   "(y * (g - sum(g * y)) with g near constant) far below the scale of its terms, and the "
                   "float16/bfloat16 rounding of the saved softmax output costs tens of ULPs at the output's scale")
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_softmax_grad_of_a_near_constant_upstream_gradient_passes(dtype):
    import torch

    verdicts = [check(*_softmax_grad(getattr(torch, dtype), seed), api="softmax") for seed in range(10)]
    assert [v.status for v in verdicts] == ["pass"] * 10
