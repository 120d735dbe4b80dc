"""kiln.ops.scan benchmark: an LSTM-sized cell scanned over a sequence under kiln.jit.

    PYTHONPATH=python python3 bench/bench_scan.py [--steps N] [--quick]

The cell: batch 32, input 128, hidden 256 (gates x @ W + h @ U + b, PyTorch's order), scanned over
1,000 steps. Targets (issue 34):
- compile time of the jitted scan <= 1 s (capture + passes + plan: the first call's time less a
  later call's);
- a call of the jitted scan is >= 2x faster than the same cell in an eager Python loop;
- its gradient (kiln.grad of a loss of the jitted function with respect to the initial state and
  the cell's weights) is >= 2x faster than the eager loop's backward (kiln.grad of the eager
  function, the same arguments). The sequence is data here: a gradient with respect to xs too
  costs a full-size (T, batch, input) accumulation per step in the compiled loop (see
  docs/guide/transforms.md, "Loops").
Two last lines (no target) give the ceilings of the ratios for a loop that runs the same GEMMs:
the eager loop's time over that of its two GEMMs per step alone (x_t @ W and h @ U, eager), and
the eager loop's gradient (its forward and backward) over its five GEMMs per step alone (those
two, then dgates @ U^T for dh, x_t^T @ dgates for dW and h^T @ dgates for dU, eager; xs needs no
gradient). The cell is GEMM-bound: the GEMMs are about two thirds of the eager loop and three
fifths of its gradient, so removing everything else gains at most ~1.45x on the call and ~1.7x
on the gradient, and 2x needs GEMMs faster than the eager loop's own.
Each ratio is eager time / compiled time, measured in alternating rounds (a shared machine is noisy);
the jitted function is compiled at jit_level="O1" (at O0 the cell's elementwise ops run one kernel
each, as eagerly). --quick: one round. --cpu: one kiln thread, every time the CPU time of the
calling thread (time.thread_time), which a loaded shared machine does not inflate: with two
threads, each GEMM's fork/join waits for a thread the OS may have given to another process, and
the wall times of both sides then vary several-fold from run to run.
"""
import argparse
import sys
import time

import numpy as np

import kiln
from kiln import ops
from timing import alternate, best_time, row

BATCH, INPUT, HIDDEN = 32, 128, 256


def cell(carry, x, w, u, b):
    h, c = carry
    gates = ops.matmul(x, w) + ops.matmul(h, u) + b
    i, f, g, o = (gates[:, k * HIDDEN:(k + 1) * HIDDEN] for k in range(4))
    c = f.sigmoid() * c + i.sigmoid() * g.tanh()
    h = o.sigmoid() * c.tanh()
    return (h, c), h


def scanned(xs, h0, c0, w, u, b):
    (h, c), ys = ops.scan(lambda carry, x: cell(carry, x, w, u, b), (h0, c0), xs)
    return ys.sum() + c.sum()


def python_loop(xs, h0, c0, w, u, b):
    carry, total = (h0, c0), None
    for t in range(xs.shape[0]):
        carry, y = cell(carry, xs[t], w, u, b)
        total = y.sum() if total is None else total + y.sum()
    return total + carry[1].sum()


def gemms_alone(xs, h0, w, u):
    """The eager loop's GEMMs without the rest of the cell (h held fixed: the same products)."""
    for t in range(xs.shape[0]):
        ops.matmul(xs[t], w)
        ops.matmul(h0, u)


