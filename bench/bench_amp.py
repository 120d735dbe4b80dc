"""Mixed precision against float32: the seed's BasicBlock and Llama attention (kiln.bench's
workloads), forward and forward+backward, compiled by kiln.jit (at --jit-level, O1 unless told: both
rows at one level) in float32 and under kiln.amp.auto_mixed_precision(model, "O2", bfloat16); and PyTorch eager in float32 and under
torch.autocast("cpu", torch.bfloat16) where torch imports (run it with the peers' Python:
/work/peers-venv/bin/python). Prints ms per call (the median of the timed calls, or with --stat min their
minimum, the figure a loaded machine disturbs least; variants
interleaved) and amp / float32 (issue 31's target on a CPU without bf16 arithmetic: <= 1.1).
Where oneDNN has bfloat16 arithmetic it first prints the bfloat16 GEMM peak (oneDNN's bf16 matmul at
2048^2, kiln.bench.sgemm.bf16_peak) and kiln's bfloat16 linear / matmul at the attention workload's
projection shapes (forward and both gradient products) on the hardware path and on the fp32-compute
fallback (kiln._C.gemm_bf16_force), as GFLOP/s and as a fraction of that peak, next to float32; the
module rows then run with the path kiln chose (python -m kiln says which; KILN_BF16_GEMM=onednn or
fallback forces one). The module rows run amp both ways in the same run, on oneDNN's bf16
primitives and on the fp32-compute fallback; and a probe times bfloat16 and float32 convolutions of
the BasicBlock's shape alone (GFLOP/s) against the bf16 GEMM peak (torch.mm of bfloat16 2048 x 2048
matrices, where torch imports).

    PYTHONPATH=python python3 bench/bench_amp.py [--size smallest|default|full] [--calls N] [--jit-level O0|O1|O2]

Why O1: amp's graph work is O1's -- common-subexpression elimination makes the forward and the
backward share one cast of each input and weight (at O0 the graph runs as recorded: the attention
input is cast once per projection), and the fusions take the casts next to elementwise chains --
and kiln.bench's amp rows time O1 too. The float32 row it is compared with runs at the same level.
"""
import argparse
import statistics
import time

import numpy as np

import kiln
from kiln import config
from kiln import ops
from kiln.bench import sgemm
from kiln.bench.workloads import SIZES, make_workloads


def kiln_call(model, backward, low, jit_level="O1"):
    """A jitted call (kiln.jit at jit_level) of the workload's model (value_and_grad over its
    parameters when backward), in float32 or, with low, at amp O2 in bfloat16."""
    net = kiln.amp.auto_mixed_precision(model, "O2", kiln.bfloat16) if low else model
    if not backward:
        return kiln.jit(lambda *a: net(*a), jit_level=jit_level)
    return kiln.jit(kiln.value_and_grad(lambda *a: net(*a), None, model.trainable_params()), jit_level=jit_level)


def on_path(fn, hardware):
    """fn with the bfloat16 path forced while it runs: oneDNN's bf16 primitives (products and
    convolutions) or the fp32-compute fallback."""
    def run(*args):
        kiln._C.gemm_bf16_force(1 if hardware else 0)
        try:
            return fn(*args)
        finally:
            kiln._C.gemm_bf16_force(-1)
    return run


def gflops(flop, ms):
    return flop / ms * 1e-6


