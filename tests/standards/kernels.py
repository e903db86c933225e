"""Real CPU kernels, valid rewrites and planted faults for calibrating the standards.

Each case: (api, fn, make_inputs). The device runs fn on inputs in D; the bench runs the
same fn on the inputs raised (fp16/bf16 -> fp32, fp32 -> fp64), as the plugin does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

RAISE = {torch.float16: torch.float32, torch.bfloat16: torch.float32, torch.float32: torch.float64}
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _g(seed):
    return torch.Generator().manual_seed(seed)


def rn(g, *shape, scale=1.0):
    return torch.randn(*shape, generator=g) * scale


def pos(g, *shape, lo=0.1, hi=10.0):
    return torch.rand(*shape, generator=g) * (hi - lo) + lo


def _ce(x, t):
    return F.cross_entropy(x, t)


# api -> list of (fn, inputs(g)); integer inputs are not cast
CORRECT = {
    "linear": [
        (F.linear, lambda g: (rn(g, 16, 64), rn(g, 8, 64))),
        (F.linear, lambda g: (rn(g, 32, 4096), rn(g, 16, 4096), rn(g, 16))),
    ],
    "matmul": [(torch.matmul, lambda g: (rn(g, 24, 1024, scale=30), rn(g, 1024, 12)))],
    "bmm": [(torch.bmm, lambda g: (rn(g, 4, 16, 512), rn(g, 4, 512, 8)))],
    "conv1d": [(F.conv1d, lambda g: (rn(g, 2, 16, 64), rn(g, 8, 16, 3)))],
    "conv2d": [(F.conv2d, lambda g: (rn(g, 2, 8, 16, 16), rn(g, 8, 8, 3, 3)))],
    "softmax": [
        (lambda x: F.softmax(x, -1), lambda g: (rn(g, 8, 4096, scale=5),)),
        (lambda x: F.softmax(x, -1), lambda g: (rn(g, 64, 16),)),
    ],
    "log_softmax": [(lambda x: F.log_softmax(x, -1), lambda g: (rn(g, 8, 2048, scale=3),))],
    "layer_norm": [
        (
            lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b),
            lambda g: (rn(g, 16, 1024, scale=100) + 50, rn(g, 1024), rn(g, 1024)),
        )
    ],
    "cumsum": [(lambda x: torch.cumsum(x, -1), lambda g: (rn(g, 4, 2048),))],
    "sum": [(lambda x: torch.sum(x, -1), lambda g: (rn(g, 64, 4096, scale=1000),)), (torch.sum, lambda g: (rn(g, 3),))],
    "mean": [(lambda x: torch.mean(x, 0), lambda g: (rn(g, 3000, 16) + 3,))],
    "exp": [(torch.exp, lambda g: (rn(g, 4096, scale=4),))],
    "log": [(torch.log, lambda g: (pos(g, 4096, lo=1e-3, hi=1e3),))],
    "silu": [(F.silu, lambda g: (rn(g, 4096, scale=6),))],
    "gelu": [(F.gelu, lambda g: (rn(g, 4096, scale=3),))],
    "tanh": [(torch.tanh, lambda g: (rn(g, 4096, scale=2),))],
    "sigmoid": [(torch.sigmoid, lambda g: (rn(g, 4096, scale=5),))],
    "pow": [
        (lambda x: torch.pow(x, 2.5), lambda g: (pos(g, 4096),)),
        (lambda x: torch.pow(x, 3), lambda g: (rn(g, 4096, scale=20),)),
    ],
    "rsqrt": [(torch.rsqrt, lambda g: (pos(g, 4096, lo=1e-2, hi=1e4),))],
    "cross_entropy": [(_ce, lambda g: (rn(g, 64, 1000, scale=3), torch.randint(0, 1000, (64,), generator=g)))],
    "embedding": [(F.embedding, lambda g: (torch.randint(0, 100, (32,), generator=g), rn(g, 100, 64)))],
    "max_pool1d": [(lambda x: F.max_pool1d(x, 3), lambda g: (rn(g, 2, 8, 96),))],
    "mul": [(torch.mul, lambda g: (rn(g, 4096, scale=100), rn(g, 4096)))],
    "add": [(torch.add, lambda g: (rn(g, 4096, scale=1e3), rn(g, 4096)))],
    "div": [(torch.div, lambda g: (rn(g, 4096), pos(g, 4096)))],
    "__truediv__": [(lambda a, b: a / b, lambda g: (rn(g, 4096), pos(g, 4096)))],
    "where": [
        (
            lambda c, a, b: torch.where(c, a, b),
            lambda g: (torch.rand(4096, generator=g) > 0.5, rn(g, 4096), rn(g, 4096)),
        )
    ],
    "topk": [(lambda x: torch.topk(x, 10), lambda g: (rn(g, 16, 500),))],
    "sort": [(lambda x: torch.sort(x, stable=True, dim=-1), lambda g: (rn(g, 16, 300),))],
    "masked_fill": [
        (lambda x, m: x.masked_fill(m, float("-inf")), lambda g: (rn(g, 8, 64), torch.rand(8, 64, generator=g) > 0.7))
    ],
}


def cast(inputs, dtype):
    return tuple(t.to(dtype) if t.is_floating_point() else t for t in inputs)


def run_pair(fn, inputs, dtype):
    """(bench, device): device in `dtype`, bench on the same values raised."""
    dev_in = cast(inputs, dtype)
    bench_in = cast(dev_in, RAISE[dtype])
    return fn(*bench_in), fn(*dev_in)


#: APIs whose outputs are sums of products (the plugin's [terms] table): their cases
#: carry each element's terms' magnitude, as the plugin measures it for a call judged
#: error (the same function on the raised inputs' absolute values)
SUMS_OF_PRODUCTS = {"linear", "matmul", "bmm", "conv1d", "conv2d", "sum", "mean", "cumsum"}


def terms_of(fn, inputs, dtype):
    """fn on |inputs| rounded to `dtype` and raised: each output element's terms' magnitude."""
    return fn(*(t.abs() if t.is_floating_point() else t for t in cast(cast(inputs, dtype), RAISE[dtype])))


def _forward_runs(seeds):
    for api, entries in CORRECT.items():
        for k, (fn, make) in enumerate(entries):
            for dtype in DTYPES:
                for seed in seeds:
                    yield f"{api}[{k}]-{str(dtype)[6:]}-s{seed}", api, fn, make(_g(seed * 100 + k)), dtype


def correct_cases(seeds=(0, 1)):
    for name, api, fn, inputs, dtype in _forward_runs(seeds):
        yield (name, api, *run_pair(fn, inputs, dtype))


def correct_terms(seeds=(0, 1)) -> dict:
    """name -> terms' magnitude of the correct_cases whose API sums products."""
    return {
        name: terms_of(fn, inputs, dtype)
        for name, api, fn, inputs, dtype in _forward_runs(seeds)
        if api in SUMS_OF_PRODUCTS
    }


