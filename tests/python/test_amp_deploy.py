"""Deployment of mixed-precision (amp) graphs: a kiln.trace of a function using amp (autocast inside,
or an auto_mixed_precision net; bfloat16 and float16) dumps with trace.dump (as recorded, optimized
for inference, enable_io16xc32) and the file, loaded by kiln.load (kbk, sink) and by the C runtime
(examples/run_model.c, kiln-run --check), computes what the trace computes; enable_ioc16 is refused
with a message that names why. Also: the batch_norm folding of the inference rewrites leaves a
16-bit convolution normalized with float32 parameters alone (it changed the result's dtype)."""
import os
import subprocess

import numpy as np
import pytest

import kiln
from kiln import models, nn, ops

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUN_MODEL = os.path.join(ROOT, "build", "run_model")
KILN_RUN = os.path.join(ROOT, "build", "kiln-run")
LOW = {"bfloat16": kiln.bfloat16, "float16": kiln.float16}
rng = np.random.default_rng(31)
X_ATTN = kiln.Tensor(rng.standard_normal((1, 8, 32)).astype(np.float32))
POS = kiln.Tensor(np.arange(8, dtype=np.int64).reshape(1, 8))
X_BLOCK = kiln.Tensor(rng.standard_normal((1, 4, 8, 8)).astype(np.float32))
X_MLP = kiln.Tensor(rng.standard_normal((8, 16)).astype(np.float32))


def _attention():
    kiln.manual_seed(0)
    return models.LlamaAttention(32, 4, 2, rope_theta=500000.0)


def _block():
    kiln.manual_seed(0)
    block = models.BasicBlock(4)
    for bn in (block.bn1, block.bn2):  # statistics that are not the identity's
        c = bn.num_features
        bn.gamma.set_data(kiln.Tensor(rng.uniform(0.5, 1.5, c).astype(np.float32)))
        bn.moving_mean.set_data(kiln.Tensor(rng.uniform(-0.2, 0.2, c).astype(np.float32)))
        bn.moving_variance.set_data(kiln.Tensor(rng.uniform(0.5, 2.0, c).astype(np.float32)))
    return block


def _mlp():
    kiln.manual_seed(0)
    net = nn.SequentialCell([nn.Dense(16, 32), nn.ReLU(), nn.Dense(32, 4)])
    return net


MODELS = {"attention": (_attention, (X_ATTN, POS)), "block": (_block, (X_BLOCK,)), "mlp": (_mlp, (X_MLP,))}


def _traced(model, how, low):
    """A kiln.trace of the model (eval mode) under amp: autocast inside the function, or an
    auto_mixed_precision net at level `how`."""
    make, args = MODELS[model]
    net = make()
    net.set_train(False)
    if how == "autocast":
        def fn(*a):
            with kiln.amp.autocast(low_prec_dtype=low):
                out = net(*a)
            return ops.softmax(out, -1) if model == "mlp" else out
    else:
        low_net = kiln.amp.auto_mixed_precision(net, how, dtype=low)

        def fn(*a):
            return low_net(*a)
    tr = kiln.trace(fn, capture_as_const=True)
    tr(*args)
    return tr, args


def _np(t):
    return t.astype(kiln.float32).asnumpy()


def _dump(tr, args, path, **options):
    tr.dump(path, input_data=[args], **options)
    return path


def _run_c(path):
    """examples/run_model.c (the C runtime: every embedded test case) and kiln-run --check."""
    for cmd in ([RUN_MODEL, path], [KILN_RUN, path, "--check", "--iter", "1"]):
        if not os.path.exists(cmd[0]):
            pytest.skip(f"{cmd[0]} is not built")
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, (cmd, r.stdout, r.stderr)
        if cmd[0] == RUN_MODEL:  # every case bitwise: the same kernels as the trace's
            errors = [float(line.rsplit(" ", 1)[1]) for line in r.stdout.splitlines() if "relative error" in line]
            assert errors and max(errors) == 0.0, r.stdout


