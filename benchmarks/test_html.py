"""Time and size of the HTML report (targets: under 10 s and under 5 MB for 20,000 calls
with 200 failures; the default run: 2,000 calls with 20).

The records are synthetic, the samples real: eight failing outputs are judged by the
standards (2-D and 1-D, float32/float16/bfloat16, five standards) and their element
samples taken as a run with --msprobe-html takes them (judge/check/samples.py); the failing
records cycle through them, each drawn afresh (the report caches nothing). The other
records pass, one output each, as in test_reports.py. Timed: the whole write_report
(plots, page, write), then its figures alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks.support import Sizes, fastest, passing_record
from pytest_msprobe.judge.verdict.record import ResultRecord
from pytest_msprobe.results.html_page import ReportContext, write_report
from pytest_msprobe.results.run_files import Entry

pytestmark = pytest.mark.benchmark(group="html")

# torch and the standards are imported where used: rendering processes (spawned, they
# import this module again) then start without them, as they do under pytest.


def faults() -> tuple[tuple[str, tuple[int, ...], Any, Any], ...]:
    """(api, shape, device dtype, how the device goes wrong)."""
    import torch

    return (
        ("linear", (64, 256), torch.float32, lambda t: t * (1 + 2**-8)),
        ("add", (128, 128), torch.float16, lambda t: t + 2**-6),
        ("conv2d", (8, 16, 12, 12), torch.float32, lambda t: t * (1 + 2**-9)),
        ("softmax", (32, 512), torch.bfloat16, lambda t: t * 1.02),
        ("sum", (4096,), torch.float32, lambda t: t * (1 + 2**-12)),
        ("matmul", (256, 64), torch.float16, lambda t: torch.where(t.abs() > 1, t * 1.01, t)),
        ("exp", (50_000,), torch.float32, lambda t: t * (1 + 2**-15)),
        ("layer_norm", (16, 1024), torch.float16, lambda t: t.clone().index_fill_(0, torch.tensor([3]), 0.5)),
    )


def failing_records() -> list[ResultRecord]:
    """One judged, sampled record per fault."""
    import torch

    from pytest_msprobe.judge.check.samples import element_samples
    from pytest_msprobe.judge.verdict.record import output_results
    from pytest_msprobe.standards import check

    generator = torch.Generator().manual_seed(0)
    records = []
    for api, shape, dtype, fault in faults():
        bench = torch.randn(shape, generator=generator, dtype=torch.float64)
        device = fault(bench.to(dtype))
        verdict = check(bench, device, api=api)
        record = ResultRecord(
            "/data/dump.json",
            f"Functional.{api}.0.forward",
            verdict.status,
            verdict.standard,
            verdict.reference,
            "cpu",
            verdict.message(),
            output_results(verdict),
            ["input_args[0]: generated from statistics (seed 1)"],
            0.004,
        )
        record.samples = element_samples(bench, device, verdict, {"error", "warning"})
        assert record.status in ("error", "warning") and record.samples, (api, record.status)
        records.append(record)
    return records


def varied_passing_record(i: int, random: np.random.Generator) -> ResultRecord:
    """Metrics of varied values, as a real run's (identical ones would pack too well)."""
    direction = ("forward", "backward")[i % 2]
    call = f"Functional.silu.{i // 2}.{direction}"
    return passing_record(call, random.uniform(1e-8, 1e-6, 5).tolist(), float(random.uniform(0.5e-3, 5e-3)))


def entries(calls: int, failures: int) -> list[Entry]:
    failing = failing_records()
    made = []
    for i in range(failures):
        template = failing[i % len(failing)]
        made.append(
            Entry(
                ResultRecord.from_dict({**template.to_dict(), "call": template.call.replace(".0.", f".{10_000 + i}.")})
            )
        )
    random = np.random.default_rng(0)
    made += [Entry(varied_passing_record(i, random)) for i in range(calls - failures)]
    return made


def test_report(benchmark, sizes: Sizes, tmp_path: Path) -> None:
    calls, failures = sizes(2_000, 20_000), sizes(20, 200)
    made = entries(calls, failures)
    target = tmp_path / "report.html"
    context = ReportContext(sessions=({"started": "now", "duration": 60.0},))
    benchmark.pedantic(write_report, args=(made, target, context), rounds=3, iterations=1)
    benchmark.extra_info.update(calls=calls, failures=failures, mb=round(target.stat().st_size / 1e6, 2))


def test_figures(benchmark, sizes: Sizes) -> None:
    from pytest_msprobe.results import plots
    from pytest_msprobe.results.elements import plot_data

    failures = sizes(20, 200)
    datas = [
        plot_data(entry.record.outputs[sample["output"]], sample)
        for entry in entries(failures, failures)
        for sample in entry.record.samples
    ]
    benchmark.pedantic(plots.render_all, args=(datas,), rounds=3, iterations=1)
    benchmark.extra_info.update(figures=len(datas), ms_each=round(fastest(benchmark) / len(datas) * 1e3, 1))
