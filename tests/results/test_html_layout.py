"""The HTML report leads with what failed: failing calls and kernels first, worst first,
passing kernels collapsed, texts that wrap so that at 1280 px the page does not scroll
sideways and no column of the calls' table is narrower than its longest word, and a
failing row shows the metrics that failed, with their limits.

The page is an offline run of a real bfloat16 dump written with a planted fault (its
adds' outputs truncated toward zero, pytest_msprobe/testing/model_faults.py) and 7 passing kernels, in
headless Chromium. Today's layout fails each check (test_the_checks_catch_...)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from test_html import DUMPS, Opened, run_pytest, table_rows

from pytest_msprobe.judge.verdict.record import OutputResult, ResultRecord
from pytest_msprobe.results.html_page import report_html, worst_first
from pytest_msprobe.results.limits import failed_metrics, key_metrics, overshoot
from pytest_msprobe.results.run_files import Entry, RunFiles, read_journal
from pytest_msprobe.standards.verdict import Status

WIDTH = 1280  # the viewport the layout must fit

# What the page measures of itself: the document's width, each column's narrowest cell
# against the widest word in it (words split at spaces and at the page's <wbr>), where
# the first failing row and the first passing kernel card are, the failing rows' key
# metrics.
MEASURE = r"""() => {
  const canvas = document.createElement("canvas").getContext("2d");
  const heads = [...document.querySelectorAll("#calls-table th")].map(th => th.textContent);
  const columns = {};
  for (const row of document.querySelectorAll("#calls-table tbody tr")) {
    [...row.cells].forEach((td, i) => {
      const style = getComputedStyle(td);
      canvas.font = style.font;
      const copy = td.cloneNode(true);
      copy.querySelectorAll("wbr").forEach(wbr => wbr.replaceWith(" "));
      const inner = td.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
      for (const word of copy.textContent.split(/\s+/).filter(Boolean)) {
        const width = canvas.measureText(word).width;
        const column = columns[heads[i]] || (columns[heads[i]] = {word: "", width: 0, inner: Infinity, overflow: 0});
        if (width - inner > column.width - column.inner) { Object.assign(column, {word, width, inner}); }
      }
      if (td.scrollWidth > td.clientWidth) { columns[heads[i]].overflow += 1; }
    });
  }
  const top = element => element ? element.getBoundingClientRect().top + window.scrollY : null;
  const failing = [...document.querySelectorAll("#calls-table tbody tr.error, #calls-table tbody tr.warning")];
  return {
    scrollWidth: document.documentElement.scrollWidth, viewport: window.innerWidth, columns,
    firstFailingRow: top(failing[0]),
    firstPassingKernel: top(document.querySelector("#kernels section.call.pass, #kernels-passing section.call.pass")),
    failingMetrics: failing.map(row => [row.cells[0].textContent, row.querySelector("td.metrics").textContent]),
  };
}"""


def layout_problems(opened: Opened) -> list[str]:
    """Every way the open page breaks the layout the report promises (none: it holds).
    The passing kernels are opened first: where the user unfolds them they still come
    after the failing rows."""
    opened.page.eval_on_selector_all("details", "all => all.forEach(d => { d.open = true; })")
    measured: dict[str, Any] = opened.page.evaluate(MEASURE)
    problems = []
    if measured["scrollWidth"] > measured["viewport"]:
        problems.append(f"the page is {measured['scrollWidth']} px wide at {measured['viewport']} px")
    for name, column in measured["columns"].items():
        if column["width"] > column["inner"] + 0.5:
            problems.append(
                f"column {name!r} is {column['inner']:.0f} px, narrower than {column['word']!r} ({column['width']:.0f} px)"
            )
        if column["overflow"]:
            problems.append(f"column {name!r}: {column['overflow']} cells overflow")
    failing, kernel = measured["firstFailingRow"], measured["firstPassingKernel"]
    if failing is None or (kernel is not None and kernel < failing):
        problems.append(
            f"the first failing row (at {failing} px) is not above the first passing kernel (at {kernel} px)"
        )
    return problems


@pytest.fixture(scope="module")
def offline_bf16(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A real bfloat16 dump whose adds were truncated toward zero when it was written,
    checked offline (the dumped outputs are the device's), with its report."""
    folder = tmp_path_factory.mktemp("offline")
    shutil.copytree(DUMPS / "models" / "faults" / "bf16_truncation", folder / "dump")
    done = run_pytest(folder, "--msprobe-dump=dump/dump.json", "--msprobe-offline", "--msprobe-html=report.html")
    assert done.returncode == pytest.ExitCode.TESTS_FAILED, done.stdout[-3000:] + done.stderr[-3000:]
    records = [entry.record for entry in read_journal(RunFiles.latest(folder / "out").journal)]
    return {"folder": folder, "report": folder / "report.html", "records": records}


def test_the_offline_report_opens_on_its_failures_and_fits_1280_px(browser, offline_bf16) -> None:
    opened = Opened(browser, offline_bf16["report"], width=WIDTH)
    kernels = opened.page.locator("#kernels-passing section.call.kernel.pass")
    collapsed = kernels.count() and not kernels.first.is_visible()
    assert layout_problems(opened) == []
    assert collapsed and kernels.count() >= 5 and kernels.first.is_visible()  # unfolded by the check
    summary = opened.page.text_content("#kernels-passing summary")
    assert summary.startswith(f"{kernels.count()} kernels pass")  # folded under their count
    rows = opened.rows()
    errors = sorted(record.call for record in offline_bf16["records"] if record.status == "error")
    assert errors and sorted(row[0] for row in rows[: len(errors)]) == errors
    opened.page.screenshot(path=str(offline_bf16["folder"] / "layout.png"), full_page=True)
    assert opened.clean()


