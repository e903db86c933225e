"""Start-up of a run as a user feels it: a dump of one call against the floor.

Each is the wall time of a fresh process (group "startup"):

  import torch     `python -c "import torch"`
  bare pytest      a pytest session of one empty test, with this environment's plugins
                   (pytest-msprobe inactive without a dump, xdist, hypothesis)
  1 call, -n 0     `pytest --msprobe-dump=<one call> --msprobe-device=cpu`
  1 call, -n 2     the same with two xdist workers (each imports torch; the controller does not)

The floor is import torch + bare pytest: what any run that replays a call under pytest
pays. Target: the 1-call run with -n 0 within 1 s of the floor. The one-call dump is
Functional.linear.0.forward of the shipped transformer dump, copied with its tensor files.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from benchmarks.support import SHIPPED, Sizes, plugin_command, timed_process

CALL = "Functional.linear.0.forward"


def one_call_dump(folder: Path) -> Path:
    """The shipped dump's first linear forward alone, with its tensor files."""
    dump = json.loads(SHIPPED.read_text())
    record = dump["data"][CALL]
    dump["data"] = {CALL: record}
    (folder / "dump_tensor_data").mkdir(parents=True)
    for name in json.dumps(record).split('"data_name": "')[1:]:
        name = name.split('"', 1)[0]
        shutil.copy(SHIPPED.parent / "dump_tensor_data" / name, folder / "dump_tensor_data" / name)
    (folder / "dump.json").write_text(json.dumps(dump))
    return folder / "dump.json"


def commands(work: Path) -> dict[str, list[str]]:
    dump = one_call_dump(work / "one")
    (work / "bare").mkdir()
    (work / "bare" / "test_bare.py").write_text("def test_nothing():\n    pass\n")
    bare = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", os.devnull]
    return {
        "import torch": [sys.executable, "-c", "import torch"],
        "bare pytest": [*bare, "--rootdir", str(work / "bare"), str(work / "bare" / "test_bare.py")],
        "1 call, -n 0": plugin_command(dump, work / "out"),
        "1 call, -n 2": plugin_command(dump, work / "out", "-n", "2"),
    }


@pytest.mark.benchmark(group="startup")
@pytest.mark.parametrize("run", ["import torch", "bare pytest", "1 call, -n 0", "1 call, -n 2"])
def test_startup(benchmark, sizes: Sizes, tmp_path: Path, run: str) -> None:
    command = commands(tmp_path)[run]
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "PYTEST_DEBUG_TEMPROOT": str(tmp_path / "tmp")}
    benchmark.pedantic(timed_process, args=(command, tmp_path, env), rounds=sizes(3, 7), iterations=1)
