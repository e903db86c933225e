"""The HTML report: one self-contained page of a run's results, to look at rather
than read CSV cells. Written at the end of a run (--msprobe-html=FILE), by msprobe-merge
for merged results (--html FILE), or rebuilt from result folders:

    msprobe-report msprobe-out/ -o report.html [--scripts DIR] [--baseline DIR ...]   (merge.py)

It holds the counts by status, standard, API type and dtype; the environment and run
time (the run file, run_files.py); a table of every call, worst first, sortable and
filterable (a small inline script); and for each failing or warning call (every call
with samples, under --msprobe-html-all) its metrics against their thresholds, the plots
of its element samples (plots.py), the worst elements, the input origins and the
command that reproduces it; with baselines, regressions now vs the baseline and each
call's key metrics across the baselines kept.

Self-contained because it is mailed, attached to CI runs and opened offline: styles,
script and figures are inline, and its Content-Security-Policy forbids any request.
Built from the journal, the truth of a run, so the page of a run, of its rebuild and
of a merge agree. Everything from a dump (call names, messages) is escaped.
"""

from __future__ import annotations

import base64
import gzip
import html
import json
import math
import shlex
import string
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_msprobe.judge.gate.baseline import Baseline, CallMetrics, Change, compare
from pytest_msprobe.judge.gate.kernel_verdicts import RATIO, KernelVerdict, kernel_verdicts
from pytest_msprobe.judge.verdict.record import OutputResult, ResultRecord
from pytest_msprobe.results.limits import (
    SIGNS,
    failed_metrics,
    key_metrics,
    limit_name,
    metric_limit,
    overshoot,
    worst_output,
)
from pytest_msprobe.results.limits import number as _number
from pytest_msprobe.results.run_files import Entry
from pytest_msprobe.results.summary import (
    CONTRADICTS,
    OVERFLOW_MODES,
    STATUSES,
    badness,
    failing_metric,
    known_label,
    overflow_mode_counts,
    skip_reason,
)

if TYPE_CHECKING:
    from pytest_msprobe.dump.index import Json, Record
    from pytest_msprobe.judge.gate.upgrade import RunComparison
    from pytest_msprobe.judge.verdict.record import ElementSample, WorstElement
    from pytest_msprobe.standards.verdict import Status

PAGE_ROWS = 500  # table rows drawn at once; "show more" draws more
DEVICE_KINDS = ("cpu", "cuda", "npu")  # a record's device label starts with its --msprobe-device
SHOWN_REGRESSIONS = 200
BAD: tuple[Status, ...] = ("error", "warning")


@dataclass(frozen=True)
class ReportContext:
    """What the page shows besides the records."""

    title: str = "pytest-msprobe report"
    sessions: tuple[Record, ...] = ()  # the run file's sessions (writer.read_sessions)
    scripts: Path | None = None  # a folder of standalone scripts (--msprobe-scripts)
    baselines: tuple[tuple[str, Baseline], ...] = ()  # (label, baseline), oldest first; the last is compared with
    # the run's own comparison with its baseline (judge/gate/upgrade.py), which the section
    # shows where a dump was paired by signature (another dump of the model) instead of
    # comparing the records by name
    comparison: RunComparison | None = None


def write_report(entries: Iterable[Entry], target: Path, context: ReportContext = ReportContext()) -> Path:
    """Write the page (atomically: a reader never sees half a report) and return its path."""
    page = report_html(list(entries), context)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    partial.write_text(page, encoding="utf-8")
    partial.replace(target)
    return target


