"""Conformance: more Python constructs under capture, each run eagerly and under every kiln.jit
variant and kiln.trace, over calls with new inputs and changed outer state: errors caught inside,
no_grad blocks, augmented assignment of Python numbers by tensors, min/max/sorted over tensor
elements, class and instance attributes shadowed and deleted, getattr/hasattr on arguments, defaults
and kwdefaults replaced, partials rebound, defaultdict/Counter, match statements, functools and
itertools helpers, classes and dataclasses made inside the function, recursion, re-raising."""
import collections
import dataclasses
import functools
import itertools
import operator

import pytest

import kiln
from conformance import TRACE_VARIANTS, VARIANTS, Call, rand, run_all_modes, t

ALL = VARIANTS + TRACE_VARIANTS


def ti(*values, dtype=kiln.int32):
    return t(*values, dtype=dtype)


def test_index_error_of_tensor_index_caught_inside():
    # (ast, trace: the graph's gather checks the index when it runs, outside the try: the function
    # now runs eagerly, with a warning naming the op and the code with the except clause)
    def f(x, idx):
        try:
            y = x[idx]
        except IndexError:
            y = x * 0
        return y

    run_all_modes(f, (rand(3), ti(1)), (rand(3), ti(5)), (rand(3), ti(2)), variants=ALL)


def _index_or_sum(x, idx):
    try:
        return x[idx] * 2
    except Exception:
        return x.sum()


def test_index_error_caught_in_a_helper_and_setitem_bare_except():
    def f(x, idx, j):
        z = x * 1.0
        try:
            z[j] = 5.0
        except:  # noqa: E722
            z = z - 1
        return _index_or_sum(x, idx), z

    run_all_modes(f, (rand(4), ti(1, 2), ti(0)), (rand(4), ti(1, 7), ti(9)), (rand(4), ti(0), ti(-1)), variants=ALL)

def test_index_checked_under_except_is_an_error_with_fullgraph():
    def f(x, idx):
        try:
            return x[idx]
        except IndexError:
            return x * 0

    jf = kiln.jit(f, capture_mode="trace", fullgraph=True)  # (ast with fullgraph refuses any try statement)
    with pytest.raises(kiln.JitSyntaxError, match="gather checks its index values"):
        jf(rand(3), ti(1))



def test_shape_error_caught_inside():
    def f(x, y):
        try:
            z = x + y
        except (ValueError, RuntimeError):
            z = x
        return z * 2

    run_all_modes(f, (rand(3), rand(3)), (rand(3), rand(2)), (rand(3), rand(1)), variants=ALL)


def test_no_grad_and_set_grad_enabled_blocks():
    def f(x, w):
        with kiln.no_grad():
            s = (x * w).sum()
        u = x * 2
        return x * w + s, u.requires_grad, s.requires_grad, kiln.is_grad_enabled()

    w = rand(3, seed=1)
    w.requires_grad_(True)
    run_all_modes(f, (rand(3), w), (rand(3, seed=2), w))


def test_augmented_assignment_of_python_number_by_tensor():
    def f(x, w):
        k = 2.0
        k += x
        k *= 3
        y = x * 1.0
        y @= w
        q, r = divmod(x, 2.0)
        return k, y, q, r, round(x.sum().item(), 2) if False else x.abs(), pow(x, 2), -(-x), +x

    run_all_modes(f, (rand(3, 3), rand(3, 3, seed=1)), (rand(3, 3, seed=2), rand(3, 3, seed=3)), variants=ALL)


def test_max_min_sorted_of_one_d_tensor_elements():
    def f(x):
        return max(x), min(x), sorted(x)[0], sum(x), list(reversed(list(x)))

    run_all_modes(f, (t(3.0, -1.0, 2.0),), (t(0.5, 4.0, -2.0),))


