"""A real msprobe tensor dump of one training step of a 12-block transformer, made with
the shared maker (../shared/tools/make_dump_torch.py), for benchmarks/bench_transformer.py.

Run with the Python that has torch and mindstudio-probe (msprobe's own venv):

    python benchmarks/make_transformer_dump.py OUT_FOLDER [DTYPE] [--tool PATH]

The shared maker ships one model (mlpcnn) and says to add one's own to its MODELS: this
script registers the tests' 12-block transformer there (tests/dumps/models/make_dumps.py:
pre-norm blocks of layer_norm, linear, matmul, mul, softmax, gelu, add; dim 32, 4 heads,
MLP 64, sequence 8; --dim and --seq for larger calls), with a mean-pooled classifier head (the maker's loss takes one label
per sample), and runs the maker's main: OUT_FOLDER/dump.json (L1, tensor task), 326 calls
in float32, forward and backward.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import sys
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

TOOL = Path(__file__).resolve().parents[2] / "shared" / "tools" / "make_dump_torch.py"


class Block(nn.Module):
    """Pre-norm transformer block: attention by matmul/softmax, MLP with gelu."""

    def __init__(s, dim: int, heads: int, mlp: int) -> None:
        super().__init__()
        s.heads = heads
        s.ln1, s.qkv, s.proj = nn.LayerNorm(dim), nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        s.ln2, s.fc1, s.fc2 = nn.LayerNorm(dim), nn.Linear(dim, mlp), nn.Linear(mlp, dim)

    def forward(s, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        dh = d // s.heads
        q, k, v = s.qkv(s.ln1(x)).split(d, dim=-1)
        q, k, v = (t.reshape(b, n, s.heads, dh).transpose(1, 2) for t in (q, k, v))
        scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(dh))
        o = torch.matmul(F.softmax(scores, dim=-1), v).transpose(1, 2).reshape(b, n, d)
        x = x + s.proj(o)
        return x + s.fc2(F.gelu(s.fc1(s.ln2(x))))


class Transformer12(nn.Module):
    def __init__(s, blocks: int = 12, vocab: int = 64, dim: int = 32, heads: int = 4, mlp: int = 64, seq: int = 8,
                 classes: int = 5) -> None:
        super().__init__()
        s.emb = nn.Embedding(vocab, dim)
        s.pos = nn.Parameter(torch.randn(seq, dim) * 0.1)
        s.blocks = nn.ModuleList(Block(dim, heads, mlp) for _ in range(blocks))
        s.ln_f, s.head = nn.LayerNorm(dim), nn.Linear(dim, classes)

    def forward(s, ids: torch.Tensor) -> torch.Tensor:
        x = s.emb(ids) + s.pos
        for block in s.blocks:
            x = block(x)
        return s.head(s.ln_f(x).mean(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("dtype", nargs="?", default="float32")
    parser.add_argument("--tool", type=Path, default=TOOL, help="the shared maker (default: ../shared/tools/...)")
    parser.add_argument("--dim", type=int, default=32, help="hidden size (heads: dim / 8; MLP: 2 x dim)")
    parser.add_argument("--seq", type=int, default=8, help="sequence length")
    args = parser.parse_args()
    spec = importlib.util.spec_from_file_location("make_dump_torch", args.tool)
    assert spec is not None and spec.loader is not None
    maker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(maker)
    model = lambda: Transformer12(dim=args.dim, heads=max(args.dim // 8, 1), mlp=2 * args.dim, seq=args.seq)  # noqa: E731
    maker.MODELS["transformer12"] = (model, lambda: torch.randint(0, 64, (4, args.seq)), 5)
    sys.argv = [str(args.tool), "transformer12", "tensor", args.dtype, str(args.out)]
    maker.main()


if __name__ == "__main__":
    main()
