"""A loop body whose carry does not match the initial one (structure, shape, dtype, a number's
type) is refused with one error naming the op, the function and the leaf: eagerly, under every
kiln.jit capture mode and under kiln.trace alike. So are bad arguments of scan, fori_loop and
MindSpore's loop primitives."""
import numpy as np
import pytest

import kiln
from kiln import ops

X = kiln.tensor(np.ones(3))


def runners():
    """(name, run(fn, *args)): eager, each kiln.jit capture mode, kiln.trace."""
    out = [("eager", lambda fn, *a: fn(*a))]
    for mode in ("ast", "bytecode", "trace"):
        out.append((mode, lambda fn, *a, mode=mode: kiln.jit(fn, capture_mode=mode)(*a)))
    out.append(("kiln.trace", lambda fn, *a: kiln.trace(fn)(*a)))
    return out


RUNNERS = runners()
IDS = [n for n, _ in RUNNERS]


def fori_structure(x):
    return ops.fori_loop(0, 2, lambda i, c: (c[0], [c[1]]), (x, x))


def fori_shape(x):
    return ops.fori_loop(0, 2, lambda i, c: {"a": c["a"], "b": c["b"].sum()}, {"a": x, "b": x})


def fori_dtype(x):
    return ops.fori_loop(0, 2, lambda i, c: [c[0], c[1].float()], [x, x])


def fori_number(x):
    return ops.fori_loop(0, 2, lambda i, c: (c[0] * 2, c[1] + 0.5), (x, 1))


def scan_structure(x):
    return ops.scan(lambda c, t: ({"h": c["h"] + t, "k": c["h"]}, t), {"h": x}, ops.stack([x, x], 0))


def scan_shape(x):
    return ops.scan(lambda c, t: ((c[0], c[1][:2]), t), (x, x), ops.stack([x, x], 0))



def while_primitive_dtype(x):
    return ops.WhileLoop()(lambda v: v[1] < 3, lambda v: (v[0].float(), v[1] + 1), (x, 0))


def scan_primitive_shape(x):
    return ops.Scan()(lambda c, t: (c.sum(), c), x, [x, x])


CASES = [
    (fori_structure, ValueError, r"fori_loop: body_fun returns a carry structured as \(leaf, \[leaf\]\), but "
                                 r"init_val is \(leaf, leaf\)"),
    (fori_shape, ValueError, r"fori_loop: body_fun returns init_val\['b'\] as Tensor float64 \(\), but it is "
                             r"Tensor float64 \(3,\) in init_val"),
    (fori_dtype, ValueError, r"fori_loop: body_fun returns init_val\[1\] as Tensor float32 \(3,\), but it is "
                             r"Tensor float64 \(3,\) in init_val"),
    (fori_number, ValueError, r"fori_loop: body_fun returns init_val\[1\] as (Python float|Tensor float32 \(\)), "
                              r"but it is a Python int in init_val"),
    (scan_structure, ValueError, r"scan: f returns a carry structured as \{'h': leaf, 'k': leaf\}, but init is "
                                 r"\{'h': leaf\}"),
    (scan_shape, ValueError, r"scan: f returns init\[1\] as Tensor float64 \(2,\), but it is Tensor float64 "
                             r"\(3,\) in init"),
    (while_primitive_dtype, ValueError, r"WhileLoop: loop_func returns init_val\[0\] as Tensor float32 \(3,\), but "
                                        r"it is Tensor float64 \(3,\) in init_val"),
    (scan_primitive_shape, ValueError, r"Scan: loop_func returns init as Tensor float64 \(\), but it is Tensor "
                                       r"float64 \(3,\) in init"),
]


@pytest.mark.parametrize("run", [r for _, r in RUNNERS], ids=IDS)
@pytest.mark.parametrize("fn,exc,message", CASES, ids=[c[0].__name__ for c in CASES])
def test_a_carry_unlike_the_initial_one_is_named(run, fn, exc, message):
    with pytest.raises(exc, match=message):
        run(fn, X)


def test_bad_arguments():
    xs = ops.stack([X, X], 0)
    with pytest.raises(ValueError, match=r"scan: the arrays scanned over differ in leading size \(xs\[0\] 2, "
                                         r"xs\[1\] 3\)"):
        ops.scan(lambda c, t: (c, t), X, [xs, ops.stack([X, X, X], 0)])
    with pytest.raises(ValueError, match=r"scan: length=5 but xs has leading size 2"):
        ops.scan(lambda c, t: (c, t), X, xs, length=5)
    with pytest.raises(ValueError, match=r"scan: xs holds no array; pass length"):
        ops.scan(lambda c, t: (c, t), X, None)
    with pytest.raises(ValueError, match=r"scan: xs\['a'\] is 0-d"):
        ops.scan(lambda c, t: (c, t), X, {"a": X.sum()})
    with pytest.raises(TypeError, match=r"scan: f must return a pair \(carry, y\), got 3 values"):
        ops.scan(lambda c, t: (c, t, t), X, xs)
    with pytest.raises(TypeError, match=r"scan: init\[0\] in init is a str"):
        ops.scan(lambda c, t: (c, t), ("a",), xs)
    with pytest.raises(TypeError, match=r"fori_loop: upper must be an int or a one-element integer Tensor, got "
                                        r"Tensor float64"):
        ops.fori_loop(0, X.sum(), lambda i, v: v, X)
    with pytest.raises(TypeError, match=r"fori_loop: body_fun must be callable"):
        ops.fori_loop(0, 2, None, X)
    with pytest.raises(TypeError, match=r"Scan: xs must be a tuple, a list or None, got Tensor"):
        ops.Scan()(lambda c, t: (c, t), X, X)
    with pytest.raises(TypeError, match=r"ForiLoop: unroll must be a bool"):
        ops.ForiLoop()(0, 2, lambda i, v: v, X, unroll=2)
