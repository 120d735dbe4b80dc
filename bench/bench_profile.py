"""Profiling overhead (issue 14), measured in one run:

    PYTHONPATH=python python3 bench/bench_profile.py [--quick] [--base DIR] [--callgrind]

Targets:
  - with profiling on (inside kiln.profiler.profile), the BasicBlock forward+backward (value_and_grad
    over its parameters, jitted at O1, 1x64x32x32; --quick 1x32x16x16) runs at most 8% slower than
    with it off (best of alternating rounds);
  - the sum of the recorded kernel durations of one profiled BasicBlock run (the kernels at the top
    level of the graph's backend) is between 90% and 100% of the wall time of that call;
  - with --base DIR (a built checkout without the recorder): with profiling off, bench_sink.py's
    per-call figure (jitted a*b+c on 2x3 float32, sink and kbk at O0) stays within 3% of the base
    tree's, best of alternating fresh processes; with --callgrind also the instructions per call
    under valgrind --tool=callgrind, counted under the jitted function's C entry point
    (deterministic, unlike the wall clock on a shared machine).
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import numpy as np

import kiln
from kiln import _C, models
from timing import row


def basic_block_step(channels, size):
    kiln.manual_seed(0)
    block = models.BasicBlock(channels)
    x = kiln.Tensor(np.random.default_rng(0).standard_normal((1, channels, size, size)).astype(np.float32))
    step = kiln.value_and_grad(kiln.jit(block, jit_level="O1"), None, block.trainable_params())
    for _ in range(10):  # the first calls of a process are many times slower (allocator, primitives)
        step(x)
    return step, x


def overhead(step, x, rounds):
    """Best seconds per call off and on (inside a profile), alternating which goes first."""
    best = {False: float("inf"), True: float("inf")}
    for r in range(rounds):
        for on in (r % 2 == 0, r % 2 == 1):
            if on:
                with kiln.profiler.profile(profile_memory=False):
                    t0 = time.perf_counter()
                    step(x)
                    t = time.perf_counter() - t0
            else:
                t0 = time.perf_counter()
                step(x)
                t = time.perf_counter() - t0
            best[on] = min(best[on], t)
    return best[False], best[True]


def event_cost(rounds):
    """Nanoseconds the recorder adds per event it records (kernels and allocations): a jitted a*b+c
    on 2x3 float32, kernel by kernel, inside and outside a profile, best of alternating windows."""
    rng = np.random.default_rng(0)
    a, b, c = (kiln.Tensor(rng.standard_normal((2, 3)).astype(np.float32)) for _ in range(3))
    f = kiln.jit(models.simple_function, jit_level="O0", backend="kbk", profiling=False)
    for _ in range(100):
        f(a, b, c)
    best = {False: float("inf"), True: float("inf")}
    calls = 300
    for r in range(rounds * 4):
        for on in (r % 2 == 0, r % 2 == 1):
            prof = kiln.profiler.profile(profile_memory=False) if on else None
            if prof:
                prof.__enter__()
            t0 = time.perf_counter()
            for _ in range(calls):
                f(a, b, c)
            best[on] = min(best[on], (time.perf_counter() - t0) / calls)
            if prof:
                prof.__exit__(None, None, None)
    with kiln.profiler.profile() as prof:  # the events one call records
        f(a, b, c)
    per_call = len(prof.events())
    return (best[True] - best[False]) / per_call * 1e9, best[False] * 1e9, per_call


def coverage(step, x, rounds):
    """The best share of one profiled call's wall time covered by top-level backend kernels."""
    best = 0.0
    for _ in range(rounds):
        with kiln.profiler.profile(profile_memory=False) as prof:
            t0 = _C.profile_now()
            step(x)
            wall = _C.profile_now() - t0
        kernels = [e for e in prof.events() if e["kind"] == "kernel" and e["depth"] == 0
                   and e["source"] in ("kbk", "sink")]
        best = max(best, sum(e["end"] - e["start"] for e in kernels) / wall)
    return best


