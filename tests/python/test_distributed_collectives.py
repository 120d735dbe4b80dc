"""Every collective on 2 and 3 ranks (mpirun, started here) against NumPy on the data of all
ranks, for float32, float64 and int32; groups, send/recv, barrier; and the errors every rank
gives when the ranks disagree (shapes, dtypes, which collective) instead of hanging."""
import pytest

from distributed_util import needs_mpi, run_ranks

pytestmark = needs_mpi

COLLECTIVES = """
import numpy as np
import kiln
from kiln import communication
from kiln.ops import collective as C

communication.init()
r, n = communication.get_rank(), communication.get_group_size()
assert communication.get_backend() == "mpi"


def data(rank, dtype, shape=(2 * n, 3)):
    rng = np.random.RandomState(100 + rank)
    return (rng.randint(1, 4, size=shape) if dtype == np.int32 else rng.randn(*shape)).astype(dtype)


def check(got, want, what):
    got = got.numpy()
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got.dtype, got.shape, want.dtype, want.shape)
    if want.dtype.kind == "f":
        np.testing.assert_allclose(got, want, rtol=1e-6 if want.dtype == np.float32 else 1e-12, err_msg=what)
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)


for dtype in (np.float32, np.float64, np.int32):
    every = np.stack([data(q, dtype) for q in range(n)])
    x = kiln.tensor(data(r, dtype))
    reductions = {"sum": every.sum(0), "max": every.max(0), "min": every.min(0), "prod": every.prod(0)}
    if dtype != np.int32:
        reductions["mean"] = every.mean(0).astype(dtype)
    for op, want in reductions.items():
        check(C.all_reduce(x, op), want.astype(dtype), f"all_reduce {op} {dtype}")
        rows = x.shape[0] // n
        check(C.reduce_scatter(x, op), want[r * rows:(r + 1) * rows].astype(dtype), f"reduce_scatter {op} {dtype}")
        check(C.reduce(x, n - 1, op), (want if r == n - 1 else np.zeros_like(want)).astype(dtype), f"reduce {op}")
    check(C.all_gather(x), np.concatenate(list(every)), f"all_gather {dtype}")
    for root in range(n):
        check(C.broadcast(x, root), every[root], f"broadcast root {root} {dtype}")
    # a strided (transposed) input gives what its contiguous copy gives
    check(C.all_reduce(x.transpose(1, 0)), every.sum(0).T.copy().astype(dtype), f"transposed {dtype}")

# int8 and float16 move by all_gather and broadcast
h = kiln.tensor(np.full((2,), r, np.float16))
check(C.all_gather(h), np.repeat(np.arange(n, dtype=np.float16), 2), "all_gather float16")

C.barrier()
# send / recv around a ring
y = kiln.tensor(np.full((3, 2), 10.0 * r, np.float32))
if r % 2 == 0:
    C.send(y, (r + 1) % n, tag=7)
    got = C.recv((3, 2), kiln.float32, (r - 1) % n, tag=7)
else:
    got = C.recv((3, 2), kiln.float32, (r - 1) % n, tag=7)
    C.send(y, (r + 1) % n, tag=7)
check(got, np.full((3, 2), 10.0 * ((r - 1) % n), np.float32), "ring")

# a group of ranks 0 and n - 1
if r in (0, n - 1):
    g = communication.create_group("ends", [0, n - 1])
    assert communication.get_group_size("ends") == 2
    assert communication.get_rank("ends") == (0 if r == 0 else 1)
    check(C.all_reduce(kiln.tensor(np.array([r + 1.0])), "sum", "ends"), np.array([float(n + 1)]), "group")
C.barrier()

# disagreements fail on every rank, naming what each rank called
def fails(fn, *needles, kind=ValueError):
    try:
        fn()
    except kind as e:
        for s in needles:
            assert s in str(e), (s, str(e))
        return
    raise AssertionError(f"no {kind.__name__}")

fails(lambda: C.all_reduce(kiln.tensor(np.ones(r + 2, np.float32))), "ranks called different", "rank 0: all_reduce(sum)"
      " of float32(2,)", "rank 1: all_reduce(sum) of float32(3,)", f"on rank {r} of {n}")
fails(lambda: C.all_reduce(kiln.tensor(np.ones(2, np.float32 if r else np.float64))), "float64", "float32")
fails(lambda: (C.all_reduce if r else C.all_gather)(kiln.tensor(np.ones(2, np.float32))), "all_gather", "all_reduce")
# the job goes on after them
check(C.all_reduce(kiln.tensor(np.ones(2, np.float32))), np.full(2, float(n), np.float32), "after errors")
# errors of one rank's own arguments
fails(lambda: C.all_reduce(kiln.tensor(np.ones(2, np.int32)), "mean"), "mean needs a floating-point", kind=TypeError)
fails(lambda: C.all_reduce(kiln.tensor(np.ones(2)), "avg"), "op must be one of")
fails(lambda: C.reduce_scatter(kiln.tensor(np.ones(n + 1)), "sum"), "must divide among the group")
fails(lambda: C.broadcast(kiln.tensor(np.ones(2)), n), "not a rank of the group")
fails(lambda: C.all_reduce(np.ones(2)), "expected a Tensor", kind=TypeError)
fails(lambda: C.all_reduce(kiln.tensor(np.ones(2)), group="nope"), "no communication group named")
# recv of another shape than was sent
if r == 0:
    C.send(kiln.tensor(np.ones((2, 2), np.float32)), 1, tag=3)
elif r == 1:
    fails(lambda: C.recv((4,), kiln.float32, 0, tag=3), "rank 0 sent float32(2, 2)")
C.barrier()
print(f"rank {r} ok", flush=True)
"""


@pytest.mark.parametrize("n", [2, 3])
def test_every_collective_against_numpy(n):
    run_ranks(n, COLLECTIVES)
