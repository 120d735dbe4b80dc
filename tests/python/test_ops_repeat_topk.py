"""tile / repeat / repeat_interleave / topk (MindSpore's and PyTorch's names): NumPy's results,
ties to the lower index and NaN as the largest in topk (PyTorch's order), gradients to the chosen
elements, clear errors, and every compiled variant equal to eager."""
import numpy as np
import pytest

import kiln
from kiln import ops
from conformance import run_all_modes

X = np.array([[3.0, 1.0, np.nan, 3.0, -np.inf, -np.inf], [0.0, 5.0, 2.0, 2.0, 1.0, 9.0]], np.float32)


def test_tile_and_repeat_match_numpy():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = kiln.Tensor(a)
    for reps in [(2,), (2, 1), (1, 3), (2, 2, 2)]:
        np.testing.assert_array_equal(ops.tile(t, reps).numpy(), np.tile(a, reps))
    np.testing.assert_array_equal(t.repeat(2, 3).numpy(), np.tile(a, (2, 3)))
    np.testing.assert_array_equal(t.repeat(2, 1, 1).numpy(), np.tile(a, (2, 1, 1)))
    with pytest.raises(ValueError, match="repeat: 1 sizes for a tensor of 2 dimensions"):
        t.repeat(2)


def test_repeat_interleave_matches_numpy():
    a = np.arange(6, dtype=np.int64).reshape(2, 3)
    t = kiln.Tensor(a)
    np.testing.assert_array_equal(ops.repeat_interleave(t, 2, 1).numpy(), np.repeat(a, 2, 1))
    np.testing.assert_array_equal(t.repeat_interleave(3).numpy(), np.repeat(a, 3))
    np.testing.assert_array_equal(ops.repeat_elements(t, 2, 0).numpy(), np.repeat(a, 2, 0))


def _reference_topk(a, k, largest):
    order = []
    for row in a:
        key = [(0 if np.isnan(v) else 1, -v if largest else v, i) if largest else
               (1 if np.isnan(v) else 0, v, i) for i, v in enumerate(row)]
        order.append([i for *_, i in sorted(key)][:k])
    idx = np.array(order)
    return np.take_along_axis(a, idx, 1), idx


@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("k", [1, 3, 6])
def test_topk_order_ties_and_nan(k, largest):
    values, indices = ops.topk(kiln.Tensor(X), k, largest=largest)
    want_v, want_i = _reference_topk(X, k, largest)
    np.testing.assert_array_equal(indices.numpy(), want_i)
    np.testing.assert_array_equal(values.numpy(), want_v)
    assert indices.dtype == kiln.int64


def test_topk_other_dim_integers_and_errors():
    a = np.array([[4, 9, 4], [7, 1, 8], [7, 3, 0]], np.int32)
    v, i = kiln.Tensor(a).topk(2, dim=0)
    np.testing.assert_array_equal(i.numpy(), [[1, 0, 1], [2, 2, 0]])
    np.testing.assert_array_equal(v.numpy(), [[7, 9, 8], [7, 3, 4]])
    with pytest.raises(ValueError, match="topk: k must be an int in \\[0, 3\\]"):
        ops.topk(kiln.Tensor(a), 4)


def test_topk_gradient_reaches_the_chosen_elements():
    x = kiln.Tensor(np.array([0.5, 2.0, -1.0, 3.0], np.float32))
    g = kiln.grad(lambda t: (ops.topk(t, 2)[0] * kiln.Tensor(np.array([10.0, 1.0], np.float32))).sum())(x)
    np.testing.assert_array_equal(g.numpy(), [0.0, 1.0, 0.0, 10.0])


def test_compiled_variants_agree_with_eager():
    def f(x):
        v, i = ops.topk(x, 2)
        return v * 2, i, ops.tile(x, (1, 2)), x.repeat_interleave(2, 0)

    run_all_modes(f, (kiln.Tensor(np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)),),
                  (kiln.Tensor(np.random.default_rng(1).standard_normal((3, 5)).astype(np.float32)),))
