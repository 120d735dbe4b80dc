"""The conformance harness: a function runs eagerly and under every kiln.jit variant, each over the
same series of calls, and every compiled run must give what eager gave.

    run_all_modes(fn, (x,), (x2,), Call((x3,), before=lambda: CFG.update(k=2)), reset=..., observe=...)

Each positional after fn is one call: a tuple of arguments or a Call (arguments, keyword arguments,
and `before`, run just before that call: mutating Python state between calls). The series runs
once eagerly (the reference) and then, from the same starting state, for every variant in
VARIANTS: capture_mode ast / bytecode / trace x jit_level O0 / O1 x backend kbk / sink, a fresh
kiln.jit wrapper each. Arguments are cloned for every run (tensors copied, containers rebuilt), so
what one run does to them in place cannot leak into the next. `reset()` restores the Python state
(globals, closure containers) before every run; `observe()` returns the Python state to compare
after every call.

What is compared after every call: the result (Python types of containers and scalars, dict key
order, tensors' dtype, shape and values), the arguments as the call left them (in-place changes of
argument containers and tensors), and observe()'s snapshot. A compiled call may instead raise a
clear kiln error (JitSyntaxError, TraceMismatchError, NotImplementedError, or an error whose
message kiln wrote: starting "kiln" / "jit", naming kiln.jit / kiln.trace, a capture or a graph break); that variant then stops. When eager raises, the compiled call must
raise the same exception type. Anything else -- another result, a missing side effect, an internal
exception -- is a failure, reported with the variant, the call number and where they differ.

KILN_CONFORM_VERBOSE=1 prints which variants raised instead of running (allowed, but worth knowing).
"""
import contextlib
import dataclasses
import math
import os
import re
import warnings

import numpy as np

import kiln
from kiln.jit.megengine import TraceMismatchError

MODES = ("ast", "bytecode", "trace")
LEVELS = ("O0", "O1")
BACKENDS = ("kbk", "sink")


class Variant:
    """A way to compile: name, and wrap(fn, **options) giving the compiled callable."""

    def __init__(self, name, wrap):
        self.name, self.wrap = name, wrap

    def __repr__(self):
        return self.name


def _jit_variant(mode, level, backend):
    return Variant(f"{mode}-{level}-{backend}",
                   lambda fn, **o: kiln.jit(fn, capture_mode=mode, jit_level=level, backend=backend, **o))


def _trace_variant(symbolic, opt_level, symbolic_shape):
    name = f"trace(symbolic={symbolic},opt_level={opt_level},symbolic_shape={symbolic_shape})"
    return Variant(name, lambda fn, **o: kiln.trace(fn, symbolic=symbolic, opt_level=opt_level,
                                                    symbolic_shape=symbolic_shape, **o))


VARIANTS = [_jit_variant(m, lv, b) for m in MODES for lv in LEVELS for b in BACKENDS]
# MegEngine's kiln.trace: records on the first call, replays after, checks each call (verify=True)
TRACE_VARIANTS = [_trace_variant(s, lv, ss) for s in (False, True) for lv in (0, 2) for ss in (True, False)]
# O1's and the sink's generated C is the same computation as its interpreted path (test_differential
# checks both); the interpreted path spares every variant a compiler run, keeping the suite fast.
ENV = {"KILN_DISABLE_CODEGEN": "1"}
VERBOSE = os.environ.get("KILN_CONFORM_VERBOSE", "") not in ("", "0")
TOL = {kiln.float32: dict(rtol=1e-5, atol=1e-6), kiln.float64: dict(rtol=1e-12, atol=1e-12),
       kiln.float16: dict(rtol=2e-3, atol=2e-3), kiln.bfloat16: dict(rtol=1e-2, atol=1e-2)}
