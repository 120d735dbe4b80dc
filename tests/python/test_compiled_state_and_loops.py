"""Compiled training steps and loops that must equal eager (issue 27): a learning-rate schedule is
an input of the compiled step (one compile for every step, in every capture mode); a BatchNorm's
running statistics are updated once per call when value_and_grad differentiates a function jitted
with capture_mode="bytecode"; jit(grad(g)) after jit(grad(f)) gives g's gradient; while_loop takes
any number of loop values, as a pytree; cache_info counts value_and_grad's compiles; a dynamic
entry keeps the bindings of a growing sequence for the next sequence."""
import warnings

import numpy as np
import pytest

import kiln
from kiln import nn, ops

MODES = ("ast", "bytecode", "trace")
VARIANTS = [(m, lvl, be) for m in MODES for lvl in ("O0", "O1") for be in ("kbk", "sink")]


def rnd(rng, *shape):
    return kiln.tensor(rng.standard_normal(shape).astype(np.float32))


def jit(fn, mode, level="O0", backend="kbk"):
    return kiln.jit(fn, capture_mode=mode, jit_level=level, backend=backend)


# ---- a learning-rate schedule ------------------------------------------------------------------


def _train(variant, schedule, optimizer, steps=6):
    """Losses, final weights and the step's cache_info of a small training step (eager: variant None)."""
    kiln.manual_seed(0)
    net = nn.Dense(4, 3)
    opt = optimizer(net.trainable_params(), schedule)
    grad_fn = kiln.value_and_grad(lambda x, y: ((net(x) - y) ** 2).mean(), None, opt.parameters)

    def step(x, y):
        loss, grads = grad_fn(x, y)
        opt(grads)
        return loss

    fn = step if variant is None else jit(step, *variant)
    rng = np.random.default_rng(1)
    x, y = rnd(rng, 5, 4), rnd(rng, 5, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "runs eagerly" fallback
        losses = [fn(x, y).item() for _ in range(steps)]
    info = None if variant is None else fn.cache_info()
    return losses, net.weight.asnumpy(), net.bias.asnumpy(), opt.global_step, info


SCHEDULES = {
    "list": lambda: [0.5, 0.0, 0.0, 0.0],  # only the first step moves the weights
    "list_then_last": lambda: [0.1, 0.05, 0.02],
    "callable": lambda: (lambda step: 0.2 / (1 + step)),
}
OPTIMIZERS = {
    "sgd_momentum": lambda params, lr: nn.SGD(params, learning_rate=lr, momentum=0.9),
    "adam": lambda params, lr: nn.Adam(params, learning_rate=lr),
}


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(v))
@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_a_learning_rate_schedule_is_an_input_of_the_compiled_step(variant, schedule, optimizer):
    make = OPTIMIZERS[optimizer]
    eager = _train(None, SCHEDULES[schedule](), make)
    got = _train(variant, SCHEDULES[schedule](), make)
    np.testing.assert_allclose(got[0], eager[0], rtol=1e-5, atol=1e-6, err_msg="losses")
    np.testing.assert_allclose(got[1], eager[1], rtol=1e-5, atol=1e-6, err_msg="weights")
    np.testing.assert_allclose(got[2], eager[2], rtol=1e-5, atol=1e-6, err_msg="biases")
    assert got[3] == eager[3] == 6
    info = got[4]
    assert info.compiles == 1 and info.eager_calls == 0, info  # one compiled step serves every step


def test_a_list_schedule_stops_the_weights_after_its_first_step():
    """The symptom: [0.5, 0, 0, 0] kept applying 0.5 under capture_mode="bytecode"."""
    losses, w, b, _, _ = _train(("bytecode",), [0.5, 0.0, 0.0, 0.0], OPTIMIZERS["sgd_momentum"])
    assert losses[1] == losses[2] == losses[5]  # (rate 0 from the second step on: nothing moves)
    assert losses[1] != losses[0]


