"""kiln.ops.cond and kiln.ops.while_loop: eager Python control flow, and under kiln.jit (trace)
one `if` / `while` node deciding at run time; gradients through both against eager autograd and
central differences; errors."""
import numpy as np
import pytest

import kiln
from kiln import nn, ops

from conftest import check_grad, numeric_grad, to_numpy

LEVELS = ["O0", "O1"]


def jit(fn, level="O0"):
    return kiln.jit(fn, capture_mode="trace", jit_level=level)


def T(a, dtype=kiln.float64):
    return kiln.Tensor(np.asarray(a, dtype=np.float64), dtype)


def close(got, want, rtol=1e-6, atol=1e-9):
    if isinstance(want, (tuple, list)):
        assert isinstance(got, type(want)) and len(got) == len(want)
        for g, w in zip(got, want):
            close(g, w, rtol, atol)
        return
    np.testing.assert_allclose(to_numpy(got), to_numpy(want), rtol=rtol, atol=atol)


# ---- cond ---------------------------------------------------------------------------------


def branchy(x, w):
    return ops.cond(x.sum() > 0, lambda a: (a * w).sin() + 1.0, lambda a: a * a - w, (x,))


@pytest.mark.parametrize("level", LEVELS)
def test_cond_takes_the_branch_of_each_call(level):
    jf = jit(branchy, level)
    rng = np.random.default_rng(0)
    w = T(rng.standard_normal((2, 3)))
    for sign in (1, -1, 1, -1):
        x = T(sign * (np.abs(rng.standard_normal((2, 3))) + 0.1))
        close(jf(x, w), branchy(x, w))
    info = jf.cache_info()
    assert info.compiles == 1 and info.hits == 3
    text = jf.graph_str(x, w)
    assert text.count("= if(") == 1 and "subgraph 1:" in text
    assert "sin(" in text and "sub(" in text  # both branches are subgraphs


def test_cond_static_predicate_and_structures():
    x = T([1.0, 2.0])
    # a Python bool decides while tracing: no if node
    jf = jit(lambda a: ops.cond(True, lambda v: v * 2, lambda v: v * 3, (a,)))
    close(jf(x), x * 2)
    assert "if(" not in jf.graph_str(x)

    def nested(a, b):
        return ops.cond(a.sum() < b.sum(), lambda u, v: (u + v, [u * v, v]), lambda u, v: (u - v, [v, u * 2]), (a, b))

    jn = jit(nested)
    y = T([5.0, 7.0])
    for args in ((x, y), (y, x)):
        got, want = jn(*args), nested(*args)
        assert isinstance(got, tuple) and isinstance(got[1], list)
        close(got, want)


def test_cond_predicate_of_any_dtype():
    for dtype, values in ((kiln.int64, (0, 3)), (kiln.float32, (0.0, -2.5)), (kiln.bool, (False, True))):
        jf = jit(lambda p, a: ops.cond(p, lambda v: v + 1, lambda v: v - 1, (a,)))
        x = T([1.0])
        for v in values:
            p = kiln.Tensor(np.array(v), dtype)
            close(jf(p, x), x + 1 if v else x - 1)


def test_cond_reads_closures_and_cell_parameters():
    net = nn.Dense(3, 3, dtype=kiln.float64)
    scale = T([0.5, 2.0, -1.0])

    def f(x):
        return ops.cond(x.mean() > 0, lambda a: net(a) * scale, lambda a: a * scale, (x,))

    jf = jit(f)
    rng = np.random.default_rng(1)
    for sign in (1, -1):
        x = T(sign * np.abs(rng.standard_normal((4, 3))))
        close(jf(x), f(x))
    text = jf.graph_str(x)
    # the parameters and the closure tensor are inputs of the node, not hidden in its subgraphs
    if_line = next(line for line in text.splitlines() if "= if(" in line)
    assert if_line.count("%") >= 1 + 1 + 1 + 3  # result, pred, x, weight/bias/scale
    assert "parameter" not in text.split("subgraph 0:")[1]
    # the parameters are read at every call, not frozen
    net.weight.set_data(net.weight * 2)
    x = T(np.abs(rng.standard_normal((4, 3))))
    close(jf(x), f(x))


# ---- while_loop ---------------------------------------------------------------------------------


def shrink(x, s):
    return ops.while_loop(lambda v: v.sum() > s, lambda v: v * 0.9 + 0.01, (x,))[0]


