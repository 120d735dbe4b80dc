"""Tensor methods scripts ported from PyTorch call (kiln/_tensor_torch.py), each against NumPy,
eagerly and under every kiln.jit variant, with gradients where they differentiate."""
import numpy as np
import pytest

import kiln
from kiln import ops

from conformance import run_all_modes

RNG = np.random.default_rng(0)
A = RNG.standard_normal((3, 5)).astype(np.float32)
B = RNG.standard_normal((5, 4)).astype(np.float32)
C3 = RNG.standard_normal((2, 3, 4)).astype(np.float32)


def t(a):
    return kiln.Tensor(a)


def lower_median(a, axis):
    s = np.sort(a, axis=axis)
    return np.take(s, (a.shape[axis] - 1) // 2, axis=axis)


CASES = {
    "eq": (lambda x: x.eq(0.5), lambda a: a == 0.5),
    "ne lt le gt ge": (lambda x: (x.ne(0.1), x.lt(0.0), x.le(0.2), x.gt(-0.3), x.ge(1.0)),
                       lambda a: (a != 0.1, a < 0.0, a <= 0.2, a > -0.3, a >= 1.0)),
    "logical_not": (lambda x: (x > 0).logical_not(), lambda a: ~(a > 0)),
    "sign reciprocal frac": (lambda x: (x.sign(), (x + 3).reciprocal(), (x * 3).frac()),
                             lambda a: (np.sign(a), 1 / (a + 3), np.modf(a * 3)[0])),
    "where": (lambda x: x.where(x > 0, -x), lambda a: np.where(a > 0, a, -a)),
    "mm and t": (lambda x: x.mm(t(B)).t(), lambda a: (a @ B).T),
    "bmm": (lambda x: t(C3).bmm(t(C3).transpose(0, 2, 1)), lambda a: C3 @ C3.transpose(0, 2, 1)),
    "view_as reshape_as": (lambda x: (x.view_as(t(A.reshape(5, 3))), x.reshape_as(t(A.reshape(15)))),
                           lambda a: (a.reshape(5, 3), a.reshape(15))),
    "chunk": (lambda x: x.chunk(2, 1), lambda a: tuple(np.array_split(a, 2, 1))),
    "narrow select": (lambda x: (x.narrow(1, 1, 3), x.select(1, 2), x.select(0, -1)),
                      lambda a: (a[:, 1:4], a[:, 2], a[-1])),
    "split_with_sizes": (lambda x: x.split_with_sizes([2, 3], 1), lambda a: (a[:, :2], a[:, 2:])),
    "tensor_split": (lambda x: (x.tensor_split(3, 1), x.tensor_split([1, -1], 1), x.hsplit(2), x.vsplit([1])),
                     lambda a: (tuple(np.array_split(a, 3, 1)), tuple(np.split(a, [1, 4], 1)),
                                tuple(np.array_split(a, 2, 1)), tuple(np.split(a, [1], 0)))),
    "flips": (lambda x: (x.fliplr(), x.flipud()), lambda a: (np.fliplr(a), np.flipud(a))),
    "diagonal": (lambda x: (x.diagonal(), x.diagonal(2), x.diagonal(-1), t(C3).diagonal(0, 1, 2),
                            t(C3).diagonal(1, 0, 2)),
                 lambda a: (np.diagonal(a), np.diagonal(a, 2), np.diagonal(a, -1), np.diagonal(C3, 0, 1, 2),
                            np.diagonal(C3, 1, 0, 2))),
    "take": (lambda x: x.take(t(np.array([[0, 7], [-1, 3]]))), lambda a: np.take(a, [[0, 7], [-1, 3]])),
    "median kthvalue": (lambda x: (x.median(), x.median(1)[0], x.median(0, keepdim=True)[0], x.kthvalue(2, 1)[0],
                                   x.kthvalue(3, 0)[1]),
                        lambda a: (lower_median(a.reshape(-1), 0), lower_median(a, 1),
                                   lower_median(a, 0)[None], np.sort(a, 1)[:, 1], np.argsort(a, 0, kind="stable")[2])),
    "new tensors": (lambda x: (x.new_zeros(2, 3), x.new_ones((2,)), x.new_full((2, 2), 7.0), x.new_empty(3),
                               x.new_tensor([1, 2])),
                    lambda a: (np.zeros((2, 3), np.float32), np.ones(2, np.float32), np.full((2, 2), 7, np.float32),
                               np.zeros(3, np.float32), np.array([1, 2], np.float32))),
}


def compare(got, want):
    if isinstance(want, tuple):
        assert isinstance(got, (tuple, list)) and len(got) == len(want)
        for g, w in zip(got, want):
            compare(g, w)
        return
    g = got.asnumpy()
    assert g.shape == np.shape(want), (g.shape, np.shape(want))
    if g.dtype == np.bool_:
        np.testing.assert_array_equal(g, want)
    else:
        np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-6)
        assert g.dtype == np.asarray(want).dtype or np.asarray(want).dtype.kind == "i"


