"""kiln.gemm_select: every float32 GEMM runs the provider (OpenBLAS or oneDNN) chosen for its
shape class; the choice is measured once per machine and cached in a file read as a stranger's
input; set_deterministic(True) pins OpenBLAS; eager and compiled calls of one shape agree bit for
bit whatever the table; KILN_GEMM_PROVIDER / KILN_GEMM_CALIBRATION / OPENBLAS_CORETYPE act."""
import copy
import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

import kiln
from kiln import _gemm_cache, gemm_select

import conformance
from conftest import python_command

PROVIDERS = gemm_select.providers()
CLASSES = gemm_select.classes()


@pytest.fixture(autouse=True)
def restore_table():
    before = gemm_select.table()
    yield
    for cls, p in before.items():
        gemm_select.set_provider(cls, p)
    kiln.set_deterministic(False)


def use_everywhere(provider):
    for cls in CLASSES:
        gemm_select.set_provider(cls, provider)


def counted(fn):
    """(fn()'s result, {provider: GEMMs it ran})"""
    before = kiln._C.gemm_calls()
    out = fn()
    after = kiln._C.gemm_calls()
    return out, {p: after[p] - before[p] for p in PROVIDERS}


# ---- shape classes -------------------------------------------------------------------------------


def test_each_calibration_shape_is_of_its_class():
    assert set(gemm_select.SHAPES) == set(CLASSES)
    for cls, (m, n, k) in gemm_select.SHAPES.items():
        assert gemm_select.class_of(m, n, k) == cls


@pytest.mark.parametrize("mnk,cls", [((63, 64, 64), "small"), ((64, 64, 64), "square"), ((16, 512, 512), "small_m"),
                                     ((17, 512, 512), "wide"), ((512, 16, 512), "small_n"),
                                     ((100, 100, 400), "deep"), ((400, 100, 100), "tall"), ((100, 400, 100), "wide"),
                                     ((300, 200, 100), "square"), ((0, 5, 5), "small")])
def test_class_boundaries(mnk, cls):
    assert gemm_select.class_of(*mnk) == cls


def test_bad_names_raise():
    with pytest.raises(ValueError, match="unknown GEMM provider 'mkl'"):
        gemm_select.set_provider("square", "mkl")
    with pytest.raises(ValueError, match="unknown GEMM shape class 'huge'"):
        gemm_select.set_provider("huge", "onednn")
    with pytest.raises(ValueError):
        gemm_select.class_of(-1, 2, 3)


# ---- every provider against NumPy ------------------------------------------------------------------

ODD = (1, 3, 17, 129)


