"""The CUDA backend: compiled into libfasttrain_cuda.so when nvcc was found,
loaded on the first CUDA use (any function here, a tensor, op, loader or
program on "cuda", page-locked memory), and usable when the machine has a
driver and a device. ``import fasttrain`` itself maps no CUDA library."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

from . import _C, _types
from ._types import as_device

if TYPE_CHECKING:
    from ._types import DeviceLike

_LIBRARY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libfasttrain_cuda.so")


def is_compiled() -> bool:
    """Whether this build contains the CUDA backend."""
    return bool(_C.CUDA_COMPILED) and os.path.exists(_LIBRARY)


if is_compiled():
    _C.cuda_set_library(_LIBRARY)


def is_available() -> bool:
    """Whether a CUDA device can be used now."""
    return _C.cuda_device_count() > 0


def unavailable_reason() -> str:
    """Why is_available() is False ('' when it is True)."""
    return _C.cuda_unavailable_reason()


def device_count() -> int:
    """The number of usable CUDA devices (0 without a backend, driver or device)."""
    return _C.cuda_device_count()


def set_device(device: DeviceLike) -> None:
    """Makes `device` (an index or "cuda:N") the one "cuda" names from now on, as torch.cuda.set_device. Under
    ft.distributed "cuda" is the local rank's device (rank r of a machine takes device r mod the device count)
    unless set."""
    index = _index(device)
    if index >= device_count():
        raise ValueError(f"set_device: cuda:{index} is not a usable device here ({device_count()} usable"
                         + (f": {unavailable_reason()})" if not is_available() else ")"))
    _types._current_cuda = index


def current_device() -> int:
    """The index of the device "cuda" names (torch.cuda.current_device)."""
    return _types.current_cuda_index()


def _index(device):
    dev = as_device("cuda" if device is None else device)
    if dev.type != "cuda":
        raise ValueError(f"expected a cuda device, got {dev}")
    return dev.index


def get_device_name(device: DeviceLike = None) -> str:
    """The name of a CUDA device (default cuda:0; an int is an index)."""
    return _C.cuda_device_props(_index(device))[0]


def get_device_capability(device: DeviceLike = None) -> tuple:
    """The compute capability (major, minor) of a CUDA device, as torch.cuda.get_device_capability."""
    return _C.cuda_device_props(_index(device))[1:]


def is_bf16_supported(device: DeviceLike = None) -> bool:
    """Whether the device computes in bfloat16 on its tensor cores (compute capability 8.0, Ampere, or later),
    which precision="bf16-mixed" needs; False without a usable device."""
    return is_available() and get_device_capability(device) >= (8, 0)


def synchronize(device: DeviceLike = None) -> None:
    """Waits for all work queued on the device."""
    _C.cuda_synchronize(_index(device))
