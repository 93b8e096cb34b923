"""Seeding and random tensors. Every value is a pure function of
(seed, offset, index) through Philox4x32-10, so draws are identical for
any thread count."""
from __future__ import annotations

import numbers
import os
import random as _pyrandom
import threading
from typing import TYPE_CHECKING

import numpy as np

from . import _C
from ._types import _BY_NAME, as_device
from ._C import TensorBase
from ._tensor import Tensor, _sizes
from .creation import _given_size, empty, tensor

if TYPE_CHECKING:
    from typing import Sequence

    from ._types import DeviceLike, DTypeLike

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

    def __init__(self, device: DeviceLike = "cpu") -> None:
        self.device = as_device(device)
        self._seed = _DEFAULT_SEED
        self._offset = 0
        self._lock = threading.Lock()

    def manual_seed(self, seed: int) -> Generator:
        """Sets the seed (an int in [-2**63, 2**64), taken modulo 2**64) and restarts the stream at offset 0;
        returns the generator."""
        seed = _check_seed(seed)
        with self._lock:
            self._seed, self._offset = seed, 0
        return self

    def seed(self) -> int:
        """Seeds from the operating system's entropy and returns the seed."""
        s = int.from_bytes(os.urandom(8), "little")
        self.manual_seed(s)
        return s

    def initial_seed(self) -> int:
        """The seed the current stream started from (the last manual_seed or seed)."""
        return self._seed

    def get_state(self) -> Tensor:
        """The state as a uint8 tensor of 16 bytes (seed, offset; little-endian)."""
        with self._lock:
            raw = np.array([self._seed, self._offset], dtype="<u8").view(np.uint8)
        return tensor(raw)

    def set_state(self, state: Tensor) -> Generator:
        """Restores a state from get_state() (16 uint8 values); returns the generator."""
        if not isinstance(state, TensorBase):
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


def manual_seed(seed: int) -> Generator:
    """Seeds fasttrain's default generator; returns it."""
    return default_generator.manual_seed(seed)


def seed() -> int:
    """Seeds the default generator from the operating system's entropy and returns the seed."""
    return default_generator.seed()


def initial_seed() -> int:
    """The seed of the default generator's current stream."""
    return default_generator.initial_seed()


def get_rng_state() -> Tensor:
    """The default generator's state as a uint8 tensor of 16 bytes (seed, offset); see Generator.get_state."""
    return default_generator.get_state()


def set_rng_state(state: Tensor) -> None:
    """Restores the default generator's state from get_rng_state()."""
    default_generator.set_state(state)


def seed_everything(seed: int) -> int:
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


def rand(*sizes: int | Sequence[int], size: Sequence[int] | None = None, generator: Generator | None = None,
         dtype: DTypeLike | None = None, device: DeviceLike = None, requires_grad: bool = False) -> Tensor:
    """Uniform samples in [0, 1) of the given size (float32 by default); requires_grad sets the tensor's flag."""
    _refuse_draw("rand")
    t = _draw(_C.uniform_, _empty(_given_size(sizes, size), dtype, device, "float32"), generator, 0.0, 1.0)
    t.requires_grad = bool(requires_grad)
    return t


def randn(*sizes: int | Sequence[int], size: Sequence[int] | None = None, generator: Generator | None = None,
          dtype: DTypeLike | None = None, device: DeviceLike = None, requires_grad: bool = False) -> Tensor:
    """Standard normal samples of the given size (float32 by default); requires_grad sets the tensor's flag."""
    _refuse_draw("randn")
    t = _draw(_C.normal_, _empty(_given_size(sizes, size), dtype, device, "float32"), generator, 0.0, 1.0)
    t.requires_grad = bool(requires_grad)
    return t


def normal(mean: float | Tensor = 0.0, std: float | Tensor = 1.0, size: Sequence[int] | None = None, *,
           generator: Generator | None = None, dtype: DTypeLike | None = None, device: DeviceLike = None,
           requires_grad: bool = False) -> Tensor:
    """Normal samples, as torch.normal: of numbers mean and std, a tensor of size (float32 by default; d2l's
    torch.normal(0, 0.01, size=(n, h))); with a tensor of means or of standard deviations (the other may be a
    number), one sample per element of their broadcast shape, of that element's mean and std."""
    tensors = isinstance(mean, TensorBase) or isinstance(std, TensorBase)
    if tensors == (size is not None):
        raise TypeError("normal: give size with numbers mean and std, and no size with a tensor of them")
    least = (float(std.min()) if std.numel() else 0.0) if isinstance(std, TensorBase) else std
    if not least >= 0:
        raise ValueError(f"normal expects std >= 0.0, got {least}")
    if tensors:
        shape = np.broadcast_shapes(*(tuple(getattr(v, "shape", ())) for v in (mean, std)))
        t = randn(shape, generator=generator, dtype=dtype or next(v.dtype for v in (mean, std)
                                                                  if isinstance(v, TensorBase)), device=device)
        t = t * std + mean
    else:
        _refuse_draw("normal")
        t = _draw(_C.normal_, _empty(_given_size((), size), dtype, device, "float32"), generator, float(mean),
                  float(std))
    t.requires_grad = bool(requires_grad)
    return t


def _refuse_draw(fn):
    from .nn.graph import refuse_draw  # (nn imports this module)
    refuse_draw(fn)


def _like(name, input, dtype, device):
    """An empty tensor in input's shape, dtype and device (unless given); a traced value records a noise node."""
    from .nn.graph import Symbolic
    if isinstance(input, Symbolic):
        return None
    _refuse_draw(name)  # of a tensor in a traced forward: drawn once, at compile
    if not isinstance(input, TensorBase):
        raise TypeError(f"{name}: expected a tensor, got {type(input).__name__}")
    return empty(tuple(input.shape), dtype=input.dtype if dtype is None else dtype,
                 device=input.device if device is None else device)