@pytest.mark.parametrize("level", LEVELS)
def test_while_trip_count_follows_the_data(level):
    jf = jit(shrink, level)
    s = T(2.0)
    counts = []
    for start in (1.0, 5.0, 0.1, 30.0):  # 0.1: no iteration at all
        x = T(np.full((2, 3), start))
        close(jf(x, s), shrink(x, s))
        n, v = 0, np.full((2, 3), start)
        while v.sum() > 2.0:
            v, n = v * 0.9 + 0.01, n + 1
        counts.append(n)
        close(jf(x, s), T(v))
    assert counts[2] == 0 and len(set(counts)) == 4
    assert jf.cache_info().compiles == 1
    text = jf.graph_str(x, s)
    assert "= while(" in text
    if level == "O1":  # the loop body is optimized too: its elementwise chain is one fused group
        assert "= fused(" in text.split("subgraph 1:")[1]


def test_while_with_counter_and_list_values():
    def f(x):
        return ops.while_loop(lambda v, i: v.max() < 100, lambda v, i: [v * 2, i + 1],
                              [x, ops.zeros((), dtype=kiln.int64)])

    jf = jit(f)
    for start in (1.0, 3.0, 200.0):
        x = T([start, 1.0])
        got, want = jf(x), f(x)
        assert isinstance(got, list)
        close(got, want)
        assert got[1].dtype is kiln.int64
    assert int(jf(T([1.0, 1.0]))[1].item()) == 7


def test_nested_control_flow():
    def f(x, limit):
        def body(v, n):
            v = ops.cond(v.sum() < 10, lambda a: a * 2, lambda a: a + 1, (v,))
            return v, n + 1

        def outer_true(a):
            return ops.while_loop(lambda v, n: v.sum() < limit, body, (a, ops.zeros((), dtype=kiln.int64)))

        return ops.cond(x.min() > 0, outer_true, lambda a: (-a, ops.zeros((), dtype=kiln.int64)), (x,))

    jf = jit(f)
    limit = T(40.0)
    for x in (T([0.5, 1.0, 1.5]), T([2.0, 3.0, 0.25]), T([-1.0, 1.0, 1.0])):
        close(jf(x, limit), f(x, limit))
    text = jf.graph_str(x, limit)
    assert text.count("= if(") == 2 and text.count("= while(") == 1


# ---- gradients ---------------------------------------------------------------------------------


def loop_fn(x, w):
    v, _ = ops.while_loop(lambda v, i: ops.logical_and(v.abs().sum() < 20, i < 40),
                          lambda v, i: (v * 1.5 + (v * w).tanh(), i + 1), (x, ops.zeros((), dtype=kiln.int64)))
    return (v * v).sum()


def cond_fn(x, w):
    return (branchy(x, w) * x).sum()


@pytest.mark.parametrize("fn", [cond_fn, loop_fn])
@pytest.mark.parametrize("level", LEVELS)
def test_gradients_match_eager_and_finite_differences(fn, level):
    rng = np.random.default_rng(2)
    jf = jit(fn, level)
    for trial in range(4):
        x = rng.standard_normal((2, 3)) * (1 if trial % 2 else -1) + (0.3 if trial % 2 else -0.3)
        w = rng.standard_normal((2, 3))
        xt, wt = T(x), T(w)
        value_e, grads_e = kiln.value_and_grad(fn, (0, 1))(xt, wt)
        value_j, grads_j = kiln.value_and_grad(jf, (0, 1))(xt, wt)
        close(value_j, value_e)
        close(grads_j, grads_e)
        for k in (0, 1):
            fd = numeric_grad(fn, [x, w], k, [np.ones(())])
            np.testing.assert_allclose(to_numpy(grads_j[k]), fd, rtol=1e-5, atol=1e-6)
    variant = next(iter(jf._grad_variants.values()))
    assert variant.cache_info().compiles == 1 and variant.cache_info().eager_calls == 0
    text = variant.graph_str(xt, wt)
    if fn is loop_fn:
        assert "= while(" in text and "= while_grad(" in text
    else:
        assert text.count("= if(") == 2  # forward, and the backward over both branches' gradients


def test_eager_gradients_through_cond_and_loop():
    rng = np.random.default_rng(3)
    check_grad(lambda x, w: branchy(x, w), rng.standard_normal((2, 3)) + 1, rng.standard_normal((2, 3)))
    check_grad(lambda x, w: branchy(x, w), rng.standard_normal((2, 3)) - 1, rng.standard_normal((2, 3)))
    check_grad(loop_fn, rng.standard_normal((2, 3)), rng.standard_normal((2, 3)))


