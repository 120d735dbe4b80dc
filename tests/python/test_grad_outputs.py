"""MindSpore's gradient semantics for functions with several outputs, eager and compiled: grad,
value_and_grad and GradOperation differentiate the sum of every tensor the function returns
(nested tuples, lists and dicts too); with has_aux only the first output, the others coming back as a
tuple; sens_param weights the outputs; return_ids/get_grad name the gradients. Checked against
central differences (float64) and every compiled variant against eager."""
import numpy as np
import pytest

import kiln
from kiln import nn, ops

from conftest import to_numpy

MODES = ("ast", "bytecode", "trace")
VARIANTS = [(m, lvl, be) for m in MODES for lvl in ("O0", "O1") for be in ("kbk", "sink")]
VARIANT_IDS = ["-".join(v) for v in VARIANTS]


def t64(a):
    return kiln.Tensor(np.asarray(a, dtype=np.float64), kiln.float64)


def _tensors(out, acc):
    if isinstance(out, kiln.Tensor):
        acc.append(out)
    elif isinstance(out, (tuple, list)):
        for o in out:
            _tensors(o, acc)
    elif isinstance(out, dict):
        for o in out.values():
            _tensors(o, acc)
    return acc


def fd_grad(fn, args, argnum, sens=None, pick=None, eps=1e-6):
    """Central differences of sum_k <output_k, sens_k> (sens: ones by default) over every tensor
    fn returns (pick: the part of the output that is differentiated) with respect to args[argnum]."""
    base = to_numpy(args[argnum]).astype(np.float64).copy()
    g = np.zeros_like(base)

    def value(arr):
        call = list(args)
        call[argnum] = t64(arr)
        out = fn(*call)
        outs = _tensors(pick(out) if pick else out, [])
        ws = [None] * len(outs) if sens is None else _tensors(sens, [])
        return sum(float(np.sum(to_numpy(o) * (1.0 if w is None else to_numpy(w)))) for o, w in zip(outs, ws))

    flat, gflat = base.reshape(-1), g.reshape(-1)
    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + eps
        hi = value(base)
        flat[i] = old - eps
        lo = value(base)
        flat[i] = old
        gflat[i] = (hi - lo) / (2 * eps)
    return g


def assert_tree_close(a, b, rtol=1e-9, atol=1e-10):
    """Same structure, same values (tensors compared as arrays, anything else with ==)."""
    if isinstance(a, (tuple, list)):
        assert isinstance(b, type(a)) and len(a) == len(b), f"{type(a).__name__} vs {b!r}"
        for x, y in zip(a, b):
            assert_tree_close(x, y, rtol, atol)
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys()
        for k in a:
            assert_tree_close(a[k], b[k], rtol, atol)
    elif isinstance(a, kiln.Tensor):
        assert isinstance(b, kiln.Tensor) and tuple(a.shape) == tuple(b.shape), f"{a!r} vs {b!r}"
        np.testing.assert_allclose(to_numpy(a), to_numpy(b), rtol=rtol, atol=atol)
    else:
        assert a == b


def jitted(fn, variant):
    mode, level, backend = variant
    return kiln.jit(fn, capture_mode=mode, jit_level=level, backend=backend)


X = np.array([0.5, -1.25, 2.0])
Y = np.array([[1.0, -2.0], [0.25, 3.0]])


def cube_and_double(x):
    return x ** 3, 2 * x


def mixed_shapes(x, y):  # outputs of different shapes, one of them a scalar
    return x * x, (y * y).sum(), ops.matmul(y, y) * x.sum()


def nested(x, y):  # a dict holding a list, a bare Python number that is not differentiated
    return {"a": [x.sin(), y * x[0]], "b": (x.sum() * y.sum(),)}, 3


# ---- eager against finite differences -------------------------------------------------------------


def test_several_outputs_give_the_gradient_of_their_sum():
    x = t64(X)
    g = kiln.grad(cube_and_double)(x)
    np.testing.assert_allclose(to_numpy(g), 3 * X ** 2 + 2, rtol=1e-12)
    np.testing.assert_allclose(to_numpy(g), fd_grad(cube_and_double, [x], 0), rtol=1e-6)


