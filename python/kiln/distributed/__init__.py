"""MegEngine's megengine.distributed over kiln's communication layer (src/comm/).

A job is started by `mpirun -n N python train.py`, by `python -m kiln.distributed.run --nproc N
train.py`, or from inside Python by the `launcher` decorator (which runs the function on N local
ranks under mpirun). init_process_group() starts communication (MegEngine's arguments are
accepted; mpirun already told each rank its place); get_rank, get_world_size; functional's
collectives; make_allreduce_cb for GradManager.attach."""
from .. import _C
from .. import communication as _communication
from ..ops import collective as _collective
from . import functional
from .launcher import launcher

WORLD = None  # the group of every rank


def init_process_group(master_ip=None, port=None, world_size=None, rank=None, device=None, backend=None,
                       device_type=None):
    """Starts communication. The rank and size come from the launcher (mpirun); when world_size or
    rank are given they must match it."""
    _communication.init(backend if backend in ("mpi", "local") else None)
    if world_size is not None and world_size != _C.comm_size():
        raise ValueError(f"init_process_group: world_size={world_size}, but the job has {_C.comm_size()} ranks")
    if rank is not None and rank != _C.comm_rank():
        raise ValueError(f"init_process_group: rank={rank}, but this process is rank {_C.comm_rank()}")


def is_distributed():
    """Whether communication is started with more than one rank."""
    return _C.comm_initialized() and _C.comm_size() > 1


def _ensure():
    if not _C.comm_initialized():
        _communication.init()


def get_rank():
    """This process's rank (0 in a process started alone)."""
    _ensure()
    return _C.comm_rank()


def get_world_size():
    _ensure()
    return _C.comm_size()


def group_barrier(group=WORLD):
    _collective.barrier(group)


def new_group(proc_ranks):
    """A group of these ranks (every member calls it)."""
    return _C.comm_create_group(list(proc_ranks))


def make_allreduce_cb(reduce_method="sum", group=WORLD, backend=None):
    """A GradManager callback that all-reduces each gradient across the ranks: reduce_method "sum"
    or "mean"."""
    if reduce_method not in ("sum", "mean"):
        raise ValueError(f"make_allreduce_cb: reduce_method must be 'sum' or 'mean', got {reduce_method!r}")
    _ensure()

    def callback(param, grad):
        return _collective.all_reduce(grad, reduce_method, group)

    return callback


AllreduceCallback = make_allreduce_cb
