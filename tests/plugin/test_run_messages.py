"""The run's own lines a user trips on: worst calls that name their dump (several
dumps) and never repeat the call's name, list entries that match no API, skip reasons
kept whole with what to do, and an offline run's missing output file named as such."""

from __future__ import annotations

import itertools
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch

from pytest_msprobe.judge.offline.dumped_run import OFFLINE_BACKWARD_REMEDY

if TYPE_CHECKING:
    from conftest import DumpRun  # the root conftest's run_dump result (tests/conftest.py is another)

DUMP = "torch_mlpcnn_tensor_fp32"
LINEAR = "Functional.linear.0.forward"
OFFLINE = ("--msprobe-device=cpu", "--msprobe-offline", "-p", "no:cacheprovider")


def _data(dump: Path, name: str) -> Path:
    return dump.parent / "dump_tensor_data" / name


def _worst_calls(result: pytest.RunResult) -> list[str]:
    lines = result.outlines
    start = lines.index("worst calls:") + 1
    # the section's indented lines, up to the next heading (under CI=true pytest's short
    # summary repeats whole messages, indented too)
    rows = itertools.takewhile(lambda line: line.startswith("  "), lines[start:])
    return [line.strip() for line in rows]


def test_worst_calls_name_the_dump_of_each_call_in_a_run_of_several(
    copy_dump: Callable[[str], Path], pytester: pytest.Pytester, tmp_path: Path
) -> None:
    dump = copy_dump(DUMP)
    ranks = tmp_path / "ranks"
    for rank in ("rank0", "rank1"):
        shutil.copytree(dump.parent, ranks / rank)
    planted = _data(ranks / "rank1" / "dump.json", f"{LINEAR}.output.0.pt")
    torch.save(torch.load(planted, weights_only=True) * (1 + 2**-12), planted)
    result = pytester.runpytest_inprocess(f"--msprobe-dump={ranks}", *OFFLINE)
    (line,) = _worst_calls(result)
    assert line.startswith(f"{LINEAR} (rank1/dump.json): output: "), line


def test_worst_calls_never_repeat_the_call_name(copy_dump: Callable[[str], Path], pytester: pytest.Pytester) -> None:
    """A call that fails before any comparison (its input file gone): its message
    starts with its name, which the summary's line names already."""
    dump = copy_dump(DUMP)
    _data(dump, "Functional.linear.1.forward.input.0.pt").unlink()
    result = pytester.runpytest_inprocess(f"--msprobe-dump={dump}", *OFFLINE)
    lines = _worst_calls(result)
    assert lines, result.stdout.str()
    for line in lines:
        call, rest = line.split(": ", 1)
        assert not rest.startswith(call), line
    assert lines[0].startswith("Functional.linear.1.forward: bad input: "), lines


@pytest.mark.parametrize(
    ("option", "typo", "closest"),
    [("--msprobe-white-list", "lineer", "linear"), ("--msprobe-black-list", "softmx", "softmax")],
)
@pytest.mark.parametrize("workers", [(), ("-n", "1")], ids=["one process", "xdist"])
def test_a_list_entry_that_matches_no_api_is_a_usage_error_naming_the_closest(
    pytester: pytest.Pytester, dumps: Path, option: str, typo: str, closest: str, workers: tuple[str, ...]
) -> None:
    dump = dumps / DUMP / "dump.json"
    result = pytester.runpytest_subprocess(f"--msprobe-dump={dump}", *OFFLINE, f"{option}=conv1d,{typo}", *workers)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str() + result.stderr.str()
    assert f"{option} entry {typo!r} matches no API of the dumps: did you mean {closest}" in result.stderr.str()
    assert "conv1d" not in result.stderr.str().split("did you mean", 1)[0]  # a matching entry is no problem


def test_a_matching_list_still_selects(run_dump: Callable[..., DumpRun], dumps: Path) -> None:
    run = run_dump(dumps / DUMP / "dump.json", *OFFLINE, "--msprobe-white-list=linear")
    assert run.ret == 0 and run.calls and all(".linear." in name for name in run.calls)


def test_skip_reasons_are_whole_and_say_what_to_do(pytester: pytest.Pytester, dumps: Path) -> None:
    """The offline backward of a composite API (cross_entropy): pytest's -rs line and the
    summary's reasons carry the whole text, up to what the user can do."""
    dump = dumps / "torch_mlpcnn_mix_tensor_fp16" / "dump.json"
    result = pytester.runpytest_inprocess(f"--msprobe-dump={dump}", *OFFLINE, "-rs", "-k", "cross_entropy")
    text = result.stdout.str()
    skipped = [line for line in result.outlines if line.startswith("SKIPPED")]
    assert skipped and all(line.endswith(OFFLINE_BACKWARD_REMEDY) for line in skipped), text
    start = result.outlines.index("skipped, by reason (not judged: the call's files have the full messages):")
    assert result.outlines[start + 1].endswith(OFFLINE_BACKWARD_REMEDY), text
    assert " ..." not in result.outlines[start + 1]


def test_an_offline_run_names_a_missing_output_file_and_what_to_do(
    copy_dump: Callable[[str], Path], run_dump: Callable[..., DumpRun]
) -> None:
    dump = copy_dump(DUMP)
    _data(dump, f"{LINEAR}.output.0.pt").unlink()
    outcome = run_dump(dump, *OFFLINE, "-k", "linear and 0 and forward").calls[LINEAR]
    assert outcome.outcome == "failed"
    first = outcome.text.splitlines()[0]
    assert f"the dumped output file '{LINEAR}.output.0.pt' is missing" in first, first
    assert "device raised" not in outcome.text and "run without --msprobe-offline" in first


@pytest.mark.parametrize(
    ("lists", "error"),
    [
        ({"black_list": ["dropout"]}, False),  # a shared config naming an API this model lacks
        ({"white_list": ["linear", "dropout"]}, False),
        ({"white_list": ["lineer"]}, True),  # nothing at all would be checked
    ],
    ids=["black list of another model", "white list partly matching", "white list matching nothing"],
)
def test_the_lists_of_msprobes_config_may_name_apis_of_other_models(
    pytester: pytest.Pytester, dumps: Path, tmp_path: Path, lists: dict[str, list[str]], error: bool
) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"acc_check": lists}))
    dump = dumps / DUMP / "dump.json"
    result = pytester.runpytest_inprocess(f"--msprobe-dump={dump}", *OFFLINE, f"--msprobe-config={config}", "-q")
    if error:
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        assert f"the white_list of --msprobe-config {config} matches no API of the dumps" in result.stderr.str()
    else:
        assert result.ret == pytest.ExitCode.OK, result.stdout.str() + result.stderr.str()