@pytest.mark.parametrize("name", sorted(CASES))
def test_against_numpy(name):
    method, reference = CASES[name]
    compare(method(t(A)), reference(A))


@pytest.mark.parametrize("name", sorted(CASES))
def test_compiled_equal_eager(name):
    method, _ = CASES[name]
    run_all_modes(method, (t(A),), (t(A * 2 - 1),))


def test_in_place_methods():
    def f(x, idx):
        y = x.clone()
        y.masked_fill_(y > 0.5, 0.0)
        y.index_add_(0, idx, ops.ones((2, 5)), alpha=2)
        y.scatter_add_(1, ops.zeros((3, 1), dtype=kiln.int64), ops.ones((3, 1)))
        y.scatter_(1, ops.ones((3, 1), dtype=kiln.int64), value=9.0)
        return y

    idx = t(np.array([0, 2], np.int64))
    y = f(t(A), idx).asnumpy()
    want = np.where(A > 0.5, 0, A)
    want[[0, 2]] += 2
    want[:, 0] += 1
    want[:, 1] = 9
    np.testing.assert_allclose(y, want, rtol=1e-6)
    run_all_modes(f, (t(A), idx), (t(A * 3), idx))


def test_random_fills_and_facts():
    x = kiln.Tensor(np.zeros((200, 50), np.float32))
    u = x.clone().uniform_(2.0, 3.0).asnumpy()
    assert u.min() >= 2.0 and u.max() < 3.0 and abs(u.mean() - 2.5) < 0.05
    n = x.clone().normal_(1.0, 2.0).asnumpy()
    assert abs(n.mean() - 1.0) < 0.1 and abs(n.std() - 2.0) < 0.1
    assert x.device == "cpu" and x.itemsize == 4 and x.nbytes == 200 * 50 * 4
    assert kiln.Tensor(np.zeros(3, np.int8)).nbytes == 3


def test_gradients_through_the_new_methods():
    def loss(x):
        parts = x.chunk(2, 1)
        return ((parts[0] ** 2).sum() + x.diagonal().sum() * 3 + x.t().mm(x).sum() + x.narrow(0, 1, 2).sum()
                + x.median(1)[0].sum() + x.take(t(np.array([4, 9]))).sum())

    x = A.astype(np.float64)
    got = kiln.grad(loss)(kiln.Tensor(x)).asnumpy()
    eps, num = 1e-6, np.zeros_like(x)
    for i in np.ndindex(x.shape):
        hi, lo = x.copy(), x.copy()
        hi[i] += eps
        lo[i] -= eps
        num[i] = (loss(kiln.Tensor(hi)).asnumpy() - loss(kiln.Tensor(lo)).asnumpy()) / (2 * eps)
    np.testing.assert_allclose(got, num, rtol=1e-5, atol=1e-6)


def test_bad_arguments_name_the_method():
    x = t(A)
    with pytest.raises(ValueError, match="Tensor.mm: both operands must be 2-D"):
        x.mm(t(C3))
    with pytest.raises(ValueError, match="Tensor.t: expects at most 2 dimensions"):
        t(C3).t()
    with pytest.raises(ValueError, match="Tensor.kthvalue: k must be in"):
        x.kthvalue(9, 1)
    with pytest.raises(IndexError, match="Tensor.select: dim 4 is out of range"):
        x.select(4, 0)
    with pytest.raises(ValueError, match="Tensor.diagonal: dim1 and dim2 must differ"):
        x.diagonal(0, 1, 1)