def report_html(entries: list[Entry], context: ReportContext = ReportContext()) -> str:
    """The page: its template (report.html) filled with the run's counts, table and the
    calls in detail, in worst-first order."""
    records = [entry.record for entry in sorted(entries, key=lambda entry: worst_first(entry.record))]
    detailed = [record for record in records if record.status in BAD or record.samples]
    anchors = {id(record): f"call-{position}" for position, record in enumerate(detailed)}
    baselines = [(label, BaselineIndex(baseline)) for label, baseline in context.baselines]
    scripts = _scripts(context.scripts)
    figures = _figures(detailed)
    template = string.Template(resources.files(__package__).joinpath("report.html").read_text("utf-8"))
    headline_class, headline = _headline(records)
    kernels = kernel_verdicts(records)
    return template.substitute(
        title=_e(context.title),
        headline_class=headline_class,
        headline=_e(headline),
        run=_e(_run_line(context.sessions)),
        summary=_summary(records),
        environment=_environment(context.sessions),
        baseline=_against_baseline(records, context, baselines),
        kernels=kernels_section(kernels),
        passing_kernels=passing_kernels_section(kernels),
        table_head="".join(f'<th scope="col">{_e(name)}</th>' for name in TABLE_COLUMNS),
        details=_details(detailed, anchors, figures, baselines, scripts),
        rows=packed_json(_table_rows(records, anchors)),
        page_rows=PAGE_ROWS,
    )


def worst_first(record: ResultRecord) -> tuple[int, float, float, str]:
    """Errors, then warnings, passes, skips; a failing or warning call the further past
    its limit first (limits.overshoot; one that failed before any comparison first of
    all), then by the larger share of failing outputs,
    then by name."""
    severity, share, call = badness(record)
    if record.status not in BAD:
        return -severity, 0.0, -share, call
    output = worst_output(record)  # none: the call failed before any comparison, first
    return -severity, -(overshoot(output) if output is not None else math.inf), -share, call


# --- the head: headline, counts, environment ----------------------------------------


def _headline(records: list[ResultRecord]) -> tuple[str, str]:
    counts = Counter(record.status for record in records)
    skipped = f" ({counts['skip']} skipped)" if counts["skip"] else ""
    if not counts["error"] and not counts["warning"]:
        if not counts["pass"] and counts["skip"]:
            return "clean", f"Nothing judged: all {counts['skip']} calls skipped"
        return "clean", f"All passed: {counts['pass']} calls{skipped}"
    bad = ", ".join(
        f"{counts[status]} {status}{'s' if counts[status] != 1 else ''}" for status in BAD if counts[status]
    )
    known = sum(1 for record in records if record.known_defect)
    known_text = (
        f", {known} of them {'a known library defect' if known == 1 else 'known library defects'}" if known else ""
    )
    return "failing", f"{bad} in {len(records)} calls{skipped}{known_text}"


def _run_line(sessions: Sequence[Record]) -> str:
    if not sessions:
        return "run time not recorded (no msprobe_run_*.json beside the results)"
    seconds = sum(float(session.get("duration", 0.0)) for session in sessions)
    many = f" over {len(sessions)} sessions" if len(sessions) > 1 else ""
    return f"started {sessions[0].get('started', '?')}, run time {_duration(seconds)}{many}; report written {time.strftime('%Y-%m-%d %H:%M:%S')}"


def _duration(seconds: float) -> str:
    minutes, rest = divmod(seconds, 60)
    return f"{int(minutes)} min {rest:.0f} s" if minutes else f"{rest:.1f} s"


def _dtype(record: ResultRecord) -> str:
    return "/".join(sorted({output.device_dtype for output in record.outputs if output.device_dtype})) or "(none)"


# Summary tables: title -> what groups a record.
GROUPS: tuple[tuple[str, Callable[[ResultRecord], str]], ...] = (
    ("standard", lambda record: record.standard or "(none)"),
    ("api type", lambda record: record.call.split(".", 1)[0]),
    ("dtype", _dtype),
)


