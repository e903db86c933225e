"""The files and outcomes a run leaves: msprobe's two CSVs (columns filled as msprobe
fills them per standard), the metrics file, JUnit properties, the summary, exit codes."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any

import pandas
import pytest
import torch  # noqa: F401 - imported before any in-process run: pytester's runs then never unload it
from planted import Planted
from synthetic import many_calls

from pytest_msprobe.results.msprobe_csv import DETAILS_HEADER, METRIC_COLUMNS, RESULT_HEADER
from pytest_msprobe.results.run_files import RunFiles

LEGACY = {"cosine", "max_abs_err", "rel_err_hundredth", "rel_err_thousandth", "rel_err_ten_thousandth"}
# msprobe fills, per standard, the legacy columns (float outputs) and its own; the rest a space.
FILLED = {
    "binary_consistency": {"error_rate"},
    "absolute_threshold": {"inf_nan_error_ratio", "rel_err_ratio", "abs_err_ratio"},
    "ulp": {"max_ulp_err", "mean_ulp_err", "ulp_err_proportion"},
    "thousandth": {"rel_err_thousandth"},
    "accumulative_error": {"inf_nan_error_ratio", "rel_err_ratio", "abs_err_ratio", "eb"},
    "benchmark": {"small_value_err_ratio", "rmse", "max_rel_err", "mean_rel_err", "eb"},
}
COLUMN_OF = dict(METRIC_COLUMNS)


def run(pytester: pytest.Pytester, dump: Path, *args: str, plugins: tuple = ()) -> tuple[Any, RunFiles]:
    result = pytester.inline_run(
        f"--msprobe-dump={dump}",
        "--msprobe-device=cpu",
        "-p",
        "no:cacheprovider",
        "--msprobe-out=out",
        *args,
        plugins=list(plugins),
    )
    files = RunFiles.latest(pytester.path / "out")
    assert files is not None
    return result, files


def read_csv(path: Path) -> list[list[str]]:
    assert path.read_bytes().startswith(b"\xef\xbb\xbf"), "msprobe's CSVs start with a byte-order mark"
    with open(path, encoding="utf-8-sig", newline="") as handle:
        return list(csv.reader(handle))


@pytest.fixture(scope="module")
def fp32_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One run of the fp32 tensor dump with the planted standards, shared by the tests
    that only read its files (a subprocess: pytester cannot be module-scoped)."""
    folder = tmp_path_factory.mktemp("fp32")
    dump = Path(__file__).parents[1] / "dumps" / "torch_mlpcnn_tensor_fp32" / "dump.json"
    junit = folder / "junit.xml"
    environment = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            f"--msprobe-dump={dump}",
            "--msprobe-device=cpu",
            "-p",
            "planted",
            "-p",
            "no:cacheprovider",
            f"--msprobe-out={folder / 'out'}",
            f"--junitxml={junit}",
            "-q",
        ],
        cwd=dump.parents[3],
        capture_output=True,
        text=True,
        timeout=300,
        env=environment,
    )
    assert done.returncode == pytest.ExitCode.TESTS_FAILED, done.stdout[-3000:] + done.stderr[-3000:]
    return {"files": RunFiles.latest(folder / "out"), "junit": junit}


