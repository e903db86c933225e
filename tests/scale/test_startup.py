"""Start-up: the xdist controller imports no torch and checks no device; the
workers do, and a device they cannot use is one clear failure, not one per worker; a
session of dump calls alone does not import hypothesis to summarize nothing; the
results are those of a run without xdist."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

DUMPS = Path(__file__).parents[1] / "dumps"

# Each process of the run writes which heavy modules it imported, at its very end.
MODULES = """
import sys, json
from pathlib import Path

import pytest


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    worker = config.workerinput["workerid"] if hasattr(config, "workerinput") else "main"
    heavy = [name for name in ("torch", "hypothesis", "sympy") if name in sys.modules]
    # the standards' numerics; the controller pools kernel verdicts by their pure sign
    # arithmetic (signs) and ranks statuses (verdict: the Status literal and its order)
    light = ("pytest_msprobe.standards.signs", "pytest_msprobe.standards.verdict")
    heavy += sorted(name for name in sys.modules if name.startswith("pytest_msprobe.standards.") and name not in light)
    Path(f"modules-{worker}.json").write_text(json.dumps(heavy))
"""


def _imported(folder: Path) -> dict[str, list[str]]:
    return {path.stem.removeprefix("modules-"): json.loads(path.read_text()) for path in folder.glob("modules-*.json")}


@pytest.fixture
def small_dump(pytester: pytest.Pytester) -> str:
    """The shipped float32 tensor dump of a small MLP/CNN (forward and backward calls)."""
    shutil.copytree(DUMPS / "torch_mlpcnn_tensor_fp32", pytester.path / "dump")
    return "--msprobe-dump=dump"


@pytest.mark.parametrize("mode", [(), ("--msprobe-offline",)], ids=["online", "offline"])
def test_the_controller_imports_no_torch(
    pytester: pytest.Pytester, small_dump: str, mode: tuple[str, ...], comparable_records
) -> None:
    pytester.makeconftest(MODULES)
    common = (small_dump, "--msprobe-device=cpu", "-p", "no:cacheprovider", *mode)
    serial = pytester.runpytest_subprocess(*common, "--msprobe-out=out0", timeout=300)
    for name in list(_imported(pytester.path)):
        (pytester.path / f"modules-{name}.json").unlink()
    parallel = pytester.runpytest_subprocess(*common, "--msprobe-out=out2", "-n", "2", timeout=300)
    assert parallel.ret == serial.ret == pytest.ExitCode.OK, parallel.stdout.str()[-3000:]
    imported = _imported(pytester.path)
    assert set(imported) == {"main", "gw0", "gw1"}, imported
    assert imported["main"] == [], imported  # no torch, no standards but signs and verdict: nothing heavy
    for worker in ("gw0", "gw1"):
        assert "torch" in imported[worker] and "sympy" not in imported[worker], imported
    assert comparable_records(pytester.path / "out0") == comparable_records(pytester.path / "out2")
    parallel.stdout.fnmatch_lines(
        ["msprobe: 2 workers, dist=worksteal; host *: gw0->cpu, gw1->cpu; 1 CPU thread(s) each"]
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_device_the_workers_cannot_use_is_one_failure(pytester: pytest.Pytester, small_dump: str) -> None:
    result = pytester.runpytest_subprocess(
        small_dump, "--msprobe-device=cuda", "-n", "2", "-p", "no:cacheprovider", timeout=300
    )
    text = result.stdout.str() + result.stderr.str()
    assert result.ret != pytest.ExitCode.OK
    assert text.count("--msprobe-device: no cuda device is available") == 2, text  # the error and its summary line
    result.stdout.fnmatch_lines(
        ["*ERROR collecting dump/dump.json*", "--msprobe-device: no cuda device is available", "*1 error in*"]
    )
    assert "Traceback" not in text and "crashed" not in text and "replacing" not in text, text


@pytest.mark.parametrize(
    "args, says",
    [
        (
            ("--msprobe-device=tpu",),
            "--msprobe-device: invalid choice: 'tpu' (choose from 'auto', 'cpu', 'cuda', 'npu')",
        ),
        (("--msprobe-devices=0;1",), "--msprobe-devices '0;1': expected device ids separated by commas"),
        (("--msprobe-max-elements=many",), "--msprobe-max-elements: 'many': expected a whole number of elements"),
    ],
    ids=["device", "device_ids", "max_elements"],
)
def test_the_controller_still_refuses_bad_options(
    pytester: pytest.Pytester, small_dump: str, args: tuple[str, ...], says: str
) -> None:
    result = pytester.runpytest_subprocess(small_dump, *args, "-n", "2", "-p", "no:cacheprovider", timeout=120)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert says in result.stderr.str()


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_dump_session_does_not_import_hypothesis(pytester: pytest.Pytester, small_dump: str, workers: str) -> None:
    pytester.makeconftest(MODULES)
    result = pytester.runpytest_subprocess(
        small_dump, "--msprobe-device=cpu", "-n", workers, "-p", "no:cacheprovider", "-k", "linear", timeout=300
    )
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()[-3000:]
    imported = _imported(pytester.path)
    assert imported and not any("hypothesis" in modules for modules in imported.values()), imported


def test_hypothesis_still_summarizes_a_session_with_other_tests(pytester: pytest.Pytester, small_dump: str) -> None:
    """Only a session of dump calls alone leaves hypothesis's summary out."""
    pytester.makeconftest(MODULES)
    pytester.makepyfile(test_other="def test_other():\n    pass\n")
    result = pytester.runpytest_subprocess(
        small_dump,
        "--msprobe-device=cpu",
        "-p",
        "no:cacheprovider",
        "-k",
        "linear or other",
        "dump",
        "test_other.py",
        timeout=300,
    )
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()[-3000:]
    assert "hypothesis" in _imported(pytester.path)["main"]  # its plugin's summary imports it, as without a dump
