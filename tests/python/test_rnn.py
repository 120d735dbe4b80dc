"""Recurrent layers (nn.RNN, nn.LSTM, nn.GRU and their cells): values against a NumPy reference
written here from the equations (PyTorch's gate order), torch's layers with copied weights when
torch is importable, compiled (ast / bytecode / trace x O0/O1 x kbk/sink) against eager for values
and gradients, gradients against central differences, the compiled time loop being ONE while node
whose graph does not grow with the sequence, and bad input."""
import numpy as np
import pytest

import kiln
from kiln import nn, ops

from conftest import to_numpy

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
    # unbatched (T, input): the batch of one, squeezed
    m.batch_first = False
    one = flat(m(T(x[0])))
    want = np_layer(kind, m, x[:1].swapaxes(0, 1))
    np.testing.assert_allclose(to_numpy(one[0]), want[0][:, 0], rtol=1e-10, atol=1e-12)
    assert tuple(one[1].shape) == (4, 4)


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
def test_compiled_blocks_padding_reverse_and_lengths(steps, mode):
    """The compiled loop runs blocks of steps: a last block padded past the sequence, the reverse
    direction over the reversed sequence and per-sequence lengths must all give eager's values and
    gradients, against NumPy too."""
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


def _top_level_nodes(text):
    return sum(" = " in line for line in text.split("\nsubgraph")[0].splitlines())


@pytest.mark.parametrize("mode", MODES)
def test_the_time_loop_is_one_while_node_that_does_not_grow_with_the_sequence(mode):
    m = model("lstm", 3, 4, num_layers=2, bidirectional=True)
    jf = jit(lambda a: m(a), (mode, "O1", "kbk"))
    counts = []
    for steps in (9, 41, 16, 48):  # (the last block padded, then not: two graph shapes, each for any length)
        x = T(np.random.default_rng(steps).standard_normal((steps, 2, 3)))
        np.testing.assert_allclose(to_numpy(jf(x)[0]), to_numpy(m(x)[0]), rtol=1e-9, atol=1e-12)
        text = jf.graph_str(x)
        assert text.count("= while(") == 2  # one per layer, both directions in its body
        counts.append((_top_level_nodes(text), len(text.splitlines())))
    assert counts[0] == counts[1] and counts[2] == counts[3]


def test_the_gradient_graph_holds_while_grad_and_does_not_grow():
    m = model("gru", 3, 4)
    params = m.trainable_params()
    jl = jit(lambda a: (m(a)[0] ** 2).sum(), ("trace", "O0", "kbk"))
    sizes = []
    for steps in (9, 25):
        x = T(np.random.default_rng(steps).standard_normal((steps, 2, 3)))
        kiln.value_and_grad(jl, 0, params)(x)
        variant = next(iter(jl._grad_variants.values()))
        text = variant.graph_str(x)
        assert text.count("= while(") == 1 and text.count("= while_grad(") == 1
        sizes.append(len(text.splitlines()))
    assert sizes[0] == sizes[1]


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
    """Only the weights differentiated: the loop's input gets no gradient built (while_grad asks for
    the wanted ones only) and the weights' are unchanged by that."""
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


@pytest.mark.parametrize("kind", ["lstm", "gru", "rnn_tanh"])
def test_layers_equal_torch_with_copied_weights(kind):
    torch = pytest.importorskip("torch")
    kiln.manual_seed(13)
    m = {"lstm": nn.LSTM, "gru": nn.GRU, "rnn_tanh": nn.RNN}[kind](3, 5, num_layers=2, bidirectional=True,
                                                                  batch_first=True)
    tm = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU, "rnn_tanh": torch.nn.RNN}[kind](
        3, 5, num_layers=2, bidirectional=True, batch_first=True)
    with torch.no_grad():
        for name, p in tm.named_parameters():
            p.copy_(torch.from_numpy(to_numpy(getattr(m, name))))
    x = np.random.default_rng(14).standard_normal((2, 6, 3)).astype(np.float32)
    tx = torch.tensor(x, requires_grad=True)
    t_out, t_state = tm(tx)
    t_last = t_state[0] if kind == "lstm" else t_state
    (t_out.square().sum() + t_last.sum()).backward()

    def loss(a):
        out, state = m(a)
        last = state[0] if kind == "lstm" else state
        return (out * out).sum() + last.sum()

    params = m.trainable_params()
    for fn in (loss, jit(loss, ("ast", "O1", "kbk"))):
        out = flat(m(kiln.tensor(x)))
        np.testing.assert_allclose(to_numpy(out[0]), t_out.detach().numpy(), rtol=1e-4, atol=1e-5)
        _, (gx, gw) = kiln.value_and_grad(fn, 0, params)(kiln.tensor(x))
        np.testing.assert_allclose(to_numpy(gx), tx.grad.numpy(), rtol=1e-4, atol=1e-5)
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
        with pytest.raises(ValueError, match=r"GRU: seq_length must lie in \[0, 5\] \(the sequence length\)"):
            jf(x, kiln.tensor(np.array(bad)))
    assert jf.cache_info().compiles == 1


def test_sizes_beyond_memory_are_refused_before_any_parameter_is_made():
    """num_layers=2**63-1 used to make small layers until memory ran out."""
    with pytest.raises(MemoryError, match="LSTM: 9223372036854775807 layers of hidden_size 4 .* more than this "
                                          "machine's memory"):
        nn.LSTM(3, 4, num_layers=2**63 - 1)
    with pytest.raises(MemoryError, match="GRUCell: .* more than this machine's memory"):
        nn.GRUCell(3, 2**62)


def test_a_stacked_bidirectional_lstm_exports_to_onnx(tmp_path):
    """The compiled layer (one while per layer, index_add into its output buffer) as ONNX Loop and
    ScatterND, run by ONNX Runtime."""
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    import warnings

    kiln.manual_seed(15)
    lstm = nn.LSTM(3, 4, num_layers=2, bidirectional=True)

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.lstm = lstm

        def construct(self, x):
            out, (h, c) = self.lstm(x)
            return out, h, c

    x = np.random.default_rng(16).standard_normal((5, 2, 3)).astype(np.float32)
    path = str(tmp_path / "lstm.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = kiln.export(Net(), kiln.Tensor(x), file_name=path, file_format="ONNX")
    onnx.checker.check_model(model, full_check=True)
    assert sum(n.op_type == "Loop" for n in model.graph.node) == 2
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    got = session.run(None, {session.get_inputs()[0].name: x})
    for g, w in zip(got, Net()(kiln.Tensor(x))):
        np.testing.assert_allclose(g, to_numpy(w), rtol=1e-5, atol=1e-6)
