"""Reverse-mode autodiff, MindSpore style: grad, value_and_grad, no_grad."""
import functools
import threading

from . import _C, grad_hooks, hooks, tree_util
from .grad_mode import enable_grad, is_grad_enabled, no_grad, set_grad_enabled  # noqa: F401 (kiln.autograd's API)


def _positions(grad_position, nargs):
    if grad_position is None:
        return ()
    single = isinstance(grad_position, int)
    pos = (grad_position,) if single else tuple(grad_position)
    for p in pos:
        if not isinstance(p, int) or not -nargs <= p < nargs:
            raise ValueError(f"grad: grad_position {grad_position!r} is out of range for {nargs} arguments")
    return tuple(p % nargs for p in pos), single


def _weights_list(weights):
    if weights is None:
        return None, False
    if isinstance(weights, _C.TensorBase):
        return [weights], True
    if hasattr(weights, "trainable_params"):
        return list(weights.trainable_params()), False
    return list(weights), False


class _Nesting(threading.local):
    """grad_nesting: the depth of grad calls (and GradManagers recording) running their function on
    this thread; setting it tells kiln's C fast path of compiled calls whether code runs inside one
    (kiln._C.JitDispatcher: an entry whose results get a refusing node then leaves the call to Python)."""

    def __init__(self):
        self._depth = 0

    @property
    def depth(self):
        return self._depth

    @depth.setter
    def depth(self, value):
        self._depth = value
        _C.JitDispatcher._set_differentiating(value > 0)


grad_nesting = _Nesting()  # depth of grad calls running their function on this thread


def differentiating():
    """Whether code runs inside a grad / value_and_grad call (its results will be differentiated)."""
    return grad_nesting._depth > 0  # (the field: its property sets C's flag too)


hooks.differentiating = differentiating


def gradient_of_gradient_possible():
    """Whether code runs inside a grad's function that itself runs inside another grad's function:
    the inner gradient is then made differentiable (create_graph), so what runs here may be
    differentiated twice."""
    return getattr(grad_nesting, "depth", 0) >= 2 and is_grad_enabled()


def _output_tensors(out, into):
    """The tensors of a (pytree) output, in tree_util's order."""
    into.extend(x for x in tree_util.tree_leaves(out) if isinstance(x, _C.TensorBase))
    return into


