"""fasttrain.Tensor: the C tensor with NumPy-style indexing and PyTorch's methods."""
from __future__ import annotations

import math
import operator
from typing import TYPE_CHECKING

import numpy as np

from . import _C, _math
from ._math import _norm_dim
from ._types import CPU, DTYPES, _BY_NAME, as_device, as_dtype, device, device_of_code, dtype

if TYPE_CHECKING:
    # Tensor's methods int, float and bool and its properties dtype and device shadow these names in the class
    # body, where type checkers would read the annotations.
    from builtins import bool as _bool, float as _float, int as _int
    from typing import Any, Sequence

    from ._types import DeviceLike, DTypeLike, device as _device, dtype as _dtype
    from .random import Generator

_FLOAT32 = _BY_NAME["float32"]
_BFLOAT16 = _BY_NAME["bfloat16"]


def _infer_size(shape, numel):
    """Resolves one -1 in a view/reshape shape."""
    shape = list(shape)
    unknown = [i for i, s in enumerate(shape) if s == -1]
    if len(unknown) > 1:
        raise ValueError("only one dimension can be inferred (-1)")
    if any(s < -1 for s in shape):
        raise ValueError(f"invalid shape {tuple(shape)}")
    known = math.prod(s for s in shape if s != -1)
    if unknown:
        if known == 0 or numel % known:
            raise ValueError(f"shape {tuple(shape)} is invalid for input of size {numel}")
        shape[unknown[0]] = numel // known
    elif known != numel:
        raise ValueError(f"shape {tuple(shape)} is invalid for input of size {numel}")
    return tuple(shape)


