"""Profiling (issue 14): the C recorder's kernel events per backend (counts = nodes x runs, source
lines, shapes), FLOPs against hand counts, the Chrome Trace JSON's required fields, MegEngine's
get_profile() shape and the profile_analyze tool, key_averages, compile phases, two threads
profiled at once, memory reports against the allocator, DOT output, and results unchanged by
recording (the sink runs its steps interpreted while recorded)."""
import json
import shutil
import subprocess
import threading

import numpy as np
import pytest

import kiln
from kiln import _C, ops
from kiln.profiler import megengine_profile, parse_shape, profile
from kiln.tools import profile_analyze

rng = np.random.default_rng(14)


def T(*shape):
    return kiln.tensor(rng.standard_normal(shape).astype(np.float32))


def _mlp(x, w1, w2):
    h = ops.relu(x @ w1)
    return (h @ w2).tanh() * 0.5


def _kernels(prof, source=None):
    return [e for e in prof.events() if e["kind"] == "kernel" and (source is None or e["source"] == source)]


@pytest.mark.parametrize("backend", ["kbk", "sink"])
def test_event_count_is_nodes_times_runs_with_locations(backend):
    x, w1, w2 = T(8, 16), T(16, 32), T(32, 4)
    jf = kiln.jit(_mlp, jit_level="O0", backend=backend)
    ref = jf(x, w1, w2).numpy()  # compiled; later calls replay
    nodes = jf.executable(x, w1, w2).order().split()
    runs = 3
    with profile() as prof:
        outs = [jf(x, w1, w2) for _ in range(runs)]
    events = _kernels(prof, backend)
    assert len(events) == len(nodes) * runs
    assert [e["name"] for e in events] == nodes * runs
    for e in events:
        assert e["loc"] and "test_profiler.py:" in e["loc"]
        assert e["end"] >= e["start"] and e["depth"] == 0
    mm = next(e for e in events if e["name"] == "matmul")
    assert mm["inputs"] == ["float32[8,16]", "float32[16,32]"] and mm["outputs"] == ["float32[8,32]"]
    for out in outs:  # recording changes no result (the sink ran interpreted)
        np.testing.assert_array_equal(out.numpy(), ref)


def test_sunk_graph_gives_the_same_results_recorded():
    x, w = T(16, 16), T(16, 16)

    def f(a, b):
        h = a @ b
        return (ops.gelu(h) * 0.5 + h.exp().tanh()).sum(axis=1) + ops.softmax(h, axis=-1).mean(axis=0)

    jf = kiln.jit(f, jit_level="O2", backend="sink")
    jf(x, w)
    ref = jf(x, w).numpy()
    with profile() as prof:
        got = jf(x, w).numpy()
    np.testing.assert_array_equal(got, ref)  # recorded, the steps run interpreted: the same kernels
    names = [e["name"] for e in _kernels(prof, "sink")]
    assert "matmul" in names and any(n.startswith("fused(") and "tanh" in n for n in names)


def test_flops_and_bytes_match_hand_counts():
    a, b = T(5, 7), T(7, 3)
    x, w, bias = T(2, 3, 9, 9), T(4, 3, 3, 3), T(4)
    with profile() as prof:
        a @ b
        a + 1.0
        a.sum()
        ops.conv2d(x, w, bias)
    ev = {e["name"]: e for e in _kernels(prof, "eager")}
    assert ev["matmul"]["flops"] == 2 * 5 * 3 * 7
    assert ev["matmul"]["bytes_read"] == 4 * (5 * 7 + 7 * 3) and ev["matmul"]["bytes_written"] == 4 * 5 * 3
    assert ev["add"]["flops"] == 5 * 7
    assert ev["sum"]["flops"] == 5 * 7
    assert ev["conv2d"]["flops"] == 2 * (2 * 4 * 7 * 7) * (3 * 3 * 3) + 2 * 4 * 7 * 7  # MACs x 2, then the bias
    assert ev["conv2d"]["outputs"] == ["float32[2,4,7,7]"]