def test_gradients_reach_cell_parameters_through_a_loop():
    net = nn.Dense(3, 3, dtype=kiln.float64)
    params = net.trainable_params()

    def f(x):
        v, _ = ops.while_loop(lambda v, n: n < 3, lambda v, n: (net(v).tanh(), n + 1), (x, ops.zeros((), dtype=kiln.int64)))
        return (v * v).sum()

    jf = jit(f)
    x = T(np.random.default_rng(4).standard_normal((2, 3)))
    value_e, (gx_e, gw_e) = kiln.value_and_grad(f, 0, params)(x)
    value_j, (gx_j, gw_j) = kiln.value_and_grad(jf, 0, params)(x)
    close(value_j, value_e)
    close(gx_j, gx_e)
    close(gw_j, gw_e)
    # finite differences on one weight entry
    w = net.weight
    base = to_numpy(w).copy()
    eps = 1e-6
    vals = []
    for d in (eps, -eps):
        bumped = base.copy()
        bumped[1, 2] += d
        w.set_data(T(bumped))
        with kiln.no_grad():
            vals.append(f(x).item())
    w.set_data(T(base))
    np.testing.assert_allclose(to_numpy(gw_j[0])[1, 2], (vals[0] - vals[1]) / (2 * eps), rtol=1e-5)


def test_gradients_through_a_cond_inside_a_loop():
    def f(x, w):
        def body(v, n):
            v = ops.cond(v.sum() < 3, lambda a: a * w + 0.5, lambda a: (a * 0.5).sin(), (v,))
            return v, n + 1

        v, _ = ops.while_loop(lambda v, n: n < 6, body, (x, ops.zeros((), dtype=kiln.int64)))
        return (v * v).sum()

    jf = jit(f)
    rng = np.random.default_rng(5)
    for _ in range(2):
        x, w = rng.standard_normal((2, 3)), rng.standard_normal((2, 3))
        value_e, grads_e = kiln.value_and_grad(f, (0, 1))(T(x), T(w))
        value_j, grads_j = kiln.value_and_grad(jf, (0, 1))(T(x), T(w))
        close(value_j, value_e)
        close(grads_j, grads_e)
        for k in (0, 1):
            np.testing.assert_allclose(to_numpy(grads_j[k]), numeric_grad(f, [x, w], k, [np.ones(())]),
                                       rtol=1e-5, atol=1e-6)


def test_branches_without_operands_differentiate_what_they_read():
    def f(p, w):
        return ops.cond(p, lambda: w * 2, lambda: w.exp(), ()).sum()

    jf = jit(f)
    w = T([0.5, -1.0])
    for taken in (True, False, True):
        p = kiln.Tensor(np.array(taken))
        close(kiln.grad(jf, 1)(p, w), kiln.grad(f, 1)(p, w))
        close(kiln.grad(jf, 1)(p, w), T([2.0, 2.0]) if taken else w.exp())


def test_gradient_of_a_loop_that_does_not_run():
    jf = jit(loop_fn)
    x = T(np.full((2, 3), 10.0))  # |x|.sum() = 60 >= 20
    w = T(np.ones((2, 3)))
    value, (gx, gw) = kiln.value_and_grad(jf, (0, 1))(x, w)
    close(value, T(600.0))
    close(gx, T(np.full((2, 3), 20.0)))
    close(gw, T(np.zeros((2, 3))))


# ---- errors ---------------------------------------------------------------------------------------


def test_branch_mismatch_errors():
    x = T([1.0, 2.0])
    with pytest.raises(ValueError, match=r"output 0 of true_fn is float64 \(2,\) but output 0 of false_fn is "
                                         r"float64 \(1,\)"):
        jit(lambda a: ops.cond(a.sum() > 0, lambda v: v, lambda v: v.sum(keepdims=True), (a,)))(x)
    with pytest.raises(ValueError, match=r"output 1 of true_fn is float64 \(2,\) but output 1 of false_fn is "
                                         r"float32 \(2,\)"):
        jit(lambda a: ops.cond(a.sum() > 0, lambda v: (v, v), lambda v: (v, v.astype(kiln.float32)), (a,)))(x)
    with pytest.raises(ValueError, match=r"true_fn returns \(Tensor, Tensor\) but false_fn returns Tensor"):
        jit(lambda a: ops.cond(a.sum() > 0, lambda v: (v, v), lambda v: v, (a,)))(x)
    with pytest.raises(ValueError, match=r"the predicate must have one element, got shape \(2,\)"):
        ops.cond(x > 0, lambda v: v, lambda v: v, (x,))
    with pytest.raises(TypeError, match="operand 1 must be a Tensor, got int"):
        ops.cond(x.sum() > 0, lambda v, k: v, lambda v, k: v, (x, 3))


