"""Shared helpers for the Python op tests: dtypes and tolerances, non-contiguous inputs made
from NumPy arrays, NumPy comparison, a central-difference gradient checker and fresh interpreters."""
import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

# The suite runs OpenBLAS for every GEMM (kiln.gemm_select's calibration off: no file written, no
# second of measuring in each fresh interpreter); test_gemm_select.py turns it on where it tests it.
os.environ.setdefault("KILN_GEMM_CALIBRATION", "off")

import kiln  # noqa: E402

# ---- dtypes ---------------------------------------------------------------------------

FLOATS = (kiln.float32, kiln.float64)
HALFS = (kiln.float16, kiln.bfloat16)
INTS = (kiln.int32, kiln.int64)

NP_DTYPE = {
    kiln.bool: np.bool_, kiln.int8: np.int8, kiln.int32: np.int32, kiln.int64: np.int64,
    kiln.float16: np.float16, kiln.float32: np.float32, kiln.float64: np.float64,
    kiln.bfloat16: np.float32,  # NumPy has no bfloat16: values travel as float32
}
KILN_DTYPE = {np.dtype(np.bool_): kiln.bool, np.dtype(np.int8): kiln.int8, np.dtype(np.int32): kiln.int32,
              np.dtype(np.int64): kiln.int64, np.dtype(np.float16): kiln.float16,
              np.dtype(np.float32): kiln.float32, np.dtype(np.float64): kiln.float64}

_TOL = {
    kiln.float64: dict(rtol=1e-10, atol=1e-12),
    kiln.float32: dict(rtol=2e-5, atol=1e-6),
    kiln.float16: dict(rtol=5e-3, atol=5e-3),
    kiln.bfloat16: dict(rtol=3e-2, atol=3e-2),
}


def tol(dtype, scale=1.0):
    """rtol/atol for comparing results of `dtype` against a float64 reference."""
    t = _TOL.get(dtype, dict(rtol=0, atol=0))
    return dict(rtol=t["rtol"] * scale, atol=t["atol"] * scale)


def dtype_name(d):
    return d.name if isinstance(d, kiln.dtype) else str(d)


def round_to(a, dtype):
    """a rounded to the precision of a kiln dtype, returned as float64 (the reference's inputs)."""
    a = np.asarray(a)
    if dtype is kiln.bfloat16:
        bits = np.asarray(a, np.float32).view(np.uint32).astype(np.uint64)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000  # round to nearest even
        return bits.astype(np.uint32).view(np.float32).astype(np.float64)
    if dtype in (kiln.float16, kiln.float32):
        return a.astype(NP_DTYPE[dtype]).astype(np.float64)
    return a


def promote(a, b):
    """kiln's promotion of two tensor dtypes: float beats int beats bool; within a category the
    wider type wins; float16 with bfloat16 gives float32."""
    def cat(d):
        return 2 if d.is_floating_point else (0 if d is kiln.bool else 1)

    if cat(a) != cat(b):
        return a if cat(a) > cat(b) else b
    if {a, b} == {kiln.float16, kiln.bfloat16}:
        return kiln.float32
    return a if a.itemsize >= b.itemsize else b


# ---- making tensors -------------------------------------------------------------------

LAYOUTS = ("contiguous", "transposed", "strided")


def _sentinel(np_dtype):
    if np.issubdtype(np_dtype, np.floating):
        return np.nan  # a kernel reading the gaps turns its result into NaN
    if np_dtype == np.bool_:
        return True
    return 77