def test_the_update_ops_check_a_learning_rate_tensor():
    p, g = nn.Parameter(ops.ones((3,)), name="p"), ops.ones((3,))
    steps = ops.zeros((), dtype=kiln.int64)
    from kiln._optable import OP

    with pytest.raises(TypeError, match="learning rate must be a 1-element float tensor"):
        kiln._C.apply(OP.sgd_update, (p, g, p, steps, ops.ones((2,))), (0,), (0.0, 0.0, 0.0, 0.0))
    with pytest.raises(ValueError, match="learning rate must be >= 0"):
        kiln._C.apply(OP.sgd_update, (p, g, p, steps, kiln.tensor(np.float64(-1.0))), (0,), (0.0, 0.0, 0.0, 0.0))
    kiln._C.apply(OP.sgd_update, (p, g, p, steps, kiln.tensor(np.float64(0.25))), (0,), (9.0, 0.0, 0.0, 0.0))
    np.testing.assert_allclose(p.asnumpy(), np.full(3, 0.75))  # the tensor's rate, not the attribute's


# ---- BatchNorm under value_and_grad(jit(f, capture_mode="bytecode")) -----------------------------


def _bn_run(mode, calls=3):
    kiln.manual_seed(0)
    net = nn.SequentialCell(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 2, 1), nn.BatchNorm2d(2))
    net.set_train(True)

    def f(x):
        return (net(x) ** 2).mean()

    fn = f if mode is None else kiln.jit(f, capture_mode=mode)
    step = kiln.value_and_grad(fn, None, net.trainable_params())
    x = rnd(np.random.default_rng(2), 4, 3, 6, 6)
    out = [step(x) for _ in range(calls)]
    stats = [c.moving_mean.asnumpy() for c in (net[1], net[4])] + [c.moving_variance.asnumpy() for c in (net[1], net[4])]
    return out, stats


@pytest.mark.parametrize("mode", MODES)
def test_batchnorm_running_statistics_are_updated_once_per_call(mode):
    eager_out, eager_stats = _bn_run(None)
    out, stats = _bn_run(mode)
    for got, want in zip(stats, eager_stats):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    for (v, gs), (ev, egs) in zip(out, eager_out):
        np.testing.assert_allclose(v.asnumpy(), ev.asnumpy(), rtol=1e-5, atol=1e-6)
        for g, eg in zip(gs, egs):
            np.testing.assert_allclose(g.asnumpy(), eg.asnumpy(), rtol=1e-4, atol=1e-5)