def backward_gemms_alone(xs, h0, dgates, w, u):
    """The eager loop's GEMMs of a call and its backward, without the rest (h and the gates'
    gradient held fixed: the same products): per step x_t @ W, h @ U, dgates @ U^T,
    x_t^T @ dgates, h^T @ dgates."""
    ut, ht = u.T, h0.T
    for t in range(xs.shape[0]):
        ops.matmul(xs[t], w)
        ops.matmul(h0, u)
        ops.matmul(dgates, ut)
        ops.matmul(xs[t].T, dgates)
        ops.matmul(ht, dgates)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--quick", action="store_true", help="fewer rounds")
    p.add_argument("--cpu", action="store_true", help="one thread, CPU time of this thread (see above)")
    a = p.parse_args()
    rounds, number = (1, 1) if a.quick else (3, 1)
    clock = time.thread_time if a.cpu else time.perf_counter
    if a.cpu:
        kiln.set_num_threads(1)
    rng = np.random.default_rng(0)

    def t(*shape, scale=0.1):
        return kiln.tensor((rng.standard_normal(shape) * scale).astype(np.float32))

    xs = t(a.steps, BATCH, INPUT, scale=1.0)
    h0, c0 = t(BATCH, HIDDEN), t(BATCH, HIDDEN)
    w, u, b = t(INPUT, 4 * HIDDEN), t(HIDDEN, 4 * HIDDEN), t(4 * HIDDEN)
    args = (xs, h0, c0, w, u, b)

    jitted = kiln.jit(scanned, capture_mode="trace", jit_level="O1")  # (O1: fused elementwise chains)
    t0 = time.perf_counter()  # (wall time also with --cpu: the C compiler runs in other processes)
    got = jitted(*args)
    compile_s = time.perf_counter() - t0
    if a.cpu:
        compile_s -= best_time(lambda: jitted(*args), 1)
    want = python_loop(*args)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-3)
    graph = jitted.graph_str(*args)
    assert graph.count(" while(") + graph.count("= while") >= 1, "the scan is not one while node"

    wrt = (1, 2, 3, 4, 5)  # h0, c0, w, u, b
    grad_jit = kiln.grad(jitted, wrt)
    grad_eager = kiln.grad(python_loop, wrt)
    for g, e in zip(grad_jit(*args), grad_eager(*args)):  # (the first call compiles the backward)
        np.testing.assert_allclose(g.numpy(), e.numpy(), rtol=2e-2, atol=1e-3)

    run_jit, run_eager = alternate(lambda: jitted(*args), lambda: python_loop(*args), rounds, number, clock)
    bwd_jit, bwd_eager = alternate(lambda: grad_jit(*args), lambda: grad_eager(*args), rounds, number, clock)
    print(f"scan of an LSTM cell (batch {BATCH}, input {INPUT}, hidden {HIDDEN}) over {a.steps} steps"
          + (", one thread, CPU time" if a.cpu else f", {kiln.get_num_threads()} threads, wall time"))
    if not a.cpu:
        compile_s -= run_jit  # (the first call also ran the loop once)
    ok = row("compile (first call less a later one)", compile_s, "s", "target", 1.0, compile_s, 1.0)
    ok &= row("call: eager loop / jitted scan", run_jit, "s", "eager loop", run_eager, run_eager / run_jit, 2.0,
              better="higher")
    ok &= row("gradient: eager loop / jitted scan", bwd_jit, "s", "eager loop", bwd_eager, bwd_eager / bwd_jit, 2.0,
              better="higher")
    loop_t, gemm_only = alternate(lambda: python_loop(*args), lambda: gemms_alone(xs, h0, w, u), rounds, number, clock)
    print(f"{'(ceiling: eager loop / its GEMMs alone)':<46} {gemm_only:10.3f} {'s':<8} {'eager loop':<28} "
          f"{loop_t:10.3f}  ratio {loop_t / gemm_only:6.3f} (no target)")
    dgates = t(BATCH, 4 * HIDDEN)
    bwd_t, bwd_gemms = alternate(lambda: grad_eager(*args), lambda: backward_gemms_alone(xs, h0, dgates, w, u),
                                 rounds, number, clock)
    print(f"{'(ceiling: eager gradient / its GEMMs alone)':<46} {bwd_gemms:10.3f} {'s':<8} {'eager gradient':<28} "
          f"{bwd_t:10.3f}  ratio {bwd_t / bwd_gemms:6.3f} (no target)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
