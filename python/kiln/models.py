"""The workloads of MindSpore's just-in-time compilation tutorial, written with kiln.nn and
kiln.ops: a simple function, a ResNet BasicBlock and a Llama attention block. Tests and
benchmarks share them; the constructors take reduced sizes."""
import math

from . import _C
from . import nn
from . import ops


def simple_function(a, b, c):
    """The tutorial's simple function."""
    return a * b + c


class BasicBlock(nn.Cell):
    """ResNet BasicBlock, stride 1, no downsample:
    conv3x3 -> BatchNorm2d -> ReLU -> conv3x3 -> BatchNorm2d -> + identity -> ReLU."""

    def __init__(self, channels=128, dtype=_C.float32):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, pad_mode="pad", padding=1, has_bias=False, dtype=dtype)
        self.bn1 = nn.BatchNorm2d(channels, dtype=dtype)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(channels, channels, 3, pad_mode="pad", padding=1, has_bias=False, dtype=dtype)
        self.bn2 = nn.BatchNorm2d(channels, dtype=dtype)

    def construct(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + x)


def rotate_half(x):
    """(x1, x2) -> (-x2, x1) along the last axis, halves taken in order."""
    half = x.shape[-1] // 2
    x1 = ops.narrow(x, -1, 0, half)
    x2 = ops.narrow(x, -1, half, half)
    return ops.concat((-x2, x1), -1)


def repeat_kv(x, n_rep):
    """(batch, kv_heads, seq, head_dim) -> (batch, kv_heads * n_rep, seq, head_dim), each head
    repeated n_rep times in a row."""
    if n_rep == 1:
        return x
    b, h, s, d = x.shape
    x = ops.broadcast_to(ops.unsqueeze(x, 2), (b, h, n_rep, s, d))
    return ops.reshape(x, (b, h * n_rep, s, d))


class LlamaAttention(nn.Cell):
    """Llama self-attention with grouped key/value heads and rotary position embedding; no bias,
    no mask, no dropout. construct(x (batch, seq, hidden), position_ids (batch, seq) ints)."""

    def __init__(self, hidden_size=4096, num_heads=32, num_kv_heads=8, rope_theta=500000.0, dtype=_C.float32):
        super().__init__()
        if hidden_size % num_heads or num_heads % num_kv_heads:
            raise ValueError(f"LlamaAttention: num_heads {num_heads} must divide hidden_size {hidden_size} "
                             f"and be a multiple of num_kv_heads {num_kv_heads}")
        self.hidden_size = hidden_size
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = hidden_size // num_heads
        self.rope_theta = float(rope_theta)
        kv_size = num_kv_heads * self.head_dim
        self.q_proj = nn.Dense(hidden_size, hidden_size, has_bias=False, dtype=dtype)
        self.k_proj = nn.Dense(hidden_size, kv_size, has_bias=False, dtype=dtype)
        self.v_proj = nn.Dense(hidden_size, kv_size, has_bias=False, dtype=dtype)
        self.o_proj = nn.Dense(hidden_size, hidden_size, has_bias=False, dtype=dtype)
        # inv_freq[i] = theta ** (-2i / head_dim)
        exponents = ops.arange(0, self.head_dim, 2, dtype=dtype) / self.head_dim
        self.inv_freq = 1.0 / (self.rope_theta ** exponents)

    def rotary(self, position_ids, dtype):
        """cos and sin of shape (batch, 1, seq, head_dim) for the given positions."""
        freqs = ops.unsqueeze(ops.cast(position_ids, dtype), -1) * self.inv_freq
        emb = ops.concat((freqs, freqs), -1)
        return ops.unsqueeze(ops.cos(emb), 1), ops.unsqueeze(ops.sin(emb), 1)

    def construct(self, x, position_ids):
        b, s, _ = x.shape
        q = ops.swapaxes(ops.reshape(self.q_proj(x), (b, s, self.num_heads, self.head_dim)), 1, 2)
        k = ops.swapaxes(ops.reshape(self.k_proj(x), (b, s, self.num_kv_heads, self.head_dim)), 1, 2)
        v = ops.swapaxes(ops.reshape(self.v_proj(x), (b, s, self.num_kv_heads, self.head_dim)), 1, 2)

        cos, sin = self.rotary(position_ids, x.dtype)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin

        # grouped query heads without copying K/V (repeat_kv's result): the n_rep query heads
        # that share a kv head are consecutive, so per kv head they form one (n_rep * seq)-row
        # matrix, and one matmul with that head's K (and V) serves them all, forward and backward
        # (whose gradient of K and V needs no sum over copies)
        n_rep = self.num_heads // self.num_kv_heads
        q = ops.reshape(q, (b, self.num_kv_heads, n_rep * s, self.head_dim))
        # softmax(q kᵀ / sqrt(head_dim)) v in one op, blockwise: the score matrix is never whole
        out = ops.scaled_dot_product_attention(q, k, v, scale=1.0 / math.sqrt(self.head_dim))
        out = ops.reshape(out, (b, self.num_heads, s, self.head_dim))
        out = ops.reshape(ops.swapaxes(out, 1, 2), (b, s, self.hidden_size))
        return self.o_proj(out)
