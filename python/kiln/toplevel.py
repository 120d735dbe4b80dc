"""kiln's top-level tensor functions -- kiln.zeros, kiln.cat, kiln.randn, ... -- where PyTorch users
reach for them first (torch.zeros, torch.cat): one table of kiln.ops' names, no copies.

NAMES maps each name to what kiln/__init__.py binds it to:
- the functions of SAME are kiln.ops' own (kiln.cat is kiln.ops.cat), so kiln.jit captures them
  as it captures kiln.ops and their errors name them the same way;
- those of CREATION are kiln.ops' creation functions wrapped once to take PyTorch's keywords
  requires_grad= (the result is a leaf that requires grad; inside a compiled function the call then
  runs eagerly, as compiled results do not require grad) and device= (None or "cpu": kiln runs
  on the CPU), besides dtype=, which kiln.ops' versions take themselves.
Names the package already binds to something else keep their meaning (kiln.trace is MegEngine's
trace, kiln.grad MindSpore's autodiff, kiln.load a deployed model); kiln.tensor, kiln.from_numpy
and kiln.manual_seed are defined with Tensor and the generator."""
import functools

from . import ops
from ._tensor import requiring_grad

SAME = (
    # joining, splitting, reshaping, indexing
    "cat", "concat", "stack", "hstack", "vstack", "split", "chunk", "unbind", "reshape", "flatten", "transpose",
    "permute", "squeeze", "unsqueeze", "movedim", "gather", "index_select", "narrow", "masked_fill", "where", "flip",
    "roll", "tril", "triu", "diag", "take_along_dim", "broadcast_to", "tile", "repeat_interleave", "nonzero", "unique",
    # arithmetic, comparison, elementwise functions
    "add", "sub", "mul", "div", "neg", "pow", "abs", "sign", "exp", "log", "log1p", "expm1", "sqrt", "rsqrt", "sin",
    "cos", "tanh", "sigmoid", "relu", "erf", "floor", "ceil", "round", "clamp", "clip", "maximum", "minimum", "lerp",
    "addcmul", "addcdiv", "eq", "ne", "lt", "le", "gt", "ge", "isnan", "isinf", "isfinite", "allclose", "isclose",
    "logical_and", "logical_or", "logical_not", "nan_to_num",
    # reductions, scans, sorting
    "sum", "mean", "prod", "std", "var", "max", "min", "amax", "amin", "argmax", "argmin", "all", "any",
    "logsumexp", "cumsum", "cumprod", "topk", "sort", "argsort", "softmax", "log_softmax",
    # products
    "matmul", "bmm", "einsum", "outer", "dot", "cdist", "kron",
    # random draws (the generator kiln.manual_seed seeds)
    "multinomial", "bernoulli",
)

CREATION = ("zeros", "ones", "full", "empty", "zeros_like", "ones_like", "full_like", "empty_like", "arange",
            "linspace", "eye", "rand", "randn", "rand_like", "randn_like", "randint", "randperm")


def check_device(name, device):
    """PyTorch's device= of a creation function: None or the CPU (kiln runs on the CPU)."""
    if device is not None and str(device) not in ("cpu", "cpu:0"):
        raise ValueError(f"kiln.{name}: device={device!r}: kiln runs on the CPU only (device=None or 'cpu')")


def with_torch_keywords(fn, name):
    """fn (a kiln.ops creation function) also taking requires_grad= and device=."""

    @functools.wraps(fn)
    def create(*args, requires_grad=False, device=None, **kwargs):
        check_device(name, device)
        t = fn(*args, **kwargs)
        return requiring_grad(t, name) if requires_grad else t

    return create


NAMES = {name: getattr(ops, name) for name in SAME}
NAMES.update({name: with_torch_keywords(getattr(ops, name), name) for name in CREATION})
