"""The result of one call as plain data: what reports, baselines, resume and scripts
read. It travels from xdist workers to the controller inside the test report."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NotRequired, TypeAlias, TypedDict, final

if TYPE_CHECKING:
    from pytest_msprobe.dump.index import Json, Record
    from pytest_msprobe.standards import Verdict
    from pytest_msprobe.standards.verdict import Status

# The record (and test) of a call's exploration (judge/explore/search.py): `<call name>.explore`.
EXPLORED_SUFFIX = ".explore"

#: One of the worst elements the standard named: its index, the device's value, the
#: bench's. A JSON array on the wire, so a list once a record is read back.
WorstElement: TypeAlias = "tuple[list[int], float, float]"


class Heatmap(TypedDict):
    """The largest scaled error in each cell of a grid over an output of 2 dimensions
    or more: `rows` (all leading dimensions) by `cols` (the last), cut into the cells
    of `grid` (judge/check/samples.py's heatmap)."""

    rows: int
    cols: int
    grid: list[list[float]]


@final
class ElementSample(TypedDict):
    """Elements of one judged output for the HTML report's plots (judge/check/samples.py
    says how they are drawn). A TypedDict, not a class: a record crosses from the xdist
    workers and into the journal as JSON, and a sample stays the plain object it was.
    Integer and bool outputs keep only `output` and `worst`."""

    output: int  # the output's position among the record's outputs
    worst: list[WorstElement]
    flat: NotRequired[list[int]]  # the sampled elements' flat indices
    bench: NotRequired[list[float]]  # their bench values, float64
    device: NotRequired[list[float]]  # their device values, float64
    rms: NotRequired[float]  # the RMS of the finite bench values: the single-run rules' scale
    heatmap: NotRequired[Heatmap]


@final
class SampleError(TypedDict):
    """Why no sample could be taken: the report says so, the verdict stands."""

    error: str


Sample: TypeAlias = "ElementSample | SampleError"


@dataclass
class OutputResult:
    """One compared output (forward output or produced gradient)."""

    index: int  # position among the call's compared leaves: `...forward.output.{index}`
    path: str
    status: Status
    standard: str
    reference: str
    device_dtype: str
    bench_dtype: str
    shape: list[int]
    metrics: dict[str, float]
    thresholds: dict[str, float]
    reasons: list[str]
    # the metrics the reasons name as failed, each with the limit it crossed (Verdict.failed)
    failed: dict[str, float] = field(default_factory=dict)
    # columns of the checks beside the standards (judge/findings/finding.py: nondeterministic_*,
    # overflow*) for the metrics file; empty where none found anything
    findings: dict[str, Json] = field(default_factory=dict)


@dataclass
class ResultRecord:
    dump: str  # the dump.json path as given to pytest (absolute)
    call: str  # the full call name, direction included
    status: Status
    standard: str
    reference: str
    device: str
    message: str
    outputs: list[OutputResult] = field(default_factory=list)
    origins: list[str] = field(default_factory=list)
    duration: float = 0.0
    # Elements of some outputs for the HTML report's plots (judge/check/samples.py); empty,
    # and absent from to_dict, unless --msprobe-html asked for them.
    samples: list[Sample] = field(default_factory=list)
    # The known library defect (judge/defects/table.py's row id) an error matches; "", and
    # absent from to_dict, for every other call.
    known_defect: str = ""
    # A failure's text at the run's verbosity (Verdict.message's detail), for the terminal;
    # empty: the message. Never written: the files keep `message`, which holds everything.
    shown: str = ""
    # --msprobe-bug-reports: the failing call reduced (scripts/bug_report.py): its
    # "size" (`4x8x128 -> 1x1x8`), "elements" kept and "folder"; empty, and absent from
    # to_dict, without that option or where the call was not reduced.
    reduction: Record = field(default_factory=dict)

    def to_dict(self) -> Record:
        """Plain data for the report (dataclasses.asdict deep-copies: 5x slower here)."""
        data = {**vars(self), "outputs": [dict(vars(output)) for output in self.outputs], "origins": list(self.origins)}
        del data["shown"]
        for optional in ("samples", "known_defect", "reduction"):
            if not data[optional]:
                del data[optional]  # the journal of a run without them (most calls) stays as it was
        return data

    @classmethod
    def from_dict(cls, data: Record) -> ResultRecord:
        outputs = [OutputResult(**item) for item in data.get("outputs", [])]
        return cls(**{**data, "outputs": outputs})


def output_results(verdict: Verdict) -> list[OutputResult]:
    """The leaves of a Verdict, in the order the standards flattened them."""
    leaves = verdict.outputs or (verdict,)
    return [
        OutputResult(
            index=position,
            path=leaf.path,
            status=leaf.status,
            standard=leaf.standard,
            reference=leaf.reference,
            device_dtype=str(leaf.device_dtype),
            bench_dtype=str(leaf.bench_dtype),
            shape=[int(n) for n in leaf.shape],
            metrics={key: float(value) for key, value in leaf.metrics.items()},
            thresholds={key: float(value) for key, value in leaf.thresholds.items()},
            reasons=[str(reason) for reason in leaf.reasons],
            failed={key: float(limit) for key, limit in leaf.failed.items()},
        )
        for position, leaf in enumerate(leaves)
    ]
