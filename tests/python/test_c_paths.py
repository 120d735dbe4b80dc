"""The Python logic that moved into the extension: the bytecode scanner (kiln._C.code_facts,
read_names), the guard recorder, argument flattening (kiln._C.tree) and the shape helpers
(kiln._C.shape). Each is checked against a plain Python reference written here from `dis`, and
called many times to check that it leaks no references."""
import dis
import gc
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

import kiln
from kiln import _C
from kiln.jit import guards, tree

ROOT = Path(__file__).resolve().parents[2]

# ---- a reference scanner, from dis -----------------------------------------------------------

_MUTATORS = {"append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse", "update", "setdefault",
             "popitem", "add", "discard", "difference_update", "intersection_update", "symmetric_difference_update",
             "__setitem__", "__delitem__", "__iadd__"}


def reference_facts(code):
    instrs = [i for i in dis.get_instructions(code) if i.opname != "EXTENDED_ARG"]
    nargs = code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & 4) + bool(code.co_flags & 8)
    params = set(code.co_varnames[:nargs]) - {i.argval for i in instrs if i.opname in (
        "STORE_FAST", "DELETE_FAST", "STORE_DEREF", "DELETE_DEREF")}
    globals_, freevars, chains, effects, prints, mutations = set(), set(), set(), [], [], []
    aliases = import_aliases(instrs, chains)
    line = code.co_firstlineno
    for k, ins in enumerate(instrs):
        if ins.positions is not None and ins.positions.lineno is not None:
            line = ins.positions.lineno
        op, arg = ins.opname, ins.argval
        free = arg in code.co_freevars
        if op in ("LOAD_GLOBAL", "LOAD_NAME"):
            globals_.add(arg)
            if arg == "print":
                prints.append(line)
        elif op in ("LOAD_DEREF", "LOAD_CLASSDEREF", "LOAD_CLOSURE") and free:
            freevars.add(arg)
        elif op in ("STORE_GLOBAL", "DELETE_GLOBAL"):
            effects.append((f"a write to the global {arg!r}", line))
        elif op in ("STORE_DEREF", "DELETE_DEREF") and free:
            effects.append((f"a write to the closure variable {arg!r} (nonlocal)", line))
        elif op in ("LOAD_METHOD", "LOAD_ATTR") and arg in _MUTATORS:
            mutations.append((f".{arg}(...)", line))
        elif op in ("STORE_ATTR", "DELETE_ATTR"):
            mutations.append((f"an assignment to attribute {arg!r}", line))
        elif op in ("STORE_SUBSCR", "DELETE_SUBSCR"):
            mutations.append(("an item assignment", line))
        name, after = arg, k
        if op == "LOAD_GLOBAL" and arg == "globals" and calls_at(instrs, k + 1, 0) and k + 4 < len(instrs) and \
                instrs[k + 3].opname == "LOAD_CONST" and isinstance(instrs[k + 3].argval, str) and \
                instrs[k + 4].opname == "BINARY_SUBSCR":  # globals()["X"]: the global X
            name, after = instrs[k + 3].argval, k + 4
            globals_.add(name)
        if op == "LOAD_FAST" and arg in aliases:  # a module imported inside: chains rooted at the module
            module, first = aliases[arg]
            steps = first + steps_after(instrs, k)
            if steps:
                chains.add(("module", module, steps))
            continue
        kind = ("global" if op in ("LOAD_GLOBAL", "LOAD_NAME") else
                "deref" if op in ("LOAD_DEREF", "LOAD_CLASSDEREF") and free else
                "fast" if op in ("LOAD_FAST", "LOAD_DEREF") and arg in params else None)
        steps = steps_after(instrs, after) if kind else ()
        if steps:
            chains.add((kind, name, steps))
    lift_nested(code, params, chains)
    nested = tuple(c for c in code.co_consts if isinstance(c, types.CodeType))
    return globals_, freevars, chains, effects, prints, mutations, nested


