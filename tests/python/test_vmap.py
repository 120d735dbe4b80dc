"""kiln.vmap and kiln.jacrev as users call them: per-example gradients, pytree arguments, in_axes
and out_axes, ensembles of a CellList, nested vmap, Jacobians, the slow path and the errors;
eagerly, under kiln.jit (each capture mode, O0/O1 x kbk/sink) and kiln.trace."""
import warnings

import numpy as np
import pytest

import kiln
from kiln import nn, ops

RNG = np.random.default_rng(1)
JIT = [(m, level, be) for m in ("ast", "bytecode", "trace") for level in ("O0", "O1") for be in ("kbk", "sink")]
JIT_IDS = [f"{m}-{level}-{be}" for m, level, be in JIT]


def t(*shape):
    return kiln.tensor(RNG.standard_normal(shape).astype(np.float32))


def compiled(fn, mode, level, backend):
    jf = kiln.jit(fn, capture_mode=mode, jit_level=level, backend=backend)

    def call(*args):
        jf(*args)
        return jf(*args)  # the second call runs the compiled graph
    return call


def close(a, b, tol=1e-5):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=tol, atol=tol)


# ---- per-example gradients of an MLP -----------------------------------------------------------

def mlp_loss(w1, b1, w2, x, y):
    h = ops.tanh(ops.dense(x, w1, b1))
    return ((ops.matmul(h, w2) - y) ** 2).mean()


def mlp_case():
    return [t(8, 5), t(8), t(8, 2), t(6, 5), t(6, 2)]


def per_example_grads(*args):
    return kiln.vmap(kiln.grad(mlp_loss, (0, 1, 2)), in_axes=(None, None, None, 0, 0))(*args)


def stacked_grad_calls(w1, b1, w2, x, y):
    per = [kiln.grad(mlp_loss, (0, 1, 2))(w1, b1, w2, x[i], y[i]) for i in range(x.shape[0])]
    return [np.stack([p[k].numpy() for p in per]) for k in range(3)]


def test_per_example_gradients_eager():
    args = mlp_case()
    got = per_example_grads(*args)
    for g, e in zip(got, stacked_grad_calls(*args)):
        close(g.numpy(), e)


@pytest.mark.parametrize("mode,level,backend", JIT, ids=JIT_IDS)
def test_per_example_gradients_compiled(mode, level, backend):
    args = mlp_case()
    got = compiled(per_example_grads, mode, level, backend)(*args)
    for g, e in zip(got, stacked_grad_calls(*args)):
        close(g.numpy(), e)


def test_per_example_gradients_match_finite_differences():
    w, x = t(3), t(4, 3)

    def f(w, x):
        return ops.sin(w * x).sum()

    g = kiln.vmap(kiln.grad(f), in_axes=(None, 0))(w, x).numpy()
    eps = 1e-3
    w64, x64 = w.numpy().astype(np.float64), x.numpy().astype(np.float64)
    for i in range(4):
        for j in range(3):
            d = np.zeros(3)
            d[j] = eps
            fd = (np.sin((w64 + d) * x64[i]).sum() - np.sin((w64 - d) * x64[i]).sum()) / (2 * eps)
            assert abs(g[i, j] - fd) < 1e-3


def test_per_example_gradients_of_a_cells_weights():
    net = nn.Dense(3, 2)
    x, y = t(5, 3), t(5, 2)

    def loss(x, y):
        return ((net(x) - y) ** 2).sum()

    gw = kiln.grad(loss, grad_position=None, weights=net.trainable_params())
    got = kiln.vmap(gw)(x, y)
    for k in range(2):
        expected = np.stack([gw(x[i], y[i])[k].numpy() for i in range(5)])
        close(got[k].numpy(), expected)


# ---- in_axes and out_axes ----------------------------------------------------------------------

def test_pytree_arguments_and_per_leaf_axes():
    a, b, c = t(3, 4), t(4, 3), t(4)

    def f(pair, d):
        x, y = pair
        return x * y + d["c"]

    got = kiln.vmap(f, in_axes=((0, 1), {"c": None}))((a, b), {"c": c}).numpy()
    expected = np.stack([a.numpy()[i] * b.numpy()[:, i] + c.numpy() for i in range(3)])
    close(got, expected)


