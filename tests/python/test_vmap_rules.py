"""kiln.vmap against a Python loop of the unbatched function, op by op (each op's KILN_BATCH rule in
src/ops/ops.def), for every in_axes position, None axes and negative axes, eagerly and under
kiln.jit in each capture mode. A rule that is used never warns; the ops with no rule are listed."""
import warnings

import numpy as np
import pytest

import kiln
from kiln import _C, ops

B = 3
RNG = np.random.default_rng(0)


def f32(*shape, positive=False):
    def make():
        a = RNG.standard_normal(shape).astype(np.float32)
        return np.abs(a) + 0.5 if positive else a
    return make


def ints(high, *shape):
    return lambda: RNG.integers(0, high, size=shape).astype(np.int64)


# (name, function, per-argument example makers, in_axes variants); each maker gives one example
CASES = [
    ("neg", ops.neg, [f32(2, 3)], [0, 1, -1]),
    ("abs", ops.abs, [f32(4)], [0]),
    ("exp", ops.exp, [f32(2, 3)], [1]),
    ("log", ops.log, [f32(3, positive=True)], [0]),
    ("sqrt", ops.sqrt, [f32(2, 2, positive=True)], [-1]),
    ("tanh", ops.tanh, [f32(3)], [0]),
    ("sigmoid", ops.sigmoid, [f32(2, 3)], [0]),
    ("relu", ops.relu, [f32(2, 3)], [1]),
    ("gelu", ops.gelu, [f32(5)], [0]),
    ("silu", ops.silu, [f32(5)], [0]),
    ("erf", ops.erf, [f32(5)], [0]),
    ("floor", ops.floor, [f32(5)], [0]),
    ("sin", ops.sin, [f32(5)], [0]),
    ("clamp", lambda x: ops.clamp(x, -0.5, 0.5), [f32(2, 3)], [0]),
    ("cast", lambda x: x.astype(kiln.float64), [f32(2, 3)], [1]),
    ("add", ops.add, [f32(2, 3), f32(3)], [(0, 0), (0, None), (None, 0), (1, 0), (-1, -1)]),
    ("sub", ops.sub, [f32(2, 3), f32(2, 3)], [(0, 1), (None, 1)]),
    ("mul", ops.mul, [f32(3), f32(2, 3)], [(0, None), (None, 0), (0, 2)]),
    ("div", ops.div, [f32(2, 3), f32(2, 3, positive=True)], [(0, 0), (1, None)]),
    ("pow", ops.pow, [f32(2, 3, positive=True), f32(3)], [(0, 0), (None, 0)]),
    ("maximum", ops.maximum, [f32(2, 3), f32(1, 3)], [(0, 0), (0, None)]),
    ("atan2", ops.atan2, [f32(4), f32(4)], [(0, None)]),
    ("logaddexp", ops.logaddexp, [f32(4), f32(4)], [(0, 0)]),
    ("lt", lambda a, b: ops.lt(a, b), [f32(2, 3), f32(3)], [(0, None), (None, 0)]),
    ("where", lambda a, b: ops.where(a > 0, a, b), [f32(2, 3), f32(3)], [(0, None), (None, 0), (1, 0)]),
    ("sum", lambda x: x.sum(axis=1), [f32(2, 3, 4)], [0, 1, 2, -1]),
    ("sum_all", lambda x: x.sum(), [f32(2, 3)], [0, 1]),
    ("mean", lambda x: ops.mean(x, 0, True), [f32(2, 3)], [0, 1]),
    ("prod", lambda x: ops.prod(x, -1), [f32(2, 3)], [0, 2]),
    ("max", lambda x: x.max(axis=-1), [f32(2, 3)], [0, 1]),
    ("var", lambda x: ops.var(x, axis=0), [f32(4, 3)], [0]),
    ("std", lambda x: ops.std(x, axis=1), [f32(4, 3)], [2]),
    ("argmax", lambda x: ops.argmax(x, 1), [f32(4, 3)], [0, 1]),
    ("cumsum", lambda x: ops.cumsum(x, 1), [f32(2, 3)], [0, 2]),
    ("cumprod", lambda x: ops.cumprod(x, 0), [f32(2, 3)], [0]),
    ("sort", lambda x: ops.sort(x, axis=-1)[0], [f32(2, 5)], [0, 1]),
    ("softmax", lambda x: ops.softmax(x, -1), [f32(2, 4)], [0, 2]),
    ("log_softmax", lambda x: ops.log_softmax(x, 0), [f32(2, 4)], [0, 1]),
    ("concat", lambda a, b: ops.concat((a, b), 1), [f32(2, 3), f32(2, 1)], [(0, 0), (0, None), (None, 1)]),
    ("gather_elements", lambda x, i: ops.gather_elements(x, 1, i), [f32(3, 4), ints(4, 3, 2)],
     [(0, 0), (0, None), (None, 0)]),
    ("matmul", ops.matmul, [f32(2, 3), f32(3, 4)], [(0, None), (None, 0), (0, 0), (1, 2), (-1, None)]),
    ("matmul_batched", ops.matmul, [f32(5, 2, 3), f32(3, 4)], [(0, None), (None, 0), (3, 1)]),
    ("matmul_vec", ops.matmul, [f32(3), f32(3, 4)], [(0, None), (None, 0), (0, 0)]),
    ("matmul_vec_vec", ops.matmul, [f32(3), f32(3)], [(0, None), (None, 0), (0, 0)]),
    ("matmul_mat_vec", ops.matmul, [f32(2, 3), f32(3)], [(0, None), (None, 0), (0, 0)]),
    ("dense", lambda x, w, b: ops.dense(x, w, b), [f32(2, 3), f32(4, 3), f32(4)],
     [(0, None, None), (None, 0, None), (None, None, 0), (0, 0, 0), (1, 2, None)]),
    ("reshape", lambda x: x.reshape((6, 2)), [f32(3, 4)], [0, 1, 2]),
    ("permute", lambda x: ops.permute(x, (2, 0, 1)), [f32(2, 3, 4)], [0, 3, -2]),
    ("transpose", lambda x: x.T, [f32(2, 3)], [0, 1]),
    ("broadcast_to", lambda x: ops.broadcast_to(x, (4, 2, 3)), [f32(2, 1)], [0, 1, 2]),
    ("slice", lambda x: x[:, 1:3], [f32(2, 4)], [0, 1, 2]),
    ("slice_step", lambda x: x[::2, -1], [f32(5, 3)], [0, 2]),
    ("index_select", lambda x, i: ops.index_select(x, 0, i), [f32(5, 3), ints(5, 4)],
     [(0, None), (None, 0), (1, None)]),
    ("embedding", lambda w, i: ops.gather(w, i, 0), [f32(6, 3), ints(6, 2, 2)], [(None, 0), (None, 2), (0, 0)]),
    ("gather_axis1", lambda w, i: ops.gather(w, i, 1), [f32(2, 6, 3), ints(6, 4)], [(0, 0), (2, None), (None, 0)]),
    ("index_add", lambda x, i, s: ops.index_add(x, 1, i, s), [f32(2, 5), ints(5, 3), f32(2, 3)],
     [(0, None, 0), (None, 0, 0), (0, 0, None), (1, 0, 1)]),
    ("conv2d", lambda x, w: ops.conv2d(x, w, pad_mode="pad", padding=1), [f32(2, 3, 5, 5), f32(4, 3, 3, 3)],
     [(0, None), (1, None), (None, 0), (0, 0), (4, 1)]),
    ("conv2d_bias_groups", lambda x, w, b: ops.conv2d(x, w, b, pad_mode="valid", stride=2, groups=2),
     [f32(2, 4, 5, 5), f32(6, 2, 3, 3), f32(6)], [(0, None, None), (None, None, 0), (0, 0, 0), (None, 0, None)]),
    ("max_pool2d", lambda x: ops.max_pool2d(x, 2, 2), [f32(2, 3, 4, 4)], [0, 4]),
    ("avg_pool2d", lambda x: ops.avg_pool2d(x, 2, 2), [f32(1, 2, 4, 4)], [0]),
    ("layer_norm", lambda x, w, b: ops.layer_norm(x, (4,), w, b), [f32(3, 4), f32(4), f32(4)],
     [(0, None, None), (1, None, None)]),
    ("attention", lambda q, k, v: ops.scaled_dot_product_attention(q, k, v),
     [f32(2, 3, 4), f32(2, 5, 4), f32(2, 5, 4)], [(0, 0, 0), (0, None, None), (None, 1, 1)]),
    ("full", lambda x: x + ops.ones((3,), kiln.float32), [f32(3)], [0]),
]


