"""Make real msprobe L1 dumps of one training step (forward + loss.backward()) of small
real models on the CPU: the calibration dumps under tests/dumps/models/.

Run with torch and mindstudio-probe installed (never torch_npu):
    python make_dumps.py MODEL DTYPE OUTDIR [--task tensor|statistics] [--fault NAME]
    python make_dumps.py --fault NAME --fault-dump OUTDIR   the fault table's model and dtype
    python make_dumps.py --all [--root DIR]      every shipped dump (and shipped fault dump)
    python make_dumps.py --list                  models, shipped dumps, the fault table
    python make_dumps.py MODEL DTYPE OUTDIR --threads N    dump with N torch threads (default 1)
    python make_dumps.py MODEL DTYPE OUTDIR --level mix   msprobe's level mix (Module.* records too; default L1)
MODEL: transformer12 transformer4 transformer1 transformer_large convbn gru lstm embedattn apizoo losses shared widenorm; DTYPE: float32 bfloat16 float16.

The dump is rewritten to the portable layout: OUTDIR/dump.json, OUTDIR/dump_tensor_data/*.pt,
OUTDIR/construct.json, with dump_data_dir set to a foreign path (a dump is always read on
another machine) and stack.json dropped (it names files of the machine that made it).
Seeds are fixed and torch runs with one thread while dumping (a reduction split over
several threads rounds differently): rerunning the maker writes the same files on any
machine. --threads N (default 1) dumps with N threads instead: another correct kernel path,
for studies/kernel_diversity.py; the shipped dumps (--all, --fault-dump) always use one
thread. One dump per process (msprobe's debugger wraps the APIs once per process); --all
and --fault-dump start subprocesses.

--fault NAME plants one of the faulty kernels of pytest_msprobe/testing/model_faults.py WHILE dumping: the
torch API is patched before msprobe wraps it, so the dumped outputs carry the fault (the
plugin's offline mode reads them as the device result). After dumping, every dumped call
of that API is replayed here with the correct kernel on its dumped inputs, and the maker
fails (exit status 1) unless the dumped result of at least one call differs from the
correct one in the fault's direction, or unless the fault dump holds exactly the calls of
the clean dump of the same model; it prints, per call, how many elements differ and the
error of the dumped and of the correct result against the exact (float64) one, in ULPs.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
# the repository, for pytest_msprobe.testing: msprobe's Python runs this, where the plugin
# need not be installed
sys.path.insert(0, str(HERE.parents[2]))
from pytest_msprobe.testing import model_faults  # noqa: E402

SEED = 1234
FOREIGN_DIR = "/home/user/msprobe_dump/step0/rank0/dump_tensor_data"

# --- models ---------------------------------------------------------------------


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
        attn = F.softmax(scores, dim=-1)
        o = torch.matmul(attn, v).transpose(1, 2).reshape(b, n, d)
        x = x + s.proj(o)
        return x + s.fc2(F.gelu(s.fc1(s.ln2(x))))


class Transformer(nn.Module):
    def __init__(s, blocks: int, vocab: int = 64, dim: int = 32, heads: int = 4, mlp: int = 64, seq: int = 8) -> None:
        super().__init__()
        s.emb = nn.Embedding(vocab, dim)
        s.pos = nn.Parameter(torch.randn(seq, dim) * 0.1)
        s.blocks = nn.ModuleList(Block(dim, heads, mlp) for _ in range(blocks))
        s.ln_f, s.head = nn.LayerNorm(dim), nn.Linear(dim, vocab)

    def forward(s, ids: torch.Tensor) -> torch.Tensor:
        x = s.emb(ids) + s.pos
        for block in s.blocks:
            x = block(x)
        return s.head(s.ln_f(x))


class ConvBN(nn.Module):
    """conv2d (with bias) -> batch_norm -> relu, twice, then max pooling and a linear
    classifier. The conv biases' gradients are mathematically zero: batch norm removes
    the per-channel mean, so a bias before it changes nothing."""

    def __init__(s) -> None:
        super().__init__()
        s.conv1, s.bn1 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        s.conv2, s.bn2 = nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8)
        s.fc = nn.Linear(8 * 4 * 4, 10)

    def forward(s, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(s.bn1(s.conv1(x)))
        x = F.relu(s.bn2(s.conv2(x)))
        x = F.max_pool2d(x, 2)
        return s.fc(torch.flatten(x, 1))


class Recurrent(nn.Module):
    """A 2-layer GRU or LSTM (batch first) and a classifier of the last step.

    nn.GRU/nn.LSTM reach the kernel through torch._VF, which msprobe 26.2 does not wrap
    here (a dump of nn.GRU holds only the calls around it), so the forward calls the same
    op as torch.gru / torch.lstm, with the module's own weights and arguments: those
    msprobe dumps as Torch.gru / Torch.lstm."""

    def __init__(s, cell: type[nn.Module]) -> None:
        super().__init__()
        s.rnn = cell(8, 16, num_layers=2, batch_first=True)
        s.fc = nn.Linear(16, 5)

    def forward(s, x: torch.Tensor) -> torch.Tensor:
        r = s.rnn
        h0 = torch.zeros(r.num_layers, x.shape[0], r.hidden_size, dtype=x.dtype)
        if isinstance(r, nn.LSTM):
            out = torch.lstm(
                x,
                (h0, h0.clone()),
                r._flat_weights,
                r.bias,
                r.num_layers,
                r.dropout,
                r.training,
                r.bidirectional,
                r.batch_first,
            )[0]
        else:
            out = torch.gru(
                x, h0, r._flat_weights, r.bias, r.num_layers, r.dropout, r.training, r.bidirectional, r.batch_first
            )[0]
        return s.fc(out[:, -1])


class EmbedAttn(nn.Module):
    """A large-vocabulary embedding and one causal self-attention (masked_fill of the
    future positions with -inf, softmax), a residual and a small classifier per token."""

    def __init__(s, vocab: int = 5000, dim: int = 16, classes: int = 10) -> None:
        super().__init__()
        s.emb = nn.Embedding(vocab, dim)
        s.q, s.k, s.v = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        s.head = nn.Linear(dim, classes)

    def forward(s, ids: torch.Tensor) -> torch.Tensor:
        x = s.emb(ids)
        n = ids.shape[1]
        scores = s.q(x) @ s.k(x).transpose(-2, -1) / math.sqrt(x.shape[-1])
        future = torch.ones(n, n, dtype=torch.bool).triu(1)
        attn = scores.masked_fill(future, float("-inf")).softmax(dim=-1)
        return s.head(x + attn @ s.v(x))


class WideNorm(nn.Module):
    """Wide reductions: GEMMs with K = 4096 and normalisations in training mode.

    x (8, 4096) -> layer_norm over the 4096 features, then three branches:
    a linear 4096 -> 24 (K = 4096) and batch_norm (BatchNorm1d, batch statistics);
    a matmul by a 4096 x 8 matrix (K = 4096);
    the same row as 512 tokens of 8 features: a linear 8 -> 8 over the 4096 tokens (its
    weight gradient sums over K = 4096), rms_norm over each sample's 512 x 8 values
    (written out: pow, mean, add, rsqrt, mul -- msprobe 26.2 does not wrap F.rms_norm, its
    torch list has npu_rms_norm only, so F.rms_norm runs but is not in the dump),
    group_norm (8 channels in 4 groups of 2 x 512 values) and BatchNorm2d (8 channels, each
    over 8 x 16 x 32 = 4096 values), averaged to 8 features. The 40 features are joined,
    layer_norm'ed, rms_norm'ed (F.rms_norm: not dumped) and classified by a linear 40 -> 10."""

    def __init__(s) -> None:
        super().__init__()
        s.ln_in = nn.LayerNorm(4096)
        s.wide, s.bn1 = nn.Linear(4096, 24), nn.BatchNorm1d(24)
        s.proj = nn.Parameter(torch.randn(4096, 8) / 64)
        s.tok = nn.Linear(8, 8)
        s.rms_tok = nn.Parameter(torch.ones(512, 8) + 0.1 * torch.randn(512, 8))
        s.gn, s.bn2 = nn.GroupNorm(4, 8), nn.BatchNorm2d(8)
        s.ln_out = nn.LayerNorm(40)
        s.rms_out = nn.Parameter(torch.ones(40) + 0.1 * torch.randn(40))
        s.head = nn.Linear(40, 10)

    def forward(s, x: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        x = s.ln_in(x)
        wide = s.bn1(s.wide(x))
        proj = torch.matmul(x, s.proj)
        tok = s.tok(x.reshape(b, 512, 8))
        tok = tok * torch.rsqrt(tok.pow(2).mean(dim=(1, 2), keepdim=True) + 1e-6) * s.rms_tok
        tok = s.gn(tok.transpose(1, 2))  # (b, 8 channels, 512)
        tok = s.bn2(tok.reshape(b, 8, 16, 32)).mean(dim=(2, 3))
        h = s.ln_out(torch.cat([wide, proj, tok], dim=1))
        return s.head(F.rms_norm(h, (40,), s.rms_out))


class ApiZoo(nn.Module):
    """Many APIs once each, on small tensors: the APIs of the standards' routing table and
    of the [terms] table that no other calibration model calls (norms, attention masked and
    unmasked, group_norm, expm1/log1p, interpolate, pooling, elementwise math), for
    exploring correct kernels on real inputs (benchmarks/RESULTS-explore.md).

    x (2, 4, 8, 8) -> per branch a (2, 8) feature block, joined and classified by a linear."""

    def __init__(s) -> None:
        super().__init__()
        s.conv = nn.Conv2d(4, 4, 3, padding=1)
        s.conv1d = nn.Conv1d(4, 4, 3, padding=1)
        s.gn, s.bn = nn.GroupNorm(2, 4), nn.BatchNorm2d(4)
        s.ln = nn.LayerNorm(8)
        s.inorm = nn.InstanceNorm2d(4, affine=True)
        s.qkv = nn.Linear(8, 24)
        s.mix = nn.Parameter(torch.randn(8, 8) / 3)
        s.head = nn.Linear(8 * 8, 10)

    def forward(s, x: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        feats = []
        y = F.silu(s.gn(s.conv(x)))  # conv2d, group_norm, silu
        y = s.inorm(
            F.interpolate(y, scale_factor=2.0, mode="bilinear", align_corners=False)
        )  # interpolate, instance_norm
        y = F.avg_pool2d(s.bn(y), 2)  # batch_norm, avg_pool2d
        feats.append(y.mean(dim=(1, 2)))  # mean
        rows = x.reshape(b, 4 * 8, 8)
        h = s.ln(rows)  # layer_norm
        q, k, v = s.qkv(h).reshape(b, 32, 3, 8).unbind(2)
        q, k, v = (t.reshape(b, 32, 2, 4).transpose(1, 2) for t in (q, k, v))
        plain = F.scaled_dot_product_attention(q, k, v)  # unmasked attention
        causal = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # masked
        future = torch.ones(32, 32, dtype=torch.bool).triu(1)
        scores = torch.matmul(q, k.transpose(-2, -1)).masked_fill(future, float("-inf"))
        attn = plain + causal + torch.matmul(F.log_softmax(scores, -1).exp(), v)  # masked log_softmax
        feats.append(attn.transpose(1, 2).reshape(b, 32, 8).mean(1))
        feats.append(
            torch.logsumexp(h, dim=1) + torch.norm(h, dim=1) + F.normalize(h, dim=1).sum(1)
        )  # logsumexp, norm, normalize
        z = torch.tanh(h[:, 0]) * 0.5  # small values: where expm1/log1p/1-cos matter
        feats.append(
            torch.expm1(z) + torch.log1p(z) + torch.cos(z) + torch.sin(z) + torch.sigmoid(h[:, 1]) + torch.exp(-z * z)
        )
        feats.append(
            torch.var(h, dim=1)
            + torch.std(h, dim=1)
            + F.softplus(h).mean(1)
            + F.elu(h).amax(1)
            + torch.rsqrt(1 + h * h).sum(1)
        )
        c = s.conv1d(h[:, :4, :])  # conv1d on 4 channels of length 8
        feats.append(
            F.avg_pool1d(c, 2).repeat_interleave(2, -1).sum(1)
            + torch.cumsum(h[:, 0], -1)
            + torch.einsum("bi,ij->bj", h[:, 1], s.mix)
        )
        feats.append(
            torch.addmm(h[:, 2], h[:, 3], s.mix)
            + F.hardswish(h[:, 4])
            + F.mish(h[:, 5])
            + torch.erf(h[:, 6])
            + F.gelu(h[:, 7], approximate="tanh")
        )
        feats.append(
            F.cosine_similarity(h[:, 8], h[:, 9], dim=0).unsqueeze(0)
            + torch.atan2(h[:, 10], 1 + h[:, 11].abs())
            + torch.pow(h[:, 12].abs() + 1, 1.5)
        )
        return s.head(torch.cat(feats, dim=-1))


class Losses(nn.Module):
    """A siamese step: two views of a batch through one encoder, rms_norm'ed (F.rms_norm:
    msprobe 26.2 wraps it only once registered, make_dump's ModelSpec.custom_apis), and
    compared by cosine_embedding_loss (1 - cos for pairs labelled 1: per pair, and their
    mean; in float32, as mixed precision computes a loss: torch's float16 kernel rounds
    every step of 1 - cos to float16, 8-38 ULP of float16 off on these views, forward and
    backward, pytest_msprobe/judge/reproducers.py), pairwise_distance and cosine_similarity.
    The APIs of the routing tables whose definition takes the angle or difference of two
    inputs, for exploring them on real inputs (benchmarks/RESULTS-explore.md).

    x (2, 4, 16): the two views, the second the first plus noise of half its scale."""

    def __init__(s) -> None:
        super().__init__()
        s.enc = nn.Linear(16, 16)
        s.scale = nn.Parameter(torch.ones(16) + 0.1 * torch.randn(16))
        s.head = nn.Linear(16, 10)

    def forward(s, x: torch.Tensor) -> torch.Tensor:
        h1 = F.rms_norm(s.enc(x[0]), (16,), s.scale, eps=1e-6)
        h2 = F.rms_norm(s.enc(x[1]), (16,))
        a, b = h1.float(), h2.float()  # the loss in float32, as mixed precision computes losses
        same = torch.ones(
            4, dtype=torch.int64
        )  # positive pairs: a pair labelled -1 (loss ~1) would set the output's scale
        pairs = F.cosine_embedding_loss(a, b, same, reduction="none")
        positive = F.cosine_embedding_loss(a, b, same)
        near = F.pairwise_distance(h1, h2) + F.cosine_similarity(h1, h2)
        return s.head(h1 + h2) + (pairs + positive).unsqueeze(1).to(h1.dtype) + near.unsqueeze(1)


class SharedReaders(nn.Module):
    """One 16-bit tensor h read by a GEMM and by a dropout and an elementwise op: an einsum
    (twice), a matmul, a linear. A GEMM's backward is recorded at an inner node, so the
    gradient of its input h is recovered from the data flow as the sum autograd formed
    over h's readers. Three of the blocks have a reader the dump does not hold
    (msprobe 26.2 dumps neither a cast, nor a slice or repeat, nor F.rms_norm unregistered):
    the sum the dump recorded holds its share, which no dumped call names.

    x (2, 6, 16) -> 4 blocks of 16; a head of 10. Dropout runs in training mode."""

    def __init__(s) -> None:
        super().__init__()
        s.inp = nn.ModuleList(nn.Linear(16, 16) for _ in range(4))
        s.mix = nn.Parameter(torch.randn(16, 16) / 4)
        s.proj = nn.Linear(16, 16)
        s.drop = nn.Dropout(0.1)
        s.head = nn.Linear(16, 10)

    def forward(s, x: torch.Tensor) -> torch.Tensor:
        h = s.inp[0](x)  # read by the einsum, the dropout and the mul only
        y = torch.einsum("bsd,de->bse", h, s.mix) + s.drop(h) + h * 0.5
        h = s.inp[1](y)  # and by a cast to float32, which the dump does not hold
        y = torch.einsum("bsd,de->bse", h, s.mix) + s.drop(h) * h + (h.float() * 0.25).to(h.dtype)
        h = s.inp[2](y)  # and by a slice repeated
        y = torch.matmul(h, s.mix) + s.drop(h) + h * h.sigmoid() + h[..., :8].repeat(1, 1, 2)
        h = s.inp[3](y)  # and by rms_norm
        y = s.proj(h) + s.drop(h) + h * 0.5 + F.rms_norm(h, (16,))
        return s.head(y)


def _two_views() -> torch.Tensor:
    base = torch.randn(4, 16)
    return torch.stack([base, base + 0.5 * torch.randn(4, 16)])


def _token_ids(vocab: int, batch: int, seq: int) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, seq))


def _repeated_token_ids() -> torch.Tensor:
    """Text-like ids: a frequent token (every third position) and a word used twice."""
    ids = torch.randint(0, 5000, (2, 12))
    ids[:, ::3] = 17
    ids[1, 7] = ids[0, 4]
    return ids


@dataclass(frozen=True)
class ModelSpec:
    build: Callable[[], nn.Module]
    inputs: Callable[[], torch.Tensor]
    labels: Callable[[torch.Tensor], torch.Tensor]  # from the logits' shape
    apis: str  # what the dump holds, for --list
    custom_apis: tuple[str, ...] = ()  # torch.nn.functional APIs msprobe wraps only once registered (as Functional.*)


def _per_token_labels(classes: int) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda logits: torch.randint(0, classes, logits.shape[:-1])


MODELS: dict[str, ModelSpec] = {
    "transformer12": ModelSpec(
        lambda: Transformer(12),
        lambda: _token_ids(64, 1, 8),
        _per_token_labels(64),
        "embedding, add, 12 x (layer_norm, linear, matmul, mul, softmax, gelu, add), cross_entropy (msprobe 26.2 dumps no split/reshape/transpose)",
    ),
    # not shipped: benchmarks/bench_dataflow.py dumps it at levels L1 and mix
    "transformer4": ModelSpec(
        lambda: Transformer(4),
        lambda: _token_ids(64, 1, 8),
        _per_token_labels(64),
        "transformer12 with 4 blocks (the data-flow dumps)",
    ),
    "transformer1": ModelSpec(
        lambda: Transformer(1),
        lambda: _token_ids(64, 1, 8),
        _per_token_labels(64),
        "transformer12 with 1 block (the fault dumps: small)",
    ),
    # not shipped (fp32 tensor dump ~1 GB): benchmarks/bench_large_calls.py makes it under /tmp
    "transformer_large": ModelSpec(
        lambda: Transformer(2, vocab=1024, dim=1024, heads=16, mlp=4096, seq=512),
        lambda: _token_ids(1024, 1, 512),
        _per_token_labels(1024),
        "transformer12's block, hidden 1024, 16 heads, MLP 4096, sequence 512, 2 blocks",
    ),
    "convbn": ModelSpec(
        ConvBN,
        lambda: torch.randn(4, 3, 8, 8),
        _per_token_labels(10),
        "conv2d, batch_norm, relu, max_pool2d, flatten, linear, cross_entropy",
    ),
    "gru": ModelSpec(
        lambda: Recurrent(nn.GRU), lambda: torch.randn(2, 6, 8), _per_token_labels(5), "GRU (2 layers), linear"
    ),
    "lstm": ModelSpec(
        lambda: Recurrent(nn.LSTM), lambda: torch.randn(2, 6, 8), _per_token_labels(5), "LSTM (2 layers), linear"
    ),
    "embedattn": ModelSpec(
        EmbedAttn,
        _repeated_token_ids,
        _per_token_labels(10),
        "embedding 5000 x 16 with repeated ids, linear, matmul, masked_fill(-inf, causal), softmax",
    ),
    "apizoo": ModelSpec(
        ApiZoo,
        lambda: torch.randn(2, 4, 8, 8),
        lambda logits: torch.randint(0, 10, logits.shape[:-1]),
        "conv2d/1d, group/instance/batch/layer_norm, silu, interpolate, avg_pool, mean, sdpa (plain, causal), masked log_softmax, "
        "logsumexp, norm, normalize, expm1, log1p, cos, sin, sigmoid, exp, var, std, softplus, elu, rsqrt, cumsum, einsum, "
        "addmm, hardswish, mish, erf, gelu (tanh), cosine_similarity, atan2, pow",
    ),
    "losses": ModelSpec(
        Losses,
        _two_views,
        _per_token_labels(10),
        "linear, rms_norm (registered), cosine_embedding_loss (positive pairs: per pair, mean), pairwise_distance, cosine_similarity",
        custom_apis=("rms_norm",),
    ),
    "shared": ModelSpec(
        SharedReaders,
        lambda: torch.randn(2, 6, 16),
        _per_token_labels(10),
        "4 x (linear, its output read by einsum / einsum / matmul / linear, dropout, mul; three also by an op the dump lacks), linear",
    ),
    # not shipped: for studies/kernel_diversity.py (wide reductions under other kernel paths)
    "widenorm": ModelSpec(
        WideNorm,
        lambda: torch.randn(8, 4096),
        _per_token_labels(10),
        "layer_norm (4096), linear 4096 -> 32, batch_norm 1d/2d (train), matmul K = 4096, "
        "linear over 4096 tokens, rms_norm over 4096 written out (pow, mean, rsqrt, mul), group_norm, "
        "mean, linear (msprobe 26.2 dumps neither F.rms_norm nor cat)",
    ),
}

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
SHORT = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}

# The shipped dumps: folder -> (model, dtype, task).
SHIPPED = {
    "transformer12_tensor_fp32": ("transformer12", "float32", "tensor"),
    "transformer12_tensor_bf16": ("transformer12", "bfloat16", "tensor"),
    "transformer12_tensor_fp16": ("transformer12", "float16", "tensor"),
    "transformer12_statistics_bf16": ("transformer12", "bfloat16", "statistics"),
    "convbn_tensor_fp32": ("convbn", "float32", "tensor"),
    "gru_tensor_fp32": ("gru", "float32", "tensor"),
    "lstm_tensor_fp32": ("lstm", "float32", "tensor"),
    "embedattn_tensor_fp32": ("embedattn", "float32", "tensor"),
    "embedattn_tensor_bf16": ("embedattn", "bfloat16", "tensor"),
    "apizoo_tensor_fp32": ("apizoo", "float32", "tensor"),
    "apizoo_tensor_fp16": ("apizoo", "float16", "tensor"),
    "apizoo_tensor_bf16": ("apizoo", "bfloat16", "tensor"),
    "losses_tensor_fp32": ("losses", "float32", "tensor"),
    "losses_tensor_fp16": ("losses", "float16", "tensor"),
    "losses_tensor_bf16": ("losses", "bfloat16", "tensor"),
    "shared_tensor_bf16": ("shared", "bfloat16", "tensor"),
    "shared_tensor_fp16": ("shared", "float16", "tensor"),
}
# Shipped dumps at level mix (Module.* records too): folder -> (model, dtype), task tensor.
SHIPPED_MIX = {"shared_mix_tensor_bf16": ("shared", "bfloat16"), "shared_mix_tensor_fp16": ("shared", "float16")}

# The fault table: fault -> (model, dtype, citation). The kernels are in pytest_msprobe/testing/model_faults.py.
# Two backward faults were tried and left out: layer_norm backward reading mean/rstd rounded
# to float16/bfloat16 (pytorch/pytorch#140259) is what torch's CPU kernel itself does (its
# native_layer_norm returns them in the input dtype), and a bfloat16 layer_norm weight
# gradient summed row by row in bfloat16 (karpathy/llm.c#476) is, over 8 rows, no less
# accurate than the CPU kernel's own.
FAULT_DUMPS: dict[str, tuple[str, str, str]] = {
    "bf16_truncation": (
        "transformer1",
        "bfloat16",
        "tenstorrent/tt-metal#19882 'Replace truncating fp32->bf16 with tie-to-even rounding rule'",
    ),
    "fp32_dot_toward_zero": (
        "transformer1",
        "float32",
        "Xilinx/mlir-aie#2983 'AIECoreToStandard: set conv_even rounding mode for bf16 matmul' (directed rounding of a matmul)",
    ),
    "fp16_gemm_fp16_accumulation": (
        "transformer1",
        "float16",
        "pytorch/pytorch#123157 'Add support for CUBLAS_COMPUTE_16F for gemm operations in cudaBLAS'",
    ),
    "tf32_conv": (
        "convbn",
        "float32",
        "pytorch/pytorch#107514 'conv2d wrong results on 3090/3090ti' (cudnn.allow_tf32 default)",
    ),
    "gelu_tanh_approximation": (
        "transformer1",
        "float32",
        "uxlfoundation/oneDNN#1122 'precision difference between Mkldnn Gelu and Gelu's erf algorithm'",
    ),
    "softmax_low_precision_sum": (
        "transformer1",
        "bfloat16",
        "apache/mxnet#14072 'Fp16 support for softmax' (reduction done in fp16)",
    ),
    "softmax_backward_half_accumulator": (
        "transformer1",
        "float16",
        "ROCm/MIOpen#3427 'Softmax log backward : Increase precision of fp16's accumulator to fp32'",
    ),
    "embedding_backward_lost_duplicates": (
        "embedattn",
        "float32",
        "pytorch/pytorch#187687 'fix: aten embed bwd thread sync before proceeding to next batch'",
    ),
    "linear_backward_bf16": (
        "transformer1",
        "float32",
        "GEMM backward defects of accelerators (TF32/HF32 inputs, split-K partial sums in low precision), inside the call",
    ),
    "einsum_backward_scaled": (
        "shared",
        "bfloat16",
        "an einsum's input gradients 2**-3 too large, judged through the summed gradient",
    ),
    "maxpool_backward_all_ties": (
        "convbn",
        "float32",
        "Theano/Theano#5248 'Backpropagation on max-pooling' (gradient to all inputs equal to the max, unlike cuDNN)",
    ),
}

# Fault dumps at level mix (Module.* records: a module's input and parameter gradients):
# folder under faults/ -> fault, on the fault table's model and dtype.
MIX_FAULT_DUMPS = {"linear_backward_bf16_mix": "linear_backward_bf16"}

# --- dumping --------------------------------------------------------------------


def make_dump(
    model_name: str, dtype_name: str, outdir: Path, task: str = "tensor", fault: str | None = None, level: str = "L1"
) -> dict[str, Any]:
    """Dump one training step; returns the rewritten dump.json."""
    dtype = DTYPES[dtype_name]
    original = None
    if fault is not None:
        spec = model_faults.FAULTS[fault]
        original = getattr(spec.owner, spec.attr)
        setattr(spec.owner, spec.attr, spec.wrap(original))  # before msprobe wraps the API
    try:
        from msprobe.pytorch import PrecisionDebugger, seed_all  # imported after the patch

        seed_all(SEED)
        raw = tempfile.mkdtemp()
        cfg = {
            "task": task,
            "dump_path": raw,
            "rank": [],
            "step": [],
            "level": level,
            "statistics": {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": "statistics"},
            "tensor": {"scope": [], "list": [], "data_mode": ["all"], "file_format": "pt"},
        }
        cfg_path = os.path.join(raw, "config.json")
        with open(cfg_path, "w") as handle:
            json.dump(cfg, handle)
        spec_model = MODELS[model_name]
        model = spec_model.build().to(dtype)
        x = spec_model.inputs()
        if x.is_floating_point():
            x = x.to(dtype)
        debugger = PrecisionDebugger(config_path=cfg_path)
        for api in spec_model.custom_apis:  # msprobe's public registration: recorded as Functional.<api>.N
            PrecisionDebugger.register_custom_api(F, api, "Functional")
        debugger.start(model=model if level != "L1" else None)  # module records need the model
        logits = model(x)
        labels = spec_model.labels(logits)
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1))
        loss.backward()
        debugger.stop()
        debugger.step()
    finally:
        if fault is not None:
            spec = model_faults.FAULTS[fault]
            setattr(spec.owner, spec.attr, original)
    src = glob.glob(os.path.join(raw, "step0", "*", "dump.json"))[0]
    srcdir = os.path.dirname(src)
    if outdir.exists():
        shutil.rmtree(outdir)
    outdir.mkdir(parents=True)
    with open(src) as handle:
        dump = json.load(handle)
    dump["dump_data_dir"] = FOREIGN_DIR if task == "tensor" else None
    with open(outdir / "dump.json", "w") as handle:
        json.dump(dump, handle, indent=1)
    if os.path.isdir(os.path.join(srcdir, "dump_tensor_data")):
        shutil.copytree(os.path.join(srcdir, "dump_tensor_data"), outdir / "dump_tensor_data")
    shutil.copy(os.path.join(srcdir, "construct.json"), outdir)
    shutil.rmtree(raw)
    size = sum(path.stat().st_size for path in outdir.rglob("*") if path.is_file())
    print(
        f"{outdir}: {model_name} {dtype_name} {task}{' fault ' + fault if fault else ''}: {len(dump['data'])} entries, {size / 1e6:.2f} MB",
        flush=True,
    )
    return dump


# --- checking that a fault is in its dump ---------------------------------------


def _tensor(value: dict[str, Any], tensor_dir: Path) -> torch.Tensor:
    tensor = torch.load(tensor_dir / value["data_name"], weights_only=True)
    return tensor.requires_grad_(True) if value.get("requires_grad") and tensor.is_floating_point() else tensor


# A typed dump.json value's kind -> its Python value (enough for the APIs of the fault
# table), as msprobe writes them; Any: a value of the kind's own type.
_KINDS: dict[str, Callable[[dict[str, Any], Path], Any]] = {
    "torch.Tensor": _tensor,
    "int": lambda value, _: value["value"],
    "float": lambda value, _: value["value"],
    "bool": lambda value, _: value["value"],
    "str": lambda value, _: value["value"],
    "slice": lambda value, _: slice(*value["value"]),
    "ellipsis": lambda value, _: Ellipsis,
    "torch.Size": lambda value, _: torch.Size(value["value"]),
    "torch.dtype": lambda value, _: getattr(torch, value["value"].split(".")[-1]),
    "torch.device": lambda value, _: torch.device("cpu"),
}


def decode(value: Any, tensor_dir: Path) -> Any:
    """A dump.json value -> the Python value: lists and untyped dicts element by element,
    a typed one by its kind (_KINDS), anything else as it is."""
    if isinstance(value, list):
        return [decode(item, tensor_dir) for item in value]
    if not isinstance(value, dict):
        return value  # None too
    kind = value.get("type")
    if kind is None:
        return {key: decode(item, tensor_dir) for key, item in value.items()}
    if kind not in _KINDS:
        raise ValueError(f"cannot decode a value of type {kind!r}")
    return _KINDS[kind](value, tensor_dir)


def _mantissa(dtype: torch.dtype) -> int:
    return {torch.float32: 23, torch.float16: 10, torch.bfloat16: 7, torch.float64: 52}[dtype]


def _ulp_errors(value: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """|value - exact| in units of the last place of `exact` rounded to value's dtype
    (finite elements only)."""
    dtype = value.dtype
    exact = exact.detach().double()
    value = value.detach().double()
    tiny = torch.finfo(dtype).tiny
    exponent = torch.floor(torch.log2(exact.to(dtype).double().abs().clamp_min(tiny)))
    ulp = torch.exp2(exponent - _mantissa(dtype))
    finite = torch.isfinite(exact) & torch.isfinite(value)
    return ((value - exact).abs() / ulp)[finite]


def _describe(errors: torch.Tensor) -> str:
    if errors.numel() == 0:
        return "-"
    return f"max {float(errors.max()):.3g} / mean {float(errors.mean()):.3g} ulp"


def _compare(correct: list[Any], dumped: list[Any], exact: list[Any]) -> list[str]:
    """Per output: how the dumped tensor differs from the correct kernel's, and both
    against the exact (float64) result, in ULPs of the output's dtype."""
    notes = []
    for position, (good, seen, true) in enumerate(zip(correct, dumped, exact, strict=False)):
        if not isinstance(good, torch.Tensor) or not isinstance(seen, torch.Tensor):
            continue
        good, seen = good.detach(), seen.detach()
        if good.shape != seen.shape:
            notes.append(f"output {position}: shape {list(seen.shape)} vs {list(good.shape)}")
            continue
        differ = ~((good == seen) | (torch.isnan(good) & torch.isnan(seen)))
        count = int(differ.sum())
        if count:
            signed = (seen.double() - true.double()) * torch.sign(true.double())
            toward_zero = float((signed[differ] < 0).double().mean())
            notes.append(
                f"output {position} {tuple(seen.shape)} {str(seen.dtype).replace('torch.', '')}: "
                f"{count}/{seen.numel()} elements differ from the correct kernel; vs exact: dumped "
                f"{_describe(_ulp_errors(seen, true))}, correct kernel {_describe(_ulp_errors(good, true))}; "
                f"{toward_zero:.0%} of the differing elements are below the exact magnitude"
            )
    return notes


