"""Per-call overhead of a jitted function on small tensors: kiln.jit(lambda a, b, c: a * b + c)
on 2x3 float32, each capture mode (ast, bytecode, trace) on backends kbk and sink (eager a*b+c
for reference), in us/call.

    PYTHONPATH=python python3 bench/bench_call_overhead.py [--baseline DIR] [--rounds N] [--calls N]

--baseline DIR: the python/ directory of another checkout (its _C*.so built). Each round measures
this tree and the baseline in turn, each in a fresh subprocess, so both see the same machine load;
the best time per variant is kept and the ratio current/baseline printed (target: <= 1.05; issue
29's refactor of capture, options and backends: <= 1.03).
"""
import argparse
import json
import os
import subprocess
import sys

MODES = ("ast", "bytecode", "trace")
VARIANTS = ("eager",) + tuple(f"{m} {b}" for m in MODES for b in ("kbk", "sink"))

_MEASURE = r"""
import json, sys, time
import numpy as np
import kiln
calls = int(sys.argv[1])
a, b, c = [kiln.Tensor(np.random.randn(2, 3).astype(np.float32)) for _ in range(3)]
def f(a, b, c):
    return a * b + c
fns = {"eager": f}
for m in ("ast", "bytecode", "trace"):
    for be in ("kbk", "sink"):
        fns[f"{m} {be}"] = kiln.jit(f, capture_mode=m, backend=be)
out = {}
for name, fn in fns.items():
    expect = (a.asnumpy() * b.asnumpy() + c.asnumpy())
    np.testing.assert_allclose(fn(a, b, c).asnumpy(), expect, rtol=1e-6)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn(a, b, c)
        best = min(best, (time.perf_counter() - t0) / calls)
    out[name] = best * 1e6
print(json.dumps(out))
"""


def measure(python_dir, calls):
    env = dict(os.environ, PYTHONPATH=os.path.abspath(python_dir))
    res = subprocess.run([sys.executable, "-c", _MEASURE, str(calls)], env=env, capture_output=True, text=True,
                         check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline", help="python/ directory of the checkout to compare with")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--calls", type=int, default=20000)
    args = p.parse_args()
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python")
    best = {"current": {}, "baseline": {}}
    for _ in range(args.rounds):
        trees = [("current", here)] + ([("baseline", args.baseline)] if args.baseline else [])
        for label, d in trees:
            for name, t in measure(d, args.calls).items():
                best[label][name] = min(best[label].get(name, float("inf")), t)
    for name in VARIANTS:
        cur = best["current"][name]
        line = f"{name:13s} current {cur:8.3f} us/call"
        if args.baseline:
            base = best["baseline"][name]
            line += f"  baseline {base:8.3f} us/call  ratio {cur / base:.3f}"
            if name != "eager":
                line += "  (target <= 1.05)"
        print(line)


if __name__ == "__main__":
    main()