def lift_nested(code, names, chains):
    """Chains nested code reads through a closure variable that is one of names (the outer code's
    unassigned parameters, as far as they reach), added as chains on the parameter."""
    for nested in (c for c in code.co_consts if isinstance(c, types.CodeType)):
        instrs = [i for i in dis.get_instructions(nested) if i.opname != "EXTENDED_ARG"]
        here = (set(names) & set(nested.co_freevars)) - {
            i.argval for i in instrs if i.opname in ("STORE_DEREF", "DELETE_DEREF")}
        for k, ins in enumerate(instrs):
            if ins.opname in ("LOAD_DEREF", "LOAD_CLASSDEREF") and ins.argval in here:
                steps = steps_after(instrs, k)
                if steps:
                    chains.add(("fast", ins.argval, steps))
        if here:
            lift_nested(nested, here, chains)


def calls_at(instrs, j, argc):
    """PRECALL n; CALL n at j taking a builtin's argc arguments (ast-converted code: up to two more)."""
    return (j + 1 < len(instrs) and instrs[j].opname == "PRECALL" and instrs[j + 1].opname == "CALL"
            and instrs[j].arg == instrs[j + 1].arg and argc <= instrs[j].arg <= argc + 2)


def import_aliases(instrs, chains):
    """local -> (module, steps) of the imports inside the code that bind a local assigned once;
    `from m import x` also adds its chain ("module", m, (("attr", x),))."""
    stores = {}
    for i in instrs:
        if i.opname in ("STORE_FAST", "DELETE_FAST"):
            stores[i.argval] = stores.get(i.argval, 0) + 1
    aliases = {}
    for k in range(2, len(instrs) - 1):
        ins, level, fromlist = instrs[k], instrs[k - 2], instrs[k - 1]
        if ins.opname != "IMPORT_NAME" or level.opname != "LOAD_CONST" or not isinstance(level.argval, int) \
                or level.argval != 0 or fromlist.opname != "LOAD_CONST":
            continue
        module = ins.argval
        if instrs[k + 1].opname == "STORE_FAST" and fromlist.argval is None:
            root, local = module.split(".")[0], instrs[k + 1].argval
            if stores.get(local) == 1 and ("." not in module or local == root):
                aliases[local] = (root, ())
            continue
        j = k + 1
        while j + 1 < len(instrs) and instrs[j].opname == "IMPORT_FROM" and instrs[j + 1].opname == "STORE_FAST":
            steps, local = (("attr", instrs[j].argval),), instrs[j + 1].argval
            chains.add(("module", module, steps))
            if stores.get(local) == 1:
                aliases[local] = (module, steps)
            j += 2
    return aliases


def steps_after(instrs, k):
    """The attribute and constant-subscript steps read after instruction k (after getattr(obj, "a")
    or hasattr: also "a"; type(obj).b: obj.__class__.b)."""
    before = instrs[k - 1] if k >= 1 else None
    getattr_of = before is not None and before.opname == "LOAD_GLOBAL" and before.argval in ("getattr", "hasattr")
    type_of = before is not None and before.opname == "LOAD_GLOBAL" and before.argval == "type"
    steps, j = [], k + 1
    steps, j = _steps(instrs, j, steps)
    if getattr_of and j < len(instrs) and instrs[j].opname == "LOAD_CONST" and isinstance(instrs[j].argval, str) \
            and (j + 1 >= len(instrs) or instrs[j + 1].opname != "BINARY_SUBSCR"):
        steps.append(("attr", instrs[j].argval))
    elif type_of and calls_at(instrs, j, 1):
        steps.append(("attr", "__class__"))
        steps, j = _steps(instrs, j + 2, steps)
    return tuple(steps)


