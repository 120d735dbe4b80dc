"""Recurrent layers (nn.RNN, nn.LSTM, nn.GRU and their cells) and their op, rnn_layer: values
against a NumPy reference written here from the equations (PyTorch's gate order), torch's layers
with copied weights when torch is importable, compiled (ast / bytecode / trace x O0/O1 x kbk/sink)
against eager for values and gradients, gradients against central differences, the float32 kernel
against the float64 reference kernel, a compiled graph holding one rnn_layer node per layer and
direction whatever the sequence's length, and bad input."""
import numpy as np
import pytest

import kiln
from kiln import nn, ops

from conftest import to_numpy
from kiln._optable import OP
from kiln.ops._util import apply

MODES = ("ast", "bytecode", "trace")
VARIANTS = [(m, lvl, be) for m in MODES for lvl in ("O0", "O1") for be in ("kbk", "sink")]
KINDS = {"lstm": nn.LSTM, "gru": nn.GRU, "rnn_tanh": nn.RNN, "rnn_relu": lambda *a, **k: nn.RNN(*a, nonlinearity="relu", **k)}


def jit(fn, variant):
    mode, level, backend = variant
    return kiln.jit(fn, capture_mode=mode, jit_level=level, backend=backend)


def T(a, dtype=kiln.float64):
    return kiln.Tensor(np.asarray(a), dtype)


# ---- the NumPy reference ----------------------------------------------------------------------------


def sigmoid(v):
    return 1 / (1 + np.exp(-v))


def np_step(kind, x, state, w):
    """One step from the equations; w = (w_ih, w_hh, b_ih, b_hh), biases may be None."""
    w_ih, w_hh, b_ih, b_hh = w
    h = state[0] if kind == "lstm" else state
    gi = x @ w_ih.T + (0 if b_ih is None else b_ih)
    gh = h @ w_hh.T + (0 if b_hh is None else b_hh)
    n = h.shape[-1]
    if kind == "rnn_tanh":
        return np.tanh(gi + gh)
    if kind == "rnn_relu":
        return np.maximum(gi + gh, 0)
    if kind == "lstm":
        g = gi + gh
        i, f, c_hat, o = (g[..., k * n:(k + 1) * n] for k in range(4))
        c = sigmoid(f) * state[1] + sigmoid(i) * np.tanh(c_hat)
        return sigmoid(o) * np.tanh(c), c
    r = sigmoid(gi[..., :n] + gh[..., :n])
    z = sigmoid(gi[..., n:2 * n] + gh[..., n:2 * n])
    cand = np.tanh(gi[..., 2 * n:] + r * gh[..., 2 * n:])
    return (1 - z) * cand + z * h


def np_weights(m, layer, d):
    s = f"_l{layer}" + ("_reverse" if d else "")
    return tuple(to_numpy(getattr(m, n + s)) if hasattr(m, n + s) else None
                 for n in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"))


def np_layer(kind, m, x, h0=None, c0=None, lengths=None):
    """The whole layer (x: (T, batch, input) NumPy): (output, h_n[, c_n]); a sequence's steps past
    its length output zeros and leave the state alone."""
    steps, batch = x.shape[:2]
    dirs = 2 if m.bidirectional else 1
    hs = np.zeros((m.num_layers * dirs, batch, m.hidden_size)) if h0 is None else h0
    cs = np.zeros_like(hs) if c0 is None else c0
    lengths = np.full(batch, steps) if lengths is None else lengths
    inp, h_n, c_n = x, [], []
    for layer in range(m.num_layers):
        outs = []
        for d in range(dirs):
            k = layer * dirs + d
            state = (hs[k], cs[k]) if kind == "lstm" else hs[k]
            out = np.zeros((steps, batch, m.hidden_size))
            for t in (reversed(range(steps)) if d else range(steps)):
                new = np_step(kind, inp[t], state, np_weights(m, layer, d))
                valid = (t < lengths)[:, None]
                if kind == "lstm":
                    state = (np.where(valid, new[0], state[0]), np.where(valid, new[1], state[1]))
                else:
                    state = np.where(valid, new, state)
                out[t] = np.where(valid, state[0] if kind == "lstm" else state, 0)
            outs.append(out)
            h_n.append(state[0] if kind == "lstm" else state)
            if kind == "lstm":
                c_n.append(state[1])
        inp = np.concatenate(outs, -1)
    return (inp, np.stack(h_n)) + ((np.stack(c_n),) if kind == "lstm" else ())


def flat(result):
    """(output, h_n) or (output, (h_n, c_n)) -> a flat list of tensors."""
    out, state = result
    return [out] + (list(state) if isinstance(state, tuple) else [state])


def model(kind, *args, seed=0, **kwargs):
    kiln.manual_seed(seed)
    return KINDS[kind](*args, dtype=kiln.float64, **kwargs)


# ---- eager values ----------------------------------------------------------------------------------

CONFIGS = {
    "one_layer": dict(num_layers=1),
    "two_layers_bidirectional": dict(num_layers=2, bidirectional=True),
    "no_bias": dict(num_layers=1, has_bias=False),
}


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_eager_layers_match_the_numpy_reference(kind, config):
    m = model(kind, 3, 4, **CONFIGS[config])
    rng = np.random.default_rng(1)
    x = rng.standard_normal((5, 2, 3))
    dirs = 2 if m.bidirectional else 1
    h0 = rng.standard_normal((m.num_layers * dirs, 2, 4))
    c0 = rng.standard_normal((m.num_layers * dirs, 2, 4))
    hx = (T(h0), T(c0)) if kind == "lstm" else T(h0)
    got = flat(m(T(x), hx))
    want = np_layer(kind, m, x, h0, c0 if kind == "lstm" else None)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(to_numpy(g), w, rtol=1e-10, atol=1e-12)
    assert tuple(got[0].shape) == (5, 2, 4 * dirs)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_seq_length_batch_first_and_unbatched_inputs(kind):
    m = model(kind, 3, 4, num_layers=2, bidirectional=True, batch_first=True)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 6, 3))  # (batch, T, input)
    lengths = np.array([6, 2, 4])
    got = flat(m(T(x), None, T(lengths, kiln.int64)))
    want = np_layer(kind, m, x.swapaxes(0, 1), lengths=lengths)
    np.testing.assert_allclose(to_numpy(got[0]), want[0].swapaxes(0, 1), rtol=1e-10, atol=1e-12)
    for g, w in zip(got[1:], want[1:]):
        np.testing.assert_allclose(to_numpy(g), w, rtol=1e-10, atol=1e-12)
    assert np.all(to_numpy(got[0])[1, 2:] == 0)  # past its length a sequence outputs zeros
    compiled = jit(lambda a, n: flat(m(a, None, n)), ("trace", "O1", "kbk"))(T(x), T(lengths, kiln.int64))
    for g, w in zip(compiled, got):
        np.testing.assert_allclose(to_numpy(g), to_numpy(w), rtol=1e-10, atol=1e-12)
    # unbatched (T, input): the batch of one, squeezed
    m.batch_first = False
    one = flat(m(T(x[0])))
    want = np_layer(kind, m, x[:1].swapaxes(0, 1))
    np.testing.assert_allclose(to_numpy(one[0]), want[0][:, 0], rtol=1e-10, atol=1e-12)
    assert tuple(one[1].shape) == (4, 4)
    for g, w in zip(jit(lambda a: flat(m(a)), ("ast", "O1", "kbk"))(T(x[0])), one):
        np.testing.assert_allclose(to_numpy(g), to_numpy(w), rtol=1e-10, atol=1e-12)


