"""Conformance: Python idioms under capture, each run eagerly and under every kiln.jit variant (and
kiln.trace where it can follow), over calls with new inputs and new outer state: comprehensions,
*args/**kwargs forwarding, mutated and replaced defaults, functools.partial, class attributes seen
through getattr with a default, global and nonlocal rebinding, exceptions caught inside, with blocks
that swallow an exception, isinstance, dict order after update/pop/setdefault, sorts with keys."""
import collections
import contextlib
import enum
import functools
import sys
import types

import kiln
from conformance import TRACE_VARIANTS, VARIANTS, Call, rand, run_all_modes, t

ALL = VARIANTS + TRACE_VARIANTS


# ---- comprehensions ----------------------------------------------------------------------------


def test_nested_dict_and_set_comprehensions_over_shapes():
    def f(xs, scale):
        by_rows = {x.shape[0]: x * scale for x in xs}
        sizes = {x.shape[-1] for x in xs}
        pairs = [(i, j) for i in range(len(xs)) for j in range(i) if xs[i].shape == xs[j].shape]
        grid = [[a * b for b in (1, 2)] for a in by_rows.values()]
        return by_rows, sorted(sizes), pairs, grid

    run_all_modes(f, ([rand(2, 3), rand(4, 3, seed=1), rand(2, 3, seed=2)], 2.0),
                  ([rand(2, 3, seed=3), rand(4, 3, seed=4), rand(2, 3, seed=5)], -1.0),
                  ([rand(5, 1, seed=6)], 0.5), variants=ALL)


# ---- *args / **kwargs ---------------------------------------------------------------------------


def _combine(a, b=2.0, *rest, scale=1.0, **extra):
    out = a * b * scale
    for r in rest:
        out = out + r
    for k in sorted(extra):
        out = out - extra[k]
    return out, tuple(sorted(extra)), len(rest)


def test_args_and_kwargs_forwarded_through_wrappers():
    def f(x, args, kwargs):
        def fwd(*a, **kw):
            return _combine(*a, **kw)
        return fwd(x, *args, **kwargs), fwd(x, **{**kwargs, "scale": 0.5})

    run_all_modes(f, (rand(3), (3.0,), {}), (rand(3, seed=1), (1.0, 2.0, 3.0), {"z": 1.0, "c": 2.0}),
                  (rand(3, seed=2), (), {"scale": 4.0}), (rand(3, seed=3), (2.0, t(1.0, 2.0, 3.0)), {"q": t(1.0)}),
                  variants=ALL)


def test_keyword_only_and_defaults_overridden_by_keywords():
    def f(x, *, mode="add", k=1):
        return x + k if mode == "add" else x * k

    run_all_modes(f, Call((rand(2),)), Call((rand(2),), {"k": 3}), Call((rand(2),), {"mode": "mul", "k": 3}),
                  Call((rand(2),), {"mode": "mul"}), variants=ALL)


# ---- defaults ----------------------------------------------------------------------------------


def test_tensor_default_argument_accumulates_in_place():
    def f(x, acc=kiln.ops.zeros((3,))):
        acc += x
        return acc * 1.0

    start = f.__defaults__[0].asnumpy().copy()

    def reset():
        f.__defaults__[0][...] = kiln.Tensor(start)

    run_all_modes(f, (rand(3),), (rand(3, seed=1),), (rand(3, seed=2),), reset=reset, variants=ALL,
                  observe=lambda: f.__defaults__[0] * 1.0)


def test_dict_default_argument_counts_calls():
    def f(x, memo={}):  # noqa: B006 -- the point of the case
        memo[x.shape[0]] = memo.get(x.shape[0], 0) + 1
        return x * memo[x.shape[0]], dict(memo)

    def reset():
        f.__defaults__[0].clear()

    run_all_modes(f, (rand(2),), (rand(2, seed=1),), (rand(3),), (rand(2, seed=2),), reset=reset, variants=ALL,
                  observe=lambda: dict(f.__defaults__[0]))