def _steps(instrs, j, steps):
    """The steps from instruction j on, appended to steps; (steps, where they stopped)."""
    while j < len(instrs):
            nxt = instrs[j]
            if nxt.opname == "COPY" and nxt.arg == 1 and j + 1 < len(instrs) and instrs[j + 1].opname == "LOAD_ATTR":
                j += 1  # `obj.n += 1` reads obj.n from a copy of obj
                continue
            copied = (nxt.opname == "LOAD_CONST" and j + 3 < len(instrs) and
                      [(i.opname, i.arg) for i in instrs[j + 1:j + 3]] == [("COPY", 2), ("COPY", 2)])
            if copied and instrs[j + 3].opname == "BINARY_SUBSCR" and isinstance(nxt.argval, (int, str)):
                steps.append(("item", nxt.argval))  # `obj[c] += 1`
                j += 4
            elif nxt.opname in ("LOAD_ATTR", "LOAD_METHOD"):
                steps.append(("attr", nxt.argval))
                if nxt.opname == "LOAD_METHOD":
                    break
                j += 1
            elif (nxt.opname == "LOAD_CONST" and j + 1 < len(instrs) and instrs[j + 1].opname == "BINARY_SUBSCR"
                  and isinstance(nxt.argval, (int, str))):
                steps.append(("item", nxt.argval))
                j += 2
            else:
                break
    return steps, j


def all_codes(code):
    yield code
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            yield from all_codes(c)


SAMPLE = '''
TABLE = [1, 2]
def outer(self, cfg, x, *args, **kw):
    global counter
    scale = 2.0
    opts = kw
    def inner(y):
        nonlocal scale
        scale = scale + opts.alpha.beta[0] + TABLE[1]
        history.append(y)
        print(y)
        return y
    cfg.count += 1
    x = x + self.scale * cfg.alpha + config.X["k"]
    items[0] = x
    del cfg.gone
    counter = len(args) + kw.get("a", 0)
    return inner(x).sum()
def closes_over(self, opts, x):
    shift = lambda v: v + self.cfg.scale + opts["k"].bias
    def deeper(y):
        return (lambda z: z * self.table["k"])(y)
    return shift(x) * self.table["k"] + deeper(x)
def rebinds(self, x):
    def set_self(v):
        nonlocal self
        self = v
    set_self(x)
    return (lambda: self.w)()
def reads_by_name(obj, x):
    import cfg_mod
    from cfg_mod import opts as o
    import pkg.sub
    s = getattr(obj, "scale", 1.0) + hasattr(obj.inner, "bias") + type(obj).gain.k
    return x * s * cfg_mod.alpha + o.beta + pkg.sub.gamma + globals()["TABLE"][0]
'''


def test_code_facts_match_a_dis_reference():
    files = [ROOT / "python" / "kiln" / "jit" / "megengine.py", Path(__file__)]
    codes = [c for f in files for c in all_codes(compile(f.read_text(), str(f), "exec"))]
    codes += list(all_codes(compile(SAMPLE, "<sample>", "exec")))
    assert len(codes) > 50
    for code in codes:
        f = _C.code_facts(code)
        got = (set(f.globals), set(f.freevars), set(f.chains), list(f.effects), list(f.prints), list(f.mutations),
               f.nested)
        assert got == reference_facts(code), code.co_qualname


def test_code_facts_see_reads_by_name():
    """getattr/hasattr with a constant name, type(obj).attr, globals()["X"] and modules imported
    inside: chains the guards follow (each of them once unguarded: a stale compiled result)."""
    code = next(c for c in all_codes(compile(SAMPLE, "<sample>", "exec")) if c.co_name == "reads_by_name")
    f = _C.code_facts(code)
    assert {("fast", "obj", (("attr", "scale"),)), ("fast", "obj", (("attr", "inner"), ("attr", "bias"))),
            ("fast", "obj", (("attr", "__class__"), ("attr", "gain"), ("attr", "k"))),
            ("module", "cfg_mod", (("attr", "alpha"),)), ("module", "cfg_mod", (("attr", "opts"),)),
            ("module", "cfg_mod", (("attr", "opts"), ("attr", "beta"))),
            ("module", "pkg", (("attr", "sub"), ("attr", "gamma"))),
            ("global", "TABLE", (("item", 0),))} <= set(f.chains)
    assert "TABLE" in f.globals