def to_kiln(a, dtype=None, layout="contiguous"):
    """A kiln tensor with the values of NumPy array `a`, of `dtype` (default: a's), laid out as
    'contiguous', 'transposed' (last two axes swapped in memory; reversed for 1-D) or
    'strided' (a step-2 slice of a larger tensor, offset by one in every axis)."""
    a = np.asarray(a)
    if dtype is None:
        dtype = KILN_DTYPE[a.dtype]
    if layout == "contiguous" or a.ndim == 0:
        return kiln.Tensor(np.ascontiguousarray(a), dtype)
    if layout == "transposed":
        if a.ndim == 1:
            t = kiln.Tensor(np.ascontiguousarray(a[::-1]), dtype)[::-1]
        else:
            t = kiln.Tensor(np.ascontiguousarray(np.swapaxes(a, -1, -2)), dtype).swapaxes(-1, -2)
    elif layout == "strided":
        big = np.full(tuple(2 * s + 1 for s in a.shape), _sentinel(a.dtype), a.dtype)
        big[tuple(slice(1, None, 2) for _ in a.shape)] = a
        t = kiln.Tensor(big, dtype)[tuple(slice(1, None, 2) for _ in a.shape)]
    else:
        raise ValueError(layout)
    assert t.shape == a.shape
    return t


def from_numpy_strided(a):
    """A tensor sharing the memory of a non-contiguous NumPy view with a's values."""
    a = np.asarray(a)
    big = np.zeros(tuple(2 * s for s in a.shape), a.dtype)
    view = big[tuple(slice(None, None, 2) for _ in a.shape)]
    view[...] = a
    return kiln.from_numpy(view)


def make_rng(seed=0):
    return np.random.default_rng(seed)


def inference_basic_block(channels, seed=0):
    """models.BasicBlock in eval mode, with batch-norm statistics that make the inference
    folding do something: bench/bench_infer.py's workload."""
    from kiln import models
    kiln.manual_seed(seed)
    block = models.BasicBlock(channels)
    rng = np.random.default_rng(seed)
    for bn in (block.bn1, block.bn2):
        bn.moving_mean.set_data(rng.standard_normal(channels).astype(np.float32) * 0.1)
        bn.moving_variance.set_data(rng.uniform(0.5, 2.0, channels).astype(np.float32))
        bn.gamma.set_data(rng.uniform(0.5, 1.5, channels).astype(np.float32))
        bn.beta.set_data(rng.standard_normal(channels).astype(np.float32) * 0.1)
    block.set_train(False)
    return block


def rand_array(rng, shape, dtype=kiln.float64, low=-2.0, high=2.0):
    """Random values for a kiln dtype as a NumPy array (float64 for float dtypes so the
    reference computes in full precision; values are rounded to dtype's precision)."""
    if dtype is kiln.bool:
        return rng.random(shape) < 0.5
    if dtype in (kiln.int8, kiln.int32, kiln.int64):
        return rng.integers(int(math.floor(low)), int(math.ceil(high)) + 1, size=shape).astype(NP_DTYPE[dtype])
    return round_to(rng.uniform(low, high, size=shape), dtype)


def to_numpy(t):
    """A tensor's values as NumPy (bfloat16 as float32)."""
    if t.dtype is kiln.bfloat16:
        return t.astype(kiln.float32).asnumpy().copy()
    return np.array(t.asnumpy(), copy=True)


def assert_close(actual, expected, dtype=None, rtol=None, atol=None, check_dtype=True):
    """actual (kiln tensor) equals expected (NumPy) in shape, dtype (when given) and value."""
    assert isinstance(actual, kiln.Tensor), type(actual)
    expected = np.asarray(expected)
    if dtype is not None and check_dtype:
        assert actual.dtype is dtype, f"dtype {actual.dtype}, expected {dtype}"
    assert actual.shape == expected.shape, f"shape {actual.shape}, expected {expected.shape}"
    got = to_numpy(actual)
    d = actual.dtype
    if not d.is_floating_point:
        np.testing.assert_array_equal(got, expected.astype(got.dtype) if expected.dtype != got.dtype else expected)
        return
    t = tol(d)
    np.testing.assert_allclose(got.astype(np.float64), expected.astype(np.float64),
                               rtol=t["rtol"] if rtol is None else rtol,
                               atol=t["atol"] if atol is None else atol, equal_nan=True)