def rand_like(input: Tensor, *, dtype: DTypeLike | None = None, device: DeviceLike = None) -> Tensor:
    """Uniform samples in [0, 1) in input's shape (and dtype and device, unless given). Of a traced value
    (model.compile), fresh samples in every step from the program's seeded stream (see compile's seed)."""
    from .nn.modules import Noise
    out = _like("rand_like", input, dtype, device)
    return Noise(uniform=True)(input) if out is None else _draw(_C.uniform_, out, None, 0.0, 1.0)


def bernoulli(input: Tensor, p: float | None = None, *, generator: Generator | None = None) -> Tensor:
    """Draws of 1 with probability input (or p) elementwise and 0 otherwise, in input's dtype, as
    torch.bernoulli. Of a traced value, fresh draws in every step: (ft.rand_like(input) < input).float()."""
    from .nn.graph import Symbolic
    chance = input if p is None else p
    if isinstance(input, Symbolic):
        return (rand_like(input) < chance).float()
    from .creation import empty_like
    return empty_like(input).bernoulli_(chance, generator=generator)


def randn_like(input: Tensor, *, dtype: DTypeLike | None = None, device: DeviceLike = None) -> Tensor:
    """Standard normal samples in input's shape (and dtype and device, unless given). Of a traced value
    (model.compile), fresh samples in every step from the program's seeded stream: a VAE's reparameterization,
    mu + ft.randn_like(std) * std, compiles."""
    from .nn.modules import Noise
    out = _like("randn_like", input, dtype, device)
    return Noise(uniform=False)(input) if out is None else _draw(_C.normal_, out, None, 0.0, 1.0)


def randint(*args: int | Sequence[int], size: int | Sequence[int] | None = None, generator: Generator | None = None,
            dtype: DTypeLike | None = None, device: DeviceLike = None) -> Tensor:
    """randint(high, size) or randint(low, high, size): uniform integers in [low, high), int64 by default."""
    if size is not None:
        args = args + (size,)
    if len(args) == 2:
        low, (high, size) = 0, args
    elif len(args) == 3:
        low, high, size = args
    else:
        raise TypeError("randint expects (high, size) or (low, high, size)")
    _refuse_draw("randint")
    return _draw(_C.randint_, _empty((size,), dtype, device, "int64"), generator, int(low), int(high))


def randperm(n: int, *, generator: Generator | None = None, dtype: DTypeLike | None = None,
             device: DeviceLike = None) -> Tensor:
    """A random permutation of 0 .. n-1 (int64 by default)."""
    _refuse_draw("randperm")
    n = int(n)
    if n < 0:
        raise ValueError(f"randperm: n must be non-negative, got {n}")
    return _draw(_C.randperm_, _empty((n,), dtype, device, "int64"), generator)


def multinomial(input: Tensor, num_samples: int, replacement: bool = False, *,
                generator: Generator | None = None) -> Tensor:
    """Indices of categories drawn from each row of input ((C,) or (N, C) non-negative weights), each with
    probability proportional to its weight, as torch.multinomial: int64, (num_samples,) or (N, num_samples), on
    input's device. With replacement a draw is the category whose cumulative share its uniform falls in; without,
    the categories of the num_samples largest u ** (1 / weight), one uniform u each (Efraimidis and Spirakis), which
    is drawing one after another without putting back. The uniforms are the generator's float64 draws, so
    ft.manual_seed repeats the samples."""
    _refuse_draw("multinomial")
    if not isinstance(input, TensorBase) or not (input.dtype.is_floating_point and input.ndim in (1, 2)):
        raise TypeError("multinomial: input must be a 1-d or 2-d floating-point tensor of weights")
    if not isinstance(num_samples, numbers.Integral) or isinstance(num_samples, bool):
        raise TypeError(f"multinomial: num_samples must be an int, got {type(num_samples).__name__}")
    num_samples = int(num_samples)
    w = np.asarray(input.detach().cpu().double()).reshape(-1, input.shape[-1])
    C = w.shape[1]
    if not np.isfinite(w).all() or (w < 0).any():
        raise ValueError("multinomial: the weights must be finite and non-negative")
    if w.shape[0] == 0 and C > 0 and num_samples >= 1:  # no rows: no draws
        return tensor(np.zeros((0, num_samples), np.int64), device=input.device)
    if C == 0 or (w.sum(1) <= 0).any():
        raise ValueError("multinomial: every row needs a positive total weight")
    if num_samples < 1:
        raise ValueError(f"multinomial: num_samples must be positive, got {num_samples}")
    if not replacement and ((w > 0).sum(1) < num_samples).any():
        raise ValueError(f"multinomial: cannot draw {num_samples} samples without replacement from a row of fewer "
                         f"categories of positive weight")
    u = np.asarray(rand(w.shape[0], num_samples if replacement else C, generator=generator, dtype="float64"))
    if replacement:
        cdf = np.cumsum(w, 1)
        cdf /= cdf[:, -1:]
        idx = np.stack([np.searchsorted(c, r, side="right") for c, r in zip(cdf, u)])
        idx = np.minimum(idx, C - 1)
    else:
        with np.errstate(divide="ignore"):
            keys = np.where(w > 0, np.log(u) / np.where(w > 0, w, 1.0), -np.inf)
        idx = np.argsort(-keys, axis=1, kind="stable")[:, :num_samples]
    out = tensor(idx.astype(np.int64), device=input.device)
    return out[0] if input.ndim == 1 else out
