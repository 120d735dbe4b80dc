"""Cell: the building block of networks (MindSpore's nn.Cell), plus SequentialCell and CellList."""
import types
from collections import OrderedDict, namedtuple

import numpy as np

from .. import _C, grad_hooks, hooks
from .. import _tensor
from .. import context as _context
from .. import recomputation
from .parameter import Parameter

_object_setattr = _C.cell_set_raw  # an attribute write that neither registers nor bumps the version

# While kiln.jit captures, the Cells called and the attribute writes on Cells are logged in the
# lists given to kiln._C.set_cell_logs (see kiln.jit.capture_core.Recording and kiln.jit.guards).
# Cell.recompute() cells called eagerly run through kiln.recompute's eager path.
_C.cell_setup(Parameter, _context._context, recomputation.call_construct)


def hooks_before(cell, args):
    """Runs cell's forward pre-hooks on its call's positional args; a hook returning something
    else than None replaces them (a tuple, or one value standing for a 1-tuple). With backward
    hooks, the args then go through the identity node whose gradient runs them (kiln.grad_hooks)."""
    hooks = cell.__dict__["_kiln_hooks"]
    for _, hook in hooks[0]:
        got = hook(cell, args)
        if got is not None:
            args = got if isinstance(got, tuple) else (got,)
    if hooks[2] or hooks[3]:
        call = grad_hooks.CellCall(cell, [h for _, h in hooks[2]], [h for _, h in hooks[3]])
        args = call.wrap_inputs(args)
        _backward_calls[id(args)] = call  # (hooks_after gets this very tuple)
    return args


_backward_calls = {}  # id(the args hooks_before returned) -> its CellCall, until hooks_after


def hooks_after(cell, args, output):
    """Runs cell's forward hooks on its call's args and output; one returning something else than
    None replaces the output. With backward hooks, the output then goes through the identity node
    whose gradient runs the pre-hooks."""
    hooks = cell.__dict__["_kiln_hooks"]
    for _, hook in hooks[1]:
        got = hook(cell, args, output)
        if got is not None:
            output = got
    if hooks[2] or hooks[3]:
        call = _backward_calls.pop(id(args), None)
        if call is not None:
            output = call.wrap_outputs(output)
    return output


def overriding_call(cell):
    """The __call__ that cell's class (a subclass written in Python) defines instead of Cell's own:
    calling the cell runs it (which may or may not reach construct through super().__call__), so a
    capture of the call must run it too; None when the class keeps Cell's. Not for a cell run
    compiled through its own set_jit_config (its __call__ routes to the compiled function, which
    runs construct)."""
    call = type(cell).__call__
    if not isinstance(call, types.FunctionType) or cell.__dict__.get("_jitted") is not None:
        return None
    return call


def call_construct_hooked(cell, construct, args, kwargs):
    """construct(*args, **kwargs) of a cell, its forward hooks around it (kiln.jit's targets, which
    call a cell's construct without Cell.__call__)."""
    if not cell.__dict__.get("_kiln_hooks"):
        return construct(*args, **kwargs)
    args = hooks_before(cell, args)
    return hooks_after(cell, args, construct(*args, **kwargs))


_C.cell_set_hook_runners(hooks_before, hooks_after)


class HookHandle(grad_hooks.RemovableHandle):
    """What a Cell's register_*hook functions return: remove() takes the hook away (MindSpore's and
    PyTorch's RemovableHandle)."""

    _next_id = 0

    def __init__(self, cell, kind):
        HookHandle._next_id += 1
        self.id, self._cell, self._kind = HookHandle._next_id, cell, kind
        super().__init__(self._take_away)

    def _take_away(self):
        hooks = self._cell.__dict__.get("_kiln_hooks")
        if hooks is None:
            return
        kept = list(hooks)
        kept[self._kind] = tuple(h for h in hooks[self._kind] if h[0] != self.id)
        # (an attribute write: graphs captured with the hook are captured again)
        self._cell._kiln_hooks = tuple(kept) if any(kept) else None
        if self._kind >= 2:  # (a function left eager by a backward hook is captured again: kiln.grad_hooks)
            grad_hooks.STATE["epoch"] += 1


