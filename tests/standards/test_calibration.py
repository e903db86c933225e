"""Calibration of the single-run rule: correct CPU kernels pass, planted faults fail.

Measured (2 seeds x 31 forward kernels x 3 dtypes + 9 valid fp32 rewrites = 213 correct
outputs, plus 2 seeds x 20 autograd BACKWARD set-ups x 3 dtypes = 120 gradient calls;
60 planted faults over fp32/fp16/bf16): false alarms 0/333, detection 60/60.
"""
import pytest
import torch

from pytest_msprobe.standards import check

from kernels import backward_cases, correct_cases, faults, valid_rewrites

CORRECT = list(correct_cases())
REWRITES = list(valid_rewrites())
BACKWARD = list(backward_cases())
FAULTS = faults()


@pytest.mark.parametrize("name,api,bench,device", CORRECT, ids=[c[0] for c in CORRECT])
def test_correct_cpu_kernel_passes_without_warning(name, api, bench, device):
    verdict = check(bench, device, api=api)
    assert verdict.status == "pass", verdict.message()


@pytest.mark.parametrize("name,api,bench,device", REWRITES, ids=[c[0] for c in REWRITES])
def test_valid_float32_rewrite_passes(name, api, bench, device):
    verdict = check(bench, device, api=api)
    assert verdict.status == "pass", verdict.message()


@pytest.mark.parametrize("name,api,bench,device", BACKWARD, ids=[c[0] for c in BACKWARD])
def test_correct_cpu_gradient_passes_without_warning(name, api, bench, device):
    verdict = check(bench, device, api=api)
    assert verdict.status == "pass", verdict.message()


@pytest.mark.parametrize("name,api,bench,device", FAULTS, ids=[c[0] for c in FAULTS])
def test_planted_fault_is_an_error(name, api, bench, device):
    verdict = check(bench, device, api=api)
    assert verdict.status == "error", verdict.message()
    assert verdict.reasons


def test_rates_recorded_in_docstring_are_current():
    correct = CORRECT + REWRITES + BACKWARD
    false_alarms = sum(check(b, d, api=a).status != "pass" for _, a, b, d in correct)
    detected = sum(check(b, d, api=a).status == "error" for _, a, b, d in FAULTS)
    assert (len(correct), false_alarms) == (333, 0)
    assert (len(FAULTS), detected) == (60, 60)
