"""The graph kiln.export(file_format="ONNX", dynamic_axes=...) writes: the trace's recording made
symbolic in the requested input dimensions only (kiln.jit.dynamic's symbols, the others fixed at
their recorded sizes), so that the ONNX model computes every size that follows from them. A
dimension that cannot vary (a size of 0 or 1 at the export, one the traced code used as a Python
number, one a weight fixes) is refused with OnnxExportError saying why."""
from .onnx_export import OnnxExportError


def _requested(dynamic_axes, arg_names, output_names, graph_inputs):
    """{(input index, axis): label} from torch's dynamic_axes form, and {(output index, axis): label}."""
    if not isinstance(dynamic_axes, dict):
        raise TypeError(f"kiln.export(ONNX): dynamic_axes must be a dict of input or output name -> axes, got "
                        f"{type(dynamic_axes).__name__}")
    ins, outs = {}, {}
    for name, axes in dynamic_axes.items():
        if name in arg_names:
            index, ndim, into, kind = arg_names.index(name), len(graph_inputs[arg_names.index(name)][1]), ins, "input"
        elif name in output_names:
            index, ndim, into, kind = output_names.index(name), None, outs, "output"
        else:
            raise ValueError(f"kiln.export(ONNX): dynamic_axes names {name!r}, which is neither an input "
                             f"({', '.join(arg_names)}) nor an output ({', '.join(output_names)})")
        if isinstance(axes, dict):
            items = list(axes.items())
        elif isinstance(axes, (list, tuple)):
            items = [(a, None) for a in axes]
        else:
            raise TypeError(f"kiln.export(ONNX): dynamic_axes[{name!r}] must be a dict of axis -> name or a list of "
                            f"axes, got {type(axes).__name__}")
        for axis, label in items:
            if not isinstance(axis, int) or isinstance(axis, bool) or (ndim is not None and not -ndim <= axis < ndim):
                raise ValueError(f"kiln.export(ONNX): dynamic_axes[{name!r}] has axis {axis!r}, out of range for the "
                                 f"{kind} {name!r}" + (f" of {ndim} dimensions" if ndim is not None else ""))
            into[(index, axis % ndim if ndim is not None else axis)] = label or f"{name}_dim{axis}"
    return ins, outs


def symbolic_export_graph(rec, arg_names, output_names, dynamic_axes):
    """(graph with symbolic sizes, {symbol: (input index, axis)}, {symbol: dimension name},
    {(output index, axis): dimension name}) for the trace's last recording rec."""
    graph = rec.graph
    inputs = graph.inputs()
    wanted, wanted_out = _requested(dynamic_axes, arg_names, output_names, inputs)
    cap = getattr(getattr(rec, "extra", None), "export_capture", None)
    symbol_dims, labels = {}, {}
    for (i, axis), label in sorted(wanted.items()):
        size = inputs[i][1][axis]
        where = f"dimension {axis} of input {arg_names[i]!r} (size {size} at the export)"
        if size < 2:
            raise OnnxExportError(f"kiln.export(ONNX): {where} cannot vary: export with a size of 2 or more there")
        expr = cap.input_exprs[i][axis] if cap is not None else None
        k = None if expr is None else expr.symbol_index
        if k is None:
            raise OnnxExportError(f"kiln.export(ONNX): {where} cannot vary: the trace could not make it symbolic")
        if k in cap.specialized:
            raise OnnxExportError(f"kiln.export(ONNX): {where} cannot vary: the traced code needs its size "
                                  f"({cap.why.get(k, 'fixed while tracing')})")
        if k in symbol_dims and labels[k] != label:
            raise OnnxExportError(f"kiln.export(ONNX): {where} is the same size as dimension {symbol_dims[k][1]} of "
                                  f"input {arg_names[symbol_dims[k][0]]!r} (the trace links them), named "
                                  f"{labels[k]!r} there and {label!r} here")
        symbol_dims.setdefault(k, (i, axis))
        labels[k] = label
    fixed = set(range(len(cap.values))) - set(symbol_dims)
    made = cap._symbolize(graph, 0, False, True, fixed)
    if made is None:
        names = ", ".join(f"{arg_names[i]}[{a}]" for i, a in symbol_dims.values())
        raise OnnxExportError(f"kiln.export(ONNX): the graph does not hold for every size of {names} (an op or "
                              "a weight needs the size it had at the export)")
    symbolic = made[0]
    out_ids = symbolic.structure()[3]
    out_sizes = symbolic.symbolic_sizes()[0]
    for (o, axis), label in wanted_out.items():
        sizes = out_sizes.get(out_ids[o])
        if sizes is None or not -len(sizes) <= axis < len(sizes) or not isinstance(sizes[axis], str):
            raise OnnxExportError(f"kiln.export(ONNX): dynamic_axes names dimension {axis} of output "
                                  f"{output_names[o]!r}, which does not vary with the inputs' dynamic axes")
    out_labels = {(o, axis % len(out_sizes[out_ids[o]])): label for (o, axis), label in wanted_out.items()}
    return symbolic, symbol_dims, labels, out_labels
