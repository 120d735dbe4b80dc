"""kiln.jacfwd and kiln.hessian as one batched graph (issue 34): jacfwd maps the forward-mode pass
over the input basis with kiln.vmap, hessian is jacfwd of kiln.jacrev. Checked as a user calls
them: jacfwd == jacrev == central differences (float64) for several functions, hessians against
differences of the gradient, has_aux and tuple grad_position, eagerly and under every kiln.jit
variant (ast / bytecode / trace x O0 / O1 x kbk / sink) and kiln.trace; and the graph's size does
not grow with the input's (no loop over basis vectors)."""
import os
import re
import sys
import warnings

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


def central_differences(f, x, h=1e-6):
    """d f(x) / d x, shape f(x).shape + x.shape, f from NumPy to NumPy."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(f(x))
    jac = np.zeros(y.shape + x.shape)
    for k in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[k] = h
        jac[(...,) + k] = (np.asarray(f(x + e)) - np.asarray(f(x - e))) / (2 * h)
    return jac


W = rnd(10, 3, 4)
M = rnd(11, 2, 3)

# (name, kiln function of one tensor, the same in NumPy, input shape)
FUNCTIONS = [
    ("elementwise", lambda a: ops.sin(a) * a + ops.exp(a * 0.5), lambda a: np.sin(a) * a + np.exp(a * 0.5), (5,)),
    ("network", lambda a: ops.tanh(ops.matmul(W, a)) * a[:3], lambda a: np.tanh(W.numpy() @ a) * a[:3], (4,)),
    ("softmax", lambda a: ops.softmax(a * 2.0, 0), lambda a: np.exp(2 * a) / np.exp(2 * a).sum(), (4,)),
    ("matrix_input", lambda a: ops.matmul(M, ops.tanh(a)).sum(1), lambda a: (M.numpy() @ np.tanh(a)).sum(1), (3, 2)),
    ("reduction", lambda a: (a ** 2).mean(0) + a.max(0), lambda a: (a ** 2).mean(0) + a.max(0), (3, 2)),
]


@pytest.mark.parametrize("name,f,f_np,shape", FUNCTIONS, ids=[f[0] for f in FUNCTIONS])
def test_jacfwd_equals_jacrev_and_central_differences(name, f, f_np, shape):
    x = rnd(1, *shape)
    fwd = kiln.jacfwd(f)(x)
    rev = kiln.jacrev(f)(x)
    want = central_differences(f_np, x.numpy())
    assert tuple(fwd.shape) == want.shape, name
    close(fwd, want, 1e-7)
    close(fwd, rev, 1e-12)


def test_jacfwd_several_positions_outputs_and_aux():
    x, w = rnd(1, 4), rnd(2, 3, 4)

    def f(a, b):
        y = ops.tanh(ops.matmul(b, a))
        return {"y": y, "s": (a * a).sum()}, a.mean()

    (jac, aux) = kiln.jacfwd(f, grad_position=(0, 1), has_aux=True)(x, w)
    jx, jw = jac["y"]
    close(jx, central_differences(lambda a: np.tanh(w.numpy() @ a), x.numpy()), 1e-7)
    close(jw, central_differences(lambda b: np.tanh(b @ x.numpy()), w.numpy()), 1e-7)
    sx, sw = jac["s"]
    close(sx, 2 * x.numpy())
    close(sw, np.zeros((3, 4)))
    close(aux, x.numpy().mean())
    rev = kiln.jacrev(lambda a, b: f(a, b)[0]["y"], grad_position=(0, 1))(x, w)
    close(jx, rev[0], 1e-12)
    close(jw, rev[1], 1e-12)


def test_jacfwd_mixed_dtypes_and_an_empty_input():
    x32 = kiln.tensor(np.array([0.5, -1.0], np.float32))
    x64 = rnd(3, 3)
    jx, jy = kiln.jacfwd(lambda a, b: ops.sin(a).sum() * b, grad_position=(0, 1))(x32, x64)
    assert jx.dtype == kiln.float64 and tuple(jx.shape) == (3, 2)
    close(jx, np.outer(x64.numpy(), np.cos(x32.numpy())), 1e-6)
    close(jy, np.eye(3) * np.sin(x32.numpy()).sum(), 1e-6)
    empty = kiln.jacfwd(lambda a: a * 2.0)(t(np.zeros((0,))))
    assert tuple(empty.shape) == (0, 0)


def test_hessian_against_differences_of_the_gradient():
    w = rnd(3, 3, 4)

    def f(a):
        return (ops.gelu(ops.matmul(w, a)) ** 2).sum() + ops.log_softmax(a, 0)[0] + (ops.sin(a) * a).sum()

    x = rnd(1, 4)
    h = kiln.hessian(f)(x)
    close(h, central_differences(lambda a: kiln.grad(f)(t(a)).numpy(), x.numpy()), 1e-6)
    close(h, h.numpy().T, 1e-12)


def test_hessian_positions_and_aux():
    x, y = rnd(1, 3), rnd(2, 2, 2)

    def f(a, b):
        return (ops.tanh(a)[:2] * ops.matmul(b, a[1:])).sum(), b * 2

    (hess, aux) = kiln.hessian(f, grad_position=(0, 1), has_aux=True)(x, y)
    assert [[tuple(h.shape) for h in row] for row in hess] == [[(3, 3), (3, 2, 2)], [(2, 2, 3), (2, 2, 2, 2)]]
    grad = kiln.grad(lambda a, b: f(a, b)[0], grad_position=(0, 1))
    for i, row in enumerate(hess):
        for j, h in enumerate(row):
            args = [x.numpy(), y.numpy()]

            def g(v, i=i, j=j):
                a = list(args)
                a[j] = v
                return grad(t(a[0]), t(a[1]))[i].numpy()

            close(h, central_differences(g, args[j]), 1e-6)
    close(aux, 2 * y.numpy())


def test_no_fallback_warning_for_the_networks_here():
    x, w = rnd(1, 4), rnd(2, 3, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", kiln.VmapFallbackWarning)
        kiln.jacfwd(lambda a: ops.tanh(ops.matmul(w, a)))(x)
        kiln.hessian(lambda a: (ops.tanh(ops.matmul(w, a)) ** 2).sum())(x)


# ---- one batched graph ----------------------------------------------------------------------------

def _op_count(graph_text):
    return len(re.findall(r"^\s*%\d+: [^=]+ = (?!constant\(|captured)\w+\(", graph_text, re.M))


@pytest.mark.parametrize("which", ["jacfwd", "hessian"])
def test_one_batched_graph_whatever_the_input_size(which):
    """A loop over the basis would add ops per input element; the batched graph has as many ops
    for 3 inputs as for 12."""
    def f(a):
        return ops.tanh(a * 1.5) * ops.sin(a).sum()

    transform = kiln.jacfwd(f) if which == "jacfwd" else kiln.hessian(lambda a: (f(a) ** 2).sum())
    jf = kiln.jit(transform)
    counts = []
    for n in (3, 12):
        x = rnd(n, n)
        got = jf(x)
        want = transform(x)
        close(got, want, 1e-12)
        counts.append(_op_count(jf.graph_str(x)))
    assert counts[0] == counts[1] and counts[0] > 0, counts


def test_eager_jacfwd_runs_a_fixed_number_of_kernels():
    def f(a):
        return ops.tanh(a * 1.5) * ops.sin(a).sum()

    calls = []
    for n in (3, 12):
        with kiln.profiler.profile(record_shapes=False, profile_memory=False) as prof:
            kiln.jacfwd(f)(rnd(n, n))
        calls.append(sum(e.count for e in prof.key_averages()))
    assert calls[0] == calls[1], calls


# ---- compiled ---------------------------------------------------------------------------------------

def _user_jacfwd(x, w):
    return kiln.jacfwd(lambda a, b: ops.tanh(ops.matmul(b, a)) * a[:3], grad_position=(0, 1))(x, w)


def _user_jacfwd_aux(x, w):
    jac, aux = kiln.jacfwd(lambda a: (ops.softmax(ops.matmul(w, a), 0), a.sum()), has_aux=True)(x)
    return jac, aux


def _user_hessian(x, w):
    return kiln.hessian(lambda a, b: (ops.tanh(ops.matmul(b, a)) ** 2).sum(), grad_position=(0, 1))(x, w)


USER = [_user_jacfwd, _user_jacfwd_aux, _user_hessian]


def _flat(out, into):
    if isinstance(out, (tuple, list)):
        for o in out:
            _flat(o, into)
    else:
        into.append(out)
    return into


def _calls():
    return [(rnd(1, 4), rnd(2, 3, 4)), (rnd(4, 4), rnd(5, 3, 4))]


def _numeric(fn, x, w):
    """fn's results from central differences: what every variant must also match."""
    if fn is _user_jacfwd:
        f = lambda a, b: np.tanh(b @ a) * a[:3]  # noqa: E731
        return [central_differences(lambda a: f(a, w), x), central_differences(lambda b: f(x, b), w)]
    if fn is _user_jacfwd_aux:
        def sm(a):
            e = np.exp(w @ a - (w @ a).max())
            return e / e.sum()
        return [central_differences(sm, x), x.sum()]
    g = kiln.grad(lambda a, b: (ops.tanh(ops.matmul(b, a)) ** 2).sum(), grad_position=(0, 1))
    out = []
    for i in range(2):
        out.append(central_differences(lambda a: g(t(a), t(w))[i].numpy(), x))
        out.append(central_differences(lambda b: g(t(x), t(b))[i].numpy(), w))
    return out


