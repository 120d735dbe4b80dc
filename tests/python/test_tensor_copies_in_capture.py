"""A copy made inside a compiled function -- kiln.Tensor(x), kiln.tensor(x), Tensor(x, dtype),
Parameter.clone(), copy.deepcopy -- is the value at every call, not the first call's. The
constructor copied outside the trace, so the graph kept the capture's copy as a constant: a
jitted function returning Tensor(x) or p.clone() gave its first call's values forever, in every
capture mode (found while compiling a loss-scale step that cloned its parameters)."""
import copy

import numpy as np
import pytest

import kiln
from kiln import nn, ops

from conformance import Call, run_all_modes

P = nn.Parameter(kiln.Tensor(np.zeros(3, np.float32)), name="p")


def bump_p(by):
    with kiln.no_grad():
        P[...] = P + by


def reset_p():
    with kiln.no_grad():
        P[...] = 0.0


def x(v):
    return kiln.Tensor(np.full(3, v, np.float32))


def copies_of_an_input(a):
    return kiln.Tensor(a) * 2 + kiln.tensor(a) + kiln.Tensor(a, kiln.float64).astype(kiln.float32)


def copies_of_a_parameter(a):
    return a + kiln.Tensor(P) + P.clone() + copy.deepcopy(P) * 2


def clone_then_update(a):
    before = P.clone()
    with kiln.no_grad():
        P[...] = P + a
    return before


def test_copies_of_inputs_follow_the_inputs():
    run_all_modes(copies_of_an_input, (x(1.0),), (x(3.0),), (x(-2.5),))


def test_copies_of_a_parameter_follow_its_updates():
    run_all_modes(copies_of_a_parameter, (x(1.0),), Call((x(1.0),), before=lambda: bump_p(1.0)),
                  Call((x(2.0),), before=lambda: bump_p(5.0)), reset=reset_p)


def test_a_clone_taken_before_an_in_place_update():
    run_all_modes(clone_then_update, (x(1.0),), (x(1.0),), (x(2.0),), reset=reset_p,
                  observe=lambda: P.asnumpy().copy())


def test_a_copy_is_detached_as_eagerly():
    def loss(w):
        return (kiln.Tensor(w) * w).sum()  # d/dw = Tensor(w): the copy carries no gradient

    w = kiln.Tensor(np.array([1.0, 2.0], np.float32))
    want = kiln.grad(loss)(w).asnumpy()
    np.testing.assert_allclose(want, [1.0, 2.0])
    for mode in ("ast", "bytecode", "trace"):
        got = kiln.jit(kiln.grad(loss), capture_mode=mode)(w).asnumpy()
        np.testing.assert_allclose(got, want)


@pytest.mark.parametrize("symbolic", [False, True])
def test_kiln_trace(symbolic):
    reset_p()
    t = kiln.trace(copies_of_a_parameter, symbolic=symbolic)
    for k in range(3):
        bump_p(1.0)
        np.testing.assert_allclose(t(x(k)).asnumpy(), copies_of_a_parameter(x(k)).asnumpy())
    reset_p()