def test_fused_group_counts_its_ops():
    x = T(6, 10)
    jf = kiln.jit(lambda a: (a * 2.0 + 1.0).exp(), jit_level="O1")
    jf(x)
    with profile() as prof:
        jf(x)
    (e,) = _kernels(prof, "kbk")
    assert e["name"].startswith("fused(") and set(e["name"][6:-1].split("+")) == {"mul", "add", "exp"}
    assert e["flops"] == 3 * 60


def test_conv_epilogue_counts_bias_and_activation():
    x, w, bias = T(1, 4, 6, 6), T(8, 4, 3, 3), T(8)
    jf = kiln.jit(lambda a, k, c: ops.relu(ops.conv2d(a, k, c)), jit_level="O1", infer_boost="on")
    jf(x, w, bias)
    with profile() as prof:
        jf(x, w, bias)
    (e,) = [e for e in _kernels(prof, "kbk") if e["name"] == "conv2d_fused"]
    out = 1 * 8 * 4 * 4
    assert e["flops"] == 2 * out * (4 * 3 * 3) + 2 * out  # the products, then the bias and the relu


REQUIRED = {"X": ("name", "ph", "ts", "dur", "pid", "tid"), "C": ("name", "ph", "ts", "pid", "args"),
            "M": ("name", "ph", "pid", "tid", "args")}


def test_chrome_trace_json(tmp_path):
    path = tmp_path / "trace.json"
    x, w1, w2 = T(4, 8), T(8, 8), T(8, 2)
    jf = kiln.jit(_mlp, jit_level="O1")
    with profile(path=str(path)) as prof:
        jf(x, w1, w2)  # first call: capture and compile phases, then eager kernels of the capture
        jf(x, w1, w2)
    doc = json.loads(path.read_text())
    events = doc["traceEvents"]
    for e in events:
        for field in REQUIRED[e["ph"]]:
            assert field in e, (field, e)
    complete = [e for e in events if e["ph"] == "X"]
    kernels = [e for e in complete if e["cat"] in ("kbk", "eager")]
    assert kernels and all(e["dur"] >= 0 and "location" in e["args"] and "flops" in e["args"] for e in kernels)
    assert any(e["cat"] == "compile" and e["name"] == "fuse_elementwise" for e in complete)
    capture = next(e for e in complete if e["cat"] == "compile" and e["name"] == "capture")
    plan = next(e for e in complete if e["cat"] == "compile" and e["name"] == "plan")
    assert capture["ts"] <= plan["ts"] and plan["ts"] + plan["dur"] <= capture["ts"] + capture["dur"] + 1e-3
    assert any(e["ph"] == "C" and e["name"] == "memory" for e in events)
    names = [e for e in events if e["ph"] == "M" and e["name"] == "thread_name"]
    assert names and names[0]["args"]["name"] == threading.current_thread().name
    assert len(complete) == len([e for e in prof.events() if e["kind"] in ("kernel", "phase")])
    # without shapes or memory
    with profile(path=str(path), record_shapes=False, profile_memory=False):
        x + x
    events = json.loads(path.read_text())["traceEvents"]
    assert not any(e["ph"] == "C" for e in events)
    assert all("inputs" not in e["args"] for e in events if e["ph"] == "X")


def test_key_averages_table_and_nested_self_time():
    x = T(16, 16)

    def body(a):
        return ops.cond(a.sum() > -1e9, lambda v: (v @ v).exp(), lambda v: v * 2.0, (a,))

    jf = kiln.jit(body, jit_level="O0")
    jf(x)
    with profile() as prof:
        for _ in range(2):
            jf(x)
    rows = {r.key: r for r in prof.key_averages()}
    assert rows["if"].count == 2 and rows["matmul"].count == 2 and rows["exp"].count == 2
    assert "mul" not in rows  # the branch not taken
    nested = [e for e in _kernels(prof) if e["name"] == "matmul"]
    assert all(e["depth"] == 1 for e in nested)  # inside the if node
    r = rows["if"]
    assert 0 <= r.self_ns < r.total_ns  # its body's kernels are not its own time
    assert rows["matmul"].self_ns == rows["matmul"].total_ns
    text = prof.key_averages().table(sort_by="total", row_limit=3)
    assert text.splitlines()[0].split()[:3] == ["op", "calls", "total"] and len(text.splitlines()) == 3 + 3
    with pytest.raises(ValueError, match="sort_by"):
        prof.key_averages().table(sort_by="nope")
    by_shape = prof.key_averages(group_by_input_shape=True)
    assert any(r.input_shapes == ("float32[16,16]", "float32[16,16]") for r in by_shape if r.key == "matmul")


