"""kiln._C.SymExpr, the handle Python holds to the C symbolic-size algebra (src/core/symdim.c):
arithmetic agreeing with Python's ints at many bindings (% and // by constants of either sign),
one canonical form (equal expressions equal and hash alike, in any order built), text with the
caller's symbol names, symbols(), substitute(), clear errors for division by zero or by a symbol,
SymLimitError where an expression outgrows the algebra; and, through kiln.jit, sizes combined with
% and negative floor division staying symbolic, and an expression past the limits specializing its
sizes rather than being wrong."""
import itertools
import random

import numpy as np
import pytest

import kiln
from kiln import _C

OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
       "//": lambda a, b: a // b, "%": lambda a, b: a % b}


def test_random_expressions_evaluate_like_python_ints():
    rng = random.Random(7)
    t = _C.SymTable()
    syms = [t.symbol(h) for h in (5, 3, 8)]
    bindings = [[rng.randint(2, 30) for _ in syms] for _ in range(12)] + [[5, 3, 8]]
    # pool of (expression, value per binding)
    pool = [(s, [b[k] for b in bindings]) for k, s in enumerate(syms)]
    made = 0
    while made < 300:
        (x, xv), (y, yv) = rng.choice(pool), rng.choice(pool)
        op = rng.choice(list(OPS))
        if op in ("//", "%"):
            c = rng.choice([-7, -3, -2, -1, 1, 2, 3, 4, 5])
            y, yv = c, [c] * len(bindings)
        elif rng.random() < 0.4:
            c = rng.randint(-6, 6)
            y, yv = c, [c] * len(bindings)
        try:
            r = OPS[op](x, y)
        except _C.SymLimitError:
            continue  # refused, never wrong
        want = [OPS[op](a, b) for a, b in zip(xv, yv)]
        got = [r.eval(b) if isinstance(r, _C.SymExpr) else r for b in bindings]
        assert got == want, (op, str(x), y, str(r))
        assert r.hint == want[-1]  # the value at the symbols' hints
        if isinstance(r, _C.SymExpr):  # its text reads back as Python (kiln.export's ONNX sizes parse it)
            assert all(eval(str(r), {}, {f"s{k}": v for k, v in enumerate(b)}) == w for b, w in zip(bindings, want)), \
                str(r)
        made += 1
        if max(abs(v) for v in want) < 10 ** 6:
            pool.append((r, want))


def test_canonical_equality_hash_and_constants():
    t = _C.SymTable()
    a, b = t.symbol(4), t.symbol(6)
    assert (a + b) * 2 == b * 2 + 2 * a and hash((a + b) * 2) == hash(b * 2 + 2 * a)
    assert {a * b * 64: 1}[64 * (b * a)] == 1
    assert (a * 6 + 4) % 3 == 1 and (a * 6) % 3 == 0  # constants fold to ints' equals
    c = a - a
    assert c.is_const and c.value == 0 and c == 0 and hash(c) == hash(0)
    assert a // -1 == -a and -(-a) == a and +a is a
    assert a != b and a != 4 and a + 0 == a
    assert (a * 2 + 1) // 2 == a  # floor((2a + 1) / 2) is a
    k = t.const(9)
    assert k.is_const and k.value == 9 and k.symbol_index is None and k.symbols() == ()
    with pytest.raises(ValueError, match="not a constant"):
        a.value


