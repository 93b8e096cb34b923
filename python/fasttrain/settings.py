"""Process-wide settings and memory statistics."""
from . import _C, cuda
from ._types import as_device

_POOLS = {"cpu": (0, 0), "cpu_pinned": (1, 0)}


def _pool_of(dev):
    if dev in _POOLS:
        return _POOLS[dev]
    d = as_device(dev)
    return (0, 0) if d.type == "cpu" else (2, d.index)


def memory_stats(device=None):
    """Bytes allocated (live), peak (highest since start or reset), reserved (live plus cached) and the number
    of allocations. With no device: a dict per pool ('cpu', 'cpu_pinned', 'cuda:N')."""
    if device is not None:
        return _C.memory_stats(*_pool_of(device))
    pools = dict(_POOLS)
    for i in range(cuda.device_count()):
        pools[f"cuda:{i}"] = (2, i)
    return {name: _C.memory_stats(*code) for name, code in pools.items()}


def reset_peak_memory_stats(device=None):
    for name in ([device] if device is not None else list(memory_stats())):
        _C.reset_peak_memory_stats(*_pool_of(name))


def empty_cache():
    """Returns cached memory blocks to the system."""
    _C.empty_cache()


def set_num_threads(n):
    """Threads of fasttrain's one (OpenMP) pool."""
    _C.set_num_threads(n)


def get_num_threads():
    return _C.get_num_threads()


def use_deterministic_algorithms(mode):
    """With True, ops give bitwise-identical results across runs and thread counts, or raise RuntimeError."""
    _C.set_deterministic(bool(mode))


def are_deterministic_algorithms_enabled():
    return _C.get_deterministic()
