"""Deployment benchmark (issue 13), ratios measured in one run: the BasicBlock (seed shapes by
default: 128 channels, 1x128x256x256 float32, eval mode) dumped with optimize_for_inference and
enable_fuse_conv_bias_with_z, run by kiln-run (C, no Python) against

  - the same file loaded in Python (kiln.load, sink backend): target ratio <= 1.05;
  - PyTorch eager (torch.no_grad(), same weights and threads), when torch is importable: kiln-run
    at least as fast (ratio <= 1.0);
  - ONNX Runtime on kiln.export(..., file_format="ONNX") of the same block (CPU provider, same
    threads), when onnx and onnxruntime are importable: kiln-run at least as fast;

and the time kiln-run reports for loading the file (kiln_model_load) against reading its bytes:
target load <= 5 ms + the read. The systems are timed in turn for --rounds rounds of --iter calls
each (after a warm-up); each figure is the best call over all rounds (the machine may be shared:
load from other processes then hits every system alike).

    PYTHONPATH=python python3 bench/bench_deploy.py [--size 256] [--iter 3] [--rounds 3] [--threads N]
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

import numpy as np

import kiln
from bench_infer import make_block, torch_block
from timing import row

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KILN_RUN = os.path.join(ROOT, "build", "kiln-run")


def best_ms(fn, n):
    fn()
    best = float("inf")
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        best = min(best, (time.perf_counter() - t0) * 1e3)
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--iter", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=kiln.get_num_threads())
    a = ap.parse_args()
    kiln.set_num_threads(a.threads)
    block, x_np = make_block(a.size)
    x = kiln.tensor(x_np)
    t = kiln.trace(block, capture_as_const=True)
    t(x)
    ok = True
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "bb.kiln")
        info = t.dump(path, enable_fuse_conv_bias_with_z=True)
        print(f"BasicBlock 1x128x{a.size}x{a.size}, {a.threads} threads, best of {a.rounds} rounds of {a.iter} calls; "
              f"file {info.tot_bytes} bytes, {info.nr_opr} nodes")
        g = kiln.load(path, backend="sink")
        systems = {"kiln-run": None, "python": lambda: g(x)}
        try:
            import torch
        except ImportError:
            torch = None
            print("PyTorch eager: torch not installed, row skipped")
        if torch is not None:
            torch.set_num_threads(a.threads)
            model, tx = torch_block(torch, block), torch.from_numpy(x_np)
            systems["torch"] = lambda: torch.no_grad()(model)(tx)
        try:
            import onnxruntime as ort
            import onnx  # noqa: F401  (kiln.export's ONNX writer)
        except ImportError:
            ort = None
            print("ONNX Runtime: onnx/onnxruntime not installed, row skipped")
        if ort is not None:
            onnx_path = os.path.join(d, "bb.onnx")
            kiln.export(block, x, file_name=onnx_path, file_format="ONNX")
            so = ort.SessionOptions()
            so.intra_op_num_threads = a.threads
            sess = ort.InferenceSession(onnx_path, so, providers=["CPUExecutionProvider"])
            name = sess.get_inputs()[0].name
            systems["onnxruntime"] = lambda: sess.run(None, {name: x_np})
        best = {k: float("inf") for k in systems}
        load_ms = float("inf")
        for _ in range(a.rounds):
            for k, fn in systems.items():
                if fn is not None:
                    best[k] = min(best[k], best_ms(fn, a.iter))
                    continue
                out = subprocess.run([KILN_RUN, path, "--iter", str(a.iter), "--warmup", "2", "--backend", "sink",
                                      "--threads", str(a.threads), "--model-info"], capture_output=True, text=True,
                                     check=True).stdout
                best[k] = min(best[k], float(re.search(r"min ([0-9.]+) ms", out).group(1)))
                load_ms = min(load_ms, float(re.search(r"load: ([0-9.]+) ms", out).group(1)))
        t0 = time.perf_counter()
        with open(path, "rb") as f:
            f.read()
        read_ms = (time.perf_counter() - t0) * 1e3
        c_ms = best["kiln-run"]
        ok &= row("kiln-run (sink)", c_ms, "ms", "kiln.load in Python (sink)", best["python"], c_ms / best["python"], 1.05)
        ok &= row("kiln-run load (kiln_model_load)", load_ms, "ms", "5 ms + reading the bytes", 5.0 + read_ms,
                  load_ms / (5.0 + read_ms), 1.0)
        if torch is not None:
            ok &= row("kiln-run (sink)", c_ms, "ms", f"torch {torch.__version__} eager", best["torch"],
                      c_ms / best["torch"], 1.0)
        if ort is not None:
            ok &= row("kiln-run (sink)", c_ms, "ms", f"onnxruntime {ort.__version__}", best["onnxruntime"],
                      c_ms / best["onnxruntime"], 1.0)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
