"""grad / value_and_grad(..., allow_int=True) (issue 34): integer and bool inputs at grad_position
get a zero float32 gradient of their shape, eagerly and under every kiln.jit variant (grad of the
jitted function, and kiln.jit of grad); without allow_int the error names the argument, its dtype
and allow_int."""
import warnings

import numpy as np
import pytest

import kiln
from kiln import tree_util
from conformance import ENV, VARIANTS, environment


def _x():
    return kiln.Tensor(np.array([1.5, -2.0, 0.25]), kiln.float32)


def _idx():
    return kiln.Tensor(np.array([[2, 0, 1]], dtype=np.int64), kiln.int64)


def _mask():
    return kiln.Tensor(np.array([True, False, True]), kiln.bool)


def f(x, idx, mask):
    picked = kiln.ops.gather(x, idx.reshape((-1,)), 0)
    return (picked * picked * mask.astype(kiln.float32)).sum()


def _check(grads, x=None):
    gx, gi, gm = grads
    x = (_x() if x is None else x).numpy()
    # d/dx sum(x[idx]^2 * mask) with idx = [2, 0, 1], mask = [1, 0, 1]: 2 x[2] at 2, 2 x[1] at 1
    np.testing.assert_allclose(gx.numpy(), [0.0, 2 * x[1], 2 * x[2]], rtol=1e-6)
    for g, shape in ((gi, (1, 3)), (gm, (3,))):
        assert g.dtype is kiln.float32 and tuple(g.shape) == shape
        assert not np.any(g.numpy())


def test_eager_integer_and_bool_inputs_get_zero_float32_gradients():
    _check(kiln.grad(f, grad_position=(0, 1, 2), allow_int=True)(_x(), _idx(), _mask()))
    value, grads = kiln.value_and_grad(f, grad_position=(0, 1, 2), allow_int=True)(_x(), _idx(), _mask())
    np.testing.assert_allclose(value.numpy(), f(_x(), _idx(), _mask()).numpy())
    _check(grads)
    gi = kiln.grad(f, grad_position=1, allow_int=True)(_x(), _idx(), _mask())
    assert gi.dtype is kiln.float32 and tuple(gi.shape) == (1, 3) and not np.any(gi.numpy())


def test_every_jit_variant_gives_eager_gradients():
    problems = []
    with environment(ENV), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for v in VARIANTS:
            for how, g in (("grad of jit", kiln.grad(v.wrap(f), grad_position=(0, 1, 2), allow_int=True)),
                           ("jit of grad", v.wrap(kiln.grad(f, grad_position=(0, 1, 2), allow_int=True)))):
                try:
                    _check(g(_x(), _idx(), _mask()))
                    _check(g(_x() * 2.0, _idx(), _mask()), _x() * 2.0)  # a second call: the compiled one
                except Exception as e:  # noqa: BLE001 (reported with the variant)
                    problems.append(f"{v.name} {how}: {type(e).__name__}: {e}")
    assert not problems, "\n".join(problems)


def test_integer_leaves_of_a_pytree_argument():
    tree = {"x": _x(), "idx": _idx(), "none": None}

    def g(t):
        return f(t["x"], t["idx"], _mask())

    grads = kiln.grad(g, allow_int=True)(tree)
    assert list(grads) == ["x", "idx", "none"] and grads["none"] is None
    _check((grads["x"], grads["idx"], kiln.ops.zeros((3,), dtype=kiln.float32)))
    jitted = kiln.grad(kiln.jit(g, capture_mode="trace"), allow_int=True)(tree)
    assert tree_util.tree_structure(jitted) == tree_util.tree_structure(grads)
    np.testing.assert_array_equal(jitted["x"].numpy(), grads["x"].numpy())
    with pytest.raises(TypeError, match=r"argument 0 \(its leaf \['idx'\]\) has dtype kiln.int64.*allow_int=True"):
        kiln.grad(g)(tree)


@pytest.mark.parametrize("mode", [None, "ast", "bytecode", "trace"])
def test_without_allow_int_the_error_names_position_dtype_and_allow_int(mode):
    fn = f if mode is None else kiln.jit(f, capture_mode=mode)
    with pytest.raises(TypeError, match=r"argument 1 has dtype kiln.int64; only float tensors have gradients "
                                        r"\(pass allow_int=True"):
        kiln.grad(fn, grad_position=(0, 1))(_x(), _idx(), _mask())
    with pytest.raises(TypeError, match=r"argument 2 has dtype kiln.bool.*allow_int"):
        kiln.value_and_grad(fn, grad_position=2)(_x(), _idx(), _mask())
    with pytest.raises(TypeError, match="allow_int must be True or False"):
        kiln.grad(fn, allow_int=1)
