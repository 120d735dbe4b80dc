"""ONNX export of inference graphs (kiln.export(..., file_format="ONNX")) through the `onnx` package.

The graph exported is the trace's recording (kiln's O0 ops, before fusion): each kiln op becomes
the ONNX operators with its meaning (opset 17). Graphs with control flow, and ops without an
entry below, raise NotImplementedError naming the op."""
import numpy as np

from .. import _C

OPSET = 17


def _np_dtype(dtype):
    return {"bool": np.bool_, "int8": np.int8, "int32": np.int32, "int64": np.int64, "float16": np.float16,
            "float32": np.float32, "float64": np.float64}[dtype.name]


class _Builder:
    def __init__(self, onnx):
        self.onnx, self.h = onnx, onnx.helper
        self.nodes, self.inits, self.names = [], [], {}
        self.count = 0

    def fresh(self, hint):
        self.count += 1
        return f"{hint}_{self.count}"

    def const(self, array, hint="c"):
        name = self.fresh(hint)
        self.inits.append(self.onnx.numpy_helper.from_array(np.asarray(array), name))
        return name

    def ints(self, values):
        return self.const(np.asarray(values, dtype=np.int64), "shape")

    def node(self, op, inputs, outputs=None, **attrs):
        outputs = outputs or [self.fresh(op.lower())]
        self.nodes.append(self.h.make_node(op, inputs, outputs, **attrs))
        return outputs[0]


_UNARY = {"relu": "Relu", "neg": "Neg", "exp": "Exp", "log": "Log", "sqrt": "Sqrt", "cos": "Cos", "sin": "Sin",
          "tanh": "Tanh", "sigmoid": "Sigmoid", "abs": "Abs", "erf": "Erf"}
_BINARY = {"add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div", "pow": "Pow", "matmul": "MatMul",
           "maximum": "Max", "minimum": "Min"}


def _emit(b, op, ins, outs, ints, floats, metas):
    """ONNX nodes for one kiln node; outs: the names its outputs get."""
    out = outs[0]
    if op in _UNARY:
        b.node(_UNARY[op], ins, [out])
    elif op in _BINARY:
        b.node(_BINARY[op], ins, [out])
    elif op == "silu":
        b.node("Mul", [ins[0], b.node("Sigmoid", ins)], [out])
    elif op == "linear":  # x @ w.T (+ b)
        y = b.node("MatMul", [ins[0], b.node("Transpose", [ins[1]], perm=[1, 0])])
        b.node("Add", [y, ins[2]], [out]) if len(ins) == 3 else b.node("Identity", [y], [out])
    elif op == "conv2d":
        sh, sw, pt, pb, pl, pr, dh, dw, groups = ints[:9]
        b.node("Conv", ins, [out], strides=[sh, sw], pads=[pt, pl, pb, pr], dilations=[dh, dw], group=groups)
    elif op == "batch_norm":
        if ints and ints[0]:
            raise NotImplementedError("kiln.export(ONNX): batch_norm in training mode (call set_train(False))")
        b.node("BatchNormalization", ins, [out], epsilon=floats[0])
        for extra in outs[1:]:  # the batch statistics outputs: unused in inference graphs
            b.node("Identity", [ins[3]], [extra])
    elif op in ("reshape", "expand"):
        b.node("Reshape" if op == "reshape" else "Expand", [ins[0], b.ints(ints)], [out])
    elif op == "permute":
        b.node("Transpose", ins, [out], perm=list(ints))
    elif op == "cast":
        b.node("Cast", ins, [out], to=b.h.np_dtype_to_tensor_dtype(np.dtype(_np_dtype(metas[0][0]))))
    elif op == "concat":
        b.node("Concat", ins, [out], axis=ints[0])
    elif op == "softmax":
        b.node("Softmax", ins, [out], axis=ints[0])
    elif op in ("sum", "mean", "max", "min"):
        mask, keep = ints[0], ints[1]
        axes = [d for d in range(64) if mask >> d & 1]
        onnx_op = {"sum": "ReduceSum", "mean": "ReduceMean", "max": "ReduceMax", "min": "ReduceMin"}[op]
        if op == "sum":
            b.node(onnx_op, [ins[0], b.ints(axes)], [out], keepdims=keep)
        else:
            b.node(onnx_op, ins, [out], axes=axes, keepdims=keep)
    elif op == "slice":
        ndim = len(metas[0][1])
        starts, steps, lengths = ints[0:ndim], ints[8:8 + ndim], ints[16:16 + ndim]
        ends = [s + st * n if (s + st * n) >= 0 else -(2 ** 62) for s, st, n in zip(starts, steps, lengths)]
        b.node("Slice", [ins[0], b.ints(starts), b.ints(ends), b.ints(list(range(ndim))), b.ints(steps)], [out])
    else:
        raise NotImplementedError(f"kiln.export(ONNX): the op {op!r} has no ONNX form here yet")


def export_graph(graph, input_names, output_names, file_name):
    """Writes the kiln._C.Graph `graph` as an ONNX model to file_name; returns the onnx ModelProto."""
    try:
        import onnx
    except ImportError:
        raise ImportError("kiln.export(file_format='ONNX') needs the onnx package (pip install onnx)") from None
    inputs, captures, nodes, outputs, nsub = graph.structure()
    if nsub:
        raise NotImplementedError("kiln.export(ONNX): graphs with control flow (if/while subgraphs) are not exported")
    b = _Builder(onnx)
    h = onnx.helper
    names = {}
    graph_inputs = []
    for (vid, (dtype, shape)), name in zip(inputs, input_names):
        names[vid] = name
        graph_inputs.append(h.make_tensor_value_info(name, h.np_dtype_to_tensor_dtype(np.dtype(_np_dtype(dtype))),
                                                     list(shape)))
    for vid, tensor in captures:
        names[vid] = b.const(tensor.asnumpy(), "param")
    metas = {}
    for op, ins, outs, ints, floats, out_metas in nodes:
        for vid in outs:
            names[vid] = f"v{vid}"
        for vid, m in zip(outs, out_metas):
            metas[vid] = m
        _emit(b, op, [names[v] for v in ins], [names[v] for v in outs], ints, floats, out_metas)
    graph_outputs = []
    for vid, name in zip(outputs, output_names):
        src = names[vid]
        b.node("Identity", [src], [name])
        dtype, shape = metas[vid] if vid in metas else dict(inputs)[vid]
        graph_outputs.append(h.make_tensor_value_info(name, h.np_dtype_to_tensor_dtype(np.dtype(_np_dtype(dtype))),
                                                      list(shape)))
    model = h.make_model(h.make_graph(b.nodes, "kiln", graph_inputs, graph_outputs, b.inits),
                         opset_imports=[h.make_opsetid("", OPSET)], producer_name="kiln")
    onnx.checker.check_model(model)
    onnx.save(model, file_name)
    return model
