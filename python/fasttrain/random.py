"""Seeding and random tensors. Every value is a pure function of
(seed, offset, index) through Philox4x32-10, so draws are identical for
any thread count."""
import os
import random as _pyrandom
import threading

import numpy as np

from . import _C
from ._types import _BY_NAME, as_device
from ._tensor import Tensor, _sizes
from .creation import empty, tensor

_DEFAULT_SEED = 67280421310721  # PyTorch's default seed
_U64 = 1 << 64


def _check_seed(seed):
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"a seed must be an int, got {type(seed).__name__}")
    seed = int(seed)
    if not -(1 << 63) <= seed < _U64:
        raise ValueError(f"seed {seed} is outside [-2**63, 2**64)")
    return seed % _U64


class Generator:
    """A Philox generator: a seed and the number of 128-bit blocks drawn so far."""

    def __init__(self, device="cpu"):
        self.device = as_device(device)
        self._seed = _DEFAULT_SEED
        self._offset = 0
        self._lock = threading.Lock()

    def manual_seed(self, seed):
        seed = _check_seed(seed)
        with self._lock:
            self._seed, self._offset = seed, 0
        return self

    def seed(self):
        """Seeds from the operating system's entropy and returns the seed."""
        s = int.from_bytes(os.urandom(8), "little")
        self.manual_seed(s)
        return s

    def initial_seed(self):
        return self._seed

    def get_state(self):
        """The state as a uint8 tensor of 16 bytes (seed, offset; little-endian)."""
        with self._lock:
            raw = np.array([self._seed, self._offset], dtype="<u8").view(np.uint8)
        return tensor(raw)

    def set_state(self, state):
        if not isinstance(state, Tensor):
            raise TypeError(f"set_state expects a fasttrain uint8 Tensor, got {type(state).__name__}")
        if state.dtype is not _BY_NAME["uint8"] or state.numel() != 16:
            raise ValueError(f"set_state expects 16 uint8 values from get_state(), got {state.numel()} "
                             f"{state.dtype.name} values")
        seed, offset = (int(v) for v in state.cpu().numpy().reshape(-1).copy().view("<u8"))
        with self._lock:
            self._seed, self._offset = seed, offset
        return self

    def _call(self, fn, out, *args):
        with self._lock:
            self._offset = fn(out, self._seed, self._offset, *args)
        return out


default_generator = Generator()


def _draw(fn, out, generator, *args):
    return (generator or default_generator)._call(fn, out, *args)


def manual_seed(seed):
    """Seeds fasttrain's default generator; returns it."""
    return default_generator.manual_seed(seed)


def seed():
    return default_generator.seed()


def initial_seed():
    return default_generator.initial_seed()


def get_rng_state():
    return default_generator.get_state()


def set_rng_state(state):
    default_generator.set_state(state)


def seed_everything(seed):
    """Seeds Python's random, NumPy's global RNG and fasttrain, and sets
    PYTHONHASHSEED for child processes. Returns the seed."""
    seed = int(seed)
    _check_seed(seed)
    _pyrandom.seed(seed)
    np.random.seed(seed % (1 << 32))
    os.environ["PYTHONHASHSEED"] = str(seed % (1 << 32))
    manual_seed(seed)
    return seed


def _empty(size, dtype, device, default):
    return empty(_sizes(size), dtype=default if dtype is None else dtype, device=device)


def rand(*size, generator=None, dtype=None, device=None):
    """Uniform samples in [0, 1)."""
    return _draw(_C.uniform_, _empty(size, dtype, device, "float32"), generator, 0.0, 1.0)


def randn(*size, generator=None, dtype=None, device=None):
    """Standard normal samples."""
    return _draw(_C.normal_, _empty(size, dtype, device, "float32"), generator, 0.0, 1.0)


def randint(*args, size=None, generator=None, dtype=None, device=None):
    """randint(high, size) or randint(low, high, size): uniform integers in [low, high)."""
    if size is not None:
        args = args + (size,)
    if len(args) == 2:
        low, (high, size) = 0, args
    elif len(args) == 3:
        low, high, size = args
    else:
        raise TypeError("randint expects (high, size) or (low, high, size)")
    return _draw(_C.randint_, _empty((size,), dtype, device, "int64"), generator, int(low), int(high))


def randperm(n, *, generator=None, dtype=None, device=None):
    """A random permutation of 0 .. n-1."""
    n = int(n)
    if n < 0:
        raise ValueError(f"randperm: n must be non-negative, got {n}")
    return _draw(_C.randperm_, _empty((n,), dtype, device, "int64"), generator)
