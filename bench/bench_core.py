"""Core-runtime benchmark: each figure is printed as a ratio against a reference measured in the
same run (PyTorch rows only when PyTorch is installed).

    PYTHONPATH=python python3 bench/bench_core.py [--quick]

Targets (issue 2): eager a*b+c <= 1.0 us/call and <= 0.5x PyTorch eager; matmul 1024^3 float32
>= 0.9x cblas_sgemm called directly; conv2d 3x3 128->128 on 1x128x256x256 forward and
forward+backward <= 1.0x PyTorch CPU; add of two 64M float32 tensors >= 0.8x copy bandwidth.
"""
import argparse
import sys

import numpy as np

import kiln
from timing import best_time, row
from kiln import ops
from kiln.bench.sgemm import Sgemm

try:
    import torch
except ImportError:  # the PyTorch rows are skipped
    torch = None


def bench_dispatch(quick):
    a, b, c = [kiln.Tensor(np.random.randn(2, 3).astype(np.float32)) for _ in range(3)]
    n = 20000 if quick else 200000
    t = best_time(lambda: a * b + c, 5, n) * 1e6
    results = [row("eager a*b+c, 2x3 float32", t, "us/call", "target 1.0 us", 1.0, t / 1.0, 1.0, "lower")]
    if torch is not None:
        ta, tb, tc = [torch.randn(2, 3) for _ in range(3)]
        tt = best_time(lambda: ta * tb + tc, 5, n) * 1e6
        results.append(row("eager a*b+c vs PyTorch eager", t, "us/call", "PyTorch eager", tt, t / tt, 0.5, "lower"))
    return results


def bench_matmul(quick):
    n = 1024
    a = np.random.randn(n, n).astype(np.float32)
    b = np.random.randn(n, n).astype(np.float32)
    ka, kb = kiln.Tensor(a), kiln.Tensor(b)
    rep = 5 if quick else 15
    c = np.empty((n, n), np.float32)
    reference = Sgemm(a, b, c)  # OpenBLAS's own threads (kiln runs it single-threaded and splits GEMMs itself)

    ops.matmul(ka, kb)
    reference()
    t = tref = float("inf")
    for _ in range(rep):  # interleaved, so a busy moment on a shared machine hits both alike
        t = min(t, best_time(lambda: ops.matmul(ka, kb), 1))
        tref = min(tref, best_time(reference, 1))
    assert np.allclose(c, ops.matmul(ka, kb).asnumpy(), rtol=1e-3, atol=1e-2)
    g, gref = reference.flops / t / 1e9, reference.flops / tref / 1e9
    return [row("matmul 1024^3 float32", g, "GFLOP/s", "cblas_sgemm direct", gref, g / gref, 0.9, "higher")]


def bench_conv(quick):
    shape = (1, 128, 64, 64) if quick else (1, 128, 256, 256)
    x = np.random.randn(*shape).astype(np.float32)
    w = (np.random.randn(128, 128, 3, 3) * 0.05).astype(np.float32)
    kx, kw = kiln.Tensor(x), kiln.Tensor(w)
    rep = 3 if quick else 5
    fwd = lambda: ops.conv2d(kx, kw, padding=1)  # noqa: E731
    loss = lambda x_, w_: ops.conv2d(x_, w_, padding=1).sum()  # noqa: E731
    vg = kiln.value_and_grad(loss, grad_position=(0, 1))
    fwdbwd = lambda: vg(kx, kw)  # noqa: E731
    fwd(), fwdbwd()
    t_f, t_fb = best_time(fwd, rep), best_time(fwdbwd, rep)
    results = []
    label = "x".join(map(str, shape))
    if torch is not None:
        tx, tw = torch.from_numpy(x), torch.from_numpy(w)
        txg, twg = tx.clone().requires_grad_(), tw.clone().requires_grad_()
        tf = lambda: torch.nn.functional.conv2d(tx, tw, padding=1)  # noqa: E731

        def tfb():
            txg.grad = twg.grad = None
            torch.nn.functional.conv2d(txg, twg, padding=1).sum().backward()

        with torch.no_grad():
            tf()
            r_f = best_time(tf, rep)
        tfb()
        r_fb = best_time(tfb, rep)
        results.append(row(f"conv2d 3x3 128->128 {label} fwd", t_f * 1e3, "ms", "PyTorch CPU", r_f * 1e3,
                           t_f / r_f, 1.0, "lower"))
        results.append(row(f"conv2d 3x3 128->128 {label} fwd+bwd", t_fb * 1e3, "ms", "PyTorch CPU", r_fb * 1e3,
                           t_fb / r_fb, 1.0, "lower"))
    else:
        print(f"conv2d {label}: fwd {t_f * 1e3:.2f} ms, fwd+bwd {t_fb * 1e3:.2f} ms (PyTorch not installed: "
              "no reference)")
    return results


def bench_add(quick):
    n = (16 if quick else 64) << 20
    a = ops.rand(n)
    b = ops.rand(n)
    rep = 3 if quick else 7
    a + b
    t_add = best_time(lambda: a + b, rep)
    t_copy = best_time(lambda: a.clone(), rep)
    an = np.empty(n, np.float32)
    src = np.ones(n, np.float32)
    t_np = best_time(lambda: np.copyto(an, src), rep)
    bw_add = 3 * 4 * n / t_add / 1e9
    bw_copy = max(2 * 4 * n / t_copy, 2 * 4 * n / t_np) / 1e9
    return [row(f"add {n >> 20}M float32 bandwidth", bw_add, "GB/s", "copy (best of kiln, NumPy)", bw_copy,
                bw_add / bw_copy, 0.8, "higher")]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smaller sizes and fewer repeats")
    args = p.parse_args()
    print(f"kiln {kiln.__version__}, {kiln.get_num_threads()} threads"
          + (f", PyTorch {torch.__version__} ({torch.get_num_threads()} threads)" if torch else ", no PyTorch"))
    results = []
    for bench in (bench_dispatch, bench_matmul, bench_conv, bench_add):
        results += bench(args.quick)
    missed = results.count(False)
    print(f"{len(results) - missed} of {len(results)} targets met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
