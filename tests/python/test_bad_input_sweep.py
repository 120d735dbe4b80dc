"""Bad-input sweep (issue 18): every public function of kiln.ops and every kiln.nn constructor,
enumerated from the modules (new ones are covered without editing this file), is called with each
hostile value in turn in each parameter: wrong dtypes, mismatched, negative and overflowing shapes,
too many dimensions, out-of-range axes and indices, non-numeric objects, None. A constructor that
accepts its arguments is also called on a tensor.

Every case must end in a TypeError / ValueError / IndexError / RuntimeError (or MemoryError, or
kiln's subclasses) whose message names the function or the op it runs, or in a result whose values
NumPy can read with the shape it reports, and never in a crash. The cases run in batches in child
interpreters (this file run as a script); when a child dies or hangs, the first case it did not
report runs alone in a child of its own, so a crash fails the test naming its case, and the batch
goes on after it."""
import inspect
import json
import os
import re
import subprocess
import sys
import tempfile

import numpy as np
import pytest

import kiln
from kiln import nn, ops

PYTHON_DIR = os.path.dirname(os.path.dirname(kiln.__file__))
BATCH = 1500
BATCH_TIMEOUT = 240
CASE_TIMEOUT = 60

# ---- the cases ------------------------------------------------------------------------------

# hostile values: key -> expression, evaluated in the child (T: a float32 tensor of that shape)
HOSTILE = {
    "none": "None",
    "str": "'abc'",
    "object": "object()",
    "dict": "{}",
    "list_of_none": "[None, None]",
    "list_mixed": "[1, 'a']",
    "float": "1.5",
    "nan": "float('nan')",
    "inf": "float('inf')",
    "bool": "True",
    "neg_int": "-1",
    "zero": "0",
    "big_int": "99",
    "neg_big_int": "-99",
    "int64_max": "2**63 - 1",
    "int64_min": "-2**63",
    "huge_int": "10**30",
    "neg_shape": "(2, -3)",
    "overflow_shape": "(2**40, 2**40)",
    "overflow_shape3": "(2**31, 2**31, 2**31)",
    "too_many_dims": "(1,) * 9",
    "way_too_many_dims": "(1,) * 64",
    "float_shape": "(2.5, 3)",
    "empty_tuple": "()",
    "int_tensor": "kiln.Tensor(np.arange(6).reshape(2, 3), kiln.int64)",
    "int32_tensor": "kiln.Tensor(np.arange(6).reshape(2, 3), kiln.int32)",
    "bool_tensor": "kiln.Tensor(np.ones((2, 3), bool), kiln.bool_)",
    "f16_tensor": "kiln.Tensor(np.ones((2, 3)), kiln.float16)",
    "f64_tensor": "kiln.Tensor(np.ones((2, 3)), kiln.float64)",
    "scalar_tensor": "T(())",
    "empty_tensor": "T((0, 3))",
    "mismatched_tensor": "T((3, 2))",
    "vector_tensor": "T((5,))",
    "rank8_tensor": "T((1,) * 8)",
    "index_oob": "kiln.Tensor(np.array([0, 99]), kiln.int64)",
    "index_neg_oob": "kiln.Tensor(np.array([-99, 0]), kiln.int64)",
    "numpy_array": "np.ones((2, 3), np.float32)",
    "tensor_list": "[T((2, 3)), T((3, 2))]",
    "lambda": "lambda *a: a",
}

# plausible values for the parameters a case does not target, by parameter name
def _default_for(name):
    n = name.lower()
    if n in ("shape", "size", "sizes", "new_shape") or n.endswith("_shape"):
        return "(2, 3)"
    if n in ("axis", "dim", "dim0", "dim1", "axis0", "axis1", "start_dim", "end_dim"):
        return "0"
    if "fn" in n or n in ("network", "backbone", "loss_fn", "func"):
        return "lambda *a: a[0] if a else None"
    if n in ("tensors", "init_vals", "operands", "inputs", "cells") or n.startswith("tensor_list"):
        return "[T((2, 3)), T((2, 3))]"
    if n in ("params", "parameters"):
        return "[nn.Parameter(T((2, 3)))]"
    if n in ("n", "m", "steps", "num", "groups", "group", "chunks", "length", "start", "end", "stop", "step") \
            or "channels" in n or "features" in n or "size" in n or n.startswith("num_") or n.startswith("vocab"):
        return "3"
    if n in ("fill_value", "value", "p", "eps", "mean", "stddev", "learning_rate", "momentum", "min", "max"):
        return "0.5"
    if n in ("index", "indices", "input_indices", "label", "labels", "target"):
        return "kiln.Tensor(np.array([0, 1]), kiln.int64)"
    if n == "dtype":
        return "kiln.float32"
    return "T((2, 3))"


