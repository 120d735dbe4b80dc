"""kiln.recompute / kiln.checkpoint / kiln.remat and Cell.recompute (issue 34): eagerly the
function's intermediates are dropped after the forward and computed again in the backward;
compiled, the recompute pass does it. Results and gradients equal running without recomputation
(bit for bit eagerly, dropout included), gradients equal finite differences, the peak memory of
a deep MLP's training step is lower (kiln's allocator high-water mark, as bench/bench_memory.py
reads it), and explain() says what was recomputed."""
import collections
import warnings

import numpy as np
import pytest

import kiln
from kiln import nn, ops
from conformance import ENV, VARIANTS, difference, environment

Pair = collections.namedtuple("Pair", "y extra")


def _rand(*shape, seed=0, dtype=kiln.float32):
    return kiln.Tensor(np.random.default_rng(seed).standard_normal(shape) * 0.3, dtype)


class Block(nn.Cell):
    def __init__(self, n, p_drop=0.0):
        super().__init__()
        self.l1 = nn.Dense(n, 4 * n)
        self.l2 = nn.Dense(4 * n, n)
        self.p_drop = p_drop

    def construct(self, x):
        h = ops.relu(self.l1(x))
        if self.p_drop:
            h = ops.dropout(h, self.p_drop)
        return x + self.l2(h)


class MLP(nn.Cell):
    def __init__(self, n, depth, recompute, p_drop=0.0):
        super().__init__()
        self.blocks = nn.CellList([Block(n, p_drop) for _ in range(depth)])
        if recompute:
            for b in self.blocks:
                b.recompute()

    def construct(self, x):
        for b in self.blocks:
            x = b(x)
        return (x * x).mean()


def _mlp(recompute, n=64, depth=6, p_drop=0.0):
    kiln._C.manual_seed(7)  # the same parameters for both
    return MLP(n, depth, recompute, p_drop)


def _train_grads(net, x, seed=11):
    kiln._C.manual_seed(seed)  # the same dropout draws for both
    value, grads = kiln.value_and_grad(net, grad_position=0, weights=net.trainable_params())(x)
    return value, grads


def _bitwise(a, b):
    la, lb = kiln.tree_util.tree_leaves(a), kiln.tree_util.tree_leaves(b)
    assert len(la) == len(lb)
    for u, v in zip(la, lb):
        assert u.dtype is v.dtype and np.array_equal(u.numpy(), v.numpy()), (u, v)


# ---- the names ---------------------------------------------------------------------------------


def test_names_and_the_checkpoint_module_rename():
    assert kiln.checkpoint is kiln.recompute and kiln.remat is kiln.recompute
    from kiln import serialization

    assert kiln.save_checkpoint is serialization.save_checkpoint
    assert kiln.load_checkpoint is serialization.load_checkpoint
    with pytest.raises(TypeError, match="expected a function or a Cell"):
        kiln.recompute(3)


# ---- eagerly ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("p_drop", [0.0, 0.3])
def test_cell_recompute_eagerly_is_bitwise_the_same(p_drop):
    x = _rand(32, 64, seed=1)
    want = _train_grads(_mlp(False, p_drop=p_drop), x)
    got = _train_grads(_mlp(True, p_drop=p_drop), x)
    _bitwise(got, want)


def test_recompute_of_a_cell_instance_is_bitwise_the_same():
    x = _rand(16, 64, seed=15)
    plain = _mlp(False, depth=2)
    wrapped = _mlp(False, depth=2)
    blocks = [kiln.recompute(b) for b in wrapped.blocks]

    def loss(x):
        for b in blocks:
            x = b(x)
        return (x * x).mean()

    want = kiln.value_and_grad(plain, grad_position=0, weights=plain.trainable_params())(x)
    got = kiln.value_and_grad(loss, grad_position=0, weights=wrapped.trainable_params())(x)
    _bitwise(got, want)


