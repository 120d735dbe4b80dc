"""Recurrent layers: RNNCell, LSTMCell, GRUCell (one step) and RNN, LSTM, GRU (whole sequences,
stacked and bidirectional), MindSpore's names with PyTorch's layouts, gate order (i, f, g, o for
the LSTM; r, z, n for the GRU) and parameter names (weight_ih_l0, bias_hh_l1_reverse, ...), so
weights copied from torch give torch's results.

Each direction of each layer of RNN, LSTM and GRU is ONE op, rnn_layer (src/ops/rnn.c: the whole
time loop in C, its gradient the op rnn_layer_backward), eagerly and under kiln.jit / kiln.trace
alike, so a compiled graph holds one node per layer and direction whatever the sequence's length.
The cells are one step of ordinary ops.
"""
import math
import os

from .. import _C
from .. import ops
from .._optable import OP
from .cell import Cell
from .init import Uniform, initializer
from .parameter import Parameter

_GATES = {"RNN_TANH": 1, "RNN_RELU": 1, "LSTM": 4, "GRU": 3}


def _positive_int(layer, name, v):
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise ValueError(f"{layer}: {name} must be a positive int, got {v!r}")
    return v


def _has_bias(layer, has_bias, bias):
    if bias is not None:
        if has_bias is not True and bool(has_bias) != bool(bias):
            raise ValueError(f"{layer}: has_bias={has_bias!r} and bias={bias!r} disagree (bias is has_bias' alias)")
        return bool(bias)
    return bool(has_bias)


def _nonlinearity(layer, nonlinearity):
    if nonlinearity not in ("tanh", "relu"):
        raise ValueError(f"{layer}: nonlinearity must be 'tanh' or 'relu', got {nonlinearity!r}")
    return "RNN_TANH" if nonlinearity == "tanh" else "RNN_RELU"


def _weights(cell, suffix, gate_size, input_size, hidden_size, has_bias, dtype):
    """Registers weight_ih{suffix}, weight_hh{suffix} (and the biases) on cell, U(-k, k) with
    k = 1/sqrt(hidden_size) as MindSpore and PyTorch initialize them."""
    init = Uniform(1 / math.sqrt(hidden_size))
    shapes = [("weight_ih", (gate_size, input_size)), ("weight_hh", (gate_size, hidden_size))]
    if has_bias:
        shapes += [("bias_ih", (gate_size,)), ("bias_hh", (gate_size,))]
    for name, shape in shapes:
        setattr(cell, name + suffix, Parameter(initializer(init, shape, dtype), name=name + suffix))


def _check_total_size(layer, num_layers, dirs, gate_size, input_size, hidden_size, dtype):
    """Refuses, before making any, parameters that cannot fit in this machine's memory (a huge
    num_layers would otherwise make small ones until memory runs out)."""
    per_dir_first = gate_size * (input_size + hidden_size + 2)
    per_dir_rest = gate_size * (hidden_size * dirs + hidden_size + 2)
    elements = dirs * (per_dir_first + (num_layers - 1) * per_dir_rest)
    nbytes = elements * dtype.itemsize
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        memory = 1 << 46
    if nbytes > memory:
        raise MemoryError(f"{layer}: {num_layers} layers of hidden_size {hidden_size} over input_size {input_size} "
                          f"need {nbytes / 2**30:.3g} GiB of parameters, more than this machine's memory")


def _chunks_by_slice(t, n):
    """t's last axis cut in n equal parts (views): the eager step's gate split."""
    size = t.shape[-1] // n
    return [t[..., k * size:(k + 1) * size] for k in range(n)]