def _summary(records: list[ResultRecord]) -> str:
    by_status = Counter(record.status for record in records)
    status_rows = "".join(
        f'<tr><td><span class="badge {status}">{status}</span></td><td class="n">{by_status[status]}</td></tr>'
        for status in STATUSES
    )
    tables = [f"<table><tr><th>status</th><th>calls</th></tr>{status_rows}</table>"]
    for title, group in GROUPS:
        counts: dict[str, Counter[Status]] = {}
        for record in records:
            counts.setdefault(group(record), Counter())[record.status] += 1
        head = "".join(f"<th>{status}</th>" for status in STATUSES)
        body = "".join(
            f"<tr><td>{_e(name)}</td>"
            + "".join(f'<td class="n">{counter[status] or ""}</td>' for status in STATUSES)
            + "</tr>"
            for name, counter in sorted(counts.items())
        )
        tables.append(f"<table><tr><th>{_e(title)}</th>{head}</tr>{body}</table>")
    skips = Counter(skip_reason(record.message) for record in records if record.status == "skip")
    if skips:
        rows = "".join(
            f'<tr><td>{_e(reason)}</td><td class="n">{count}</td></tr>' for reason, count in skips.most_common()
        )
        tables.append(f'<table class="skips"><tr><th>skipped, by reason</th><th>calls</th></tr>{rows}</table>')
    tables += _overflow_modes(records)
    return f'<div class="counts">{"".join(tables)}</div>'


def _overflow_modes(records: list[ResultRecord]) -> list[str]:
    """The calls whose outputs overflow their dtype on the bench, by the overflow mode
    the device showed (judge/findings/overflow_modes.py): counted apart from accuracy errors."""
    counts: Counter[str] = Counter()
    for record in records:
        counts.update(overflow_mode_counts(record))
    if not counts:
        return []
    rows = "".join(
        f'<tr><td>{_e(mode)}</td><td class="n">{counts[mode]}</td></tr>'
        for mode in (*OVERFLOW_MODES, CONTRADICTS)
        if counts[mode]
    )
    return [f'<table class="overflow-modes"><tr><th>overflow mode</th><th>calls</th></tr>{rows}</table>']


# environment row -> where the run file's environment has it
ENVIRONMENT_ROWS: tuple[tuple[str, Callable[[Record], Json]], ...] = (
    ("device", lambda env: env.get("device")),
    ("torch", lambda env: env.get("versions", {}).get("torch")),
    ("torch_npu", lambda env: env.get("versions", {}).get("torch_npu")),
    ("CANN", lambda env: env.get("cann")),
    ("MindSpore", lambda env: env.get("versions", {}).get("mindspore")),
    ("numpy", lambda env: env.get("versions", {}).get("numpy")),
    ("python", lambda env: env.get("python")),
    ("platform", lambda env: env.get("platform")),
)


def _environment(sessions: Sequence[Record]) -> str:
    if not sessions:
        return '<p class="muted">not recorded</p>'
    last = sessions[-1]
    env = last.get("environment", {}) or {}
    items = "".join(
        f"<div><dt>{_e(name)}</dt><dd>{_e(value(env) or 'not used')}</dd></div>" for name, value in ENVIRONMENT_ROWS
    )
    command = last.get("command")
    shown = f"<p>command: <code>{_e(shlex.join(str(part) for part in command))}</code></p>" if command else ""
    return f'<dl class="environment">{items}</dl>{shown}'


# --- the table of every call -----------------------------------------------------------

TABLE_COLUMNS = ("call", "direction", "status", "standard", "dtype", "key metrics", "why", "reference", "ms")


def _table_rows(records: list[ResultRecord], anchors: dict[int, str]) -> Record:
    """Rows as compact JSON for the page's script: repeated words once, in `strings`."""
    strings: dict[str, int] = {}

    def word(value: str) -> int:
        return strings.setdefault(value, len(strings))

    rows = [
        [
            record.call,
            word(record.status),
            word(record.standard),
            word(_dtype(record)),
            key_metrics(record),
            "" if record.status == "pass" else known_label(record) + failing_metric(record),
            word(record.reference),
            round(record.duration * 1e3, 1),
            anchors.get(id(record), ""),
        ]
        for record in records
    ]
    return {"strings": list(strings), "rows": rows}


