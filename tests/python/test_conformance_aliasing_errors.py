"""Conformance: what a compiled call shares with its arguments and what it raises -- a returned
argument or view of one is the argument's memory as in eager (a write through it shows in the
argument), the same tensor passed twice, requires_grad of results, no_grad inside the function,
and errors eager raises (bad shapes, bad indices, Python exceptions) raised by compiled calls too."""
import numpy as np
import pytest

import kiln
from conformance import ENV, VARIANTS, Call, environment, is_clear_error, rand, run_all_modes, t


def test_returned_argument_and_view_share_memory_as_in_eager():
    def f(x):
        return x, x[1:], x * 1

    def probe(fn):
        x = t(1.0, 2.0, 3.0)
        outs = []
        for _ in range(3):
            a, v, c = fn(x)
            a[0] = 10.0
            v[0] = 20.0
            c[2] = 30.0
            outs.append(x.asnumpy().tolist())
        return outs

    want = probe(f)
    with environment(ENV):
        for v in VARIANTS:
            assert probe(v.wrap(f)) == want, v.name


def test_same_tensor_passed_twice():
    def f(a, b):
        return a * b + a, (a is b)

    x = rand(3)
    run_all_modes(f, (x, x), (x, rand(3, seed=1)), (x, x))


def test_same_tensor_passed_twice_and_written_through_one():
    def f(a, b):
        a[0] = 5.0
        return b * 2

    def probe(fn):
        out = []
        for k in range(3):
            x, y = rand(3, seed=k), rand(3, seed=10 + k)
            out.append(fn(x, x).asnumpy().tolist())
            out.append(fn(x, y).asnumpy().tolist())
        return out

    want = probe(f)
    with environment(ENV):
        for v in VARIANTS:
            try:
                got = probe(v.wrap(f))
            except Exception as e:  # noqa: BLE001
                assert is_clear_error(e), f"{v.name}: {type(e).__name__}: {e}"
                continue
            assert got == want, v.name


def test_results_require_grad_as_in_eager():
    def f(x, w):
        return x * w, (x * 2).detach(), w.sum()

    w = rand(3, seed=1)
    w.requires_grad_(True)
    run_all_modes(f, (rand(3), w), (rand(3, seed=2), w), check_requires_grad=True)


def test_no_grad_inside_the_function():
    def f(x, w):
        with kiln.no_grad():
            frozen = w * 2
        return x * frozen + w

    w = rand(3, seed=1)
    w.requires_grad_(True)
    # grad mode after each call: a with block's __exit__ once ran only at capture (bytecode)
    run_all_modes(f, (rand(3), w), (rand(3, seed=2), w), (rand(3, seed=3), w), observe=kiln.is_grad_enabled,
                  check_requires_grad=True)
    run_all_modes(f, (rand(3), w), (rand(3, seed=2), w), (rand(3, seed=3), w),
                  around=lambda g: kiln.value_and_grad(g, grad_position=(0, 1)))


def test_shape_error_on_a_later_call():
    def f(x, y):
        return x + y

    run_all_modes(f, (rand(3), rand(3, seed=1)), (rand(3, seed=2), rand(3, seed=3)), (rand(3), rand(4)), raises=True)


def test_index_error_on_a_later_call():
    def f(xs, i):
        return xs[i] * 2

    run_all_modes(f, ([rand(2), rand(2, seed=1)], 1), ([rand(2), rand(2, seed=1)], 0), ([rand(2)], 1), raises=True)


def test_python_exception_on_python_value():
    def f(x, mode):
        if mode not in ("a", "b"):
            raise ValueError(f"bad mode {mode}")
        return x + 1 if mode == "a" else x - 1

    run_all_modes(f, (rand(2), "a"), (rand(2), "b"), (rand(2), "c"), raises=True)


def test_creation_ops_sized_by_input():
    def f(x):
        n = x.shape[0]
        return kiln.ops.ones(n) * x.sum(), kiln.ops.zeros((n, 2)), kiln.ops.arange(n) * 2

    run_all_modes(f, (rand(2, 3),), (rand(3, 3),), (rand(5, 3),), (rand(2, 3, seed=1),))


def test_result_written_by_caller_does_not_change_the_next_call():
    def f(x):
        return x * 2, (x + 1).sum()

    def probe(fn):
        out = []
        x = t(1.0, 2.0)
        for _ in range(3):
            a, s = fn(x)
            out.append((a.asnumpy().tolist(), float(s.asnumpy())))
            a[:] = 99.0
            s.fill_(-5.0) if hasattr(s, "fill_") else None
        return out

    want = probe(f)
    with environment(ENV):
        for v in VARIANTS:
            assert probe(v.wrap(f)) == want, v.name


def test_random_ops_draw_anew_each_call():
    def f(x):
        return x + kiln.ops.rand(x.shape), kiln.ops.dropout(x, p=0.5) if hasattr(kiln.ops, "dropout") else x

    run_all_modes(f, (kiln.ops.ones((64,)),), (kiln.ops.ones((64,)),), (kiln.ops.ones((64,)),), reset=lambda: kiln.manual_seed(0))


def test_same_tensor_twice_then_two_tensors_share_no_graph():
    """A graph captured for f(x, x) never serves f(x, y), nor the other way round (C fast path
    included): the key holds which arguments are one tensor."""
    def f(a, b):
        return a * 2 + b, a is b

    for v in VARIANTS:
        jf = v.wrap(f)
        with environment(ENV):
            x, y = rand(3), rand(3, seed=1)
            for args in [(x, y), (x, x), (x, y), (y, y), (y, x), (x, x)]:
                got, same = jf(*args)
                assert same is (args[0] is args[1]), v.name
                assert np.allclose(got.asnumpy(), (args[0] * 2 + args[1]).asnumpy()), v.name
