"""What guards on Python state cost a jitted call (issue 10): a*b+c on 2x3 float32 jitted as
a plain function (no Python state read: the per-call time before guards existed, plus one check
of an empty guard set) against the same graph from a function that reads two globals and a Cell
attribute (five guards: the two globals, the Cell's identity, its attribute and its state
version), both served by the C fast path, kernel by kernel and sunk, in the same run.

    PYTHONPATH=python python3 bench/bench_guards.py [--quick]

Target: the guarded function at most 1.15x the plain one's per-call time, for kbk and sink.
"""
import argparse
import sys
import time

import numpy as np

import kiln
from kiln import models, nn
from timing import row

USE_FMA = True
MODE = "fma"


class Gate(nn.Cell):
    def __init__(self):
        super().__init__()
        self.active = True

    def construct(self, x):
        return x


gate = Gate()


def guarded(a, b, c):
    if USE_FMA and MODE == "fma" and gate.active:
        return a * b + c
    return a * b - c


def per_call(f, args, n, repeat):
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(n):
            f(*args)
        best = min(best, (time.perf_counter() - t0) / n)
    return best


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls")
    args = parser.parse_args()
    n, repeat = (20000, 5) if args.quick else (200000, 7)
    rng = np.random.default_rng(0)
    abc = tuple(kiln.Tensor(rng.standard_normal((2, 3)).astype(np.float32)) for _ in range(3))
    ok = True
    for backend in ("kbk", "sink"):
        plain = kiln.jit(models.simple_function, backend=backend)
        checked = kiln.jit(guarded, backend=backend)
        want = models.simple_function(*abc).asnumpy()
        for f in (plain, checked):
            for _ in range(3):
                assert np.array_equal(f(*abc).asnumpy(), want)
        assert checked._fast_hits > 0, "the guarded function must be served by the C fast path"
        guards = len(checked._last.guards)
        tp, tg = (per_call(f, abc, n, repeat) * 1e6 for f in (plain, checked))
        ok &= row(f"{backend}: a*b+c reading 2 globals + a Cell attr", tg, "us/call", "no Python state read", tp,
                  tg / tp, 1.15)
        print(f"  ({guards} guards checked per call)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
