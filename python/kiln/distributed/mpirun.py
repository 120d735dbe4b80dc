"""The mpirun command line that starts N ranks of a kiln program, with what containers need:
Open MPI refuses to run as root without --allow-run-as-root, its shared-memory single-copy
transport (CMA) fails where ptrace is forbidden (btl_vader_single_copy_mechanism=none), and
more ranks than cores need --oversubscribe. Each rank runs cores / local ranks kernel threads
(OMP_NUM_THREADS) unless told otherwise."""
import os
import shutil


def find_mpirun():
    """The path of mpirun, or a RuntimeError saying how to get it."""
    path = shutil.which("mpirun")
    if not path:
        raise RuntimeError("kiln.distributed: mpirun was not found on PATH; install Open MPI (Debian: "
                           "apt-get install openmpi-bin libopenmpi-dev, as scripts/install-deps.sh does)")
    return path


def mpirun_command(nproc, program, hosts=None, threads=None, extra=()):
    """[mpirun, options..., program...]: nproc ranks (spread over hosts, "a,b" or a list, when given)
    running the argument list program. threads: kernel threads per rank (default cores / ranks per
    host)."""
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"kiln.distributed: nproc must be an int >= 1, got {nproc!r}")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"kiln.distributed: threads must be an int >= 1, got {threads!r}")
    cmd = [find_mpirun(), "-n", str(nproc)]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    cores = os.cpu_count() or 1
    if hosts:
        host_list = hosts.split(",") if isinstance(hosts, str) else list(hosts)
        cmd += ["--host", ",".join(host_list)]
        per_host = -(-nproc // len(host_list))
    else:
        per_host = nproc
    if per_host > cores or hosts:
        cmd.append("--oversubscribe")
    if threads is None:
        threads = int(os.environ["OMP_NUM_THREADS"]) if os.environ.get("OMP_NUM_THREADS", "").isdigit() \
            else max(1, cores // per_host)
    cmd += ["--mca", "btl_vader_single_copy_mechanism", "none", "-x", f"OMP_NUM_THREADS={threads}"]
    for var in ("PYTHONPATH", "KILN_COMM_TIMEOUT", "KILN_COMM_CHECK", "LD_LIBRARY_PATH"):
        if var in os.environ:
            cmd += ["-x", var]
    return cmd + list(extra) + list(program)


def environment():
    """os.environ with what lets mpirun run as root."""
    env = dict(os.environ)
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    return env
