"""kiln.bench's mixed-precision rows (issue 31): on the BasicBlock and attention workloads, kiln eager
and kiln.jit under kiln.amp.auto_mixed_precision(model, "O2", dtype), and torch / torch.compile under
torch.autocast where torch imports. The smallest shapes in a subprocess, checked through the JSON;
kiln.jit's amp rows are held to kiln eager amp's results (float32's tolerance), the others to kiln
eager float32's within the low precision's; a wrong amp row fails the command. No speed asserted."""
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import kiln
from kiln.bench import __main__ as bench_main
from kiln.bench import workloads

HAS_TORCH = importlib.util.find_spec("torch") is not None
PEERS = "torch" if HAS_TORCH else "none"
MODULES = ("conv-fwd", "conv-fwdbwd", "attention-fwd", "attention-fwdbwd")


def _run(tmp_path, *args):
    out = tmp_path / "bench.json"
    env = dict(os.environ)
    python_dir = os.path.dirname(os.path.dirname(os.path.abspath(kiln.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (python_dir, env.get("PYTHONPATH"))))
    proc = subprocess.run([sys.executable, "-m", "kiln.bench", "--smallest", "--repeat", "1", "--json", str(out), *args],
                          env=env, capture_output=True, text=True, timeout=600)
    return proc, json.loads(out.read_text()) if out.exists() else None


@pytest.fixture(scope="module")
def bf16_run(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("bench_amp"), "--peers", PEERS)


def _amp_rows(w):
    return [r for r in w["rows"] if r["amp"] != "-"]


def test_amp_rows_present_and_agreeing(bf16_run):
    proc, record = bf16_run
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert record["ok"] and record["amp"]["dtype"] == "bfloat16" and record["amp"]["level"] == "O2"
    keys = {w["key"]: w for w in record["workloads"]}
    assert not _amp_rows(keys["simple"])  # the simple function has no amp rows
    expected = [(v.capture_mode, v.jit_level, v.backend) for v in workloads.AMP_JIT_VARIANTS]
    for key in MODULES:
        rows = _amp_rows(keys[key])
        assert all(r["amp"] == "bf16" for r in rows)
        assert rows[0]["system"] == "kiln" and rows[0]["check"] == "ok", rows[0]
        jit = [(r["capture_mode"], r["jit_level"], r["backend"]) for r in rows if r["system"] == "kiln.jit"]
        assert jit == expected, (key, jit)
        for r in rows:
            assert r["agree"] is True and r["error"] is None, (key, r["system"], r["check"], r["error"])
            assert r["per_run_s"] > 0 and r["runs"] == keys[key]["runs"]
            if r["system"] == "kiln.jit":
                assert r["info"]["compiles"] == 1 and r["info"]["eager_calls"] == 0, (key, r["info"])
        if HAS_TORCH:
            assert [r["system"] for r in rows if not r["system"].startswith("kiln")] == ["torch"]
        # the float32 rows are all still there, before the amp rows
        first_amp = keys[key]["rows"].index(rows[0])
        assert all(r["amp"] == "-" for r in keys[key]["rows"][:first_amp])


def test_default_table_fits_100_columns_and_names_amp_rows(bf16_run):
    proc, _ = bf16_run
    lines = proc.stdout.splitlines()
    assert max(len(line) for line in lines) <= 100
    assert any(line.startswith("kiln.jit") and "trace O1 kbk bf16" in line for line in lines)
    assert any(line.startswith("kiln ") and " bf16 " in line for line in lines)
    text = " ".join(proc.stdout.split())  # (notes wrap)
    assert "rows ending bf16" in text and "auto_mixed_precision(model, 'O2', bfloat16)" in text
    assert "versus peers, mixed precision" in text or not HAS_TORCH


def test_wide_has_an_amp_column(tmp_path):
    proc, record = _run(tmp_path, "--peers", "none", "--only", "attention", "--wide", "--amp", "float16")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    header = next(line for line in proc.stdout.splitlines() if line.startswith("system"))
    assert "  amp  " in header
    for w in record["workloads"]:
        rows = _amp_rows(w)
        assert rows and all(r["amp"] == "fp16" and r["agree"] for r in rows), w["key"]


def test_amp_none_has_no_amp_rows(tmp_path):
    proc, record = _run(tmp_path, "--peers", "none", "--only", "conv", "--amp", "none")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert record["amp"] is None
    assert all(not _amp_rows(w) for w in record["workloads"])


def test_a_wrong_amp_row_fails(tmp_path, monkeypatch, capsys):
    """A kiln.jit amp row is checked against kiln eager amp with float32's tolerance: a row that
    skips amp (float32 results: 0.1-3% from bfloat16's) is a MISMATCH and the command fails."""
    real = bench_main.kiln_amp_variants

    def with_a_wrong_one(workload, jit_variants, dtype="bfloat16"):
        rows = real(workload, jit_variants, dtype)
        fp32 = workloads.kiln_variants(workload, ())[0]  # kiln eager float32 in an amp row's clothes
        wrong = workloads.Variant("kiln.jit", True, "O9", "wrong", "kbk", "false", fp32.make,
                                  workloads.kiln_results, amp=rows[0].amp)
        return rows + [wrong]

    monkeypatch.setattr(bench_main, "kiln_amp_variants", with_a_wrong_one)
    out = tmp_path / "bench.json"
    rc = bench_main.main(["--smallest", "--only", "attention", "--peers", "none", "--repeat", "1", "--json", str(out)])
    assert rc == 1
    assert "MISMATCH" in capsys.readouterr().out
    for w in json.loads(out.read_text())["workloads"]:
        assert [r["agree"] for r in _amp_rows(w)] == [True] * (len(_amp_rows(w)) - 1) + [False], w["key"]


def test_amp_tolerance():
    """Values within atol x max|ref| (no floor at 1: outputs of magnitude 0.1 are held to their own
    scale), gradients by relative L2 error; float32's rule unchanged."""
    tol = workloads.AMP["bf16"]
    ref = np.array([0.1, -0.05, 0.0], np.float32)
    assert workloads._error(ref + 0.0019, ref, False, tol) < 1  # 1.9e-3 < 2e-2 x 0.1
    assert workloads._error(ref + 0.0021, ref, False, tol) > 1
    assert workloads._error(ref, ref, False, tol) == 0
    assert workloads._error(np.zeros(3), np.zeros(3), False, tol) == 0
    assert workloads._error(np.ones(3), np.zeros(3), False, tol) == float("inf")
    g = np.array([1.0, 2.0, 3.0])
    assert workloads._error(g * 1.04, g, True, tol) < 1 < workloads._error(g * 1.06, g, True, tol)
    # float32's: atol relative to max(1, max|ref|) plus rtol: as before
    assert workloads._error(ref + 0.9e-4, ref, False) < 1 < workloads._error(ref + 2e-4, ref, False)
