"""Process-wide settings and memory statistics."""
from __future__ import annotations

import contextlib
import threading
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


_grad = threading.local()  # .modes: the enclosing no_grad (False) and enable_grad (True) contexts, innermost last


def is_grad_enabled() -> bool:
    """False inside no_grad(), True elsewhere or inside an enable_grad() within it, as torch.is_grad_enabled (which
    code written for PyTorch asks, as d2l's batch norm does). A traced forward reads True: a batch norm's node
    normalizes by the batch in the training step and by its running statistics in predict and evaluate."""
    modes = getattr(_grad, "modes", None)
    return modes[-1] if modes else True


def _enter_grad_mode(enabled):
    _grad.__dict__.setdefault("modes", []).append(enabled)


def _exit_grad_mode():
    _grad.modes.pop()


class no_grad(contextlib.ContextDecorator):
    """A context manager and decorator for code written for PyTorch (``with ft.no_grad():``, ``@ft.no_grad()``,
    ``@ft.no_grad``) that changes no computation: fasttrain's eager ops record no graph, and compiled programs take
    their gradients themselves; is_grad_enabled() reads False inside it. In a forward being traced, it refuses to
    hold back ops that train (nn/graph.py)."""

    def __new__(cls, func=None):
        return func if func is not None else super().__new__(cls)  # used bare, as @ft.no_grad

    def __enter__(self):
        from .nn.graph import no_grad_entered
        no_grad_entered()
        _enter_grad_mode(False)
        return self

    def __exit__(self, *exc):
        from .nn.graph import no_grad_exited
        _exit_grad_mode()
        no_grad_exited(exc[0] is not None)
        return False


class enable_grad(contextlib.ContextDecorator):
    """A context manager and decorator that changes no computation (torch.enable_grad): see no_grad;
    is_grad_enabled() reads True inside it."""

    def __enter__(self):
        _enter_grad_mode(True)
        return self

    def __exit__(self, *exc):
        _exit_grad_mode()
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