def _batched(make, axis):
    """B examples stacked at axis (one shared example when axis is None)."""
    if axis is None:
        return make()
    return np.stack([make() for _ in range(B)], axis=axis)


def _example(arr, axis, i):
    return arr if axis is None else np.take(arr, i, axis=axis)


def _axes(in_axes, n):
    return in_axes if isinstance(in_axes, tuple) else (in_axes,) * n


def _run(mode, fn, in_axes, arrays):
    mapped = kiln.vmap(fn, in_axes=in_axes)
    args = [kiln.tensor(a) for a in arrays]
    if mode == "eager":
        return mapped(*args)
    mode, level, backend = (mode.split("-") + ["O0", "kbk"])[:3]
    jf = kiln.jit(lambda *xs: mapped(*xs), capture_mode=mode, jit_level=level, backend=backend)
    jf(*args)
    return jf(*args)  # the compiled call


CASE_IDS = [f"{name}-{ax}" for name, _, _, variants in CASES for ax in variants]
CASE_ARGS = [(fn, makers, ax) for _, fn, makers, variants in CASES for ax in variants]


@pytest.mark.parametrize("mode", ["eager", "ast", "bytecode", "trace", "trace-O1-sink", "ast-O0-sink", "bytecode-O1-kbk"])
@pytest.mark.parametrize("fn,makers,in_axes", CASE_ARGS, ids=CASE_IDS)
def test_rule_matches_a_loop(mode, fn, makers, in_axes):
    axes = _axes(in_axes, len(makers))
    arrays = [_batched(m, ax) for m, ax in zip(makers, axes)]
    norm = [None if ax is None else ax % arrays[k].ndim for k, ax in enumerate(axes)]
    expected = np.stack([np.asarray(fn(*[kiln.tensor(_example(a, ax, i)) for a, ax in zip(arrays, norm)]).numpy())
                         for i in range(B)])
    with warnings.catch_warnings():
        warnings.simplefilter("error", kiln.VmapFallbackWarning)  # the rule, not the slow path
        got = _run(mode, fn, in_axes, arrays).numpy()
    assert got.shape == expected.shape
    assert got.dtype == expected.dtype
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


