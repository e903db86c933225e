"""Real msprobe tensor dumps of one training step of model code from the libraries users
train with, for studies/real_models.py: Hugging Face transformers (decoders, an
encoder, encoder-decoders; attention `eager` and `sdpa`) and timm CNNs.

Run with the Python that has torch, mindstudio-probe, transformers and timm (msprobe's
own venv; timm installed with `pip install --no-deps timm`):

    python tools/make_real_model_dumps.py OUT_ROOT [--levels L1 mix] [--dtypes float32 ...] [--models llama_sdpa resnet ...]

Every model is built from a config object, small and randomly initialised (no hub
download), and trained for one step (forward, the model's own loss, backward) in
training mode, so dropout runs as users run it. One process per msprobe level (the
debugger wraps the APIs once per process and reads its config once); inside it every
(model, dtype) is one msprobe step, rewritten to the portable layout of the shared maker
(../shared/tools/make_dump_torch.py): OUT_ROOT/<model>_<level>_tensor_<dtype>/dump.json,
dump_tensor_data/*.pt, construct.json, dump_data_dir a foreign path. Seeds are fixed and
torch runs with one thread. The default set: 14 models at level L1 in 3 dtypes and two
(llama_sdpa, resnet) at level mix in float32, 44 dumps, about 120 MB.

timm imports torchvision at import time (a FrozenBatchNorm2d, dataset and transform
classes), and torchvision's wheels here are CUDA builds: this process answers every
`torchvision.*` import with a stand-in whose names raise when used. None of the models
below uses them (their code is timm's own: the stand-in only lets `import timm` finish).
"""

from __future__ import annotations

import argparse
import glob
import importlib.abc
import importlib.machinery
import json
import os
import shutil
import subprocess
import sys
import tempfile
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

FOREIGN_DIR = "/home/user/msprobe_dump/step0/rank0/dump_tensor_data"
SEED = 1234
BATCH, SEQ, VOCAB, IMAGE = 2, 8, 128, 32
SHORT = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