def test_comparisons_with_none_and_strings():
    def f(x, other):
        return (x is None, other is None, x == other if other is None else x.sum(), isinstance(other, str))

    run_all_modes(f, (rand(2), None), (rand(2), "a"), variants=ALL)


class Cfg:
    scale = 1.0

    def __init__(self):
        self.bias = 0.5


CFG = Cfg()


def test_instance_attribute_deleted_falls_back_to_class():
    def f(x):
        return x * CFG.scale + CFG.bias

    def shadow():
        CFG.scale = 4.0

    def unshadow():
        del CFG.scale

    def cls():
        Cfg.scale = -2.0

    def reset():
        Cfg.scale = 1.0
        CFG.__dict__.pop("scale", None)
        CFG.bias = 0.5

    x = rand(2)
    run_all_modes(f, (x,), Call((x,), before=shadow), Call((x,), before=unshadow), Call((x,), before=cls),
                  reset=reset, variants=ALL)


def test_hasattr_and_getattr_on_an_argument_object():
    def f(x, obj):
        if hasattr(obj, "extra"):
            x = x + obj.extra
        return x * getattr(obj, "scale", 1.0)

    a, b, c = Obj(), Obj(), Obj()
    a.scale = b.scale = 2.0
    b.extra = 1.0
    run_all_modes(f, (rand(2), a), (rand(2), b), (rand(2), c), variants=ALL)


class Obj:
    pass


def test_module_level_function_default_changed_through_helper():
    def helper(x, k=2.0):
        return x * k

    def f(x):
        return helper(x)

    def rebind():
        helper.__defaults__ = (-1.0,)

    def reset():
        helper.__defaults__ = (2.0,)

    run_all_modes(f, (rand(2),), Call((rand(2),), before=rebind), reset=reset, variants=ALL)


def test_kwdefaults_changed():
    def f(x, *, k=2.0):
        return x * k

    def rebind():
        f.__kwdefaults__ = {"k": 7.0}

    def reset():
        f.__kwdefaults__ = {"k": 2.0}

    run_all_modes(f, (rand(2),), Call((rand(2),), before=rebind), reset=reset, variants=ALL)


def test_closure_partial_args_changed():
    p = [functools.partial(lambda x, a, b: x * a + b, 1.0)]

    def f(x):
        return p[0](x, 2.0)

    lam = p[0].func

    def change():
        p[0] = functools.partial(lam, 3.0)

    def reset():
        p[0] = functools.partial(lam, 1.0)

    run_all_modes(f, (rand(2),), Call((rand(2),), before=change), reset=reset, variants=ALL)


def test_defaultdict_and_counter_locally():
    def f(xs):
        d = collections.defaultdict(list)
        for x in xs:
            d[x.shape[0]].append(x)
        c = collections.Counter(x.shape[0] for x in xs)
        return {k: sum(v) for k, v in d.items()}, c.most_common(1)[0][0], dict(c)

    run_all_modes(f, ([rand(2), rand(3), rand(2, seed=1)],), ([rand(4)],), variants=ALL)


def test_enumerate_start_and_zip_strict_over_tensors():
    def f(x, ys):
        out = []
        for i, (r, y) in enumerate(zip(x, ys), start=1):
            out.append(r * i + y)
        return out, len(out)

    run_all_modes(f, (rand(3, 2), [1.0, 2.0, 3.0]), (rand(2, 2), [1.0, 2.0, 3.0]), variants=ALL)


def test_list_of_tensors_sorted_by_a_value_key():
    def f(xs):
        return sorted(xs, key=lambda v: float(v.sum()))

    run_all_modes(f, ([t(3.0), t(1.0), t(2.0)],), ([t(-1.0), t(5.0)],))


def test_tuple_unpack_of_tensor_rows_and_star():
    def f(x):
        a, *rest = x
        b, c = x.shape
        return a + sum(rest), b * c

    run_all_modes(f, (rand(3, 2),), (rand(4, 2),), (rand(2, 2),), variants=ALL)


