"""How certainly a 16-bit kernel that truncates is caught on small outputs, and how often a
correct one is called an error (issue 37: "16-bit truncation caught on every size >= 64").

For each normalisation and activation, each 16-bit dtype and each size, SEEDS random
inputs (x ~ N(0.5, 2), in D): the bench is the API in float32 on them; the correct device
rounds the bench to nearest (what a float32-opmath kernel does), the faulty one truncates
it (rounds toward zero). Each pair is judged by the shipped standards (standards.check),
single-run and against a reference run (the CPU kernel in D). Prints, per row, the
share of truncations missed and of correct results failed, and which test caught the
truncations: the sign tests (bias.py, "scale ... bias") or the far-misrounding test
("misrounding").

    python benchmarks/truncation_power.py [--seeds 400] [--sizes 32 64 96 128]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import pandas as pd
import torch
import torch.nn.functional as F

from pytest_msprobe.standards import check

KERNELS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "layer_norm": lambda t: F.layer_norm(t, t.shape[-1:]),
    "softmax": lambda t: F.softmax(t, -1),
    "rms_norm": lambda t: F.rms_norm(t, t.shape[-1:]),
    "gelu": F.gelu,
    "silu": F.silu,
    "tanh": torch.tanh,
}


def toward_zero(value: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float32 `value` rounded toward zero to `dtype` (where nearest rounding moved it away)."""
    nearest = value.to(dtype)
    away = nearest.float().abs() > value.abs()
    return torch.where(away, torch.nextafter(nearest, torch.zeros_like(nearest)), nearest)


def measure(api: str, dtype: torch.dtype, size: int, seeds: int, reference: bool) -> dict[str, object]:
    fn = KERNELS[api]
    missed = failed = by_sign = by_far = 0
    for seed in range(seeds):
        x = (torch.randn(2, size // 2, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 2 + 0.5).to(dtype)
        bench = fn(x.float())
        run = fn(x) if reference else None
        failed += check(bench, bench.to(dtype), api=api, reference=run).status == "error"
        verdict = check(bench, toward_zero(bench, dtype), api=api, reference=run)
        text = verdict.message()
        missed += verdict.status != "error"
        by_sign += "bias:" in text or "bias " in text
        by_far += "misrounding" in text
    return {
        "api": api,
        "dtype": str(dtype).removeprefix("torch."),
        "mode": "reference" if reference else "single-run",
        "elements": size,
        "seeds": seeds,
        "truncation missed": missed / seeds,
        "correct failed": failed / seeds,
        "caught by sign tests": by_sign / seeds,
        "caught by far misroundings": by_far / seeds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=400)
    parser.add_argument("--sizes", type=int, nargs="+", default=[32, 64, 96, 128])
    parser.add_argument("--markdown", help="write the table here too")
    args = parser.parse_args()
    start = time.perf_counter()
    rows = [
        measure(api, dtype, size, args.seeds, reference)
        for api in KERNELS
        for dtype in (torch.bfloat16, torch.float16)
        for size in args.sizes
        for reference in (False, True)
    ]
    table = pd.DataFrame(rows)
    print(table.to_string(index=False))
    print(f"wall {time.perf_counter() - start:.0f} s")
    if args.markdown:
        table.to_markdown(args.markdown, index=False)


if __name__ == "__main__":
    main()
