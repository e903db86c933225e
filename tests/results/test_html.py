"""The HTML report (--msprobe-html, msprobe-report, msprobe-merge --html): the element
samples it plots, the tolerance line it draws, what the page holds, and the page itself
in a real headless Chromium driven by playwright: no console error, no request, the
table sorts and filters, a planted fault's calls come first with their plots visible,
a clean run says all passed.

The browser tests need Debian's chromium (`apt-get install chromium`, or a browser
named by MSPROBE_CHROMIUM) and playwright (`pip install -e ".[test]"`); where either
is missing they skip and say which.
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from pytest_msprobe.judge.check import samples
from pytest_msprobe.judge.check.samples import element_samples, scaled_errors
from pytest_msprobe.judge.verdict.record import output_results
from pytest_msprobe.results import plots
from pytest_msprobe.results.elements import plot_data, tolerance_of
from pytest_msprobe.results.html_page import report_html
from pytest_msprobe.results.merge import main as msprobe_merge
from pytest_msprobe.results.merge import report_main as msprobe_report
from pytest_msprobe.results.run_files import RunFiles, read_journal
from pytest_msprobe.standards import check
from pytest_msprobe.standards.dtypes import dtype_info

HERE = Path(__file__).parent
DUMPS = HERE.parent / "dumps"
PLANTED_LINEAR = HERE.parent / "scripts"  # planted_linear.py: float32 linear 1 + 2**-5 too large


# --- the element samples ---------------------------------------------------------------


def test_samples_are_bounded_deterministic_and_the_heatmap_finds_a_wrong_block(monkeypatch) -> None:
    generator = torch.Generator().manual_seed(0)
    bench = torch.randn(300, 700, generator=generator, dtype=torch.float64)
    device = bench.to(torch.float32)
    device[200:205, 600:610] *= 1.01  # a block far off, at rows 200-204, columns 600-609
    verdict = check(bench, device, api="add")
    (sample,) = element_samples(bench, device, verdict, {"error"})
    assert len(sample["flat"]) == samples.SAMPLE_SIZE == len(sample["bench"]) == len(sample["device"])
    assert element_samples(bench, device, verdict, {"error"}) == [sample]  # the same elements every time
    flat = np.asarray(sample["flat"])
    assert (np.asarray(sample["bench"]) == bench.numpy().ravel()[flat]).all()
    assert (np.asarray(sample["device"]) == device.double().numpy().ravel()[flat]).all()
    assert [offender[0] for offender in sample["worst"]] == [list(offender.index) for offender in verdict.worst]
    grid = np.asarray(sample["heatmap"]["grid"])
    assert grid.shape == (48, 48) and (sample["heatmap"]["rows"], sample["heatmap"]["cols"]) == (300, 700)
    row, column = np.unravel_index(grid.argmax(), grid.shape)
    assert row == 200 * 48 // 300 and column in (600 * 48 // 700, 609 * 48 // 700)
    # every cell is the largest error of its elements, read in chunks that cut rows anywhere
    monkeypatch.setattr(samples, "CHUNK", 37)
    errors = scaled_errors(bench.numpy().ravel(), device.double().numpy().ravel(), dtype_info("float32"), sample["rms"])
    rows, cols = np.arange(49) * 300 // 48, [*(np.arange(48) * 700 // 48), 700]
    expected = [
        [errors.reshape(300, 700)[rows[i] : rows[i + 1], cols[j] : cols[j + 1]].max() for j in range(48)]
        for i in range(48)
    ]
    (chunked,) = element_samples(bench, device, verdict, {"error"})
    assert np.allclose(chunked["heatmap"]["grid"], expected, rtol=6e-3)  # cells keep 3 digits
    assert element_samples(bench, device, verdict, {"warning"}) == []  # only the asked statuses


def test_an_integer_output_keeps_its_worst_elements_and_nothing_to_plot() -> None:
    bench = torch.arange(12).reshape(3, 4)
    device = bench.clone()
    device[1, 2] = 99
    verdict = check(bench, device, api="argmax")
    (sample,) = element_samples(bench, device, verdict, {"error"})
    assert json.loads(json.dumps(sample)) == {"output": 0, "worst": [[[1, 2], 99.0, 6.0]]}  # as records carry it
    assert plot_data(output_results(verdict)[0], sample) is None


# --- the tolerance line ------------------------------------------------------------------

# (api, its standard, which elements the test moves): a standard that fails on one
# element is moved one element, one that judges a share moves them all.
BOUNDARIES = [
    ("add", "absolute_threshold", "one"),
    ("cumsum", "accumulative_error", "one"),
    ("exp", "benchmark", "one"),
    ("matmul", "ulp", "every"),
    ("conv2d", "thousandth", "every"),
]


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize(("api", "standard", "moved"), BOUNDARIES, ids=[b[1] for b in BOUNDARIES])
def test_the_tolerance_line_is_where_the_standard_judges(
    api: str, standard: str, moved: str, dtype: torch.dtype
) -> None:
    """Errors at half the drawn line pass the standard, at three times it fail."""
    generator = torch.Generator().manual_seed(1)
    bench = torch.randn(64, 64, generator=generator, dtype=torch.float64)
    judged = check(bench, bench.to(dtype), api=api)
    assert (judged.status, judged.standard) == ("pass", standard)
    rms = float(bench.pow(2).mean().sqrt())
    line = torch.from_numpy(tolerance_of(output_results(judged)[0], rms).curve(bench.abs().numpy()))
    signs = torch.where(torch.rand(bench.shape, generator=generator) < 0.5, -1.0, 1.0).double()
    where = (
        torch.ones_like(bench)
        if moved == "every"
        else torch.zeros_like(bench).index_put_(
            (torch.tensor([3]), torch.tensor([5])), torch.tensor(1.0, dtype=torch.float64)
        )
    )

    def moved_by(factor: float) -> torch.Tensor:
        return (bench + where * signs * factor * line).to(dtype)

    assert check(bench, moved_by(0.5), api=api).status == "pass"
    assert check(bench, moved_by(3.0), api=api).status == "error"


def test_a_standard_without_a_per_element_rule_draws_no_line() -> None:
    bench = torch.arange(6.0).reshape(2, 3)
    judged = check(bench, bench, api="abs")
    tolerance = tolerance_of(output_results(judged)[0], 1.0)
    assert judged.standard == "binary_consistency" and tolerance.curve is None and "any difference" in tolerance.text


# --- figures ---------------------------------------------------------------------------


def _plots(shape: tuple[int, ...], factor: float) -> Any:
    generator = torch.Generator().manual_seed(2)
    bench = torch.randn(shape, generator=generator, dtype=torch.float64)
    device = (bench * factor).to(torch.float16)
    verdict = check(bench, device, api="mul")
    (sample,) = element_samples(bench, device, verdict, {"error"})
    return plot_data(output_results(verdict)[0], sample)


def test_a_figure_is_the_same_whatever_was_drawn_before() -> None:
    """The figures are reused between outputs: nothing of one may leak into the next,
    nor into a user's own matplotlib settings."""
    import matplotlib

    settings, backend = dict(matplotlib.rcParams), matplotlib.get_backend()
    first, second = _plots((40, 30), 1.01), _plots((500,), 0.97)
    alone = plots.render(first)
    plots.render(second)
    plots.render(_plots((8, 9, 10), 1.2))
    assert plots.render(first) == alone
    assert dict(matplotlib.rcParams) == settings and matplotlib.get_backend() == backend
    assert "<image" in alone and alone.count('<g id="axes_') == 4  # scatter, histogram, heatmap, colorbar


