"""matmul and dense over several threads: kiln splits a large GEMM into row or column blocks per
OpenMP thread and spreads batches of GEMMs over the threads; every split, batch count and layout
must give NumPy's result, with 1, 2 and 3 threads."""
import numpy as np
import pytest

import kiln
from kiln import ops

from conftest import assert_close, make_rng, to_kiln

# (a shape, b shape): column splits (N >= M), row splits (M > N), N not a multiple of 16, batches
# that divide the thread count and that do not, a batch broadcast against a shared matrix
SHAPES = [((67, 300), (300, 129)), ((301, 90), (90, 70)), ((2, 64, 100), (2, 100, 97)),
          ((3, 80, 130), (3, 130, 80)), ((5, 1, 64, 70), (1, 4, 70, 66)), ((3, 70, 200), (200, 90)),
          ((1, 200), (200, 1500)), ((1500, 200), (200, 1))]


@pytest.fixture(params=[1, 2, 3], ids=lambda n: f"threads{n}")
def threads(request):
    before = kiln.get_num_threads()
    kiln.set_num_threads(request.param)
    yield request.param
    kiln.set_num_threads(before)


@pytest.mark.parametrize("shapes", SHAPES, ids=lambda s: f"{s[0]}@{s[1]}")
@pytest.mark.parametrize("layouts", [("contiguous", "contiguous"), ("transposed", "transposed"),
                                     ("strided", "transposed")], ids=lambda ls: "-".join(ls))
def test_matmul_split(shapes, layouts, threads):
    rng = make_rng(90)
    a = rng.standard_normal(shapes[0]).astype(np.float32)
    b = rng.standard_normal(shapes[1]).astype(np.float32)
    exp = np.matmul(a.astype(np.float64), b.astype(np.float64))
    got = ops.matmul(to_kiln(a, layout=layouts[0]), to_kiln(b, layout=layouts[1]))
    assert_close(got, exp, kiln.float32, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("bias", [False, True])
def test_dense_split(bias, threads):
    rng = make_rng(91)
    x = rng.standard_normal((3, 70, 160)).astype(np.float32)
    w = rng.standard_normal((130, 160)).astype(np.float32)
    b = rng.standard_normal(130).astype(np.float32)
    exp = x.astype(np.float64) @ w.T.astype(np.float64) + (b if bias else 0)
    got = ops.dense(kiln.Tensor(x), kiln.Tensor(w), kiln.Tensor(b) if bias else None)
    assert_close(got, exp, kiln.float32, rtol=1e-4, atol=1e-4)


def test_matmul_float64_split(threads):
    rng = make_rng(92)
    a, b = rng.standard_normal((2, 90, 110)), rng.standard_normal((2, 110, 100))
    assert_close(ops.matmul(kiln.Tensor(a), to_kiln(b, layout="transposed")), a @ b, kiln.float64, rtol=1e-10)
