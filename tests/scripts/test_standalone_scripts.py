"""Standalone scripts (--msprobe-scripts, msprobe-script): written for calls of the
shared dumps, run in a fresh interpreter where pytest-msprobe cannot be imported (the
judging library then comes from _msprobe_judge.py beside them) and in one where it is
installed, and held to the verdict and metrics of the test that ran the same call."""

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
from pytest_msprobe.judge.verdict.record import ResultRecord
from pytest_msprobe.scripts.command import main as msprobe_script
from pytest_msprobe.scripts.shared import SHARED_FILE
from pytest_msprobe.scripts.standalone import WriteOptions, expected_verdict, script_file_name, write_script

HERE = Path(__file__).parent
EXIT_IMPORTED = 99  # without_plugin.py's exit status where a script imported pytest_msprobe
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
] + (
    [
        ("mindspore_small_statistics_fp32", "Mint.exp.0.backward"),
        ("mindspore_small_tensor_fp32", "Tensor.__mul__.1.backward"),
    ]
    if importlib.util.find_spec("mindspore")
    else []
)


def bare_python(script: Path, *args: str, fault: str | None = None) -> subprocess.CompletedProcess:
    """Run a script as the kernel engineer would, with torch but without pytest-msprobe
    (without_plugin.py: importing it fails, and a run that imported it anyway exits 99);
    `fault` names a module of this folder that plants a fault first (planted_linear)."""
    env = {**os.environ, **ONE_THREAD, "PYTHONPATH": os.pathsep.join([str(SITE_PACKAGES), str(HERE)]), "GLOG_v": "3"}
    first = f"import {fault}; " if fault else ""
    command = ["-c", f"{first}import without_plugin; without_plugin.run()", str(script)]
    done = subprocess.run(
        [sys.executable, "-S", *command, *args], cwd=script.parent, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode != EXIT_IMPORTED, done.stderr
    assert "note: judged by" not in done.stderr, done.stderr  # the library it was written with
    if script.with_name(SHARED_FILE).is_file() and "judged by" in done.stdout:
        assert "judged by _msprobe_judge.py beside the script" in done.stdout, done.stdout
    return done


def installed_python(script: Path, *args: str) -> subprocess.CompletedProcess:
    """Run a script where pytest-msprobe is installed (this environment's), from a copy
    of its folder without _msprobe_judge.py: the installed package judges."""
    alone = script.parent.parent / f"{script.parent.name}-installed"
    alone.mkdir(exist_ok=True)
    for path in (script, script.with_suffix(".pt")):
        if path.is_file():
            shutil.copy(path, alone / path.name)
    env = {**os.environ, **ONE_THREAD}
    done = subprocess.run(
        [sys.executable, script.name, *args], cwd=alone, env=env, capture_output=True, text=True, timeout=300
    )
    assert "judged by the installed pytest-msprobe" in done.stdout, done.stdout + done.stderr
    assert "note: judged by" not in done.stderr, done.stderr
    return done


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
    written = {path.name for path in scripts.glob("*.py")}
    assert written - {SHARED_FILE} == {f"{call}.py" for _, call in records}  # every selected call, one file each
    assert SHARED_FILE in written  # and the judging library, once

    def check(chosen: tuple[str, str]) -> tuple[str, str, list[subprocess.CompletedProcess], list[Path]]:
        dump, call = chosen
        # Same-named calls of two dumps share a file name: write each one apart.
        fields = {k: v for k, v in records[(dump, call)].items() if k in ResultRecord.__dataclass_fields__}
        expected = expected_verdict(ResultRecord.from_dict(fields))
        target = write_script(
            read_index(every_call_scripted / dump / "dump.json"),
            call,
            every_call_scripted / "apart" / dump,
            WriteOptions(expected=expected),
        )
        outs = [target.with_name(f"{target.stem}.{how}.json") for how in ("bare", "installed")]
        runs = [
            bare_python(target, "--device", "cpu", "--json", str(outs[0])),
            installed_python(target, "--device", "cpu", "--json", str(outs[1])),
        ]
        return dump, call, runs, outs

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(check, CHOSEN))
    for dump, call, runs, outs in results:
        record = records[(dump, call)]
        for done, out in zip(runs, outs, strict=True):
            assert "Traceback" not in done.stdout + done.stderr, done.stderr
            assert done.returncode == {"pass": 0, "warning": 0, "error": 1, "skip": 2}[record["status"]], done.stdout
            [script_run] = json.loads(out.read_text())
            assert_same_judgement(script_run, record)
            assert f"verdict: {record['status']}" in done.stdout
            assert f"as the test: {record['status']} by the" in done.stdout, done.stdout
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
        [SHARED_FILE, *(f"{c}.py" for c in failed)]
    )  # failed calls only
    script = tmp_path / "scripts" / "Functional.linear.0.forward.py"
    assert "error by the" in script.read_text().split('"""', 1)[0]  # its header quotes the test's verdict
    faulty = bare_python(script, "--device", "cpu", "--json", "faulty.json", fault="planted_linear")
    assert faulty.returncode == 1 and "verdict: error" in faulty.stdout, faulty.stdout + faulty.stderr
    assert "as the test: error by the" in faulty.stdout
    assert_same_judgement(
        json.loads((script.parent / "faulty.json").read_text())[0], records[("dump", "Functional.linear.0.forward")]
    )
    healthy = bare_python(script, "--device", "cpu")
    assert healthy.returncode == 0 and "verdict: pass" in healthy.stdout
    assert "differs from the test: status 'error' in the test" in healthy.stdout, healthy.stdout


