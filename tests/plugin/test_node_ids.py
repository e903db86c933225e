"""Counts and names that add up: every test's node id as `-v` prints it selects that
test when given back to pytest (calls, `.explore` tests and kernel tests alike), and the
msprobe summary counts calls and kernel tests apart, as pytest's own count adds them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch  # noqa: F401  loaded before pytester's in-process runs: numpy loads once per process

from pytest_msprobe.judge.gate.kernel_verdicts import is_kernel

DUMP = Path(__file__).parents[1] / "dumps" / "models" / "losses_tensor_bf16" / "dump.json"
RUN = ("--msprobe-device=cpu", "-p", "no:cacheprovider")
#: a test's line under -v: `<node id> PASSED [ 10%]`
VERBOSE_LINE = re.compile(r"^(\S+::\S+) (PASSED|FAILED|SKIPPED|XFAIL|XPASS|ERROR)\b")


def _printed(result: pytest.RunResult) -> list[str]:
    return [match[1] for line in result.outlines if (match := VERBOSE_LINE.match(line))]


def _collected(result: pytest.RunResult) -> list[str]:
    """The names of the tests `--collect-only -q` lists (its ids are the rootdir's)."""
    return [line.split("::", 1)[1] for line in result.outlines if "::" in line]


def _kernels(printed: list[str]) -> list[str]:
    return [nodeid for nodeid in printed if is_kernel(nodeid.split("::", 1)[1])]


def test_counts_add_up_and_every_printed_id_selects_its_test(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_inprocess(f"--msprobe-dump={DUMP}", *RUN, "-v")
    printed = _printed(result)
    kernels = _kernels(printed)
    calls = [nodeid for nodeid in printed if nodeid not in kernels]
    assert len(calls) == 30 and len(kernels) == 8, printed
    # the summary counts them apart, as pytest's count adds them
    result.stdout.fnmatch_lines(["30 calls, 30 pass; 8 kernels, 8 pass"])
    result.assert_outcomes(passed=38)
    for nodeid in calls:
        again = pytester.runpytest_inprocess(f"--msprobe-dump={DUMP}", *RUN, "--collect-only", "-q", nodeid)
        assert _collected(again) == [nodeid.split("::", 1)[1]], again.stdout.str()
    # No item bears a kernel's name: its id runs the calls it pools (its evidence) and
    # reports that kernel, no other.
    for nodeid in (kernels[0], kernels[-1]):
        again = pytester.runpytest_inprocess(f"--msprobe-dump={DUMP}", *RUN, "-v", nodeid)
        shown = _printed(again)
        assert _kernels(shown) == [nodeid], again.stdout.str()
        head, _, direction = nodeid.split("::", 1)[1].partition(".kernel.")
        api = head.rsplit(".", 1)[0]  # without the dtype
        pooled = [other for other in shown if other != nodeid]
        assert len(pooled) >= 2, shown
        assert all(re.fullmatch(rf"{re.escape(api)}\.\d+\.{direction}", other.split("::", 1)[1]) for other in pooled)
        again.assert_outcomes(passed=len(shown))


def test_a_printed_explore_id_selects_that_test(pytester: pytest.Pytester) -> None:
    chosen = ("--msprobe-explore=1", "-k", "Tensor.__add__.0.forward")
    result = pytester.runpytest_inprocess(f"--msprobe-dump={DUMP}", *RUN, *chosen, "-v")
    explored = [nodeid for nodeid in _printed(result) if nodeid.endswith(".explore")]
    assert len(explored) == 1, result.stdout.str()
    again = pytester.runpytest_inprocess(
        f"--msprobe-dump={DUMP}", *RUN, "--msprobe-explore=1", "--collect-only", "-q", explored[0]
    )
    assert _collected(again) == [explored[0].split("::", 1)[1]], again.stdout.str()
