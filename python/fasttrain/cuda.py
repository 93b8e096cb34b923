"""The CUDA backend: compiled into libfasttrain_cuda.so when nvcc was found,
loaded on the first CUDA use (any function here, a tensor, op, loader or
program on "cuda", page-locked memory), and usable when the machine has a
driver and a device. ``import fasttrain`` itself maps no CUDA library."""
import os

from . import _C
from ._types import as_device

_LIBRARY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libfasttrain_cuda.so")


def is_compiled():
    """Whether this build contains the CUDA backend."""
    return bool(_C.CUDA_COMPILED) and os.path.exists(_LIBRARY)


if is_compiled():
    _C.cuda_set_library(_LIBRARY)


def is_available():
    """Whether a CUDA device can be used now."""
    return _C.cuda_device_count() > 0


def unavailable_reason():
    """Why is_available() is False ('' when it is True)."""
    if not is_compiled():
        return "this fasttrain build has no CUDA backend (nvcc or cuDNN was not found, or FASTTRAIN_CUDA=0)"
    return _C.cuda_unavailable_reason()


def device_count():
    return _C.cuda_device_count()


def _index(device):
    dev = as_device("cuda" if device is None else device)
    if dev.type != "cuda":
        raise ValueError(f"expected a cuda device, got {dev}")
    return dev.index


def get_device_name(device=None):
    return _C.cuda_device_name(_index(device))


def synchronize(device=None):
    """Waits for all work queued on the device."""
    _C.cuda_synchronize(_index(device))
