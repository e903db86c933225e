"""Torch's own reduced-precision defects that the real-model dumps show
(studies/real_models.py, studies/verdicts-on-real-models.md), reproduced without the plugin: the
kernel against float64, beside the same kernel given what the defect takes away. The
plugin calls these calls errors, and is right to; judge/defects/table.py's rows name these
functions and label such calls. (judge/defects/explored_reproducers.py holds the float32 findings of
--msprobe-explore.)

    python -m pytest_msprobe.judge.defects.reproduce torch-cpu-scalar-rounded

- add and subtract of a Python float in bfloat16/float16 (GPT-2's tanh-gelu written out,
  `0.79788456 + x`-style terms): torch's CPU kernel wraps the scalar as a 0-dim tensor of
  the tensor's dtype, so the scalar is rounded to bfloat16/float16 before the float32
  operation (0.79788456 becomes 0.796875 in bfloat16): every result carries the scalar's
  rounding, up to half an ULP of the scalar, and results near 0 (x near -s) are off by
  many of their own ULPs. mul and div keep the scalar in float32 (correctly rounded).

- batch_norm in bfloat16/float16 with weight and bias in that dtype (a model cast with
  `.to(torch.bfloat16)`, as timm's and torchvision's CNNs are) keeps the saved mean and
  inverse standard deviation in bfloat16/float16 and normalises with the rounded ones:
  where the mean is large against the spread, x - mean loses the spread's digits. With
  float32 weight and bias (autocast's choice) the statistics stay float32 and the output
  carries only its own rounding.
- layer_norm's weight and bias gradients in bfloat16/float16 (one thread) are summed over
  the rows in the reduced dtype: the error grows with the number of rows (a gradient's
  sum over a batch of tokens), far beyond one rounding of the float32 sum.
- cross_entropy's gradient in bfloat16/float16 is exp(log_softmax) - one_hot with the
  log_softmax it saved rounded to the dtype: a log-probability near -5 carries an absolute
  error of up to 2**-6 (bfloat16), so each probability is off by up to 1.6%, several ULPs
  of the gradient, where computing the gradient in float32 and rounding it once is off by
  half an ULP; the errors of a row share a sign (whole rows shift by 1-2 ULPs), so the
  plugin's bias test fails the call single-run (transformers' BART and BERT losses take
  the model's bfloat16/float16 logits as they are; its causal-LM loss upcasts them first).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

REDUCED = (torch.bfloat16, torch.float16)


def _relative(found: torch.Tensor, exact: torch.Tensor) -> float:
    """The worst error, relative to the largest exact value (the output's scale)."""
    return float((found.detach().double() - exact).abs().max() / exact.abs().max())


def batch_norm_statistics(dtype: torch.dtype, shift: float, weight_dtype: torch.dtype) -> dict[str, float]:
    """batch_norm (training, batch statistics) on 4x8x8x8 values of mean `shift` and
    spread 1: the relative error of the output, the input gradient and the weight gradient."""
    generator = torch.Generator().manual_seed(0)
    x = (torch.randn(4, 8, 8, 8, generator=generator) + shift).to(dtype)
    grad = torch.randn(4, 8, 8, 8, generator=generator).to(dtype)
    results = {}
    for kind in ("kernel", "exact"):
        wide = kind == "exact"
        inputs = x.double() if wide else x.clone()
        weight = torch.ones(8, dtype=torch.float64 if wide else weight_dtype)
        bias = torch.zeros(8, dtype=weight.dtype)
        for tensor in (inputs, weight, bias):
            tensor.requires_grad_()
        out = F.batch_norm(inputs, None, None, weight, bias, training=True)
        out.backward(grad.double() if wide else grad)
        results[kind] = (out.detach(), inputs.grad, weight.grad)
    kernel, exact = results["kernel"], results["exact"]
    return {
        name: _relative(found, wide)
        for name, found, wide in zip(("output", "input grad", "weight grad"), kernel, exact, strict=True)
    }


def _saved_statistics(dtype: torch.dtype, weight_dtype: torch.dtype) -> tuple[torch.dtype, float]:
    """The dtype of the saved inverse std and its worst relative error against float64."""
    x = (torch.randn(2, 64, 8, 8, generator=torch.Generator().manual_seed(1)) * 3 + 5).to(dtype)
    weight, bias = torch.ones(64, dtype=weight_dtype), torch.zeros(64, dtype=weight_dtype)
    _, _, invstd = torch.native_batch_norm(x, weight, bias, None, None, True, 0.1, 1e-5)
    exact = (x.double().var((0, 2, 3), unbiased=False) + 1e-5).rsqrt()
    return invstd.dtype, float(((invstd.double() - exact) / exact).abs().max())


def batch_norm_reduced() -> None:
    print("batch_norm, training: worst error relative to the largest exact value (float64)")
    for dtype in REDUCED:
        for weight_dtype in (dtype, torch.float32):
            saved, error = _saved_statistics(dtype, weight_dtype)
            print(f"  {dtype}, weights in {weight_dtype}: saved invstd {saved}, off by {error:.2%}")
        for shift in (0.0, 4.0, 16.0):
            reduced = batch_norm_statistics(dtype, shift, dtype)
            wide = batch_norm_statistics(dtype, shift, torch.float32)
            cells = ", ".join(f"{name} {reduced[name]:.3g} (float32 weights {wide[name]:.3g})" for name in reduced)
            print(f"    mean {shift:4.0f}, spread 1: {cells}")
        print(f"    (one rounding to {dtype}: {torch.finfo(dtype).eps / 2:.3g})")


def layer_norm_affine_grad(dtype: torch.dtype, rows: int) -> tuple[float, float, float]:
    """layer_norm over 32 features of `rows` rows, one thread: the relative error of the
    weight and bias gradients, and of the float32 sum of the same gradients rounded once."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(rows, 32, generator=generator).to(dtype)
    grad = (torch.randn(rows, 32, generator=generator) + 0.5).to(dtype)
    weight = (1 + 0.1 * torch.randn(32, generator=generator)).to(dtype).requires_grad_()
    bias = torch.zeros(32, dtype=dtype).requires_grad_()
    F.layer_norm(x, (32,), weight, bias).backward(grad)
    wide_weight = weight.detach().double().requires_grad_()
    wide_bias = bias.detach().double().requires_grad_()
    F.layer_norm(x.double(), (32,), wide_weight, wide_bias).backward(grad.double())
    assert (
        wide_weight.grad is not None
        and wide_bias.grad is not None
        and weight.grad is not None
        and bias.grad is not None
    )
    rounded_once = grad.float().sum(0).to(dtype)
    return (
        _relative(weight.grad, wide_weight.grad),
        _relative(bias.grad, wide_bias.grad),
        _relative(rounded_once, wide_bias.grad),
    )


def layer_norm_reduced() -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        print("layer_norm weight/bias gradients, one thread: worst error relative to the largest exact value (float64)")
        for dtype in REDUCED:
            for rows in (64, 512, 4096):
                weight, bias, once = layer_norm_affine_grad(dtype, rows)
                print(
                    f"  {dtype}, {rows:5} rows: weight grad {weight:.3g}, bias grad {bias:.3g}; the float32 sum rounded once {once:.3g}"
                )
    finally:
        torch.set_num_threads(threads)


def cross_entropy_grad(dtype: torch.dtype, spread: float, seed: int) -> tuple[float, float, float, float]:
    """cross_entropy (mean over 8 rows of 128 classes) of logits with standard deviation
    `spread`: the worst element's error and the worst row's mean signed error of the input
    gradient, in ULPs of each element (of the smallest normal number below it), for
    torch's kernel and for the float32 gradient rounded once."""
    generator = torch.Generator().manual_seed(seed)
    logits = (torch.randn(8, 128, generator=generator) * spread).to(dtype)
    target = torch.randint(0, 128, (8,), generator=generator)
    grads = {}
    for wide in (logits.double(), logits.float(), logits.clone()):
        wide.requires_grad_()
        F.cross_entropy(wide, target).backward()
        grads[wide.dtype] = wide.grad
    exact = grads[torch.float64]
    info = torch.finfo(dtype)
    kernel, once = (
        (found.double() - exact) / (info.eps * exact.abs().clamp_min(info.tiny))
        for found in (grads[dtype], grads[torch.float32].to(dtype))
    )
    return (
        float(kernel.abs().max()),
        float(kernel.mean(1).abs().max()),
        float(once.abs().max()),
        float(once.mean(1).abs().max()),
    )


def cross_entropy_reduced() -> None:
    print("cross_entropy input gradient, 8 rows of 128 classes: error in ULPs of each element against float64")
    for dtype in REDUCED:
        for spread in (0.1, 1.0):
            for seed in (0, 1):
                worst, row, once_worst, once_row = cross_entropy_grad(dtype, spread, seed)
                print(
                    f"  {dtype}, logits of spread {spread}, seed {seed}: torch worst {worst:.2f}, worst row mean {row:.2f}; "
                    f"float32 rounded once worst {once_worst:.2f}, worst row mean {once_row:.2f}"
                )


def scalar_rounded() -> None:
    """x + s, s + x, x - s, s - x and x * s in bfloat16/float16 against float64 rounded
    once, beside the same operation given the scalar rounded to the dtype."""
    x = torch.randn(4096, generator=torch.Generator().manual_seed(0)) * 0.05
    scalar = 0.79788456
    operations = {
        "x + s": lambda a, s: a + s,
        "s + x": lambda a, s: s + a,
        "x - s": lambda a, s: a - s,
        "s - x": lambda a, s: s - a,
        "x * s": lambda a, s: a * s,
    }
    print(
        f"Python scalar s = {scalar} with a tensor x of 4096 values near 0: elements off the exact result rounded once"
    )
    for dtype in REDUCED:
        rounded = float(torch.tensor(scalar, dtype=dtype))
        tensor = x.to(dtype)
        for label, operation in operations.items():
            kernel = operation(tensor, scalar)
            exact = operation(tensor.double(), scalar).to(dtype)
            by_rounded = operation(tensor.double(), rounded).to(dtype)
            print(
                f"  {dtype}, {label}: {int((kernel != exact).sum())} off the exact, "
                f"{int((kernel != by_rounded).sum())} off the result with s rounded to {rounded!r}; "
                f"worst relative error {_relative(kernel, operation(tensor.double(), scalar)):.3g}"
            )


#: every reproducer here, in the order --all runs them
REPRODUCERS = (scalar_rounded, batch_norm_reduced, layer_norm_reduced, cross_entropy_reduced)
