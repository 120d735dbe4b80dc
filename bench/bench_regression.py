"""Before/after: the per-call figures that a refactoring must not regress, measured in this tree
and in another built checkout (--base), alternating between the two trees in fresh processes.

    PYTHONPATH=python python3 bench/bench_regression.py --base ../kiln-before [--rounds N]

The other checkout must be built (cmake --build build); each of its rounds runs with its own
python/ first on the path. Limits (issue 11, "Must not regress"): jitted a*b+c on 2x3 float32 at
most 1.1x the base's per-call time for kbk and sink at O0 and O1; the BasicBlock (1x128x64x64)
and LlamaAttention (hidden 512, 8 heads, 2 KV heads, sequence 256) forwards at O1 within 3%.
A round runs every workload once in each tree; a tree's figure is its best over the rounds (this
machine's noise between single rounds is often 10% or more, and it only ever adds time).
"""
import argparse
import json
import os
import subprocess
import sys
import time

LIMITS = {"abc": 1.10, "block": 1.03, "attention": 1.03}


def measure():
    """Runs in a child process: best seconds per call of each workload, as JSON on stdout."""
    import numpy as np

    import kiln
    from kiln import models

    rng = np.random.default_rng(0)
    out = {}
    a, b, c = (kiln.Tensor(rng.standard_normal((2, 3)).astype(np.float32)) for _ in range(3))
    for level in ("O0", "O1"):
        for backend in ("kbk", "sink"):
            f = kiln.jit(models.simple_function, jit_level=level, backend=backend)
            for _ in range(10):
                f(a, b, c)
            best = float("inf")
            for _ in range(30):
                t0 = time.perf_counter()
                for _ in range(2000):
                    f(a, b, c)
                best = min(best, (time.perf_counter() - t0) / 2000)
            out[f"abc {backend} {level}"] = best
    kiln.manual_seed(0)
    block = models.BasicBlock(128)
    x = kiln.Tensor(rng.standard_normal((1, 128, 64, 64)).astype(np.float32))
    attention = models.LlamaAttention(512, 8, 2)
    h = kiln.Tensor(rng.standard_normal((1, 256, 512)).astype(np.float32))
    pos = kiln.Tensor(np.arange(256, dtype=np.int64).reshape(1, 256))
    for name, cell, args in (("block", block, (x,)), ("attention", attention, (h, pos))):
        f = kiln.jit(cell, jit_level="O1")
        for _ in range(3):
            f(*args)
        best = float("inf")
        for _ in range(15):
            t0 = time.perf_counter()
            f(*args)
            best = min(best, time.perf_counter() - t0)
        out[f"{name} kbk O1"] = best
    json.dump(out, sys.stdout)


def run_in(tree):
    env = dict(os.environ, PYTHONPATH=os.path.join(tree, "python"))
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child"], cwd=tree, env=env,
                          capture_output=True, text=True, check=True)
    return json.loads(proc.stdout)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", help="a built checkout to compare with (the 'before' tree)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return measure()
    if not args.base:
        p.error("--base DIR is required")
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    best = {"before": {}, "after": {}}
    for _ in range(args.rounds):
        for label, tree in (("before", os.path.abspath(args.base)), ("after", here)):
            for k, v in run_in(tree).items():
                best[label][k] = min(best[label].get(k, float("inf")), v)
    status = 0
    print(f"before: {os.path.abspath(args.base)}; after: {here}; best of {args.rounds} alternating rounds")
    for k in best["after"]:
        before, after = best["before"][k], best["after"][k]
        limit = LIMITS[k.split()[0]]
        unit, scale = ("us", 1e6) if k.startswith("abc") else ("ms", 1e3)
        ok = after / before <= limit
        status |= not ok
        print(f"{k:<22} before {before * scale:9.3f} {unit}  after {after * scale:9.3f} {unit}  "
              f"after/before {after / before:.3f} (limit {limit:.2f}) {'ok' if ok else 'OVER'}")
    return status


if __name__ == "__main__":
    sys.exit(main())