def test_global_rebound_inside_with_try_finally():
    def f(x):
        global MODE
        old = MODE
        MODE = "eval"
        try:
            y = x * (2 if MODE == "eval" else 3)
        finally:
            MODE = old
        return y, MODE

    def reset():
        global MODE
        MODE = "train"

    run_all_modes(f, (rand(2),), (rand(2),), reset=reset, observe=lambda: MODE, variants=ALL)


MODE = "train"


def test_int_tensor_true_division_and_floor_with_negative_python_numbers():
    def f(x, a):
        return x / a, x // a, x % a, a / x, a // x, a % x, x ** 2, 2 ** x, x * a

    run_all_modes(f, (ti(7, -7, 3), -2), (ti(7, -7, 3), 2.5), (ti(1, 2, 4), -3), variants=ALL)


def test_bool_tensor_arithmetic_with_python_numbers():
    def f(m, a):
        return m + a, m * a, m & True, m | False, ~m, m ^ True, m.sum(), -a * m, m == a

    run_all_modes(f, (t(1, 0, 1, dtype=kiln.bool_), 2), (t(1, 0, 1, dtype=kiln.bool_), 1.5),
                  (t(0, 0, 1, dtype=kiln.bool_), True), variants=ALL)


def test_setitem_with_negative_and_out_of_range_index_tensors():
    def f(x, idx):
        y = x * 1.0
        y[idx] = -1.0
        return y

    run_all_modes(f, (rand(4), ti(-1, 0)), (rand(4), ti(3)), (rand(4), ti(-4, -4)), variants=ALL)


def test_in_place_on_a_view_of_a_view_and_aliasing():
    def f(x):
        v = x[1:]
        w = v[::2]
        w += 10.0
        v[0] *= -1.0
        x.add_(1.0)
        return x, v, w

    run_all_modes(f, (rand(5),), (rand(5, seed=1),), (rand(6, seed=2),), variants=ALL)


def test_float_to_int_and_int_of_shapes_in_arithmetic():
    def f(x, s):
        n = int(x.shape[0] * s)
        m = x.shape[0] // 2 + int(s)
        return x[:n], x.reshape(-1)[:m], float(x.shape[0]) / 2, x.shape[0] / 2

    run_all_modes(f, (rand(4), 0.5), (rand(4), 1.5), (rand(6), 0.5), variants=ALL)


P = collections.namedtuple("P", "a b")


def test_match_statement_on_shapes_and_strings():
    def f(x, mode):
        match x.shape:
            case (n, 1):
                y = x * n
            case (n, m) if m > 2:
                y = x.sum(axis=1, keepdims=True) + m
            case _:
                y = x
        match mode:
            case "double":
                y = y * 2
            case "neg" | "minus":
                y = -y
        return y

    run_all_modes(f, (rand(3, 1), "double"), (rand(2, 4), "neg"), (rand(2, 2), "minus"), (rand(2, 1), "x"),
                  variants=ALL)


def test_reduce_accumulate_chain_and_operator_getters():
    def f(xs, p):
        total = functools.reduce(operator.add, xs)
        acc = list(itertools.accumulate(xs))
        both = list(itertools.chain(xs, [p.a]))
        get_a = operator.attrgetter("a")
        first = operator.itemgetter(0)
        return total, acc, len(both), get_a(p) * first(xs), list(map(operator.mul, xs, xs))

    run_all_modes(f, ([rand(2), rand(2, seed=1)], P(rand(2, seed=2), 1)),
                  ([rand(2, seed=3), rand(2, seed=4), rand(2, seed=5)], P(rand(2, seed=6), 2)), variants=ALL)


def test_string_methods_on_mode_arguments():
    def f(x, mode):
        m = mode.lower().strip()
        if m.startswith("re") and "lu" in m:
            x = x.relu() if hasattr(x, "relu") else x * (x > 0)
        elif m.endswith("h"):
            x = x.tanh()
        return x, m.upper(), m.split("_")[0], "-".join([m, str(x.ndim)])

    run_all_modes(f, (rand(3), " ReLU "), (rand(3), "tanh"), (rand(3), "id_x"), variants=ALL)


