"""The rest of the seeds' API surface: MindSpore's positional dtypes in creation ops, jit's
dynamic and ge_options, set_context / get_context; MegEngine's trace parameters (record_only,
dtr_config, graph_opt_config, opt_level), its config classes and module paths."""
import numpy as np
import pytest

import kiln
from kiln import ops


# ---- creation ops: MindSpore's positional dtype -------------------------------------------


def test_creation_ops_take_a_positional_dtype_after_the_shape():
    z = ops.zeros((2, 4), kiln.float32)
    assert z.shape == (2, 4) and z.dtype == kiln.float32
    np.testing.assert_array_equal(z.asnumpy(), np.zeros((2, 4), np.float32))
    o = ops.ones((2, 4), kiln.int32)
    assert o.dtype == kiln.int32
    np.testing.assert_array_equal(o.asnumpy(), np.ones((2, 4), np.int32))
    f = ops.full((2, 4), 3.0, kiln.float64)
    assert f.dtype == kiln.float64
    np.testing.assert_array_equal(f.asnumpy(), np.full((2, 4), 3.0))
    assert ops.zeros(3, kiln.int64).dtype == kiln.int64 and ops.zeros(3, kiln.int64).shape == (3,)
    assert ops.ones(2, 3, kiln.float64).shape == (2, 3)


def test_creation_ops_keep_their_other_call_forms():
    assert ops.zeros(2, 4, dtype=kiln.int32).dtype == kiln.int32
    assert ops.zeros([2, 4]).shape == (2, 4) and ops.zeros(5).dtype == kiln.float32
    assert ops.ones((3,), dtype=kiln.float64).dtype == kiln.float64
    assert ops.full((2,), 7).dtype == kiln.int64 and ops.full(2, True).dtype == kiln.bool
    with pytest.raises(TypeError, match=r"zeros: dtype given twice, positionally \(float32\)"):
        ops.zeros((2, 4), kiln.float32, dtype=kiln.int32)
    with pytest.raises(TypeError, match="ones: shape entries must be ints"):
        ops.ones(kiln.float32)
