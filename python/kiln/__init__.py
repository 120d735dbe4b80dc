"""kiln: a deep-learning runtime and just-in-time graph compiler with a C11 core."""
import os as _os

from . import _gemm_cache

# OpenBLAS picks its kernels when it loads (with the extension, next line): the AVX2 ones where
# kiln's calibration found them faster on this CPU (kiln.gemm_select), unless the user chose.
_coretype = _gemm_cache.coretype_before_load()
if _coretype:
    _os.environ["OPENBLAS_CORETYPE"] = _coretype
from . import _C  # noqa: E402
from ._C import bfloat16, bool, float16, float32, float64, int8, int32, int64  # noqa: A004
from ._C import dtype
from ._tensor import Tensor, from_dlpack, from_numpy, tensor
from . import ops
from .autograd import (GradOperation, enable_grad, get_grad, grad, is_grad_enabled, no_grad, set_grad_enabled,
                       value_and_grad)
from .derivatives import hessian, jacfwd, jvp, linearize, vjp
from . import nn
from .nn import Parameter, ParameterTuple
from .jit import JitConfig, JitSyntaxError, disable_jit
from . import jit  # the package, callable as MindSpore's jit (see kiln/jit/__init__.py)
from .jit import trace, TraceMismatchError, SublinearMemoryConfig
from .jit.deploy import load
from .jit.export import export
from .jit.dynamic import mark_dynamic, mark_static
from .jit.mutable import mutable
from .jit import replay as _replay
from .context import GRAPH_MODE, LAX, PYNATIVE_MODE, STRICT, get_context, set_context, wait_compiles
from .context import get_deterministic, set_deterministic
from .config import show_config
from .serialization import CheckpointError, load_checkpoint, load_param_into_net, save_checkpoint
from . import autodiff, common, dataset, optim, profiler, tools, tree, tree_util
from .recomputation import recompute
checkpoint = remat = recompute  # JAX's names (checkpoint files: kiln.serialization)
from .batching import VmapFallbackWarning, jacrev, vmap
from .context import ParallelMode, get_auto_parallel_context, reset_auto_parallel_context, set_auto_parallel_context
from . import communication, distributed
from . import amp
from .amp import torch_autocast as autocast

float_ = float32
int_ = int64
bool_ = bool

# PyTorch's top-level tensor functions (kiln.zeros, kiln.cat, ...): kiln.ops' own, named once in
# kiln.toplevel's table; the creation functions also take requires_grad= and device=
from .toplevel import NAMES as _TOPLEVEL_NAMES  # noqa: E402

globals().update({_n: _f for _n, _f in _TOPLEVEL_NAMES.items() if _n not in globals()})

from .version import __version__  # noqa: E402
from . import gemm_select  # noqa: E402

gemm_select.startup(_coretype)


_seed = None


def _seeded_while_recording(name):
    """A seed set by the function being compiled: a graph replays the random draws but never this
    Python call, so later calls would draw on from where the last one stopped instead of from the
    seed. The recording running on this thread (if any) is not replayed: the function runs eagerly
    (inside a bytecode piece, that part runs in Python)."""
    _replay.mark_not_replayable(f"kiln.{name} inside the function (a compiled graph would not seed the "
                                "generator again at later calls)")


def manual_seed(seed):
    """Seeds the generator behind rand, randn, normal, uniform and dropout."""
    _seeded_while_recording("manual_seed")
    _C.manual_seed(int(seed))


def set_seed(seed):
    """MindSpore's global seed: seeds kiln's generator (rand, randn, dropout, initializers) and
    NumPy's global one (numpy.random), as mindspore.set_seed does. seed: an int in [0, 2**32)."""
    global _seed
    import builtins

    if type(seed) is builtins.bool or not isinstance(seed, builtins.int) or not 0 <= seed < 2 ** 32:
        raise ValueError(f"set_seed: seed must be an int in [0, 2**32), got {seed!r}")
    import numpy

    _seeded_while_recording("set_seed")
    _C.manual_seed(seed)
    numpy.random.seed(seed)
    dataset.config.set_seed(seed)  # (shuffles and random samplers too)
    _seed = seed


def get_seed():
    """The seed set_seed was given last, or None."""
    return _seed


def device(type="cpu", index=None):
    """PyTorch's torch.device: kiln runs on the CPU, so "cpu" (or "cpu:0") is the only device; it is
    returned as the string "cpu", which every device= of kiln takes."""
    name = str(type) if index is None else f"{type}:{index}"
    if name not in ("cpu", "cpu:0"):
        raise ValueError(f"kiln.device({name!r}): kiln runs on the CPU only")
    return "cpu"


def set_num_threads(n):
    """Number of threads kernels may use: an int from 1 to 1024 (KILN_MAX_THREADS); anything else
    raises (TypeError for a non-int, ValueError out of range) and changes nothing."""
    _C.set_num_threads(n)


def get_num_threads():
    return _C.get_num_threads()


def _star_names():
    """`from kiln import *` brings every public name but the top-level functions named like Python's
    builtins (kiln.sum, kiln.max, kiln.abs, ...): those would silently replace sum() and max()."""
    import builtins

    shadowing = {n for n in _TOPLEVEL_NAMES if hasattr(builtins, n)}
    return sorted(n for n in globals() if not n.startswith("_") and n not in shadowing)


__all__ = _star_names()
