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
