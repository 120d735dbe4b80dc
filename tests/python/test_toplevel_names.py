"""PyTorch's top-level tensor functions on kiln (issue 30): kiln.zeros, kiln.cat, kiln.randn, ... are
kiln.ops' own functions, named once in kiln.toplevel's table; the creation functions also take
requires_grad= and device=. They give what kiln.ops gives, eagerly and under every kiln.jit variant,
and a compiled function records the same graph with either spelling."""
import warnings

import numpy as np
import pytest

import kiln
from kiln import toplevel
from conformance import run_all_modes


def test_every_name_of_the_table_is_bound():
    for name in toplevel.SAME:
        assert getattr(kiln, name) is getattr(kiln.ops, name), name  # the function itself, no copy
    for name in toplevel.CREATION:
        assert getattr(kiln, name) is toplevel.NAMES[name], name
        assert getattr(kiln, name).__wrapped__ is getattr(kiln.ops, name), name
    # names the package gives another meaning keep it
    assert kiln.trace is kiln.jit.trace and kiln.grad is kiln.autograd.grad
    assert kiln.tensor is kiln._tensor.tensor


@pytest.mark.parametrize("call, want", [
    (lambda: kiln.zeros(2, 3), np.zeros((2, 3), np.float32)),
    (lambda: kiln.zeros((2, 3), dtype=kiln.int64), np.zeros((2, 3), np.int64)),
    (lambda: kiln.ones(4, dtype=kiln.float64), np.ones(4)),
    (lambda: kiln.full((2, 2), 1.5), np.full((2, 2), 1.5, np.float32)),
    (lambda: kiln.empty(3, 2), np.zeros((3, 2), np.float32)),
    (lambda: kiln.empty_like(kiln.ones(2, dtype=kiln.int32)), np.zeros(2, np.int32)),
    (lambda: kiln.zeros_like(kiln.ones(2, 2), dtype=kiln.float64), np.zeros((2, 2))),
    (lambda: kiln.ones_like(kiln.zeros(3)), np.ones(3, np.float32)),
    (lambda: kiln.full_like(kiln.zeros(2), 7), np.full(2, 7, np.float32)),
    (lambda: kiln.arange(5), np.arange(5)),
    (lambda: kiln.arange(1, 2, 0.25, dtype=kiln.float64), np.arange(1, 2, 0.25)),
    (lambda: kiln.linspace(0, 1, 5), np.linspace(0, 1, 5, dtype=np.float32)),
    (lambda: kiln.eye(2, 3), np.eye(2, 3, dtype=np.float32)),
    (lambda: kiln.cat([kiln.ones(1, 2), kiln.zeros(1, 2)], dim=0), np.array([[1, 1], [0, 0]], np.float32)),
    (lambda: kiln.concat([kiln.ones(1, 2), kiln.zeros(1, 2)], 1), np.array([[1, 1, 0, 0]], np.float32)),
    (lambda: kiln.stack([kiln.ones(2), kiln.zeros(2)], dim=1), np.array([[1, 0], [1, 0]], np.float32)),
    (lambda: kiln.tensor([1, 2], dtype=kiln.float64), np.array([1.0, 2.0])),
    (lambda: kiln.from_numpy(np.arange(3.0)), np.arange(3.0)),
])
def test_values_and_dtypes(call, want):
    got = call().numpy()
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name, args", [("rand", (2, 3)), ("randn", (4,)), ("randint", (0, 10, (5,))),
                                        ("randperm", (6,))])
def test_random_draws_follow_manual_seed_like_ops(name, args):
    kiln.manual_seed(3)
    a = getattr(kiln, name)(*args).numpy()
    kiln.manual_seed(3)
    b = getattr(kiln.ops, name)(*args).numpy()
    kiln.manual_seed(4)
    c = getattr(kiln, name)(*args).numpy()
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_requires_grad_makes_a_leaf():
    w = kiln.randn(3, requires_grad=True)
    t = kiln.tensor([1.0, 2.0, 3.0], requires_grad=True)
    assert w.requires_grad and t.requires_grad and not kiln.zeros(3).requires_grad
    (w * t).sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), t.numpy())
    np.testing.assert_allclose(t.grad.numpy(), w.numpy())


