"""OpenBLAS's cblas_sgemm called directly (through ctypes): the machine's float32 matrix-multiply
speed that kiln's figures are measured against. kiln links OpenBLAS (and runs it single-threaded,
splitting GEMMs itself); here OpenBLAS runs on its own threads, as many as kiln uses.

Used by kiln.bench (the peak GFLOP/s printed once per run) and bench/bench_core.py (the matmul row).
"""
import ctypes
import ctypes.util
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