# Ops without a KILN_BATCH line: a vmapped function using one runs it once per example (warned), or
# fails for ops with side effects and control flow. This list may only shrink.
WITHOUT_RULE = {
    "index_put",
    "batch_norm",
    "conv2d_fused", "relayout",
    "rnn_layer", "rnn_layer_backward", "sgd_update", "adam_update", "adam_amsgrad_update", "print", "check", "fused",
    "if", "while", "while_grad", "matmul_epilogue",
    # collectives: effects (every rank must make the same calls), refused inside vmap
    "all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "barrier", "send", "recv",
    # made by the bucket_all_reduce pass after capture, never met by vmap
    "all_reduce_bucket", "all_reduce_start", "all_reduce_wait",
}


def test_ops_without_a_batching_rule_do_not_grow():
    missing = {op for op, rule in _C.batch_rules().items() if not rule}
    grown = missing - WITHOUT_RULE
    assert not grown, f"ops without a batching rule (add a KILN_BATCH line in src/ops/ops.def): {sorted(grown)}"
    gone = WITHOUT_RULE - missing
    assert not gone, f"these ops have a batching rule now: remove them from WITHOUT_RULE: {sorted(gone)}"


def test_every_rule_is_a_known_kind():
    kinds = {"elementwise", "reduce", "along", "matmul", "linear", "reshape", "permute", "expand", "slice",
             "slice_assign", "gather", "index_add", "fold", "conv", "norm_backward", "channels", "leading", "leading_all",
             "unbatched", ""}
    assert set(_C.batch_rules().values()) <= kinds
    assert _C.batch_rules()["add"] == "elementwise" and _C.batch_rules()["matmul"] == "matmul"


# ---- batch norm's backward ops: the batch folded into the channels ------------------------------