CASES = [(m, how, low) for m in ("attention", "block", "mlp") for how in ("autocast", "O2", "O3")
         for low in ("bfloat16", "float16")]


@pytest.mark.parametrize("model,how,low", CASES)
def test_dump_as_recorded_is_bitwise(tmp_path, model, how, low):
    """optimize_for_inference=False: the recording as it is, the trace's kernels: equal bits, in
    Python (kbk, sink) and in the C runtime."""
    tr, args = _traced(model, how, LOW[low])
    expected = tr(*args)
    assert kiln._C.graph_computes_16bit(tr._last.graph)
    path = _dump(tr, args, str(tmp_path / "m.kiln"), optimize_for_inference=False)
    for backend in ("kbk", "sink"):
        got = kiln.load(path, backend=backend)(*args)
        assert got.dtype == expected.dtype
        assert np.array_equal(_np(got), _np(expected)), backend
    _run_c(path)


@pytest.mark.parametrize("model,how,low", CASES)
def test_dump_for_inference(tmp_path, model, how, low):
    """The inference rewrites keep every dtype (the trace's result's included) and the values: the
    same bits where no rewrite changes a kernel (batch norm folding and the convolution algorithm
    chosen for inference round differently: within float32's rounding there)."""
    tr, args = _traced(model, how, LOW[low])
    expected = _np(tr(*args))
    dtype = tr(*args).dtype
    path = _dump(tr, args, str(tmp_path / "m.kiln"))
    for backend in ("kbk", "sink"):
        got = kiln.load(path, backend=backend)(*args)
        assert got.dtype == dtype, (backend, got.dtype, dtype)
        if model == "block":
            tol = 1e-5 if dtype == kiln.float32 else 2 ** -7  # one bfloat16 / float16 rounding step
            assert np.allclose(_np(got), expected, rtol=tol, atol=tol * np.abs(expected).max()), backend
        else:
            assert np.array_equal(_np(got), expected), backend
    _run_c(path)


@pytest.mark.parametrize("model,how,low", CASES)
def test_dump_io16xc32_keeps_amp_dtypes(tmp_path, model, how, low):
    """enable_io16xc32 on an amp graph: float16 inputs and outputs, every dtype inside as amp chose
    (the positions and rotary angles float32): the file computes what the trace computes on the
    inputs rounded to float16, its float32 outputs rounded to float16."""
    tr, args = _traced(model, how, LOW[low])
    dtype = tr(*args).dtype
    rounded = [a.astype(kiln.float16).astype(kiln.float32) if a.dtype == kiln.float32 else a for a in args]
    expected = tr(*rounded)
    if dtype == kiln.float32:
        expected = expected.astype(kiln.float16)
    path = _dump(tr, args, str(tmp_path / "m.kiln"), enable_io16xc32=True)
    loaded = kiln.load(path)
    assert [dt for _, dt, _ in loaded.inputs] == [kiln.float16 if a.dtype == kiln.float32 else a.dtype for a in args]
    if model == "attention":  # the positions and rotary angles stay float32 inside
        assert "float32" in loaded.graph_str()
    for backend in ("kbk", "sink"):
        got = kiln.load(path, backend=backend)(*args)  # float32 inputs converted by kiln.load
        assert got.dtype == expected.dtype, (backend, got.dtype, expected.dtype)
        if model == "block":
            tol = 2 ** -7
            ref = _np(expected)
            assert np.allclose(_np(got), ref, rtol=tol, atol=tol * np.abs(ref).max()), backend
        else:
            assert np.array_equal(_np(got), _np(expected)), backend
    _run_c(path)


