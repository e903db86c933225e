"""The upgrade gate on two dumps (judge/gate/upgrade.py, --msprobe-gate): dump A recorded as the
baseline before an operator upgrade, dump B of the same model, seed and data after it.

The pairs are real dumps of one training step made here (pytest_msprobe/testing/upgrade_dumps.py): B by
another ATen kernel path (ATEN_CPU_CAPABILITY=default, 2 threads, in a subprocess) is a
correct upgrade and must name nothing; B with a planted fault (every gelu result scaled
by 1 + 2**-6 in 16-bit, 1 + 2**-16 in float32) must name exactly the gelu calls and
kernels; a fault A already had is no regression; a dump of another model compares
nothing and says so.
"""

from __future__ import annotations

import csv
import filecmp
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pytest_msprobe.judge.gate.baseline import Baseline, CallMetrics, environment
from pytest_msprobe.judge.gate.upgrade import CALL_LIMIT, call_change, pair_calls
from pytest_msprobe.plugin.baselines import GATE_EXIT
from pytest_msprobe.results.merge import main as merge_main
from pytest_msprobe.testing.upgrade_dumps import DTYPES, step

MAKER = ("-m", "pytest_msprobe.testing.upgrade_dumps")
GELU_CALLS = {f"Functional.gelu.{index}.{direction}" for index in range(4) for direction in ("forward", "backward")}
OFFLINE = ("--msprobe-offline", "--msprobe-device=cpu")


def other_path(root: Path, dtype: str, *extra: str) -> Path:
    """The dump written on 2 threads by another correct kernel path than this process's:
    torch's unvectorised kernels, or its vectorised ones where this run is itself forced
    onto the unvectorised (ATEN_CPU_CAPABILITY=default, as CI's second pass runs)."""
    forced = os.environ.get("ATEN_CPU_CAPABILITY", "").lower() == "default"
    env = {key: value for key, value in os.environ.items() if key != "ATEN_CPU_CAPABILITY"}
    if not forced:
        env["ATEN_CPU_CAPABILITY"] = "default"
    subprocess.run(
        [sys.executable, *MAKER, str(root), "--dtype", dtype, "--threads", "2", *extra],
        check=True,
        env=env,
        capture_output=True,
    )
    return root / "dump.json"


def recorded(run_dump, dump: Path, folder: Path) -> Path:
    """Dump A's baseline, checked offline."""
    run_dump(dump, *OFFLINE, f"--msprobe-out={folder / 'out-a'}", f"--msprobe-baseline-save={folder / 'baseline'}")
    return folder / "baseline"


def gate(run_dump, dump: Path, baseline: Path, out: Path, *extra: str):
    return run_dump(dump, *OFFLINE, f"--msprobe-out={out}", f"--msprobe-baseline={baseline}", "--msprobe-gate", *extra)


def gated_pair(tmp_path: Path, run_dump, capsys, before: Path, after: Path, *extra: str):
    """A recorded as the baseline, B gated against it: B's outcomes and the terminal text."""
    baseline = recorded(run_dump, before, tmp_path)
    capsys.readouterr()
    result = gate(run_dump, after, baseline, tmp_path / "out", *extra)
    return result, capsys.readouterr().out


def regression_rows(out: Path) -> list[dict[str, str]]:
    """The regressions file's regressions (its other rows are the unchanged calls)."""
    (found,) = out.glob("msprobe_regressions_*.csv")
    with open(found, encoding="utf-8-sig", newline="") as handle:
        return [row for row in csv.DictReader(handle) if row["kind"] == "regression"]


