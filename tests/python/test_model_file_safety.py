"""Model files that leave or enter kiln (issue 28): a loaded model does not change when its file is
rewritten, truncated or deleted; kiln-run's --output-dir never writes outside its directory,
whatever the file names its outputs; names in files are UTF-8 text without NUL bytes, checked when
written and when read."""
import io
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

import kiln
from kiln import nn, ops

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KILN_RUN = os.path.join(ROOT, "build", "kiln-run")
PYTHON_DIR = os.path.dirname(os.path.dirname(kiln.__file__))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_deploy import fix_checksum  # noqa: E402  (the spec's checksum, recomputed)


class Net(nn.Cell):
    def __init__(self, seed):
        super().__init__()
        kiln.manual_seed(seed)
        self.fc1 = nn.Dense(6, 32)
        self.fc2 = nn.Dense(32, 3)

    def construct(self, x):
        return self.fc2(ops.tanh(self.fc1(x)))


X = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)


def dump_net(path, seed, **options):
    net = Net(seed)
    t = kiln.trace(net, capture_as_const=True)
    want = t(kiln.tensor(X)).asnumpy()
    t.dump(path, **options)
    return want


# ---- 1. a loaded model is immutable ----------------------------------------------------------------

def test_loaded_model_ignores_the_file_rewritten_in_place(tmp_path):
    path = str(tmp_path / "m.kiln")
    want = dump_net(path, seed=0)
    g = kiln.load(path)
    np.testing.assert_allclose(g(kiln.tensor(X)).asnumpy(), want, rtol=1e-5, atol=1e-6)
    other = dump_net(path, seed=1)  # the training script saves its latest weights to the same path
    assert np.abs(other - want).max() > 1e-2  # the new file computes something else
    np.testing.assert_array_equal(g(kiln.tensor(X)).asnumpy(), g(kiln.tensor(X)).asnumpy())
    np.testing.assert_allclose(g(kiln.tensor(X)).asnumpy(), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(kiln.load(path)(kiln.tensor(X)).asnumpy(), other, rtol=1e-5, atol=1e-6)


# truncating (SIGBUS with a shared mapping) and deleting run in a child, so a crash fails the test
CHILD = r"""
import os, sys
import numpy as np
import kiln
path, how = sys.argv[1], sys.argv[2]
x = kiln.tensor(np.load(sys.argv[3]))
g = kiln.load(path)
before = g(x).asnumpy()
if how == "truncate":
    with open(path, "r+b") as f:
        f.truncate(100)
elif how == "empty":
    open(path, "wb").close()
elif how == "delete":
    os.unlink(path)
elif how == "scribble":
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.write(b"\xff" * size)
after = g(x).asnumpy()
assert np.array_equal(before, after), np.abs(before - after).max()
print("same")
"""


@pytest.mark.parametrize("how", ["truncate", "empty", "delete", "scribble"])
def test_loaded_model_survives_its_file_truncated_or_deleted(tmp_path, how):
    path = str(tmp_path / "m.kiln")
    want = dump_net(path, seed=0)
    np.save(tmp_path / "x.npy", X)
    r = subprocess.run([sys.executable, "-c", CHILD, path, how, str(tmp_path / "x.npy")], capture_output=True,
                       text=True, env={**os.environ, "PYTHONPATH": PYTHON_DIR}, timeout=120)
    assert r.returncode == 0 and "same" in r.stdout, (r.returncode, r.stderr[-2000:])
    del want


def test_a_truncated_file_on_disk_is_a_clear_error(tmp_path):
    path = tmp_path / "m.kiln"
    dump_net(str(path), seed=0)
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])
    with pytest.raises(ValueError, match="m.kiln: kiln file: truncated"):
        kiln.load(str(path))


# ---- 2. kiln-run --output-dir stays in its directory ---------------------------------------------

needs_kiln_run = pytest.mark.skipif(not os.path.exists(KILN_RUN), reason="build/kiln-run is not built")


def two_outputs(x):
    return ops.tanh(x), x * 2.0


@needs_kiln_run
@pytest.mark.parametrize("names, files", [
    (["../escape", "/tmp/kiln_abs_escape"], ["%2E.%2Fescape.npy", "%2Ftmp%2Fkiln_abs_escape.npy"]),
    (["a/b", "a%2Fb"], ["a%2Fb.npy", "a%252Fb.npy"]),  # never two names on one file
    ([".hidden", ".."], ["%2Ehidden.npy", "%2E..npy"]),
    (["plain_name-1.x", "résultat"], ["plain_name-1.x.npy", "résultat.npy"]),
])
def test_kiln_run_output_names_never_leave_the_output_dir(tmp_path, names, files):
    x = kiln.tensor(X)
    t = kiln.trace(two_outputs, capture_as_const=True)
    want = [o.asnumpy() for o in t(x)]
    work = tmp_path / "work"
    work.mkdir()
    model = work / "m.kiln"
    t.dump(str(model), output_names=names, arg_names=["x"])
    np.save(work / "x.npy", X)
    out = work / "out"
    before = set(os.listdir(tmp_path)), set(os.listdir(work))
    r = subprocess.run([KILN_RUN, str(model), "--input", f"x={work / 'x.npy'}", "--output-dir", str(out)],
                       capture_output=True, text=True, cwd=str(work))
    assert r.returncode == 0, r.stderr
    assert (set(os.listdir(tmp_path)), set(os.listdir(work)) - {"out"}) == before
    assert not os.path.exists("/tmp/kiln_abs_escape.npy")
    assert sorted(os.listdir(out)) == sorted(files)
    for f, w in zip(files, want):
        np.testing.assert_allclose(np.load(out / f), w, rtol=1e-6)