def test_recompute_function_with_closure_parameters_is_bitwise_the_same():
    ws = [kiln.Parameter(_rand(16, 16, seed=k), name=f"w{k}") for k in range(4)]
    x = _rand(8, 16, seed=9)

    def layer(h, w):
        return ops.tanh(ops.tanh(h @ w) @ w)

    @kiln.checkpoint
    def layer_rc(h, w):
        return ops.tanh(ops.tanh(h @ w) @ w)

    def loss(x, f):
        for w in ws:
            x = f(x, w)
        return (x * x).sum()

    want = kiln.value_and_grad(lambda x: loss(x, layer), grad_position=0, weights=ws)(x)
    got = kiln.value_and_grad(lambda x: loss(x, layer_rc), grad_position=0, weights=ws)(x)
    _bitwise(got, want)
    # a parameter read from a closure, not an argument, gets its gradient too
    w0 = ws[0]
    got = kiln.grad(kiln.remat(lambda x: ops.tanh(x @ w0).sum()), grad_position=None, weights=[w0])(x)
    want = kiln.grad(lambda x: ops.tanh(x @ w0).sum(), grad_position=None, weights=[w0])(x)
    _bitwise(got, want)


def test_recompute_gradients_match_finite_differences_with_pytrees():
    a = _rand(3, 4, seed=2, dtype=kiln.float64)
    b = _rand(4, seed=3, dtype=kiln.float64)

    @kiln.recompute
    def block(p, scale):
        y = ops.sin(p["a"] @ p["b"]) * scale
        return Pair(y, {"none": None, "sq": y * y})

    def loss(p):
        out = block(p, 1.5)
        return out.y.sum() + out.extra["sq"].sum()

    p = {"a": a, "b": b}
    g = kiln.grad(loss)(p)
    out = block(p, 1.5)
    assert type(out) is Pair and out.extra["none"] is None
    eps = 1e-6
    for key in ("a", "b"):
        base = p[key].numpy()
        num = np.zeros_like(base)
        for i in np.ndindex(base.shape):
            vals = []
            for s in (1, -1):
                moved = base.copy()
                moved[i] += s * eps
                q = dict(p, **{key: kiln.Tensor(moved, kiln.float64)})
                vals.append(float(loss(q).numpy()))
            num[i] = (vals[0] - vals[1]) / (2 * eps)
        np.testing.assert_allclose(g[key].numpy(), num, rtol=1e-6, atol=1e-9)


def _eager_peak(net, x):
    step = kiln.value_and_grad(net, grad_position=None, weights=net.trainable_params())
    step(x)  # (warm: whatever the first call allocates once)
    before = kiln._C.memory_stats()[0]
    kiln._C.reset_peak_memory()
    step(x)
    return kiln._C.memory_stats()[1] - before


def test_eager_peak_memory_is_lower_on_a_deep_mlp():
    x = _rand(256, 128, seed=4)
    plain, recomputed = _eager_peak(_mlp(False, n=128, depth=8), x), _eager_peak(_mlp(True, n=128, depth=8), x)
    assert recomputed < 0.75 * plain, (recomputed, plain)


def test_misuse_is_a_clear_error():
    x = _rand(4, 4, seed=5)
    w = kiln.Parameter(_rand(4, 4, seed=6), name="w")
    made_outside = x * 1.0
    made_outside.requires_grad_(True)
    h = made_outside * 2.0  # a tensor with its own history, read from a closure

    with pytest.raises(ValueError, match=r"reads a tensor made outside it with its own gradient history \(by mul\)"):
        kiln.recompute(lambda v: (v * h).sum())(w)

    arg = _rand(4, 4, seed=8)
    arg.requires_grad_(True)
    f = kiln.recompute(lambda v, u: (v @ w * u).sum())
    y = f(arg, x)
    x.add_(1.0)  # an argument changed in place before the backward
    with pytest.raises(RuntimeError, match=r"the argument tensor args\[1\] was changed in place"):
        kiln._C.grad([y], [arg], None, False)


