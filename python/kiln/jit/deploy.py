"""Deployment: trace.dump, kiln.load and kiln.export write and read kiln model files (a graph with
its parameters, named inputs and outputs and embedded test cases; docs/model_format.md), which
the C runtime and the kiln-run program run without Python.

The graph in a file is the trace's recording optimized for inference (MegEngine's
optimize_for_inference: kiln's O1 passes with the inference rewrites: batch norm folded into
convolutions, constants folded, elementwise fusion), or as recorded (optimize_for_inference=False:
results bitwise equal to the trace at O0)."""
import collections
import json
import os
import re

from .. import _C
from . import tree

DumpInfo = collections.namedtuple("DumpInfo", "nr_opr tot_bytes tensor_value_bytes inputs outputs")
DumpInfo.__doc__ = """What trace.dump wrote: nodes, file bytes, parameter bytes, input and output names."""

# MegEngine's layout options for other hardware: what each is for. The CPU ones (4-channel blocks
# for ARM's 4-wide NEON) become kiln's blocked channel layout for this CPU, as enable_nchw88 (8 or 16
# channels, what x86's SIMD reads); the GPU ones are recorded in the file's metadata and leave the
# graph in NCHW, so the file runs everywhere. Either way a warning names the option, once.
_CPU_BLOCKED_LAYOUTS = {
    "enable_nchw44": "ARM CPUs (NEON)",
    "enable_nchw44_dot": "ARMv8.2 CPUs with dot-product instructions",
}
_FOREIGN_LAYOUTS = {
    "enable_nchw4": "NVIDIA GPUs (cuDNN int8)",
    "enable_nchw32": "NVIDIA GPUs with tensor cores (cuDNN)",
    "enable_chwn4": "NVIDIA GPUs with tensor cores",
    "enable_hwcd4": "OpenCL (mobile GPU) backends",
}
_LAYOUTS = ("enable_nchw88",) + tuple(_CPU_BLOCKED_LAYOUTS) + tuple(_FOREIGN_LAYOUTS)
_warned_layouts = set()


def _warn_layout_once(option, text):
    if option not in _warned_layouts:
        _warned_layouts.add(option)
        import warnings

        warnings.warn(f"trace.dump: {option}: {text}", RuntimeWarning, stacklevel=4)
_FLOAT16 = ("enable_io16xc32", "enable_ioc16")
_FUSIONS = ("enable_fuse_conv_bias_nonlinearity", "enable_fuse_conv_bias_with_z")
_OPTIONS = _LAYOUTS + _FLOAT16 + _FUSIONS
# kiln_pass_options.conv_fusion (include/kiln/passes.h)
_CONV_FUSE_ALL, _CONV_FUSE_NONE, _CONV_FUSE_BIAS_ACT = 0, 1, 2


def _inference_options(optimize_for_inference, options):
    """The pass settings of dump's keyword options: (level, inference, disable_format_transform,
    conv_fusion, float16 (0, 1: enable_io16xc32, 2: enable_ioc16), the options in effect, the options
    recorded but not applied)."""
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise TypeError(f"trace.dump: unknown keyword argument(s) {', '.join(unknown)}; the inference options are "
                        f"{', '.join(_OPTIONS)}")
    on = sorted(k for k, v in options.items() if v)
    if not optimize_for_inference:
        if on:
            raise ValueError(f"trace.dump: {', '.join(on)} need optimize_for_inference=True (MegEngine skips every "
                             "option without it)")
        return 0, False, True, _CONV_FUSE_NONE, 0, [], []
    layouts = [k for k in on if k in _LAYOUTS]
    if len(layouts) > 1:
        raise ValueError(f"trace.dump: choose at most one layout option, got {', '.join(layouts)}")
    recorded, blocked = [], "enable_nchw88" in on
    for k in layouts:
        if k in _CPU_BLOCKED_LAYOUTS:
            blocked = True
            _warn_layout_once(k, f"the 4-channel blocked layout of {_CPU_BLOCKED_LAYOUTS[k]}; kiln applies its own "
                                 "blocked channel layout for this CPU (as enable_nchw88: 8 or 16 channels a block)")
        elif k in _FOREIGN_LAYOUTS:
            recorded.append(k)
            _warn_layout_once(k, f"the layout for {_FOREIGN_LAYOUTS[k]}, which kiln does not run on; recorded in the "
                                 "file's metadata, the graph stays NCHW (the file runs everywhere)")
    float16 = 2 if "enable_ioc16" in on else 1 if "enable_io16xc32" in on else 0  # model_write's float16
    if "enable_ioc16" in on:
        if "enable_io16xc32" in on:
            raise ValueError("trace.dump: choose one of enable_io16xc32 and enable_ioc16")
        fused = [k for k in on if k in _FUSIONS]
        if fused:
            # a fused convolution keeps its bias, residual and activation steps in float32: the
            # steps' results would not be rounded to float16 each
            raise ValueError(f"trace.dump: enable_ioc16 rounds every op's result to float16, which "
                             f"{', '.join(fused)} cannot (the fused steps stay float32); use enable_io16xc32 with it")
    if "enable_fuse_conv_bias_with_z" in on:
        fusion = _CONV_FUSE_ALL
    elif "enable_fuse_conv_bias_nonlinearity" in on:
        fusion = _CONV_FUSE_BIAS_ACT
    else:
        fusion = _CONV_FUSE_NONE
    return 1, True, not blocked, fusion, float16, [k for k in on if k not in recorded], recorded


