"""The hidden-fault catalogue (pytest_msprobe/testing/explore_faults.py) against every call of its API:
does --msprobe-explore=N find each planted fault on every forward call of the API, in
the fault's dtypes, in every real dump of tests/dumps/models/ (and the example dump)?

    python studies/explore_faults_catalogue.py [--examples 50] [FAULT ...]

Per fault and call it runs one pytest session in this process with the fault patched
in (-k <call>, CPU device, a fresh --msprobe-out), and prints one JSON line: whether the
dumped test passed, whether the explored test failed, how the example was made minimal
(shrunk, or an edge tried first), and whether its one-call dump, judged as exploration
judges it (--msprobe-explore=1 -m explore), fails with the fault and passes without it
(with the fault's correct kernel where torch's own has the fault: ExploreFault.correct).
The tests (tests/judge/explore/test_explore.py) run one call per fault; this runs all of them.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import tempfile
from pathlib import Path

import pytest
import torch

from pytest_msprobe.testing.explore_faults import FAULTS, ExploreFault

ROOT = Path(__file__).resolve().parent.parent

DUMPS = [
    ROOT / "examples" / "mlpcnn_tensor_fp32",
    *sorted(path for path in (ROOT / "tests" / "dumps" / "models").iterdir() if "_tensor_" in path.name),
]


class _Patch:
    """monkeypatch's setattr and undo, outside a test."""

    def __init__(self) -> None:
        self.saved: list[tuple[object, str, object]] = []

    def setattr(self, owner: object, attr: str, value: object) -> None:
        self.saved.append((owner, attr, getattr(owner, attr)))
        setattr(owner, attr, value)

    def undo(self) -> None:
        for owner, attr, value in reversed(self.saved):
            setattr(owner, attr, value)
        self.saved.clear()


def _calls(dump: Path, fault: ExploreFault) -> list[str]:
    """The dump's forward calls of the fault's API whose first tensor has one of its dtypes."""
    data = json.loads((dump / "dump.json").read_text())["data"]
    dtypes = {str(dtype) for dtype in fault.dtypes}
    calls = []
    for name, record in data.items():
        if not (name.startswith(fault.api + ".") and name.endswith(".forward")):
            continue
        first = next((arg for arg in record.get("input_args", []) if isinstance(arg, dict) and arg.get("dtype")), None)
        if first is not None and first["dtype"] in dtypes:
            calls.append(name)
    return calls


def _records(out: Path) -> dict[str, dict]:
    return {
        record["call"]: record
        for journal in out.glob("msprobe_records_*.jsonl")
        for record in map(json.loads, journal.read_text().splitlines())
    }


def _run(dump: Path, out: Path, *args: str) -> dict[str, dict]:
    out.mkdir(parents=True, exist_ok=True)
    with contextlib.redirect_stdout(io.StringIO()):
        pytest.main(
            [
                f"--msprobe-dump={dump}",
                "--msprobe-device=cpu",
                f"--msprobe-out={out}",
                "-q",
                "-p",
                "no:cacheprovider",
                "--rootdir",
                str(out),
                *args,
            ]
        )
    return _records(out)


def check(name: str, dump: Path, call: str, examples: int, scratch: Path) -> dict:
    """One row of the table: the fault FAULTS[name] planted, explored on one call."""
    fault = FAULTS[name]
    patch = _Patch()
    fault.patch(patch)
    try:
        records = _run(dump / "dump.json", scratch / "explore", f"--msprobe-explore={examples}", "-k", call)
        explored = records.get(call + ".explore", {})
        message = explored.get("message", "")
        found = re.search(r"--msprobe-dump=(\S+) --msprobe-explore=1", message)
        again = (
            _run(Path(found[1]), scratch / "again", "--msprobe-explore=1", "-m", "explore").get(call + ".explore", {})
            if found
            else {}
        )
    finally:
        patch.undo()
    fault.patch_correct(patch)  # torch's own kernel where it is correct, else the fault's correct kernel
    try:
        fixed = (
            _run(Path(found[1]), scratch / "fixed", "--msprobe-explore=1", "-m", "explore").get(call + ".explore", {})
            if found
            else {}
        )
    finally:
        patch.undo()
    return {
        "fault": name,
        "dump": dump.name,
        "call": call,
        "dumped": records.get(call, {}).get("status"),
        "explored": explored.get("status"),
        "minimal": "edge"
        if "an edge tried first" in message
        else "shrunk"
        if "shrunk by hypothesis" in message
        else "",
        # the planted kernel itself crashing on an explored input (an empty row) is no finding
        "device_raised": "the device raised" in message,
        "counts": next(
            (line.strip() for line in message.splitlines() if "examples around the call judged" in line), ""
        ),
        "reproduced": again.get("status"),
        "without_fault": fixed.get("status"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("faults", nargs="*", help=f"some of: {', '.join(sorted(FAULTS))} (default: all)")
    parser.add_argument("--examples", type=int, default=50)
    args = parser.parse_args()
    torch.set_num_threads(1)
    unknown = sorted(set(args.faults) - set(FAULTS))
    if unknown:
        parser.error(f"unknown faults: {', '.join(unknown)}")
    for name in args.faults or sorted(FAULTS):
        fault = FAULTS[name]
        for dump in DUMPS:
            for call in _calls(dump, fault):
                with tempfile.TemporaryDirectory() as scratch:
                    print(json.dumps(check(name, dump, call, args.examples, Path(scratch))), flush=True)


if __name__ == "__main__":
    main()