class Cell(_C.CellBase):
    """Base class of layers and networks. Subclasses call super().__init__() first, assign
    Parameters and sub-Cells as attributes (they are registered in assignment order) and
    define construct(*inputs); calling the cell runs construct.

    Calling, and assigning or deleting attributes (which registers Parameters and sub-Cells and
    bumps the state version compiled graphs guard on), are kiln._C.CellBase's, in C.

    `training` is False until set_train() (MindSpore's default)."""

    def __init__(self, auto_prefix=True, flags=None):
        _object_setattr(self, "_params", OrderedDict())
        _object_setattr(self, "_cells", OrderedDict())
        _object_setattr(self, "training", False)
        _object_setattr(self, "requires_grad", False)
        _object_setattr(self, "_auto_prefix", bool(auto_prefix))
        _object_setattr(self, "_jit_config", None)
        _object_setattr(self, "_kiln_version", 0)  # bumped by attribute writes (kiln._C.CellBase)
        if flags:
            _object_setattr(self, "_flags", dict(flags))

    _recompute = False  # Cell.recompute(): read by kiln._C.CellBase's call while a capture records

    # ---- running ------------------------------------------------------------------------
    def recompute(self, mode=True, **kwargs):
        """MindSpore's Cell.recompute: in a compiled training graph (kiln.jit of a training step, or
        value_and_grad of a jitted function) the activations this cell's construct computes are
        not kept for the backward but computed again, from the cell's inputs, just before the
        backward reads them (src/passes/recompute.c; no search: the cell says what). Random ops
        (dropout) inside are never recomputed. Eagerly (while grad is enabled) each call runs as
        kiln.recompute(construct): its intermediates are dropped after the forward and the
        construct runs again in the backward, drawing the same random numbers. mode=False undoes it. MindSpore's keyword arguments
        (mp_comm_recompute, parallel_optimizer_comm_recompute, recompute_slice_activation) concern
        parallel training; they are checked and have no effect here. Returns self."""
        if not isinstance(mode, bool):
            raise TypeError(f"Cell.recompute: mode must be True or False, got {mode!r}")
        for name, value in kwargs.items():
            if name not in ("mp_comm_recompute", "parallel_optimizer_comm_recompute", "recompute_slice_activation"):
                raise TypeError(f"Cell.recompute: unexpected keyword argument {name!r}")
            if not isinstance(value, bool):
                raise TypeError(f"Cell.recompute: {name} must be True or False, got {value!r}")
        self._recompute = mode  # an attribute write: graphs compiled before are recompiled
        return self

    def construct(self, *inputs, **kwargs):
        if type(self).forward is not Cell.forward:  # a MegEngine / PyTorch style module: its forward
            return self.forward(*inputs, **kwargs)
        raise NotImplementedError(f"{type(self).__name__} must define construct() (or forward())")

    def forward(self, *inputs, **kwargs):
        """MegEngine's and PyTorch's name of construct: a Cell may define either."""
        if type(self).construct is Cell.construct:
            raise NotImplementedError(f"{type(self).__name__} must define construct() (or forward())")
        return self.construct(*inputs, **kwargs)

    def _graph_mode_jit(self):
        """kiln.jit of this cell with the default options, made once (set_context(mode=GRAPH_MODE))."""
        from ..jit.options import JitOptions

        jitted = self.__dict__.get("_graph_jitted")
        if jitted is None:
            jitted = hooks.make_jit_function(self, JitOptions.make())
            _object_setattr(self, "_graph_jitted", jitted)
        return jitted

    # ---- registration -------------------------------------------------------------------
    def insert_param_to_cell(self, param_name, param, check_name_contain_dot=True):
        """Registers param under param_name (like assigning it as an attribute)."""
        if not isinstance(param_name, str) or not param_name or (check_name_contain_dot and "." in param_name):
            raise KeyError(f"insert_param_to_cell: invalid parameter name {param_name!r}")
        if param is not None and not isinstance(param, Parameter):
            raise TypeError(f"insert_param_to_cell: expected a Parameter, got {type(param).__name__}")
        setattr(self, param_name, param)

    def insert_child_to_cell(self, child_name, child_cell):
        """Registers child_cell under child_name (like assigning it as an attribute)."""
        if not isinstance(child_name, str) or not child_name or "." in child_name:
            raise KeyError(f"insert_child_to_cell: invalid cell name {child_name!r}")
        if child_cell is not None and not isinstance(child_cell, Cell):
            raise TypeError(f"insert_child_to_cell: expected a Cell, got {type(child_cell).__name__}")
        setattr(self, child_name, child_cell)

    def update_parameters_name(self, prefix="", recurse=True):
        """Prefixes the names of this cell's parameters with prefix."""
        for p in self.get_parameters(expand=recurse):
            p.name = prefix + (p.name or "")
            p._auto_name = False

    # ---- traversal ----------------------------------------------------------------------
    def cells_and_names(self, cells=None, name_prefix=""):
        """(name, cell) for this cell ('' or name_prefix) and every sub-cell, each cell once."""
        seen = set() if cells is None else cells
        if id(self) in seen:
            return
        seen.add(id(self))
        yield name_prefix, self
        for name, cell in self._cells.items():
            if cell is None:
                continue
            yield from cell.cells_and_names(seen, f"{name_prefix}.{name}" if name_prefix else name)

    def name_cells(self):
        """The direct sub-cells by attribute name."""
        return OrderedDict((n, c) for n, c in self._cells.items() if c is not None)

    def cells(self):
        """The direct sub-cells."""
        return list(self.name_cells().values())

    def parameters_and_names(self, name_prefix="", expand=True):
        """(path, parameter) pairs such as ('layer.weight', p), each parameter once: this cell's
        own parameters, then each sub-cell's, in registration order (MindSpore's order);
        expand=False lists only this cell's own parameters."""
        seen = set()
        cells = self.cells_and_names(name_prefix=name_prefix) if expand else ((name_prefix, self),)
        for cell_name, cell in cells:
            for name, p in cell._params.items():
                if p is None or id(p) in seen:
                    continue
                seen.add(id(p))
                yield (f"{cell_name}.{name}" if cell_name else name), p

    def get_parameters(self, expand=True):
        """The parameters (recursively unless expand=False), each once."""
        for _, p in self.parameters_and_names(expand=expand):
            yield p

    def trainable_params(self, recurse=True):
        """The parameters that require gradients, in registration order."""
        return [p for p in self.get_parameters(expand=recurse) if p.requires_grad]

    def to_float(self, dst_type):
        """MindSpore's Cell.to_float: while this cell runs, every float op in it (and in the cells it
        calls, unless they set their own) takes its inputs in dst_type (float16, bfloat16, or
        float32 to keep a part of a mixed-precision network in float32: amp level O3 with that
        dtype, see kiln.amp). The parameters keep their dtype (cast where read). Returns self."""
        if dst_type not in (_C.float16, _C.bfloat16, _C.float32):
            raise TypeError(f"to_float: dst_type must be kiln.float16, kiln.bfloat16 or kiln.float32, got {dst_type!r}")
        self._amp = (3, dst_type)
        return self

    def untrainable_params(self, recurse=True):
        """The parameters that do not require gradients (e.g. BatchNorm running statistics)."""
        return [p for p in self.get_parameters(expand=recurse) if not p.requires_grad]

    def parameters_dict(self, recurse=True):
        """OrderedDict path -> parameter."""
        return OrderedDict(self.parameters_and_names(expand=recurse))

    def checkpoint_entries(self):
        """[(name, tensor)] a checkpoint of this cell holds: the parameters by path, then the state of
        every optimizer in it -- this cell's as "moment1.0", a sub-cell's under its path
        ("optimizer.moment1.0"), so saving a TrainOneStepCell keeps its optimizer's moments."""
        out = list(self.parameters_and_names())
        for path, cell in self.cells_and_names():
            state = getattr(cell, "state_for_checkpoint", None)
            if state is not None:
                out += [(f"{path}.{name}" if path else name, t) for name, t in state()]
        return out

    def state_dict(self):
        """PyTorch's spelling: OrderedDict name -> tensor of the parameters (and optimizers' state)."""
        return OrderedDict(self.checkpoint_entries())

    def load_state_dict(self, state_dict, strict=True):
        """PyTorch's spelling of load_param_into_net: returns (missing_keys, unexpected_keys); strict
        raises when either is not empty (shapes and dtypes must match in any case)."""
        missing, unexpected = load_param_into_net(self, dict(state_dict), strict_load=strict)
        return _IncompatibleKeys(missing, unexpected)

    def load_parameter_dict(self, parameter_dict, strict=True):
        """Copies values (Tensors, arrays) into the parameters of the same paths. With strict,
        missing or unexpected names raise KeyError. Returns the names not found in the dict."""
        own = self.parameters_dict()
        missing = [n for n in own if n not in parameter_dict]
        unexpected = [n for n in parameter_dict if n not in own]
        if strict and (missing or unexpected):
            raise KeyError(f"load_parameter_dict: missing {missing}, unexpected {unexpected}")
        for name, p in own.items():
            if name in parameter_dict:
                value = parameter_dict[name]
                shape = tuple(getattr(value, "shape", ()))
                if shape != p.shape:
                    raise ValueError(f"load_parameter_dict: {name} has shape {p.shape}, the value has {shape}")
                p.set_data(value)
        return missing

    def apply(self, fn):
        """Calls fn on every sub-cell (children first) and on this cell; returns self."""
        for cell in self.cells():
            cell.apply(fn)
        fn(self)
        return self

    # ---- modes and configuration --------------------------------------------------------
    def register_forward_pre_hook(self, hook_fn):
        """hook_fn(cell, inputs) runs before each call's construct, with the call's positional inputs
        as a tuple; returning something else than None replaces them. Returns a handle whose
        remove() takes the hook away. Compiled graphs that call this cell run its hooks (they are
        captured with it) and are captured again when a hook is added or removed."""
        return self._add_hook(0, hook_fn, "register_forward_pre_hook")

    def register_forward_hook(self, hook_fn):
        """hook_fn(cell, inputs, output) runs after each call's construct; returning something else
        than None replaces the output. Returns a handle whose remove() takes the hook away."""
        return self._add_hook(1, hook_fn, "register_forward_hook")

    def register_backward_pre_hook(self, hook_fn):
        """hook_fn(cell, grad_output) runs in the backward pass of each call (made while grad is on,
        with an output that requires grad) once the gradients of its outputs are known: grad_output
        is a tuple, one entry per tensor of the output (None where no gradient came); returning
        something else than None (a tuple of the same length) replaces them. Returns a handle whose
        remove() takes the hook away. PyTorch's register_full_backward_pre_hook."""
        return self._add_hook(2, hook_fn, "register_backward_pre_hook")

    def register_backward_hook(self, hook_fn):
        """hook_fn(cell, grad_input, grad_output) runs in the backward pass of each call once the
        gradients of its positional inputs are known: grad_input holds one entry per positional
        input (None for one that is no tensor or gets no gradient), grad_output as for
        register_backward_pre_hook; returning something else than None (a tuple like grad_input)
        replaces grad_input. Hooks run in the order they were added. Returns a handle whose
        remove() takes the hook away. PyTorch's register_full_backward_hook. A compiled function
        that calls the cell while it has backward hooks runs eagerly (kiln.grad_hooks)."""
        return self._add_hook(3, hook_fn, "register_backward_hook")

    register_full_backward_hook = register_backward_hook
    register_full_backward_pre_hook = register_backward_pre_hook

    def _add_hook(self, kind, hook_fn, name):
        if not callable(hook_fn):
            raise TypeError(f"Cell.{name}: the hook must be callable, got {type(hook_fn).__name__}")
        handle = HookHandle(self, kind)
        hooks = list(self.__dict__.get("_kiln_hooks") or ((), (), (), ()))
        hooks[kind] = hooks[kind] + ((handle.id, hook_fn),)
        self._kiln_hooks = tuple(hooks)  # (an attribute write: graphs captured before are captured again)
        if kind >= 2:
            grad_hooks.STATE["epoch"] += 1
        return handle

    def set_train(self, mode=True):
        """Training mode (Dropout drops, BatchNorm uses batch statistics) for this cell and
        every sub-cell; returns self."""
        for _, cell in self.cells_and_names():  # not a state version bump: compiled graphs guard on it apart
            _object_setattr(cell, "training", bool(mode))
        return self

    def train(self, mode=True):
        """MegEngine's / PyTorch's set_train; returns self."""
        return self.set_train(mode)

    def eval(self):
        """Inference mode (set_train(False)); returns self."""
        return self.set_train(False)

    # ---- PyTorch's nn.Module spellings ------------------------------------------------------------
    # kiln has no buffers apart from parameters: what PyTorch keeps as buffers (BatchNorm's running
    # statistics) are Parameters that do not require grad. parameters() lists those that do, so
    # torch.optim-style code (Adam(model.parameters())) gets what MindSpore's trainable_params() gives.

    def parameters(self, recurse=True):
        """PyTorch's parameters(): an iterator over the parameters that require grad."""
        return iter(self.trainable_params(recurse))

    def named_parameters(self, prefix="", recurse=True):
        """PyTorch's named_parameters(): (path, parameter) of those that require grad."""
        return ((n, p) for n, p in self.parameters_and_names(prefix, expand=recurse) if p.requires_grad)

    def buffers(self, recurse=True):
        """PyTorch's buffers(): the parameters that do not require grad (running statistics)."""
        return iter(self.untrainable_params(recurse))

    def named_buffers(self, prefix="", recurse=True):
        return ((n, p) for n, p in self.parameters_and_names(prefix, expand=recurse) if not p.requires_grad)

    def children(self):
        """PyTorch's children(): the direct sub-cells."""
        return iter(self.cells())

    def named_children(self):
        return iter(self.name_cells().items())

    def modules(self):
        """PyTorch's modules(): this cell and every sub-cell, each once."""
        return (cell for _, cell in self.cells_and_names())

    def named_modules(self, prefix=""):
        return iter(self.cells_and_names(name_prefix=prefix))

    def zero_grad(self, set_to_none=True):
        """PyTorch's zero_grad(): clears the .grad of every parameter."""
        for p in self.get_parameters():
            p.grad = None

    def requires_grad_(self, requires_grad=True):
        """PyTorch's requires_grad_(): sets requires_grad of every parameter; returns self."""
        for p in self.get_parameters():
            p.requires_grad = requires_grad
        return self

    def to(self, *args, **kwargs):
        """PyTorch's to(device): kiln runs on the CPU, so to("cpu") returns self. A dtype (to(dtype),
        double(), half()) is refused: kiln keeps a network's parameters in the dtype they were made
        in (mixed precision: kiln.amp, Cell.to_float)."""
        for a in list(args) + list(kwargs.values()):
            if isinstance(a, _C.dtype):
                raise TypeError(f"{type(self).__name__}.to({a}): kiln does not convert a network's parameters; "
                                f"make its layers with dtype={a}, or use kiln.amp / Cell.to_float for mixed precision")
            if a is not None and not isinstance(a, bool) and str(a) not in ("cpu", "cpu:0"):
                raise ValueError(f"{type(self).__name__}.to({a!r}): kiln runs on the CPU only")
        return self

    def cpu(self):
        return self

    def set_grad(self, requires_grad=True):
        """Marks the network as one that gradients are taken of (informational); returns self."""
        for _, cell in self.cells_and_names():
            _object_setattr(cell, "requires_grad", bool(requires_grad))
        return self

    def set_jit_config(self, jit_config):
        """Makes this cell run compiled with jit_config (a kiln.JitConfig)."""
        from ..jit.config import JitConfig

        if not isinstance(jit_config, JitConfig):
            raise TypeError(f"set_jit_config: expected a kiln.JitConfig, got {type(jit_config).__name__}")
        _object_setattr(self, "_jit_config", jit_config)
        _object_setattr(self, "_jitted", hooks.make_jit_function(self, jit_config.jit_options()))
        return self

    def get_jit_config(self):
        """The JitConfig given to set_jit_config, or None."""
        return self.__dict__.get("_jit_config")

    # ---- printing -----------------------------------------------------------------------
    def extend_repr(self):
        """Extra text shown inside this cell's repr."""
        return ""

    def __repr__(self):
        lines = []
        extra = self.extend_repr()
        if extra:
            lines += extra.split("\n")
        for name, cell in self.name_cells().items():
            sub = repr(cell).split("\n")
            lines.append(f"({name}): " + "\n  ".join(sub))
        body = type(self).__name__ + "<"
        if not lines:
            return body + ">"
        if len(lines) == 1 and not self._cells:
            return body + lines[0] + ">"
        return body + "\n  " + "\n  ".join(lines) + "\n  >"


