"""What the checks beside the precision standards found in a call's outputs: the device
giving other bits when run again on the same inputs (`repeat`, --msprobe-repeat),
an inf/NaN in the dumped outputs re-checked on the bench (`overflow`) and a dropout's
dropped share against its p (`dropout rate`, run/dropout.py).

The standards' verdict stays what it is (the first run's, against the bench): a finding
is reported beside it, where the standards' results already go, so that every reader of
the result files sees it without a new file or a new CSV column: the output's status and
reasons (the details CSV keeps msprobe's columns: Status and Message), the output's own
`findings` columns in the metrics file, and the call's status and message. A finding
that fails makes the call an error whatever the verdict; one that does not is a note.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pytest_msprobe.judge.verdict.record import OutputResult

if TYPE_CHECKING:
    from pytest_msprobe.dump.index import CallName, Json
    from pytest_msprobe.run.replay import Results
    from pytest_msprobe.standards.verdict import Status


@dataclass(frozen=True)
class Finding:
    """One output's finding."""

    kind: str  # "nondeterministic", "kernel overflow", "input overflow"
    path: str  # the output's path in the verdict's flatten order ("" for a lone output)
    fails: bool  # whether it makes the call an error
    text: str  # what was found and what it means, for the message and the output's reasons
    columns: dict[str, Json]  # the output's columns in the metrics file

    @property
    def reason(self) -> str:
        return f"{self.kind}: {self.text}"


def status_with(status: Status, findings: list[Finding]) -> Status:
    """The call's status: an error where a finding fails, else the verdict's."""
    return "error" if any(finding.fails for finding in findings) else status


def message_with(call: str, text: str, findings: list[Finding]) -> str:
    """The call's message: the verdict's text, after a head naming the failing
    findings (they decide the outcome), or followed by the notes."""
    if not findings:
        return text
    lines = [f"  {finding.path or 'output'}: {finding.reason}" for finding in findings]
    failing = sorted({finding.kind for finding in findings if finding.fails})
    if not failing:
        return "\n".join([text, *lines])
    head = f"{call}: error: {', '.join(failing)} (the accuracy standards' verdict follows)"
    return "\n".join([head, *lines, text])


def annotate(outputs: list[OutputResult], findings: list[Finding]) -> list[OutputResult]:
    """The output results with their findings: reasons and columns added, the status
    an error where a finding fails."""
    annotated_outputs = []
    for output in outputs:
        mine = [finding for finding in findings if finding.path == output.path]
        if mine:
            output = dataclasses.replace(
                output,
                status=status_with(output.status, mine),
                reasons=[*output.reasons, *(finding.reason for finding in mine)],
                findings={key: value for finding in mine for key, value in finding.columns.items()},
            )
        annotated_outputs.append(output)
    return annotated_outputs


def dropout_findings(results: Results, name: CallName) -> list[Finding]:
    """A dropout's dropped share on the device against p (run/dropout.py): an error
    beyond Z_LIMIT standard deviations of Binomial(n, p). Imported here: the xdist
    controller reads this module's records and must not import torch."""
    from pytest_msprobe.run.apis import dropout_table
    from pytest_msprobe.run.dropout import Z_LIMIT, Drawn, dropped_share

    kind = dropout_table().get(name.operator)
    shown = None if kind is None else Drawn(kind).find_masks(results.inputs, results.device, name.direction)
    if shown is None or kind is None:
        return []
    unit_dims = kind.units(shown.result.dim())
    dropped, n, z = dropped_share(shown, unit_dims)
    if not n:
        return []
    unit = "elements" if not unit_dims else "channels"
    text = f"{dropped} of {n} {unit} dropped ({dropped / n:.4g}) where p = {shown.p:g}: z {z:+.2f} of Binomial(n, p)"
    fails = abs(z) > Z_LIMIT
    text += f", beyond the bound |z| <= {Z_LIMIT:g}" if fails else ""
    path = "" if name.direction == "forward" else "[0]"
    return [Finding("dropout rate", path, fails, text, {"dropped": dropped, "units": n, "dropout_z": round(z, 3)})]
