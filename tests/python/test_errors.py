"""Bad input raises ValueError / TypeError / IndexError whose message names the op and the
shapes involved, and never crashes the interpreter."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import kiln
from kiln import ops


def T(*shape, dtype=np.float64, fill=1.0):
    return kiln.Tensor(np.full(shape, fill, dtype))


def I(*values, dtype=np.int64):
    return kiln.Tensor(np.array(values, dtype))


A = T(2, 3)

# (id, callable, exception type, substrings the message must contain)
ERROR_CASES = [
    # broadcasting
    ("add_broadcast", lambda: A + T(4), ValueError, ["add", "(2, 3)", "(4,)"]),
    ("sub_broadcast", lambda: ops.sub(A, T(3, 2)), ValueError, ["sub", "(2, 3)", "(3, 2)"]),
    ("mul_broadcast", lambda: A * T(2, 2), ValueError, ["mul", "(2, 3)", "(2, 2)"]),
    ("div_broadcast", lambda: A / T(1, 4), ValueError, ["div", "(2, 3)", "(1, 4)"]),
    ("maximum_broadcast", lambda: ops.maximum(A, T(5)), ValueError, ["maximum", "(2, 3)", "(5,)"]),
    ("eq_broadcast", lambda: A == T(5), ValueError, ["eq", "(2, 3)", "(5,)"]),
    ("where_broadcast", lambda: ops.where(T(5, dtype=np.bool_), A, A), ValueError, ["where", "(5,)", "(2, 3)"]),
    ("expand", lambda: A.expand(3, 3), ValueError, ["broadcast", "(2, 3)", "(3, 3)"]),
    # matmul / dense
    ("matmul_inner", lambda: A @ A, ValueError, ["matmul", "(2, 3)"]),
    ("matmul_1d", lambda: ops.matmul(T(3), T(4)), ValueError, ["matmul", "(3,)", "(4,)"]),
    ("matmul_batch", lambda: ops.matmul(T(2, 2, 3), T(3, 3, 4)), ValueError, ["matmul", "(2, 2, 3)", "(3, 3, 4)"]),
    ("matmul_0d", lambda: ops.matmul(T(), A), ValueError, ["matmul", "()", "(2, 3)"]),
    ("dense_in", lambda: ops.dense(A, T(4, 4)), ValueError, ["linear", "(2, 3)", "(4, 4)"]),
    ("dense_bias", lambda: ops.dense(A, T(4, 3), T(5)), ValueError, ["linear", "(5,)"]),
    # shapes
    ("reshape_size", lambda: A.reshape(4, 2), ValueError, ["reshape", "(2, 3)", "(4, 2)"]),
    ("reshape_infer", lambda: A.reshape(-1, 4), ValueError, ["reshape", "(2, 3)", "(-1, 4)"]),
    ("reshape_two_unknown", lambda: A.reshape(-1, -1), ValueError, ["reshape", "-1"]),
    ("permute_repeat", lambda: ops.permute(A, 0, 0), ValueError, ["permute"]),
    ("permute_len", lambda: ops.permute(A, 0), ValueError, ["permute", "(2, 3)"]),
    ("squeeze", lambda: A.squeeze(0), ValueError, ["squeeze", "(2, 3)"]),
    ("flatten", lambda: A.flatten(1, 0), ValueError, ["flatten"]),
    ("concat_shapes", lambda: ops.concat([A, T(4)]), ValueError, ["concat", "(2, 3)", "(4,)"]),
    ("concat_inner", lambda: ops.concat([A, T(2, 4)], 0), ValueError, ["concat", "(2, 3)", "(2, 4)"]),
    ("concat_empty", lambda: ops.concat([]), ValueError, ["concat"]),
    ("stack_shapes", lambda: ops.stack([A, T(3, 2)]), ValueError, ["stack", "(2, 3)", "(3, 2)"]),
    ("split_sections", lambda: ops.split(A, [1, 2], 0), ValueError, ["split", "2"]),
    ("split_size", lambda: ops.split(A, 0, 1), ValueError, ["split"]),
    # axes
    ("sum_axis", lambda: A.sum(2), IndexError, ["sum", "2"]),
    ("mean_axis_neg", lambda: A.mean(-3), IndexError, ["mean", "-3"]),
    ("max_axis_tuple", lambda: ops.max(A, (0, 5)), IndexError, ["max", "5"]),
    ("sum_axis_twice", lambda: A.sum((0, 0)), ValueError, ["sum", "twice"]),
    ("sum_axis_type", lambda: A.sum(1.5), TypeError, ["sum", "axis"]),
    ("argmax_axis", lambda: A.argmax(5), IndexError, ["argmax", "5"]),
    ("softmax_axis", lambda: ops.softmax(A, 2), IndexError, ["softmax", "2"]),
    ("log_softmax_axis", lambda: ops.log_softmax(A, -3), IndexError, ["log_softmax", "-3"]),
    ("concat_axis", lambda: ops.concat([A, A], 2), IndexError, ["concat", "2"]),
    ("gather_axis", lambda: ops.gather(A, I(0), 3), IndexError, ["gather", "3"]),
    ("swapaxes_axis", lambda: A.swapaxes(0, 4), IndexError, ["swapaxes", "4"]),
    # indexing
    ("index_int", lambda: A[5], IndexError, ["5", "axis 0", "2"]),
    ("index_neg_int", lambda: A[-3], IndexError, ["-3"]),
    ("index_axis1", lambda: A[0, 3], IndexError, ["3", "axis 1"]),
    ("index_too_many", lambda: A[0, 0, 0], IndexError, ["too many", "(2, 3)"]),
    ("index_tensor", lambda: A[I(0, 2)], IndexError, ["2", "(2, 3)"]),
    ("index_tensor_neg", lambda: A[I(-3)], IndexError, ["-3", "(2, 3)"]),
    ("index_tensor_axis1", lambda: A[:, I(1, 3)], IndexError, ["3", "(2, 3)"]),
    ("index_float_tensor", lambda: A[T(2)], IndexError, ["float"]),
    ("index_mask_len", lambda: A[kiln.Tensor(np.array([True, False, True]))], IndexError, ["(3,)", "2"]),
    ("index_str", lambda: A["x"], IndexError, ["'x'"]),
    ("index_float", lambda: A[1.5], IndexError, ["1.5"]),
    ("index_two_ellipsis", lambda: A[..., ...], IndexError, ["ellipsis"]),
    ("setitem_oob", lambda: A.__setitem__(I(7), 1.0), IndexError, ["7", "(2, 3)"]),
    ("setitem_int_oob", lambda: A.__setitem__((1, 3), 1.0), IndexError, ["3"]),
    ("setitem_shape", lambda: T(2, 3).__setitem__(0, T(4)), ValueError, ["(4,)", "3"]),
    ("gather_oob", lambda: ops.gather(A, I(0, 5), 1), IndexError, ["gather", "5", "(2, 3)"]),
    ("gather_oob_neg", lambda: ops.gather(A, I(-4), 1), IndexError, ["gather", "-4", "(2, 3)"]),
    ("gather_float_idx", lambda: ops.gather(A, T(1), 1), TypeError, ["gather", "float"]),
    ("index_select_oob", lambda: ops.index_select(A, 0, I(2)), IndexError, ["2", "(2, 3)"]),
    ("index_select_2d", lambda: ops.index_select(A, 0, kiln.Tensor(np.zeros((1, 1), np.int64))), ValueError,
     ["index_select", "(1, 1)"]),
    ("embedding_oob", lambda: ops.embedding(kiln.Tensor(np.array([[0, 9]])), A), IndexError, ["9", "(2, 3)"]),
    ("embedding_float_ids", lambda: ops.embedding(T(2), A), TypeError, ["float"]),
    ("gather_elements_oob", lambda: ops.gather_elements(A, 1, kiln.Tensor(np.array([[0, 3, 0]]))), IndexError,
     ["gather_elements", "3", "(2, 3)"]),
    ("index_add_oob", lambda: ops.index_add(A, 0, I(2), T(1, 3)), IndexError, ["index_add", "2", "(2, 3)"]),
    ("index_add_shape", lambda: ops.index_add(A, 0, I(1), T(1, 4)), ValueError, ["index_add", "(1, 4)"]),
    ("scatter_add_oob", lambda: ops.scatter_add(A, 0, kiln.Tensor(np.array([[0, 2, 0]])), T(1, 3)), IndexError,
     ["scatter_add", "2"]),
    # dtypes
    ("neg_bool", lambda: -T(2, dtype=np.bool_), TypeError, ["neg", "bool"]),
    ("sub_bool", lambda: T(2, dtype=np.bool_) - T(2, dtype=np.bool_), TypeError, ["sub", "bool"]),
    ("and_float", lambda: A & A, TypeError, ["bitwise_and", "float64", "(2, 3)", "integer or bool"]),
    ("or_float_int", lambda: A | T(3, dtype=np.int32), TypeError, ["bitwise_or", "float64", "int32", "(3,)"]),
    ("invert_float", lambda: ~A, TypeError, ["bitwise_not", "float64", "integer or bool"]),
    ("grad_int_input", lambda: kiln.grad(lambda x: x.sum())(kiln.Tensor([1, 2])), TypeError, ["grad", "int64"]),
    ("cast_bad_dtype", lambda: ops.cast(A, "float33"), TypeError, ["float33"]),
    ("tensor_bad_dtype", lambda: kiln.Tensor([1], dtype="foo"), TypeError, ["foo"]),
    # conv / pool / norm
    ("conv_channels", lambda: ops.conv2d(T(1, 3, 5, 5), T(2, 4, 3, 3)), ValueError,
     ["conv2d", "(1, 3, 5, 5)", "(2, 4, 3, 3)"]),
    ("conv_groups_out", lambda: ops.conv2d(T(1, 4, 5, 5), T(3, 2, 3, 3), groups=2), ValueError,
     ["conv2d", "groups", "(3, 2, 3, 3)"]),
    ("conv_groups_in", lambda: ops.conv2d(T(1, 3, 5, 5), T(4, 1, 3, 3), groups=2), ValueError,
     ["conv2d", "groups", "(1, 3, 5, 5)"]),
    ("conv_kernel_too_big", lambda: ops.conv2d(T(1, 1, 2, 2), T(1, 1, 3, 3)), ValueError,
     ["conv2d", "(1, 1, 2, 2)", "(1, 1, 3, 3)"]),
    ("conv_3d_input", lambda: ops.conv2d(T(3, 5, 5), T(1, 3, 3, 3)), ValueError, ["conv2d", "(3, 5, 5)"]),
    ("conv_bias", lambda: ops.conv2d(T(1, 3, 5, 5), T(2, 3, 3, 3), T(3)), ValueError, ["conv2d", "(3,)"]),
    ("conv_stride_zero", lambda: ops.conv2d(T(1, 3, 5, 5), T(2, 3, 3, 3), stride=0), ValueError, ["conv2d", "stride"]),
    ("conv_neg_padding", lambda: ops.conv2d(T(1, 3, 5, 5), T(2, 3, 3, 3), padding=-1), ValueError,
     ["conv2d", "padding"]),
    ("conv_pad_mode", lambda: ops.conv2d(T(1, 3, 5, 5), T(2, 3, 3, 3), pad_mode="full"), ValueError,
     ["conv2d", "pad_mode", "full"]),
    ("conv_stride_type", lambda: ops.conv2d(T(1, 3, 5, 5), T(2, 3, 3, 3), stride="a"), TypeError, ["conv2d", "stride"]),
    ("conv_padding_type", lambda: ops.conv2d(T(1, 3, 5, 5), T(2, 3, 3, 3), padding=(1, 2, 3)), TypeError,
     ["conv2d", "padding"]),
    ("max_pool_kernel", lambda: ops.max_pool2d(T(1, 1, 2, 2), 3), ValueError, ["pool", "(1, 1, 2, 2)"]),
    ("avg_pool_3d", lambda: ops.avg_pool2d(T(1, 2, 2), 2), ValueError, ["pool", "(1, 2, 2)"]),
    ("pool_stride_zero", lambda: ops.avg_pool2d(T(1, 1, 4, 4), 2, 0), ValueError, ["pool", "stride"]),
    ("pool_padding", lambda: ops.max_pool2d(T(1, 1, 4, 4), 2, padding=2), ValueError, ["pool", "padding"]),
    ("pool_kernel_type", lambda: ops.max_pool2d(T(1, 1, 4, 4), "2"), TypeError, ["max_pool2d", "kernel_size"]),
    ("batch_norm_channels", lambda: ops.batch_norm(T(2, 3, 2, 2), T(4), T(4), T(4), T(4), True), ValueError,
     ["batch_norm", "(2, 3, 2, 2)", "(4,)"]),
    ("layer_norm_shape", lambda: ops.layer_norm(A, 4), ValueError, ["layer_norm", "(4,)", "(2, 3)"]),
    ("layer_norm_weight", lambda: ops.layer_norm(A, 3, T(4)), ValueError, ["layer_norm", "(4,)", "(2, 3)"]),
    ("rms_norm_weight", lambda: ops.rms_norm(A, T(4)), ValueError, ["rms_norm", "(4,)", "(2, 3)"]),
    # argument types and values
    ("tensor_from_str", lambda: kiln.Tensor("abc"), TypeError, ["str"]),
    ("tensor_from_object", lambda: kiln.Tensor(object()), TypeError, ["object"]),
    ("tensor_ragged", lambda: kiln.Tensor([[1, 2], [3]]), ValueError, []),
    ("tensor_no_data", lambda: kiln.Tensor(), TypeError, ["input_data"]),
    ("tensor_uint8", lambda: kiln.Tensor(np.ones(2, np.uint8)), TypeError, ["B"]),
    ("tensor_too_many_dims", lambda: kiln.Tensor(np.ones((1,) * 9)), (TypeError, ValueError), ["9"]),
    ("add_str", lambda: A + "x", TypeError, ["str"]),
    ("add_none", lambda: A + None, TypeError, ["NoneType"]),
    ("reshape_str", lambda: A.reshape("a"), TypeError, ["reshape"]),
    ("full_bad_shape", lambda: ops.full((2, "a"), 1.0), TypeError, ["full"]),
    ("zeros_negative", lambda: ops.zeros(-1, 2), ValueError, ["negative", "(-1, 2)"]),
    ("rand_negative", lambda: ops.rand(-3), ValueError, ["(-3,)"]),
    ("arange_step", lambda: ops.arange(0, 5, 0), ValueError, ["arange", "step"]),
    ("linspace_steps", lambda: ops.linspace(0, 1, -1), ValueError, ["linspace", "-1"]),
    ("eye_negative", lambda: ops.eye(-2), ValueError, ["eye", "-2"]),
    ("clamp_no_bounds", lambda: ops.clamp(A), ValueError, ["clamp"]),
    ("dropout_p", lambda: ops.dropout(A, 1.5), ValueError, ["dropout", "1.5"]),
    ("gelu_approx", lambda: ops.gelu(A, approximate="fast"), ValueError, ["gelu", "fast"]),
    ("pow_modulus", lambda: pow(A, 2, 3), TypeError, ["pow"]),
    ("item_many", lambda: A.item(), ValueError, ["item", "(2, 3)"]),
    ("bool_many", lambda: bool(A), ValueError, ["(2, 3)", "ambiguous"]),
    ("len_0d", lambda: len(T()), TypeError, ["0-d"]),
    ("iter_0d", lambda: iter(T()), TypeError, ["0-d"]),
    ("index_float_tensor_scalar", lambda: [1, 2][T()], TypeError, ["integer"]),
    ("backward_non_scalar", lambda: (A * 1.0).backward(), RuntimeError, ["backward", "6"]),
    ("grad_non_tensor_arg", lambda: kiln.grad(lambda x: x)(1.0), TypeError, ["grad", "float"]),
    ("grad_position_range", lambda: kiln.grad(lambda x: x.sum(), grad_position=3)(A), ValueError,
     ["grad", "grad_position", "3"]),
    ("grad_returns_float", lambda: kiln.grad(lambda x: 1.0)(A), TypeError, ["grad", "float"]),
    ("grad_no_targets", lambda: kiln.grad(lambda x: x.sum(), grad_position=None)(A), ValueError, ["grad"]),
    ("has_aux_single", lambda: kiln.grad(lambda x: x.sum(), has_aux=True)(A), ValueError, ["has_aux"]),
    ("max_empty_axis", lambda: T(0, 3).max(0), ValueError, ["max", "(0, 3)"]),
    ("argmin_empty_axis", lambda: T(0, 3).argmin(0), ValueError, ["argmin", "(0, 3)"]),
    ("setitem_two_tensors_apart", lambda: T(2, 3, 4).__setitem__((I(0), slice(None), I(0)), 1.0), IndexError,
     ["index", "adjacent"]),
]


@pytest.mark.parametrize("case", ERROR_CASES, ids=lambda c: c[0])
def test_error_message(case):
    name, fn, exc, words = case
    with pytest.raises(exc) as info:
        fn()
    msg = str(info.value)
    for w in words:
        assert w in msg, f"{name}: {w!r} not in message {msg!r}"


def test_failed_op_leaves_inputs_intact():
    a = kiln.Tensor(np.arange(6.0).reshape(2, 3))
    with pytest.raises(IndexError):
        a[I(0, 9)] = 5.0
    np.testing.assert_array_equal(a.asnumpy(), np.arange(6.0).reshape(2, 3))
    with pytest.raises(ValueError):
        a[0] = T(4)
    np.testing.assert_array_equal(a.asnumpy(), np.arange(6.0).reshape(2, 3))
    with pytest.raises(IndexError):
        ops.index_add(a, 0, I(0, 5), T(2, 3))
    np.testing.assert_array_equal(a.asnumpy(), np.arange(6.0).reshape(2, 3))
    # the library keeps working after errors
    np.testing.assert_array_equal((a + 1.0).asnumpy(), np.arange(6.0).reshape(2, 3) + 1)


def test_error_inside_grad_leaves_grad_mode_on():
    with pytest.raises(ValueError):
        kiln.grad(lambda x: (x @ x).sum())(A)
    assert kiln.is_grad_enabled()
    with pytest.raises(ValueError):
        with kiln.no_grad():
            A @ A
    assert kiln.is_grad_enabled()


_FUZZ = textwrap.dedent("""
    import sys
    import numpy as np
    import kiln
    from kiln import ops

    rng = np.random.default_rng(int(sys.argv[1]))
    allowed = (ValueError, TypeError, IndexError, NotImplementedError, OverflowError, RuntimeError)

    def shape():
        return tuple(int(s) for s in rng.integers(0, 4, size=rng.integers(0, 5)))

    def tensor(s=None):
        s = shape() if s is None else s
        kind = rng.integers(0, 4)
        if kind == 0:
            return kiln.Tensor(rng.standard_normal(s))
        if kind == 1:
            return kiln.Tensor(rng.integers(-5, 5, s).astype(np.int32))
        if kind == 2:
            return kiln.Tensor(rng.random(s) < 0.5)
        return kiln.Tensor(rng.standard_normal(s).astype(np.float32), kiln.bfloat16)

    calls = [
        lambda a, b: a + b, lambda a, b: a * b, lambda a, b: a / b, lambda a, b: a @ b,
        lambda a, b: ops.maximum(a, b), lambda a, b: ops.where(a, b, a), lambda a, b: ops.concat([a, b], 0),
        lambda a, b: ops.gather(a, b, 0), lambda a, b: ops.index_select(a, 0, b), lambda a, b: a[b],
        lambda a, b: a.__setitem__(b, 1.0), lambda a, b: ops.conv2d(a, b), lambda a, b: ops.max_pool2d(a, 2),
        lambda a, b: ops.avg_pool2d(a, (1, 2)), lambda a, b: ops.layer_norm(a, b.shape),
        lambda a, b: ops.rms_norm(a, b),
        lambda a, b: ops.dense(a, b), lambda a, b: ops.softmax(a, -1), lambda a, b: a.sum(0), lambda a, b: a.argmax(),
        lambda a, b: a.reshape(b.shape), lambda a, b: ops.gather_elements(a, 0, b), lambda a, b: ops.stack([a, b]),
        lambda a, b: ops.index_add(a, 0, b, a), lambda a, b: ops.var(a, 0), lambda a, b: a.prod(),
        lambda a, b: ops.batch_norm(a, b, b, b, b, True), lambda a, b: a.T @ b, lambda a, b: a[..., None, ::-1],
    ]
    for step in range(1500):
        a, b = tensor(), tensor()
        f = calls[rng.integers(0, len(calls))]
        try:
            f(a, b)
        except allowed:
            pass
    print("ok")
