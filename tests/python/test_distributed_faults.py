"""A rank that raises, dies, or never reaches a collective ends every rank of the job with a
clear error in bounded time, never a hang (a collective that outlasts the timeout ends the job,
naming the collective, the rank and the shape)."""
import time

from distributed_util import needs_mpi, run_ranks

pytestmark = needs_mpi

PRELUDE = """
import os, signal, time
import numpy as np
import kiln
from kiln import communication
from kiln.ops import collective as C

communication.init()
r = communication.get_rank()
x = kiln.tensor(np.ones(4, np.float32))
C.all_reduce(x)
"""


def _ends_fast(source, limit, env=None):
    start = time.monotonic()
    p = run_ranks(2, PRELUDE + source, timeout=limit + 30, env=env, expect_ok=False)
    took = time.monotonic() - start
    assert p.returncode != 0, p.stdout + p.stderr
    assert took < limit, (took, p.stdout + p.stderr)
    return p.stdout + p.stderr


def test_a_rank_raising_ends_every_rank():
    out = _ends_fast("""
if r == 1:
    raise ValueError("rank one gives up")
C.all_reduce(x)
time.sleep(60)  # not reached: the job is ended
""", limit=40)
    assert "rank one gives up" in out
    assert "rank 1 raised ValueError; ending every rank of the job" in out


def test_a_rank_killed_mid_step_ends_every_rank():
    out = _ends_fast("""
if r == 1:
    os.kill(os.getpid(), signal.SIGKILL)
C.all_reduce(x)
time.sleep(60)
""", limit=40, env={"KILN_COMM_TIMEOUT": "20"})
    assert "signal 9" in out or "killed" in out.lower() or "timed out" in out, out


def test_a_rank_that_never_arrives_times_out_with_a_clear_error():
    out = _ends_fast("""
if r == 1:
    time.sleep(120)
C.all_reduce(x)
""", limit=60, env={"KILN_COMM_TIMEOUT": "3"})
    assert "kiln: all_reduce(sum) of float32(4,) on rank 0 of 2: timed out after 3 s waiting for the other ranks " \
           "(one died, raised, or has not reached this collective" in out, out


def test_the_timeout_is_set_from_python():
    out = _ends_fast("""
communication.set_timeout(2)
assert communication.get_timeout() == 2
if r == 0:
    time.sleep(120)
C.broadcast(x, 0)
""", limit=60)
    assert "kiln: broadcast root 0 of float32(4,) on rank 1 of 2: timed out after 2 s" in out, out


def test_ctrl_c_stops_every_rank():
    import os
    import signal
    import subprocess
    import sys
    import tempfile

    from distributed_util import PYTHON_DIR
    from kiln.distributed.mpirun import environment, mpirun_command

    with tempfile.TemporaryDirectory(prefix="kiln-dist-test-") as tmp:
        path = os.path.join(tmp, "spin.py")
        with open(path, "w") as f:
            f.write(PRELUDE + "print('started', flush=True)\nwhile True:\n    C.all_reduce(x)\n")
        env = environment()
        env["PYTHONPATH"] = PYTHON_DIR
        p = subprocess.Popen(mpirun_command(2, [sys.executable, path], threads=1, extra=["--oversubscribe"]), env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        line = p.stdout.readline()  # both ranks print it; unbuffered, the two may share one line
        assert "started" in line, line
        start = time.monotonic()
        p.send_signal(signal.SIGINT)
        try:
            p.wait(timeout=30)
        finally:
            if p.poll() is None:
                p.kill()
        assert p.returncode != 0 and time.monotonic() - start < 30