def test_defaults_replaced_between_calls():
    def f(x, k=2.0):
        return x * k

    def rebind():
        f.__defaults__ = (5.0,)

    def reset():
        f.__defaults__ = (2.0,)

    run_all_modes(f, (rand(2),), Call((rand(2),), before=rebind), (rand(2, seed=1),), reset=reset, variants=ALL)


# ---- functools.partial --------------------------------------------------------------------------


def _affine(x, w, b=0.0):
    return x * w + b


PART = functools.partial(_affine, w=2.0)


def test_partial_keywords_changed_between_calls():
    def f(x):
        return PART(x), PART(x, b=1.0)

    def change():
        PART.keywords["w"] = -3.0

    def reset():
        PART.keywords["w"] = 2.0

    run_all_modes(f, (rand(2),), Call((rand(2),), before=change), (rand(2, seed=1),), reset=reset, variants=ALL)


def test_partial_made_inside_with_a_tensor_and_an_argument():
    def f(x, w):
        p = functools.partial(_affine, w=w)
        q = functools.partial(p, b=x.sum())
        return q(x), p(x, b=2), q.keywords["w"] if isinstance(q.keywords["w"], float) else 0.0

    run_all_modes(f, (rand(3), 2.0), (rand(3, seed=1), 3.0), (rand(3, seed=2), rand(3, seed=3)), variants=ALL)


# ---- class attributes --------------------------------------------------------------------------


class Base:
    gain = 2.0

    def apply(self, x):
        return x * self.gain + self.offset()

    @classmethod
    def offset(cls):
        return getattr(cls, "shift", 0.0)


class Child(Base):
    pass


def test_base_class_attribute_changed_seen_through_subclass_instance():
    obj = Child()

    def f(x):
        return obj.apply(x)

    def gain():
        Base.gain = -1.0

    def shadow():
        Child.gain = 10.0

    def shift():
        Child.shift = 0.5

    def instance():
        obj.gain = 7.0

    def reset():
        Base.gain = 2.0
        for k in ("gain", "shift"):
            if k in Child.__dict__:
                delattr(Child, k)
        obj.__dict__.pop("gain", None)

    x = rand(3)
    run_all_modes(f, (x,), Call((x,), before=gain), Call((x,), before=shadow), Call((x,), before=shift),
                  Call((x,), before=instance), reset=reset, variants=ALL)


# ---- global and nonlocal -----------------------------------------------------------------------


W = kiln.ops.ones((3,))
STEPS = 0


def _global_step(x):
    global W, STEPS
    STEPS += 1
    W = W * 0.5 + x
    return W * STEPS


def test_global_tensor_rebound_by_the_function_each_call():
    def reset():
        global W, STEPS
        W, STEPS = kiln.ops.ones((3,)), 0

    run_all_modes(_global_step, (rand(3),), (rand(3, seed=1),), (rand(3, seed=2),), reset=reset, variants=ALL,
                  observe=lambda: (W * 1.0, STEPS))


def test_nonlocal_tensor_and_count_in_a_made_closure():
    def make():
        total = kiln.ops.zeros((2,))
        n = 0

        def step(x):
            nonlocal total, n
            n += 1
            total = total + x * n
            return total, n

        return step

    holder = {}

    def f(x):
        return holder["step"](x)

    def reset():
        holder["step"] = make()

    run_all_modes(f, (rand(2),), (rand(2, seed=1),), (rand(2, seed=2),), reset=reset, variants=ALL,
                  observe=lambda: holder["step"].__closure__[1].cell_contents * 1.0)


# ---- exceptions and with blocks ----------------------------------------------------------------


def test_exceptions_caught_inside_the_function():
    def f(x, table, i):
        out = x
        try:
            out = out * table[i]
        except (KeyError, IndexError):
            out = out - 1
        else:
            out = out + 1
        finally:
            out = out * 2
        try:
            if x.shape[0] > 2:
                raise ValueError("long")
            out = out + 3
        except ValueError as e:
            out = out + len(str(e))
        return out

    run_all_modes(f, (rand(2), [1.0, 2.0], 1), (rand(2), [1.0, 2.0], 5), (rand(3), {0: 2.0}, 0),
                  (rand(3), {0: 2.0}, 1), variants=ALL)