def _raised(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.detach().double().requires_grad_(value.requires_grad)
    if isinstance(value, list):
        return [_raised(item) for item in value]
    if isinstance(value, dict):
        return {key: _raised(item) for key, item in value.items()}
    return value


def _run_forward(function: Callable, record: dict[str, Any], tensor_dir: Path, exact: bool = False) -> list[Any]:
    args = decode(record.get("input_args", []), tensor_dir)
    kwargs = decode(record.get("input_kwargs", {}), tensor_dir)
    if exact:
        args, kwargs = _raised(args), _raised(kwargs)
    with torch.no_grad():
        output = function(*args, **kwargs)
    return list(output) if isinstance(output, (tuple, list)) else [output]


def _run_backward(
    function: Callable, forward: dict[str, Any], backward: dict[str, Any], tensor_dir: Path, exact: bool = False
) -> list[Any]:
    """The gradients msprobe records: those the autograd node producing the call's
    (first) output passes to its inputs, given the dumped incoming gradients."""
    args = decode(forward.get("input_args", []), tensor_dir)
    kwargs = decode(forward.get("input_kwargs", {}), tensor_dir)
    grads_in = decode(backward.get("input", []), tensor_dir)
    if exact:
        args, kwargs = _raised(args), _raised(kwargs)
    captured: list[Any] = []
    with torch.enable_grad():
        output = function(*args, **kwargs)
        outputs = list(output) if isinstance(output, (tuple, list)) else [output]
        first = next(t for t in outputs if isinstance(t, torch.Tensor) and t.grad_fn is not None)
        first.grad_fn.register_hook(lambda grad_inputs, grad_outputs: captured.append(list(grad_inputs)))
        pairs = [
            (o, g)
            for o, g in zip(outputs, grads_in, strict=False)
            if isinstance(o, torch.Tensor) and o.requires_grad and isinstance(g, torch.Tensor)
        ]
        torch.autograd.backward([o for o, _ in pairs], [g.to(o.dtype) for o, g in pairs])
    return captured[0]


def _downstream(outdir: Path, clean_dir: Path, data: dict[str, Any]) -> list[str]:
    """The backward records whose tensors differ from the clean dump's: where a fault
    inside a composite call shows, when msprobe records only a view at the call."""
    differ = []
    for name, record in data.items():
        if ".backward" not in name:
            continue
        for key in ("input", "output"):
            for value in record.get(key) or []:
                if isinstance(value, dict) and value.get("data_name"):
                    mine = torch.load(outdir / "dump_tensor_data" / value["data_name"], weights_only=True)
                    theirs = torch.load(clean_dir / "dump_tensor_data" / value["data_name"], weights_only=True)
                    if not torch.equal(mine, theirs):
                        differ.append(f"{name} {key}")
    return sorted(set(differ))


def verify_fault(
    outdir: Path, fault: str, clean: dict[str, Any] | None = None, clean_dir: Path | None = None
) -> list[tuple[str, list[str]]]:
    """Replay every dumped call of the faulty API with the correct kernel on its dumped
    inputs; fail unless, in the fault's direction, at least one call's dumped result
    differs. With the clean dump's data: fail unless both hold the same calls."""
    spec = model_faults.FAULTS[fault]
    function = getattr(spec.owner, spec.attr)
    with open(outdir / "dump.json") as handle:
        data = json.load(handle)["data"]
    if clean is not None and list(clean) != list(data):
        extra, missing = sorted(set(data) - set(clean)), sorted(set(clean) - set(data))
        raise SystemExit(
            f"THE FAULT DUMP HOLDS OTHER CALLS than the clean dump: extra {extra[:10]}, missing {missing[:10]}"
        )
    tensor_dir = outdir / "dump_tensor_data"
    findings = []
    for name, record in data.items():
        if not name.startswith(spec.call_prefix):
            continue
        dumped = decode(record.get("output", []), tensor_dir)
        if name.endswith(".forward"):
            correct = _run_forward(function, record, tensor_dir)
            exact = _run_forward(function, record, tensor_dir, exact=True)
        else:
            forward = data.get(name.rsplit(".", 1)[0] + ".forward")
            if forward is None:
                continue
            correct = _run_backward(function, forward, record, tensor_dir)
            exact = _run_backward(function, forward, record, tensor_dir, exact=True)
        findings.append((name, _compare(correct, dumped, exact)))
    wanted = [d for d in ("forward", "backward") if d in spec.direction]
    hits = [name for name, notes in findings if notes and name.endswith(tuple(wanted))]
    for name, notes in findings:
        print(f"  {name}: {'; '.join(notes) if notes else 'identical to the correct kernel'}")
    if not hits and "backward" in spec.direction and clean_dir is not None:
        downstream = _downstream(outdir, clean_dir, data)
        if downstream:
            print(
                f"{fault}: in the dump, downstream only ({len(downstream)} backward records differ from the clean dump's: {downstream[:6]} ...)"
            )
            return findings
    if not hits:
        raise SystemExit(
            f"FAULT NOT IN THE DUMP: no {'/'.join(wanted)} call of {spec.call_prefix}* in {outdir} differs from the correct kernel"
        )
    print(
        f"{fault}: in the dump ({len(hits)} {'/'.join(wanted)} calls of {spec.call_prefix}* differ from the correct kernel)"
    )
    return findings


def _in_subprocess(*args: str) -> None:
    """msprobe's debugger is a process-wide singleton that wraps the APIs once: one dump
    per process."""
    subprocess.run([sys.executable, str(Path(__file__).resolve()), *args], check=True)


def make_fault_dump(
    fault: str, outdir: Path, model: str | None = None, dtype: str | None = None, level: str = "L1"
) -> None:
    """The fault dump (in this process), checked: the fault is in it, and it holds the
    calls of the clean dump of the same model (made in a subprocess)."""
    model = model or FAULT_DUMPS[fault][0]
    dtype = dtype or FAULT_DUMPS[fault][1]
    with tempfile.TemporaryDirectory() as scratch:
        _in_subprocess(model, dtype, str(Path(scratch) / "clean"), "--level", level)
        with open(Path(scratch) / "clean" / "dump.json") as handle:
            clean = json.load(handle)["data"]
        make_dump(model, dtype, outdir, "tensor", fault, level)
        verify_fault(outdir, fault, clean, Path(scratch) / "clean")


# --- command line ---------------------------------------------------------------


def make_all(root: Path) -> None:
    for folder, (model, dtype, task) in SHIPPED.items():
        _in_subprocess(model, dtype, str(root / folder), "--task", task)
    for folder, (model, dtype) in SHIPPED_MIX.items():
        _in_subprocess(model, dtype, str(root / folder), "--level", "mix")
    for fault in FAULT_DUMPS:
        _in_subprocess("--fault", fault, "--fault-dump", str(root / "faults" / fault))
    for folder, fault in MIX_FAULT_DUMPS.items():
        model, dtype, _ = FAULT_DUMPS[fault]
        _in_subprocess(model, dtype, str(root / "faults" / folder), "--level", "mix", "--fault", fault)


def list_everything() -> None:
    print("models:")
    for name, spec in MODELS.items():
        print(f"  {name}: {spec.apis}")
    print("shipped dumps (under tests/dumps/models/):")
    for folder, (model, dtype, task) in SHIPPED.items():
        print(f"  {folder}: {model} {dtype} {task}")
    for folder, (model, dtype) in SHIPPED_MIX.items():
        print(f"  {folder}: {model} {dtype} tensor, level mix")
    print("faults (pytest_msprobe/testing/model_faults.py; dumps under tests/dumps/models/faults/<fault>/):")
    for fault, (model, dtype, citation) in FAULT_DUMPS.items():
        spec = model_faults.FAULTS[fault]
        print(
            f"  {fault}: {spec.call_prefix}* {'/'.join(SHORT[str(d).replace('torch.', '')] for d in spec.dtypes)} "
            f"{spec.direction}; dumped on {model} {dtype}; {citation}"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", choices=sorted(MODELS))
    parser.add_argument("dtype", nargs="?", choices=sorted(DTYPES))
    parser.add_argument("outdir", nargs="?", type=Path)
    parser.add_argument("--task", default="tensor", choices=["tensor", "statistics"])
    parser.add_argument(
        "--level", default="L1", choices=["L1", "mix"], help="msprobe's level (mix: Module.* records too)"
    )
    parser.add_argument("--fault", choices=sorted(model_faults.FAULTS))
    parser.add_argument(
        "--fault-dump",
        type=Path,
        metavar="OUTDIR",
        help="with --fault: dump the fault table's model and dtype for this fault into OUTDIR",
    )
    parser.add_argument("--all", action="store_true", help="regenerate every shipped dump under --root")
    parser.add_argument("--root", type=Path, default=HERE)
    parser.add_argument("--list", action="store_true")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        metavar="N",
        help="torch threads while dumping MODEL DTYPE OUTDIR (default 1; --all and --fault-dump subprocesses always use 1)",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.list:
        list_everything()
    elif args.all:
        make_all(args.root)
    elif args.fault and args.fault_dump:
        make_fault_dump(args.fault, args.fault_dump)
    else:
        if args.model is None or args.dtype is None or args.outdir is None:
            parser.error("MODEL DTYPE OUTDIR are required (or --all / --list)")
        if args.fault and args.task != "tensor":
            parser.error("a fault dump must be a tensor dump (its outputs are the device result)")
        if args.fault:
            make_fault_dump(args.fault, args.outdir, args.model, args.dtype, args.level)
        else:
            make_dump(args.model, args.dtype, args.outdir, args.task, level=args.level)


if __name__ == "__main__":
    main()