def _known_badge(record: ResultRecord) -> str:
    return (
        f' <span class="badge known" title="{_e(KNOWN_TITLE)}">known defect {_e(record.known_defect)}</span>'
        if record.known_defect
        else ""
    )


#: what a known-defect badge says on hover
KNOWN_TITLE = (
    "a known library defect (pytest_msprobe/judge/defects/table.py): python -m pytest_msprobe.judge.defects.reproduce"
)


# --- the calls in detail ---------------------------------------------------------------


def _figures(records: list[ResultRecord]) -> dict[tuple[int, int], tuple[str, str]]:
    """(record id, output position) -> the inline SVG of its plots and their caption."""
    from pytest_msprobe.results import plots
    from pytest_msprobe.results.elements import caption, plot_data

    keys, captions, datas = [], [], []
    for record in records:
        for sample in record.samples:
            if "error" in sample:
                continue
            position = sample["output"]
            if 0 <= position < len(record.outputs):
                data = plot_data(record.outputs[position], sample)
                if data is not None:
                    keys.append((id(record), position))
                    captions.append(caption(record.outputs[position], sample, data))
                    datas.append(data)
    svgs = plots.render_all(datas)
    return {
        key: (plots.inline_svg(svg, f"f{number}-"), text)
        for number, (key, svg, text) in enumerate(zip(keys, svgs, captions, strict=False))
    }


def _details(
    records: list[ResultRecord],
    anchors: dict[int, str],
    figures: dict[tuple[int, int], tuple[str, str]],
    baselines: list[tuple[str, BaselineIndex]],
    scripts: dict[str, Path],
) -> str:
    if not records:
        return ""
    sections = [_call_section(record, anchors[id(record)], figures, baselines, scripts) for record in records]
    title = "Calls in detail" if any(record.status not in BAD for record in records) else "Failing and warning calls"
    return f'<section id="details"><h2>{title}</h2>{"".join(sections)}</section>'


def _call_section(
    record: ResultRecord,
    anchor: str,
    figures: dict[tuple[int, int], tuple[str, str]],
    baselines: list[tuple[str, BaselineIndex]],
    scripts: dict[str, Path],
) -> str:
    samples = {sample["output"]: sample for sample in record.samples if "error" not in sample}
    meta = " · ".join(
        part
        for part in (
            f"standard {record.standard}" if record.standard else "",
            f"reference {record.reference}" if record.reference else "",
            f"device {record.device}" if record.device else "",
            f"{record.duration * 1e3:.1f} ms",
        )
        if part
    )
    status = _e(record.status)
    parts = [
        f'<section class="call {status}" id="{anchor}">',
        f'<h3><span class="badge {status}">{status}</span>{_known_badge(record)} {_e(record.call)}</h3>',
        f'<p class="muted">{_e(meta)}<br>dump {_e(record.dump)}</p>',
    ]
    shown = [output for output in record.outputs if output.status in BAD or output.index in samples]
    if record.status != "pass" and not any(output.reasons for output in shown):  # else each output says why
        parts.append(f'<p class="why">{_e(failing_metric(record))}</p>')
    for output in shown:
        parts.append(_output_part(output, samples.get(output.index), figures.get((id(record), output.index))))
    if len(shown) < len(record.outputs):
        parts.append(f'<p class="muted">{len(record.outputs) - len(shown)} more outputs pass.</p>')
    parts += [f'<p class="muted">{_e(sample["error"])}</p>' for sample in record.samples if "error" in sample]
    if baselines:
        parts.append(_trend(record, baselines))
    parts.append(
        "<h4>Inputs</h4>"
        + (f"<pre>{_e(chr(10).join(record.origins))}</pre>" if record.origins else '<p class="muted">none recorded</p>')
    )
    parts.append(f"<h4>Reproduce</h4><pre>{_e(reproduce(record, scripts))}</pre>")
    if record.reduction:
        parts.append(_bug_report_part(record.reduction))
    if not record.samples:  # without samples its worst elements are only in the message
        parts.append(f"<details><summary>the test's message</summary><pre>{_e(record.message)}</pre></details>")
    return "".join(parts) + "</section>"