_IncompatibleKeys = namedtuple("IncompatibleKeys", "missing_keys unexpected_keys")


class _CellContainer(Cell):
    """Shared bookkeeping of SequentialCell and CellList: children named '0', '1', ..."""

    def __init__(self):
        super().__init__()
        _object_setattr(self, "_list", [])

    def _set_list(self, cells):
        for c in cells:
            if not isinstance(c, Cell):
                raise TypeError(f"{type(self).__name__}: expected Cells, got {type(c).__name__}")
        for name in list(self._cells):
            if name.isdigit():
                delattr(self, name)
        _object_setattr(self, "_list", [])
        for i, c in enumerate(cells):
            setattr(self, str(i), c)
            self._list.append(c)

    def __len__(self):
        return len(self._list)

    def __iter__(self):
        return iter(self._list)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return type(self)(self._list[index])
        if not isinstance(index, int):
            raise TypeError(f"{type(self).__name__} indices must be ints or slices, got {type(index).__name__}")
        return self._list[index]

    def __setitem__(self, index, cell):
        cells = list(self._list)
        cells[index] = cell
        self._set_list(cells)

    def __delitem__(self, index):
        cells = list(self._list)
        del cells[index]
        self._set_list(cells)

    def append(self, cell):
        """Adds cell at the end; returns self."""
        if not isinstance(cell, Cell):
            raise TypeError(f"{type(self).__name__}.append: expected a Cell, got {type(cell).__name__}")
        setattr(self, str(len(self._list)), cell)
        self._list.append(cell)
        return self

    def extend(self, cells):
        """Adds each of cells at the end; returns self."""
        for c in cells:
            self.append(c)
        return self

    def insert(self, index, cell):
        """Inserts cell before index."""
        cells = list(self._list)
        cells.insert(index, cell)
        self._set_list(cells)


