"""GEMM epilogue fusion benchmark: a product followed by bias, activation and residual steps,
compiled at O1 (the fuse_matmul_epilogue pass makes one matmul_epilogue node) against O0 (the
product and each step as separate kernels) and against the bare product of the same shape, every
figure a ratio measured in the same run.

    flock /tmp/kiln_bench.lock env PYTHONPATH=python python3 bench/bench_gemm_fusion.py [--quick]

Targets (issue 33 item 3), forward: the fused node is at least as fast as the unfused ops
(O1 / O0 <= 1.0) and within 1.1x of the bare product (O1 / bare <= 1.1). Forward + backward
(kiln.grad under kiln.jit) is printed against O0 and the bare product's forward + backward for
reference: there a gradient rule that needs an intermediate (gelu's input) keeps it out of the
chain, so less is fused.
"""
import argparse
import sys

import numpy as np

import kiln
from kiln import ops
from timing import best_time, row


def interleaved(fns, rounds, number):
    """Best per-call time of each of fns over short interleaved rounds: a busy moment on a shared
    machine hits them alike."""
    best = [float("inf")] * len(fns)
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            best[i] = min(best[i], best_time(fn, 1, number))
    return best


def mlp_up(x, w, b):  # GPT MLP, first layer: dense + bias + gelu
    return ops.gelu(ops.dense(x, w, b))


def mlp_down(x, w, b, r):  # GPT MLP, second layer: dense + bias + residual
    return ops.dense(x, w, b) + r


def attn_out(x, w, b, r):  # attention block's output projection + residual
    return ops.dense(x, w, b) + r


def small_relu(x, w, b):  # a 512x512 linear + relu
    return ops.relu(ops.dense(x, w, b))


def scores(q, k):  # attention scores: batched q @ k^T scaled
    return ops.matmul(q, ops.swapaxes(k, -1, -2)) * 0.125


def bare_dense(x, w, *_):
    return ops.dense(x, w)


def bare_matmul(q, k):
    return ops.matmul(q, ops.swapaxes(k, -1, -2))


# name, function, bare product, operand shapes, multiply-adds
CASES = [
    ("2048x768 @ 768x3072 +b gelu", mlp_up, bare_dense, [(2048, 768), (3072, 768), (3072,)], 2048 * 768 * 3072),
    ("2048x3072 @ 3072x768 +b +res", mlp_down, bare_dense, [(2048, 3072), (768, 3072), (768,), (2048, 768)],
     2048 * 3072 * 768),
    ("2048x768 @ 768x768 +b +res", attn_out, bare_dense, [(2048, 768), (768, 768), (768,), (2048, 768)],
     2048 * 768 * 768),
    ("512x512 @ 512x512 +b relu", small_relu, bare_dense, [(512, 512), (512, 512), (512,)], 512 ** 3),
    ("4x12x256x64 @ ^T *0.125", scores, bare_matmul, [(4, 12, 256, 64), (4, 12, 256, 64)], 48 * 256 * 256 * 64),
]


def fused_nodes(fn):
    return fn.graph_str().split("subgraph")[0].count("= matmul_epilogue(")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer repeats")
    p.add_argument("--forward", action="store_true", help="forward only")
    args = p.parse_args()
    rounds = 4 if args.quick else 8
    print(f"kiln {kiln.__version__}, {kiln.get_num_threads()} threads, float32")
    rng = np.random.default_rng(0)
    ok = True
    for name, f, bare, shapes, macs in CASES:
        xs = [kiln.Tensor(rng.uniform(-1, 1, s).astype(np.float32)) for s in shapes]
        j1, j0, jb = kiln.jit(f, jit_level="O1"), kiln.jit(f, jit_level="O0"), kiln.jit(bare, jit_level="O0")
        for j in (j1, j0, jb):
            j(*xs), j(*xs)
        assert fused_nodes(j1) == 1 and fused_nodes(j0) == 0, j1.graph_str()
        np.testing.assert_array_equal(j1(*xs).asnumpy(), j0(*xs).asnumpy())
        number = max(1, int(2e8 // macs))
        t1, t0, tb = interleaved([lambda: j1(*xs), lambda: j0(*xs), lambda: jb(*xs)], rounds, number)
        print(f"-- {name}: O1 {t1 * 1e3:.2f} ms ({2 * macs / t1 / 1e9:.1f} GFLOP/s), O0 {t0 * 1e3:.2f} ms, "
              f"bare product {tb * 1e3:.2f} ms ({2 * macs / tb / 1e9:.1f} GFLOP/s)")
        ok &= row(f"fwd {name} O1/O0", t1 * 1e3, "ms", "O0 (unfused)", t0 * 1e3, t1 / t0, 1.0)
        ok &= row(f"fwd {name} O1/bare", t1 * 1e3, "ms", "bare product", tb * 1e3, t1 / tb, 1.1)

        if args.forward:
            continue
        pos = tuple(range(len(xs)))
        loss = lambda *a, f=f: ops.sum(f(*a))  # noqa: E731
        loss_b = lambda *a, bare=bare: ops.sum(bare(*a))  # noqa: E731
        g1 = kiln.jit(kiln.grad(loss, pos), jit_level="O1")
        g0 = kiln.jit(kiln.grad(loss, pos), jit_level="O0")
        gb = kiln.jit(kiln.grad(loss_b, pos[:2]), jit_level="O0")
        for g in (g1, g0, gb):
            g(*xs), g(*xs)
        t1, t0, tb = interleaved([lambda: g1(*xs), lambda: g0(*xs), lambda: gb(*xs)], rounds, 1)
        row(f"fwd+bwd {name} O1/O0", t1 * 1e3, "ms", "O0 (unfused)", t0 * 1e3, t1 / t0, 1.0)
        row(f"fwd+bwd {name} O1/bare", t1 * 1e3, "ms", "bare product fwd+bwd", tb * 1e3, t1 / tb, 1.1)
    print("all forward targets met" if ok else "some forward targets MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