@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_a_correct_upgrade_names_nothing(tmp_path: Path, run_dump, capsys, dtype: str) -> None:
    """B written by another kernel path: its tensors differ from A's (else this proves
    nothing), and no call or kernel is a regression."""
    before = step(tmp_path / "a", "mlp", DTYPES[dtype], None)
    after = other_path(tmp_path / "b", dtype)
    differing = filecmp.cmpfiles(
        before.parent / "dump_tensor_data",
        after.parent / "dump_tensor_data",
        os.listdir(after.parent / "dump_tensor_data"),
    )[1]
    assert differing, "the two kernel paths wrote the same bits"
    result, summary = gated_pair(tmp_path, run_dump, capsys, before, after)
    assert result.ret == pytest.ExitCode.OK and result.by_outcome("failed") == {}, summary
    assert (
        "b/dump.json paired with the baseline's" in summary
        and "40 calls by name and signature, 0 new, 0 vanished" in summary
    )
    assert "0 regression" in summary and "kernels of the paired dumps: 0 regressed of 9" in summary
    assert regression_rows(tmp_path / "out") == []


@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_a_planted_fault_names_exactly_its_calls_and_kernels(tmp_path: Path, run_dump, capsys, dtype: str) -> None:
    before = step(tmp_path / "a", "mlp", DTYPES[dtype], None)
    after = step(tmp_path / "b", "mlp", DTYPES[dtype], "gelu_scaled")
    html, junit = tmp_path / "report.html", tmp_path / "gate.xml"
    result, summary = gated_pair(
        tmp_path, run_dump, capsys, before, after, f"--msprobe-html={html}", f"--junitxml={junit}"
    )
    kernels = {f"Functional.gelu.{dtype}.kernel.{direction}.regression" for direction in ("forward", "backward")}
    assert set(result.by_outcome("failed")) == GELU_CALLS | kernels, summary
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    text = result.calls["Functional.gelu.0.forward"].text
    assert text.startswith(
        "regression against the baseline (--msprobe-gate): Functional.gelu.0.forward: pass -> error, mean_rel_err "
    ), text
    assert "8 regression, 0 improvement, 32 unchanged, 0 new, 0 vanished" in summary
    rows = regression_rows(tmp_path / "out")
    assert {row["name"] for row in rows} == GELU_CALLS | {name.removesuffix(".regression") for name in kernels}
    growths = [float(row["growth"]) for row in rows if "kernel" not in row["name"]]
    assert growths == sorted(growths, reverse=True)  # worst first
    assert "Regressions against the baseline" in html.read_text()
    assert junit.read_text().count("<failure") == len(GELU_CALLS | kernels)


def test_a_fault_already_in_the_baseline_is_no_regression(tmp_path: Path, run_dump, capsys) -> None:
    """A and B both carry the gelu fault (B by another kernel path): the gelu calls fail
    as before, which the gate expects (xfail); without the gate they fail the run."""
    before = step(tmp_path / "a", "mlp", torch.bfloat16, "gelu_scaled")
    after = other_path(tmp_path / "b", "bfloat16", "--fault", "gelu_scaled")
    gated, summary = gated_pair(tmp_path, run_dump, capsys, before, after)
    assert gated.ret == pytest.ExitCode.OK and gated.by_outcome("failed") == {}, summary
    assert set(gated.by_outcome("skipped")) == GELU_CALLS  # xfailed: pytest reports them as skipped
    assert "failed the same way in the baseline, not a regression" in gated.calls["Functional.gelu.0.forward"].text
    assert "0 regression" in summary
    ungated = run_dump(
        after, *OFFLINE, f"--msprobe-out={tmp_path / 'ungated'}", f"--msprobe-baseline={tmp_path / 'baseline'}"
    )
    assert set(ungated.by_outcome("failed")) == GELU_CALLS


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_failure_that_got_worse_is_a_regression(tmp_path: Path, run_dump, capsys, dtype: str) -> None:
    """A's gelu already failed (scaled by 1 + 2**-6 in 16-bit, 1 + 2**-16 in float32);
    B's error is 16x (64x) that: error -> error, but its mean_rel_err grew beyond the
    limit (4x 16-bit, 16x float32)."""
    before = step(tmp_path / "a", "mlp", DTYPES[dtype], "gelu_scaled")
    after = step(tmp_path / "b", "mlp", DTYPES[dtype], "gelu_scaled_more")
    result, _ = gated_pair(tmp_path, run_dump, capsys, before, after)
    assert set(result.by_outcome("failed")) == GELU_CALLS | {
        f"Functional.gelu.{dtype}.kernel.{d}.regression" for d in ("forward", "backward")
    }
    text = result.calls["Functional.gelu.0.forward"].text
    assert "Functional.gelu.0.forward: error -> error, mean_rel_err " in text and "limit" in text, text


