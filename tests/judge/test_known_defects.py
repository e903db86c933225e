"""Known library defects (pytest_msprobe/judge/defects/table.py), labelled wherever a failing
call shows: torch's CPU kernels' reduced-precision defects that real models' dumps show
(a bfloat16 `0.79788456 + x`, a bfloat16 layer_norm backward over many rows, a
bfloat16 cross_entropy backward, a bfloat16 batch_norm with bfloat16 weights), each in a
small dump written here, fail and are
labelled in the message, the result files and the HTML report; the same APIs with a
planted new fault (a truncating add, a NaN, a biased gradient) fail and are not;
--msprobe-known-defects=xfail makes the known ones expected failures, never passes.

Before the table, none of these failures said it was a known defect (on main every
labelled assertion below fails)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from pytest_msprobe.judge.defects.reproduce import by_name, main
from pytest_msprobe.judge.defects.table import BY_ID, DEFECTS, REPRODUCE
from pytest_msprobe.testing.dumpwriter import DumpWriter
from pytest_msprobe.testing.model_faults import truncate_to_bfloat16

SCALAR = 0.79788456  # GPT-2's sqrt(2 / pi), written out
ROWS = {
    "radd": "torch-cpu-scalar-rounded",
    "sub": "torch-cpu-scalar-rounded",
    "layer_norm": "torch-cpu-layer-norm-affine-sums",
    "cross_entropy": "torch-cpu-cross-entropy-rounded-log-softmax",
    "batch_norm": "torch-cpu-batch-norm-statistics",
}
CALLS = {
    "radd": "Tensor.__radd__.0.forward",
    "sub": "Tensor.__sub__.0.forward",
    "layer_norm": "Functional.layer_norm.0.backward",
    "cross_entropy": "Functional.cross_entropy.0.backward",
    "batch_norm": "Functional.batch_norm.0.forward",
}


def _generator(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def write_dump(root: Path) -> Path:
    """One dump of the four calls, as a bfloat16 model on the CPU records them."""
    writer = DumpWriter(root, "tensor")
    x = (torch.randn(64, 64, generator=_generator()) * 0.05).bfloat16()  # x + s near s: every sum carries s's rounding
    writer.forward("Tensor.__radd__.0", [x, SCALAR], {}, SCALAR + x)
    writer.forward("Tensor.__sub__.0", [x, SCALAR], {}, x - SCALAR)
    generator = _generator(1)
    rows = 4096  # the bias gradient's sum in bfloat16 drifts far beyond the standard's limit
    inputs = torch.randn(rows, 32, generator=generator).bfloat16()
    grad = (torch.randn(rows, 32, generator=generator) + 0.5).bfloat16()
    weight = (1 + 0.1 * torch.randn(32, generator=generator)).bfloat16()
    bias = torch.zeros(32).bfloat16()
    leaves = [t.clone().requires_grad_() for t in (inputs, weight, bias)]
    out = F.layer_norm(leaves[0], (32,), leaves[1], leaves[2])
    out.backward(grad)
    writer.forward("Functional.layer_norm.0", [inputs, [32], weight, bias], {}, out.detach())
    writer.backward("Functional.layer_norm.0", [grad], [leaf.grad for leaf in leaves])
    generator = _generator(0)
    logits = (torch.randn(8, 128, generator=generator) * 0.1).bfloat16()  # rows shift by a whole ULP and more
    target = torch.randint(0, 128, (8,), generator=generator)
    leaf = logits.clone().requires_grad_()
    loss = F.cross_entropy(leaf, target)
    loss.backward()
    writer.forward("Functional.cross_entropy.0", [logits, target], {}, loss.detach())
    writer.backward("Functional.cross_entropy.0", [torch.ones((), dtype=torch.bfloat16)], [leaf.grad])
    # a model cast with .to(torch.bfloat16): weight and bias in bfloat16; mean 16 times the spread
    inputs = (torch.randn(4, 8, 8, 8, generator=_generator()) + 16).bfloat16()
    weight, bias = torch.ones(8).bfloat16(), torch.zeros(8).bfloat16()
    out = F.batch_norm(inputs, None, None, weight, bias, True)
    writer.forward("Functional.batch_norm.0", [inputs, None, None, weight, bias, True], {}, out)
    return writer.write()


@pytest.fixture(scope="module")
def dump(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_dump(tmp_path_factory.mktemp("known"))


def _records(out: Path) -> dict[str, dict]:
    (journal,) = out.glob("msprobe_records_*.jsonl")
    return {record["call"]: record for record in map(json.loads, journal.read_text().splitlines())}


def _metrics(out: Path) -> dict[str, set[str]]:
    """call -> the known_defect values of its outputs' lines in the metrics file."""
    (metrics,) = out.glob("accuracy_checking_metrics_*.jsonl")
    found: dict[str, set[str]] = {}
    for line in map(json.loads, metrics.read_text().splitlines()):
        found.setdefault(f"{line['call']}.{line['direction']}", set()).add(line.get("known_defect", ""))
    return found


