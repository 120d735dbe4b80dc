"""The whole-graph sink backend (kiln.jit(..., backend="sink"), alias "GE"; O2 by default;
JitConfig(exc_mode="sink")): every op family sunk equals eager (bitwise at O0, where the sunk graph
calls the same kernels); training steps with in-place optimizer updates; value_and_grad graphs;
results that alias inputs, captured tensors or folded constants; views (and reshapes that must
copy); inputs in other layouts; repeated calls; run-time errors naming the op, the shapes and the
source line; the C fast path; JitConfig and Cell.set_jit_config; no C compiler (interpreted steps,
identical results, one warning); the disk cache in a new process."""
import inspect
import os
import subprocess
import sys
import textwrap
import zlib

import numpy as np
import pytest

import kiln
from kiln import nn, ops

from conftest import to_kiln, tol
from test_jit import CASES, FLOATS, OPTIMIZERS, _make_net, assert_same, make_arrays, rnd, to_tensors

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def executable_of(jf):
    return jf._last.executable


def assert_sunk(jf, native=True):
    exe = executable_of(jf)
    assert exe.backend == "sink", exe.backend
    if native:
        assert exe.native, "the sunk graph runs interpreted"


def replay(fn, specs, dtype, name, check, **options):
    """The tracing call and two replays (new values, then the first ones) of kiln.jit(fn, **options)
    against eager, inputs fresh for every call (in-place updates of inputs are compared too). Eager
    runs on contiguous inputs: a sunk graph computes on contiguous copies of inputs in other layouts
    (a reduction over a copy may round differently from one over the strided original)."""
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    sets = [make_arrays(specs, rng) for _ in range(2)]
    jf = kiln.jit(fn, **options)
    for step, arrays in enumerate([sets[0], sets[1], sets[0]]):
        contiguous = [(kind, a, "contiguous" if layout else layout) for kind, a, layout in arrays]
        ins_e, ins_j = to_tensors(contiguous, dtype), to_tensors(arrays, dtype)
        expected = fn(*ins_e)
        got = jf(*ins_j)
        check(got, expected, f"{name} call {step}")
        check(ins_j, ins_e, f"{name} call {step}: inputs after the call")
    info = jf.cache_info()
    assert (info.compiles, info.hits, info.misses, info.eager_calls) == (1, 2, 1, 0), info
    return jf


# ---- every op family --------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: d.name)
@pytest.mark.parametrize("name, fn, specs", CASES, ids=[c[0] for c in CASES])
def test_sunk_equals_eager_bitwise_at_o0(name, fn, specs, dtype):
    # the sink copies inputs in other layouts to contiguous ones: a reduction then takes another
    # kernel path (rows instead of columns) and may round differently, so those cases compare closely
    check = _close(dtype) if name == "non_contiguous_inputs" else assert_same
    jf = replay(fn, specs, dtype, name, check, backend="sink")
    assert_sunk(jf)


def _close(dtype):
    def check(got, expected, what):
        got = got if isinstance(got, (tuple, list)) else [got]
        expected = expected if isinstance(expected, (tuple, list)) else [expected]
        flat_g, flat_e = [], []
        for src, dst in ((got, flat_g), (expected, flat_e)):
            stack = list(src)
            while stack:
                x = stack.pop(0)
                if isinstance(x, (tuple, list)):
                    stack[:0] = list(x)
                else:
                    dst.append(x)
        assert len(flat_g) == len(flat_e), what
        for g, e in zip(flat_g, flat_e):
            assert g.dtype is e.dtype and g.shape == e.shape, what
            if g.dtype.is_floating_point and g.dtype.itemsize >= 4:
                np.testing.assert_allclose(np.asarray(g.asnumpy(), np.float64), np.asarray(e.asnumpy(), np.float64),
                                           err_msg=what, **tol(g.dtype, 20))
            else:
                np.testing.assert_array_equal(np.asarray(g.asnumpy(), np.float64),
                                              np.asarray(e.asnumpy(), np.float64), err_msg=what)
    return check


