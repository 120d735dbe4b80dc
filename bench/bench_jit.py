"""kiln.jit benchmark: each figure is printed as a ratio against a reference measured in the same
run (the PyTorch row only when PyTorch is installed).

    PYTHONPATH=python python3 bench/bench_jit.py [--quick]

Targets (issue 3), on the workloads of the MindSpore tutorial (kiln.models):
- a jitted a*b+c on 2x3 float32 takes <= 1.0 us per call, and <= 0.3x torch.jit.trace's per-call time;
- time to prepare: the first call of a jitted BasicBlock forward <= 1.2x one eager forward, compared
  like for like (first call against first call in fresh processes; fresh jit against warm eager);
- BasicBlock (128 channels, 1x128x256x256; --quick 1x128x64x64) forward+backward through
  kiln.value_and_grad(block, None, block.trainable_params()): jitted <= 1.0x eager time per call,
  and the jitted step's peak memory <= 0.8x eager's measured peak.
The block runs in its default mode (training=False, as a MindSpore Cell starts).
"""
import argparse
import json
import os
import subprocess
import sys
import time
import warnings

import numpy as np

import kiln
from timing import best_time, row
from kiln import models


def import_torch():
    """PyTorch, or None when it is not installed (its row is skipped). Imported only by the
    parent process: the fresh processes timing the first call should load kiln alone."""
    try:
        import torch
    except ImportError:
        return None
    return torch


