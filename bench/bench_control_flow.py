"""Control-flow benchmark: a tensor-dependent while loop, eager against jitted, as ratios measured in
one run.

    PYTHONPATH=python python3 bench/bench_control_flow.py [--quick]

Target (issue 5): x = x * 0.99 + 0.01 on a 2x3 float32 tensor while x.sum() > s, 100
iterations, is at least 3x faster jitted than eager. The jitted rows trace kiln.ops.while_loop
into one `while` node whose cond and body run in C (capture_mode="trace"; an ast-captured row
joins when that front end lands). The eager reference is the same loop written as a plain Python
`while` over kiln ops (the faster of the two eager forms; eager kiln.ops.while_loop, which also
checks each iteration's values, is printed too). value_and_grad (forward loop + while_grad) is
printed for reference against the same computation differentiated eagerly.
"""
import argparse
import sys

import numpy as np

import kiln
from kiln import ops
from timing import best_time, row

ITERATIONS = 100


def threshold_for(x0, iterations):
    """The s at which the loop stops after exactly `iterations` steps."""
    v = x0.astype(np.float32)
    sums = []
    for _ in range(iterations + 1):
        sums.append(float(v.sum(dtype=np.float32)))
        v = v * np.float32(0.99) + np.float32(0.01)
    return (sums[iterations - 1] + sums[iterations]) / 2


def decay(x, s):
    return ops.while_loop(lambda v: v.sum() > s, lambda v: (v * 0.99 + 0.01,), (x,))[0]


def decay_python(x, s):
    while x.sum() > s:
        x = x * 0.99 + 0.01
    return x


def decay_loss(x, s):
    return (decay(x, s) * x).sum()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer repeats")
    args = p.parse_args()
    rep, number = (5, 20) if args.quick else (11, 50)
    x0 = np.full((2, 3), 5.0, dtype=np.float32)
    s_value = threshold_for(x0, ITERATIONS)
    x, s = kiln.Tensor(x0), kiln.Tensor(np.float32(s_value))
    print(f"kiln {kiln.__version__}: while x.sum() > s: x = x * 0.99 + 0.01 on 2x3 float32, {ITERATIONS} iterations")

    jitted = kiln.jit(decay, capture_mode="trace")
    want = decay_python(x, s)
    for fn in (decay, jitted, jitted):
        np.testing.assert_allclose(fn(x, s).asnumpy(), want.asnumpy(), rtol=1e-6)
    assert "= while(" in jitted.graph_str(x, s)

    t_python = best_time(lambda: decay_python(x, s), rep, number)
    t_eager = best_time(lambda: decay(x, s), rep, number)
    t_jit = best_time(lambda: jitted(x, s), rep, number)

    grad_eager = kiln.value_and_grad(decay_loss)
    grad_jit = kiln.value_and_grad(kiln.jit(decay_loss, capture_mode="trace"))
    ve, ge = grad_eager(x, s)
    vj, gj = grad_jit(x, s)
    np.testing.assert_allclose(vj.asnumpy(), ve.asnumpy(), rtol=1e-5)
    np.testing.assert_allclose(gj.asnumpy(), ge.asnumpy(), rtol=1e-5)
    t_grad_eager = best_time(lambda: grad_eager(x, s), rep, max(1, number // 5))
    t_grad_jit = best_time(lambda: grad_jit(x, s), rep, max(1, number // 5))

    us = 1e6
    print(f"eager kiln.ops.while_loop: {t_eager * us:.1f} us ({t_eager / t_jit:.1f}x the jitted time)")
    results = [
        row("while_loop jitted (trace), 100 iterations", t_jit * us, "us", "eager Python while loop", t_python * us,
            t_python / t_jit, 3.0, "higher"),
    ]
    row("value_and_grad jitted (while + while_grad)", t_grad_jit * us, "us", "eager value_and_grad",
        t_grad_eager * us, t_grad_eager / t_grad_jit, 1.0, "higher")
    missed = results.count(False)
    print(f"{len(results) - missed} of {len(results)} targets met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