def test_code_facts_of_the_sample_see_each_kind():
    code = next(c for c in all_codes(compile(SAMPLE, "<sample>", "exec")) if c.co_name == "outer")
    f = _C.code_facts(code)
    assert {"config", "len"} <= set(f.globals) and "TABLE" not in f.globals  # TABLE is read by inner
    assert ("fast", "self", (("attr", "scale"),)) in f.chains
    assert ("fast", "cfg", (("attr", "alpha"),)) in f.chains
    assert ("global", "config", (("attr", "X"), ("item", "k"))) in f.chains
    assert not any(c[1] == "x" for c in f.chains)  # x is assigned: not the caller's object
    assert [w for w, _ in f.effects] == ["a write to the global 'counter'"]
    assert ("an item assignment", 15) in f.mutations and ("an assignment to attribute 'gone'", 16) in f.mutations
    assert ("fast", "cfg", (("attr", "count"),)) in f.chains  # cfg.count += 1 reads it from a copy of cfg
    inner = next(c for c in all_codes(compile(SAMPLE, "<sample>", "exec")) if c.co_name == "inner")
    assert _C.code_facts(inner).appended == ("history",)  # only ever appended to: its contents are not read
    assert _C.code_facts(code).appended == ()
    inner = next(c for c in f.nested if c.co_name == "inner")
    fi = _C.code_facts(inner)
    assert set(fi.freevars) == {"scale", "opts"}
    assert ("deref", "opts", (("attr", "alpha"), ("attr", "beta"), ("item", 0))) in fi.chains
    assert ("global", "TABLE", (("item", 1),)) in fi.chains
    assert fi.effects == (("a write to the closure variable 'scale' (nonlocal)", 9),)
    assert fi.prints == (11,) and (".append(...)", 10) in fi.mutations
    assert _C.code_facts(code) is f  # cached on the code object


def test_appended_names_need_every_load_to_call_a_write_only_method():
    src = "def f(x):\n    LOG.append(x)\n    SEEN.add(x)\n    if x in SEEN:\n        OUT.extend([x])\n    return len(LOG2)\n"
    code = compile(src, "<appended>", "exec").co_consts[0]
    assert sorted(_C.code_facts(code).appended) == ["LOG", "OUT"]


def test_extended_args_are_folded():
    names = [f"g{k}" for k in range(300)]
    src = "def f():\n    return " + " + ".join(names) + " + last.attr[3]\n"
    code = next(c for c in all_codes(compile(src, "<many>", "exec")) if c.co_name == "f")
    assert any(i.opname == "EXTENDED_ARG" for i in dis.get_instructions(code))
    f = _C.code_facts(code)
    assert set(f.globals) == set(names) | {"last"}
    assert ("global", "last", (("attr", "attr"), ("item", 3))) in f.chains


def test_read_names_match_a_dis_reference():
    def reference(code):
        loads, stores = (set(), set()), set()
        for c in all_codes(code):
            for ins in dis.get_instructions(c):
                if ins.opname == "LOAD_GLOBAL":
                    loads[0].add(ins.argval)
                elif ins.opname in ("LOAD_DEREF", "LOAD_CLASSDEREF"):
                    loads[1].add(ins.argval)
                elif ins.opname in ("STORE_GLOBAL", "DELETE_GLOBAL", "STORE_DEREF", "DELETE_DEREF"):
                    stores.add(ins.argval)
        return loads[0] - stores, loads[1] - stores

    for code in all_codes(compile(SAMPLE, "<sample>", "exec")):
        assert _C.read_names(code) == reference(code)
    with pytest.raises(TypeError, match="code object"):
        _C.read_names(42)


# ---- flattening ---------------------------------------------------------------------------------