def _operands(rng, m, n, k, layout):
    """(a as kiln passes it, b, float64 a, float64 b): contiguous, transposed views or strided views."""
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    if layout == "contiguous":
        ka, kb = kiln.tensor(a), kiln.tensor(b)
    elif layout == "transposed":  # a.T of a (k, m) tensor: BLAS's Trans, no copy
        ka, kb = kiln.tensor(np.ascontiguousarray(a.T)).T, kiln.tensor(np.ascontiguousarray(b.T)).T
    else:  # rows of a wider tensor (leading dimension > columns) and a column-strided one
        wa = np.zeros((m, k + 5), np.float32)
        wa[:, 2:k + 2] = a
        wb = np.zeros((k, 2 * n), np.float32)
        wb[:, ::2] = b
        ka, kb = kiln.tensor(wa)[:, 2:k + 2], kiln.tensor(wb)[:, ::2]
    return ka, kb, a.astype(np.float64), b.astype(np.float64)


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "strided"])
def test_matmul_matches_numpy_on_odd_shapes(provider, layout):
    use_everywhere(provider)
    rng = np.random.default_rng(1)
    ran = 0
    for m in ODD:
        for n in ODD:
            for k in ODD:
                ka, kb, a, b = _operands(rng, m, n, k, layout)
                out, calls = counted(lambda: kiln.ops.matmul(ka, kb).numpy())
                ran += calls[provider]
                assert all(v == 0 for p, v in calls.items() if p != provider), (m, n, k, calls)
                np.testing.assert_allclose(out, a @ b, rtol=2e-5, atol=2e-5 * np.sqrt(k), err_msg=f"{m}x{n}x{k}")
    assert ran > 0  # the provider did run (tiny products and copies run plain loops instead)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_linear_batched_and_beta_paths_match_numpy(provider):
    use_everywhere(provider)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 129, 17)).astype(np.float32)
    w = rng.standard_normal((33, 17)).astype(np.float32)
    bias = rng.standard_normal(33).astype(np.float32)
    out, calls = counted(lambda: kiln.ops.dense(kiln.tensor(x), kiln.tensor(w), kiln.tensor(bias)).numpy())
    assert calls[provider] > 0
    np.testing.assert_allclose(out, x.astype(np.float64) @ w.T.astype(np.float64) + bias, rtol=2e-5, atol=1e-4)
    a = rng.standard_normal((4, 65, 129)).astype(np.float32)
    b = rng.standard_normal((4, 129, 3)).astype(np.float32)
    out, calls = counted(lambda: kiln.ops.bmm(kiln.tensor(a), kiln.tensor(b)).numpy())
    assert calls[provider] > 0
    np.testing.assert_allclose(out, a.astype(np.float64) @ b.astype(np.float64), rtol=2e-5, atol=1e-4)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_matmul_gradient_matches_numpy(provider):
    use_everywhere(provider)
    rng = np.random.default_rng(3)
    a = rng.standard_normal((17, 129)).astype(np.float32)
    b = rng.standard_normal((129, 3)).astype(np.float32)
    g = kiln.grad(lambda x, y: (kiln.ops.matmul(x, y) * kiln.tensor(np.arange(51, dtype=np.float32).reshape(17, 3))).sum(),
                  grad_position=(0, 1))(kiln.tensor(a), kiln.tensor(b))
    w = np.arange(51, dtype=np.float64).reshape(17, 3)
    np.testing.assert_allclose(g[0].numpy(), w @ b.T.astype(np.float64), rtol=2e-5, atol=1e-3)
    np.testing.assert_allclose(g[1].numpy(), a.T.astype(np.float64) @ w, rtol=2e-5, atol=1e-3)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_gemm_rate_measures_each_provider(provider):
    assert kiln._C.gemm_rate(provider, 64, 64, 64, 1, 1, 0.0) > 0
    with pytest.raises(ValueError, match="gemm_rate"):
        kiln._C.gemm_rate(provider, 0, 64, 64)


# ---- set_deterministic pins one provider ------------------------------------------------------------


def test_deterministic_mode_pins_openblas():
    rng = np.random.default_rng(4)
    a = kiln.tensor(rng.standard_normal((200, 300)).astype(np.float32))
    b = kiln.tensor(rng.standard_normal((300, 250)).astype(np.float32))
    use_everywhere("openblas")
    reference = kiln.ops.matmul(a, b).numpy()
    use_everywhere("onednn")
    kiln.set_deterministic(True)
    assert set(gemm_select.table(used=True).values()) == {"openblas"}
    assert set(gemm_select.table().values()) == {"onednn"}  # the table itself is kept
    pinned, calls = counted(lambda: kiln.ops.matmul(a, b).numpy())
    assert calls["onednn"] == 0 and calls["openblas"] > 0
    assert np.array_equal(pinned.view(np.uint32), reference.view(np.uint32))
    kiln.set_deterministic(False)
    _, calls = counted(lambda: kiln.ops.matmul(a, b).numpy())
    assert calls["onednn"] > 0 and calls["openblas"] == 0
    kiln.set_context(deterministic="ON")
    _, calls = counted(lambda: kiln.ops.matmul(a, b).numpy())
    assert calls["onednn"] == 0
    kiln.set_context(deterministic="OFF")
    assert gemm_select.table(used=True)["square"] == "onednn"


# ---- eager == compiled, bit for bit ----------------------------------------------------------------


def _products(a, b, w, bias):
    return kiln.ops.matmul(a, b), kiln.ops.dense(a, w, bias)


def _bits(results):
    return [r.numpy().view(np.uint32) for r in results]


# One product per class, with K long enough that the providers' sums differ in the last bits
BITWISE_SHAPES = {"small": (16, 16, 200), "small_m": (8, 300, 1000), "small_n": (300, 8, 1000),
                  "deep": (64, 64, 1024), "tall": (1200, 64, 700), "wide": (64, 1200, 700),
                  "square": (200, 300, 700)}


def _class_operands(rng, m, n, k):
    a = kiln.tensor(rng.standard_normal((m, k)).astype(np.float32))
    b = kiln.tensor(rng.standard_normal((k, n)).astype(np.float32))
    w = kiln.tensor(rng.standard_normal((n, k)).astype(np.float32))
    bias = kiln.tensor(rng.standard_normal(n).astype(np.float32))
    return a, b, w, bias