def test_a_nondeterministic_kernel_fails_the_repeated_test_and_script(tmp_path: Path) -> None:
    """--msprobe-repeat and a script's --repeat share the check (judge/findings/repeat.py)."""
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
    assert "# expected:  Torch.exp.0.forward: error\n" in text
    default = write_script(index, "Torch.exp.0.forward", tmp_path).read_text("utf-8")
    assert f"MAX_ELEMENTS = {DEFAULT_MAX_ELEMENTS}  #" in default and "STANDARDS_CSV = None" in default
    assert "# expected:  (written without running the test)\n" in default
    with pytest.raises(TypeError):
        WriteOptions(max_element=1)  # type: ignore[call-arg]  # a misspelt option is an error, never ignored


def test_console_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dump = DUMPS / "torch_mlpcnn_statistics_bf16"
    assert msprobe_script([str(dump), "Torch.exp.0.forward", "-o", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "Torch.exp.0.forward.py")
    assert msprobe_script([str(dump), "Torch.exp.9.forward", "-o", str(tmp_path)]) == 2
    assert "did you mean Torch.exp.0.forward" in capsys.readouterr().err
    assert msprobe_script([str(tmp_path / "nowhere.json"), "Torch.exp.0.forward"]) == 2
    assert msprobe_script([str(dump), "Torch.exp.0.forward", "-o", str(tmp_path), "--offline"]) == 2
    assert "--offline needs a tensor dump" in capsys.readouterr().err
    assert msprobe_script([str(EXAMPLE), "Torch.exp.0.forward", "-o", str(tmp_path / "offline"), "--offline"]) == 0
    script = Path(capsys.readouterr().out.strip())
    assert "OFFLINE = True" in script.read_text("utf-8") and (tmp_path / "offline" / SHARED_FILE).is_file()
    assert "Torch.exp.0.forward.output.0.pt" in torch.load(script.with_suffix(".pt"), weights_only=True)


def test_scripts_all_needs_a_folder(tmp_path: Path) -> None:
    shutil.copytree(DUMPS / "npu_rope_statistics_fp16", tmp_path / "dump")
    done = run_pytest(tmp_path, "--msprobe-dump=dump", "--msprobe-scripts-all")
    assert done.returncode == 4 and "--msprobe-scripts-all needs --msprobe-scripts" in done.stderr


EXAMPLE = HERE.parent.parent / "examples" / "mlpcnn_tensor_fp32" / "dump.json"
# the ceiling the issue set: a script small enough to paste into a kernel bug report
SCRIPT_BYTES = 50_000


def test_every_script_is_small_and_shares_one_library(tmp_path: Path) -> None:
    """The example dump's calls and a bfloat16 call of a real model: each script is a
    few KB, its tensors beside it, the judging library one file for the folder."""
    index = read_index(EXAMPLE)
    scripts = [write_script(index, name, tmp_path) for name in index.names]
    bf16 = read_index(DUMPS / "models" / "embedattn_tensor_bf16" / "dump.json")
    scripts.append(write_script(bf16, "Tensor.__truediv__.0.forward", tmp_path))
    sizes = {script.name: script.stat().st_size for script in scripts}
    assert max(sizes.values()) < SCRIPT_BYTES, max(sizes.items(), key=lambda item: item[1])
    assert sorted(path.name for path in tmp_path.glob("_msprobe*")) == [SHARED_FILE]
    for script in scripts:
        text = script.read_text("utf-8")
        assert "_FILES" not in text and "def _unpack" not in text  # no library source in a script
        side = script.with_suffix(".pt")
        assert side.is_file() and f"TENSORS = {side.name!r}" in text  # tensor dumps: the tensors beside it
        loaded = torch.load(side, weights_only=True)
        assert all(isinstance(tensor, torch.Tensor) for tensor in loaded.values())
    assert "dump_tensor_data" not in "".join(script.read_text("utf-8") for script in scripts).replace(
        "dump_tensor_data/", ""
    )  # never a path into the dump's tensors


def test_every_input_is_listed_scalars_by_value(tmp_path: Path) -> None:
    """x / 4.0 in bfloat16 (a real model's attention scale): the scalar operand is in the
    header and in the run's inputs, by value, beside the tensor's dtype and shape."""
    index = read_index(DUMPS / "models" / "embedattn_tensor_bf16" / "dump.json")
    script = write_script(index, "Tensor.__truediv__.0.forward", tmp_path)
    header = script.read_text("utf-8").split('"""', 1)[0]
    assert "#   input_args[0]  tensor bfloat16 [2, 12, 12]  in Tensor.__truediv__.0.forward.pt\n" in header
    assert "#   input_args[1]  float 4.0\n" in header
    done = bare_python(script, "--device", "cpu")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line.split() for line in done.stdout.splitlines()]
    assert ["input_args[1]", "float", "4.0"] in lines and ["input_args[0]", "bfloat16", "[2,", "12,", "12]"] in [
        line[:5] for line in lines
    ]
    backward = write_script(index, "Tensor.__truediv__.0.backward", tmp_path)
    assert "#   backward.input[0]  tensor bfloat16 [2, 12, 12]" in backward.read_text("utf-8")


