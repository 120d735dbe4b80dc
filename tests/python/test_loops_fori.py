"""kiln.ops.fori_loop and MindSpore's ops.ForiLoop / ops.WhileLoop against Python loops: values and
gradients (central differences in float64, eager autograd of the loop), static and tensor bounds,
no step at all, pytree and Python-number carries, eagerly, under every kiln.jit variant and
kiln.trace, the compiled graph holding the loop as one `while` node."""
import numpy as np
import pytest

import kiln
from kiln import ops

from conftest import check_grad, to_numpy
from loop_variants import JIT_IDS, JIT_VARIANTS, O2_IDS, O2_VARIANTS, assert_one_node, jitted


def body(w):
    def f(i, val):
        h, acc = val["h"], val["acc"]
        h = (h * w).sin() + i * 0.1
        return {"h": h, "acc": [acc[0] + h.sum(), acc[1] * 2]}
    return f


def tensor_carried(h, w):
    return ops.fori_loop(1, 6, body(w), {"h": h, "acc": [ops.zeros((), dtype=kiln.float64), 3]})


def python_loop(h, w):
    val = {"h": h, "acc": [0.0, 3]}
    for i in range(1, 6):
        val = body(w)(ops.full((), i, dtype=kiln.int64), val)  # (fori_loop's i: a 0-d int64 tensor)
    return val


def loop_loss(h, w):
    out = python_loop(h, w)
    return (out["h"] * out["h"]).sum() + out["acc"][0] * out["acc"][1]


def data(seed):
    rng = np.random.default_rng(seed)
    return kiln.tensor(rng.standard_normal(4)), kiln.tensor(rng.uniform(0.5, 1.5, 4))


def assert_same(got, want):
    np.testing.assert_allclose(to_numpy(got["h"]), to_numpy(want["h"]), rtol=1e-12)
    np.testing.assert_allclose(float(got["acc"][0]), float(want["acc"][0]), rtol=1e-12)
    assert type(got["acc"][1]) is int and got["acc"][1] == want["acc"][1] == 3 * 2 ** 5


def test_eager_fori_loop_is_the_python_loop():
    h, w = data(0)
    assert_same(tensor_carried(h, w), python_loop(h, w))


def test_a_python_float_carry_that_becomes_a_tensor_is_refused_eagerly():
    h, w = data(0)
    with pytest.raises(ValueError, match=r"fori_loop: body_fun returns init_val\['acc'\]\[0\] as Tensor float32 \(\), "
                                         r"but it is a Python float in init_val"):
        ops.fori_loop(0, 2, lambda i, v: {"h": v["h"], "acc": [v["acc"][0] + v["h"].sum().float(), v["acc"][1]]},
                      {"h": h, "acc": [0.0, 3]})


@pytest.mark.parametrize("variant", JIT_VARIANTS + O2_VARIANTS, ids=JIT_IDS + O2_IDS)
def test_jitted_fori_loop_is_one_while_node_equal_to_the_loop(variant):
    h, w = data(1)
    fn = jitted(tensor_carried, variant)
    want = python_loop(h, w)
    for _ in range(2):
        assert_same(fn(h, w), want)
    assert_one_node(fn.graph_str(h, w), "while")


@pytest.mark.parametrize("variant", JIT_VARIANTS + O2_VARIANTS, ids=JIT_IDS + O2_IDS)
def test_jitted_fori_loop_gradient_equals_the_loops(variant):
    h, w = data(2)
    want = kiln.grad(loop_loss, (0, 1))(h, w)

    def tensor_loss(h, w):
        out = tensor_carried(h, w)
        return (out["h"] * out["h"]).sum() + out["acc"][0] * out["acc"][1]

    grad = kiln.grad(jitted(tensor_loss, variant), (0, 1))
    for _ in range(2):
        for g, e in zip(grad(h, w), want):
            np.testing.assert_allclose(to_numpy(g), to_numpy(e), rtol=1e-10, atol=1e-12)


def test_fori_loop_gradient_by_central_differences_eager_and_jitted():
    rng = np.random.default_rng(3)
    h, w = rng.standard_normal(4), rng.uniform(0.5, 1.5, 4)

    def fn(h, w):
        out = tensor_carried(h, w)
        return out["h"], out["acc"][0]

    check_grad(fn, h, w, rtol=1e-6, atol=1e-8)
    check_grad(kiln.jit(fn, capture_mode="ast"), h, w, rtol=1e-6, atol=1e-8)


def bounded(x, lo, hi):
    """Tensor bounds: the trip count is read at run time."""
    return ops.fori_loop(lo, hi, lambda i, v: v * 1.5 + i.astype(kiln.float64), x)


