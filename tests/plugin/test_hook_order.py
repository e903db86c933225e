"""The plugins a dump brings hold no order by accident: registered in the reverse order
(plugin/__init__.py's REGISTERED), a run that uses every one of them reports, writes and
says the same, in the same order. pluggy calls the hooks of the later-registered plugin
first, so an ordering left to registration shows here as a difference.

The run: dump B of pytest_msprobe/testing/upgrade_dumps.py with a planted gelu fault, gated against dump
A's baseline (per-call and kernel regressions), with the HTML report, scripts,
saved failed data, a new baseline, a black list and a shard: each plugin's hooks."""

from __future__ import annotations

import difflib
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch

import pytest_msprobe.plugin
from pytest_msprobe.testing.upgrade_dumps import step

RUN = "run"  # each run writes here, then the folder is renamed after its order
# what differs between two runs of the same calls: times (a minute or more, on a busy
# machine), timestamps in names and texts, the HTML report's compressed data (which holds
# the durations), and its matplotlib figures (rendered in parallel worker processes: under
# load two runs of the same data gave SVGs of 98 and 193 lines for one figure), and the
# padding of pytest's summary line, whose width follows the duration's ("in 9.87s" or "in 10.12s")
VOLATILE = re.compile(
    r"={2,}|\d+ min\b|\(\d+:\d\d:\d\d\)|\d+(\.\d+)? ?m?s\b|[\d.]+ calls/s|\d{4}-\d\d-\d\d[ T][\d:.]+[+\-\d:]*|\d{14,}"
    r"|\"(duration|started|time)\": [^,}]+|time=\"[^\"]*\"|[A-Za-z0-9+/=]{200,}"
    r"|(?s:<figure class=\"plots\">.*?</figure>)"
)


def gated_run(
    pytester: pytest.Pytester, capsys: pytest.CaptureFixture[str], dump: Path
) -> tuple[list[tuple[str, str, str, tuple[str, ...]]], str]:
    """Every report (node id, phase, outcome, its sections' titles) in the order the hooks
    saw them, and the terminal text."""
    capsys.readouterr()
    reprec = pytester.inline_run(
        f"--msprobe-dump={dump}",
        "-p",
        "no:cacheprovider",
        "--msprobe-offline",
        "--msprobe-device=cpu",
        f"--msprobe-out={RUN}/out",
        "--msprobe-baseline=baseline",
        "--msprobe-gate",
        f"--msprobe-baseline-save={RUN}/saved",
        f"--msprobe-html={RUN}/report.html",
        f"--msprobe-scripts={RUN}/scripts",
        f"--msprobe-save-failed={RUN}/failed",
        f"--junitxml={RUN}/junit.xml",
        "--msprobe-black-list=softmax",
        "--msprobe-shard=1/1",
        "-rA",
    )
    reports = [
        (
            report.nodeid,
            report.when,
            report.outcome,
            tuple(title for title, _ in report.sections if title.startswith("msprobe")),
        )
        for report in reprec.getreports("pytest_runtest_logreport")
    ]
    return reports, capsys.readouterr().out


def written(folder: Path) -> dict[str, str]:
    """Every file a run wrote, by its path (timestamps left out), its text with what differs
    between two runs of the same calls left out."""
    files = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and ".cache" not in path.parts[-2]:
            text = path.read_text(encoding="utf-8", errors="replace")
            files[VOLATILE.sub("T", str(path.relative_to(folder)))] = VOLATILE.sub("T", text.replace(str(folder), RUN))
    return files


def diff(before: str, after: str) -> str:
    """The lines that differ, for the assertion's message."""
    lines = difflib.unified_diff(
        before.replace(">", ">\n").splitlines(), after.replace(">", ">\n").splitlines(), n=0, lineterm=""
    )
    return "\n".join(line[:300] for line in list(lines)[:20])


def junit_cases(path: Path) -> list[tuple[str | None, str | None, list[str]]]:
    return [
        (case.get("classname"), case.get("name"), [child.tag for child in case])
        for case in ET.parse(path).getroot().iter("testcase")
    ]


def test_the_plugins_registered_in_reverse_make_the_same_run(
    pytester: pytest.Pytester, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    before = step(pytester.path / "a", "mlp", torch.float32, None)
    after = step(pytester.path / "b", "mlp", torch.float32, "gelu_scaled")
    pytester.inline_run(
        f"--msprobe-dump={before}", "-p", "no:cacheprovider", "--msprobe-offline", "--msprobe-device=cpu", "--msprobe-out=out-a",
        "--msprobe-baseline-save=baseline",
    )  # fmt: skip
    runs = {}
    for order in ("registered", "reversed"):
        monkeypatch.setattr(
            pytest_msprobe.plugin, "REGISTERED", pytest_msprobe.plugin.REGISTERED[:: 1 if order == "registered" else -1]
        )
        reports, text = gated_run(pytester, capsys, after)
        folder = (pytester.path / RUN).rename(pytester.path / order)
        runs[order] = (
            reports,
            VOLATILE.sub("T", text.replace(str(pytester.path), "")),
            written(folder),
            junit_cases(folder / "junit.xml"),
        )
    registered, reversed_ = runs["registered"], runs["reversed"]
    reports, text, files, junit = registered
    assert {outcome for _, when, outcome, _ in reports if when == "call"} == {"passed", "failed"}
    assert any(name.endswith(".kernel.forward.regression") for name, *_ in reports)
    assert any(("msprobe failed data" in titles and "msprobe script" in titles) for *_, titles in reports)
    assert "deselected" in text and "shard 1/1" in text and "msprobe html report" in text
    assert {"report.html", "junit.xml"} <= set(files) and any(name.startswith("saved/") for name in files)
    assert reversed_[0] == reports
    assert reversed_[1] == text
    assert reversed_[3] == junit
    assert sorted(reversed_[2]) == sorted(files)
    differing = {name: diff(files[name], reversed_[2][name]) for name in files if reversed_[2][name] != files[name]}
    assert differing == {}
