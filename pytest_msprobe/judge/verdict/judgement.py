"""What a call's verdict is made from (Judgement), and the ways a call judged error is
judged again (RE_JUDGEMENTS), in order.

A verdict against the bench can be an error that no fault of the kernel explains: the
standard of a plain backward holds one that sums overlapping contributions, a sum of
products cancels, the bench saves its forward results in a wider dtype than the device,
the device ran the reference in another memory layout. Each such way of judging is one
row of RE_JUDGEMENTS (a name, `applies`, `run`), tried in order while the verdict is an
error, as torch.testing's `pair_types` or judge/explore/overflow_excuses.py's EXCUSES: one more way of
judging is one more row. Every row gets and returns a Judgement, so what one row
evaluates (the terms' magnitudes, the summed route) is there for the next.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

from pytest_msprobe.judge.verdict.groups import groups_of
from pytest_msprobe.judge.verdict.rounding import rounded_once_of
from pytest_msprobe.judge.verdict.summed import summed_route, sums_contributions
from pytest_msprobe.judge.verdict.terms import term_magnitudes
from pytest_msprobe.judge.verdict.written_rows import cut, written
from pytest_msprobe.run.replay import Run, evaluate, saved_in_device_dtype

if TYPE_CHECKING:
    import torch

    from pytest_msprobe.dump.index import CallName
    from pytest_msprobe.dump.values import Nested
    from pytest_msprobe.judge.offline.layouts import LayoutReferences
    from pytest_msprobe.run.replay import Results, Side
    from pytest_msprobe.standards import Registry, Verdict

SUMMED_LABEL = "a backward that sums overlapping contributions (judge/verdict/summed.py)"

#: a baseline's recorded metrics of a call: {output path: {metric: value}} (standards' reference=)
Recorded: TypeAlias = dict[str, dict[str, float]]


@dataclass(frozen=True)
class Judgement:
    """What a call's verdict is made from, and the verdict so far."""

    registry: Registry
    name: CallName
    results: Results  # what is judged: a re-judgement's own where its verdict stands (the report's samples show them)
    bench: Side  # the bench run: re-judgements evaluate it again
    framework: str
    recorded: Recorded | None = None  # a baseline's metrics, judged against instead of the reference run
    layouts: LayoutReferences | None = (
        None  # offline: the reference run in the other memory layouts (judge/offline/layouts.py)
    )
    groups: torch.Tensor | None = (
        None  # elements sharing a rounded normaliser, for the bias tests (judge/verdict/groups.py)
    )
    # the 16-bit elements a correct kernel rounds once, for the far-misrounding test (judge/verdict/rounding.py)
    rounded_once: torch.Tensor | None = None
    route: str | None = None  # the standard's routing name; None: the call's API
    terms: Nested = (
        None  # each element's terms' magnitudes (judge/verdict/terms.py), once a re-judgement evaluated them
    )
    verdict: Verdict | None = None  # None until judged (judge_and_rejudge() judges it against the bench first)

    @property
    def error(self) -> bool:
        """Whether the verdict so far is an error: only then is the call judged again."""
        return self.verdict is not None and self.verdict.status == "error"

    def require_verdict(self) -> Verdict:
        """The verdict, once judged."""
        if self.verdict is None:
            raise ValueError(f"{self.name} is not judged yet: judge_and_rejudge() judges it")
        return self.verdict


@dataclass(frozen=True)
class Rejudgement:
    """One way of judging a call again where its verdict is an error."""

    name: str  # what it judges against (exploration counts its excused examples by it: judge/explore/search.py)
    applies: Callable[[Judgement], bool]
    run: Callable[
        [Judgement], Judgement
    ]  # the judgement again: its new verdict, or the one it had where the error stands


def judge(judgement: Judgement) -> Verdict:
    """The standards' verdict of the results: against recorded baseline metrics when
    given, else against the reference run where there is one; conditioned on the
    elements' terms' magnitudes when given; the bias tests counting the groups of
    elements that share a rounded normaliser when given (judge/verdict/groups.py), and the
    far-misrounding test reading the elements a correct kernel rounds once
    (judge/verdict/rounding.py); by the standard of the route (default: the call's API)."""
    results = judgement.results
    reference = judgement.recorded if judgement.recorded is not None else results.reference
    api = judgement.route or judgement.name.operator
    return judgement.registry.check(
        results.bench,
        results.device,
        api=api,
        reference=reference,
        terms=judgement.terms,
        groups=judgement.groups,
        rounded_once=judgement.rounded_once,
    )


def judge_and_rejudge(judgement: Judgement) -> Judgement:
    """The verdict against the bench (by the groups of the call's outputs and the
    elements rounded once), then each re-judgement of RE_JUDGEMENTS that applies, in
    order, while it is an error."""
    name, bench, inputs = judgement.name, judgement.bench, judgement.results.inputs
    grouped = dataclasses.replace(
        judgement, groups=groups_of(name, bench, inputs), rounded_once=rounded_once_of(name, bench, inputs)
    )
    return rejudge(dataclasses.replace(grouped, verdict=judge(grouped)), RE_JUDGEMENTS)


def rejudge(judgement: Judgement, table: Sequence[Rejudgement]) -> Judgement:
    """Each row of `table` that applies, in order, while the verdict is an error."""
    for row in table:
        if judgement.error and row.applies(judgement):
            judgement = row.run(judgement)
    return judgement