""")


def run_isolated(tmp_path, code, *args):
    """Runs code in a child Python (a crash there fails this test, not the whole session)."""
    script = tmp_path / "child.py"
    script.write_text(code)
    env = dict(os.environ)
    pkg = os.path.dirname(os.path.dirname(kiln.__file__))
    env["PYTHONPATH"] = pkg + os.pathsep + env.get("PYTHONPATH", "")
    res = subprocess.run([sys.executable, str(script), *map(str, args)], capture_output=True, text=True, env=env,
                         timeout=300)
    assert res.returncode == 0 and res.stdout.strip().endswith("ok"), \
        f"exit {res.returncode}\nstdout: {res.stdout[-2000:]}\nstderr: {res.stderr[-4000:]}"


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_random_bad_inputs_never_crash(seed, tmp_path):
    """Random shape/dtype combinations through many ops in a child process: only Python
    exceptions, never a crash (segfault, abort)."""
    run_isolated(tmp_path, _FUZZ, seed)


_ZERO_SIZE = textwrap.dedent("""
    import sys
    import numpy as np
    import kiln
    from kiln import ops

    a_shape, b_shape = eval(sys.argv[1]), eval(sys.argv[2])
    a, b = np.zeros(a_shape), np.ones(b_shape)
    for dt in (kiln.float32, kiln.float64):
        for _ in range(3):
            r = ops.matmul(kiln.Tensor(a, dt), kiln.Tensor(b, dt))
            e = np.matmul(a, b)
            assert r.shape == e.shape, (r.shape, e.shape)
            np.testing.assert_array_equal(r.asnumpy(), e)
    junk = [kiln.Tensor(np.ones(1000)) for _ in range(200)]  # heap damage shows up here
    print("ok")
""")


@pytest.mark.parametrize("shapes", [((3, 0, 2), (2, 1)), ((2, 0, 3), (3, 4)), ((3, 0, 0), (0, 1)),
                                    ((2, 0, 3), (2, 3, 4)), ((0, 2, 3), (3, 4)), ((3, 2, 0), (0, 4)),
                                    ((2, 3), (3, 0)), ((2, 3, 4), (2, 4, 0))], ids=str)
def test_zero_size_matmul(shapes, tmp_path):
    run_isolated(tmp_path, _ZERO_SIZE, repr(shapes[0]), repr(shapes[1]))
