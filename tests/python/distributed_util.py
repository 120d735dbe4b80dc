"""Running a small program on several ranks under mpirun, for the tests of distributed training
(tests/python/test_distributed_*.py). They skip, saying why, where mpirun or kiln's mpi
backend (built when CMake finds MPI) is missing; scripts/install-deps.sh installs Open MPI."""
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PYTHON_DIR = os.path.join(ROOT, "python")


def _mpi_backend_built():
    import kiln

    return os.path.exists(os.path.join(os.path.dirname(kiln.__file__), "libkiln_comm_mpi.so")) or \
        bool(os.environ.get("KILN_COMM_MPI_LIBRARY"))


needs_mpi = pytest.mark.skipif(
    shutil.which("mpirun") is None or not _mpi_backend_built(),
    reason="needs mpirun and kiln's mpi backend (Open MPI: apt-get install openmpi-bin libopenmpi-dev, then "
           "rebuild; scripts/install-deps.sh installs them)")


def run_ranks(n, source, timeout=120, env=None, expect_ok=True):
    """Runs `source` (a Python program; the tests directory and kiln on its path) on n ranks under
    mpirun with one kernel thread each. Returns the CompletedProcess (stdout and stderr as text);
    with expect_ok, asserts it exited 0 and printed "rank r ok" for every rank."""
    from kiln.distributed.mpirun import environment, mpirun_command

    with tempfile.TemporaryDirectory(prefix="kiln-dist-test-") as tmp:
        path = os.path.join(tmp, "rank_program.py")
        with open(path, "w") as f:
            f.write(f"import sys\nsys.path[:0] = [{HERE!r}, {PYTHON_DIR!r}]\n" + textwrap.dedent(source))
        full_env = environment()
        full_env["PYTHONPATH"] = os.pathsep.join([PYTHON_DIR, HERE] + ([full_env["PYTHONPATH"]]
                                                                        if full_env.get("PYTHONPATH") else []))
        full_env.update(env or {})
        cmd = mpirun_command(n, [sys.executable, path], threads=1, extra=["--oversubscribe"])
        p = subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=timeout, cwd=tmp)
    if expect_ok:
        out = p.stdout + p.stderr
        assert p.returncode == 0, out[-6000:]
        for r in range(n):
            assert f"rank {r} ok" in p.stdout, out[-6000:]
    return p
