"""Under dynamic shapes, sizes read from an input and passed to a creation op (zeros, ones, full,
arange, rand, randn, normal, uniform), a stack, or a reshape with -1 stay symbolic: one compiled
entry serves every batch size, and each call equals eager. Before, each of these fixed the size
("specialized: used as an int" / "the graph needs a fixed size here") and every new batch size
compiled again."""
import numpy as np
import pytest

import kiln
from kiln import ops

MODES = ("ast", "bytecode", "trace")
VARIANTS = [(m, lv, b) for m in MODES for lv in ("O0", "O1") for b in ("kbk", "sink")]
IDS = ["-".join(v) for v in VARIANTS]


def zeros_rows(x):
    return ops.zeros((x.shape[0], 3), kiln.float32) + x[:, :3]


def ones_positional(x):
    return ops.ones(x.shape[0], x.shape[1]) * x


def full_twice(x):
    n = x.shape[0]
    return ops.full((n, 2), 2.5) * x[:, 1:3] + ops.full((n * 2, 1), 1.0).reshape(n, 2)


def zeros_like_plus(x):
    return ops.zeros_like(x) + x * 2


def arange_rows(x):
    return ops.arange(x.shape[0]).astype(kiln.float32) + x[:, 0]


def arange_from(x):
    return ops.arange(1, x.shape[0] + 1, 2).astype(kiln.float32).sum() + x.sum()


def random_times_zero(x):
    n, m = x.shape
    return ops.randn(n, m) * 0 + ops.rand(n, m) * 0 + ops.normal((n, m)) * 0 + ops.uniform((n, m)) * 0 + x


def stacked(x):
    return ops.stack([x, x * 2, x + 1], 0).sum(0) + ops.stack([x, x], 1).sum(1)


def flat_view(x):
    return x.view(-1).sum() + x.reshape(-1, 2).sum(0).sum() + x.reshape(x.shape[0], -1).mean()


FUNCTIONS = [zeros_rows, ones_positional, full_twice, zeros_like_plus, arange_rows, arange_from,
             random_times_zero, stacked, flat_view]


def batch(n, seed=0):
    return kiln.Tensor(np.random.default_rng(seed + n).standard_normal((n, 4)).astype(np.float32))


@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
@pytest.mark.parametrize("fn", FUNCTIONS, ids=lambda f: f.__name__)
def test_one_entry_for_every_batch_size(fn, variant):
    mode, level, backend = variant
    f = kiln.jit(fn, capture_mode=mode, jit_level=level, backend=backend, dynamic=True)
    for n in (5, 6, 9, 13):
        x = batch(n)
        got, want = f(x), fn(x)
        assert got.shape == want.shape
        np.testing.assert_allclose(got.asnumpy(), want.asnumpy(), rtol=1e-6, atol=1e-6)
    info = f.cache_info()
    assert info.compiles == 1, info
    assert all("specialized" not in str(d["symbols"]) for d in info.dynamic), info


@pytest.mark.parametrize("fn", [zeros_rows, full_twice, stacked, flat_view], ids=lambda f: f.__name__)
def test_gradients_follow_the_batch(fn):
    f = kiln.jit(kiln.grad(lambda x: (fn(x) * fn(x)).sum()), dynamic=True)
    ref = kiln.grad(lambda x: (fn(x) * fn(x)).sum())
    for n in (5, 7, 11):
        x = batch(n, seed=3)
        np.testing.assert_allclose(f(x).asnumpy(), ref(x).asnumpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fn", [zeros_rows, stacked, flat_view, arange_rows], ids=lambda f: f.__name__)
def test_kiln_trace_symbolic_shape(fn):
    t = kiln.trace(fn, symbolic=True, symbolic_shape=True)
    for n in (5, 6, 9):
        x = batch(n, seed=1)
        np.testing.assert_allclose(t(x).asnumpy(), fn(x).asnumpy(), rtol=1e-6, atol=1e-6)


def test_a_size_used_in_arithmetic_on_a_python_list_still_specializes():
    """What Python computes from a size (a list of that many items) must fix it: the entry stays correct."""
    def f(x):
        return ops.stack([x[i] for i in range(x.shape[0])], 0).sum()

    g = kiln.jit(f, capture_mode="trace", dynamic=True)
    for n in (5, 6):
        x = batch(n)
        np.testing.assert_allclose(g(x).asnumpy(), f(x).asnumpy(), rtol=1e-6)
