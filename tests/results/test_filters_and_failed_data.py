"""White/black lists (options and msprobe's config.json), dedup, saving failed calls'
data, and the CSV cell rules on their own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from planted import Planted
from synthetic import many_calls, tensor

from pytest_msprobe.dump.filters import AccCheckConfig, FilterConfigError, read_config
from pytest_msprobe.results.msprobe_csv import MAX_CELL, metric_text, neutralise


def selected(
    pytester: pytest.Pytester, dump: Path, *args: str, plugins: tuple = ()
) -> tuple[list[str], pytest.HookRecorder]:
    recorder = pytester.inline_run(
        f"--msprobe-dump={dump}",
        "--msprobe-device=cpu",
        "-p",
        "no:cacheprovider",
        "--msprobe-out=out",
        *args,
        plugins=list(plugins),
    )
    names = [
        report.nodeid.rsplit("::", 1)[-1]
        for report in recorder.getreports("pytest_runtest_logreport")
        if report.when == "call"
    ]
    return sorted(names), recorder


@pytest.mark.parametrize("section", ["acc_check", "run_ut"])
def test_config_json_is_read_from_either_section_name(tmp_path: Path, section: str) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"task": "statistics", section: {"white_list": ["add"], "error_data_path": "bad"}}))
    assert read_config(config) == AccCheckConfig(("add",), (), "bad")


def test_config_json_lists_select_calls_and_options_override_them(pytester: pytest.Pytester, write_dump) -> None:
    dump = write_dump(many_calls(4))  # Torch.add.0, Functional.silu.1 (+backward), Torch.matmul.2, Tensor.abs.3
    config = pytester.path / "config.json"
    config.write_text(json.dumps({"acc_check": {"white_list": ["add", "silu"], "black_list": ["silu"]}}))
    names, recorder = selected(pytester, dump, f"--msprobe-config={config}")
    assert names == ["Torch.add.0.forward"]
    assert len(recorder.getcalls("pytest_deselected")[0].items) == 4
    names, _ = selected(pytester, dump, f"--msprobe-config={config}", "--msprobe-white-list=Torch.matmul, abs")
    assert names == ["Tensor.abs.3.forward", "Torch.matmul.2.forward"]


def test_a_bad_config_is_a_usage_error_that_says_what_to_fix(tmp_path: Path) -> None:
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({"acc_check": {"white_list": "linear"}}))
    with pytest.raises(FilterConfigError, match=r'white_list must be a list of API names, e.g. \["conv2d", "linear"\]'):
        read_config(bad)
    bad.write_text("{")
    with pytest.raises(FilterConfigError, match="cannot be read as JSON"):
        read_config(bad)


def test_dedup_keeps_one_call_per_signature_and_says_how_many_it_stands_for(
    pytester: pytest.Pytester, write_dump
) -> None:
    data = many_calls(8)  # two of each API, same shapes
    data["Torch.add.9.forward"] = {
        "input_args": [tensor([5]), tensor([5])],
        "input_kwargs": {},
        "output": [tensor([5])],
    }
    data["Torch.add.10.forward"] = {
        "input_args": [tensor([2, 3]), {"type": "int", "value": 2}],
        "input_kwargs": {},
        "output": [tensor([2, 3])],
    }
    names, recorder = selected(pytester, write_dump(data), "--msprobe-dedup", "-rA")
    assert names == [
        "Functional.silu.1.backward",
        "Functional.silu.1.forward",
        "Tensor.abs.3.forward",
        "Torch.add.0.forward",
        "Torch.add.10.forward",
        "Torch.add.9.forward",
        "Torch.matmul.2.forward",
    ]
    represents = {
        report.nodeid.rsplit("::", 1)[-1]: dict(report.user_properties).get("msprobe_represents")
        for report in recorder.getreports("pytest_runtest_logreport")
        if report.when == "call"
    }
    assert represents["Torch.add.0.forward"] == 2 and represents["Functional.silu.1.backward"] == 2
    assert represents["Torch.add.9.forward"] == 1


def test_dedup_counts_add_up_to_the_dumped_tests_and_every_direction_is_checked(
    pytester: pytest.Pytester, write_dump
) -> None:
    """A silu call without a backward comes first: it stands for the forwards, and the
    first silu backward is kept for the backwards (was: every silu backward dropped, and
    the summary's total off)."""
    data = {
        "Functional.silu.99.forward": {"input_args": [tensor([2, 3])], "input_kwargs": {}, "output": [tensor([2, 3])]},
        **many_calls(8),
    }  # 11 tests
    result = pytester.runpytest_inprocess(
        f"--msprobe-dump={write_dump(data)}",
        "--msprobe-device=cpu",
        "-p",
        "no:cacheprovider",
        "--msprobe-out=out",
        "--msprobe-dedup",
        "-rA",
    )
    result.assert_outcomes(passed=5, deselected=6)
    result.stdout.fnmatch_lines(
        [
            "dedup: these 5 tests stand for 11 dumped tests*the most repeated:",
            "  Functional.silu.99.forward: 3",
            "*PASSED*Functional.silu.1.backward*",
        ]
    )


def test_failed_calls_are_saved_as_safe_tensors_and_a_call_description(pytester: pytest.Pytester, write_dump) -> None:
    dump = write_dump(many_calls(2))
    names, _ = selected(pytester, dump, "--msprobe-save-failed=failed", "--msprobe-strict", plugins=(Planted(),))
    assert len(names) == 3
    saved = sorted(path.name for path in (pytester.path / "failed").iterdir())
    assert saved == [
        "Functional.silu.1.backward",
        "Functional.silu.1.forward",
    ]  # warnings fail under strict; add passed
    folder = pytester.path / "failed" / "Functional.silu.1.backward"
    call = json.loads((folder / "call.json").read_text())
    assert call["status"] == "warning" and call["forward_record"]["input_args"][0]["shape"] == [2, 3]
    assert call["files"] == ["bench.pt", "device.pt", "inputs.pt"]
    inputs = torch.load(folder / "inputs.pt", weights_only=True)
    assert set(inputs) == {"input_args.0", "grads.0"} and inputs["input_args.0"].shape == (2, 3)
    device, bench = (torch.load(folder / f"{side}.pt", weights_only=True) for side in ("device", "bench"))
    assert device["output.0"].dtype == torch.float32 and bench["output.0"].dtype == torch.float64


@pytest.mark.parametrize(
    "text, expected",
    [
        ("=1+2", "'=1+2"),
        ("+1", "'+1"),
        ("-1", "'-1"),
        ("@SUM(A1)", "'@SUM(A1)"),
        ("＝1", "'＝1"),
        ("\tx", "'\tx"),
        ("a=1", "a=1"),
        ("双千指标 ok", "双千指标 ok"),
        ("first\n=second\n", "first | =second"),
        ("\n=hidden", "'=hidden"),
    ],
)
def test_cells_are_neutralised_and_kept_on_one_line(text: str, expected: str) -> None:
    assert neutralise(text) == expected


def test_very_long_cells_are_cut_with_a_note() -> None:
    cell = neutralise("é" * (MAX_CELL + 5000))
    assert len(cell) < 32_767 and cell.endswith("(5000 more characters; see the metrics file)")


def test_metrics_print_with_14_decimals_and_a_space_when_absent() -> None:
    assert metric_text(1 / 3) == "0.33333333333333"
    assert metric_text(-0.5) == "-0.50000000000000"
    assert (metric_text(None), metric_text(float("nan")), metric_text(float("-inf"))) == (" ", "nan", "-inf")


def test_offline_failed_data_saves_the_dumped_outputs_that_were_judged(copy_dump, run_dump, tmp_path: Path) -> None:
    """Offline, the device is the dump: device.pt must hold the dumped (faulty) outputs,
    not a CPU replay of the call (which is what it held before)."""
    dump = copy_dump("models/faults/tf32_conv")
    run_dump(dump, "--msprobe-device=cpu", "--msprobe-offline", f"--msprobe-save-failed={tmp_path / 'failed'}")
    saved = torch.load(tmp_path / "failed" / "Functional.conv2d.0.forward" / "device.pt", weights_only=True)
    dumped = torch.load(dump.parent / "dump_tensor_data" / "Functional.conv2d.0.forward.output.0.pt", weights_only=True)
    assert torch.equal(saved["output"], dumped)
