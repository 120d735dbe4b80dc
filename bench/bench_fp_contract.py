"""What compiling generated C with -ffp-contract=off costs (issue 33 item 7): a fused elementwise
chain of multiply-adds (Horner's rule, 8 steps) jitted at O1, its generated kernel compiled once
with kiln's flags (contraction off, as the interpreted kernels are built: ISO C11 leaves GCC's
contraction off) and once with a compiler wrapper that turns the flag into -ffp-contract=fast,
each in its own process and compile cache. Prints the best time per call of each, the ratio,
and whether each result is bitwise the eager one (it exits 1 when kiln's own is not).

    flock /tmp/kiln-bench.lock env PYTHONPATH=python python3 bench/bench_fp_contract.py [--quick]
"""
import argparse
import json
import os
import stat
import subprocess
import sys
import tempfile


CHILD = r"""
import json, sys, time
import numpy as np
import kiln

n, runs = int(sys.argv[1]), int(sys.argv[2])
x = kiln.tensor(np.random.default_rng(0).uniform(-1, 1, n).astype(np.float32))
COEF = (0.5, -1.25, 0.75, 2.0, -0.5, 1.5, -2.25, 0.25)


def horner(x):
    y = x * COEF[0] + COEF[1]
    for c in COEF[2:]:
        y = y * x + c
    return y


f = kiln.jit(horner, jit_level="O1", capture_mode="trace")
f(x)  # (the first call traces: it runs eagerly)
out = f(x)
calls = max(1, 2_000_000 // n)
best = float("inf")
for _ in range(runs):
    t0 = time.perf_counter()
    for _ in range(calls):
        f(x)
    best = min(best, (time.perf_counter() - t0) / calls)
print(json.dumps({"seconds": best, "bitwise": bool(np.array_equal(out.asnumpy(), horner(x).asnumpy())),
                  "fused": f.graph_str().count("= fused(")}))
"""

WRAPPER = """#!/bin/sh
# kiln's compiler flags with -ffp-contract=off turned into -ffp-contract=fast
for a do
  shift
  [ "$a" = -ffp-contract=off ] && a=-ffp-contract=fast
  set -- "$@" "$a"
done
exec {cc} "$@"
"""


def measure(n, runs, cc, where):
    env = dict(os.environ, CC=cc, KILN_CACHE_DIR=os.path.join(where, "cache-" + os.path.basename(cc.split()[0])))
    out = subprocess.run([sys.executable, "-c", CHILD, str(n), str(runs)], env=env, check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer timed rounds")
    a = p.parse_args()
    runs = 3 if a.quick else 7
    cc = os.environ.get("CC", "cc")
    with tempfile.TemporaryDirectory() as where:
        wrapper = os.path.join(where, "cc-contract")
        with open(wrapper, "w") as fh:
            fh.write(WRAPPER.format(cc=cc))
        os.chmod(wrapper, stat.S_IRWXU)
        ok = True
        for n in (1 << 14, 1 << 22):  # in cache; from memory
            off, on = measure(n, runs, cc, where), measure(n, runs, wrapper, where)
            print(f"{n} elements: fused groups {off['fused']}; bitwise the eager result: contract off "
                  f"{off['bitwise']}, contract fast {on['bitwise']}")
            print(f"Horner x8, {n:>8} elements: contract off (kiln) {off['seconds'] * 1e6:10.2f} us, contract fast "
                  f"{on['seconds'] * 1e6:10.2f} us: off costs {off['seconds'] / on['seconds']:.2f}x")
            ok &= off["bitwise"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
