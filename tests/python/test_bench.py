"""Smoke test of `python -m kiln.bench`: the smallest size in a subprocess, checked through the JSON
it writes (every workload, every implemented kiln.jit variant, results agreeing with kiln eager,
exit status 0); a variant that disagrees makes it fail. No speed is asserted."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

import kiln
from kiln.bench import __main__ as bench_main
from kiln.bench import workloads

WORKLOADS = ("simple", "conv-fwd", "conv-fwdbwd", "attention-fwd", "attention-fwdbwd")
HAS_TORCH = importlib.util.find_spec("torch") is not None
PEERS = "torch,torch.jit.trace" if HAS_TORCH else "none"  # torch.compile takes minutes to compile


def implemented_jit_variants():
    """The configurations kiln.jit accepts today, found independently of the benchmark's own check."""
    out = []
    for v in workloads.JIT_VARIANTS:
        try:
            kiln.jit(lambda a: a, capture_mode=v.capture_mode, jit_level=v.jit_level, backend=v.backend,
                     fullgraph=v.fullgraph)
        except NotImplementedError:
            continue
        out.append(v)
    return out


def row_key(row):
    return (row["capture_mode"], row["jit_level"], row["backend"], row["fullgraph"])


@pytest.fixture(scope="module")
def smallest_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    env = dict(os.environ)
    python_dir = os.path.dirname(os.path.dirname(os.path.abspath(kiln.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (python_dir, env.get("PYTHONPATH"))))
    proc = subprocess.run([sys.executable, "-m", "kiln.bench", "--smallest", "--peers", PEERS, "--json", str(out)],
                          env=env, capture_output=True, text=True, timeout=600)
    return proc, json.loads(out.read_text()) if out.exists() else None


def test_exit_status_and_table(smallest_run):
    proc, record = smallest_run
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert record is not None and record["ok"] and record["failures"] == 0
    assert "all results agree with kiln eager" in proc.stdout
    for header in ("enable jit", "jit level", "capture mode", "backend", "fullgraph", "prepare", "time for runs",
                   "per run"):
        assert header in proc.stdout
    assert "\r" not in proc.stderr  # the progress line is for terminals only


def test_every_workload_and_variant_present_and_agreeing(smallest_run):
    _, record = smallest_run
    assert [w["key"] for w in record["workloads"]] == list(WORKLOADS)
    expected = implemented_jit_variants()
    assert expected, "no kiln.jit variant is implemented?"
    for w in record["workloads"]:
        rows = w["rows"]
        assert rows[0]["system"] == "kiln" and rows[0]["check"] == "reference", w["key"]
        jit_rows = {row_key(r): r for r in rows if r["system"] == "kiln.jit"}
        for v in expected:
            key = (v.capture_mode, v.jit_level, v.backend, str(v.fullgraph).lower())
            assert key in jit_rows, f"{w['key']}: no row for {key}"
            info = jit_rows[key]["info"]
            assert info["compiles"] == 1 and info["eager_calls"] == 0, (w["key"], info)  # really compiled
        assert len(jit_rows) == len(expected)
        for r in rows:
            assert r["agree"] is True and r["error"] is None, (w["key"], r["system"], r["check"], r["error"])
            assert r["runs"] == w["runs"] > 0
            assert r["prepare_s"] > 0 and r["run_s"] > 0 and r["per_run_s"] > 0
        if HAS_TORCH:
            assert {"torch", "torch.jit.trace"} <= {r["system"] for r in rows}
        if w["key"].endswith("fwdbwd"):
            assert w["outputs"][0] == "value" and len(w["outputs"]) > 1  # gradients are compared too


def test_skipped_variants_are_noted(smallest_run):
    _, record = smallest_run
    implemented = {(v.capture_mode, v.jit_level, v.backend, v.fullgraph) for v in implemented_jit_variants()}
    for v in record["jit_variants"]:
        key = (v["capture_mode"], v["jit_level"], v["backend"], v["fullgraph"])
        assert v["implemented"] == (key in implemented), v
        if not v["implemented"]:
            assert v["note"].startswith("not implemented yet"), v
            assert any(v["note"] in n for n in record["notes"])


def test_a_mismatch_is_marked_and_fails(tmp_path, monkeypatch, capsys):
    """A variant whose results differ from kiln eager's is marked in the table and the command
    exits with status 1."""
    real = bench_main.kiln_variants

    def with_a_wrong_one(workload, jit_variants):
        rows = real(workload, jit_variants)
        wrong = workloads.Variant("kiln.jit", True, "O9", "wrong", "kbk", "false",
                                  lambda args0: (lambda a, b, c: a * b + c + 1e-2), workloads.kiln_results)
        return rows + [wrong]

    monkeypatch.setattr(bench_main, "kiln_variants", with_a_wrong_one)
    out = tmp_path / "bench.json"
    rc = bench_main.main(["--smallest", "--only", "simple", "--peers", "none", "--json", str(out)])
    assert rc == 1
    assert "MISMATCH" in capsys.readouterr().out
    rows = json.loads(out.read_text())["workloads"][0]["rows"]
    assert [r["agree"] for r in rows] == [True] * (len(rows) - 1) + [False]


def test_compare_tolerance():
    import numpy as np

    ref = [np.array([1000.0, 0.0, -3.0], np.float32)]
    assert workloads.compare([ref[0] + 0.05], ref, ["output"])[0]  # 5e-5 of the largest element
    ok, err, where = workloads.compare([ref[0] + np.float32([0, 0.2, 0])], ref, ["output"])
    assert not ok and err > 1 and where == "output"
    assert not workloads.compare([np.full(3, np.nan, np.float32)], ref, ["output"])[0]
    assert not workloads.compare([ref[0][:2]], ref, ["output"])[0]
    # gradients (outputs from grads_from on): relative L2 error, so one element changed by a ReLU
    # taking the other branch passes while a wrong slice does not
    rng = np.random.default_rng(0)
    value, grad = rng.standard_normal(8), rng.standard_normal((64, 64))
    flipped = grad.copy()
    flipped[3, 5] += 0.5
    names = ["value", "grad w"]
    assert workloads.compare([value, flipped], [value, grad], names, grads_from=1)[0]
    assert not workloads.compare([value, flipped], [value, grad], names)[0]  # elementwise: fails
    wrong = grad.copy()
    wrong[7] *= 1.5
    ok, err, where = workloads.compare([value, wrong], [value, grad], names, grads_from=1)
    assert not ok and where == "grad w"
    assert not workloads.compare([value, grad + 1], [value, np.zeros_like(grad)], names, grads_from=1)[0]
    assert workloads.compare([value, np.zeros_like(grad)], [value, np.zeros_like(grad)], names, grads_from=1)[0]


def test_bad_arguments():
    with pytest.raises(SystemExit):
        bench_main.build_parser().parse_args(["--peers", "tensorflow"])
    assert bench_main.parse_peers("jax,torch") == ("jax.jit", "torch")
    assert bench_main.parse_peers("none") == ()
