"""kiln.export (MindSpore's mindspore.export): a Cell or function traced by kiln.trace, written as a
kiln model file (trace.dump, kiln.jit.deploy) or as an ONNX model (kiln.jit.onnx_export)."""
import os

from .. import _C
from .deploy import default_arg_names
from .megengine import trace


def export(net, *inputs, file_name, file_format="KILN", **kwargs):
    """Writes net (a Cell or function) traced on `inputs` to file_name (MindSpore's
    mindspore.export; ".kiln" or ".onnx" is appended when the name has no suffix).
    file_format "KILN": keyword arguments go to trace.dump (optimize_for_inference, arg_names,
    ...), and the DumpInfo is returned. "ONNX": the recorded graph (kiln's ops before fusion) as an
    ONNX model through the onnx package (keywords arg_names, output_names, dynamic_axes), which is
    returned. dynamic_axes (as torch.onnx.export takes it): {input name: {axis: name} or [axes]}, the
    input dimensions the model accepts at any size (an axis of size 0 or 1 at export cannot be one);
    default: the dimensions kiln.mark_dynamic marked on the inputs given. The outputs' dimensions that
    follow get names too (an output's entry must name dimensions that do vary)."""
    fmt = str(file_format).upper()
    if fmt not in ("KILN", "ONNX"):
        raise ValueError(f"kiln.export: file_format must be 'KILN' or 'ONNX', got {file_format!r}")
    if not os.path.splitext(str(file_name))[1]:
        file_name = f"{file_name}.{fmt.lower()}"
    t = trace(net, capture_as_const=True, opt_level=0, verify=False)
    t(*inputs)
    if fmt == "KILN":
        return t.dump(file_name, **kwargs)
    from .onnx_export import export_graph

    unknown = sorted(set(kwargs) - {"arg_names", "output_names", "dynamic_axes"})
    if unknown:
        raise TypeError(f"kiln.export(ONNX): unknown keyword argument(s) {', '.join(unknown)}")
    rec = t._last
    nin, nout = len(rec.graph.inputs()), rec.graph.num_outputs
    arg_names = list(kwargs.get("arg_names") or default_arg_names(t, nin))
    output_names = list(kwargs.get("output_names") or (["output"] if nout == 1 else [f"output{k}" for k in range(nout)]))
    if len(arg_names) != nin or len(output_names) != nout:
        raise ValueError(f"kiln.export(ONNX): {len(arg_names)} arg_names and {len(output_names)} output_names for "
                         f"{nin} inputs and {nout} outputs")
    dynamic = kwargs.get("dynamic_axes")
    if dynamic is None:
        dynamic = _marked_axes([x for x in inputs if isinstance(x, _C.TensorBase)], arg_names)
    if not dynamic:
        return export_graph(rec.graph, arg_names, output_names, str(file_name))
    from .onnx_dynamic import symbolic_export_graph

    graph, symbol_dims, labels, out_labels = symbolic_export_graph(rec, arg_names, output_names, dynamic)
    return export_graph(graph, arg_names, output_names, str(file_name), symbol_dims, labels, out_labels)


def _marked_axes(tensors, arg_names):
    """{input name: [axes]} that kiln.mark_dynamic marked on the tensors the trace was called with."""
    from .dynamic import marks_of

    out = {}
    for name, t in zip(arg_names, tensors):
        marks = marks_of(t)
        if marks:
            axes = [d for d, dynamic in marks.items() if dynamic]
            if axes:
                out[name] = axes
    return out