class Recorder:
    log = []

    def __init__(self, tag):
        self.tag = tag

    def __enter__(self):
        Recorder.log.append("enter " + self.tag)
        return self

    def __exit__(self, kind, value, tb):
        Recorder.log.append("exit " + self.tag + (" " + kind.__name__ if kind else ""))
        return kind is KeyError  # swallows KeyError only


def test_with_block_exit_swallows_some_exceptions():
    def f(x, d, key):
        out = x
        with Recorder("a") as r:
            out = out + len(r.tag)
            out = out * d[key]
        with contextlib.suppress(ZeroDivisionError):
            out = out + 1 / len(d)
        return out

    def reset():
        Recorder.log.clear()

    run_all_modes(f, (rand(2), {"k": 2.0}, "k"), (rand(2), {"k": 2.0}, "z"), (rand(2), {}, "z"),
                  reset=reset, observe=lambda: list(Recorder.log), variants=ALL)


# ---- isinstance, dicts -------------------------------------------------------------------------


Pair = collections.namedtuple("Pair", "a b")


def test_isinstance_on_tensors_and_containers():
    def f(v):
        if isinstance(v, kiln.Tensor):
            return v * 2, "tensor"
        if isinstance(v, Pair):
            return v.a - v.b, "pair"
        if isinstance(v, tuple):
            return v[0] + v[-1], "tuple"
        if isinstance(v, dict):
            return sum(v.values()), "dict"
        if isinstance(v, (list, set)):
            return len(v), type(v).__name__
        return v, "other"

    run_all_modes(f, (rand(2),), (Pair(rand(2), rand(2, seed=1)),), ((rand(2), rand(2, seed=2)),),
                  ({"a": rand(2), "b": rand(2, seed=3)},), ([1, 2],), (3.5,), variants=ALL)


def test_dict_order_after_update_pop_and_reinsert():
    def f(x, extra):
        d = {"a": x, "b": x * 2}
        d.update(extra)
        d.update(c=x * 3)
        v = d.pop("a")
        d["a"] = v + 1  # goes to the end
        d.setdefault("b", x * 100)
        d.setdefault("z", x * 5)
        merged = {**d, "b": x - 1}
        last = d.popitem()
        return d, merged, last[0], list(merged.items())[0][0]

    run_all_modes(f, (rand(2), {}), (rand(2, seed=1), {"c": 1.0, "q": 2.0}), (rand(2, seed=2), {"a": 0.0}),
                  variants=ALL)


def test_list_sort_with_key_on_shapes_and_numbers():
    def f(xs, ws):
        order = list(range(len(xs)))
        order.sort(key=lambda i: (xs[i].shape[0], -ws[i]))
        xs = sorted(xs, key=lambda x: x.shape[0], reverse=True)
        out = [xs[0].sum() * w for w in sorted(ws)]
        return order, [x.shape[0] for x in xs], out, min(ws, key=abs), max(range(len(ws)), key=ws.__getitem__)

    run_all_modes(f, ([rand(3), rand(1), rand(2)], [1.0, -2.0, 0.5]),
                  ([rand(2), rand(2, seed=1), rand(5)], [3.0, 3.0, -0.1]), variants=ALL)


MOD = types.ModuleType("kiln_idioms_probe_mod")
MOD.scale = 2.0
sys.modules["kiln_idioms_probe_mod"] = MOD


class Table:
    rows = [1.0, 2.0]
    gain = 1.0

    def apply(self, x):
        return x * type(self).gain + sum(self.__class__.rows)

    @staticmethod
    def shift(x):
        return x + 1.0


TAB = Table()