def _chunks_by_gather(t, n):
    """The same parts taken by gather: inside a loop body, whose gradient may not write in place
    (a slice's gradient does; gather's, index_add, does not)."""
    parts = t.reshape(tuple(t.shape[:-1]) + (n, t.shape[-1] // n))
    return [ops.gather(parts, _index(k), parts.ndim - 2) for k in range(n)]


def _index(k):
    """k as a 0-d int64 tensor made by an op: inside a loop body a node of the body, where a tensor
    made from the number would be one more captured input of the loop."""
    return ops.full((), k, dtype=_C.int64)


def _chunks(t, n):
    """The gate split: by gather while a trace records (the step may be the body of a user's own
    while_loop over a cell), by slices otherwise."""
    return (_chunks_by_gather if _C.is_tracing() else _chunks_by_slice)(t, n)


def _step(mode, x, state, w):
    """One time step of a cell. state: h, or (h, c) for the LSTM; w: (w_ih, w_hh, b_ih, b_hh),
    biases may be None. Returns the new state in the same form."""
    w_ih, w_hh, b_ih, b_hh = w
    h = state[0] if mode == "LSTM" else state
    gi = ops.dense(x, w_ih, b_ih)
    gh = ops.dense(h, w_hh, b_hh)
    if mode == "RNN_TANH":
        return (gi + gh).tanh()
    if mode == "RNN_RELU":
        return ops.relu(gi + gh)
    if mode == "LSTM":
        i, f, g, o = _chunks(gi + gh, 4)
        c = f.sigmoid() * state[1] + i.sigmoid() * g.tanh()
        return o.sigmoid() * c.tanh(), c
    ir, iz, inn = _chunks(gi, 3)
    hr, hz, hn = _chunks(gh, 3)
    r = (ir + hr).sigmoid()
    z = (iz + hz).sigmoid()
    n = (inn + r * hn).tanh()
    return (1 - z) * n + z * h


def _check_input(layer, x, input_size, dtype, ndims):
    if not isinstance(x, _C.TensorBase):
        raise TypeError(f"{layer}: input must be a Tensor, got {type(x).__name__}")
    if x.ndim not in ndims or x.shape[-1] != input_size:
        want = " or ".join(f"{n}-D" for n in ndims)
        raise ValueError(f"{layer}: input must be {want} with last size input_size={input_size}, got shape "
                         f"{tuple(x.shape)}")
    if x.dtype != dtype:
        raise TypeError(f"{layer}: input is {x.dtype.name} but the weights are {dtype.name}")


def _check_state(layer, what, t, shape, dtype):
    if not isinstance(t, _C.TensorBase):
        raise TypeError(f"{layer}: {what} must be a Tensor, got {type(t).__name__}")
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{layer}: {what} must have shape {tuple(shape)}, got {tuple(t.shape)}")
    if t.dtype != dtype:
        raise TypeError(f"{layer}: {what} is {t.dtype.name} but the weights are {dtype.name}")


# ---- cells: one step --------------------------------------------------------------------------------


class _CellBase(Cell):
    _mode = None

    def __init__(self, input_size, hidden_size, has_bias=True, dtype=_C.float32, bias=None, mode=None):
        super().__init__()
        name = type(self).__name__
        if mode is not None:
            self._mode = mode
        self.input_size = _positive_int(name, "input_size", input_size)
        self.hidden_size = _positive_int(name, "hidden_size", hidden_size)
        self.has_bias = _has_bias(name, has_bias, bias)
        self.dtype = dtype
        _check_total_size(name, 1, 1, _GATES[self._mode] * hidden_size, input_size, hidden_size, dtype)
        _weights(self, "", _GATES[self._mode] * hidden_size, input_size, hidden_size, self.has_bias, dtype)

    def _w(self):
        return (self.weight_ih, self.weight_hh, getattr(self, "bias_ih", None), getattr(self, "bias_hh", None))

    def _state(self, x, hx, what):
        shape = tuple(x.shape[:-1]) + (self.hidden_size,)
        if hx is None:
            return ops.zeros(shape, dtype=self.dtype)
        _check_state(type(self).__name__, what, hx, shape, self.dtype)
        return hx

    def extend_repr(self):
        return f"input_size={self.input_size}, hidden_size={self.hidden_size}, has_bias={self.has_bias}"


class RNNCell(_CellBase):
    """h' = nonlinearity(x @ weight_ih.T + bias_ih + h @ weight_hh.T + bias_hh); nonlinearity
    'tanh' or 'relu'. x: (batch, input_size) or (input_size,); hx: like x with hidden_size (zeros
    when None). Returns h'."""

    def __init__(self, input_size, hidden_size, has_bias=True, nonlinearity="tanh", dtype=_C.float32, *, bias=None):
        super().__init__(input_size, hidden_size, has_bias, dtype, bias, _nonlinearity("RNNCell", nonlinearity))
        self.nonlinearity = nonlinearity

    def construct(self, x, hx=None):
        _check_input("RNNCell", x, self.input_size, self.dtype, (1, 2))
        return _step(self._mode, x, self._state(x, hx, "hx"), self._w())


class LSTMCell(_CellBase):
    """One LSTM step, gates (i, f, g, o) in PyTorch's order. x: (batch, input_size) or
    (input_size,); hx: (h, c), each like x with hidden_size (zeros when None). Returns (h', c')."""
    _mode = "LSTM"

    def __init__(self, input_size, hidden_size, has_bias=True, dtype=_C.float32, *, bias=None):
        super().__init__(input_size, hidden_size, has_bias, dtype, bias)

    def construct(self, x, hx=None):
        _check_input("LSTMCell", x, self.input_size, self.dtype, (1, 2))
        if hx is None:
            hx = (None, None)
        elif not isinstance(hx, (tuple, list)) or len(hx) != 2:
            raise TypeError(f"LSTMCell: hx must be a pair (h, c) of Tensors, got {type(hx).__name__}")
        state = (self._state(x, hx[0], "h"), self._state(x, hx[1], "c"))
        return _step("LSTM", x, state, self._w())


class GRUCell(_CellBase):
    """One GRU step, gates (r, z, n) in PyTorch's order: n = tanh(W_in x + b_in + r * (W_hn h + b_hn)),
    h' = (1 - z) * n + z * h. x: (batch, input_size) or (input_size,); hx like x with hidden_size
    (zeros when None). Returns h'."""
    _mode = "GRU"

    def __init__(self, input_size, hidden_size, has_bias=True, dtype=_C.float32, *, bias=None):
        super().__init__(input_size, hidden_size, has_bias, dtype, bias)

    def construct(self, x, hx=None):
        _check_input("GRUCell", x, self.input_size, self.dtype, (1, 2))
        return _step("GRU", x, self._state(x, hx, "hx"), self._w())


# ---- layers: whole sequences ----------------------------------------------------------------------


class _RNNBase(Cell):
    _mode = None

    def __init__(self, input_size, hidden_size, num_layers=1, has_bias=True, batch_first=False, dropout=0.0,
                 bidirectional=False, dtype=_C.float32, bias=None, mode=None):
        super().__init__()
        name = type(self).__name__
        if mode is not None:
            self._mode = mode
        self.input_size = _positive_int(name, "input_size", input_size)
        self.hidden_size = _positive_int(name, "hidden_size", hidden_size)
        self.num_layers = _positive_int(name, "num_layers", num_layers)
        self.has_bias = _has_bias(name, has_bias, bias)
        self.batch_first = bool(batch_first)
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
            raise ValueError(f"{name}: dropout must be a number in [0, 1), got {dropout!r}")
        self.dropout = float(dropout)
        self.bidirectional = bool(bidirectional)
        self.num_directions = 2 if self.bidirectional else 1
        self.dtype = dtype
        gate_size = _GATES[self._mode] * hidden_size
        _check_total_size(name, num_layers, self.num_directions, gate_size, input_size, hidden_size, dtype)
        for layer in range(num_layers):
            layer_input = input_size if layer == 0 else hidden_size * self.num_directions
            for d in range(self.num_directions):
                _weights(self, self._suffix(layer, d), gate_size, layer_input, hidden_size, self.has_bias, dtype)

    @staticmethod
    def _suffix(layer, direction):
        return f"_l{layer}" + ("_reverse" if direction else "")

    def _w(self, layer, direction):
        s = self._suffix(layer, direction)
        return (getattr(self, "weight_ih" + s), getattr(self, "weight_hh" + s), getattr(self, "bias_ih" + s, None),
                getattr(self, "bias_hh" + s, None))

    def _initial(self, name, hx, shape):
        if hx is None:
            if len(shape) == 3 and _C.is_tracing():  # (ops.zeros would fix a symbolic batch size)
                return ops.broadcast_to(ops.zeros((shape[0], 1, shape[2]), dtype=self.dtype), shape)
            return ops.zeros(shape, dtype=self.dtype)
        _check_state(type(self).__name__, name, hx, shape, self.dtype)
        return hx

    def _lengths(self, seq_length, batch, steps, unbatched):
        name = type(self).__name__
        if seq_length is None:
            return None
        if unbatched:
            raise ValueError(f"{name}: seq_length needs a batched (3-D) input")
        if not isinstance(seq_length, _C.TensorBase):
            raise TypeError(f"{name}: seq_length must be a Tensor, got {type(seq_length).__name__}")
        if seq_length.dtype not in (_C.int32, _C.int64) or tuple(seq_length.shape) != (batch,):
            raise ValueError(f"{name}: seq_length must be an int32/int64 Tensor of shape ({batch},), got "
                             f"{seq_length.dtype.name} {tuple(seq_length.shape)}")
        if not _C.is_tracing() and batch:  # a traced length is data: rnn_layer checks it on every call
            lo, hi = ops.min(seq_length).item(), ops.max(seq_length).item()
            if lo < 0 or hi > steps:
                raise ValueError(f"{name}: seq_length must lie in [0, {steps}] (the sequence length), got values from "
                                 f"{lo} to {hi}")
        return seq_length

    def construct(self, x, hx=None, seq_length=None):
        name = type(self).__name__
        _check_input(name, x, self.input_size, self.dtype, (2, 3))
        unbatched = x.ndim == 2
        if unbatched:
            x = x.unsqueeze(1)
        elif self.batch_first:
            x = x.swapaxes(0, 1)
        steps, batch = x.shape[0], x.shape[1]
        if steps == 0:
            raise ValueError(f"{name}: the input has no time steps (shape {tuple(x.shape)})")
        lengths = self._lengths(seq_length, batch, steps, unbatched)
        h0, c0 = self._initial_states(hx, batch, unbatched)
        finals_h, finals_c = [], []
        layer_input = x
        for layer in range(self.num_layers):
            dirs = range(self.num_directions)
            k = [layer * self.num_directions + d for d in dirs]
            states = [(h0[i], c0[i]) if self._mode == "LSTM" else h0[i] for i in k]
            weights = [self._w(layer, d) for d in dirs]
            outputs, states = _fused_layer(self._mode, layer_input, states, weights, lengths)
            for st in states:
                finals_h.append(st[0] if self._mode == "LSTM" else st)
                if self._mode == "LSTM":
                    finals_c.append(st[1])
            layer_input = outputs[0] if len(outputs) == 1 else ops.concat(outputs, -1)
            if self.dropout and self.training and layer < self.num_layers - 1:
                layer_input = ops.dropout(layer_input, self.dropout, True)
        out = layer_input
        h_n = _stacked(finals_h)
        c_n = _stacked(finals_c) if self._mode == "LSTM" else None
        if unbatched:
            out, h_n = out.squeeze(1), h_n.squeeze(1)
            c_n = None if c_n is None else c_n.squeeze(1)
        elif self.batch_first:
            out = out.swapaxes(0, 1)
        return (out, (h_n, c_n)) if self._mode == "LSTM" else (out, h_n)

    def _initial_states(self, hx, batch, unbatched):
        name = type(self).__name__
        shape = (self.num_layers * self.num_directions,) + (() if unbatched else (batch,)) + (self.hidden_size,)
        if self._mode == "LSTM":
            if hx is None:
                hx = (None, None)
            elif not isinstance(hx, (tuple, list)) or len(hx) != 2:
                raise TypeError(f"{name}: hx must be a pair (h_0, c_0) of Tensors, got {type(hx).__name__}")
            h0, c0 = self._initial("h_0", hx[0], shape), self._initial("c_0", hx[1], shape)
        else:
            h0, c0 = self._initial("hx", hx, shape), None
        if unbatched:
            h0 = h0.unsqueeze(1)
            c0 = None if c0 is None else c0.unsqueeze(1)
        return h0, c0

    def extend_repr(self):
        return (f"{self.input_size}, {self.hidden_size}, num_layers={self.num_layers}, has_bias={self.has_bias}, "
                f"batch_first={self.batch_first}, dropout={self.dropout}, bidirectional={self.bidirectional}")


def _stacked(states):
    """The final states stacked on a new first axis, by concat of unsqueezed states (ops.stack would
    fix a symbolic batch size under dynamic shapes); one state alone is only unsqueezed."""
    parts = [s.unsqueeze(0) for s in states]
    return parts[0] if len(parts) == 1 else ops.concat(parts, 0)


_MODE_IDS = {"LSTM": 0, "GRU": 1, "RNN_TANH": 2, "RNN_RELU": 3}  # rnn_layer's i[0] (ops.def)


def _fused_layer(mode, x, states, weights, lengths):
    """One layer, every direction, each one rnn_layer op: (outputs per direction (T, batch,
    hidden), final states). The reverse direction runs from the last step back; with lengths
    ((batch,) ints), a sequence's steps past its length leave the state alone and output zeros (so
    its reverse direction starts at its own last step)."""
    outputs, finals = [], []
    for d, (state, (w_ih, w_hh, b_ih, b_hh)) in enumerate(zip(states, weights)):
        initial = list(state) if mode == "LSTM" else [state]
        biases = [] if b_ih is None else [b_ih, b_hh]
        ins = [x] + initial + [w_ih, w_hh] + biases + ([] if lengths is None else [lengths])
        attrs = (_MODE_IDS[mode], d, int(bool(biases)), int(lengths is not None))
        y, h_n, c_n, _ = _C.apply(OP.rnn_layer, tuple(ins), attrs, ())
        outputs.append(y)
        finals.append((h_n, c_n) if mode == "LSTM" else h_n)
    return outputs, finals


class RNN(_RNNBase):
    """Elman RNN over a sequence: h_t = nonlinearity(x_t @ W_ih.T + b_ih + h_{t-1} @ W_hh.T + b_hh).
    construct(x, hx=None, seq_length=None): x (T, batch, input_size) ((batch, T, ...) with
    batch_first, or unbatched (T, input_size)); hx (num_layers * num_directions, batch, hidden_size);
    seq_length: (batch,) ints, each sequence's length (steps past it output zeros and keep the state).
    Returns (output (T, batch, num_directions * hidden_size), h_n)."""
    _mode = "RNN_TANH"

    def __init__(self, input_size, hidden_size, num_layers=1, nonlinearity="tanh", has_bias=True, batch_first=False,
                 dropout=0.0, bidirectional=False, dtype=_C.float32, *, bias=None):
        super().__init__(input_size, hidden_size, num_layers, has_bias, batch_first, dropout, bidirectional, dtype, bias,
                         _nonlinearity("RNN", nonlinearity))
        self.nonlinearity = nonlinearity


class LSTM(_RNNBase):
    """LSTM over a sequence, gates (i, f, g, o). construct(x, hx=None, seq_length=None) as RNN's, hx a
    pair (h_0, c_0); returns (output, (h_n, c_n))."""
    _mode = "LSTM"

    def __init__(self, input_size, hidden_size, num_layers=1, has_bias=True, batch_first=False, dropout=0.0,
                 bidirectional=False, dtype=_C.float32, *, bias=None):
        super().__init__(input_size, hidden_size, num_layers, has_bias, batch_first, dropout, bidirectional, dtype, bias)


class GRU(_RNNBase):
    """GRU over a sequence, gates (r, z, n). construct(x, hx=None, seq_length=None) as RNN's;
    returns (output, h_n)."""
    _mode = "GRU"

    def __init__(self, input_size, hidden_size, num_layers=1, has_bias=True, batch_first=False, dropout=0.0,
                 bidirectional=False, dtype=_C.float32, *, bias=None):
        super().__init__(input_size, hidden_size, num_layers, has_bias, batch_first, dropout, bidirectional, dtype, bias)


__all__ = ["RNNCell", "LSTMCell", "GRUCell", "RNN", "LSTM", "GRU"]