def _output_part(output: OutputResult, sample: ElementSample | None, figure: tuple[str, str] | None) -> str:
    title = (
        f"{output.path or 'output'} · {output.status} by {output.standard} · {output.device_dtype} "
        f"(bench {output.bench_dtype}) · shape {tuple(output.shape)}"
    )
    parts = [f"<h4>{_e(title)}</h4>", _metrics_table(output)]
    if output.reasons and output.status != "pass":
        parts.append("".join(f'<p class="why">{_e(reason[:600])}</p>' for reason in output.reasons[:4]))
    if figure is not None:
        svg, text = figure
        parts.append(f'<figure class="plots">{svg}<figcaption>{_e(text)}</figcaption></figure>')
    if sample is not None and sample.get("worst"):
        parts.append(_worst_table(sample["worst"]))
    return "".join(parts)


def _bug_report_part(reduction: Record) -> str:
    """The call reduced (--msprobe-bug-reports): its sizes, and a link to its folder."""
    folder = Path(str(reduction.get("folder", "")))
    link = f'<a href="{_e(folder.resolve().as_uri())}">{_e(str(folder))}</a>'
    return (
        f"<h4>Bug report</h4><p>reduced {_e(str(reduction.get('size')))} "
        f"({_e(str(reduction.get('elements')))} input elements): {link}</p>"
    )


def _metrics_table(output: OutputResult) -> str:
    """Every metric against its limit; those the output failed on first, marked."""
    failed = failed_metrics(output)
    rows, used = [], set()
    for key in [*failed, *(key for key in output.metrics if key not in failed)]:  # the failed first
        value = output.metrics[key]
        limit, how = metric_limit(output, key)
        used.add((limit_name(output, key) or ("",))[0])
        shown = "" if limit is None else f"{SIGNS[how]} {_number(limit)}"
        rows.append(
            f'<tr><td>{_e(key)}</td><td class="v{" over" if key in failed else ""}">{_number(value)}</td><td class="v">{_e(shown)}</td></tr>'
        )
    table = f'<table class="metrics"><tr><th>metric</th><th>value</th><th>limit</th></tr>{"".join(rows)}</table>'
    other = ", ".join(f"{key} {_number(value)}" for key, value in output.thresholds.items() if key not in used)
    return table + (f'<p class="muted">other thresholds: {_e(other)}</p>' if other else "")


def _worst_table(worst: list[WorstElement]) -> str:
    rows = "".join(
        f'<tr><td class="v">{_e(index)}</td><td class="v">{_e(repr(device))}</td><td class="v">{_e(repr(bench))}</td>'
        f'<td class="v">{_number(abs(device - bench)) if _finite(device, bench) else "inf/NaN"}</td></tr>'
        for index, device, bench in worst
    )
    return (
        '<h4>Worst elements</h4><table class="worst"><tr><th>index</th><th>device</th><th>bench</th>'
        f"<th>|device - bench|</th></tr>{rows}</table>"
    )


def _finite(*values: float) -> bool:
    return all(isinstance(value, (int, float)) and math.isfinite(value) for value in values)


def reproduce(record: ResultRecord, scripts: dict[str, Path]) -> str:
    """Its standalone script where one was written, else the pytest command that runs
    the call alone and msprobe-script's command that writes its script."""
    script = scripts.get(record.call)
    if script is not None:
        return f"python {shlex.quote(str(script))}"
    dump = shlex.quote(record.dump)
    kind = record.device.split(":")[0].split(" ")[0]
    device = f" --msprobe-device={kind}" if kind in DEVICE_KINDS else ""
    return (
        f"pytest --msprobe-dump={dump}{device} {shlex.quote(f'{record.dump}::{record.call}')}\n"
        f"msprobe-script {dump} {shlex.quote(record.call)} -o msprobe-scripts"
    )