def test_the_providers_differ_in_the_last_bits():
    """Why eager and compiled must pick the same provider: the two providers' sums differ (so the
    bitwise test below can fail), within float32 rounding."""
    rng = np.random.default_rng(6)
    differ = []
    for cls, (m, n, k) in BITWISE_SHAPES.items():
        assert gemm_select.class_of(m, n, k) == cls
        args = _class_operands(rng, m, n, k)
        out = {}
        for p in PROVIDERS:
            use_everywhere(p)
            out[p] = _bits(_products(*args))
        if not all(np.array_equal(x, y) for x, y in zip(out["openblas"], out["onednn"])):
            differ.append(cls)
        for x, y in zip(out["openblas"], out["onednn"]):
            np.testing.assert_allclose(x.view(np.float32), y.view(np.float32), rtol=1e-4, atol=1e-3)
    assert len(differ) >= 4, differ


@pytest.mark.parametrize("table", ["measured", "mixed", "flipped"])
def test_compiled_equals_eager_bitwise_per_shape_class(table):
    """With calibration on (this machine's measured table, and tables alternating the providers),
    each class's product gives the same bits eagerly and under every kiln.jit variant."""
    if table == "measured":
        gemm_select.apply(gemm_select.measure())
    else:
        for i, cls in enumerate(CLASSES):
            gemm_select.set_provider(cls, PROVIDERS[(i + (table == "flipped")) % 2])
    rng = np.random.default_rng(5)
    for cls, (m, n, k) in BITWISE_SHAPES.items():
        args = _class_operands(rng, m, n, k)
        conformance.run_all_modes(_products, args)  # values, under the harness
        want = _bits(_products(*args))
        problems = []
        with warnings.catch_warnings(), conformance.environment(conformance.ENV):
            warnings.simplefilter("ignore")
            for v in conformance.VARIANTS:
                got = _bits(v.wrap(_products)(*args))
                if not all(np.array_equal(g, e) for g, e in zip(got, want)):
                    problems.append(v.name)
        assert not problems, f"{cls} {m}x{n}x{k}: compiled bits differ from eager in {problems}"


# ---- the calibration file ----------------------------------------------------------------------------


def _valid():
    calib = {"format": 1, "key": {**_gemm_cache.cpu_key(), "blas": "b", "onednn": "d"}, "coretype": None,
             "coretype_gflops": {"SkylakeX": 30.0, "Haswell": 25.0},
             "classes": {c: {"provider": "onednn" if i % 2 else "openblas", "gflops": {"openblas": 10.0, "onednn": 12}}
                         for i, c in enumerate(CLASSES)}}
    return calib


def _read(path, key=None):
    key = key or _valid()["key"]
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        data = _gemm_cache.read(key, CLASSES, PROVIDERS, file=str(path))
    return data, [x for x in w if issubclass(x.category, _gemm_cache.GemmCalibrationWarning)]


def test_valid_file_round_trips(tmp_path):
    p = tmp_path / "g.json"
    assert _gemm_cache.write(_valid(), file=str(p))
    data, warned = _read(p)
    assert data == json.loads(json.dumps(_valid())) and not warned
    assert _read(tmp_path / "missing.json") == (None, [])  # no file: nothing to warn about