IDX = "kiln.Tensor(np.array([0, 1]), kiln.int64)"
IDX23 = "kiln.Tensor(np.zeros((2, 3), np.int64), kiln.int64)"
# where a function needs more than _default_for's guess for the untargeted arguments to be valid
# (so that the hostile one reaches the checks, and the C code, behind them)
FN_DEFAULTS = {
    "conv2d": {"input": "T((1, 2, 5, 5))", "weight": "T((3, 2, 3, 3))"},
    "max_pool2d": {"input": "T((1, 2, 5, 5))", "kernel_size": "2"},
    "avg_pool2d": {"input": "T((1, 2, 5, 5))", "kernel_size": "2"},
    "batch_norm": {"input": "T((2, 3, 4, 4))", "running_mean": "T((3,))", "running_var": "T((3,))",
                   "weight": "T((3,))", "bias": "T((3,))"},
    "layer_norm": {"normalized_shape": "(3,)"},
    "rms_norm": {"weight": "T((3,))"},
    "embedding": {"input": IDX, "weight": "T((4, 3))"},
    "gather": {"input_indices": IDX},
    "gather_elements": {"index": IDX23},
    "index_add": {"index": IDX, "source": "T((2, 3))"},
    "index_select": {"index": IDX},
    "scatter_add": {"index": IDX23, "src": "T((2, 3))"},
    "linear": {"weight": "T((4, 3))"},
    "dense": {"weight": "T((4, 3))"},
    "narrow": {"start": "0", "length": "1"},
    "split": {"split_size_or_sections": "1"},
    "where": {"condition": "kiln.Tensor(np.ones((2, 3), bool), kiln.bool_)"},
    "swapaxes": {"axis0": "0", "axis1": "1"},
}
# the input a constructed Cell is called on
CELL_INPUT = {
    "Conv2d": "T((1, 3, 5, 5))", "BatchNorm2d": "T((2, 3, 4, 4))", "MaxPool2d": "T((1, 2, 5, 5))",
    "AvgPool2d": "T((1, 2, 5, 5))", "Embedding": IDX,
}


def _targets():
    """(kind, name, callable) for each public op function and nn class."""
    out = []
    for name in sorted(dir(ops)):
        f = getattr(ops, name)
        if name.startswith("_") or inspect.isclass(f) or inspect.ismodule(f) or not callable(f):
            continue
        out.append(("ops", name, f))
    for name in sorted(dir(nn)):
        c = getattr(nn, name)
        if name.startswith("_") or not inspect.isclass(c):
            continue
        out.append(("nn", name, c))
    return out


def _parameters(f):
    """f's parameters: from its signature, or for C callables without one from the first line of
    their docstring ("abs(input): ...", "(input, axis=None, ...): ...")."""
    try:
        return list(inspect.signature(f).parameters.values())
    except (TypeError, ValueError):
        pass
    m = re.match(r"^\w*\((.*?)\):", (getattr(f, "__doc__", None) or "").split("\n", 1)[0])
    if not m:
        return []
    namespace = {}
    exec(f"def parameters({m.group(1)}): pass", namespace)
    return list(inspect.signature(namespace["parameters"]).parameters.values())


def cases():
    """Every case as (case id, call source): 'ops.sum[axis=big_int]' -> 'ops.sum(T((2, 3)), axis=99)'."""
    out = []
    for kind, name, f in _targets():
        params = [p for p in _parameters(f) if p.kind != p.VAR_KEYWORD]
        for target in params:
            for key, value in HOSTILE.items():
                parts, positional = [], True  # positional while no parameter was left out
                for p in params:
                    if p is not target and p.default is not p.empty:
                        positional = positional and p.kind == p.VAR_POSITIONAL
                        continue  # an optional parameter not targeted keeps its default
                    v = value if p is target else FN_DEFAULTS.get(name, {}).get(p.name) or _default_for(p.name)
                    if p.kind == p.VAR_POSITIONAL or (p.kind != p.KEYWORD_ONLY and positional):
                        parts.append(v)
                    else:
                        positional = False
                        parts.append(f"{p.name}={v}")
                src = ", ".join(parts)
                out.append((f"{kind}.{name}[{target.name}={key}]", f"{kind}.{name}({src})"))
    return out

# ---- running them (in the child) ---------------------------------------------------------------

ACCEPTED = (TypeError, ValueError, IndexError, RuntimeError, MemoryError, NotImplementedError)


