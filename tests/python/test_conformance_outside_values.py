"""Conformance: values of tensors from outside the call read into Python. A function that reads a
global's, a closure's or a Cell buffer's value (.item(), float(), int(), .tolist(), a truth test) and
computes with the number must follow an in-place write to that tensor between calls, as eager does.
ast and trace capture used to bake the first call's number into the graph with no guard on the
tensor, so `rate[...] = 2.0` went unseen; each read is now guarded on the tensor's version (an
in-place write compiles again; kiln.trace reports the changed constant)."""
import numpy as np
import pytest

import kiln
from kiln import nn
from conformance import Call, TRACE_VARIANTS, VARIANTS, rand, run_all_modes

RATE = kiln.tensor(0.5, dtype=kiln.float64)
STEPS = kiln.tensor(2, dtype=kiln.int64)
TABLE = kiln.tensor(np.array([1.0, 2.0, 3.0], np.float32))


def _set(t, value):
    def before():
        t[...] = value
    return before


def _calls(t, values):
    return [Call((rand(2, 3, seed=k),), before=_set(t, v)) for k, v in enumerate(values)]


def test_item_of_a_global_tensor():
    def f(x):
        return x * RATE.item()

    run_all_modes(f, *_calls(RATE, (0.5, 2.0, 2.0, -1.5)), variants=VARIANTS)


def test_float_of_a_global_tensor_in_python_arithmetic():
    def f(x):
        scale = float(RATE) * 2 + 1
        return x * scale, scale

    run_all_modes(f, *_calls(RATE, (0.5, 0.25, 3.0)), variants=VARIANTS)


def test_int_of_a_tensor_as_a_loop_count():
    def f(x):
        for _ in range(int(STEPS)):
            x = x * 0.5 + 1.0
        return x

    run_all_modes(f, *_calls(STEPS, (2, 3, 3, 1)), variants=VARIANTS)


def test_tolist_of_a_closure_tensor():
    table = kiln.tensor(np.array([1.0, 2.0, 3.0], np.float32))

    def f(x):
        a, b, c = table.tolist()
        return x * a + b - c

    calls = [Call((rand(2, 3, seed=k),), before=_set(table, np.array(v, np.float32)))
             for k, v in enumerate(([1.0, 2.0, 3.0], [0.5, 2.0, 3.0], [0.5, 2.0, -3.0]))]
    run_all_modes(f, *calls, variants=VARIANTS)


def test_a_cell_buffer_read_as_a_number():
    class Scaled(nn.Cell):
        def __init__(self):
            super().__init__()
            self.factor = kiln.tensor(2.0, dtype=kiln.float32)

        def construct(self, x):
            return x * self.factor.item()

    net = Scaled()
    calls = [Call((rand(2, 3, seed=k),), before=_set(net.factor, v)) for k, v in enumerate((2.0, 4.0, -1.0))]
    run_all_modes(lambda x: net(x), *calls, variants=VARIANTS)


def test_kiln_trace_reports_the_changed_value():
    """kiln.trace (MegEngine's semantics) raises TraceMismatchError naming the changed constant rather
    than computing with the old value; the same series, run through the conformance harness, may
    only raise that clear error."""
    def f(x):
        return x * TABLE.sum().item()

    run_all_modes(f, *_calls(TABLE, (np.array([1.0, 2.0, 3.0], np.float32), np.array([1.0, 2.0, 4.0], np.float32))),
                  variants=TRACE_VARIANTS)


def test_a_decorated_function_reading_an_outside_value_into_a_list():
    """A decorated function that reads the value into a list it builds and mutates in place."""
    import functools

    def scaled(fn):
        @functools.wraps(fn)
        def wrapper(x):
            return fn(x) * 1.0
        return wrapper

    @scaled
    def f(x):
        factors = [RATE.item()]
        factors.append(factors[0] * 2)
        factors[0] += 1.0
        return x * factors[0] + factors[1]

    run_all_modes(f, *_calls(RATE, (0.5, 0.25, 0.25, 3.0)), variants=VARIANTS)


_TABLE = np.array([1.0, -1.0, 0.5], dtype=np.float32)
_TABLES = [np.array([2.0, 3.0, 4.0], dtype=np.float32)]


class _Config:
    pass


_CFG = _Config()
_CFG.offsets = np.array([0.25, 0.5, 0.75], dtype=np.float32)


def _scaled_by_a_global_array(x):
    return x * kiln.Tensor(_TABLE)


def _shifted_by_an_attribute_array(x):
    return x + kiln.Tensor(_CFG.offsets)


def _scaled_by_an_array_in_a_global_list(x):
    return x * kiln.Tensor(_TABLES[0])


def _reset_arrays():
    _TABLE[:] = [1.0, -1.0, 0.5]
    _TABLES[0][:] = [2.0, 3.0, 4.0]
    _CFG.offsets[:] = [0.25, 0.5, 0.75]


def _write_arrays():
    _TABLE[0] = 7.0
    _TABLES[0][2] = -5.0
    _CFG.offsets[1] = -9.0


@pytest.mark.parametrize("fn", [_scaled_by_a_global_array, _shifted_by_an_attribute_array,
                                _scaled_by_an_array_in_a_global_list], ids=lambda f: f.__name__)
def test_a_numpy_array_from_outside_changed_in_place(fn):
    """A NumPy array reached through a global, an attribute or a global list, made a tensor in the
    function: its values are the graph's constants, so a write into the array between calls must
    compile again (every kiln.jit variant kept the first values)."""
    run_all_modes(fn, Call((rand(2, 3, seed=1),)), Call((rand(2, 3, seed=2),), before=_write_arrays),
                  Call((rand(2, 3, seed=3),)), reset=_reset_arrays, variants=VARIANTS)