def test_class_defined_inside_the_function():
    def f(x, k):
        class Scale:
            def __init__(self, s):
                self.s = s

            def __call__(self, v):
                return v * self.s

        return Scale(k)(x), type(Scale(k)).__name__

    run_all_modes(f, (rand(2), 2.0), (rand(2), 3.0), variants=ALL)


@dataclasses.dataclass
class Out:
    y: object
    n: int


def test_dataclass_and_namedtuple_replace_built_inside():
    def f(x, p):
        o = Out(x * 2, x.shape[0])
        q = p._replace(a=p.a + 1)
        return o, q, dataclasses.replace(o, n=o.n + 1)

    run_all_modes(f, (rand(2), P(rand(2, seed=1), 3)), (rand(3), P(rand(3, seed=2), 4)), variants=ALL)


def test_walrus_inside_a_comprehension_and_finally_return():
    def f(xs):
        ys = [y for v in xs if (y := v * 2).shape[0] > 1]
        try:
            out = sum(ys) if ys else xs[0]
        finally:
            n = len(ys)
        return out, n

    run_all_modes(f, ([rand(1), rand(2), rand(2, seed=1)],), ([rand(1)],), variants=ALL)


def test_recursion_on_a_list_of_tensors():
    def tree_sum(v):
        if isinstance(v, (list, tuple)):
            return sum(tree_sum(u) for u in v) if v else 0.0
        return v * 1.0

    def f(nested):
        return tree_sum(nested)

    run_all_modes(f, ([rand(2), [rand(2, seed=1), (rand(2, seed=2),)]],), ([[rand(2)], []],), variants=ALL)


def test_len_of_a_zero_d_tensor_raises_type_error_caught():
    def f(x):
        try:
            n = len(x)
        except TypeError:
            n = -1
        return x * n

    run_all_modes(f, (rand(3),), (t(2.0),), (rand(2),), variants=ALL)


def test_reraise_from_an_except_block_keeps_the_type():
    def f(x, d, k):
        try:
            return x * d[k]
        except KeyError as e:
            raise ValueError(f"no {k}") from e

    run_all_modes(f, (rand(2), {"a": 2.0}, "a"), (rand(2), {"a": 2.0}, "b"), variants=ALL, raises=True)


def test_type_checks_of_tensors():
    def f(x, y):
        return (type(x) is type(y), type(x).__name__, x.__class__ is kiln.Tensor, isinstance(x, kiln.Tensor),
                callable(x.sum), x.dtype == y.dtype, x * 1)

    run_all_modes(f, (rand(2), rand(2)), (rand(2), t(1.0, dtype=kiln.int32)), (rand(2), rand(2, dtype=kiln.float64)), variants=ALL)


def test_sum_with_a_tensor_start_and_max_with_a_key():
    def f(xs, start):
        return sum(xs, start), max(xs, key=lambda v: v.shape[0]), min(range(len(xs)), key=lambda i: -xs[i].shape[0])

    run_all_modes(f, ([rand(2), rand(2, seed=1)], rand(2, seed=2)), ([rand(2)], 1.5), variants=ALL)


def test_global_function_rebound_to_a_partial():
    def f(x):
        return ACT(x)

    def rebind():
        global ACT
        ACT = functools.partial(operator.mul, 3.0)

    def reset():
        global ACT
        ACT = _double

    run_all_modes(f, (rand(2),), Call((rand(2),), before=rebind), (rand(2),), reset=reset, variants=ALL)


def _double(x):
    return x * 2


ACT = _double


COUNT = []


def _key(k):
    COUNT.append(k)
    return k