def test_a_capture_given_up_leaves_in_place_updates_to_the_eager_run():
    """A capture that cannot finish (a value read by code run as it is) ran the running-statistics
    update once already: the eager run that follows must not make it twice."""
    kiln.manual_seed(0)
    bn = nn.BatchNorm1d(3)
    bn.set_train(True)

    def f(x):
        y = bn(x)
        return y * max(y.sum(), y.mean())  # (max compares two tensors: a value read by code run as it is)

    eager_bn = nn.BatchNorm1d(3)
    eager_bn.set_train(True)
    x = rnd(np.random.default_rng(3), 5, 3)
    jf = kiln.jit(f, capture_mode="bytecode")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(2):
            jf(x)
            eager_bn(x)
    assert jf.cache_info().eager_calls == 2  # the capture gave up: the calls ran eagerly
    np.testing.assert_allclose(bn.moving_mean.asnumpy(), eager_bn.moving_mean.asnumpy(), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(bn.moving_variance.asnumpy(), eager_bn.moving_variance.asnumpy(), rtol=1e-6,
                               atol=1e-7)


@pytest.mark.parametrize("mode", MODES)
def test_dropout_under_value_and_grad_draws_the_random_stream_once(mode):
    """A differentiable bytecode piece is captured, then run compiled: the capture's draws are
    given back, so the values and the generator's stream follow eager's from manual_seed."""
    x = kiln.tensor(np.ones((4, 8), np.float32))

    def run(jitted):
        kiln.manual_seed(0)
        w = nn.Parameter(kiln.tensor(np.linspace(0.5, 1.5, 64, dtype=np.float32).reshape(8, 8)), name="w")

        def f(x):
            return (ops.dropout(x @ w, 0.5) ** 2).sum()

        vg = kiln.value_and_grad(kiln.jit(f, capture_mode=mode) if jitted else f, None, [w])
        out = [vg(x) for _ in range(3)]
        return out, ops.rand((4,)).asnumpy()

    (eager, eager_next), (got, got_next) = run(False), run(True)
    np.testing.assert_array_equal(got_next, eager_next)  # the stream after the calls
    for (v, (g,)), (ev, (eg,)) in zip(got, eager):
        np.testing.assert_allclose(v.asnumpy(), ev.asnumpy(), rtol=1e-6)
        np.testing.assert_allclose(g.asnumpy(), eg.asnumpy(), rtol=1e-6)


# ---- kiln.grad wrappers ------------------------------------------------------------------------


def _fd(f, x, eps=1e-3):
    base = x.asnumpy().astype(np.float64)
    out = np.zeros_like(base)
    for i in np.ndindex(base.shape):
        hi, lo = base.copy(), base.copy()
        hi[i] += eps
        lo[i] -= eps
        out[i] = (float(f(kiln.tensor(hi.astype(np.float32))).item())
                  - float(f(kiln.tensor(lo.astype(np.float32))).item())) / (2 * eps)
    return out


@pytest.mark.parametrize("mode", ("bytecode", "trace"))
def test_each_jitted_grad_wrapper_differentiates_its_own_function(mode):
    def f(x):
        return (x * x).sum()

    def g(x):
        return (ops.sin(x) * x * x * x).sum()

    x = kiln.tensor(np.array([0.5, -1.0, 2.0], np.float32))
    gf = kiln.jit(kiln.grad(f), capture_mode=mode)(x)
    gg = kiln.jit(kiln.grad(g), capture_mode=mode)(x)
    np.testing.assert_allclose(gf.asnumpy(), _fd(f, x), rtol=1e-2, atol=1e-2)
    np.testing.assert_allclose(gg.asnumpy(), _fd(g, x), rtol=1e-2, atol=1e-2)
    np.testing.assert_allclose(gg.asnumpy(), kiln.grad(g)(x).asnumpy(), rtol=1e-5, atol=1e-6)
    v, dg = kiln.jit(kiln.value_and_grad(g), capture_mode=mode)(x)
    np.testing.assert_allclose(v.asnumpy(), g(x).asnumpy(), rtol=1e-6)
    np.testing.assert_allclose(dg.asnumpy(), gg.asnumpy(), rtol=1e-5, atol=1e-6)


_SCALE = [2.0]


def _scaled_square(x):
    return (x * x * _SCALE[0]).sum()


def _body_scale(a):
    return a * _SCALE[0]


@pytest.mark.parametrize("mode", ("bytecode", "trace"))  # (ast: kiln.jit(kiln.grad(f)) is the ast owner's)
def test_what_a_jitted_grad_or_a_loop_body_reads_is_guarded(mode):
    """The user code a kiln.grad wrapper or a loop body runs reads Python state: a compiled call
    after it changed must follow it."""
    x = kiln.tensor(np.array([1.0, 2.0, 3.0], np.float32))

    def loop(a):
        return ops.while_loop(lambda v: v.sum() < 100, _body_scale, (a,))[0]

    _SCALE[0] = 2.0
    g = kiln.jit(kiln.grad(_scaled_square), capture_mode=mode)
    lp = kiln.jit(loop, capture_mode=mode)
    try:
        for scale in (2.0, 5.0):
            _SCALE[0] = scale
            np.testing.assert_allclose(g(x).asnumpy(), kiln.grad(_scaled_square)(x).asnumpy(), rtol=1e-6)
            np.testing.assert_allclose(lp(x).asnumpy(), loop(x).asnumpy(), rtol=1e-6)
    finally:
        _SCALE[0] = 2.0


def test_cache_info_counts_the_graphs_value_and_grad_compiles():
    x = kiln.tensor(np.array([1.0, 2.0, 3.0], np.float32))
    for mode in MODES:
        jf = kiln.jit(lambda a: (a * a * 3).sum(), capture_mode=mode)
        vg = kiln.value_and_grad(jf)
        for _ in range(3):
            v, g = vg(x)
        np.testing.assert_allclose(g.asnumpy(), [6.0, 12.0, 18.0])
        info = jf.cache_info()
        assert info.compiles >= 1 and info.eager_calls == 0, (mode, info)


# ---- while_loop: any number of loop values, as a pytree ------------------------------------------


def _many_values(n):
    vals = tuple(kiln.tensor(np.full((2,), i, np.float32)) for i in range(n))
    return vals + (kiln.tensor(np.int64(0)), kiln.tensor(np.arange(4, dtype=np.float64).reshape(2, 2)))


def _loop_many(*v):
    return ops.while_loop(lambda *u: u[0].sum() < 6, lambda *u: tuple(t + 1 for t in u), v)


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(v))
def test_while_loop_keeps_every_one_of_256_loop_values(variant):
    vals = _many_values(256)
    eager = _loop_many(*vals)
    assert len(eager) == 258
    fn = jit(_loop_many, *variant)
    for _ in range(2):
        got = fn(*vals)
        assert len(got) == len(eager)
        for k, (a, b) in enumerate(zip(got, eager)):
            assert a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape), k
            np.testing.assert_array_equal(a.asnumpy(), b.asnumpy(), err_msg=f"loop value {k}")
    assert float(got[100].asnumpy()[0]) == 103.0 and int(got[256].item()) == 3


