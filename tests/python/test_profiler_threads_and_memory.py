"""kiln.profiler against what users do: threads whose names hold NUL characters or lone surrogates
(profile() raised on entry), and long profiles (issue 28)."""
import json
import threading

import numpy as np

import kiln
from kiln import ops


def test_thread_named_with_a_nul_and_a_surrogate(tmp_path):
    go, done = threading.Event(), threading.Event()
    x = kiln.tensor(np.ones(3, np.float32))

    def work():
        go.wait()
        ops.tanh(x)
        done.set()

    t = threading.Thread(target=work, name="worker\x00tail\udc80")
    t.start()
    with kiln.profiler.profile() as p:
        go.set()
        done.wait(30)
        ops.exp(x)
    t.join()
    path = tmp_path / "trace.json"
    p.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert names[t.native_id] == "worker\\x00tail\\udc80"
    assert {e["name"] for e in events if e["ph"] == "X" and e["tid"] == t.native_id} >= {"tanh"}


def test_a_long_profile_is_held_packed_in_c(tmp_path):
    """About 200k events (eager ops with their allocations): the closed profile holds them in C at
    under 100 bytes each, Python holds almost nothing for them, and the trace written from C has
    every one. (Each event was a Python dict: 1.28 GiB for 100k ops.)"""
    import tracemalloc

    x = kiln.tensor(np.ones((2, 3), np.float32))
    n_ops = 60000
    tracemalloc.start()
    with kiln.profiler.profile(record_shapes=True) as p:
        for _ in range(n_ops):
            ops.add(x, x)
        before_exit = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
    retained_py = tracemalloc.get_traced_memory()[0] - before_exit
    exit_peak_py = tracemalloc.get_traced_memory()[1] - before_exit
    tracemalloc.stop()
    n = len(p._log)
    assert n >= 3 * n_ops  # a kernel, an allocation and a free per op
    per_event = p.nbytes / n
    print(f"{n} events: {p.nbytes} bytes in C, {per_event:.1f} bytes/event; Python retained {retained_py} bytes, "
          f"peak while closing {exit_peak_py} bytes")
    assert per_event < 100
    assert retained_py < 64 * 1024 and exit_peak_py < 1024 * 1024
    # what it reads back is what ran
    rows = {r.key: r for r in p.key_averages()}
    assert rows["add"].count == n_ops
    assert p.peak_memory_bytes > 0
    path = tmp_path / "trace.json"
    p.export_chrome_trace(path)
    events = json.loads(path.read_text())["traceEvents"]
    assert sum(e["ph"] == "X" and e["name"] == "add" for e in events) == n_ops
    assert sum(e["ph"] == "C" for e in events) == n - n_ops
    kernels = [e for e in p.events() if e["kind"] == "kernel"]
    assert len(kernels) == n_ops and kernels[0]["inputs"] == ["float32[2,3]", "float32[2,3]"]