def test_gradients_of_gradients_through_recompute():
    w = kiln.Parameter(_rand(5, 5, seed=13, dtype=kiln.float64), name="w")
    x = _rand(3, 5, seed=14, dtype=kiln.float64)

    def inner(x):
        return ops.tanh(x @ w).sum()

    def plain(x):
        return (kiln.grad(inner)(x) ** 2).sum()

    def recomputed(x):
        return (kiln.grad(kiln.recompute(inner))(x) ** 2).sum()

    np.testing.assert_allclose(recomputed(x).numpy(), plain(x).numpy(), rtol=1e-12)
    want = kiln.grad(plain, grad_position=0, weights=[w])(x)
    got = kiln.grad(recomputed, grad_position=0, weights=[w])(x)
    np.testing.assert_allclose(got[0].numpy(), want[0].numpy(), rtol=1e-10)
    np.testing.assert_allclose(got[1][0].numpy(), want[1][0].numpy(), rtol=1e-10)
    assert np.abs(want[0].numpy()).max() > 0


# ---- compiled ----------------------------------------------------------------------------------


def test_every_jit_variant_equals_eager_and_marks_the_region():
    x = _rand(16, 32, seed=12)

    def make(rc):
        net = _mlp(rc, n=32, depth=3)
        return kiln.value_and_grad(net, grad_position=0, weights=net.trainable_params())

    want = make(False)(x)
    problems = []
    with environment(ENV), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for v in VARIANTS:
            jf = v.wrap(make(True))
            d = difference(jf(x), want)
            if d:
                problems.append(f"{v.name}: {d}")
            if jf.cache_info().eager_calls or jf.cache_info().compiles != 1:
                problems.append(f"{v.name}: {jf.cache_info()}")
            text = str(jf.explain())
            if "recompute (kiln.recompute / Cell.recompute):" not in text:
                problems.append(f"{v.name}: explain() says nothing of recomputation:\n{text}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("mode", ["ast", "bytecode", "trace"])
def test_kiln_recompute_function_compiled(mode):
    ws = [kiln.Parameter(_rand(32, 32, seed=20 + k), name=f"w{k}") for k in range(4)]

    def loss(x, rc):
        for w in ws:
            f = kiln.recompute(_layer) if rc else _layer
            x = f(x, w)
        return (x * x).sum()

    x = _rand(64, 32, seed=30)
    want = kiln.value_and_grad(lambda x: loss(x, False), grad_position=0, weights=ws)(x)
    jf = kiln.jit(kiln.value_and_grad(lambda x: loss(x, True), grad_position=0, weights=ws), capture_mode=mode)
    assert difference(jf(x), want) is None
    assert difference(jf(x), want) is None
    info = jf.cache_info()
    assert info.compiles == 1 and info.eager_calls == 0 and jf.explain().graph_break_count == 0
    assert "recompute (kiln.recompute / Cell.recompute):" in str(jf.explain())


def _layer(h, w):
    return ops.relu(ops.relu(h @ w) @ w) + h


def test_compiled_peak_memory_is_lower_on_a_deep_mlp():
    x = _rand(256, 128, seed=4)
    peaks = []
    for rc in (False, True):
        net = _mlp(rc, n=128, depth=8)
        step = kiln.jit(kiln.value_and_grad(net, grad_position=None, weights=net.trainable_params()),
                        capture_mode="trace")
        step(x)
        exe = step.executable(x)
        peaks.append(exe.recompute_report())
    assert peaks[0].get("recompute", "none") == "none" and peaks[1]["recompute"] == "cell"
    assert peaks[1]["peak_after"] < 0.75 * peaks[1]["peak_before"], peaks[1]


@pytest.mark.parametrize("mode", ["ast", "bytecode", "trace"])
def test_compiled_recompute_with_dropout_equals_eager(mode):
    x = _rand(16, 32, seed=3)
    net = _mlp(True, n=32, depth=3, p_drop=0.3)
    vg = kiln.value_and_grad(net, grad_position=0, weights=net.trainable_params())
    kiln.manual_seed(5)
    want = vg(x)  # eagerly: recomputed on the tape, the same mask drawn again
    plain = _mlp(False, n=32, depth=3, p_drop=0.3)
    kiln.manual_seed(5)
    _bitwise(want, kiln.value_and_grad(plain, grad_position=0, weights=plain.trainable_params())(x))
    jf = kiln.jit(vg, capture_mode=mode)
    kiln.manual_seed(5)
    assert difference(jf(x), want) is None
    assert jf.cache_info().compiles == 1 and jf.cache_info().eager_calls == 0
