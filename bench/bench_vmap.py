"""kiln.vmap and kiln.jacrev (issue 34): per-example gradients of an MLP (4 x Dense 256, batch 128)
with kiln.jit(kiln.vmap(kiln.grad(f))) against

  - a Python loop of grad calls, one per example          (target: >= 10x faster)
  - one ordinary batched backward of the same MLP         (target: <= 1.5x its time)
  - torch.func.vmap(torch.func.grad(f)) when torch imports (target: >= 1.3x faster; run with
    /work/peers-venv/bin/python in a subprocess, or --torch-python)

and kiln.jacrev of a 256 -> 256 MLP (jitted) against 256 separate grad calls (target: >= 5x).

    PYTHONPATH=python python3 bench/bench_vmap.py [--repeats N] [--threads N] [--torch-python PATH]

--threads sets kiln's and torch's kernel threads alike (on a loaded 2-core machine 1 is the
steadiest: threads waiting for each other at every kernel dominate otherwise).
"""
import argparse
import os
import subprocess
import sys
import time

import numpy as np

WIDTH, DEPTH, BATCH = 256, 4, 128

_TORCH = r"""
import sys, time
import torch
from torch.func import grad, vmap
torch.manual_seed(0)
W, D, B, reps = 256, 4, 128, int(sys.argv[1])
torch.set_num_threads(int(sys.argv[2]))
params = [p for _ in range(D) for p in (torch.randn(W, W) / W ** 0.5, torch.zeros(W))]
x, y = torch.randn(B, W), torch.randn(B, W)
def loss(params, x, y):
    h = x
    for k in range(D):
        h = torch.nn.functional.linear(h, params[2 * k], params[2 * k + 1])
        if k < D - 1:
            h = torch.tanh(h)
    return ((h - y) ** 2).mean()
f = vmap(grad(loss), in_dims=(None, 0, 0))
f(params, x, y)
best = float("inf")
for _ in range(reps):
    t0 = time.perf_counter(); f(params, x, y); best = min(best, time.perf_counter() - t0)
print(best)
"""


def best_of(fn, repeats):
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--loop-examples", type=int, default=32,
                   help="examples the Python loop of grad calls runs (its time is scaled to the batch)")
    p.add_argument("--torch-python", default="/work/peers-venv/bin/python")
    p.add_argument("--threads", type=int, default=None, help="kernel threads (kiln and torch); default: kiln's")
    args = p.parse_args()

    import kiln
    from kiln import ops

    if args.threads:
        kiln.set_num_threads(args.threads)
    threads = args.threads or os.cpu_count() or 1
    print(f"threads: {args.threads or 'default'}")

    rng = np.random.default_rng(0)

    def tensor(*shape, scale=1.0):
        return kiln.tensor((rng.standard_normal(shape) * scale).astype(np.float32))

    params = [q for _ in range(DEPTH) for q in (tensor(WIDTH, WIDTH, scale=WIDTH ** -0.5), tensor(WIDTH, scale=0.0))]
    x, y = tensor(BATCH, WIDTH), tensor(BATCH, WIDTH)
    positions = tuple(range(len(params)))

    def loss(*a):
        ps, xb, yb = a[:-2], a[-2], a[-1]
        h = xb
        for k in range(DEPTH):
            h = ops.dense(h, ps[2 * k], ps[2 * k + 1])
            if k < DEPTH - 1:
                h = ops.tanh(h)
        return ((h - yb) ** 2).mean()

    per_example = kiln.jit(kiln.vmap(kiln.grad(loss, positions), in_axes=(None,) * len(params) + (0, 0)))
    batched = kiln.jit(kiln.grad(loss, positions))
    one = kiln.grad(loss, positions)

    got = per_example(*params, x, y)
    check = one(*params, x[3], y[3])
    np.testing.assert_allclose(got[0].numpy()[3], check[0].numpy(), rtol=1e-3, atol=1e-5)

    t_vmap = best_of(lambda: per_example(*params, x, y), args.repeats)
    n = min(args.loop_examples, BATCH)
    t_loop = best_of(lambda: [one(*params, x[i], y[i]) for i in range(n)], max(1, args.repeats // 2)) * BATCH / n
    t_batched = best_of(lambda: batched(*params, x, y), args.repeats)
    print(f"per-example gradients, MLP {DEPTH} x Dense {WIDTH}, batch {BATCH}:")
    print(f"  jit(vmap(grad(f)))            {t_vmap * 1e3:9.2f} ms")
    print(f"  Python loop of grad calls     {t_loop * 1e3:9.2f} ms   ratio {t_loop / t_vmap:6.2f}x  (target >= 10x)")
    print(f"  one batched backward (jit)    {t_batched * 1e3:9.2f} ms   vmap/batched {t_vmap / t_batched:6.2f}  "
          f"(target <= 1.5)")
    if os.path.exists(args.torch_python):
        res = subprocess.run([args.torch_python, "-c", _TORCH, str(args.repeats), str(threads)], capture_output=True,
                             text=True)
        if res.returncode == 0:
            t_torch = float(res.stdout.strip().splitlines()[-1])
            print(f"  torch.func.vmap(grad(f))      {t_torch * 1e3:9.2f} ms   ratio {t_torch / t_vmap:6.2f}x  "
                  f"(target >= 1.3x)")
        else:
            print(f"  torch.func: not run ({res.stderr.strip().splitlines()[-1] if res.stderr.strip() else 'failed'})")
    else:
        print("  torch.func: not run (no torch interpreter)")

    # jacrev of a 256 -> 256 MLP
    w1, b1, w2, b2 = tensor(WIDTH, WIDTH, scale=WIDTH ** -0.5), tensor(WIDTH), tensor(WIDTH, WIDTH,
                                                                                       scale=WIDTH ** -0.5), tensor(WIDTH)

    def mlp(v):
        return ops.dense(ops.tanh(ops.dense(v, w1, b1)), w2, b2)

    v = tensor(WIDTH)
    jac = kiln.jit(kiln.jacrev(mlp))
    J = jac(v).numpy()
    row = kiln.grad(lambda v: mlp(v)[7])(v).numpy()
    np.testing.assert_allclose(J[7], row, rtol=1e-3, atol=1e-5)
    grads = [kiln.grad(lambda v, i=i: mlp(v)[i]) for i in range(WIDTH)]
    t_jac = best_of(lambda: jac(v), args.repeats)
    t_rows = best_of(lambda: [g(v) for g in grads], max(1, args.repeats // 2))
    print(f"jacrev of a {WIDTH} -> {WIDTH} MLP:")
    print(f"  jit(jacrev(f))                {t_jac * 1e3:9.2f} ms")
    print(f"  {WIDTH} grad calls                {t_rows * 1e3:9.2f} ms   ratio {t_rows / t_jac:6.2f}x  (target >= 5x)")


if __name__ == "__main__":
    sys.exit(main())
