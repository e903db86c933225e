"""Cost of the kernel verdicts (pytest_msprobe/judge/gate/kernel_verdicts.py; target: under 2% of a
run's time) on the 322-call transformer dumps of tests/dumps/models (the default run:
the float32 tensor dump single-run; --bench-full: the four dumps, offline too for the
tensor ones).

One run of the plugin per dump and mode (a process of its own, untimed here: its wall
time goes into extra_info) gives the journal; on its records:
- pooling: what the single writer adds per run: KernelPool.add of every record, the
  verdicts, their result CSV rows and metrics lines, and each kernel's message;
- writing with and without the sums: Entry.to_json and the metrics rows of every record
  as they are, and the same records without the sums the bias tests report (bias_n,
  *_signs, *_signs_sq): the difference is the sums' share of the per-call writing.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable

import pytest

from benchmarks.support import MODELS, PluginRun, Sizes, fastest
from pytest_msprobe.judge.gate.kernel_verdicts import KernelPool
from pytest_msprobe.judge.verdict.record import ResultRecord
from pytest_msprobe.results.run_files import (
    Entry,
    RunFiles,
    kernel_metrics_row,
    kernel_rows,
    metrics_rows,
    read_journal,
)

RUNS = [
    ("transformer12_tensor_fp32", "single"),
    ("transformer12_tensor_fp32", "offline"),
    ("transformer12_tensor_bf16", "single"),
    ("transformer12_tensor_bf16", "offline"),
    ("transformer12_tensor_fp16", "single"),
    ("transformer12_tensor_fp16", "offline"),
    ("transformer12_statistics_bf16", "single"),
]
SUMS = ("_n", "_signs", "_signs_sq", "_signs_elements", "_signs_sq_elements")


def pooling(records: list[ResultRecord]) -> None:
    pool = KernelPool()
    for record in records:
        pool.add(record)
    verdicts = pool.verdicts()
    kernel_rows(verdicts)
    "".join(json.dumps(kernel_metrics_row(verdict)) for verdict in verdicts)
    [verdict.message() for verdict in verdicts]


def without_sums(entry: Entry) -> Entry:
    record = ResultRecord.from_dict(entry.record.to_dict())
    for output in record.outputs:
        output.metrics = {key: value for key, value in output.metrics.items() if not key.endswith(SUMS)}
    return Entry(record, entry.represents)


def writing(entries: list[Entry]) -> None:
    for entry in entries:
        entry.to_json()
        [json.dumps(row) for row in metrics_rows(entry)]


@pytest.fixture(scope="module")
def journal(
    request: pytest.FixtureRequest,
    sizes: Sizes,
    run_plugin: Callable[..., PluginRun],
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[list[Entry], PluginRun]:
    name, mode = request.param
    if (name, mode) != RUNS[0] and not sizes.full:
        pytest.skip("the other dumps and modes: --bench-full")
    tmp_path = tmp_path_factory.mktemp("kernels")
    shutil.copytree(MODELS / name, tmp_path / name)
    found = run_plugin(
        tmp_path / name / "dump.json", tmp_path / "out", *(("--msprobe-offline",) if mode == "offline" else ())
    )
    files = RunFiles.latest(tmp_path / "out")
    assert files is not None, f"{name}: the run wrote no results"
    return read_journal(files.journal), found


@pytest.mark.benchmark(group="kernels: pooling")
@pytest.mark.parametrize("journal", RUNS, indirect=True, ids=[f"{name}-{mode}" for name, mode in RUNS])
def test_pooling(benchmark, journal: tuple[list[Entry], PluginRun]) -> None:
    entries, run = journal
    records = [entry.record for entry in entries]
    benchmark.pedantic(pooling, args=(records,), rounds=7, iterations=1)
    pool = KernelPool()
    for record in records:
        pool.add(record)
    benchmark.extra_info.update(
        calls=len(records),
        kernels=len(pool.verdicts()),
        run_s=round(run.wall_s, 2),
        share_of_the_run=f"{fastest(benchmark) / run.wall_s:.3%}",
    )


@pytest.mark.benchmark(group="kernels: writing")
@pytest.mark.parametrize("sums", ["with the sums", "without"])
@pytest.mark.parametrize("journal", RUNS, indirect=True, ids=[f"{name}-{mode}" for name, mode in RUNS])
def test_writing(benchmark, journal: tuple[list[Entry], PluginRun], sums: str) -> None:
    entries, run = journal
    written = entries if sums == "with the sums" else [without_sums(entry) for entry in entries]
    benchmark.pedantic(writing, args=(written,), rounds=7, iterations=1)
    benchmark.extra_info.update(calls=len(entries), run_s=round(run.wall_s, 2))
