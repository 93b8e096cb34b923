"""The CUDA runtime as the ops and users see it: device memory statistics and the caching allocator, scratch
memory given back by the ops, non-blocking copies from and to pinned memory ordered with the work around
them, bitwise repeatable results (always for fasttrain's own kernels; for cuDNN and cuBLAS in deterministic
mode), the TF32 switch, recovery after errors, and the tensor conveniences on CUDA tensors."""
import numpy as np
import pytest

import fasttrain as ft
from _cudaref import assert_close, host, pair, rng

pytestmark = pytest.mark.cuda
F = ft.nn.functional
ops = ft.ops


@pytest.fixture
def benchmark():
    ft.backends.benchmark = True
    yield
    ft.backends.benchmark = False


def bits(t):
    return np.ascontiguousarray(host(t)).tobytes()


# ---------------------------------------------------------------- device and tensors

def test_device_queries_and_tensor_conveniences():
    assert ft.cuda.is_compiled() and ft.cuda.device_count() >= 1 and ft.cuda.unavailable_reason() == ""
    name = ft.cuda.get_device_name()
    assert isinstance(name, str) and name
    ft.cuda.synchronize()
    ft.cuda.synchronize("cuda:0")
    g = ft.arange(6, dtype=ft.float32).reshape(2, 3).to("cuda")
    assert g.device == ft.device("cuda:0") and g.is_cuda and "device='cuda:0'" in repr(g)
    assert g.tolist() == [[0, 1, 2], [3, 4, 5]] and np.asarray(g).tolist() == g.tolist()
    with pytest.raises(TypeError, match=r"\.cpu\(\)"):
        g.numpy()
    assert g.cuda() is g and g.cpu().tolist() == g.tolist()
    assert g.t().contiguous().tolist() == [[0, 3], [1, 4], [2, 5]]
    assert g.to(ft.bfloat16).float().tolist() == g.tolist()
    h = ft.zeros(2, 3, device="cuda")
    h.copy_(g)
    h[0, 1] = 7.0
    h[1] = g[0]
    assert h.tolist() == [[0, 7, 2], [0, 1, 2]]


def test_set_device_chooses_what_cuda_names():
    assert ft.cuda.current_device() == 0 and ft.device("cuda") == ft.device("cuda:0")
    last = ft.cuda.device_count() - 1
    try:
        ft.cuda.set_device(last)
        assert ft.cuda.current_device() == last and ft.zeros(2, device="cuda").device == ft.device("cuda", last)
    finally:
        ft.cuda.set_device(0)
    with pytest.raises(ValueError, match=f"set_device: cuda:{last + 1} is not a usable device here"):
        ft.cuda.set_device(last + 1)


# ---------------------------------------------------------------- memory

def test_device_memory_stats_and_empty_cache():
    ft.cuda.synchronize()
    ft.empty_cache()
    base, cpu_base = ft.memory_stats("cuda:0"), ft.memory_stats("cpu")
    t = ft.empty(1 << 20, device="cuda")  # 4 MiB
    s = ft.memory_stats("cuda:0")
    assert s["allocated_bytes"] - base["allocated_bytes"] >= 4 << 20
    assert s["num_allocs"] >= base["num_allocs"] + 1
    assert s["peak_bytes"] >= s["allocated_bytes"] and s["reserved_bytes"] >= s["allocated_bytes"]
    assert ft.memory_stats("cpu")["allocated_bytes"] == cpu_base["allocated_bytes"]  # device memory only
    ptr = t.data_ptr()
    del t
    after = ft.memory_stats("cuda:0")
    assert after["allocated_bytes"] == base["allocated_bytes"]
    assert after["reserved_bytes"] >= base["reserved_bytes"] + (4 << 20)  # kept for reuse
    assert ft.empty(1 << 20, device="cuda").data_ptr() == ptr  # the same block comes back
    ft.empty_cache()
    s = ft.memory_stats("cuda:0")
    assert s["reserved_bytes"] == s["allocated_bytes"]
    ft.reset_peak_memory_stats("cuda:0")
    s = ft.memory_stats("cuda:0")
    assert s["peak_bytes"] == s["allocated_bytes"]
    assert "cuda:0" in ft.memory_stats()