def test_symbols_index_text_and_substitute():
    t = _C.SymTable()
    a, b, c = t.symbol(5), t.symbol(3), t.symbol(7)
    assert (a.symbol_index, b.symbol_index, t.get(2) == c, t.symbols) == (0, 1, True, 3)
    e = (a + 1) // 2 * b - 3
    assert e.symbol_index is None
    assert e.symbols() == (0, 1)
    assert str(e) == "s1*((s0+1)//2)-3" and repr(e) == "SymExpr('s1*((s0+1)//2)-3')"
    assert e.text(["batch", "seq", "unused"]) == "seq*((batch+1)//2)-3"
    assert e.text([None, "seq"]) == "seq*((s0+1)//2)-3"
    assert (a % 4).text(["n"]) == "n-(n//4)*4"
    assert e.eval([5, 3, 7]) == e.hint == 6 and e.eval([10, 4, 1]) == 17
    fixed = e.substitute({1: 4})
    assert fixed.symbols() == (0,) and all(fixed.eval([n, 99, 99]) == (n + 1) // 2 * 4 - 3 for n in range(2, 20))
    whole = e.substitute({0: 9, 1: 2})
    assert whole.is_const and whole.value == 7
    with pytest.raises(ValueError, match="3 sizes expected"):
        e.eval([1, 2])
    with pytest.raises(TypeError):
        e.text([1])
    with pytest.raises(ValueError, match="no symbol"):
        e.substitute({5: 1})
    with pytest.raises(IndexError):
        t.get(3)


def test_bad_operations_raise_clear_errors():
    t, u = _C.SymTable(), _C.SymTable()
    a, b, other = t.symbol(5), t.symbol(3), u.symbol(5)
    for f in (lambda: a // 0, lambda: a % 0, lambda: t.const(4) // 0):
        with pytest.raises(ZeroDivisionError):
            f()
    for f in (lambda: a // b, lambda: 7 % a):
        with pytest.raises(ValueError, match="symbolic size"):
            f()
    with pytest.raises(ValueError, match="different symbol tables"):
        a + other
    assert a + u.const(2) == a + 2  # a constant belongs to no table
    with pytest.raises(TypeError):
        a + 1.5
    with pytest.raises(TypeError):
        a + True
    with pytest.raises(ValueError):
        t.symbol(1)  # lower bound 2 by default, above the hint
    small = t.symbol(2) * 2 ** 61  # its hint 2 ** 62 fits
    with pytest.raises(_C.SymLimitError):
        small * 4  # a coefficient past int64
    with pytest.raises(_C.SymLimitError):
        small + small  # the value at the hints past int64
    with pytest.raises(_C.SymLimitError):
        a + 2 ** 64  # a constant past int64


def test_limits_raise_sym_limit_error_and_leave_the_table_usable():
    t = _C.SymTable()
    s = [t.symbol(2 + k) for k in range(9)]
    total = sum(s[1:8], s[0])  # 8 terms fit
    with pytest.raises(_C.SymLimitError) as err:
        total + s[8]
    assert isinstance(err.value, ValueError) and "terms" in str(err.value)
    with pytest.raises(_C.SymLimitError):
        (s[0] + 1) * (s[1] + 1) * (s[2] + 1) * (s[3] + 1)  # 16 terms
    power = s[0] * s[0] * s[0] * s[0] * s[0] * s[0] * s[0] * s[0]
    with pytest.raises(_C.SymLimitError):
        power * s[0]
    with pytest.raises(_C.SymLimitError):
        for k in range(2, 5000):
            s[1] * k
    assert t.entries == 4096
    assert (s[1] * 2).eval([2, 3] + [2] * 7) == 6  # expressions already held still build


# ---- through kiln.jit -------------------------------------------------------------------------
def _mod_and_negative_floordiv(x):
    n = x.shape[0]
    whole = n - n % 3  # rows in complete groups of 3
    half_up = -(n // -2)  # ceil(n / 2) by floor division by a negative constant
    return x[:whole] * 2.0, x[:half_up].sum(0), x[:divmod(n, 4)[1] + 1].sum(0)


@pytest.mark.parametrize("mode", ["ast", "trace", "bytecode"])
def test_mod_and_negative_floordiv_of_sizes_stay_symbolic(mode):
    jf = kiln.jit(_mod_and_negative_floordiv, capture_mode=mode, dynamic=True)
    rng = np.random.default_rng(3)
    for n in (7, 5, 9, 12, 4, 7):
        x = kiln.Tensor(rng.standard_normal((n, 3)).astype(np.float32))
        got, want = jf(x), _mod_and_negative_floordiv(x)
        np.testing.assert_allclose(got[0].asnumpy(), want[0].asnumpy(), rtol=1e-6)
        np.testing.assert_allclose(got[1].asnumpy(), want[1].asnumpy(), rtol=1e-5)
        np.testing.assert_allclose(got[2].asnumpy(), want[2].asnumpy(), rtol=1e-5)
    info = jf.cache_info()
    assert info.compiles == 1, info  # one capture serves every size: nothing was specialized
    (d,) = info.dynamic
    assert all(v.endswith(">= 2") for v in d["symbols"].values()), d


def _past_int64(x):
    n = x.shape[0]
    whole = n * 10 ** 20 // 10 ** 20  # a Python int past int64 on the way, as in eager
    also = n * 2 ** 62 // 2 ** 62  # the expression's value past int64
    return x[:whole - 1] * 2.0, x[:also].sum(0), n * 10 ** 20 > 10 ** 19


@pytest.mark.parametrize("mode", ["ast", "trace", "bytecode"])
def test_sizes_past_int64_are_python_ints(mode):
    jf = kiln.jit(_past_int64, capture_mode=mode, dynamic=True)
    rng = np.random.default_rng(5)
    for n in (4, 6, 4):
        x = kiln.Tensor(rng.standard_normal((n, 2)).astype(np.float32))
        got, want = jf(x), _past_int64(x)
        np.testing.assert_allclose(got[0].asnumpy(), want[0].asnumpy(), rtol=1e-6)
        np.testing.assert_allclose(got[1].asnumpy(), want[1].asnumpy(), rtol=1e-5)
        assert got[2] is want[2] is True
    assert jf.cache_info().compiles == 2  # n was specialized: each size its own entry


def _product_of_sums(a, b, c, d, e):
    k = (a.shape[0] + 1) * (b.shape[0] + 1) * (c.shape[0] + 1) * (d.shape[0] + 1)  # 16 terms
    return (a.sum() + b.sum() + c.sum() + d.sum()) * k + e * 2.0


@pytest.mark.parametrize("mode", ["ast", "trace"])
def test_expression_past_the_limits_specializes_its_sizes(mode):
    jf = kiln.jit(_product_of_sums, capture_mode=mode, dynamic=True)
    rng = np.random.default_rng(4)
    for sizes in ((2, 3, 4, 5, 9), (3, 4, 5, 6, 10), (2, 3, 4, 5, 11), (3, 4, 5, 6, 7)):
        args = [kiln.Tensor(rng.standard_normal((n,)).astype(np.float32)) for n in sizes]
        np.testing.assert_allclose(jf(*args).asnumpy(), _product_of_sums(*args).asnumpy(), rtol=1e-5)
    info = jf.cache_info()
    assert info.compiles == 2, info  # new sizes of a..d: a new entry; of e alone: an instance
    for d in info.dynamic:
        whys = list(d["symbols"].values())
        assert sum("past the symbolic algebra's limits" in w for w in whys) == 4, whys
        assert sum(w.endswith(">= 2") for w in whys) == 1, whys  # e's size stays symbolic
