"""Which CPU kernels round differently on a channels_last tensor, and what offline says.

Why
---
msprobe saves every tensor contiguous: a dump cannot say in which memory layout the device
ran a call. Offline, the reference (the CPU in the dump's dtype) runs the contiguous
kernel; where the channels_last kernel rounds otherwise, a correct call written
channels_last may be judged "beyond the reference run". This script finds those kernels
on this machine and checks the plugin's offline verdicts on a dump written channels_last.

How
---
For each capability in --capabilities it runs itself in a subprocess with
ATEN_CPU_CAPABILITY set (and OMP_NUM_THREADS=2), which

1. runs each API of CASES forward and backward in float32, bfloat16 and float16 on
   (N, C, H, W) = (4, C, 14, 14) random inputs, contiguous and channels_last (the incoming
   gradient laid out like the output), and counts the elements whose bits differ;
2. writes every case run channels_last as a tensor dump (pytest_msprobe/testing/dumpwriter.py) and runs
   the plugin on it with --msprobe-offline, counting failed calls.

Run: python studies/layout_kernels.py [--channels 24 13] [--capabilities avx2 default]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

DTYPES = ("float32", "bfloat16", "float16")


def cases(channels: int) -> dict[str, tuple[str, Callable[..., object], list[object], dict[str, object]]]:
    """case -> (dumped API, function, arguments after the input, keyword arguments); tensors
    among the arguments in float32 (cast to the case's dtype)."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    weight, depthwise = torch.randn(channels, channels, 3, 3) * 0.2, torch.randn(channels, 1, 3, 3) * 0.2
    gamma, beta = torch.randn(channels), torch.randn(channels)
    groups = 4 if channels % 4 == 0 else 1
    return {
        "conv2d": ("Functional.conv2d", F.conv2d, [weight, None, 1, 1], {}),
        "conv2d depthwise": ("Functional.conv2d", F.conv2d, [depthwise, None, 1, 1, 1, channels], {}),
        "conv_transpose2d": ("Functional.conv_transpose2d", F.conv_transpose2d, [weight, None, 2], {}),
        "batch_norm (training)": ("Functional.batch_norm", F.batch_norm, [None, None, gamma, beta, True], {}),
        "group_norm": ("Functional.group_norm", F.group_norm, [groups, gamma, beta], {}),
        "avg_pool2d": ("Functional.avg_pool2d", F.avg_pool2d, [3, 2], {}),
        "adaptive_avg_pool2d": ("Functional.adaptive_avg_pool2d", F.adaptive_avg_pool2d, [1], {}),
        "max_pool2d": ("Functional.max_pool2d", F.max_pool2d, [3, 2], {}),
        "interpolate bilinear": (
            "Functional.interpolate",
            F.interpolate,
            [],
            {"scale_factor": 2.0, "mode": "bilinear"},
        ),
        "gelu": ("Functional.gelu", F.gelu, [], {}),
        "silu": ("Functional.silu", F.silu, [], {}),
        "hardswish": ("Functional.hardswish", F.hardswish, [], {}),
        "sigmoid": ("Torch.sigmoid", torch.sigmoid, [], {}),
        "mean over H, W": ("Tensor.mean", torch.Tensor.mean, [[2, 3]], {}),
        "sum over H, W": ("Tensor.sum", torch.Tensor.sum, [[2, 3]], {}),
        "softmax over C": ("Torch.softmax", torch.softmax, [1], {}),
    }


def _run(
    function: Callable[..., object], x: object, extra: list[object], kwargs: dict[str, object], channels_last: bool
) -> tuple:
    """(input, arguments, output, incoming gradient, gradients of the floating tensors)."""
    import torch

    dtype = x.dtype
    cast = [a.to(dtype) if isinstance(a, torch.Tensor) else a for a in extra]
    laid = [x, *cast]
    if channels_last:
        laid = [
            a.to(memory_format=torch.channels_last) if isinstance(a, torch.Tensor) and a.dim() == 4 else a for a in laid
        ]
    laid = [a.detach().requires_grad_() if isinstance(a, torch.Tensor) else a for a in laid]
    y = function(*laid, **kwargs)
    upstream = torch.randn(y.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    y.backward(upstream.to(memory_format=torch.channels_last) if channels_last and y.dim() == 4 else upstream)
    grads = [a.grad.contiguous() for a in laid if isinstance(a, torch.Tensor)]
    return [x, *cast], y.detach().contiguous(), upstream, grads


def measure(channels: list[int], dump_root: Path) -> dict[str, object]:
    """In this process's capability: differing elements per case, and the offline verdicts."""
    import torch

    from pytest_msprobe.testing.dumpwriter import DumpWriter

    rows, writer, number = [], DumpWriter(dump_root, "tensor"), 0
    for size in channels:
        for name, (api, function, extra, kwargs) in cases(size).items():
            for dtype_name in DTYPES:
                x = torch.randn(4, size, 14, 14, generator=torch.Generator().manual_seed(2)).to(
                    getattr(torch, dtype_name)
                )
                args, contiguous, _, plain_grads = _run(function, x, extra, kwargs, False)
                _, laid, upstream, laid_grads = _run(function, x, extra, kwargs, True)
                forward = int((contiguous != laid).sum())
                backward = int((plain_grads[0] != laid_grads[0]).sum())
                rows.append([size, name, dtype_name, forward, contiguous.numel(), backward, x.numel()])
                call = f"{api}.{number}"
                writer.forward(call, args, kwargs, laid)
                edges = [*laid_grads, None] if "conv" in api else laid_grads  # a convolution's node has a bias edge
                writer.backward(call, [upstream], edges)
                number += 1
    dump = writer.write()
    with tempfile.TemporaryDirectory() as out:
        subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", f"--msprobe-dump={dump}",
             "--msprobe-offline", "--msprobe-device=cpu", f"--msprobe-out={out}"],
            cwd=ROOT, capture_output=True, check=False,
        )  # fmt: skip
        failed = _failed(Path(out))
    return {"rows": rows, "calls": 2 * number, "failed": failed}


