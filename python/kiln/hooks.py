"""What lower modules of kiln reach of higher ones, registered by the higher module when it is
imported (modules import only modules of their own layer and below: tools/check_layers.py,
PY_LAYERS; kiln/__init__.py imports every layer at start-up)."""

# The class of kiln.jit's functions (kiln.jit.function.JitFunction, set by that module). autograd
# differentiates a jitted function through its compiled graph, a Cell given a JitConfig (or run in
# GRAPH_MODE) makes one, and the capture modes tell a jitted function called inside another apart.
jit_function_class = None


def is_jit_function(obj):
    """Whether obj is a kiln.jit function (a JitFunction)."""
    return jit_function_class is not None and isinstance(obj, jit_function_class)


def make_jit_function(fn, options):
    """kiln.jit's function of fn compiled with options (a JitOptions)."""
    if jit_function_class is None:
        raise RuntimeError("kiln.jit is not imported: import kiln first")
    return jit_function_class(fn, options)


# Notes a 0-d tensor that stands for a Python number of a type (int, float, bool) while a capture
# records, so the capture returns it as that number (set by kiln.jit.ast_runtime; kiln.ops' loops
# carry Python numbers as 0-d tensors when compiled).
note_number = None


# Whether code runs inside a grad / value_and_grad call, whose results will be differentiated
# (kiln.autograd.differentiating, set by that module): a loop recorded there stores its residuals
# for the gradient as it runs (kiln.ops.control_flow).
differentiating = None


# kiln.vmap and kiln.jacrev (kiln.batching, set by that module): kiln.jacfwd maps the forward-mode
# pass over the input basis with vmap, kiln.hessian is jacfwd of jacrev. vmap_refusals: the
# exceptions of what vmap refuses and a loop of calls handles (control flow, a value read into
# Python: kiln.batching.VmapControlFlowError, VmapValueReadError).
vmap = None
jacrev = None
vmap_refusals = None


def batching(name):
    """kiln.batching's `name` (vmap, jacrev or vmap_refusals), registered when kiln is imported."""
    fn = globals()[name]
    if fn is None:
        raise RuntimeError(f"kiln.{name} is not imported: import kiln first")
    return fn