SIMPLE = """
import sys, time, numpy as np, kiln
from kiln import models
rng = np.random.default_rng(0)
a, b, c = (kiln.Tensor(rng.standard_normal((2, 3)).astype(np.float32)) for _ in range(3))
fs = {be: kiln.jit(models.simple_function, jit_level="O0", backend=be) for be in sys.argv[3].split(",")}
calls = int(sys.argv[1])
for f in fs.values():
    for _ in range(200):
        f(a, b, c)
out = {}
for be, f in fs.items():
    best = float("inf")
    for _ in range(int(sys.argv[2])):
        t0 = time.perf_counter()
        for _ in range(calls):
            f(a, b, c)
        best = min(best, (time.perf_counter() - t0) / calls)
    out[be] = best
print("RESULT" + repr(out))
"""


def simple_in(tree, calls, windows, callgrind=False, backends="kbk,sink"):
    env = dict(os.environ, PYTHONPATH=os.path.join(tree, "python"), PYTHONHASHSEED="0")  # the same dict probes
    cmd = [sys.executable, "-c", SIMPLE, str(calls), str(windows), backends]
    if not callgrind:
        out = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, check=True).stdout
        return eval(out[out.index("RESULT") + 6:])  # noqa: S307 (our own child's repr of a dict)
    with tempfile.TemporaryDirectory() as d:
        outfile = os.path.join(d, "cg.out")
        # only what runs under the jitted functions' C entry point (the fast path and what it calls)
        subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={outfile}", "--collect-atstart=no",
                        "--toggle-collect=dispatcher_vectorcall"] + cmd, cwd=tree, env=env,
                       capture_output=True, text=True, check=True)
        with open(outfile) as f:
            totals = re.search(r"^totals:\s+(\d+)", f.read(), re.M)
        return int(totals.group(1))


def off_path(base, quick, callgrind):
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    rounds = 3 if quick else 5
    best = {"base": {}, "here": {}}
    for _ in range(rounds):
        for label, tree in (("base", base), ("here", here)):
            for k, v in simple_in(tree, 2000, 10).items():
                best[label][k] = min(best[label].get(k, float("inf")), v)
    ok = True
    for k in ("kbk", "sink"):
        ok &= row(f"a*b+c {k} O0, profiling off (per call)", best["here"][k] * 1e6, "us", "base tree",
                  best["base"][k] * 1e6, best["here"][k] / best["base"][k], 1.03)
    if callgrind:
        # the difference of two call counts cancels the first calls (capture, compile)
        for be in ("kbk", "sink"):
            per_call = {}
            for label, tree in (("base", base), ("here", here)):
                lo, hi = simple_in(tree, 1000, 1, True, be), simple_in(tree, 3000, 1, True, be)
                per_call[label] = (hi - lo) / 2000
            ok &= row(f"a*b+c {be} O0 instructions per call", per_call["here"], "Ir", "base tree", per_call["base"],
                      per_call["here"] / per_call["base"], 1.03)
    return ok


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--base", help="a built checkout without the recorder, for the off-path comparison")
    p.add_argument("--callgrind", action="store_true", help="with --base: also count instructions with valgrind")
    args = p.parse_args()
    channels, size, rounds = (32, 16, 10) if args.quick else (64, 32, 30)
    print(f"kiln {kiln.__version__}, {kiln.get_num_threads()} threads; BasicBlock forward+backward "
          f"1x{channels}x{size}x{size} at O1")
    step, x = basic_block_step(channels, size)
    off, on = overhead(step, x, rounds)
    ok = row("BasicBlock fwd+bwd, profiling on", on * 1e3, "ms", "profiling off", off * 1e3, on / off, 1.08)
    per_event, call_ns, per_call = event_cost(rounds)
    with kiln.profiler.profile() as prof:
        step(x)
    events = len(prof.events())
    print(f"recorder cost: {per_event:.0f} ns per event (a*b+c kbk call: {call_ns:.0f} ns off, {per_call} events); "
          f"a BasicBlock "
          f"step records {events} events (kernels and allocations): about {events * per_event / 1e3:.1f} us, "
          f"{100 * events * per_event / (off * 1e9):.2f}% of its best time off")
    share = coverage(step, x, rounds)
    ok &= row("recorded kernel time / wall of a run", share, "", "lower bound", 0.90, share, 0.90, better="higher")
    ok &= row("recorded kernel time / wall of a run", share, "", "upper bound", 1.00, share, 1.00)
    if args.base:
        ok &= off_path(os.path.abspath(args.base), args.quick, args.callgrind)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
