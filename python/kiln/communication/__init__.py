"""MindSpore's mindspore.communication over kiln's communication layer (src/comm/): init,
release, ranks and groups of a job launched by `mpirun -n N python train.py` (or
`python -m kiln.distributed.run --nproc N train.py`); a process started alone is rank 0 of 1
(the local backend: every collective is the identity).

init() also makes the job end cleanly: an exception no one catches on one rank ends every rank
(MPI_Abort after its traceback) instead of leaving the others waiting, and a collective whose
peers do not arrive fails after a timeout (set_timeout, KILN_COMM_TIMEOUT, 300 s by default).
In a job of several ranks, init sets each rank's kernel threads to cores / ranks on this machine
unless OMP_NUM_THREADS is set (kiln.set_num_threads after init chooses otherwise)."""
import atexit
import os
import sys

from .. import _C
from ..ops import collective

HCCL_WORLD_COMM_GROUP = "hccl_world_group"
NCCL_WORLD_COMM_GROUP = "nccl_world_group"
MPI_WORLD_COMM_GROUP = "mpi_world_group"


class GlobalComm:
    """MindSpore's names of the world group and backend (kiln's backends: local, mpi)."""
    WORLD_COMM_GROUP = HCCL_WORLD_COMM_GROUP
    BACKEND = None
    INITED = False


_state = {"threads_set_by_init": False, "hooked": False}


def local_size():
    """How many ranks of the job run on this machine (from the launcher's environment)."""
    for var in ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "PMI_LOCAL_SIZE"):
        if os.environ.get(var, "").isdigit():
            return max(1, int(os.environ[var]))
    return _C.comm_size() if _C.comm_initialized() else 1


def local_rank():
    for var in ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PMI_LOCAL_RANK"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return _C.comm_rank() if _C.comm_initialized() else 0


def _abort_on_uncaught(previous):
    def hook(kind, value, tb):
        previous(kind, value, tb)
        if _C.comm_initialized() and _C.comm_size() > 1:
            sys.stderr.write(f"kiln.communication: rank {_C.comm_rank()} raised {kind.__name__}; ending every rank "
                             "of the job\n")
            sys.stderr.flush()
            _C.comm_abort(1)
    return hook


def _release_at_exit():
    if _C.comm_initialized():
        _C.comm_finalize()


def init(backend_name=None):
    """Starts communication: backend_name "mpi" (the default when mpirun launched this process),
    "local" (one process; the default otherwise), or MindSpore's "hccl" / "nccl", which mean the
    default here (kiln runs on the CPU). Calling it again does nothing."""
    if backend_name in ("hccl", "nccl", "gloo"):
        backend_name = None
    if backend_name is not None and not isinstance(backend_name, str):
        raise TypeError(f"init: backend_name must be a str, got {backend_name!r}")
    name = _C.comm_init(backend_name)
    GlobalComm.BACKEND, GlobalComm.INITED = name, True
    if not _state["hooked"]:
        _state["hooked"] = True
        atexit.register(_release_at_exit)
        sys.excepthook = _abort_on_uncaught(sys.excepthook)
    if "OMP_NUM_THREADS" not in os.environ and not _state["threads_set_by_init"]:
        _state["threads_set_by_init"] = True
        threads = max(1, (os.cpu_count() or 1) // local_size())
        if _C.comm_size() > 1:
            _C.set_num_threads(threads)
    return name


def release():
    """Ends communication (MPI_Finalize); collectives fail after it."""
    _C.comm_finalize()
    GlobalComm.INITED = False


def is_initialized():
    return _C.comm_initialized()


def get_backend():
    """The backend init started ("mpi" or "local"), "" before init."""
    return _C.comm_backend()


def get_rank(group=None):
    """This process's rank in the group (the world by default)."""
    return _C.comm_rank(collective.group_id(group, "get_rank"))


def get_group_size(group=None):
    """The number of ranks of the group (the world by default)."""
    return _C.comm_size(collective.group_id(group, "get_group_size"))


def get_local_rank(group=None):
    """This process's rank among the ranks on its machine."""
    return local_rank()


def get_local_rank_size(group=None):
    return local_size()


def create_group(group, rank_ids):
    """Makes a group named `group` of the world ranks rank_ids (this rank among them; every
    member calls it, in the same order as the other members' other create_group calls)."""
    if not isinstance(group, str) or not group:
        raise TypeError(f"create_group: the group's name must be a non-empty str, got {group!r}")
    if group in collective.WORLD_NAMES:
        raise ValueError(f"create_group: {group!r} names the world group")
    gid = _C.comm_create_group(list(rank_ids))
    collective.register_group(group, gid)
    return gid


def destroy_group(group):
    gid = collective.group_id(group, "destroy_group")
    _C.comm_destroy_group(gid)
    if isinstance(group, str):
        collective.forget_group(group)



def set_timeout(seconds):
    """Seconds a collective waits for the other ranks before failing (<= 0: forever)."""
    _C.comm_set_timeout(float(seconds))


def get_timeout():
    return _C.comm_timeout()
