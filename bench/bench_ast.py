"""capture_mode="ast" benchmark: each figure is a ratio against a reference measured in the same run.

    PYTHONPATH=python python3 bench/bench_ast.py [--quick]

Targets (issue 5):
- a function with a tensor-dependent while loop running 100 iterations of small elementwise ops
  (while x.sum() > s: x = x * 0.99 + 0.01 on 2x3 float32, s chosen for exactly 100 iterations) is
  >= 3x faster ast-jitted than eager;
- the tutorial's simple function a*b+c (2x3 float32) through @kiln.jit (ast, O0) is within 1.2x of
  the trace-mode per-call time.
The loop figure measures graph control flow: with the eager stand-in of kiln.ops.while_loop (before
branch cf is merged) the capture freezes the loop into 100 unrolled steps, which this script reports.
"""
import argparse
import sys

import numpy as np

import kiln
from kiln import models
from timing import alternate, best_time, row


ITERATIONS = 100


def decay_loop(x, s):
    while x.sum() > s:
        x = x * 0.99 + 0.01
    return x


def threshold_for(x0, iterations):
    """The s at which decay_loop stops after exactly `iterations` steps (float32 arithmetic)."""
    v = x0.astype(np.float32)
    sums = []
    for _ in range(iterations + 1):
        sums.append(float(v.sum(dtype=np.float32)))
        v = v * np.float32(0.99) + np.float32(0.01)
    return (sums[iterations - 1] + sums[iterations]) / 2


def bench_loop(quick):
    x0 = np.full((2, 3), 5.0, dtype=np.float32)
    x, s = kiln.Tensor(x0), kiln.Tensor(np.float32(threshold_for(x0, ITERATIONS)))
    jf = kiln.jit(decay_loop, capture_mode="ast", jit_level="O0", fullgraph=True)
    want = decay_loop(x, s).asnumpy()
    np.testing.assert_allclose(jf(x, s).asnumpy(), want, rtol=1e-6)
    np.testing.assert_allclose(jf(x, s).asnumpy(), want, rtol=1e-6)
    text = jf.graph_str()
    loop_nodes = text.count(" = while(")
    # short alternating rounds, best of each: a busy moment on a shared machine hits both alike
    eager = jitted = float("inf")
    for _ in range(8 if quick else 30):
        eager = min(eager, best_time(lambda: decay_loop(x, s), 1, 10))
        jitted = min(jitted, best_time(lambda: jf(x, s), 1, 10))
    how = "one while node" if loop_nodes else f"NO while node: {text.count(' = mul(')} unrolled steps (stand-in)"
    print(f"while x.sum() > s: x = x * 0.99 + 0.01 on 2x3 float32, {ITERATIONS} iterations; graph: {how}")
    ok = row("while loop x100 (ast O0), us/call", jitted * 1e6, "us", "eager", eager * 1e6,
             eager / jitted, 3.0, better="higher")
    if not loop_nodes:
        print("  not counted as met: the graph has no while node, so this is not the loop the target is about")
    return ok and loop_nodes > 0


def bench_simple(quick):
    rng = np.random.default_rng(1)
    a, b, c = (kiln.Tensor(rng.standard_normal((2, 3)).astype(np.float32)) for _ in range(3))
    ast_f = kiln.jit(models.simple_function, capture_mode="ast", jit_level="O0")
    trace_f = kiln.jit(models.simple_function, capture_mode="trace", jit_level="O0")
    want = models.simple_function(a, b, c).asnumpy()
    for f in (ast_f, trace_f):
        np.testing.assert_array_equal(f(a, b, c).asnumpy(), want)
    t_ast, t_trace = alternate(lambda: ast_f(a, b, c), lambda: trace_f(a, b, c), 15 if quick else 40,
                               2000 if quick else 10000)
    return row("a*b+c @kiln.jit (ast O0), us/call", t_ast * 1e6, "us", "trace O0", t_trace * 1e6,
               t_ast / t_trace, 1.2)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    args = parser.parse_args()
    ok = bench_loop(args.quick)
    ok = bench_simple(args.quick) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
