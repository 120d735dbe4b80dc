"""A compiled graph keeps its casts of parameters from one call to the next (plan.h's weight_cast,
src/runtime/weight_cache.c) while each parameter's storage version is unchanged: every in-place write
(set_data, assign_value, copy_, setitem, load_param_into_net, `param += x`, an optimizer step, a
compiled training step) makes the next call cast again, and a parameter handed to NumPy writable
(whose writes kiln cannot see) is cast on every call. Compiled results equal eager amp's bit for bit
after each kind of write, in every capture mode, jit level and backend and under kiln.trace, in
bfloat16 and float16, on the bfloat16 hardware path (where the CPU has it) and the fallback."""
import numpy as np
import pytest

import kiln
from kiln import nn

from conformance import TRACE_VARIANTS, VARIANTS

DTYPES = {"bfloat16": kiln.bfloat16, "float16": kiln.float16}
PATHS = {"hardware": 1, "fallback": 0}  # kiln._C.gemm_bf16_force: 1 where the CPU has the path


@pytest.fixture(params=list(PATHS))
def path(request, monkeypatch):
    # the sink's generated C runs the steps its interpreted path runs (test_differential); the
    # interpreted path spares each variant a compiler run. test_casts_are_kept... runs the generated C.
    monkeypatch.setenv("KILN_DISABLE_CODEGEN", "1")
    kiln._C.gemm_bf16_force(PATHS[request.param])
    yield request.param
    kiln._C.gemm_bf16_force(-1)


def model(dtype):
    kiln.manual_seed(0)
    net = nn.SequentialCell([nn.Dense(16, 32), nn.ReLU(), nn.Dense(32, 4)])
    return net, kiln.amp.auto_mixed_precision(net, "O2", dtype)


def values(t):
    """t's values (a tensor's, or a tuple's: a loss-scaled step's) without handing t's memory to NumPy
    (which would stop its casts being kept)."""
    if isinstance(t, tuple):
        return [values(e) for e in t]
    return t.astype(kiln.float64).numpy()


def rng_array(seed, shape):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def writes(net):
    """(name, write): each changes net's parameters in place in its own way."""
    w0, b0 = net[0].weight, net[0].bias
    w2 = net[2].weight

    def load():
        kiln.load_param_into_net(net, {name: rng_array(7 + k, p.shape) for k, (name, p) in
                                       enumerate(net.parameters_and_names())})

    def sgd():
        grads = [kiln.Tensor(rng_array(20 + k, p.shape)) for k, p in enumerate(net.trainable_params())]
        nn.SGD(net.trainable_params(), learning_rate=0.1)(grads)

    def numpy_write():
        w0.asnumpy()[...] = rng_array(30, w0.shape)  # no version bump: kiln never sees this write

    def iadd():
        net[0].weight += kiln.Tensor(rng_array(31, w0.shape))

    return [
        ("set_data", lambda: w0.set_data(kiln.Tensor(rng_array(1, w0.shape)))),
        ("assign_value", lambda: w2.assign_value(kiln.Tensor(rng_array(2, w2.shape)))),
        ("copy_", lambda: b0.copy_(kiln.Tensor(rng_array(3, b0.shape)))),
        ("setitem", lambda: w2.__setitem__((slice(0, 2),), kiln.Tensor(rng_array(4, (2, 32))))),
        ("data setter", lambda: setattr(w0, "data", kiln.Tensor(rng_array(5, w0.shape)))),
        ("load_param_into_net", load),
        ("iadd", iadd),
        ("optimizer step", sgd),
        ("numpy write", numpy_write),
        ("numpy write again", lambda: w0.asnumpy().__setitem__((0, 0), 3.0)),
    ]