def test_ops_give_their_scratch_memory_back():
    """After a warm-up call (which may create library handles and their workspaces), a round of every op family
    leaves the device's allocated bytes where they were once its outputs are gone."""
    x = pair(rng(1).standard_normal((16, 32, 14, 14)), "nhwc")[1]
    w = pair(rng(2).standard_normal((32, 32, 3, 3)) * 0.1)[1]
    logits = pair(rng(3).standard_normal((256, 1000)))[1]
    target = pair(rng(4).integers(0, 1000, 256), dtype=ft.int64)[1]
    a, b = pair(rng(5).standard_normal((512, 256)))[1], pair(rng(6).standard_normal((128, 256)))[1]

    def round_of_ops():
        y = ops.conv2d_forward(None, x, w, None, padding=1)
        ops.conv2d_backward(None, None, None, y, x, w, padding=1)
        out, mean, invstd = ops.batch_norm_forward(None, None, None, y, None, None)
        ops.batch_norm_backward(None, None, None, out, y, None, None, None, mean, invstd)
        ops.layer_norm_forward(None, None, None, a, None, None, (256,))
        z = ops.linear_forward(None, a, b, None)
        ops.linear_backward(None, None, None, z, a, b)
        ops.cross_entropy_forward(None, None, logits, target, label_smoothing=0.1)
        F.softmax(logits, 1)
        F.mse_loss(a, a, reduction="sum")
        ops.max_pool2d_forward(None, None, y, 3, 2, 1)
        F.adaptive_avg_pool2d(y, 1)

    round_of_ops()
    ft.cuda.synchronize()
    before = ft.memory_stats("cuda:0")["allocated_bytes"]
    for _ in range(3):
        round_of_ops()
    ft.cuda.synchronize()
    assert ft.memory_stats("cuda:0")["allocated_bytes"] == before


def test_out_of_memory_raises_and_leaves_the_device_usable():
    with pytest.raises(MemoryError):
        ft.empty(1 << 50, device="cuda")
    x = pair(rng(7).standard_normal((3, 1000)))
    assert_close(F.gelu(x[1]), F.gelu(x[0]), 1e-6, 0)  # no stale error is reported by the next kernel


# ---------------------------------------------------------------- copies

def test_non_blocking_copies_from_pinned_memory_are_ordered():
    """Each copy from pinned memory is queued behind the kernels already queued (its destination may be a block
    that such a kernel still writes: here the freed output of a gelu), and the kernels queued after it see its
    data. A copy that overtook the gelu would leave the gelu's values in its destination."""
    n = 1 << 24  # 64 MiB: the gelu takes long enough for an unordered copy to overlap it
    src = ft.ones(n, device="cuda")
    want = [np.arange(n, dtype=np.float32) * np.float32(1e-3) + np.float32(i) for i in range(6)]
    pinned = [ft.empty(n, pin_memory=True).copy_(ft.from_numpy(v)) for v in want]
    assert all(p.is_pinned() for p in pinned)
    results = []
    for p in pinned:
        y = ops.activation_forward(None, src, "gelu")
        del y  # its block goes back to the cache while the gelu may still be running
        g = p.to("cuda", non_blocking=True)
        results.append(ops.mul_forward(None, g, src))  # queued after the copy: must see its data
    ft.cuda.synchronize()
    for r, v in zip(results, want):
        np.testing.assert_array_equal(host(r), v)
    # device to pinned host memory, non-blocking: valid after a synchronize
    back = [ft.empty(n, pin_memory=True) for _ in results]
    for dst, r in zip(back, results):
        dst.copy_(ops.activation_forward(None, r, "relu"), non_blocking=True)
    ft.cuda.synchronize()
    for dst, v in zip(back, want):
        np.testing.assert_array_equal(dst.numpy(), v)


def test_copies_of_views_and_between_dtypes():
    a = rng(8).standard_normal((6, 7, 5)).astype(np.float32)
    g = ft.from_numpy(a).to("cuda")
    np.testing.assert_array_equal(host(g.permute(2, 0, 1).contiguous()), a.transpose(2, 0, 1))
    np.testing.assert_array_equal(host(g[1:5:2, ::-1, 3]), a[1:5:2, ::-1, 3])
    c = ft.from_numpy(a).permute(1, 2, 0)
    np.testing.assert_array_equal(host(c.to("cuda", non_blocking=True)), a.transpose(1, 2, 0))
    np.testing.assert_array_equal(host(g.to(ft.float16)), a.astype(np.float16))
    np.testing.assert_array_equal(host(g.to(ft.int32)), a.astype(np.int32))


# ---------------------------------------------------------------- repeatability

def conv_step(layout):
    x = pair(rng(10).standard_normal((32, 64, 28, 28)), layout)[1]
    w = pair(rng(11).standard_normal((64, 64, 3, 3)) * 0.05)[1]
    b = pair(rng(12).standard_normal(64))[1]

    def run():
        y = ops.conv2d_forward(None, x, w, b, padding=1)
        return [bits(y)] + [bits(t) for t in ops.conv2d_backward(None, None, None, y, x, w, padding=1)]
    return run


@pytest.mark.parametrize("layout", ["contiguous", "nhwc"])
def test_deterministic_convolution_is_bitwise_repeatable(layout, ft_deterministic, benchmark):
    """cuDNN's backward algorithms may add partial sums in any order; deterministic mode (which also turns off
    the algorithm search of ft.backends.benchmark) must not."""
    run = conv_step(layout)
    first = run()
    for _ in range(2):
        assert run() == first


