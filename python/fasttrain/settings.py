"""Process-wide settings and memory statistics."""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from . import _C, cuda
from ._types import as_device

if TYPE_CHECKING:
    from ._types import DeviceLike

_POOLS = {"cpu": (0, 0), "cpu_pinned": (1, 0)}


def _pool_of(dev):
    if dev in _POOLS:
        return _POOLS[dev]
    d = as_device(dev)
    return (0, 0) if d.type == "cpu" else (2, d.index)


def memory_stats(device: DeviceLike = None) -> dict[str, int] | dict[str, dict[str, int]]:
    """Bytes allocated (live), peak (highest since start or reset), reserved (live plus cached) and the number
    of allocations. With no device: a dict per pool ('cpu', 'cpu_pinned', 'cuda:N')."""
    if device is not None:
        return _C.memory_stats(*_pool_of(device))
    pools = dict(_POOLS)
    for i in range(cuda.device_count()):
        pools[f"cuda:{i}"] = (2, i)
    return {name: _C.memory_stats(*code) for name, code in pools.items()}


def reset_peak_memory_stats(device: DeviceLike = None) -> None:
    """Sets the peak of device's pool ('cpu', 'cpu_pinned', 'cuda:N'; every pool with no device) to its
    current allocation."""
    for name in ([device] if device is not None else list(memory_stats())):
        _C.reset_peak_memory_stats(*_pool_of(name))


def empty_cache() -> None:
    """Returns cached memory blocks to the system."""
    _C.empty_cache()


def set_num_threads(n: int) -> None:
    """Threads of fasttrain's one (OpenMP) pool."""
    _C.set_num_threads(n)


def get_num_threads() -> int:
    """Threads of fasttrain's (OpenMP) pool."""
    return _C.get_num_threads()


def use_deterministic_algorithms(mode: bool) -> None:
    """With True, ops give bitwise-identical results across runs and thread counts, or raise RuntimeError."""
    _C.set_deterministic(bool(mode))


def are_deterministic_algorithms_enabled() -> bool:
    """Whether use_deterministic_algorithms(True) is in effect."""
    return _C.get_deterministic()


class no_grad(contextlib.ContextDecorator):
    """A context manager and decorator that changes nothing, for code written for PyTorch (``with ft.no_grad():``,
    ``@ft.no_grad()``, ``@ft.no_grad``): fasttrain's eager ops record no graph, and compiled programs take their
    gradients themselves. In a forward being traced, it refuses to hold back ops that train (nn/graph.py)."""

    def __new__(cls, func=None):
        return func if func is not None else super().__new__(cls)  # used bare, as @ft.no_grad

    def __enter__(self):
        from .nn.graph import no_grad_entered
        no_grad_entered()
        return self

    def __exit__(self, *exc):
        from .nn.graph import no_grad_exited
        no_grad_exited(exc[0] is not None)
        return False


class enable_grad(contextlib.ContextDecorator):
    """A context manager and decorator that changes nothing (torch.enable_grad): see no_grad."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def set_grad_enabled(mode: bool) -> "no_grad | enable_grad":
    """no_grad() for mode False, enable_grad() for True, as ``with torch.set_grad_enabled(phase == "train"):``
    uses it (a transfer-learning loop's train and validation phases)."""
    return enable_grad() if mode else no_grad()


def inference_mode(mode: bool = True) -> "no_grad | enable_grad":
    """no_grad() (torch.inference_mode), or enable_grad() for mode False; ``@ft.inference_mode`` decorates too."""
    if callable(mode):  # used bare, as @ft.inference_mode
        return no_grad()(mode)
    return no_grad() if mode else enable_grad()