@pytest.mark.parametrize("name", ["batch_norm_backward", "batch_norm_relu_backward"])
@pytest.mark.parametrize("training", [1, 0])
@pytest.mark.parametrize("in_axes", [(0, None, None), (0, 0, None), (1, None, 0), (None, 0, 0)])
def test_batch_norm_backward_ops(name, training, in_axes):
    """(gy, x, gamma) batched or not (gy along axis 1 once), the statistics (and relu's r) not: the
    op per example, stacked; jacrev and hessian of a batch norm reach the op this way (the cotangents
    batched, the forward's values not)"""
    r64 = np.random.default_rng(1)

    def t64(*shape):
        return kiln.tensor(r64.standard_normal(shape))

    mean, invstd, r = t64(3), kiln.tensor(r64.uniform(0.5, 1.5, 3)), t64(4, 3, 2, 2)
    extra = (r,) if name == "batch_norm_relu_backward" else ()

    def f(gy, x, gamma):
        return _C.apply(OP_INDEX[name], [gy, x, gamma, mean, invstd, *extra], (training,))

    one = [t64(4, 3, 2, 2), t64(4, 3, 2, 2), t64(3)]
    args = []
    for a, ax in zip(one, in_axes):
        if ax is None:
            args.append(a)
        else:
            shape = list(a.shape)
            shape.insert(ax, B)
            args.append(t64(*shape))
    expected = [np.stack([f(*[a if ax is None else kiln.tensor(np.take(a.numpy(), i, axis=ax))
                              for a, ax in zip(args, in_axes)])[k].numpy() for i in range(B)]) for k in range(3)]
    with warnings.catch_warnings():
        warnings.simplefilter("error", kiln.VmapFallbackWarning)
        got = kiln.vmap(f, in_axes=in_axes)(*args)
    for k in range(3):
        assert got[k].shape == expected[k].shape
        np.testing.assert_allclose(got[k].numpy(), expected[k], rtol=1e-12, atol=1e-12)


# ---- every elementwise op of the table, applied by its op number -------------------------------

OP_INDEX = {row[0]: k for k, row in enumerate(_C.op_table())}
INTEGER_ONLY = {"bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not", "left_shift", "right_shift"}
ELEMENTWISE = sorted(name for name, rule in _C.batch_rules().items()
                     if rule == "elementwise" and name not in ("clamp", "cast", "class_labels"))


def _apply(name, *xs):
    return _C.apply(OP_INDEX[name], list(xs))


@pytest.mark.parametrize("name", ELEMENTWISE)
def test_every_elementwise_op(name):
    nin = _C.op_table()[OP_INDEX[name]][1]
    makers = [f32(2, 3, positive=True)] + [f32(3, positive=True)] * (nin - 1)
    if name in INTEGER_ONLY:  # bitwise ops refuse floats: values and shift counts 0..9
        makers = [ints(10, 2, 3)] + [ints(10, 3)] * (nin - 1)
    variants = [0, 1] if nin == 1 else [(0,) + (None,) * (nin - 1), (None,) + (0,) * (nin - 1), (2,) + (0,) * (nin - 1)]
    for in_axes in variants:
        axes = _axes(in_axes, nin)
        arrays = [_batched(m, ax) for m, ax in zip(makers, axes)]
        if name == "where":
            arrays[0] = arrays[0] > 1.0
        expected = np.stack([_apply(name, *[kiln.tensor(_example(a, ax, i)) for a, ax in zip(arrays, axes)]).numpy()
                             for i in range(B)])
        with warnings.catch_warnings():
            warnings.simplefilter("error", kiln.VmapFallbackWarning)
            got = kiln.vmap(lambda *xs: _apply(name, *xs), in_axes=in_axes)(*[kiln.tensor(a) for a in arrays])
        np.testing.assert_allclose(got.numpy(), expected, rtol=1e-5, atol=1e-6, equal_nan=True)


# ---- gradient ops: vmap(grad(f)) against stacked grad calls ------------------------------------

