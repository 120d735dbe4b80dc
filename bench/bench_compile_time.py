"""First-call (compile) time of kiln.jit: capture_mode="bytecode" against "trace" (issue 33, item 5).

    flock /tmp/kiln-bench.lock env PYTHONPATH=python python3 bench/bench_compile_time.py [--size default] [--repeat 3]
                                                                                    [--quick]

Target: bytecode capture's first call with backward <= 1.2x trace capture's, on the seed workloads
in kiln.bench's forward+backward form (value_and_grad of the jitted model over its trainable
parameters; the simple function a*b+c over its three inputs), at O0 and O1; and no compile phase
above 100 ms that explain() does not name.

Each measurement runs in a fresh process (no code-object entries, no in-memory kernels) with an
empty KILN_CACHE_DIR (no compiled kernels on disk), after one eager call of the workload (so that
the process's first use of BLAS, threads and memory is not counted): the time of building the
jitted callable and its first call. The modes take turns, repetition by repetition; a figure is
the median of --repeat (3x --repeat where the first is under 50 ms). Below each row: the compile phases of that first call as explain() lists
them (ms, the largest first, those under 5 ms left out; "capture" holds the others), and the last
line names any phase over 100 ms that a kiln.profiler.profile of the first call (one more process,
not timed) recorded and explain() did not list.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

PHASE_LIMIT_S = 0.1  # a phase longer than this must be named by explain()


def _workload(key, size):
    import numpy as np

    import kiln
    from kiln import models
    from kiln.bench import workloads

    if key == "simple-fwdbwd":  # the tutorial's function; its gradient over its three inputs
        rng = np.random.default_rng(1)
        shape = workloads.SIZES[size].simple_shape
        args = tuple(kiln.Tensor(rng.standard_normal(shape).astype(np.float32))
                     for _ in range(3))
        return models.simple_function, args, lambda f: kiln.value_and_grad(f, (0, 1, 2))
    wl = next(w for w in workloads.make_workloads(workloads.SIZES[size]) if w.key == key)
    weights = wl.model.trainable_params() if wl.backward else None
    return wl.model, wl.args0, (lambda f: kiln.value_and_grad(f, None, weights)) if wl.backward else (lambda f: f)


def worker(mode, level, key, size, profiled):
    """One first call in this (fresh) process: prints a JSON line. profiled: the call runs inside
    kiln.profiler.profile (not timed), for the phases it records on any thread."""
    import contextlib
    import io

    import kiln

    model, args, wrap = _workload(key, size)
    wrap(model)(*args)  # eager, once
    prof = kiln.profiler.profile() if profiled == "profiled" else contextlib.nullcontext()
    with prof:
        t0 = time.perf_counter()
        jf = kiln.jit(model, capture_mode=mode, jit_level=level)
        wrap(jf)(*args)
        seconds = time.perf_counter() - t0
    recorded = {}
    if profiled == "profiled":
        for e in prof.events():
            if e["kind"] == "phase":
                recorded[e["name"]] = recorded.get(e["name"], 0) + (e["end"] - e["start"]) / 1e9
    with contextlib.redirect_stdout(io.StringIO()):
        report = jf.explain()
    print(json.dumps({"seconds": seconds, "phases": getattr(report, "phases", []), "text": str(report), "recorded": recorded}))


def measure(mode, level, key, size, profiled=False):
    env = dict(os.environ)
    with tempfile.TemporaryDirectory(prefix="kiln-cache-") as cache:
        env["KILN_CACHE_DIR"] = cache
        out = subprocess.run([sys.executable, __file__, "--worker", mode, level, key, size,
                              "profiled" if profiled else "timed"], env=env, capture_output=True, text=True,
                             check=False)
    if out.returncode:
        raise RuntimeError(f"{mode} {level} {key}: worker failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="default", choices=("smallest", "default", "full"),
                    help="kiln.bench's sizes (default: %(default)s)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="one repetition")
    ap.add_argument("--levels", default="O0,O1")
    ap.add_argument("--only", default="simple-fwdbwd,conv-fwdbwd,attention-fwdbwd",
                    help="workloads, comma-separated (kiln.bench's keys, and simple-fwdbwd)")
    ap.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return worker(*a.worker)
    keys, levels = a.only.split(","), a.levels.split(",")
    if a.quick:
        a.repeat = 1
    missed = False
    print(f"kiln.jit first call with backward, bytecode vs trace capture (size {a.size}, median of {a.repeat} "
          "(of 3x as many under 50 ms), fresh process and compile cache each)")
    print(f"{'workload':<18} {'level':<5} {'trace ms':>9} {'bytecode ms':>12} {'ratio':>6}  target <= 1.2")
    unnamed = []
    for key in keys:
        for level in levels:
            got = {"trace": [], "bytecode": []}
            rep = 0
            while rep < a.repeat * (3 if got["trace"] and got["trace"][0]["seconds"] < 0.05 else 1):
                for mode in got:  # (first calls of a few ms: 3x the repetitions, the machine's noise is larger)
                    got[mode].append(measure(mode, level, key, a.size))
                rep += 1
            t = {m: statistics.median(r["seconds"] for r in rs) for m, rs in got.items()}
            ratio = t["bytecode"] / t["trace"]
            mark = "" if ratio <= 1.2 else "  OVER"
            missed |= ratio > 1.2
            print(f"{key:<18} {level:<5} {t['trace'] * 1e3:9.0f} {t['bytecode'] * 1e3:12.0f} {ratio:6.2f}{mark}")
            for mode, rs in got.items():
                phases = sorted(rs[-1]["phases"], key=lambda p: -p[2])
                shown = [f"{n} {s * 1e3:.0f}" + (f" ({c}x)" if c > 1 else "") for n, c, s in phases if s >= 0.005]
                print(f"    {mode} phases (ms): {', '.join(shown) or '-'}")
                # the phases a profile of the first call records, against explain()'s names
                seen = measure(mode, level, key, a.size, profiled=True)
                named = {n for n, _, _ in seen["phases"]}  # (none before explain() listed phases)
                unnamed += [f"{key} {level} {mode}: {n} {s * 1e3:.0f} ms" for n, s in seen["recorded"].items()
                            if s > PHASE_LIMIT_S and n not in named]
    print("compile phases over 100 ms that explain() does not name: " + ("; ".join(unnamed) or "none"))
    return 1 if missed or unnamed else 0


if __name__ == "__main__":
    sys.exit(main())
