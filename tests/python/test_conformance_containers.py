"""Conformance: Python containers built, read, returned and mutated in place by compiled code agree
with eager, under every kiln.jit variant (conformance.run_all_modes), over calls with new values,
new shapes and containers of other lengths or keys."""
import collections
import dataclasses

import kiln
from conformance import Call, rand, run_all_modes, t

Pair = collections.namedtuple("Pair", "a b")


@dataclasses.dataclass
class Box:
    w: object
    scale: float


def test_returns_nested_containers_of_tensors_and_numbers():
    def f(x, y):
        return {"sum": x + y, "parts": [x * 2, (y - 1, 3)], "n": x.shape[0], "r": 0.5}, (x,)

    run_all_modes(f, (rand(2, 3), rand(2, 3, seed=1)), (rand(2, 3, seed=2), rand(2, 3, seed=3)),
                  (rand(4, 3), rand(4, 3, seed=4)))


def test_local_list_methods():
    def f(x):
        out = [x, x * 2]
        out.append(x + 1)
        out.extend([x - 1, x * x])
        out.insert(1, -x)
        last = out.pop()
        out.reverse()
        del out[0]
        return out, last, len(out)

    run_all_modes(f, (rand(3),), (rand(3, seed=1),), (rand(5),))


def test_local_dict_building_and_reading():
    def f(x, y):
        d = {"a": x}
        d["b"] = y * 2
        d.update(c=x + y)
        d.setdefault("a", y)
        got = d.get("missing", x - y)
        keys = list(d.keys())
        total = d["a"]
        for k, v in d.items():
            if k != "a":
                total = total + v
        return total, keys, got, dict(d)

    run_all_modes(f, (rand(2), rand(2, seed=1)), (rand(2, seed=2), rand(2, seed=3)))


def test_unpacking_and_star_unpacking():
    def f(xs):
        first, *rest = xs
        a, (b, c) = first, (rest[0], rest[-1])
        return a + b * c, len(rest), tuple(rest)

    run_all_modes(f, ([rand(2), rand(2, seed=1), rand(2, seed=2)],),
                  ([rand(2, seed=3), rand(2, seed=4), rand(2, seed=5), rand(2, seed=6)],))


def test_list_argument_of_changing_length_and_contents():
    def f(xs, w):
        acc = w * 0
        for i, x in enumerate(xs):
            acc = acc + x * (i + 1)
        return acc, len(xs)

    w = rand(3, seed=9)
    run_all_modes(f, ([rand(3), rand(3, seed=1)], w), ([rand(3, seed=2), rand(3, seed=3)], w),
                  ([rand(3, seed=4)], w), ([rand(3, seed=5), rand(3, seed=6), rand(3, seed=7)], w))


def test_dict_argument_with_changing_keys():
    def f(d):
        out = 0
        for k in d:
            out = out + d[k] * len(k)
        return out, sorted(d)

    run_all_modes(f, ({"a": rand(2), "bb": rand(2, seed=1)},), ({"a": rand(2, seed=2), "bb": rand(2, seed=3)},),
                  ({"bb": rand(2, seed=4), "ccc": rand(2, seed=5)},), ({"a": rand(2, seed=6)},))


def test_argument_list_mutated_in_place():
    def f(history, x):
        history.append(x.sum())
        history[0] = history[0] * 2
        return x * len(history)

    run_all_modes(f, ([t(1.0)], rand(3)), ([t(2.0), t(3.0)], rand(3, seed=1)), ([t(4.0)], rand(3, seed=2)))


def test_argument_dict_written():
    def f(state, x):
        state["last"] = x * 2
        state["count"] = state.get("count", 0) + 1
        return x + state["count"]

    run_all_modes(f, ({}, rand(2)), ({"count": 3}, rand(2, seed=1)), ({"count": 3}, rand(2, seed=2)))


def test_namedtuple_argument_and_result():
    def f(p):
        q = Pair(p.a + p.b, p.b * 2)
        return q, q.a.sum(), p._replace(a=q.b)

    run_all_modes(f, (Pair(rand(3), rand(3, seed=1)),), (Pair(rand(3, seed=2), rand(3, seed=3)),),
                  (Pair(rand(2, 2), rand(2, 2, seed=1)),))


def test_dataclass_argument():
    def f(box, x):
        return x * box.w * box.scale

    run_all_modes(f, (Box(rand(3), 2.0), rand(3, seed=1)), (Box(rand(3, seed=2), 2.0), rand(3, seed=3)),
                  (Box(rand(3, seed=4), -1.5), rand(3, seed=5)))


def test_ordered_dict_result():
    def f(x):
        return collections.OrderedDict([("b", x), ("a", x * 3)])

    run_all_modes(f, (rand(2),), (rand(2, seed=1),))


def test_comprehensions():
    def f(xs, k):
        sq = [x * x for x in xs if x.shape[0] > 1]
        named = {f"x{i}": x + k for i, x in enumerate(xs)}
        total = sum(x.sum() for x in xs)
        return sq, named, total

    run_all_modes(f, ([rand(2), rand(1), rand(3)], 1), ([rand(2, seed=1), rand(1, seed=2), rand(3, seed=3)], 2),
                  ([rand(1, seed=4), rand(4, seed=5)], 2))


def test_tuple_and_list_slicing_and_negative_indexing():
    def f(xs):
        a = xs[-1] + xs[0]
        b = xs[1:][::-1]
        c = list(xs[:2]) + [a]
        return a, b, c, len(xs[1:]) if isinstance(xs, list) else -1

    run_all_modes(f, ((rand(2), rand(2, seed=1), rand(2, seed=2)),), ([rand(2, seed=3), rand(2, seed=4), rand(2, seed=5)],))


def test_tensor_argument_written_in_place():
    def f(x, y):
        x[0] = y[1]
        x += 1
        return x * 2

    run_all_modes(f, (rand(3), rand(3, seed=1)), (rand(3, seed=2), rand(3, seed=3)), (rand(5), rand(5, seed=1)))


def test_set_argument_and_membership():
    def f(names, x):
        out = x
        if "double" in names:
            out = out * 2
        if "neg" in names:
            out = -out
        return out, len(names)

    run_all_modes(f, ({"double"}, rand(3)), ({"double"}, rand(3, seed=1)), ({"neg", "double"}, rand(3, seed=2)),
                  (set(), rand(3, seed=3)))


def test_numpy_argument_values_change():
    import numpy as np

    def f(a, x):
        return x * kiln.Tensor(a, kiln.float32) + float(a.sum())

    run_all_modes(f, (np.array([1.0, 2.0]), rand(2)), (np.array([3.0, -1.0]), rand(2, seed=1)))
