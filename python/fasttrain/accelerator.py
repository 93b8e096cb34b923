"""ft.accelerator, as torch.accelerator: the device beyond the CPU where one is present (CUDA), as PyTorch's
quickstart picks it: ``ft.accelerator.current_accelerator().type if ft.accelerator.is_available() else "cpu"``."""
from . import cuda
from ._types import device


def is_available() -> bool:
    """Whether a CUDA device is present."""
    return cuda.is_available()


def current_accelerator() -> "device | None":
    """ft.device("cuda") where a CUDA device is present, else None."""
    return device("cuda") if cuda.is_available() else None


def device_count() -> int:
    """The number of CUDA devices."""
    return cuda.device_count()
