"""Backward hooks: Tensor.register_hook (MindSpore's and PyTorch's), Cell.register_backward_hook /
register_backward_pre_hook (PyTorch's register_full_backward_hook / _pre_hook), ops.HookBackward and
ops.InsertGradientOf. Gradients are checked against NumPy's hand-computed ones, eagerly and under
every kiln.jit variant (conformance.run_all_modes) and kiln.trace: hooks that scale, clip, record
(a list appended to), return None, are removed, are added between calls of a compiled function,
on parameters and on activations, several in order."""
import warnings

import numpy as np
import pytest

import kiln
from kiln import nn, ops

from conformance import TRACE_VARIANTS, run_all_modes

VARIANTS = [(m, lv, b) for m in ("ast", "bytecode", "trace") for lv in ("O0", "O1") for b in ("kbk", "sink")]
IDS = ["-".join(v) for v in VARIANTS]


def arr(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def t(*shape, seed=0):
    return kiln.Tensor(arr(*shape, seed=seed))


@pytest.fixture(autouse=True)
def quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


class Lin(nn.Cell):
    """y = x @ w (w: 3 x 2), NumPy's gradients easy to write down."""

    def __init__(self, seed=0):
        super().__init__()
        self.w = nn.Parameter(kiln.Tensor(arr(3, 2, seed=seed)), name=f"w{seed}")

    def construct(self, x):
        return ops.matmul(x, self.w)


def np_grads(x, w, scale_h=1.0, clip=None):
    """Gradients of L = sum(tanh(x @ w) ** 2) for w and x, the gradient of h = x @ w scaled (and
    clipped) on its way."""
    h = x @ w
    gh = 2 * np.tanh(h) * (1 - np.tanh(h) ** 2) * scale_h
    if clip is not None:
        gh = np.clip(gh, -clip, clip)
    return x.T @ gh, gh @ w.T


# ---- eager semantics --------------------------------------------------------------------------------

def test_leaf_hooks_scale_in_order_and_see_the_whole_gradient():
    x = kiln.Tensor(np.array([1.0, 2.0, 3.0], np.float32))
    x.requires_grad = True
    seen = []
    x.register_hook(lambda g: seen.append(g.asnumpy().copy()))  # returns None: the gradient goes on
    x.register_hook(lambda g: g * 2)
    x.register_hook(lambda g: seen.append(g.asnumpy().copy()))  # sees what the one before returned
    ((x * x).sum() + (x * 3).sum()).backward()  # two uses of x: the hooks see their sum, once
    want = 2 * x.asnumpy() + 3
    np.testing.assert_allclose(seen[0], want)
    np.testing.assert_allclose(seen[1], 2 * want)
    np.testing.assert_allclose(x.grad.asnumpy(), 2 * want)
    assert len(seen) == 2


def test_grad_accumulation_hooks_see_only_this_pass():
    x = kiln.Tensor(np.array([1.0, -2.0], np.float32))
    x.requires_grad = True
    seen = []
    x.register_hook(lambda g: seen.append(g.asnumpy().copy()) or g * 10)
    (x * 2).sum().backward()
    (x * 3).sum().backward()
    np.testing.assert_allclose(seen[0], [2, 2])
    np.testing.assert_allclose(seen[1], [3, 3])  # not the accumulated 5
    np.testing.assert_allclose(x.grad.asnumpy(), [50, 50])


def test_intermediate_hook_replaces_the_gradient_downstream():
    xv = arr(4, 3)
    wv = arr(3, 2, seed=1)
    x = kiln.Tensor(xv)
    w = nn.Parameter(kiln.Tensor(wv), name="w")
    h = ops.matmul(x, w)
    h.register_hook(lambda g: g * 0.5)
    (ops.tanh(h) ** 2).sum().backward()
    gw, _ = np_grads(xv, wv, scale_h=0.5)
    np.testing.assert_allclose(w.grad.asnumpy(), gw, rtol=1e-5, atol=1e-6)


def test_hook_added_after_the_tensor_was_used_still_sees_every_use():
    x = kiln.Tensor(np.array([1.0, 2.0], np.float32))
    x.requires_grad = True
    y = x * 3
    out = (y * y).sum() + y.sum()
    y.register_hook(lambda g: g * 0 + 1)  # dL/dy replaced by ones
    out.backward()
    np.testing.assert_allclose(x.grad.asnumpy(), [3, 3])


def test_remove_and_context_manager():
    x = kiln.Tensor(np.array([1.0, 2.0], np.float32))
    x.requires_grad = True
    handle = x.register_hook(lambda g: g * 100)
    handle.remove()
    handle.remove()  # twice is harmless
    with x.register_hook(lambda g: g * 7):
        np.testing.assert_allclose(kiln.grad(lambda a: a.sum())(x).asnumpy(), [7, 7])
    np.testing.assert_allclose(kiln.grad(lambda a: a.sum())(x).asnumpy(), [1, 1])


def test_hook_on_input_of_grad_call_and_on_tensor_without_gradient():
    x = kiln.Tensor(np.array([1.0, 2.0], np.float32))
    x.requires_grad = True
    calls = []
    unused = kiln.Tensor(np.zeros(2, np.float32))
    unused.requires_grad = True
    unused.register_hook(lambda g: calls.append("unused"))
    x.register_hook(lambda g: calls.append("x") or g + 1)
    g = kiln.grad(lambda a, b: (a * a).sum(), 0)(x, unused)
    np.testing.assert_allclose(g.asnumpy(), [3, 5])
    assert calls == ["x"]  # no gradient reaches `unused`: its hook does not run
    # an argument that does not require grad: grad differentiates a copy, which takes the hooks
    y = kiln.Tensor(np.array([1.0, 2.0], np.float32))
    with pytest.raises(RuntimeError, match="does not require grad"):
        y.register_hook(lambda g: g)


def test_hook_errors_are_clear():
    x = kiln.Tensor(np.array([1.0, 2.0], np.float32))
    x.requires_grad = True
    with pytest.raises(TypeError, match="hook must be callable"):
        x.register_hook(3)
    with x.register_hook(lambda g: "no"):
        with pytest.raises(TypeError, match="must return a Tensor or None, got str"):
            (x * 2).sum().backward()
    with x.register_hook(lambda g: ops.ones((3,), kiln.float32)):
        with pytest.raises(ValueError, match=r"shape \(3,\) for a gradient of shape \(2,\)"):
            (x * 2).sum().backward()

    def boom(g):
        raise KeyError("from the hook")

    with x.register_hook(boom):  # the hook's own exception reaches the caller
        with pytest.raises(KeyError, match="from the hook"):
            kiln.grad(lambda a: a.sum())(x)
    np.testing.assert_allclose(kiln.grad(lambda a: (a * 2).sum())(x).asnumpy(), [2, 2])  # nothing left behind


def test_cell_backward_hooks_eager():
    xv = arr(4, 3)
    net = Lin(1)
    x = kiln.Tensor(xv)
    x.requires_grad = True
    log = []

    def pre(cell, grad_output):
        log.append(("pre", cell, [g.shape for g in grad_output]))
        return (grad_output[0] * 2,)

    def post(cell, grad_input, grad_output):
        log.append(("post", cell, [g.shape for g in grad_input], [g.shape for g in grad_output]))
        return (grad_input[0] * 0.5,)

    h1 = net.register_backward_pre_hook(pre)
    h2 = net.register_full_backward_hook(post)  # PyTorch's name
    gx, gw = kiln.grad(lambda x: (net(x) ** 2).sum(), 0, [net.w])(x)
    y = xv @ net.w.asnumpy()
    gy = 2 * y * 2  # the pre-hook doubled it
    np.testing.assert_allclose(gw[0].asnumpy(), xv.T @ gy, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gx.asnumpy(), 0.5 * gy @ net.w.asnumpy().T, rtol=1e-5, atol=1e-5)
    assert [e[0] for e in log] == ["pre", "post"] and log[0][1] is net
    assert log[1][2] == [(4, 3)] and log[1][3] == [(4, 2)]
    h1.remove()
    h2.remove()
    gx2 = kiln.grad(lambda x: (net(x) ** 2).sum())(x)
    np.testing.assert_allclose(gx2.asnumpy(), 2 * y @ net.w.asnumpy().T, rtol=1e-5, atol=1e-5)
    assert len(log) == 2


def test_cell_backward_hook_errors_reach_the_caller():
    net = Lin(3)

    def bad(cell, gin, gout):
        raise KeyError("cell hook")

    with net.register_backward_hook(bad):
        with pytest.raises(KeyError, match="cell hook"):
            kiln.grad(lambda x: net(x).sum())(t(2, 3))
    with net.register_backward_pre_hook(lambda cell, gout: (gout[0], gout[0])):
        with pytest.raises(ValueError, match="returned 2 gradients for 1"):
            kiln.grad(lambda x: net(x).sum())(t(2, 3))
    with net.register_backward_hook(lambda cell, gin, gout: ops.ones((5, 5), kiln.float32)):
        with pytest.raises(ValueError, match=r"shape \(5, 5\) for one of shape \(2, 3\)"):
            kiln.grad(lambda x: net(x).sum())(t(2, 3))
    kiln.grad(lambda x: net(x).sum())(t(2, 3))  # the hooks are gone


def test_cell_backward_hook_when_inputs_take_no_gradient():
    net = Lin(2)
    seen = []
    net.register_backward_hook(lambda cell, gin, gout: seen.append((gin, len(gout))))
    kiln.grad(lambda x: net(x).sum(), None, [net.w])(t(2, 3))
    assert seen == [((None,), 1)]


def test_hook_backward_and_insert_gradient_of():
    seen = []
    hook = ops.HookBackward(lambda g: seen.append(float(g.asnumpy())))

    def hook_test(x, y):
        z = hook(x * y)
        return z * y

    gx, gy = ops.GradOperation(get_all=True)(hook_test)(kiln.Tensor(1.0), kiln.Tensor(2.0))
    assert seen == [2.0]  # MindSpore's documented example
    assert float(gx.asnumpy()) == 4.0 and float(gy.asnumpy()) == 4.0
    clip = ops.InsertGradientOf(lambda g: ops.clamp(g, -0.5, 0.5))
    g = kiln.grad(lambda a: (clip(a * 1.0) * kiln.Tensor(np.array([3.0, 0.1], np.float32))).sum())(
        kiln.Tensor(np.array([1.0, 1.0], np.float32)))
    np.testing.assert_allclose(g.asnumpy(), [0.5, 0.1], rtol=1e-6)


# ---- compiled: every kiln.jit variant gives eager's gradients ------------------------------------

def _loss(net):
    return lambda x: (ops.tanh(net(x)) ** 2).sum()


def test_compiled_parameter_hooks_scale_and_record():
    net = Lin(3)
    xs = [t(4, 3, seed=k) for k in range(3)]
    LOG = []
    net.w.register_hook(lambda g: g * 3)
    net.w.register_hook(lambda g: LOG.append(g.sum()))
    fn = kiln.grad(_loss(net), None, [net.w])
    want = run_all_modes(fn, *[(x,) for x in xs], reset=LOG.clear, observe=lambda: [float(v.asnumpy()) for v in LOG])
    for x, rec in zip(xs, want):
        gw, _ = np_grads(x.asnumpy(), net.w.asnumpy())
        np.testing.assert_allclose(rec[1][0].asnumpy(), 3 * gw, rtol=1e-5, atol=1e-5)


def test_compiled_activation_hook_clips():
    net = Lin(4)

    def loss(x):
        h = net(x)
        h.register_hook(lambda g: ops.clamp(g, -0.1, 0.1))
        return (ops.tanh(h) ** 2).sum()

    fn = kiln.grad(loss, 0, [net.w])
    xs = [t(4, 3, seed=k) for k in range(3)]
    want = run_all_modes(fn, *[(x,) for x in xs])
    for x, rec in zip(xs, want):
        gw, gx = np_grads(x.asnumpy(), net.w.asnumpy(), clip=0.1)
        np.testing.assert_allclose(rec[1][1][0].asnumpy(), gw, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(rec[1][0].asnumpy(), gx, rtol=1e-5, atol=1e-6)


def test_compiled_cell_backward_hooks_record_and_scale():
    net = Lin(5)
    LOG = []
    net.register_backward_pre_hook(lambda cell, gout: (gout[0] * -1,))
    net.register_backward_hook(lambda cell, gin, gout: LOG.append(float(gout[0].asnumpy().sum())))
    fn = kiln.grad(_loss(net), 0, [net.w])
    run_all_modes(fn, (t(4, 3),), (t(4, 3, seed=1),), reset=LOG.clear, observe=lambda: list(LOG))


def test_compiled_hook_operators():
    LOG = []
    hb = ops.HookBackward(lambda g: LOG.append(float(g.asnumpy().sum())))
    ig = ops.InsertGradientOf(lambda g: g * 4)

    def f(x, y):
        return (ig(hb(x * y)) * y).sum()

    run_all_modes(kiln.grad(f, (0, 1)), (t(3), t(3, seed=1)), (t(3, seed=2), t(3, seed=3)), reset=LOG.clear,
                  observe=lambda: list(LOG))


@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_hooks_added_and_removed_between_calls_take_effect(variant):
    mode, level, backend = variant
    net = Lin(6)
    x = t(4, 3)
    gw, _ = np_grads(x.asnumpy(), net.w.asnumpy())
    f = kiln.jit(kiln.grad(_loss(net), None, [net.w]), capture_mode=mode, jit_level=level, backend=backend)
    np.testing.assert_allclose(f(x)[0].asnumpy(), gw, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(f(x)[0].asnumpy(), gw, rtol=1e-5, atol=1e-6)  # (compiled by now)
    seen = []
    h1 = net.w.register_hook(lambda g: g * -2)
    h2 = net.w.register_hook(lambda g: seen.append(1))
    np.testing.assert_allclose(f(x)[0].asnumpy(), -2 * gw, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(f(x)[0].asnumpy(), -2 * gw, rtol=1e-5, atol=1e-6)
    assert len(seen) == 2
    h1.remove()
    np.testing.assert_allclose(f(x)[0].asnumpy(), gw, rtol=1e-5, atol=1e-6)
    h2.remove()
    np.testing.assert_allclose(f(x)[0].asnumpy(), gw, rtol=1e-5, atol=1e-6)
    assert len(seen) == 3
    cell_hook = net.register_backward_hook(lambda cell, gin, gout: seen.append(2))
    np.testing.assert_allclose(f(x)[0].asnumpy(), gw, rtol=1e-5, atol=1e-6)
    assert seen[-1] == 2
    cell_hook.remove()
    np.testing.assert_allclose(f(x)[0].asnumpy(), gw, rtol=1e-5, atol=1e-6)
    assert len(seen) == 4


@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_pure_hooks_compile_and_others_run_eagerly_with_a_warning(variant):
    """trace and ast capture record a hook made of tensor ops into the graph (guarded: a closure
    value it reads changes -> captured again); a hook with a Python side effect, and every hook under
    bytecode capture (its backward runs in C, outside the interpreter), make the call eager with a
    RuntimeWarning naming why."""
    mode, level, backend = variant
    net = Lin(7)
    x = t(4, 3)
    gw, _ = np_grads(x.asnumpy(), net.w.asnumpy())
    factor = {"k": 2.0}
    net.w.register_hook(lambda g: g * factor["k"])
    f = kiln.jit(kiln.grad(_loss(net), None, [net.w]), capture_mode=mode, jit_level=level, backend=backend)
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        for _ in range(3):
            np.testing.assert_allclose(f(x)[0].asnumpy(), 2 * gw, rtol=1e-5, atol=1e-6)
        factor["k"] = -1.0
        np.testing.assert_allclose(f(x)[0].asnumpy(), -gw, rtol=1e-5, atol=1e-6)
    messages = [str(w.message) for w in got if issubclass(w.category, RuntimeWarning)]
    if mode == "bytecode":
        assert any("runs eagerly" in m and "register_hook" in m for m in messages), messages
    else:
        assert messages == [] and f.cache_info().compiles == 2 and f.cache_info().eager_calls == 0, \
            (messages, f.cache_info())
    LOG = []
    with net.w.register_hook(lambda g: LOG.append(1)):
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            f(x)
            f(x)
    assert len(LOG) == 2
    assert any("runs eagerly" in str(w.message) for w in got if issubclass(w.category, RuntimeWarning))


def test_hooked_input_argument_of_a_compiled_function():
    """A tensor argument with a hook: a compiled call must not replay a graph captured without it."""
    def loss(a):
        return (a * a).sum()

    plain = kiln.Tensor(np.array([1.0, 2.0], np.float32))
    plain.requires_grad = True
    hooked = kiln.Tensor(np.array([1.0, 2.0], np.float32))
    hooked.requires_grad = True
    hooked.register_hook(lambda g: g * 10)
    for mode, level, backend in VARIANTS:
        f = kiln.jit(kiln.grad(loss), capture_mode=mode, jit_level=level, backend=backend)
        for a, want in ((plain, [2, 4]), (plain, [2, 4]), (hooked, [20, 40]), (plain, [2, 4]), (hooked, [20, 40])):
            np.testing.assert_allclose(f(a).asnumpy(), want, err_msg=f"{mode}-{level}-{backend}")


@pytest.mark.parametrize("variant", TRACE_VARIANTS, ids=[v.name for v in TRACE_VARIANTS])
def test_kiln_trace_with_hooks(variant):
    """kiln.trace runs a hook at every call (a recording with one is not replayed) and refuses, with
    TraceMismatchError naming the op, a call whose ops differ from the recording's because a hook was
    added or removed since: never a different gradient."""
    net = Lin(8)
    LOG = []
    handle = net.w.register_hook(lambda g: LOG.append(1) or g * 5)
    fn = kiln.grad(_loss(net), None, [net.w])
    x = t(4, 3)
    gw, _ = np_grads(x.asnumpy(), net.w.asnumpy())
    traced = variant.wrap(fn)
    for k in range(3):
        np.testing.assert_allclose(traced(x)[0].asnumpy(), 5 * gw, rtol=1e-5, atol=1e-6)
        assert len(LOG) == k + 1
    handle.remove()
    with pytest.raises(kiln.jit.megengine.TraceMismatchError, match="fewer ops than recorded"):
        traced(x)
    traced = variant.wrap(fn)
    for _ in range(2):
        np.testing.assert_allclose(traced(x)[0].asnumpy(), gw, rtol=1e-5, atol=1e-6)
    with net.w.register_hook(lambda g: g * 5):
        with pytest.raises(kiln.jit.megengine.TraceMismatchError, match="more ops than recorded"):
            traced(x)
    np.testing.assert_allclose(traced(x)[0].asnumpy(), gw, rtol=1e-5, atol=1e-6)


def test_grad_of_a_compiled_function_with_hooks_inside():
    """kiln.grad around a jitted function (its differentiable pieces): hooks on an activation, a
    Cell's backward hooks and InsertGradientOf inside it act as eagerly."""
    net = Lin(9)
    LOG = []
    net.register_backward_pre_hook(lambda cell, gout: (gout[0] * 3,))
    scale = ops.InsertGradientOf(lambda g: g * -2)

    def f(x):
        h = net(x)
        h.register_hook(lambda g: LOG.append(1) or ops.clamp(g, -0.2, 0.2))
        return (ops.tanh(scale(h)) ** 2).sum()

    run_all_modes(f, (t(4, 3),), (t(4, 3, seed=1),), (t(4, 3, seed=2),), reset=LOG.clear, observe=lambda: len(LOG),
                  around=lambda fn: kiln.grad(fn, 0, [net.w]))


@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_pure_cell_hooks_compile(variant):
    mode, level, backend = variant
    net = Lin(10)
    net.register_backward_pre_hook(lambda cell, gout: (gout[0] * 2,))
    net.register_backward_hook(lambda cell, gin, gout: (gin[0] + 1,))
    x = t(4, 3)
    x.requires_grad = False
    fn = kiln.grad(_loss(net), 0, [net.w])
    f = kiln.jit(fn, capture_mode=mode, jit_level=level, backend=backend)
    want = fn(x)
    gw, gx = np_grads(x.asnumpy(), net.w.asnumpy(), scale_h=2.0)
    np.testing.assert_allclose(want[1][0].asnumpy(), gw, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(want[0].asnumpy(), gx + 1, rtol=1e-5, atol=1e-6)
    for _ in range(3):
        got = f(x)
        np.testing.assert_allclose(got[0].asnumpy(), want[0].asnumpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got[1][0].asnumpy(), want[1][0].asnumpy(), rtol=1e-5, atol=1e-6)
    if mode != "bytecode":
        assert f.cache_info().eager_calls == 0 and f.cache_info().compiles == 1, f.cache_info()