def _scripts(folder: Path | None) -> dict[str, Path]:
    """call name -> its script in the folder: msprobe-script names a script after its
    call (a name with characters unsafe in a file name is not matched: its command is
    shown instead)."""
    if folder is None or not folder.is_dir():
        return {}
    return {path.stem: path for path in folder.glob("*.py")}


# --- baselines -------------------------------------------------------------------------


class BaselineIndex:
    """A baseline's calls found by a record: a baseline keys dumps by their path from
    the rootdir of the run that saved it, a record by its absolute path, so a call is
    matched by name and the dump whose key ends its path."""

    def __init__(self, baseline: Baseline) -> None:
        self.baseline = baseline
        self.by_call: dict[str, list[tuple[str | None, CallMetrics]]] = {}
        for (dump, call), metrics in baseline.calls.items():
            self.by_call.setdefault(call, []).append((dump, metrics))

    def metrics_of(self, record: ResultRecord) -> CallMetrics | None:
        candidates = self.by_call.get(record.call, [])
        path = Path(record.dump).as_posix()
        for dump, metrics in candidates:
            if dump is None or dump == record.dump or path.endswith("/" + Path(dump).as_posix().lstrip("./")):
                return metrics
        return candidates[0][1] if len(candidates) == 1 else None


def changes(records: list[ResultRecord], index: BaselineIndex) -> list[tuple[ResultRecord, Change, CallMetrics | None]]:
    """Each judged record compared with its baseline record (judge.baseline.compare)."""
    found = []
    for record in records:
        if record.status == "skip":
            continue
        recorded = index.metrics_of(record)
        found.append((record, compare(CallMetrics.of(record), recorded, record.call), recorded))
    return found


def _baseline_section(records: list[ResultRecord], index: BaselineIndex, label: str) -> str:
    compared = changes(records, index)
    counts = Counter(change.kind for _, change, _ in compared)
    head = ", ".join(f"{counts[kind]} {kind}" for kind in ("regression", "improvement", "unchanged", "new"))
    regressions = sorted(
        (item for item in compared if item[1].kind == "regression"), key=lambda item: -(item[1].ratio or 0.0)
    )
    rows = []
    for record, change, recorded in regressions[:SHOWN_REGRESSIONS]:
        growth = f"{change.metric} {change.ratio:.3g}x" if change.ratio is not None else ""
        rows.append(
            f'<tr><td class="mono">{_e(record.call)}</td><td>{_e(change.was)} → {_e(change.now)}</td>'
            f"<td>{_e(growth)}</td><td>{_now_vs_then(CallMetrics.of(record), recorded)}</td></tr>"
        )
    table = (
        (
            "<table><tr><th>call</th><th>status</th><th>largest growth</th><th>metrics now / baseline</th></tr>"
            + "".join(rows)
            + "</table>"
        )
        if rows
        else '<p class="muted">no regression</p>'
    )
    more = (
        f'<p class="muted">... and {len(regressions) - SHOWN_REGRESSIONS} more</p>'
        if len(regressions) > SHOWN_REGRESSIONS
        else ""
    )
    created = index.baseline.environment.get("created", "")
    return (
        f'<section id="baseline"><h2>Against the baseline</h2><p>{_e(label)}{_e(f" (recorded {created})" if created else "")}: '
        f"{_e(head)}</p>{table}{more}</section>"
    )


def _against_baseline(
    records: list[ResultRecord], context: ReportContext, baselines: list[tuple[str, BaselineIndex]]
) -> str:
    """The regressions of the run's own comparison where it paired a dump by signature;
    else the records against the newest baseline kept, by name ("" without one)."""
    if context.comparison is not None and context.comparison.paired:
        return _regression_section(context.comparison)
    return _baseline_section(records, baselines[-1][1], baselines[-1][0]) if baselines else ""


