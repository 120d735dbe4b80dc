"""kiln.ops: the functional namespace, one function per op of the table (and a few composites)."""
from .array import (arange, broadcast_to, cat, chunk, concat, contiguous, embedding, empty, empty_like, expand,
                    expand_dims, eye, flatten, full, full_like, gather, gather_elements, index_add, index_select,
                    linspace, narrow, normal, ones, ones_like, permute, rand, randn, reshape, scatter_add, split,
                    squeeze, stack, swapaxes, transpose, uniform, unsqueeze, view, zeros, zeros_like)
from .math import (abs, add, all, amax, amin, any, argmax, argmin, cast, clamp, clip, cos, div, divide, eq, equal,
                   erf, exp, floor_div, floor_divide, floor_mod, ge, gelu, greater, greater_equal, gt, le, less,
                   less_equal, log, log_softmax, mod, remainder, ceil, expm1, fix, floor, isfinite, isinf, isnan,
                   log1p, round, trunc, tan, asin, arcsin, acos, arccos, atan, arctan, sinh, cosh, asinh, arcsinh,
                   acosh, arccosh, atanh, arctanh, log2, log10, exp2, fmod, atan2, arctan2, hypot, logaddexp,
                   logical_and, logical_not, logical_or, lt, max, maximum, mean, min, minimum, mul, multiply, ne,
                   neg, not_equal, pow, prod, reciprocal, relu, rsqrt, sigmoid, sign, silu, sin, softmax, sqrt,
                   square, std, sub, subtract, sum, tanh, true_divide, var, where, bitwise_and, bitwise_or,
                   bitwise_xor, bitwise_left_shift, bitwise_right_shift, left_shift, right_shift, invert, bitwise_not)
from .nn_functional import (avg_pool2d, batch_norm, conv2d, dense, dropout, layer_norm, linear, matmul,
                            max_pool2d, rms_norm, scaled_dot_product_attention, stop_gradient)
from .conv_transpose import conv3d, conv_transpose2d
from .interpolate import adaptive_max_pool2d, interpolate
from .array_extra import flip, gather_nd, masked_fill, one_hot, pad, roll, scatter, tril, triu
from .linalg import bmm, einsum, norm
from .data_dependent import argwhere, isin, masked_select, nonzero, unique
from .losses import (binary_cross_entropy_with_logits, cross_entropy, kl_div, l1_loss, mse_loss, nll_loss,
                     smooth_l1_loss)
from .activations import (celu, elu, glu, hardsigmoid, hardswish, hardtanh, leaky_relu, logit, mish, prelu, relu6,
                          selu, softplus, softsign)
from .math_extra import (addcdiv, addcmul, allclose, clamp_max, clamp_min, count_nonzero, cummax, cummin, diff,
                         isclose, lerp, logical_xor, logsumexp, nan_to_num, std_mean, var_mean)
from .array_more import (diag, hstack, movedim, moveaxis, ravel, rot90, take_along_dim, tril_indices, triu_indices,
                         unbind, vstack)
from .linalg_extra import (addmm, baddbmm, cdist, cosine_similarity, dot, ger, kron, mv, outer, pairwise_distance,
                           trace)
from .sampling import bernoulli, multinomial, rand_like, randint, randn_like, randperm
from .losses_more import (binary_cross_entropy, cosine_embedding_loss, huber_loss, margin_ranking_loss,
                          soft_margin_loss)
from .repeat_topk import repeat, repeat_elements, repeat_interleave, tile, topk
from .scan_sort import argsort, cumprod, cumsum, sort
from .clip import clip_by_global_norm, clip_by_norm
from .control_flow import cond, while_loop
from .loops import ForiLoop, Scan, WhileLoop, fori_loop, map, scan, switch
from .debug import print_
from .assign import assign, assign_add, assign_sub


def _name_errors():
    """Each function's errors from bad arguments name it (ops._util.naming_errors). cond and
    while_loop and the loops run the user's functions, print_ the user's formatting: their errors pass
    untouched."""
    import types

    from ._util import function_names, naming_errors

    g = globals()
    public = [n for n, f in g.items() if not n.startswith("_") and isinstance(f, types.FunctionType)]
    known = function_names(g)
    for n in public:
        if n not in ("cond", "while_loop", "fori_loop", "scan", "map", "switch", "print_"):
            g[n] = naming_errors(g[n], n, known)


_name_errors()

# MindSpore's primitive classes (ops.Add()(x, y), ops.ReduceSum(keep_dims=True)(x, 1), ...)
from .primitives import *  # noqa: E402,F401,F403

# MindSpore's functional autodiff, also reachable as kiln.ops.* (after _name_errors: the user's
# function's errors pass untouched)
from ..autograd import GradOperation, get_grad, grad, value_and_grad  # noqa: E402
from ..derivatives import hessian, jacfwd, jvp, linearize, vjp  # noqa: E402
# MindSpore's hook operators: identities whose backward runs a function on the gradient
from ..grad_hooks import HookBackward, InsertGradientOf  # noqa: E402,F401
