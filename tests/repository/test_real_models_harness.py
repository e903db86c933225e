"""studies/real_models.py's reading of results: the error classes it names (a class
that swallowed a new error would hide it from the lead's re-run) and its tables."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from pytest_msprobe.testing.script_modules import load_script

real_models = load_script(Path(__file__).resolve().parents[2] / "studies" / "real_models.py")

SDPA = "Functional.scaled_dot_product_attention.0"


@pytest.fixture
def sdpa_dump(write_dump):
    """A dump of two sdpa calls: one with dropout_p 0.1 (random), one with 0.0."""

    def entry(p: float) -> dict:
        return {"input_args": [], "input_kwargs": {"dropout_p": {"type": "float", "value": p}}, "output": []}

    return write_dump(
        {f"{SDPA}.forward": entry(0.1), "Functional.scaled_dot_product_attention.1.forward": entry(0.0)}, task="tensor"
    )


def _verdict(
    call: str,
    message: str,
    dump: str = "/d/resnet_L1_tensor_bf16/dump.json",
    mode: str = "single",
    status: str = "error",
):
    return real_models.Verdict(mode, dump, call, status, f"{call}: {message}")


def test_each_known_class_matches_its_calls_and_an_unknown_error_stays_unclassified(sdpa_dump):
    exact = "error by binary_consistency: [0]: 117 of 32768 elements differ from the bench; this op must be exact"
    assert real_models.classify(_verdict("Functional.max_pool2d.0.backward", exact)).startswith(
        "false alarm: max_pool2d"
    )
    assert real_models.classify(_verdict("Functional.batch_norm.3.forward", "max_scaled_ulp_err 9 > 8")).startswith(
        "torch defect: batch_norm"
    )
    # the same batch_norm error in float32 is no torch defect we know of: it stays new
    assert (
        real_models.classify(
            _verdict("Functional.batch_norm.3.forward", "x", dump="/d/resnet_L1_tensor_fp32/dump.json")
        )
        == "unclassified"
    )
    leaf = "the device raised RuntimeError: a leaf Variable that requires grad is being used in an in-place operation."
    assert real_models.classify(_verdict("Tensor.__iadd__.0.backward", leaf, mode="offline")).startswith(
        "false alarm: an in-place"
    )
    assert real_models.classify(_verdict("Tensor.__iadd__.0.backward", leaf, mode="single")) == "unclassified"
    # sdpa is random only where its dumped dropout_p is not 0
    assert real_models.classify(_verdict(f"{SDPA}.backward", "x", dump=str(sdpa_dump))).startswith(
        "false alarm: scaled_dot"
    )
    assert (
        real_models.classify(_verdict("Functional.scaled_dot_product_attention.1.forward", "x", dump=str(sdpa_dump)))
        == "unclassified"
    )
    assert real_models.classify(_verdict("Functional.linear.0.forward", "max_ulp_err 900 > 64")) == "unclassified"


def test_the_tables_count_every_verdict_and_name_each_skip_once():
    verdicts = [
        _verdict("Functional.linear.0.forward", "pass", status="pass"),
        _verdict("Functional.linear.0.backward", "pass", status="pass", mode="offline"),
        _verdict("Functional.dropout.0.forward", "Functional.dropout draws random numbers (p = 0.1)", status="skip"),
        _verdict("Functional.dropout.1.forward", "Functional.dropout draws random numbers (p = 0.2)", status="skip"),
        _verdict("Functional.linear.1.forward", "max_ulp_err 900 > 64"),
    ]
    options = argparse.Namespace(modes=["single", "offline"], dumps=Path("/d"), workers=2, label="before")
    text = real_models.markdown(verdicts, {"single": 1.0, "offline": 2.0}, options)
    assert "| single | 4 | 1 | 0 | 1 | 2 | 50.0% | 1 |" in text
    assert "| offline | 1 | 1 | 0 | 0 | 0 | 0.0% | 2 |" in text
    assert "| Functional.dropout | forward | 2 | 0 | Functional.dropout draws random numbers (p = N) |" in text
    assert (
        "| unclassified | single | error | resnet_L1_tensor_bf16 | Functional.linear.1.forward | max_ulp_err 900 > 64 |"
        in text
    )


def test_a_rerun_keeps_the_notes_written_by_hand(tmp_path):
    results = tmp_path / "RESULTS.md"
    assert real_models.kept_notes(results) == ""
    results.write_text(f"# old tables\n\n{real_models.NOTES} (today)\n\nwhy relu.0 passes\n", encoding="utf-8")
    assert real_models.kept_notes(results) == f"\n{real_models.NOTES} (today)\n\nwhy relu.0 passes\n"
