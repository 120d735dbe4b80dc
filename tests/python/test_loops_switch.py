"""kiln.ops.switch against indexing a list of functions: the index clamped to the branches as JAX
does, Python numbers among the branches' values, pytree operands, gradients (central differences
in float64, eager autograd of the chosen branch), eagerly, under every kiln.jit variant and
kiln.trace, the compiled graph holding the choice as one `if` node."""
import numpy as np
import pytest

import kiln
from kiln import ops

from conftest import check_grad, to_numpy
from loop_variants import JIT_IDS, JIT_VARIANTS, O2_IDS, O2_VARIANTS, assert_one_node, jitted

BRANCHES = [
    lambda p: {"y": p["x"] * p["w"], "n": 0, "c": 1.5},
    lambda p: {"y": (p["x"] + p["w"]).sin(), "n": 1, "c": 1.5},
    lambda p: {"y": 2.0, "n": 2, "c": 1.5},  # (a number where the others give a tensor)
    lambda p: {"y": p["x"].exp(), "n": 3, "c": 1.5},
]


def choose(index, x, w):
    return ops.switch(index, BRANCHES, {"x": x, "w": w})


def want(k, x, w):
    k = min(max(k, 0), len(BRANCHES) - 1)
    out = BRANCHES[k]({"x": x, "w": w})
    y = out["y"]
    return (np.full(x.shape, y) if isinstance(y, float) else to_numpy(y)), k


def data(seed):
    rng = np.random.default_rng(seed)
    return kiln.tensor(rng.standard_normal(3)), kiln.tensor(rng.standard_normal(3))


INDICES = [-3, 0, 1, 2, 3, 7]


def test_eager_switch_with_int_and_tensor_indices():
    x, w = data(0)
    for k in INDICES:
        for index in (k, kiln.tensor(np.array(k)), kiln.tensor(np.array([k], dtype=np.int32))):
            out = choose(index, x, w)
            y, kk = want(k, x, w)
            np.testing.assert_allclose(np.broadcast_to(to_numpy(out["y"]) if not isinstance(out["y"], float)
                                                       else out["y"], x.shape), y, rtol=1e-12)
            assert out["n"] == kk and out["c"] == 1.5


@pytest.mark.parametrize("variant", JIT_VARIANTS + O2_VARIANTS, ids=JIT_IDS + O2_IDS)
def test_jitted_switch_is_one_if_node_equal_to_the_chosen_branch(variant):
    x, w = data(1)
    fn = jitted(choose, variant)
    for _ in range(2):
        for k in INDICES:
            out = fn(kiln.tensor(np.array(k)), x, w)
            y, kk = want(k, x, w)
            np.testing.assert_allclose(to_numpy(out["y"]), y, rtol=1e-12)  # (the number: a tensor like the others)
            assert type(out["n"]) is int and out["n"] == kk
            assert type(out["c"]) is float and out["c"] == 1.5  # (the same number in every branch: a constant)
    assert_one_node(fn.graph_str(kiln.tensor(np.array(0)), x, w), "if")


def test_kiln_trace_of_switch():
    x, w = data(2)
    tr = kiln.trace(choose)
    for _ in range(2):
        for k in INDICES:
            out = tr(kiln.tensor(np.array(k)), x, w)
            np.testing.assert_allclose(to_numpy(out["y"]), want(k, x, w)[0], rtol=1e-12)
            assert out["n"] == want(k, x, w)[1]
    assert_one_node(tr.graph_str(), "if")


def loss(index, x, w):
    return (choose(index, x, w)["y"] * x).sum()


@pytest.mark.parametrize("variant", JIT_VARIANTS[::2], ids=JIT_IDS[::2])
def test_jitted_switch_gradients_equal_the_chosen_branchs(variant):
    x, w = data(3)
    grad = kiln.grad(jitted(loss, variant), (1, 2))
    for k in INDICES:
        index = kiln.tensor(np.array(k))
        for g, e in zip(grad(index, x, w), kiln.grad(loss, (1, 2))(index, x, w)):
            np.testing.assert_allclose(to_numpy(g), to_numpy(e), rtol=1e-12, atol=1e-14)


def test_switch_gradient_by_central_differences():
    rng = np.random.default_rng(4)
    x, w = rng.standard_normal(3), rng.standard_normal(3)
    fn = kiln.jit(lambda i, x, w: choose(i, x, w)["y"], capture_mode="trace")
    for k in (0, 1, 3):
        index = kiln.tensor(np.array(k))
        check_grad(lambda x, w: choose(index, x, w)["y"], x, w, rtol=1e-6, atol=1e-8)
        check_grad(lambda x, w: fn(index, x, w), x, w, rtol=1e-6, atol=1e-8)


def test_mismatched_branches_are_named():
    x, w = data(5)
    fn = kiln.jit(lambda i, x: ops.switch(i, [lambda x: x, lambda x: x.float()], x), capture_mode="trace")
    with pytest.raises(ValueError, match=r"switch: branches\[1\] returns out as Tensor float32 \(3,\), but "
                                         r"branches\[0\] as Tensor float64 \(3,\)"):
        fn(kiln.tensor(np.array(0)), x)
    fn = kiln.jit(lambda i, x: ops.switch(i, [lambda x: (x, x), lambda x: [x, x]], x), capture_mode="trace")
    with pytest.raises(ValueError, match=r"switch: branches\[1\] returns \[leaf, leaf\], but branches\[0\] returns"):
        fn(kiln.tensor(np.array(0)), x)
    with pytest.raises(TypeError, match=r"switch: index must be an int or a one-element integer Tensor, got Tensor "
                                        r"float64"):
        ops.switch(x, [lambda x: x], x)
    with pytest.raises(TypeError, match=r"switch: branches must be a non-empty sequence"):
        ops.switch(0, [], x)
    with pytest.raises(TypeError, match=r"switch: branches\[1\] must be callable"):
        ops.switch(0, [lambda x: x, 3], x)