def test_flatten_roundtrip_and_keys():
    t = kiln.Tensor(np.ones(2, np.float32))
    obj = (1, [t, {"a": t, "b": (2.5, "s")}], None)
    leaves = []
    spec = tree.flatten(obj, leaves)
    assert leaves == [t, t] or all(a is b for a, b in zip(leaves, [t, t]))
    back, pos = tree.unflatten(spec, leaves)
    assert pos == 2 and back[1][0] is t and back[1][1]["a"] is t and back[1][1]["b"] == (2.5, "s")
    assert tree.describe(spec) == "(1, [Tensor, {'a': Tensor, 'b': (2.5, 's')}], None)"
    key = lambda v: tree.flatten(v, [])  # noqa: E731
    assert key(0.0) != key(-0.0) and key(1) != key(1.0) != key(True)
    assert key(float("nan")) == key(float("nan")) and hash(key(float("nan"))) == hash(key(float("nan")))
    assert key(np.float32(1.0)) != key(np.float64(1.0))
    class Unhashable:  # (sets, dict views and NumPy arrays are keyed by their contents)
        __hash__ = None

    with pytest.raises(TypeError, match="argument of type Unhashable is neither"):
        tree.flatten([Unhashable()], [])


def test_reductions_match_numpy():
    a = (np.arange(24, dtype=np.float32).reshape(2, 3, 4) % 7).astype(np.float32)
    x = kiln.Tensor(a)
    np.testing.assert_allclose(kiln.ops.sum(x, (0, 2), keepdims=True).asnumpy(), a.sum((0, 2), keepdims=True))
    np.testing.assert_allclose(kiln.ops.mean(x, dim=-1, keepdim=True).asnumpy(), a.mean(-1, keepdims=True))
    np.testing.assert_allclose(kiln.ops.var(x, 1, ddof=1).asnumpy(), a.var(1, ddof=1), rtol=1e-6)
    np.testing.assert_allclose(kiln.ops.std(x, 0, correction=0, unbiased=True).asnumpy(), a.std(0, ddof=1), rtol=1e-6)
    np.testing.assert_array_equal(kiln.ops.argmax(x, 1).asnumpy(), a.argmax(1))
    np.testing.assert_array_equal(kiln.ops.argmin(x).asnumpy(), a.argmin())
    assert kiln.ops.max(x).item() == a.max() and kiln.ops.min(x, axis=(1, 2)).asnumpy().tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match=r"sum: axis 0 appears twice in \(0, 0\)"):
        kiln.ops.sum(x, (0, 0))
    with pytest.raises(IndexError, match="argmax: axis 3 is out of range for a tensor with 3 dimensions"):
        kiln.ops.argmax(x, 3)


def test_trace_call_checks_and_branch_values():
    t = kiln.Tensor(np.ones(2, np.float32))
    spec = lambda *a, **k: tree.flatten((a, k), [])  # noqa: E731
    check = _C.tree.check_call
    assert check(spec(t, 1), spec(t, 1), False) is None
    assert check(spec(t, 1), spec(t), False) == ("different argument count: the function was traced with 2 "
                                                 "positional arguments, this call passes 1")
    assert check(spec(t, a=1), spec(t, b=1), False) == ("different keyword arguments: the function was traced "
                                                        "with ['a'], this call passes ['b']")
    assert check(spec(t, a=1), spec(t, a=t), False) == ("keyword arguments found to be tensor this time but were "
                                                        "non-tensor when traced: a (was 1)")
    assert check(spec(t, [t, 1]), spec(t, (t, 1)), True) == ("args[1] is (Tensor, 1) this time but was "
                                                             "[Tensor, 1] when traced")
    assert check(spec(t, 1), spec(t, 2), True) is None  # verify: the re-run decides
    assert check(spec(t, 1), spec(t, 2), False).startswith("args[1] is 2 this time but was 1 when traced; with "
                                                           "verify=False")
    assert _C.tree.arg_labels(spec(t, [t, 1], k=t)) == ["args[0]", "args[1][0]", "k"]
    leaves = []
    value = (t, [2, {"a": 1.5, "b": True}], "name")
    b = _C.tree.branch_flatten(value, leaves)
    assert [x.dtype for x in leaves] == [kiln.float32, kiln.int64, kiln.float64, kiln.bool]  # a float: a double
    leaves32 = []
    _C.tree.branch_flatten(value, leaves32, True)  # floats as float32 (beside a float32 tensor on another path)
    assert [x.dtype for x in leaves32] == [kiln.float32, kiln.int64, kiln.float32, kiln.bool]
    back = _C.tree.branch_unflatten(b, iter(leaves))
    assert back[0] is t and back[1][0] is leaves[1] and back[1][1]["b"] is leaves[3] and back[2] == "name"
    assert _C.tree.same_branch_spec(b, _C.tree.branch_flatten((t, [t, {"a": t, "b": t}], "name"), []))
    assert not _C.tree.same_branch_spec(b, _C.tree.branch_flatten((t, (t, {"a": t, "b": t}), "name"), []))
    assert not _C.tree.same_branch_spec(b, _C.tree.branch_flatten((t, [t, {"a": t, "b": t}], "other"), []))


