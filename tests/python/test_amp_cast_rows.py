"""float32 <-> bfloat16 casts: contiguous rows run as vectorized loops (src/core/copy.c), strided
ones element by element; both must round to nearest even and quiet NaN exactly as the reference
rule below, on contiguous, strided and transposed tensors, eager and compiled."""
import numpy as np
import pytest

import kiln

BF = kiln.bfloat16


def to_bf16_bits(x):
    """The reference: float32 -> bfloat16 bits, round to nearest even, NaN quieted (0x40 set)."""
    u = x.view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF
    quiet = (u >> 16) | 0x40
    return np.where((u & 0x7FFFFFFF) > 0x7F800000, quiet, rounded).astype(np.uint16)


def awkward_values(n, seed):
    rng = np.random.default_rng(seed)
    v = (rng.standard_normal(n) * np.exp2(rng.integers(-140, 127, n))).astype(np.float32)
    bits = np.array([0x7FC00000, 0x7F800001, 0xFFBFFFFF, 0x7F800000, 0xFF800000, 0x80000000, 0x00000001,
                     0x3F808000, 0x3F818000, 0x3F807FFF, 0x7F7FFFFF, 0x7F7F8000, 0x0080FFFF], np.uint32)
    v[: len(bits)] = bits.view(np.float32)
    return v


def bits_of(t):
    """The bfloat16 tensor's raw bits (its float32 widening is exact)."""
    return (t.astype(kiln.float32).numpy().view(np.uint32) >> 16).astype(np.uint16)


@pytest.mark.parametrize("n", [37, 4096, 1 << 18])
def test_contiguous_and_strided_round_alike(n):
    v = awkward_values(n, n)
    want = to_bf16_bits(v)
    got = bits_of(kiln.tensor(v).astype(BF))
    np.testing.assert_array_equal(got, want)
    m = v[: (n // 8) * 8].reshape(-1, 8)
    t = kiln.tensor(m).T  # a transposed view: strided rows
    np.testing.assert_array_equal(bits_of(t.astype(BF)), to_bf16_bits(np.ascontiguousarray(m.T)))
    # and back: bfloat16 -> float32 widens exactly
    b = kiln.tensor(v).astype(BF)
    np.testing.assert_array_equal(b.astype(kiln.float32).numpy().view(np.uint32), want.astype(np.uint32) << 16)
    np.testing.assert_array_equal(b[::2].astype(kiln.float32).numpy().view(np.uint32),  # strided
                                  want[::2].astype(np.uint32) << 16)


@pytest.mark.parametrize("mode", ["ast", "bytecode", "trace"])
@pytest.mark.parametrize("level", ["O0", "O1"])
@pytest.mark.parametrize("backend", ["kbk", "sink"])
def test_compiled_casts_equal_eager(mode, level, backend):
    v = awkward_values(1 << 16, 3).reshape(256, 256)

    def f(x):
        return x.astype(BF), x.T.astype(BF).astype(kiln.float32)

    x = kiln.tensor(v)
    want = f(x)
    got = kiln.jit(f, capture_mode=mode, jit_level=level, backend=backend)(x)
    np.testing.assert_array_equal(bits_of(got[0]), bits_of(want[0]))
    np.testing.assert_array_equal(got[1].numpy().view(np.uint32), want[1].numpy().view(np.uint32))
    np.testing.assert_array_equal(bits_of(want[0]), to_bf16_bits(v))