@pytest.mark.parametrize("name, fn, specs", CASES, ids=[c[0] for c in CASES])
def test_sunk_o2_equals_eager(name, fn, specs):
    """O2 (fusion, folding, ...) sinks the graph by default: fused groups run as generated loops."""
    jf = replay(fn, specs, kiln.float32, name, _close(kiln.float32), jit_level="O2")
    assert_sunk(jf)


def test_fused_groups_run_from_the_generated_function():
    rng = np.random.default_rng(0)
    x, y, z = (rnd(rng, 64, 33) for _ in range(3))
    fn = lambda x, y, z: (ops.gelu(x * y + z), ops.tanh(x - y) * z)  # noqa: E731
    jf = kiln.jit(fn, jit_level="O1", backend="GE")
    for _ in range(3):
        got = jf(x, y, z)
        for g, e in zip(got, fn(x, y, z)):
            np.testing.assert_allclose(g.asnumpy(), e.asnumpy(), **tol(kiln.float32, 20))
    assert jf.graph_str().split("subgraph")[0].count("= fused(") == 2
    assert_sunk(jf)


# ---- training, gradients ----------------------------------------------------------------------


def _train(kind, optimizer, steps=8, **options):
    net = _make_net(kind)
    opt = optimizer(net.trainable_params())
    loss_fn = nn.MSELoss()
    rng = np.random.default_rng(12)
    shape_x, shape_y = ((5, 8), (5, 4)) if kind == "mlp" else ((3, 2, 6, 6), (3, 3))
    batches = [(rnd(rng, *shape_x), rnd(rng, *shape_y)) for _ in range(2)]
    grad_fn = kiln.value_and_grad(lambda x, y: loss_fn(net(x), y), None, opt.parameters)

    def step(x, y):
        loss, grads = grad_fn(x, y)
        opt(grads)
        return loss

    if options:
        step = kiln.jit(step, **options)
    losses = [step(*batches[i % 2]).item() for i in range(steps)]
    return losses, net.get_parameters(), step


@pytest.mark.parametrize("kind", ["mlp", "conv_bn"])
@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
def test_training_step_with_in_place_updates(kind, opt_name):
    losses_e, params_e, _ = _train(kind, OPTIMIZERS[opt_name])
    losses_s, params_s, step = _train(kind, OPTIMIZERS[opt_name], backend="sink")
    assert losses_s == losses_e, np.max(np.abs(np.array(losses_s) - np.array(losses_e)))
    assert_same(list(params_s), list(params_e), "parameters after training")
    assert_sunk(step)
    assert step.cache_info().compiles == 1 and step.cache_info().eager_calls == 0


def test_value_and_grad_of_a_sunk_function():
    def f(x, w):
        return (ops.tanh(ops.matmul(x, w)) * 2.0).sum()

    rng = np.random.default_rng(1)
    x, w = rnd(rng, 4, 5, dtype=kiln.float64), rnd(rng, 5, 3, dtype=kiln.float64)
    jf = kiln.jit(f, backend="sink")
    ve, ge = kiln.value_and_grad(f, grad_position=(0, 1))(x, w)
    for _ in range(3):
        vs, gs = kiln.value_and_grad(jf, grad_position=(0, 1))(x, w)
        assert_same((vs, gs), (ve, ge))
    variant = next(iter(jf._grad_variants.values()))
    assert_sunk(variant)
    assert variant.cache_info().compiles == 1 and variant.cache_info().hits == 2


# ---- what results share -----------------------------------------------------------------------


