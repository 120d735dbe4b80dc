"""A decorated function is compiled with its decorator (issue 27 item 6): source capture reads
the code of the function it is given, never the function a decorator's __wrapped__ names; and
compiled code made for one wrapper is not reused for another wrapping a different function
(item 11). Every capture mode against eager."""
import functools

import numpy as np
import pytest

import kiln

MODES = ("ast", "bytecode", "trace")


def square_sum(x):
    return (x * x).sum()


def cube_sum(x):
    return (x * x * x).sum()


def doubled(fn):
    @functools.wraps(fn)
    def wrapper(*args):
        return fn(*args) * 2.0

    return wrapper


def plus(c):
    def decorate(fn):
        @functools.wraps(fn)
        def wrapper(x):
            return fn(x) + c

        return wrapper

    return decorate


@doubled
def add(x, y):
    return x + y


@plus(10.0)
def twice(x):
    return x * 2.0


def X():
    return kiln.Tensor(np.array([1.0, 2.0, 3.0], np.float32))


def same(got, want):
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want)
        for g, w in zip(got, want):
            same(g, w)
    else:
        np.testing.assert_allclose(np.asarray(got.numpy()), np.asarray(want.numpy()), rtol=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_jit_of_grad_gives_the_gradient(mode):
    x = X()
    for transform in (kiln.grad, kiln.value_and_grad):
        jf = kiln.jit(transform(square_sum), capture_mode=mode)
        for _ in range(2):
            same(jf(x), transform(square_sum)(x))


@pytest.mark.parametrize("mode", MODES)
def test_wrappers_of_different_functions_do_not_share_compiled_code(mode):
    x = X()
    same(kiln.jit(kiln.grad(square_sum), capture_mode=mode)(x), kiln.grad(square_sum)(x))
    same(kiln.jit(kiln.grad(cube_sum), capture_mode=mode)(x), kiln.grad(cube_sum)(x))
    same(kiln.jit(doubled(cube_sum), capture_mode=mode)(x), doubled(cube_sum)(x))
    same(kiln.jit(doubled(square_sum), capture_mode=mode)(x), doubled(square_sum)(x))


@pytest.mark.parametrize("mode", MODES)
def test_a_called_helper_keeps_its_decorator(mode):
    @kiln.jit(capture_mode=mode)
    def f(x):
        return add(x, x) - 1.0

    x = X()
    for _ in range(2):
        same(f(x), add(x, x) - 1.0)


@pytest.mark.parametrize("mode", MODES)
def test_a_decorator_with_a_closure_is_compiled_with_it(mode):
    jf = kiln.jit(twice, capture_mode=mode)
    x = X()
    for _ in range(2):
        same(jf(x), twice(x))
