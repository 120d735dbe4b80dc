"""PyTorch twins of the zoo's models (same structure and parameter names), weights copied from the
kiln model, for the parity tests (tests/python/test_examples.py) and the side-by-side benchmark
(bench/bench_zoo.py). Imported only where torch is installed."""
import math

import numpy as np
import torch
from torch import nn

# kiln's parameter names -> PyTorch's (MindSpore spells BatchNorm/LayerNorm/Embedding's differently)
_RENAMES = {"gamma": "weight", "beta": "bias", "embedding_table": "weight", "moving_mean": "running_mean",
            "moving_variance": "running_var"}


def copy_weights(kiln_net, twin):
    """Every parameter and BatchNorm statistic of kiln_net into twin, by name; raises on a
    parameter of either that the other lacks or of another shape."""
    state = twin.state_dict()
    seen = set()
    for name, p in kiln_net.parameters_and_names():
        head, _, leaf = name.rpartition(".")
        tname = f"{head}.{_RENAMES.get(leaf, leaf)}" if head else _RENAMES.get(leaf, leaf)
        if tname not in state or tuple(state[tname].shape) != tuple(p.shape):
            raise KeyError(f"copy_weights: kiln parameter {name} {tuple(p.shape)} has no twin {tname}")
        state[tname] = torch.from_numpy(np.ascontiguousarray(p.asnumpy()))
        seen.add(tname)
    missing = [k for k in state if k not in seen and not k.endswith("num_batches_tracked")]
    if missing:
        raise KeyError(f"copy_weights: torch parameters without a kiln twin: {missing}")
    twin.load_state_dict(state)
    return twin


class LeNet5(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 6, 5, bias=False), nn.ReLU(), nn.MaxPool2d(2, 2),
                                      nn.Conv2d(6, 16, 5, bias=False),
                                      nn.ReLU(), nn.MaxPool2d(2, 2), nn.Flatten())
        self.classifier = nn.Sequential(nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
                                        nn.Linear(84, num_classes))

    def forward(self, x):
        return self.classifier(self.features(x))


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + (x if self.down is None else self.down(x)))


class ResNet18(nn.Module):
    def __init__(self, num_classes=10, width=64):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        blocks, cin = [], width
        for i, cout in enumerate([width, 2 * width, 4 * width, 8 * width]):
            blocks += [Block(cin, cout, 1 if i == 0 else 2), Block(cout, cout, 1)]
            cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x):
        return self.fc(self.blocks(self.stem(x)).mean(dim=(2, 3)))


class CausalSelfAttention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = (z.reshape(b, t, self.heads, self.head_dim).transpose(1, 2) for z in self.qkv(x).split(c, -1))
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(out.transpose(1, 2).reshape(b, t, c))


class GPTBlock(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(approximate="tanh"), nn.Linear(4 * dim, dim))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab, dim=64, heads=4, layers=2, context=64):
        super().__init__()
        self.tokens = nn.Embedding(vocab, dim)
        self.positions = nn.Embedding(context, dim)
        self.blocks = nn.Sequential(*[GPTBlock(dim, heads) for _ in range(layers)])
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx):
        x = self.tokens(idx) + self.positions(torch.arange(idx.shape[1]))
        return self.head(self.ln(self.blocks(x)))


def warmup_cosine(min_lr, max_lr, warmup, decay):
    """kiln.nn.WarmUpCosineDecayLR as a factor of max_lr at each step (for torch's LambdaLR)."""
    def factor(step):
        if step < warmup:
            return step / warmup
        p = min(step - warmup, decay) / decay
        return (0.5 * (max_lr - min_lr) * (math.cos(math.pi * p) + 1.0) + min_lr) / max_lr
    return factor


def rotate(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin


class LlamaAttention(nn.Module):
    def __init__(self, dim, heads, kv_heads):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.q = nn.Linear(dim, dim, bias=False)
        self.k = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.v = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.o = nn.Linear(dim, dim, bias=False)

    def forward(self, x, cos, sin, k_cache, v_cache):
        b = x.shape[0]
        q = self.q(x).reshape(b, 1, self.heads, self.head_dim).transpose(1, 2)
        k = self.k(x).reshape(b, 1, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v(x).reshape(b, 1, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        k_cache, v_cache = torch.cat((k_cache, k), 2), torch.cat((v_cache, v), 2)
        rep = self.heads // self.kv_heads
        out = torch.nn.functional.scaled_dot_product_attention(
            q, k_cache.repeat_interleave(rep, 1), v_cache.repeat_interleave(rep, 1))
        return self.o(out.transpose(1, 2).reshape(b, 1, -1)), k_cache, v_cache


class SwiGLU(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.down(torch.nn.functional.silu(self.gate(x)) * self.up(x))


class LlamaLayer(nn.Module):
    def __init__(self, dim, heads, kv_heads):
        super().__init__()
        self.attn_norm, self.mlp_norm = nn.RMSNorm(dim, eps=1e-6), nn.RMSNorm(dim, eps=1e-6)
        self.attn = LlamaAttention(dim, heads, kv_heads)
        self.mlp = SwiGLU(dim, 4 * dim)

    def forward(self, x, cos, sin, k_cache, v_cache):
        h, k_cache, v_cache = self.attn(self.attn_norm(x), cos, sin, k_cache, v_cache)
        x = x + h
        return x + self.mlp(self.mlp_norm(x)), k_cache, v_cache


class Llama(nn.Module):
    def __init__(self, vocab=256, dim=128, heads=8, kv_heads=2, layers=2, max_len=4096):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList([LlamaLayer(dim, heads, kv_heads) for _ in range(layers)])
        self.norm = nn.RMSNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, vocab, bias=False)
        head_dim = dim // heads
        angles = np.arange(max_len)[:, None] / 10000.0 ** (np.arange(0, head_dim, 2) / head_dim)
        angles = np.concatenate([angles, angles], axis=1).astype(np.float32)
        self.cos, self.sin = torch.from_numpy(np.cos(angles)), torch.from_numpy(np.sin(angles))
        self.kv_shape = (kv_heads, head_dim)

    def forward(self, token, position, caches):
        x = self.embed(token)
        cos, sin = self.cos[position], self.sin[position]
        new = []
        for layer, (k, v) in zip(self.layers, caches):
            x, k, v = layer(x, cos, sin, k, v)
            new.append((k, v))
        return self.head(self.norm(x)), new

    def empty_caches(self):
        return [(torch.zeros(1, *self.kv_shape[:1], 0, self.kv_shape[1]),) * 2 for _ in self.layers]
