"""judge/verdict/judgement.py: a Judgement is what a verdict is made from; the re-judgements are
rows of an ordered table, each tried where it applies while the verdict is an error."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from pytest_msprobe.dump.index import parse_call_name
from pytest_msprobe.judge.verdict.judgement import RE_JUDGEMENTS, Judgement, Rejudgement, judge_and_rejudge, rejudge
from pytest_msprobe.run.replay import Inputs, Results
from pytest_msprobe.standards import Registry
from pytest_msprobe.standards.verdict import Verdict


def _judgement(verdict: Verdict | None = None) -> Judgement:
    name = parse_call_name("Functional.relu.0.forward")
    assert name is not None
    x = torch.tensor([1.0, 2.0, 3.0])
    results = Results(x, x.double(), None, Inputs([x], {}, []))
    return Judgement(Registry.default(), name, results, bench=None, framework="pytorch", verdict=verdict)  # type: ignore[arg-type]


def _row(name: str, applies: bool, status: str, ran: list[str]) -> Rejudgement:
    """A row that notes that it ran and sets a verdict of `status`."""

    def run(judgement: Judgement) -> Judgement:
        ran.append(name)
        return dataclasses.replace(judgement, verdict=Verdict(status, name))

    return Rejudgement(name, lambda judgement: applies, run)


def test_an_unjudged_judgement_has_no_verdict_to_read() -> None:
    with pytest.raises(ValueError, match="not judged yet"):
        _judgement().require_verdict()
    assert not _judgement().error


def test_rows_run_in_order_where_they_apply_while_the_verdict_is_an_error() -> None:
    ran: list[str] = []
    table = [
        _row("a", True, "error", ran),
        _row("skipped", False, "pass", ran),
        _row("b", True, "warning", ran),
        _row("c", True, "pass", ran),
    ]
    judgement = rejudge(_judgement(Verdict("error", "benchmark")), table)
    assert ran == ["a", "b"]  # "c" never runs: "b" left no error
    assert judgement.require_verdict().status == "warning"


def test_no_row_runs_on_a_verdict_that_is_no_error() -> None:
    ran: list[str] = []
    judgement = rejudge(_judgement(Verdict("pass", "benchmark")), [_row("a", True, "error", ran)])
    assert ran == []
    assert judgement.require_verdict().status == "pass"


def test_the_re_judgements_keep_their_order() -> None:
    """The order is part of every verdict's reference text: the summed route first (the
    next rows judge by it), the terms (the saved-in-D bench judges with them), the
    layouts last (each layout judged afresh by every row before)."""
    assert [row.name for row in RE_JUDGEMENTS] == [
        "by the standard of a backward that sums overlapping contributions",
        "conditioned on the terms' magnitudes",
        "against the bench saving its forward results in the device dtype",
        "against the reference run in the other memory layouts",
    ]


def test_judged_judges_against_the_bench_first() -> None:
    judgement = judge_and_rejudge(_judgement())
    assert judgement.require_verdict().status == "pass"
    assert judgement.route is None and judgement.terms is None  # no re-judgement ran
