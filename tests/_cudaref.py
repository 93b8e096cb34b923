"""Helpers of the CUDA tests: the same values as a CPU and a CUDA tensor in one memory layout, host copies of
results, and the comparisons whose tolerances docs/cuda.md lists. It imports no torch (the op tests run
under compute-sanitizer, where a torch import only costs time)."""
import numpy as np
import pytest

import fasttrain as ft

# Memory layouts of a 4-d (N, C, H, W) value: C order, channels-last, every other element of a wider last
# dimension, and every dimension reversed (strides increasing).
LAYOUTS = ("contiguous", "nhwc", "strided", "transposed")


@pytest.fixture(autouse=True)
def full_fp32():
    """float32 math for convolutions and matmuls (no TF32) in every test of a module that imports it."""
    tf32 = ft.backends.allow_tf32
    ft.backends.allow_tf32 = False
    yield
    ft.backends.allow_tf32 = tf32


def rng(seed):
    return np.random.default_rng(seed)


def _base_and_view(a, layout):
    """A C-ordered array and the view (a function of a tensor over it) that gives a's values in `layout`."""
    if layout == "contiguous" or a.ndim == 0:
        return a, lambda t: t
    if layout == "nhwc":
        assert a.ndim == 4
        return a.transpose(0, 2, 3, 1), lambda t: t.permute(0, 3, 1, 2)
    if layout == "transposed":
        rev = list(range(a.ndim))[::-1]
        return a.transpose(rev), lambda t: t.permute(rev)
    if layout == "strided":
        wide = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), a.dtype)
        wide[..., ::2] = a
        return wide, lambda t: t[..., ::2]
    raise ValueError(layout)


def pair(a, layout="contiguous", dtype=ft.float32):
    """(cpu, cuda): two tensors holding a's values, converted to dtype, in the same memory layout."""
    a = np.asarray(a)
    base, view = _base_and_view(a, layout)
    src = ft.from_numpy(np.array(base, order="C", copy=True)).to(dtype)
    cpu, gpu = view(src.clone()), view(src.to("cuda"))
    assert gpu.is_cuda and not cpu.is_cuda and cpu.shape == gpu.shape == a.shape
    assert cpu.stride() == gpu.stride()
    return cpu, gpu


def host(t):
    """The values of a tensor on any device as a NumPy array (a copy; bfloat16 widened to float32)."""
    if t.is_cuda:
        t = t.cpu()
    if t.dtype is ft.bfloat16:
        t = t.float()
    return np.array(t.numpy())


def check_like(gpu, cpu):
    """The CUDA result lives on the device, with the CPU result's shape, dtype and strides (memory format)."""
    assert gpu.is_cuda, "the result of an op on CUDA tensors is not on the device"
    assert gpu.shape == cpu.shape and gpu.dtype is cpu.dtype, (gpu.shape, gpu.dtype, cpu.shape, cpu.dtype)
    if 0 not in cpu.shape:
        assert gpu.stride() == cpu.stride(), f"strides {gpu.stride()} on CUDA, {cpu.stride()} on the CPU"


def _report(bad, got, want, what):
    idx = np.argwhere(bad)[:5]
    rows = ", ".join(f"{tuple(int(v) for v in i)}: {got[tuple(i)]!r} vs {want[tuple(i)]!r}" for i in idx)
    return f"{what}: {int(bad.sum())} of {bad.size} elements differ (CUDA vs CPU) - {rows}"


def assert_same(gpu, cpu):
    """The same values (NaNs in the same places; 0.0 and -0.0 count as equal), shape and dtype."""
    check_like(gpu, cpu)
    g, c = host(gpu), host(cpu)
    bad = ~((g == c) | (np.isnan(g) & np.isnan(c))) if g.dtype.kind == "f" else g != c
    assert not bad.any(), _report(bad, g, c, "not bitwise equal")


def _spacing(x, dtype):
    """The spacing of the float32 (or bfloat16) numbers at |x|."""
    s = np.spacing(np.abs(x).astype(np.float32)).astype(np.float64)
    return s * 65536.0 if dtype is ft.bfloat16 else s


def assert_ulp(gpu, cpu, ulps=2, scale=0.0):
    """|cuda - cpu| <= ulps units in the last place of max(|cpu|, scale) for the result's float type. `scale`
    (an array broadcast to the result, or a number) is the magnitude of the terms the op combined, for
    results that come from a cancellation (a derivative near its zero): there an ulp of the result says
    nothing about the error of the computation. Equal values (infinities, NaNs) always pass."""
    check_like(gpu, cpu)
    g, c = host(gpu).astype(np.float64), host(cpu).astype(np.float64)
    same = (g == c) | (np.isnan(g) & np.isnan(c))
    mag = np.maximum(np.abs(c), np.broadcast_to(np.abs(np.asarray(scale, np.float64)), c.shape))
    tol = ulps * _spacing(mag, cpu.dtype)
    with np.errstate(invalid="ignore"):
        bad = ~same & ~(np.abs(g - c) <= tol)
    assert not bad.any(), _report(bad, g, c, f"more than {ulps} ulp apart")


def assert_close(gpu, cpu, rtol=1e-5, scaled=None):
    """|cuda - cpu| <= rtol * |cpu| + scaled * max|cpu| elementwise (scaled defaults to rtol): a relative
    tolerance for each value, and one relative to the largest value for values that come out of sums with
    cancellation. NaNs must match."""
    check_like(gpu, cpu)
    g, c = host(gpu).astype(np.float64), host(cpu).astype(np.float64)
    finite = np.isfinite(c)
    scale = np.abs(c[finite]).max() if finite.any() else 0.0
    atol = (rtol if scaled is None else scaled) * scale
    np.testing.assert_allclose(g, c, rtol=rtol, atol=atol, equal_nan=True,
                               err_msg=f"CUDA vs CPU (rtol {rtol}, atol {atol:.3g})")


def same_error(cpu_call, gpu_call, exc):
    """Both calls raise `exc` with the same message: validation on CUDA reports like the CPU."""
    with pytest.raises(exc) as on_cpu:
        cpu_call()
    with pytest.raises(exc) as on_gpu:
        gpu_call()
    assert str(on_gpu.value) == str(on_cpu.value)


def mixed_devices(call):
    """A call mixing CPU and CUDA tensors raises RuntimeError naming both devices."""
    with pytest.raises(RuntimeError) as e:
        call()
    msg = str(e.value)
    assert "cpu" in msg and "cuda:0" in msg, f"the error does not name both devices: {msg!r}"