def test_parameter_names_shapes_and_aliases():
    m = nn.LSTM(3, 5, num_layers=2, bidirectional=True)
    names = [p.name for p in m.trainable_params()]
    assert names[:4] == ["weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0"]
    assert "weight_ih_l1_reverse" in names and len(names) == 16
    assert tuple(m.weight_ih_l1.shape) == (20, 10) and tuple(m.weight_hh_l0.shape) == (20, 5)
    assert tuple(nn.GRU(3, 5).weight_ih_l0.shape) == (15, 3)
    assert len(nn.RNN(3, 5, bias=False).trainable_params()) == 2
    assert len(nn.GRUCell(3, 5, bias=False).trainable_params()) == 2
    bound = 1 / np.sqrt(5)
    assert all(np.abs(to_numpy(p)).max() <= bound for p in m.trainable_params())


# ---- compiled against eager --------------------------------------------------------------------------


def _loss_fn(m, kind):
    def loss(x, h0, lengths):
        hx = (h0, h0 * 0.5) if kind == "lstm" else h0
        out, state = m(x, hx, lengths)
        last = state[1] if kind == "lstm" else state
        return (out * out).sum() + (last * last.sin()).sum()

    return loss


def _inputs(seed=3):
    rng = np.random.default_rng(seed)
    return T(rng.standard_normal((5, 2, 3))), T(rng.standard_normal((4, 2, 4))), T([5, 3], kiln.int64)


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(v))
def test_compiled_lstm_equals_eager_values_and_gradients(variant):
    m = model("lstm", 3, 4, num_layers=2, bidirectional=True)
    loss = _loss_fn(m, "lstm")
    x, h0, lengths = _inputs()
    params = m.trainable_params()
    jf = jit(lambda a, h, n: flat(m(a, (h, h * 0.5), n)), variant)
    for got, want in zip(jf(x, h0, lengths), flat(m(x, (h0, h0 * 0.5), lengths))):
        np.testing.assert_allclose(to_numpy(got), to_numpy(want), rtol=1e-9, atol=1e-12)
    value_e, grads_e = kiln.value_and_grad(loss, (0, 1), params)(x, h0, lengths)
    jl = jit(loss, variant)
    for _ in range(2):  # the second call runs the compiled step
        value_j, grads_j = kiln.value_and_grad(jl, (0, 1), params)(x, h0, lengths)
        np.testing.assert_allclose(value_j.item(), value_e.item(), rtol=1e-10)
        for got, want in zip(list(grads_j[0]) + list(grads_j[1]), list(grads_e[0]) + list(grads_e[1])):
            np.testing.assert_allclose(to_numpy(got), to_numpy(want), rtol=1e-9, atol=1e-12)
    assert jl.cache_info().eager_calls == 0  # (no call gave up compiling)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", ["gru", "rnn_tanh", "rnn_relu"])
