"""kiln.ops.scan and kiln.ops.map against the same steps in a Python loop: values and gradients
(central differences in float64, eager autograd of the loop), forward and reverse, xs=None with
length, Python-number carries and y's, eagerly, under every kiln.jit variant and kiln.trace, the
compiled graph holding the loop as one `while` node (its gradient one `while_grad`)."""
import numpy as np
import pytest

import kiln
from kiln import ops

from conftest import check_grad, to_numpy
from loop_variants import JIT_IDS, JIT_VARIANTS, O2_IDS, O2_VARIANTS, assert_one_node, jitted

STEPS, WIDTH = 5, 3


def step(w):
    def f(carry, x):
        h, n = carry
        h = (h * w + x).tanh()
        return (h, n + 1), {"h": h, "s": h.sum()}
    return f


def scanned(h0, xs, w, reverse=False):
    (h, n), ys = ops.scan(step(w), (h0, 0), xs, reverse=reverse)
    return h, n, ys["h"], ys["s"]


def python_loop(h0, xs, w, reverse=False):
    carry, hs, ss = (h0, 0), [None] * xs.shape[0], [None] * xs.shape[0]
    order = range(xs.shape[0] - 1, -1, -1) if reverse else range(xs.shape[0])
    for t in order:
        carry, y = step(w)(carry, xs[t])
        hs[t], ss[t] = y["h"], y["s"]
    return carry[0], carry[1], ops.stack(hs, 0), ops.stack(ss, 0)


def loss(h0, xs, w, reverse=False):
    h, n, hs, ss = scanned(h0, xs, w, reverse)
    return (h * h).sum() + (hs * hs.cos()).sum() + (ss * ss).sum() * n


def loop_loss(h0, xs, w, reverse=False):
    h, n, hs, ss = python_loop(h0, xs, w, reverse)
    return (h * h).sum() + (hs * hs.cos()).sum() + (ss * ss).sum() * n


def data(seed=0):
    rng = np.random.default_rng(seed)
    return (kiln.tensor(rng.standard_normal(WIDTH)), kiln.tensor(rng.standard_normal((STEPS, WIDTH))),
            kiln.tensor(rng.uniform(0.5, 1.5, WIDTH)))


