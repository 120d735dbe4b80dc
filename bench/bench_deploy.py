"""Deployment benchmark (issue 13): the BasicBlock dumped with optimize_for_inference (and the conv
fusion options), run by kiln-run (C, no Python) against the same file loaded in Python on the sink
backend, and the time to load the file against the time to read its bytes; all in one run.

    PYTHONPATH=python python3 bench/bench_deploy.py [--channels 128] [--size 256] [--iter 5] [--threads N]

Targets: kiln-run's median per-iteration time <= 1.05x the Python sink call's median; loading
(kiln_model_load, as kiln-run --model-info prints it) <= 5 ms + the time to read the file's bytes.
Needs build/kiln-run. Not measured here (not done): PyTorch eager and ONNX Runtime on the same
model, and the float16 options."""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

import kiln
from kiln import models

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KILN_RUN = os.path.join(ROOT, "build", "kiln-run")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--channels", type=int, default=128)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--iter", type=int, default=5)
    ap.add_argument("--threads", type=int, default=kiln.get_num_threads())
    a = ap.parse_args()
    kiln.set_num_threads(a.threads)
    kiln.manual_seed(0)
    block = models.BasicBlock(a.channels)
    block.set_train(False)
    x = kiln.tensor(np.random.default_rng(0).standard_normal((1, a.channels, a.size, a.size)).astype(np.float32))
    t = kiln.trace(block, capture_as_const=True)
    t(x)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "bb.kiln")
        info = t.dump(path, enable_fuse_conv_bias_with_z=True)
        print(f"file: {info.tot_bytes} bytes, {info.tensor_value_bytes} parameter bytes, {info.nr_opr} nodes")
        g = kiln.load(path, backend="sink")
        g(x)
        py = []
        for _ in range(a.iter):
            t0 = time.perf_counter()
            g(x)
            py.append((time.perf_counter() - t0) * 1e3)
        out = subprocess.run([KILN_RUN, path, "--iter", str(a.iter), "--warmup", "1", "--backend", "sink",
                              "--threads", str(a.threads), "--model-info"], capture_output=True, text=True,
                             check=True).stdout
        c_median = float(re.search(r"median ([0-9.]+) ms", out).group(1))
        load_ms = float(re.search(r"load: ([0-9.]+) ms", out).group(1))
        t0 = time.perf_counter()
        with open(path, "rb") as f:
            f.read()
        read_ms = (time.perf_counter() - t0) * 1e3
    py_median = statistics.median(py)
    print(f"BasicBlock 1x{a.channels}x{a.size}x{a.size}, {a.threads} threads, {a.iter} iterations")
    print(f"kiln-run (sink) median {c_median:.3f} ms; Python kiln.load(sink) median {py_median:.3f} ms; "
          f"ratio {c_median / py_median:.3f} (target <= 1.05)")
    print(f"load {load_ms:.3f} ms; reading the file's bytes {read_ms:.3f} ms; load - read {load_ms - read_ms:.3f} ms "
          "(target <= 5 ms)")


if __name__ == "__main__":
    sys.exit(main())