def default_arg_names(tr, nin):
    """The traced function's parameter names when it took nin positional tensors, else arg_0, ..."""
    import inspect

    fn = tr.__wrapped__
    if not inspect.isfunction(fn) and not inspect.ismethod(fn):
        fn = getattr(fn, "construct", fn)
    try:
        params = [p for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    labels = tr._labels or []
    if len(labels) == nin and all(label == f"args[{k}]" for k, label in enumerate(labels)) and len(params) >= nin:
        return [p.name for p in params[:nin]]
    return [f"arg_{k}" for k in range(nin)]


def _cases(rec, inputs, arg_names, input_data, round_inputs=False):
    """The test cases of input_data: a list of tensors, per case the inputs then the outputs
    the trace computes for them (round_inputs: for the float32 inputs rounded to float16 first)."""
    if input_data is None:
        return []
    from .._tensor import tensor as _tensor

    cases = input_data if isinstance(input_data, list) else [input_data]
    flat = []
    nin = len(inputs)
    for c, case in enumerate(cases):
        if isinstance(case, dict):
            names = arg_names
            missing = [n for n in names if n not in case]
            if missing or len(case) != len(names):
                raise ValueError(f"trace.dump: input_data case {c} names {sorted(case)}, the inputs are {names}")
            case = [case[n] for n in names]
        elif not isinstance(case, (tuple, list)):
            case = [case]
        if len(case) != nin:
            raise ValueError(f"trace.dump: input_data case {c} has {len(case)} inputs, the graph takes {nin}")
        ins = []
        for k, (value, (dtype, shape)) in enumerate(zip(case, inputs)):
            t = value if isinstance(value, _C.TensorBase) else _tensor(value, dtype=dtype)
            if t.dtype is not dtype or tuple(t.shape) != tuple(shape):
                raise ValueError(f"trace.dump: input_data case {c} input {k} is {t.dtype.name}{list(t.shape)}, the "
                                 f"traced input is {dtype.name}{list(shape)}")
            if round_inputs and t.dtype is _C.float32:
                t = t.astype(_C.float16).astype(_C.float32)
            ins.append(t)
        outs = rec.executable(*ins)
        flat.extend(ins)
        flat.extend(outs)
    return flat


def dump_trace(tr, file, *, arg_names=None, output_names=None, append=False, keep_var_name=1, keep_opr_name=False,
               keep_param_name=False, keep_opr_priority=False, strip_info_file=None, append_json=False,
               optimize_for_inference=True, user_info=None, enable_metadata=True, input_data=None, **kwargs):
    """trace.dump (see kiln.trace.dump)."""
    if not tr.capture_as_const:
        raise ValueError("trace.dump: the trace must be made with capture_as_const=True (as in MegEngine): a file "
                         "holds the parameters' values")
    if tr._last is None:
        raise RuntimeError("trace.dump: nothing traced yet; call the trace first")
    graph_name = kwargs.pop("graph_name", None)
    existing, taken = _existing_graphs(file) if append else (b"", [])
    if graph_name is None:
        graph_name, k = tr.__qualname__, len(taken)
        while graph_name in taken:
            graph_name, k = f"{tr.__qualname__}:{k}", k + 1
    elif not isinstance(graph_name, str) or not graph_name:
        raise ValueError(f"trace.dump: graph_name must be a non-empty str, got {graph_name!r}")
    elif graph_name in taken:
        raise ValueError(f"trace.dump: {file} already holds a graph named {graph_name!r} (its graphs: {taken})")
    if keep_var_name not in (0, 1, 2, False, True):
        raise ValueError(f"trace.dump: keep_var_name must be 0, 1 or 2, got {keep_var_name!r}")
    level, inference, no_format, fusion, float16, options, not_applied = _inference_options(optimize_for_inference,
                                                                                            kwargs)
    rec = tr._last
    graph_inputs = rec.graph.inputs()
    nin, nout = len(graph_inputs), rec.graph.num_outputs
    if arg_names is None:
        arg_names = default_arg_names(tr, nin)
    arg_names = list(arg_names)
    if len(arg_names) != nin:
        raise ValueError(f"trace.dump: {len(arg_names)} arg_names for {nin} inputs")
    if output_names is None:
        output_names = [f"output{k}" for k in range(nout)] if nout != 1 else ["output"]
    elif isinstance(output_names, str):
        output_names = [output_names]
    output_names = list(output_names)
    if len(output_names) != nout:
        raise ValueError(f"trace.dump: {len(output_names)} output_names for {nout} outputs")
    # a graph computing in 16-bit floats already (amp) keeps its dtypes under enable_io16xc32: its
    # float32 inputs and outputs become float16, and the file computes what the trace does on the
    # inputs rounded to float16 (model.c's float16_storage; enable_ioc16 is refused there)
    io_only = bool(float16) and _C.graph_computes_16bit(rec.graph)
    cases = _cases(rec, graph_inputs, arg_names, input_data, round_inputs=io_only)
    if float16:  # the file's inputs and outputs are float16 too
        cases = [c.astype(_C.float16) if c.dtype is _C.float32 else c for c in cases]
    metadata = None
    if enable_metadata:
        metadata = json.dumps({"producer": "kiln.trace.dump", "function": tr.__qualname__,
                               "optimize_for_inference": bool(optimize_for_inference), "options": options,
                               "level": f"O{level}", "test_cases": len(cases) // max(nin + nout, 1),
                               "options_not_applied": not_applied}, sort_keys=True)
    info = json.dumps(user_info, sort_keys=True) if user_info is not None else None
    param_names = getattr(rec.extra, "param_names", None) if keep_param_name else None
    data, nodes, params, text = _C.model_write(rec.graph, level, inference, no_format, fusion, float16, arg_names,
                                                output_names, metadata, info, cases, graph_name, param_names,
                                                int(keep_var_name), bool(keep_opr_name), bool(keep_opr_priority))
    if isinstance(file, (str, os.PathLike)):
        with open(file, "ab" if existing else "wb") as f:  # a file's graphs are records one after another
            f.write(data)
    else:
        file.write(data)
    if strip_info_file is not None:
        _write_strip_info(strip_info_file, text, append_json)
    return DumpInfo(nodes, len(data), params, arg_names, output_names)


def _existing_graphs(file):
    """append=True: the bytes of the kiln file at path `file` and the names of its graphs (b"" and []
    when it does not exist or is empty), each graph checked (a file that is not a kiln model, or a
    corrupt one, raises)."""
    if not isinstance(file, (str, os.PathLike)):
        raise ValueError("trace.dump: append=True needs a path (as in MegEngine, where it only works when file is "
                         "a str), not a file object")
    if not os.path.exists(file):
        return b"", []
    with open(file, "rb") as f:
        data = f.read()
    if not data:
        return b"", []
    try:
        first = _C.Model(data)
        for k in range(1, len(first.graph_names)):
            _C.Model(data, index=k)
    except ValueError as e:
        raise ValueError(f"trace.dump(append=True): {os.fspath(file)} is not a kiln model file this kiln can append "
                         f"to: {e}") from None
    if first.version == 1:  # its header's size is the whole file's: a record after it would make it unreadable
        raise ValueError(f"trace.dump(append=True): {os.fspath(file)} is a format version 1 file, which holds one "
                         "graph; dump that graph again with this kiln to append to it")
    return data, first.graph_names


def _write_strip_info(path, graph_text, append):
    """MegEngine's strip_info_file: the ops and dtypes the graph uses, as JSON (merged into the
    file's lists with append_json)."""
    ops = set(re.findall(r"= ([a-z0-9_]+)\(", graph_text))
    dtypes = set(re.findall(r": ([a-z0-9]+)\[", graph_text))
    if append and os.path.exists(path):
        with open(path) as f:
            old = json.load(f)
        ops |= set(old.get("opr_types", []))
        dtypes |= set(old.get("dtype_types", []))
    with open(path, "w") as f:
        json.dump({"opr_types": sorted(ops), "dtype_types": sorted(dtypes)}, f, indent=1, sort_keys=True)


class LoadedGraph:
    """A graph of a model file loaded for running (kiln.load): call it with the inputs (positional,
    in the file's order); it returns the output, or a tuple of them. backend: a registered backend
    ("kbk", "sink", "reference": kiln._C.backend_names()).

    The names the file keeps (trace.dump's keep_* options; docs/model_format.md): param_names,
    var_names and op_names (lists, in the graph's order), op_priorities (the recorded order of each
    node, [] when not kept); name, index and graph_names tell which graph of the file this is."""

    def __init__(self, source, backend="kbk", index=0, name=None):
        if hasattr(source, "read"):
            source = source.read()
        self._model = _C.Model(source, index=index, name=name)
        self._exe = self._model.compile(_C.CompileOptions(backend=backend, inference=True))
        self.backend = backend
        values, nodes, self.op_priorities = self._model.names()
        self.param_names = [n for _, capture, n in values if capture]
        self.var_names = [n for _, capture, n in values if not capture]
        self.op_names = [n for _, n in nodes]

    @property
    def name(self):
        """This graph's name in its file (trace.dump's graph_name)."""
        return self._model.name

    @property
    def index(self):
        return self._model.index

    @property
    def graph_names(self):
        """The names of the file's graphs, in order (kiln.load's index or name picks one)."""
        return self._model.graph_names

    @property
    def version(self):
        """The file's format version."""
        return self._model.version

    @property
    def inputs(self):
        """[(name, dtype, shape)]"""
        return self._model.inputs

    @property
    def outputs(self):
        return self._model.outputs

    @property
    def metadata(self):
        text = self._model.metadata
        return json.loads(text) if text else None

    @property
    def user_info(self):
        text = self._model.user_info
        return json.loads(text) if text else None

    @property
    def param_bytes(self):
        return self._model.param_bytes

    @property
    def num_nodes(self):
        return self._model.num_nodes

    def graph_str(self):
        return self._model.graph_str()

    def test_cases(self):
        """[(inputs, expected outputs)] embedded by dump's input_data."""
        return self._model.cases()

    def __call__(self, *args):
        from .._tensor import tensor as _tensor

        if len(args) != len(self.inputs):
            raise TypeError(f"kiln.load: the graph takes {len(self.inputs)} inputs "
                            f"({', '.join(n for n, _, _ in self.inputs)}), got {len(args)}")
        ins = [a if isinstance(a, _C.TensorBase) else _tensor(a, dtype=dt) for a, (_, dt, _) in zip(args, self.inputs)]
        # float32 tensors given to a float16 file (enable_io16xc32) are converted
        ins = [a.astype(dt) if a.dtype is _C.float32 and dt is _C.float16 else a for a, (_, dt, _) in zip(ins, self.inputs)]
        outs = self._exe(*ins)
        return outs[0] if len(outs) == 1 else tuple(outs)

    def __repr__(self):
        ins = ", ".join(f"{n}: {dt.name}{list(s)}" for n, dt, s in self.inputs)
        return f"<kiln.load graph ({ins}) -> {len(self.outputs)} output(s), {self.num_nodes} nodes>"


def load(source, backend="kbk", index=0, name=None):
    """Loads a graph of a model file (a path, bytes or a binary file object) written by trace.dump or
    kiln.export, as a callable graph (MindSpore's mindspore.load; nn.GraphCell wraps it): the first,
    or the one at `index`, or the one named `name` (a file trace.dump appended graphs to)."""
    return LoadedGraph(source, backend=backend, index=index, name=name)
