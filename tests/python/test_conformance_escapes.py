"""Conformance: objects a compiled state cannot rebuild. Bytecode capture freezes the state at a graph
break and rebuilds it (thaw) for the next graph or Python step. Three ways that lost eager's meaning:

- a list the code made, handed to an object outside the frames at a Python step (`LOG.append(l)`,
  `H.items = l`, `CACHE[k] = l`, `SimpleNamespace(items=l)`, `d.setdefault(k, [])`), was rebuilt as a
  copy: what the code appended afterwards never reached the outside object, from the first call on;
- a set the code made and kept across a break was kept by identity: every later call was given the
  capture's set, with what earlier calls had added;
- an object the capture made by calling a class (`kiln.no_grad()`) was named by a weak reference:
  once freed, the state could not be rebuilt and CPython ran the whole call again, repeating the side
  effects already done in it (a decorator's log entry, twice).
Each case runs eagerly and in every variant, observing the outside objects after each call."""
import collections
import functools
import types
import warnings

import pytest

import kiln
from conformance import Call, TRACE_VARIANTS, VARIANTS, rand, run_all_modes

LOG = []
CACHE = {}


class Holder:
    pass


H = Holder()


def _reset():
    LOG.clear()
    CACHE.clear()
    H.__dict__.clear()


def _observe():
    return repr(LOG), repr(CACHE), repr(H.__dict__), kiln._C.is_grad_enabled()


def list_appended_to_a_global(x):
    rows = []
    LOG.append(rows)
    y = x * 2.0
    rows.append(1)
    rows.append(len(LOG))
    return y + len(LOG[-1])


def list_stored_in_a_global_dict(x):
    rows = []
    CACHE["rows"] = rows
    y = x * 2.0
    rows.extend([1, 2])
    return y + len(CACHE["rows"])


def list_stored_as_an_attribute(x):
    rows = []
    H.rows = rows
    y = x * 2.0
    rows.append(3)
    return y + sum(H.rows)


def list_given_to_an_unknown_function(x):
    y = x * 2.0
    rows = []
    ns = types.SimpleNamespace(rows=rows)
    rows.append(1)
    LOG.append(len(ns.rows))
    return y + len(ns.rows)


def list_stored_by_a_method(x):
    y = x * 2.0
    d = collections.OrderedDict()
    d.setdefault("n", []).append(1)
    d["n"].append(2)
    return y + len(d["n"])


def dict_inside_a_list_given_out(x):
    inner = {"a": 1}
    outer = [inner]
    LOG.append(outer)
    y = x + 1.0
    inner["b"] = 2
    return y * len(LOG[-1][0])


def set_kept_across_a_break(x):
    y = x * 2.0
    seen = set()
    LOG.append(seen)
    seen.add(len(LOG))
    return y + len(seen)


def set_made_and_read_again(x):
    y = x * 2.0
    seen = {1, 2}
    LOG.append(len(LOG))
    seen.add(len(LOG) + 10)
    return y + len(seen) + max(seen)


CASES = [list_appended_to_a_global, list_stored_in_a_global_dict, list_stored_as_an_attribute,
         list_given_to_an_unknown_function, list_stored_by_a_method, dict_inside_a_list_given_out,
         set_kept_across_a_break, set_made_and_read_again]


def _calls(n=4):
    return [Call((rand(2, 3, seed=s),)) for s in range(1, 2 * n, 2)]


@pytest.mark.parametrize("fn", CASES, ids=lambda f: f.__name__)
def test_objects_handed_out_or_kept_match_eager(fn):
    run_all_modes(fn, *_calls(), reset=_reset, observe=_observe, variants=VARIANTS + TRACE_VARIANTS)


def _logged(fn):
    @functools.wraps(fn)
    def wrapper(*args):
        LOG.append("call")
        return fn(*args)

    return wrapper


def _no_grad_after_a_loop(x, y):
    acc = x * 2.0
    with kiln.no_grad():
        for t in (x, y):
            acc = acc + t
    return acc * y


def _autocast_block(x, y):
    acc = x * 2.0
    with kiln.amp.autocast(low_prec_dtype=kiln.bfloat16):
        z = acc @ y.T
    return z.astype(kiln.float32) + 1.0