def test_loop_body_errors():
    x = T([1.0, 2.0])
    with pytest.raises(ValueError, match=r"body_fn returns loop value 0 as float64 \(1,\), but it is float64 \(2,\)"):
        jit(lambda a: ops.while_loop(lambda v: v.sum() < 10, lambda v: (v.sum(keepdims=True),), (a,)))(x)
    with pytest.raises(ValueError, match="body_fn returns loop value 0 as float64"):
        ops.while_loop(lambda v: v.sum() < 10, lambda v: (v.sum(keepdims=True),), (x,))  # eager too
    with pytest.raises(ValueError, match="body_fn must return 2 loop values like init_vals, got 1 values"):
        jit(lambda a: ops.while_loop(lambda v, w: v.sum() < 10, lambda v, w: (v,), (a, a)))(x)
    with pytest.raises(ValueError, match=r"the value of cond_fn must have one element, got shape \(2,\)"):
        jit(lambda a: ops.while_loop(lambda v: v < 10, lambda v: (v * 2,), (a,)))(x)
    with pytest.raises(TypeError, match="init_vals must be a tuple or list"):
        ops.while_loop(lambda v: v.sum() < 10, lambda v: v, x)


def test_bodies_must_be_pure():
    x = T([1.0, 2.0])

    def writes(v):
        c = v * 1
        c[0] = 5.0
        return c

    with pytest.raises(NotImplementedError, match="writes a tensor in place"):
        jit(lambda a: ops.cond(a.sum() > 0, writes, lambda v: v * 2, (a,)))(x)
    with pytest.raises(NotImplementedError, match="draws random numbers"):
        jit(lambda a: ops.while_loop(lambda v: v.sum() < 10, lambda v: (ops.dropout(v, 0.5) + 1,), (a,)))(x)
    # eagerly both are plain Python
    close(ops.cond(x.sum() > 0, writes, lambda v: v * 2, (x,)), T([5.0, 2.0]))


def test_run_time_error_in_a_body_names_the_op_and_line():
    def f(x, i, limit):
        def body(v, k):
            picked = ops.gather(v, k, 0)  # out of range once k reaches 3
            return v + picked, k + 1

        return ops.while_loop(lambda v, k: (k < limit).all(), body, (x, i))

    jf = jit(f)
    x = T([1.0, 2.0, 3.0])
    i = kiln.Tensor(np.array([0]), kiln.int64)
    pattern = r"in the loop body: gather \(.*test_control_flow\.py:\d+\): gather: index 3 is out of range"
    with pytest.raises(IndexError, match=pattern):  # while tracing
        jf(x, i, kiln.Tensor(np.array(5), kiln.int64))
    close(jf(x, i, kiln.Tensor(np.array(3), kiln.int64)), f(x, i, kiln.Tensor(np.array(3), kiln.int64)))
    with pytest.raises(IndexError, match=r"while \(.*test_control_flow\.py:\d+\): " + pattern):  # compiled
        jf(x, i, kiln.Tensor(np.array(5), kiln.int64))
    assert jf.cache_info().compiles == 1


@pytest.mark.parametrize("level", LEVELS)
def test_while_values_that_alias_inputs_and_lifted_tensors(level):
    # the loop values swap, pass through and take a lifted tensor; the cond reads two lifted ones
    w, scale = T([1.0, 2.0, 4.0]), T(0.5)

    def f(a, b, c, limit):
        def cond_fn(a, b, c, i):
            return (a * scale).sum() + w.sum() * 0 < limit

        def body(a, b, c, i):
            return a + w, a, w, i + 1

        return ops.while_loop(cond_fn, body, (a, b, c, ops.zeros((), dtype=kiln.int64)))

    jf = jit(f, level)
    a, b, c = T([0.5, 1.0, 1.5]), T([-1.0, -2.0, -3.0]), T([7.0, 8.0, 9.0])
    before = [to_numpy(t).copy() for t in (a, b, c)]
    for limit in (0.0, 3.0, 6.0, 9.0, 30.0):  # 0, 1, 2, 3, ... iterations: both buffer sets end the loop
        got, want = jf(a, b, c, T(limit)), f(a, b, c, T(limit))
        close(got, want)
        n, av, bv, cv = 0, to_numpy(a), to_numpy(b), to_numpy(c)
        while (av * 0.5).sum() < limit:
            av, bv, cv, n = av + to_numpy(w), av, to_numpy(w), n + 1
        close(got, (T(av), T(bv), T(cv), kiln.Tensor(np.array(n), kiln.int64)))
    for t, v in zip((a, b, c), before):
        np.testing.assert_array_equal(to_numpy(t), v)  # the caller's tensors are never written
    assert jf.cache_info().compiles == 1


