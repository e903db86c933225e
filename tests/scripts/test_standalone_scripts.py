"""Standalone scripts (--msprobe-scripts, msprobe-script): written for calls of the
shared dumps, run in a fresh interpreter where pytest-msprobe cannot be imported, and
held to the verdict and metrics of the test that ran the same call."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch

from pytest_msprobe.dump import DEFAULT_MAX_ELEMENTS
from pytest_msprobe.dump.index import read_index
from pytest_msprobe.scripts.writer import WriteOptions, script_file_name, write_script
from pytest_msprobe.scripts.writer import main as msprobe_script

HERE = Path(__file__).parent
DUMPS = HERE.parent / "dumps"
# torch's own site-packages, put on the path of an interpreter started with -S: its
# .pth files (pytest-msprobe's editable finder among them) are never processed.
SITE_PACKAGES = Path(torch.__file__).parent.parent
# One thread on both sides: CPU kernels split reductions by thread count, and the
# tests run two scripts at a time on two cores.
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

# (dump, call): tensor and statistics tasks, forward and backward, tuple outputs,
# scalar arguments, keyword arguments, and a MindSpore call where MindSpore is installed
# (its dump needs MindSpore; tests/mindspore_replay covers MindSpore otherwise).
CHOSEN = [
    ("torch_mlpcnn_tensor_fp32", "Functional.linear.0.backward"),
    ("torch_mlpcnn_tensor_fp32", "Torch.topk.0.forward"),
    ("torch_mlpcnn_statistics_bf16", "Tensor.mean.0.backward"),
    ("torch_mlpcnn_statistics_bf16", "Functional.layer_norm.0.forward"),
    ("torch_mlpcnn_mix_tensor_fp16", "Functional.silu.0.backward"),
] + ([("mindspore_small_statistics_fp32", "Mint.exp.0.backward")] if importlib.util.find_spec("mindspore") else [])


def bare_python(script: Path, *args: str, fault: str | None = None) -> subprocess.CompletedProcess:
    """Run a script as the kernel engineer would, with torch but without pytest-msprobe;
    `fault` names a module of this folder that plants a fault first (planted_linear)."""
    env = {**os.environ, **ONE_THREAD, "PYTHONPATH": os.pathsep.join([str(SITE_PACKAGES), str(HERE)]), "GLOG_v": "3"}
    if fault:
        command = [
            "-c",
            f"import {fault}, runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')",
            str(script),
        ]
    else:
        command = [str(script)]
    return subprocess.run(
        [sys.executable, "-S", *command, *args], cwd=script.parent, env=env, capture_output=True, text=True, timeout=300
    )


def run_pytest(folder: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, **ONE_THREAD, "PYTHONPATH": str(HERE)}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--msprobe-device=cpu", "--msprobe-out=out", *args],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def journal(folder: Path) -> dict[tuple[str, str], dict[str, Any]]:
    """The test's records, by (dump folder name, call)."""
    [path] = (folder / "out").glob("msprobe_records_*.jsonl")
    records = (json.loads(line) for line in path.read_text().splitlines())
    return {(Path(r["dump"]).parent.name, r["call"]): r for r in records}


def same_number(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-9, abs=1e-12)


def assert_same_judgement(script_run: dict[str, Any], record: dict[str, Any]) -> None:
    assert script_run["status"] == record["status"], (script_run["message"], record["message"])
    assert len(script_run["outputs"]) == len(record["outputs"])
    for mine, theirs in zip(script_run["outputs"], record["outputs"], strict=True):
        for key in ("status", "standard", "reference", "device_dtype", "bench_dtype", "shape", "thresholds"):
            assert mine[key] == theirs[key], key
        assert mine["metrics"].keys() == theirs["metrics"].keys()
        differ = {
            k: (v, theirs["metrics"][k]) for k, v in mine["metrics"].items() if not same_number(v, theirs["metrics"][k])
        }
        assert differ == {}


def test_bare_interpreter_cannot_import_the_plugin() -> None:
    env = {**os.environ, "PYTHONPATH": str(SITE_PACKAGES)}
    done = subprocess.run(
        [sys.executable, "-S", "-c", "import torch; import pytest_msprobe"],
        cwd="/",
        env=env,
        capture_output=True,
        text=True,
    )
    assert "No module named 'pytest_msprobe'" in done.stderr