def test_a_failing_row_shows_the_metrics_that_failed_with_their_limits(browser, offline_bf16) -> None:
    """The adds fail on their scale bias against the reference run (limit 0.25 ULP
    beyond the reference's) with a sign test over 5: those, not the rel_err_ratio that
    is over a threshold of 0 and passes offline (the reference run's is as large)."""
    opened = Opened(browser, offline_bf16["report"], width=WIDTH)
    shown = dict(opened.page.evaluate(MEASURE)["failingMetrics"])
    assert shown and all(call.startswith("Tensor.__add__.") for call in shown)
    for text in shown.values():
        assert re.fullmatch(
            r"scale_bias_ulp -0\.\d+ \(\|Δ\xa0ref\|\xa0≤\xa00\.25\), scale_bias_z \d+(\.\d+)? \(≤\xa05\)", text
        ), text
    page = offline_bf16["report"].read_text("utf-8")
    # in each failing call's metrics table the failed ones come first, marked, with their limits
    for body in re.findall(r'<section class="call error" id="call-\d+">(.*?)</section>', page, re.S):
        first = re.findall(r'<tr><td>(\w+)</td><td class="v( over)?">[^<]*</td><td class="v">([^<]*)</td>', body)[:3]
        assert [(key, over, bool(limit)) for key, over, limit in first] == [
            ("scale_bias_ulp", " over", True),
            ("scale_bias_z", " over", True),
            ("inf_nan_error_ratio", "", True),
        ]
        assert body.count(' over"') == 2
    assert opened.clean()


def test_the_checks_catch_the_layout_of_before(browser, offline_bf16, tmp_path: Path) -> None:
    """Each check can fail: the page with the table's old styles (long texts on one line,
    words broken anywhere) and the passing kernels open above the table, as they were."""
    page = offline_bf16["report"].read_text("utf-8")
    old = page.replace(
        "</style>",
        "#calls-table td { overflow-wrap: anywhere; } #calls-table td.reference { white-space: nowrap; }"
        " #calls-table td.metrics, #calls-table td.why { min-width: 0; } </style>",
    )
    kernels = re.search(r'<section id="kernels-passing">.*?</section></details></section>', old, re.S).group(0)
    old = old.replace(kernels, "").replace('<section id="calls">', kernels + '<section id="calls">')
    (tmp_path / "old.html").write_text(old, encoding="utf-8")
    problems = layout_problems(Opened(browser, tmp_path / "old.html", width=WIDTH))
    assert any(problem.startswith("the page is") for problem in problems), problems
    assert any(problem.startswith("column 'why' is") for problem in problems), problems
    assert any(problem.startswith("the first failing row") for problem in problems), problems


# --- which metrics failed, and how far ----------------------------------------------


def _output(
    metrics: dict[str, float], thresholds: dict[str, float], reasons: list[str], status: Status = "error"
) -> OutputResult:
    return OutputResult(
        0, "", status, "benchmark", "reference", "float16", "float32", [8], metrics, thresholds, reasons
    )


def test_the_failed_metrics_are_those_the_reasons_name_with_their_test_statistics() -> None:
    ratio = _output(
        {"max_rel_err": 0.3, "max_rel_err_ratio": 3.0, "rmse": 0.1, "rmse_ratio": 1.1, "small_value_err_ratio": 0.2},
        {"max_rel_err_ratio": 2.0, "rmse_ratio": 2.0, "small_value_err_ratio": 0.0},
        ["max_rel_err 0.3 is 3x the reference's 0.1 (limit 2x)"],
    )
    # not small_value_err_ratio, over its threshold: no reason names it
    assert failed_metrics(ratio) == ["max_rel_err", "max_rel_err_ratio"]
    assert overshoot(ratio) == pytest.approx(1.5)
    share = _output({"rel_err_thousandth": 0.9}, {"rel_err_thousandth": 0.999}, ["more than 0.1% of elements are off"])
    assert failed_metrics(share) == ["rel_err_thousandth"]  # no reason names one: those past their limits
    assert overshoot(share) == pytest.approx(0.999 / 0.9)
    assert failed_metrics(_output(share.metrics, share.thresholds, [], status="pass")) == []


def test_failing_calls_are_ordered_by_how_far_past_their_limits() -> None:
    def record(call: str, ratio: float, status: Status = "error") -> ResultRecord:
        output = _output(
            {"rmse": 0.1, "rmse_ratio": ratio}, {"rmse_ratio": 2.0}, [f"rmse 0.1 is {ratio}x the reference's"], status
        )
        return ResultRecord("d", call, status, "benchmark", "reference", "cpu", "", [output])

    records = [
        record("a", 2.5),
        record("b", 9.0),
        record("c", 1.0, "pass"),
        record("d", 4.0, "warning"),
        record("e", 3.0),
    ]
    assert [item.call for item in sorted(records, key=worst_first)] == ["b", "e", "a", "d", "c"]
    assert key_metrics(records[1]) == "rmse 0.1, rmse_ratio 9 (≤\xa02)"
    rows = table_rows(report_html([Entry(item) for item in records]))
    assert [row[0] for row in rows] == ["b", "e", "a", "d", "c"]