CLEAR_ERRORS = (kiln.JitSyntaxError, TraceMismatchError, NotImplementedError)
# an error of another type is clear when kiln says so: its message names jit / kiln.trace / capture
CLEAR_MESSAGE = re.compile(r"^(kiln|jit)\b|kiln\.(jit|trace)\b|\bcapture|graph break", re.IGNORECASE)


class Call:
    """One call of the series: args, kwargs, and before() run first (changing Python state)."""

    def __init__(self, args=(), kwargs=None, before=None):
        self.args, self.kwargs, self.before = tuple(args), dict(kwargs or {}), before


@contextlib.contextmanager
def environment(env):
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# ---- cloning arguments ---------------------------------------------------------------------------


def clone(obj, memo=None):
    """A copy of obj with fresh tensors and containers, keeping which parts alias which."""
    memo = {} if memo is None else memo
    if id(obj) in memo:
        return memo[id(obj)]
    if isinstance(obj, kiln.Tensor):
        out = kiln.Tensor(np.array(obj.asnumpy(), copy=True), obj.dtype)
        if not obj.is_contiguous():  # a view with gaps, as the original is not contiguous either
            big = kiln.Tensor(np.zeros(tuple(2 * s for s in obj.shape), np.float64), obj.dtype)
            view = big[tuple(slice(None, None, 2) for _ in obj.shape)]
            view[...] = out
            out = view
        if obj.requires_grad:
            out.requires_grad_(True)
    elif isinstance(obj, np.ndarray):
        out = obj.copy()
    elif isinstance(obj, list):
        out = memo[id(obj)] = []
        out.extend(clone(v, memo) for v in obj)
        return out
    elif isinstance(obj, dict):
        out = memo[id(obj)] = type(obj)()
        for k, v in obj.items():
            out[k] = clone(v, memo)
        return out
    elif isinstance(obj, tuple) and hasattr(obj, "_fields"):
        out = type(obj)(*(clone(v, memo) for v in obj))
    elif isinstance(obj, tuple):
        out = tuple(clone(v, memo) for v in obj)
    elif isinstance(obj, (set, frozenset)):
        out = type(obj)(obj)  # elements are hashable: numbers, strings
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = memo[id(obj)] = object.__new__(type(obj))
        for f in dataclasses.fields(obj):
            setattr(out, f.name, clone(getattr(obj, f.name), memo))
        return out
    elif _plain_object(obj):
        out = memo[id(obj)] = object.__new__(type(obj))
        out.__dict__.update(clone(vars(obj), memo))
        return out
    else:
        out = obj  # numbers, strings, None, functions, Cells: shared
    memo[id(obj)] = out
    return out


def _plain_object(obj):
    """An instance of a user class holding its state in __dict__ (not a function, type, module, Cell)."""
    return (hasattr(obj, "__dict__") and not isinstance(obj, (type, kiln.nn.Cell, type(os)))
            and not callable(obj) and type(obj).__module__ not in ("builtins",))


# ---- comparing -----------------------------------------------------------------------------------


REQUIRES_GRAD = False  # compare results' requires_grad (run_all_modes(check_requires_grad=True) turns it on)


