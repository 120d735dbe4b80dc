"""python -m kiln.distributed.run --nproc N [--threads T] [--host a,b] train.py [args...]

Runs train.py on N ranks under mpirun (kiln.distributed.mpirun adds what a container and a root
user need); the exit status is mpirun's. Inside train.py, kiln.communication.init() (or
kiln.distributed.init_process_group()) starts communication."""
import argparse
import subprocess
import sys

from .mpirun import environment, mpirun_command


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m kiln.distributed.run",
                                     description="Run a kiln program on several ranks under mpirun.")
    parser.add_argument("--nproc", "--nproc-per-node", "-n", type=int, required=True, help="number of ranks")
    parser.add_argument("--threads", type=int, default=None, help="kernel threads per rank (default cores / ranks)")
    parser.add_argument("--host", default=None, help="comma-separated hosts to spread the ranks over")
    parser.add_argument("script", help="the Python program")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    opts = parser.parse_args(argv)
    if opts.nproc < 1:
        parser.error("--nproc must be >= 1")
    try:
        cmd = mpirun_command(opts.nproc, [sys.executable, opts.script, *opts.args], hosts=opts.host,
                             threads=opts.threads)
    except (RuntimeError, ValueError) as e:
        print(f"kiln.distributed.run: {e}", file=sys.stderr)
        return 2
    return subprocess.call(cmd, env=environment())


if __name__ == "__main__":
    sys.exit(main())