def test_details_csv_has_msprobes_columns_filled_as_msprobe_fills_them(fp32_run) -> None:
    rows = read_csv(fp32_run["files"].details)
    assert tuple(rows[0]) == DETAILS_HEADER
    frame = pandas.read_csv(fp32_run["files"].details, encoding="utf-8-sig", keep_default_na=False, dtype=str)
    assert len(frame) > 40
    standards = dict(
        zip(*pandas.read_json(fp32_run["files"].metrics, lines=True)[["name", "standard"]].T.values, strict=True)
    )
    seen = set()
    for _, row in frame.iterrows():
        standard = standards[row["API Name"]]
        seen.add(standard)
        assert row["API Name"].split(".")[-2] == "output" and row["API Name"].split(".")[-3] in ("forward", "backward")
        assert row["DEVICE Dtype"].startswith("torch.") and row["Bench Dtype"].startswith("torch.")
        assert row["Shape"].startswith("(")
        assert row["Status"] in ("pass", "warning", "error", "SKIP")
        expected = FILLED.get(standard, set()) | (LEGACY if "float" in row["DEVICE Dtype"] else set())
        for key, column in METRIC_COLUMNS:
            if key in expected and not standard.startswith("planted"):
                float(row[column])  # a number, printed with 14 decimals
                assert row[column] in ("nan", "inf", "-inf") or len(row[column].split(".")[1]) == 14, (
                    row["API Name"],
                    column,
                )
            elif not standard.startswith("planted"):
                assert row[column] == " ", (row["API Name"], column, standard)
    assert set(FILLED) <= seen | {"accumulative_error"}, seen  # every standard but one appears in this dump


def test_result_csv_has_one_row_per_call_and_a_space_where_no_backward(fp32_run) -> None:
    rows = read_csv(fp32_run["files"].result)
    assert tuple(rows[0]) == RESULT_HEADER
    by_name = {row[0]: row for row in rows[1:]}
    assert len(by_name) == len(rows) - 1
    assert by_name["Functional.linear.0"][1:3] == ["error", "error"]  # planted
    assert by_name["Functional.silu.0"][1] == "warning"
    assert by_name["Torch.argmax.0"][2] == " "  # an integer output has no backward
    assert all(row[1] in ("pass", "warning", "error", "SKIP", " ") for row in rows[1:])


def test_hostile_text_is_neutralised_kept_on_one_line_and_cut(fp32_run) -> None:
    rows = read_csv(fp32_run["files"].details) + read_csv(fp32_run["files"].result)
    planted = [row[-1] for row in rows if row[0].startswith("Functional.linear.0")]
    assert planted
    for message in planted:
        assert not message.startswith(("=", "+", "-", "@")) and "\n" not in message
        assert len(message) < 32_767  # Excel's cell limit
    details = [row for row in rows if row[0] == "Functional.linear.0.forward.output.0"][0]
    assert details[-1].startswith("'=HYPERLINK") and "精度异常" in details[-1] and "more characters" in details[-1]
    assert details[DETAILS_HEADER.index(COLUMN_OF["cosine"])] == "-0.50000000000000"  # a number is never quoted


def test_metrics_file_is_one_pandas_read_with_every_metric(fp32_run) -> None:
    frame = pandas.read_json(fp32_run["files"].metrics, lines=True)
    details = read_csv(fp32_run["files"].details)
    kernels = frame[
        frame.standard == "kernel"
    ]  # a line per kernel verdict (judge/gate/kernel_verdicts.py), no details row
    assert set(kernels.name) and all(name.endswith((".kernel.forward", ".kernel.backward")) for name in kernels.name)
    frame = frame[frame.standard != "kernel"]
    assert len(frame) == len(details) - 1
    assert {"call", "direction", "name", "status", "standard", "cosine", "max_ulp_err", "error_rate"} <= set(
        frame.columns
    )
    ulp = frame[frame.standard == "ulp"]
    assert ulp.max_ulp_err.notna().all() and ulp.error_rate.isna().all()


def test_details_csv_reads_into_pandas_with_numbers_as_the_docs_say(fp32_run) -> None:
    """msprobe's " " for an unfilled metric makes every metric column text to a plain
    read_csv; the result files' reference gives the call that reads them as numbers."""
    documented = 'pandas.read_csv(path, encoding="utf-8-sig", na_values=" ")'
    assert documented in (Path(__file__).parents[2] / "docs" / "reference" / "results.md").read_text(encoding="utf-8")
    frame = pandas.read_csv(fp32_run["files"].details, encoding="utf-8-sig", na_values=" ")  # that line
    assert all(frame[column].dtype == "float64" for _, column in METRIC_COLUMNS), frame.dtypes