def test_figures_drawn_by_processes_are_the_figures_drawn_here(monkeypatch) -> None:
    datas = [_plots((20, 30), 1.0 + i / 100) for i in range(1, 5)]
    here = plots.render_all(datas)
    monkeypatch.setattr(plots, "_cpus", lambda: plots.MIN_CPUS)
    monkeypatch.setattr(plots, "PER_PROCESS", 2)
    assert plots.render_all(datas) == here


def test_inline_svg_prefixes_every_id_and_keeps_the_labels() -> None:
    svg = plots.inline_svg(plots.render(_plots((40, 30), 1.01)), "f7-")
    ids = re.findall(r' id="([^"]+)"', svg)
    assert ids and all(name.startswith("f7-") for name in ids)
    assert all(reference.startswith("f7-") for reference in re.findall(r'(?:href="#|url\(#)([^")]+)', svg))
    assert svg.startswith("<svg") and "<metadata" not in svg and "|device - bench|" in svg and "error in ULPs" in svg


# --- what the page holds ---------------------------------------------------------------


def table_rows(page: str) -> list[list[Any]]:
    """The table's rows as the page's script unpacks them."""
    packed = re.search(r'<script id="msprobe-rows" type="application/json">([^<]*)</script>', page).group(1)
    data = json.loads(gzip.decompress(base64.b64decode(packed)))
    return [[row[0], data["strings"][row[1]], *row[2:]] for row in data["rows"]]