def test_out_axes_per_output_and_none():
    x, s = t(3, 4), t(4)

    def f(x, s):
        return x * s, s * 2, (x + 1, s)

    y, unbatched, (z, s2) = kiln.vmap(f, in_axes=(0, None), out_axes=(1, None, (-1, 0)))(x, s)
    close(y.numpy(), (x.numpy() * s.numpy()).T)
    close(unbatched.numpy(), s.numpy() * 2)
    close(z.numpy(), (x.numpy() + 1).T)
    close(s2.numpy(), np.broadcast_to(s.numpy(), (3, 4)))


def test_out_axes_none_for_a_batched_output_is_an_error():
    with pytest.raises(ValueError, match="out_axes is None for output 0"):
        kiln.vmap(lambda x: x * 2, out_axes=None)(t(3, 2))


def test_errors_name_the_argument():
    with pytest.raises(ValueError, match=r"in_axes 2 is out of bounds for argument 1 of rank 2"):
        kiln.vmap(lambda a, b: a + b, in_axes=(0, 2))(t(3), t(3, 3))
    with pytest.raises(ValueError, match=r"argument 0 has 3 .* argument 1 has 4"):
        kiln.vmap(lambda a, b: a + b)(t(3, 2), t(4, 2))
    with pytest.raises(ValueError, match="no argument is mapped over"):
        kiln.vmap(lambda a: a, in_axes=None)(t(3))
    with pytest.raises(ValueError, match="in_axes has 1 entries for 2 arguments"):
        kiln.vmap(lambda a, b: a, in_axes=(0,))(t(3), t(3))
    with pytest.raises(ValueError, match="does not match the structure of argument 0"):
        kiln.vmap(lambda p: p[0], in_axes=((0, 0, 0),))((t(3), t(3)))
    with pytest.raises(ValueError, match="only Tensors are mapped over"):
        kiln.vmap(lambda a, n: a * n, in_axes=(0, 0))(t(3), 2)


def test_reading_a_value_per_example_is_an_error():
    def f(x):
        return x * 2 if float(x.sum()) > 0 else -x

    with pytest.raises(ValueError, match="reads a tensor's value"):
        kiln.vmap(f)(t(4, 2))


def test_python_numbers_and_unmapped_arguments_pass_through():
    x = t(3, 2)
    got = kiln.vmap(lambda x, k: x * k + 1.5, in_axes=(0, None))(x, 3.0).numpy()
    close(got, x.numpy() * 3 + 1.5)


# ---- nested vmap -------------------------------------------------------------------------------

def test_nested_vmap_is_an_outer_product():
    a, b = t(3, 4), t(5, 4)
    dot = lambda u, v: (u * v).sum()  # noqa: E731
    outer = kiln.vmap(kiln.vmap(dot, in_axes=(None, 0)), in_axes=(0, None))
    close(outer(a, b).numpy(), a.numpy() @ b.numpy().T)


@pytest.mark.parametrize("mode,level,backend", JIT, ids=JIT_IDS)
def test_nested_vmap_compiled(mode, level, backend):
    a, b = t(3, 4), t(5, 4)
    outer = kiln.vmap(kiln.vmap(lambda u, v: ops.tanh(u * v).sum(), in_axes=(None, 0)), in_axes=(0, None))
    got = compiled(lambda a, b: outer(a, b), mode, level, backend)(a, b)
    close(got.numpy(), np.tanh(a.numpy()[:, None, :] * b.numpy()[None, :, :]).sum(-1))


def test_nested_vmap_over_other_axes():
    x = t(2, 3, 4)
    got = kiln.vmap(kiln.vmap(lambda r: r.sum(), in_axes=1), in_axes=0)(x).numpy()  # (2, 4)
    close(got, x.numpy().sum(1))


# ---- gradients through vmap --------------------------------------------------------------------

def test_grad_of_a_vmapped_function():
    w, x = t(3, 2), t(4, 3)

    def loss(w, x):
        return kiln.vmap(lambda xi: ops.tanh(ops.matmul(xi, w)).sum())(x).sum()

    got = kiln.grad(loss)(w, x).numpy()
    expected = kiln.grad(lambda w, x: ops.tanh(ops.matmul(x, w)).sum())(w, x).numpy()
    close(got, expected)


# ---- ensembles -------------------------------------------------------------------------------

def ensemble():
    return nn.CellList([nn.SequentialCell(nn.Dense(3, 4), nn.Tanh(), nn.Dense(4, 2)) for _ in range(3)])