def summation_orders(seed=1):
    """The float16 and bfloat16 linear of K = 4096 with its float32 accumulation done in
    other orders, each a correct kernel: split-K over 2, 8 or 16 strided partial sums
    (threads), forward or reversed, and one term at a time. On a Xeon with AVX512-FP16,
    torch's own linear with 2 threads put one element of these 512 at 2 ULP of float16
    (an element of |b| 0.03 from terms of 2644): msprobe's single-run rule fails it on
    that machine only. Built here, the same on every CPU. -> (name, api, bench, device,
    terms)."""
    fn, make = CORRECT["linear"][1]
    x, w, b = make(_g(seed * 100 + 1))
    for dtype in (torch.float16, torch.bfloat16):
        xd, wd, bd = (t.to(dtype).float() for t in (x, w, b))
        bench = F.linear(*cast((xd, wd, bd), torch.float32))
        terms = terms_of(fn, (x, w, b), dtype)
        orders = {
            f"splitK{parts}-{way}": sum(xs[:, k::parts] @ ws[:, k::parts].T for k in range(parts))
            for parts in (2, 8, 16)
            for way, xs, ws in (("forward", xd, wd), ("reversed", xd.flip(1), wd.flip(1)))
        }
        sequential = torch.zeros(x.shape[0], w.shape[0])
        for k in range(x.shape[1]):
            sequential = sequential + xd[:, k : k + 1] * wd[:, k : k + 1].T
        orders["sequential"] = sequential
        for order, acc in orders.items():
            yield f"linear-{order}-{str(dtype)[6:]}", "linear", bench, (acc + bd).to(dtype), terms


