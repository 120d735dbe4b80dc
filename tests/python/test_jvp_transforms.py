"""kiln.jvp, vjp, linearize, jacfwd and hessian as a user calls them: pytrees, has_aux, bad input,
Jacobians against NumPy finite differences and stacked grad rows, Hessians against closed forms,
and each eagerly, under every kiln.jit variant (ast / bytecode / trace x O0 / O1 x kbk / sink) and
under kiln.trace, with new values on the second call."""
import os
import sys

import numpy as np
import pytest

import kiln
from kiln import ops

sys.path.insert(0, os.path.dirname(__file__))
from conformance import ENV, TRACE_VARIANTS, VARIANTS, environment  # noqa: E402

F64 = kiln.float64


def t(a):
    return kiln.tensor(np.asarray(a, dtype=np.float64), dtype=F64)


def rnd(seed, *shape):
    return t(np.random.default_rng(seed).standard_normal(shape))


def close(a, b, tol=1e-10):
    np.testing.assert_allclose(np.asarray(a.numpy() if hasattr(a, "numpy") else a),
                               np.asarray(b.numpy() if hasattr(b, "numpy") else b), rtol=tol, atol=tol)


def numeric_jacobian(f, x, h=1e-6):
    """d f(x) / d x by central differences, shape f(x).shape + x.shape (NumPy in, NumPy out)."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(f(x))
    jac = np.zeros(y.shape + x.shape)
    for k in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[k] = h
        jac[(...,) + k] = (np.asarray(f(x + e)) - np.asarray(f(x - e))) / (2 * h)
    return jac


def mlp(x, w):
    return ops.tanh(ops.matmul(w, x)) * x[:3] + ops.softmax(x[:3] * 2.0, 0)


def mlp_np(x, w):
    s = np.exp(2 * x[:3] - (2 * x[:3]).max())
    return np.tanh(w @ x) * x[:3] + s / s.sum()


# ---- jvp ---------------------------------------------------------------------------------------

def test_jvp_of_a_pytree_against_central_differences():
    def f(inputs):
        a, rest = inputs["a"], inputs["rest"]
        return {"s": ops.sin(a) * rest[0], "p": (rest[1] ** 2).sum()}

    a, r0, r1 = rnd(1, 3), rnd(2, 3), rnd(3, 2, 2)
    va, v0, v1 = rnd(4, 3), rnd(5, 3), rnd(6, 2, 2)
    out, tan = kiln.jvp(f, ({"a": a, "rest": [r0, r1]},), ({"a": va, "rest": [v0, v1]},))
    assert set(out) == {"s", "p"} and set(tan) == {"s", "p"}
    close(out["s"], np.sin(a.numpy()) * r0.numpy())
    close(tan["s"], np.cos(a.numpy()) * va.numpy() * r0.numpy() + np.sin(a.numpy()) * v0.numpy())
    close(tan["p"], (2 * r1.numpy() * v1.numpy()).sum())


def test_jvp_single_tensor_and_tuple_forms():
    x, v = rnd(1, 4), rnd(2, 4)
    out, tan = kiln.jvp(ops.exp, x, v)
    close(tan, np.exp(x.numpy()) * v.numpy())
    (o1, o2), (t1, t2) = kiln.jvp(lambda a, b: (a * b, a - b), (x, x * 2), (v, v))
    close(t1, v.numpy() * 2 * x.numpy() + x.numpy() * v.numpy())
    close(t2, np.zeros(4))


def test_jvp_has_aux_returns_the_aux_untouched_by_tangents():
    x, v = rnd(1, 3), rnd(2, 3)
    out, tan, aux = kiln.jvp(lambda a: (ops.sin(a), {"c": ops.cos(a), "n": 3}), x, v, has_aux=True)
    close(tan, np.cos(x.numpy()) * v.numpy())
    close(aux["c"], np.cos(x.numpy()))
    assert aux["n"] == 3
    out, tan, aux = kiln.jvp(lambda a: (a * a, a + 1, a - 1), x, v, has_aux=True)
    assert isinstance(aux, tuple) and len(aux) == 2
    close(aux[1], x.numpy() - 1)


def test_constant_outputs_have_zero_tangents():
    x, v = rnd(1, 3), rnd(2, 3)
    out, tan = kiln.jvp(lambda a: (a * 2, 3, {"f": 1.5, "c": kiln.tensor(np.ones(3))}), x, v)
    assert out[1] == 3 and tan[1] == 0 and type(tan[1]) is int
    assert out[2]["f"] == 1.5 and tan[2]["f"] == 0.0
    close(tan[2]["c"], np.zeros(3))
    jac = kiln.jacfwd(lambda a: (a * 2, 7))(x)
    assert jac[1] == 0
    close(jac[0], 2 * np.eye(3))


def test_jvp_closure_tensors_are_constants():
    w = rnd(7, 3)
    x, v = rnd(1, 3), rnd(2, 3)
    _, tan = kiln.jvp(lambda a: a * w, x, v)
    close(tan, v.numpy() * w.numpy())


@pytest.mark.parametrize("call,match", [
    (lambda x: kiln.jvp(ops.sin, x, (x,)), "structure of inputs"),
    (lambda x: kiln.jvp(ops.sin, (x,), (x[:2],)), r"tangent 0 has shape \[2\]"),
    (lambda x: kiln.jvp(ops.sin, (x,), (ops.cast(x, kiln.float32),)), "dtype"),
    (lambda x: kiln.jvp(ops.sin, (x,), (x, x)), "the tangents are"),
    (lambda x: kiln.jvp(lambda a: a, (ops.cast(x, kiln.int64),), (x,)), "only float tensors"),
    (lambda x: kiln.jvp(ops.sin, (x, 2.0), (x, x)), "expected Tensors"),
    (lambda x: kiln.jvp(ops.sin, 3.0, x), "inputs must be a Tensor"),
    (lambda x: kiln.jvp(lambda a: a, x, x, has_aux=True), "has_aux=True the function must return a tuple"),
    (lambda x: kiln.jvp(lambda a: a, x, x, has_aux=1), "has_aux must be True or False"),
    (lambda x: kiln.jvp(None, x, x), "jvp: fn must be a function"),
    (lambda x: kiln.vjp(None, x), "vjp: fn must be a function"),
    (lambda x: kiln.linearize(None, x), "linearize: fn must be a function"),
    (lambda x: kiln.jacfwd(3), "jacfwd: fn must be a function"),
    (lambda x: kiln.hessian("f"), "hessian: fn must be a function"),
])
def test_jvp_bad_input_is_a_clear_error(call, match):
    with pytest.raises((TypeError, ValueError), match=match):
        call(rnd(1, 3))


def test_hessian_through_a_while_loop_names_the_op():
    def f(a):  # forward over the loop's reverse: while_grad has no forward-mode rule
        return (ops.while_loop(lambda i, b: i < 3, lambda i, b: (i + 1, ops.sin(b)), (kiln.tensor(0), a))[1] ** 2).sum()

    with pytest.raises(ValueError, match=r"jvp: control flow 'while_grad'.* has no forward-mode \(JVP\) rule"):
        kiln.hessian(f)(rnd(1, 3))


def looped(a, b):
    return ops.while_loop(lambda i, p, q: i < 3, lambda i, p, q: (i + 1, ops.sin(p) * q + W_IF, q * 1.1),
                          (kiln.tensor(0), a, b))[1]


def test_jacfwd_through_while_loop():
    x, y = t(np.array([0.3, 0.7, 1.1])), t(np.array([1.0, 2.0, 3.0]))
    jx, jy = kiln.jacfwd(looped, grad_position=(0, 1))(x, y)
    close(jx, numeric_jacobian(lambda a: looped(t(a), y).numpy(), x.numpy()), 1e-7)
    close(jy, numeric_jacobian(lambda b: looped(x, t(b)).numpy(), y.numpy()), 1e-7)


W_IF = t(np.array([0.5, -1.0, 2.0]))


def branchy(a, b):
    return ops.cond(a.sum() > 0, lambda p, q: ops.sin(p) * q * W_IF, lambda p, q: (p * p + q, )[0], (a, b))


def test_jacfwd_and_hessian_through_cond():
    for x in (t(np.array([0.3, 0.7, 1.1])), t(np.array([-0.3, -0.7, 1.1]))):
        y = t(np.array([1.0, 2.0, 3.0]))
        jx, jy = kiln.jacfwd(branchy, grad_position=(0, 1))(x, y)
        close(jx, numeric_jacobian(lambda a: branchy(t(a), y).numpy(), x.numpy()), 1e-7)
        close(jy, numeric_jacobian(lambda b: branchy(x, t(b)).numpy(), y.numpy()), 1e-7)
        hess = kiln.hessian(lambda a: ops.cond(a.sum() > 0, lambda p: (p ** 3).sum(), lambda p: (p ** 2).sum(), (a,)))(x)
        close(hess, np.diag(6 * x.numpy()) if x.numpy().sum() > 0 else 2 * np.eye(3))


def test_jvp_runs_in_place_writes_once():
    state = {"buf": t(np.zeros(3))}

    def f(a):
        state["buf"][0:3] = state["buf"] + a  # an in-place write on a tensor outside the function
        return a * 2

    x, v = rnd(1, 3), rnd(2, 3)
    kiln.jvp(f, x, v)
    close(state["buf"], x.numpy())  # once, as calling f once does


def test_reverse_over_forward():
    x, v = rnd(1, 4), rnd(2, 4)
    g = kiln.grad(lambda a: kiln.jvp(lambda b: ops.sin(b) * b, a, v)[1].sum())(x)
    xn, vn = x.numpy(), v.numpy()
    # d/dx sum(v (cos x * x + sin x)) = v (-sin x * x + 2 cos x)
    close(g, vn * (-np.sin(xn) * xn + 2 * np.cos(xn)), 1e-9)


@pytest.mark.parametrize("mode", ["ast", "bytecode", "trace"])
def test_reverse_over_forward_compiled(mode):
    v = t(np.array([1.0, -1.0, 0.5]))

    def h(a):
        return kiln.jvp(lambda b: ops.sin(b) * b, a, v)[1].sum()

    for x in (rnd(1, 3), rnd(2, 3)):
        want = kiln.grad(h)(x).numpy()
        close(kiln.grad(kiln.jit(h, capture_mode=mode))(x), want)  # forward and backward compiled together
        close(kiln.jit(lambda a: kiln.grad(h)(a), capture_mode=mode)(x), want)


# ---- vjp -----------------------------------------------------------------------------------------

def test_vjp_against_transposed_jacobian_and_reusable():
    x, w = rnd(1, 4), rnd(2, 3, 4)
    out, vjp_fn = kiln.vjp(mlp, x, w)
    close(out, mlp_np(x.numpy(), w.numpy()))
    for seed in (3, 4):  # the function may be called again
        u = rnd(seed, 3)
        gx, gw = vjp_fn(u)
        jx = numeric_jacobian(lambda a: mlp_np(a, w.numpy()), x.numpy())
        jw = numeric_jacobian(lambda b: mlp_np(x.numpy(), b), w.numpy())
        close(gx, np.tensordot(u.numpy(), jx, 1), 1e-7)
        close(gw, np.tensordot(u.numpy(), jw, 1), 1e-7)


def test_vjp_pytree_has_aux_and_errors():
    x, y = rnd(1, 3), rnd(2, 3)
    out, vjp_fn, aux = kiln.vjp(lambda d: ({"p": d["x"] * d["y"]}, d["x"].sum()), {"x": x, "y": y}, has_aux=True)
    (g,) = vjp_fn({"p": ops.ones_like(x)})
    close(g["x"], y.numpy())
    close(g["y"], x.numpy())
    close(aux, x.numpy().sum())
    with pytest.raises(ValueError, match="cotangents are"):
        vjp_fn(ops.ones_like(x))
    with pytest.raises(ValueError, match=r"cotangent 0 has shape \[2\]"):
        vjp_fn({"p": x[:2]})
    _, vjp_unused = kiln.vjp(lambda a, b: a * 2, x, y)
    ga, gb = vjp_unused(ops.ones_like(x))
    close(gb, np.zeros(3))


# ---- linearize -------------------------------------------------------------------------------------

def test_linearize_reuses_the_forward():
    x = rnd(1, 5)
    out, f_jvp = kiln.linearize(lambda a: ops.sin(a) * ops.exp(a), x)
    close(out, np.sin(x.numpy()) * np.exp(x.numpy()))
    for seed in (2, 3):
        v = rnd(seed, 5)
        close(f_jvp(v), kiln.jvp(lambda a: ops.sin(a) * ops.exp(a), x, v)[1], 1e-12)
    linear_ops = kiln._C.linear_ops(f_jvp._kiln_linear)
    assert linear_ops and not {"sin", "cos", "exp"} & set(linear_ops), linear_ops  # only the tangent part
    with pytest.raises(ValueError, match=r"tangent 0 has shape \[2\]"):
        f_jvp(x[:2])


def test_linearize_several_primals_and_outputs():
    x, y = rnd(1, 3), rnd(2, 3)
    (p, q), f_jvp = kiln.linearize(lambda a, b: (a * b, ops.tanh(a)), x, y)
    tp, tq = f_jvp(rnd(3, 3), rnd(4, 3))
    close(tp, rnd(3, 3).numpy() * y.numpy() + x.numpy() * rnd(4, 3).numpy())
    close(tq, (1 - np.tanh(x.numpy()) ** 2) * rnd(3, 3).numpy())


# ---- jacfwd ---------------------------------------------------------------------------------------

def test_jacfwd_against_numpy_and_grad_rows():
    x, w = rnd(1, 4), rnd(2, 3, 4)
    jac = kiln.jacfwd(mlp)(x, w)
    assert tuple(jac.shape) == (3, 4)
    close(jac, numeric_jacobian(lambda a: mlp_np(a, w.numpy()), x.numpy()), 1e-7)
    rows = [kiln.grad(lambda a, k=k: mlp(a, w)[k])(x).numpy() for k in range(3)]
    close(jac, np.stack(rows), 1e-12)


def test_jacfwd_positions_outputs_and_aux():
    x, w = rnd(1, 4), rnd(2, 3, 4)
    (jx, jw), aux = kiln.jacfwd(lambda a, b: (mlp(a, b), a.sum()), grad_position=(0, 1), has_aux=True)(x, w)
    assert tuple(jw.shape) == (3, 3, 4)
    close(jw, numeric_jacobian(lambda b: mlp_np(x.numpy(), b), w.numpy()), 1e-7)
    close(aux, x.numpy().sum())
    out = kiln.jacfwd(lambda a: {"sq": a * a, "s": a.sum()})(x)
    close(out["sq"], np.diag(2 * x.numpy()))
    close(out["s"], np.ones(4))
    with pytest.raises(ValueError, match="grad_position 3 is out of range for 2 arguments"):
        kiln.jacfwd(mlp, grad_position=3)(x, w)
    with pytest.raises(TypeError, match="argument 1 must be a Tensor"):
        kiln.jacfwd(lambda a, b: a * b, grad_position=1)(x, 2.0)


# ---- hessian ----------------------------------------------------------------------------------------

def test_hessian_closed_forms():
    x = rnd(1, 4)
    xn = x.numpy()
    close(kiln.hessian(lambda a: (a ** 3).sum())(x), np.diag(6 * xn))
    a_mat = rnd(2, 4, 4)
    close(kiln.hessian(lambda a: ops.matmul(a, ops.matmul(a_mat, a)))(x), a_mat.numpy() + a_mat.numpy().T)
    p = np.exp(xn) / np.exp(xn).sum()
    close(kiln.hessian(lambda a: ops.logsumexp(a, 0))(x), np.diag(p) - np.outer(p, p))
    close(kiln.hessian(lambda a: ops.sin(a).sum())(x), np.diag(-np.sin(xn)))


def test_hessian_two_arguments_and_aux():
    x, y = rnd(1, 3), rnd(2, 3)
    ((hxx, hxy), (hyx, hyy)), aux = kiln.hessian(lambda a, b: ((a * b * b).sum(), a * 2), grad_position=(0, 1),
                                                 has_aux=True)(x, y)
    close(hxx, np.zeros((3, 3)))
    close(hxy, np.diag(2 * y.numpy()))
    close(hyx, np.diag(2 * y.numpy()))
    close(hyy, np.diag(2 * x.numpy()))
    close(aux, 2 * x.numpy())


def test_hessian_of_a_network_against_differences_of_its_gradient():
    w = rnd(3, 3, 4)
    f = lambda a: (ops.gelu(ops.matmul(w, a)) ** 2).sum() + ops.log_softmax(a, 0)[0]  # noqa: E731
    x = rnd(1, 4)
    g = lambda a: kiln.grad(f)(t(a)).numpy()  # noqa: E731
    close(kiln.hessian(f)(x), numeric_jacobian(g, x.numpy()), 1e-6)


# ---- compiled ---------------------------------------------------------------------------------------

def _user_jvp(x, w, v):
    out, tan, aux = kiln.jvp(lambda d: (mlp(d["x"], d["w"]), d["x"].sum()), ({"x": x, "w": w},),
                             ({"x": v, "w": w * 0.5},), has_aux=True)
    return out, tan, aux


def _user_vjp(x, w, v):
    out, vjp_fn = kiln.vjp(mlp, x, w)
    return out, vjp_fn(v[:3])


def _user_linearize(x, w, v):
    out, f_jvp = kiln.linearize(lambda a: mlp(a, w), x)
    return out, f_jvp(v), f_jvp(v * 2)


def _user_jacfwd(x, w, v):
    return kiln.jacfwd(mlp, grad_position=(0, 1))(x, w)


def _user_hessian(x, w, v):
    return kiln.hessian(lambda a: (ops.tanh(ops.matmul(w, a)) ** 2).sum() + (a * v).sum())(x)


def _user_cond(x, w, v):
    a = x[:3] - 0.39  # the first call takes the true branch, the second the false one
    out, tan = kiln.jvp(branchy, (a, v[:3]), (v[1:], x[1:]))
    return out, tan, kiln.jacfwd(branchy)(a, v[:3])


def _user_while(x, w, v):
    out, tan = kiln.jvp(looped, (x[:3], v[:3]), (v[1:], x[1:]))
    return out, tan, kiln.linearize(looped, x[:3], v[:3])[1](v[1:], x[1:])


USER = [_user_jvp, _user_vjp, _user_linearize, _user_jacfwd, _user_hessian, _user_cond, _user_while]


def _flat(out, into):
    if isinstance(out, (tuple, list)):
        for o in out:
            _flat(o, into)
    elif isinstance(out, dict):
        for k in sorted(out):
            _flat(out[k], into)
    else:
        into.append(out)
    return into


def _calls():
    return [(rnd(1, 4), rnd(2, 3, 4), rnd(3, 4)), (rnd(4, 4), rnd(5, 3, 4), rnd(6, 4))]


@pytest.mark.parametrize("fn", USER, ids=[f.__name__ for f in USER])
def test_compiled_equals_eager(fn):
    calls = _calls()
    want = [_flat(fn(*c), []) for c in calls]
    with environment(ENV):
        for variant in VARIANTS:
            jf = variant.wrap(fn)
            for c, w in zip(calls, want):
                got = _flat(jf(*c), [])
                assert len(got) == len(w), variant.name
                for k, (a, b) in enumerate(zip(got, w)):
                    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-12, atol=1e-12,
                                               err_msg=f"{variant.name} output {k}")
            info = jf.cache_info()
            assert info.compiles >= 1 and not info.eager_calls, (variant.name, info)


def test_kiln_trace_notices_a_constant_of_the_function_changing():
    def f(a):
        return a * (2.0 if float(a.sum()) > 0 else 3.0)

    traced = kiln.trace(lambda x, v: kiln.jvp(f, x, v)[1])
    v = t(np.ones(2))
    close(traced(t(np.ones(2)), v), np.full(2, 2.0))
    with pytest.raises(kiln.TraceMismatchError, match="the trace recorded the constant 2, this call used the constant 3"):
        traced(t(-np.ones(2)), v)


@pytest.mark.parametrize("fn", USER, ids=[f.__name__ for f in USER])
def test_kiln_trace_equals_eager(fn):
    calls = _calls()
    want = [_flat(fn(*c), []) for c in calls]
    for variant in TRACE_VARIANTS:
        tf = variant.wrap(fn)
        for c, w in zip(calls, want):
            got = _flat(tf(*c), [])
            for k, (a, b) in enumerate(zip(got, w)):
                np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-12, atol=1e-12,
                                           err_msg=f"{variant.name} output {k}")