def test_compiled_gru_and_rnn_equal_eager(kind, mode):
    m = model(kind, 3, 4, num_layers=2, bidirectional=True)
    loss = _loss_fn(m, kind)
    x, h0, lengths = _inputs(4)
    params = m.trainable_params()
    value_e, grads_e = kiln.value_and_grad(loss, (0, 1), params)(x, h0, lengths)
    jl = jit(loss, (mode, "O1", "kbk"))
    np.testing.assert_allclose(jl(x, h0, lengths).item(), value_e.item(), rtol=1e-10)
    value_j, grads_j = kiln.value_and_grad(jl, (0, 1), params)(x, h0, lengths)
    np.testing.assert_allclose(value_j.item(), value_e.item(), rtol=1e-10)
    for got, want in zip(list(grads_j[0]) + list(grads_j[1]), list(grads_e[0]) + list(grads_e[1])):
        np.testing.assert_allclose(to_numpy(got), to_numpy(want), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("steps", [1, 8, 11, 19])
def test_compiled_reverse_and_lengths_over_any_length(steps, mode):
    """The reverse direction and per-sequence lengths (one sequence of length 1) give eager's values
    and gradients compiled, against NumPy too, for short and long sequences."""
    m = model("lstm", 3, 4, bidirectional=True, seed=17)
    rng = np.random.default_rng(steps)
    x, h0 = T(rng.standard_normal((steps, 3, 3))), T(rng.standard_normal((2, 3, 4)))
    lengths = T([steps, max(steps // 2, 1), 1], kiln.int64)
    loss = _loss_fn(m, "lstm")
    params = m.trainable_params()
    want = np_layer("lstm", m, to_numpy(x), to_numpy(h0), to_numpy(h0) * 0.5, to_numpy(lengths))
    got = jit(lambda a, h, n: flat(m(a, (h, h * 0.5), n)), (mode, "O1", "kbk"))(x, h0, lengths)
    for g, w in zip(got, want):
        np.testing.assert_allclose(to_numpy(g), w, rtol=1e-9, atol=1e-12)
    value_e, grads_e = kiln.value_and_grad(loss, (0, 1), params)(x, h0, lengths)
    value_j, grads_j = kiln.value_and_grad(jit(loss, (mode, "O1", "kbk")), (0, 1), params)(x, h0, lengths)
    np.testing.assert_allclose(value_j.item(), value_e.item(), rtol=1e-10)
    for g, w in zip(list(grads_j[0]) + list(grads_j[1]), list(grads_e[0]) + list(grads_e[1])):
        np.testing.assert_allclose(to_numpy(g), to_numpy(w), rtol=1e-9, atol=1e-12)


def _node_count(text, op):
    return text.count(f"= {op}(")


@pytest.mark.parametrize("mode", MODES)
def test_the_compiled_graph_holds_one_node_per_layer_and_direction_whatever_the_length(mode):
    m = model("lstm", 3, 4, num_layers=2, bidirectional=True)
    jf = jit(lambda a: m(a), (mode, "O1", "kbk"))
    sizes = []
    for steps in (9, 41, 128):
        x = T(np.random.default_rng(steps).standard_normal((steps, 2, 3)))
        for got, want in zip(flat(jf(x)), flat(m(x))):
            np.testing.assert_allclose(to_numpy(got), to_numpy(want), rtol=1e-12, atol=1e-12)
        text = jf.graph_str(x)
        assert _node_count(text, "rnn_layer") == 4 and "while" not in text  # 2 layers x 2 directions
        sizes.append(len(text.splitlines()))
    assert sizes[0] == sizes[1] == sizes[2]


def test_the_gradient_graph_holds_one_backward_node_per_layer_and_direction():
    m = model("gru", 3, 4, num_layers=2)
    params = m.trainable_params()
    jl = jit(lambda a: (m(a)[0] ** 2).sum(), ("trace", "O0", "kbk"))
    sizes = []
    for steps in (9, 25):
        x = T(np.random.default_rng(steps).standard_normal((steps, 2, 3)))
        _, (gx, gw) = kiln.value_and_grad(jl, 0, params)(x)
        _, (ex, ew) = kiln.value_and_grad(lambda a: (m(a)[0] ** 2).sum(), 0, params)(x)
        for got, want in zip([gx] + list(gw), [ex] + list(ew)):
            np.testing.assert_allclose(to_numpy(got), to_numpy(want), rtol=1e-12, atol=1e-12)
        variant = next(iter(jl._grad_variants.values()))
        text = variant.graph_str(x)
        assert _node_count(text, "rnn_layer") == 2 and _node_count(text, "rnn_layer_backward") == 2
        assert "while" not in text
        sizes.append(len(text.splitlines()))
    assert sizes[0] == sizes[1]


# ---- the op: float32 kernel against the float64 reference, finite differences, edges ------------------

OP_MODES = {"lstm": 0, "gru": 1, "rnn_tanh": 2, "rnn_relu": 3}
GATES = {"lstm": 4, "gru": 3, "rnn_tanh": 1, "rnn_relu": 1}


def _op_inputs(kind, steps=4, batch=3, inp=2, hidden=3, bias=True, lengths=None, seed=0):
    """NumPy arrays for rnn_layer: x, h0[, c0], w_ih, w_hh[, b_ih, b_hh]; lengths (int64) apart."""
    rng = np.random.default_rng(seed)
    gh = GATES[kind] * hidden
    arrays = [rng.standard_normal((steps, batch, inp)), rng.standard_normal((batch, hidden)) * 0.5]
    if kind == "lstm":
        arrays.append(rng.standard_normal((batch, hidden)) * 0.5)
    arrays += [rng.standard_normal((gh, inp)) * 0.6, rng.standard_normal((gh, hidden)) * 0.6]
    if bias:
        arrays += [rng.standard_normal(gh) * 0.3, rng.standard_normal(gh) * 0.3]
    return arrays


def _run_op(kind, arrays, reverse, lengths, dtype, bias=True):
    ins = [kiln.Tensor(a, dtype) for a in arrays]
    if lengths is not None:
        ins.append(kiln.Tensor(np.asarray(lengths), kiln.int64))
    attrs = (OP_MODES[kind], int(reverse), int(bias), int(lengths is not None))
    return ins, attrs


def _op_loss(kind, attrs, weights):
    """A scalar of every output (y, h_n, c_n) through fixed random weights."""
    def loss(*ins):
        y, h, c, _ = apply(OP.rnn_layer, ins, attrs, ())
        total = (y * weights[0]).sum() + (h * weights[1]).sum()
        return total + (c * weights[2]).sum() if kind == "lstm" else total
    return loss


def _loss_weights(arrays, dtype, seed=1):
    rng = np.random.default_rng(seed)
    steps, batch = arrays[0].shape[:2]
    hidden = arrays[1].shape[1]
    return [kiln.Tensor(rng.standard_normal(s), dtype) for s in ((steps, batch, hidden), (batch, hidden), (batch, hidden))]


CASES = [(k, rev, lens) for k in sorted(OP_MODES) for rev in (False, True) for lens in (None, [4, 2, 0])]


@pytest.mark.parametrize("kind,reverse,lengths", CASES, ids=str)
def test_op_gradients_match_central_differences(kind, reverse, lengths):
    """Every gradient of the float64 (reference) kernel against central differences of its forward,
    every element of every input."""
    arrays = _op_inputs(kind)
    ins, attrs = _run_op(kind, arrays, reverse, lengths, kiln.float64)
    weights = _loss_weights(arrays, kiln.float64)
    loss = _op_loss(kind, attrs, weights)
    n = len(arrays)
    grads = kiln.grad(loss, grad_position=tuple(range(n)))(*ins)
    for k, arr in enumerate(arrays):
        want = np.zeros_like(arr)
        for index in np.ndindex(arr.shape):
            def value():
                with kiln.no_grad():
                    cur = [kiln.Tensor(a, kiln.float64) for a in arrays] + ins[n:]
                    return loss(*cur).item()
            want[index] = _central(value, arr, index)
        np.testing.assert_allclose(to_numpy(grads[k]), want, rtol=1e-6, atol=1e-8, err_msg=f"input {k}")


@pytest.mark.parametrize("kind,reverse,lengths", CASES, ids=str)
def test_float32_kernel_equals_the_float64_reference(kind, reverse, lengths):
    """The sgemm kernel (float32) and the plain-loop reference (float64) on the same values:
    outputs, workspace and every gradient; with longer sequences and more rows than the tiny case."""
    arrays = _op_inputs(kind, steps=13, batch=5, inp=6, hidden=7, seed=2)
    lengths = None if lengths is None else [13, 5, 0, 1, 12]
    results = {}
    for dtype in (kiln.float32, kiln.float64):
        cast = [a.astype(np.float32).astype(np.float64) for a in arrays]  # the same values in both
        ins, attrs = _run_op(kind, cast, reverse, lengths, dtype)
        weights = _loss_weights(arrays, dtype)
        outs = apply(OP.rnn_layer, ins, attrs, ())
        grads = kiln.grad(_op_loss(kind, attrs, weights), grad_position=tuple(range(len(arrays))))(*ins)
        results[dtype] = [to_numpy(t) for t in list(outs) + list(grads)]
    for k, (got, want) in enumerate(zip(results[kiln.float32], results[kiln.float64])):
        assert got.dtype == np.float32 and want.dtype == np.float64
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5, err_msg=f"result {k}")


def test_float32_activations_keep_relative_precision_near_zero():
    """The float32 kernel's tanh (through a vectorizable exp) against NumPy's over the float range,
    tiny values included: an Elman step h = tanh(x) with w_ih = 1, w_hh = 0."""
    a = np.concatenate([np.linspace(-20, 20, 40001), np.geomspace(1e-30, 1, 500), -np.geomspace(1e-30, 1, 500)])
    a = a.astype(np.float32)
    ins = [kiln.tensor(a.reshape(1, -1, 1)), kiln.tensor(np.zeros((a.size, 1), np.float32)),
           kiln.tensor(np.ones((1, 1), np.float32)), kiln.tensor(np.zeros((1, 1), np.float32))]
    y = to_numpy(apply(OP.rnn_layer, ins, (2, 0, 0, 0), ())[0]).ravel()
    np.testing.assert_allclose(y, np.tanh(a.astype(np.float64)), rtol=2e-6, atol=0)


def test_op_without_biases_and_with_int32_lengths():
    arrays = _op_inputs("gru", bias=False)
    ins, attrs = _run_op("gru", arrays, False, None, kiln.float64, bias=False)
    lengths = kiln.Tensor(np.array([3, 1, 4]), kiln.int32)
    y, h, c, _ = apply(OP.rnn_layer, ins + [lengths], attrs[:3] + (1,), ())
    x, h0, w_ih, w_hh = arrays
    state, out = h0, np.zeros((4, 3, 3))
    for t in range(4):
        new = np_step("gru", x[t], state, (w_ih, w_hh, None, None))
        valid = (t < np.array([3, 1, 4]))[:, None]
        state = np.where(valid, new, state)
        out[t] = np.where(valid, state, 0)
    np.testing.assert_allclose(to_numpy(y), out, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(to_numpy(h), state, rtol=1e-12, atol=1e-12)
    assert np.all(to_numpy(c) == 0)  # c_n: zeros but for the LSTM


@pytest.mark.parametrize("dtype", [kiln.float32, kiln.float64])
def test_op_over_zero_steps_or_zero_rows(dtype):
    """No steps: y empty, the final states the initial ones, their gradients passed through; no
    batch rows: everything empty."""
    arrays = _op_inputs("lstm", steps=0)
    ins, attrs = _run_op("lstm", arrays, True, None, dtype)
    y, h, c, ws = apply(OP.rnn_layer, ins, attrs, ())
    assert tuple(y.shape) == (0, 3, 3) and tuple(ws.shape) == (0, 3, 18)
    np.testing.assert_allclose(to_numpy(h), arrays[1], rtol=1e-6)
    np.testing.assert_allclose(to_numpy(c), arrays[2], rtol=1e-6)
    g = kiln.grad(lambda *t: apply(OP.rnn_layer, t, attrs, ())[1].sum(), grad_position=(1, 3))(*ins)
    np.testing.assert_allclose(to_numpy(g[0]), np.ones((3, 3)))
    assert np.all(to_numpy(g[1]) == 0)
    arrays = _op_inputs("gru", batch=0)
    ins, attrs = _run_op("gru", arrays, False, [], dtype)
    y, h, _, _ = apply(OP.rnn_layer, ins, attrs, ())
    assert tuple(y.shape) == (4, 0, 3) and tuple(h.shape) == (0, 3)
    m = model("gru", 2, 3)
    out, h_n = m(T(np.zeros((4, 0, 2))))
    assert tuple(out.shape) == (4, 0, 3) and tuple(h_n.shape) == (1, 0, 3)


def test_op_bad_shapes_and_attributes_raise_clear_errors():
    arrays = _op_inputs("lstm")
    ins, attrs = _run_op("lstm", arrays, False, None, kiln.float32)
    with pytest.raises(ValueError, match=r"rnn_layer \(LSTM\): expected x \(T, B, I\).*got shapes"):
        apply(OP.rnn_layer, [ins[0]] + [kiln.Tensor(np.zeros((3, 5)), kiln.float32)] + ins[2:], attrs, ())
    with pytest.raises(ValueError, match=r"rnn_layer \(LSTM\): expected x \(T, B, I\).*\(12, 3\)"):
        apply(OP.rnn_layer, ins[:3] + [kiln.Tensor(np.zeros((12, 3)), kiln.float32)] + ins[4:], attrs, ())
    with pytest.raises(ValueError, match=r"rnn_layer \(LSTM\): expected 7 inputs for these attributes, got 6"):
        apply(OP.rnn_layer, ins[:6], attrs, ())
    with pytest.raises(ValueError, match="rnn_layer: mode must be 0"):
        apply(OP.rnn_layer, ins, (7, 0, 1, 0), ())
    with pytest.raises(TypeError, match="rnn_layer \\(LSTM\\): x, the states, weights and biases must have one "
                                        "floating-point dtype, got float32 and float64"):
        apply(OP.rnn_layer, ins[:1] + [kiln.Tensor(arrays[1], kiln.float64)] + ins[2:], attrs, ())
    with pytest.raises(ValueError, match=r"rnn_layer \(LSTM\): lengths must be an int32 or int64 tensor of shape \(3,\)"):
        apply(OP.rnn_layer, ins + [kiln.Tensor(np.ones(3), kiln.float32)], attrs[:3] + (1,), ())
    with pytest.raises(ValueError, match=r"rnn_layer \(LSTM\): seq_length must lie in \[0, 4\].*got 5 at batch index 1"):
        apply(OP.rnn_layer, ins + [kiln.Tensor(np.array([1, 5, 2]), kiln.int64)], attrs[:3] + (1,), ())
    with pytest.raises(ValueError, match="rnn_layer: its workspace output .* is not differentiable"):
        kiln.grad(lambda a: apply(OP.rnn_layer, [a] + ins[1:], attrs, ())[3].sum())(ins[0])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("layers,bidirectional", [(1, False), (2, True)])
def test_dynamic_lengths_and_batches(mode, layers, bidirectional):
    """dynamic=True: the sequence length and batch size are symbols of rnn_layer's shape rule. The
    forward compiles once for every length and batch; so does a one-layer, one-direction training
    step (stacked or bidirectional layers concatenate, and concat's gradient is compiled per shape
    for now). Values and gradients equal eager's."""
    m = model("lstm", 3, 4, num_layers=layers, bidirectional=bidirectional)
    params = m.trainable_params()

    def loss(a):
        out, (h, c) = m(a)
        return (out * out).sum() + (c * h).sum()

    jf = kiln.jit(loss, capture_mode=mode, dynamic=True)
    jg = kiln.jit(loss, capture_mode=mode, dynamic=True)
    for steps, batch in ((5, 2), (9, 5), (17, 6), (11, 7)):
        x = T(np.random.default_rng(steps).standard_normal((steps, batch, 3)))
        value_e, grads_e = kiln.value_and_grad(loss, 0, params)(x)
        np.testing.assert_allclose(jf(x).item(), value_e.item(), rtol=1e-12)
        value_j, grads_j = kiln.value_and_grad(jg, 0, params)(x)
        np.testing.assert_allclose(value_j.item(), value_e.item(), rtol=1e-12)
        for got, want in zip([grads_j[0]] + list(grads_j[1]), [grads_e[0]] + list(grads_e[1])):
            np.testing.assert_allclose(to_numpy(got), to_numpy(want), rtol=1e-10, atol=1e-12)
    assert jf.cache_info().compiles == 1, jf.cache_info()
    # (bytecode's gradient capture explains the fixed input size 3 as a length minus a constant: a
    # second entry, the capture machinery's, not the layer's)
    if layers == 1 and not bidirectional and mode != "bytecode":
        (variant,) = jg._grad_variants.values()  # forward and backward: one graph, rebound per size
        assert variant.cache_info().compiles == 1, variant.cache_info()


# ---- finite differences ----------------------------------------------------------------------------


def _central(f, arr, index, eps=1e-6):
    base = arr[index]
    arr[index] = base + eps
    up = f()
    arr[index] = base - eps
    down = f()
    arr[index] = base
    return (up - down) / (2 * eps)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_compiled_gradients_match_central_differences(kind):
    m = model(kind, 2, 3, bidirectional=True, seed=5)
    rng = np.random.default_rng(6)
    x, h0 = rng.standard_normal((4, 1, 2)), rng.standard_normal((2, 1, 3)) * 0.5
    lengths = T([3], kiln.int64)
    loss = _loss_fn(m, kind)
    w_name = "weight_hh_l0_reverse"
    w = to_numpy(getattr(m, w_name)).copy()
    _, (gx, gh) = kiln.value_and_grad(jit(loss, ("ast", "O1", "kbk")), (0, 1))(T(x), T(h0), lengths)
    _, gw = kiln.value_and_grad(jit(loss, ("trace", "O0", "kbk")), None, [getattr(m, w_name)])(T(x), T(h0), lengths)

    def value():
        getattr(m, w_name).set_data(T(w))
        with kiln.no_grad():
            return loss(T(x), T(h0), lengths).item()

    for index in [(0, 0, 1), (2, 0, 0), (3, 0, 1)]:  # (step 3 is past the length: no gradient)
        np.testing.assert_allclose(to_numpy(gx)[index], _central(value, x, index), rtol=1e-5, atol=1e-7)
    for index in [(0, 0, 0), (1, 0, 2)]:
        np.testing.assert_allclose(to_numpy(gh)[index], _central(value, h0, index), rtol=1e-5, atol=1e-7)
    for index in [(0, 1), (min(w.shape[0] - 1, 7), 2)]:
        np.testing.assert_allclose(to_numpy(gw[0])[index], _central(value, w, index), rtol=1e-5, atol=1e-7)
    assert np.all(to_numpy(gx)[3] == 0) and np.any(to_numpy(gx)[2] != 0)  # step 3 lies past the length


@pytest.mark.parametrize("mode", MODES)
def test_weight_gradients_alone_equal_eager(mode):
    """Only the weights differentiated: the weights' gradients are eager's."""
    m = model("lstm", 3, 4, num_layers=2)
    x = T(np.random.default_rng(7).standard_normal((6, 2, 3)))

    def loss(a):
        out, (h, c) = m(a)
        return (out.tanh() * out).sum() + c.sum()

    params = m.trainable_params()
    value_e, grads_e = kiln.value_and_grad(loss, None, params)(x)
    value_j, grads_j = kiln.value_and_grad(jit(loss, (mode, "O0", "kbk")), None, params)(x)
    np.testing.assert_allclose(value_j.item(), value_e.item(), rtol=1e-10)
    assert len(grads_j) == len(grads_e) == 8
    for got, want in zip(grads_j, grads_e):
        np.testing.assert_allclose(to_numpy(got), to_numpy(want), rtol=1e-9, atol=1e-12)


# ---- cells -------------------------------------------------------------------------------------------

CELLS = {"lstm": nn.LSTMCell, "gru": nn.GRUCell, "rnn_tanh": nn.RNNCell,
         "rnn_relu": lambda *a, **k: nn.RNNCell(*a, nonlinearity="relu", **k)}


@pytest.mark.parametrize("kind", sorted(CELLS))
def test_cells_match_numpy_eagerly_and_compiled(kind):
    kiln.manual_seed(8)
    cell = CELLS[kind](3, 4, dtype=kiln.float64)
    rng = np.random.default_rng(9)
    x, h, c = rng.standard_normal((2, 3)), rng.standard_normal((2, 4)), rng.standard_normal((2, 4))
    w = tuple(to_numpy(getattr(cell, n)) for n in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"))
    want = np_step(kind, x, (h, c) if kind == "lstm" else h, w)
    hx = (T(h), T(c)) if kind == "lstm" else T(h)
    want = list(want) if kind == "lstm" else [want]

    def run(a, hx):
        out = cell(a, hx)
        return list(out) if isinstance(out, tuple) else [out]

    for fn in [run] + [jit(run, (mode, "O1", "kbk")) for mode in MODES]:
        for got, ref in zip(fn(T(x), hx), want):
            np.testing.assert_allclose(to_numpy(got), ref, rtol=1e-10, atol=1e-12)
    # no state: zeros; one sample (input_size,)
    zero = (np.zeros(4), np.zeros(4)) if kind == "lstm" else np.zeros(4)
    one = run(T(x[0]), None)
    ref = np_step(kind, x[0], zero, w)
    np.testing.assert_allclose(to_numpy(one[0]), ref[0] if kind == "lstm" else ref, rtol=1e-10, atol=1e-12)


def test_a_cell_stepped_in_a_while_loop_differentiates_compiled():
    """A user's own time loop over LSTMCell under ops.while_loop, with gradients through it."""
    kiln.manual_seed(10)
    cell = nn.LSTMCell(3, 4, dtype=kiln.float64)
    xs = T(np.random.default_rng(11).standard_normal((5, 2, 3)))

    def f(x):
        def body(t, h, c):
            h, c = cell(ops.gather(x, t, 0), (h, c))
            return t + 1, h, c

        zeros = ops.zeros((2, 4), dtype=kiln.float64)
        _, h, c = ops.while_loop(lambda t, h, c: t < 5, body, (ops.zeros((), dtype=kiln.int64), zeros, zeros))
        return (h * c).sum()

    params = cell.trainable_params()
    value_e, grads_e = kiln.value_and_grad(f, 0, params)(xs)
    for mode in MODES:
        value_j, grads_j = kiln.value_and_grad(jit(f, (mode, "O1", "kbk")), 0, params)(xs)
        np.testing.assert_allclose(value_j.item(), value_e.item(), rtol=1e-10)
        for got, want in zip([grads_j[0]] + list(grads_j[1]), [grads_e[0]] + list(grads_e[1])):
            np.testing.assert_allclose(to_numpy(got), to_numpy(want), rtol=1e-9, atol=1e-12)


# ---- dropout between layers ----------------------------------------------------------------------------


def test_dropout_applies_between_layers_only_in_training():
    m = model("gru", 3, 8, num_layers=2, dropout=0.5)
    x = T(np.random.default_rng(12).standard_normal((4, 2, 3)))
    m.set_train(False)
    want = np_layer("gru", m, to_numpy(x))
    np.testing.assert_allclose(to_numpy(m(x)[0]), want[0], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(to_numpy(jit(lambda a: m(a)[0], ("ast", "O1", "kbk"))(x)), want[0], rtol=1e-10,
                               atol=1e-12)
    m.set_train(True)
    kiln.manual_seed(0)
    trained = to_numpy(m(x)[0])
    assert not np.allclose(trained, want[0])  # the first layer's outputs were dropped and scaled
    one_layer = model("gru", 3, 8, num_layers=1, dropout=0.5)
    one_layer.set_train(True)
    np.testing.assert_allclose(to_numpy(one_layer(x)[0]), np_layer("gru", one_layer, to_numpy(x))[0], rtol=1e-10,
                               atol=1e-12)  # no layer after the last: no dropout


# ---- torch, with copied weights ------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["lstm", "gru", "rnn_tanh", "rnn_relu"])
def test_layers_equal_torch_with_copied_weights(kind):
    """Values and every gradient (input, initial states, weights) against torch's layer, eager and
    compiled."""
    torch = pytest.importorskip("torch")
    kiln.manual_seed(13)
    relu = kind == "rnn_relu"
    make = {"lstm": nn.LSTM, "gru": nn.GRU, "rnn_tanh": nn.RNN, "rnn_relu": nn.RNN}[kind]
    tmake = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU, "rnn_tanh": torch.nn.RNN, "rnn_relu": torch.nn.RNN}[kind]
    extra = {"nonlinearity": "relu"} if relu else {}
    m = make(3, 5, num_layers=2, bidirectional=True, batch_first=True, **extra)
    tm = tmake(3, 5, num_layers=2, bidirectional=True, batch_first=True, **extra)
    with torch.no_grad():
        for name, p in tm.named_parameters():
            p.copy_(torch.from_numpy(to_numpy(getattr(m, name))))
    rng = np.random.default_rng(14)
    x = rng.standard_normal((2, 6, 3)).astype(np.float32)
    h0, c0 = (rng.standard_normal((4, 2, 5)).astype(np.float32) * 0.5 for _ in range(2))
    tx, th, tc = (torch.tensor(a, requires_grad=True) for a in (x, h0, c0))
    t_out, t_state = tm(tx, (th, tc) if kind == "lstm" else th)
    t_last = t_state[1] if kind == "lstm" else t_state
    (t_out.square().sum() + t_last.sin().sum()).backward()
    t_grads = [tx.grad, th.grad] + ([tc.grad] if kind == "lstm" else [])

    def loss(a, h, c):
        out, state = m(a, (h, c) if kind == "lstm" else h)
        last = state[1] if kind == "lstm" else state
        return (out * out).sum() + last.sin().sum()

    params = m.trainable_params()
    inputs = [kiln.tensor(a) for a in (x, h0, c0)]
    positions = (0, 1, 2) if kind == "lstm" else (0, 1)
    for fn in (loss, jit(loss, ("ast", "O1", "kbk")), jit(loss, ("trace", "O0", "sink"))):
        out = flat(m(inputs[0], (inputs[1], inputs[2]) if kind == "lstm" else inputs[1]))
        np.testing.assert_allclose(to_numpy(out[0]), t_out.detach().numpy(), rtol=1e-4, atol=1e-5)
        _, (gin, gw) = kiln.value_and_grad(fn, positions, params)(*inputs)
        for g, want in zip(gin, t_grads):
            np.testing.assert_allclose(to_numpy(g), want.numpy(), rtol=1e-4, atol=1e-5)
        for p, g in zip(params, gw):
            np.testing.assert_allclose(to_numpy(g), dict(tm.named_parameters())[p.name].grad.numpy(), rtol=1e-4,
                                       atol=1e-5)


# ---- bad input -------------------------------------------------------------------------------------------


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="LSTM: hidden_size must be a positive int, got 0"):
        nn.LSTM(3, 0)
    with pytest.raises(ValueError, match="RNN: nonlinearity must be 'tanh' or 'relu', got 'gelu'"):
        nn.RNN(3, 4, nonlinearity="gelu")
    with pytest.raises(ValueError, match=r"GRU: dropout must be a number in \[0, 1\), got 1.5"):
        nn.GRU(3, 4, dropout=1.5)
    m = nn.LSTM(3, 4, num_layers=2)
    x = kiln.tensor(np.zeros((5, 2, 3), np.float32))
    with pytest.raises(ValueError, match=r"LSTM: input must be 2-D or 3-D with last size input_size=3, got shape "
                                         r"\(5, 2, 7\)"):
        m(kiln.tensor(np.zeros((5, 2, 7), np.float32)))
    with pytest.raises(TypeError, match="LSTM: input is float64 but the weights are float32"):
        m(kiln.tensor(np.zeros((5, 2, 3))))
    with pytest.raises(ValueError, match=r"LSTM: h_0 must have shape \(2, 2, 4\), got \(1, 2, 4\)"):
        m(x, (kiln.tensor(np.zeros((1, 2, 4), np.float32)), kiln.tensor(np.zeros((2, 2, 4), np.float32))))
    with pytest.raises(TypeError, match=r"LSTM: hx must be a pair \(h_0, c_0\) of Tensors, got Tensor"):
        m(x, kiln.tensor(np.zeros((2, 2, 4), np.float32)))
    with pytest.raises(ValueError, match=r"LSTM: seq_length must lie in \[0, 5\] \(the sequence length\), got "
                                         r"values from 1 to 9"):
        m(x, None, kiln.tensor(np.array([9, 1])))
    with pytest.raises(ValueError, match=r"LSTM: seq_length must be an int32/int64 Tensor of shape \(2,\)"):
        m(x, None, kiln.tensor(np.array([1.0, 2.0])))
    with pytest.raises(ValueError, match="LSTM: the input has no time steps"):
        m(kiln.tensor(np.zeros((0, 2, 3), np.float32)))
    with pytest.raises(ValueError, match="GRUCell: hx must have shape"):
        nn.GRUCell(3, 4)(kiln.tensor(np.zeros((2, 3), np.float32)), kiln.tensor(np.zeros((3, 4), np.float32)))
    with pytest.raises(ValueError, match="disagree"):
        nn.LSTM(3, 4, has_bias=False, bias=True)
    with pytest.raises(ValueError, match="LSTM: input must be 2-D or 3-D"):  # compiled: the same error
        kiln.jit(lambda a: m(a), capture_mode="ast")(kiln.tensor(np.zeros((5, 3, 2, 3), np.float32)))


@pytest.mark.parametrize("mode", MODES)
def test_compiled_seq_length_outside_the_sequence_raises_as_eager(mode):
    """A length is data under kiln.jit: the graph checks it on every call, as eager checks it."""
    m = nn.GRU(3, 4)
    x = kiln.tensor(np.zeros((5, 2, 3), np.float32))
    jf = kiln.jit(lambda a, n: m(a, None, n)[0], capture_mode=mode)
    np.testing.assert_allclose(to_numpy(jf(x, kiln.tensor(np.array([5, 2])))),
                               to_numpy(m(x, None, kiln.tensor(np.array([5, 2])))[0]), rtol=1e-6, atol=1e-7)
    for bad in ([9, 1], [-1, 2]):
        with pytest.raises(ValueError, match=r"GRU: seq_length must lie in \[0, 5\] \(the sequence length\)"):
            m(x, None, kiln.tensor(np.array(bad)))
        with pytest.raises(ValueError, match=r"rnn_layer \(GRU\): seq_length must lie in \[0, 5\] \(the sequence "
                                             r"length\), got -?\d at batch index 0"):
            jf(x, kiln.tensor(np.array(bad)))
    assert jf.cache_info().compiles == 1


def test_sizes_beyond_memory_are_refused_before_any_parameter_is_made():
    """num_layers=2**63-1 used to make small layers until memory ran out."""
    with pytest.raises(MemoryError, match="LSTM: 9223372036854775807 layers of hidden_size 4 .* more than this "
                                          "machine's memory"):
        nn.LSTM(3, 4, num_layers=2**63 - 1)
    with pytest.raises(MemoryError, match="GRUCell: .* more than this machine's memory"):
        nn.GRUCell(3, 2**62)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_stacked_bidirectional_layers_export_to_onnx(kind, tmp_path):
    """Each rnn_layer as ONNX's LSTM / GRU / RNN (gate blocks permuted to ONNX's order, lengths as
    sequence_lens), run by ONNX Runtime against kiln, with and without lengths."""
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    import warnings

    kiln.manual_seed(15)
    layer = KINDS[kind](3, 4, num_layers=2, bidirectional=True)

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.layer = layer

        def construct(self, x, n):
            out, state = self.layer(x, None, n)
            return tuple(flat((out, state)))

    rng = np.random.default_rng(16)
    x = rng.standard_normal((5, 3, 3)).astype(np.float32)
    lengths = np.array([5, 2, 4])
    path = str(tmp_path / f"{kind}.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = kiln.export(Net(), kiln.Tensor(x), kiln.Tensor(lengths), file_name=path, file_format="ONNX")
    onnx.checker.check_model(model, full_check=True)
    op_type = {"lstm": "LSTM", "gru": "GRU"}.get(kind, "RNN")
    assert sum(n.op_type == op_type for n in model.graph.node) == 4  # 2 layers x 2 directions
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    for n in (lengths, np.array([5, 5, 5])):
        got = session.run(None, dict(zip(names, (x, n))))
        want = Net()(kiln.Tensor(x), kiln.Tensor(n))
        assert len(got) == len(want)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, to_numpy(w), rtol=1e-5, atol=1e-6)