def test_truncated_files_are_ignored_with_a_warning(tmp_path):
    raw = json.dumps(_valid()).encode()
    p = tmp_path / "g.json"
    for cut in list(range(0, len(raw), max(1, len(raw) // 97))) + [len(raw) - 1]:
        p.write_bytes(raw[:cut])
        data, warned = _read(p)
        assert data is None and len(warned) == 1, cut


def test_garbage_and_huge_files_are_ignored_with_a_warning(tmp_path):
    rng = np.random.default_rng(7)
    p = tmp_path / "g.json"
    samples = [rng.integers(0, 256, size=int(s), dtype=np.uint8).tobytes() for s in rng.integers(1, 3000, size=40)]
    samples += [b"[]", b"null", b"1e999", b'"x"', b"[" * 100000 + b"]" * 100000, b"{" * 5000,
                b" " * (_gemm_cache.MAX_BYTES + 1), json.dumps({**_valid(), "pad": "x" * 70000}).encode(),
                b"\xff\xfe" + json.dumps(_valid()).encode("utf-16-le")]
    for raw in samples:
        p.write_bytes(raw)
        data, warned = _read(p)
        assert data is None and len(warned) == 1, raw[:40]


def test_a_fifo_or_directory_does_not_hang_or_crash(tmp_path):
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    assert _read(fifo)[0] is None and len(_read(fifo)[1]) == 1
    (tmp_path / "dir.json").mkdir()
    assert _read(tmp_path / "dir.json")[0] is None and len(_read(tmp_path / "dir.json")[1]) == 1


def test_unwritable_place_warns(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("KILN_CACHE_DIR", str(blocker / "cache"))  # under a file: cannot be made
    assert not _gemm_cache.write(_valid())
    monkeypatch.setattr(gemm_select, "measure", _valid)
    with pytest.warns(_gemm_cache.GemmCalibrationWarning, match="cannot write"):
        gemm_select.calibrate(force=True)


def _mutations():
    """(description, file content) pairs, each invalid in one field."""
    def m(desc, f):
        d = copy.deepcopy(_valid())
        f(d)
        return desc, d
    yield m("format 2", lambda d: d.update(format=2))
    yield m("format true", lambda d: d.update(format=True))
    yield m("format 1.0", lambda d: d.update(format=1.0))
    yield m("extra field", lambda d: d.update(extra=1))
    yield m("missing classes", lambda d: d.pop("classes"))
    yield m("another cpu", lambda d: d["key"].update(cpu="another"))
    yield m("another blas", lambda d: d["key"].update(blas="OpenBLAS 9"))
    yield m("key not a dict", lambda d: d.update(key=["x"]))
    yield m("long key text", lambda d: d["key"].update(extra="x" * 5000))
    yield m("coretype injection", lambda d: d.update(coretype="Haswell; rm -rf /"))
    yield m("coretype number", lambda d: d.update(coretype=3))
    yield m("coretype SkylakeX", lambda d: d.update(coretype="SkylakeX"))
    yield m("coretype gflops nan", lambda d: d["coretype_gflops"].update(Haswell=float("nan")))
    yield m("coretype gflops negative", lambda d: d["coretype_gflops"].update(Haswell=-1.0))
    yield m("coretype gflops string", lambda d: d["coretype_gflops"].update(Haswell="fast"))
    yield m("unknown provider", lambda d: d["classes"]["square"].update(provider="mkl"))
    yield m("provider not text", lambda d: d["classes"]["square"].update(provider=None))
    yield m("missing class", lambda d: d["classes"].pop("deep"))
    yield m("unknown class", lambda d: d["classes"].update(huge=d["classes"]["deep"]))
    yield m("class not a dict", lambda d: d["classes"].update(deep="onednn"))
    yield m("class extra field", lambda d: d["classes"]["deep"].update(x=1))
    yield m("gflops infinite", lambda d: d["classes"]["deep"]["gflops"].update(onednn=float("inf")))
    yield m("gflops bool", lambda d: d["classes"]["deep"]["gflops"].update(onednn=True))
    yield m("gflops huge", lambda d: d["classes"]["deep"]["gflops"].update(onednn=1e300))
    yield m("gflops unknown provider", lambda d: d["classes"]["deep"]["gflops"].update(mkl=3.0))
    yield m("classes a list", lambda d: d.update(classes=[1, 2]))


@pytest.mark.parametrize("desc,content", list(_mutations()), ids=[d for d, _ in _mutations()])
def test_each_invalid_field_is_rejected(tmp_path, desc, content):
    p = tmp_path / "g.json"
    p.write_text(json.dumps(content))  # NaN and Infinity as Python's json writes them
    data, warned = _read(p)
    assert data is None and len(warned) == 1, desc


# ---- at start-up: the file, measuring, the environment ----------------------------------------------


def _fresh(code, cache_dir, **env):
    e = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "KILN_GEMM_PROVIDER")}
    e.update({"PYTHONPATH": os.path.dirname(os.path.dirname(kiln.__file__)), "KILN_CACHE_DIR": str(cache_dir),
              "KILN_GEMM_CALIBRATION": "on", **env})
    p = subprocess.run(python_command(code), capture_output=True, text=True, env=e, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout.strip().splitlines()[-1], p.stderr


REPORT = ("import json, os, kiln; from kiln import gemm_select as g; "
          "print(json.dumps([g.source(), g.table(), kiln._C.build_info()['blas_core'], "
          "os.environ.get('OPENBLAS_CORETYPE')]))")


def test_startup_measures_once_then_reads_the_file(tmp_path):
    cache = tmp_path / "cache"
    out, _ = _fresh(REPORT, cache)
    source, table, _, _ = json.loads(out)
    assert source == "measured"
    written = json.loads((tmp_path / "cache-gemm.json").read_text())
    assert {c: e["provider"] for c, e in written["classes"].items()} == table
    out, _ = _fresh(REPORT, cache)
    assert json.loads(out)[:2] == ["file", table]


def test_startup_with_a_bad_file_warns_and_measures_again(tmp_path):
    f = tmp_path / "cache-gemm.json"
    f.write_text('{"format": 1, "key": {"cpu"')
    out, err = _fresh(REPORT, tmp_path / "cache", PYTHONWARNINGS="always")
    assert json.loads(out)[0] == "measured"
    assert "GemmCalibrationWarning" in err and "not JSON" in err
    assert _gemm_cache.validate(json.loads(f.read_text()), {}, CLASSES, PROVIDERS) is None  # rewritten, valid


def test_calibration_off_reads_and_writes_nothing(tmp_path):
    f = tmp_path / "cache-gemm.json"
    calib = _valid()
    calib["classes"] = {c: {"provider": "onednn", "gflops": {"onednn": 1.0}} for c in CLASSES}
    f.write_text(json.dumps(calib))
    out, _ = _fresh(REPORT, tmp_path / "cache", KILN_GEMM_CALIBRATION="off")
    source, table, _, core = json.loads(out)
    assert source == "default" and set(table.values()) == {"openblas"} and core is None
    out, _ = _fresh(REPORT, tmp_path / "other", KILN_GEMM_CALIBRATION="off")
    assert not (tmp_path / "other-gemm.json").exists()


def test_env_provider_override(tmp_path):
    out, _ = _fresh(REPORT, tmp_path / "cache", KILN_GEMM_PROVIDER="onednn")
    source, table, _, _ = json.loads(out)
    assert source == "env" and set(table.values()) == {"onednn"}
    assert not (tmp_path / "cache-gemm.json").exists()
    e = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(kiln.__file__)), KILN_GEMM_PROVIDER="mkl")
    p = subprocess.run(python_command("import kiln"), capture_output=True, text=True, env=e, timeout=120)
    assert p.returncode != 0 and "KILN_GEMM_PROVIDER='mkl'" in p.stderr


def _file_for_this_machine(path, coretype):
    """A valid file for this machine (its real key) choosing `coretype`."""
    code = ("import json, kiln; from kiln import gemm_select as g; "
            "print(json.dumps(g.library_key()))")
    out, _ = _fresh(code, path.parent / "unused", KILN_GEMM_CALIBRATION="off")
    calib = _valid()
    calib["key"], calib["coretype"] = json.loads(out), coretype
    path.write_text(json.dumps(calib))
    return calib


@pytest.mark.skipif("avx512f" not in kiln._C.build_info()["cpu_isa"].split(), reason="needs an AVX-512 CPU")
def test_cached_coretype_is_set_before_openblas_loads_unless_the_user_chose(tmp_path):
    f = tmp_path / "cache-gemm.json"
    calib = _file_for_this_machine(f, "Haswell")
    out, _ = _fresh(REPORT, tmp_path / "cache")
    source, table, core, env_core = json.loads(out)
    assert (source, core, env_core) == ("file", "Haswell", "Haswell")
    assert table == {c: e["provider"] for c, e in calib["classes"].items()}
    out, _ = _fresh(REPORT, tmp_path / "cache", OPENBLAS_CORETYPE="SkylakeX")
    assert json.loads(out)[2:] == ["SkylakeX", "SkylakeX"]
    _file_for_this_machine(f, None)
    out, _ = _fresh(REPORT, tmp_path / "cache")
    assert json.loads(out)[3] is None and json.loads(out)[2] != "Haswell"


# ---- kiln.bench's peak and python -m kiln ---------------------------------------------------------


def test_bench_peak_is_the_best_candidate():
    from kiln.bench import sgemm
    best, label, cands = sgemm.best_peak(256, repeat=2)
    assert label in cands and best == max(cands.values()) and "oneDNN" in cands
    assert any(k.startswith("OpenBLAS ") for k in cands)


def test_python_m_kiln_prints_the_provider_per_class(tmp_path):
    e = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    e.update(PYTHONPATH=os.path.dirname(os.path.dirname(kiln.__file__)), KILN_CACHE_DIR=str(tmp_path / "c"),
             KILN_GEMM_PROVIDER="onednn")
    p = subprocess.run([sys.executable, "-m", "kiln"], capture_output=True, text=True, env=e, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "float32 GEMM:    KILN_GEMM_PROVIDER" in p.stdout
    for cls in CLASSES:
        assert f"  {cls} onednn" in p.stdout
