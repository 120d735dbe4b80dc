"""Random functions with control flow (astgen): converted by capture_mode="ast" they compute what
the Python function computes, for inputs taking different paths, and ast-jitted with
fullgraph=True their first call (the capture) agrees with eager too. (One compiled graph serving
inputs that take different paths is tested in test_ast_control_flow.py.)"""
import numpy as np
import pytest

import astgen
import kiln
from kiln.jit import ast_runtime

SEEDS = range(120)


def inputs():
    rng = np.random.default_rng(7)
    base = rng.standard_normal((2, 3)).astype(np.float32)
    return [kiln.tensor(base * s) for s in (0.1, 1.0, 3.0, -2.0)]


def values(r):
    return [np.asarray(v.asnumpy() if isinstance(v, kiln.Tensor) else v, np.float64) for v in r]


def agree(got, want, seed):
    for a, b in zip(values(got), values(want)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5, err_msg=astgen.source(seed))


@pytest.mark.parametrize("seed", SEEDS)
def test_converted_function_computes_what_python_computes(seed):
    fn = astgen.program(seed)
    conv = ast_runtime.convert_function(fn)
    for x in inputs():
        agree(conv(x), fn(x), seed)


@pytest.mark.parametrize("seed", SEEDS[::4])
def test_capture_run_agrees_with_eager(seed):
    fn = astgen.program(seed)
    for x in inputs()[:2]:
        try:
            got = kiln.jit(fn, fullgraph=True)(x)
        except kiln.JitSyntaxError as e:
            # a number that is an int or a float by the path taken: refused (one graph output cannot
            # follow eager's type); without fullgraph the function then runs eagerly
            assert "by the path an if on a tensor takes" in str(e), (str(e), astgen.source(seed))
            with pytest.warns(RuntimeWarning):
                got = kiln.jit(fn)(x)
        agree(got, fn(x), seed)