@pytest.mark.parametrize("fn", [mixed_shapes, nested], ids=["mixed_shapes", "nested"])
def test_outputs_of_any_structure_are_all_differentiated(fn):
    x, y = t64(X), t64(Y)
    gx, gy = kiln.grad(fn, grad_position=(0, 1))(x, y)
    np.testing.assert_allclose(to_numpy(gx), fd_grad(fn, [x, y], 0), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(to_numpy(gy), fd_grad(fn, [x, y], 1), rtol=1e-6, atol=1e-8)


def test_value_and_grad_returns_every_output_as_the_value():
    x = t64(X)
    value, g = kiln.value_and_grad(cube_and_double)(x)
    assert isinstance(value, tuple) and len(value) == 2
    np.testing.assert_allclose(to_numpy(value[0]), X ** 3)
    np.testing.assert_allclose(to_numpy(value[1]), 2 * X)
    np.testing.assert_allclose(to_numpy(g), 3 * X ** 2 + 2, rtol=1e-12)


def test_has_aux_differentiates_the_first_output_and_returns_the_rest_as_a_tuple():
    x = t64(X)

    def f(x):
        return x ** 3, 2 * x

    g, aux = kiln.grad(f, has_aux=True)(x)
    np.testing.assert_allclose(to_numpy(g), 3 * X ** 2, rtol=1e-12)
    assert isinstance(aux, tuple) and len(aux) == 1
    np.testing.assert_allclose(to_numpy(aux[0]), 2 * X)
    value, g2 = kiln.value_and_grad(f, has_aux=True)(x)
    assert isinstance(value, tuple) and len(value) == 2
    np.testing.assert_allclose(to_numpy(value[1]), 2 * X)
    np.testing.assert_allclose(to_numpy(g2), 3 * X ** 2, rtol=1e-12)

    def first_is_a_pair(x):  # has_aux with a first output that is itself several tensors
        return (x * x, x.sum()), x * 5, "tag"

    g3, aux3 = kiln.grad(first_is_a_pair, has_aux=True)(x)
    np.testing.assert_allclose(to_numpy(g3), fd_grad(first_is_a_pair, [x], 0, pick=lambda o: o[0]), rtol=1e-6)
    assert len(aux3) == 2 and aux3[1] == "tag"
    np.testing.assert_allclose(to_numpy(aux3[0]), 5 * X)


def test_grad_of_grad_of_a_function_with_several_outputs():
    x = t64(X)

    def first(x):
        return kiln.grad(cube_and_double)(x).sum()  # d/dx sum(3x^2 + 2) = 6x

    np.testing.assert_allclose(to_numpy(kiln.grad(first)(x)), 6 * X, rtol=1e-12)


# ---- GradOperation --------------------------------------------------------------------------------


class Affine(nn.Cell):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(t64([[0.5, -1.0], [2.0, 0.25]]), name="w")
        self.b = nn.Parameter(t64([0.1, -0.3]), name="b")

    def construct(self, x, y):
        h = ops.matmul(y, self.w) + self.b
        return (h * x[:2]).sum(), h.tanh()


def test_gradoperation_combinations_against_finite_differences():
    x, y = t64(X), t64(Y)
    net = Affine()
    params = net.trainable_params()
    fd_x, fd_y = fd_grad(net, [x, y], 0), fd_grad(net, [x, y], 1)

    g = ops.GradOperation()(net)(x, y)  # the first input's only
    np.testing.assert_allclose(to_numpy(g), fd_x, rtol=1e-6, atol=1e-8)
    gs = ops.GradOperation(get_all=True)(net)(x, y)
    assert isinstance(gs, tuple) and len(gs) == 2
    np.testing.assert_allclose(to_numpy(gs[1]), fd_y, rtol=1e-6, atol=1e-8)

    def with_w(w, b, x, y):  # the net's function of its parameters, for finite differences
        h = ops.matmul(y, w) + b
        return (h * x[:2]).sum(), h.tanh()

    fd_w = fd_grad(with_w, [params[0], params[1], x, y], 0)
    fd_b = fd_grad(with_w, [params[0], params[1], x, y], 1)
    gw = ops.GradOperation(get_by_list=True)(net, params)(x, y)
    assert isinstance(gw, tuple) and len(gw) == 2
    np.testing.assert_allclose(to_numpy(gw[0]), fd_w, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(to_numpy(gw[1]), fd_b, rtol=1e-6, atol=1e-8)
    gin, gw2 = ops.GradOperation(get_all=True, get_by_list=True)(net, params)(x, y)
    assert_tree_close(gin, gs)
    assert_tree_close(gw2, gw)


def test_gradoperation_sens_param_weights_each_output():
    x, y = t64(X), t64(Y)
    net = Affine()
    sens = (t64(1.5), t64([[1.0, -2.0], [0.5, 4.0]]))
    g = ops.GradOperation(sens_param=True)(net)(x, y, sens)
    np.testing.assert_allclose(to_numpy(g), fd_grad(net, [x, y], 0, sens=sens), rtol=1e-6, atol=1e-8)
    gx, gy = ops.GradOperation(get_all=True, sens_param=True)(net)(x, y, sens)
    np.testing.assert_allclose(to_numpy(gy), fd_grad(net, [x, y], 1, sens=sens), rtol=1e-6, atol=1e-8)
    with pytest.raises(ValueError, match="sens"):
        ops.GradOperation(sens_param=True)(net)(x, y, t64(1.0))  # one sens for two outputs
    with pytest.raises(ValueError, match="shape"):
        ops.GradOperation(sens_param=True)(net)(x, y, (t64(1.0), t64([1.0, 2.0])))


def test_gradoperation_get_all_gives_zeros_for_an_integer_tensor():
    x = t64(X)
    idx = kiln.Tensor(np.array([2, 0], dtype=np.int64))
    gx, gi = ops.GradOperation(get_all=True)(lambda x, i: ops.gather(x, i, 0) * 2)(x, idx)
    np.testing.assert_allclose(to_numpy(gx), [2.0, 0.0, 2.0])
    assert tuple(gi.shape) == (2,) and not np.any(to_numpy(gi))


def test_gradoperation_bad_use_is_a_clear_error():
    with pytest.raises(TypeError, match="get_all"):
        ops.GradOperation(get_all=1)
    with pytest.raises(ValueError, match="weights"):
        ops.GradOperation(get_by_list=True)(lambda x: x)
    with pytest.raises(ValueError, match="get_by_list"):
        ops.GradOperation()(lambda x: x, [nn.Parameter(t64([1.0]))])
    with pytest.raises(TypeError, match="Tensor"):
        ops.GradOperation()(lambda x: x * 2)(3.0)


# ---- return_ids and get_grad ----------------------------------------------------------------------


def test_return_ids_pairs_each_gradient_with_its_identifier():
    x, y = t64(X), t64(Y)
    net = Affine()
    params = net.trainable_params()
    plain = kiln.grad(net, grad_position=(0, 1), weights=params)(x, y)
    ids = kiln.grad(net, grad_position=(0, 1), weights=params, return_ids=True)(x, y)
    (p0, g0), (p1, g1) = ids[0]
    assert (p0, p1) == (0, 1)
    assert [name for name, _ in ids[1]] == ["w", "b"]
    assert_tree_close((g0, g1), plain[0])
    assert_tree_close(ops.get_grad(ids, 1), plain[0][1])
    assert_tree_close(kiln.get_grad(ids, net.b), plain[1][1])
    assert_tree_close(kiln.get_grad(ids, net.w), plain[1][0])
    single = kiln.grad(net, grad_position=1, return_ids=True)(x, y)
    assert single[0] == 1 and kiln.get_grad(single, 1) is single[1]
    _, vids = kiln.value_and_grad(net, grad_position=0, weights=net.b, return_ids=True)(x, y)
    assert vids[1][0] == "b"
    with pytest.raises(ValueError, match="no gradient"):
        kiln.get_grad(ids, 2)
    with pytest.raises(ValueError, match="no gradient"):
        kiln.get_grad(single, net.w)
    with pytest.raises(TypeError, match="identifier"):
        kiln.get_grad(ids, "w")


# ---- compiled: every variant equals eager ---------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_grad_of_a_jitted_function_with_several_outputs(variant):
    x, y = t64(X), t64(Y)
    for fn, how in ((cube_and_double, dict(grad_position=0)), (mixed_shapes, dict(grad_position=(0, 1))),
                    (nested, dict(grad_position=(0, 1)))):
        args = (x,) if fn is cube_and_double else (x, y)
        jf = jitted(fn, variant)
        for _ in range(2):  # the capture, then the compiled graph
            assert_tree_close(kiln.grad(jf, **how)(*args), kiln.grad(fn, **how)(*args))
            assert_tree_close(kiln.value_and_grad(jf, **how)(*args), kiln.value_and_grad(fn, **how)(*args))
            assert_tree_close(kiln.grad(jf, has_aux=True, **how)(*args), kiln.grad(fn, has_aux=True, **how)(*args))


@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_gradoperation_inside_a_jitted_function(variant):
    x, y = t64(X), t64(Y)
    net = Affine()
    params = net.trainable_params()
    sens = (t64(0.5), t64([[1.0, 2.0], [3.0, -1.0]]))

    def step(x, y, s0, s1):
        g_all = ops.GradOperation(get_all=True, get_by_list=True)(net, params)(x, y)
        g_sens = ops.GradOperation(sens_param=True)(net)(x, y, (s0, s1))
        g_first = kiln.grad(lambda x: cube_and_double(x))(x)
        g_ids = kiln.grad(net, grad_position=1, weights=params, return_ids=True)(x, y)
        return g_all, g_sens, g_first, kiln.get_grad(g_ids, net.w)

    expected = step(x, y, *sens)
    jf = jitted(step, variant)
    for _ in range(2):
        assert_tree_close(jf(x, y, *sens), expected)


@pytest.mark.parametrize("mode", MODES)
def test_gradoperation_of_a_jitted_cell(mode):
    x, y = t64(X), t64(Y)
    net = Affine()
    params = net.trainable_params()
    jnet = kiln.jit(net, capture_mode=mode)
    sens = (t64(2.0), t64([[1.0, 0.0], [0.0, 1.0]]))
    for _ in range(2):
        assert_tree_close(ops.GradOperation(get_all=True, get_by_list=True)(jnet, params)(x, y),
                          ops.GradOperation(get_all=True, get_by_list=True)(net, params)(x, y))
        assert_tree_close(ops.GradOperation(get_all=True, sens_param=True)(jnet)(x, y, sens),
                          ops.GradOperation(get_all=True, sens_param=True)(net)(x, y, sens))
        assert_tree_close(kiln.grad(jnet, (0, 1), params, return_ids=True)(x, y),
                          kiln.grad(net, (0, 1), params, return_ids=True)(x, y))


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v[2] == "kbk"], ids=lambda v: "-".join(v))
def test_grad_of_grad_of_several_outputs_compiled(variant):
    x = t64(X)

    def cubic(x):  # its own code: not a function another test jitted (bytecode pieces are per code)
        return x ** 3, 2 * x

    def second(x):  # d/dx sum(d/dx (x^3 + 2x)) = 6x
        return kiln.grad(lambda x: kiln.grad(cubic)(x).sum())(x)

    jf = jitted(second, variant)
    for _ in range(2):
        np.testing.assert_allclose(to_numpy(jf(x)), 6 * X, rtol=1e-12)
    inner = jitted(lambda x: kiln.grad(cubic)(x).sum(), variant)
    for _ in range(2):
        np.testing.assert_allclose(to_numpy(kiln.grad(inner)(x)), 6 * X, rtol=1e-12)