def check_series(jf, low, net, x):
    """jf(x) == low(x) bit for bit on a first call, a repeated one, and after every kind of write."""
    def same(when):
        got, want = jf(x), low(x)
        assert got.dtype == want.dtype, when
        np.testing.assert_array_equal(values(got), values(want), err_msg=when)

    same("first call")
    same("second call")
    for name, write in writes(net):
        with kiln.no_grad():  # a leaf that requires grad is written in place outside autograd
            write()
        same(f"after {name}")
        same(f"again after {name}")


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("variant", VARIANTS, ids=[v.name for v in VARIANTS])
def test_writes_between_calls_jit(variant, dtype, path):
    net, low = model(DTYPES[dtype])
    x = kiln.Tensor(rng_array(0, (8, 16)))
    check_series(variant.wrap(lambda x: low(x)), low, net, x)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("variant", TRACE_VARIANTS, ids=[v.name for v in TRACE_VARIANTS])
def test_writes_between_calls_trace(variant, dtype, path):
    net, low = model(DTYPES[dtype])
    x = kiln.Tensor(rng_array(0, (8, 16)))
    check_series(variant.wrap(lambda x: low(x)), low, net, x)


@pytest.mark.parametrize("backend", ["kbk", "sink"])
@pytest.mark.parametrize("level", ["O0", "O1"])
def test_casts_are_kept_while_weights_do_not_change(level, backend):
    """A repeated forward reuses every weight cast; a write to one weight makes one cast again."""
    net, low = model(kiln.bfloat16)
    x = kiln.Tensor(rng_array(0, (8, 16)))
    jf = kiln.jit(lambda x: low(x), jit_level=level, backend=backend)
    jf(x)  # the capturing call (eager)
    jf(x)  # the first compiled call casts
    kept0, cast0 = kiln._C.weight_cast_counts()
    jf(x)
    kept1, cast1 = kiln._C.weight_cast_counts()
    assert (kept1 - kept0, cast1 - cast0) == (4, 0)  # two weights, two biases
    assert jf.plan_str(x).count("kept between calls") == 4, jf.plan_str(x)
    net[0].weight.set_data(kiln.Tensor(rng_array(1, (32, 16))))
    jf(x)
    kept2, cast2 = kiln._C.weight_cast_counts()
    assert (kept2 - kept1, cast2 - cast1) == (3, 1)
    net[0].weight.asnumpy()  # handed to NumPy writable: cast on every call from now on
    jf(x)
    jf(x)
    kept3, cast3 = kiln._C.weight_cast_counts()
    assert (kept3 - kept2, cast3 - cast2) == (6, 2)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("variant", VARIANTS, ids=[v.name for v in VARIANTS])
def test_compiled_training_steps(variant, dtype, path):
    """A compiled amp training step updates the weights it casts every call: each call casts again and
    the weights and losses equal eager steps' bit for bit; a forward compiled beside it follows."""
    def build():
        net, _ = model(DTYPES[dtype])
        step = kiln.amp.build_train_network(net, nn.SGD(net.trainable_params(), learning_rate=0.05),
                                            nn.MSELoss(), level="O2", dtype=DTYPES[dtype],
                                            loss_scale_manager=kiln.amp.DynamicLossScaleManager(2 ** 4, 2, 1000))
        return net, step

    (net_e, step_e), (net_c, step_c) = build(), build()
    low_e, low_c = (kiln.amp.auto_mixed_precision(n, "O2", DTYPES[dtype]) for n in (net_e, net_c))
    jstep = variant.wrap(lambda x, y: step_c(x, y))
    jfwd = variant.wrap(lambda x: low_c(x))
    for k in range(3):
        x, y = kiln.Tensor(rng_array(40 + k, (8, 16))), kiln.Tensor(rng_array(50 + k, (8, 4)))
        before = values(net_c[0].weight)
        for got, want in zip(values(jstep(x, y)), values(step_e(x, y))):
            np.testing.assert_array_equal(got, want, err_msg=f"step {k}")
        assert not (values(net_c[0].weight) == before).all(), "the step did not update the weights"
        for pc, pe in zip(net_c.trainable_params(), net_e.trainable_params()):
            np.testing.assert_array_equal(values(pc), values(pe), err_msg=f"{pc.name} after step {k}")
        for _ in range(2):
            np.testing.assert_array_equal(values(jfwd(x)), values(low_e(x)), err_msg=f"forward after step {k}")