def test_an_offline_bias_fails_the_test_and_its_script_alike(tmp_path: Path) -> None:
    """--msprobe-offline: the dumped outputs are the device's. A linear whose dumped
    output was planted 2**-12 too large fails the test; its script, carrying that output
    in its tensor file, reaches the same verdict with no device fault planted; a passing
    call's script passes."""
    shutil.copytree(EXAMPLE.parent, tmp_path / "dump")
    output = tmp_path / "dump" / "dump_tensor_data" / "Functional.linear.0.forward.output.0.pt"
    torch.save(torch.load(output, weights_only=True) * (1 + 2**-12), output)
    calls = ["Functional.linear.0.forward", "Tensor.__mul__.0.forward"]
    done = run_pytest(
        tmp_path,
        "--msprobe-dump=dump",
        "--msprobe-offline",
        "--msprobe-scripts=scripts",
        "--msprobe-scripts-all",
        "-q",
        "-k",
        " or ".join(calls),
    )
    records = journal(tmp_path)
    assert done.returncode == 1 and records[("dump", calls[0])]["status"] == "error", done.stdout[-2000:]
    assert records[("dump", calls[1])]["status"] == "pass"
    shutil.rmtree(tmp_path / "dump")  # the scripts need nothing of the dump
    for call in calls:
        script = tmp_path / "scripts" / f"{call}.py"
        assert "OFFLINE = True" in script.read_text("utf-8")
        done = bare_python(script, "--json", "run.json")
        record = records[("dump", call)]
        assert done.returncode == {"pass": 0, "error": 1}[record["status"]], done.stdout + done.stderr
        assert "offline: the dumped outputs are the device result" in done.stdout
        assert f"as the test: {record['status']} by the" in done.stdout, done.stdout
        assert_same_judgement(json.loads((script.parent / "run.json").read_text())[0], record)
        assert installed_python(script).returncode == done.returncode


def test_a_script_names_a_judging_library_it_was_not_written_with(tmp_path: Path) -> None:
    index = read_index(EXAMPLE)
    script = write_script(index, "Tensor.__mul__.0.forward", tmp_path)
    shared = tmp_path / SHARED_FILE
    text = shared.read_text("utf-8")
    shared.write_text(text.replace("(library ", "(library 0", 1), "utf-8")  # another library's identity
    done = bare_python_allowing_notes(script)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "note: judged by pytest-msprobe" in done.stderr and "its verdict may differ" in done.stderr
    write_script(index, "Tensor.__mul__.0.forward", tmp_path)
    assert shared.read_text("utf-8") == text  # writing again restores the library the scripts need
    shared.unlink()
    alone = bare_python_allowing_notes(script)
    assert alone.returncode == 1 and "Traceback" not in alone.stderr
    assert "pytest-msprobe installed (pip install pytest-msprobe) or _msprobe_judge.py beside" in alone.stderr


def bare_python_allowing_notes(script: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, **ONE_THREAD, "PYTHONPATH": os.pathsep.join([str(SITE_PACKAGES), str(HERE)])}
    command = ["-c", "import without_plugin; without_plugin.run()", str(script), "--device", "cpu"]
    return subprocess.run(
        [sys.executable, "-S", *command], cwd=script.parent, env=env, capture_output=True, text=True, timeout=300
    )


def test_a_hostile_or_missing_tensor_file_is_refused_not_run(tmp_path: Path) -> None:
    """The tensor file travels with a bug report: loaded with weights_only=True, a
    pickle that would run code is refused, and a missing one is named."""
    script = write_script(read_index(EXAMPLE), "Tensor.__mul__.0.forward", tmp_path)
    side = script.with_suffix(".pt")
    marker = tmp_path / "ran"
    torch.save({"Tensor.__mul__.0.forward.input.0.pt": Hostile(str(marker))}, side)
    done = bare_python(script, "--device", "cpu")
    assert done.returncode == 1 and "bad input: cannot load Tensor.__mul__.0.forward.pt" in done.stdout, done.stdout
    assert not marker.exists() and "Traceback" not in done.stdout + done.stderr
    torch.save({"../escape.pt": torch.zeros(1)}, side)
    done = bare_python(script, "--device", "cpu")
    assert done.returncode == 1 and "is not a dict of dumped file names to tensors" in done.stdout, done.stdout
    side.unlink()
    done = bare_python(script, "--device", "cpu")
    assert done.returncode == 1 and "Tensor.__mul__.0.forward.pt is not beside the script" in done.stdout


class Hostile:
    """Pickles as a call of os.system: what weights_only=True must never run."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return os.system, (f"touch {self.marker}",)