def test_results_alias_inputs_and_captured_tensors_as_eager_ones_do():
    c = kiln.Tensor(np.arange(4.0, dtype=np.float32))

    def f(x):
        return x, x[1:], c, c[::2], x * c

    jf = kiln.jit(f, backend="sink")
    for _ in range(3):
        x = kiln.Tensor(np.ones(4, np.float32))
        got = jf(x)
        assert got[0] is not x and got[0]._shares_storage(x) and got[1]._shares_storage(x)
        assert got[2]._shares_storage(c) and got[3]._shares_storage(c)
        assert not got[4]._shares_storage(x) and not got[4]._shares_storage(c)
        assert_same(got, f(x))
    c[0] = 10.0  # a captured tensor is a live reference
    assert jf(x)[4].asnumpy()[0] == 10.0


def test_folded_constants_are_fresh_results_every_call():
    def f(x):
        k = ops.ones(3) * 2.0 + 1.0  # folded to a constant at O1
        return x + k, k, k[1:]

    jf = kiln.jit(f, jit_level="O1", backend="sink")
    x = kiln.Tensor(np.zeros(3, np.float32))
    first = jf(x)
    for r in first:
        r.fill_(-1.0)
    for _ in range(2):
        got = jf(x)
        assert_same(got, f(x))
        assert not any(g._shares_storage(p) for g in got for p in first)


def test_results_are_fresh_tensors_between_calls():
    jf = kiln.jit(lambda a, b: (a * b + 1.0, (a - b).T), backend="sink")
    rng = np.random.default_rng(2)
    a, b = rnd(rng, 3, 4), rnd(rng, 3, 4)
    r1 = jf(a, b)
    r2 = jf(a * 2, b)
    assert not r1[0]._shares_storage(r2[0]) and not r1[1]._shares_storage(r2[1])
    assert_same(r1, (a * b + 1.0, (a - b).T))
    assert_same(r2, (a * 2 * b + 1.0, (a * 2 - b).T))


def test_views_and_reshapes_that_copy():
    def f(x, y):
        t = x.permute(0, 2, 1)  # a view of an input
        u = t.reshape(2, -1)  # its layout makes the reshape copy
        h = (x * y).swapaxes(1, 2).reshape(2, 12)  # a copying reshape of an intermediate
        return u + h, h[:, ::3], t, u.reshape(2, 3, 4)

    rng = np.random.default_rng(3)
    jf = kiln.jit(f, backend="sink")
    for _ in range(3):
        x, y = rnd(rng, 2, 3, 4), rnd(rng, 2, 3, 4)
        assert_same(jf(x, y), f(x, y))
    assert_sunk(jf)


def test_inputs_in_other_layouts_are_copied_or_run_kernel_by_kernel():
    def read_only(a, b):
        return ops.matmul(a, b) + a.reshape(16).sum() * b[0]

    def writes_input(a, b):
        a[1] = b[0]
        return a * 2

    rng = np.random.default_rng(4)
    jr, jw = kiln.jit(read_only, backend="sink"), kiln.jit(writes_input, backend="sink")
    for layout in ("contiguous", "transposed", "strided", "contiguous"):
        arrays = rng.uniform(-1, 1, (4, 4)), rng.uniform(-1, 1, (4, 4))
        a, b = (to_kiln(v, kiln.float32, layout) for v in arrays)
        assert_same(jr(a, b), read_only(a, b), layout)
        ae, be = (to_kiln(v, kiln.float32, layout) for v in arrays)
        aj, bj = (to_kiln(v, kiln.float32, layout) for v in arrays)
        assert_same(jw(aj, bj), writes_input(ae, be), layout)
        assert_same(aj, ae, f"{layout}: the input written in place")
    # contiguity is part of the call's key (Python may read x.is_contiguous()): one graph for the
    # contiguous calls, one captured with the transposed input and served the strided one too
    assert jr.cache_info().compiles == 2 and jw.cache_info().compiles == 2
    assert all(e.executable.fallback_calls == 0 for es in jr._entries.exact.values() for e in es)
    # a written input in another layout (strided, into the transposed graph) cannot be swapped for a
    # copy: that call ran kernel by kernel
    assert sum(e.executable.fallback_calls for es in jw._entries.exact.values() for e in es) == 1


