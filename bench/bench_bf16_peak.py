"""The bfloat16 hardware bound of this CPU, measured in one run: can bfloat16 products beat float32
ones here at all, and by how much at most (issue 31 asks amp O2 for >= 1.6x float32)?

1. In-register throughput of one core (bench/c/bench_bf16_peak.c, CMake target bench_bf16_peak):
   vdpbf16ps zmm (32 bfloat16 multiply-adds per instruction) against vfmadd231ps zmm (16 float32
   ones) and, where the CPU has AVX512_FP16, vfmadd231ph zmm (32 float16 ones); 16 independent
   accumulators, no memory: what the execution units can do. Multiply-adds per ns, per cycle
   (the clock measured by a chain of dependent multiplies) and the ratio bf16 peak / fp32 peak:
   no bfloat16 GEMM can beat that ratio over a float32 GEMM on this core.
2. GEMMs at 2048^3 on --threads threads (1 unless told: the in-register figures are one core's):
   oneDNN's bfloat16 matmul (kiln._C.gemm_bf16_rate) against its sgemm (kiln._C.gemm_rate), kiln's
   ops.matmul in bfloat16 on the hardware path (oneDNN's bf16 primitive) and on the fp32-compute
   fallback against ops.matmul in float32, and torch.mm in bfloat16 against float32 where torch
   imports (here, or in --torch-python, default /work/peers-venv/bin/python where it exists). Each
   as GFLOP/s, as bf16 / fp32, and as a fraction of its dtype's in-register peak.

A benchmark, not a test: where the CPU lacks an instruction set (no AVX-512, no AVX512_BF16) its
rows say so and the run goes on. Run it alone (flock /tmp/kiln_bench.lock ...):

    cmake --build build --target bench_bf16_peak
    PYTHONPATH=python python3 bench/bench_bf16_peak.py [--threads N] [--n 2048] [--repeat 5]
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

import kiln
from kiln import ops

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEERS_PYTHON = "/work/peers-venv/bin/python"

# instruction -> (dtype it multiplies, label)
INSTRUCTIONS = {"vfmadd231ps_zmm": ("float32", "vfmadd231ps zmm (fp32 FMA)"),
                "vdpbf16ps_zmm": ("bfloat16", "vdpbf16ps zmm (bf16 dot product)"),
                "vfmadd231ph_zmm": ("float16", "vfmadd231ph zmm (fp16 FMA)")}


def in_register(exe, seconds):
    """{"clock_ghz": GHz or None, instruction: (multiply-adds per ns, ns per instruction) or the
    reason it is absent}, or a string saying why nothing was measured."""
    if not os.path.exists(exe):
        return f"{exe} not built (cmake --build build --target bench_bf16_peak)"
    r = subprocess.run([exe, str(seconds)], capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        return f"{exe} failed ({r.returncode}): {r.stderr.strip()[-300:]}"
    out = {"clock_ghz": None}
    for line in r.stdout.splitlines():
        name, _, rest = line.partition(" ")
        if name == "clock_ghz":
            out["clock_ghz"] = float(rest)
        elif rest.startswith("absent"):
            out[name] = rest
        else:
            rate, ns = rest.split()
            out[name] = (float(rate), float(ns))
    return out


def best_seconds(fn, repeat):
    """The best of `repeat` timed calls of fn, after one untimed call."""
    fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def kiln_rows(n, threads, repeat):
    """{row: GFLOP/s} of the GEMMs kiln reaches, n x n x n, on `threads` threads; a row that cannot
    run here holds the reason instead."""
    rows = {}
    flop = 2.0 * n ** 3
    rows["oneDNN sgemm (float32)"] = kiln._C.gemm_rate("onednn", n, n, n, threads, repeat, 0.0)
    hardware = kiln._C.gemm_bf16_info()["hardware"]
    rows["oneDNN bf16 matmul"] = (kiln._C.gemm_bf16_rate(n, n, n, threads, repeat, 0.0) if hardware
                                  else "absent (oneDNN's instruction set has no bfloat16 arithmetic here)")
    rng = np.random.default_rng(0)
    a = kiln.Tensor(rng.standard_normal((n, n), dtype=np.float32))
    b = kiln.Tensor(rng.standard_normal((n, n), dtype=np.float32))
    a16, b16 = a.astype(kiln.bfloat16), b.astype(kiln.bfloat16)
    before = kiln.get_num_threads()
    kiln.set_num_threads(threads)
    try:
        rows["kiln ops.matmul float32"] = flop / best_seconds(lambda: ops.matmul(a, b), repeat) / 1e9
        for name, how in (("kiln ops.matmul bf16 oneDNN path", 1), ("kiln ops.matmul bf16 fallback", 0)):
            if how == 1 and not hardware:
                rows[name] = "absent (no bfloat16 hardware path here)"
                continue
            kiln._C.gemm_bf16_force(how)
            try:
                rows[name] = flop / best_seconds(lambda: ops.matmul(a16, b16), repeat) / 1e9
            finally:
                kiln._C.gemm_bf16_force(-1)
    finally:
        kiln.set_num_threads(before)
    return rows


TORCH_CODE = r"""
import json, sys, time
import torch
n, threads, repeat = map(int, sys.argv[1:4])
torch.set_num_threads(threads)
out = {"version": torch.__version__}
for name, dt in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
    a = torch.randn(n, n).to(dt)
    b = torch.randn(n, n).to(dt)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
    out[name] = 2.0 * n ** 3 / best / 1e9