def _regression_section(comparison: RunComparison) -> str:
    """The run against its baseline: how its dumps paired, the counts, and every
    regression (calls and kernels), worst first, with its verdict and key metric before
    and after."""
    counts = comparison.counts()
    head = ", ".join(f"{counts[kind]} {kind}" for kind in ("regression", "improvement", "unchanged", "new", "vanished"))
    rows = [
        f'<tr><td class="mono">{_e(c.name)}</td><td class="mono">{_e(c.recorded_as)}</td><td>{_e(c.was)} → {_e(c.now)}</td>'
        f"<td>{_e(c.growth_text())}</td></tr>"
        for c in comparison.regressions()
    ]
    table = (
        "<table><tr><th>regression</th><th>in the baseline</th><th>verdict</th><th>key metric before → after</th></tr>"
        + "".join(rows)
        + "</table>"
        if rows
        else '<p class="muted">no regression</p>'
    )
    notes = "".join(f"<p>{_e(note)}</p>" for note in comparison.notes)
    return f'<section id="baseline"><h2>Regressions against the baseline</h2>{notes}<p>{_e(head)}</p>{table}</section>'


def _now_vs_then(now: CallMetrics, then: CallMetrics | None) -> str:
    lines = []
    for path, metrics in now.outputs.items():
        before = then.outputs.get(path, {}) if then is not None else {}
        lines += [
            f"{path or 'output'} {key}: {_number(value)} / {_number(before[key]) if key in before else '-'}"
            for key, value in metrics.items()
        ]
    return _e("; ".join(lines))


def _trend(record: ResultRecord, baselines: list[tuple[str, BaselineIndex]]) -> str:
    """The call's key metrics in each baseline kept, then now."""
    now = CallMetrics.of(record)
    columns = [(label, index.metrics_of(record)) for label, index in baselines] + [("now", now)]
    keys = [(path, key) for path, metrics in now.outputs.items() for key in metrics]
    if not keys:
        return ""
    head = "".join(f"<th>{_e(label)}</th>" for label, _ in columns)
    status = "".join(f"<td>{_e(metrics.status if metrics else '-')}</td>" for _, metrics in columns)
    body = "".join(
        f"<tr><td>{_e((path or 'output') + ' ' + key)}</td>"
        + "".join(
            f'<td class="v">{_number(metrics.outputs.get(path, {})[key]) if metrics and key in metrics.outputs.get(path, {}) else "-"}</td>'
            for _, metrics in columns
        )
        + "</tr>"
        for path, key in keys
    )
    return f'<h4>Across the baselines</h4><table class="metrics"><tr><th></th>{head}</tr><tr><td>status</td>{status}</tr>{body}</table>'


# --- text ------------------------------------------------------------------------------


KERNEL_BAR_WIDTH, KERNEL_PLOT_HEIGHT = 6, 80  # px: one bar per pooled output, its signed z


def kernels_section(verdicts: list[KernelVerdict]) -> str:
    """The failing kernels, the strongest evidence first, each with its pooled numbers
    and its calls worst first: the evidence each carries (its own z of the test, signed
    toward the pooled sum's direction, or its log error ratio), drawn as bars beside the
    pooled statistic. Placed before the calls: a failing kernel is a failing test."""
    failing = sorted(
        (verdict for verdict in verdicts if verdict.status in BAD),
        key=lambda verdict: (verdict.status != "error", -abs(verdict.pooled), verdict.key),
    )
    if not failing:
        return ""
    return (
        f'<section id="kernels"><h2>Failing kernels</h2><p class="muted">{KERNELS_NOTE}</p>'
        f"{''.join(_kernel_card(verdict) for verdict in failing)}</section>"
    )


def passing_kernels_section(verdicts: list[KernelVerdict]) -> str:
    """The passing kernels, collapsed under their count: after the failures, since a
    bfloat16 run's 18 cards are some 3,700 px."""
    passing = sorted((verdict for verdict in verdicts if verdict.status not in BAD), key=lambda verdict: verdict.key)
    if not passing:
        return ""
    many = "s" if len(passing) != 1 else ""
    return (
        f'<section id="kernels-passing"><h2>Passing kernels</h2><details><summary>{len(passing)} kernel{many} '
        f"pass{'' if many else 'es'}: {KERNELS_NOTE}</summary>{''.join(_kernel_card(verdict) for verdict in passing)}"
        "</details></section>"
    )