def test_ensemble_of_a_cell_list():
    cells, x = ensemble(), t(3, 5, 3)
    got = kiln.vmap(cells, in_axes=0, out_axes=0)(x).numpy()
    close(got, np.stack([cells[i](x[i]).numpy() for i in range(3)]))
    shared = t(5, 3)
    got = kiln.vmap(cells, in_axes=None)(shared).numpy()
    close(got, np.stack([cells[i](shared).numpy() for i in range(3)]))


@pytest.mark.parametrize("mode,level,backend", JIT, ids=JIT_IDS)
def test_ensemble_compiled(mode, level, backend):
    cells, x = ensemble(), t(3, 5, 3)
    ens = kiln.vmap(cells, in_axes=0, out_axes=1)
    got = compiled(lambda x: ens(x), mode, level, backend)(x).numpy()
    close(got, np.stack([cells[i](x[i]).numpy() for i in range(3)], axis=1))


def test_ensemble_gradients_reach_each_cell():
    cells, x = ensemble(), t(3, 5, 3)
    ens = kiln.vmap(cells)
    params = cells.trainable_params()
    grads = kiln.grad(lambda x: (ens(x) ** 2).sum(), grad_position=None, weights=params)(x)
    expected = kiln.grad(lambda x: sum((cells[i](x[i]) ** 2).sum() for i in range(3)), grad_position=None,
                         weights=params)(x)
    for g, e in zip(grads, expected):
        close(g.numpy(), e.numpy())


def test_ensemble_of_different_cells_is_an_error():
    with pytest.raises(ValueError, match="identical cells"):
        kiln.vmap(nn.CellList([nn.Dense(3, 2), nn.Dense(3, 4)]))(t(2, 3))


# ---- jacrev ------------------------------------------------------------------------------------

def jac_fd(f, x, eps=1e-3):
    x = x.astype(np.float64)
    cols = []
    for j in range(x.size):
        d = np.zeros(x.size)
        d[j] = eps
        d = d.reshape(x.shape)
        cols.append((f(x + d) - f(x - d)) / (2 * eps))
    y = f(x)
    return np.stack(cols, -1).reshape(y.shape + x.shape)


def test_jacrev_matches_finite_differences():
    w = t(3, 4)
    x = t(2, 3)
    got = kiln.jacrev(lambda x: ops.tanh(ops.matmul(x, w)))(x).numpy()
    expected = jac_fd(lambda xn: np.tanh(xn @ w.numpy().astype(np.float64)), x.numpy())
    assert got.shape == (2, 4, 2, 3)
    close(got, expected, tol=2e-3)


def test_jacrev_positions_outputs_and_aux():
    x, y = t(3), t(3)

    def f(x, y):
        return x * y, ops.sin(x)

    (jxy, jsin) = kiln.jacrev(f, grad_position=(0, 1))(x, y)
    close(jxy[0].numpy(), np.diag(y.numpy()))
    close(jxy[1].numpy(), np.diag(x.numpy()))
    close(jsin[0].numpy(), np.diag(np.cos(x.numpy())))
    close(jsin[1].numpy(), np.zeros((3, 3)))
    jac, aux = kiln.jacrev(lambda x: (x ** 2, x.sum()), has_aux=True)(x)
    close(jac.numpy(), np.diag(2 * x.numpy()))
    close(aux.numpy(), x.numpy().sum())


@pytest.mark.parametrize("mode,level,backend", JIT, ids=JIT_IDS)
def test_jacrev_compiled(mode, level, backend):
    w, x = t(4, 4), t(4)
    f = kiln.jacrev(lambda x: ops.tanh(ops.matmul(w, x)))
    got = compiled(lambda x: f(x), mode, level, backend)(x).numpy()
    close(got, f(x).numpy())
    close(got, jac_fd(lambda xn: np.tanh(w.numpy().astype(np.float64) @ xn), x.numpy()), tol=2e-3)


def test_jacrev_is_one_batched_backward():
    w, x = t(6, 6), t(6)
    with warnings.catch_warnings():
        warnings.simplefilter("error", kiln.VmapFallbackWarning)
        jac = kiln.jacrev(lambda x: ops.tanh(ops.matmul(w, x)))(x).numpy()
    rows = [kiln.grad(lambda x, i=i: ops.tanh(ops.matmul(w, x))[i])(x).numpy() for i in range(6)]
    close(jac, np.stack(rows))


# ---- the slow path -----------------------------------------------------------------------------

