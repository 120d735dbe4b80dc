"""The attention core of kiln.models.LlamaAttention, softmax(q kᵀ / sqrt(d)) v with its query heads
folded per kv head (grouped-query attention without K/V copies), two ways, timed in alternating
rounds in one run: the unfused ops (matmul, div, softmax, matmul: the whole score matrix
materialized) and the fused op `attention` (blockwise, src/ops/attention.c), forward and
forward+backward (gradients of q, k, v), eager and jitted at O1. These ratios calibrated the cost
model by which kiln.ops.scaled_dot_product_attention and the O1 pass fuse_attention choose
(src/ops/attention_cost.c).
Every figure is a ratio fused / unfused measured in the same run (below 1: the fused op is faster).

    flock /tmp/kiln-bench.lock env PYTHONPATH=python python3 bench/bench_flash.py [--quick]

Shapes (batch 1, head dim 128, 4 query heads per kv head): the bench's default size (2 kv heads,
sequence 256), the seed's full size (8 kv heads, sequence 512) and a long sequence (2 kv heads,
sequence 2048; --quick: 1024). Target (issue 17 part 5): fused <= 1.0x unfused wherever
scaled_dot_product_attention runs the fused op.
"""
import argparse
import math

import numpy as np

import kiln
from kiln import ops
from kiln._optable import OP
from kiln.ops._util import apply
from timing import alternate

HEAD_DIM, N_REP = 128, 4


def unfused(q, k, v):
    s = ops.matmul(q, ops.swapaxes(k, -1, -2)) / math.sqrt(q.shape[-1])
    return ops.matmul(ops.softmax(s, -1), v)


def fused(q, k, v):  # the op itself: kiln.ops.scaled_dot_product_attention chooses by these figures
    return apply(OP.attention, (q, k, v), (), (1.0 / math.sqrt(q.shape[-1]),))[0]


def loss_of(f):
    return lambda q, k, v, w: ops.sum(f(q, k, v) * w)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer rounds, the long sequence at 1024")
    args = ap.parse_args()
    rounds = 3 if args.quick else 5
    shapes = [("default (2 kv heads, seq 256)", 2, 256), ("full (8 kv heads, seq 512)", 8, 512),
              ("long (2 kv heads, seq %d)" % (1024 if args.quick else 2048), 2, 1024 if args.quick else 2048)]
    rng = np.random.default_rng(0)
    ok = True
    print(f"{'shape':<34} {'variant':<22} {'unfused ms':>11} {'fused ms':>9}  ratio")
    for name, kvh, seq in shapes:
        q = kiln.Tensor(rng.standard_normal((1, kvh, N_REP * seq, HEAD_DIM)).astype(np.float32))
        k = kiln.Tensor(rng.standard_normal((1, kvh, seq, HEAD_DIM)).astype(np.float32))
        v = kiln.Tensor(rng.standard_normal((1, kvh, seq, HEAD_DIM)).astype(np.float32))
        w = kiln.Tensor(rng.standard_normal((1, kvh, N_REP * seq, HEAD_DIM)).astype(np.float32))
        variants = [
            ("forward, eager", unfused, fused, (q, k, v)),
            ("forward, jit O1", kiln.jit(unfused, jit_level="O1"), kiln.jit(fused, jit_level="O1"), (q, k, v)),
            ("fwd+bwd, eager", kiln.grad(loss_of(unfused), (0, 1, 2)), kiln.grad(loss_of(fused), (0, 1, 2)),
             (q, k, v, w)),
            ("fwd+bwd, jit O1", kiln.grad(kiln.jit(loss_of(unfused), jit_level="O1"), (0, 1, 2)),
             kiln.grad(kiln.jit(loss_of(fused), jit_level="O1"), (0, 1, 2)), (q, k, v, w)),
        ]
        for vname, fu, ff, xs in variants:
            fu(*xs), ff(*xs)  # capture and compile
            tu, tf = alternate(lambda: fu(*xs), lambda: ff(*xs), rounds, 1)
            ratio = tf / tu
            ok &= ratio <= 1.0
            print(f"{name:<34} {vname:<22} {tu * 1e3:11.2f} {tf * 1e3:9.2f}  {ratio:5.2f} "
                  f"{'ok' if ratio <= 1.0 else 'SLOWER'}")
    print("all fused <= unfused" if ok else "some fused rows slower than unfused")


if __name__ == "__main__":
    main()
