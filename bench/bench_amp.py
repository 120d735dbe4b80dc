"""Mixed precision against float32: the seed's BasicBlock and Llama attention (kiln.bench's
workloads), forward and forward+backward, compiled by kiln.jit in float32 and under
kiln.amp.auto_mixed_precision(model, "O2", bfloat16); and PyTorch eager in float32 and under
torch.autocast("cpu", torch.bfloat16) where torch imports (run it with the peers' Python:
/work/peers-venv/bin/python). Prints ms per call (the median of the timed calls, variants
interleaved) and amp / float32 (issue 31's target on a CPU without bf16 arithmetic: <= 1.1).
Where oneDNN has bf16 arithmetic, amp runs both ways in the same run: on oneDNN's bf16 primitives
(convolutions) and on the fp32-compute fallback (kiln._C.amp_native_allow(False)); and a probe
times bfloat16 and float32 convolutions of the BasicBlock's shape alone (GFLOP/s) against the bf16
GEMM peak (torch.mm of bfloat16 2048 x 2048 matrices, where torch imports).

    PYTHONPATH=python python3 bench/bench_amp.py [--size smallest|default|full] [--calls N]
"""
import argparse
import statistics
import time

import numpy as np

import kiln
from kiln import config
from kiln.bench.workloads import SIZES, make_workloads


def kiln_call(model, backward, low):
    """A jitted call of the workload's model (value_and_grad over its parameters when backward),
    in float32 or, with low, at amp O2 in bfloat16."""
    net = kiln.amp.auto_mixed_precision(model, "O2", kiln.bfloat16) if low else model
    if not backward:
        return kiln.jit(lambda *a: net(*a))
    return kiln.jit(kiln.value_and_grad(lambda *a: net(*a), None, model.trainable_params()))


def fallback(fn):
    """fn with oneDNN's bf16 primitives forbidden while it runs: the fp32-compute fallback."""
    def run(*args):
        prev = kiln._C.amp_native_allow(False)
        try:
            return fn(*args)
        finally:
            kiln._C.amp_native_allow(prev)
    return run


def gflops(flop, ms):
    return flop / ms * 1e-6


def conv_probe(size, torch, calls):
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
    ms = timed(variants, None, calls)
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


def timed(variants, args, calls):
    """{name: median ms per call}, the variants' calls interleaved (each sees the same load)."""
    times = {name: [] for name in variants}
    for name, (fn, a) in variants.items():
        fn(*a)  # compile / warm up
    for _ in range(calls):
        for name, (fn, a) in variants.items():
            start = time.perf_counter()
            fn(*a)
            times[name].append((time.perf_counter() - start) * 1e3)
    return {name: statistics.median(t) for name, t in times.items()}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="default", choices=sorted(SIZES))
    p.add_argument("--calls", type=int, default=5)
    p.add_argument("--only", choices=("conv", "attention", "probe"), help="one group of rows (default: all)")
    args = p.parse_args()
    size = SIZES[args.size]
    try:
        import torch
    except ImportError:
        torch = None
    print(f"kiln {kiln.__version__}; {config.amp_kernel_path()[1]}")
    print(f"sizes: {size.name} ({size.note}); median of {args.calls} calls per variant, interleaved"
          + ("" if torch else "; torch not importable: no torch rows"))
    print(f"{'workload':<34} {'variant':<24} {'ms':>9} {'amp/fp32':>9}")
    if args.only in (None, "probe"):
        conv_probe(size, torch, args.calls)
    for group in ("conv", "attention"):
        if args.only not in (None, group):
            continue
        plain = make_workloads(size, only=group, runs=1)
        low = make_workloads(size, only=group, runs=1)  # the same weights: amp sets BatchNorm to_float
        for w, wl in zip(plain, low):
            inputs = w.args0
            variants = {"kiln jit float32": (kiln_call(w.model, w.backward, False), inputs),
                        "kiln jit amp O2 bf16": (kiln_call(wl.model, wl.backward, True), inputs)}
            if config.amp_kernel_path()[0] == "bf16":  # the same compiled amp function on the fallback
                variants["kiln amp bf16 fallback"] = (fallback(variants["kiln jit amp O2 bf16"][0]), inputs)
            if torch is not None:
                targs = tuple(torch.from_numpy(a) for a in w.numpy_args()[0])
                variants["torch float32"] = (torch_call(torch, w, False), targs)
                variants["torch autocast bf16"] = (torch_call(torch, w, True), targs)
            ms = timed(variants, inputs, args.calls)
            for name, t in ms.items():
                base = ms["torch float32" if name.startswith("torch") else "kiln jit float32"]
                ratio = f"{t / base:9.2f}" if "bf16" in name else ""
                print(f"{w.title:<34.34} {name:<24} {t:9.2f} {ratio:>9}")
            if "kiln amp bf16 fallback" in ms:
                print(f"{'':<34} {'bf16 primitives / fallback':<24} {'':>9} "
                      f"{ms['kiln jit amp O2 bf16'] / ms['kiln amp bf16 fallback']:9.2f}")
            if "torch autocast bf16" in ms:
                print(f"{'':<34} {'kiln amp / torch autocast':<24} {'':>9} "
                      f"{ms['kiln jit amp O2 bf16'] / ms['torch autocast bf16']:9.2f}")


if __name__ == "__main__":
    main()
