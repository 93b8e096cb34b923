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


_grad = threading.local()  # .enabled: what is_grad_enabled() reads (True when unset)


def is_grad_enabled() -> bool:
    """False inside no_grad() (or after set_grad_enabled(False)), True elsewhere or inside an enable_grad() within
    it, as torch.is_grad_enabled (which code written for PyTorch asks, as d2l's batch norm does). A traced forward
    reads True: a batch norm's node normalizes by the batch in the training step and by its running statistics in
    predict and evaluate."""
    return getattr(_grad, "enabled", True)


class _GradMode(contextlib.ContextDecorator):
    """A context manager and decorator that sets what is_grad_enabled() reads while it lasts, and changes no
    computation: fasttrain's eager ops record no graph, and compiled programs take their gradients themselves."""

    _enabled = True

    def __enter__(self):
        self._before = is_grad_enabled()
        _grad.enabled = self._enabled
        return self

    def __exit__(self, *exc):
        _grad.enabled = self._before
        return False


class no_grad(_GradMode):
    """torch.no_grad for code written for PyTorch (``with ft.no_grad():``, ``@ft.no_grad()``, ``@ft.no_grad``): see
    _GradMode. In a forward being traced, it refuses to hold back ops that train (nn/graph.py)."""

    _enabled = False

    def __new__(cls, func=None):
        return func if func is not None else super().__new__(cls)  # used bare, as @ft.no_grad

    def __enter__(self):
        from .nn.graph import no_grad_entered
        no_grad_entered()
        return super().__enter__()

    def __exit__(self, *exc):
        from .nn.graph import no_grad_exited
        super().__exit__(*exc)
        no_grad_exited(exc[0] is not None)
        return False


class enable_grad(_GradMode):
    """torch.enable_grad: see _GradMode."""


class set_grad_enabled(_GradMode):
    """torch.set_grad_enabled(mode): called, it sets what is_grad_enabled() reads at once; as a context manager
    (``with ft.set_grad_enabled(phase == "train"):``, a transfer-learning loop's phases) it puts the mode before it
    back at the end; mode False in a traced forward is no_grad()'s."""

    def __init__(self, mode: bool):
        self._enabled, self._before = bool(mode), is_grad_enabled()
        _grad.enabled = self._enabled
        self._held = None if self._enabled else no_grad()

    def __enter__(self):
        if self._held is not None:
            self._held.__enter__()
        _grad.enabled = self._enabled
        return self

    def __exit__(self, *exc):
        if self._held is not None:
            self._held.__exit__(*exc)
        _grad.enabled = self._before
        return False


def inference_mode(mode: bool = True) -> "no_grad | enable_grad":
    """no_grad() (torch.inference_mode), or enable_grad() for mode False; ``@ft.inference_mode`` decorates too."""
    if callable(mode):  # used bare, as @ft.inference_mode
        return no_grad()(mode)
    return no_grad() if mode else enable_grad()
