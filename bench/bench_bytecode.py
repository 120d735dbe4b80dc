"""capture_mode="bytecode" benchmark: each figure is a ratio against a reference measured in the same run.

    flock /tmp/kiln-bench.lock env PYTHONPATH=python python3 bench/bench_bytecode.py [--quick]

Targets (issue 12):
- the tutorial's simple function a*b+c (2x3 float32), bytecode O0 per call <= 1.2x ast O0 per call;
- BasicBlock and LlamaAttention forward and forward+backward (reduced sizes, O1): bytecode within 5%
  of ast (<= 1.05x). value_and_grad of a jitted function compiles forward and backward as one graph
  captured like trace mode from the function itself (ast: its converted source; bytecode: the
  function), so the forward+backward rows time that graph;
- a function with one graph break in the middle (print of a Python scalar between two blocks of
  tensor work) <= 1.5x the same function without the break, both bytecode O0.
Without a target: the time a capture takes (a new wrapper's first call, compile included; the code
objects' decoded tables are kept) with the interpreter's generic instructions run in C
(kiln._C.bytecode_steps) against all of them in Python's handlers, for the three seed workloads and
for a loop of Python-level work on small tensors. --threads 1 shows the
  same figure without kiln's worker threads, which sleep while Python runs between the two graphs.
"""
import argparse
import io
import sys
from contextlib import redirect_stdout

import numpy as np

import kiln
from kiln import models
from timing import alternate, row


def bench_simple(quick):
    rng = np.random.default_rng(1)
    a, b, c = (kiln.Tensor(rng.standard_normal((2, 3)).astype(np.float32)) for _ in range(3))
    ast_f = kiln.jit(models.simple_function, capture_mode="ast", jit_level="O0")
    bc_f = kiln.jit(models.simple_function, capture_mode="bytecode", jit_level="O0")
    want = models.simple_function(a, b, c).asnumpy()
    for f in (ast_f, bc_f):
        np.testing.assert_array_equal(f(a, b, c).asnumpy(), want)
    t_bc, t_ast = alternate(lambda: bc_f(a, b, c), lambda: ast_f(a, b, c), 10 if quick else 30,
                            2000 if quick else 10000)
    return row("a*b+c (bytecode O0), us/call", t_bc * 1e6, "us", "ast O0", t_ast * 1e6, t_bc / t_ast, 1.2)


def bench_module(name, cell, inputs, quick, backward=False):
    ast_f = kiln.jit(cell, capture_mode="ast", jit_level="O1")
    bc_f = kiln.jit(cell, capture_mode="bytecode", jit_level="O1")
    what = "forward"
    if backward:
        weights = cell.trainable_params()
        ast_f, bc_f = (kiln.value_and_grad(f, None, weights) for f in (ast_f, bc_f))
        want = kiln.value_and_grad(cell, None, weights)(*inputs)
        for f in (ast_f, bc_f):
            got = f(*inputs)
            for a, b in zip((got[0],) + tuple(got[1]), (want[0],) + tuple(want[1])):
                np.testing.assert_allclose(a.asnumpy(), b.asnumpy(), rtol=1e-3, atol=1e-3)
        what = "fwd+bwd"
    else:
        want = cell(*inputs).asnumpy()
        for f in (ast_f, bc_f):
            np.testing.assert_allclose(f(*inputs).asnumpy(), want, rtol=1e-4, atol=1e-4)
    for _ in range(3):  # O1 builds its fused kernels at the first compiled run
        bc_f(*inputs), ast_f(*inputs)
    t_bc, t_ast = alternate(lambda: bc_f(*inputs), lambda: ast_f(*inputs), 4 if quick else 25, 5 if quick else 10)
    return row(f"{name} {what} (bytecode O1), ms/call", t_bc * 1e3, "ms", "ast O1", t_ast * 1e3, t_bc / t_ast, 1.05)


def two_blocks(x):
    y = kiln.ops.tanh(x * 0.5 + 0.1)
    y = kiln.ops.matmul(y, y) * 0.9
    z = kiln.ops.tanh(y - 0.2)
    return kiln.ops.matmul(z, z) + x


def two_blocks_with_break(x):
    y = kiln.ops.tanh(x * 0.5 + 0.1)
    y = kiln.ops.matmul(y, y) * 0.9
    print("step", 3)
    z = kiln.ops.tanh(y - 0.2)
    return kiln.ops.matmul(z, z) + x


