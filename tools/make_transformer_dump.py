"""A real msprobe tensor dump of one training step of a 12-block transformer, made with
the shared maker (../shared/tools/make_dump_torch.py), for benchmarks/test_transformer.py.

Run with the Python that has torch and mindstudio-probe (msprobe's own venv):

    python tools/make_transformer_dump.py OUT_FOLDER [DTYPE] [--tool PATH] [--blocks N]

The shared maker ships one model (mlpcnn) and says to add one's own to its MODELS: this
script registers the tests' 12-block transformer there (tests/dumps/models/make_dumps.py:
pre-norm blocks of layer_norm, linear, matmul, mul, softmax, gelu, add; dim 32, 4 heads,
MLP 64, sequence 8; --dim and --seq for larger calls), with a mean-pooled classifier head (the maker's loss takes one label
per sample), and runs the maker's main: OUT_FOLDER/dump.json (L1, tensor task), 326 calls
in float32, forward and backward. --blocks N for a deeper (or shallower) model: each block
adds 26 calls (16 blocks: 430 calls, the depth of the issues' "436-call" dump).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import torch
import torch.nn as nn

TOOL = Path(__file__).resolve().parents[2] / "shared" / "tools" / "make_dump_torch.py"
CLASSES = 5  # the classifier head's outputs: the labels the shared maker's loss draws


# the tests' model makers: a script beside the dumps it writes, run (as this is) by msprobe's Python
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "dumps" / "models"))
from make_dumps import Transformer  # noqa: E402


class Transformer12(Transformer):
    """The tests' 12-block transformer with a mean-pooled classifier head: the shared
    maker's loss takes one label per sample."""

    def __init__(s, dim: int = 32, seq: int = 8, blocks: int = 12) -> None:
        """`dim` sets the rest as --dim says: heads dim / 8 (at least 1), MLP 2 x dim."""
        super().__init__(blocks, dim=dim, heads=max(dim // 8, 1), mlp=2 * dim, seq=seq)
        s.head = nn.Linear(dim, CLASSES)

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
    parser.add_argument(
        "--blocks", type=int, default=12, help="transformer blocks (26 calls each; default 12: 326 calls)"
    )
    args = parser.parse_args()
    spec = importlib.util.spec_from_file_location("make_dump_torch", args.tool)
    assert spec is not None and spec.loader is not None
    maker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(maker)
    model = lambda: Transformer12(dim=args.dim, seq=args.seq, blocks=args.blocks)
    maker.MODELS["transformer12"] = (model, lambda: torch.randint(0, 64, (4, args.seq)), CLASSES)
    sys.argv = [str(args.tool), "transformer12", "tensor", args.dtype, str(args.out)]
    maker.main()


if __name__ == "__main__":
    main()