class SequentialCell(_CellContainer):
    """SequentialCell(cell0, cell1, ...) or SequentialCell([cells]) or SequentialCell(OrderedDict):
    runs the cells one after another, each on the previous one's output."""

    def __init__(self, *args):
        super().__init__()
        if len(args) == 1 and isinstance(args[0], (dict, OrderedDict)):
            for name, c in args[0].items():
                if not isinstance(c, Cell):
                    raise TypeError(f"SequentialCell: expected Cells, got {type(c).__name__} for {name!r}")
                setattr(self, name, c)
                self._list.append(c)
        elif len(args) == 1 and isinstance(args[0], (list, tuple)):
            self._set_list(list(args[0]))
        else:
            self._set_list(list(args))

    def construct(self, x):
        for cell in self._list:
            x = cell(x)
        return x


class CellList(_CellContainer):
    """A list of Cells, registered as sub-cells '0', '1', ... (it has no construct of its own)."""

    def __init__(self, cells=None):
        super().__init__()
        if cells is not None:
            self._set_list(list(cells))

    def construct(self, *inputs):
        raise NotImplementedError("CellList has no construct(); iterate over it instead")


class WithLossCell(Cell):
    """loss_fn(backbone(data), label): a network returning its loss."""

    def __init__(self, backbone, loss_fn):
        super().__init__(auto_prefix=False)
        self._backbone = backbone
        self._loss_fn = loss_fn

    def construct(self, data, label):
        return self._loss_fn(self._backbone(data), label)

    @property
    def backbone_network(self):
        return self._backbone


