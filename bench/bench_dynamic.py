"""Dynamic shapes (issue 16): one compiled graph for many input shapes, against graphs compiled for
each exact shape, measured in the same run.

    PYTHONPATH=python python3 bench/bench_dynamic.py [--quick]

- LlamaAttention (hidden 512, 8 heads, 2 KV heads) forward at O1, called with 20 different sequence
  lengths between 64 and 512: one kiln.jit in its default (automatic) mode against 20 kiln.jit(...,
  dynamic=False) compiled one per length. For the dynamic function each length's time is its first
  call that did not compile, which includes making the length's instance (rebinding, optimizing and
  planning the recorded graph; its generated kernels come from the compiler's cache); for the exact
  ones it is the first call of the graph compiled for that length (its warm call is printed too,
  for information). Targets: at most 2 compiles; total at most 1.1x. Then, for information, a new
  length's first call (its instance made: the recording made symbolic, optimized and planned once,
  each instance that plan bound to the length's sizes) against a warm exact-shape call, and the same
  with each instance instantiated and planned per length (kiln.jit.dynamic.planned_instances off) and
  with instances made by rebinding and optimizing per length (kiln.jit.dynamic.symbolic_instances
  off), in the same run.
- The seed's simple function a*b+c on 50 different float32 shapes (2..11 x 2..6; the seed's (2, 3)
  first, then the others in a fixed shuffled order whose first differs from it in both sizes): one
  kiln.jit (automatic mode) against 50 exact-shape ones, 200 calls per shape in alternating batches,
  served by the C fast path (the dynamic entry's instance per binding). Targets: at most 2 compiles;
  per call at most 1.2x. The one-time cost of making each binding's instance is printed beside it.
  The same again with capture_mode="bytecode" on both sides (a dynamic piece, each binding's
  instance served by the C fast path too; a fresh code object per round, since bytecode entries are
  kept with the code object and shared by wrappers whose options agree), same targets.
A round measures everything once; each length's or shape's time is the best of the rounds (noise
only adds time), and the totals add those up.
"""
import argparse
import random
import sys
import time
import types

import numpy as np

import kiln
from kiln import models
from kiln.jit import dynamic
from timing import row


def attention_round(att, lengths, inputs, once=True, planned=True):
    """Per length, the dynamic function's time, the exact-shape graph's first and warm call times
    (lists), and the dynamic function's cache_info. once: instances from the recording optimized
    once (else rebound and optimized per length); planned: and planned once (else planned per length)."""
    dynamic.symbolic_instances = once
    dynamic.planned_instances = planned
    dyn = kiln.jit(att, jit_level="O1")
    dyn_times, exact_times, warm_times = [], [], []
    for s in lengths:
        x, pos = inputs[s]
        compiles = dyn.cache_info().compiles
        t0 = time.perf_counter()
        dyn(x, pos)
        t = time.perf_counter() - t0
        if dyn.cache_info().compiles != compiles:  # the call compiled: time the length's next call
            t0 = time.perf_counter()
            dyn(x, pos)
            t = time.perf_counter() - t0
        dyn_times.append(t)
        exact = kiln.jit(att, jit_level="O1", dynamic=False)
        exact(x, pos)  # compiles
        t0 = time.perf_counter()
        exact(x, pos)  # the graph compiled for this length, called once
        exact_times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        exact(x, pos)  # and again, warm
        warm_times.append(time.perf_counter() - t0)
    dynamic.symbolic_instances = dynamic.planned_instances = True
    return dyn_times, exact_times, warm_times, dyn.cache_info()


def per_call(fn, args, calls):
    t0 = time.perf_counter()
    for _ in range(calls):
        fn(*args)
    return (time.perf_counter() - t0) / calls