def difference(got, want, path="result"):
    """None when got equals want as eager's result; otherwise a sentence saying where and how not."""
    if isinstance(want, kiln.Tensor):
        if not isinstance(got, kiln.Tensor):
            return f"{path}: {type(got).__name__} instead of a Tensor"
        if got.dtype is not want.dtype:
            return f"{path}: dtype {got.dtype} instead of {want.dtype}"
        if tuple(got.shape) != tuple(want.shape):
            return f"{path}: shape {tuple(got.shape)} instead of {tuple(want.shape)}"
        if REQUIRES_GRAD and bool(got.requires_grad) != bool(want.requires_grad):
            return f"{path}: requires_grad {got.requires_grad} instead of {want.requires_grad}"
        return _values_differ(np.asarray(got.asnumpy()), np.asarray(want.asnumpy()), want.dtype, path)
    if type(got) is not type(want):
        return f"{path}: {type(got).__name__} {_short(got)} instead of {type(want).__name__} {_short(want)}"
    if isinstance(want, np.ndarray):
        if got.dtype != want.dtype or got.shape != want.shape:
            return f"{path}: array {got.dtype}{got.shape} instead of {want.dtype}{want.shape}"
        return _values_differ(got, want, None, path)
    if isinstance(want, (list, tuple)):
        if len(got) != len(want):
            return f"{path}: length {len(got)} instead of {len(want)}: {_short(got)} vs {_short(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            d = difference(g, w, f"{path}[{i}]")
            if d:
                return d
        return None
    if isinstance(want, dict):
        if list(got) != list(want):
            return f"{path}: keys {list(got)} instead of {list(want)}"
        for k in want:
            d = difference(got[k], want[k], f"{path}[{k!r}]")
            if d:
                return d
        return None
    if isinstance(want, float):
        same = got == want or (math.isnan(got) and math.isnan(want))
        close = math.isclose(got, want, rel_tol=1e-5, abs_tol=1e-6)
        return None if same or close else f"{path}: {got!r} instead of {want!r}"
    if dataclasses.is_dataclass(want):
        for f in dataclasses.fields(want):
            d = difference(getattr(got, f.name), getattr(want, f.name), f"{path}.{f.name}")
            if d:
                return d
        return None
    if _plain_object(want):
        return difference(vars(got), vars(want), f"{path}.__dict__")
    if isinstance(want, (int, str, bytes, bool, type(None), complex, set, frozenset, range, slice)):
        return None if got == want else f"{path}: {got!r} instead of {want!r}"
    return None if got is want or got == want else f"{path}: {_short(got)} instead of {_short(want)}"


def _values_differ(got, want, dtype, path):
    if want.dtype.kind in "fc":
        t = TOL.get(dtype, dict(rtol=1e-5, atol=1e-6))
        ok = np.allclose(got.astype(np.float64), want.astype(np.float64), equal_nan=True, **t)
    else:
        ok = np.array_equal(got, want)
    if ok:
        return None
    return f"{path}: values {np.array2string(got.ravel()[:6], precision=5)} instead of " \
           f"{np.array2string(want.ravel()[:6], precision=5)}"


def _short(v):
    """A one-line description: tensors as Tensor(float32[2, 3]), containers element by element."""
    if isinstance(v, kiln.Tensor):
        s = f"Tensor({v.dtype}{list(v.shape)})"
    elif isinstance(v, tuple) and hasattr(v, "_fields"):
        s = f"{type(v).__name__}(" + ", ".join(f"{k}={_short(e)}" for k, e in zip(v._fields, v)) + ")"
    elif isinstance(v, (list, tuple)):
        inner = ", ".join(_short(e) for e in v)
        s = f"[{inner}]" if isinstance(v, list) else f"({inner}{',' if len(v) == 1 else ''})"
    elif isinstance(v, dict):
        s = "{" + ", ".join(f"{k!r}: {_short(e)}" for k, e in v.items()) + "}"
    else:
        s = repr(v).replace("\n", " ")
    return s if len(s) < 160 else s[:157] + "..."


# ---- running -------------------------------------------------------------------------------------


def _calls(calls):
    return [c if isinstance(c, Call) else Call(c) for c in calls]


def _series(fn, calls, reset, observe):
    """Runs the calls; returns one record per call: ('ok', result, args after, observed) or
    ('raise', exception). Stops after the first exception."""
    if reset:
        reset()
    out = []
    for c in calls:
        if c.before:
            c.before()
        args, kwargs = clone(c.args), clone(c.kwargs)
        try:
            r = fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 -- compared with eager's
            out.append(("raise", e))
            break
        out.append(("ok", r, (args, kwargs), observe() if observe else None))
    return out


def is_clear_error(e):
    if isinstance(e, CLEAR_ERRORS):
        return True
    return isinstance(e, (RuntimeError, TypeError, ValueError)) and CLEAR_MESSAGE.search(str(e)) is not None


