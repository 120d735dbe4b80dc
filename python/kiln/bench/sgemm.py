"""The machine's float32 matrix-multiply speed that kiln's figures are measured against: the best
sgemm available here (best_peak), over OpenBLAS's cblas_sgemm called directly (through ctypes) with
the core type kiln loaded, OpenBLAS with its other core type (AVX2's Haswell against an AVX-512 one,
in a child process, since OPENBLAS_CORETYPE applies at load) and oneDNN's dnnl_sgemm. kiln links
both (and runs them single-threaded, splitting GEMMs itself); here each runs on its own threads, as
many as kiln uses.

Used by kiln.bench (the peak GFLOP/s printed once per run) and bench/bench_core.py (the matmul row).
bf16_peak: the bfloat16 GEMM peak, oneDNN's bfloat16 matmul (kiln.bench and bench/bench_amp.py).
"""
import ctypes
import ctypes.util
import json
import os
import subprocess
import sys
import time

import numpy as np

import kiln

_ROW_MAJOR, _NO_TRANS = 101, 111


def _openblas():
    return ctypes.CDLL(ctypes.util.find_library("openblas") or "libopenblas.so.0")


class Sgemm:
    """c = a @ b for float32 C-contiguous NumPy arrays a (m x k) and b (k x n), c (m x n) given;
    call() runs cblas_sgemm on kiln's thread count. Raises OSError when OpenBLAS cannot be loaded."""

    def __init__(self, a, b, c):
        m, k = a.shape
        n = b.shape[1]
        if b.shape[0] != k or c.shape != (m, n) or any(x.dtype != np.float32 or not x.flags.c_contiguous
                                                       for x in (a, b, c)):
            raise ValueError(f"Sgemm: float32 C-contiguous a {a.shape}, b {b.shape}, c {c.shape} expected")
        self.lib = _openblas()
        self.threads = kiln.get_num_threads()
        self.arrays = (a, b, c)  # kept alive: the pointers below point into them
        fp = ctypes.POINTER(ctypes.c_float)
        self.args = (_ROW_MAJOR, _NO_TRANS, _NO_TRANS, m, n, k, ctypes.c_float(1.0), a.ctypes.data_as(fp), k,
                     b.ctypes.data_as(fp), n, ctypes.c_float(0.0), c.ctypes.data_as(fp), n)
        self.flops = 2.0 * m * n * k

    def __call__(self):
        self.lib.openblas_set_num_threads(self.threads)
        self.lib.cblas_sgemm(*self.args)


def peak_gflops(n=2048, repeat=5, seed=0):
    """The best GFLOP/s of `repeat` calls of cblas_sgemm on n x n x n float32 (after one warm-up
    call), or None when OpenBLAS cannot be loaded."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    try:
        gemm = Sgemm(a, b, np.empty((n, n), np.float32))
    except OSError:
        return None
    gemm()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        gemm()
        best = min(best, time.perf_counter() - t0)
    return gemm.flops / best / 1e9


_other_core = {}  # (n, threads) -> (label, GFLOP/s) or None: measured once per process


def _other_core_peak(n, repeat, threads):
    """OpenBLAS with the other core type in a child process: (label, GFLOP/s), or None where the CPU
    has no AVX-512, the user set OPENBLAS_CORETYPE, or the child fails."""
    if (n, threads) in _other_core:
        return _other_core[(n, threads)]
    info = kiln._C.build_info()
    result = None
    if "avx512f" in info["cpu_isa"].split() and (kiln.gemm_select.coretype_set() or "OPENBLAS_CORETYPE" not in os.environ):
        env = dict(os.environ, KILN_GEMM_CALIBRATION="off")
        env.pop("OPENBLAS_CORETYPE", None)
        if not kiln.gemm_select.coretype_set():
            env["OPENBLAS_CORETYPE"] = "Haswell"
        code = ("import importlib.util, json, sys\n"
                "spec = importlib.util.spec_from_file_location('kiln._C', sys.argv[1])\n"
                "C = importlib.util.module_from_spec(spec); spec.loader.exec_module(C)\n"
                "n, t, r = map(int, sys.argv[2:5])\n"
                "print(json.dumps([C.build_info()['blas_core'], C.gemm_rate('openblas', n, n, n, t, r, 0.0)]))\n")
        try:
            r = subprocess.run([sys.executable, "-c", code, kiln._C.__file__, str(n), str(threads), str(repeat)],
                               env=env, capture_output=True, text=True, timeout=300)
            core, rate = json.loads(r.stdout.strip().splitlines()[-1])
            if r.returncode == 0 and rate > 0:
                result = (f"OpenBLAS {core}", float(rate))
        except (OSError, ValueError, IndexError, TypeError, subprocess.SubprocessError):
            result = None
    _other_core[(n, threads)] = result
    return result


def peak_candidates(n=2048, repeat=5):
    """{label: best GFLOP/s of `repeat` calls on n x n x n float32 on kiln's thread count}: OpenBLAS
    as loaded ("OpenBLAS <core>"), OpenBLAS with its other core type (measured once per process), and
    oneDNN. A library that cannot be measured is left out."""
    threads = kiln.get_num_threads()
    out = {}
    openblas = peak_gflops(n, repeat)
    if openblas:
        out[f"OpenBLAS {kiln._C.build_info()['blas_core']}"] = openblas
    other = _other_core_peak(n, repeat, threads)
    if other:
        out[other[0]] = other[1]
    out["oneDNN"] = kiln._C.gemm_rate("onednn", n, n, n, threads, repeat, 0.0)
    return out


def best_peak(n=2048, repeat=5):
    """(GFLOP/s, label, every candidate): the best sgemm available on this machine (peak_candidates)."""
    cands = peak_candidates(n, repeat)
    label = max(cands, key=cands.get)
    return cands[label], label, cands


def bf16_peak(n=2048, repeat=5):
    """The bfloat16 GEMM peak: the best GFLOP/s of `repeat` calls of oneDNN's bfloat16 matmul
    (bf16 x bf16 -> bf16, float32 sums) on n x n x n on kiln's thread count (oneDNN's own threads),
    or None where oneDNN's instruction set has no bfloat16 arithmetic (src/ops/gemm_bf16.h)."""
    if not kiln._C.gemm_bf16_info()["hardware"]:
        return None
    return kiln._C.gemm_bf16_rate(n, n, n, kiln.get_num_threads(), repeat, 0.0)
