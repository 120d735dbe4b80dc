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
