"""ONNX export of inference graphs (kiln.export(..., file_format="ONNX")) through the `onnx` package.

The graph exported is the trace's recording (kiln's O0 ops, before fusion): each kiln op becomes
the ONNX operators with its meaning (opset 17). Control flow becomes ONNX's If (kiln's `if`: the
branches read their inputs from the enclosing graph) and Loop (kiln's `while`: the loop's
condition graph runs once before the loop and again at the end of each iteration). An op without
an entry below raises OnnxExportError naming it."""
import numpy as np

from .. import _C
from .onnx_sizes import SizeEmitter, dim_param, is_symbolic, product, start_plus

OPSET = 17


class OnnxExportError(ValueError):
    """A graph kiln.export(file_format="ONNX") cannot write: an op without an ONNX form here."""


def _bfloat16():
    """NumPy's bfloat16, from ml_dtypes (a dependency of the onnx package, which writes bfloat16
    tensors with it): amp graphs in bfloat16 export with ONNX's BFLOAT16 tensor type."""
    import ml_dtypes

    return ml_dtypes.bfloat16


def _np_dtype(dtype):
    if dtype.name == "bfloat16":
        return _bfloat16()
    return {"bool": np.bool_, "int8": np.int8, "int32": np.int32, "int64": np.int64, "float16": np.float16,
            "float32": np.float32, "float64": np.float64}[dtype.name]


def _dtype_of_code(code):
    """A kiln_dtype number (the attribute of cast and the creation ops) as a NumPy dtype."""
    if code == 5:
        return _bfloat16()
    return {0: np.bool_, 1: np.int8, 2: np.int32, 3: np.int64, 4: np.float16, 6: np.float32, 7: np.float64}[code]


def _floating(dt):
    """Whether the NumPy dtype is a float one (bfloat16, which NumPy does not class as floating, included)."""
    return np.issubdtype(dt, np.floating) or np.dtype(dt) == np.dtype(_bfloat16())


def _half(dt):
    """float16 or bfloat16."""
    return _floating(dt) and np.dtype(dt).itemsize == 2


def _constant(tensor):
    """A captured tensor as NumPy with its own dtype (kiln hands bfloat16 out as float32, exactly)."""
    a = tensor.asnumpy()
    return a.astype(_bfloat16()) if tensor.dtype.name == "bfloat16" else a


class _Builder:
    """The nodes and initializers of one ONNX graph (subgraphs get a child sharing the names' counter)."""

    def __init__(self, onnx, counter=None, sizes=None, labels=None):
        self.onnx, self.h = onnx, onnx.helper
        self.nodes, self.inits = [], []
        self.counter = counter if counter is not None else [0]
        self.sizes = sizes  # a SizeEmitter when sizes vary (dynamic axes), else None
        self.labels = labels or {}  # symbol -> the name of its dimension

    def child(self):
        return _Builder(self.onnx, self.counter, self.sizes, self.labels)

    def fresh(self, hint):
        self.counter[0] += 1
        return f"{hint}_{self.counter[0]}"

    def const(self, array, hint="c"):
        name = self.fresh(hint)
        self.inits.append(self.onnx.numpy_helper.from_array(np.asarray(array), name))
        return name

    def ints(self, values):
        """A 1-D int64 tensor of sizes (computed from the inputs' dimensions where they vary)."""
        if is_symbolic(values):
            return self.sizes.shape(self, list(values))
        return self.const(np.asarray(values, dtype=np.int64), "shape")

    def node(self, op, inputs, outputs=None, **attrs):
        outputs = outputs or [self.fresh(op.lower())]
        self.nodes.append(self.h.make_node(op, inputs, outputs, **attrs))
        return outputs[0]

    def value_info(self, name, meta):
        dtype, shape = meta
        return self.h.make_tensor_value_info(name, self.h.np_dtype_to_tensor_dtype(np.dtype(_np_dtype(dtype))),
                                             [dim_param(d, self.labels) for d in shape])


_UNARY = {"relu": "Relu", "neg": "Neg", "exp": "Exp", "log": "Log", "sqrt": "Sqrt", "cos": "Cos", "sin": "Sin",
          "tanh": "Tanh", "sigmoid": "Sigmoid", "abs": "Abs", "erf": "Erf", "logical_not": "Not",
          "contiguous": "Identity"}
_BINARY = {"add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div", "pow": "Pow", "matmul": "MatMul",
           "maximum": "Max", "minimum": "Min", "eq": "Equal", "lt": "Less", "le": "LessOrEqual", "gt": "Greater",
           "ge": "GreaterOrEqual", "logical_and": "And", "logical_or": "Or", "where": "Where"}