# ---- gradients ------------------------------------------------------------------------


def _outputs(r):
    return list(r) if isinstance(r, (tuple, list)) else [r]


def numeric_grad(fn, args, argnum, weights, eps=1e-6):
    """Central differences of sum_k <fn(*args)[k], weights[k]> with respect to args[argnum]
    (a float64 NumPy array); the other args are passed as they are."""
    base = np.array(args[argnum], dtype=np.float64, copy=True)
    g = np.zeros_like(base)
    flat, gflat = base.reshape(-1), g.reshape(-1)

    def value(arr):
        call = list(args)
        call[argnum] = kiln.Tensor(arr, kiln.float64)
        call = [kiln.Tensor(c, kiln.float64) if isinstance(c, np.ndarray) and c.dtype == np.float64 else c
                for c in call]
        with kiln.no_grad():
            outs = _outputs(fn(*call))
        return sum(float(np.sum(to_numpy(o).astype(np.float64) * w)) for o, w in zip(outs, weights))

    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + eps
        hi = value(base)
        flat[i] = old - eps
        lo = value(base)
        flat[i] = old
        gflat[i] = (hi - lo) / (2 * eps)
    return g


def check_grad(fn, *args, argnums=None, eps=1e-6, rtol=1e-5, atol=1e-7, seed=0):
    """Checks kiln.grad of fn against central differences in float64.

    args: float64 NumPy arrays (become float64 tensors) and anything else (passed as is, e.g.
    index tensors or Python ints). argnums: which args to differentiate (default: every float64
    array). fn may return one tensor or a tuple; its outputs are weighted by fixed random
    arrays so every output element matters with a different weight."""
    if argnums is None:
        argnums = tuple(i for i, a in enumerate(args) if isinstance(a, np.ndarray) and a.dtype == np.float64)
    tensors = [kiln.Tensor(a, kiln.float64) if isinstance(a, np.ndarray) and a.dtype == np.float64 else a
               for a in args]
    with kiln.no_grad():
        outs = _outputs(fn(*tensors))
    rng = np.random.default_rng(seed + 1000)
    weights = [rng.standard_normal(o.shape) for o in outs]
    wts = [kiln.Tensor(w, kiln.float64) for w in weights]

    def scalar(*ts):
        total = None
        for o, w in zip(_outputs(fn(*ts)), wts):
            term = (o * w).sum()
            total = term if total is None else total + term
        return total

    analytic = kiln.grad(scalar, grad_position=tuple(argnums))(*tensors)
    assert len(analytic) == len(argnums)
    for k, i in enumerate(argnums):
        expected = numeric_grad(fn, list(args), i, weights, eps)
        got = analytic[k]
        assert got.shape == tuple(np.shape(args[i])), f"grad of arg {i}: shape {got.shape} vs {np.shape(args[i])}"
        assert got.dtype is kiln.float64, f"grad of arg {i}: dtype {got.dtype}"
        np.testing.assert_allclose(to_numpy(got), expected, rtol=rtol, atol=atol,
                                   err_msg=f"gradient of argument {i}")


# ---- fresh interpreters ---------------------------------------------------------------


def python_env(**extra):
    """os.environ with kiln importable, plus `extra`."""
    python_dir = os.path.dirname(os.path.dirname(kiln.__file__))
    return dict(os.environ, PYTHONPATH=python_dir + os.pathsep + os.environ.get("PYTHONPATH", ""), **extra)


def python_command(code):
    """argv running `code` (dedented) in a fresh interpreter."""
    return [sys.executable, "-c", textwrap.dedent(code)]


def run_isolated(code, timeout=120, **env):
    """Runs code in a fresh interpreter (environment python_env(**env)); returns (returncode, stdout + stderr)."""
    p = subprocess.run(python_command(code), capture_output=True, text=True, env=python_env(**env), timeout=timeout)
    return p.returncode, p.stdout + p.stderr