def test_an_op_without_a_rule_runs_per_example_and_warns():
    x, w = t(3, 2, 4), t(3, 4)  # a batch of layer_norm weights: its rule takes a batched input only
    f = lambda x, w: ops.layer_norm(x, (4,), w)  # noqa: E731
    with pytest.warns(kiln.VmapFallbackWarning, match="layer_norm"):
        got = kiln.vmap(f)(x, w).numpy()
    close(got, np.stack([f(x[k], w[k]).numpy() for k in range(3)]))


def test_a_batch_of_tables_and_of_indices():
    tables = t(3, 5, 2)
    idx = kiln.tensor(np.array([[0, 4], [1, 1], [3, -1]], np.int64))
    got = kiln.vmap(lambda tab, i: ops.gather(tab, i, 0))(tables, idx).numpy()
    close(got, np.stack([tables.numpy()[k][idx.numpy()[k]] for k in range(3)]))
    bad = kiln.tensor(np.array([[0, 4], [1, 9], [3, 2]], np.int64))
    with pytest.raises(IndexError):
        kiln.vmap(lambda tab, i: ops.gather(tab, i, 0))(tables, bad)


def test_ensemble_of_conv_weights_is_one_grouped_convolution():
    x, w = t(2, 1, 3, 5, 5), t(2, 4, 3, 3, 3)
    f = lambda x, w: ops.conv2d(x, w, pad_mode="valid")  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("error", kiln.VmapFallbackWarning)
        got = kiln.vmap(f)(x, w).numpy()
    close(got, np.stack([f(x[i], w[i]).numpy() for i in range(2)]), tol=1e-4)


def test_control_flow_inside_vmap_is_refused():
    def f(x):
        return ops.cond(x.sum() > 0, lambda v: v * 2, lambda v: v, (x,))

    with pytest.raises(NotImplementedError, match="control flow"):
        kiln.jit(lambda x: kiln.vmap(f)(x), capture_mode="trace")(t(3, 2))


# ---- kiln.trace --------------------------------------------------------------------------------

def test_vmap_under_kiln_trace():
    w, x = t(3, 2), t(4, 3)
    pe = kiln.vmap(kiln.grad(lambda w, x: ops.tanh(ops.matmul(x, w)).sum()), in_axes=(None, 0))
    traced = kiln.trace(lambda w, x: pe(w, x))
    traced(w, x)
    got = traced(w, x).numpy()
    close(got, pe(w, x).numpy())


# ---- in-place writes and new sizes ---------------------------------------------------------------

def test_an_in_place_write_to_a_mapped_argument_happens_once_per_example():
    x = kiln.tensor(np.ones((3, 2), np.float32))

    def f(r):
        r[0] = r[0] + 1.0
        return r * 2

    y = kiln.vmap(f)(x)
    close(y.numpy(), np.tile([4.0, 2.0], (3, 1)))
    close(x.numpy(), np.tile([2.0, 1.0], (3, 1)))  # as a loop over the rows leaves it: once each


@pytest.mark.parametrize("mode", ["ast", "bytecode", "trace"])
def test_compiled_vmap_called_with_other_batch_sizes(mode):
    jf = kiln.jit(lambda x: kiln.vmap(lambda r: ops.tanh(r).sum())(x), capture_mode=mode)
    for n in (3, 5, 7, 5):
        x = t(n, 4)
        close(jf(x).numpy(), np.tanh(x.numpy()).sum(1))


@pytest.mark.parametrize("mode", ["ast", "bytecode", "trace"])
def test_vmap_of_a_jitted_function_and_its_gradient(mode):
    x = t(4, 3)
    jf = kiln.jit(lambda r: ops.tanh(r * 2).sum(), capture_mode=mode)
    jf(x[0])  # compiled for one example before vmap traces it
    close(kiln.vmap(jf)(x).numpy(), np.tanh(2 * x.numpy()).sum(1))
    close(kiln.vmap(kiln.grad(jf))(x).numpy(), 2 * (1 - np.tanh(2 * x.numpy()) ** 2))


@pytest.mark.parametrize("mode", ["ast", "bytecode", "trace"])
def test_grad_of_a_jitted_function_that_vmaps(mode):
    w, x = t(3, 2), t(4, 3)
    jf = kiln.jit(lambda w, x: kiln.vmap(lambda xi: ops.tanh(ops.matmul(xi, w)).sum())(x).sum(), capture_mode=mode)
    g = kiln.grad(jf)
    g(w, x)
    expected = kiln.grad(lambda w, x: ops.tanh(ops.matmul(x, w)).sum())(w, x).numpy()
    close(g(w, x).numpy(), expected)