print(json.dumps(out))
"""


def torch_rows(n, threads, repeat, python):
    """{"version", "float32", "bfloat16": GFLOP/s} of torch.mm, or a string saying why not."""
    try:
        import torch  # noqa: F401
        exe = sys.executable
    except ImportError:
        exe = python
        if not exe or not os.path.exists(exe):
            return "torch not importable here, and no --torch-python"
    r = subprocess.run([exe, "-c", TORCH_CODE, str(n), str(threads), str(repeat)], capture_output=True, text=True,
                       timeout=600)
    if r.returncode != 0:
        return f"torch unavailable in {exe}: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode}"
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1, help="threads of the GEMMs (default 1: one core, "
                                                          "as the in-register figures)")
    p.add_argument("--n", type=int, default=2048, help="GEMM size n x n x n (default 2048)")
    p.add_argument("--repeat", type=int, default=5, help="timed calls per GEMM, the best kept")
    p.add_argument("--seconds", type=float, default=0.3, help="seconds per in-register measurement")
    p.add_argument("--exe", default=os.path.join(ROOT, "build", "bench_bf16_peak"),
                   help="the in-register benchmark (default build/bench_bf16_peak)")
    p.add_argument("--torch-python", default=PEERS_PYTHON if os.path.exists(PEERS_PYTHON) else None,
                   help="a Python with torch, where this one has none (default the peers' venv)")
    args = p.parse_args()
    print(f"kiln {kiln.__version__}; CPU ISA (kiln's build_info): {kiln._C.build_info()['cpu_isa']}")

    print("\n1. in-register throughput, one core (16 independent accumulators, no memory)")
    reg = in_register(args.exe, args.seconds)
    peaks = {}  # dtype -> multiply-adds per ns, one core
    if isinstance(reg, str):
        print(f"  skipped: {reg}")
    else:
        ghz = reg["clock_ghz"]
        print(f"  clock: {ghz:.2f} GHz (a chain of dependent imul; per-cycle figures use it)")
        print(f"  {'instruction':<36} {'madd/ns':>9} {'madd/cycle':>10} {'GFLOP/s':>9} {'ns/instr':>9}")
        for name, (dtype, label) in INSTRUCTIONS.items():
            v = reg.get(name, "absent (not measured)")
            if isinstance(v, str):
                print(f"  {label:<36} {v}")
                continue
            rate, ns = v
            peaks[dtype] = rate
            print(f"  {label:<36} {rate:9.1f} {rate / ghz:10.1f} {2 * rate:9.1f} {ns:9.3f}")
        if "float32" in peaks and "bfloat16" in peaks:
            ratio = peaks["bfloat16"] / peaks["float32"]
            print(f"  bf16 peak / fp32 peak: {ratio:.2f}  ->  bf16 >= 1.6x fp32 is "
                  + ("within the hardware bound" if ratio >= 1.6 else
                     f"NOT reachable on this CPU: a bf16 product on vdpbf16ps runs at most {ratio:.2f}x "
                     "fp32's peak, and the fp32-compute fallback at fp32's"))
        if "float32" in peaks and "float16" in peaks:
            print(f"  fp16 peak / fp32 peak: {peaks['float16'] / peaks['float32']:.2f}")

    n, threads = args.n, args.threads
    print(f"\n2. GEMM {n}^3 on {threads} thread(s): GFLOP/s, bf16 / fp32, fraction of the in-register "
          f"peak of the arithmetic it runs ({threads} core(s); the fallback's is float32's)")
    rows = kiln_rows(n, threads, args.repeat)
    t = torch_rows(n, threads, args.repeat, args.torch_python)
    if isinstance(t, str):
        rows["torch.mm float32"] = rows["torch.mm bfloat16"] = f"absent ({t})"
    else:
        rows[f"torch {t['version']} mm float32"] = t["float32"]
        rows[f"torch {t['version']} mm bfloat16"] = t["bfloat16"]
    fp32_of = {"oneDNN bf16 matmul": "oneDNN sgemm (float32)",
               "kiln ops.matmul bf16 oneDNN path": "kiln ops.matmul float32",
               "kiln ops.matmul bf16 fallback": "kiln ops.matmul float32"}
    for name in rows:
        if "bfloat16" in name and name.startswith("torch"):
            fp32_of[name] = name.replace("bfloat16", "float32")
    print(f"  {'GEMM':<40} {'GFLOP/s':>9} {'bf16/fp32':>9} {'of peak':>8}")
    for name, v in rows.items():
        if isinstance(v, str):
            print(f"  {name:<40} {v}")
            continue
        base = rows.get(fp32_of.get(name))
        ratio = f"{v / base:9.2f}" if isinstance(base, float) else ""
        # the fallback computes in float32: its bound is the float32 peak
        dtype = "float32" if name not in fp32_of or "fallback" in name else "bfloat16"
        frac = f"{v / (2 * peaks[dtype] * threads):8.2f}" if dtype in peaks else ""
        print(f"  {name:<40} {v:9.1f} {ratio:>9} {frac:>8}")


if __name__ == "__main__":
    main()