@pytest.mark.parametrize("inner", [_no_grad_after_a_loop, _autocast_block], ids=lambda f: f.__name__)
def test_a_decorated_call_runs_its_side_effects_once(inner):
    """The wrapper's log entry is done in Python before the graph that makes the context manager; the
    graph's state must be rebuilt at every call, not the call run again."""
    import kiln.amp  # noqa: F401  (registers autocast as made again at each call)

    fn = _logged(inner)
    calls = [Call((rand(2, 3, seed=s), rand(2, 3, seed=s + 1))) for s in (1, 3, 5, 7, 9, 11)]
    run_all_modes(fn, *calls, reset=_reset, observe=_observe, variants=VARIANTS)


def test_a_context_manager_made_in_a_graph_stays_compiled():
    """Making kiln.no_grad() in a graph is not a reason to give up: the state makes one per call."""
    def step(x):
        y = x * 2.0
        LOG.append(1)
        with kiln.no_grad():
            z = y + 1.0
        return z * y

    jf = kiln.jit(step, capture_mode="bytecode")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for s in range(6):
            x = rand(2, 3, seed=s)
            got = jf(x)
            assert (got.numpy() == step(x).numpy()).all()
    _reset()
    assert jf.stats.eager_calls == 0 and jf.stats.compiles <= 4, jf.stats


def test_an_object_made_in_a_graph_and_kept_is_not_shared_between_calls():
    """A kiln object the capture makes that is not made again per call (here a Parameter-free
    Cell-less helper: kiln.nn.Identity) and stays live at a break gives up compiling rather than hand
    every later call the capture's object."""
    from kiln import nn

    def f(x):
        y = x * 2.0
        ident = nn.Identity()
        LOG.append(ident)
        return ident(y)

    jf = kiln.jit(f, capture_mode="bytecode")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        outs = [jf(rand(2, 3, seed=s)) for s in range(3)]
    assert len({id(o) for o in LOG}) == 3  # one per call, as eagerly
    for s, o in enumerate(outs):
        assert (o.numpy() == (rand(2, 3, seed=s) * 2.0).numpy()).all()
    _reset()


def _set_made_inside(x, s):
    return x * 2.0, {1, 2}


def _set_passed_in(x, s):
    return x * 2.0, s


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
def test_a_returned_set_is_the_calls_own(variant):
    """A set the function makes is a new set at every call (the caller may change it); a set the
    caller passed in comes back as that very set. Compiled calls once gave every caller the
    capture's set."""
    for fn in (_set_made_inside, _set_passed_in):
        jf = variant.wrap(fn)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = []
            for seed in range(3):
                s = {0}
                y, out = jf(rand(2, 3, seed=seed), s)
                assert (y.numpy() == (rand(2, 3, seed=seed) * 2.0).numpy()).all()
                got.append((s, out))
                out.add(99)  # the caller changes what it got
        for s, out in got:
            assert out == ({1, 2, 99} if fn is _set_made_inside else {0, 99}), (fn.__name__, out)
            assert (out is s) == (fn is _set_passed_in), fn.__name__
        assert len({id(out) for _, out in got}) == 3


def test_a_list_handed_out_and_left_alone_compiles_once():
    """The common case of a hand-over: a step collects numbers in a list, appends it to a global
    history and goes on without the list. The list is a new object each call; a state naming it
    would be captured again at every call (and give up after the limit on graphs). It is dead
    after the hand-over (kiln.jit.liveness), so the state leaves it out."""
    def step(x):
        losses = []
        y = x * 2.0
        losses.append(y.sum())
        LOG.append(losses)
        return y + 1.0

    jf = kiln.jit(step, capture_mode="bytecode")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for s in range(12):
            x = rand(2, 3, seed=s)
            assert (jf(x).numpy() == (x * 2.0 + 1.0).numpy()).all()
    assert [len(h) for h in LOG] == [1] * 12
    assert jf.stats.compiles <= 3, jf.stats
    _reset()


def test_a_dead_object_is_left_out_but_a_live_one_is_not():
    """Liveness decides per resume point: the list read again after the break stays in the state."""
    def step(x):
        rows = []
        LOG.append(rows)
        y = x * 2.0
        if len(LOG) > 100:  # (never: but it reads rows after the break, so rows stays live)
            rows.append(0)
        return y + len(rows)

    run_all_modes(step, *_calls(), reset=_reset, observe=_observe, variants=VARIANTS)