def test_a_dump_of_another_model_compares_nothing(tmp_path: Path, run_dump, capsys) -> None:
    """Nothing to gate against: the faulty calls fail as they would with no baseline,
    and the gate fails as a usage error (exit 4, not 1: the baseline is the wrong one),
    saying why in one line. Exited 1 (its calls' own failures) before the gate checked."""
    before = step(tmp_path / "a", "mlp", torch.float32, None)
    after = step(tmp_path / "b", "wide", torch.float32, "gelu_scaled")
    result, summary = gated_pair(tmp_path, run_dump, capsys, before, after)
    (line,) = (line for line in summary.splitlines() if line.startswith("ERROR: --msprobe-gate: "))
    assert "b/dump.json and the baseline's" in line and "are dumps of different models: 0 of " in line, line
    assert "nothing was compared: exit status 4 (usage error)" in line
    assert result.ret == GATE_EXIT == pytest.ExitCode.USAGE_ERROR
    assert "0 regression, 0 improvement, 0 unchanged" in summary
    assert set(result.by_outcome("failed")) == {
        f"Functional.gelu.{i}.{d}" for i in range(2) for d in ("forward", "backward")
    }


def test_a_dump_paired_below_the_threshold_fails_the_gate(tmp_path: Path, run_dump, capsys) -> None:
    """B holds A's 40 calls and 60 more (10 blocks for 4): 40% pair, below the share of
    one model. Every call passes; exited 0 before the gate checked what it compared."""
    before = step(tmp_path / "a", "mlp", torch.float32, None)
    after = step(tmp_path / "b", "mlp_deep", torch.float32, None)
    result, summary = gated_pair(tmp_path, run_dump, capsys, before, after)
    assert result.by_outcome("failed") == {} and result.ret == pytest.ExitCode.USAGE_ERROR, summary
    assert "ERROR: --msprobe-gate: " in summary
    assert "are dumps of different models: 40 of 100 calls pair by signature (at least 50% for one model)" in summary
    ungated = run_dump(
        after, *OFFLINE, f"--msprobe-out={tmp_path / 'ungated'}", f"--msprobe-baseline={tmp_path / 'baseline'}"
    )
    assert ungated.ret == pytest.ExitCode.OK  # without the gate: a warning (test_baseline.py), as before


def test_a_baseline_with_no_record_of_the_dump_fails_the_gate(tmp_path: Path, run_dump, capsys) -> None:
    """A baseline file with no records (recorded by a run that selected no call): every
    call is new, nothing is compared, and the gate fails. Exited 0 before."""
    dump = step(tmp_path / "a", "mlp", torch.float32, None)
    folder = tmp_path / "baseline"
    Baseline(environment([], "cpu")).write(folder)
    result = gate(run_dump, dump, folder, tmp_path / "out")
    summary = capsys.readouterr().out
    assert result.by_outcome("failed") == {} and result.ret == pytest.ExitCode.USAGE_ERROR, summary
    assert "ERROR: --msprobe-gate: the baseline has a record of none of the 40 calls that ran from " in summary