def simple_round(shapes, calls, chunks=5, capture_mode="ast"):
    """Per shape, `chunks` alternating batches of calls/chunks calls to each function; a shape's
    per-call time is its best batch. Returns the mean over the shapes for each, and the time of
    the dynamic function's first calls that made an instance."""
    rng = np.random.default_rng(1)
    fn = models.simple_function
    if capture_mode == "bytecode":  # a code object of this round's own (entries are kept with it)
        fn = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__)
    dyn = kiln.jit(fn, capture_mode=capture_mode)
    dyn_time = exact_time = make_time = 0.0
    for shape in shapes:
        args = tuple(kiln.Tensor(rng.standard_normal(shape).astype(np.float32)) for _ in range(3))
        compiles = dyn.cache_info().compiles
        t0 = time.perf_counter()
        dyn(*args)
        if dyn.cache_info().compiles == compiles:
            make_time += time.perf_counter() - t0
        exact = kiln.jit(fn, dynamic=False, capture_mode=capture_mode)
        exact(*args)
        exact(*args)
        d = e = float("inf")
        for _ in range(chunks):
            d = min(d, per_call(dyn, args, calls // chunks))
            e = min(e, per_call(exact, args, calls // chunks))
        dyn_time += d
        exact_time += e
    return dyn_time / len(shapes), exact_time / len(shapes), make_time, dyn.cache_info()


def compiles(what, info, detail):
    """Prints the compile count against its target (at most 2); returns whether it is met."""
    ok = info.compiles <= 2
    print(f"{what}: {info.compiles} compiles, {info.instances} instances ({detail}); target <= 2 compiles: "
          f"{'ok' if ok else 'MISSED'}")
    return ok


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    args = parser.parse_args()
    rounds = 2 if args.quick else 3
    ok = True

    rng = np.random.default_rng(0)
    kiln.manual_seed(0)
    att = models.LlamaAttention(512, 8, 2)
    lengths = [int(s) for s in np.linspace(64, 512, 20).round()]
    inputs = {s: (kiln.Tensor(rng.standard_normal((1, s, 512)).astype(np.float32)),
                  kiln.Tensor(np.arange(s, dtype=np.int64).reshape(1, s))) for s in lengths}
    best = [[float("inf")] * len(lengths) for _ in range(3)]
    rebound = [float("inf")] * len(lengths)
    replanned = [float("inf")] * len(lengths)
    making = [float("inf")] * 3  # per mode, the least time making one instance took (mean over a round)
    for _ in range(rounds):  # each round a new dynamic function: its instances are made again
        *times, info = attention_round(att, lengths, inputs)
        best = [[min(a, b) for a, b in zip(old, new)] for old, new in zip(best, times)]
        replanned_times, *_, replanned_info = attention_round(att, lengths, inputs, planned=False)
        replanned = [min(a, b) for a, b in zip(replanned, replanned_times)]
        rebound_times, *_, rebound_info = attention_round(att, lengths, inputs, once=False)
        rebound = [min(a, b) for a, b in zip(rebound, rebound_times)]
        making = [min(m, i.instance_seconds / max(i.instances, 1)) for m, i in
                  zip(making, (info, replanned_info, rebound_info))]
    best_dyn, best_exact, best_warm = (sum(b) for b in best)
    ok &= compiles(f"LlamaAttention O1, {len(lengths)} sequence lengths {lengths[0]}..{lengths[-1]}", info,
                   "one per length after the compiles")
    ok &= row("attention, 20 lengths, dynamic (total)", best_dyn * 1e3, "ms", "exact-shape graphs",
              best_exact * 1e3, best_dyn / best_exact, 1.1)
    print(f"  (information: the exact graphs' second, warm calls total {best_warm * 1e3:.1f} ms, ratio "
          f"{best_dyn / best_warm:.3f}; making the instances took {info.instance_seconds * 1e3:.1f} ms of the dynamic "
          "total in the last round)")
    made = [k for k in range(len(lengths)) if k >= 2]  # the first two lengths compile (automatic mode)
    first_once = sum(best[0][k] for k in made) / len(made)
    first_rebound = sum(rebound[k] for k in made) / len(made)
    first_replanned = sum(replanned[k] for k in made) / len(made)
    warm = sum(best[2][k] for k in made) / len(made)
    print(f"attention, a new length's first call (mean of {len(made)}): optimized and planned once "
          f"{first_once * 1e3:.2f} ms, optimized once and planned per length {first_replanned * 1e3:.2f} ms, "
          f"rebound and optimized per length {first_rebound * 1e3:.2f} ms, warm exact-shape call {warm * 1e3:.2f} ms; "
          f"ratios to the warm call {first_once / warm:.3f}, {first_replanned / warm:.3f} and {first_rebound / warm:.3f} "
          "(information)")
    print(f"attention, making one instance (best round's mean): planned once {making[0] * 1e6:.0f} us, planned per length "
          f"{making[1] * 1e6:.0f} us, rebound and optimized per length {making[2] * 1e6:.0f} us; ratios "
          f"{making[1] / making[0]:.2f} and {making[2] / making[0]:.2f} (information)")

    shapes = [(r, c) for r in range(2, 12) for c in range(2, 7) if (r, c) != (2, 3)]
    random.Random(0).shuffle(shapes)
    shapes = [(2, 3)] + shapes  # the seed's shape first, then the others in a fixed shuffled order
    calls = 100 if args.quick else 200
    best_dyn = best_exact = float("inf")
    for _ in range(rounds):
        dyn_call, exact_call, make_time, info = simple_round(shapes, calls)
        best_dyn, best_exact = min(best_dyn, dyn_call), min(best_exact, exact_call)
    ok &= compiles(f"a*b+c, {len(shapes)} shapes", info,
                   f"first calls that made them: {make_time / max(info.instances, 1) * 1e6:.0f} us each")
    ok &= row("a*b+c, 50 shapes, dynamic (per call)", best_dyn * 1e6, "us", "exact-shape graphs",
              best_exact * 1e6, best_dyn / best_exact, 1.2)

    best_dyn = best_exact = float("inf")
    for _ in range(rounds):
        dyn_call, exact_call, make_time, info = simple_round(shapes, calls, capture_mode="bytecode")
        best_dyn, best_exact = min(best_dyn, dyn_call), min(best_exact, exact_call)
    ok &= compiles(f"a*b+c bytecode capture, {len(shapes)} shapes", info,
                   f"first calls that made them: {make_time / max(info.instances, 1) * 1e6:.0f} us each")
    ok &= row("a*b+c bytecode, 50 shapes, dynamic (per call)", best_dyn * 1e6, "us", "exact-shape graphs",
              best_exact * 1e6, best_dyn / best_exact, 1.2)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