# (name, f(w, x) -> scalar, w maker, x maker (one example), ops allowed to run per example)
GRAD_CASES = [
    ("softmax", lambda w, x: (ops.softmax(x * w, -1) * x).sum(), f32(4), f32(2, 4), set()),
    ("log_softmax", lambda w, x: ops.log_softmax(x * w, 0).sum(), f32(4), f32(2, 4), set()),
    ("cumsum", lambda w, x: (ops.cumsum(x * w, 1) ** 2).sum(), f32(4), f32(2, 4), set()),
    ("sort", lambda w, x: (ops.sort(x * w, axis=-1)[0] * ops.arange(4).astype(kiln.float32)).sum(), f32(4),
     f32(2, 4), set()),
    ("slice", lambda w, x: (x[:, 1:3] * w[1:3]).sum(), f32(4), f32(3, 4), set()),
    ("matmul", lambda w, x: ops.tanh(ops.matmul(x, w)).sum(), f32(4, 3), f32(2, 4), set()),
    ("dense", lambda w, x: ops.tanh(ops.dense(x, w)).sum(), f32(3, 4), f32(4), set()),
    ("broadcast", lambda w, x: (ops.broadcast_to(w, (2, 4)) * x).sum(), f32(4), f32(2, 4), set()),
    ("permute", lambda w, x: (ops.permute(x, (1, 0)) * w[:, None]).sum(), f32(4), f32(2, 4), set()),
    ("max", lambda w, x: (x * w).max(axis=1).sum(), f32(4), f32(2, 4), set()),
    ("gather_table", lambda w, x: (ops.gather(w, ops.argmax(x, 0), 0) * 2).sum(), f32(5, 3), f32(5),
     set()),  # indices varying per example: the gradient's index_add as scatter_add_elements
    ("conv2d", lambda w, x: ops.conv2d(x, w, pad_mode="pad", padding=1).sum(), f32(2, 3, 3, 3), f32(1, 3, 4, 4),
     set()),
    ("conv2d_input", lambda w, x: (ops.conv2d(w, x, pad_mode="valid") ** 2).sum(), f32(1, 3, 5, 5),
     f32(2, 3, 3, 3), set()),  # a batched weight: grouped convolutions
    ("max_pool2d", lambda w, x: ops.max_pool2d(x * w, 2, 2).sum(), f32(4), f32(1, 2, 4, 4), set()),
    ("avg_pool2d", lambda w, x: (ops.avg_pool2d(x * w, 2, 2) ** 2).sum(), f32(4), f32(1, 2, 4, 4), set()),
    ("layer_norm", lambda w, x: (ops.layer_norm(x, (4,), w) ** 3).sum(), f32(4), f32(2, 4), set()),
    ("layer_norm_bias", lambda w, x: (ops.layer_norm(x, (2, 4), None, w) ** 2 * x).sum(), f32(2, 4), f32(3, 2, 4),
     set()),
    ("layer_norm_one_row", lambda w, x: (ops.layer_norm(x, (4,), w) * x).sum(), f32(4), f32(4), set()),
    ("rms_norm", lambda w, x: (ops.rms_norm(x, w) ** 3).sum(), f32(4), f32(2, 4), set()),
    ("attention", lambda w, x: ops.scaled_dot_product_attention(x * w, x, x).sum(), f32(4), f32(2, 3, 4), set()),
]


@pytest.mark.parametrize("mode", ["eager", "trace"])
@pytest.mark.parametrize("name,f,wm,xm,allowed", GRAD_CASES, ids=[c[0] for c in GRAD_CASES])
def test_grad_rules_match_stacked_grad_calls(mode, name, f, wm, xm, allowed):
    w = kiln.tensor(wm())
    x = kiln.tensor(np.stack([xm() for _ in range(B)]))
    g = kiln.grad(f, (0, 1))
    expected = [np.stack([g(w, x[i])[k].numpy() for i in range(B)]) for k in range(2)]
    pe = kiln.vmap(g, in_axes=(None, 0))
    call = pe if mode == "eager" else kiln.jit(lambda w, x: pe(w, x), capture_mode="trace")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", kiln.VmapFallbackWarning)
        got = call(w, x)
        got = call(w, x)
    slow = {op for m in seen if issubclass(m.category, kiln.VmapFallbackWarning)
            for op in str(m.message).split("applies to ")[1].split(" here")[0].split(", ")}
    assert slow <= allowed, f"ran per example: {slow - allowed}"
    for k in range(2):
        np.testing.assert_allclose(got[k].numpy(), expected[k], rtol=1e-4, atol=1e-5)