def test_bad_keywords_name_the_function():
    with pytest.raises(TypeError, match="kiln.arange: only float tensors can require gradients, got kiln.int64"):
        kiln.arange(3, requires_grad=True)
    with pytest.raises(ValueError, match="kiln.zeros: device='cuda'.*CPU only"):
        kiln.zeros(2, device="cuda")
    with pytest.raises(ValueError, match="kiln.tensor: device='cuda:0'"):
        kiln.tensor([1.0], device="cuda:0")
    assert kiln.ones(2, device="cpu").shape == (2,)


def creating(x):
    a = kiln.zeros(2, 3) + kiln.ones((2, 3), dtype=kiln.float32) * x[:1]
    b = kiln.cat([a, kiln.full((1, 3), 2.0)], dim=0) + kiln.arange(3, dtype=kiln.float32)
    c = kiln.stack([kiln.eye(3), kiln.zeros_like(b), kiln.empty(3, 3)], dim=0).sum(0)
    d = kiln.linspace(0, 1, 3) * kiln.ones_like(x)
    return kiln.concat([b + c, d.reshape(1, 3)], 0)


def creating_with_ops(x):
    ops = kiln.ops
    a = ops.zeros(2, 3) + ops.ones((2, 3), dtype=kiln.float32) * x[:1]
    b = ops.cat([a, ops.full((1, 3), 2.0)], dim=0) + ops.arange(3, dtype=kiln.float32)
    c = ops.stack([ops.eye(3), ops.zeros_like(b), ops.empty(3, 3)], dim=0).sum(0)
    d = ops.linspace(0, 1, 3) * ops.ones_like(x)
    return ops.concat([b + c, d.reshape(1, 3)], 0)


def test_creation_under_every_jit_variant():
    x = kiln.Tensor(np.array([1.0, 2.0, 3.0], np.float32))
    np.testing.assert_array_equal(creating(x).numpy(), creating_with_ops(x).numpy())
    run_all_modes(creating, (x,), (x * 2,))


def drawing(x):
    return x + kiln.randn(3) + kiln.rand(3, dtype=kiln.float32)


def test_random_creation_under_every_jit_variant():
    x = kiln.Tensor(np.zeros(3, np.float32))
    run_all_modes(drawing, (x,), (x,), reset=lambda: kiln.manual_seed(5))


@pytest.mark.parametrize("mode", ["ast", "bytecode", "trace"])
def test_same_graph_as_kiln_ops(mode):
    x = kiln.Tensor(np.array([1.0, 2.0, 3.0], np.float32))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graphs = []
        for fn in (creating, creating_with_ops):
            jf = kiln.jit(fn, capture_mode=mode)
            jf(x)
            graphs.append([line.split("  #")[0] for line in jf.graph_str(x).splitlines()])  # no source lines
    assert graphs[0] == graphs[1]
    assert sum("= full(" in line for line in graphs[0]) >= 5


def leaf_inside(x):
    w = kiln.ones(3, requires_grad=True)
    return x * w, w


def test_requires_grad_inside_jit_runs_as_eager():
    """A compiled function's results do not require grad: one that makes a leaf requiring grad runs
    eagerly, so its results are eager's, requires_grad included."""
    x = kiln.Tensor(np.array([1.0, 2.0, 3.0], np.float32))
    run_all_modes(leaf_inside, (x,), (x,), check_requires_grad=True)
    for mode in ("ast", "bytecode", "trace"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            y, w = kiln.jit(leaf_inside, capture_mode=mode)(x)
        assert w.requires_grad and y.requires_grad, mode


def test_star_import_keeps_pythons_builtins():
    ns = {}
    exec("from kiln import *", ns)  # noqa: S102
    assert "zeros" in ns and "cat" in ns and "Tensor" in ns and "float32" in ns and "nn" in ns
    for name in ("sum", "max", "min", "abs", "all", "any", "round", "pow"):
        assert name not in ns, name
        assert getattr(kiln, name) is getattr(kiln.ops, name)  # still kiln.max, as torch.max
