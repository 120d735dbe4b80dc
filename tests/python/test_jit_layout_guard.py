"""kiln.jit on functions that branch on a tensor's layout in Python (x.is_contiguous()): a
contiguous input and a strided view of the same shape take their own branch, as in eager, in
every capture mode, whichever comes first."""
import warnings

import numpy as np
import pytest

import kiln

CASES = [(mode, level, backend) for mode in ("ast", "bytecode", "trace") for level in ("O0", "O1")
         for backend in ("kbk", "sink")]


def by_layout(x):
    if x.is_contiguous():
        return x + 1.0
    return x - 1.0


def _inputs():
    base = kiln.Tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    view = base.transpose(0, 1)
    dense = kiln.Tensor(view.asnumpy().copy())
    assert not view.is_contiguous() and dense.is_contiguous()
    return view, dense


@pytest.mark.parametrize("mode,level,backend", CASES)
@pytest.mark.parametrize("view_first", [True, False])
def test_contiguous_and_strided_inputs_take_their_own_branch(mode, level, backend, view_first):
    jf = kiln.jit(by_layout, capture_mode=mode, jit_level=level, backend=backend)
    view, dense = _inputs()
    order = [view, dense] if view_first else [dense, view]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for _ in range(2):
            for x in order:
                np.testing.assert_allclose(jf(x).asnumpy(), by_layout(x).asnumpy())