def test_class_list_attribute_appended_and_type_of_self_reads():
    # (type(self).gain was read through a call, no attribute chain: unguarded in every mode)
    def f(x):
        return TAB.apply(x), Table.shift(x)

    def append():
        Table.rows.append(10.0)

    def gain():
        Table.gain = 3.0

    def static():
        Table.shift = staticmethod(lambda x: x - 1.0)

    def reset():
        Table.rows = [1.0, 2.0]
        Table.gain = 1.0
        Table.shift = staticmethod(lambda x: x + 1.0)

    x = rand(2)
    run_all_modes(f, (x,), Call((x,), before=append), Call((x,), before=gain), Call((x,), before=static),
                  reset=reset, variants=ALL)


def test_module_imported_inside_the_function_attribute_changed():
    # (a module imported inside the function is a local: its attributes were unguarded in every mode)
    def f(x):
        import kiln_idioms_probe_mod as probe_mod
        from kiln_idioms_probe_mod import scale
        return x * probe_mod.scale + scale

    def change():
        MOD.scale = -1.0

    def reset():
        MOD.scale = 2.0

    x = rand(2)
    run_all_modes(f, (x,), Call((x,), before=change), reset=reset, variants=ALL)


def test_globals_dict_read_by_key():
    # (globals() gave kiln's own module's dict in bytecode and ast capture, and the read was unguarded)
    def f(x):
        return x + globals()["OFFSET"] * 2

    def offset():
        globals()["OFFSET"] = 5.0

    def reset():
        globals()["OFFSET"] = 0.0

    x = rand(2)
    run_all_modes(f, (x,), Call((x,), before=offset), reset=reset, variants=ALL)


OFFSET = 0.0


class Cfg:
    def __init__(self):
        self.scale = 2.0


CFG = Cfg()


def test_default_argument_object_attribute_changed():
    def f(x, cfg=CFG):
        return x * cfg.scale

    def change():
        CFG.scale = 9.0

    def reset():
        CFG.scale = 2.0

    x = rand(2)
    run_all_modes(f, (x,), Call((x,), before=change), reset=reset, variants=ALL)


FLAG = {"mode": "train"}


class Mode:
    def __init__(self, m):
        self.m = m

    def __enter__(self):
        self.old = FLAG["mode"]
        FLAG["mode"] = self.m

    def __exit__(self, *a):
        FLAG["mode"] = self.old


def test_context_manager_sets_a_flag_the_body_reads():
    def f(x):
        with Mode("eval"):
            y = x * (2.0 if FLAG["mode"] == "eval" else 3.0)
        return y * (1.0 if FLAG["mode"] == "train" else -1.0)

    def other():
        FLAG["mode"] = "test"

    def reset():
        FLAG["mode"] = "train"

    run_all_modes(f, (rand(2),), (rand(2),), Call((rand(2),), before=other), reset=reset,
                  observe=lambda: dict(FLAG), variants=ALL)


OPS = {"act": functools.partial(lambda v, k: v * k, k=3.0)}


def test_partial_in_a_dict_replaced_between_calls():
    def f(x):
        return OPS["act"](x)

    def swap():
        OPS["act"] = functools.partial(lambda v, k: v * k, k=-2.0)

    def reset():
        OPS["act"] = functools.partial(lambda v, k: v * k, k=3.0)

    x = t(-1.0, 2.0)
    run_all_modes(f, (x,), Call((x,), before=swap), (x,), reset=reset, variants=ALL)


def test_dict_helpers_order():
    def f(x, keys):
        d = dict.fromkeys(keys, 0)
        for i, k in enumerate(keys):
            d[k] += i
        r = list(reversed(d))
        m = d | {"z": -1}
        return x * len(d), r, m, {k: v for k, v in sorted(d.items(), key=lambda kv: -kv[1])}

    run_all_modes(f, (rand(2), ["b", "a", "b", "c"]), (rand(2), ["q"]), variants=ALL)


def test_bound_method_of_a_global_object_rebound():
    class Doubler:
        def __init__(self, k):
            self.k = k

        def run(self, x):
            return x * self.k

    holder = {"m": Doubler(2.0).run}

    def f(x):
        return holder["m"](x)

    def rebind():
        holder["m"] = Doubler(5.0).run

    def reset():
        holder["m"] = Doubler(2.0).run

    run_all_modes(f, (rand(2),), Call((rand(2),), before=rebind), reset=reset, variants=ALL)


