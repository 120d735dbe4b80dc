"""Gradients of the collectives on 2 ranks: kiln's (eager) against finite differences of the
job's total loss (every rank's loss summed), and every compiled variant (capture_mode ast /
bytecode / trace x O0 / O1 / O2 x kbk / sink, forward and backward in one graph) against eager,
collectives inside a branch on a tensor included."""
from distributed_util import needs_mpi, run_ranks

pytestmark = needs_mpi

FINITE_DIFFERENCES = """
import numpy as np
import kiln
from kiln import communication
from kiln.ops import collective as C

communication.init()
r, n = communication.get_rank(), communication.get_group_size()
shape = (2 * n, 3)
x0 = np.random.RandomState(10 + r).randn(*shape)
x0[np.abs(x0) < 0.2] += 0.5  # prod divides by x: no element near 0
w = kiln.tensor(np.random.RandomState(20 + r).randn(*shape))


def local_loss(fn, x):
    y = fn(x)
    wy = w[: y.shape[0]] if y.shape[0] <= w.shape[0] else kiln.ops.concat([w] * n)
    return (wy * y.sin()).sum()


FNS = {
    "all_reduce sum": lambda x: C.all_reduce(x, "sum"),
    "all_reduce mean": lambda x: C.all_reduce(x, "mean"),
    "all_reduce max": lambda x: C.all_reduce(x, "max"),
    "all_reduce min": lambda x: C.all_reduce(x, "min"),
    "all_reduce prod": lambda x: C.all_reduce(x, "prod"),
    "all_gather": lambda x: C.all_gather(x),
    "reduce_scatter sum": lambda x: C.reduce_scatter(x, "sum"),
    "reduce_scatter mean": lambda x: C.reduce_scatter(x, "mean"),
    "broadcast root 1": lambda x: C.broadcast(x, 1),
    "reduce sum root 0": lambda x: C.reduce(x, 0, "sum"),
    "reduce mean root 1": lambda x: C.reduce(x, 1, "mean"),
}

eps = 1e-6
for name, fn in FNS.items():
    g = kiln.grad(lambda x: local_loss(fn, x))(kiln.tensor(x0)).numpy()
    numeric = np.zeros(shape)
    for q in range(n):  # every rank evaluates the job's loss with rank q's x moved
        for i in np.ndindex(*shape):
            total = []
            for sign in (1, -1):
                x = x0.copy()
                if r == q:
                    x[i] += sign * eps
                total.append(C.all_reduce(local_loss(fn, kiln.tensor(x)), "sum").item())
            if r == q:
                numeric[i] = (total[0] - total[1]) / (2 * eps)
    np.testing.assert_allclose(g, numeric, rtol=1e-5, atol=1e-7, err_msg=name)
print(f"rank {r} ok", flush=True)
"""

COMPILED = """
import numpy as np
import kiln
from kiln import communication
from kiln.ops import collective as C
from compiled_equal import assert_compiled_equal

communication.init()
r, n = communication.get_rank(), communication.get_group_size()


def step(x, w):
    y = C.all_reduce(x * w, "sum")
    z = C.all_gather(y.sin())
    s = C.reduce_scatter(z, "mean") * w
    return s.sum() + C.broadcast(x, 1).tanh().sum() + C.all_reduce(x, "max").sum() + C.reduce(x * x, 0).sum()


x = kiln.tensor(np.random.RandomState(r).randn(2 * n, 3).astype(np.float32))
w = kiln.tensor(np.random.RandomState(9).randn(2 * n, 3).astype(np.float32))
assert_compiled_equal(step, (x, w), (x * 2, w))
assert_compiled_equal(step, (x, w), (x * 2, w), grad=True)


def branch(x):
    # the condition is the same on every rank (an all-reduced value): each call runs the branch's
    # collectives on every rank or on none
    return kiln.ops.cond(C.all_reduce(x.sum()) > 0, lambda a: C.all_gather(a).sum(0) + 1,
                         lambda a: C.broadcast(a, 1).sum(0) * 2, (x,))


assert_compiled_equal(branch, (x.abs(),), (-x.abs(),), (x.abs(),))


def branch_if(x):
    if C.all_reduce(x.sum()) > 0:
        y = C.all_gather(x).sum(0) + 1
    else:
        y = C.broadcast(x, 1).sum(0) * 2
    return y


def exchange(x):
    # point to point between ranks 0 and 1: rank 0 sends, then receives; rank 1 the other way
    if r == 0:
        C.send(x * 2, 1, tag=5)
        return C.recv(tuple(x.shape), x.dtype, 1, tag=6) + x
    if r == 1:
        y = C.recv(tuple(x.shape), x.dtype, 0, tag=5)
        C.send(x * 3, 0, tag=6)
        return y + x
    return x


assert_compiled_equal(exchange, (x,), (x * 2,))

for level in ("O0", "O1"):
    for backend in ("kbk", "sink"):
        jf = kiln.jit(branch_if, capture_mode="ast", jit_level=level, backend=backend)
        for arg in (x.abs(), -x.abs(), x.abs()):
            np.testing.assert_allclose(jf(arg).numpy(), branch_if(arg).numpy(), rtol=1e-6)
        assert jf.cache_info().eager_calls == 0, jf.cache_info()
print(f"rank {r} ok", flush=True)
"""


def test_gradients_of_collectives_by_finite_differences():
    run_ranks(2, FINITE_DIFFERENCES)


def test_compiled_collectives_and_their_gradients_equal_eager():
    run_ranks(2, COMPILED, timeout=400)
