"""Per-call cost of kiln.trace on small functions, with and without verify (verify=True, the
default, records the function again on every call and compares the recordings), in us/call:
a few elementwise ops on 2x3 float32, and a small Cell with parameters (two Dense layers).

    PYTHONPATH=python python3 bench/bench_trace_call.py [--baseline DIR] [--rounds N] [--calls N]

--baseline DIR: the python/ directory of another checkout (its _C*.so built). Each round measures
this tree and the baseline in turn, each in a fresh subprocess, so both see the same machine load;
the best time per variant is kept and the ratio current/baseline printed (issue 29: <= 1.03).
--clock cpu (default) times with the process's CPU time (time.process_time: the calls run on one
thread, and time other processes take from a shared machine is not counted; their effect on caches
still is), --clock wall with time.perf_counter. Wrap it in `flock /tmp/kiln_bench.lock` on a
shared machine.
"""
import argparse
import json
import os
import subprocess
import sys

VARIANTS = ("elementwise verify", "elementwise no-verify", "cell verify", "cell no-verify")

_MEASURE = r"""
import json, sys, time
import numpy as np
import kiln
from kiln import nn
calls = int(sys.argv[1])
clock = time.process_time if sys.argv[2] == "cpu" else time.perf_counter
rng = np.random.default_rng(0)
a, b, c = [kiln.Tensor(rng.standard_normal((2, 3)).astype(np.float32)) for _ in range(3)]
x = kiln.Tensor(rng.standard_normal((4, 8)).astype(np.float32))

def elementwise(a, b, c):
    return kiln.ops.relu(a * b + c) - a

class Small(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Dense(8, 16)
        self.fc2 = nn.Dense(16, 4)

    def construct(self, x):
        return self.fc2(kiln.ops.relu(self.fc1(x)))

cell = Small()
cell.set_train(False)
cases = {}
for verify in (True, False):
    tag = "verify" if verify else "no-verify"
    cases[f"elementwise {tag}"] = (kiln.trace(elementwise, verify=verify), (a, b, c), elementwise)
    cases[f"cell {tag}"] = (kiln.trace(cell, verify=verify), (x,), cell)
out = {}
for name, (fn, args, eager) in cases.items():
    np.testing.assert_allclose(fn(*args).asnumpy(), eager(*args).asnumpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(fn(*args).asnumpy(), eager(*args).asnumpy(), rtol=1e-5, atol=1e-6)
    n = calls if "no-verify" in name else max(calls // 10, 1)
    best = float("inf")
    for _ in range(5):
        t0 = clock()
        for _ in range(n):
            fn(*args)
        best = min(best, (clock() - t0) / n)
    out[name] = best * 1e6
print(json.dumps(out))
"""


def measure(python_dir, calls, clock):
    env = dict(os.environ, PYTHONPATH=os.path.abspath(python_dir))
    res = subprocess.run([sys.executable, "-c", _MEASURE, str(calls), clock], env=env, capture_output=True, text=True,
                         check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline", help="python/ directory of the checkout to compare with")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--calls", type=int, default=20000, help="calls per timing without verify (a tenth with)")
    p.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    args = p.parse_args()
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python")
    best = {"current": {}, "baseline": {}}
    for _ in range(args.rounds):
        trees = [("current", here)] + ([("baseline", args.baseline)] if args.baseline else [])
        for label, d in trees:
            for name, t in measure(d, args.calls, args.clock).items():
                best[label][name] = min(best[label].get(name, float("inf")), t)
    for name in VARIANTS:
        cur = best["current"][name]
        line = f"{name:22s} current {cur:8.3f} us/call ({args.clock})"
        if args.baseline:
            base = best["baseline"][name]
            line += f"  baseline {base:8.3f} us/call  ratio {cur / base:.3f}  (target <= 1.03)"
        print(line)


if __name__ == "__main__":
    main()
