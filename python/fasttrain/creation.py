"""Tensor creation: from sizes, values, NumPy arrays and DLPack producers."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as _np

from . import _C
from ._types import _BY_NAME, as_device, as_dtype
from ._C import TensorBase
from ._tensor import Tensor, _sizes

if TYPE_CHECKING:
    from typing import Any, Sequence

    from ._types import DeviceLike, DTypeLike

    Number = bool | int | float


def _given_size(sizes: tuple, size: Any) -> tuple:
    """The size given positionally (2, 3 or (2, 3)) or as size=(2, 3), as PyTorch takes either."""
    if size is None:
        return _sizes(sizes)
    if sizes:
        raise TypeError("give the size positionally or as size=, not both")
    return _sizes((size,))


def empty(*sizes: int | Sequence[int], size: Sequence[int] | None = None, dtype: DTypeLike | None = None,
          device: DeviceLike = None, pin_memory: bool = False, requires_grad: bool = False) -> Tensor:
    """An uninitialised tensor of the given size (``empty(2, 3)``, ``empty((2, 3))`` or ``empty(size=(2, 3))``),
    float32 by default; pin_memory=True allocates page-locked host memory. requires_grad sets the tensor's flag, as
    the other creation functions' do (a compiled model trains its registered parameters)."""
    from .nn.graph import Blank, names_batch
    d = _BY_NAME["float32"] if dtype is None else as_dtype(dtype)
    size = _given_size(sizes, size)
    if names_batch(size):  # in a traced forward: filled in place, with a draw per sample or a constant
        return Blank(size, d, device)
    kind, index = as_device(device)._code
    t = _C.empty(size, d._code, kind, index, bool(pin_memory))
    if requires_grad:
        t.requires_grad = True
    return t


def full(size: int | Sequence[int], fill_value: Number | Tensor, *, dtype: DTypeLike | None = None,
         device: DeviceLike = None, pin_memory: bool = False, requires_grad: bool = False) -> Tensor:
    """A tensor filled with fill_value; the dtype follows fill_value like PyTorch (bool, int64, float32)."""
    if dtype is None:
        dtype = fill_value.dtype if isinstance(fill_value, TensorBase) else _C.tensor_from_data(fill_value, -1).dtype
    return empty(size, dtype=dtype, device=device, pin_memory=pin_memory, requires_grad=requires_grad).fill_(
        fill_value)


def zeros(*sizes: int | Sequence[int], size: Sequence[int] | None = None, dtype: DTypeLike | None = None,
          device: DeviceLike = None, pin_memory: bool = False, requires_grad: bool = False) -> Tensor:
    """A tensor of zeros of the given size, float32 by default. In a traced forward, a size with the batch
    (x.size(0)) first is zeros for every sample (a hand-written RNN's zero state, torch.zeros(x.size(0), hidden)),
    and one with the batch second an RNN's zero initial state (PyTorch's h0 = torch.zeros(layers, x.size(0),
    hidden))."""
    from .nn.graph import BatchSize, ZeroStates, names_batch
    sizes = _given_size(sizes, size)
    if not names_batch(sizes) and any(isinstance(n, BatchSize) for n in sizes):
        return ZeroStates(sizes)
    return empty(sizes, dtype=dtype, device=device, pin_memory=pin_memory, requires_grad=requires_grad).fill_(0)


def ones(*sizes: int | Sequence[int], size: Sequence[int] | None = None, dtype: DTypeLike | None = None,
         device: DeviceLike = None, pin_memory: bool = False, requires_grad: bool = False) -> Tensor:
    """A tensor of ones of the given size, float32 by default."""
    return empty(_given_size(sizes, size), dtype=dtype, device=device, pin_memory=pin_memory,
                 requires_grad=requires_grad).fill_(1)


def empty_like(t: Tensor, *, dtype: DTypeLike | None = None, device: DeviceLike = None,
               requires_grad: bool = False) -> Tensor:
    """An uninitialised contiguous tensor with t's shape, and t's dtype and device unless given."""
    return empty(t.shape, dtype=t.dtype if dtype is None else dtype, device=t.device if device is None else device,
                 requires_grad=requires_grad)


def zeros_like(t: Tensor, *, dtype: DTypeLike | None = None, device: DeviceLike = None,
               requires_grad: bool = False) -> Tensor:
    """Zeros with t's shape, and t's dtype and device unless given."""
    return full_like(t, 0, dtype=dtype, device=device, requires_grad=requires_grad)


def ones_like(t: Tensor, *, dtype: DTypeLike | None = None, device: DeviceLike = None,
              requires_grad: bool = False) -> Tensor:
    """Ones with t's shape, and t's dtype and device unless given."""
    return full_like(t, 1, dtype=dtype, device=device, requires_grad=requires_grad)


def full_like(t: Tensor, fill_value: Number | Tensor, *, dtype: DTypeLike | None = None,
              device: DeviceLike = None, requires_grad: bool = False) -> Tensor:
    """fill_value with t's shape, and t's dtype and device unless given (not inferred from fill_value). Of a
    traced value (model.compile), a constant of every sample's shape."""
    from .nn.graph import Symbolic, constant_like
    if isinstance(t, Symbolic):
        return constant_like(t, float(fill_value))
    return empty_like(t, dtype=dtype, device=device, requires_grad=requires_grad).fill_(fill_value)


