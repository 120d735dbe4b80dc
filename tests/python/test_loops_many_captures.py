"""A loop body reading more captured tensors that need gradients than a loop node's gradient
carries beside its loop values (32): each compiled variant reads them through one packed tensor
per dtype, and their gradients equal eager autograd's of the Python loop and central differences."""
import numpy as np
import pytest

import kiln
from kiln import ops

from conftest import to_numpy
from loop_variants import JIT_IDS, JIT_VARIANTS, assert_one_node, jitted

NW = 40


def weights(seed, n=NW):
    rng = np.random.default_rng(seed)
    return [kiln.tensor(rng.uniform(-0.5, 0.5, 3)) for _ in range(n)]


def make_losses(ws):
    def fori_loss(h):
        def body(i, h):
            total = h * 0.5
            for k, w in enumerate(ws):
                total = total + (h * w + k * 0.01).sin() * 0.05
            return total
        return (ops.fori_loop(0, 4, body, h) ** 2).sum()

    def scan_loss(h, xs):
        def step(h, x):
            acc = h * 0.5 + x
            for w in ws:
                acc = acc + (h * w).tanh() * 0.03
            return acc, acc.sum()
        h, ys = ops.scan(step, h, xs)
        return (h * h).sum() + (ys * ys).sum()

    def fori_loop_eager(h):
        for i in range(4):
            total = h * 0.5
            for k, w in enumerate(ws):
                total = total + (h * w + k * 0.01).sin() * 0.05
            h = total
        return (h ** 2).sum()

    return fori_loss, scan_loss, fori_loop_eager


def gradients(fn, ws, *args):
    """d fn / d (args..., ws...)."""
    for w in ws:
        w.requires_grad = True
    try:
        xs = [kiln.tensor(to_numpy(a)) for a in args]
        for x in xs:
            x.requires_grad = True
        fn(*xs).backward()
        return [to_numpy(x.grad) for x in xs] + [to_numpy(w.grad) for w in ws]
    finally:
        for w in ws:
            w.grad = None
            w.requires_grad = False


@pytest.mark.parametrize("variant", JIT_VARIANTS, ids=JIT_IDS)
def test_forty_captured_weights_needing_gradients(variant):
    ws = weights(1)
    fori_loss, _, fori_loop_eager = make_losses(ws)
    h = kiln.tensor(np.array([0.3, -0.2, 0.1]))
    want = gradients(fori_loop_eager, ws, h)
    fn = jitted(fori_loss, variant)
    got = gradients(fn, ws, h)
    assert len(got) == NW + 1
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)
    assert fn.explain().fallback is None


def test_scan_reading_forty_weights_central_differences():
    ws = weights(2)
    _, scan_loss, _ = make_losses(ws)
    rng = np.random.default_rng(3)
    h, xs = kiln.tensor(rng.standard_normal(3)), kiln.tensor(rng.standard_normal((5, 3)) * 0.3)
    fn = kiln.jit(scan_loss, capture_mode="trace")
    got = gradients(fn, ws, h, xs)
    eps = 1e-6
    for j in (0, 17, 39):  # a few of the weights, every element
        w = ws[j]
        base = to_numpy(w).copy()
        for i in range(3):
            vals = []
            for sign in (1, -1):
                b = base.copy()
                b[i] += sign * eps
                ws[j] = kiln.tensor(b)
                _, loss_j, _ = make_losses(ws)
                vals.append(float(to_numpy(loss_j(h, xs))))
            ws[j] = w
            np.testing.assert_allclose(got[2 + j][i], (vals[0] - vals[1]) / (2 * eps), rtol=1e-6, atol=1e-8)
    text = fn.graph_str(h, xs)
    assert_one_node(text, "while")


def test_kiln_trace_of_the_gradient_through_forty_weights():
    ws = weights(4)
    fori_loss, _, fori_loop_eager = make_losses(ws)
    h = kiln.tensor(np.array([0.2, 0.1, -0.4]))
    for w in ws:
        w.requires_grad = True
    try:
        want = kiln.grad(fori_loop_eager, 0, weights=ws)(h)
        tr = kiln.trace(lambda h: kiln.grad(fori_loss, 0, weights=ws)(h))
        for _ in range(2):
            got = tr(h)
            assert len(got) == 2 and len(got[1]) == NW
            np.testing.assert_allclose(to_numpy(got[0]), to_numpy(want[0]), rtol=1e-10, atol=1e-12)
            for g, w in zip(got[1], want[1]):
                np.testing.assert_allclose(to_numpy(g), to_numpy(w), rtol=1e-10, atol=1e-12)
    finally:
        for w in ws:
            w.requires_grad = False