def run_pytest(folder: Path, *args: str, planted: bool = False) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(PLANTED_LINEAR), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
    }
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "--msprobe-device=cpu",
        "--msprobe-out=out",
        *(["-p", "planted_linear"] if planted else []),
        *args,
    ]
    return subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def faulty_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The shipped fp32 tensor dump with linear wrong in float32, under xdist (the
    samples travel from the workers in the records), with scripts and a report."""
    folder = tmp_path_factory.mktemp("faulty")
    shutil.copytree(DUMPS / "torch_mlpcnn_tensor_fp32", folder / "dump")
    done = run_pytest(
        folder,
        "--msprobe-dump=dump/dump.json",
        "-n",
        "2",
        "--msprobe-scripts=scripts",
        "--msprobe-html=report.html",
        planted=True,
    )
    assert done.returncode == pytest.ExitCode.TESTS_FAILED, done.stdout[-3000:] + done.stderr[-3000:]
    records = [entry.record for entry in read_journal(RunFiles.latest(folder / "out").journal)]
    faulty = sorted(record.call for record in records if record.status == "error")
    assert faulty and all(call.startswith("Functional.linear.") for call in faulty)
    return {
        "folder": folder,
        "report": folder / "report.html",
        "records": records,
        "faulty": faulty,
        "stdout": done.stdout,
    }


def test_the_run_names_its_report_and_the_page_holds_the_faulty_calls_first(faulty_run) -> None:
    assert f"msprobe html report: {faulty_run['report']}" in faulty_run["stdout"]
    page = faulty_run["report"].read_text("utf-8")
    rows = table_rows(page)
    assert len(rows) == len(faulty_run["records"])
    assert sorted(row[0] for row in rows[: len(faulty_run["faulty"])]) == faulty_run["faulty"]
    sections = re.findall(r'<section class="call error" id="(call-\d+)">(.*?)</section>', page, re.S)
    assert [re.search(r"</span> ([^<]+)</h3>", body).group(1) for _, body in sections] == [
        row[0] for row in rows[: len(sections)]
    ]
    assert len(sections) == len(faulty_run["faulty"])
    for _, body in sections:
        assert "<figure" in body and "<svg" in body and "Worst elements" in body
        assert re.search(r"python \S+/scripts/Functional\.linear\.\d\.(forward|backward)\.py", body)
        assert "generated from statistics" in body or "dump_tensor_data" in body or ".pt" in body  # input origins
    assert "All passed" not in page


def test_the_report_is_rebuilt_and_merged_from_the_result_folder(faulty_run, tmp_path: Path) -> None:
    folder = faulty_run["folder"]
    title = "pytest-msprobe: dump/dump.json"
    assert (
        msprobe_report(
            [
                str(folder / "out"),
                "-o",
                str(tmp_path / "again.html"),
                "--scripts",
                str(folder / "scripts"),
                "--title",
                title,
            ]
        )
        == 0
    )
    written = re.compile(r"report written [0-9: -]+")
    assert written.sub("", (tmp_path / "again.html").read_text("utf-8")) == written.sub(
        "", faulty_run["report"].read_text("utf-8")
    )
    assert (
        msprobe_merge(
            [
                str(folder / "out"),
                str(folder / "out"),
                "-o",
                str(tmp_path / "merged"),
                "--html",
                str(tmp_path / "m.html"),
            ]
        )
        == 0
    )
    merged = (tmp_path / "m.html").read_text("utf-8")
    assert sorted(row[0] for row in table_rows(merged)) == sorted(record.call for record in faulty_run["records"])
    assert merged.count("<figure") == faulty_run["report"].read_text("utf-8").count("<figure")
    assert "over 2 sessions" in merged  # each source's session, from its run file


def test_hostile_text_is_escaped_and_a_clean_report_says_all_passed(faulty_run) -> None:
    entries = read_journal(RunFiles.latest(faulty_run["folder"] / "out").journal)
    hostile = entries[0].record
    hostile.call, hostile.message = (
        "Functional.</script><script>alert(1)</script>.0.forward",
        "<img src=x onerror=alert(2)>",
    )
    page = report_html(entries)
    assert "<script>alert(1)" not in page and "<img src=x" not in page
    clean = [entry for entry in entries if entry.record.status == "pass"]
    page = report_html(clean)
    assert "All passed: " in page and "<figure" not in page and 'id="details"' not in page


def test_samples_are_taken_only_for_a_report(pytester: pytest.Pytester, write_dump, monkeypatch) -> None:
    """Without --msprobe-html no sample is taken (the journal is as before); with it,
    failing outputs have one; --msprobe-html-all alone is a usage error."""
    from synthetic import many_calls

    dump = write_dump(many_calls(4))
    monkeypatch.setattr(torch, "add", _scaled(torch.add))
    base = (f"--msprobe-dump={dump}", "--msprobe-device=cpu", "-p", "no:cacheprovider")
    pytester.inline_run(*base, "--msprobe-out=plain")
    plain = RunFiles.latest(pytester.path / "plain").journal.read_text("utf-8")
    assert '"status": "error"' in plain and '"samples"' not in plain
    pytester.inline_run(*base, "--msprobe-out=sampled", "--msprobe-html=r.html")
    sampled = [entry.record for entry in read_journal(RunFiles.latest(pytester.path / "sampled").journal)]
    assert all(bool(record.samples) == (record.status == "error") for record in sampled)
    pytester.inline_run(*base, "--msprobe-out=all", "--msprobe-html=all.html", "--msprobe-html-all")
    every = [entry.record for entry in read_journal(RunFiles.latest(pytester.path / "all").journal)]
    assert all(record.samples for record in every if record.status in ("pass", "error"))
    result = pytester.runpytest_inprocess(*base, "--msprobe-html-all")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--msprobe-html-all needs --msprobe-html=FILE*"])


def _scaled(function: Any) -> Any:
    def faulty(*args: Any, **kwargs: Any) -> Any:
        out = function(*args, **kwargs)
        return out * (1 + 2**-5) if isinstance(out, torch.Tensor) and out.dtype == torch.float32 else out

    return faulty


def test_regressions_against_the_baseline_show_now_and_then(copy_dump, pytester: pytest.Pytester, monkeypatch) -> None:
    dump = copy_dump("torch_mlpcnn_tensor_fp32")
    base = (f"--msprobe-dump={dump}", "--msprobe-device=cpu", "-p", "no:cacheprovider", "--msprobe-out=out")
    pytester.inline_run(*base, "--msprobe-baseline-save=baseline")
    monkeypatch.setattr(torch.nn.functional, "linear", _scaled(torch.nn.functional.linear))
    pytester.inline_run(*base, "--msprobe-baseline=baseline", "--msprobe-html=report.html")
    page = (pytester.path / "report.html").read_text("utf-8")
    section = re.search(r'<section id="baseline">(.*?)</section>', page, re.S).group(1)
    regressed = re.findall(r'<td class="mono">([^<]+)</td><td>pass → error</td>', section)
    assert regressed and all(call.startswith("Functional.linear.") for call in regressed)
    assert " / " in section  # metrics now / baseline
    assert page.count("<h4>Across the baselines</h4>") == len(re.findall(r'<section class="call error"', page))
    # msprobe-report takes the baselines a user keeps: each is a column of the trend, then now
    again = pytester.path / "again.html"
    assert msprobe_report(["out", "-o", str(again), "--baseline", "baseline", "--baseline", "baseline"]) == 0
    trend = re.search(
        r"<h4>Across the baselines</h4><table[^>]*><tr><th></th>(.*?)</tr>", again.read_text("utf-8")
    ).group(1)
    assert re.findall(r"<th>([^<]*)</th>", trend) == ["baseline", "baseline", "now"]


# --- in the browser --------------------------------------------------------------------


class Opened:
    """A report open in a page, with every console error and request it caused."""

    def __init__(self, browser: Any, path: Path, width: int = 1300) -> None:
        self.url = path.as_uri()
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.page = browser.new_page(viewport={"width": width, "height": 900})
        self.page.on(
            "console",
            lambda message: self.errors.append(message.text) if message.type in ("error", "warning") else None,
        )
        self.page.on("pageerror", lambda error: self.errors.append(str(error)))
        self.page.on("request", lambda request: self.requests.append(request.url))
        self.page.goto(self.url)
        self.page.wait_for_selector("body[data-ready]", timeout=20_000)

    def rows(self) -> list[list[str]]:
        return self.page.eval_on_selector_all(
            "#calls-table tbody tr", "rows => rows.map(r => [...r.cells].map(c => c.textContent))"
        )

    def clean(self) -> bool:
        return not self.errors and self.requests == [self.url]


def test_in_the_browser_the_planted_fault_comes_first_with_its_plots(browser, faulty_run, tmp_path: Path) -> None:
    opened = Opened(browser, faulty_run["report"])
    assert opened.errors == [] and opened.requests == [opened.url]
    faulty = faulty_run["faulty"]
    rows = opened.rows()
    assert len(rows) == len(faulty_run["records"])
    assert sorted(row[0] for row in rows[: len(faulty)]) == faulty and {row[2] for row in rows[: len(faulty)]} == {
        "error"
    }
    sections = opened.page.locator("section.call.error")
    assert sections.count() == len(faulty)
    for number in range(sections.count()):
        figures = sections.nth(number).locator("figure.plots svg")
        assert figures.count() >= 1
        for figure in range(figures.count()):
            assert figures.nth(figure).is_visible()
            box = figures.nth(figure).bounding_box()
            assert box["width"] > 400 and box["height"] > 100
            assert figures.nth(figure).locator("image").count() >= 1  # the rasterized points
    opened.page.locator("#calls-table tbody tr").first.locator("a").click()  # a faulty call's link leads to its plots
    assert opened.page.locator("section.call.error").first.is_visible()
    shot = tmp_path / "planted-fault.png"
    opened.page.evaluate("window.scrollTo(0, 0)")  # the table's sticky head at the top of the shot
    opened.page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 50_000
    assert opened.clean()


def test_in_the_browser_the_table_sorts_and_filters(browser, faulty_run, tmp_path: Path) -> None:
    opened = Opened(browser, faulty_run["report"])
    page = opened.page
    names = [record.call for record in faulty_run["records"]]
    page.click("#calls-table th:text-is('call')")
    assert [row[0] for row in opened.rows()] == sorted(names)
    page.click("#calls-table th:text-is('call')")
    assert [row[0] for row in opened.rows()] == sorted(names, reverse=True)
    page.click("#calls-table th:text-is('ms')")
    times = [float(row[8]) for row in opened.rows()]
    assert times == sorted(times)
    page.click("#calls-table th:text-is('status')")  # worst status first
    assert [row[2] for row in opened.rows()][: len(faulty_run["faulty"])] == ["error"] * len(faulty_run["faulty"])
    page.fill("#search", "conv1d")
    rows = opened.rows()
    assert rows and all("conv1d" in row[0] for row in rows) and len(rows) == sum("conv1d" in name for name in names)
    assert page.text_content("#shown") == f"{len(rows)} of {len(names)} calls match"
    page.fill("#search", "")
    page.select_option("#status-filter", "error")
    assert sorted(row[0] for row in opened.rows()) == faulty_run["faulty"]
    page.fill("#search", "no such call")
    assert opened.rows() == []
    page.screenshot(path=str(tmp_path / "filtered.png"))
    assert opened.clean()


def test_in_the_browser_a_clean_run_shows_all_passed(browser, copy_dump, tmp_path: Path) -> None:
    folder = copy_dump("torch_mlpcnn_tensor_fp32").parents[1]
    done = run_pytest(folder, "--msprobe-dump=torch_mlpcnn_tensor_fp32/dump.json", "--msprobe-html=report.html")
    assert done.returncode == pytest.ExitCode.OK, done.stdout[-3000:]
    opened = Opened(browser, folder / "report.html")
    assert opened.page.text_content("#headline").startswith("All passed: ")
    assert opened.page.locator("figure").count() == 0 and opened.page.locator("#details").count() == 0
    assert {row[2] for row in opened.rows()} == {"pass"}
    opened.page.screenshot(path=str(tmp_path / "clean.png"), full_page=True)
    assert opened.clean()


def test_the_browser_checks_catch_a_planted_request_and_error(browser, faulty_run, tmp_path: Path) -> None:
    """The checks above are not vacuous: a page that asks the network and logs an error
    is caught (its Content-Security-Policy refuses the request, which is a console error)."""
    page = faulty_run["report"].read_text("utf-8")
    planted = page.replace(
        "</body>", '<img src="https://example.com/x.png"><script>console.error("planted")</script></body>'
    )
    (tmp_path / "planted.html").write_text(planted, encoding="utf-8")
    opened = Opened(browser, tmp_path / "planted.html")
    assert not opened.clean()
    assert any("planted" in error for error in opened.errors)
    assert any("example.com" in error for error in opened.errors) or any(
        "example.com" in url for url in opened.requests
    )
