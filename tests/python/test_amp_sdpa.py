"""scaled_dot_product_attention under amp with operands of mixed float dtypes (a Llama block's
rotary queries and keys come out float32, its values bfloat16): the shapes are checked without
running the attention op (a validating call used to compute an attention and throw it away,
eagerly and in every compiled graph), the result is that of the unfused ops, and bad shapes
still raise."""
import numpy as np
import pytest

import kiln
from kiln import ops

BF = kiln.bfloat16


def operands():
    rng = np.random.default_rng(3)
    q = kiln.tensor(rng.standard_normal((1, 4, 8, 16)).astype(np.float32))
    k = kiln.tensor(rng.standard_normal((1, 2, 8, 16)).astype(np.float32))
    v = kiln.tensor(rng.standard_normal((1, 2, 8, 16)).astype(np.float32)).astype(BF)
    return q, k, v


def attend(q, k, v):
    with kiln.amp.autocast(low_prec_dtype=BF):
        return ops.scaled_dot_product_attention(q, k, v, scale=0.25)


def reference(q, k, v):
    """The unfused ops' rounding: q, k, v rounded to bfloat16, each product rounded once."""
    r = lambda a: a.astype(BF).astype(kiln.float32).numpy()
    qf = r(q).reshape(1, 2, 16, 16)
    s = r(kiln.tensor(qf @ r(k).swapaxes(-1, -2)))
    s = r(kiln.tensor(s * 0.25))
    p = np.exp(s - s.max(-1, keepdims=True))
    p = r(kiln.tensor(p / p.sum(-1, keepdims=True)))
    return (p @ r(v)).reshape(1, 4, 8, 16)


@pytest.mark.parametrize("mode", ["ast", "bytecode", "trace"])
def test_mixed_dtypes_run_one_attention(mode):
    q, k, v = operands()
    want = attend(q, k, v)
    with kiln.profiler.profile() as prof:
        attend(q, k, v)
    assert "attention" not in {row.key for row in prof.key_averages()}  # no attention thrown away
    np.testing.assert_allclose(want.astype(kiln.float32).numpy(), reference(q, k, v), rtol=2e-2, atol=2e-2)
    jf = kiln.jit(attend, capture_mode=mode)
    got = jf(q, k, v)
    np.testing.assert_array_equal(got.astype(kiln.float32).numpy(), want.astype(kiln.float32).numpy())
    assert "attention(" not in jf.graph_str(q, k, v)


def test_bad_shapes_still_raise_under_amp():
    q, k, v = operands()
    with pytest.raises(ValueError, match="attention"):
        attend(q, k[..., :8], v)