class Lazy:
    def __init__(self):
        self._d = {"scale": 2.0}

    def __getattr__(self, name):
        try:
            return self._d[name]
        except KeyError:
            raise AttributeError(name) from None


LAZY = Lazy()


def test_attribute_served_by_getattr_from_a_dict():
    def f(x):
        return x * LAZY.scale

    def change():
        LAZY._d["scale"] = -3.0

    def reset():
        LAZY._d["scale"] = 2.0

    run_all_modes(f, (rand(2),), Call((rand(2),), before=change), reset=reset, variants=ALL)


CONF = ([1.0, 2.0],)
GRID = [[1.0, 2.0], [3.0, 4.0]]


def test_tuple_holding_a_list_changed_in_place():
    def f(x):
        return x * CONF[0][1]

    def change():
        CONF[0][1] = 7.0

    def reset():
        CONF[0][:] = [1.0, 2.0]

    run_all_modes(f, (rand(2),), Call((rand(2),), before=change), reset=reset, variants=ALL)


def test_nested_list_read_with_loop_indices():
    # (GRID's contents were guarded one level deep: an inner list changed in place went unseen)
    def f(x):
        out = x * 0
        for i in range(2):
            for j in range(2):
                out = out + GRID[i][j]
        return out

    def change():
        GRID[1][0] = 30.0

    def reset():
        GRID[1][0] = 3.0

    run_all_modes(f, (rand(2),), Call((rand(2),), before=change), reset=reset, variants=ALL)


class ActKind(enum.Enum):
    RELU = "relu"
    TANH = "tanh"


ACT_SETTINGS = {"act": ActKind.RELU}


def test_enum_in_a_global_dict_and_enum_value_reads():
    def f(x):
        a = ACT_SETTINGS["act"]
        y = x.relu() if a is ActKind.RELU else x.tanh()
        return y, a.value, a.name

    def change():
        ACT_SETTINGS["act"] = ActKind.TANH

    def reset():
        ACT_SETTINGS["act"] = ActKind.RELU

    run_all_modes(f, (rand(3),), Call((rand(3),), before=change), reset=reset, variants=ALL)


class Slots:
    __slots__ = ("k",)

    def __init__(self):
        self.k = 2.0


SL = Slots()


def test_slots_attribute_changed():
    def f(x):
        return x * SL.k

    def change():
        SL.k = 5.0

    def reset():
        SL.k = 2.0

    run_all_modes(f, (rand(2),), Call((rand(2),), before=change), reset=reset, variants=ALL)


class Desc:
    def __get__(self, obj, owner):
        return owner.base * 2


class WithDesc:
    base = 1.0
    twice = Desc()


def test_descriptor_reading_a_class_attribute():
    def f(x):
        return x * WithDesc.twice

    def change():
        WithDesc.base = 10.0

    def reset():
        WithDesc.base = 1.0

    run_all_modes(f, (rand(2),), Call((rand(2),), before=change), reset=reset, variants=ALL)


def test_list_of_python_numbers_argument_changes():
    def f(x, ws):
        return sum(w * x for w in ws), len(ws)

    run_all_modes(f, (rand(2), [1.0, 2.0]), (rand(2), [1.0, 3.0]), (rand(2), [1.0]), (rand(2), [1, 2]),
                  variants=ALL)


def test_dict_of_tensors_global_replaced_item():
    # (kiln.trace: the recording read the tensor it captured; verify compared the ops only)
    def f(x):
        return x * TENSORS["w"] + TENSORS["b"]

    def change():
        TENSORS["w"] = t(5.0, 5.0)

    def inplace():
        TENSORS["b"][0] = 100.0

    def reset():
        TENSORS["w"] = t(1.0, 2.0)
        TENSORS["b"] = t(0.0, 0.0)

    run_all_modes(f, (rand(2),), Call((rand(2),), before=change), Call((rand(2),), before=inplace), reset=reset,
                  variants=ALL)


TENSORS = {"w": t(1.0, 2.0), "b": t(0.0, 0.0)}
