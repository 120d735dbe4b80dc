"""Per-op timing of two ways of running one kiln.bench workload, and whether they compile the same
plan: what a SLOWER mark of `python -m kiln.bench` is checked with (issue 17: identical plans and
per-op times mean the mark was the machine's load, not kiln).

    PYTHONPATH=python python3 bench/compare_variants.py SIZE WORKLOAD A B [--runs N]

SIZE: full, default or smallest; WORKLOAD: simple, conv-fwd, conv-fwdbwd, attention-fwd,
attention-fwdbwd; A, B: "eager" or capture_mode,jit_level,backend,fullgraph,infer_boost, e.g.
trace,O1,kbk,false,on. Each variant is built and called once, its calls timed N times, then run N
times under kiln.profiler; the table gives each op's calls and self time per call of both.
"""
import argparse
import sys
import time

import numpy as np

import kiln
from kiln import profiler
from kiln.bench.workloads import SIZES, JitVariant, make_workloads


def parse_variant(text):
    if text == "eager":
        return None
    try:
        capture, level, backend, fullgraph, boost = text.split(",")
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected eager or capture,level,backend,fullgraph,infer_boost: {text!r}")
    return JitVariant(capture, level, backend, fullgraph == "true", boost)


def build(wl, variant):
    """(callable of the workload, the jitted function whose plan it runs or None)."""
    weights = wl.model.trainable_params() if wl.backward else None
    if variant is None:
        return (kiln.value_and_grad(wl.model, None, weights) if wl.backward else wl.model), None
    jf = kiln.jit(wl.model, **variant.kwargs())
    if not wl.backward:
        return jf, jf
    return kiln.value_and_grad(jf, None, weights), jf._grad_variant(None, weights, False)


def measure(wl, variant, runs):
    fn, jf = build(wl, variant)
    fn(*wl.args0)
    args = [wl.run_args[i % len(wl.run_args)] for i in range(runs)]
    times = []
    for a in args:
        t0 = time.perf_counter()
        fn(*a)
        times.append(time.perf_counter() - t0)
    with profiler.profile(record_shapes=False, profile_memory=False) as prof:
        for a in args:
            fn(*a)
    ops = {k.key: (k.count / runs, k.self_ns / runs / 1e6) for k in prof.key_averages()}
    return times, ops, (jf.plan_str(*wl.args0) if jf is not None else None)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("size", choices=tuple(SIZES))
    p.add_argument("workload")
    p.add_argument("a", type=parse_variant)
    p.add_argument("b", type=parse_variant)
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args()
    wls = {w.key: w for w in make_workloads(SIZES[args.size], args.workload.split("-")[0])}
    if args.workload not in wls:
        p.error(f"unknown workload {args.workload!r}; choose from {', '.join(wls)}")
    wl = wls[args.workload]
    names = [sys.argv[3], sys.argv[4]]
    results = [measure(wl, v, args.runs) for v in (args.a, args.b)]
    for name, (times, _, _) in zip(names, results):
        print(f"{name}: per call median {np.median(times) * 1e3:.2f} ms, min {min(times) * 1e3:.2f}, "
              f"max {max(times) * 1e3:.2f} ({args.runs} calls)")
    a, b = results[0][1], results[1][1]
    print(f"{'op':40s} {'calls A':>8s} {'ms A':>9s} {'calls B':>8s} {'ms B':>9s} {'B - A':>9s}")
    for k in sorted(set(a) | set(b), key=lambda k: -max(a.get(k, (0, 0))[1], b.get(k, (0, 0))[1])):
        (ca, ta), (cb, tb) = a.get(k, (0, 0)), b.get(k, (0, 0))
        print(f"{k[:40]:40s} {ca:8.1f} {ta:9.3f} {cb:8.1f} {tb:9.3f} {tb - ta:9.3f}")
    print(f"{'self time of all kernels':40s} {'':8s} {sum(t for _, t in a.values()):9.3f} {'':8s} "
          f"{sum(t for _, t in b.values()):9.3f}")
    pa, pb = results[0][2], results[1][2]
    if pa is not None and pb is not None:
        print("plans identical" if pa == pb else "plans differ")
    return 0


if __name__ == "__main__":
    sys.exit(main())
