"""Time and peak memory of the npu_fusion_attention CPU reference on a large shape.

Target: a (batch 1, 32 heads, 4096 tokens, head dim 128) attention in float32
runs on a 2-core / 24 GB machine without materialising the 32 x 4096 x 4096 score matrix
(4 GiB in float64). Each case runs in its own process so that its peak RSS is its own.

    python benchmarks/bench_attention.py              # all cases
    python benchmarks/bench_attention.py --seq 1024   # a quicker look
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

CASES = {
    "fp32 forward": ("float32", False),
    "fp32 forward+backward": ("float32", True),
    "fp64 forward (bench of a fp32 dump)": ("float64", False),
}


def run_one(dtype_name: str, backward: bool, seq: int, heads: int, dim: int) -> dict:
    import torch

    from pytest_msprobe.bench_functions import fusion_attention, get

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
    total_s = time.perf_counter() - start
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "forward_s": round(forward_s, 2),
        "total_s": round(total_s, 2),
        "peak_rss_mib": round(peak_kib / 1024),
        "peak_rss_growth_mib": round((peak_kib - rss_before) / 1024),
        "threads": torch.get_num_threads(),
        "score_block_elements": fusion_attention.score_block_elements,
        "finite": bool(torch.isfinite(out).all()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        dtype_name, backward = CASES[args.one]
        print(json.dumps(run_one(dtype_name, backward, args.seq, args.heads, args.dim)))
        return
    full_scores_gib = args.heads * args.seq * args.seq * 8 / 2**30
    print(
        f"npu_fusion_attention reference, BNSD (1, {args.heads}, {args.seq}, {args.dim}), sparse_mode=3 "
        f"(one float64 score matrix would be {full_scores_gib:.1f} GiB)"
    )
    for name in CASES:
        proc = subprocess.run(
            [
                sys.executable,
                __file__,
                "--one",
                name,
                "--seq",
                str(args.seq),
                "--heads",
                str(args.heads),
                "--dim",
                str(args.dim),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        print(
            f"  {name:38s} forward {r['forward_s']:7.2f} s  total {r['total_s']:7.2f} s  "
            f"peak RSS {r['peak_rss_mib']:6d} MiB (+{r['peak_rss_growth_mib']} MiB during the call)  "
            f"threads={r['threads']} finite={r['finite']}"
        )


if __name__ == "__main__":
    main()
