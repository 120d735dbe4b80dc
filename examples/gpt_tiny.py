"""A small GPT (token and position embeddings, causal self-attention, GELU MLP, pre-LayerNorm
blocks) trained character by character on bundled text (this repository's ARCHITECTURE.md) with
AdamW, a warm-up + cosine learning-rate schedule and gradient clipping, eagerly or under kiln.jit;
then greedy generation from a prompt.

    PYTHONPATH=python python3 examples/gpt_tiny.py [--steps 300] [--mode ast|bytecode|trace|eager]

Prints the loss every 50 steps (it falls from ln(vocabulary) ~ 4.4 to under 2.5) and a sample."""
import argparse
import math
import pathlib

import numpy as np

import kiln
from kiln import nn, ops
from training import train_step

TEXT = pathlib.Path(__file__).resolve().parents[1] / "ARCHITECTURE.md"


class CausalSelfAttention(nn.Cell):
    def __init__(self, dim, heads, context):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.qkv = nn.Dense(dim, 3 * dim)
        self.proj = nn.Dense(dim, dim)
        # -inf above the diagonal: position t attends to positions <= t
        self.mask = kiln.Tensor(np.triu(np.full((context, context), -1e9, np.float32), 1))

    def construct(self, x):
        b, t, c = x.shape
        q, k, v = ops.split(self.qkv(x), c, axis=-1)
        q, k, v = (z.reshape(b, t, self.heads, self.head_dim).transpose(0, 2, 1, 3) for z in (q, k, v))
        scores = ops.matmul(q, k.transpose(0, 1, 3, 2)) * (1.0 / math.sqrt(self.head_dim)) + self.mask[:t, :t]
        out = ops.matmul(ops.softmax(scores, -1), v)
        return self.proj(out.transpose(0, 2, 1, 3).reshape(b, t, c))


class Block(nn.Cell):
    def __init__(self, dim, heads, context):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm((dim,)), nn.LayerNorm((dim,))
        self.attn = CausalSelfAttention(dim, heads, context)
        self.mlp = nn.SequentialCell(nn.Dense(dim, 4 * dim), nn.GELU(), nn.Dense(4 * dim, dim))

    def construct(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Cell):
    def __init__(self, vocab, dim=64, heads=4, layers=2, context=64):
        super().__init__()
        self.tokens = nn.Embedding(vocab, dim)
        self.positions = nn.Embedding(context, dim)
        self.blocks = nn.SequentialCell(*[Block(dim, heads, context) for _ in range(layers)])
        self.ln = nn.LayerNorm((dim,))
        self.head = nn.Dense(dim, vocab, has_bias=False)
        self.position_ids = kiln.Tensor(np.arange(context, dtype=np.int64))

    def construct(self, idx):
        t = idx.shape[1]
        x = self.tokens(idx) + self.positions(self.position_ids[:t])
        return self.head(self.ln(self.blocks(x)))


def corpus():
    text = TEXT.read_text(encoding="utf-8")
    chars = sorted(set(text))
    return np.array([chars.index(c) for c in text], np.int64), chars


def make_step(model, mode, steps, max_lr=3e-3):
    loss_fn = nn.CrossEntropyLoss()
    schedule = nn.WarmUpCosineDecayLR(max_lr / 10, max_lr, max(1, steps // 10), steps)
    opt = nn.AdamW(model.trainable_params(), lr=schedule, weight_decay=0.01)

    def loss_of(x, y):
        logits = model(x)
        return loss_fn(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))

    return train_step(loss_of, opt, mode, clip=1.0)


def batches(data, batch, context, seed):
    rng = np.random.default_rng(seed)
    while True:
        starts = rng.integers(0, len(data) - context - 1, batch)
        x = np.stack([data[s:s + context] for s in starts])
        y = np.stack([data[s + 1:s + context + 1] for s in starts])
        yield kiln.Tensor(x), kiln.Tensor(y)


def train(steps=300, mode="ast", batch=16, context=64, seed=0, log=print):
    """Trains a fresh model; returns (model, vocabulary, losses)."""
    kiln.manual_seed(seed)
    data, chars = corpus()
    model = GPT(len(chars), context=context)
    model.set_train()
    step = make_step(model, mode, steps)
    losses = []
    for i, (x, y) in zip(range(steps), batches(data, batch, context, seed)):
        losses.append(float(step(x, y).asnumpy()))
        if (i + 1) % 50 == 0 or i == 0:
            log(f"step {i + 1:4d}: loss {losses[-1]:.3f}")
    return model, chars, losses


def generate(model, chars, prompt, tokens=80, context=64):
    model.set_train(False)
    idx = [chars.index(c) for c in prompt if c in chars]
    for _ in range(tokens):
        window = kiln.Tensor(np.array([idx[-context:]], np.int64))
        idx.append(int(model(window).asnumpy()[0, -1].argmax()))
    return "".join(chars[i] for i in idx)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--mode", default="ast", choices=["ast", "bytecode", "trace", "eager"])
    args = p.parse_args()
    model, chars, _ = train(args.steps, args.mode)
    print(repr(generate(model, chars, "The graph ")))


if __name__ == "__main__":
    main()