def value_and_grad_on_tape(fn, grad_position, weights, has_aux, args, kwargs, sens_param=False, return_ids=False,
                           all_inputs=False, allow_int=False):
    """(fn's value, its gradients) as MindSpore computes them: the gradient of the sum of every
    tensor fn returns (with has_aux, of its first output only), each non-scalar output weighted by
    ones, or by the sensitivity given as the last positional argument (sens_param: one tensor per
    differentiated output, in the same structure). all_inputs: differentiate every Tensor argument
    (GradOperation(get_all=True); a non-float one gets zeros)."""
    Tensor = _C.tensor_class()  # kiln.Tensor (a subclass of it, a Parameter, keeps its identity)

    sens = None
    if sens_param:
        if not args:
            raise TypeError("GradOperation: with sens_param=True the last positional argument must be the sens")
        args, sens = args[:-1], args[-1]
    nargs = len(args)
    if all_inputs:
        grad_position = tuple(k for k, a in enumerate(args) if isinstance(a, _C.TensorBase))
    if grad_position is None and weights is None:
        raise ValueError("grad: grad_position and weights cannot both be None")
    pos, single = _positions(grad_position, nargs) if grad_position is not None else ((), False)
    args = list(args)
    leaves, defs = [], []  # the differentiated tensors (None: a zero gradient), each argument's treedef
    for p in pos:
        a = args[p]
        if all_inputs:
            tensors, treedef = [a], None
        else:
            tensors, treedef = tree_util.tree_flatten(a)
        defs.append((treedef, tensors))
        paths = None if treedef is None or treedef.num_nodes == 1 else treedef.leaf_paths()
        for k, t in enumerate(tensors):
            leaf = _differentiable(t, p, paths and paths[k], all_inputs or allow_int, Tensor)
            leaves.append(leaf)
            if leaf is not None:
                tensors[k] = leaf
        args[p] = tensors[0] if treedef is None else treedef.unflatten(tensors)
    wlist, wsingle = _weights_list(weights)
    depth = getattr(grad_nesting, "depth", 0)
    grad_nesting.depth = depth + 1
    try:
        with enable_grad():
            out = fn(*args, **kwargs)
    finally:
        grad_nesting.depth = depth
    if has_aux:
        if not isinstance(out, tuple) or len(out) < 2:
            raise ValueError("grad: with has_aux=True the function must return a tuple (output, aux, ...)")
        value, differentiated = out, out[0]
    else:
        value = differentiated = out
    outputs = _output_tensors(differentiated, [])
    if not outputs:
        raise TypeError(f"grad: the function must return a Tensor (or tensors), got {type(differentiated).__name__}")
    if sens is not None:
        souts = _output_tensors(sens, [])
        if len(souts) != len(outputs) or (isinstance(differentiated, _C.TensorBase)
                                          != isinstance(sens, _C.TensorBase)):
            raise ValueError(f"GradOperation: the sens must have the structure of the output: "
                             f"{len(outputs)} tensor(s), got {len(souts)}")
        for k, (o, s) in enumerate(zip(outputs, souts)):
            if tuple(o.shape) != tuple(s.shape):
                raise ValueError(f"GradOperation: sens {k} has shape {list(s.shape)}, "
                                 f"the output has shape {list(o.shape)}")
    else:
        souts = [None] * len(outputs)
    pairs = [(o, s) for o, s in zip(outputs, souts) if o.requires_grad]
    targets = [t for t in leaves if t is not None] + (wlist or [])
    if not pairs or not targets:
        grads = tuple(_zeros_like(t) for t in targets)
    else:
        gouts = None if sens is None else [s for _, s in pairs]
        # inside another grad's function the gradients must be differentiable themselves
        grads = _C.grad([o for o, _ in pairs], targets, gouts, depth > 0 and is_grad_enabled())
        grads = tuple(g if g is not None else _zeros_like(t) for g, t in zip(grads, targets))
    it = iter(grads)
    inputs = iter(leaves)
    gin = []
    for p, (treedef, tensors) in zip(pos, defs):
        if treedef is None:  # (all_inputs) a Tensor argument: a non-float one gets zeros of its dtype
            gin.append(next(it) if next(inputs) is not None else _zeros_like(tensors[0]))
            continue
        gs = [next(it) if next(inputs) is not None else _zero_grad(t) for t in tensors]
        gin.append(treedef.unflatten(gs))  # the argument's own pytree type
    gin = tuple(gin)
    gw = tuple(it)
    if return_ids:
        gin = tuple(zip(pos, gin))
        gw = tuple(zip((w.name if getattr(w, "name", None) is not None else k for k, w in enumerate(wlist or [])),
                       gw))
    if grad_position is not None and single:
        gin = gin[0]
    if weights is not None and wsingle:
        gw = gw[0]
    if grad_position is None:
        result = gw
    elif weights is None:
        result = gin
    else:
        result = (gin, gw)
    return value, result


def _differentiable(a, position, leaf, allow_int, Tensor):
    """The tensor a (argument `position`, at path `leaf` in it when the argument is a pytree)
    made a leaf that records its gradient; None for an integer or bool tensor whose gradient is
    zeros (allow_int)."""
    where = f"argument {position}" + (f" (its leaf {leaf})" if leaf is not None else "")  # e.g. its leaf ['w'][0]
    if not isinstance(a, _C.TensorBase):
        raise TypeError(f"grad: {where} must be a Tensor (or a pytree of Tensors) to be differentiated, "
                        f"got {type(a).__name__}")
    if not a.dtype.is_floating_point:
        if allow_int:
            return None  # no gradient: zeros
        raise TypeError(f"grad: {where} has dtype {a.dtype}; only float tensors have gradients (pass "
                        f"allow_int=True for a zero float32 gradient of integer and bool inputs)")
    if a.requires_grad or (isinstance(a, Tensor) and type(a) is not Tensor):
        return a  # already tracked (e.g. inside an outer grad), or a Parameter keeping its identity
    leaf = a.detach()
    leaf.requires_grad = True
    if grad_hooks.has_hooks(a):  # (a leaf's hooks see the gradient of its copy)
        grad_hooks.copy_hooks(a, leaf)
    return leaf


