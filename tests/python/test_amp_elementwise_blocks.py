"""Elementwise ops with bfloat16 or float16 operands or results, float32 operands beside them
(src/ops/elementwise.c, run_half): computed on blocks, each 16-bit operand widened into float32
registers, each 16-bit result rounded as it is stored, without float32 copies of whole tensors.
They must give, bit for bit, what the float32 op on the widened operands gives, its result cast
once: on contiguous, strided (transposed, permuted, sliced) and broadcast operands, with values
that round awkwardly (ties, NaN, infinities, subnormals); and the same under every kiln.jit
variant (the rotary products of LlamaAttention under amp: a bfloat16 view times a float32
broadcast)."""
import numpy as np
import pytest

import kiln
from kiln import ops

import conformance

BF, F16, F32 = kiln.bfloat16, kiln.float16, kiln.float32


def awkward(shape, seed):
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    v = (rng.standard_normal(n) * np.exp2(rng.integers(-20, 20, n))).astype(np.float32)
    bits = np.array([0x7FC00000, 0x7F800000, 0xFF800000, 0x80000000, 0x00000001, 0x3F808000,
                     0x3F818000, 0x3F807FFF, 0x7F7FFFFF, 0x0080FFFF], np.uint32)
    v[: min(n, len(bits))] = bits[: min(n, len(bits))].view(np.float32)
    return v.reshape(shape)


def bits(t):
    """A tensor's raw bits as integers (16-bit dtypes through their exact float32 widening)."""
    a = t.astype(F32).numpy() if t.dtype in (BF, F16) else t.numpy()
    if a.dtype == np.float32:
        a = a.view(np.uint32)
        return a >> 16 if t.dtype == BF else a
    return a


def reference(fn, *args):
    """fn on the operands widened to float32, its result cast once to the block path's dtype."""
    out_dtype = fn(*args).dtype
    got = fn(*(a.astype(F32) if getattr(a, "dtype", None) in (BF, F16) else a for a in args))
    return got if got.dtype == out_dtype else got.astype(out_dtype)


def views(t):
    """t itself, a transposed view and a strided slice (2-D t)."""
    return {"contiguous": t, "transposed": t.T, "sliced": t[::2, 1::3]}


UNARY = {"neg": ops.neg, "exp": ops.exp, "tanh": ops.tanh, "abs": ops.abs, "sigmoid": ops.sigmoid,
         "square": ops.square}
BINARY = {"mul": ops.mul, "add": ops.add, "sub": ops.sub, "div": ops.div, "maximum": ops.maximum,
          "less": ops.less}
MIXES = [(BF, BF), (BF, F32), (F32, BF), (F16, BF), (F16, F32), (BF, F16)]


@pytest.mark.parametrize("name", sorted(UNARY))
@pytest.mark.parametrize("dtype", [BF, F16])
def test_unary_equals_float32_then_cast(name, dtype):
    x = kiln.tensor(awkward((64, 300), 1)).astype(dtype)
    for how, v in views(x).items():
        got, want = UNARY[name](v), reference(UNARY[name], v)
        assert got.dtype == dtype
        np.testing.assert_array_equal(bits(got), bits(want), err_msg=f"{name} {dtype} {how}")


@pytest.mark.parametrize("name", sorted(BINARY))
@pytest.mark.parametrize("da,db", MIXES)
def test_binary_mixes_equal_float32_then_cast(name, da, db):
    a = kiln.tensor(awkward((48, 600), 2)).astype(da)
    b = kiln.tensor(awkward((48, 600), 3)).astype(db)
    fn = BINARY[name]
    for (how_a, va), (how_b, vb) in zip(views(a).items(), views(b).items()):
        got, want = fn(va, vb), reference(fn, va, vb)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(bits(got), bits(want), err_msg=f"{name} {da} {db} {how_a}/{how_b}")
    row = kiln.tensor(awkward((1, 600), 4)).astype(db)  # a broadcast operand
    np.testing.assert_array_equal(bits(fn(a, row)), bits(reference(fn, a, row)))
    np.testing.assert_array_equal(bits(fn(a, 1.5)), bits(reference(fn, a, 1.5)))


def test_exact_products_match_numpy():
    """bfloat16 x float32 (a float32 result) and bfloat16 x bfloat16 (rounded to nearest even)
    against NumPy: float32 products of the exactly widened operands."""
    from test_amp_cast_rows import to_bf16_bits

    a32, b32 = awkward((32, 515), 5), awkward((32, 515), 6)
    a = kiln.tensor(a32).astype(BF)
    wa = (to_bf16_bits(a32).astype(np.uint32) << 16).view(np.float32)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(bits(ops.mul(a, kiln.tensor(b32))), (wa * b32).view(np.uint32))
        wb = (to_bf16_bits(b32).astype(np.uint32) << 16).view(np.float32)
        b = kiln.tensor(b32).astype(BF)
        np.testing.assert_array_equal(bits(ops.add(a, b)), to_bf16_bits(wa + wb))


def test_rotary_products_compiled_equal_eager():
    """The rotary step of LlamaAttention under amp: bfloat16 projections (permuted views) times
    float32 cos/sin, the halves rotated in bfloat16; every kiln.jit variant against eager."""
    rng = np.random.default_rng(7)
    q = kiln.tensor(rng.standard_normal((1, 40, 4, 32)).astype(np.float32)).astype(BF)
    ang = rng.standard_normal((1, 1, 40, 32)).astype(np.float32)
    cos, sin = kiln.tensor(np.cos(ang)), kiln.tensor(np.sin(ang))

    def rotary(q, cos, sin):
        q = ops.swapaxes(q, 1, 2)
        x1, x2 = ops.narrow(q, -1, 0, 16), ops.narrow(q, -1, 16, 16)
        return q * cos + ops.concat((-x2, x1), -1) * sin

    want = conformance.run_all_modes(rotary, (q, cos, sin))
    assert want[0][0] != "raise"
    got = rotary(q, cos, sin)
    assert got.dtype == F32
    qf = np.swapaxes(q.astype(F32).numpy(), 1, 2)
    rot = np.concatenate((-qf[..., 16:], qf[..., :16]), -1)
    np.testing.assert_array_equal(got.numpy(), qf * cos.numpy() + rot * sin.numpy())
