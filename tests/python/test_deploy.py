"""trace.dump / kiln.load / kiln.export / nn.GraphCell, kiln-run and the model file's checks
against hostile files (docs/model_format.md)."""
import io
import json
import os
import re
import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest

import kiln
from kiln import models, nn, ops
from kiln._optable import OP
from kiln.ops._util import apply

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KILN_RUN = os.path.join(ROOT, "build", "kiln-run")
sys.path.insert(0, os.path.join(ROOT, "tests", "fuzz"))
from make_model_corpus import MLP, branchy  # noqa: E402  (the corpus's models)


def arr(*shape, seed=0):
    return kiln.tensor(np.random.default_rng(seed + len(shape)).standard_normal(shape).astype(np.float32))


class CNN(nn.Cell):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, pad_mode="pad", padding=1)
        self.bn = nn.BatchNorm2d(4)

    def construct(self, x):
        return ops.relu(self.bn(self.conv(x))).mean(axis=(2, 3))


def basic_block():
    kiln.manual_seed(0)
    b = models.BasicBlock(8)
    b.set_train(False)
    return b


def traced(fn, *inputs, **kwargs):
    t = kiln.trace(fn, capture_as_const=True, **kwargs)
    return t, t(*inputs)


def dumped(t, **options):
    buf = io.BytesIO()
    info = t.dump(buf, **options)
    return buf.getvalue(), info


@pytest.mark.parametrize("make, inputs", [
    (lambda: models.simple_function, lambda: (arr(2, 3), arr(2, 3, seed=1), arr(2, 3, seed=2))),
    (lambda: MLP(), lambda: (arr(4, 6),)),
    (lambda: CNN().set_train(False), lambda: (arr(2, 3, 8, 8),)),
    (lambda: branchy, lambda: (arr(3), arr(3, seed=5))),
    (basic_block, lambda: (arr(1, 8, 10, 10),)),
])
def test_round_trip_bitwise_without_rewrites(make, inputs):
    fn, xs = make(), inputs()
    t, want = traced(fn, *xs, opt_level=0)
    data, info = dumped(t, optimize_for_inference=False)
    g = kiln.load(data)
    got = g(*xs)
    np.testing.assert_array_equal(got.asnumpy(), want.asnumpy())
    assert info.tot_bytes == len(data)
    data2, _ = dumped(t, optimize_for_inference=False)
    assert data2 == data  # deterministic


@pytest.mark.parametrize("backend", ["kbk", "sink"])
def test_round_trip_with_inference_rewrites(backend):
    blk = basic_block()
    x = arr(1, 8, 10, 10)
    t, want = traced(blk, x)
    for options in ({}, {"enable_fuse_conv_bias_nonlinearity": True}, {"enable_fuse_conv_bias_with_z": True},
                    {"enable_nchw88": True}):
        data, _ = dumped(t, **options)
        got = kiln.load(data, backend=backend)(x)
        np.testing.assert_allclose(got.asnumpy(), want.asnumpy(), rtol=1e-4, atol=1e-5)
        assert dumped(t, **options)[0] == data


def top_level_ops(data):
    """The ops of a file's graph, in order (not those inside fused groups' subgraphs)."""
    text = kiln.load(data).graph_str().split("\nsubgraph")[0]
    rhs = [line.partition("= ")[2] for line in text.splitlines()[1:]]
    return [r.split("(")[0] for r in rhs if "(" in r and not r.startswith("constant(")]  # not filled constants


def test_conv_fusion_options_leave_the_block_two_convolutions():
    blk = basic_block()
    t, _ = traced(blk, arr(1, 8, 10, 10))
    plain = top_level_ops(dumped(t)[0])
    fused = top_level_ops(dumped(t, enable_fuse_conv_bias_nonlinearity=True)[0])
    with_z = top_level_ops(dumped(t, enable_fuse_conv_bias_with_z=True)[0])
    assert plain == ["conv2d_fused", "relu", "conv2d_fused", "fused"]  # the residual add and relu: one fused group
    assert fused == ["conv2d_fused", "conv2d_fused", "fused"]
    assert with_z == ["conv2d_fused", "conv2d_fused"]
    # at the seed's channel count too (the folded weights are larger than the jit's folding limit)
    kiln.manual_seed(0)
    wide = models.BasicBlock(128)
    wide.set_train(False)
    x = arr(1, 128, 4, 4)
    t, want = traced(wide, x)
    data = dumped(t, enable_fuse_conv_bias_with_z=True)[0]
    assert top_level_ops(data) == ["conv2d_fused", "conv2d_fused"]
    np.testing.assert_allclose(kiln.load(data)(x).asnumpy(), want.asnumpy(), rtol=1e-4, atol=1e-5)


