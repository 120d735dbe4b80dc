"""MegEngine's dist.launcher: a decorator whose function, when called, runs on N local ranks
(under mpirun, started here) and returns the list of each rank's result. Like multiprocessing's
spawn start method, each rank imports the caller's main script as "__mp_main__" (so code under
`if __name__ == "__main__":` does not run again) and finds the function there by name: it must
be defined at the top level of a module, and its arguments and result must pickle. Called inside
a job mpirun already started, it just runs the function on this rank."""
import functools
import os
import pickle
import subprocess
import sys
import tempfile

from .. import _C
from .mpirun import environment, mpirun_command


class launcher:
    """@launcher(n_gpus=N) or launcher(func, n_gpus=N): calling it runs func(*args, **kwargs) on N
    ranks (each with communication started) and returns [rank 0's result, rank 1's, ...]. An
    exception on a rank is raised here as a RuntimeError with that rank's output."""

    def __new__(cls, *args, **kwargs):
        if not args:
            return functools.partial(cls, **kwargs)
        return super().__new__(cls)

    def __init__(self, func, n_gpus=None, world_size=None, rank_start=0, master_ip="localhost", port=0,
                 device_type="cpu", backend=None, nproc=None, threads=None):
        n = nproc or world_size or n_gpus or os.cpu_count() or 1
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"launcher: the number of ranks must be an int >= 1, got {n!r}")
        self.func, self.n, self.threads = func, n, threads
        functools.update_wrapper(self, func)

    def __call__(self, *args, **kwargs):
        if _C.comm_initialized() or os.environ.get("OMPI_COMM_WORLD_SIZE"):
            from .. import communication

            communication.init()
            return self.func(*args, **kwargs)
        module = self.func.__module__
        main = sys.modules.get("__main__")
        script = getattr(main, "__file__", None) if module == "__main__" else None
        with tempfile.TemporaryDirectory(prefix="kiln-launch-") as tmp:
            job = os.path.join(tmp, "job.pkl")
            with open(job, "wb") as f:
                pickle.dump({"module": module, "script": script, "name": self.func.__qualname__,
                             "args": args, "kwargs": kwargs, "out": tmp, "path": sys.path}, f)
            cmd = mpirun_command(self.n, [sys.executable, "-m", "kiln.distributed._worker", job], threads=self.threads)
            p = subprocess.run(cmd, env=environment(), capture_output=True, text=True)
            outcomes = {}
            for r in range(self.n):
                path = os.path.join(tmp, f"result{r}.pkl")
                if os.path.exists(path):
                    with open(path, "rb") as f:
                        outcomes[r] = pickle.load(f)
            for r, (ok, value) in sorted(outcomes.items()):
                if not ok:
                    raise RuntimeError(f"launcher: rank {r} of {self.n} raised:\n{value}\n{p.stderr[-4000:]}")
            if p.returncode != 0 or len(outcomes) != self.n:
                raise RuntimeError(f"launcher: the job of {self.n} ranks failed (mpirun exit status "
                                   f"{p.returncode}):\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}")
            results = [outcomes[r][1] for r in range(self.n)]
            sys.stdout.write(p.stdout)
            return results
