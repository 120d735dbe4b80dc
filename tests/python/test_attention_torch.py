"""kiln.models.LlamaAttention against an independent PyTorch implementation of the same block
(Hugging Face's Llama attention: rotary embedding, grouped key/value heads), eager and jitted at O0
and O1: outputs and the gradients of x and of every projection weight agree within float32
tolerance. Sizes reach the threaded GEMM paths (row and column splits, head batches)."""
import math

import numpy as np
import pytest

import kiln
from kiln import models

torch = pytest.importorskip("torch")

TOLS = dict(rtol=2e-4, atol=2e-5)
NAMES = ("q_proj", "k_proj", "v_proj", "o_proj")


def torch_attention(x, position_ids, weights, inv_freq, heads, kv_heads):
    b, s, hidden = x.shape
    hd = hidden // heads
    q = (x @ weights["q_proj"].T).view(b, s, heads, hd).transpose(1, 2)
    k = (x @ weights["k_proj"].T).view(b, s, kv_heads, hd).transpose(1, 2)
    v = (x @ weights["v_proj"].T).view(b, s, kv_heads, hd).transpose(1, 2)
    freqs = position_ids[..., None].to(x.dtype) * inv_freq
    emb = torch.cat((freqs, freqs), -1)
    cos, sin = emb.cos()[:, None], emb.sin()[:, None]

    def rotate_half(t):
        return torch.cat((-t[..., hd // 2:], t[..., :hd // 2]), -1)

    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin
    k = torch.repeat_interleave(k, heads // kv_heads, dim=1)
    v = torch.repeat_interleave(v, heads // kv_heads, dim=1)
    p = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd), -1)
    return (p @ v).transpose(1, 2).reshape(b, s, hidden) @ weights["o_proj"].T


@pytest.mark.parametrize("mode", ["eager", "O0", "O1"])
@pytest.mark.parametrize("hidden,heads,kv_heads,batch,seq", [(64, 4, 2, 2, 16), (256, 8, 2, 1, 96)],
                         ids=["h64", "h256"])
def test_llama_attention_matches_torch(hidden, heads, kv_heads, batch, seq, mode):
    kiln.manual_seed(11)
    attn = models.LlamaAttention(hidden, heads, kv_heads, rope_theta=10000.0)
    rng = np.random.default_rng(12)
    xn = rng.standard_normal((batch, seq, hidden)).astype(np.float32)
    pos = np.stack([np.arange(seq) + 3 * i for i in range(batch)]).astype(np.int64)
    sens = rng.standard_normal((batch, seq, hidden)).astype(np.float32)
    weights = [getattr(attn, n).weight for n in NAMES]

    ks = kiln.Tensor(sens)
    fn = attn if mode == "eager" else kiln.jit(attn, jit_level=mode)
    loss = lambda x, p: (fn(x, p) * ks).sum()  # noqa: E731
    out = fn(kiln.Tensor(xn), kiln.Tensor(pos)).asnumpy()
    _, (gx, gws) = kiln.value_and_grad(loss, 0, weights)(kiln.Tensor(xn), kiln.Tensor(pos))

    tw = {n: torch.tensor(getattr(attn, n).weight.asnumpy(), requires_grad=True) for n in NAMES}
    tx = torch.tensor(xn, requires_grad=True)
    tout = torch_attention(tx, torch.tensor(pos), tw, torch.tensor(attn.inv_freq.asnumpy()), heads, kv_heads)
    (tout * torch.tensor(sens)).sum().backward()

    np.testing.assert_allclose(out, tout.detach().numpy(), **TOLS, err_msg="output")
    np.testing.assert_allclose(gx.asnumpy(), tx.grad.numpy(), **TOLS, err_msg="gradient of x")
    for name, g in zip(NAMES, gws):
        scale = np.abs(tw[name].grad.numpy()).max()
        np.testing.assert_allclose(g.asnumpy(), tw[name].grad.numpy(), rtol=2e-4, atol=2e-5 * max(1.0, scale),
                                   err_msg=f"gradient of {name}")