def arange(start: int | float | None = None, end: int | float | None = None, step: int | float = 1, *,
           dtype: DTypeLike | None = None, device: DeviceLike = None) -> Tensor:
    """Values start, start+step, ... below end (arange(n) and arange(end=n) from 0); int64 for integer arguments,
    float32 otherwise."""
    start, end, step = (v.item() if isinstance(v, TensorBase) and v.ndim == 0 else v for v in (start, end, step))
    if start is None and end is None:
        raise TypeError("arange() missing 1 required argument: 'end'")
    start, end = (0, start) if end is None else (0 if start is None else start, end)
    if step == 0:
        raise ValueError("arange: step must be nonzero")
    values = (start, end, step)
    if not all(isinstance(v, (int, float, _np.integer, _np.floating)) and not isinstance(v, bool) for v in values):
        from .nn.graph import BatchPositions, BatchSize
        if start == 0 and isinstance(end, BatchSize) and step == 1:  # x[ft.arange(N), y] while tracing
            return BatchPositions()
        if any(isinstance(v, BatchSize) for v in values):
            BatchPositions()._refuse()
        raise TypeError("arange expects real numbers")
    if dtype is None:
        is_int = all(isinstance(v, (int, _np.integer)) for v in values)
        dtype = _BY_NAME["int64"] if is_int else _BY_NAME["float32"]
    dtype = as_dtype(dtype)
    if not all(_np.isfinite(float(v)) for v in values):
        raise ValueError("arange: start, end and step must be finite")
    if (end - start) * step < 0:  # PyTorch's refusal: such a range is a mistake more often than an empty one
        raise ValueError(f"arange: the step {step} goes away from end {end} from start {start}")
    n = max(0, int(_np.ceil((end - start) / step)))
    out = empty(n, dtype=dtype, device=device)
    if dtype.is_floating_point:
        values = _np.float64(start) + _np.arange(n, dtype=_np.float64) * _np.float64(step)
    else:  # PyTorch's: the count from the real arguments, the values from start and step truncated to integers
        values = _np.int64(int(start)) + _np.arange(n, dtype=_np.int64) * _np.int64(int(step))
    return out.copy_(from_numpy(values))


def from_numpy(array: _np.ndarray) -> Tensor:
    """A tensor sharing memory with a NumPy array (which it keeps alive)."""
    return _C.from_numpy(array)


def from_dlpack(obj: Any) -> Tensor:
    """A tensor sharing memory with a DLPack producer (any object with __dlpack__, or a capsule)."""
    return _C.from_dlpack(obj)


def _is_nested_data(data):
    return isinstance(data, (list, tuple, int, float, bool, _np.generic)) or data is None


def _as_array(data):
    """A NumPy view of an object exposing the buffer protocol or NumPy's array protocols."""
    arr = _np.asarray(data)
    if arr.dtype == object:
        raise TypeError(f"cannot make a tensor from {type(data).__name__}")
    return arr


def _check_int64_range(t: Tensor, what: str) -> None:
    """Refuses uint64 values beyond int64, which integer labels and ids are read as (a cast would wrap them)."""
    if t.dtype is _BY_NAME["uint64"] and t.numel() and int(t.max()) >= 1 << 63:
        raise ValueError(f"{what} are read as int64: {int(t.max())} (uint64) does not fit")


def as_tensor(data: Any, dtype: DTypeLike | None = None, device: DeviceLike = None) -> Tensor:
    """A tensor for data, sharing memory whenever it can: the same tensor, a view of a NumPy array or DLPack
    producer; copied only when dtype or device differ, or when data is a list or scalar."""
    if isinstance(data, TensorBase):
        return data.to(dtype=dtype, device=device)
    if isinstance(data, _np.ndarray):
        t = from_numpy(data)
    elif _is_nested_data(data):
        t = _C.tensor_from_data(data, -1 if dtype is None else as_dtype(dtype)._code)
    elif hasattr(data, "__dlpack__"):
        t = from_dlpack(data)
    else:
        t = from_numpy(_as_array(data))
    return t if dtype is None and device is None else t.to(dtype=dtype, device=device)


def tensor(data: Any, dtype: DTypeLike | None = None, device: DeviceLike = None, pin_memory: bool = False) -> Tensor:
    """A new tensor holding a copy of data (nested lists, scalars, arrays, tensors)."""
    if isinstance(data, TensorBase):
        t = data
    elif isinstance(data, _np.ndarray):
        t = from_numpy(data)
    elif hasattr(data, "__dlpack__"):  # another library's tensor (PyTorch's bfloat16 too), copied below
        t = from_dlpack(data)
    elif _is_nested_data(data):
        t = _C.tensor_from_data(data, -1 if dtype is None else as_dtype(dtype)._code)
        if device is None and not pin_memory:
            return t
    else:
        t = from_numpy(_as_array(data))
    d = t.dtype if dtype is None else as_dtype(dtype)
    kind, index = as_device(device)._code
    return t._to(d._code, kind, index, bool(pin_memory), False, False)
