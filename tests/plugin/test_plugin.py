"""The plugin as users run it: collection, node ids, markers, selection, options."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch

from pytest_msprobe.judge.gate.kernel_verdicts import is_kernel

STATS = "torch_mlpcnn_statistics_bf16"


@pytest.fixture
def local(pytester: pytest.Pytester, dumps: Path):
    """A shipped dump copied into the pytester folder (so that the repository's own
    conftest.py is not picked up as a nested one); returns its folder's name."""

    def copy(name: str, to: str | None = None) -> str:
        shutil.copytree(dumps / name, pytester.path / (to or name))
        return to or name

    return copy


def test_silent_without_a_dump_option(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_ok():\n    assert 1 + 1 == 2\n")
    result = pytester.runpytest("-q")
    result.assert_outcomes(passed=1)


def test_help_states_the_defaults(pytester: pytest.Pytester) -> None:
    text = " ".join(pytester.runpytest("--help").stdout.str().split())
    for flag, default in (
        ("--msprobe-device={auto,cpu,cuda,npu}", "auto"),
        ("--msprobe-out=PATH", "msprobe-out"),
        ("--msprobe-timeout=SECONDS", "300"),
        ("--msprobe-max-elements=N", "268435456"),
    ):
        described = text.split(flag, 1)[1].split(" --", 1)[0]
        assert f"(default: {default})" in described, (flag, described)


def test_plugin_import_costs_nothing() -> None:
    code = (
        "import sys, pytest_msprobe.plugin; print(sorted(m for m in ('torch', 'numpy', 'pandas') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_disabled_with_p_no(pytester: pytest.Pytester, local) -> None:
    pytester.makepyfile("def test_ok():\n    pass\n")
    pytester.runpytest("-p", "no:msprobe", "-q").assert_outcomes(passed=1)
    result = pytester.runpytest("-p", "no:msprobe", f"--msprobe-dump={local(STATS)}")
    result.stderr.fnmatch_lines(["*unrecognized arguments: --msprobe-dump*"])


def test_node_ids_are_path_and_call_name(pytester: pytest.Pytester, local) -> None:
    local(STATS, "step0/rank3")
    result = pytester.runpytest("--msprobe-dump=step0", "--co", "-q")
    assert "step0/rank3/dump.json::Functional.linear.0.forward" in result.stdout.lines
    assert "step0/rank3/dump.json::Functional.linear.0.backward" in result.stdout.lines
    result.stdout.fnmatch_lines(["49 tests collected*"])


def test_verbose_shows_the_node_id_that_deselect_takes(pytester: pytest.Pytester, local) -> None:
    dump = f"--msprobe-dump={local('npu_rope_statistics_fp16', 'rope')}"
    shown = pytester.runpytest(dump, "--msprobe-device=cpu", "-v", "-p", "no:cacheprovider")
    shown.stdout.fnmatch_lines(["rope/dump.json::Torch.cat.8.forward PASSED*"])
    assert "::Torch::cat::" not in shown.stdout.str()
    left = pytester.runpytest(
        dump,
        "--msprobe-device=cpu",
        "-q",
        "-p",
        "no:cacheprovider",
        "--deselect",
        "rope/dump.json::Torch.cat.8.forward",
    )
    left.assert_outcomes(passed=2, deselected=1)


def test_a_folder_of_ranks_gives_one_suite_per_dump(pytester: pytest.Pytester, local) -> None:
    for rank in ("rank0", "rank1"):
        local("npu_rope_statistics_fp16", f"step0/{rank}")
    result = pytester.runpytest("--msprobe-dump=step0", "--co", "-q")
    assert "step0/rank0/dump.json::Torch.cat.8.forward" in result.stdout.lines
    assert "step0/rank1/dump.json::Torch.cat.8.forward" in result.stdout.lines
    result.stdout.fnmatch_lines(["6 tests collected*"])


def test_module_entries_are_not_collected(pytester: pytest.Pytester, local) -> None:
    result = pytester.runpytest(f"--msprobe-dump={local('torch_mlpcnn_mix_tensor_fp16')}", "--co", "-q")
    result.stdout.fnmatch_lines(["49 tests collected*"])
    assert not any("::Module." in line for line in result.stdout.lines)
    result.stdout.fnmatch_lines(
        ["msprobe: torch_mlpcnn_mix_tensor_fp16/dump.json: 49 API calls, 18 Module/Cell entries not collected*"]
    )


def test_markers_and_keywords_select_calls(pytester: pytest.Pytester, local) -> None:
    dump = f"--msprobe-dump={local(STATS)}"
    result = pytester.runpytest(dump, "--co", "-q", "-m", "backward and api_functional", "--strict-markers")
    result.stdout.fnmatch_lines(["9/49 tests collected*"])
    result = pytester.runpytest(dump, "--co", "-q", "-k", "linear and forward")
    result.stdout.fnmatch_lines(["3/49 tests collected*"])


def test_dump_tests_only_unless_paths_are_named(pytester: pytest.Pytester, local) -> None:
    pytester.makepyfile(test_own="def test_own():\n    pass\n")
    dump = f"--msprobe-dump={local('npu_rope_statistics_fp16', 'rope')}"
    only_dump = pytester.runpytest(dump, "--co", "-q")
    only_dump.stdout.fnmatch_lines(["3 tests collected*"])
    both = pytester.runpytest(dump, "--co", "-q", "test_own.py", "rope/dump.json")
    both.stdout.fnmatch_lines(["4 tests collected*"])


def test_ini_options_work_like_flags(pytester: pytest.Pytester, local) -> None:
    pytester.makeini(f"[pytest]\nmsprobe_dump = {local('npu_rope_statistics_fp16')}\nmsprobe_device = cpu\n")
    pytester.runpytest("-q").assert_outcomes(passed=3)


def test_ini_paths_are_relative_to_the_ini_file(
    pytester: pytest.Pytester, local, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`pytest` in a subfolder of the project finds the dump and writes the results
    where the ini file says, as pytest's own path options do."""
    pytester.makeini(
        f"[pytest]\nmsprobe_dump = {local('npu_rope_statistics_fp16', 'step0')}\nmsprobe_device = cpu\nmsprobe_out = results\n"
    )
    monkeypatch.chdir(pytester.mkdir("sub"))
    pytester.runpytest("-q", "-p", "no:cacheprovider").assert_outcomes(passed=3)
    assert list((pytester.path / "results").glob("msprobe_records_*.jsonl"))
    assert not (pytester.path / "sub" / "results").exists()


def test_a_dump_inside_the_repository_runs_from_any_folder(tmp_path: Path) -> None:
    """Naming a dump of this repository from elsewhere makes pytest load the
    repository's conftest.py as a nested one: that must not stop the user's run."""
    example = Path(__file__).parents[2] / "examples" / "mlpcnn_tensor_fp32" / "dump.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            f"--msprobe-dump={example}",
            "--msprobe-device=cpu",
            "-q",
            "-p",
            "no:cacheprovider",
            "-k",
            "linear.0.forward",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "1 passed" in done.stdout


def test_unknown_device_is_a_usage_error(pytester: pytest.Pytester, local) -> None:
    result = pytester.runpytest(f"--msprobe-dump={local('npu_rope_statistics_fp16')}", "--msprobe-device=tpu")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*--msprobe-device: invalid choice: 'tpu' (choose from 'auto', 'cpu', 'cuda', 'npu')*"]
    )
    pytester.makeini("[pytest]\nmsprobe_device = tpu\n")  # an ini value is checked after argparse, by the plugin
    result = pytester.runpytest(f"--msprobe-dump={local('npu_rope_statistics_fp16', 'again')}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unknown device 'tpu': choose auto, cpu, cuda or npu*"])


@pytest.mark.parametrize(
    "rows, says",
    [
        ("api,standard\nlinear,nosuch\n", "API 'linear' is routed to standard 'nosuch', which is not registered"),
        (
            "api,dtype,threshold,value\nlinear,*,rmse_ratoi,2\n",
            "threshold 'rmse_ratoi' of 'linear' is read by no standard (did you mean 'rmse_ratio'?)",
        ),
        (
            "api,dtype,threshold,value\nlinear,float128,rtol,2\n",
            "threshold of 'linear' for dtype 'float128': not a floating dtype",
        ),
    ],
    ids=["unknown_standard", "unknown_threshold", "unknown_dtype"],
)
def test_a_standards_file_is_checked_at_start_up(pytester: pytest.Pytester, local, rows: str, says: str) -> None:
    pytester.makefile(".csv", standards=rows)
    result = pytester.runpytest(
        f"--msprobe-dump={local(STATS)}",
        "--msprobe-device=cpu",
        "--msprobe-standards=standards.csv",
        "-p",
        "no:cacheprovider",
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert says in result.stderr.str()
    assert "Traceback" not in result.stdout.str() + result.stderr.str()


def test_a_standard_of_ones_own_may_read_thresholds_of_its_own(pytester: pytest.Pytester, local) -> None:
    pytester.makeconftest(
        "def pytest_msprobe_register_standards(registry):\n"
        "    registry.register_standard('mine', lambda pair, thresholds, reference=None: None)\n"
    )
    pytester.makefile(".csv", standards="api,standard,dtype,threshold,value\nlinear,mine,*,my_limit,2\n")
    result = pytester.runpytest(
        f"--msprobe-dump={local(STATS)}", "--msprobe-standards=standards.csv", "--co", "-q", "-p", "no:cacheprovider"
    )
    assert result.ret == pytest.ExitCode.OK, result.stderr.str()


def test_missing_dump_path_is_a_usage_error(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--msprobe-dump=nowhere/dump.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--msprobe-dump nowhere/dump.json: no such file or folder*"])


@pytest.mark.skipif(
    importlib.util.find_spec("torch_npu") is not None, reason="checks the message where torch_npu is not installed"
)
def test_npu_without_torch_npu_says_it_is_not_installed(pytester: pytest.Pytester, local) -> None:
    result = pytester.runpytest(f"--msprobe-dump={local('npu_rope_statistics_fp16')}", "--msprobe-device=npu")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*--msprobe-device: torch_npu is not installed. Install pytest-msprobe?npu? (torch_npu)*"]
    )
    assert "is installed but" not in result.stderr.str()


def test_baseline_update_without_a_baseline_is_a_usage_error(pytester: pytest.Pytester, local) -> None:
    result = pytester.runpytest(f"--msprobe-dump={local('npu_rope_statistics_fp16')}", "--msprobe-baseline-update")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--msprobe-baseline-update needs --msprobe-baseline=DIR*"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_cuda_without_a_gpu_says_why(pytester: pytest.Pytester, local) -> None:
    result = pytester.runpytest(f"--msprobe-dump={local('npu_rope_statistics_fp16')}", "--msprobe-device=cuda")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*no cuda device is available*"])


def test_last_failed_reruns_only_the_failed_call(pytester: pytest.Pytester, local) -> None:
    local("npu_rope_statistics_fp16", "rope")
    # A conftest that breaks torch.cat for good: run in subprocesses so it cannot leak.
    pytester.makeconftest(
        "import torch\n"
        "original = torch.cat\n"
        "def biased(tensors, *args, **kwargs):\n"
        "    out = original(tensors, *args, **kwargs)\n"
        "    return out * 1.01 if out.dtype == torch.float16 else out\n"
        "torch.cat = biased\n"
    )
    first = pytester.runpytest_subprocess("--msprobe-dump=rope", "--msprobe-device=cpu", "-q")
    first.assert_outcomes(passed=2, failed=1)
    again = pytester.runpytest_subprocess("--msprobe-dump=rope", "--msprobe-device=cpu", "-q", "--lf")
    again.assert_outcomes(failed=1)
    again.stdout.fnmatch_lines(["*rope/dump.json::Torch.cat.8.forward*"])


def junit_properties(path: Path) -> dict[str, dict[str, str]]:
    tree = ET.parse(path)
    return {
        case.get("name"): {prop.get("name"): prop.get("value") for prop in case.iter("property")}
        for case in tree.iter("testcase")
    }


def test_junit_carries_status_standard_and_metrics(pytester: pytest.Pytester, local) -> None:
    pytester.runpytest(
        f"--msprobe-dump={local(STATS)}",
        "--msprobe-device=cpu",
        "-q",
        "--junitxml=out.xml",
        "-k",
        "linear.0.forward or topk",
    )
    props = junit_properties(pytester.path / "out.xml")
    linear = props["Functional.linear.0.forward"]
    assert linear["msprobe_status"] == "pass" and linear["msprobe_standard"] == "ulp"
    assert float(linear["msprobe_ulp_err_proportion"]) >= 0.0
    assert props["Torch.topk.0.forward"]["msprobe_standard"] == "binary_consistency"


def test_offline_verdicts_and_metrics_do_not_depend_on_workers(pytester: pytest.Pytester, local) -> None:
    """Offline the bench and the reference run on the CPU, whose kernels round by their
    thread count: every process must use the same count (it was all cores without
    xdist, a share of them in each xdist worker)."""
    dump = f"--msprobe-dump={local('torch_mlpcnn_tensor_fp32')}"
    runs = {}
    for label, extra in {"lone": ["-p", "no:xdist"], "n2": ["-n", "2"]}.items():
        pytester.runpytest(dump, "--msprobe-offline", "-q", "-p", "no:cacheprovider", f"--junitxml={label}.xml", *extra)
        runs[label] = junit_properties(pytester.path / f"{label}.xml")
    assert len([name for name in runs["lone"] if not is_kernel(name)]) == 49  # and the kernels' tests
    assert runs["lone"] == runs["n2"]


def test_statistics_verdicts_do_not_depend_on_order_or_workers(pytester: pytest.Pytester, local) -> None:
    dump = f"--msprobe-dump={local(STATS)}"
    runs = {}
    for label, extra in {"first": ["-p", "no:xdist"], "again": ["-p", "no:xdist"], "n2": ["-n", "2"]}.items():
        pytester.runpytest(dump, "--msprobe-device=cpu", "-q", f"--junitxml={label}.xml", *extra)
        runs[label] = junit_properties(pytester.path / f"{label}.xml")
    pytester.runpytest(
        dump, "--msprobe-device=cpu", "-q", "--junitxml=one.xml", "-k", "Functional.layer_norm.0.backward"
    )
    one = junit_properties(pytester.path / "one.xml")
    assert len([name for name in runs["first"] if not is_kernel(name)]) == 49  # and the kernels' tests
    assert runs["first"] == runs["again"] == runs["n2"]
    assert one["Functional.layer_norm.0.backward"] == runs["first"]["Functional.layer_norm.0.backward"]


@pytest.mark.parametrize(
    ("ini", "says"),
    [
        ("msprobe_timeout = soon", "--msprobe-timeout 'soon': expected seconds, e.g. 300"),
        ("msprobe_max_elements = 0", "--msprobe-max-elements '0': must be at least 1"),
    ],
)
def test_ini_numbers_are_checked_as_the_flags_are(pytester: pytest.Pytester, local, ini: str, says: str) -> None:
    """argparse checks a flag's number; the same check reads the ini value, which pytest
    reads after the command line."""
    pytester.makeini(f"[pytest]\n{ini}\n")
    result = pytester.runpytest(f"--msprobe-dump={local('npu_rope_statistics_fp16')}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{says}*"])