# ---- calls --------------------------------------------------------------------------------------


def test_repeated_calls_and_the_c_fast_path():
    fn = lambda a, b, c: a * b + c  # noqa: E731
    jf = kiln.jit(fn, backend="sink")
    rng = np.random.default_rng(5)
    inputs = [tuple(rnd(rng, 2, 3) for _ in range(3)) for _ in range(50)]
    results = [jf(*abc) for abc in inputs]
    for abc, r in zip(inputs, results):
        assert_same(r, fn(*abc))
    assert jf._fast_hits == 49
    assert jf.cache_info().hits == 49 and jf.cache_info().compiles == 1
    assert_sunk(jf)


def test_calls_from_several_threads_get_their_own_results():
    """The sunk graph's tensors are shared: calls run one at a time (the lock), results stay apart."""
    import threading

    fn = lambda a, b: ops.tanh(ops.matmul(a, b)) * 2.0 + a.sum()  # noqa: E731
    jf = kiln.jit(fn, backend="sink")
    rng = np.random.default_rng(6)
    inputs = [(rnd(rng, 128, 128), rnd(rng, 128, 128)) for _ in range(8)]  # large enough to release the GIL
    jf(*inputs[0])
    results = [None] * len(inputs)

    def work(k):
        for _ in range(5):
            results[k] = jf(*inputs[k])

    threads = [threading.Thread(target=work, args=(k,)) for k in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for (a, b), r in zip(inputs, results):
        assert_same(r, fn(a, b))


def test_run_time_errors_name_the_op_the_shapes_and_the_source_line():
    def f(a, idx):
        y = a * 2.0
        return ops.gather(y, idx, 0) + 1.0  # the failing line

    jf = kiln.jit(f, backend="sink")
    a = kiln.Tensor(np.ones((6, 5), np.float32))
    jf(a, kiln.Tensor(np.array([1, 2], np.int64)))
    with pytest.raises(IndexError) as e:
        jf(a, kiln.Tensor(np.array([1, 9], np.int64)))
    msg = str(e.value)
    src, first = inspect.getsourcelines(f)
    line = first + next(i for i, s in enumerate(src) if "the failing line" in s)
    assert "gather" in msg and "(6, 5)" in msg and "(2,)" in msg and "index 9" in msg, msg
    assert f"{os.path.basename(__file__)}:{line}" in msg, msg
    # the graph is fine afterwards
    assert_same(jf(a, kiln.Tensor(np.array([5, 0], np.int64))), f(a, kiln.Tensor(np.array([5, 0], np.int64))))


def test_wrong_inputs_to_the_executable_raise():
    jf = kiln.jit(lambda a: a + 1.0, backend="sink")
    a = kiln.Tensor(np.ones(3, np.float32))
    jf(a)
    exe = executable_of(jf)
    with pytest.raises(ValueError, match=r"input 0 is float32 \(4,\), the graph was compiled for float32 \(3,\)"):
        exe(kiln.Tensor(np.ones(4, np.float32)))
    with pytest.raises(TypeError):
        exe(a, a)


# ---- configuration ----------------------------------------------------------------------------


def test_backend_names_and_levels():
    a = kiln.Tensor(np.ones(3, np.float32))
    expect = [(dict(backend="sink"), "sink"), (dict(backend="GE"), "sink"), (dict(jit_level="O2"), "sink"),
              (dict(jit_level="O2", backend="ms_backend"), "kbk"), (dict(jit_level="O2", backend="kbk"), "kbk"),
              (dict(jit_level="O1"), "kbk"), (dict(), "kbk"), (dict(jit_level="O1", backend="GE"), "sink")]
    for options, backend in expect:
        jf = kiln.jit(lambda x: x * 2.0, **options)
        jf(a)
        assert executable_of(jf).backend == backend, options


def _cell():
    kiln.manual_seed(3)
    return nn.SequentialCell(nn.Dense(3, 5), nn.ReLU(), nn.Dense(5, 2))


@pytest.mark.parametrize("config, backend", [
    (dict(jit_level="O2"), "sink"),
    (dict(jit_level="O1", exc_mode="sink"), "sink"),
    (dict(jit_level="O0", exc_mode="sink", exec_order="dfs"), "sink"),
    (dict(jit_level="O2", exc_mode="no_sink"), "kbk"),
    (dict(jit_level="O1"), "kbk"),
])
def test_set_jit_config_runs_the_cell_with_that_backend(config, backend):
    net = _cell()
    x = kiln.Tensor(np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32))
    eager = net(x).asnumpy()
    net.set_jit_config(kiln.JitConfig(**config))
    for _ in range(3):
        np.testing.assert_allclose(net(x).asnumpy(), eager, **tol(kiln.float32, 5))
    assert executable_of(net._jitted).backend == backend
    info = net._jitted.cache_info()
    assert info.compiles == 1 and info.hits == 2
    v_e, g_e = kiln.value_and_grad(lambda x: net.construct(x).sum(), None, net.trainable_params())(x)
    v_j, g_j = kiln.value_and_grad(net, None, net.trainable_params())(x)
    np.testing.assert_allclose(v_j.sum().asnumpy(), v_e.asnumpy(), **tol(kiln.float32, 5))


