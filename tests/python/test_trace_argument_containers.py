"""kiln.trace and lists or dicts passed as arguments: a traced function that changes one is refused
with TraceMismatchError on the recording call (a replay runs only the recorded tensor ops, so the
change would silently not happen on later calls), and the caller's container is left as it was;
reading them is fine. kiln.jit runs such functions eagerly, so its results and the caller's
containers equal eager's."""
import warnings

import numpy as np
import pytest

import kiln


def t(*v):
    return kiln.tensor(np.array(v, dtype=np.float32))


def appends(x, acc):
    acc.append(x * 2)
    return x + 1


def sets_item(x, acc):
    acc[0] = acc[0] + x
    return x * 3


def pops(x, d):
    return d.pop("a") * x


def updates_nested(x, pair):
    pair[1]["k"] = x
    return x - 1


def updates_kwarg(x, *, extra):
    extra.extend([x, x])
    return x


CHANGERS = [
    (appends, lambda: ((t(1.0, 2.0), [t(0.0, 0.0)]), {})),
    (sets_item, lambda: ((t(1.0, 2.0), [t(5.0, 6.0)]), {})),
    (pops, lambda: ((t(1.0, 2.0), {"a": t(3.0, 4.0), "b": t(0.0, 1.0)}), {})),
    (updates_nested, lambda: ((t(1.0, 2.0), (t(0.0, 0.0), {"k": t(9.0, 9.0)})), {})),
    (updates_kwarg, lambda: ((t(1.0, 2.0),), {"extra": []})),
]


def snapshot(v):
    if isinstance(v, kiln.Tensor):
        return ("T", v.numpy().tolist())
    if isinstance(v, (list, tuple)):
        return (type(v).__name__, [snapshot(i) for i in v])
    if isinstance(v, dict):
        return ("dict", [(k, snapshot(i)) for k, i in v.items()])
    return v


@pytest.mark.parametrize("fn,make", CHANGERS, ids=[f.__name__ for f, _ in CHANGERS])
@pytest.mark.parametrize("symbolic", [False, True])
def test_trace_refuses_changing_an_argument_container(fn, make, symbolic):
    args, kwargs = make()
    before = snapshot((args, kwargs))
    traced = kiln.trace(fn, symbolic=symbolic)
    with pytest.raises(kiln.jit.TraceMismatchError, match="passed in as an argument"):
        traced(*args, **kwargs)
    assert snapshot((args, kwargs)) == before  # the refused call left the caller's objects alone


@pytest.mark.parametrize("fn,make", CHANGERS, ids=[f.__name__ for f, _ in CHANGERS])
@pytest.mark.parametrize("mode", ["ast", "bytecode", "trace"])
def test_jit_changes_argument_containers_as_eager_does(fn, make, mode):
    jitted = kiln.jit(fn, capture_mode=mode)
    for _ in range(3):
        eager_args, eager_kwargs = make()
        expected = snapshot(fn(*eager_args, **eager_kwargs))
        args, kwargs = make()
        with warnings.catch_warnings():  # (jit may warn that the function runs eagerly)
            warnings.simplefilter("ignore")
            got = snapshot(jitted(*args, **kwargs))
        assert got == expected
        assert snapshot((args, kwargs)) == snapshot((eager_args, eager_kwargs))


def reads_containers(x, acc, d):
    return x * acc[0] + d["w"] * len(acc)


@pytest.mark.parametrize("verify", [True, False])
def test_trace_reading_argument_containers_replays(verify):
    traced = kiln.trace(reads_containers)
    traced.verify = verify
    for k in range(4):
        acc, d = [t(1.0, float(k))], {"w": t(2.0, 3.0)}
        got = traced(t(1.0, 2.0), acc, d).numpy()
        np.testing.assert_array_equal(got, reads_containers(t(1.0, 2.0), acc, d).numpy())
        assert len(acc) == 1 and list(d) == ["w"]
