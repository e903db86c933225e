"""Every script of benchmarks/, studies/ and tools/ runs from a fresh clone as its
README says: a command-line script answers `--help`, a plugin or a script without
options imports, and a script that needs msprobe's own Python or an optional library
(jax, onnxruntime) compiles.

All of one folder in one fresh interpreter (torch is imported once, not once per
script): each script runs there as `python <folder>/<script>.py` would run it, its
folder first on sys.path, from the repository's root.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# how each script is checked; a new script must be named here
HELP = "help"  # runs as __main__ with --help: argparse prints its usage and exits 0
IMPORT = "import"  # imported (a plugin, or a script without options whose main measures)
COMPILE = "compile"  # compiled only: it needs msprobe's Python or a library the project does not depend on
SCRIPTS = {
    "benchmarks": {},
    "studies": {
        "compiled_kernels.py": IMPORT,
        "cuda_kernels.py": HELP,
        "dataflow_coverage.py": HELP,
        "explore_faults_catalogue.py": HELP,
        "families_jax.py": COMPILE,  # needs jax[cpu]
        "families_onnx.py": COMPILE,  # needs onnx and onnxruntime
        "family_device.py": COMPILE,  # a plugin that needs jax[cpu]
        "family_recompute.py": IMPORT,
        "kernel_diversity.py": HELP,
        "kernel_ratios.py": HELP,
        "layout_kernels.py": HELP,
        "library_families.py": HELP,
        "real_models.py": HELP,
        "rounded_once.py": HELP,
        "summed_gradient_allowance.py": HELP,
        "upgrade_spread.py": HELP,
    },
    "tools": {
        "compare_records.py": HELP,
        "make_real_model_dumps.py": HELP,
        "make_transformer_dump.py": HELP,
        "msprobe_acc_check_cpu.py": COMPILE,  # needs msprobe's Python, and runs as it is imported
        "probe_plugin.py": IMPORT,
    },
}
SHELL_SCRIPTS = {"tools": {"cuda_check.sh", "verdict_harnesses.sh"}}
# the pytest-benchmark suite's own files in benchmarks/: tests/repository/test_benchmark_suite.py checks them
SUITE = ("test_", "conftest.py", "support.py", "__init__.py")

DRIVER = r"""
import contextlib, io, json, runpy, sys, traceback
folder, checks = sys.argv[1], json.loads(sys.argv[2])
sys.path.insert(0, folder)
results = {}
for name, how in checks.items():
    path = f"{folder}/{name}"
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            if how == "compile":
                compile(open(path, encoding="utf-8").read(), path, "exec")
            elif how == "import":
                runpy.run_path(path, run_name=name.removesuffix(".py"))
            else:
                sys.argv = [path, "--help"]
                try:
                    runpy.run_path(path, run_name="__main__")
                except SystemExit as stop:
                    if stop.code not in (0, None):
                        raise
                if "usage:" not in out.getvalue():
                    raise AssertionError("--help printed no usage")
        results[name] = None
    except BaseException:
        results[name] = traceback.format_exc()[-3000:] + out.getvalue()[-2000:]
print("RESULTS " + json.dumps(results))
"""


@pytest.mark.parametrize("folder", sorted(SCRIPTS))
def test_every_script_is_checked(folder: str) -> None:
    scripts = (
        path.name for path in (ROOT / folder).glob("*.py") if folder != "benchmarks" or not path.name.startswith(SUITE)
    )
    assert sorted(scripts) == sorted(SCRIPTS[folder])
    assert {path.name for path in (ROOT / folder).glob("*.sh")} == SHELL_SCRIPTS.get(folder, set())


@pytest.mark.parametrize("folder", sorted(SCRIPTS))
def test_every_script_runs(folder: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER, str(ROOT / folder), json.dumps(SCRIPTS[folder])],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULTS ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    failed = {name: error for name, error in json.loads(lines[-1].removeprefix("RESULTS ")).items() if error}
    assert not failed, "\n\n".join(f"{name}:\n{error}" for name, error in failed.items())


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
@pytest.mark.parametrize("script", sorted(SHELL_SCRIPTS["tools"]))
def test_every_shell_tool_parses_and_asks_for_its_arguments(script: str) -> None:
    """Run without arguments, a tool names what it needs and does nothing else."""
    path = ROOT / "tools" / script
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0
    done = subprocess.run(["bash", str(path)], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode != 0 and done.stderr.strip() and not done.stdout, done.stdout + done.stderr
