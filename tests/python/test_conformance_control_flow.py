"""Conformance: control flow nested on tensor and Python conditions -- if inside loops, loops inside
ifs, break / continue / early return on tensor values, while loops carrying several values, Python
state chosen under a tensor condition -- with inputs taking different paths on later calls."""
import kiln
from conformance import Call, rand, run_all_modes, t


def test_tensor_if_inside_python_for():
    def f(x):
        acc = x * 0
        for i in range(3):
            if (x * (i + 1)).sum() > 1.0:
                acc = acc + x * i
            else:
                acc = acc - 1
        return acc

    run_all_modes(f, (t(0.1, 0.2),), (t(1.0, 2.0),), (t(-1.0, -2.0),), (t(0.3, 0.3),))


def test_tensor_while_inside_python_if():
    def f(x, clamp):
        if clamp:
            n = 0
            while x.max() > 1.0 and n < 10:
                x = x * 0.5
                n += 1
        return x

    run_all_modes(f, (t(8.0, 1.0), True), (t(3.0, 0.5), True), (t(8.0, 1.0), False), (t(0.5, 0.5), True))


def test_break_and_continue_on_tensor_values():
    def f(xs):
        acc = xs[0] * 0
        for x in xs:
            if x.sum() < 0:
                continue
            acc = acc + x
            if acc.sum() > 3:
                break
        return acc

    run_all_modes(f, ([t(1.0), t(-1.0), t(5.0), t(1.0)],), ([t(-1.0), t(1.0), t(1.0), t(1.0)],),
                  ([t(4.0), t(1.0), t(1.0), t(1.0)],))


def test_early_return_in_nested_ifs():
    def f(x, y):
        if x.sum() > 0:
            if y.sum() > 0:
                return x + y
            y = y * 2
        elif y.mean() > 1:
            return y
        return x - y

    run_all_modes(f, (t(1.0, 1.0), t(1.0, 1.0)), (t(1.0, 1.0), t(-1.0, -1.0)), (t(-1.0, -1.0), t(2.0, 2.0)),
                  (t(-1.0, -1.0), t(0.0, 0.0)))


def test_while_loop_carrying_several_values():
    def f(x):
        s = x * 0
        i = t(0.0)
        while i < 4:
            s = s + x * i
            x = x * 0.9
            i = i + 1
        return s, x, i

    run_all_modes(f, (t(1.0, 2.0),), (t(-1.0, 0.5),), (t(3.0, 3.0, 3.0),))


def test_nested_while_loops_on_tensors():
    def f(x):
        total = x * 0
        i = t(0.0)
        while i < 3:
            j = t(0.0)
            while j < i:
                total = total + x
                j = j + 1
            i = i + 1
        return total

    run_all_modes(f, (t(1.0, 2.0),), (t(0.5, -1.0),))


def test_python_value_chosen_under_tensor_if():
    def f(x):
        if x.sum() > 0:
            scale = 2.0
            name = "pos"
        else:
            scale = -1.0
            name = "neg"
        return x * scale, name

    run_all_modes(f, (t(1.0, 2.0),), (t(-1.0, -2.0),), (t(3.0, 1.0),))


def test_local_dict_updated_under_python_if():
    def f(x, use_bias):
        parts = {"w": x * 2}
        if use_bias:
            parts["b"] = x + 1
        out = parts["w"]
        for v in parts.values():
            out = out + v
        return out, len(parts)

    run_all_modes(f, (rand(2), True), (rand(2, seed=1), False), (rand(2, seed=2), True))


def test_loop_over_python_list_with_tensor_if_and_shape_change():
    def f(x, ws):
        for w in ws:
            y = x * w
            x = y if y.sum() > 0 else -y
        return x

    run_all_modes(f, (rand(3), [1.0, -2.0]), (rand(3, seed=1), [1.0, -2.0]), (rand(5), [1.0, -2.0]),
                  (rand(3, seed=2), [0.5, 0.5, -1.0]))


def test_for_over_tensor_rows():
    def f(x):
        acc = x[0] * 0
        for row in x:
            acc = acc + row * row.sum()
        return acc

    run_all_modes(f, (rand(2, 3),), (rand(2, 3, seed=1),), (rand(4, 3),))


def test_raise_under_tensor_condition():
    def f(x):
        if x.min() < 0:
            raise ValueError("negative input")
        return x.sqrt()

    run_all_modes(f, (t(1.0, 4.0),), (t(9.0, 16.0),), (t(-1.0, 4.0),), raises=True)