def test_megengine_layouts_for_other_hardware_are_accepted(monkeypatch):
    """enable_nchw44(_dot) become kiln's blocked channel layout for this CPU (the file equals
    enable_nchw88's); the GPU layouts are recorded in the metadata with the graph left in NCHW.
    Each warns once, naming the option; every file computes what the trace does."""
    from kiln.jit import deploy

    monkeypatch.setattr(deploy, "_warned_layouts", set())
    blk = basic_block()
    x = arr(1, 8, 10, 10)
    t, want = traced(blk, x)
    plain, blocked = dumped(t)[0], dumped(t, enable_nchw88=True)[0]
    for option in ("enable_nchw44", "enable_nchw44_dot"):
        with pytest.warns(RuntimeWarning, match=f"{option}: .*kiln applies its own blocked channel layout"):
            data = dumped(t, **{option: True})[0]
        assert top_level_ops(data) == top_level_ops(blocked)
        np.testing.assert_allclose(kiln.load(data)(x).asnumpy(), want.asnumpy(), rtol=1e-4, atol=1e-5)
    for option in ("enable_nchw4", "enable_nchw32", "enable_chwn4", "enable_hwcd4"):
        with pytest.warns(RuntimeWarning, match=f"{option}: .*recorded in the file's metadata"):
            data = dumped(t, **{option: True})[0]
        g = kiln.load(data)
        assert g.metadata["options_not_applied"] == [option]
        assert top_level_ops(data) == top_level_ops(plain)
        np.testing.assert_allclose(g(x).asnumpy(), want.asnumpy(), rtol=1e-4, atol=1e-5)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per option and process
        dumped(t, enable_nchw32=True)


def test_layout_and_option_errors():
    t, _ = traced(models.simple_function, arr(2), arr(2), arr(2))
    with pytest.raises(ValueError, match="at most one layout"):
        t.dump(io.BytesIO(), enable_nchw88=True, enable_hwcd4=True)
    with pytest.raises(TypeError, match="enable_nchw99"):
        t.dump(io.BytesIO(), enable_nchw99=True)
    with pytest.raises(ValueError, match="need optimize_for_inference=True"):
        t.dump(io.BytesIO(), optimize_for_inference=False, enable_io16xc32=True)
    with pytest.raises(ValueError, match="capture_as_const"):
        u = kiln.trace(models.simple_function)
        u(arr(2), arr(2), arr(2))
        u.dump(io.BytesIO())
    with pytest.raises(ValueError, match="append"):
        t.dump(io.BytesIO(), append=True)


def rel_l2(got, want):
    got, want = got.astype(np.float64), want.astype(np.float64)
    return np.linalg.norm(got - want) / np.linalg.norm(want)