def assert_same(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        if isinstance(w, int):
            assert type(g) is int and g == w, (g, w)
        else:
            np.testing.assert_allclose(to_numpy(g), to_numpy(w), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("reverse", [False, True])
def test_eager_scan_is_the_python_loop(reverse):
    args = data()
    assert_same(scanned(*args, reverse=reverse), python_loop(*args, reverse=reverse))


@pytest.mark.parametrize("variant", JIT_VARIANTS + O2_VARIANTS, ids=JIT_IDS + O2_IDS)
@pytest.mark.parametrize("reverse", [False, True])
def test_jitted_scan_is_one_while_node_equal_to_the_loop(variant, reverse):
    args = data(1)
    fn = jitted(lambda h0, xs, w: scanned(h0, xs, w, reverse), variant)
    want = python_loop(*args, reverse=reverse)
    assert_same(fn(*args), want)
    assert_same(fn(*args), want)  # (the compiled graph's run)
    assert_one_node(fn.graph_str(*args), "while")


@pytest.mark.parametrize("variant", JIT_VARIANTS + O2_VARIANTS, ids=JIT_IDS + O2_IDS)
def test_jitted_scan_gradient_equals_the_loops(variant):
    args = data(2)
    want = kiln.grad(loop_loss, (0, 1, 2))(*args)
    grad = kiln.grad(jitted(loss, variant), (0, 1, 2))
    for _ in range(2):
        for g, w in zip(grad(*args), want):
            np.testing.assert_allclose(to_numpy(g), to_numpy(w), rtol=1e-10, atol=1e-12)


def test_scan_gradient_by_central_differences_eager_and_jitted():
    rng = np.random.default_rng(3)
    h0, xs, w = rng.standard_normal(WIDTH), rng.standard_normal((STEPS, WIDTH)), rng.uniform(0.5, 1.5, WIDTH)
    for reverse in (False, True):
        check_grad(lambda a, b, c: scanned(a, b, c, reverse)[2:], h0, xs, w, rtol=1e-6, atol=1e-8)
        fn = kiln.jit(lambda a, b, c: scanned(a, b, c, reverse)[2:], capture_mode="trace")
        check_grad(fn, h0, xs, w, rtol=1e-6, atol=1e-8)


def test_kiln_trace_of_scan_and_of_its_gradient():
    args = data(4)
    tr = kiln.trace(lambda h0, xs, w: scanned(h0, xs, w, True))
    want = python_loop(*args, reverse=True)
    for _ in range(3):
        assert_same(tr(*args), want)
    assert_one_node(tr.graph_str(), "while")
    gtr = kiln.trace(lambda h0, xs, w: kiln.grad(loss, (0, 1, 2))(h0, xs, w))
    want = kiln.grad(loop_loss, (0, 1, 2))(*args)
    for _ in range(3):
        for g, w in zip(gtr(*args), want):
            np.testing.assert_allclose(to_numpy(g), to_numpy(w), rtol=1e-10, atol=1e-12)
    assert_one_node(gtr.graph_str(), "while", "while_grad")  # (the loss reads the ys: the forward runs too)


def counted(h0, w):
    """xs=None with length: f gets x=None; the carry holds a Python float and int."""
    def f(c, x):
        assert x is None
        h, k, total = c
        h = (h * w).sin() + 0.5
        return (h, k + 2, total + 0.25), h * k
    return ops.scan(f, (h0, 1, 0.5), None, length=4)


def counted_loop(h0, w):
    h, k, total, ys = h0, 1, 0.5, []
    for _ in range(4):
        h, k, total, y = (h * w).sin() + 0.5, k + 2, total + 0.25, ((h * w).sin() + 0.5) * k
        ys.append(y)
    return (h, k, total), ops.stack(ys, 0)


@pytest.mark.parametrize("variant", [None] + JIT_VARIANTS, ids=["eager"] + JIT_IDS)
def test_length_without_xs_and_number_carries(variant):
    h0, _, w = data(5)
    fn = counted if variant is None else jitted(counted, variant)
    (want_h, want_k, want_t), want_ys = counted_loop(h0, w)
    for _ in range(2):
        (h, k, total), ys = fn(h0, w)
        assert type(k) is int and k == want_k and type(total) is float and total == want_t
        np.testing.assert_allclose(to_numpy(h), to_numpy(want_h), rtol=1e-12)
        np.testing.assert_allclose(to_numpy(ys), to_numpy(want_ys), rtol=1e-12)
    if variant is not None:
        assert_one_node(fn.graph_str(h0, w), "while")


def many_leaves(x, xs):
    """A carry of 42 tensor leaves in a dict, a list and a tuple, and 12 arrays scanned over."""
    def f(c, x_t):
        d, lst, (a, b) = c
        d = {k: (v * 0.9 + x_t[int(k[1:]) % 12]).sin() for k, v in d.items()}
        lst = [v.cos() * x_t[j] for j, v in enumerate(lst)]
        return (d, lst, (a + b, b * 0.5)), [d["k3"].sum(), lst[0]]
    init = ({f"k{j}": x * (j + 1) for j in range(30)}, [x + j for j in range(10)], (x, x * 2))
    return ops.scan(f, init, [xs[j] for j in range(12)])


def many_leaves_loss(x, xs):
    (d, lst, (a, b)), ys = many_leaves(x, xs)
    return sum((v * v).sum() for v in d.values()) + sum(v.sum() for v in lst) + (a * b).sum() + \
        (ys[0] * ys[0]).sum() + ys[1].sum()


@pytest.mark.parametrize("mode", ["ast", "bytecode", "trace"])
def test_a_carry_of_42_leaves_and_12_scanned_arrays(mode):
    rng = np.random.default_rng(6)
    x, xs = kiln.tensor(rng.standard_normal(2)), kiln.tensor(rng.standard_normal((12, 4, 2)))
    fn = kiln.jit(many_leaves, capture_mode=mode)
    want, got = many_leaves(x, xs), fn(x, xs)
    assert isinstance(got[0][0], dict) and isinstance(got[0][1], list) and isinstance(got[0][2], tuple)
    for g, w in zip(_leaves(got), _leaves(want)):
        np.testing.assert_allclose(to_numpy(g), to_numpy(w), rtol=1e-12)
    assert_one_node(fn.graph_str(x, xs), "while")
    want_g = kiln.grad(many_leaves_loss, (0, 1))(x, xs)
    got_g = kiln.grad(kiln.jit(many_leaves_loss, capture_mode=mode), (0, 1))(x, xs)
    for g, w in zip(got_g, want_g):
        np.testing.assert_allclose(to_numpy(g), to_numpy(w), rtol=1e-10, atol=1e-12)


def _leaves(obj):
    if isinstance(obj, dict):
        return [v for k in sorted(obj) for v in _leaves(obj[k])]
    if isinstance(obj, (tuple, list)):
        return [v for o in obj for v in _leaves(o)]
    return [obj]


def doubled(xs):
    return ops.map(lambda x: {"sq": x * x, "sum": x.sum()}, xs)


@pytest.mark.parametrize("variant", [None] + JIT_VARIANTS[::3], ids=["eager"] + JIT_IDS[::3])
def test_map_stacks_f_of_each_row(variant):
    xs = data(7)[1]
    fn = doubled if variant is None else jitted(doubled, variant)
    got = fn(xs)
    a = to_numpy(xs)
    np.testing.assert_allclose(to_numpy(got["sq"]), a * a, rtol=1e-12)
    np.testing.assert_allclose(to_numpy(got["sum"]), a.sum(axis=1), rtol=1e-12)
    if variant is not None:
        assert_one_node(fn.graph_str(xs), "while")