def _check_result(value, depth=0):
    """A returned tensor (or tensors) must be readable with the shape it reports."""
    if depth > 3:
        return None
    if isinstance(value, kiln.Tensor):
        a = np.asarray(value.asnumpy() if hasattr(value, "asnumpy") else value)
        if tuple(a.shape) != tuple(value.shape):
            return f"result reads as shape {a.shape} but reports {tuple(value.shape)}"
        return None
    if isinstance(value, (tuple, list)):
        for v in value:
            bad = _check_result(v, depth + 1)
            if bad:
                return bad
    return None


def run_case(case_id, src, namespace):
    try:
        value = eval(src, namespace)
        if isinstance(value, nn.Cell) and case_id.startswith("nn."):
            cls = case_id[3:].split("[", 1)[0]
            try:
                value = value(eval(CELL_INPUT.get(cls, "T((2, 3))"), namespace))
            except ACCEPTED:
                return {"case": case_id, "outcome": "ok"}  # a cell that cannot take this input: fine
        bad = _check_result(value)
        return {"case": case_id, "outcome": "bad" if bad else "ok", "why": bad}
    except ACCEPTED as e:
        return {"case": case_id, "outcome": "raised", "type": type(e).__name__, "msg": str(e)}
    except Exception as e:  # the wrong kind of exception
        return {"case": case_id, "outcome": "bad", "why": f"{type(e).__name__}: {e}"}


def child(ids_path, results_path):
    import warnings
    warnings.simplefilter("ignore")
    rng = np.random.default_rng(0)

    def T(shape):
        return kiln.Tensor(rng.standard_normal(shape).astype(np.float32), kiln.float32)

    namespace = {"kiln": kiln, "np": np, "ops": ops, "nn": nn, "T": T}
    table = dict(cases())
    with open(ids_path) as f:
        ids = [line.rstrip("\n") for line in f if line.strip()]
    with open(results_path, "a", buffering=1) as out:
        for case_id in ids:
            out.write(json.dumps(run_case(case_id, table[case_id], namespace)) + "\n")
    sys.stdout.flush()
    os._exit(0)  # skip teardown: what is checked is the cases


# ---- the test (in the parent) ------------------------------------------------------------------

def _run_child(ids, timeout):
    with tempfile.TemporaryDirectory() as tmp:
        ids_path, results_path = os.path.join(tmp, "ids"), os.path.join(tmp, "results")
        with open(ids_path, "w") as f:
            f.write("\n".join(ids) + "\n")
        open(results_path, "w").close()
        env = dict(os.environ, PYTHONPATH=PYTHON_DIR + os.pathsep + os.environ.get("PYTHONPATH", ""),
                   OMP_NUM_THREADS="1")
        try:
            p = subprocess.run([sys.executable, __file__, ids_path, results_path], capture_output=True, text=True,
                               env=env, timeout=timeout)
            died = None if p.returncode == 0 else f"exit status {p.returncode}: {(p.stdout + p.stderr)[-2000:]}"
        except subprocess.TimeoutExpired:
            died = f"no result within {timeout} s"
        with open(results_path) as f:
            results = [json.loads(line) for line in f if line.endswith("\n")]
    return results, died


def _names_op(case_id, msg):
    """The message names the function called ('sum: ...', '... Conv2d ...') or the op it runs
    under another name ('max: ...' from amax): it starts with 'name: ' for an op-table name, a
    kiln.ops function or a kiln.nn class."""
    name = case_id.split(".", 1)[1].split("[", 1)[0]
    if name.lower() in msg.lower():
        return True
    head = msg.split(": ", 1)[0] if ": " in msg else ""
    return any(part in KNOWN for part in head.split("/"))  # "max/min: ..." names max


KNOWN = {row[0] for row in kiln._C.op_table()} | {name for kind, name, f in _targets()}