@pytest.mark.parametrize("variant", [None] + JIT_VARIANTS, ids=["eager"] + JIT_IDS)
def test_tensor_bounds_and_no_step(variant):
    x = data(4)[0]
    fn = bounded if variant is None else jitted(bounded, variant)
    for lo, hi in [(2, 7), (0, 3), (5, 5), (6, 2)]:
        want = to_numpy(x)
        for i in range(lo, hi):
            want = want * 1.5 + i
        got = fn(x, kiln.tensor(np.array(lo)), kiln.tensor(np.array(hi, dtype=np.int32)))
        np.testing.assert_allclose(to_numpy(got), want, rtol=1e-12)
    if variant is not None:
        assert_one_node(fn.graph_str(x, kiln.tensor(np.array(0)), kiln.tensor(np.array(1, dtype=np.int32))), "while")


def test_kiln_trace_of_fori_loop_and_its_gradient():
    h, w = data(5)
    tr = kiln.trace(tensor_carried)
    want = python_loop(h, w)
    for _ in range(3):
        assert_same(tr(h, w), want)
    assert_one_node(tr.graph_str(), "while")

    def only_h(h, w):
        return (tensor_carried(h, w)["h"] ** 2).sum()

    gtr = kiln.trace(lambda h, w: kiln.grad(only_h, (0, 1))(h, w))
    want = kiln.grad(lambda h, w: (python_loop(h, w)["h"] ** 2).sum(), (0, 1))(h, w)
    for _ in range(3):
        for g, e in zip(gtr(h, w), want):
            np.testing.assert_allclose(to_numpy(g), to_numpy(e), rtol=1e-10, atol=1e-12)
    assert_one_node(gtr.graph_str(), "while", "while_grad")  # (the loop's final h is read by the loss)


def counts(x):
    """Python numbers only in the carry beside a tensor: numbers come back as numbers."""
    return ops.fori_loop(0, 4, lambda i, c: (c[0] + 2, c[1] * 0.5, c[2] | (c[0] > 100), c[3] * 2), (1, 8.0, True, x))


@pytest.mark.parametrize("variant", [None] + JIT_VARIANTS, ids=["eager"] + JIT_IDS)
def test_python_number_carries(variant):
    x = data(6)[0]
    fn = counts if variant is None else jitted(counts, variant)
    for _ in range(2):
        n, f, b, t = fn(x)
        assert (type(n), type(f), type(b)) == (int, float, bool) and (n, f, b) == (9, 0.5, True)
        np.testing.assert_allclose(to_numpy(t), to_numpy(x) * 16, rtol=1e-12)


def negated(x):
    """`not` on a carried Python bool: a 0-d tensor's truth read in a compiled body."""
    return ops.fori_loop(0, 3, lambda i, c: (not c[0], c[1] * 2), (True, x))


def test_a_value_read_in_a_compiled_body_is_refused_not_frozen():
    x = data(7)[0]
    flag, y = negated(x)
    assert flag is False
    np.testing.assert_allclose(to_numpy(y), to_numpy(x) * 8)
    for fn in (kiln.jit(negated, capture_mode="trace"), kiln.trace(negated)):
        with pytest.raises(NotImplementedError, match=r"while_loop: body_fn reads a tensor's value into Python .* at "
                                                      r".*test_loops_fori.py:\d+"):
            fn(x)


def mindspore_style(x):
    total = ops.ForiLoop()(0, 4, lambda i, r: i + r, 0)
    y = ops.WhileLoop()(lambda v: v[0].sum() < 100, lambda v: (v[0] * 2 + 1, v[1] + 1), (x, 0))
    return total, y


@pytest.mark.parametrize("variant", [None] + JIT_VARIANTS, ids=["eager"] + JIT_IDS)
def test_mindspore_fori_loop_and_while_loop_primitives(variant):
    x = kiln.tensor(np.array([1.0, 2.0]))
    fn = mindspore_style if variant is None else jitted(mindspore_style, variant)
    total, (y, steps) = fn(x)
    assert total == 6 and type(total) is int
    want, n = np.array([1.0, 2.0]), 0
    while want.sum() < 100:
        want, n = want * 2 + 1, n + 1
    np.testing.assert_allclose(to_numpy(y), want)
    assert steps == n and type(steps) is int
    if variant is not None:
        assert_one_node(fn.graph_str(x), "while", "while")  # (ForiLoop, then WhileLoop)


def test_mindspore_examples_eagerly():
    assert ops.ForiLoop()(0, 4, lambda index, res: index + res, 0) == 6
    assert ops.WhileLoop()(lambda v: v < 100, lambda v: v + 1, 10) == 100
    assert ops.Scan()(lambda res, el: (res + el, res + el), 0, [1, 2, 3, 4]) == (10, [1, 3, 6, 10])
