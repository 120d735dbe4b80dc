"""Lists and dicts passed to a jitted function and changed inside it keep the change, and a
returned argument is the caller's own object, as eagerly (issue 27 item 1). A compiled graph
cannot replay such a change, so the function runs eagerly (with a warning) from the capturing
call on — including that call's own change."""
import warnings

import numpy as np
import pytest

import kiln

MODES = ("ast", "bytecode", "trace")


def T(*values):
    return kiln.Tensor(np.array(values, np.float32))


def record(x, history):
    history.append((x * x).sum())
    return x


def item_write(a, d):
    a[0] = a[0] * 2.0
    d["sum"] = a[0] + a[1]
    return a


def removals(a, d):
    if len(a) > 1:
        a.pop(1)
    d.pop("b", None)
    return d


def augmented_item(lst):
    lst[0] += lst[1]
    return lst[0] * 1.0


def run(fn, mode, calls):
    f = fn if mode == "eager" else kiln.jit(fn, capture_mode=mode)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return [f(*c) for c in calls]


def values(obj):
    if isinstance(obj, kiln.Tensor):
        return obj.numpy().tolist()
    if isinstance(obj, (list, tuple)):
        return [values(v) for v in obj]
    if isinstance(obj, dict):
        return {k: values(v) for k, v in obj.items()}
    return obj


@pytest.mark.parametrize("mode", MODES)
def test_appends_to_an_argument_list_are_kept(mode):
    h = []
    run(record, mode, [(T(1.0, 2.0), h), (T(3.0), h), (T(1.0, 2.0), h)])
    assert values(h) == [5.0, 9.0, 5.0]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fn, make", [
    (item_write, lambda: ([T(1.0), T(2.0)], {})),
    (removals, lambda: ([T(1.0), T(2.0), T(3.0)], {"a": 1, "b": 2})),
    (augmented_item, lambda: ([T(1.0), T(5.0)],)),
])
def test_changes_and_identity_match_eager(fn, make, mode):
    eager_args, jit_args = make(), make()
    for _ in range(2):
        want = run(fn, "eager", [eager_args])[0]
        got = run(fn, mode, [jit_args])[0]
        assert values(jit_args) == values(eager_args)
        assert values(got) == values(want)
        for a, w in zip(jit_args, eager_args):  # a returned argument is the caller's object
            assert (got is a) == (want is w)


@pytest.mark.parametrize("mode", MODES)
def test_the_switch_to_eager_is_said(mode):
    with pytest.warns(RuntimeWarning, match="runs eagerly"):
        kiln.jit(record, capture_mode=mode)(T(1.0), [])