KERNELS_NOTE = "the bias tests and error ratios of every call of one API, dtype and direction, pooled"


def _kernel_card(verdict: KernelVerdict) -> str:
    test = verdict.leading_test
    rows = "".join(
        f'<tr><td class="mono">{_e(item.call)}</td><td>{_e(item.output)}</td><td>{_e(item.status)}</td><td>{item.value(test):+.3g}</td></tr>'
        for item in verdict.evidence
    )
    why = "".join(f'<p class="why">{_e(reason)}</p>' for reason in verdict.reasons)
    numbers = ", ".join(f"{key} {value:.4g}" for key, value in verdict.metrics.items())
    return (
        f'<section class="call kernel {verdict.status}"><h3>{_e(verdict.key.name)} <span class="badge {verdict.status}">'
        f"{verdict.status}</span></h3>{why}<p class='mono'>{_e(numbers)}</p>{_kernel_plot(verdict, test)}"
        f"<details><summary>{len(verdict.evidence)} outputs of {len(verdict.calls)} calls, most evidence first</summary>"
        f"<table><tr><th>call</th><th>output</th><th>status</th><th>{_e(_describe_bars(test))} alone</th></tr>{rows}</table></details></section>"
    )


def _kernel_plot(verdict: KernelVerdict, test: str) -> str:
    """An inline SVG: one bar per output (worst first), up toward the pooled direction."""
    values = [item.value(test) for item in verdict.evidence]
    direction = verdict.direction
    top = max([abs(value) for value in values] + [abs(verdict.pooled), 1.0])
    half = KERNEL_PLOT_HEIGHT / 2
    bars = []
    for position, value in enumerate(values):
        height = abs(value) / top * half
        toward = value * direction > 0
        y = half - height if toward else half
        bars.append(
            f'<rect class="{"toward" if toward else "against"}" x="{position * KERNEL_BAR_WIDTH}" y="{y:.1f}" '
            f'width="{KERNEL_BAR_WIDTH - 1}" height="{height:.1f}"><title>{_e(verdict.evidence[position].call)}: {value:+.3g}</title></rect>'
        )
    width = max(len(values), 1) * KERNEL_BAR_WIDTH
    return (
        f'<svg class="kernel-z" width="{width}" height="{KERNEL_PLOT_HEIGHT}" viewBox="0 0 {width} {KERNEL_PLOT_HEIGHT}" '
        f'preserveAspectRatio="none" role="img" '
        f'aria-label="{_e(_describe_bars(test))} of each output; pooled {verdict.pooled:.3g}">'
        f'<line x1="0" x2="{width}" y1="{half}" y2="{half}"/>{"".join(bars)}</svg>'
    )


def _describe_bars(test: str) -> str:
    """What a kernel's bars show of each output."""
    return f"log {test}" if test == RATIO else f"{test}_z"


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def packed_json(data: Json) -> str:
    """JSON, gzipped and in base64, which the page unpacks (DecompressionStream): the
    rows of 20,000 calls are 2-3 MB of JSON, a fifth of that packed. Base64 cannot end
    its <script> element early; the fixed mtime keeps a report reproducible."""
    text = json.dumps(data, separators=(",", ":"), allow_nan=False).encode("utf-8")
    return base64.b64encode(gzip.compress(text, compresslevel=6, mtime=0)).decode("ascii")


def read_baselines(folders: Sequence[Path]) -> tuple[tuple[str, Baseline], ...]:
    """(label, baseline) per folder, oldest first by the time each was recorded."""
    read = [(str(folder), Baseline.read(folder)) for folder in folders]
    return tuple(sorted(read, key=lambda item: str(item[1].environment.get("created", ""))))