@pytest.fixture
def one_thread():
    """One thread: the kernel's sums and the symptom's recomputation split the rows alike
    on any machine (both read torch.get_num_threads() in this process)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_a_known_defect_fails_labelled_in_the_message_the_files_and_the_report(dump, tmp_path, run_dump, one_thread):
    out, html = tmp_path / "out", tmp_path / "report.html"
    run = run_dump(dump, "--msprobe-device=cpu", f"--msprobe-out={out}", f"--msprobe-html={html}")
    records, metrics, page = _records(out), _metrics(out), html.read_text()
    (details,) = out.glob("accuracy_checking_details_*.csv")
    details_text = details.read_text(encoding="utf-8-sig")
    for case, call in CALLS.items():
        row = BY_ID[ROWS[case]]
        outcome = run.calls[call]
        assert outcome.outcome == "failed", (case, outcome.text)  # the verdict stands: still an error
        assert f"known defect {row.id} of torch CPU" in outcome.text, outcome.text
        assert f"{REPRODUCE} {row.id}" in outcome.text and "seen on torch 2.13" in outcome.text
        assert records[call]["status"] == "error" and records[call]["known_defect"] == row.id
        assert row.id in metrics[call]
        assert f"known defect {row.id}" in details_text
        assert f"known defect {row.id}" in page
    assert f"{len(CALLS)} errors in " in page and f"{len(CALLS)} of them known library defects" in page  # the headline
    assert "Tensor.__mul__" not in records  # (a correct op: no row for it)
    assert all("known_defect" not in record for record in records.values() if record["status"] == "pass")


def _truncating_radd(original):
    """Tensor.__radd__ in bfloat16 rounded toward zero: a new fault in the scalar op."""

    def radd(self, other):
        out = original(self, other)
        if self.dtype != torch.bfloat16:
            return out
        return truncate_to_bfloat16(self.float() + other)

    return radd


def _nan_sub(original):
    """Tensor.__sub__ with the scalar rounded as torch does and one NaN: a NaN is new."""

    def sub(self, other):
        out = original(self, other)
        if self.dtype == torch.bfloat16:
            out = out.clone()
            out.view(-1)[7] = float("nan")
        return out

    return sub


class _BiasedGradient(torch.autograd.Function):
    """Identity forward; the backward scales the gradient by 1 + 2**-4 (a biased kernel)."""

    @staticmethod
    def forward(ctx, tensor):
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, grad):
        return grad * (1 + 2.0**-4)


def _biased_backward(original, position):
    """The API with its `position`-th argument's gradient biased in bfloat16."""

    def api(*args, **kwargs):
        if isinstance(args[0], torch.Tensor) and args[0].dtype == torch.bfloat16:
            args = list(args)
            args[position] = _BiasedGradient.apply(args[position])
        return original(*args, **kwargs)

    return api


def _biased_output(original):
    """The API's bfloat16 output scaled by 1 + 2**-5 (a biased kernel)."""

    def api(*args, **kwargs):
        out = original(*args, **kwargs)
        return out * (1 + 2.0**-5) if out.dtype == torch.bfloat16 else out

    return api