def _zero_grad(t):
    """The gradient of an input that has none: zeros of its shape, float32 for an integer or bool
    input (allow_int; JAX's float0 has no storage, which kiln's tensors have not either)."""
    from .ops.array import zeros

    return zeros(tuple(t.shape), dtype=t.dtype if t.dtype.is_floating_point else _C.float32)


def _zeros_like(t):
    from .ops.array import zeros_like

    return zeros_like(t)


def grad(fn, grad_position=0, weights=None, has_aux=False, return_ids=False, allow_int=False):
    """A function returning the gradients of fn's output with respect to the arguments at
    grad_position and/or the given weights (Parameters or a Cell), as MindSpore's grad: a function
    returning several tensors (a tuple, list or dict, nested) is differentiated as the sum of them
    all, each non-scalar output with a gradient of ones. With has_aux fn returns (output, aux, ...),
    only its first output is differentiated, and grad returns (gradients, the tuple of the other
    outputs). return_ids: each gradient is paired with its identifier, (position, gradient) for an
    input and (parameter name, gradient) for a weight (see get_grad).

    An argument at grad_position may be a pytree of tensors (kiln.tree_util): its gradient is the
    pytree of the same type with each leaf's gradient. allow_int=True: integer and bool tensors
    there are allowed, their gradient zeros of their shape in float32 (JAX gives float0, a dtype
    without storage; kiln has none, and float32 zeros add into optimizer updates harmlessly)."""
    _check_flags(has_aux=has_aux, return_ids=return_ids, allow_int=allow_int)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        value, grads = _value_and_grads(fn, grad_position, weights, has_aux, args, kwargs, return_ids=return_ids,
                                        allow_int=allow_int)
        if has_aux:  # (gradients, the outputs after the first, as a tuple)
            return grads, tuple(value[1:])
        return grads

    wrapper._kiln_grad_of = fn
    return wrapper


def value_and_grad(fn, grad_position=0, weights=None, has_aux=False, return_ids=False, allow_int=False):
    """Like grad, but the function returns (fn's value, gradients); the value is everything fn
    returned (with has_aux too)."""
    _check_flags(has_aux=has_aux, return_ids=return_ids, allow_int=allow_int)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return _value_and_grads(fn, grad_position, weights, has_aux, args, kwargs, return_ids=return_ids,
                                allow_int=allow_int)

    wrapper._kiln_grad_of = fn
    return wrapper


def _check_flags(**flags):
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise TypeError(f"grad: {name} must be True or False, got {value!r}")


def get_grad(gradients, identifier):
    """The gradient that grad / value_and_grad(..., return_ids=True) returned for identifier: an
    argument position (int) or a Parameter (found by its name)."""
    if isinstance(identifier, bool) or not isinstance(identifier, (int, _C.TensorBase)):
        raise TypeError(f"get_grad: identifier must be an argument position (int) or a Parameter, "
                        f"got {type(identifier).__name__}")
    if isinstance(identifier, _C.TensorBase):
        key = getattr(identifier, "name", None)
        if key is None:
            raise ValueError("get_grad: the Parameter has no name to find its gradient by")
    else:
        key = identifier
    found = _find_grad(gradients, key, isinstance(identifier, int))
    if found is None:
        raise ValueError(f"get_grad: no gradient for {identifier if isinstance(identifier, int) else key!r} "
                         "in the gradients (were they computed with return_ids=True?)")
    return found


def _find_grad(node, key, positional):
    if not isinstance(node, tuple):
        return None
    if len(node) == 2 and isinstance(node[1], _C.TensorBase) and not isinstance(node[0], (tuple, _C.TensorBase)):
        ident = node[0]
        if positional == (isinstance(ident, int) and not isinstance(ident, bool)) and ident == key:
            return node[1]
        return None
    for sub in node:
        g = _find_grad(sub, key, positional)
        if g is not None:
            return g
    return None