def test_run_time_error_in_a_loop_condition_names_it():
    def f(x, i, limit):  # v[k] over v = x * 2**k: 1, 4, 12, then k = 3 is out of range
        return ops.while_loop(lambda v, k: ops.gather(v, k, 0).sum() < limit, lambda v, k: (v * 2, k + 1), (x, i))

    jf = jit(f)
    x = T([1.0, 2.0, 3.0])
    i = kiln.Tensor(np.array([0]), kiln.int64)
    pattern = r"in the loop condition: gather \(.*test_control_flow\.py:\d+\): gather: index 3 is out of range"
    close(jf(x, i, T(10.0)), f(x, i, T(10.0)))
    with pytest.raises(IndexError, match=r"while \(.*test_control_flow\.py:\d+\): " + pattern):  # compiled
        jf(x, i, T(100.0))
    assert jf.cache_info().compiles == 1

def test_second_order_gradients():
    def f(x):
        return ops.cond(x.sum() > 0, lambda a: (a * a * a).sum(keepdims=True), lambda a: a.sum(keepdims=True),
                        (x,)).sum()

    jf = jit(f)
    x = T([1.0, 2.0])
    close(kiln.grad(lambda v: kiln.grad(jf)(v).sum())(x), T([6.0, 12.0]))

    def h(x):
        return ops.while_loop(lambda v, n: n < 2, lambda v, n: (v * v, n + 1),
                              (x, ops.zeros((), dtype=kiln.int64)))[0].sum()

    close(kiln.grad(jit(h))(x), T([4.0, 32.0]))  # d x^4 / dx
    # differentiating a loop's gradient again is refused, not silently zero
    with pytest.raises(NotImplementedError, match="gradients of gradients through a while loop"):
        kiln.grad(jit(lambda v: kiln.grad(h)(v).sum()))(x)


@pytest.mark.parametrize("backend, level", [("sink", "O0"), ("sink", "O2"), ("kbk", "O1")])
def test_control_flow_under_every_backend(backend, level):
    # bodies registered by other captures first, so a graph's subgraph indices and the process-wide
    # body ids differ: each node must run its own subgraphs
    jit(branchy)(T([1.0, 2.0]), T([0.5, 0.5]))

    def f(x, s):
        x = ops.while_loop(lambda v, lim: v.sum() > lim, lambda v, lim: (v * 0.5, lim), (x, s))[0]
        return ops.cond(x.mean() > 0.1, lambda v: v + 1.0, lambda v: v - 1.0, (x,))

    jf = kiln.jit(f, capture_mode="trace", backend=backend, jit_level=level)
    for k in (1.0, 4.0, 0.1, 9.0):
        x, s = T([k, k, k]), T(1.0)
        close(jf(x, s), f(x, s))
    assert jf.cache_info().compiles == 1


# ---- the bodies' lifetime ------------------------------------------------------------------------


def test_bodies_are_freed_once_nothing_can_run_them():
    """Bodies registered while capturing cond / while_loop (and the backward bodies of their
    gradients) live only as long as a call or a tape node needs them: compiled graphs own copies."""
    import gc

    def branchy(x):
        if x.sum() > 0:
            y = x * 2
        else:
            y = x - 1
        while y.sum() < 100:
            y = y * 3
        return y.sum()

    x = kiln.Tensor(np.array([1.0, 2.0], np.float32))
    gc.collect()
    before = kiln._C.live_bodies()
    jf = kiln.jit(branchy)
    for _ in range(3):
        jf(x)
    value, grad = kiln.value_and_grad(jf)(x)
    np.testing.assert_allclose(value.asnumpy(), branchy(x).asnumpy())
    np.testing.assert_allclose(grad.asnumpy(), [54.0, 54.0])
    del value, grad
    gc.collect()
    assert kiln._C.live_bodies() == before
    assert "while(" in jf.graph_str()
