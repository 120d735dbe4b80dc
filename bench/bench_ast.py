"""capture_mode="ast" benchmark: each figure is a ratio against a reference measured in the same run.

    PYTHONPATH=python python3 bench/bench_ast.py [--quick]

Targets (issue 5):
- a function with a tensor-dependent while loop running 100 iterations of small elementwise ops
  (x = x * 0.99 + 0.01 on 2x3 float32 while a counter tensor is below 100) is >= 3x faster
  ast-jitted than eager;
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
from timing import best_time, row


def decay_loop(x, limit):
    i = x.sum() * 0
    while i < limit:
        x = x * 0.99 + 0.01
        i = i + 1
    return x


def bench_loop(quick):
    x = kiln.Tensor(np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32))
    limit = kiln.tensor(100.0)
    jf = kiln.jit(decay_loop, capture_mode="ast", jit_level="O0", fullgraph=True)
    want = decay_loop(x, limit).asnumpy()
    np.testing.assert_allclose(jf(x, limit).asnumpy(), want, rtol=1e-5)
    np.testing.assert_allclose(jf(x, limit).asnumpy(), want, rtol=1e-5)
    text = jf.graph_str()
    loop_nodes = text.count(" = while(")
    # short alternating rounds, best of each: a busy moment on a shared machine hits both alike
    eager = jitted = float("inf")
    for _ in range(8 if quick else 30):
        eager = min(eager, best_time(lambda: decay_loop(x, limit), 1, 10))
        jitted = min(jitted, best_time(lambda: jf(x, limit), 1, 10))
    how = "one while node" if loop_nodes else f"NO while node: {text.count(' = mul(')} unrolled steps (stand-in)"
    print(f"graph of the ast-jitted loop: {how}")
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
    number = 2000 if quick else 10000
    # many short alternating rounds, best of each: a busy moment on a shared machine hits both alike
    t_ast = t_trace = float("inf")
    for _ in range(15 if quick else 40):
        t_ast = min(t_ast, best_time(lambda: ast_f(a, b, c), 1, number))
        t_trace = min(t_trace, best_time(lambda: trace_f(a, b, c), 1, number))
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
