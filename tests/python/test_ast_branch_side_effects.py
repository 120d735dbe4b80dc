"""Both paths of an if on a tensor run while ast capture builds the graph; a list, dict or set
changed in place on a path (a local, the enclosing function's, a global) would then change
whatever the condition (issue 27 item 2). Such a change is undone and the function is captured
another way (here: run eagerly with a warning), so the result and the state equal eager's."""
import warnings

import numpy as np
import pytest

import kiln

LOG = []


def local_list(x):
    items = [x]
    if x.sum() > 0:
        items.append(x * 2.0)
    return items


def global_list(x):
    if x.sum() > 0:
        LOG.append("pos")
    else:
        LOG.append("neg")
    return x + 1.0


def numpy_state(x):
    counts = np.array([1, 2])
    a = x * 0.0
    for e in (1.0, 3.0, 5.0):
        a = a + float(counts.sum()) + e
        if a.sum() <= 15:
            counts += 1
    return a


def dict_in_enclosing_scope(x):
    seen = {}

    def inner(v):
        if v.sum() > 1:
            seen["big"] = v
        return v * 3.0

    return inner(x), sorted(seen)


@pytest.mark.parametrize("fn", [local_list, global_list, dict_in_enclosing_scope])
def test_state_changed_under_a_tensor_condition_matches_eager(fn):
    jf = kiln.jit(fn, capture_mode="ast")
    for values in ([1.0, 2.0], [-3.0, 1.0], [0.5, 0.25]):
        x = kiln.Tensor(np.array(values, np.float32))
        LOG.clear()
        want = fn(x)
        want_log = list(LOG)
        LOG.clear()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            got = jf(x)
        assert LOG == want_log
        got, want = (got if isinstance(got, (list, tuple)) else [got]), (want if isinstance(want, (list, tuple)) else [want])
        assert len(got) == len(want)
        for g, w in zip(got, want):
            if isinstance(w, kiln.Tensor):
                np.testing.assert_allclose(g.numpy(), w.numpy())
            else:
                assert g == w


def test_numpy_array_changed_in_place_is_not_a_python_container():
    # counts += 1 on a NumPy array under a tensor condition: kiln reads its value (float(...)) and
    # the capture cannot follow it, so the function runs eagerly and gives eager's result
    x = kiln.Tensor(np.array([0.0], np.float32))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        got = kiln.jit(numpy_state, capture_mode="ast")(x)
    np.testing.assert_allclose(got.numpy(), numpy_state(x).numpy())


def test_a_number_both_paths_give_alike_stays_a_number():
    def f(x, n):
        if x.sum() > 0:
            x = x * 2.0
            n = 3
        else:
            x = x - 1.0
            n = 3
        return x, n

    jf = kiln.jit(f, capture_mode="ast")
    for values in ([1.0], [-1.0]):
        x = kiln.Tensor(np.array(values, np.float32))
        got, n = jf(x, 3)
        assert type(n) is int and n == 3
        np.testing.assert_allclose(got.numpy(), f(x, 3)[0].numpy())


def appends_before_and_in_a_tensor_loop(x):
    for v in (1, 2):
        LOG.append(v)
    while x.sum() > 100.0:  # never true here: eagerly the body does not run
        LOG.append("loop")
        x = x * 0.5
    return x


def test_a_capture_given_up_leaves_the_state_as_eager_does():
    # the tensor loop's body appends to a global while traced; the capture is given up for another
    # one, which runs the function again: the first attempt's appends (before the loop too) are undone
    x = kiln.Tensor(np.array([1.0, 2.0], np.float32))
    LOG.clear()
    want = appends_before_and_in_a_tensor_loop(x)
    want_log = list(LOG)
    LOG.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        got = kiln.jit(appends_before_and_in_a_tensor_loop, capture_mode="ast")(x)
    assert LOG == want_log == [1, 2]
    np.testing.assert_allclose(got.numpy(), want.numpy())