def bench_break(quick):
    x = kiln.Tensor(np.random.default_rng(2).standard_normal((64, 64)).astype(np.float32) * 0.1)
    plain = kiln.jit(two_blocks, capture_mode="bytecode", jit_level="O0")
    broken = kiln.jit(two_blocks_with_break, capture_mode="bytecode", jit_level="O0")
    sink = io.StringIO()
    with redirect_stdout(sink):
        np.testing.assert_allclose(broken(x).asnumpy(), two_blocks(x).asnumpy(), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(plain(x).asnumpy(), two_blocks(x).asnumpy(), rtol=1e-5, atol=1e-5)
        t_brk, t_plain = alternate(lambda: broken(x), lambda: plain(x), 8 if quick else 20, 100 if quick else 400)
    print(f"graphs: {broken._pieces.count} with the break, {plain._pieces.count} without")
    return row("one graph break (print), us/call", t_brk * 1e6, "us", "no break", t_plain * 1e6,
               t_brk / t_plain, 1.5)


def python_heavy(x, n):
    acc, parts = x, [x * 0.5, x - 1.0]
    for k in range(n):
        a, b = parts[0], parts[1]
        if k % 3 == 0 and k is not None:
            acc = acc + a * (k + 1)
        elif k > 2:
            acc = acc - b
        else:
            acc = (acc, b)[0] * 1.5
    return acc


def bench_capture(quick):
    """Capture time with C steps against Python handlers only (bytecode.STEPS_IN_C)."""
    import time

    from kiln.jit import bytecode

    rng = np.random.default_rng(5)
    a, b, c = (kiln.Tensor(rng.standard_normal((2, 3)).astype(np.float32)) for _ in range(3))
    block = models.BasicBlock(channels=16)
    block.set_train(False)
    x = kiln.Tensor(rng.standard_normal((1, 16, 8, 8)).astype(np.float32))
    att = models.LlamaAttention(hidden_size=64, num_heads=4, num_kv_heads=2)
    xa = kiln.Tensor(rng.standard_normal((1, 8, 64)).astype(np.float32))
    pos = kiln.Tensor(np.arange(8).reshape(1, 8).astype(np.int64))
    work = {"seed workloads": [(models.simple_function, (a, b, c)), (block, (x,)), (att, (xa, pos))],
            "Python-level loop": [(python_heavy, (a, 150))]}
    saved = bytecode.STEPS_IN_C

    def capture(calls, in_c):
        bytecode.STEPS_IN_C = in_c
        t0 = time.perf_counter()
        for fn, args in calls:
            if hasattr(fn, "__code__"):
                kiln._C.code_entries(fn.__code__).clear()  # (a plain function's entries live on its code)
            kiln.jit(fn, capture_mode="bytecode", jit_level="O0")(*args)
        return time.perf_counter() - t0

    try:
        for name, calls in work.items():
            t_c = t_py = float("inf")
            for _ in range(3 if quick else 7):
                t_c, t_py = min(t_c, capture(calls, True)), min(t_py, capture(calls, False))
            print(f"{'capture, ' + name + ' (C steps), ms':<46} {t_c * 1e3:10.3f} ms       Python handlers      "
                  f"{t_py * 1e3:10.3f}  ratio {t_c / t_py:6.3f} (no target)")
    finally:
        bytecode.STEPS_IN_C = saved


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--threads", type=int, help="kiln.set_num_threads before measuring")
    args = parser.parse_args()
    if args.threads:
        kiln.set_num_threads(args.threads)
    print(f"kiln threads: {kiln.get_num_threads()}")
    ok = bench_simple(args.quick)
    block = models.BasicBlock(channels=32)
    block.set_train(False)
    x = kiln.Tensor(np.random.default_rng(3).standard_normal((1, 32, 16, 16)).astype(np.float32))
    ok = bench_module("BasicBlock", block, (x,), args.quick) and ok
    train_block = models.BasicBlock(channels=32)
    ok = bench_module("BasicBlock", train_block, (x,), args.quick, backward=True) and ok
    att = models.LlamaAttention(hidden_size=256, num_heads=8, num_kv_heads=2)
    xa = kiln.Tensor(np.random.default_rng(4).standard_normal((1, 32, 256)).astype(np.float32))
    pos = kiln.Tensor(np.arange(32).reshape(1, 32).astype(np.int64))
    ok = bench_module("LlamaAttention", att, (xa, pos), args.quick) and ok
    ok = bench_module("LlamaAttention", att, (xa, pos), args.quick, backward=True) and ok
    ok = bench_break(args.quick) and ok
    bench_capture(args.quick)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