def test_io16xc32_long_sequence(tmp_path):
    """At 512 tokens (rotary angles up to 511 radians, which neither bfloat16 nor float16 holds
    exactly) the amp file is as close to float32 as the amp trace: amp's float32 values stay float32
    in the file (before, enable_io16xc32 made them float16: 0.8% off the trace at 8 tokens)."""
    kiln.manual_seed(0)
    net = models.LlamaAttention(32, 4, 2, rope_theta=500000.0)
    net.set_train(False)
    x = kiln.Tensor(np.random.default_rng(5).standard_normal((1, 512, 32)).astype(np.float32))
    pos = kiln.Tensor(np.arange(512, dtype=np.int64).reshape(1, 512))
    ref = net(x, pos).asnumpy()
    low = kiln.amp.auto_mixed_precision(net, "O2", dtype=kiln.bfloat16)
    tr = kiln.trace(lambda a, p: low(a, p), capture_as_const=True)
    traced = tr(x, pos).asnumpy()
    amp_err = np.abs(traced - ref).max() / np.abs(ref).max()
    path = str(tmp_path / "a.kiln")
    tr.dump(path, enable_io16xc32=True)
    got = _np(kiln.load(path)(x, pos))
    file_err = np.abs(got - ref).max() / np.abs(ref).max()
    assert amp_err < 0.015 and file_err < amp_err + 2 ** -9, (file_err, amp_err)
    assert np.abs(got - traced).max() / np.abs(traced).max() < 2 ** -6  # a few bfloat16 rounding steps


@pytest.mark.parametrize("low", ["bfloat16", "float16"])
def test_ioc16_refused_for_amp_graphs(tmp_path, low):
    tr, args = _traced("attention", "O2", LOW[low])
    with pytest.raises(ValueError, match="enable_ioc16 .*16-bit floats already.*enable_io16xc32"):
        tr.dump(str(tmp_path / "m.kiln"), enable_ioc16=True)


def test_float32_graph_float16_options_unchanged(tmp_path):
    """A float32 graph is not an amp graph: enable_ioc16 still converts every value."""
    net = _mlp()
    tr = kiln.trace(lambda x: net(x), capture_as_const=True)
    tr(X_MLP)
    assert not kiln._C.graph_computes_16bit(tr._last.graph)
    path = str(tmp_path / "m.kiln")
    tr.dump(path, enable_ioc16=True)
    assert "float32" not in kiln.load(path).graph_str()


@pytest.mark.parametrize("low", ["bfloat16", "float16"])
@pytest.mark.parametrize("infer_boost", ["off", "on"])
def test_folding_keeps_dtype_under_jit(low, infer_boost):
    """amp O3 normalizes a 16-bit convolution with float32 parameters: batch_norm folding (the
    inference rewrites: trace.dump, kiln.jit infer_boost) must leave it, or the folded weight
    makes the convolution's result float32. kiln.jit returns eager's dtype and values."""
    net = kiln.amp.auto_mixed_precision(_block(), "O3", dtype=LOW[low])
    net.set_train(False)
    eager = net(X_BLOCK)
    jitted = kiln.jit(lambda x: net(x), capture_mode="trace", jit_level="O1", infer_boost=infer_boost)(X_BLOCK)
    assert jitted.dtype == eager.dtype == LOW[low]
    assert np.array_equal(_np(jitted), _np(eager))


def test_kiln_run_writes_bfloat16_outputs_widened(tmp_path):
    """.npy has no bfloat16: kiln-run --output-dir writes a bfloat16 output (amp O3) as float32,
    exactly, and says so (it refused the output before)."""
    if not os.path.exists(KILN_RUN):
        pytest.skip("build/kiln-run is not built")
    tr, args = _traced("mlp", "O3", kiln.bfloat16)
    expected = tr(*args)
    assert expected.dtype == kiln.bfloat16
    path = str(tmp_path / "m.kiln")
    tr.dump(path, arg_names=["x"], output_names=["y"], optimize_for_inference=False)
    np.save(tmp_path / "x.npy", args[0].asnumpy())
    r = subprocess.run([KILN_RUN, path, "--input", f"x={tmp_path / 'x.npy'}", "--output-dir", str(tmp_path / "out"),
                        "--iter", "1"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "output y is bfloat16" in r.stderr and "as float32" in r.stderr
    got = np.load(tmp_path / "out" / "y.npy")
    assert got.dtype == np.float32 and np.array_equal(got, _np(expected))