# ---- no compiler; the disk cache ---------------------------------------------------------------


def _run_script(script, **env):
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"), **env)
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    return p


def test_no_compiler_runs_the_steps_interpreted(tmp_path):
    """CC=/nonexistent: the sunk graphs run interpreted, identical to kernel by kernel, one warning."""
    script = """
        import numpy as np, kiln
        from kiln import ops
        rng = np.random.default_rng(0)
        x, y, z = [kiln.Tensor(rng.uniform(-2, 2, (50, 70)).astype(np.float32)) for _ in range(3)]
        def f(x, y, z):
            return ops.gelu(x * y + z), ops.tanh(x - y).T * 2.0, ops.matmul(x, y.T)
        def g(x, y):
            return ops.exp(x * 0.5) + ops.sigmoid(y)
        for fn, args in ((f, (x, y, z)), (g, (x, y))):
            for level in ("O0", "O1"):
                js = kiln.jit(fn, jit_level=level, backend="sink")
                jk = kiln.jit(fn, jit_level=level, backend="kbk")
                js(*args), jk(*args)
                rs, rk = js(*args), jk(*args)
                assert js._last.executable.backend == "sink" and not js._last.executable.native
                rs = rs if isinstance(rs, tuple) else (rs,)
                rk = rk if isinstance(rk, tuple) else (rk,)
                for a, b in zip(rs, rk):
                    assert np.array_equal(a.asnumpy(), b.asnumpy())
        print("ok")
    """
    p = _run_script(script, CC="/nonexistent", KILN_CACHE_DIR=str(tmp_path / "cache"))
    assert p.stdout.strip().endswith("ok")
    assert p.stderr.count("kiln: warning") == 1, p.stderr


def test_a_new_process_loads_the_sunk_graph_from_the_disk_cache(tmp_path):
    script = """
        import numpy as np, kiln
        from kiln import ops
        jf = kiln.jit(lambda a, b: ops.relu(a * b) + ops.exp(b), jit_level="O1", backend="sink")
        a = kiln.Tensor(np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4))
        r = jf(a, a)
        assert jf._last.executable.native
        print(float(r.asnumpy().sum()))
    """
    cache = tmp_path / "cache"

    def entries():
        return {p.name: p.stat().st_mtime_ns for p in cache.iterdir()}

    first = _run_script(script, KILN_CACHE_DIR=str(cache)).stdout
    built = entries()
    assert any(name.endswith(".so") for name in built), built
    second = _run_script(script, KILN_CACHE_DIR=str(cache)).stdout
    assert entries() == built  # nothing built again: loaded from the cache
    assert first == second
