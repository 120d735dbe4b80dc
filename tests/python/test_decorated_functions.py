"""Decorated functions under kiln.jit and kiln.trace: the function captured is a wrapper
(functools.wraps) around the user's function, as logging, timing, scaling and caching decorators
make it. Every variant must give eager's results: a decorator's closed-over settings read live,
its Python side effects kept, stacked decorators, decorated Cell methods, and kiln.jit applied
above or below a decorator."""
import functools

import numpy as np
import pytest

import kiln
from conformance import Call, rand, run_all_modes
from compiled_equal import assert_compiled_equal
from kiln import nn


def scaled(factor):
    def decorate(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            return fn(*args, **kwargs) * factor
        return wrapper
    return decorate


def shifted_inputs(fn):
    @functools.wraps(fn)
    def wrapper(x, *rest, shift=1.0):
        return fn(x + shift, *rest)
    return wrapper


@scaled(3.0)
@shifted_inputs
def stacked(x, y):
    return ops_mix(x, y)


def ops_mix(x, y):
    return kiln.ops.tanh(x) * y + x.sum()


def test_stacked_decorators_compile_and_equal_eager():
    assert stacked.__name__ == "stacked"
    assert_compiled_equal(stacked, (rand(3, 4), rand(3, 4, seed=1)), (rand(3, 4, seed=2), rand(3, 4, seed=3)))


def test_stacked_decorators_gradients_equal_eager():
    assert_compiled_equal(stacked, (rand(2, 3), rand(2, 3, seed=1)), grad=True)


def test_wrapper_keyword_argument_changes_between_calls():
    x, y = rand(3), rand(3, seed=1)
    run_all_modes(stacked, Call((x, y)), Call((x, y), {"shift": 2.0}), Call((x, y), {"shift": -0.5}))


SETTINGS = {"factor": 2.0}


def live_factor(fn):
    @functools.wraps(fn)
    def wrapper(x):
        return fn(x) * SETTINGS["factor"]
    return wrapper


@live_factor
def live(x):
    return x * x + 1.0


def test_decorator_reads_a_setting_the_caller_changes():
    x = rand(4)
    run_all_modes(live, (x,), Call((x,), before=lambda: SETTINGS.update(factor=5.0)), (x,),
                  reset=lambda: SETTINGS.update(factor=2.0))


def counted(fn):
    @functools.wraps(fn)
    def wrapper(*args):
        wrapper.calls.append(len(wrapper.calls))
        return fn(*args)
    wrapper.calls = []
    return wrapper


@counted
def counted_fn(x):
    return (x * 2.0).exp()


def test_decorator_side_effect_happens_at_every_call():
    x = rand(3)
    run_all_modes(counted_fn, (x,), (x,), (x,), reset=lambda: counted_fn.calls.clear(),
                  observe=lambda: list(counted_fn.calls))


def memoized_on_shape(fn):
    cache = {}

    @functools.wraps(fn)
    def wrapper(x):
        key = tuple(x.shape)
        if key not in cache:
            cache[key] = float(len(cache) + 1)
        return fn(x) + cache[key]
    wrapper.cache = cache
    return wrapper


@memoized_on_shape
def memo(x):
    return x.mean(axis=0)


def test_decorator_with_its_own_cache_keyed_on_shape():
    run_all_modes(memo, (rand(2, 3),), (rand(4, 3, seed=1),), (rand(2, 3, seed=2),),
                  reset=lambda: memo.cache.clear(), observe=lambda: dict(memo.cache))


class Block(nn.Cell):
    def __init__(self):
        super().__init__()
        self.dense = nn.Dense(4, 4)
        self.gain = 1.5

    @scaled(0.5)
    def construct(self, x):
        return kiln.ops.relu(self.dense(x)) * self.gain


@pytest.mark.parametrize("mode", ["ast", "bytecode", "trace"])
def test_decorated_cell_construct_follows_attribute_changes(mode):
    kiln.set_seed(0)
    net = Block()
    jf = kiln.jit(net, capture_mode=mode)
    x = rand(2, 4)
    np.testing.assert_allclose(jf(x).numpy(), net.construct(x).numpy(), rtol=1e-6)
    net.gain = -2.0
    np.testing.assert_allclose(jf(x).numpy(), net.construct(x).numpy(), rtol=1e-6)
    assert np.allclose(net.construct(x).numpy(), (np.maximum(net.dense(x).numpy(), 0) * -1.0), rtol=1e-6)


def test_jit_below_a_decorator_and_above_one():
    calls = []

    def logged(fn):
        @functools.wraps(fn)
        def wrapper(x):
            calls.append("call")
            return fn(x)
        return wrapper

    def f(x):
        return kiln.ops.sigmoid(x) * 4.0 - x

    inner = logged(kiln.jit(f, capture_mode="bytecode"))
    outer = kiln.jit(logged(f), capture_mode="bytecode")
    x = rand(5)
    want = f(x).numpy()
    for _ in range(3):
        np.testing.assert_allclose(inner(x).numpy(), want, rtol=1e-6)
        np.testing.assert_allclose(outer(x).numpy(), want, rtol=1e-6)
    assert calls == ["call"] * 6  # the wrapper's own Python runs at every call, below jit or above


@pytest.mark.parametrize("kwargs", [{}, {"symbolic": True}, {"verify": False}])
def test_kiln_trace_of_a_decorated_function(kwargs):
    f = kiln.trace(stacked, **kwargs)
    for seed in range(3):
        x, y = rand(3, seed=seed), rand(3, seed=seed + 10)
        np.testing.assert_allclose(f(x, y).numpy(), stacked(x, y).numpy(), rtol=1e-6)
