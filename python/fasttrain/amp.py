"""ft.autocast: PyTorch's torch.autocast("cpu", dtype=torch.bfloat16) for fasttrain's eager ops.

Inside ``with ft.autocast():`` the products (conv1d/conv2d, linear, scaled_dot_product_attention, and the
layers built on them) take float32 operands as bfloat16 (each call converts its input and weight, as
torch.autocast does) and return bfloat16; every other op runs in its inputs' dtype (they all read bfloat16).
It is for eager inference and evaluation code: a compiled program chooses its precision once, at
``compile(precision=...)``, and autocast does not change it."""
import contextvars

from ._types import _BY_NAME, as_dtype

_dtype = contextvars.ContextVar("fasttrain_autocast", default=None)


class autocast:
    """Context manager (and decorator) turning autocast on (enabled=True) or off within its block; nests."""

    def __init__(self, device_type="cpu", dtype=None, enabled=True):
        if device_type != "cpu":
            raise NotImplementedError(f"ft.autocast: device_type must be 'cpu' (bf16 on CUDA is not built yet), "
                                      f"got {device_type!r}")
        dtype = as_dtype(dtype or "bfloat16")
        if dtype is not _BY_NAME["bfloat16"]:
            raise ValueError(f"ft.autocast: dtype must be bfloat16 on the CPU, got {dtype.name}")
        self.dtype, self.enabled = dtype, bool(enabled)
        self._tokens = []

    def __enter__(self):
        self._tokens.append(_dtype.set(self.dtype if self.enabled else None))
        return self

    def __exit__(self, *exc):
        _dtype.reset(self._tokens.pop())
        return False

    def __call__(self, fn):
        import functools

        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            with autocast("cpu", self.dtype, self.enabled):
                return fn(*args, **kwargs)
        return wrapped


def cast(*tensors):
    """The tensors as a product under autocast takes them: float32 ones converted to the autocast dtype (None
    stays None); unchanged outside autocast."""
    dtype = _dtype.get()
    if dtype is None:
        return tensors
    return tuple(t.to(dtype) if t is not None and t.dtype is _BY_NAME["float32"] else t for t in tensors)
