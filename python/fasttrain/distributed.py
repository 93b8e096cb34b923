"""Data parallelism over processes with MPI, as PyTorch's DistributedDataParallel: launch one process per
core group (or per machine) with ``mpirun -np 4 python train.py``; each calls ``ft.distributed.init()``,
compiles its model with ``distributed=True`` and trains on its shard of the data (a Loader shards by rank
once init() ran). Every step averages the gradients and the loss over the ranks before the optimizer update,
so all ranks keep the same weights (docs/distributed.md).

The MPI backend (libfasttrain_mpi.so, built when mpicc is found) is loaded by init() only: without MPI,
``import fasttrain`` and everything on one process still work, and init() says what to install."""
from __future__ import annotations

import atexit
import datetime
import os
import sys

from . import _C
from ._tensor import Tensor

_LIBRARY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libfasttrain_mpi.so")
if os.path.exists(_LIBRARY):
    _C.dist_set_library(_LIBRARY)

_ranks = None  # (rank, world size, local rank) once init() ran


def is_available() -> bool:
    """Whether this build has the MPI backend (init() can still fail if libmpi is missing at run time)."""
    return os.path.exists(_LIBRARY)


def is_initialized() -> bool:
    """Whether init() ran (and finalize() did not)."""
    return _C.dist_ready()


def init(timeout: float | datetime.timedelta = 1800.0) -> None:
    """Initialises MPI (once; later calls only set the timeout). Under mpirun or srun every process learns its
    rank and the world size; run alone it is rank 0 of 1. With more than one rank an uncaught exception on any
    rank aborts them all (MPI_Abort) after printing its traceback, and a collective (a training step's gradient
    sum, a barrier) that not every rank joins within `timeout` (seconds or a timedelta; 30 minutes, PyTorch's
    default) ends the job the same way, saying so, so that no rank waits forever for a peer that stopped (exited
    by sys.exit, returned, or compiled another program). A collective left running cannot be taken back, so the
    job ends rather than raising, as PyTorch's watchdog ends it."""
    global _ranks
    seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else timeout
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds > 0:
        raise ValueError(f"init: timeout must be a positive number of seconds or a timedelta, got {timeout!r}")
    if _ranks is not None and is_initialized():
        _C.dist_set_timeout(float(seconds))
        return
    _ranks = _C.dist_init()
    _C.dist_set_timeout(float(seconds))
    from . import _types
    _types._local_rank = _ranks[2]  # "cuda" is the local rank's GPU (ft.cuda.set_device)
    if _ranks[1] > 1:
        hook = sys.excepthook

        def abort_all(kind, value, tb):
            hook(kind, value, tb)
            sys.stderr.flush()
            _C.dist_abort(1)

        sys.excepthook = abort_all
    atexit.register(finalize)


def _require():
    if not is_initialized():
        raise RuntimeError("call ft.distributed.init() first")
    return _ranks


def get_rank() -> int:
    """This process's rank, 0 .. world size - 1 (0 before init())."""
    return _ranks[0] if is_initialized() else 0


def get_world_size() -> int:
    """The number of processes (1 before init())."""
    return _ranks[1] if is_initialized() else 1


def get_local_rank() -> int:
    """The rank among the processes of this machine: the GPU a process of a multi-GPU machine takes."""
    return _ranks[2] if is_initialized() else 0


def barrier() -> None:
    """Waits until every rank has called barrier()."""
    _require()
    _C.dist_barrier()


def _in_host_memory(collective, tensor: Tensor, *args) -> Tensor:
    """Runs an MPI collective on a contiguous CPU tensor in place; a CUDA tensor goes through a host copy (MPI
    reads host memory; the compiled step sums CUDA gradients with NCCL)."""
    _require()
    if not tensor.is_cuda:
        collective(tensor, *args)
        return tensor
    host = tensor.cpu()
    collective(host, *args)
    return tensor.copy_(host)


def all_reduce(tensor: Tensor, op: str = "sum") -> Tensor:
    """Reduces a float32 or float64 tensor (contiguous on the CPU, or on a CUDA device) over the ranks in place
    ('sum' or 'mean'); returns it."""
    if op not in ("sum", "mean"):
        raise ValueError(f"all_reduce: op must be 'sum' or 'mean', got {op!r}")
    _in_host_memory(_C.dist_all_reduce_sum, tensor)
    if op == "mean":
        tensor.mul_(1.0 / get_world_size())
    return tensor


def broadcast(tensor: Tensor, src: int = 0) -> Tensor:
    """Overwrites a tensor (contiguous on the CPU, or on a CUDA device) with rank src's values, in place;
    returns it."""
    return _in_host_memory(_C.dist_broadcast, tensor, int(src))


def finalize() -> None:
    """Shuts MPI down (at exit by default); no collective can run after it in this process."""
    if is_initialized():
        _C.dist_finalize()