@pytest.mark.parametrize("option", ["enable_io16xc32", "enable_ioc16"])
def test_float16_storage_halves_parameters_and_activations(option, tmp_path):
    blk = basic_block()
    x = arr(1, 8, 10, 10)
    t, want = traced(blk, x)
    # ioc16 rounds every op's result, so the residual add and the activations stay ops of their own
    fusion = {"enable_fuse_conv_bias_with_z": True} if option == "enable_io16xc32" else {}
    f32, info32 = dumped(t, **fusion)
    f16, info16 = dumped(t, input_data=x, **fusion, **{option: True})
    if option == "enable_ioc16":
        assert top_level_ops(f16) == ["conv2d_fused", "relu", "conv2d_fused", "add", "relu"]
    g32, g16 = kiln.load(f32), kiln.load(f16)
    assert info16.tensor_value_bytes <= 0.55 * info32.tensor_value_bytes
    assert g16._exe.arena_bytes <= 0.55 * g32._exe.arena_bytes
    assert [dt for _, dt, _ in g16.inputs + g16.outputs] == [kiln.float16, kiln.float16]
    got = g16(x)  # float32 arguments are converted
    assert got.dtype is kiln.float16
    assert rel_l2(got.asnumpy(), want.asnumpy()) <= 1e-2
    (ins, outs), = g16.test_cases()
    np.testing.assert_array_equal(ins[0].asnumpy(), x.asnumpy().astype(np.float16))
    assert outs[0].dtype is kiln.float16
    # the C runtime runs the float16 file and its embedded case too
    model = tmp_path / "f16.kiln"
    model.write_bytes(f16)
    np.save(tmp_path / "x.npy", x.asnumpy().astype(np.float16))
    r = subprocess.run([KILN_RUN, str(model), "--check", "--iter", "1", "--threads", "1", "--input",
                        f"x={tmp_path / 'x.npy'}", "--output-dir", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    out = np.load(tmp_path / "output.npy")
    assert out.dtype == np.float16 and rel_l2(out, want.asnumpy()) <= 1e-2


@pytest.mark.parametrize("option", ["enable_io16xc32", "enable_ioc16"])
def test_float16_storage_of_the_attention_block(option):
    kiln.manual_seed(0)
    att = models.LlamaAttention(hidden_size=64, num_heads=4, num_kv_heads=2)
    att.set_train(False)
    x, pos = arr(1, 8, 64), kiln.tensor(np.arange(8, dtype=np.int64).reshape(1, 8))
    t, want = traced(att, x, pos)
    f32, info32 = dumped(t)
    f16, info16 = dumped(t, **{option: True})
    g16 = kiln.load(f16)
    assert info16.tensor_value_bytes <= 0.55 * info32.tensor_value_bytes
    assert g16._exe.arena_bytes <= 0.55 * kiln.load(f32)._exe.arena_bytes
    assert rel_l2(g16(x, pos).asnumpy(), want.asnumpy()) <= 1e-2  # rope's theta 500000 is folded before narrowing


class Head(nn.Cell):
    """matmul, bias, relu, scaling, a residual add and softmax as ops of their own"""

    def __init__(self):
        super().__init__()
        rng = np.random.default_rng(7)
        self.w = nn.Parameter(kiln.tensor(rng.standard_normal((8, 8)).astype(np.float32) * 0.5))
        self.b = nn.Parameter(kiln.tensor(rng.standard_normal(8).astype(np.float32)))

    def construct(self, x):
        h = ops.relu(ops.matmul(x, self.w) + self.b) * 0.3 + x
        return h, ops.softmax(h, axis=-1)


def test_ioc16_rounds_every_op_as_numpy_float16_does():
    head = Head()
    x = arr(16, 8)
    t, _ = traced(head, x)
    got_h, got = (v.asnumpy() for v in kiln.load(dumped(t, enable_ioc16=True)[0])(x))
    assert got.dtype == np.float16
    # NumPy's float16 arithmetic: each op computes in float32 and rounds its result to float16
    f16, f32 = np.float16, np.float32
    x16, w16, b16 = (v.asnumpy().astype(f16) for v in (x, head.w, head.b))
    mm = (x16.astype(f32) @ w16.astype(f32)).astype(f16)
    h = np.maximum(mm + b16, f16(0)) * f16(0.3) + x16
    e = np.exp(h.astype(f32) - h.astype(f32).max(axis=-1, keepdims=True))
    want = (e / e.sum(axis=-1, keepdims=True)).astype(f16)
    # the same ops in float32, rounded once at the end, differ here: the comparison tells them apart
    once = (np.maximum(x16.astype(f32) @ w16.astype(f32) + b16, 0) * f32(0.3) + x16).astype(f16)
    assert (once != h).sum() >= 8
    # the GEMM may sum in another order: a float32 difference can move a result by one float16 step
    np.testing.assert_array_max_ulp(got_h, h, maxulp=1)
    assert (got_h != h).sum() <= 2
    np.testing.assert_array_max_ulp(got, want, maxulp=2)


def test_files_hold_no_absolute_source_paths(tmp_path):
    head = Head()
    t, _ = traced(head, arr(4, 8))
    data, _ = dumped(t)
    assert ROOT.encode() not in data
    here = os.path.basename(__file__)
    locs = set(re.findall(r"# (\S+):\d+", kiln.load(data).graph_str()))
    assert locs == {here}  # one source file: its base name
    # a function in another directory: base names too
    sub = tmp_path / "pkg"
    sub.mkdir()
    (sub / "helper.py").write_text("from kiln import ops\n\ndef scaled(h):\n    return ops.tanh(h) * 2.0\n")
    sys.path.insert(0, str(tmp_path))
    try:
        from pkg.helper import scaled
    finally:
        sys.path.remove(str(tmp_path))
    t, _ = traced(lambda x: scaled(head(x)[0]), arr(4, 8))
    data, _ = dumped(t, optimize_for_inference=False)
    assert str(tmp_path).encode() not in data and ROOT.encode() not in data
    locs = set(re.findall(r"# (\S+):\d+", kiln.load(data).graph_str()))
    assert locs == {here, "helper.py"}


def test_ioc16_option_errors():
    t, _ = traced(basic_block(), arr(1, 8, 10, 10))
    with pytest.raises(ValueError, match="enable_ioc16 rounds every op's result.*enable_fuse_conv_bias_with_z"):
        t.dump(io.BytesIO(), enable_ioc16=True, enable_fuse_conv_bias_with_z=True)
    with pytest.raises(ValueError, match="one of enable_io16xc32 and enable_ioc16"):
        t.dump(io.BytesIO(), enable_ioc16=True, enable_io16xc32=True)


def test_names_metadata_user_info_and_cases(tmp_path):
    t, want = traced(MLP(), arr(4, 6))
    path = tmp_path / "mlp.kiln"
    info = t.dump(str(path), output_names=["logits"], user_info={"owner": "kiln", "v": [1, 2]},
                  input_data=[arr(4, 6, seed=3), {"x": arr(4, 6, seed=4)}], strip_info_file=str(tmp_path / "s.json"))
    assert info.inputs == ["x"] and info.outputs == ["logits"]
    g = nn.GraphCell(kiln.load(str(path)))
    assert [n for n, _, _ in g.graph.inputs] == ["x"]
    assert g.graph.user_info == {"owner": "kiln", "v": [1, 2]}
    assert g.graph.metadata["optimize_for_inference"] is True
    cases = g.graph.test_cases()
    assert len(cases) == 2
    for ins, outs in cases:
        np.testing.assert_allclose(g(*ins).asnumpy(), outs[0].asnumpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(cases[0][1][0].asnumpy(), t(arr(4, 6, seed=3)).asnumpy(), rtol=1e-6)
    strip = json.loads((tmp_path / "s.json").read_text())
    assert strip["dtype_types"] == ["float32"] and "conv2d" not in strip["opr_types"]
    assert set(top_level_ops(path.read_bytes())) <= set(strip["opr_types"])
    with pytest.raises(ValueError, match="input 0 is float32\\[3, 6\\]"):
        t.dump(io.BytesIO(), input_data=arr(3, 6))


def test_export(tmp_path):
    mlp = MLP()
    x = arr(2, 6)
    kiln.export(mlp, x, file_name=str(tmp_path / "net"))
    np.testing.assert_allclose(kiln.load(str(tmp_path / "net.kiln"))(x).asnumpy(), mlp(x).asnumpy(), rtol=1e-5,
                               atol=1e-6)
    with pytest.raises(ValueError, match="'KILN' or 'ONNX'"):
        kiln.export(mlp, x, file_name=str(tmp_path / "net.mindir"), file_format="MINDIR")


# ---- hostile files ---------------------------------------------------------------------------

def good_file():
    t, _ = traced(MLP(), arr(2, 6))
    return dumped(t, input_data=arr(2, 6))[0]


def fix_checksum(b):
    """Recomputes the checksum (docs/model_format.md) so a test reaches the checks behind it."""
    b = bytearray(b)
    b[56:64] = bytes(8)
    n = len(b)
    words = np.frombuffer(bytes(b) + bytes(-n % 8), dtype="<u8")
    P, M = 0x100000001b3, (1 << 64) - 1
    h = [0xcbf29ce484222325 ^ k for k in range(4)]
    for i, w in enumerate(words.tolist()):
        h[i & 3] = ((h[i & 3] ^ w) * P) & M
    r = n
    for k in range(4):
        r = ((r ^ h[k]) * P) & M
    b[56:64] = struct.pack("<Q", r)
    return bytes(b)


def test_checksum_matches_the_spec():
    data = good_file()
    assert fix_checksum(data) == data


def test_bad_files_give_clear_errors():
    data = good_file()
    meta_size = struct.unpack_from("<Q", data, 32)[0]
    data_offset = struct.unpack_from("<Q", data, 40)[0]
    for cut in sorted({0, 10, 63, 64, 64 + meta_size // 2, 64 + meta_size, data_offset, len(data) - 1}):
        with pytest.raises(ValueError, match="kiln file: .*(truncated|header says)"):
            kiln.load(data[:cut])
    with pytest.raises(ValueError, match="wrong magic"):
        kiln.load(b"XILNMDL\0" + data[8:])
    with pytest.raises(ValueError, match="format version 7"):
        kiln.load(data[:8] + struct.pack("<I", 7) + data[12:])
    rng = np.random.default_rng(0)
    for pos in rng.integers(64, len(data), 20):
        flipped = bytearray(data)
        flipped[pos] ^= 0x10
        with pytest.raises(ValueError, match="checksum mismatch"):
            kiln.load(bytes(flipped))
    # lying sizes behind a valid checksum
    lie = bytearray(data)
    struct.pack_into("<Q", lie, 32, meta_size + 1000)
    with pytest.raises(ValueError, match="metadata|data section"):
        kiln.load(fix_checksum(lie))
    # the first string (the producer) claims 2^31 bytes
    lie = bytearray(data)
    struct.pack_into("<I", lie, 64, 1 << 31)
    with pytest.raises(ValueError, match="the producer .* is 2147483648, at most"):
        kiln.load(fix_checksum(lie))
    # every byte of the metadata flipped in turn: an error or a file that still loads, never a crash
    for pos in range(64, 64 + meta_size, 3):
        flipped = bytearray(data)
        flipped[pos] ^= 0xff
        try:
            kiln.load(fix_checksum(flipped))
        except (ValueError, MemoryError):
            pass


# ---- kiln-run ----------------------------------------------------------------------------------

needs_kiln_run = pytest.mark.skipif(not os.path.exists(KILN_RUN), reason="build/kiln-run is not built")


@needs_kiln_run
def test_kiln_run_check_inputs_and_outputs(tmp_path):
    blk = basic_block()
    x = arr(1, 8, 10, 10)
    t, want = traced(blk, x)
    model = tmp_path / "bb.kiln"
    t.dump(str(model), input_data=[x], enable_fuse_conv_bias_with_z=True)
    np.save(tmp_path / "x.npy", x.asnumpy())
    out = subprocess.run([KILN_RUN, str(model), "--check", "--iter", "3", "--warmup", "1", "--threads", "1",
                          "--input", f"x={tmp_path / 'x.npy'}", "--output-dir", str(tmp_path / "out"), "--model-info"],
                         capture_output=True, text=True, check=True).stdout
    assert "check: 1 case(s)" in out and ": ok" in out
    assert out.count("iter ") == 3 and "median" in out
    assert "input 0: x float32[1, 8, 10, 10]" in out
    np.testing.assert_allclose(np.load(tmp_path / "out" / "output.npy"), want.asnumpy(), rtol=1e-4, atol=1e-5)
    # a wrong expectation: exit 1 naming the worst error
    tol = subprocess.run([KILN_RUN, str(model), "--check", "--iter", "0", "--tolerance", "0"], capture_output=True,
                         text=True)
    assert tol.returncode == (1 if "relative error 0 " not in tol.stdout else 0)
    bad = subprocess.run([KILN_RUN, str(model), "--input", "nope=x.npy"], capture_output=True, text=True)
    assert bad.returncode == 2 and "no input named 'nope'" in bad.stderr
    corrupt = tmp_path / "corrupt.kiln"
    corrupt.write_bytes(model.read_bytes()[:100])
    bad = subprocess.run([KILN_RUN, str(corrupt)], capture_output=True, text=True)
    assert bad.returncode == 2 and "truncated" in bad.stderr


@needs_kiln_run
def test_kiln_run_check_fails_on_a_mismatch(tmp_path):
    t, _ = traced(models.simple_function, arr(2, 3), arr(2, 3), arr(2, 3))
    model = tmp_path / "f.kiln"
    t.dump(str(model), input_data=[(arr(2, 3), arr(2, 3), arr(2, 3))])
    data = bytearray(model.read_bytes())
    # the expected output is the last tensor of the data section (24 bytes at a multiple of 64, then zero
    # padding to the record's multiple of 64): change it
    struct.pack_into("<f", data, len(data) - 64, 1234.5)
    model.write_bytes(fix_checksum(data))
    r = subprocess.run([KILN_RUN, str(model), "--check", "--iter", "0"], capture_output=True, text=True)
    assert r.returncode == 1 and "MISMATCH" in r.stdout


@needs_kiln_run
def test_kiln_run_profile_writes_a_chrome_trace(tmp_path):
    t, _ = traced(models.simple_function, arr(2, 3), arr(2, 3), arr(2, 3))
    model = tmp_path / "f.kiln"
    t.dump(str(model), optimize_for_inference=False)
    r = subprocess.run([KILN_RUN, str(model), "--iter", "3", "--warmup", "1", "--profile", str(tmp_path / "p.json")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    events = json.loads((tmp_path / "p.json").read_text())["traceEvents"]
    kernels = [e for e in events if e["ph"] == "X" and e["cat"] == "kbk"]
    assert sorted({e["name"] for e in kernels}) == ["add", "mul"]
    assert len(kernels) == 2 * 4  # two nodes, four runs (one warm-up)
    assert all(e["dur"] >= 0 and e["args"]["inputs"] for e in kernels)
    assert any(e["ph"] == "X" and e["cat"] == "compile" and e["name"] == "plan" for e in events)
    assert any(e["ph"] == "C" and e["name"] == "memory" for e in events)
    bad = subprocess.run([KILN_RUN, str(model), "--iter", "1", "--profile", str(tmp_path / "no" / "p.json")],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "--profile" in bad.stderr


# ---- ONNX export (runs where onnx and onnxruntime are installed) ----------------------------------

def _attention():
    kiln.manual_seed(0)
    a = models.LlamaAttention(hidden_size=64, num_heads=4, num_kv_heads=2)
    a.set_train(False)
    return a, (arr(1, 8, 64), kiln.tensor(np.arange(8, dtype=np.int64).reshape(1, 8)))


class PoolNet(nn.Cell):
    """pooling, gelu, clamp, comparisons and where, log_softmax, argmax"""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, pad_mode="pad", padding=1)
        self.max = nn.MaxPool2d(2, 2)
        self.avg = nn.AvgPool2d(2, 2)

    def construct(self, x):
        h = self.avg(self.max(ops.gelu(self.conv(x))))
        h = ops.where(h > 0.1, ops.clamp(h, -1.0, 0.5), ops.rsqrt(h * h + 1.0)).reshape(2, -1)
        return ops.log_softmax(h, axis=-1), h.argmax(axis=-1), h.var(axis=-1), h.std(axis=-1)


class Encoder(nn.Cell):
    """embedding lookup, layer and RMS norms, erf gelu"""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 8)
        self.ln = nn.LayerNorm((8,))
        self.rms = nn.RMSNorm(8)
        self.fc = nn.Dense(8, 8)

    def construct(self, ids):
        h = self.ln(self.emb(ids))
        return self.rms(ops.gelu(self.fc(h)) + h)


def fused_attention(q, k, v):
    """the attention op itself, query heads grouped over kv heads (kiln.ops' function runs the
    unfused ops at these sizes)"""
    return apply(OP.attention, (q, k, v), (), (0.35,))[0]


def looped(x):
    return ops.while_loop(lambda v: v.sum() > 1.0, lambda v: v * 0.5 + 0.01, (x,))[0] * 2


@pytest.mark.parametrize("make", [
    lambda: (MLP(), (arr(2, 6),)),
    lambda: (CNN().set_train(False), (arr(2, 3, 8, 8),)),
    lambda: (basic_block(), (arr(1, 8, 10, 10),)),
    _attention,
    lambda: (fused_attention, (arr(1, 4, 5, 8), arr(1, 2, 7, 8, seed=1), arr(1, 2, 7, 6, seed=2))),
    lambda: (PoolNet(), (arr(2, 3, 8, 8),)),
    lambda: (Encoder(), (kiln.tensor(np.array([[1, 4, 9], [0, 2, 2]], dtype=np.int64)),)),
    lambda: (branchy, (arr(3), arr(3, seed=5))),  # if: both branches
    lambda: (branchy, (-abs(arr(3)), arr(3, seed=5))),
    lambda: (looped, (abs(arr(4)) + 1,)),  # while: several iterations
])
def test_onnx_export_matches_onnxruntime(make, tmp_path):
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    net, xs = make()
    path = str(tmp_path / "net")
    kiln.export(net, *xs, file_name=path, file_format="ONNX")
    session = ort.InferenceSession(path + ".onnx", providers=["CPUExecutionProvider"])
    got = session.run(None, {i.name: x.asnumpy() for i, x in zip(session.get_inputs(), xs)})
    want = net(*xs)
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w.asnumpy(), rtol=1e-4, atol=1e-5)


def test_onnx_export_names_an_op_without_an_onnx_form(tmp_path):
    pytest.importorskip("onnx")
    from kiln.jit.onnx_export import OnnxExportError

    def scatter(x, idx, src):
        return ops.scatter_add(x, 0, idx, src)

    idx = kiln.tensor(np.array([[0, 1, 0]], dtype=np.int64))
    with pytest.raises(OnnxExportError, match="the op 'scatter_add_elements' has no ONNX form"):
        kiln.export(scatter, arr(2, 3), idx, arr(1, 3), file_name=str(tmp_path / "s.onnx"), file_format="ONNX")