@pytest.mark.parametrize("fn", USER, ids=[f.__name__ for f in USER])
def test_eager_matches_central_differences(fn):
    for x, w in _calls():
        got = _flat(fn(x, w), [])
        want = _numeric(fn, x.numpy(), w.numpy())
        assert len(got) == len(want)
        for a, b in zip(got, want):
            close(a, b, 1e-6)


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


@pytest.mark.parametrize("fn", USER, ids=[f.__name__ for f in USER])
def test_kiln_trace_equals_eager(fn):
    calls = _calls()
    want = [_flat(fn(*c), []) for c in calls]
    for variant in TRACE_VARIANTS:
        tf = variant.wrap(fn)
        for c, w in zip(calls, want):
            got = _flat(tf(*c), [])
            assert len(got) == len(w), variant.name
            for k, (a, b) in enumerate(zip(got, w)):
                np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-12, atol=1e-12,
                                           err_msg=f"{variant.name} output {k}")


# ---- what vmap refuses: the loops take over ---------------------------------------------------------

def scaled(a):
    return a * (2.0 if float(a.sum()) > 0 else 3.0) + ops.sin(a)  # a value read into Python


def test_a_value_read_into_python_is_fixed_by_the_primals():
    """jacfwd records the function once, as jvp does, so a Python branch on the primals' values is
    taken once; hessian's kiln.jacrev refuses it (vmap: the value may differ per example), and the
    rows of the Jacobian come from a vjp per output element instead."""
    for x in (t(np.array([0.5, 1.0, -0.2])), t(np.array([-0.5, -1.0, 0.2]))):
        k = 2.0 if x.numpy().sum() > 0 else 3.0
        xn = x.numpy()
        close(kiln.jacfwd(scaled)(x), np.diag(k + np.cos(xn)))
        close(kiln.hessian(lambda a: (scaled(a) ** 2).sum())(x),
              np.diag(2 * (k + np.cos(xn)) ** 2 - 2 * (k * xn + np.sin(xn)) * np.sin(xn)))
    with pytest.raises(kiln.batching.VmapValueReadError, match="reads a tensor's value into Python"):
        kiln.jacrev(scaled)(t(np.ones(3)))
    assert issubclass(kiln.batching.VmapValueReadError, ValueError)



