"""What a CUDA device's own settings and kernels do to accuracy, measured against float64.

Run on a machine with a GPU (tools/cuda_check.sh runs it first); each measurement
prints one line, and one that fails says why and the rest go on. These are the causes
behind the verdicts studies/verdicts-on-a-cuda-gpu.md records for correct GPU kernels: TF32 (torch's
default for cuDNN convolutions and RNNs), cuDNN's RNN kernels, the fused attention
kernels' exp, batch_norm's statistics, bfloat16 GEMM epilogues.

    python studies/cuda_kernels.py [--dump-dir tests/dumps/models]
"""

from __future__ import annotations

import argparse
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

BACKENDS = torch.backends
# torch.backends attributes (some newer than others: an absent one says so)
SETTINGS = [
    "cuda.matmul.allow_tf32",
    "cudnn.allow_tf32",
    "cudnn.conv.fp32_precision",
    "cudnn.rnn.fp32_precision",
    "cuda.matmul.allow_fp16_reduced_precision_reduction",
    "cuda.matmul.allow_bf16_reduced_precision_reduction",
]
ULP32 = 2.0**-23


def _relative(result: torch.Tensor, exact: torch.Tensor) -> str:
    error = (result.detach().double().cpu() - exact).abs() / exact.abs().clamp_min(1e-30)
    return f"max_rel {error.max():.3g} mean_rel {error.mean():.3g}"


def _read(path: str) -> object:
    value: object = BACKENDS
    for part in path.split("."):
        value = getattr(value, part, "absent in this torch")
    return value


def settings(_: Path) -> None:
    for path in SETTINGS:
        print(f"  torch.backends.{path} = {_read(path)}")
    print(
        f"  float32_matmul_precision {torch.get_float32_matmul_precision()}, cpu capability {BACKENDS.cpu.get_cpu_capability()}"
    )
    print(
        f"  device {torch.cuda.get_device_name()} capability {torch.cuda.get_device_capability()}, torch {torch.__version__}"
    )


def tf32_linear(_: Path) -> None:
    """TF32 keeps float16's 10 mantissa bits: it costs nothing on float16 inputs."""
    g = torch.Generator().manual_seed(0)
    for label, cast in (("float16-valued", lambda t: t.half().float()), ("float32", lambda t: t)):
        x, w = cast(torch.randn(512, 1024, generator=g)), cast(torch.randn(1024, 1024, generator=g))
        exact, scale = F.linear(x.double(), w.double()), F.linear(x.double().abs(), w.double().abs())
        for tf32 in (False, True):
            BACKENDS.cuda.matmul.allow_tf32 = tf32
            error = ((F.linear(x.cuda(), w.cuda()).cpu().double() - exact).abs() / scale).max()
            print(f"  linear on {label} inputs, allow_tf32={tf32}: max error at the terms' scale {float(error):.3g}")
    BACKENDS.cuda.matmul.allow_tf32 = False


def rnn(_: Path) -> None:
    """cuDNN's float32 RNNs under torch's default (TF32) and with TF32 off."""
    torch.manual_seed(0)
    for cls in (torch.nn.LSTM, torch.nn.GRU):
        module = cls(8, 16, num_layers=2, batch_first=True).double()
        x = torch.randn(2, 6, 8, dtype=torch.double)
        exact = module(x)[0]
        cpu = module.float()(x.float())[0]
        for tf32 in (True, False):
            BACKENDS.cudnn.allow_tf32 = tf32
            print(f"  {cls.__name__} cudnn.allow_tf32={tf32}: {_relative(module.cuda()(x.float().cuda())[0], exact)}")
            module.cpu()
        print(f"  {cls.__name__} on the CPU: {_relative(cpu, exact)}")
    BACKENDS.cudnn.allow_tf32 = True


def batch_norm(_: Path) -> None:
    """Each channel's mean relative error in float32 ULPs: the shift its statistics make."""
    torch.manual_seed(0)
    x, w, b = torch.randn(2, 4, 16, 16), torch.rand(4) + 0.5, torch.randn(4)
    exact = F.batch_norm(x.double(), None, None, w.double(), b.double(), training=True)

    def shifts(y: torch.Tensor) -> list[float]:
        return [round(v, 2) for v in ((y.double().cpu() - exact) / (exact.abs() * ULP32)).mean(dim=(0, 2, 3)).tolist()]

    for cudnn in (True, False):
        BACKENDS.cudnn.enabled = cudnn
        print(f"  cuda, cudnn={cudnn}: {shifts(F.batch_norm(x.cuda(), None, None, w.cuda(), b.cuda(), training=True))}")
    BACKENDS.cudnn.enabled = True
    print(f"  cpu: {shifts(F.batch_norm(x, None, None, w, b, training=True))}")


def attention(_: Path) -> None:
    """The mean signed relative error in float32 ULPs of each float32 attention backend."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 32, 4) for _ in range(3))
    exact = F.scaled_dot_product_attention(q.double(), k.double(), v.double())

    def bias(y: torch.Tensor) -> str:
        signed = (y.double().cpu() - exact) / (exact.abs() * ULP32)
        return f"mean {float(signed.mean()):+.3f} median {float(signed.median()):+.3f} ULP, {_relative(y, exact)}"

    for backend in (SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH):
        with sdpa_kernel(backend):
            print(f"  cuda {backend.name}: {bias(F.scaled_dot_product_attention(q.cuda(), k.cuda(), v.cuda()))}")
    print(f"  cpu: {bias(F.scaled_dot_product_attention(q, k, v))}")


def bfloat16_addmm(dumps: Path) -> None:
    """The apizoo dump's bfloat16 addmm: elements over 1 ULP of the float32 bench."""
    data = dumps / "apizoo_tensor_bf16" / "dump_tensor_data"
    bias, m1, m2 = (torch.load(data / f"Torch.addmm.0.forward.input.{i}.pt", weights_only=True) for i in range(3))
    bench = torch.addmm(bias.float(), m1.float(), m2.float())
    spacing = torch.ldexp(torch.ones_like(bench), torch.frexp(bench).exponent - 8)

    def over(y: torch.Tensor) -> str:
        ulps = (y.float().cpu() - bench).abs() / spacing
        return f"{int((ulps > 1).sum())} of {ulps.numel()} over 1 ULP, max {float(ulps.max()):.2f}"

    for reduced in (True, False):
        BACKENDS.cuda.matmul.allow_bf16_reduced_precision_reduction = reduced
        print(f"  cuda, reduced-precision reduction {reduced}: {over(torch.addmm(bias.cuda(), m1.cuda(), m2.cuda()))}")
    print(f"  cpu: {over(torch.addmm(bias, m1, m2))}")


MEASUREMENTS: list[Callable[[Path], None]] = [settings, tf32_linear, rnn, batch_norm, attention, bfloat16_addmm]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--dump-dir", type=Path, default=Path(__file__).resolve().parent.parent / "tests" / "dumps" / "models"
    )
    options = parser.parse_args()
    for measure in MEASUREMENTS:
        print(f"{measure.__name__}:")
        try:
            measure(options.dump_dir)
        except Exception:  # noqa: BLE001 - one measurement's failure (a backend this torch lacks) is printed; the rest run
            traceback.print_exc(limit=2)


if __name__ == "__main__":
    main()
