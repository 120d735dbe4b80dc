"""Mixed precision against float32: the seed's BasicBlock and Llama attention (kiln.bench's
workloads), forward and forward+backward, compiled by kiln.jit in float32 and under
kiln.amp.auto_mixed_precision(model, "O2", bfloat16); and PyTorch eager in float32 and under
torch.autocast("cpu", torch.bfloat16) where torch imports (run it with the peers' Python:
/work/peers-venv/bin/python). Prints ms per call (the median of the timed calls, variants
interleaved) and amp / float32 (issue 31's target on a CPU without bf16 arithmetic: <= 1.1).

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
    for group in ("conv", "attention"):
        plain = make_workloads(size, only=group, runs=1)
        low = make_workloads(size, only=group, runs=1)  # the same weights: amp sets BatchNorm to_float
        for w, wl in zip(plain, low):
            inputs = w.args0
            variants = {"kiln jit float32": (kiln_call(w.model, w.backward, False), inputs),
                        "kiln jit amp O2 bf16": (kiln_call(wl.model, wl.backward, True), inputs)}
            if torch is not None:
                targs = tuple(torch.from_numpy(a) for a in w.numpy_args()[0])
                variants["torch float32"] = (torch_call(torch, w, False), targs)
                variants["torch autocast bf16"] = (torch_call(torch, w, True), targs)
            ms = timed(variants, inputs, args.calls)
            for name, t in ms.items():
                base = ms["torch float32" if name.startswith("torch") else "kiln jit float32"]
                ratio = f"{t / base:9.2f}" if "bf16" in name else ""
                print(f"{w.title:<34.34} {name:<24} {t:9.2f} {ratio:>9}")
            if "torch autocast bf16" in ms:
                print(f"{'':<34} {'kiln amp / torch autocast':<24} {'':>9} "
                      f"{ms['kiln jit amp O2 bf16'] / ms['torch autocast bf16']:9.2f}")


if __name__ == "__main__":
    main()