def test_control_flow_takes_the_pass_per_basis_vector():
    def f(a):
        return ops.cond(a.sum() > 0, lambda p: ops.sin(p) * p, lambda p: p * p, (a,))

    x = t(np.array([0.3, 0.7, 1.1]))
    with pytest.raises(kiln.batching.VmapControlFlowError, match="if .*control flow"):
        kiln.vmap(f)(t(np.ones((2, 3))))
    assert issubclass(kiln.batching.VmapControlFlowError, NotImplementedError)
    close(kiln.jacfwd(f)(x), central_differences(lambda a: np.sin(a) * a, x.numpy()), 1e-7)
    close(kiln.hessian(lambda a: f(a).sum())(x), np.diag(2 * np.cos(x.numpy()) - x.numpy() * np.sin(x.numpy())),
          1e-10)


def test_gradient_through_the_batched_jacobian():
    """Reverse over forward: kiln.grad of a function of jacfwd's Jacobian."""
    def f(a):
        return ops.sin(a) * a.sum()

    def jac_np(a):
        return np.diag(np.cos(a)) * a.sum() + np.sin(a)[:, None]

    x = t(np.array([0.3, -0.7, 1.1]))
    got = kiln.grad(lambda a: (kiln.jacfwd(f)(a) ** 2).sum())(x)
    close(got, central_differences(lambda a: (jac_np(a) ** 2).sum(), x.numpy()), 1e-7)
