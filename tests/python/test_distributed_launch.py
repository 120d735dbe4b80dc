"""Launching ranks: `python -m kiln.distributed.run --nproc N train.py args` and MegEngine's
`launcher` decorator called from a program started alone, both over mpirun (as root in this
container: the launchers add what Open MPI needs); threads per rank default to cores / ranks."""
import os
import subprocess
import sys
import tempfile
import textwrap

from distributed_util import PYTHON_DIR, needs_mpi

pytestmark = needs_mpi


def _run(args, source, timeout=120):
    with tempfile.TemporaryDirectory(prefix="kiln-launch-test-") as tmp:
        path = os.path.join(tmp, "train.py")
        with open(path, "w") as f:
            f.write(textwrap.dedent(source))
        env = dict(os.environ, PYTHONPATH=PYTHON_DIR)
        for var in ("OMP_NUM_THREADS", "OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"):
            env.pop(var, None)  # the launchers must manage without them
        return subprocess.run([sys.executable, *args(path)], env=env, capture_output=True, text=True,
                              timeout=timeout, cwd=tmp)


def test_kiln_distributed_run_starts_the_ranks():
    p = _run(lambda path: ["-m", "kiln.distributed.run", "--nproc", "2", path, "--lr", "0.5"], """
        import sys
        import numpy as np
        import kiln
        from kiln import communication
        communication.init()
        r = communication.get_rank()
        total = kiln.ops.collective.all_reduce(kiln.tensor(np.array([r + 1.0]))).item()
        print(f"rank {r} of {communication.get_group_size()} args {sys.argv[1:]} total {total} "
              f"threads {kiln.get_num_threads()}")
    """)
    assert p.returncode == 0, p.stdout + p.stderr
    threads = max(1, (os.cpu_count() or 1) // 2)
    for r in range(2):
        assert f"rank {r} of 2 args ['--lr', '0.5'] total 3.0 threads {threads}" in p.stdout, p.stdout + p.stderr


def test_kiln_distributed_run_reports_a_failing_rank():
    p = _run(lambda path: ["-m", "kiln.distributed.run", "--nproc", "2", path], """
        import kiln
        kiln.communication.init()
        if kiln.communication.get_rank() == 1:
            raise SystemExit(3)
    """)
    assert p.returncode != 0


def test_launcher_runs_a_function_on_every_rank():
    p = _run(lambda path: [path], """
        import numpy as np
        import kiln
        import kiln.distributed as dist


        @dist.launcher(n_gpus=2)
        def worker(scale):
            x = kiln.tensor(np.full(2, scale * (dist.get_rank() + 1.0)))
            return dist.get_rank(), dist.get_world_size(), dist.functional.all_reduce_sum(x).numpy().tolist()


        @dist.launcher(n_gpus=2)
        def failing():
            if dist.get_rank() == 1:
                raise KeyError("rank one's trouble")
            dist.functional.all_reduce_sum(kiln.tensor(np.ones(1)))


        if __name__ == "__main__":
            print("results", worker(2.0))
            try:
                failing()
            except RuntimeError as e:
                print("failed:", "rank one's trouble" in str(e))
    """, timeout=180)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "results [(0, 2, [6.0, 6.0]), (1, 2, [6.0, 6.0])]" in p.stdout, p.stdout + p.stderr
    assert "failed: True" in p.stdout, p.stdout + p.stderr
