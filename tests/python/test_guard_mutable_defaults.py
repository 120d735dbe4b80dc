"""kiln.jit and mutable default arguments: a list, dict or set default is state the call key does
not hold, and len(), iteration or `in` read its contents with no attribute chain to guard. A
compiled call must see the default as it is at that call, whether the caller changed it between
calls, the function's own helper appends to it, or it is keyword-only; and a default that does not
change compiles once."""
import warnings

import numpy as np
import pytest

import kiln

VARIANTS = [(m, lv, b) for m in ("ast", "bytecode", "trace") for lv in ("O0", "O1") for b in ("kbk", "sink")]
IDS = ["-".join(v) for v in VARIANTS]

SCALES = [1.0]
TABLE = {"a": 1.0}
SEEN = {1}


def scaled(v, k=SCALES):
    return v * len(k) + sum(k)


def top_default(x, table=TABLE):
    return x * len(table) + table.get("b", 0.0)


def uses_helper(x):
    return scaled(x) - 1.0


def kwonly(x, *, members=SEEN):
    return x * (3 if 2 in members else 1)


def counts_calls(v, calls=[]):  # noqa: B006 - the mutable default is the point
    calls.append(1)
    return v * len(calls)


def twice(x):
    return counts_calls(x) + counts_calls(x)


def t(*v):
    return kiln.tensor(np.array(v, dtype=np.float32))


def jitted(fn, variant):
    mode, level, backend = variant
    return kiln.jit(fn, capture_mode=mode, jit_level=level, backend=backend)


def run(jf, *args):
    with warnings.catch_warnings():  # (a graph break or an eager fallback may warn)
        warnings.simplefilter("ignore")
        return jf(*args).numpy()


@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_caller_changes_a_default_between_calls(variant):
    SCALES[:], TABLE.clear(), SEEN.clear()
    TABLE["a"] = 1.0
    SEEN.add(1)
    fns = [jitted(f, variant) for f in (uses_helper, top_default, kwonly)]
    x = t(1.0, 2.0)
    for step in range(4):
        for fn, jf in zip((uses_helper, top_default, kwonly), fns):
            np.testing.assert_array_equal(run(jf, x), fn(x).numpy(), err_msg=f"{fn.__name__}, step {step}")
        SCALES.append(0.5 * step)
        TABLE[f"k{step}"] = 2.0
        TABLE["b"] = float(step)
        SEEN.add(step)


@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_helper_appends_to_its_own_default(variant):
    counts_calls.__defaults__[0].clear()
    jf = jitted(twice, variant)
    x = t(1.0, 2.0)
    got = [run(jf, x).tolist() for _ in range(3)]
    counts_calls.__defaults__[0].clear()
    expected = [twice(x).numpy().tolist() for _ in range(3)]
    assert got == expected


@pytest.mark.parametrize("mode", ["ast", "bytecode", "trace"])
def test_unchanged_default_compiles_once(mode):
    SCALES[:] = [1.0, 2.0]
    jf = kiln.jit(scaled, capture_mode=mode)
    x = t(1.0, 2.0)
    for _ in range(5):
        np.testing.assert_array_equal(run(jf, x), scaled(x).numpy())
    assert jf.stats.compiles == 1


@pytest.mark.parametrize("mode", ["ast", "bytecode", "trace"])
def test_passed_argument_is_not_the_default(mode):
    SCALES[:] = [1.0]
    jf = kiln.jit(scaled, capture_mode=mode)
    x = t(1.0, 2.0)
    for k in range(3):
        mine = [2.0] * (k + 1)
        np.testing.assert_array_equal(run(jf, x, mine), scaled(x, mine).numpy())