def _loop_tree(x, y):
    init = [{"i": ops.zeros((), dtype=kiln.int64), "acc": (y, [x, x * 2])}]
    return ops.while_loop(lambda s: s["i"] < 3,
                          lambda s: {"i": s["i"] + 1, "acc": (s["acc"][0] * 2, [s["acc"][1][0] + x, s["acc"][1][1]])},
                          init)


@pytest.mark.parametrize("mode", MODES)
def test_while_loop_values_may_be_a_pytree(mode):
    rng = np.random.default_rng(4)
    x, y = rnd(rng, 3), rnd(rng, 3)
    eager = _loop_tree(x, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (bytecode: np.int64 construction may run eagerly)
        got = kiln.jit(_loop_tree, capture_mode=mode)(x, y)
    assert isinstance(got, list) and set(got[0]) == {"i", "acc"}
    assert int(got[0]["i"].item()) == 3
    np.testing.assert_allclose(got[0]["acc"][0].asnumpy(), y.asnumpy() * 8, rtol=1e-6)
    np.testing.assert_allclose(got[0]["acc"][1][0].asnumpy(), x.asnumpy() * 4, rtol=1e-6)
    for a, b in zip((got[0]["acc"][0], *got[0]["acc"][1]), (eager[0]["acc"][0], *eager[0]["acc"][1])):
        np.testing.assert_allclose(a.asnumpy(), b.asnumpy(), rtol=1e-6)


def test_gradients_flow_through_a_loop_of_many_values():
    """Past 32 values the loop carries them packed; gradients reach every one."""
    rng = np.random.default_rng(5)
    xs = [rnd(rng, 2) for _ in range(40)]

    def f(*v):
        out = ops.while_loop(lambda k, *u: k < 2, lambda k, *u: (k + 1,) + tuple(t * t for t in u),
                             (ops.zeros((), dtype=kiln.int64),) + v)
        return sum((t * (i + 1)).sum() for i, t in enumerate(out[1:]))

    eager_g = kiln.grad(f, grad_position=tuple(range(40)))(*xs)
    for mode in MODES:
        got = kiln.grad(kiln.jit(f, capture_mode=mode), grad_position=tuple(range(40)))(*xs)
        for k, (a, b) in enumerate(zip(got, eager_g)):
            np.testing.assert_allclose(a.asnumpy(), b.asnumpy(), rtol=1e-4, atol=1e-5, err_msg=f"{mode} value {k}")
    # d/dx of (i + 1) * x^4: 4 (i + 1) x^3
    for i, (x, g) in enumerate(zip(xs, eager_g)):
        np.testing.assert_allclose(g.asnumpy(), 4 * (i + 1) * x.asnumpy() ** 3, rtol=1e-4, atol=1e-4)


def _cond_many(p, *v):
    return ops.cond(p.sum() > 0, lambda *u: [t * 2 for t in u], lambda *u: [t - 1 for t in u], v)


@pytest.mark.parametrize("mode", MODES)
def test_cond_returns_every_one_of_many_outputs(mode):
    vals = _many_values(40)
    fn = kiln.jit(_cond_many, capture_mode=mode)
    for p in (ops.ones((1,)), -ops.ones((1,))):
        eager, got = _cond_many(p, *vals), fn(p, *vals)
        assert isinstance(got, list) and len(got) == len(eager) == 42
        for k, (a, b) in enumerate(zip(got, eager)):
            assert a.dtype == b.dtype, k
            np.testing.assert_array_equal(a.asnumpy(), b.asnumpy(), err_msg=f"output {k}")
    xs = vals[:36]
    grads = kiln.grad(lambda *v: sum(t.sum() for t in fn(ops.ones((1,)), *v)), grad_position=tuple(range(36)))(*xs)
    for g, x in zip(grads, xs):
        np.testing.assert_allclose(g.asnumpy(), np.full(x.shape, 2.0))


def test_a_differentiated_bytecode_piece_with_more_than_32_outputs():
    """The piece's tape node has 40 outputs: its backward must not read past an op's 32."""
    xs = [t * 1.0 for t in _many_values(40)[:40]]

    def pieces(*v):
        return tuple(t * (i + 1) for i, t in enumerate(v))

    fn = kiln.jit(pieces, capture_mode="bytecode")
    for _ in range(2):
        grads = kiln.grad(lambda *v: sum(t.sum() for t in fn(*v)), grad_position=tuple(range(40)))(*xs)
        for i, g in enumerate(grads):
            np.testing.assert_allclose(g.asnumpy(), np.full((2,), i + 1.0))


def test_while_loop_refuses_a_body_changing_the_structure():
    x = kiln.tensor(np.ones(2, np.float32))
    with pytest.raises(ValueError, match="body_fn returns"):
        ops.while_loop(lambda a: a[0].sum() < 5, lambda a: ((a[0] + 1, a[0]),), ((x,),))
    with pytest.raises(TypeError, match="loop value 0 must be a Tensor"):
        ops.while_loop(lambda a: a < 5, lambda a: a + 1, (3,))


# ---- dynamic shapes: the bindings of a growing sequence ------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_a_growing_sequence_binds_each_length_once(mode):
    def attend(q, cache):
        scores = ops.matmul(cache, q)  # (n,)
        return (ops.softmax(scores, -1)[:, None] * cache).sum(0)

    fn = kiln.jit(attend, capture_mode=mode, dynamic=True)
    rng = np.random.default_rng(6)
    q = rnd(rng, 8)
    lengths = range(2, 60)
    for _ in range(2):  # two generated sequences of the same lengths
        for n in lengths:
            cache = rnd(rng, n, 8)
            np.testing.assert_allclose(fn(q, cache).asnumpy(), attend(q, cache).asnumpy(), rtol=1e-5, atol=1e-6)
    info = fn.cache_info()
    # the second sequence finds every length bound by the first
    assert info.instances <= len(lengths), info
