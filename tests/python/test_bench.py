"""Smoke test of `python -m kiln.bench`: the smallest size in a subprocess, checked through the JSON
it writes (every workload, every implemented kiln.jit variant, results agreeing with kiln eager,
exit status 0); a variant that disagrees makes it fail. No speed is asserted."""
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

WORKLOADS = ("simple", "conv-fwd", "conv-fwdbwd", "attention-fwd", "attention-fwdbwd")
HAS_TORCH = importlib.util.find_spec("torch") is not None
PEERS = "torch,torch.jit.trace" if HAS_TORCH else "none"  # torch.compile takes minutes to compile


def implemented_jit_variants():
    """The configurations kiln.jit accepts today, found independently of the benchmark's own check."""
    out = []
    for v in workloads.JIT_VARIANTS:
        try:
            kiln.jit(lambda a: a, capture_mode=v.capture_mode, jit_level=v.jit_level, backend=v.backend,
                     fullgraph=v.fullgraph, infer_boost=v.infer_boost)
        except NotImplementedError:
            continue
        out.append(v)
    return out


def row_key(row):
    return (row["capture_mode"], row["jit_level"], row["backend"], row["fullgraph"], row["infer_boost"])


@pytest.fixture(scope="module")
def smallest_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    env = dict(os.environ)
    python_dir = os.path.dirname(os.path.dirname(os.path.abspath(kiln.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (python_dir, env.get("PYTHONPATH"))))
    proc = subprocess.run([sys.executable, "-m", "kiln.bench", "--smallest", "--peers", PEERS, "--wide", "--json",
                           str(out)],
                          env=env, capture_output=True, text=True, timeout=600)
    return proc, json.loads(out.read_text()) if out.exists() else None


def test_exit_status_and_table(smallest_run):
    """With --wide, the tables have the tutorial's columns (the default's are tested below)."""
    proc, record = smallest_run
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert record is not None and record["ok"] and record["failures"] == 0
    assert "all results agree with kiln eager" in proc.stdout
    for header in ("enable jit", "jit level", "capture mode", "backend", "fullgraph", "prepare", "time for runs",
                   "per run", "GFLOP/s", "of peak"):
        assert header in proc.stdout
    # the peak is the best sgemm here, and the line says which (OpenBLAS <core type> or oneDNN); the
    # record's source follows the best of the later measurements, which another provider may win
    peak = record["sgemm_peak"]
    first = max(peak["candidates"], key=peak["candidates"].get)
    assert f"peak: the best sgemm here, {first}, 512x512x512" in proc.stdout
    assert peak["source"] in peak["candidates"] and "oneDNN" in peak["candidates"]
    assert peak["candidates"][first] == peak["measured"][0]
    measured = record["sgemm_peak"]["measured"]
    assert len(measured) == len(WORKLOADS) and record["sgemm_peak"]["gflops_per_s"] == max(measured)
    # the bfloat16 GEMM peak (oneDNN's bf16 matmul), where oneDNN has bfloat16 arithmetic
    bf16 = record["bf16_gemm_peak"]
    assert bf16["n"] == 512 and "bf16 GEMM peak: oneDNN's bfloat16 matmul, 512x512x512" in proc.stdout
    if kiln._C.gemm_bf16_info()["hardware"]:
        assert bf16["gflops_per_s"] > 0 and f"{bf16['gflops_per_s']:.1f} GFLOP/s" in proc.stdout
    else:
        assert bf16["gflops_per_s"] is None and "none (no bfloat16 arithmetic" in proc.stdout
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
            key = (v.capture_mode, v.jit_level, v.backend, str(v.fullgraph).lower(), v.infer_boost)
            assert key in jit_rows, f"{w['key']}: no row for {key}"
            info = jit_rows[key]["info"]
            assert info["compiles"] == 1 and info["eager_calls"] == 0, (w["key"], info)  # really compiled
        assert len(jit_rows) == len(expected)
        for r in rows:
            assert r["agree"] is True and r["error"] is None, (w["key"], r["system"], r["check"], r["error"])
            assert r["runs"] == w["runs"] > 0
            assert r["prepare_s"] > 0 and r["run_s"] > 0 and r["per_run_s"] > 0
            # --repeat 3 (the default): the median and the spread of three timings of the runs
            each = r["run_s_each"]
            assert r["repeat"] == len(each) == 3 and r["run_s"] == sorted(each)[1]
            assert r["per_run_min_s"] * r["runs"] == pytest.approx(min(each))
            assert r["per_run_max_s"] * r["runs"] == pytest.approx(max(each))
            assert isinstance(r["slower_than"], list)
        assert w["load_before"] is not None and w["load_after"] is not None
        peak = w["sgemm_peak_gflops"]  # the best measurement so far
        assert peak > 0 and w["flops"] > 0
        assert peak == max(record["sgemm_peak"]["measured"][:record["workloads"].index(w) + 1])
        for r in rows:  # GFLOP/s of the workload's FLOPs in the row's median per-run time, and of the peak
            assert r["gflops_per_s"] == pytest.approx(w["flops"] / r["per_run_s"] / 1e9)
            assert r["peak_fraction"] == pytest.approx(r["gflops_per_s"] / peak)
        if HAS_TORCH:
            assert {"torch", "torch.jit.trace"} <= {r["system"] for r in rows}
        if w["key"].endswith("fwdbwd"):
            assert w["outputs"][0] == "value" and len(w["outputs"]) > 1  # gradients are compared too


def test_skipped_variants_are_noted(smallest_run):
    _, record = smallest_run
    implemented = {(v.capture_mode, v.jit_level, v.backend, v.fullgraph, v.infer_boost)
                   for v in implemented_jit_variants()}
    for v in record["jit_variants"]:
        key = (v["capture_mode"], v["jit_level"], v["backend"], v["fullgraph"], v["infer_boost"])
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
    text = capsys.readouterr().out
    assert "MISMATCH" in text
    assert max(len(line) for line in text.splitlines()) <= 100, "the default output fits 100 columns"
    rows = json.loads(out.read_text())["workloads"][0]["rows"]
    assert [r["agree"] for r in rows] == [True] * (len(rows) - 1) + [False]


def test_workload_flops_match_the_formulas():
    """The FLOPs per call of a workload (kiln.profiler's count of kiln eager's kernels) against the
    analytic counts: 2mnk for a matmul; 2 N Cout Ho Wo Cin kh kw for a convolution, and twice that
    for its forward+backward over the weight (conv2d_backward_weight is a convolution as large)."""
    import numpy as np

    rng = np.random.default_rng(0)
    m, k, n = 5, 7, 3
    a, b = (kiln.Tensor(rng.standard_normal(s).astype(np.float32)) for s in ((m, k), (k, n)))
    mm = workloads.Workload("mm", "t", "matmul", "", False, kiln.ops.matmul, (a, b), [])
    assert workloads.workload_flops(mm) == 2 * m * n * k
    batch, cin, cout, hw, kh = 2, 3, 4, 6, 3
    conv = kiln.nn.Conv2d(cin, cout, kh, pad_mode="pad", padding=1, has_bias=False)
    x = kiln.Tensor(rng.standard_normal((batch, cin, hw, hw)).astype(np.float32))
    forward = 2 * batch * cout * hw * hw * cin * kh * kh
    for backward, expected in ((False, forward), (True, 2 * forward)):
        wl = workloads.Workload("conv", "t", "conv", "", backward, conv, (x,), [])
        assert workloads.workload_flops(wl) == expected, backward


def test_rates_of_a_row():
    assert bench_main._rate(2e9, 0.5, 8.0) == (4.0, 0.5)
    assert bench_main._rate(2e9, 0.5, None) == (4.0, None)  # no OpenBLAS: no fraction
    assert bench_main._rate(2e9, float("nan"), 8.0) == (None, None)  # a failed row


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


# ---- SLOWER marks (issue 17 part 4), on synthetic timings ----------------------------------------------


def synthetic_row(system="kiln.jit", level="O0", capture="trace", backend="kbk", fullgraph="false", boost="off",
                  times=(1.0, 1.0, 1.0), runs=1):
    """A table row as __main__ makes it, from the times of the repetitions (seconds)."""
    import numpy as np

    if system == "kiln":
        level = capture = backend = fullgraph = boost = "-"
    return {"system": system, "jit_level": level, "capture_mode": capture, "backend": backend,
            "fullgraph": fullgraph, "infer_boost": boost, "runs": runs, "repeat": len(times),
            "run_s_each": list(times), "per_run_s": float(np.median(times)) / runs,
            "per_run_min_s": min(times) / runs, "per_run_max_s": max(times) / runs, "check": "ok", "error": None}


def test_slower_against_each_baseline():
    from kiln.bench import slower

    eager = synthetic_row("kiln", times=(1.0, 1.02, 0.99))
    o0 = synthetic_row(level="O0", times=(0.8, 0.81, 0.79))
    o1 = synthetic_row(level="O1", times=(0.9, 0.91, 0.9))             # slower than O0 by 0.1 > spreads 0.02, 0.01
    sink = synthetic_row(level="O0", backend="sink", times=(0.7, 0.72, 0.71))  # faster than kbk: fine
    full = synthetic_row(level="O0", capture="ast", fullgraph="true", times=(1.2, 1.21, 1.19))
    ast = synthetic_row(level="O0", capture="ast", times=(0.8, 0.8, 0.8))
    boost = synthetic_row(level="O1", boost="on", times=(0.95, 0.96, 0.95))
    rows = [eager, o0, o1, sink, full, ast, boost]
    assert slower.mark(rows) == 3
    assert [s["than"] for s in o1["slower_than"]] == ["O0"]
    assert o1["slower_than"][0]["ratio"] == pytest.approx(0.9 / 0.8)
    assert "SLOWER than O0 (1.12x)" in o1["check"]
    assert [s["than"] for s in full["slower_than"]] == ["eager", "fullgraph=false"]
    assert [s["than"] for s in boost["slower_than"]] == ["infer_boost off"]  # no O0 row with infer_boost on
    assert not o0["slower_than"] and not sink["slower_than"] and not ast["slower_than"] and not eager["slower_than"]
    assert "SLOWER" not in sink["check"]


def test_slower_needs_more_than_the_spread():
    from kiln.bench import slower

    o0 = synthetic_row(level="O0", times=(1.0, 1.05, 0.95))  # spread 0.1
    o1 = synthetic_row(level="O1", times=(1.08, 1.1, 1.09))  # median 0.09 above: within O0's spread
    assert slower.mark([o0, o1]) == 0 and not o1["slower_than"]
    o1 = synthetic_row(level="O1", times=(1.11, 1.12, 1.11))  # 0.12 above: beyond it
    assert slower.mark([o0, o1]) == 1
    noisy = synthetic_row(level="O1", times=(1.0, 1.3, 1.5))  # 0.3 above, but its own spread is 0.5
    assert slower.mark([o0, noisy]) == 0
    # one repetition: no spread, so nothing is marked however slow
    once = [synthetic_row(level="O0", times=(1.0,)), synthetic_row(level="O1", times=(5.0,))]
    assert slower.mark(once) == 0
    # a failed baseline (no times) marks nothing
    failed = synthetic_row(level="O0")
    nan = float("nan")
    failed.update(run_s_each=[], per_run_s=nan, per_run_min_s=nan, per_run_max_s=nan, error="boom")
    assert slower.mark([failed, synthetic_row(level="O1", times=(2.0, 2.0, 2.0))]) == 0


def test_slower_mark_kept_only_when_timing_in_turns_confirms_it():
    from kiln.bench import slower

    asked = []

    def remeasure(times_row, times_base):
        def fn(row, base):
            asked.append((row["jit_level"], base["jit_level"]))
            return list(times_row), list(times_base)
        return fn

    o0 = synthetic_row(level="O0", times=(1.0, 1.0, 1.01))
    o1 = synthetic_row(level="O1", times=(1.2, 1.21, 1.2))  # slower in the table
    # timed again in turns, the two are equal: load during the table, not kiln
    assert slower.mark([o0, o1], remeasure((1.0, 1.01, 1.0), (1.0, 1.0, 1.01))) == 0
    assert asked == [("O1", "O0")]
    assert o1["slower_than"] == [] and "SLOWER" not in o1["check"]
    [note] = o1["not_slower_interleaved"]
    assert note["than"] == "O0" and note["ratio"] == pytest.approx(1.2 / 1.0)
    assert note["interleaved_ratio"] == pytest.approx(1.0)
    # timed again in turns, still slower by more than the spread: marked, with both ratios
    o1 = synthetic_row(level="O1", times=(1.2, 1.21, 1.2))
    assert slower.mark([o0, o1], remeasure((1.3, 1.3, 1.31), (1.0, 1.01, 1.0))) == 1
    assert o1["slower_than"][0]["interleaved_ratio"] == pytest.approx(1.3)
    assert "SLOWER than O0 (1.20x; 1.30x timed in turns)" in o1["check"]
    # rows not slower in the table are not measured again
    asked.clear()
    assert slower.mark([o0, synthetic_row(level="O1", times=(1.0, 1.0, 1.0))], remeasure((9, 9, 9), (1, 1, 1))) == 0
    assert asked == []


def test_measure_interleaved_takes_turns():
    order = []

    def variant(name, fail=False):
        def make(args0):
            def fn(x):
                if fail:
                    raise ValueError("boom")
                order.append(name)
                return kiln.Tensor(np.array([x], np.float32))
            return fn
        return workloads.Variant("kiln.jit", True, "O0", "trace", "kbk", "false", make, workloads.kiln_results)

    a, b, bad = workloads.measure_interleaved([variant("a"), variant("b"), variant("bad", fail=True)],
                                              (0.0,), [(1.0,), (2.0,)], repeat=3)
    assert order == ["a", "b"] + ["a", "a", "b", "b"] * 3  # prepared, then whole repetitions in turns
    assert len(a.rep_s) == len(b.rep_s) == 3 and a.error is None
    assert a.last[0].tolist() == [2.0] and a.first[0].tolist() == [0.0]
    assert bad.error == "ValueError: boom" and bad.rep_s == []


def test_versus_best_peer_and_the_bound_at_peak():
    from kiln.bench import report

    eager = synthetic_row("kiln", times=(3.0, 3.0, 3.0))
    o0 = synthetic_row(level="O0", times=(2.0, 2.1, 2.0))
    o1 = synthetic_row(level="O1", times=(1.0, 1.1, 1.0))
    torch_row = synthetic_row(system="torch", times=(1.4, 1.5, 1.4))
    jax_row = synthetic_row(system="jax.jit", times=(1.2, 1.2, 1.3))
    failed = synthetic_row(system="torch.compile", times=(0.1, 0.1, 0.1))
    failed["error"] = "boom"  # a failed peer is no peer
    record = {"rows": [eager, o0, o1, torch_row, jax_row, failed], "flops": 100e9, "sgemm_peak_gflops": 200.0}
    v = report.versus_best_peer(record)
    assert v["kiln_s"] == 1.0 and v["peer"] == "jax.jit" and v["peer_s"] == 1.2
    assert v["peer_over_kiln"] == pytest.approx(1.2)
    assert v["at_peak_s"] == pytest.approx(0.5) and v["peer_over_at_peak"] == pytest.approx(2.4)
    text = report.versus_best_peer_text(v)
    assert "1.20x kiln's time" in text and "more than 2.40x faster" in text
    assert report.versus_best_peer({"rows": [eager, o0, o1]}) is None  # no peer ran
    record["flops"] = 1e9  # 5 ms at the peak against kiln's 1 s: not what bounds it
    assert "memory traffic, not arithmetic" in report.versus_best_peer_text(report.versus_best_peer(record))
    del record["sgemm_peak_gflops"]
    assert "at_peak_s" not in report.versus_best_peer(record)


def test_slower_compares_only_rows_that_differ_in_one_setting():
    from kiln.bench import slower

    o0_kbk = synthetic_row(level="O0", times=(1.0, 1.0, 1.0))
    o1_sink = synthetic_row(level="O1", backend="sink", times=(2.0, 2.0, 2.0))  # differs in two settings
    peer = synthetic_row(system="torch", times=(0.1, 0.1, 0.1))
    peer.update(jit_level="-", capture_mode="-", backend="-", fullgraph="-", infer_boost="-")
    assert slower.baselines(o1_sink, [o0_kbk, o1_sink, peer]) == []
    assert slower.baselines(peer, [o0_kbk, o1_sink, peer]) == []  # peers are never marked
    o2 = synthetic_row(level="O2", times=(1.0, 1.0, 1.0))
    o1 = synthetic_row(level="O1", times=(1.0, 1.0, 1.0))
    assert [name for name, _ in slower.baselines(o2, [o0_kbk, o1, o2])] == ["O1"]


def test_slower_mark_in_the_table(tmp_path, monkeypatch, capsys):
    """A kiln.jit row made slow on purpose is marked SLOWER in the printed table and the JSON,
    and the command still exits 0 (a mark is a finding, not a failure)."""
    import time as _time

    real = bench_main.kiln_variants

    def with_a_slow_one(workload, jit_variants):
        rows = real(workload, [v for v in jit_variants if (v.capture_mode, v.jit_level) == ("trace", "O0")
                                 and v.backend == "kbk"])

        def make(args0):
            jf = kiln.jit(workload.model, capture_mode="trace", jit_level="O1")

            def slow(*args):
                _time.sleep(0.002)
                return jf(*args)
            return slow
        return rows + [workloads.Variant("kiln.jit", True, "O1", "trace", "kbk", "false", make, workloads.kiln_results,
                                         infer_boost="off")]

    monkeypatch.setattr(bench_main, "kiln_variants", with_a_slow_one)
    out = tmp_path / "bench.json"
    rc = bench_main.main(["--smallest", "--only", "simple", "--peers", "none", "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0
    record = json.loads(out.read_text())
    rows = record["workloads"][0]["rows"]
    assert [r["jit_level"] for r in rows] == ["-", "O0", "O1"]
    assert [s["than"] for s in rows[2]["slower_than"]] == ["eager", "O0"]
    assert all(s["interleaved_ratio"] > 1 for s in rows[2]["slower_than"])  # confirmed when timed in turns
    assert "timed in turns" in rows[2]["check"]
    assert record["slower"] == 1 and "1 kiln.jit row SLOWER" in text
    assert "SLOWER than eager" in text
    assert max(len(line) for line in text.splitlines()) <= 100, "the default output fits 100 columns"


# ---- the report's width (issue 29 item 9) -------------------------------------------------------------


def fixed_workload():
    """A workload record as __main__ makes it, with the widest cells a run can print: the longest
    system and variant names, times in seconds, a mismatch also marked SLOWER, notes, peers."""
    from kiln.bench import report

    eager = synthetic_row("kiln", times=(0.3462, 0.3482, 0.400), runs=20)
    eager_fast = synthetic_row("kiln", times=(17.31e-3, 17.41e-3, 20.0e-3), runs=20)  # a spread across units
    boost = synthetic_row(level="O1", boost="on", times=(0.2292, 0.2080, 0.2514), runs=20)
    full = synthetic_row(level="O0", capture="ast", fullgraph="true", times=(396.5, 383.0, 407.6), runs=20)
    full["check"] = ("MISMATCH 3.25x tol (grad conv1.weight) (ran eagerly 2x) SLOWER than eager "
                     "(1.23x; 1.10x timed in turns)")
    full["agree"], full["slower_than"] = False, [{"than": "eager", "ratio": 1.23}]
    slow = synthetic_row(level="O1", backend="sink", times=(0.39, 0.38, 0.40), runs=20)
    slow["check"] = "ok SLOWER than eager (1.13x; 1.11x timed in turns), O0 (1.10x; 1.08x timed in turns)"
    slow["slower_than"] = [{"than": "eager", "ratio": 1.13}, {"than": "O0", "ratio": 1.10}]
    ms = synthetic_row("mindspore.jit", level="O0", capture="bytecode", backend="ms_backend",
                       times=(1.01, 0.92, 1.14), runs=20)
    ms["infer_boost"] = "-"
    tjt = synthetic_row("torch.jit.trace", level="-", capture="trace", backend="torchscript",
                        times=(0.412, 0.401, 0.434), runs=20)
    tjt.update(fullgraph="-", infer_boost="-")
    rows = [eager, boost, full, slow, ms, tjt]
    for r in rows + [eager_fast]:
        r.update(enable_jit=r["system"] != "kiln", prepare_s=992.64e-3, thousand_runs_s=r["per_run_s"] * 1000)
        r["gflops_per_s"] = 2.423 / r["per_run_s"]
        r["peak_fraction"] = r["gflops_per_s"] / 174.5
    rows[0]["check"] = "reference"
    rows.append(dict(eager_fast, system="torch", peak_fraction=16.0))  # "of peak" past 1000%
    record = {"title": "conv: ResNet BasicBlock, forward", "runs": 20, "repeat": 3, "flops": 2.423e9,
              "shapes": "BasicBlock 128->128 channels, stride 1; x float32 1x128x64x64; eval mode",
              "sgemm_peak_gflops": 174.5, "load_before": 1.36, "load_after": 1.79, "rows": rows,
              "notes": ["kiln.jit trace O1 sink: 1.25x kbk's time in the table, 0.99x when the two were timed again "
                        "in turns (3 repetitions each): not slower by more than the spread, so not marked"]}
    record["versus_best_peer"] = report.versus_best_peer(record)
    return record


def test_default_table_fits_100_columns_and_wide_keeps_every_column():
    import io

    from kiln.bench import report

    record = fixed_workload()
    out = io.StringIO()
    report.print_workload(record, out)
    text = out.getvalue()
    too_wide = [line for line in text.splitlines() if len(line) > 100]
    assert not too_wide, "\n".join(too_wide)
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("system"))
    assert header.split() == ["system", "variant", "prepare", "per", "run", "spread", "of", "peak", "check"]
    row = {line.split()[0]: line for line in lines[lines.index(header) + 1:lines.index(header) + 8]}
    assert "865.5-1000" in row["torch"] and "1600%" in row["torch"]  # cells kept to their widths
    assert "ast O0 kbk fullgraph" in text and "trace O1 kbk infer_boost" in text
    assert "bytecode O0 ms_backend" in row["mindspore.jit"] and "trace torchscript" in row["torch.jit.trace"]
    assert "11.46 ms" in text and "10.40-12.57" in text  # the infer_boost row: median, spread in ms
    assert "396.50 s" not in text and "19.82 s" in text  # per run = 396.5 s / 20 runs
    assert "MISMATCH *" in text and "ok SLOWER *" in text  # short verdicts in the column
    full_check = record["rows"][2]["check"]
    assert " ".join(text.split()).count(full_check) == 1  # the whole check text under the table
    assert "versus peers:" in text and "note: kiln.jit trace O1 sink" in text

    wide = io.StringIO()
    report.print_workload(record, wide, wide=True)
    wide_text = wide.getvalue()
    for column in ("enable jit", "jit level", "capture mode", "backend", "fullgraph", "infer boost", "time for runs",
                   "x1000 runs", "GFLOP/s", "of peak"):
        assert column in wide_text
    assert any(full_check in line and line.startswith("kiln.jit") for line in wide_text.splitlines())


def test_wide_flag_and_default_through_main(capsys):
    rc = bench_main.main(["--smallest", "--only", "simple", "--peers", "none", "--repeat", "2"])
    default = capsys.readouterr().out
    rc_wide = bench_main.main(["--smallest", "--only", "simple", "--peers", "none", "--repeat", "2", "--wide"])
    wide = capsys.readouterr().out
    assert rc == rc_wide == 0
    assert max(map(len, default.splitlines())) <= 100
    assert "time for runs" in wide and "time for runs" not in default.split("## simple")[1]
    assert max(map(len, wide.splitlines())) > 100  # --wide: the full detail, unwrapped


# ---- the plot (issue 19 part 5; issue 29 item 9) ---------------------------------------------------------


def test_plot_panels_best_row_per_system_relative_to_best_peer():
    from kiln.bench import report

    conv = fixed_workload()
    conv["rows"] = [r for r in conv["rows"] if r["system"] != "torch"]  # the best peer: torch.jit.trace
    simple = {"title": "simple function f(a, b, c) = a * b + c", "rows": [
        synthetic_row("kiln", times=(3.0, 3.0, 3.0)),
        synthetic_row(level="O0", times=(2.0, 2.0, 2.0)),
        synthetic_row(level="O1", times=(1.0, 1.0, 1.2))]}
    failed = synthetic_row("torch", times=(0.1, 0.1, 0.1))
    failed["per_run_s"] = float("nan")  # a failed peer has no time
    simple["rows"].append(failed)
    record = {"workloads": [conv, simple, {"title": "nothing measured", "rows": [failed]}]}
    panels = report.plot_panels(record)
    assert [p["title"] for p in panels] == [conv["title"], simple["title"]]  # one panel per measured workload

    bars = panels[0]["bars"]
    assert [b["system"] for b in bars] == ["kiln", "kiln.jit", "torch.jit.trace", "mindspore.jit"]  # one per system
    by = {b["system"]: b for b in bars}
    jit_rows = [r for r in conv["rows"] if r["system"] == "kiln.jit"]
    assert by["kiln.jit"]["row"] is min(jit_rows, key=lambda r: r["per_run_s"])  # its best row
    peer_s = by["torch.jit.trace"]["row"]["per_run_s"]  # the best peer (faster than mindspore.jit)
    assert panels[0]["reference"] == "best peer (torch.jit.trace)"
    for b in bars:
        assert b["ratio"] == pytest.approx(b["row"]["per_run_s"] / peer_s)
        assert b["lo"] <= b["ratio"] <= b["hi"]
    assert by["torch.jit.trace"]["ratio"] == 1.0
    assert len({b["colour"] for b in bars}) == len(bars)  # distinct colours

    # no peer measured: relative to kiln eager, and each system keeps its colour across panels
    bars2 = panels[1]["bars"]
    assert [b["system"] for b in bars2] == ["kiln", "kiln.jit"]
    assert panels[1]["reference"] == "kiln (no peer ran)"
    assert [b["ratio"] for b in bars2] == [1.0, pytest.approx(1.0 / 3.0)]
    assert {b["system"]: b["colour"] for b in bars2} == {s: by[s]["colour"] for s in ("kiln", "kiln.jit")}



def test_plot_writes_a_png(tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (bash ./scripts/bench.sh installs it)")
    png = tmp_path / "bench.png"
    rc = bench_main.main(["--smallest", "--peers", "none", "--repeat", "2", "--only", "attention", "--plot",
                          str(png)])
    assert rc == 0
    assert f"plot written to {png}" in capsys.readouterr().out
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_plot_without_matplotlib_is_a_clear_error(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    with pytest.raises(SystemExit) as e:
        bench_main.main(["--smallest", "--peers", "none", "--plot", "x.png"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--plot needs matplotlib" in err and "pip install matplotlib" in err