def test_bad_input_sweep():
    unknown = [name for kind, name, f in _targets() if not _parameters(f)]
    assert not unknown, f"no signature to sweep for {unknown}"
    all_cases = cases()
    ids = [c for c, _ in all_cases]
    print(f"bad-input sweep: {len(ids)} cases over {len(_targets())} functions and constructors")
    results, crashed = {}, []
    table = dict(all_cases)
    for start in range(0, len(ids), BATCH):
        pending = ids[start:start + BATCH]
        while pending:
            got, died = _run_child(pending, BATCH_TIMEOUT)
            results.update((r["case"], r) for r in got)
            rest = [c for c in pending if c not in results]
            if not died or not rest:
                break
            # the first case the child did not report is the one it died in: alone, in its own child
            suspect, pending = rest[0], rest[1:]
            got1, died1 = _run_child([suspect], CASE_TIMEOUT)
            if died1 or not got1:
                crashed.append(f"{suspect} ({table[suspect]}): {died1 or 'no result'}")
            else:
                crashed.append(f"{suspect} ({table[suspect]}): killed its batch ({died}), but not alone")
                results[suspect] = got1[0]
    bad = [f"{r['case']} ({table[r['case']]}): {r['why']}" for r in results.values() if r["outcome"] == "bad"]
    unnamed = [f"{r['case']} ({table[r['case']]}): {r['type']}: {r['msg']}" for r in results.values()
               if r["outcome"] == "raised" and not _names_op(r["case"], r["msg"])]
    raised = sum(r["outcome"] == "raised" for r in results.values())
    print(f"bad-input sweep: {raised} raised, {len(results) - raised - len(bad)} returned results, "
          f"{len(bad)} wrong, {len(unnamed)} messages not naming the function, {len(crashed)} crashed or hung")
    problems = [f"crashed: {c}" for c in crashed] + [f"wrong: {b}" for b in bad] + \
               [f"message does not name the function: {u}" for u in unnamed]
    assert not problems, f"{len(problems)} of {len(ids)} cases:\n" + "\n".join(problems[:80])
    assert len(results) == len(ids)



# ---- reproducers of wrong results the sweep's values led to ------------------------------------

def _image():
    return kiln.Tensor(np.random.default_rng(1).standard_normal((1, 2, 5, 5)).astype(np.float32))


@pytest.mark.parametrize("kwargs, message", [
    (dict(padding=2**63 - 1), "too large"),  # the padded size wrapped around: a (1, 3, 1, 1) result
    (dict(padding=2**62), "too large"),
    (dict(dilation=2**62), "too large"),
    (dict(padding=(2**62, 1)), "too large"),
])
def test_conv2d_huge_geometry_raises(kwargs, message):
    w = kiln.Tensor(np.ones((3, 2, 3, 3), np.float32))
    with pytest.raises(ValueError, match=f"conv2d: .*{message}"):
        ops.conv2d(_image(), w, **kwargs)


@pytest.mark.parametrize("kwargs, message", [
    (dict(kernel_size=2**63 - 1), "larger than the padded input"),  # the dilated kernel wrapped: (1, 2, 1, 1)
    (dict(kernel_size=3, dilation=2**62), "too large"),
    (dict(kernel_size=3, stride=2**63 - 1, ceil_mode=True), "too large"),
])
def test_pool_huge_geometry_raises(kwargs, message):
    for pool in (ops.max_pool2d, ops.avg_pool2d):
        if "dilation" in kwargs and pool is ops.avg_pool2d:
            continue
        with pytest.raises(ValueError, match=message):
            pool(_image(), **kwargs)


def test_huge_dilation_and_ddof():
    """Found by the sweep under UndefinedBehaviorSanitizer: signed overflow in pooling's window spans
    and in var/std's n - ddof. A 1x1 window with any dilation is the input itself; a ddof of -2^63
    divides the squared deviations by n - ddof, in floating point (NumPy's int64 n - ddof wraps)."""
    x = _image()
    np.testing.assert_array_equal(np.asarray(nn.MaxPool2d(dilation=2**63 - 1)(x)), np.asarray(x))
    v = np.arange(6.0)
    got = float(ops.var(kiln.Tensor(v.astype(np.float32)), ddof=-2**63).item())
    np.testing.assert_allclose(got, ((v - v.mean()) ** 2).sum() / (6 + 2.0**63), rtol=1e-6)


def test_huge_stride_is_one_window():
    """A stride past the input is fine: one window, as NumPy slicing would take (the reference)."""
    x = _image()
    got = np.asarray(ops.max_pool2d(x, 3, stride=2**63 - 1))
    want = np.asarray(x)[:, :, :3, :3].max(axis=(2, 3), keepdims=True)
    np.testing.assert_array_equal(got, want)
    w = kiln.Tensor(np.ones((3, 2, 3, 3), np.float32))
    got = np.asarray(ops.conv2d(x, w, stride=2**63 - 1))
    want = np.broadcast_to(np.asarray(x)[:, :, :3, :3].sum(axis=(1, 2, 3)).reshape(1, 1, 1, 1), (1, 3, 1, 1))
    np.testing.assert_allclose(got, want, rtol=1e-5)


if __name__ == "__main__":
    child(sys.argv[1], sys.argv[2])