class TrainOneStepCell(Cell):
    """Calling it runs network(*inputs), takes the gradients of that loss with respect to the
    optimizer's parameters, applies the optimizer and returns the loss.

    In data-parallel mode (kiln.set_auto_parallel_context(parallel_mode="data_parallel"), decided
    when it is made) the gradients are all-reduced across the ranks before the optimizer runs
    (averaged with gradients_mean=True; fused into buckets, kiln.nn.grad_reduce), and with
    parameter_broadcast=True rank 0's parameters are first copied to every rank."""

    def __init__(self, network, optimizer, sens=1.0):
        super().__init__(auto_prefix=False)
        from ..autograd import value_and_grad

        self.network = network
        self.optimizer = optimizer
        self.sens = float(sens)
        self.weights = tuple(optimizer.parameters)
        self._grad_fn = value_and_grad(self._scaled, None, self.weights)
        self._reducer = None
        if _context.data_parallel():
            from . import grad_reduce

            if not _C.comm_initialized():
                raise RuntimeError("TrainOneStepCell: data_parallel mode needs communication: call "
                                   "kiln.communication.init() first")
            mean = _context.get_auto_parallel_context("gradients_mean")
            splits = _context.get_auto_parallel_context("all_reduce_fusion_config")
            if _C.comm_size() > 1:  # one rank: nothing to reduce, the step is stand-alone's
                self._reducer = lambda grads: grad_reduce.reduce_gradients(grads, mean, split_indices=splits)
            if _context.get_auto_parallel_context("parameter_broadcast"):
                grad_reduce.broadcast_parameters(self.weights)

    def _scaled(self, *inputs):
        loss = self.network(*inputs)
        return loss * self.sens if self.sens != 1.0 else loss

    def construct(self, *inputs):
        loss, grads = self._grad_fn(*inputs)
        if self._reducer is not None:
            grads = self._reducer(grads)
        self.optimizer(grads)
        return loss / self.sens if self.sens != 1.0 else loss