@pytest.fixture(scope="module")
def every_call_scripted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One run of the chosen dumps with --msprobe-scripts-all."""
    folder = tmp_path_factory.mktemp("all")
    dumps = sorted({dump for dump, _ in CHOSEN})
    for dump in dumps:
        shutil.copytree(DUMPS / dump, folder / dump)
    selected = " or ".join(call for _, call in CHOSEN)
    done = run_pytest(
        folder,
        *(f"--msprobe-dump={d}" for d in dumps),
        "--msprobe-scripts=scripts",
        "--msprobe-scripts-all",
        "-q",
        "-k",
        selected,
    )
    assert done.returncode in (0, 1), done.stdout[-3000:] + done.stderr[-3000:]
    return folder


def test_scripts_reach_the_tests_verdict_and_metrics(every_call_scripted: Path) -> None:
    records = journal(every_call_scripted)
    scripts = every_call_scripted / "scripts"
    assert len(list(scripts.glob("*.py"))) == len({call for _, call in records})  # every selected call, one file each

    def check(chosen: tuple[str, str]) -> tuple[str, str, subprocess.CompletedProcess, Path]:
        dump, call = chosen
        # Same-named calls of two dumps share a file name: write each one apart.
        target = write_script(
            read_index(every_call_scripted / dump / "dump.json"), call, every_call_scripted / "apart" / dump
        )
        out = target.with_suffix(".json")
        return dump, call, bare_python(target, "--device", "cpu", "--json", str(out)), out

    with ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(check, CHOSEN))
    for dump, call, done, out in runs:
        record = records[(dump, call)]
        assert "Traceback" not in done.stdout + done.stderr, done.stderr
        assert done.returncode == {"pass": 0, "warning": 0, "error": 1, "skip": 2}[record["status"]], done.stdout
        [script_run] = json.loads(out.read_text())
        assert_same_judgement(script_run, record)
        assert f"verdict: {record['status']}" in done.stdout
        for output in record["outputs"]:
            assert f"by the {output['standard']} standard" in done.stdout
            for key in output["metrics"]:
                assert key in done.stdout


def test_planted_fault_fails_the_test_and_its_script(tmp_path: Path) -> None:
    shutil.copytree(DUMPS / "torch_mlpcnn_tensor_fp32", tmp_path / "dump")
    done = run_pytest(tmp_path, "--msprobe-dump=dump", "-p", "planted_linear", "--msprobe-scripts=scripts", "-q")
    records = journal(tmp_path)
    failed = {call for (_, call), r in records.items() if r["status"] == "error"}
    assert done.returncode == 1 and {c for c in failed if c.startswith("Functional.linear.")} == {
        c for _, c in records if c.startswith("Functional.linear.")
    }
    assert sorted(p.name for p in (tmp_path / "scripts").glob("*.py")) == sorted(
        f"{c}.py" for c in failed
    )  # failed calls only
    script = tmp_path / "scripts" / "Functional.linear.0.forward.py"
    assert "error by the" in script.read_text().split('"""', 1)[0]  # its header quotes the test's verdict
    faulty = bare_python(script, "--device", "cpu", "--json", "faulty.json", fault="planted_linear")
    assert faulty.returncode == 1 and "verdict: error" in faulty.stdout, faulty.stdout + faulty.stderr
    assert_same_judgement(
        json.loads((script.parent / "faulty.json").read_text())[0], records[("dump", "Functional.linear.0.forward")]
    )
    healthy = bare_python(script, "--device", "cpu")
    assert healthy.returncode == 0 and "verdict: pass" in healthy.stdout


def test_a_nondeterministic_kernel_fails_the_repeated_test_and_script(tmp_path: Path) -> None:
    """--msprobe-repeat and a script's --repeat share the check (judge/repeat.py)."""
    shutil.copytree(DUMPS / "torch_mlpcnn_tensor_fp32", tmp_path / "dump")
    done = run_pytest(
        tmp_path,
        "--msprobe-dump=dump",
        "-p",
        "split_k_linear",
        "--msprobe-repeat=3",
        "-k",
        "linear.0.forward",
        "--msprobe-scripts=scripts",
        "-q",
    )
    record = journal(tmp_path)[("dump", "Functional.linear.0.forward")]
    assert done.returncode == 1 and record["status"] == "error" and "nondeterministic" in record["message"]
    script = tmp_path / "scripts" / "Functional.linear.0.forward.py"
    repeated = bare_python(
        script, "--device", "cpu", "--repeat", "3", "--json", "repeated.json", fault="split_k_linear"
    )
    assert repeated.returncode == 1 and "nondeterministic: " in repeated.stdout, repeated.stdout + repeated.stderr
    [run] = json.loads((script.parent / "repeated.json").read_text())  # its metrics vary with the first run's bits
    assert run["status"] == "error" and run["outputs"][0]["findings"].keys() == record["outputs"][0]["findings"].keys()
    assert run["outputs"][0]["findings"]["nondeterministic_elements"] > 0
    once = bare_python(script, "--device", "cpu", fault="split_k_linear")
    assert once.returncode == 0 and "verdict: pass" in once.stdout, once.stdout + once.stderr


def test_seeds_and_generated_inputs(tmp_path: Path) -> None:
    index = read_index(DUMPS / "torch_mlpcnn_tensor_fp32" / "dump.json")
    script = write_script(index, "Torch.topk.0.forward", tmp_path)
    done = bare_python(script, "--device", "cpu", "--generate", "--seeds", "2", "--direction", "forward")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "seed variant 2" in done.stdout and done.stdout.count("generated from statistics (seed") == 3