# ----------------------------------------------------------------------- rewrites
def valid_rewrites(seed=0):
    """Valid float32 rewrites with other rounding: must pass."""
    g = _g(seed)
    x, w = rn(g, 32, 2048), rn(g, 16, 2048)
    xd, wd = x.double(), w.double()
    bench = F.linear(xd, wd)
    yield "linear-split-K", "linear", bench, x[:, :1024] @ w[:, :1024].T + x[:, 1024:] @ w[:, 1024:].T
    yield "linear-sequential", "linear", bench, torch.cumsum(x[:, None, :] * w[None], -1)[..., -1]
    s = rn(g, 64, 4096, scale=100)
    yield "sum-reversed", "sum", s.double().sum(-1), s.flip(-1).sum(-1)
    yield "sum-sequential", "sum", s.double().sum(-1), torch.cumsum(s, -1)[:, -1]
    a, b = rn(g, 4096), pos(g, 4096)
    yield "div-reciprocal", "div", a.double() / b.double(), a * (1.0 / b)
    c = torch.full((4096,), 3.0)
    yield "div3-reciprocal", "div", a.double() / 3.0, a * (1.0 / c)
    yield "benchmark-div3-reciprocal", "exp_div", a.double() / 3.0, a * (1.0 / c)
    sm = rn(g, 8, 4096, scale=5)
    e = torch.exp(sm - sm.max(-1, keepdim=True).values)
    yield "softmax-recip", "softmax", F.softmax(sm.double(), -1), e * (1.0 / e.sum(-1, keepdim=True))
    m = rn(g, 3000, 16) + 3
    yield "mean-recip", "mean", m.double().mean(0), m.sum(0) * (1.0 / 3000)


# ----------------------------------------------------------------------- faults
def round_toward_zero(exact: torch.Tensor, dtype) -> torch.Tensor:
    """exact (raised) values rounded to `dtype` toward zero instead of to nearest."""
    r = exact.to(dtype)
    over = (r.double().abs() > exact.double().abs()) & torch.isfinite(r) & (r != 0)
    ibits = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}[dtype]
    bits = r.view(ibits).clone()
    bits[over] -= 1
    return bits.view(dtype)


def lower_precision_accumulate(x, w, dtype, acc_dtype, chunk=16):
    """x @ w.T with the running sum rounded to acc_dtype every `chunk` terms."""
    acc = torch.zeros(x.shape[0], w.shape[0], dtype=acc_dtype)
    for k in range(0, x.shape[1], chunk):
        part = x[:, k : k + chunk].float() @ w[:, k : k + chunk].float().T
        acc = (acc.float() + part).to(acc_dtype)
    return acc.to(dtype)


def faults(seed=0):
    """(name, api, bench, device) of planted kernel faults: each must be an error."""
    return [case[:4] for case in faults_with_terms(seed)]