def _view_strides(old_shape, old_strides, new_shape):
    """Strides that let new_shape view the same elements, or None when the
    layout needs a copy (PyTorch's rule: only runs of dimensions that are
    contiguous with each other can be split or merged)."""
    if math.prod(old_shape) == 0 or not old_shape:
        return _contiguous_strides(new_shape)
    new_strides = [0] * len(new_shape)
    view_d = len(new_shape) - 1
    chunk_base = old_strides[-1]
    tensor_numel = view_numel = 1
    for d in range(len(old_shape) - 1, -1, -1):
        tensor_numel *= old_shape[d]
        if d == 0 or (old_shape[d - 1] != 1 and old_strides[d - 1] != tensor_numel * chunk_base):
            while view_d >= 0 and (view_numel < tensor_numel or new_shape[view_d] == 1):
                new_strides[view_d] = view_numel * chunk_base
                view_numel *= new_shape[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if d > 0:
                chunk_base = old_strides[d - 1]
                tensor_numel = view_numel = 1
    return new_strides if view_d == -1 else None


def _contiguous_strides(shape):
    strides, s = [], 1
    for n in reversed(shape):
        strides.append(s)
        s *= max(n, 1)
    return strides[::-1]


def _sizes(args):
    """size arguments given as f(2, 3) or f((2, 3))."""
    if len(args) == 1 and not isinstance(args[0], int) and hasattr(args[0], "__iter__"):  # not the batch size N
        return tuple(args[0])
    return tuple(args)


class _TensorType(type):
    """Tensor's type: isinstance(x, ft.Tensor) holds for a traced value too (nn/graph.py's Symbolic), so a forward
    that checks for a tensor (to take a tensor or a list of them) takes the same branch while compile traces it.
    The library's own checks ask for _C.TensorBase, which traced values are not."""

    def __instancecheck__(cls, obj):
        if type.__instancecheck__(cls, obj):
            return True
        from .nn.graph import Common, Symbolic
        return cls is Tensor and isinstance(obj, (Symbolic, Common))

    def __call__(cls, *args, device=None, **kwargs):
        """ft.Tensor(2, 3), PyTorch's legacy constructor, with which older code makes parameters
        (nn.Parameter(ft.Tensor(out, in)) before an init): uninitialised float32 of those sizes; of one sequence or
        array, float32 of its values (ft.Tensor([1, 2])). Subclasses (nn.Parameter) construct as they define."""
        if cls is not Tensor:
            return super().__call__(*args, **kwargs, **({} if device is None else {"device": device}))
        from . import creation
        if kwargs:
            raise TypeError(f"Tensor(): unexpected keyword arguments {sorted(kwargs)}")
        if all(isinstance(a, (int, np.integer)) and not isinstance(a, (bool, np.bool_)) for a in args):
            return creation.empty(*(int(a) for a in args or (0,)), device=device)
        if len(args) == 1 and np.ndim(args[0]) == 0:
            raise TypeError(f"Tensor(): data must be a sequence or sizes, got {type(args[0]).__name__}")
        if len(args) > 1:
            raise TypeError(f"Tensor(): expected sizes or one sequence of values, got {args!r}")
        return creation.tensor(args[0], dtype="float32", device=device)


def _traced_copy(t):
    """While a forward is traced, a copy of a trainable parameter (or of a view of one: self.w[1:5].clone()) as the
    elements it copies, through which the parameter trains, as PyTorch's copy is differentiable; None otherwise."""
    from .nn.graph import Gathered, uses_trainable
    if not uses_trainable([t]):
        return None
    return t if t.is_contiguous() else Gathered.of(t)


def _moved(ndim, source, destination):
    """The order of ndim dimensions after movedim(source, destination): source moved to destination, the others
    in their order."""
    src = [_norm_dim(d, ndim) for d in ((source,) if isinstance(source, (int, np.integer)) else source)]
    dst = [_norm_dim(d, ndim) for d in ((destination,) if isinstance(destination, (int, np.integer)) else destination)]
    if len(src) != len(dst) or len(set(src)) != len(src) or len(set(dst)) != len(dst):
        raise ValueError(f"movedim: source {source} and destination {destination} must be unique dimensions of one "
                         "length")
    order = [d for d in range(ndim) if d not in src]
    for s, d in sorted(zip(src, dst), key=lambda p: p[1]):
        order.insert(d, s)
    return order


def _refuse_traced_write(t, op):
    """Fails for an in-place write into a trainable parameter while its model's forward is traced."""
    from .nn.graph import refuse_parameter_write
    refuse_parameter_write(op, t)


def _refuse_traced_parameter(t, what):
    """Fails for a trainable parameter's values read while its model's forward is traced: they would be a constant
    of the compiled step."""
    from .nn.graph import refuse_eager_parameters
    refuse_eager_parameters(what, (t,))


class Tensor(_C.TensorBase, metaclass=_TensorType):
    """An n-dimensional array on a device, sharing memory with NumPy and DLPack
    without copies. Create with ``ft.tensor``, ``ft.empty``, ``ft.from_numpy`` ..."""

    __slots__ = ()

    # ---- attributes ----
    @property
    def dtype(self) -> _dtype:
        """The element type (``ft.float32``, ...)."""
        return DTYPES[self._dtype_code]

    @property
    def device(self) -> _device:
        """The device the data lives on: ``device(type='cpu')`` or ``device(type='cuda', index=N)``."""
        return device_of_code(self._device_tuple)

    @property
    def is_cuda(self) -> _bool:
        """Whether the tensor is on a CUDA device."""
        return self._device_tuple[0] == 2

    def is_floating_point(self) -> _bool:
        """Whether the dtype is a floating-point one (float16, bfloat16, float32, float64), as PyTorch's."""
        return self.dtype.is_floating_point

    @property
    def itemsize(self) -> _int:
        """Bytes per element."""
        return self.element_size()

    @property
    def nbytes(self) -> _int:
        """Bytes of the elements the tensor views (numel() * itemsize), not of its whole storage."""
        return self.numel() * self.element_size()

    def size(self, dim: _int | None = None) -> tuple[_int, ...] | _int:
        """The shape as a tuple, or the size of dimension dim (negative counts from the end)."""
        return self.shape if dim is None else self.shape[_norm_dim(dim, self.ndim)]

    def dim(self) -> _int:
        """The number of dimensions (ndim)."""
        return self.ndim

    def __len__(self):
        if self.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    def requires_grad_(self, requires_grad: _bool = True) -> Tensor:
        """Sets requires_grad in place and returns the tensor, as PyTorch's."""
        self.requires_grad = requires_grad
        return self

    def backward(self, *args, **kwargs):
        """Refused with the way gradients are computed: eager tensors record no graph."""
        raise RuntimeError("Tensor.backward: eager fasttrain tensors record no graph. Compile the model with its "
                           "loss, program = model.compile(optimizer, loss, batch_size=...): program.backward(x, y) "
                           "fills each parameter's .grad (then optimizer.step()), program.train_step(x, y) runs the "
                           "whole step (docs/models.md)")

    # ---- views ----
    def __getitem__(self, index):
        if isinstance(index, Tensor) and not isinstance(index, _C.TensorBase):  # traced ids: a table's rows
            if self.ndim == 1:  # per-class values (weights) at the labels: the rows of a one-column table
                return self.view(-1, 1)[index].squeeze(-1)
            if self.ndim != 2:
                from .nn.graph import fail
                fail(f"indexing a {self.ndim}-d tensor with traced values", "index a 2-d table (its rows, as "
                     "F.embedding(ids, table)) or a 1-d tensor (per-class values at the labels)")
            from .nn import functional as F
            return F.embedding(index, self)
        index = _math.sequence_as_tuple(index)
        advanced = _math.advanced_index(index)
        if advanced is not None:  # masks and integer arrays: a copy, as in NumPy and PyTorch
            from .nn.graph import Gathered, uses_trainable
            if uses_trainable([self]):  # while a forward is traced: a relative position bias's table[index]
                return Gathered.of(self)[index]
            split = _math.ints_first(index)
            if split is not None:
                return self[split[0]][split[1]]
            return _math.getitem(self, advanced)
        shape, strides, offset = self._index(index)
        return self.as_strided(shape, strides, offset)

    def _index(self, index):
        """Shape, strides and storage offset of the basic-indexing view self[index]."""
        if not isinstance(index, tuple):
            index = (index,)
        consumed = sum(1 for i in index if i is not None and i is not Ellipsis)
        if sum(1 for i in index if i is Ellipsis) > 1:
            raise IndexError("an index can only have a single ellipsis ('...')")
        if consumed > self.ndim:
            raise IndexError(f"too many indices for a tensor of dimension {self.ndim}")
        shape, strides = [], []
        offset = self.storage_offset()
        old_shape, old_strides = self.shape, self.stride()
        d = 0
        for item in index:
            if item is Ellipsis:
                for _ in range(self.ndim - consumed):
                    shape.append(old_shape[d])
                    strides.append(old_strides[d])
                    d += 1
            elif item is None:
                shape.append(1)
                strides.append(0)
            elif isinstance(item, slice):
                start, stop, step = item.indices(old_shape[d])
                n = len(range(start, stop, step))
                if n:
                    offset += start * old_strides[d]
                shape.append(n)
                strides.append(old_strides[d] * step)
                d += 1
            elif isinstance(item, (int, np.integer, _C.TensorBase)) and not isinstance(item, (bool, np.bool_)):
                i = operator.index(item)  # a 0-d integer tensor indexes as its value
                if not -old_shape[d] <= i < old_shape[d]:
                    raise IndexError(f"index {i} is out of bounds for dimension {d} with size {old_shape[d]}")
                offset += (i % old_shape[d]) * old_strides[d]
                d += 1
            else:
                raise IndexError(f"only integers, slices, None, ..., and integer or bool tensors, arrays and lists "
                                 f"are valid indices, got {type(item).__name__}")
        shape += old_shape[d:]
        strides += old_strides[d:]
        return shape, strides, offset

    def __setitem__(self, index, value):
        if isinstance(value, Tensor) and not isinstance(value, _C.TensorBase):  # a traced value
            from .nn.graph import refuse_assignment
            refuse_assignment()
        _refuse_traced_write(self, "x[...] = v")
        index = _math.sequence_as_tuple(index)
        advanced = _math.advanced_index(index)
        if advanced is not None:
            split = _math.ints_first(index)
            if split is not None:  # written through the view the integers select
                self[split[0]][split[1]] = value
                return None
            return _math.setitem(self, advanced, value)
        view = self[index]
        if isinstance(value, (int, float, bool, np.number, np.bool_)):
            view._fill(value)  # converted as a copy converts it: t[0] = 1e6 of float16 is inf, as in PyTorch
            return
        lead = len(value.shape) - view.ndim if hasattr(value, "shape") else 0
        if lead > 0 and all(n == 1 for n in value.shape[:lead]):  # leading 1s drop, as PyTorch's t[i] = [[v]]
            value = value.reshape(tuple(value.shape[lead:]))
        view.copy_(value)

    def view(self, *shape: _int | Sequence[_int]) -> Tensor:
        """A view with the given shape (one size may be -1) sharing self's memory, as torch.Tensor.view;
        raises ValueError where the strides do not allow one (reshape copies then). view(dtype) is not
        supported."""
        if len(shape) == 1 and isinstance(shape[0], (dtype, str)):
            raise TypeError("view(dtype) is not supported; use .to(dtype) for a converted copy")
        shape = _infer_size(_sizes(shape), self.numel())
        strides = _view_strides(self.shape, self.stride(), shape)
        if strides is None:
            raise ValueError("view size is not compatible with the tensor's strides (at least one dimension spans "
                             "across two contiguous subspaces): use .reshape(...) instead")
        return self.as_strided(shape, strides, self.storage_offset())

    def reshape(self, *shape: _int | Sequence[_int]) -> Tensor:
        """The given shape (one size may be -1): a view where the strides allow one, else a contiguous copy."""
        shape = _infer_size(_sizes(shape), self.numel())
        strides = _view_strides(self.shape, self.stride(), shape)
        if strides is None:
            return self.contiguous().view(shape)
        return self.as_strided(shape, strides, self.storage_offset())

    def flatten(self, start_dim: _int = 0, end_dim: _int = -1) -> Tensor:
        """Dimensions start_dim..end_dim merged into one (through reshape: a view when possible); a 0-d tensor
        gives shape (1,)."""
        if self.ndim == 0:
            return self.reshape(1)
        s, e = _norm_dim(start_dim, self.ndim), _norm_dim(end_dim, self.ndim)
        if s > e:
            raise ValueError("flatten: start_dim cannot come after end_dim")
        shape = self.shape
        return self.reshape(shape[:s] + (math.prod(shape[s:e + 1]),) + shape[e + 1:])

    def unflatten(self, dim: _int, sizes: Sequence[_int]) -> Tensor:
        """Dimension dim split into sizes (one may be -1), through reshape, as torch.Tensor.unflatten."""
        d = _norm_dim(dim, self.ndim)
        return self.reshape(self.shape[:d] + tuple(sizes) + self.shape[d + 1:])

    def permute(self, *dims: _int | Sequence[_int]) -> Tensor:
        """A view with the dimensions reordered: dimension i of the result is dimension dims[i] of self."""
        dims = [_norm_dim(d, self.ndim) for d in _sizes(dims)]
        if sorted(dims) != list(range(self.ndim)):
            raise ValueError(f"permute: {tuple(dims)} is not a permutation of the {self.ndim} dimensions")
        shape, strides = self.shape, self.stride()
        return self.as_strided([shape[d] for d in dims], [strides[d] for d in dims], self.storage_offset())

    def transpose(self, dim0: _int, dim1: _int) -> Tensor:
        """A view with dimensions dim0 and dim1 swapped."""
        dims = list(range(self.ndim))
        a, b = _norm_dim(dim0, self.ndim), _norm_dim(dim1, self.ndim)
        if self.ndim:  # a 0-d tensor takes dimensions 0 and -1, as PyTorch's: itself
            dims[a], dims[b] = dims[b], dims[a]
        return self.permute(dims)

    def t(self) -> Tensor:
        """The transpose of a 2-d tensor as a view; a 0-d or 1-d tensor is returned as it is."""
        if self.ndim > 2:
            raise ValueError(f"t() expects a tensor with at most 2 dimensions, got {self.ndim}; use transpose")
        return self if self.ndim < 2 else self.transpose(0, 1)

    @property
    def T(self) -> Tensor:
        """A view with all dimensions in reverse order."""
        return self.permute(list(range(self.ndim))[::-1])

    def unsqueeze(self, dim: _int) -> Tensor:
        """A view with a new dimension of size 1 inserted at dim."""
        d = _norm_dim(dim, self.ndim + 1)
        return self[(slice(None),) * d + (None,)]

    def squeeze(self, dim: _int | Sequence[_int] | None = None) -> Tensor:
        """A view without the dimensions of size 1 (only those of dim, an int or a sequence, when given)."""
        dims = range(self.ndim) if dim is None else [_norm_dim(d, self.ndim) for d in (
            (dim,) if isinstance(dim, (int, np.integer)) else dim)]
        keep = [i for i in range(self.ndim) if not (i in dims and self.shape[i] == 1)]
        shape, strides = self.shape, self.stride()
        return self.as_strided([shape[i] for i in keep], [strides[i] for i in keep], self.storage_offset())

    def expand(self, *sizes: _int | Sequence[_int]) -> Tensor:
        """A broadcast view with zero strides (no copy), as torch.Tensor.expand. While a model is traced,
        expanding over the batch (x.shape[0]) makes the tensor a value of the model (a class token)."""
        from .nn.graph import BatchSize, constant
        sizes = tuple(sizes[0]) if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)) else sizes
        if sizes and isinstance(sizes[0], BatchSize):
            if len(sizes) > self.ndim:  # new leading dimensions (CLIP's class_embedding.expand(N, 1, -1))
                return self.reshape((1,) * (len(sizes) - self.ndim) + tuple(self.shape)).expand(*sizes)
            if len(sizes) != self.ndim or self.shape[0] != 1:
                raise ValueError(f"expand: a tensor of shape {self.shape} is expanded over the batch as (N, ...) "
                                 "from a leading size of 1")
            return constant(self, tuple(have if n == -1 else n for n, have in zip(sizes[1:], self.shape[1:])))
        sizes = _sizes(sizes)
        if len(sizes) < self.ndim:
            raise ValueError(f"expand: the number of sizes ({len(sizes)}) must be at least the tensor's "
                             f"dimensions ({self.ndim})")
        lead = len(sizes) - self.ndim
        shape, strides = [], []
        for i, n in enumerate(sizes):
            if i < lead:
                if n < 0:
                    raise ValueError(f"expand: size {n} is not allowed for a new leading dimension")
                shape.append(n)
                strides.append(0)
                continue
            have, stride = self.shape[i - lead], self.stride()[i - lead]
            if n == -1 or n == have:
                shape.append(have)
                strides.append(stride)
            elif have == 1:
                shape.append(n)
                strides.append(0)
            else:
                raise ValueError(f"expand: cannot broadcast shape {self.shape} to {tuple(sizes)}")
        return self.as_strided(shape, strides, self.storage_offset())

    def contiguous(self, memory_format: str = "contiguous") -> Tensor:
        """self if its memory is C-contiguous (memory_format=ft.channels_last: a 4-d tensor's NHWC-contiguous, as
        PyTorch's), else such a copy."""
        if self.is_contiguous(memory_format):
            return self
        if memory_format == "channels_last":
            return self.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)
        traced = _traced_copy(self)
        return traced if traced is not None else self._to(self._dtype_code, *self._device_tuple, False, False, False)

    def is_contiguous(self, memory_format: str = "contiguous") -> _bool:
        """Whether the memory is C-contiguous (an empty tensor always is, as in PyTorch: no element is out of place),
        or with memory_format=ft.channels_last a 4-d tensor's dimensions lie as (N, H, W, C)."""
        from ._types import check_memory_format
        if check_memory_format("is_contiguous", memory_format) != "channels_last":
            return self.numel() == 0 or _C.TensorBase.is_contiguous(self)
        if self.ndim != 4:
            raise ValueError(f"memory_format=channels_last applies to 4-d tensors, got {self.ndim}-d")
        return _C.TensorBase.is_contiguous(self.permute(0, 2, 3, 1))

    # ---- copies and conversions ----
    def clone(self) -> Tensor:
        """A copy with the same dtype, device and memory layout (a channels-last tensor stays channels-last)."""
        traced = _traced_copy(self)
        return traced if traced is not None else self._to(self._dtype_code, *self._device_tuple, False, False, True)

    def copy_(self, src: Any, non_blocking: _bool = False) -> Tensor:
        """Copies src (a tensor, array or nested list, broadcast to self's shape) into self, converting dtype
        and device."""
        _refuse_traced_write(self, "copy_")
        if not isinstance(src, _C.TensorBase):
            from .creation import as_tensor
            src = as_tensor(src)
        if src.shape != self.shape:
            try:
                src = src.expand(self.shape)
            except ValueError:
                raise ValueError(f"copy_: source of shape {src.shape} cannot be broadcast to {self.shape}") from None
        return self._copy_from(src, non_blocking)

    def fill_(self, value: _bool | _int | _float | Tensor) -> Tensor:
        """Sets every element to value (a number or a one-element tensor) in place; returns self. A number the dtype
        cannot hold fails, as in PyTorch (a tensor's value converts as copies do)."""
        _refuse_traced_write(self, "fill_")
        if isinstance(value, _C.TensorBase):
            value = value.item()
        else:
            _math.checked_number(value, self.dtype)
        return self._fill(value)

    def zero_(self) -> Tensor:
        """Sets every element to zero in place; returns self."""
        _refuse_traced_write(self, "zero_")
        return self._fill(0)

    def uniform_(self, a: _float = 0.0, b: _float = 1.0, *, generator: Generator | None = None) -> Tensor:
        """Fills self in place with values drawn uniformly from [a, b), from generator (default: the global
        one) by its counter-based (Philox) stream, so the values do not depend on the thread count."""
        from .random import _draw
        return _draw(_C.uniform_, self, generator, float(a), float(b))

    def normal_(self, mean: _float = 0.0, std: _float = 1.0, *, generator: Generator | None = None) -> Tensor:
        """Fills self in place with values drawn from the normal distribution N(mean, std^2), from generator
        (default: the global one) by its counter-based (Philox) stream, as uniform_."""
        from .random import _draw
        return _draw(_C.normal_, self, generator, float(mean), float(std))

    def bernoulli_(self, p: _float = 0.5, *, generator: Generator | None = None) -> Tensor:
        """Fills self in place with 1 where a uniform draw (as uniform_'s) falls below p and 0 elsewhere, as
        torch's bernoulli_."""
        from . import creation
        from .random import _refuse_draw
        _refuse_draw("bernoulli_")  # in a traced forward: drawn once, at compile
        chances = np.asarray(p.cpu().numpy() if isinstance(p, _C.TensorBase) else p)
        if not ((chances >= 0) & (chances <= 1)).all():
            raise ValueError(f"bernoulli_: p must be in [0, 1], got {p}")
        return self.copy_(creation.empty(self.shape, device=self.device).uniform_(generator=generator) < p)

    def to(self, *args: Any, dtype: DTypeLike | None = None, device: DeviceLike = None, non_blocking: _bool = False,
           copy: _bool = False, memory_format: str = "preserve") -> Tensor:
        """to(dtype), to(device), to(device, dtype), to(other): a converted copy, or self when nothing changes;
        memory_format=ft.channels_last (or ft.contiguous_format) lays it out so, as contiguous(memory_format)."""
        from ._types import check_memory_format
        if check_memory_format("to", memory_format) != "preserve":
            return self.to(*args, dtype=dtype, device=device, non_blocking=non_blocking, copy=copy).contiguous(
                memory_format)
        if not args and dtype is None and device is None and not copy:
            return self
        for a in args:
            if isinstance(a, _C.TensorBase):
                dtype, device = a.dtype, a.device
            elif isinstance(a, (device_type, int)) or (isinstance(a, str) and a.split(":")[0] in ("cpu", "cuda")):
                device = a
            else:
                dtype = a
        want_dtype = self.dtype if dtype is None else as_dtype(dtype)
        want_device = self.device if device is None else as_device(device)
        if not copy and want_dtype is self.dtype and want_device == self.device:
            return self
        kind, index = want_device._code
        return self._to(want_dtype._code, kind, index, False, non_blocking, True)

    def cpu(self) -> Tensor:
        """self if it is on the CPU, else a copy in host memory."""
        return self.to(CPU)

    def numpy(self, *, force: _bool = False) -> Any:
        """A NumPy array sharing this CPU tensor's memory; with force=True, as PyTorch's, the values of a tensor on
        any device (a copy in host memory for a CUDA one)."""
        _refuse_traced_parameter(self, "numpy()")
        return _C.TensorBase.numpy(self.cpu() if force else self)

    def cuda(self, device: DeviceLike = None, non_blocking: _bool = False) -> Tensor:
        """self if it is on the CUDA device (default cuda:0; an int is an index), else a copy there."""
        return self.to(as_device("cuda" if device is None else device), non_blocking=non_blocking)

    def pin_memory(self) -> Tensor:
        """A copy in page-locked host memory (self if it already is)."""
        if self.is_pinned():
            return self
        if self.is_cuda:
            raise RuntimeError("pin_memory() applies to CPU tensors; this one is on " + str(self.device))
        return self._to(self._dtype_code, 1, 0, True, False, False)

    def float(self) -> Tensor:
        """self.to(ft.float32)."""
        return self.to(_FLOAT32)

    def double(self) -> Tensor:
        """self.to(ft.float64)."""
        return self.to(_BY_NAME["float64"])

    def half(self) -> Tensor:
        """self.to(ft.float16)."""
        return self.to(_BY_NAME["float16"])

    def bfloat16(self) -> Tensor:
        """self.to(ft.bfloat16)."""
        return self.to(_BFLOAT16)

    def int(self) -> Tensor:
        """self.to(ft.int32)."""
        return self.to(_BY_NAME["int32"])

    def long(self) -> Tensor:
        """self.to(ft.int64)."""
        return self.to(_BY_NAME["int64"])

    def short(self) -> Tensor:
        """self.to(ft.int16)."""
        return self.to(_BY_NAME["int16"])

    def byte(self) -> Tensor:
        """self.to(ft.uint8)."""
        return self.to(_BY_NAME["uint8"])

    def char(self) -> Tensor:
        """self.to(ft.int8)."""
        return self.to(_BY_NAME["int8"])

    def bool(self) -> Tensor:
        """self.to(ft.bool)."""
        return self.to(_BY_NAME["bool"])

    # ---- Python and NumPy interop ----
    def _host_array(self):
        """A NumPy array of the values: a zero-copy view when possible."""
        t = self
        if t.is_cuda:
            t = t.cpu()
        if t.dtype is _BFLOAT16:
            t = t.to(_FLOAT32)
        return t.numpy()

    def tolist(self) -> Any:
        """The values as nested Python lists (a Python number for a 0-d tensor), as NumPy's tolist."""
        _refuse_traced_parameter(self, "tolist()")
        return self._host_array().tolist()

    def __array__(self, dtype=None, copy=None):
        _refuse_traced_parameter(self, "a NumPy array")
        needs_copy = self.is_cuda or self.dtype is _BFLOAT16
        if needs_copy and copy is False:
            raise ValueError(f"a {self.dtype.name} tensor on {self.device} cannot become a NumPy array without a copy")
        arr = self._host_array()
        if dtype is not None and np.dtype(dtype) != arr.dtype:
            if copy is False:
                raise ValueError(f"converting to {np.dtype(dtype)} needs a copy")
            return arr.astype(dtype)
        return arr.copy() if copy and not needs_copy else arr

    @property
    def __array_interface__(self):
        _refuse_traced_parameter(self, "a NumPy array")
        if self.is_cuda or self.dtype._typestr is None:
            raise AttributeError(f"a {self.dtype.name} tensor on {self.device} has no __array_interface__")
        return {
            "version": 3,
            "shape": self.shape,
            "typestr": self.dtype._typestr,
            # The data is an array that holds the storage (a raw address would be held only through this
            # object, which model.compile() rebinds to the flat buffer, releasing the memory it pointed at).
            "data": self._storage_bytes(),
            "offset": self.storage_offset() * self.itemsize,
            "strides": None if self.is_contiguous() else tuple(s * self.itemsize for s in self.stride()),
        }

    # ---- math (fasttrain/_math.py): NumPy on the host; a CUDA tensor is copied there and back ----
    # NumPy arrays defer to these operators (array + tensor gives a tensor, promoted as PyTorch)
    __array_priority__ = 1000

    __add__, __radd__ = _math.operator_method(_math.add), _math.operator_method(_math.add, reflected=True)
    __sub__, __rsub__ = _math.operator_method(_math.sub), _math.operator_method(_math.sub, reflected=True)
    __mul__, __rmul__ = _math.operator_method(_math.mul), _math.operator_method(_math.mul, reflected=True)
    __truediv__ = _math.operator_method(_math.div)
    __rtruediv__ = _math.operator_method(_math.div, reflected=True)
    __floordiv__ = _math.operator_method(_math.floor_divide)
    __rfloordiv__ = _math.operator_method(_math.floor_divide, reflected=True)
    __mod__, __rmod__ = _math.operator_method(_math.remainder), _math.operator_method(_math.remainder, reflected=True)
    __pow__, __rpow__ = _math.operator_method(_math.pow), _math.operator_method(_math.pow, reflected=True)
    __matmul__ = _math.operator_method(_math.matmul)
    __rmatmul__ = _math.operator_method(_math.matmul, reflected=True)
    __and__, __rand__ = _math.operator_method(_math.bitwise_and), _math.operator_method(_math.bitwise_and, True)
    __or__, __ror__ = _math.operator_method(_math.bitwise_or), _math.operator_method(_math.bitwise_or, True)
    __xor__, __rxor__ = _math.operator_method(_math.bitwise_xor), _math.operator_method(_math.bitwise_xor, True)
    __lshift__ = _math.operator_method(_math.bitwise_left_shift)
    __rlshift__ = _math.operator_method(_math.bitwise_left_shift, True)
    __rshift__ = _math.operator_method(_math.bitwise_right_shift)
    __rrshift__ = _math.operator_method(_math.bitwise_right_shift, True)
    __eq__, __ne__ = _math.operator_method(_math.eq), _math.operator_method(_math.ne)
    __lt__, __le__ = _math.operator_method(_math.lt), _math.operator_method(_math.le)
    __gt__, __ge__ = _math.operator_method(_math.gt), _math.operator_method(_math.ge)
    __neg__, __abs__, __invert__ = _math.neg, _math.abs, _math.bitwise_not

    def __pos__(self):
        return self

    add, sub, mul, div, pow = _math.add, _math.sub, _math.mul, _math.div, _math.pow
    floor_divide, remainder, maximum, minimum = _math.floor_divide, _math.remainder, _math.maximum, _math.minimum
    eq, ne, lt, le, gt, ge = _math.eq, _math.ne, _math.lt, _math.le, _math.gt, _math.ge
    neg, abs, exp, log, sqrt, rsqrt = _math.neg, _math.abs, _math.exp, _math.log, _math.sqrt, _math.rsqrt
    relu, sigmoid, tanh, clamp, clip = _math.relu, _math.sigmoid, _math.tanh, _math.clamp, _math.clip
    sum, mean, std, var, all, any = _math.sum, _math.mean, _math.std, _math.var, _math.all, _math.any
    max, min, argmax, argmin = _math.max, _math.min, _math.argmax, _math.argmin
    matmul, softmax, log_softmax = _math.matmul, _math.softmax, _math.log_softmax
    sort, argsort, topk, unique = _math.sort, _math.argsort, _math.topk, _math.unique
    tril, triu, masked_fill = _math.tril, _math.triu, _math.masked_fill
    clamp_min, clamp_max, square, logsumexp = _math.clamp_min, _math.clamp_max, _math.square, _math.logsumexp

    amax, amin, norm, gather = _math.amax, _math.amin, _math.norm, _math.gather
    floor, ceil, round, trunc, sign = _math.floor, _math.ceil, _math.round, _math.trunc, _math.sign
    isnan, isinf, isfinite, log1p, expm1 = _math.isnan, _math.isinf, _math.isfinite, _math.log1p, _math.expm1
    flip, roll, cumsum, nan_to_num = _math.flip, _math.roll, _math.cumsum, _math.nan_to_num
    prod, cumprod, nansum, nanmean = _math.prod, _math.cumprod, _math.nansum, _math.nanmean
    count_nonzero, median, quantile = _math.count_nonzero, _math.median, _math.quantile
    log2, log10, exp2, reciprocal = _math.log2, _math.log10, _math.exp2, _math.reciprocal
    sin, cos, tan, asin, acos, atan = _math.sin, _math.cos, _math.tan, _math.asin, _math.acos, _math.atan
    sinh, cosh, atan2, hypot, logaddexp = _math.sinh, _math.cosh, _math.atan2, _math.hypot, _math.logaddexp
    fmod, fmax, fmin, lerp = _math.fmod, _math.fmax, _math.fmin, _math.lerp
    logical_and, logical_or, logical_xor, logical_not = (_math.logical_and, _math.logical_or, _math.logical_xor,
                                                         _math.logical_not)
    isclose, allclose, equal = _math.isclose, _math.allclose, _math.equal
    outer, dot, mv, mm, bmm = _math.outer, _math.dot, _math.mv, _math.mm, _math.bmm
    erf, erfc, addmm, baddbmm = _math.erf, _math.erfc, _math.addmm, _math.baddbmm
    diagonal, diag, trace, nonzero = _math.diagonal, _math.diag, _math.trace, _math.nonzero
    index_select, masked_select, scatter, scatter_add = (_math.index_select, _math.masked_select, _math.scatter,
                                                         _math.scatter_add)
    bincount, diff, repeat_interleave = _math.bincount, _math.diff, _math.repeat_interleave

    @property
    def mT(self) -> Tensor:
        """A view with the last two dimensions swapped (a batch of matrices transposed)."""
        if self.ndim < 2:
            raise ValueError(f"mT: expected a tensor of at least 2 dimensions, got {self.ndim}")
        return self.transpose(-2, -1)

    def movedim(self, source: _int | Sequence[_int], destination: _int | Sequence[_int]) -> Tensor:
        """A view with dimensions source moved to destination, the others in their order, as torch.movedim."""
        order = _moved(self.ndim, source, destination)
        return self.permute(order if self.ndim else [])  # a 0-d tensor's dimension 0 or -1: itself

    moveaxis = movedim

    def swapaxes(self, axis0: _int, axis1: _int) -> Tensor:
        """transpose(axis0, axis1), as torch.swapaxes."""
        return self.transpose(axis0, axis1)

    swapdims = swapaxes

    def view_as(self, other: Tensor) -> Tensor:
        """self.view(other.shape)."""
        return self.view(other.shape)

    def reshape_as(self, other: Tensor) -> Tensor:
        """self.reshape(other.shape)."""
        return self.reshape(other.shape)

    def ravel(self) -> Tensor:
        """The elements in one contiguous dimension: a view of a contiguous tensor, else a copy (as torch.ravel)."""
        return self.contiguous().view(-1)

    def tile(self, *dims: _int | Sequence[_int]) -> Tensor:
        """A copy repeated dims times along each dimension; fewer dims than dimensions repeat the last ones, as
        torch.tile."""
        dims = _sizes(dims)
        return self.repeat((1,) * (self.ndim - len(dims)) + tuple(dims))

    def broadcast_to(self, size: Sequence[_int]) -> Tensor:
        """The broadcast view of self of shape size (self.expand(size))."""
        return self.expand(size)

    def new_full(self, size: Sequence[_int], fill_value: _float, *, dtype: DTypeLike | None = None,
                 device: DeviceLike = None) -> Tensor:
        """fill_value of size, in this tensor's dtype and device unless given."""
        from .creation import full
        return full(size, fill_value, dtype=dtype or self.dtype, device=device or self.device)

    def new_zeros(self, *size: _int | Sequence[_int], dtype: DTypeLike | None = None,
                  device: DeviceLike = None) -> Tensor:
        """Zeros of size, in this tensor's dtype and device unless given."""
        return self.new_full(_sizes(size), 0, dtype=dtype, device=device)

    def new_ones(self, *size: _int | Sequence[_int], dtype: DTypeLike | None = None,
                 device: DeviceLike = None) -> Tensor:
        """Ones of size, in this tensor's dtype and device unless given."""
        return self.new_full(_sizes(size), 1, dtype=dtype, device=device)

    def new_tensor(self, data: Any, *, dtype: DTypeLike | None = None, device: DeviceLike = None) -> Tensor:
        """A tensor of data (copied), in this tensor's dtype and device unless given."""
        from .creation import tensor
        return tensor(data, dtype=dtype or self.dtype, device=device or self.device)

    def select(self, dim: _int, index: _int) -> Tensor:
        """The view at index along dim, that dimension dropped."""
        d = _norm_dim(dim, self.ndim, "select: dim")
        return self[(slice(None),) * d + (index,)]

    def narrow(self, dim: _int, start: _int, length: _int) -> Tensor:
        """The view of length elements from start along dim."""
        d = _norm_dim(dim, self.ndim, "narrow: dim")
        if start < 0:
            start += self.shape[d]
        if not 0 <= start <= start + length <= self.shape[d]:
            raise IndexError(f"narrow: start {start} and length {length} exceed dimension {d} of size "
                             f"{self.shape[d]}")
        return self[(slice(None),) * d + (slice(start, start + length),)]

    def unfold(self, dimension: _int, size: _int, step: _int) -> Tensor:
        """The view of every window of size elements along dimension, one each step: that dimension becomes the
        windows' count and a last dimension of size their elements, as torch.Tensor.unfold (of a 0-d tensor, itself
        as one window of one element)."""
        if not self.ndim:
            return self.reshape(1).unfold(dimension, size, step).reshape(size)
        d = _norm_dim(dimension, self.ndim, "unfold: dimension")
        if step <= 0:
            raise RuntimeError(f"unfold: step is {step} but must be > 0")
        if not 0 <= size <= self.shape[d]:
            raise RuntimeError(f"unfold: maximum size for tensor at dimension {d} is {self.shape[d]} but size is "
                               f"{size}")
        shape, strides = list(self.shape), list(self.stride())
        shape[d], strides[d] = (shape[d] - size) // step + 1, strides[d] * step
        return self.as_strided(shape + [size], strides + [self.stride(d)], self.storage_offset())

    def unbind(self, dim: _int = 0) -> tuple[Tensor, ...]:
        """The views at each index along dim, that dimension dropped."""
        d = _norm_dim(dim, self.ndim, "unbind: dim")
        return tuple(self.select(d, i) for i in range(self.shape[d]))

    def split(self, split_size: _int | Sequence[_int], dim: _int = 0) -> tuple[Tensor, ...]:
        """Views of split_size along dim (the last shorter), or of the sizes listed."""
        d = _norm_dim(dim, self.ndim, "split: dim")
        n = self.shape[d]
        if isinstance(split_size, int):
            if split_size < 1:
                raise ValueError(f"split: split_size must be positive, got {split_size}")
            sizes = [min(split_size, n - at) for at in range(0, n, split_size)] or [0]
        else:
            sizes = list(split_size)
            if sum(sizes) != n or any(k < 0 for k in sizes):
                raise ValueError(f"split: sizes {sizes} do not add up to dimension {d} of size {n}")
        starts = np.cumsum([0] + sizes[:-1])
        return tuple(self.narrow(d, int(a), k) for a, k in zip(starts, sizes))

    def chunk(self, chunks: _int, dim: _int = 0) -> tuple[Tensor, ...]:
        """Views of ceil(size / chunks) along dim (the last shorter; fewer than chunks where they run out)."""
        if chunks < 1:
            raise ValueError(f"chunk: chunks must be positive, got {chunks}")
        n = self.shape[_norm_dim(dim, self.ndim, "chunk: dim")]
        if n == 0:  # chunks empty pieces, as PyTorch's
            return (self,) * chunks
        return self.split(-(-n // chunks), dim)

    def repeat(self, *sizes: _int | Sequence[_int]) -> Tensor:
        """A copy tiled sizes times along each dimension (more sizes than dimensions add leading ones)."""
        sizes = _sizes(sizes)
        if len(sizes) < self.ndim:
            raise ValueError(f"repeat: the number of sizes ({len(sizes)}) must be at least the tensor's dimensions "
                             f"({self.ndim})")
        return _math._apply("repeat", lambda a: np.tile(a, sizes), [self], self.dtype, self.dtype)

    def expand_as(self, other: Tensor) -> Tensor:
        """self.expand(other.shape)."""
        return self.expand(other.shape)

    def type_as(self, other: Tensor) -> Tensor:
        """self in other's dtype."""
        return self.to(other.dtype)

    add_, sub_, mul_, div_ = (_math.in_place(f) for f in (_math.add, _math.sub, _math.mul, _math.div))
    pow_, clamp_, clip_ = _math.in_place(_math.pow), _math.in_place(_math.clamp), _math.in_place(_math.clamp)
    masked_fill_ = _math.in_place(_math.masked_fill)
    neg_, abs_, exp_, log_, sqrt_ = (_math.in_place(f) for f in (_math.neg, _math.abs, _math.exp, _math.log,
                                                                _math.sqrt))
    relu_, sigmoid_, tanh_ = (_math.in_place(f) for f in (_math.relu, _math.sigmoid, _math.tanh))
    clamp_min_, clamp_max_ = _math.in_place(_math.clamp_min), _math.in_place(_math.clamp_max)
    scatter_, scatter_add_ = _math.in_place(_math.scatter), _math.in_place(_math.scatter_add)
    index_add, index_add_ = _math.index_add, _math.in_place(_math.index_add)
    lerp_, fmod_, reciprocal_ = _math.in_place(_math.lerp), _math.in_place(_math.fmod), _math.in_place(
        _math.reciprocal)
    __iadd__, __isub__ = _math.operator_method(add_), _math.operator_method(sub_)
    __imul__, __itruediv__ = _math.operator_method(mul_), _math.operator_method(div_)
    __ifloordiv__ = _math.operator_method(_math.in_place(_math.floor_divide))
    __imod__ = _math.operator_method(_math.in_place(_math.remainder))
    __ipow__ = _math.operator_method(pow_)
    __iand__ = _math.operator_method(_math.in_place(_math.bitwise_and))
    __ior__ = _math.operator_method(_math.in_place(_math.bitwise_or))
    __ixor__ = _math.operator_method(_math.in_place(_math.bitwise_xor))
    __ilshift__ = _math.operator_method(_math.in_place(_math.bitwise_left_shift))
    __irshift__ = _math.operator_method(_math.in_place(_math.bitwise_right_shift))

    def where(self, condition: Tensor, other: Any) -> Tensor:
        """self where condition holds, else other: ft.where(condition, self, other)."""
        return _math.where(condition, self, other)

    def detach(self) -> Tensor:
        """A new tensor object viewing self's memory, as torch.Tensor.detach (fasttrain's eager tensors record no
        graph, so nothing else changes). Of a trainable parameter (or a view of one) while its model's forward is
        traced, its value through which no gradient passes."""
        from .nn.graph import common_value, uses_trainable
        if uses_trainable([self]):
            return common_value(self).detach()
        return self.as_strided(self.shape, self.stride(), self.storage_offset())

    @property
    def data(self) -> Tensor:
        """self.detach(). Assigning t.data = other copies other's values into t's memory (same shape), where PyTorch
        would rebind t to other's: a compiled model keeps reading its parameters where they are."""
        return self.detach()

    @data.setter
    def data(self, value: Any) -> None:
        if isinstance(value, _C.TensorBase) and value.shape != self.shape:
            raise ValueError(f"data: a tensor of shape {self.shape} cannot take values of shape {value.shape}")
        self.copy_(value)

    __hash__ = _C.TensorBase.__hash__  # identity, as PyTorch's: tensors stay usable as dict keys

    def __bool__(self):
        if self.numel() != 1:
            count = "no values" if self.numel() == 0 else "more than one value"
            raise ValueError(f"Boolean value of Tensor with {count} is ambiguous")
        return bool(self.item())

    def __format__(self, spec):
        # f"{loss:.4f}" and f"{loss}" format a 0-d tensor as its number, as PyTorch's
        return format(self.item(), spec) if self.ndim == 0 else object.__format__(self, spec)

    def item(self) -> Any:
        """The value of a one-element tensor as a Python number (a model's buffer read so while its forward is traced
        is a constant of the program, named if the buffer changes after compile)."""
        from .nn.graph import _note_buffers
        _note_buffers((self,))
        return _C.TensorBase.item(self)

    def __float__(self):
        return float(self.item())

    def __int__(self):
        return int(self.item())

    def __index__(self):
        if self.dtype.is_floating_point or self.dtype.is_complex or self.numel() != 1:
            raise TypeError("only integer tensors of a single element can be converted to an index")
        return int(self.item())

    def __repr__(self):
        suffix = []
        if self.dtype not in (_FLOAT32, _BY_NAME["int64"], _BY_NAME["bool"]) or self.numel() == 0:
            suffix.append(f"dtype={self.dtype!r}")
        if self.is_cuda:
            suffix.append(f"device='{self.device}'")
        if self.numel() == 0 and self.ndim != 1:
            suffix.insert(0, f"size={self.shape}")
            body = "[]"
        else:
            body = np.array2string(self._host_array(), separator=", ", prefix="tensor(", threshold=1000)
        return "tensor(" + ", ".join([body] + suffix) + ")"

    def _repr_html_(self):
        # Jupyter's form: shape, dtype and device in a table above the values as repr writes them
        import html
        from ._display import Column, Table
        table = Table([Column("shape"), Column("dtype"), Column("device"), Column("requires_grad")],
                      [[str(tuple(self.shape)), self.dtype.name, str(self.device), str(self.requires_grad)]])
        return table.html() + f"<pre>{html.escape(repr(self))}</pre>"

    def __reduce__(self):
        """Pickling and copy.deepcopy: the values, dtype and device, and the class and requires_grad (a module's
        deep copy keeps its parameters trainable)."""
        return (_rebuild, (self.cpu().to(_FLOAT32).numpy() if self.dtype is _BFLOAT16 else self.cpu().numpy(),
                           self.dtype.name, str(self.device), type(self), self.requires_grad))

    def type(self, dtype: DTypeLike | None = None, non_blocking: _bool = False) -> "Tensor | str":
        """The tensor as dtype (itself when it has it), as torch's Tensor.type(dtype) (the quickstart's
        ``(pred.argmax(1) == y).type(ft.float)``); without a dtype its name, "fasttrain.float32"."""
        return f"fasttrain.{self.dtype.name}" if dtype is None else self.to(dtype)


dtype_type = dtype
device_type = device


def _rebuild(array, dtype_name, device_name, cls=Tensor, requires_grad=False):
    from .creation import tensor
    t = tensor(array, dtype=_BY_NAME[dtype_name], device=device_name)
    t.__class__ = cls  # nn.Parameter adds no state of its own
    t.requires_grad = requires_grad
    return t


_math.take_numpy_names(Tensor)
_C._set_tensor_class(Tensor)
