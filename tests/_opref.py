"""Helpers of the op tests: tensors in both memory formats, central finite
differences in float64, and the optional torch oracle."""
import numpy as np

import fasttrain as ft

try:  # an optional oracle: tests compare with it when it is importable
    import torch
except ImportError:  # pragma: no cover - depends on the environment
    torch = None


def t(a, dtype=np.float32):
    """A fasttrain tensor over a C-contiguous copy of a."""
    return ft.from_numpy(np.array(a, dtype=dtype, order="C", copy=True))


def nhwc(a, dtype=np.float32):
    """A 4-d (N, C, H, W) fasttrain tensor stored channels-last (NHWC)."""
    a = np.asarray(a, dtype=dtype)
    x = ft.from_numpy(np.array(a.transpose(0, 2, 3, 1), order="C", copy=True).transpose(0, 3, 1, 2))
    assert x.stride()[1] == 1 and x.shape == a.shape
    return x


def strided(a, dtype=np.float32):
    """A non-contiguous view holding a's values (every other element of a wider array)."""
    a = np.asarray(a, dtype=dtype)
    wide = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), dtype) if a.ndim else np.zeros((2,), dtype)
    if a.ndim == 0:
        wide[0] = a
        return ft.from_numpy(wide)[0]
    wide[..., ::2] = a
    return ft.from_numpy(wide)[..., ::2]


def bf16_round(a):
    """float32 values rounded to bfloat16 (to nearest even), as float32: the reference of every bfloat16
    conversion."""
    u = np.ascontiguousarray(a, np.float32).view(np.uint32).astype(np.uint64)
    return (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)


def n(x):
    """The values of a tensor as a float64 NumPy array."""
    return np.array(x.float().numpy() if x.dtype is ft.bfloat16 else x.numpy(), dtype=np.float64)


def fd_grad(f, x, dy, eps=1e-6):
    """d sum(f(x) * dy) / dx by central differences, f a float64 NumPy function."""
    x = np.array(x, dtype=np.float64)
    g = np.zeros_like(x)
    it = np.nditer(x, flags=["multi_index"])
    for _ in it:
        i = it.multi_index
        old = x[i]
        x[i] = old + eps
        up = np.sum(f(x) * dy)
        x[i] = old - eps
        down = np.sum(f(x) * dy)
        x[i] = old
        g[i] = (up - down) / (2 * eps)
    return g


def bits(x):
    """The raw bytes of a tensor's values, to compare results bitwise (bfloat16 as float32: exact)."""
    return np.ascontiguousarray((x.to(ft.float32) if x.dtype is ft.bfloat16 else x).numpy()).tobytes()


def with_threads(threads, n_threads, fn):
    threads(n_threads)
    return fn()