def faults_with_terms(seed=0):
    """faults() with each matrix product's terms' magnitude (linear), else None: the
    plugin judges such a call again at its terms, and a fault must fail there too.
    (A sum is judged by the benchmark standard, whose single-run rule still takes the
    terms in ULPs of D: a float16 sum accumulated in float16 passes there; single_run.py,
    "Known limits".) -> (name, api, bench, device, terms)."""
    out = []
    for dtype in DTYPES:
        first = len(out)
        dn = str(dtype)[6:]
        g = _g(seed + 7)
        m = {torch.float32: 23, torch.float16: 10, torch.bfloat16: 7}[dtype]
        x, w = rn(g, 16, 1024), rn(g, 8, 1024)
        bl, dl = run_pair(F.linear, (x, w), dtype)
        t = rn(g, 4096, scale=3)
        be, de = run_pair(torch.exp, (t,), dtype)
        bg, dg = run_pair(F.gelu, (t,), dtype)
        s = rn(g, 32, 2048, scale=10)
        bs, ds = run_pair(lambda v: v.sum(-1), (s,), dtype)
        a, b2 = rn(g, 4096), rn(g, 4096)
        bm, dm = run_pair(torch.mul, (a, b2), dtype)
        bsm, dsm = run_pair(lambda v: F.softmax(v, -1), (rn(g, 8, 512),), dtype)
        # 1 escaped NaN
        for api, bench, dev in (("linear", bl, dl), ("exp", be, de), ("mul", bm, dm), ("softmax", bsm, dsm)):
            bad = dev.clone().reshape(-1)
            bad[5] = float("nan")
            out.append((f"nan-{api}-{dn}", api, bench, bad.reshape(dev.shape)))
        # 2 approximation substituted for the exact function
        if dtype == torch.float32:
            out.append((f"approx-gelu-tanh-{dn}", "gelu", bg, F.gelu(t.to(dtype), approximate="tanh")))
        tt = t.to(dtype).float()
        out.append((f"approx-exp-{dn}", "exp", be, ((1 + tt / 1024) ** 1024).to(dtype)))
        # 3 inputs silently rounded to a lower precision
        low = torch.bfloat16 if dtype != torch.bfloat16 else torch.float8_e4m3fn
        xr, wr = x.to(dtype).to(low).to(dtype), w.to(dtype).to(low).to(dtype)
        out.append((f"lowinputs-linear-{dn}", "linear", bl, F.linear(xr, wr)))
        out.append((f"lowinputs-exp-{dn}", "exp", be, torch.exp(t.to(dtype).to(low).to(dtype))))
        # 4 reduction accumulated in a lower precision
        acc = dtype if dtype != torch.float32 else torch.bfloat16
        out.append(
            (f"lowacc-linear-{dn}", "linear", bl, lower_precision_accumulate(x.to(dtype), w.to(dtype), dtype, acc))
        )
        ones = torch.ones(1, s.shape[1])
        out.append(
            (f"lowacc-sum-{dn}", "sum", bs, lower_precision_accumulate(s.to(dtype), ones, dtype, acc).reshape(-1))
        )
        # 5 systematic bias of some tens of ulps
        for api, bench, dev in (("linear", bl, dl), ("exp", be, de), ("mul", bm, dm), ("sum", bs, ds)):
            biased = (dev.double() * (1 + 30 * 2.0**-m)).to(dtype)
            out.append((f"bias30-{api}-{dn}", api, bench, biased))
        # 6 rounding toward zero instead of to nearest (fp16/bf16: computed in fp32)
        if dtype != torch.float32:
            for api, bench in (("exp", be), ("gelu", bg), ("linear", bl), ("softmax", bsm)):
                out.append((f"rtz-{api}-{dn}", api, bench, round_toward_zero(bench, dtype)))
        # 7 one element wrong
        for api, bench, dev in (("linear", bl, dl), ("exp", be, de), ("mul", bm, dm), ("gelu", bg, dg)):
            bad = dev.clone().reshape(-1)
            mag = bench.to(dtype).double().reshape(-1).abs()
            mag[~torch.isfinite(mag)] = 0
            i = int(torch.argsort(mag)[int(0.9 * mag.numel())])  # 90th percentile
            bad[i] = bad[i] * 1.25
            out.append((f"onewrong-{api}-{dn}", api, bench, bad.reshape(dev.shape)))
        terms = {"linear": terms_of(F.linear, (x, w), dtype)}
        out[first:] = [(*case, terms.get(case[1])) for case in out[first:]]
    return out