def test_for_else_while_else_and_finally_overriding_return():
    def f(x, n):
        for i in range(n):
            if i == 2:
                break
        else:
            x = x + 100
        j = 0
        while j < n:
            j += 1
        else:
            x = x * 2
        try:
            return x
        finally:
            x = x - 1  # (does not change what is returned)

    run_all_modes(f, (rand(2), 1), (rand(2), 5), (rand(2), 0), variants=ALL)


def test_side_effecting_index_evaluated_once_in_augmented_assignment():
    # (ast: a chained comparison's middle operand was evaluated twice, once per comparison)
    def f(x, k):
        d = {"a": x, "b": x * 2}
        d[_key(k)] += 1.0
        lo = 0
        ok = lo < len(_key("c")) < 5
        return d, ok

    run_all_modes(f, (rand(2), "a"), (rand(2), "b"), reset=COUNT.clear, observe=lambda: list(COUNT), variants=ALL)


def test_late_binding_lambdas_in_a_comprehension():
    def f(x):
        fs = [lambda v: v * i for i in range(3)]
        gs = [lambda v, i=i: v * i for i in range(3)]
        return [g(x) for g in fs], [g(x) for g in gs]

    run_all_modes(f, (rand(2),), (rand(2, seed=1),), variants=ALL)


def test_star_args_from_a_generator_and_slice_assignment():
    def f(xs):
        def add(*vs):
            return sum(vs)

        total = add(*(v * 2 for v in xs))
        ys = list(xs)
        ys[1:2] = [xs[0], xs[0]]
        del ys[0]
        (a, *mid), last = ys[:-1], ys[-1]
        return total, len(ys), a + last, len(mid)

    run_all_modes(f, ([rand(2), rand(2, seed=1), rand(2, seed=2)],), ([rand(2), rand(2, seed=3)],), variants=ALL)


def test_dict_and_set_displays_with_unpacking():
    def f(x, a, b):
        d = {**a, **b, "x": x}
        s = {*a, *b} - {"q"}
        return d, sorted(s), {k: v * 2 for k, v in d.items() if k != "x"}, (a.keys() & b.keys())

    run_all_modes(f, (rand(2), {"p": 1.0, "q": 2.0}, {"q": 3.0, "r": 4.0}), (rand(2), {}, {"z": 1.0}), variants=ALL)


def test_nested_function_with_global_statement():
    def f(x):
        def bump():
            global BUMPS
            BUMPS += 1
            return BUMPS

        return x * bump(), x * bump()

    def reset():
        global BUMPS
        BUMPS = 0

    run_all_modes(f, (rand(2),), (rand(2),), reset=reset, observe=lambda: BUMPS, variants=ALL)


BUMPS = 0


def test_try_import_and_string_ops():
    def f(x, name):
        try:
            import math as m
        except ImportError:
            m = None
        label = (name * 2).replace("a", "b")[:3]
        return x * m.pi if m else x, label, f"{name!r:>6}", name.center(7, "*")

    run_all_modes(f, (rand(2), "ab"), (rand(2), "zz"), variants=ALL)


def test_tensor_passed_in_kwargs_and_mutated_through_an_alias():
    def g(*, out, scale):
        out *= scale
        return out

    def f(x, s):
        y = x * 1.0
        z = g(out=y, scale=s)
        return y, z is y, z

    run_all_modes(f, (rand(2), 2.0), (rand(2), -1.0), variants=ALL)


def test_chained_comparisons_on_tensors_evaluate_each_operand_once():
    def f(x, lo, hi):
        if lo < _key(x.sum()) < hi:
            y = x * 2
        else:
            y = x - 1
        inside = lo <= _key(x.max()) <= hi
        return y, inside, len(COUNT)

    run_all_modes(f, (t(0.5, 0.5), 0.0, 2.0), (t(3.0, 3.0), 0.0, 2.0), (t(-1.0, 0.5), 0.0, 2.0),
                  reset=COUNT.clear, observe=lambda: len(COUNT))
