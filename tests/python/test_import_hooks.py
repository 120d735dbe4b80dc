"""The hooks kiln.jit installs at import into lower modules are in place after `import kiln`.
A module of kiln.ops importing kiln.jit early (while kiln._tensor was still loading) once let
kiln._tensor's own initialisation reset them, and compiled functions assigning .grad silently
replayed stale gradients. Checked in a fresh interpreter, whatever this test process imported."""
import os
import subprocess
import sys

CHECK = """
import kiln, kiln._tensor as t
from kiln.jit import replay
assert t.grad_written_while_tracing is replay.grad_written, t.grad_written_while_tracing
assert t.grad_read_while_tracing is not None
print("ok")
"""


def test_jit_hooks_survive_import_order():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    p = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stdout + p.stderr
