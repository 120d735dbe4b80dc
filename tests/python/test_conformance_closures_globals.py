"""Conformance: globals and closure variables read by compiled code (numbers, tensors, functions,
config objects, containers) changed between calls, global and nonlocal writes, closures made
again with other values, default and keyword arguments: every kiln.jit variant agrees with eager."""
import types

import pytest

import kiln
from conformance import Call, rand, run_all_modes, t

SCALE = 2.0
BIAS = t(1.0, 2.0, 3.0)
TABLE = [1.0, 2.0]
CFG = types.SimpleNamespace(alpha=0.5, mode="add")
COUNT = 0
LOG = []


def _reset_globals():
    global SCALE, BIAS, TABLE, COUNT, helper
    SCALE, BIAS, TABLE, COUNT = 2.0, t(1.0, 2.0, 3.0), [1.0, 2.0], 0
    CFG.alpha, CFG.mode = 0.5, "add"
    LOG.clear()
    helper = _helper_add


def _set(name, value):
    """A before() rebinding global `name` to value (a fresh one per run when value is a function)."""
    def before():
        globals()[name] = value() if callable(value) else value
    return before


def test_global_number_rebound_between_calls():
    def f(x):
        return x * SCALE

    x = rand(3)
    run_all_modes(f, (x,), (x,), Call((x,), before=_set("SCALE", -3.0)), Call((x,), before=_set("SCALE", 0.25)),
                  reset=_reset_globals)


def test_global_tensor_rebound_and_changed_in_place():
    def f(x):
        return x + BIAS

    def write_in_place():
        BIAS[1] = 10.0

    x = rand(3)
    run_all_modes(f, (x,), (x,), Call((x,), before=_set("BIAS", lambda: t(5.0, 5.0, 5.0))), Call((x,), before=write_in_place),
                  reset=_reset_globals)


def test_global_list_element_and_length_change():
    def f(x):
        out = x * TABLE[0]
        for w in TABLE:
            out = out + w
        return out, len(TABLE)

    def change_element():
        TABLE[0] = 7.0

    def change_other_element():
        TABLE[1] = -5.0

    def grow():
        TABLE.append(3.0)

    x = rand(2)
    run_all_modes(f, (x,), (x,), Call((x,), before=change_element), Call((x,), before=change_other_element),
                  Call((x,), before=grow), Call((x,), before=grow),
                  reset=_reset_globals)


def test_config_object_attributes_change():
    def f(x):
        if CFG.mode == "add":
            return x + CFG.alpha
        return x * CFG.alpha

    def mul_mode():
        CFG.mode = "mul"

    def alpha():
        CFG.alpha = 4.0

    x = rand(3)
    run_all_modes(f, (x,), Call((x,), before=alpha), Call((x,), before=mul_mode), (x,), reset=_reset_globals)


def _helper_add(x):
    return x + 1


def _helper_mul(x):
    return x * 3


helper = _helper_add


def test_global_function_rebound():
    def f(x):
        return helper(x) * 2

    x = rand(3)
    run_all_modes(f, (x,), (x,), Call((x,), before=_set("helper", lambda: _helper_mul)), (x,), reset=_reset_globals)


def test_global_write_counts_every_call():
    def f(x):
        global COUNT
        COUNT += 1
        return x * COUNT

    x = rand(2)
    run_all_modes(f, (x,), (x,), (rand(2, seed=1),), reset=_reset_globals, observe=lambda: COUNT)


def test_closure_variable_changed_by_outer_scope():
    def make():
        k = 1.0

        def f(x):
            return x * k

        def set_k(v):
            nonlocal k
            k = v
        return f, set_k

    f, set_k = make()
    x = rand(3)
    run_all_modes(f, (x,), Call((x,), before=lambda: set_k(5.0)), Call((x,), before=lambda: set_k(-1.0)),
                  reset=lambda: set_k(1.0))


def test_closure_over_tensor_rebound():
    def make():
        w = t(1.0, 1.0)

        def f(x):
            return (x * w).sum()

        def set_w(v):
            nonlocal w
            w = v
        return f, set_w

    f, set_w = make()
    x = rand(2)
    run_all_modes(f, (x,), Call((x,), before=lambda: set_w(t(2.0, -2.0))), Call((x,), before=lambda: set_w(t(0.5, 3.0))),
                  reset=lambda: set_w(t(1.0, 1.0)))


def test_nonlocal_counter_written_by_compiled_function():
    def make():
        calls = 0

        def f(x):
            nonlocal calls
            calls += 1
            return x + calls

        def reset():
            nonlocal calls
            calls = 0
        return f, lambda: calls, reset

    f, get, reset = make()
    run_all_modes(f, (rand(2),), (rand(2, seed=1),), (rand(2, seed=2),), observe=get, reset=reset)


def test_closures_made_again_with_other_values():
    def make(scale):
        def f(x):
            return x * scale + 1
        return f

    x = rand(3)
    for scale in (2.0, 3.0, -1.0):
        run_all_modes(make(scale), (x,), (rand(3, seed=1),))


def test_default_and_keyword_arguments():
    def f(x, scale=2.0, *, shift=0.0, flip=False):
        y = x * scale + shift
        return -y if flip else y

    x = rand(3)
    run_all_modes(f, (x,), Call((x,), dict(shift=1.0)), Call((x, 3.0), dict(flip=True)), Call((x,), dict(scale=-1.0)),
                  Call((x,), dict(flip=True, shift=2)))


def test_varargs_and_kwargs():
    def f(*xs, **named):
        out = xs[0]
        for x in xs[1:]:
            out = out + x
        for k in sorted(named):
            out = out * named[k]
        return out, len(xs), sorted(named)

    run_all_modes(f, (rand(2), rand(2, seed=1)), Call((rand(2), rand(2, seed=1), rand(2, seed=2)), dict(a=2.0)),
                  Call((rand(2),), dict(a=2.0, b=-1.0)))


def test_global_list_appended_by_compiled_function():
    def f(x):
        y = x * 2
        LOG.append(len(LOG))
        return y

    run_all_modes(f, (rand(2),), (rand(2, seed=1),), (rand(2, seed=2),), reset=_reset_globals, observe=lambda: list(LOG))


def _closure_counter():
    n = 0

    def f(x):
        def bump():
            nonlocal n
            n = n + 1

        bump()
        return x * n

    def reset():
        nonlocal n
        n = 0

    return f, reset, lambda: n


def test_nonlocal_written_by_an_inner_function_each_call():
    f, reset, observe = _closure_counter()
    run_all_modes(f, (rand(2),), (rand(2, seed=1),), (rand(2, seed=2),), (rand(3),), reset=reset, observe=observe)


def test_local_closure_accumulates_within_a_call():
    def f(x, k):
        total = 0

        def add(v):
            nonlocal total
            total += v

        add(k)
        add(2)
        return x * total, total

    run_all_modes(f, (rand(2), 1), (rand(2, seed=1), 1), (rand(2, seed=2), 5))