def relabel(verdict: Verdict, how: str) -> Verdict:
    """The verdict, its reference (and its outputs') saying how it was reached."""
    outputs = tuple(relabel(output, how) for output in verdict.outputs)
    return dataclasses.replace(verdict, reference=f"{verdict.reference}, {how}", outputs=outputs)


def _sums_contributions(judgement: Judgement) -> bool:
    return sums_contributions(
        judgement.name, judgement.bench, judgement.results.inputs, judgement.framework
    )  # judge/verdict/summed.py


def _by_summed_route(judgement: Judgement) -> Judgement:
    """A backward that sums overlapping contributions, by its own standard: that
    verdict stands, an error too (the next rows judge by that route)."""
    routed = dataclasses.replace(judgement, route=summed_route(judgement.name))
    return dataclasses.replace(routed, verdict=relabel(judge(routed), SUMMED_LABEL))


def _always(judgement: Judgement) -> bool:
    return True


def _conditioned_on_terms(judgement: Judgement) -> Judgement:
    """Where the outputs are sums of products, with each element's terms' magnitude
    (one more bench evaluation, only here); the terms stay for the next rows, where
    the error stands too."""
    terms = _align_terms(
        term_magnitudes(judgement.name, judgement.bench, judgement.results.inputs, judgement.framework),
        judgement.results.bench,
    )
    with_terms = dataclasses.replace(judgement, terms=_cut_as_results(terms, judgement))
    if with_terms.terms is None:
        return with_terms
    conditioned = judge(with_terms)
    if conditioned.status == "error":
        return with_terms
    return dataclasses.replace(with_terms, verdict=relabel(conditioned, "conditioned on the terms' magnitudes"))


def _cut_as_results(value: Nested, judgement: Judgement) -> Nested:
    """A re-evaluation cut as the results were (judge/verdict/written_rows.py)."""
    where = written(judgement.name, judgement.results.inputs, judgement.framework)
    return cut(value, where) if value is not None and where is not None else value


def _align_terms(terms: Nested, bench: Nested) -> Nested:
    """The terms with the bench's structure: None where offline alignment left a
    gradient out of the comparison."""
    if isinstance(terms, tuple) and isinstance(bench, tuple) and len(terms) == len(bench):
        return tuple(None if b is None else t for t, b in zip(terms, bench, strict=True))
    return terms


def _backward_without_reference(judgement: Judgement) -> bool:
    """A backward judged by the single-run rule, or against a baseline whose metrics may
    come from the same re-judgement."""
    return judgement.name.direction == "backward" and judgement.results.reference is None


def _against_saved_in_device_dtype(judgement: Judgement) -> Judgement:
    """Against the bench that saves its forward results in the device dtype
    (replay.saved_in_device_dtype), with those results, where that is not an error;
    else the error against the plain bench stands."""
    inputs, bench = judgement.results.inputs, judgement.bench
    saved_in_d = saved_in_device_dtype(bench, inputs) if isinstance(bench, Run) else None
    grads = evaluate(saved_in_d, "backward", inputs, judgement.framework) if saved_in_d is not None else None
    if saved_in_d is None or saved_in_d.saved_in is None or grads is None:
        return judgement
    again = dataclasses.replace(
        judgement, results=dataclasses.replace(judgement.results, bench=_cut_as_results(grads, judgement))
    )
    verdict = judge(again)
    if verdict.status == "error":
        return judgement
    return dataclasses.replace(
        again,
        verdict=relabel(verdict, f"forward results saved in {str(saved_in_d.saved_in[1]).removeprefix('torch.')}"),
    )


def _in_other_layouts(judgement: Judgement) -> bool:
    return judgement.layouts is not None and judgement.recorded is None and judgement.results.reference is not None


def _against_other_layouts(judgement: Judgement) -> Judgement:
    """Against the reference in each other memory layout the device may have run
    (judge/offline/layouts.py), each judged afresh by every row above: the least severe verdict
    stands (one layout's reference at a time: their metrics are never mixed); where
    every layout's is an error, the contiguous one's does, saying so."""
    from pytest_msprobe.standards.verdict import STATUS_ORDER

    assert judgement.layouts is not None  # _in_other_layouts
    results = judgement.results
    others = {
        layout: judge_and_rejudge(
            Judgement(
                judgement.registry,
                judgement.name,
                dataclasses.replace(results, reference=reference),
                judgement.bench,
                judgement.framework,
            )
        )
        for layout, reference in judgement.layouts.outputs(results.reference).items()
    }
    least = min(others, key=lambda layout: STATUS_ORDER[others[layout].require_verdict().status], default=None)
    if least is None:
        return judgement
    again = others[least]
    if again.error:
        how = f"an error against the reference run in {' and '.join(others)} layout too"
        return dataclasses.replace(judgement, verdict=relabel(judgement.require_verdict(), how))
    return dataclasses.replace(
        again,
        verdict=relabel(
            again.require_verdict(), f"against the reference run in {least} layout (the device may have run it)"
        ),
    )


#: The re-judgements of a call judged error, in the order they are tried.
RE_JUDGEMENTS = (
    Rejudgement(
        "by the standard of a backward that sums overlapping contributions", _sums_contributions, _by_summed_route
    ),
    Rejudgement("conditioned on the terms' magnitudes", _always, _conditioned_on_terms),
    Rejudgement(
        "against the bench saving its forward results in the device dtype",
        _backward_without_reference,
        _against_saved_in_device_dtype,
    ),
    Rejudgement("against the reference run in the other memory layouts", _in_other_layouts, _against_other_layouts),
)