def load_param_into_net(net, parameter_dict, strict_load=False):
    """Copies the entries of parameter_dict (name -> tensor or array) into the parameters of net with
    those names (and into an optimizer's state, when net is one or holds one). Returns
    (param_not_load, ckpt_not_load): net's parameters no entry matched, and entries no parameter
    took. A shape or dtype that differs raises ValueError naming the parameter; strict_load also
    refuses names that do not match."""
    if not isinstance(net, Cell):
        raise TypeError(f"load_param_into_net: net must be a Cell, got {type(net).__name__}")
    if not isinstance(parameter_dict, dict):
        raise TypeError(f"load_param_into_net: parameter_dict must be a dict, got {type(parameter_dict).__name__}")
    targets = dict(net.checkpoint_entries())
    param_not_load = [n for n in targets if n not in parameter_dict]
    ckpt_not_load = [n for n in parameter_dict if n not in targets]
    if strict_load and (param_not_load or ckpt_not_load):
        raise ValueError(f"load_param_into_net: strict_load: parameters without an entry {param_not_load}, "
                         f"entries without a parameter {ckpt_not_load}")
    for name, p in targets.items():
        if name not in parameter_dict:
            continue
        v = parameter_dict[name]
        if not isinstance(v, _C.TensorBase):
            v = _tensor.Tensor(np.asarray(v))
        if tuple(v.shape) != tuple(p.shape):
            raise ValueError(f"load_param_into_net: {name!r} has shape {list(p.shape)} in the net, {list(v.shape)} "
                             "in the checkpoint")
        if v.dtype != p.dtype:
            if v.dtype.is_floating_point and p.dtype.is_floating_point:
                v = v.astype(p.dtype)
            else:
                raise ValueError(f"load_param_into_net: {name!r} is {p.dtype.name} in the net, {v.dtype.name} in the "
                                 "checkpoint")
        if hasattr(p, "set_data"):
            p.set_data(v)
        else:
            p[...] = v
    return param_not_load, ckpt_not_load
