"""Time and peak memory of the npu_fusion_attention CPU reference on a large shape.

Target: a (batch 1, 32 heads, 4096 tokens, head dim 128) attention in float32 runs on a
2-core / 24 GB machine without materialising the 32 x 4096 x 4096 score matrix (4 GiB in
float64): --bench-full. The default run takes 512 tokens. Each case runs in a process of
its own, so that its peak RSS is its own; the number is the attention call's own time
(forward, or forward and backward) as that process reports it.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from benchmarks.support import ReportedClock, Sizes

HEADS, DIM = 32, 128
CASES = {
    "fp32 forward": ("float32", False),
    "fp32 forward+backward": ("float32", True),
    "fp64 forward (bench of a fp32 dump)": ("float64", False),
}
ONE_CASE = r"""
import json, resource, sys, time
import torch
from pytest_msprobe.bench_functions import fusion_attention, get
dtype_name, backward, seq, heads, dim = sys.argv[1], sys.argv[2] == "1", *map(int, sys.argv[3:6])
torch.manual_seed(0)
dtype = getattr(torch, dtype_name)
q, k, v = (torch.randn(1, heads, seq, dim, dtype=dtype, requires_grad=backward) for _ in range(3))
mask = torch.ones(2048, 2048, dtype=torch.bool).triu(1)
rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
out = get("npu_fusion_attention")(q, k, v, heads, "BNSD", atten_mask=mask, sparse_mode=3, scale=dim**-0.5)[0]
forward_s = time.perf_counter() - start
if backward:
    out.sum().backward()
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"forward_s": forward_s, "total_s": time.perf_counter() - start, "peak_rss_mib": peak // 1024,
    "peak_rss_growth_mib": (peak - rss_before) // 1024, "threads": torch.get_num_threads(),
    "score_block_elements": fusion_attention.score_block_elements, "finite": bool(torch.isfinite(out).all())}))
"""
clock = ReportedClock()


@pytest.mark.benchmark(group="attention", timer=clock)
@pytest.mark.parametrize("case", CASES)
def test_fusion_attention(benchmark, sizes: Sizes, case: str) -> None:
    dtype_name, backward = CASES[case]
    seq = sizes(512, 4096)
    found: dict[str, float] = {}

    def one() -> None:
        argv = [dtype_name, "1" if backward else "0", str(seq), str(HEADS), str(DIM)]
        done = subprocess.run([sys.executable, "-c", ONE_CASE, *argv], capture_output=True, text=True, check=True)
        found.update(json.loads(done.stdout.strip().splitlines()[-1]))
        clock.add(found["total_s"])

    benchmark.pedantic(one, rounds=1, iterations=1)
    assert found["finite"], "the reference's output is not finite"
    benchmark.extra_info.update(shape=f"BNSD (1, {HEADS}, {seq}, {DIM}), sparse_mode=3", **found)
