"""Conformance: Python's logic operators and comparisons in compiled code: `and`/`or` returning
an operand (Python values and tensors), `not`, chained comparisons, `is None` / `is not None`, `in`,
conditional expressions, and element-wise `&`/`|`/`~` on boolean tensors."""
import kiln
from conformance import Call, rand, run_all_modes, t


def test_and_or_on_python_values_return_an_operand():
    def f(x, a, b):
        k = a or b
        m = a and b
        return x * (k or 1) + (m or 0), k, m, (not a), (a or None)

    run_all_modes(f, (rand(2), 0, 3), (rand(2, seed=1), 2, 0), (rand(2, seed=2), 2, 5), (rand(2, seed=3), 0.0, 0))


def test_and_or_not_on_tensor_conditions():
    def f(x, y):
        if x.sum() > 0 and y.sum() > 0:
            r = x + y
        elif not (x.max() > 1) or y.min() < -1:
            r = x - y
        else:
            r = x * y
        return r

    run_all_modes(f, (t(1.0, 1.0), t(1.0, 1.0)), (t(-1.0, 0.5), t(1.0, 1.0)), (t(-1.0, 2.0), t(1.0, 1.0)),
                  (t(2.0, 0.5), t(-1.0, -0.5)), (t(-0.5, 2.0), t(0.0, -2.0)))


def test_or_of_tensor_condition_and_python_flag():
    def f(x, flag):
        if flag or x.sum() > 0:
            return x * 2
        return x - 1

    run_all_modes(f, (t(1.0, 2.0), False), (t(-1.0, -2.0), False), (t(-1.0, -2.0), True), (t(1.0, 2.0), True))


def test_conditional_expression_on_tensor_and_python_values():
    def f(x, k):
        y = x * 2 if x.mean() > 0 else x - 3
        z = y + (1 if k > 2 else -1)
        return z if k != 0 else -z

    run_all_modes(f, (t(1.0, 2.0), 3), (t(-1.0, -2.0), 3), (t(-1.0, -2.0), 0), (t(2.0, 2.0), 1))


def test_chained_comparisons_identity_and_membership():
    def f(x, k, opt, names):
        out = x
        if 0 < k <= 3:
            out = out + k
        if opt is None:
            out = out * 2
        if opt is not None:
            out = out + opt
        if "a" in names and "z" not in names:
            out = out - 1
        return out

    run_all_modes(f, (rand(2), 2, None, ("a",)), (rand(2, seed=1), 5, None, ("a", "z")), (rand(2, seed=2), 1, rand(2), ["b"]),
                  (rand(2, seed=3), 3, None, {"a": 1}))


def test_elementwise_logic_on_bool_tensors():
    def f(x, y):
        m = (x > 0) & (y > 0)
        n = (x > 1) | ~(y < 0)
        return m, n, kiln.ops.where(m ^ n, x, y) if hasattr(m, "__xor__") else kiln.ops.where(m, x, y)

    run_all_modes(f, (t(1.0, -1.0, 2.0), t(1.0, 1.0, -1.0)), (t(-1.0, 3.0, 0.5), t(2.0, -1.0, 1.0)))


def test_truth_of_multi_element_tensor_raises_like_eager():
    def f(x):
        if x > 0:
            return x
        return -x

    run_all_modes(f, (t(1.0, 2.0),), (t(-1.0, 2.0),), raises=True)


def test_tensor_operands_of_and_or():
    def f(x, y):
        a = x.sum() > 0
        b = y.sum() > 0
        c = a and b
        d = a or b
        return kiln.ops.where(c, x, y), kiln.ops.where(d, y, x)

    run_all_modes(f, (t(1.0, 2.0), t(3.0, 1.0)), (t(-1.0, -2.0), t(3.0, 1.0)), (t(1.0, 2.0), t(-3.0, 1.0)),
                  (t(-1.0, -2.0), t(-3.0, 1.0)))
