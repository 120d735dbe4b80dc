"""A Llama-style decoder (RMSNorm, rotary position embeddings, SwiGLU MLP, grouped-query attention)
generating tokens greedily with a KV cache: one jitted decode step serves every cache length
through kiln.jit's dynamic shapes, compiling a bounded number of times however long the text grows.

    PYTHONPATH=python python3 examples/llama_decode.py [--tokens 64] [--mode ast|bytecode|trace|eager]

Prints the generated token ids, tokens per second, and the number of compiles."""
import argparse
import time

import numpy as np

import kiln
from kiln import nn, ops


def rotate(x, cos, sin):
    """Rotary embedding of x (..., d) at the positions cos and sin (..., d) were taken for."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return x * cos + ops.concat((-x2, x1), -1) * sin


class Attention(nn.Cell):
    def __init__(self, dim, heads, kv_heads):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.q = nn.Dense(dim, dim, has_bias=False)
        self.k = nn.Dense(dim, kv_heads * self.head_dim, has_bias=False)
        self.v = nn.Dense(dim, kv_heads * self.head_dim, has_bias=False)
        self.o = nn.Dense(dim, dim, has_bias=False)

    def construct(self, x, cos, sin, k_cache, v_cache):
        b = x.shape[0]
        q = self.q(x).reshape(b, 1, self.heads, self.head_dim).transpose(0, 2, 1, 3)
        k = self.k(x).reshape(b, 1, self.kv_heads, self.head_dim).transpose(0, 2, 1, 3)
        v = self.v(x).reshape(b, 1, self.kv_heads, self.head_dim).transpose(0, 2, 1, 3)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        k_cache, v_cache = ops.concat((k_cache, k), 2), ops.concat((v_cache, v), 2)
        out = ops.scaled_dot_product_attention(q, k_cache, v_cache)  # query head h uses kv head h // 2
        return self.o(out.transpose(0, 2, 1, 3).reshape(b, 1, -1)), k_cache, v_cache


class SwiGLU(nn.Cell):
    def __init__(self, dim, hidden):
        super().__init__()
        self.gate = nn.Dense(dim, hidden, has_bias=False)
        self.up = nn.Dense(dim, hidden, has_bias=False)
        self.down = nn.Dense(hidden, dim, has_bias=False)

    def construct(self, x):
        return self.down(ops.silu(self.gate(x)) * self.up(x))


class Layer(nn.Cell):
    def __init__(self, dim, heads, kv_heads):
        super().__init__()
        self.attn_norm, self.mlp_norm = nn.RMSNorm((dim,)), nn.RMSNorm((dim,))
        self.attn = Attention(dim, heads, kv_heads)
        self.mlp = SwiGLU(dim, 4 * dim)

    def construct(self, x, cos, sin, k_cache, v_cache):
        h, k_cache, v_cache = self.attn(self.attn_norm(x), cos, sin, k_cache, v_cache)
        x = x + h
        return x + self.mlp(self.mlp_norm(x)), k_cache, v_cache


class Llama(nn.Cell):
    def __init__(self, vocab=256, dim=128, heads=8, kv_heads=2, layers=2, max_len=4096):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.CellList([Layer(dim, heads, kv_heads) for _ in range(layers)])
        self.norm = nn.RMSNorm((dim,))
        self.head = nn.Dense(dim, vocab, has_bias=False)
        head_dim = dim // heads
        angles = np.arange(max_len)[:, None] / 10000.0 ** (np.arange(0, head_dim, 2) / head_dim)
        angles = np.concatenate([angles, angles], axis=1).astype(np.float32)
        self.cos, self.sin = kiln.Tensor(np.cos(angles)), kiln.Tensor(np.sin(angles))
        self.kv_shape = (kv_heads, head_dim)

    def construct(self, token, position, caches):
        """Logits of the next token after token (1, 1) at position (1,), and the caches grown by one."""
        x = self.embed(token)
        cos, sin = self.cos[position], self.sin[position]
        new = []
        for layer, (k, v) in zip(self.layers, caches):
            x, k, v = layer(x, cos, sin, k, v)
            new.append((k, v))
        return self.head(self.norm(x)), new

    def empty_caches(self):
        z = np.zeros((1, self.kv_shape[0], 0, self.kv_shape[1]), np.float32)
        return [(kiln.Tensor(z), kiln.Tensor(z)) for _ in self.layers]


def generate(model, step, prompt, tokens):
    """Greedy decoding: the prompt's tokens through the cache, then `tokens` new ones."""
    caches, out = model.empty_caches(), list(prompt)
    logits = None
    for pos in range(len(prompt) + tokens - 1):
        token = kiln.Tensor(np.array([[out[pos]]], np.int64))
        logits, caches = step(token, kiln.Tensor(np.array([pos], np.int64)), caches)
        if pos >= len(prompt) - 1:
            out.append(int(logits.asnumpy()[0, -1].argmax()))
    return out[len(prompt):]


def run(tokens=64, mode="ast", seed=0):
    """(generated ids, seconds per token, compiles) for a fresh model with seeded weights."""
    kiln.manual_seed(seed)
    model = Llama()
    model.set_train(False)
    step = model.construct if mode == "eager" else kiln.jit(model.construct, capture_mode=mode)
    start = time.perf_counter()
    ids = generate(model, step, [1, 2, 3, 4], tokens)
    per_token = (time.perf_counter() - start) / (tokens + 3)
    compiles = 0 if mode == "eager" else step.cache_info().compiles
    return ids, per_token, compiles


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--mode", default="ast", choices=["ast", "bytecode", "trace", "eager"])
    args = p.parse_args()
    ids, per_token, compiles = run(args.tokens, args.mode)
    print("generated:", ids)
    print(f"{1 / per_token:.1f} tokens/s, {compiles} compiles for {args.tokens} tokens")


if __name__ == "__main__":
    main()