def test_bad_input_gives_an_explanation_not_a_traceback(write_dump, run_dump, tmp_path: Path) -> None:
    tensor = {
        "type": "torch.Tensor",
        "dtype": "torch.float32",
        "shape": [2, 3],
        "Max": 1.0,
        "Min": -1.0,
        "Mean": 0.0,
        "Norm": 1.0,
        "requires_grad": False,
    }
    dump = write_dump(
        {
            "Torch.exp.0.forward": {
                "input_args": [{**tensor, "data_name": "gone.pt"}],
                "input_kwargs": {},
                "output": [tensor],
            },
            "Torch.exp.1.forward": {
                "input_args": [{**tensor, "data_name": "../../escape.pt"}],
                "input_kwargs": {},
                "output": [tensor],
            },
            "Torch.exp.2.forward": {
                "input_args": [{"type": "mystery", "value": 1}],
                "input_kwargs": {},
                "output": [tensor],
            },
            "Torch.bernoulli.0.forward": {
                "input_args": [tensor, {"type": "float", "value": 0.5}],
                "input_kwargs": {},
                "output": [tensor],
            },
            "Torch.exp'''\nimport os.0.forward": {"input_args": [tensor], "input_kwargs": {}, "output": [tensor]},
        },
        task="tensor",
    )
    index = read_index(dump)
    tests = run_dump(dump, "--msprobe-device=cpu").calls
    expected = {
        "Torch.exp.0.forward": (1, "bad input: ", "is missing"),
        "Torch.exp.1.forward": (1, "bad input: ", "refused"),
        "Torch.exp.2.forward": (2, "skipped: ", "unsupported value type 'mystery'"),
        "Torch.bernoulli.0.forward": (2, "cannot be replayed: ", "random"),
        "Torch.exp'''\nimport os.0.forward": (2, "cannot be replayed: ", "replay table"),
    }
    scripts = {call: write_script(index, call, tmp_path / "scripts") for call in expected}
    with ThreadPoolExecutor(2) as pool:
        runs = dict(
            zip(scripts, pool.map(lambda script: bare_python(script, "--device", "cpu"), scripts.values()), strict=True)
        )
    for call, (status, kind, why) in expected.items():
        script, done = scripts[call], runs[call]
        assert script.parent == tmp_path / "scripts" and script.name == script_file_name(index.entry(call).name)
        assert "Traceback" not in done.stdout + done.stderr, done.stderr
        assert done.returncode == status and kind in done.stdout and why in done.stdout, done.stdout
        assert tests[call].outcome == {1: "failed", 2: "skipped"}[status] and why in tests[call].text


def test_write_options_name_the_file_and_embed_the_run(tmp_path: Path) -> None:
    """What write_script takes from the run (the largest tensor, the standards file) and
    from the test (its verdict line, its file's name), each where the script shows it."""
    index = read_index(DUMPS / "torch_mlpcnn_statistics_bf16" / "dump.json")
    standards = "api,standard\nexp,benchmark\n"
    options = WriteOptions(
        max_elements=123, standards_csv=standards, judged="Torch.exp.0.forward: error", file_name="named"
    )
    script = write_script(index, "Torch.exp.0.forward", tmp_path, options)
    text = script.read_text("utf-8")
    assert script == tmp_path / "named.py"
    assert "MAX_ELEMENTS = 123  #" in text and f"STANDARDS_CSV = r'''{standards}'''" in text
    assert "# test:  Torch.exp.0.forward: error\n" in text
    default = write_script(index, "Torch.exp.0.forward", tmp_path).read_text("utf-8")
    assert f"MAX_ELEMENTS = {DEFAULT_MAX_ELEMENTS}  #" in default and "STANDARDS_CSV = None" in default
    assert "# test:  (written without running the test)\n" in default
    with pytest.raises(TypeError):
        WriteOptions(max_element=1)  # type: ignore[call-arg]  # a misspelt option is an error, never ignored


def test_console_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dump = DUMPS / "torch_mlpcnn_statistics_bf16"
    assert msprobe_script([str(dump), "Torch.exp.0.forward", "-o", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "Torch.exp.0.forward.py")
    assert msprobe_script([str(dump), "Torch.exp.9.forward", "-o", str(tmp_path)]) == 2
    assert "did you mean Torch.exp.0.forward" in capsys.readouterr().err
    assert msprobe_script([str(tmp_path / "nowhere.json"), "Torch.exp.0.forward"]) == 2


def test_scripts_all_needs_a_folder(tmp_path: Path) -> None:
    shutil.copytree(DUMPS / "npu_rope_statistics_fp16", tmp_path / "dump")
    done = run_pytest(tmp_path, "--msprobe-dump=dump", "--msprobe-scripts-all")
    assert done.returncode == 4 and "--msprobe-scripts-all needs --msprobe-scripts" in done.stderr
