"""Token-by-token decoding with a growing KV cache (issue 27): a Llama-style attention decode step
(q/k/v projections of one new token, the new key and value appended to the cache, grouped-query
attention over the whole cache, the output projection) jitted with automatic dynamic shapes
against the same step run eagerly, in the same run.

    PYTHONPATH=python python3 bench/bench_kv_decode.py [--tokens N] [--rounds R]

Each round decodes N tokens (cache length 1..N) with both; the jitted step sees a new cache
length at every call, so each token is served by the dynamic entry's instance for that length
(made on its first use, then kept: kiln.jit.dynamic's bound-instance limit). Printed: compiles,
instances, and the time per token jitted / eager of the best round (target <= 1.0: compiling must
not make decoding slower than eager). Threads: kiln's default."""
import argparse
import time

import numpy as np

import kiln
from kiln import nn, ops


class DecodeStep(nn.Cell):
    def __init__(self, hidden=256, heads=8, kv_heads=2):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, hidden // heads
        self.q = nn.Dense(hidden, hidden, has_bias=False)
        self.k = nn.Dense(hidden, kv_heads * self.head_dim, has_bias=False)
        self.v = nn.Dense(hidden, kv_heads * self.head_dim, has_bias=False)
        self.o = nn.Dense(hidden, hidden, has_bias=False)

    def construct(self, x, k_cache, v_cache):
        b = x.shape[0]
        q = self.q(x).reshape(b, 1, self.heads, self.head_dim).transpose(0, 2, 1, 3)
        k = self.k(x).reshape(b, 1, self.kv_heads, self.head_dim).transpose(0, 2, 1, 3)
        v = self.v(x).reshape(b, 1, self.kv_heads, self.head_dim).transpose(0, 2, 1, 3)
        k_cache = ops.concat((k_cache, k), 2)
        v_cache = ops.concat((v_cache, v), 2)
        out = ops.scaled_dot_product_attention(q, k_cache, v_cache)
        return self.o(out.transpose(0, 2, 1, 3).reshape(b, 1, -1)), k_cache, v_cache


def decode(step, tokens, xs, hidden, kv_heads, head_dim):
    k = kiln.Tensor(np.zeros((1, kv_heads, 0, head_dim), np.float32))
    v = kiln.Tensor(np.zeros((1, kv_heads, 0, head_dim), np.float32))
    t0 = time.perf_counter()
    for t in range(tokens):
        y, k, v = step(xs[t], k, v)
    return (time.perf_counter() - t0) / tokens, y


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="64 tokens")
    args = parser.parse_args()
    if args.quick:
        args.tokens = min(args.tokens, 64)
    kiln.manual_seed(0)
    hidden, heads, kv_heads = 256, 8, 2
    net = DecodeStep(hidden, heads, kv_heads)
    rng = np.random.default_rng(0)
    xs = [kiln.Tensor(rng.standard_normal((1, 1, hidden)).astype(np.float32)) for _ in range(args.tokens)]
    jitted = kiln.jit(net.construct, jit_level="O1")
    best_eager = best_jit = float("inf")
    for _ in range(args.rounds):
        te, ye = decode(net.construct, args.tokens, xs, hidden, kv_heads, hidden // heads)
        tj, yj = decode(jitted, args.tokens, xs, hidden, kv_heads, hidden // heads)
        np.testing.assert_allclose(yj.asnumpy(), ye.asnumpy(), rtol=1e-4, atol=1e-5)
        best_eager, best_jit = min(best_eager, te), min(best_jit, tj)
    info = jitted.cache_info()
    print(f"kv-cache decode, {args.tokens} tokens, hidden {hidden}, {heads} heads / {kv_heads} kv heads")
    print(f"compiles {info.compiles}, instances {info.instances}")
    ratio = best_jit / best_eager
    print(f"per token: jitted {best_jit * 1e6:9.1f} us   eager {best_eager * 1e6:9.1f} us   "
          f"ratio {ratio:.3f} (target <= 1.0) {'ok' if ratio <= 1.0 else 'MISSED'}")


if __name__ == "__main__":
    main()