def test_call_keys_and_what_changed():
    from kiln import nn

    t = kiln.Tensor(np.ones((2, 3), np.float32))
    net = nn.Dense(3, 3)
    (spec, sig, extra), leaves = _C.tree.call_key((t, 2, net), {"k": t}, (None, None))
    assert leaves[0] is t and leaves[1] is t and sig == ((t.dtype.id, (2, 3), False),) * 2
    # (t passed twice: the key says which leaves are one tensor, so f(t, t) and f(t, u) are keyed apart)
    assert extra == (kiln._C.is_grad_enabled(), (False,), ("same tensors", (0, 0)))
    u = kiln.Tensor(np.ones((2, 3), np.float32))
    assert _C.tree.call_key((t, 2, net), {"k": u}, (None, None))[0][2] == (kiln._C.is_grad_enabled(), (False,))
    assert _C.tree.describe_change(_C.tree.call_key((t, 2, net), {"k": u}, (None, None))[0], (spec, sig, extra)) \
        == "one tensor passed as two arguments (or no longer)"
    other = _C.tree.call_key((kiln.Tensor(np.ones((4, 3), np.float32)), 2, net), {"k": t}, (None, None))[0]
    assert _C.tree.describe_change((spec, sig, extra), other) == "the shape of tensor argument 0 ((2, 3) -> (4, 3))"
    third = _C.tree.call_key((t, 3, net), {"k": t}, (None, None))[0]
    assert _C.tree.describe_change((spec, sig, extra), third) == "argument 1 (2 -> 3)"
    net.set_train(True)
    assert _C.tree.describe_change((spec, sig, extra), _C.tree.call_key((t, 2, net), {"k": t}, (None, None))[0]) \
        == "the grad or training mode"


# ---- no leaked references -----------------------------------------------------------------------

def _refs_after(fn, n=2000):
    fn()
    gc.collect()
    before = sys.gettotalrefcount() if hasattr(sys, "gettotalrefcount") else len(gc.get_objects())
    for _ in range(n):
        fn()
    gc.collect()
    after = sys.gettotalrefcount() if hasattr(sys, "gettotalrefcount") else len(gc.get_objects())
    return after - before