_REDUCE = {"sum": "ReduceSum", "mean": "ReduceMean", "max": "ReduceMax", "min": "ReduceMin", "prod": "ReduceProd"}
_OTHER = ("sign", "silu", "gelu", "rsqrt", "clamp", "linear", "conv2d", "conv2d_backward_input", "batch_norm", "layer_norm",
          "rms_norm", "reshape",
          "attention", "rnn_layer",
          "expand", "permute", "cast", "concat", "softmax", "log_softmax", "var", "std", "argmax", "argmin", "slice",
          "gather", "gather_elements", "index_add", "max_pool2d", "avg_pool2d", "full", "arange", "linspace", "eye", "ne", "if", "while",
          "floor", "ceil", "round", "trunc", "log1p", "expm1", "isnan", "isinf", "isfinite", "cumsum", "sort",
          "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "log2", "log10", "exp2", "fmod")
# kiln's float-valued unary ops with ONNX operators of their own (integer inputs cast to the result first)
_UNARY_FLOAT = {"tan": "Tan", "asin": "Asin", "acos": "Acos", "atan": "Atan", "sinh": "Sinh", "cosh": "Cosh",
                "asinh": "Asinh", "acosh": "Acosh", "atanh": "Atanh"}
SUPPORTED = sorted(set(_UNARY) | set(_BINARY) | set(_REDUCE) | set(_OTHER))


def _axes(mask, ndim):
    return [d for d in range(ndim) if mask >> d & 1]


def _emit(b, op, ins, outs, ints, floats, metas, in_metas, sub):
    """ONNX nodes for one kiln node; outs: the names its outputs get; metas / in_metas: its
    outputs' and inputs' (dtype, shape); sub(index, input_names) emits a subgraph of the graph
    holding the node into a child builder, returning (builder, output names, output metas)."""
    out = outs[0]
    if op in _UNARY:
        b.node(_UNARY[op], ins, [out])
    elif op == "sign":  # kiln's sign of NaN is 0 (as torch's); ONNX's is NaN
        if _floating(_np_dtype(in_metas[0][0])):
            zero = b.const(np.zeros((), _np_dtype(in_metas[0][0])))
            b.node("Where", [b.node("IsNaN", ins), zero, b.node("Sign", ins)], [out])
        else:
            b.node("Sign", ins, [out])
    elif op in ("floor", "ceil", "round", "trunc", "log1p", "expm1", "isnan", "isinf", "isfinite"):
        _emit_rounding_classifying(b, op, ins[0], out, _np_dtype(in_metas[0][0]), _np_dtype(metas[0][0]))
    elif op in _UNARY_FLOAT or op in ("log2", "log10", "exp2"):
        _emit_unary_float(b, op, ins[0], out, _np_dtype(in_metas[0][0]), _np_dtype(metas[0][0]))
    elif op == "fmod":  # ONNX's Mod with fmod=1 (the dividend's sign); kiln's integer x fmod 0 is 0
        dt = _np_dtype(metas[0][0])
        a, d = [b.node("Cast", [i], to=b.h.np_dtype_to_tensor_dtype(np.dtype(dt))) if _np_dtype(m[0]) != dt else i
                for i, m in zip(ins, in_metas)]
        if _floating(dt):
            b.node("Mod", [a, d], [out], fmod=1)
        else:
            zero, one = b.const(np.zeros((), dt)), b.const(np.ones((), dt))
            nought = b.node("Equal", [d, zero])
            b.node("Where", [nought, zero, b.node("Mod", [a, b.node("Where", [nought, one, d])], fmod=1)], [out])
    elif op == "cumsum":  # kiln accumulates floats in double: so does the export, then rounds
        src, dst = _np_dtype(in_metas[0][0]), _np_dtype(metas[0][0])
        acc = np.float64 if _floating(dst) else np.int64
        x = b.node("Cast", ins, to=b.h.np_dtype_to_tensor_dtype(np.dtype(acc))) if src != acc else ins[0]
        summed = b.node("CumSum", [x, b.const(np.asarray(ints[0], np.int64))], reverse=ints[1])
        b.node("Cast", [summed], [out], to=b.h.np_dtype_to_tensor_dtype(np.dtype(dst)))
    elif op == "sort":
        _emit_sort(b, ins[0], outs, ints[0], ints[1], _np_dtype(in_metas[0][0]), in_metas[0][1][ints[0]])
    elif op == "div" and _np_dtype(metas[0][0]) != _np_dtype(in_metas[0][0]):
        # kiln's true division of integers gives floats; ONNX's Div keeps its inputs' type
        to = b.h.np_dtype_to_tensor_dtype(np.dtype(_np_dtype(metas[0][0])))
        b.node("Div", [b.node("Cast", [i], to=to) for i in ins], [out])
    elif op in _BINARY:
        b.node(_BINARY[op], _one_dtype(b, op, ins, in_metas, metas), [out])
    elif op == "ne":
        b.node("Not", [b.node("Equal", ins)], [out])
    elif op == "silu":
        b.node("Mul", [ins[0], b.node("Sigmoid", ins)], [out])
    elif op == "gelu":  # x / 2 * (1 + erf(x / sqrt(2))): opset 17 has no Gelu
        dt = _np_dtype(metas[0][0])
        e = b.node("Erf", [b.node("Mul", [ins[0], b.const(np.asarray(0.70710678118654752, dt))])])
        half = b.node("Mul", [ins[0], b.const(np.asarray(0.5, dt))])
        b.node("Mul", [half, b.node("Add", [e, b.const(np.asarray(1, dt))])], [out])
    elif op == "rsqrt":
        b.node("Reciprocal", [b.node("Sqrt", ins)], [out])
    elif op == "clamp":
        dt = _np_dtype(metas[0][0])
        lo = b.const(np.asarray(floats[0], dt)) if np.isfinite(floats[0]) else ""
        hi = b.const(np.asarray(floats[1], dt)) if np.isfinite(floats[1]) else ""
        b.node("Clip", [ins[0], lo, hi], [out])
    elif op == "linear":  # x @ w.T (+ b)
        y = b.node("MatMul", [ins[0], b.node("Transpose", [ins[1]], perm=[1, 0])])
        b.node("Add", [y, ins[2]], [out]) if len(ins) == 3 else b.node("Identity", [y], [out])
    elif op == "conv2d":
        sh, sw, pt, pb, pl, pr, dh, dw, groups = ints[:9]
        b.node("Conv", ins, [out], strides=[sh, sw], pads=[pt, pl, pb, pr], dilations=[dh, dw], group=groups)
    elif op == "conv2d_backward_input":  # the transposed convolution (ops.conv_transpose2d)
        sh, sw, pt, _, pl, _, dh, dw, groups = ints[:9]
        kernel, size, out_hw = in_metas[1][1][2:], in_metas[0][1][2:], ints[11:13]
        pads, extra = [pt, pl, 0, 0], [0, 0]
        for d, (s, dil, top) in enumerate(((sh, dh, pt), (sw, dw, pl))):
            full = s * (size[d] - 1) + (kernel[d] - 1) * dil + 1 - top  # ONNX's size with no end padding
            pads[2 + d], extra[d] = max(full - out_hw[d], 0), max(out_hw[d] - full, 0)
        b.node("ConvTranspose", ins, [out], strides=[sh, sw], pads=pads, dilations=[dh, dw], group=groups,
               kernel_shape=list(kernel), output_padding=extra)
    elif op in ("max_pool2d", "avg_pool2d"):
        kh, kw, sh, sw, pt, pb, pl, pr, dh, dw, ceil = ints[:11]
        common = dict(kernel_shape=[kh, kw], strides=[sh, sw], pads=[pt, pl, pb, pr], ceil_mode=ceil)
        if op == "max_pool2d" and _floating(_np_dtype(in_metas[0][0])):
            # kiln's window maximum is NaN when the window holds one; ONNX Runtime's skips it
            dt = _np_dtype(in_metas[0][0])
            pooled = b.node("MaxPool", ins, dilations=[dh, dw], **common)
            nan = b.node("Cast", [b.node("IsNaN", ins)], to=b.h.np_dtype_to_tensor_dtype(np.dtype(dt)))
            has_nan = b.node("Greater", [b.node("MaxPool", [nan], dilations=[dh, dw], **common),
                                         b.const(np.zeros((), dt))])
            b.node("Where", [has_nan, b.const(np.asarray(np.nan, dt)), pooled], [out])
        elif op == "max_pool2d":
            b.node("MaxPool", ins, [out], dilations=[dh, dw], **common)
        else:
            if (dh, dw) != (1, 1):
                raise OnnxExportError(f"kiln.export(ONNX): avg_pool2d with dilation {dh, dw} has no ONNX form")
            b.node("AveragePool", ins, [out], count_include_pad=ints[11], **common)
    elif op == "batch_norm":
        if ints and ints[0]:
            raise OnnxExportError("kiln.export(ONNX): batch_norm in training mode (call set_train(False))")
        b.node("BatchNormalization", ins, [out], epsilon=floats[0])
        for extra in outs[1:]:  # the batch statistics outputs: unused in inference graphs
            b.node("Identity", [ins[3]], [extra])
    elif op == "layer_norm":  # outputs (y, mean, rstd): ONNX's Mean and InvStdDev
        b.node("LayerNormalization", ins, list(outs), axis=-ints[0], epsilon=floats[0])
    elif op == "rms_norm":  # (y, rstd): y = x * rstd * w, rstd = 1 / sqrt(mean(x * x) + eps) over the last axes
        ndim, dt = len(in_metas[0][1]), _np_dtype(metas[0][0])
        ms = b.node("ReduceMean", [b.node("Mul", [ins[0], ins[0]])], axes=list(range(ndim - ints[0], ndim)),
                    keepdims=1)
        rstd = b.node("Reciprocal", [b.node("Sqrt", [b.node("Add", [ms, b.const(np.asarray(floats[0], dt))])])])
        b.node("Mul", [b.node("Mul", [ins[0], rstd]), ins[1]], [out])
        if len(outs) > 1:
            b.node("Reshape", [rstd, b.ints(metas[1][1])], [outs[1]])
    elif op == "attention":  # (out, lse): softmax(scale q kᵀ) v; query heads grouped per kv head
        if len(ins) > 3 or (ints and ints[0]):
            raise OnnxExportError("kiln.export(ONNX): attention with a mask or the causal flag is not exported")
        qs, ks, vs = (list(m[1]) for m in in_metas)
        q, k, v = ins
        if is_symbolic((qs[-3], ks[-3])):
            raise OnnxExportError("kiln.export(ONNX): attention with a varying number of heads")
        group = qs[-3] // ks[-3] if ks[-3] else 1
        if group > 1:  # q (..., Hk, group, Lq, D) against k and v (..., Hk, 1, Lk, D)
            q = b.node("Reshape", [q, b.ints(ks[:-2] + [group] + qs[-2:])])
            k = b.node("Reshape", [k, b.ints(ks[:-2] + [1] + ks[-2:])])
            v = b.node("Reshape", [v, b.ints(vs[:-2] + [1] + vs[-2:])])
        nd = len(qs) + (group > 1)
        kt = b.node("Transpose", [k], perm=list(range(nd - 2)) + [nd - 1, nd - 2])
        scores = b.node("Mul", [b.node("MatMul", [q, kt]), b.const(np.asarray(floats[0], _np_dtype(in_metas[0][0])))])
        o = b.node("MatMul", [b.node("Softmax", [scores], axis=-1), v])
        b.node("Reshape", [o, b.ints(metas[0][1])], [out])
        if len(outs) > 1:
            lse = b.node("ReduceLogSumExp", [scores], axes=[-1], keepdims=0)
            b.node("Reshape", [b.node("Cast", [lse], to=b.h.np_dtype_to_tensor_dtype(np.dtype(_np_dtype(metas[1][0]))))
                               , b.ints(metas[1][1])], [outs[1]])
    elif op == "rnn_layer":
        _emit_rnn_layer(b, ins, outs, ints, metas, in_metas)
    elif op in ("reshape", "expand"):
        if op == "reshape":  # allowzero: a 0 in the shape is a size 0, not "as the input's"
            b.node("Reshape", [ins[0], b.ints(ints)], [out], allowzero=1)
        else:
            b.node("Expand", [ins[0], b.ints(ints)], [out])
    elif op == "permute":
        b.node("Transpose", ins, [out], perm=list(ints))
    elif op == "cast":
        src, dst = _np_dtype(in_metas[0][0]), _np_dtype(metas[0][0])
        to = b.h.np_dtype_to_tensor_dtype(np.dtype(dst))
        x = ins[0]
        if _floating(src) and np.issubdtype(dst, np.integer):
            # kiln saturates a float beyond the integer's range and takes NaN to 0; ONNX's Cast leaves
            # both undefined (ONNX Runtime gives INT_MIN): clip in float64 (exact for the bounds)
            info = np.iinfo(dst)
            hi = float(np.nextafter(np.float64(info.max) + 1, 0)) if info.bits == 64 else float(info.max)
            x64 = x if src == np.float64 else b.node("Cast", [x], to=b.onnx.TensorProto.DOUBLE)
            clipped = b.node("Clip", [x64, b.const(np.float64(info.min)), b.const(np.float64(hi))])
            x = b.node("Where", [b.node("IsNaN", [x64]), b.const(np.float64(0)), clipped])
        b.node("Cast", [x], [out], to=to)
    elif op == "concat":
        b.node("Concat", ins, [out], axis=ints[0])
    elif op in ("softmax", "log_softmax"):
        b.node("Softmax" if op == "softmax" else "LogSoftmax", ins, [out], axis=ints[0])
    elif op in _REDUCE:
        axes, keep = _axes(ints[0], len(in_metas[0][1])), ints[1]
        floating = _floating(_np_dtype(in_metas[0][0]))
        if not axes:  # no axis reduced (axis=()): the input itself; ONNX reads empty axes as every axis
            b.node("Identity", ins, [out])
        elif op == "sum":
            b.node("ReduceSum", [ins[0], b.ints(axes)], [out], keepdims=keep)
        elif op in ("max", "min") and floating:
            # kiln's max/min propagate NaN; ONNX Runtime's skip it: add NaN where a reduced NaN was
            r = b.node(_REDUCE[op], ins, axes=axes, keepdims=keep)
            zero = b.const(np.zeros((), _np_dtype(in_metas[0][0])))
            nan_or_zero = b.node("Where", [b.node("IsNaN", ins), ins[0], zero])
            b.node("Add", [r, b.node("ReduceSum", [nan_or_zero, b.ints(axes)], keepdims=keep)], [out])
        else:
            b.node(_REDUCE[op], ins, [out], axes=axes, keepdims=keep)
    elif op in ("var", "std"):  # mean((x - mean(x))^2) * n / (n - correction)
        shape, dt = in_metas[0][1], _np_dtype(metas[0][0])
        axes = _axes(ints[0], len(shape))
        n = product([shape[d] for d in axes])
        d = b.node("Sub", [ins[0], b.node("ReduceMean", ins, axes=axes, keepdims=1)])
        m = b.node("ReduceMean", [b.node("Mul", [d, d])], axes=axes, keepdims=ints[1])
        # n / (n - ddof) as kiln computes it: a divisor of 0 past n (inf, or NaN for a zero sum)
        if is_symbolic((n,)):
            to = b.h.np_dtype_to_tensor_dtype(np.dtype(dt))
            n_t = b.sizes.scalar(b, n)
            rest = b.node("Max", [b.node("Sub", [n_t, b.const(np.asarray(ints[2], np.int64))]),
                                  b.const(np.asarray(0, np.int64))])
            v = b.node("Div", [b.node("Mul", [m, b.node("Cast", [n_t], to=to)]), b.node("Cast", [rest], to=to)])
        else:
            v = b.node("Div", [b.node("Mul", [m, b.const(np.asarray(n, dt))]),
                               b.const(np.asarray(max(n - ints[2], 0), dt))])
        b.node("Sqrt" if op == "std" else "Identity", [v], [out])
    elif op in ("argmax", "argmin"):
        shape = in_metas[0][1]
        axes = _axes(ints[0], len(shape))
        onnx_op = "ArgMax" if op == "argmax" else "ArgMin"
        floating = _floating(_np_dtype(in_metas[0][0]))

        def arg(x, axis, keepdims, into=None):
            found = b.node(onnx_op, [x], None if floating else into, axis=axis, keepdims=keepdims)
            if not floating:
                return found
            # kiln, as NumPy, gives the first NaN's index where there is one; ONNX Runtime skips NaN
            nan = b.node("Cast", [b.node("IsNaN", [x])], to=b.onnx.TensorProto.INT32)
            first_nan = b.node("ArgMax", [nan], axis=axis, keepdims=keepdims)
            has_nan = b.node("Cast", [b.node("ReduceMax", [nan], axes=[axis], keepdims=keepdims)],
                             to=b.onnx.TensorProto.BOOL)
            return b.node("Where", [has_nan, first_nan, found], into)

        if len(axes) == 1 and len(shape) > 0:
            arg(ins[0], axes[0], ints[1], [out])
        else:  # the flattened tensor
            flat = arg(b.node("Reshape", [ins[0], b.ints([-1])]), 0, 0)
            b.node("Reshape", [flat, b.ints(metas[0][1])], [out])
    elif op == "slice":
        ndim = len(metas[0][1])
        starts, steps, lengths = ints[0:ndim], ints[8:8 + ndim], ints[16:16 + ndim]
        ends = [start_plus(s, st, n) for s, st, n in zip(starts, steps, lengths)]
        ends = [e if isinstance(e, str) or e >= 0 else -(2 ** 62) for e in ends]  # (a reversed slice to the start)
        b.node("Slice", [ins[0], b.ints(starts), b.ints(ends), b.ints(list(range(ndim))), b.ints(steps)], [out])
    elif op in ("gather", "gather_elements"):
        b.node("Gather" if op == "gather" else "GatherElements", ins, [out], axis=ints[0])
    elif op == "index_add":  # x plus src's slices at idx along the axis: ScatterND(add) with that axis first
        axis, x_shape, idx_shape = ints[0], in_metas[0][1], in_metas[1][1]
        if is_symbolic(x_shape) or is_symbolic(idx_shape):
            raise OnnxExportError("kiln.export(ONNX): index_add of a size that varies (dynamic_axes)")
        ndim, k = len(x_shape), len(idx_shape)
        sel = list(x_shape[:axis]) + list(idx_shape) + list(x_shape[axis + 1:])
        first = [axis] + [d for d in range(ndim) if d != axis]
        x = b.node("Transpose", [ins[0]], perm=first) if axis else ins[0]
        src = b.node("Expand", [ins[2], b.ints(sel)])  # (src broadcasts to the selection)
        if axis:
            src = b.node("Transpose", [src], perm=list(range(axis, axis + k)) +
                         [d for d in range(len(sel)) if not axis <= d < axis + k])
        rest = [x_shape[d] for d in first[1:]]
        src = b.node("Reshape", [src, b.ints([-1] + rest)])
        idx = b.node("Cast", [b.node("Reshape", [ins[1], b.ints([-1, 1])])], to=b.onnx.TensorProto.INT64)
        idx = b.node("Mod", [idx, b.const(np.asarray(x_shape[axis], np.int64))])  # (negative indices wrap)
        if axis:
            b.node("Transpose", [b.node("ScatterND", [x, idx, src], reduction="add")], [out],
                   perm=[first.index(d) for d in range(ndim)])
        else:
            b.node("ScatterND", [x, idx, src], [out], reduction="add")
    elif op in ("full", "arange") and is_symbolic(metas[0][1]):  # of sizes that vary: computed
        dt = _dtype_of_code(ints[0])
        to = b.h.np_dtype_to_tensor_dtype(np.dtype(dt))
        if op == "full":
            value = b.onnx.numpy_helper.from_array(np.full((1,), floats[0], dtype=dt))
            b.node("ConstantOfShape", [b.ints(metas[0][1])], [out], value=value)
        else:  # start + step * k, k = 0 .. n-1, in float64 as kiln computes it
            k = b.node("Range", [b.const(np.asarray(0, np.int64)), b.sizes.scalar(b, ints[1]),
                                 b.const(np.asarray(1, np.int64))])
            k = b.node("Cast", [k], to=b.onnx.TensorProto.DOUBLE)
            v = b.node("Add", [b.const(np.asarray(floats[0], np.float64)),
                               b.node("Mul", [b.const(np.asarray(floats[1], np.float64)), k])])
            b.node("Cast", [v], [out], to=to)
    elif op in ("full", "arange", "linspace", "eye"):  # constants: their values as initializers
        dt, shape = _dtype_of_code(ints[0]), metas[0][1]
        if is_symbolic(shape):
            raise OnnxExportError(f"kiln.export(ONNX): {op} of a size that varies (dynamic_axes)")
        if op == "full":
            value = np.full(shape, floats[0], dtype=dt)
        elif op == "arange":
            value = (floats[0] + floats[1] * np.arange(ints[1], dtype=np.float64)).astype(dt)
        elif op == "linspace":
            value = np.linspace(floats[0], floats[1], ints[1], dtype=np.float64).astype(dt)
        else:
            value = np.eye(ints[1], ints[2], dtype=dt)
        b.node("Identity", [b.const(value, op)], [out])
    elif op == "if":  # (pred, x..., lifted...): both branches read x... and lifted... by name
        branches = []
        for k, label in ((ints[0], "then"), (ints[1], "else")):
            child, names, out_metas = sub(k, ins[1:])
            finals = [child.node("Identity", [n]) for n in names]  # a branch's outputs are its own values
            branches.append(b.h.make_graph(child.nodes, b.fresh(label), [],
                                           [child.value_info(n, m) for n, m in zip(finals, out_metas)], child.inits))
        cond = b.node("Cast", [ins[0]], to=b.onnx.TensorProto.BOOL)
        b.node("If", [cond], list(outs), then_branch=branches[0], else_branch=branches[1])
    elif op == "while":  # (v..., lifted...) -> final v...: cond once before, then after each body
        nv = len(outs)
        carried, lifted = ins[:nv], ins[nv:]
        parent_cond, _, _ = sub(ints[0], carried + lifted, into=b)
        first = b.node("Cast", parent_cond, to=b.onnx.TensorProto.BOOL)
        body_ins = [b.fresh("v") for _ in carried]
        child, nexts, next_metas = sub(ints[1], body_ins + lifted)
        cond_names, _, _ = sub(ints[0], nexts + lifted, into=child)
        cond_out = child.node("Cast", cond_names, to=b.onnx.TensorProto.BOOL)
        finals = [child.node("Identity", [n]) for n in nexts]
        it, cond_in = b.fresh("iter"), b.fresh("cond")
        body = b.h.make_graph(
            child.nodes, b.fresh("body"),
            [b.h.make_tensor_value_info(it, b.onnx.TensorProto.INT64, []),
             b.h.make_tensor_value_info(cond_in, b.onnx.TensorProto.BOOL, [])]
            + [child.value_info(n, m) for n, m in zip(body_ins, in_metas[:nv])],
            [b.h.make_tensor_value_info(cond_out, b.onnx.TensorProto.BOOL, [])]
            + [child.value_info(n, m) for n, m in zip(finals, next_metas)], child.inits)
        b.node("Loop", ["", first] + carried, list(outs), body=body)
    else:
        raise OnnxExportError(f"kiln.export(ONNX): the op {op!r} has no ONNX form here (ops with one: "
                              f"{', '.join(SUPPORTED)})")


def _one_dtype(b, op, ins, in_metas, metas):
    """The operands of a binary op in one dtype, as ONNX's operators want them: kiln's take mixed
    dtypes and compute in the promoted one (amp: a bfloat16 query times float32 rotary factors gives
    float32), so the narrower operands are cast to it (the result's dtype, or for a comparison the
    widest operand's)."""
    first = 1 if op == "where" else 0  # (where's condition is bool)
    dts = [_np_dtype(m[0]) for m in in_metas[first:]]
    if len({np.dtype(d) for d in dts}) <= 1:
        return ins
    target = _np_dtype(metas[0][0])
    if np.dtype(target) == np.dtype(np.bool_):
        target = max(dts, key=lambda d: (_floating(d), np.dtype(d).itemsize))
    to = b.h.np_dtype_to_tensor_dtype(np.dtype(target))
    return ins[:first] + [i if np.dtype(d) == np.dtype(target) else b.node("Cast", [i], to=to)
                          for i, d in zip(ins[first:], dts)]


def _emit_unary_float(b, op, x, out, src, dst):
    """tan ... atanh (ONNX operators), log2 and log10 (log(x) / log(base)) and exp2 (Pow(2, x)); integer
    inputs compute in float32, as kiln's."""
    if src != dst:
        x = b.node("Cast", [x], to=b.h.np_dtype_to_tensor_dtype(np.dtype(dst)))
    if op in _UNARY_FLOAT:
        b.node(_UNARY_FLOAT[op], [x], [out])
    elif op == "exp2":
        b.node("Pow", [b.const(np.asarray(2, dst)), x], [out])
    else:
        b.node("Div", [b.node("Log", [x]), b.const(np.asarray(np.log(2.0 if op == "log2" else 10.0), dst))], [out])


def _emit_rounding_classifying(b, op, x, out, src, dst):
    """floor, ceil, round (halves to even, as ONNX's Round), trunc, log1p, expm1 (accurate near 0
    without ONNX operators of their own), isnan, isinf, isfinite (integers: never NaN or infinite)."""
    floating = _floating(src)
    if op in ("floor", "ceil", "round", "trunc") and not floating:
        b.node("Identity", [x], [out])  # integers are whole already
    elif op in ("floor", "ceil", "round"):
        b.node(op.capitalize(), [x], [out])
    elif op == "trunc":  # toward 0: ceil below 0, floor elsewhere (NaN included)
        below = b.node("Less", [x, b.const(np.zeros((), src))])
        b.node("Where", [below, b.node("Ceil", [x]), b.node("Floor", [x])], [out])
    elif op in ("log1p", "expm1"):
        if src != dst:  # integers compute in float32, as kiln's
            x = b.node("Cast", [x], to=b.h.np_dtype_to_tensor_dtype(np.dtype(dst)))
        one = b.const(np.ones((), dst))
        if op == "log1p":  # u = 1 + x: log(u) * x / (u - 1), exact where u rounds to 1 (Goldberg)
            u = b.node("Add", [x, one])
            main = b.node("Mul", [b.node("Log", [u]), b.node("Div", [x, b.node("Sub", [u, one])])])
            main = b.node("Where", [b.node("IsInf", [u], detect_negative=0), u, main])
            b.node("Where", [b.node("Equal", [u, one]), x, main], [out])
        else:  # u = exp(x): (u - 1) * x / log(u), x where u rounds to 1, -1 where u - 1 does (Kahan)
            u = b.node("Exp", [x])
            um1 = b.node("Sub", [u, one])
            main = b.node("Mul", [um1, b.node("Div", [x, b.node("Log", [u])])])
            main = b.node("Where", [b.node("IsInf", [u], detect_negative=0), u, main])
            main = b.node("Where", [b.node("Equal", [um1, b.const(-np.ones((), dst))]), um1, main])
            b.node("Where", [b.node("Equal", [u, one]), x, main], [out])
    elif not floating:  # integers and bool: x == x is true
        same = b.node("Equal", [x, x])
        b.node("Identity" if op == "isfinite" else "Not", [same], [out])
    else:
        if _half(src) and op != "isnan":  # (opset 17's IsInf takes float32 and float64)
            x = b.node("Cast", [x], to=b.onnx.TensorProto.FLOAT)
        if op == "isnan":
            b.node("IsNaN", [x], [out])
        elif op == "isinf":
            b.node("IsInf", [x], [out])
        else:
            b.node("Not", [b.node("Or", [b.node("IsNaN", [x]), b.node("IsInf", [x])])], [out])


def _emit_sort(b, x, outs, axis, descending, src, n):
    """kiln's sort (stable, NaN the largest) through ONNX's TopK, whose ties go to the lower index:
    floats are ordered first by being NaN, then by value with NaN read as +inf, so NaN comes after
    +inf ascending and before it descending. bool sorts as int32."""
    k = b.ints([n])

    def order_of(key, into=None):  # TopK's second output: the positions in sorted order
        indices = into or b.fresh("order")
        b.node("TopK", [key, k], [b.fresh("sorted"), indices], axis=axis, largest=int(descending), sorted=1)
        return indices

    if _floating(src):
        nan = b.node("IsNaN", [x])
        by_nan = order_of(b.node("Cast", [nan], to=b.onnx.TensorProto.FLOAT))
        key = b.node("GatherElements", [b.node("Where", [nan, b.const(np.asarray(np.inf, src)), x]), by_nan], axis=axis)
        order = b.node("GatherElements", [by_nan, order_of(key)], [outs[1]], axis=axis)
    else:
        order = order_of(x if src != np.bool_ else b.node("Cast", [x], to=b.onnx.TensorProto.INT32), outs[1])
    b.node("GatherElements", [x, order], [outs[0]], axis=axis)


# rnn_layer's modes (ops.def i[0]) as ONNX operators, and where each of ONNX's gate blocks lies in
# kiln's (PyTorch's) order: LSTM kiln (i, f, g, o), ONNX (i, o, f, c); GRU kiln (r, z, n), ONNX (z, r, h)
_RNN_ONNX = {0: ("LSTM", [0, 3, 1, 2]), 1: ("GRU", [1, 0, 2]), 2: ("RNN", [0]), 3: ("RNN", [0])}


def _emit_rnn_layer(b, ins, outs, ints, metas, in_metas):
    """rnn_layer (one direction of one layer) as ONNX's LSTM, GRU or RNN with one direction: the
    weights' gate blocks permuted, the biases concatenated (W's then R's), the lengths as int32, y
    and the states without ONNX's direction axis. The workspace (for gradients only) is not made."""
    mode, reverse, has_bias, has_lengths = ints[:4]
    onnx_op, order = _RNN_ONNX[mode]
    hidden = in_metas[1][1][1]
    if is_symbolic((hidden,)):
        raise OnnxExportError("kiln.export(ONNX): rnn_layer with a varying hidden size")
    k = 3 if mode == 0 else 2
    w_ih, w_hh = ins[k], ins[k + 1]
    rows = b.const(np.concatenate([np.arange(g * hidden, (g + 1) * hidden) for g in order]).astype(np.int64), "gates")
    axis0 = b.const(np.asarray([0], np.int64), "axes")

    def gates(t):  # t's gate blocks in ONNX's order, with ONNX's leading direction axis
        return b.node("Unsqueeze", [b.node("Gather", [t, rows], axis=0), axis0])

    bias = ""
    if has_bias:  # B = (Wb, Rb), each in ONNX's gate order
        both = b.node("Concat", [b.node("Gather", [ins[k + 2], rows], axis=0),
                                 b.node("Gather", [ins[k + 3], rows], axis=0)], axis=0)
        bias = b.node("Unsqueeze", [both, axis0])
    lengths = ""
    if has_lengths:
        lengths = b.node("Cast", [ins[k + 2 + 2 * has_bias]], to=b.onnx.TensorProto.INT32)
    inputs = [ins[0], gates(w_ih), gates(w_hh), bias, lengths, b.node("Unsqueeze", [ins[1], axis0])]
    attrs = dict(hidden_size=int(hidden), direction="reverse" if reverse else "forward")
    if mode == 0:
        inputs.append(b.node("Unsqueeze", [ins[2], axis0]))
    elif mode == 1:
        attrs["linear_before_reset"] = 1  # n = tanh(W_in x + b_in + r * (W_hn h + b_hn)), PyTorch's GRU
    else:
        attrs["activations"] = ["Tanh" if mode == 2 else "Relu"]
    raw = [b.fresh("rnn_y"), b.fresh("rnn_h")] + ([b.fresh("rnn_c")] if mode == 0 else [])
    b.node(onnx_op, inputs, raw, **attrs)
    b.node("Squeeze", [raw[0], b.const(np.asarray([1], np.int64), "axes")], [outs[0]])
    b.node("Squeeze", [raw[1], axis0], [outs[1]])
    if len(outs) > 2:
        if mode == 0:
            b.node("Squeeze", [raw[2], axis0], [outs[2]])
        else:  # c_n: zeros for the GRU and RNN
            zero = b.h.make_tensor("zero", b.h.np_dtype_to_tensor_dtype(np.dtype(_np_dtype(metas[2][0]))), [1], [0])
            b.node("ConstantOfShape", [b.node("Shape", [ins[1]])], [outs[2]], value=zero)


# kiln ops whose ONNX operators take no bfloat16 at opset 17 (Conv, ConvTranspose, MaxPool,
# AveragePool, Sin, Cos, Tan, ..., Round, RNN/GRU/LSTM: float16, float and double only)
_NO_BFLOAT16 = ("conv2d", "conv2d_backward_input", "max_pool2d", "avg_pool2d", "rnn_layer", "round", "sin", "cos",
                *_UNARY_FLOAT)


def _emit_widened(b, op, ins, outs, ints, floats, metas, in_metas, sub):
    """A node on bfloat16 values whose ONNX operator takes no bfloat16: its bfloat16 inputs cast to
    float32, the operator run in float32, its bfloat16 results rounded by a Cast, as kiln computes
    them (in float32 registers, each result rounded once)."""
    f32 = _C.float32
    widened = [b.node("Cast", [i], to=b.onnx.TensorProto.FLOAT) if m[0].name == "bfloat16" else i
               for i, m in zip(ins, in_metas)]
    tmp = [b.fresh("wide") if m[0].name == "bfloat16" else o for o, m in zip(outs, metas)]
    _emit(b, op, widened, tmp, ints, floats, [(f32 if m[0].name == "bfloat16" else m[0], m[1]) for m in metas],
          [(f32 if m[0].name == "bfloat16" else m[0], m[1]) for m in in_metas], sub)
    for t, o, m in zip(tmp, outs, metas):
        if t != o:
            b.node("Cast", [t], [o], to=b.onnx.TensorProto.BFLOAT16)


def _emit_graph(b, graph, path, in_names):
    """Emits the (sub)graph at path with its inputs named in_names into b; returns its outputs'
    names and metas."""
    inputs, captures, nodes, outputs, _ = graph.structure(tuple(path))
    # sizes that vary (dynamic axes): the values' and size attributes' expressions over the symbols
    sym_values, sym_attrs = graph.symbolic_sizes(tuple(path)) if b.sizes is not None else ({}, {})
    prefix = b.fresh("g") + "_" if path else ""  # each emission of a subgraph names its values anew
    names = {vid: name for (vid, _), name in zip(inputs, in_names)}
    metas = {vid: (m[0], sym_values.get(vid, m[1])) for vid, m in inputs}
    for vid, tensor in captures:
        names[vid] = b.const(_constant(tensor), "param")
        metas[vid] = (tensor.dtype, tuple(tensor.shape))
    for index, (op, ins, outs, ints, floats, out_metas) in enumerate(nodes):
        ints = sym_attrs.get(index, ints)
        out_metas = [(m[0], sym_values.get(vid, m[1])) for vid, m in zip(outs, out_metas)]
        for vid, m in zip(outs, out_metas):
            names[vid], metas[vid] = f"{prefix}v{vid}", m

        def sub(index, sub_in_names, into=None):
            child = into if into is not None else b.child()
            sub_outs, sub_metas = _emit_graph(child, graph, tuple(path) + (index,), sub_in_names)
            return (sub_outs, sub_metas, None) if into is not None else (child, sub_outs, sub_metas)

        emit = _emit_widened if op in _NO_BFLOAT16 and any(
            m[0].name == "bfloat16" for m in out_metas + [metas[v] for v in ins]) else _emit
        emit(b, op, [names[v] for v in ins], [names[v] for v in outs], ints, floats, out_metas,
             [metas[v] for v in ins], sub)
    return [names[v] for v in outputs], [metas[v] for v in outputs]


def _without_identities(nodes, initializers, inputs, outputs):
    """The main graph's nodes without its Identity nodes: a use of an Identity's result reads its
    input instead, and a graph output that an Identity copies from a value a node makes becomes that
    node's output (renamed everywhere, subgraphs' outer-scope reads included). An Identity stays only
    where an output copies a graph input, an initializer or another output."""
    made = {o for n in nodes for o in n.output}
    alias, rename, kept = {}, {}, []

    def resolve(name):
        while name in alias:
            name = alias[name]
        return rename.get(name, name)

    for n in nodes:
        if n.op_type != "Identity":
            kept.append(n)
            continue
        src, dst = resolve(n.input[0]), n.output[0]
        if dst not in outputs:
            alias[dst] = src
        elif src in made and src not in outputs and src not in initializers and src not in inputs and \
                src not in rename.values():
            rename[src] = dst
        else:
            kept.append(n)

    def rewrite(node_list):
        for n in node_list:
            for k, name in enumerate(n.input):
                if name:
                    n.input[k] = resolve(name)
            for k, name in enumerate(n.output):
                n.output[k] = rename.get(name, name)
            for a in n.attribute:  # subgraphs read outer values by name
                for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                    rewrite(g.node)

    rewrite(kept)
    return kept


def export_graph(graph, input_names, output_names, file_name, symbol_dims=None, labels=None, output_labels=None):
    """Writes the kiln._C.Graph `graph` as an ONNX model to file_name; returns the onnx ModelProto.
    A graph with symbolic sizes (dynamic axes): symbol_dims maps each symbol to the (input index,
    axis) it is read from, labels each symbol to the name of its dimension, output_labels an
    (output index, axis) to the name the caller gave it."""
    try:
        import onnx
    except ImportError:
        raise ImportError("kiln.export(file_format='ONNX') needs the onnx package (pip install onnx)") from None
    b = _Builder(onnx, labels=labels)
    if symbol_dims:
        b.sizes = SizeEmitter(b, symbol_dims, list(input_names))
    inputs = graph.structure()[0]
    in_sizes = graph.symbolic_sizes()[0] if symbol_dims else {}
    graph_inputs = [b.value_info(name, (meta[0], in_sizes.get(vid, meta[1])))
                    for (vid, meta), name in zip(inputs, input_names)]
    outs, metas = _emit_graph(b, graph, (), list(input_names))
    graph_outputs = []
    for o, (src, name, meta) in enumerate(zip(outs, output_names, metas)):
        b.node("Identity", [src], [name])
        shape = [(output_labels or {}).get((o, axis), d) for axis, d in enumerate(meta[1])]
        graph_outputs.append(b.value_info(name, (meta[0], shape)))
    nodes = _without_identities(b.nodes, {t.name for t in b.inits}, set(input_names), set(output_names))
    model = onnx.helper.make_model(onnx.helper.make_graph(nodes, "kiln", graph_inputs, graph_outputs, b.inits),
                                   opset_imports=[onnx.helper.make_opsetid("", OPSET)], producer_name="kiln")
    onnx.checker.check_model(model)
    onnx.save(model, file_name)
    return model