def compare_series(name, got, want):
    """Problems of a compiled series against eager's (an empty list when it conforms)."""
    for i, w in enumerate(want):
        if i >= len(got):
            return []  # the compiled series stopped at a clear error, checked below
        g = got[i]
        where = f"{name} call {i}"
        if w[0] == "raise":
            if g[0] != "raise":
                return [f"{where}: eager raised {type(w[1]).__name__}: {w[1]}; compiled returned {_short(g[1])}"]
            if not isinstance(g[1], type(w[1])) and not is_clear_error(g[1]):
                return [f"{where}: eager raised {type(w[1]).__name__}, compiled {type(g[1]).__name__}: {g[1]}"]
            return []
        if g[0] == "raise":
            if is_clear_error(g[1]):
                if VERBOSE:
                    print(f"  [raised] {where}: {type(g[1]).__name__}: {str(g[1])[:200]}")
                return []
            return [f"{where}: {type(g[1]).__name__}: {g[1]} (eager returned {_short(w[1])})"]
        for label, gv, wv in (("result", g[1], w[1]), ("arguments after the call", g[2], w[2]),
                              ("observed state", g[3], w[3])):
            d = difference(gv, wv, label)
            if d:
                return [f"{where}: {d}"]
    return []


def run_all_modes(fn, *calls, reset=None, observe=None, variants=VARIANTS, options=None, around=None,
                  check_requires_grad=False, raises=False):
    """Runs fn eagerly, then under every variant, over the same calls; raises AssertionError listing
    every variant whose results differ from eager's without a clear error. Returns eager's records.
    around(f) -> callable: what is called with each call's arguments, given fn or its compiled
    variant (e.g. lambda f: kiln.value_and_grad(f)); default: f itself. check_requires_grad=True:
    results' requires_grad is compared too (off by default: compiled Cells' results, and the value
    value_and_grad of a compiled function returns, do not require grad where eager's do, while
    their gradients are right). raises=True: eager is expected to raise on
    a call (the case tests errors); otherwise an eager exception fails the case (a broken case
    would otherwise pass, every variant raising the same)."""
    global REQUIRES_GRAD
    calls = _calls(calls)
    REQUIRES_GRAD = check_requires_grad
    around = around or (lambda f: f)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = _series(around(fn), calls, reset, observe)
        eager_raised = want[-1][0] == "raise"
        if eager_raised != raises:
            raise AssertionError(f"eager {'raised ' + repr(want[-1][1]) if eager_raised else 'did not raise'} "
                                 f"(raises={raises})")
        problems = []
        with environment(ENV):
            for v in variants:
                try:
                    jf = around(v.wrap(fn, **(options or {})))
                except Exception as e:  # noqa: BLE001
                    problems.append(f"{v.name}: refused: {type(e).__name__}: {e}")
                    continue
                got = _series(jf, calls, reset, observe)
                problems += compare_series(v.name, got, want)
    REQUIRES_GRAD = False
    if reset:
        reset()
    name = getattr(fn, "__qualname__", type(fn).__name__)
    assert not problems, f"{name}: compiled differs from eager:\n  " + "\n  ".join(_grouped(problems))
    return want


def _grouped(problems):
    """'variant call i: symptom' lines, variants with the same symptom on one line."""
    by = {}
    for p in problems:
        name, _, rest = p.partition(" ")
        by.setdefault(rest, []).append(name)
    return [f"{', '.join(names)}: {rest}" for rest, names in by.items()]


def t(*values, dtype=kiln.float32):
    """A tensor of values (nested lists allowed)."""
    return kiln.Tensor(np.array(values if len(values) != 1 else values[0], dtype=np.float64), dtype)


def rand(*shape, seed=0, dtype=kiln.float32):
    return kiln.Tensor(np.random.default_rng(seed).standard_normal(shape), dtype)