PLANTED = {
    "radd": (torch.Tensor, "__radd__", _truncating_radd),
    "sub": (torch.Tensor, "__sub__", _nan_sub),
    "layer_norm": (F, "layer_norm", lambda original: _biased_backward(original, 2)),  # the weight's gradient
    "cross_entropy": (F, "cross_entropy", lambda original: _biased_backward(original, 0)),
    "batch_norm": (F, "batch_norm", _biased_output),
}


@pytest.mark.parametrize("case", PLANTED)
def test_a_new_fault_in_the_same_api_fails_unlabelled(case, dump, tmp_path, run_dump, monkeypatch, one_thread):
    owner, attr, fault = PLANTED[case]
    monkeypatch.setattr(owner, attr, fault(getattr(owner, attr)))
    out = tmp_path / "out"
    run = run_dump(dump, "--msprobe-device=cpu", f"--msprobe-out={out}", "-k", attr.strip("_"))
    outcome = run.calls[CALLS[case]]
    assert outcome.outcome == "failed", outcome.text
    assert "known defect" not in outcome.text, outcome.text
    assert "known_defect" not in _records(out)[CALLS[case]]


def test_xfail_reports_known_defects_as_expected_failures(dump, tmp_path, run_dump, monkeypatch, one_thread):
    """Under --msprobe-known-defects=xfail the known ones are xfailed with the row in the
    reason; a planted fault in another call still fails; the summary counts them apart."""
    monkeypatch.setattr(torch.Tensor, "__radd__", _truncating_radd(torch.Tensor.__radd__))
    out = tmp_path / "out"
    run = run_dump(dump, "--msprobe-device=cpu", f"--msprobe-out={out}", "--msprobe-known-defects=xfail")
    assert run.calls[CALLS["radd"]].outcome == "failed"  # the new fault
    for case in ("sub", "layer_norm", "cross_entropy", "batch_norm"):
        outcome = run.calls[CALLS[case]]
        assert outcome.outcome == "skipped", outcome.text  # pytest's xfail
        assert f"known defect {ROWS[case]} (--msprobe-known-defects=xfail)" in outcome.text
    assert run.ret == pytest.ExitCode.TESTS_FAILED


def test_the_summary_counts_known_defects_apart(dump, pytester, one_thread):
    result = pytester.runpytest_inprocess(f"--msprobe-dump={dump}", "--msprobe-device=cpu", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(
        [
            "5 failing calls are known library defects, not new faults: torch-cpu-scalar-rounded (2), "
            "torch-cpu-layer-norm-affine-sums (1), torch-cpu-cross-entropy-rounded-log-softmax (1), "
            "torch-cpu-batch-norm-statistics (1); --msprobe-known-defects=xfail makes them expected failures",
            "worst calls:",
        ]
    )
    # each worst call says which known defect it is
    worst = result.outlines[result.outlines.index("worst calls:") + 1 :]
    rows = list(itertools.takewhile(lambda line: line.startswith("  "), worst))
    assert len(rows) == 5 and all(": known defect torch-cpu-" in row for row in rows), rows


def test_an_unknown_choice_of_the_option_is_a_usage_error(dump, pytester):
    result = pytester.runpytest_inprocess(f"--msprobe-dump={dump}", "-o", "msprobe_known_defects=pass")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*msprobe_known_defects = 'pass': expected one of fail, xfail*"])


def test_every_row_has_a_shipped_reproducer_and_is_on_the_docs_page():
    """The rows' reproducers exist in the package; the docs page includes the table
    generated from the rows (docs/_ext), so the two cannot drift."""
    names = by_name()
    assert [row.id for row in DEFECTS if row.reproducer not in names] == []
    assert len(BY_ID) == len(DEFECTS)
    page = (Path(__file__).parents[2] / "docs" / "explanation" / "findings.md").read_text()
    assert "```{include} ../_generated/known-defects.md" in page


def test_a_reproducer_runs_by_its_row(capsys):
    assert main(["torch-cpu-scalar-rounded"]) == 0
    printed = capsys.readouterr().out
    assert "0 off the result with s rounded to 0.796875" in printed
    with pytest.raises(SystemExit):
        main(["torch-cpu-scalar"])
    assert "did you mean torch-cpu-scalar-rounded" in capsys.readouterr().err