def conv_probe(size, torch, calls, stat="median"):
    """The BasicBlock's 3x3 convolution alone, eager, in bfloat16 and float32: forward, and
    forward + both gradients (value_and_grad: three convolutions); GFLOP/s, and the bf16 GEMM peak."""
    c, hw = size.conv_channels, size.conv_hw
    rng = np.random.default_rng(0)
    x = kiln.Tensor(rng.standard_normal((1, c, hw, hw)).astype(np.float32))
    w = kiln.Tensor((rng.standard_normal((c, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32))
    flop = 2.0 * c * c * 9 * hw * hw
    fwd = lambda a, b: kiln.ops.conv2d(a, b, padding=1)  # noqa: E731
    grad = kiln.value_and_grad(lambda a, b: kiln.ops.conv2d(a, b, padding=1).astype(kiln.float32).sum(), (0, 1))
    b16 = (x.astype(kiln.bfloat16), w.astype(kiln.bfloat16))
    variants = {"conv fwd float32": (fwd, (x, w)), "conv fwd bf16": (fwd, b16),
                "conv fwd+bwd float32": (grad, (x, w)), "conv fwd+bwd bf16": (grad, b16)}
    if config.amp_kernel_path()[0] == "bf16":
        variants["conv fwd bf16 fallback"] = (fallback(fwd), b16)
        variants["conv fwd+bwd bf16 fallback"] = (fallback(grad), b16)
    peak = None
    if torch is not None:
        n = 2048
        a = torch.randn(n, n).to(torch.bfloat16)
        variants["torch.mm bf16 2048"] = (lambda p, q: torch.mm(p, q), (a, a))
        variants["torch.mm float32 2048"] = (lambda p, q: torch.mm(p, q), (a.float(), a.float()))
    ms = timed(variants, None, calls, stat)
    if torch is not None:
        peak = gflops(2.0 * 2048 ** 3, ms["torch.mm bf16 2048"])
    print(f"convolution probe: 1x{c}x{hw}x{hw}, 3x3, {c} -> {c} channels ({flop * 1e-9:.1f} GFLOP each)")
    for name, t in ms.items():
        f = 2.0 * 2048 ** 3 if name.startswith("torch") else flop * (3 if "bwd" in name else 1)
        g = gflops(f, t)
        print(f"  {name:<28} {t:9.2f} ms {g:8.1f} GFLOP/s" + (f"  {g / peak:5.2f} of the bf16 GEMM peak" if peak else ""))


def torch_call(torch, workload, low):
    from kiln.bench.peers import _torch_model, _torch_name

    model = _torch_model(torch, workload)
    params = dict(model.named_parameters())
    weights = [params[_torch_name(n)] for n in workload.param_names()]

    def call(*args):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=low):
            out = model(*args)
        if not workload.backward:
            return out
        return out, torch.autograd.grad(out, weights, torch.ones_like(out))

    return call


def timed(variants, args, calls, stat="median"):
    """{name: median (or min) ms per call}, the variants' calls interleaved (each sees the same load)."""
    times = {name: [] for name in variants}
    for name, (fn, a) in variants.items():
        fn(*a)  # compile / warm up
    for _ in range(calls):
        for name, (fn, a) in variants.items():
            start = time.perf_counter()
            fn(*a)
            times[name].append((time.perf_counter() - start) * 1e3)
    pick = min if stat == "min" else statistics.median
    return {name: pick(t) for name, t in times.items()}


def best_ms(fn, calls):
    fn()
    best = float("inf")
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def gemm_rows(size, calls):
    """kiln's bfloat16 products at the attention workload's projection shapes, on both paths and in
    float32, against the bfloat16 GEMM peak measured here first."""
    peak = sgemm.bf16_peak(2048)
    fp32_peak = sgemm.best_peak(2048)[0]
    if peak is None:
        print("bf16 GEMM peak: none (oneDNN's instruction set has no bfloat16 arithmetic here)")
        return
    print(f"bf16 GEMM peak: oneDNN bfloat16 matmul 2048^3 on {kiln.get_num_threads()} threads: {peak:.1f} GFLOP/s; "
          f"sgemm peak {fp32_peak:.1f} GFLOP/s (bf16 / fp32 peak {peak / fp32_peak:.2f})")
    h, s = size.attn_hidden, size.attn_seq
    kv = size.attn_kv_heads * (h // size.attn_heads)
    rng = np.random.default_rng(0)

    def tensor(*shape):
        return kiln.Tensor(rng.standard_normal(shape).astype(np.float32))

    shapes = []
    for out in sorted({h, kv}, reverse=True):
        x, w, g = tensor(s, h), tensor(out, h), tensor(s, out)
        shapes += [(f"linear {s}x{h} -> {out}", lambda x, w, g: ops.dense(x, w), (x, w, g), 2 * s * h * out),
                   (f"grad x {s}x{out} @ {out}x{h}", lambda x, w, g: ops.matmul(g, w), (x, w, g), 2 * s * h * out),
                   (f"grad w {out}x{s} @ {s}x{h}", lambda x, w, g: ops.matmul(g.T, x), (x, w, g), 2 * s * h * out)]
    print(f"{'product (attention shapes)':<34} {'variant':<24} {'ms':>9} {'GFLOP/s':>9} {'of bf16 peak':>12}")
    for title, fn, args, flops in shapes:
        low = tuple(a.astype(kiln.bfloat16) for a in args)
        rows = {"float32": best_ms(lambda: fn(*args), calls)}
        for name, how in (("bf16 oneDNN", 1), ("bf16 fp32 fallback", 0)):
            kiln._C.gemm_bf16_force(how)
            try:
                rows[name] = best_ms(lambda: fn(*low), calls)
            finally:
                kiln._C.gemm_bf16_force(-1)
        for name, ms in rows.items():
            rate = flops / ms / 1e6
            print(f"{title:<34} {name:<24} {ms:9.2f} {rate:9.1f} {rate / peak:12.2f}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="default", choices=sorted(SIZES))
    p.add_argument("--calls", type=int, default=5)
    p.add_argument("--jit-level", default="O1", choices=("O0", "O1", "O2"),
                   help="kiln.jit's level of the float32 and amp rows alike (default O1, see above)")
    p.add_argument("--no-gemm", action="store_true", help="skip the bfloat16 GEMM rows")
    p.add_argument("--stat", default="median", choices=("median", "min"),
                   help="per variant: the median of its timed calls (default) or their minimum")
    p.add_argument("--only", choices=("conv", "attention", "probe"), help="one group of rows (default: all)")
    args = p.parse_args()
    size = SIZES[args.size]
    try:
        import torch
    except ImportError:
        torch = None
    print(f"kiln {kiln.__version__}; {config.amp_kernel_path()[1]}")
    print(f"sizes: {size.name} ({size.note}); kiln.jit at {args.jit_level}; {args.stat} of {args.calls} calls per variant, "
          "interleaved"
          + ("" if torch else "; torch not importable: no torch rows"))
    if not args.no_gemm:
        gemm_rows(size, args.calls)
    print(f"{'workload':<34} {'variant':<24} {'ms':>9} {'amp/fp32':>9}")
    if args.only in (None, "probe"):
        conv_probe(size, torch, args.calls, args.stat)
    for group in ("conv", "attention"):
        if args.only not in (None, group):
            continue
        plain = make_workloads(size, only=group, runs=1)
        low = make_workloads(size, only=group, runs=1)  # the same weights: amp sets BatchNorm to_float
        for w, wl in zip(plain, low):
            inputs = w.args0
            variants = {"kiln jit float32": (kiln_call(w.model, w.backward, False, args.jit_level), inputs),
                        "kiln jit amp O2 bf16": (kiln_call(wl.model, wl.backward, True, args.jit_level), inputs)}
            if kiln._C.gemm_bf16_info()["hardware"]:  # the same compiled amp function on each path
                variants["kiln amp bf16 hardware"] = (on_path(variants["kiln jit amp O2 bf16"][0], True), inputs)
                variants["kiln amp bf16 fallback"] = (on_path(variants["kiln jit amp O2 bf16"][0], False), inputs)
            if torch is not None:
                targs = tuple(torch.from_numpy(a) for a in w.numpy_args()[0])
                variants["torch float32"] = (torch_call(torch, w, False), targs)
                variants["torch autocast bf16"] = (torch_call(torch, w, True), targs)
            ms = timed(variants, inputs, args.calls, args.stat)
            for name, t in ms.items():
                base = ms["torch float32" if name.startswith("torch") else "kiln jit float32"]
                ratio = f"{t / base:9.2f}" if "bf16" in name else ""
                print(f"{w.title:<34.34} {name:<24} {t:9.2f} {ratio:>9}")
            if "kiln amp bf16 fallback" in ms:
                print(f"{'':<34} {'bf16 primitives / fallback':<24} {'':>9} "
                      f"{ms['kiln amp bf16 hardware'] / ms['kiln amp bf16 fallback']:9.2f}")
            if "torch autocast bf16" in ms:
                print(f"{'':<34} {'kiln amp / torch autocast':<24} {'':>9} "
                      f"{ms['kiln jit amp O2 bf16'] / ms['torch autocast bf16']:9.2f}")


if __name__ == "__main__":
    main()