@needs_kiln_run
def test_kiln_run_does_not_write_through_a_link_in_the_output_dir(tmp_path):
    t = kiln.trace(ops.tanh, capture_as_const=True)
    t(kiln.tensor(X))
    model = tmp_path / "m.kiln"
    t.dump(str(model), output_names=["y"])
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    os.symlink(victim, out / "y.npy")
    r = subprocess.run([KILN_RUN, str(model), "--output-dir", str(out)], capture_output=True, text=True)
    assert r.returncode == 2 and "can't create" in r.stderr and "y.npy" in r.stderr
    assert victim.read_text() == "keep"


# ---- 5. names are UTF-8 text without NUL bytes ----------------------------------------------------

@pytest.mark.parametrize("option, names", [
    ("arg_names", ["a\x00b"]),
    ("output_names", ["y\x00"]),
    ("arg_names", ["a\udc80"]),
    ("output_names", ["\ud800"]),
])
def test_dump_refuses_names_a_file_cannot_hold(option, names):
    t = kiln.trace(ops.tanh, capture_as_const=True)
    t(kiln.tensor(X))
    with pytest.raises(ValueError, match=f"trace.dump {option}: name 0 .*(NUL character|not UTF-8)"):
        t.dump(io.BytesIO(), **{option: names})


def test_dump_refuses_a_graph_name_with_a_nul():
    t = kiln.trace(ops.tanh, capture_as_const=True)
    t(kiln.tensor(X))
    with pytest.raises(ValueError, match="graph_name.*NUL character"):
        t.dump(io.BytesIO(), graph_name="g\x00h")


def test_dump_refuses_an_input_and_an_output_of_one_name():
    t = kiln.trace(ops.tanh, capture_as_const=True)
    t(kiln.tensor(X))
    with pytest.raises(ValueError, match="an input and an output are both named 'v'"):
        t.dump(io.BytesIO(), arg_names=["v"], output_names=["v"])


def with_name_bytes(data, old, new):
    """data with the name `old` (bytes, its length prefix in front) replaced by `new` of the same length."""
    assert len(old) == len(new)
    at = data.index(struct.pack("<I", len(old)) + old)
    return fix_checksum(data[:at + 4] + new + data[at + 4 + len(old):])


@pytest.mark.parametrize("bad", [b"\xff\xfe", b"\xc0\xaf", b"\xed\xa0", b"a\x80"])
@pytest.mark.parametrize("which", ["input", "output", "graph"])
def test_loader_refuses_names_that_are_not_utf8(bad, which, tmp_path):
    t = kiln.trace(ops.tanh, capture_as_const=True)
    t(kiln.tensor(X))
    buf = io.BytesIO()
    t.dump(buf, arg_names=["in"], output_names=["ou"], graph_name="gr")
    old = {"input": b"in", "output": b"ou", "graph": b"gr"}[which]
    data = with_name_bytes(buf.getvalue(), old, bad)
    with pytest.raises(ValueError, match="kiln file: .* is not UTF-8 text"):
        kiln.load(data)
    path = tmp_path / "m.kiln"
    path.write_bytes(data)
    with pytest.raises(ValueError, match="kiln file: .* is not UTF-8 text"):
        kiln.load(str(path))
    if os.path.exists(KILN_RUN):
        r = subprocess.run([KILN_RUN, str(path), "--model-info"], capture_output=True, text=True)
        assert r.returncode == 2 and "not UTF-8 text" in r.stderr


def test_utf8_names_round_trip():
    t = kiln.trace(ops.tanh, capture_as_const=True)
    want = t(kiln.tensor(X)).asnumpy()
    buf = io.BytesIO()
    t.dump(buf, arg_names=["entrée"], output_names=["出力"], graph_name="グラフ")
    g = kiln.load(buf.getvalue())
    assert [n for n, _, _ in g.inputs] == ["entrée"] and [n for n, _, _ in g.outputs] == ["出力"]
    np.testing.assert_allclose(g(kiln.tensor(X)).asnumpy(), want, rtol=1e-6)