def test_trace_get_profile_matches_megengine_shape(tmp_path, capsys):
    x, w1, w2 = T(4, 8), T(8, 8), T(8, 2)
    t = kiln.trace(_mlp, profiling=True, opt_level=0)
    for _ in range(4):
        t(x, w1, w2)  # the first call records eagerly: 3 compiled runs
    p = t.get_profile()
    ops_ = p["graph_exec"]["operator"]
    nodes = t._last.executable.order().split()
    assert sorted(op["type"] for op in ops_.values()) == sorted(nodes)
    for oid, op in ops_.items():
        assert set(op) >= {"id", "name", "type", "input", "output"} and op["id"] == oid
        for v in op["input"] + op["output"]:
            assert set(p["graph_exec"]["var"][v]) >= {"shape", "dtype"}
        runs = p["profiler"]["host"][oid]
        assert len(runs) == 3 and all(r["start"] <= r["kern"] <= r["end"] for r in runs.values())
        assert p["profiler"]["device"][oid] == runs
        fp = p["profiler"]["opr_footprint"][oid]
        assert set(fp) >= {"computation", "memory", "in_shapes", "out_shapes"}
    mm = next(o for o in ops_ if ops_[o]["type"] == "matmul")
    assert p["profiler"]["opr_footprint"][mm]["computation"] == 2 * 4 * 8 * 8
    assert any(ph["name"] == "capture" for ph in p["kiln"]["phases"])
    path = tmp_path / "prof.json"
    path.write_text(json.dumps(p))
    assert profile_analyze.main([str(path), "-t", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "operators" in out[0] and len(out) == 3 + 2  # total, header, rule, the top 2
    assert profile_analyze.main([str(path), "--aggregate-by", "type", "--min-time", "0"]) == 0
    out = capsys.readouterr().out
    assert "matmul" in out and "tanh" in out
    pytest.importorskip("matplotlib")
    png = tmp_path / "ops.png"
    assert profile_analyze.main([str(path), "--plot", str(png)]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_jit_profiling_option_and_jit_config():
    x, w1, w2 = T(4, 8), T(8, 8), T(8, 2)
    jf = kiln.jit(_mlp, profiling=True)
    jf(x, w1, w2)
    jf(x, w1, w2)
    jf(x, w1, w2)
    runs = {len(r) for r in jf.get_profile()["profiler"]["host"].values()}
    assert runs == {2}
    with pytest.raises(RuntimeError, match="profiling=False"):
        kiln.jit(_mlp).get_profile()
    with pytest.raises(TypeError, match="profiling must be True or False"):
        kiln.jit(_mlp, profiling=1)
    assert kiln.JitConfig(profiling=True).jit_options().profiling is True


def test_two_threads_give_two_consistent_tracks(tmp_path):
    start, finished, done = threading.Barrier(2), threading.Barrier(3), threading.Event()

    def work(a):
        start.wait()
        for _ in range(20):
            a = (a * 1.0001).tanh()
        finished.wait()
        done.wait()  # alive until the profile closed: its name goes into the trace

    threads = [threading.Thread(target=work, args=(T(64, 64),), name=f"worker{k}") for k in range(2)]
    with profile(path=tmp_path / "threads.json") as prof:
        for th in threads:
            th.start()
        finished.wait()
    done.set()
    for th in threads:
        th.join()
    tracks = {}
    for e in _kernels(prof, "eager"):
        tracks.setdefault(e["tid"], []).append(e)
    assert set(tracks) == {th.native_id for th in threads} and all(len(t) == 40 for t in tracks.values())
    for track in tracks.values():  # one thread's kernels never overlap
        track.sort(key=lambda e: e["start"])
        assert all(a["end"] <= b["start"] for a, b in zip(track, track[1:]))
        assert [e["name"] for e in track] == ["mul", "tanh"] * 20
    events = json.loads((tmp_path / "threads.json").read_text())["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {names[th.native_id] for th in threads} == {"worker0", "worker1"}


def test_memory_report_peak_agrees_with_the_allocator():
    x, w1, w2 = T(128, 256), T(256, 256), T(256, 64)

    def f(a, b, c):
        h = (a @ b).relu()
        g = h * h + h
        return g @ c

    jf = kiln.jit(f, jit_level="O0")
    r = jf.memory_report(x, w1, w2)
    assert r.arena_bytes == jf.executable(x, w1, w2).arena_bytes > 0
    assert r.output_bytes == 128 * 64 * 4
    assert abs(r.measured_peak_bytes - r.planned_peak_bytes) <= 0.05 * r.planned_peak_bytes
    assert r.eager_peak_bytes > 0 and r.live_bytes <= r.arena_bytes
    assert r.buffers and r.buffers[0]["bytes"] == 128 * 256 * 4 and r.buffers[0]["loc"]
    assert sum(b["bytes"] for b in r.buffers) == r.live_bytes
    assert "largest buffers" in str(r)
    plan_only = jf.memory_report()
    assert plan_only.measured_peak_bytes is None and plan_only.arena_bytes == r.arena_bytes


def _check_dot(text):
    """Balanced braces; every edge joins declared nodes."""
    assert text.startswith("digraph kiln {") and text.count("{") == text.count("}")
    declared = {line.split()[0] for line in text.splitlines() if "[shape=" in line}
    for line in text.splitlines():
        if "->" in line:
            a, b = line.strip().rstrip(";").split(" -> ")
            assert a in declared and b in declared, line


def test_graph_dot_clusters_and_draw(tmp_path):
    x = T(4, 4)

    def f(a):
        b = (a * 2.0 + 1.0).exp()
        return ops.cond(b.sum() > 0, lambda v: v.sin() + 1.0, lambda v: v * 3.0, (b,))

    jf = kiln.jit(f, jit_level="O1")
    jf(x)
    text = jf.graph_dot()
    _check_dot(text)
    assert 'label="fused group' in text and 'label="then"' in text and 'label="else"' in text
    assert text.count("subgraph cluster_") >= 4  # the fused group, the if and its two bodies
    assert "float32[4,4]" in text and "test_profiler.py:" in text
    out = kiln.tools.draw(jf, tmp_path / "g.dot")
    assert open(out).read() == text
    if shutil.which("dot") is None:
        with pytest.raises(RuntimeError, match="needs Graphviz"):
            kiln.tools.draw(jf, tmp_path / "g.svg")
        pytest.skip("Graphviz's dot is not installed: SVG not drawn")
    subprocess.run(["dot", "-Tsvg", "-o", str(tmp_path / "g.svg")], input=text.encode(), check=True)
    kiln.tools.draw(jf, tmp_path / "g2.svg")
    assert "<svg" in (tmp_path / "g2.svg").read_text()


def test_helpers_and_errors():
    assert parse_shape("int64[]") == ("int64", ())
    with pytest.raises(ValueError, match="dtype\\[shape\\]"):
        parse_shape("nope")
    assert megengine_profile([])["graph_exec"]["operator"] == {}
    p = profile()
    with pytest.raises(RuntimeError, match="still open"):
        p.events()
    with pytest.raises(TypeError, match="path must be"):
        profile(path=3)
    assert _C.profile_events(0) == []  # the last session to close emptied the list