def test_junit_properties_carry_status_standard_and_key_metrics(fp32_run) -> None:
    tree = ElementTree.parse(fp32_run["junit"])
    cases = {
        case.get("name"): {p.get("name"): p.get("value") for p in case.iter("property")}
        for case in tree.iter("testcase")
    }
    linear = cases["Functional.linear.0.forward"]
    assert linear["msprobe_status"] == "error" and linear["msprobe_standard"] == "planted_error"
    matmul = cases["Tensor.__matmul__.0.forward"]
    assert matmul["msprobe_standard"] == "ulp" and {"msprobe_max_ulp_err", "msprobe_ulp_err_proportion"} <= set(matmul)


def test_an_error_fails_the_run_and_a_warning_only_under_strict(pytester: pytest.Pytester, write_dump) -> None:
    dump = write_dump(many_calls(2))  # Torch.add.0 and Functional.silu.1 (forward, backward)
    result, _ = run(pytester, dump, plugins=(Planted(),))
    assert result.ret == pytest.ExitCode.OK
    result, _ = run(pytester, dump, "--msprobe-strict", plugins=(Planted(),))
    assert result.ret == pytest.ExitCode.TESTS_FAILED


def test_summary_counts_names_the_worst_and_the_files(fp32_run, pytester: pytest.Pytester, write_dump) -> None:
    dump = write_dump(many_calls(8))
    result = pytester.runpytest_inprocess(
        f"--msprobe-dump={dump}",
        "--msprobe-device=cpu",
        "-p",
        "no:cacheprovider",
        "--msprobe-out=out",
        "--msprobe-white-list=add,silu",
        plugins=[Planted()],
    )
    result.stdout.fnmatch_lines(
        [
            "*msprobe summary*",
            "6 calls, 2 pass, 4 warning",
            "6 run here in * s (* calls/s)",
            "by standard:",
            "*planted_warning*warning 4",
            "by api type:",
            "worst calls:",
            "  Functional.silu.*: *=HYPERLINK* ...",
            "results: *accuracy_checking_result_*.csv",
        ]
    )
    assert "PASSED" not in result.stdout.str()
    worst = result.outlines[result.outlines.index("worst calls:") + 1 :][:4]
    assert all(len(line) < 400 for line in worst), worst


def test_deselected_calls_are_not_called_left_to_run(pytester: pytest.Pytester, write_dump) -> None:
    dump = write_dump(many_calls(8))  # 10 tests
    result = pytester.runpytest_inprocess(
        f"--msprobe-dump={dump}", "--msprobe-device=cpu", "-p", "no:cacheprovider", "--msprobe-out=out", "-k", "add"
    )
    result.stdout.fnmatch_lines(["2 calls, 2 pass", "2 run here in * s (* calls/s)"])
    assert "not run" not in result.stdout.str()


def test_a_run_that_checks_nothing_says_so_and_writes_nothing(pytester: pytest.Pytester, write_dump) -> None:
    result = pytester.runpytest_inprocess(
        f"--msprobe-dump={write_dump(many_calls(2))}",
        "--msprobe-device=cpu",
        "-p",
        "no:cacheprovider",
        "--msprobe-out=out",
        "-k",
        "nothing_matches",
    )
    result.stdout.fnmatch_lines(["results: none written (no call ran)"])
    assert not list((pytester.path / "out").glob("accuracy_checking_*"))


def test_progress_line_tells_done_pace_and_time_left() -> None:
    from pytest_msprobe.judge.verdict.record import ResultRecord
    from pytest_msprobe.results.summary import Summary

    summary = Summary()
    summary.started -= 10.0
    for number in range(20):
        status = "error" if number == 3 else "pass"
        summary.add(
            ResultRecord(
                dump="d",
                call=f"Torch.exp.{number}.forward",
                status=status,
                standard="benchmark",
                reference="single-run",
                device="cpu",
                message="",
            )
        )
    line = summary.progress(100)
    assert line.startswith("msprobe: 20/100 calls in 10 s (2.0 calls/s)")
    assert "about 40 s left" in line and "1 errors so far" in line