def per_call(f, a, b, c, n, repeat=5):
    """Best seconds per call of f(a, b, c) in a plain loop."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(n):
            f(a, b, c)
        best = min(best, (time.perf_counter() - t0) / n)
    return best


def bench_overhead(quick):
    rng = np.random.default_rng(0)
    a, b, c = (kiln.Tensor(rng.standard_normal((2, 3)).astype(np.float32)) for _ in range(3))
    jf = kiln.jit(models.simple_function)
    assert np.array_equal(jf(a, b, c).asnumpy(), models.simple_function(a, b, c).asnumpy())
    n = 20000 if quick else 200000
    t = per_call(jf, a, b, c, n) * 1e6
    # the tutorial's pattern: 1000 different inputs, one call each
    inputs = [tuple(kiln.Tensor(rng.standard_normal((2, 3)).astype(np.float32)) for _ in range(3))
              for _ in range(1000)]
    t1000 = best_time(lambda: [jf(*abc) for abc in inputs], 5 if quick else 20) * 1e3
    te = per_call(models.simple_function, a, b, c, n) * 1e6
    results = [row("jit a*b+c 2x3 float32, per call", t, "us/call", "target 1.0 us", 1.0, t / 1.0, 1.0)]
    print(f"{'  (eager per call; 1000 inputs once each)':<46} {te:10.3f} us/call, jit {t1000:.3f} ms / 1000 calls")
    torch = import_torch()
    if torch is not None:
        ta, tb, tc = (torch.randn(2, 3) for _ in range(3))
        with warnings.catch_warnings():  # recent PyTorch deprecates torch.jit.trace
            warnings.simplefilter("ignore")
            traced = torch.jit.trace(models.simple_function, (ta, tb, tc))
        for _ in range(10):  # torch.jit optimizes the graph over the first calls
            traced(ta, tb, tc)
        tt = per_call(traced, ta, tb, tc, n) * 1e6
        results.append(row("jit a*b+c vs torch.jit.trace", t, "us/call", "torch.jit.trace", tt, t / tt, 0.3))
    return results


def block_size(quick):
    return 64 if quick else 256


def block_label(quick):
    return f"1x128x{block_size(quick)}x{block_size(quick)}"


def block_and_input(quick, seed=0):
    kiln.manual_seed(seed)
    block = models.BasicBlock(128)
    size = block_size(quick)
    x = kiln.Tensor(np.random.default_rng(seed).standard_normal((1, 128, size, size)).astype(np.float32))
    return block, x, block_label(quick)


def _prepare_child(mode, quick):
    """In a fresh process: the first call's time of a jitted (mode 'jit') or eager forward, then
    the best time of a warm eager forward."""
    block, x, _ = block_and_input(quick)
    t0 = time.perf_counter()
    (kiln.jit(block) if mode == "jit" else block)(x)
    first = time.perf_counter() - t0
    block(x)
    warm = best_time(lambda: block(x), 3 if quick else 5)
    fresh_jit = float("inf")  # a new JitFunction in this warm process: tracing and compiling alone
    for _ in range(3):
        t0 = time.perf_counter()
        kiln.jit(block)(x)
        fresh_jit = min(fresh_jit, time.perf_counter() - t0)
    print(json.dumps({"first": first, "warm": warm, "fresh_jit": fresh_jit}))


def _run_child(mode, quick):
    cmd = [sys.executable, os.path.abspath(__file__), "--prepare-child", mode] + (["--quick"] if quick else [])
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def bench_prepare(quick):
    """Time to prepare, as the tutorial measures it: the first call in a fresh process (which
    also makes the kernels' oneDNN primitives for these shapes)."""
    label = block_label(quick)
    runs = 3  # fresh processes each; the best of them, as for every other timing
    j = min((_run_child("jit", quick) for _ in range(runs)), key=lambda r: r["first"] / r["warm"])
    e = min((_run_child("eager", quick) for _ in range(runs)), key=lambda r: r["first"] / r["warm"])
    # like for like: a first call against a first call (both make this process's kernels and
    # primitives), and a fresh jit against a warm eager call in an already warm process
    results = [row(f"BasicBlock {label} fwd prepare, fresh process", j["first"] * 1e3, "ms",
                   "1st eager fwd, fresh process", e["first"] * 1e3, j["first"] / e["first"], 1.2),
               row(f"BasicBlock {label} fwd prepare, warm process", j["fresh_jit"] * 1e3, "ms",
                   "eager fwd (warm)", j["warm"] * 1e3, j["fresh_jit"] / j["warm"], 1.2)]
    print(f"{'  (1st jit call, fresh process, vs a warm eager fwd)':<46} ratio {j['first'] / j['warm']:.3f}; "
          f"a 1st eager call is {e['first'] / e['warm']:.3f} of a warm one")
    return results


def _tensor_bytes(obj):
    if isinstance(obj, (tuple, list)):
        return sum(_tensor_bytes(o) for o in obj)
    return obj.size * obj.dtype.itemsize


def _measured_peak(fn, held=0):
    """Bytes of kiln memory in use at the peak of fn(), above what was in use before it (plus
    `held`: memory reserved before the call for it, such as a compiled graph's arena)."""
    kiln._C.reset_peak_memory()
    base = kiln._C.memory_stats()[0]
    out = fn()
    peak = kiln._C.memory_stats()[1]
    del out
    return peak - base + held


def bench_block_step(quick):
    block, x, label = block_and_input(quick, seed=1)
    weights = block.trainable_params()
    step_e = kiln.value_and_grad(block, None, weights)
    jblock = kiln.jit(block)
    step_j = kiln.value_and_grad(jblock, None, weights)
    # same results first
    (ve, ge), (vj, gj) = step_e(x), step_j(x)
    assert np.array_equal(ve.asnumpy(), vj.asnumpy()) and all(
        np.array_equal(a.asnumpy(), b.asnumpy()) for a, b in zip(ge, gj)), "jitted step differs from eager"
    del ve, ge, vj, gj
    rep = 6 if quick else 4
    xs = [x * ((i + 1) / rep) for i in range(rep)]  # the tutorial's x * (i / n)
    it_e, it_j = iter(xs * 2), iter(xs * 2)
    step_e(xs[0]), step_j(xs[0])
    te = tj = float("inf")
    for _ in range(rep):  # alternating, so both see the same machine load
        te = min(te, best_time(lambda: step_e(next(it_e)), 1))
        tj = min(tj, best_time(lambda: step_j(next(it_j)), 1))
    results = [row(f"BasicBlock {label} fwd+bwd, jit vs eager", tj * 1e3, "ms", "eager", te * 1e3, tj / te, 1.0)]

    exe = jblock._grad_variant(None, weights, False).executable(x)
    planned = exe.arena_bytes + exe.output_bytes
    peak_e = _measured_peak(lambda: step_e(x))
    peak_j = _measured_peak(lambda: step_j(x), held=exe.arena_bytes)
    mib = 1 << 20
    results.append(row(f"BasicBlock {label} fwd+bwd planned peak", planned / mib, "MiB", "eager measured peak",
                       peak_e / mib, planned / peak_e, 0.8))
    results.append(row(f"BasicBlock {label} fwd+bwd measured peak", peak_j / mib, "MiB", "eager measured peak",
                       peak_e / mib, peak_j / peak_e, 0.8))
    print(f"{'  (arena; outputs; input; parameters)':<46} {exe.arena_bytes / mib:.1f} MiB; "
          f"{exe.output_bytes / mib:.1f} MiB; {_tensor_bytes(x) / mib:.1f} MiB; {_tensor_bytes(weights) / mib:.1f} MiB")
    return results


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smaller BasicBlock input and fewer repeats")
    p.add_argument("--prepare-child", choices=("jit", "eager"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.prepare_child:
        _prepare_child(args.prepare_child, args.quick)
        return 0
    torch = import_torch()
    print(f"kiln {kiln.__version__}, {kiln.get_num_threads()} threads"
          + (f", PyTorch {torch.__version__} ({torch.get_num_threads()} threads)" if torch else ", no PyTorch"))
    results = []
    for bench in (bench_overhead, bench_prepare, bench_block_step):
        results += bench(args.quick)
    missed = results.count(False)
    print(f"{len(results) - missed} of {len(results)} targets met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