# ----------------------------------------------------------------------- backward kernels
# Gradients are composites: autograd chains several kernels, each rounding to D, and
# often ends in a cancellation (softmax: y*(g - sum(g*y)); layer_norm: g - mean(g) -
# xhat*mean(g*xhat)). These are what the plugin compares for every *.backward call.
BACKWARD = {
    "conv1d": [(F.conv1d, lambda g: (rn(g, 4, 16, 10), rn(g, 8, 16, 3), rn(g, 8)))],
    "conv2d": [(F.conv2d, lambda g: (rn(g, 2, 8, 12, 12), rn(g, 8, 8, 3, 3)))],
    "softmax": [
        (lambda x: F.softmax(x, -1), lambda g: (rn(g, 4, 5, 5, scale=2),)),
        (lambda x: F.softmax(x, -1), lambda g: (rn(g, 8, 1024, scale=3),)),
    ],
    "log_softmax": [(lambda x: F.log_softmax(x, -1), lambda g: (rn(g, 16, 512, scale=3),))],
    "layer_norm": [
        (lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b), lambda g: (rn(g, 4, 5, 8), rn(g, 8), rn(g, 8))),
        (
            lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b),
            lambda g: (rn(g, 32, 256, scale=10) + 5, rn(g, 256), rn(g, 256)),
        ),
    ],
    "rsqrt": [
        (torch.rsqrt, lambda g: (pos(g, 4, 1, lo=1.0, hi=50.0),)),
        (torch.rsqrt, lambda g: (pos(g, 4096, lo=1e-2, hi=1e3),)),
    ],
    "embedding": [
        (lambda i, w: F.embedding(i, w), lambda g: (torch.randint(0, 50, (4, 64), generator=g), rn(g, 50, 16)))
    ],
    "linear": [(F.linear, lambda g: (rn(g, 64, 256), rn(g, 32, 256), rn(g, 32)))],
    "matmul": [(torch.matmul, lambda g: (rn(g, 8, 64, 128), rn(g, 128, 32)))],
    "silu": [(F.silu, lambda g: (rn(g, 4096, scale=4),))],
    "gelu": [(F.gelu, lambda g: (rn(g, 4096, scale=3),))],
    "cross_entropy": [(_ce, lambda g: (rn(g, 32, 100, scale=3), torch.randint(0, 100, (32,), generator=g)))],
    "mean": [(lambda x: torch.mean(x, -1), lambda g: (rn(g, 64, 512),))],
    "cumsum": [(lambda x: torch.cumsum(x, -1), lambda g: (rn(g, 8, 1024),))],
    "where": [
        (
            lambda c, a, b: torch.where(c, a * b, a),
            lambda g: (torch.rand(4096, generator=g) > 0.5, rn(g, 4096), rn(g, 4096)),
        )
    ],
    "mul": [(torch.mul, lambda g: (rn(g, 4096, scale=10), rn(g, 4096)))],
    "div": [(torch.div, lambda g: (rn(g, 4096), pos(g, 4096)))],
}


def grad_pair(fn, inputs, grad_seed, dtype):
    """(bench grads, device grads) of fn's float inputs for one random grad_output.

    The device differentiates in `dtype` with grad_output in `dtype`; the bench runs
    autograd on the same values raised, as the plugin replays a backward call.
    """

    def grads(xs):
        xs = tuple(t.detach().requires_grad_(True) if t.is_floating_point() else t for t in xs)
        out = fn(*xs)
        g = torch.randn(out.shape, generator=_g(grad_seed)).to(out.dtype)
        if g_dtype[0] is not None:
            g = g.to(g_dtype[0]).to(out.dtype)
        return torch.autograd.grad(out, [t for t in xs if t.is_floating_point()], g)

    g_dtype = [dtype]  # grad_output is a D tensor on both sides
    dev_in = cast(inputs, dtype)
    return grads(cast(dev_in, RAISE[dtype])), grads(dev_in)


def backward_cases(seeds=(0, 1)):
    for api, entries in BACKWARD.items():
        for k, (fn, make) in enumerate(entries):
            for dtype in DTYPES:
                for seed in seeds:
                    bench, device = grad_pair(fn, make(_g(seed * 100 + k + 50)), seed + 7, dtype)
                    yield f"{api}[{k}].backward-{str(dtype)[6:]}-s{seed}", api, bench, device