class _Absent(type):
    """A torchvision name that is not there: any attribute is another stand-in, a call raises."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Absent(name, (), {})

    def __call__(cls, *args: object, **kwargs: object) -> Any:
        raise RuntimeError(f"torchvision is not installed: {cls.__name__} is the dump maker's stand-in")


class _AbsentModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Absent(name, (), {})


class _TorchvisionStandIn(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: object, target: object = None) -> importlib.machinery.ModuleSpec | None:
        if fullname == "torchvision" or fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _AbsentModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def _timm() -> Any:
    try:
        import torchvision  # noqa: F401
    except ImportError:
        sys.meta_path.insert(0, _TorchvisionStandIn())
    import timm

    return timm


# --- models: name -> (builder, family) ------------------------------------------------


def _hf(config_name: str, model_name: str, attention: str, **config: Any) -> Callable[[], torch.nn.Module]:
    def build() -> torch.nn.Module:
        import transformers

        cfg = getattr(transformers, config_name)(attn_implementation=attention, **config)
        return getattr(transformers, model_name)(cfg)

    return build


def _decoder(vocab: int, hidden: int, layers: int, positions: int) -> dict[str, int]:
    """A Llama-style decoder's config (Llama, Qwen2, Mistral name these alike): MLP
    2 x hidden, a head per 8 of hidden, two query heads per key/value head."""
    return dict(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 8,
        num_key_value_heads=hidden // 16,
        max_position_embeddings=positions,
    )


_DECODER = _decoder(VOCAB, 32, 2, 64)
_TINY_DECODER = _decoder(32, 16, 1, 16)  # the CI dump (tests/dumps/real/): one block, hidden 16
_BERT = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=64,
)
_GPT2 = dict(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=0, eos_token_id=0)
_T5 = dict(
    vocab_size=VOCAB,
    d_model=32,
    d_kv=8,
    d_ff=64,
    num_layers=1,
    num_decoder_layers=1,
    num_heads=4,
    decoder_start_token_id=0,
)
_BART = dict(
    vocab_size=VOCAB,
    d_model=32,
    encoder_layers=1,
    decoder_layers=1,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=64,
    decoder_ffn_dim=64,
    max_position_embeddings=64,
)


def _timm_model(name: str, channels_last: bool = False, **kwargs: Any) -> Callable[[], torch.nn.Module]:
    def build() -> torch.nn.Module:
        model = _timm().create_model(name, pretrained=False, num_classes=5, **kwargs)
        return model.to(memory_format=torch.channels_last) if channels_last else model

    return build


@dataclass(frozen=True)
class Model:
    build: Callable[[], torch.nn.Module]
    family: str  # causal (labels = ids), masked, seq2seq, image
    channels_last: bool = False
    vocab: int = VOCAB


MODELS: dict[str, Model] = {
    "llama_sdpa": Model(_hf("LlamaConfig", "LlamaForCausalLM", "sdpa", **_DECODER), "causal"),
    "llama_tiny_sdpa": Model(_hf("LlamaConfig", "LlamaForCausalLM", "sdpa", **_TINY_DECODER), "causal", vocab=32),
    "llama_eager": Model(_hf("LlamaConfig", "LlamaForCausalLM", "eager", **_DECODER), "causal"),
    "qwen2_sdpa": Model(_hf("Qwen2Config", "Qwen2ForCausalLM", "sdpa", **_DECODER), "causal"),
    "mistral_eager": Model(_hf("MistralConfig", "MistralForCausalLM", "eager", **_DECODER), "causal"),
    "gpt2_eager": Model(_hf("GPT2Config", "GPT2LMHeadModel", "eager", **_GPT2), "causal"),
    "gpt2_sdpa": Model(_hf("GPT2Config", "GPT2LMHeadModel", "sdpa", **_GPT2), "causal"),
    "bert_sdpa": Model(_hf("BertConfig", "BertForMaskedLM", "sdpa", **_BERT), "masked"),
    "bert_eager": Model(_hf("BertConfig", "BertForMaskedLM", "eager", **_BERT), "masked"),
    "t5_eager": Model(_hf("T5Config", "T5ForConditionalGeneration", "eager", **_T5), "seq2seq"),
    "bart_sdpa": Model(_hf("BartConfig", "BartForConditionalGeneration", "sdpa", **_BART), "seq2seq"),
    # timm: ResNet's stem max-pools 3x3 with stride 2 (overlapping windows), batch_norm, relu(inplace)
    "resnet": Model(_timm_model("resnet18", layers=(1, 1, 1, 1), channels=(8, 16, 32, 64), stem_width=8), "image"),
    # ConvNeXt as timm's train.py --channels-last runs it: depthwise conv, LayerNorm2d, 1x1 conv MLP with gelu
    "convnext_cl": Model(_timm_model("convnext_atto", True, depths=(1, 1, 1, 1), dims=(8, 16, 32, 64)), "image", True),
    # MobileNetV3: hardswish, hardsigmoid squeeze-excitation, relu
    "mobilenetv3": Model(_timm_model("mobilenetv3_small_050"), "image"),
    # timm's own tiny EfficientNet: SiLU, squeeze-excitation (sigmoid gate), batch_norm
    "efficientnet": Model(_timm_model("test_efficientnet"), "image"),
}
DEFAULT_L1 = [name for name in MODELS if name not in ("llama_tiny_sdpa",)]
DEFAULT_DTYPES = ("float32", "bfloat16", "float16")
# level mix adds the Module.* entries (not collected) around the same API calls: two models
# in float32 suffice
DEFAULT_MIX = ("llama_sdpa", "resnet")


def _inputs(spec: Model, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """One batch, made before the dump starts, as a data loader makes it."""
    if spec.family == "image":
        images = torch.randn(BATCH, 3, IMAGE, IMAGE, dtype=dtype)
        if spec.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        return {"images": images, "labels": torch.randint(0, 5, (BATCH,))}
    ids = torch.randint(1, spec.vocab, (BATCH, SEQ))
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    mask[1, -2:] = 0  # a padded sample: the attention masks it
    if spec.family == "causal":
        labels = ids.masked_fill(mask == 0, -100)
    elif spec.family == "masked":
        labels = torch.full((BATCH, SEQ), -100)
        labels[:, 1::3] = ids[:, 1::3]
    else:
        labels = torch.randint(1, spec.vocab, (BATCH, SEQ // 2))
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def _loss(model: torch.nn.Module, spec: Model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """One training step's loss, as the library's own training code computes it."""
    if spec.family == "image":
        return torch.nn.functional.cross_entropy(model(batch["images"]).float(), batch["labels"])
    return model(**batch).loss


def _portable(raw_step: Path, out: Path) -> int:
    """Move one msprobe step folder to OUT's portable layout; return its entry count."""
    src = Path(glob.glob(str(raw_step / "*" / "dump.json"))[0]).parent
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    dump = json.loads((src / "dump.json").read_text(encoding="utf-8"))
    dump["dump_data_dir"] = FOREIGN_DIR
    (out / "dump.json").write_text(json.dumps(dump, indent=1), encoding="utf-8")
    (src / "dump_tensor_data").rename(out / "dump_tensor_data")
    (src / "construct.json").rename(out / "construct.json")
    return len(dump["data"])