def test_moved_paths_leak_no_references():
    t = kiln.Tensor(np.arange(6, dtype=np.float32))
    obj = (1.5, [t, {"k": t}], "s", np.int32(3))
    code = test_moved_paths_leak_no_references.__code__

    def flatten_roundtrip():
        leaves = []
        spec = tree.flatten(obj, leaves)
        tree.unflatten(spec, leaves)
        tree.describe(spec)
        _C.tree.diff_spec(spec, tree.flatten((2.5, [t, {"k": t}], "s", np.int32(3)), []), "x", True)
        call = tree.flatten(((t, 1), {"k": t}), [])
        _C.tree.check_call(call, tree.flatten(((t, 2), {"k": 1}), []), False)
        leaves = []
        branch = _C.tree.branch_flatten((t, [1.5, {"a": True}], "c"), leaves)
        _C.tree.branch_unflatten(branch, iter(leaves))
        _C.tree.same_branch_spec(branch, branch)
        _C.tree.describe_change(_C.tree.call_key((t, 1), {}, (None,))[0], _C.tree.call_key((t, 2), {}, (None,))[0])

    def shapes():
        x = _C.shape.reshape(t, 2, -1)
        _C.shape.flatten(_C.shape.transpose(x), 0, -1)
        _C.shape.squeeze(_C.shape.unsqueeze(x, 0), 0)
        _C.shape.broadcast_to(x, 3, -1, 3)
        _C.shape.axes_mask("sum", (0, -1), 2)
        kiln.ops.sum(x, (0, 1), keepdims=True)
        kiln.ops.var(x, dim=1, unbiased=True)
        kiln.ops.argmax(x, -1)
        try:
            _C.shape.reshape(t, 4, -1)
        except ValueError:
            pass

    def facts():
        _C.code_facts(code)
        _C.read_names(code)

    for fn in (flatten_roundtrip, shapes, facts):
        assert _refs_after(fn) < 50, fn.__name__
    counts = [sys.getrefcount(o) for o in (t, code)]
    for _ in range(1000):
        flatten_roundtrip(), shapes(), facts()
    assert [sys.getrefcount(o) for o in (t, code)] == counts


CONFIG = {"alpha": 2.0}


def test_guard_recorder_leaks_nothing_and_frees_what_it_held():
    class Holder:
        pass

    def user(x, cfg):
        return x * CONFIG["alpha"] + cfg.scale

    cfg = Holder()
    cfg.scale = 1.0
    x = kiln.Tensor(np.ones(2, np.float32))

    def capture():
        rec = guards.Recorder(top=user)

        def hook(frame, event, arg):
            if event == "call" and frame.f_code is user.__code__:
                rec.on_call(frame)
            return None

        sys.settrace(hook)
        try:
            user(x, cfg)
        finally:
            sys.settrace(None)
        assert rec.side_effect([]) is None
        gs, names = rec.guard_set()
        assert "global CONFIG['alpha']" in names and "argument 'cfg' of" not in names and "cfg.scale" in names
        assert gs.check()

    capture()
    counts = [sys.getrefcount(o) for o in (cfg, x, CONFIG, user)]
    assert _refs_after(capture, 300) < 50
    assert [sys.getrefcount(o) for o in (cfg, x, CONFIG, user)] == counts


def test_code_share_tool_runs():
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "code_share.py")], capture_output=True, text=True,
                         check=True).stdout
    last = out.strip().splitlines()[-1]
    assert last.startswith("C ") and "% C" in last and "src/python" in out and "python/kiln/jit" in out


def test_cell_calls_and_writes_leak_nothing_and_log_the_writer():
    from kiln import nn

    class Scale(nn.Cell):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(kiln.Tensor(np.ones(3, np.float32)))
            self.inner = nn.Dense(3, 3)

        def construct(self, x):
            return self.inner(x * self.w)

    net = Scale()
    assert net.w.name == "w" and [n for n, _ in net.parameters_and_names()][:2] == ["w", "inner.weight"]
    x = kiln.Tensor(np.ones((2, 3), np.float32))
    expected = net(x).asnumpy()

    def use():
        np.testing.assert_allclose(net(x).asnumpy(), expected)
        net.tag = 1.0
        del net.tag

    use()
    version = net._kiln_version
    counts = [sys.getrefcount(o) for o in (net, net.w, net.inner, x)]
    assert _refs_after(use, 500) < 50
    assert [sys.getrefcount(o) for o in (net, net.w, net.inner, x)] == counts
    assert net._kiln_version == version + 2 * 501
    calls, writes = [], []
    prev = _C.set_cell_logs(calls, writes)
    try:
        net(x)
        net.tag = 2.0; line = sys._getframe().f_lineno  # noqa: E702
    finally:
        _C.set_cell_logs(*prev)
    assert calls == [net, net.inner]
    assert writes == [(net, "tag", f"{__file__}:{line}")]
    with pytest.raises(TypeError, match="cannot assign a float to parameter 'w' of Scale"):
        net.w = 1.0
