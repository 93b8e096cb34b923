"""dtype and device objects, named as in PyTorch."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from . import _C


class dtype:
    """An element type. Compare with ``is`` or ``==``; ``str(ft.float32) == 'fasttrain.float32'``."""

    __slots__ = ("name", "_code", "itemsize", "is_floating_point", "is_complex", "is_signed", "_typestr")

    def __init__(self, name, code, dl_code, bits, itemsize):
        self.name = name
        self._code = code
        self.itemsize = itemsize
        self.is_floating_point = dl_code in (2, 4)
        self.is_complex = dl_code == 5
        self.is_signed = dl_code in (0, 2, 4, 5)
        # bfloat16 has no NumPy type string.
        self._typestr = None if name == "bfloat16" else np.dtype(name).str

    def __repr__(self):
        return f"fasttrain.{self.name}"

    def __reduce__(self):
        return (_dtype_by_name, (self.name,))


DTYPES = [dtype(*entry) for entry in _C.DTYPES]
_BY_NAME = {d.name: d for d in DTYPES}
_ALIASES = {"float": "float32", "double": "float64", "half": "float16", "long": "int64", "int": "int32",
            "short": "int16", "cfloat": "complex64", "cdouble": "complex128"}


def _dtype_by_name(name):
    return _BY_NAME[name]


class finfo:
    """The limits of a floating dtype (float32 by default), as torch.finfo: bits, eps, max, min, tiny
    (= smallest_normal) and resolution."""

    def __init__(self, type: DTypeLike | None = None):
        self.dtype = as_dtype("float32" if type is None else type)
        if not self.dtype.is_floating_point:
            raise TypeError(f"finfo takes a floating dtype, got {self.dtype.name} (iinfo is for integers)")
        if self.dtype.name == "bfloat16":  # float32's exponent with 8 bits of significand
            self.bits, self.eps, self.max, self.tiny, self.resolution = 16, 2.0 ** -7, float.fromhex("0x1.fep127"), \
                2.0 ** -126, 0.01
        else:
            info = np.finfo(self.dtype.name)
            self.bits, self.eps, self.max, self.tiny = info.bits, float(info.eps), float(info.max), \
                float(info.smallest_normal)
            self.resolution = 10.0 ** -info.precision
        self.min, self.smallest_normal = -self.max, self.tiny

    def __repr__(self):
        return f"finfo(resolution={self.resolution}, min={self.min:g}, max={self.max:g}, eps={self.eps:g}, " \
               f"tiny={self.tiny:g}, dtype={self.dtype.name})"


class iinfo:
    """The limits of an integer dtype, as torch.iinfo: bits, min and max."""

    def __init__(self, type: DTypeLike):
        self.dtype = as_dtype(type)
        if self.dtype.is_floating_point or self.dtype.is_complex or self.dtype.name == "bool":
            raise TypeError(f"iinfo takes an integer dtype, got {self.dtype.name} (finfo is for floats)")
        info = np.iinfo(self.dtype.name)
        self.bits, self.min, self.max = info.bits, int(info.min), int(info.max)

    def __repr__(self):
        return f"iinfo(min={self.min}, max={self.max}, bits={self.bits}, dtype={self.dtype.name})"


def as_dtype(obj: DTypeLike) -> dtype:
    """A fasttrain dtype from a dtype, a NumPy dtype or type, a name like 'float32', or a torch dtype (by its name:
    code written for PyTorch passes torch.bfloat16)."""
    if isinstance(obj, dtype):
        return obj
    if type(obj).__module__ == "torch" and type(obj).__name__ == "dtype":
        obj = str(obj).removeprefix("torch.")
    if isinstance(obj, str):
        name = _ALIASES.get(obj, obj)
        if name in _BY_NAME:
            return _BY_NAME[name]
        raise TypeError(f"unknown dtype {obj!r}")
    if obj is bool:
        return _BY_NAME["bool"]
    if obj is int:
        return _BY_NAME["int64"]
    if obj is float:
        return _BY_NAME["float32"]
    try:
        npd = np.dtype(obj)
    except TypeError:
        raise TypeError(f"cannot interpret {obj!r} as a fasttrain dtype") from None
    name = "bool" if npd.kind == "b" else npd.name
    if name not in _BY_NAME or not npd.isnative:
        raise TypeError(f"NumPy dtype {npd} has no fasttrain equivalent")
    return _BY_NAME[name]


DEV_CPU, DEV_CUDA = 1, 2

# The CUDA device "cuda" names: the one ft.cuda.set_device gave, else cuda:0, or under ft.distributed the
# local rank's device (one process per GPU).
_current_cuda = None
_local_rank = 0


def current_cuda_index():
    if _current_cuda is not None:
        return _current_cuda
    from . import _C
    count = _C.cuda_device_count()
    return _local_rank % count if count else 0


class device:
    """A device: ``ft.device('cpu')``, ``ft.device('cuda:1')``, ``ft.device('cuda', 0)``."""

    __slots__ = ("type", "index")

    def __init__(self, type, index=None):
        if isinstance(type, device):
            type, index = type.type, type.index
        if not isinstance(type, str):
            raise TypeError(f"a device is given as a string like 'cpu' or 'cuda:0', not {type!r}")
        name, sep, num = type.partition(":")
        if sep:
            if index is not None:
                raise ValueError(f"device {type!r} already names an index")
            if not num.isdigit():
                raise ValueError(f"invalid device string {type!r}")
            index = int(num)
        if name not in ("cpu", "cuda"):
            raise ValueError(f"unknown device type {name!r}: fasttrain knows 'cpu' and 'cuda'")
        if index is not None and (not isinstance(index, int) or index < 0):
            raise ValueError(f"device index must be a non-negative int, got {index!r}")
        if name == "cpu":
            index = None
        elif index is None:
            index = current_cuda_index()
        object.__setattr__(self, "type", name)
        object.__setattr__(self, "index", index)

    def __setattr__(self, key, value):
        raise AttributeError("device objects are immutable")

    @property
    def _code(self):
        return (DEV_CPU, 0) if self.type == "cpu" else (DEV_CUDA, self.index)

    def __eq__(self, other):
        if isinstance(other, str):
            other = device(other)
        return isinstance(other, device) and (self.type, self.index) == (other.type, other.index)

    def __hash__(self):
        return hash((self.type, self.index))

    def __str__(self):
        return self.type if self.index is None else f"{self.type}:{self.index}"

    def __repr__(self):
        if self.index is None:
            return f"device(type='{self.type}')"
        return f"device(type='{self.type}', index={self.index})"

    def __reduce__(self):
        return (device, (str(self),))


CPU = device("cpu")

# PyTorch's memory formats, as the names compile(memory_format=) takes
channels_last, contiguous_format, preserve_format = "channels_last", "contiguous", "preserve"
MEMORY_FORMATS = (channels_last, contiguous_format, preserve_format)


def check_memory_format(what, memory_format):
    if memory_format not in MEMORY_FORMATS:
        raise ValueError(f"{what}: memory_format must be ft.channels_last, ft.contiguous_format or "
                         f"ft.preserve_format, got {memory_format!r}")
    return memory_format


def as_device(obj: DeviceLike) -> device:
    """A fasttrain device from a device, a string like 'cuda:1', a CUDA index, or None (the CPU)."""
    if obj is None:
        return CPU
    if isinstance(obj, int) and not isinstance(obj, bool):
        return device("cuda", obj)
    return device(obj)


def device_of_code(code):
    kind, index = code
    return CPU if kind == DEV_CPU else device("cuda", index)


if TYPE_CHECKING:
    from typing import Union

    # what the functions taking dtype= and device= accept (as_dtype and as_device say how each is read)
    DTypeLike = Union[dtype, str, type, np.dtype]
    DeviceLike = Union[device, str, int, None]