@pytest.mark.parametrize("folder", ["missing", "empty"])
def test_a_wrong_baseline_path_is_a_usage_error(tmp_path: Path, pytester: pytest.Pytester, folder: str) -> None:
    """No folder there, or a folder with no baseline file: pytest's usage error before any
    call runs, naming the path and what to do (held before the gate checked anything)."""
    dump = step(tmp_path / "a", "mlp", torch.float32, None)
    (tmp_path / "empty").mkdir()
    result = pytester.runpytest(
        f"--msprobe-dump={dump}",
        *OFFLINE,
        f"--msprobe-baseline={tmp_path / folder}",
        "--msprobe-gate",
        "-p",
        "no:cacheprovider",
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {tmp_path / folder}*record one with --msprobe-baseline-save*"])


def kernel_rows(out: Path) -> dict[str, list[str]]:
    """The kernels CSV's rows (API name -> its cells), its header left out."""
    (found,) = out.glob("accuracy_checking_kernels_*.csv")
    with open(found, encoding="utf-8-sig", newline="") as handle:
        return {row[0]: row for row in list(csv.reader(handle))[1:]}


def test_online_the_same_dump_pools_and_compares_its_kernels(tmp_path: Path, run_dump, monkeypatch, capsys) -> None:
    """test_kernels.py's small head replayed before and after: after, its linear rounds
    toward zero, which no call shows alone (each passes against its recorded metrics) and
    the kernel's pooled test does: the kernel test fails, the kernels CSV has its row, the
    summary compares it with the baseline's record. Before, a run against a baseline
    pooled nothing: no kernel test, a kernels CSV of its header alone."""
    from test_kernels import CALLS, KERNEL, TOWARD_ZERO, small_head_dump

    dump = small_head_dump(tmp_path / "dump", faulty=False)
    saved = run_dump(dump, f"--msprobe-out={tmp_path / 'before'}", f"--msprobe-baseline-save={tmp_path / 'baseline'}")
    assert saved.kernels[KERNEL].outcome == "passed"
    unchanged = run_dump(
        dump, f"--msprobe-out={tmp_path / 'same'}", f"--msprobe-baseline={tmp_path / 'baseline'}", "--msprobe-gate"
    )
    assert unchanged.ret == pytest.ExitCode.OK and unchanged.kernels[KERNEL].outcome == "passed"
    assert kernel_rows(tmp_path / "same")[KERNEL.removesuffix(".forward")][1] == "pass"
    TOWARD_ZERO.patch(monkeypatch)
    capsys.readouterr()
    after = run_dump(
        dump, f"--msprobe-out={tmp_path / 'after'}", f"--msprobe-baseline={tmp_path / 'baseline'}", "--msprobe-gate"
    )
    summary = capsys.readouterr().out
    assert {call.outcome for call in after.calls.values()} == {"passed"} and len(after.calls) == CALLS
    assert after.kernels[KERNEL].outcome == "failed" and after.ret == pytest.ExitCode.TESTS_FAILED, summary
    assert "systematic scale (toward/away from zero) bias" in after.kernels[KERNEL].text
    assert kernel_rows(tmp_path / "after")[KERNEL.removesuffix(".forward")][1] == "error"
    assert "kernels: 1 worse of 1 compared with the baseline (0 not in it)" in summary
    assert f"dump/dump.json::{KERNEL}: pass -> error" in summary


def test_a_dump_json_identical_with_changed_tensors_is_another_dump(tmp_path: Path, run_dump, capsys) -> None:
    """B's dump.json is A's, byte for byte, beside the tensors of a linear rounded toward
    zero: paired as another dump (each call against its own bench, the kernel pooled, a
    "paired with" line), not judged as A replayed against A's records. Before, B was A
    by identity: no kernel test, a kernels CSV of its header alone, no "paired with"."""
    from test_kernels import KERNEL, small_head_dump

    before = small_head_dump(tmp_path / "a", faulty=False)
    after = small_head_dump(tmp_path / "b", faulty=True)
    after.write_bytes(before.read_bytes())
    result, summary = gated_pair(tmp_path, run_dump, capsys, before, after)
    assert "b/dump.json paired with the baseline's" in summary and "12 calls by name and signature" in summary, summary
    assert "is not the one the baseline was recorded with" not in summary  # another path: no record of it
    assert result.kernels[KERNEL].outcome == "failed" and result.ret == pytest.ExitCode.TESTS_FAILED
    assert kernel_rows(tmp_path / "out")[KERNEL.removesuffix(".forward")][1] == "error"


def test_calls_whose_names_shifted_pair_by_signature_in_order(tmp_path: Path, run_dump, capsys) -> None:
    """B has one more gelu before the blocks (another shape: new); every later gelu's
    index moved by one and pairs with A's call of its signature, in order."""
    before = step(tmp_path / "a", "mlp", torch.float32, None)
    after = step(tmp_path / "b", "mlp_shifted", torch.float32, "gelu_scaled")
    result, summary = gated_pair(tmp_path, run_dump, capsys, before, after)
    assert (
        "40 calls by name and signature (8 of them by signature: their names shifted), 2 new, 0 vanished" in summary
    ), summary
    shifted = {f"Functional.gelu.{index}.{direction}" for index in range(1, 5) for direction in ("forward", "backward")}
    assert set(result.by_outcome("failed")) - {"Functional.gelu.0.forward", "Functional.gelu.0.backward"} >= shifted
    assert (
        "Functional.gelu.1.forward (the baseline's Functional.gelu.0.forward): pass -> error"
        in result.calls["Functional.gelu.1.forward"].text
    )


def test_the_gate_is_the_same_under_xdist_and_shards(tmp_path: Path, run_dump, pytester: pytest.Pytester) -> None:
    """-n 2, and two shards together, fail the same calls as one process."""
    before = step(tmp_path / "a", "mlp", torch.float16, None)
    after = step(tmp_path / "b", "mlp", torch.float16, "gelu_scaled")
    baseline = recorded(run_dump, before, tmp_path)

    def failed(*extra: str) -> set[str]:
        args = (
            f"--msprobe-dump={after}",
            *OFFLINE,
            f"--msprobe-baseline={baseline}",
            "--msprobe-gate",
            "-p",
            "no:cacheprovider",
        )
        reports = pytester.inline_run(*args, f"--msprobe-out={tmp_path / str(len(extra))}", *extra).getreports(
            "pytest_runtest_logreport"
        )
        return {report.nodeid.rsplit("::", 1)[-1] for report in reports if report.when == "call" and report.failed}

    lone = failed("-p", "no:xdist")
    assert lone >= GELU_CALLS
    assert failed("-n", "2", "-p", "no:benchmark") == lone
    shards = failed("-p", "no:xdist", "--msprobe-shard=1/2") | failed(
        "-p", "no:xdist", "--msprobe-shard=2/2", "-k", "not linear"
    )
    assert shards == lone
    # msprobe-merge joins the shards' compared calls and pools their kernels again: the lone run's regressions
    assert merge_main(["-o", str(tmp_path / "merged"), str(tmp_path / "3"), str(tmp_path / "5")]) == 0
    assert {row["name"] for row in regression_rows(tmp_path / "merged")} == {
        row["name"] for row in regression_rows(tmp_path / "2")
    }


def test_pairing_by_signature_in_order() -> None:
    """B inserted a gelu of another signature first: its later gelus pair with A's by
    signature in order, not by their (shifted) names; fails with pairing by name first."""
    recorded = {
        "F.relu.0.forward": (0, "r"),
        "F.gelu.0.forward": (1, "g"),
        "F.gelu.1.forward": (2, "g"),
        "F.tanh.0.forward": (3, "t"),
    }
    current = {
        "F.add.0.forward": (0, "a"),
        "F.gelu.0.forward": (1, "g2"),
        "F.gelu.1.forward": (2, "g"),
        "F.gelu.2.forward": (3, "g"),
    }
    pairing = pair_calls(recorded, current)
    assert pairing.pairs == {
        "F.gelu.1.forward": "F.gelu.0.forward",
        "F.gelu.2.forward": "F.gelu.1.forward",
    }  # shifted by one
    assert pairing.new == ("F.add.0.forward", "F.gelu.0.forward") and pairing.vanished == (
        "F.relu.0.forward",
        "F.tanh.0.forward",
    )
    assert pairing.by_signature == 2 and pairing.same_model
    assert pair_calls(recorded, recorded).pairs == {name: name for name in recorded}


@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_a_metric_grown_beyond_the_limit_is_a_regression_with_the_same_verdict(dtype: str) -> None:
    was = CallMetrics("pass", "benchmark", {"": {"mean_rel_err": 1e-3}}, dtype)
    within = CallMetrics("pass", "benchmark", {"": {"mean_rel_err": 1e-3 * CALL_LIMIT[dtype] * 0.99}}, dtype)
    beyond = CallMetrics("pass", "benchmark", {"": {"mean_rel_err": 1e-3 * CALL_LIMIT[dtype] * 1.01}}, dtype)
    assert call_change(within, was, "x", "x", dtype).kind == "unchanged"
    assert call_change(beyond, was, "x", "x", dtype).kind == "regression"
    assert call_change(was, beyond, "x", "x", dtype).kind == "improvement"


def test_online_the_same_dump_gates_by_its_own_records(
    copy_dump, run_dump, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """One dump replayed before and after (found by content): each call is judged
    against its own recorded metrics, so silu, as wrong as before, passes; layer_norm,
    wrong only after, is a regression and fails."""
    from pytest_msprobe.testing.faults import scaled_in

    dump = copy_dump("torch_mlpcnn_statistics_bf16")
    silu = scaled_in(torch.bfloat16, 1 + 2**-6)(torch.nn.functional.silu)
    monkeypatch.setattr(torch.nn.functional, "silu", silu)
    run_dump(dump, f"--msprobe-out={tmp_path / 'before'}", f"--msprobe-baseline-save={tmp_path / 'baseline'}")
    monkeypatch.setattr(
        torch.nn.functional, "layer_norm", scaled_in(torch.bfloat16, 1 + 2**-6)(torch.nn.functional.layer_norm)
    )
    result = run_dump(
        dump, f"--msprobe-out={tmp_path / 'after'}", f"--msprobe-baseline={tmp_path / 'baseline'}", "--msprobe-gate"
    )
    failed = set(result.by_outcome("failed"))
    assert failed and {name.split(".")[1] for name in failed} == {"layer_norm"}, failed
    assert all("regression against the baseline (--msprobe-gate)" in result.calls[name].text for name in failed)
    assert {result.calls[f"Functional.silu.0.{direction}"].outcome for direction in ("forward", "backward")} == {
        "passed"
    }


def test_a_kernel_that_failed_before_is_expected_to_fail(tmp_path: Path, run_dump) -> None:
    """test_kernels.py's small head, a float32 linear rounded toward zero: every call
    passes, its kernel verdict fails. Recorded failing in A, the same kernel failing in B
    (another dump: its dump.json rewritten) is an xfail under the gate, a failure without."""
    from test_kernels import KERNEL, small_head_dump

    before = small_head_dump(tmp_path / "a", faulty=True)
    after = tmp_path / "b" / "dump.json"
    after.parent.mkdir()
    (after.parent / "dump_tensor_data").symlink_to(before.parent / "dump_tensor_data")
    after.write_text(before.read_text() + "\n")
    baseline = recorded(run_dump, before, tmp_path)
    ungated = run_dump(after, *OFFLINE, f"--msprobe-out={tmp_path / 'ungated'}", f"--msprobe-baseline={baseline}")
    assert ungated.kernels[KERNEL].outcome == "failed" and ungated.ret == pytest.ExitCode.TESTS_FAILED
    gated = gate(run_dump, after, baseline, tmp_path / "gated")
    assert (
        gated.kernels[KERNEL].outcome == "skipped"
        and "failed the same way in the baseline" in gated.kernels[KERNEL].text
    )
    assert gated.ret == pytest.ExitCode.OK


def test_a_dump_that_cannot_be_read_is_its_own_failure(tmp_path: Path, run_dump, capsys) -> None:
    """Dump B broken (not JSON): its one `collection` test fails, saying why, and the
    comparison pairs nothing of it instead of ending the run with a traceback."""
    before = step(tmp_path / "a", "mlp", torch.float32, None)
    broken = tmp_path / "b" / "dump.json"
    broken.parent.mkdir()
    broken.write_text('{"task": "tensor", "data": {')
    result, summary = gated_pair(tmp_path, run_dump, capsys, before, broken)
    assert list(result.calls) == ["collection"] and result.calls["collection"].outcome == "failed"
    assert result.ret == pytest.ExitCode.TESTS_FAILED and "INTERNALERROR" not in summary
    assert "0 regression, 0 improvement, 0 unchanged, 0 new, 0 vanished" in summary