def test_deterministic_linear_is_bitwise_repeatable(ft_deterministic):
    x = pair(rng(13).standard_normal((512, 1024)))[1]
    w = pair(rng(14).standard_normal((768, 1024)) * 0.03)[1]
    b = pair(rng(15).standard_normal(768))[1]

    def run():
        y = ops.linear_forward(None, x, w, b, "gelu")
        return [bits(y)] + [bits(t) for t in ops.linear_backward(None, None, None, y, x, w)]
    first = run()
    assert run() == first


@pytest.mark.parametrize("layout", ["contiguous", "nhwc"])
def test_own_kernels_are_bitwise_repeatable_without_deterministic_mode(layout):
    """fasttrain's kernels reduce in a fixed order (no float atomics): repeated runs agree bit for bit even
    without ft.use_deterministic_algorithms."""
    x = pair(rng(16).standard_normal((32, 64, 16, 16)) + 3, layout)[1]
    dy = pair(rng(17).standard_normal((32, 64, 16, 16)), layout)[1]
    logits = pair(rng(18).standard_normal((1024, 1000)))[1]
    logits4 = pair(rng(19).standard_normal((8, 21, 32, 32)), layout)[1]
    target = pair(rng(20).integers(0, 1000, 1024), dtype=ft.int64)[1]
    target4 = pair(rng(21).integers(0, 21, (8, 32, 32)), dtype=ft.int64)[1]
    rows = pair(rng(22).standard_normal((256, 4096)) + 2)[1]
    wl = pair(rng(23).standard_normal(4096))[1]
    wc = pair(rng(24).standard_normal((64, 64, 1, 1)))[1]

    def run():
        r = []
        out, mean, invstd = ops.batch_norm_forward(None, None, None, x, None, None)
        r += [bits(out), bits(mean), bits(invstd)]
        r += [bits(t) for t in ops.batch_norm_backward(None, None, None, dy, x, None, None, None, mean, invstd)
              if t is not None]
        y, m, s = ops.layer_norm_forward(None, None, None, rows, wl, wl, (4096,))
        r += [bits(y), bits(m), bits(s)]
        r += [bits(t) for t in ops.layer_norm_backward(None, None, None, rows, rows, wl, m, s, (4096,))]
        for lg, tg in ((logits, target), (logits4, target4)):
            for kw in (dict(), dict(label_smoothing=0.1, reduction="sum")):
                r += [bits(t) for t in ops.cross_entropy_forward(None, None, lg, tg, **kw)]
        sm = F.softmax(logits, 1)
        r += [bits(sm), bits(ops.softmax_backward(None, logits, sm, 1)),
              bits(ops.log_softmax_backward(None, logits4, F.log_softmax(logits4, 1), 1))]
        r += [bits(F.mse_loss(x, dy)), bits(F.mse_loss(x, dy, reduction="sum"))]
        p, idx = ops.max_pool2d_forward(None, None, x, 3, 2, 1)
        r += [bits(p), bits(idx), bits(ops.max_pool2d_backward(None, p, idx, (16, 16)))]
        r += [bits(ops.avg_pool2d_backward(None, p, (16, 16), 3, 2, 1)), bits(F.adaptive_avg_pool2d(x, 1))]
        r += [bits(ops.conv2d_backward(False, False, None, dy, x, wc)[2])]  # the bias gradient's channel sums
        return r
    first = run()
    assert run() == first


# ---------------------------------------------------------------- TF32

def test_tf32_is_opt_in_and_only_loosens_convolutions_and_matmuls():
    assert ft.backends.allow_tf32 is False  # the default: float32 math
    xc, xg = pair(rng(30).standard_normal((8, 32, 16, 16)), "nhwc")
    wc, wg = pair(rng(31).standard_normal((64, 32, 3, 3)) * 0.1)
    ac, ag = pair(rng(32).standard_normal((256, 512)))
    bc, bg = pair(rng(33).standard_normal((128, 512)) * 0.05)
    softmax_fp32 = bits(F.softmax(ag, 1))
    ft.backends.allow_tf32 = True
    try:
        assert ft.backends.allow_tf32 is True
        # TF32 keeps 10 mantissa bits of each product's factors: about 1e-3 relative
        assert_close(ops.conv2d_forward(None, xg, wg, None, padding=1), ops.conv2d_forward(None, xc, wc, None,
                                                                                           padding=1), 1e-2, 5e-3)
        assert_close(ops.linear_forward(None, ag, bg), ops.linear_forward(None, ac, bc), 1e-2, 5e-3)
        assert bits(F.softmax(ag, 1)) == softmax_fp32
    finally:
        ft.backends.allow_tf32 = False