def dump_level(out_root: Path, level: str, jobs: list[tuple[str, str]]) -> None:
    """Dump every (model, dtype) of jobs as one msprobe step each, in this process."""
    from msprobe.pytorch import PrecisionDebugger, seed_all

    torch.set_num_threads(1)
    out_root.mkdir(parents=True, exist_ok=True)
    raw = Path(
        tempfile.mkdtemp(prefix=f".msprobe-{level}-", dir=out_root)
    )  # beside the dumps: their files are moved, not copied
    config = {
        "task": "tensor",
        "dump_path": str(raw),
        "rank": [],
        "step": [],
        "level": level,
        "tensor": {"scope": [], "list": [], "data_mode": ["all"], "file_format": "pt"},
    }
    (raw / "config.json").write_text(json.dumps(config), encoding="utf-8")
    debugger = PrecisionDebugger(config_path=str(raw / "config.json"))
    for step, (name, dtype_name) in enumerate(jobs):
        spec = MODELS[name]
        seed_all(SEED)
        model = spec.build().to(getattr(torch, dtype_name)).train()
        batch = _inputs(spec, getattr(torch, dtype_name))
        debugger.start(model=model if level != "L1" else None)
        _loss(model, spec, batch).backward()
        debugger.stop()
        debugger.step()
        out = out_root / f"{name}_{level}_tensor_{SHORT[dtype_name]}"
        print(out, _portable(raw / f"step{step}", out), "entries", flush=True)
    shutil.rmtree(raw)


def jobs_for(models: list[str], dtypes: list[str]) -> list[tuple[str, str]]:
    return [(model, dtype) for model in models for dtype in dtypes]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_root", type=Path)
    parser.add_argument("--levels", nargs="+", default=["L1", "mix"], choices=["L1", "mix"])
    parser.add_argument(
        "--models",
        nargs="+",
        default=DEFAULT_L1,
        choices=list(MODELS),
        help="L1 models (default: all but the CI dump's)",
    )
    parser.add_argument(
        "--mix-models", nargs="+", default=list(DEFAULT_MIX), choices=list(MODELS), help="level mix models"
    )
    parser.add_argument(
        "--dtypes", nargs="+", default=list(DEFAULT_DTYPES), choices=list(DEFAULT_DTYPES), help="L1 dtypes"
    )
    parser.add_argument(
        "--mix-dtypes", nargs="+", default=["float32"], choices=list(DEFAULT_DTYPES), help="level mix dtypes"
    )
    parser.add_argument("--worker", choices=["L1", "mix"], help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        if args.worker == "L1":
            dump_level(args.out_root, "L1", jobs_for(args.models, args.dtypes))
        else:
            dump_level(args.out_root, "mix", jobs_for(args.mix_models, args.mix_dtypes))
        return 0
    common = [
        "--models",
        *args.models,
        "--mix-models",
        *args.mix_models,
        "--dtypes",
        *args.dtypes,
        "--mix-dtypes",
        *args.mix_dtypes,
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    workers = [
        subprocess.Popen([sys.executable, __file__, str(args.out_root), "--worker", level, *common], env=env)
        for level in args.levels
    ]
    return max(worker.wait() for worker in workers)


if __name__ == "__main__":
    sys.exit(main())