class GradOperation:
    """MindSpore's GradOperation(get_all=False, get_by_list=False, sens_param=False): a higher-order
    function; GradOperation(...)(fn[, weights]) returns the function computing fn's gradients.
    Without get_all and get_by_list: the gradient with respect to the first argument; get_all: a
    tuple of gradients, one per Tensor argument; get_by_list: a tuple of gradients, one per weight
    (a list or ParameterTuple of Parameters, or a Cell's trainable parameters); both: (input
    gradients, weight gradients). fn's outputs are all differentiated (the gradient of their sum);
    sens_param: the call takes one more positional argument, the sensitivity (the gradient of the
    output, one tensor per output tensor in the output's structure) instead of ones."""

    def __init__(self, get_all=False, get_by_list=False, sens_param=False):
        for name, value in (("get_all", get_all), ("get_by_list", get_by_list), ("sens_param", sens_param)):
            if not isinstance(value, bool):
                raise TypeError(f"GradOperation: {name} must be True or False, got {value!r}")
        self.get_all, self.get_by_list, self.sens_param = get_all, get_by_list, sens_param

    def __call__(self, fn, weights=None):
        if not callable(fn):
            raise TypeError(f"GradOperation: expected a function or a Cell, got {type(fn).__name__}")
        if self.get_by_list and weights is None:
            raise ValueError("GradOperation(get_by_list=True): give the weights, as GradOperation(...)(fn, weights)")
        if not self.get_by_list and weights is not None:
            raise ValueError("GradOperation: weights are only taken with get_by_list=True")
        if weights is not None:
            weights = weights if hasattr(weights, "trainable_params") else list(
                [weights] if isinstance(weights, _C.TensorBase) else weights)
        get_all, sens_param = self.get_all, self.sens_param
        position = None if self.get_by_list and not get_all else 0

        def grad_fn(*args, **kwargs):
            if position == 0 and not get_all and (len(args) - sens_param) < 1:
                raise TypeError("GradOperation: the function has no argument to differentiate")
            _, grads = _value_and_grads(fn, position, weights, False, args, kwargs, sens_param=sens_param,
                                        all_inputs=get_all)
            return grads

        functools.update_wrapper(grad_fn, fn, updated=())
        grad_fn._kiln_grad_of = fn
        return grad_fn

    def __repr__(self):
        return (f"GradOperation(get_all={self.get_all}, get_by_list={self.get_by_list}, "
                f"sens_param={self.sens_param})")


def jitted_of(fn):
    """The kiln.jit function behind fn (fn itself, or a Cell's JitConfig one), or None."""
    return fn if hooks.is_jit_function(fn) else getattr(fn, "__dict__", {}).get("_jitted")


def differentiates_by_pieces(fn):
    """Whether fn (a Python function) is a grad / value_and_grad of a jitted function whose gradients come from its
    compiled pieces on the eager tape (capture_mode="bytecode" with graph breaks): a capture around
    it must call it in Python (a graph break) rather than trace through it."""
    inner = fn.__dict__.get("_kiln_grad_of")
    jitted = None if inner is None else jitted_of(inner)
    return jitted is not None and jitted._grad_through_pieces()


def _value_and_grads(fn, grad_position, weights, has_aux, args, kwargs, **how):
    if not _C.is_tracing():
        jitted = jitted_of(fn)
        if jitted is not None and jitted._grad_through_pieces():
            # bytecode capture with graph breaks: each compiled piece records one node on the tape, its
            # backward compiled with it, and the Python between pieces is recorded as eager code is
            return value_and_grad_on_tape(fn, grad_position, weights, has_aux, args, kwargs, **how)
        if jitted is not None:  # a jitted function, or a Cell given a JitConfig
            # forward and backward compiled together as one graph
            return jitted._grad_variant(grad_position, weights, has_aux, **how)(*args, **kwargs)
    return value_and_grad_on_tape(fn, grad_position, weights, has_aux, args, kwargs, **how)