def _failed(out: Path) -> list[str]:
    """The calls judged error, from the result CSV."""
    import csv

    failed = []
    for path in out.glob("accuracy_checking_result_*.csv"):
        with open(path, encoding="utf-8-sig", newline="") as handle:
            for row in csv.DictReader(handle):
                for direction, column in (("forward", "Forward Test Success"), ("backward", "Backward Test Success")):
                    if row.get(column) == "error":
                        failed.append(f"{row['API name']}.{direction}")
    return failed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--channels", type=int, nargs="+", default=[24, 13])
    parser.add_argument("--capabilities", nargs="+", default=["avx2", "default"])
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner:
        with tempfile.TemporaryDirectory() as root:
            print(json.dumps(measure(args.channels, Path(root) / "dump")))
        return
    for capability in args.capabilities:
        env = {**os.environ, "ATEN_CPU_CAPABILITY": capability, "OMP_NUM_THREADS": "2"}
        command = [sys.executable, __file__, "--inner", "--channels", *map(str, args.channels)]
        result = json.loads(
            subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout.splitlines()[-1]
        )
        print(f"\n## ATEN_CPU_CAPABILITY={capability}, OMP_NUM_THREADS=2\n")
        print("| C | case | dtype | forward elements differing | backward (input gradient) elements differing |")
        print("| --- | --- | --- | --- | --- |")
        for size, name, dtype, forward, forward_n, backward, backward_n in result["rows"]:
            if forward or backward:
                print(f"| {size} | {name} | {dtype} | {forward} / {forward_n} | {backward} / {backward_n} |")
        print(
            f"\noffline on the dump written channels_last: {result['calls']} calls, {len(result['failed'])} judged error"
        )
        for call in result["failed"]:
            print(f"- {call}")


if __name__ == "__main__":
    main()
