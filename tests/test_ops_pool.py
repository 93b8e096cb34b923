"""max/avg/adaptive pooling: forward against NumPy loops, backward against the analytic scatter and central
differences, NCHW vs NHWC, int32/int64 indices, determinism and bad input."""

import numpy as np
import pytest

import fasttrain as ft
from _opref import bf16_round, bits, fd_grad, n, nhwc, strided, t, torch
from _poolcases import AVG_CASES, MAX_CASES, avg_args, max_args

F = ft.nn.functional
rng = np.random.default_rng(0)


def pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def out_len(size, k, s, p, d, ceil):
    o = (size + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil else 0)) // s + 1
    if ceil and (o - 1) * s >= size + p:
        o -= 1
    return o


def ref_max_pool(x, k, s=None, p=0, d=1, ceil=False):
    """(out, flat indices h * W + w) of PyTorch's max_pool2d, NaN-free x."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = pair(k), pair(s or k), pair(p), pair(d)
    N, C, H, W = x.shape
    P, Q = out_len(H, kh, sh, ph, dh, ceil), out_len(W, kw, sw, pw, dw, ceil)
    out, idx = np.zeros((N, C, P, Q)), np.zeros((N, C, P, Q), np.int64)
    for i in range(P):
        rows = [i * sh - ph + a * dh for a in range(kh) if 0 <= i * sh - ph + a * dh < H]
        for j in range(Q):
            cols = [j * sw - pw + b * dw for b in range(kw) if 0 <= j * sw - pw + b * dw < W]
            win = x[:, :, rows][:, :, :, cols].reshape(N, C, -1)
            a = np.argmax(win, axis=2)
            out[:, :, i, j] = np.take_along_axis(win, a[..., None], 2)[..., 0]
            idx[:, :, i, j] = np.array(rows)[a // len(cols)] * W + np.array(cols)[a % len(cols)]
    return out, idx


def ref_avg_pool(x, k, s=None, p=0, ceil=False, count_include_pad=True, divisor_override=None):
    (kh, kw), (sh, sw), (ph, pw) = pair(k), pair(s or k), pair(p)
    N, C, H, W = x.shape
    P, Q = out_len(H, kh, sh, ph, 1, ceil), out_len(W, kw, sw, pw, 1, ceil)
    out, div = np.zeros((N, C, P, Q)), np.zeros((P, Q))
    for i in range(P):
        h0 = i * sh - ph
        h1 = min(h0 + kh, H + ph)
        for j in range(Q):
            w0 = j * sw - pw
            w1 = min(w0 + kw, W + pw)
            size = (h1 - h0) * (w1 - w0)
            a0, a1, b0, b1 = max(h0, 0), min(h1, H), max(w0, 0), min(w1, W)
            div[i, j] = divisor_override or (size if count_include_pad else (a1 - a0) * (b1 - b0))
            out[:, :, i, j] = x[:, :, a0:a1, b0:b1].sum(axis=(2, 3)) / div[i, j]
    return out


def ref_adaptive(x, size, op):
    N, C, H, W = x.shape
    P, Q = pair(size)
    out = np.zeros((N, C, P, Q))
    idx = np.zeros((N, C, P, Q), np.int64)
    for i in range(P):
        h0, h1 = i * H // P, -(-(i + 1) * H // P)
        for j in range(Q):
            w0, w1 = j * W // Q, -(-(j + 1) * W // Q)
            win = x[:, :, h0:h1, w0:w1]
            if op == "avg":
                out[:, :, i, j] = win.mean(axis=(2, 3))
            else:
                flat = win.reshape(N, C, -1)
                a = np.argmax(flat, axis=2)
                out[:, :, i, j] = flat.max(axis=2)
                idx[:, :, i, j] = (h0 + a // (w1 - w0)) * W + w0 + a % (w1 - w0)
    return out, idx


def scatter(idx, dy, shape):
    g = np.zeros(shape)
    N, C = shape[:2]
    for a in range(N):
        for c in range(C):
            np.add.at(g[a, c].reshape(-1), idx[a, c].reshape(-1), dy[a, c].reshape(-1))
    return g


@pytest.mark.parametrize("case", MAX_CASES)
def test_max_pool_forward_backward(case):
    x = rng.normal(size=(2, 3, 7, 8))
    want, want_idx = ref_max_pool(x, case["k"], case.get("s"), case.get("p", 0), case.get("d", 1),
                                  case.get("ceil", False))
    out, idx = ft.ops.max_pool2d_forward(None, None, t(x), **max_args(case))
    np.testing.assert_array_equal(n(out), want.astype(np.float32))
    np.testing.assert_array_equal(idx.numpy(), want_idx)
    dy = rng.normal(size=want.shape)
    analytic = scatter(want_idx, dy, x.shape)
    fd = fd_grad(lambda v: ref_max_pool(v, case["k"], case.get("s"), case.get("p", 0), case.get("d", 1),
                                        case.get("ceil", False))[0], x, dy)
    np.testing.assert_allclose(analytic, fd, atol=1e-6)
    dx = ft.ops.max_pool2d_backward(None, t(dy), idx, x.shape)
    np.testing.assert_allclose(n(dx), analytic, rtol=1e-6, atol=1e-6)
    # channels-last gives the same bits, and int32 indices the same gradient
    out2, idx2 = ft.ops.max_pool2d_forward(None, ft.zeros(*want.shape, dtype=ft.int32), nhwc(x), **max_args(case))
    assert out2.stride()[1] == 1 and bits(out2.contiguous()) == bits(out)
    np.testing.assert_array_equal(idx2.numpy(), want_idx)
    dx2 = ft.ops.max_pool2d_backward(nhwc(np.zeros(x.shape)), nhwc(dy), idx2)
    assert bits(dx2.contiguous()) == bits(dx)


@pytest.mark.parametrize("case", AVG_CASES)
def test_avg_pool_forward_backward(case):
    x = rng.normal(size=(2, 3, 7, 6))
    args = avg_args(case)
    ref = lambda v: ref_avg_pool(v, case["k"], case.get("s"), case.get("p", 0), case.get("ceil", False),  # noqa
                                 case.get("count_include_pad", True), case.get("divisor_override"))
    want = ref(x)
    out = ft.ops.avg_pool2d_forward(None, t(x), **args)
    np.testing.assert_allclose(n(out), want, rtol=1e-6, atol=1e-6)
    dy = rng.normal(size=want.shape)
    fd = fd_grad(ref, x, dy)
    dx = ft.ops.avg_pool2d_backward(None, t(dy), x.shape, **args)
    np.testing.assert_allclose(n(dx), fd, rtol=1e-5, atol=1e-6)
    out2 = ft.ops.avg_pool2d_forward(None, nhwc(x), **args)
    assert bits(out2.contiguous()) == bits(out)
    dx2 = ft.ops.avg_pool2d_backward(None, nhwc(dy), x.shape, **args)
    assert dx2.stride()[1] == 1 and bits(dx2.contiguous()) == bits(dx)


@pytest.mark.parametrize("case", AVG_CASES, ids=str)
def test_avg_pool_layers_compile_as_they_run_eagerly(case):
    """nn.AvgPool2d with each case's options (divisor_override too) in a compiled program: its predictions are
    the eager layer's and its gradients central differences'."""
    a = avg_args(case)
    ft.manual_seed(5)
    model = ft.nn.Sequential(ft.nn.Conv2d(2, 3, 1), ft.nn.AvgPool2d(**a), ft.nn.Flatten())
    x = np.random.default_rng(6).standard_normal((2, 2, 7, 6)).astype(np.float32)
    out = model(ft.tensor(x))
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), ft.nn.MSELoss(), batch_size=2,
                            input_shape=(2, 7, 6))
    np.testing.assert_allclose(program.predict(x).numpy(), out.numpy(), rtol=1e-5, atol=1e-6)
    assert ft.testing.gradcheck(program, x, np.zeros(out.shape, np.float32), rtol=1e-2, atol=1e-4)
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match="AvgPool2d: divisor_override must be a positive int"):
            ft.nn.AvgPool2d(2, divisor_override=bad)


def test_max_pool_layers_take_pytorchs_argument_order():
    """nn.MaxPool2d(3, 2, 0, 1, True) asks for the indices (PyTorch's fifth argument), not ceil_mode: eagerly
    (output, indices) as the NumPy reference gives them; ceil_mode is the sixth; a compiled forward refuses the
    indices, and MaxPool1d refuses them at construction."""
    x = rng.standard_normal((1, 2, 6, 6)).astype(np.float32)
    out, idx = ft.nn.MaxPool2d(3, 2, 0, 1, True)(t(x))
    want, want_idx = ref_max_pool(x, 3, 2)
    np.testing.assert_array_equal(n(out), want)
    np.testing.assert_array_equal(n(idx), want_idx)
    assert n(ft.nn.MaxPool2d(3, 2, 0, 1, False, True)(t(x))).shape == (1, 2, 3, 3)  # ceil_mode
    assert n(ft.nn.MaxPool2d(3, 2, 0, 1, False)(t(x))).shape == (1, 2, 2, 2)
    model = ft.nn.Sequential(ft.nn.Conv2d(2, 2, 1), ft.nn.MaxPool2d(2, return_indices=True))
    with pytest.raises(ft.nn.TracingError, match=r"MaxPool2d\(return_indices=True\) in a compiled forward"):
        model.compile(ft.optim.SGD(model.parameters(), lr=0.1), lambda o, y: o[0].sum(), batch_size=2,
                      input_shape=(2, 6, 6))
    with pytest.raises(NotImplementedError, match="MaxPool1d: return_indices=True is not supported"):
        ft.nn.MaxPool1d(2, 2, 0, 1, True)


def test_avg_pool_backward_analytic():
    x, dy = rng.normal(size=(1, 2, 5, 5)), rng.normal(size=(1, 2, 3, 3))
    g = np.zeros(x.shape)
    for i in range(3):
        for j in range(3):
            h0, w0 = i * 2 - 1, j * 2 - 1
            a0, a1, b0, b1 = max(h0, 0), min(h0 + 3, 5), max(w0, 0), min(w0 + 3, 5)
            g[:, :, a0:a1, b0:b1] += dy[:, :, i:i + 1, j:j + 1] / ((a1 - a0) * (b1 - b0))
    dx = ft.ops.avg_pool2d_backward(None, t(dy), (5, 5), 3, 2, 1, count_include_pad=False)
    np.testing.assert_allclose(n(dx), g, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("size", [1, (2, 3), (3, 5), (7, 4), (5, 8)])
def test_adaptive_pools(size):
    x = rng.normal(size=(2, 4, 7, 5))
    want, _ = ref_adaptive(x, size, "avg")
    out = F.adaptive_avg_pool2d(t(x), size)
    np.testing.assert_allclose(n(out), want, rtol=1e-6, atol=1e-6)
    dy = rng.normal(size=want.shape)
    fd = fd_grad(lambda v: ref_adaptive(v, size, "avg")[0], x, dy)
    np.testing.assert_allclose(n(ft.ops.adaptive_avg_pool2d_backward(None, t(dy), x.shape)), fd, rtol=1e-5,
                               atol=1e-6)
    assert bits(F.adaptive_avg_pool2d(nhwc(x), size).contiguous()) == bits(out)
    wmax, widx = ref_adaptive(x, size, "max")
    out, idx = F.adaptive_max_pool2d(t(x), size, return_indices=True)
    np.testing.assert_array_equal(n(out), wmax.astype(np.float32))
    np.testing.assert_array_equal(idx.numpy(), widx)
    analytic = scatter(widx, dy, x.shape)
    np.testing.assert_allclose(analytic, fd_grad(lambda v: ref_adaptive(v, size, "max")[0], x, dy), atol=1e-6)
    np.testing.assert_allclose(n(ft.ops.adaptive_max_pool2d_backward(None, t(dy), idx, x.shape)), analytic,
                               rtol=1e-6, atol=1e-6)
    out2, idx2 = F.adaptive_max_pool2d(nhwc(x), size, return_indices=True)
    assert bits(out2.contiguous()) == bits(out) and np.array_equal(idx2.numpy(), widx)


def test_global_pool_is_the_one_by_one_case():
    x = rng.normal(size=(3, 5, 6, 7))
    np.testing.assert_allclose(n(F.adaptive_avg_pool2d(t(x), 1)), x.mean(axis=(2, 3), keepdims=True), rtol=1e-5)
    np.testing.assert_array_equal(n(F.adaptive_max_pool2d(t(x), (1, 1))),
                                  x.max(axis=(2, 3), keepdims=True).astype(np.float32))
    dy = rng.normal(size=(3, 5, 1, 1))
    dx = ft.ops.adaptive_avg_pool2d_backward(None, t(dy), (6, 7))
    np.testing.assert_allclose(n(dx), np.broadcast_to(dy / 42, x.shape), rtol=1e-6)


def test_functional_forms():
    x = rng.normal(size=(2, 3, 6, 6))
    np.testing.assert_array_equal(n(F.max_pool2d(t(x), 2)), ref_max_pool(x, 2)[0].astype(np.float32))
    out, idx = F.max_pool2d(t(x), 3, 2, 1, return_indices=True)
    assert out.shape == idx.shape == (2, 3, 3, 3) and idx.dtype is ft.int64
    np.testing.assert_allclose(n(F.avg_pool2d(t(x), 2, 2)), ref_avg_pool(x, 2), rtol=1e-6, atol=1e-7)
    # unbatched (C, H, W) inputs
    np.testing.assert_array_equal(n(F.max_pool2d(t(x[0]), 2)), ref_max_pool(x[:1], 2)[0][0].astype(np.float32))
    assert F.adaptive_avg_pool2d(t(x[0]), (None, 2)).shape == (3, 6, 2)
    np.testing.assert_allclose(n(F.avg_pool2d(strided(x), 3, 1)), ref_avg_pool(x, 3, 1), rtol=1e-6, atol=1e-7)


def test_accumulate_and_special_values():
    x = rng.normal(size=(1, 2, 4, 4))
    dy = rng.normal(size=(1, 2, 2, 2))
    _, idx = ft.ops.max_pool2d_forward(None, None, t(x), 2)
    g0 = rng.normal(size=x.shape).astype(np.float32)
    g = t(g0)
    ft.ops.max_pool2d_backward(g, t(dy), idx, accumulate=True)
    np.testing.assert_allclose(n(g), g0 + scatter(idx.numpy(), dy, x.shape), rtol=1e-6, atol=1e-6)
    g = t(g0)
    ft.ops.avg_pool2d_backward(g, t(dy), None, 2, accumulate=True)
    np.testing.assert_allclose(n(g), g0 + np.repeat(np.repeat(dy, 2, 2), 2, 3) / 4, rtol=1e-6, atol=1e-6)
    y = x.copy()
    y[0, 0, 0, 1] = np.nan
    y[0, 1, :2, :2] = -np.inf
    out, idx = ft.ops.max_pool2d_forward(None, None, t(y), 2)
    assert np.isnan(n(out)[0, 0, 0, 0]) and idx.numpy()[0, 0, 0, 0] == 1
    assert n(out)[0, 1, 0, 0] == -np.inf and idx.numpy()[0, 1, 0, 0] == 0


def channels_last(a, dtype):
    """(N, C, H, W) values a stored channels-last as dtype (a fasttrain dtype name; bfloat16 rounds)."""
    return ft.from_numpy(np.ascontiguousarray(np.moveaxis(a, 1, 3))).to(dtype).permute(0, 3, 1, 2)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("case", MAX_CASES)
def test_max_pool_over_blocks_of_sixteen_channels(case, dtype):
    """Dense channels-last max pools run 16 channels at a time in vector registers (40 channels: two blocks and a
    rest of 8): the reference's values and positions, and the bits of the same pool over channels at a stride of 2
    (the general loop), through NaN, infinities, ties and signed zeros."""
    x = rng.normal(size=(2, 40, 7, 8))
    x[0, 3, 1, 1] = x[1, 33, 4, 4] = x[1, 33, 4, 5] = np.nan
    x[1, 17, :3, :3] = -np.inf
    x[0, 20, :4, :4] = 0.0
    x[0, 20, 1, 1] = x[0, 21, :2, :2] = -0.0
    x[1, 5, :, :] = 1.5  # ties everywhere: the first position wins
    x = bf16_round(x) if dtype == "bfloat16" else x.astype(np.float32)
    args = max_args(case)
    want, want_idx = ref_max_pool(x, case["k"], case.get("s"), case.get("p", 0), case.get("d", 1),
                                  case.get("ceil", False))
    strided_x = channels_last(np.repeat(x, 2, axis=1), dtype)[:, ::2]
    assert strided_x.stride()[1] == 2
    general, general_idx = ft.ops.max_pool2d_forward(None, None, strided_x, **args)
    one_nan = np.ones(want.shape, bool)
    one_nan[1, 33] = False  # two NaN in a window: the reference takes the first, PyTorch's CPU kernel the last
    for indices in (None, channels_last(np.zeros(want.shape), "int32")):  # int64 allocated, int32 given
        out, idx = ft.ops.max_pool2d_forward(None, indices, channels_last(x, dtype), **args)
        assert out.stride()[1] == 1 and idx.stride()[1] == 1
        np.testing.assert_array_equal(n(out.float()), want.astype(np.float32))
        np.testing.assert_array_equal(idx.numpy()[one_nan], want_idx[one_nan])
        assert bits(out.contiguous()) == bits(general.contiguous())
        np.testing.assert_array_equal(idx.numpy(), general_idx.numpy())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("index_dtype", ["int32", "int64"])
@pytest.mark.parametrize("accumulate", [False, True])
def test_max_pool_backward_over_disjoint_tiles_is_the_scatter(dtype, index_dtype, accumulate):
    """A channels-last max pool whose indices lie in disjoint tiles (kernel = stride) has its gradient gathered
    in one pass; -1 indices, positions in no tile and a sample with an index outside its tile (done by the
    scatter instead) must all give the scatter's bits, signed zeros included."""
    N, C, H, W, P, Q = 3, 70, 9, 7, 4, 3  # 2 x 2 tiles; row 8 and column 6 lie in no tile; 70 > one channel block
    r = np.random.default_rng(1)
    kh, kw = r.integers(0, 2, (N, C, P, Q)), r.integers(0, 2, (N, C, P, Q))
    idx = (2 * np.arange(P)[:, None] + kh) * W + 2 * np.arange(Q) + kw
    idx[r.random(idx.shape) < 0.1] = -1
    idx[1, 66, 2, 1] = 8 * W + 6  # a valid position outside its tile: sample 1's last block takes the scatter
    dy = r.normal(size=(N, C, P, Q)).astype(np.float32)
    dy[r.random(dy.shape) < 0.1] = -0.0
    g0 = r.normal(size=(N, C, H, W)).astype(np.float32)
    g0[r.random(g0.shape) < 0.1] = -0.0
    if dtype == "bfloat16":
        dy, g0 = bf16_round(dy), bf16_round(g0)
    want = g0.copy() if accumulate else np.zeros_like(g0)
    for a in range(N):
        for c in range(C):
            np.add.at(want[a, c].reshape(-1), idx[a, c][idx[a, c] >= 0], dy[a, c][idx[a, c] >= 0])
    if dtype == "bfloat16":
        want = bf16_round(want)
    dinp = channels_last(g0 if accumulate else np.full_like(g0, np.nan), dtype)
    ft.ops.max_pool2d_backward(dinp, channels_last(dy, dtype), channels_last(idx, index_dtype), accumulate=accumulate)
    assert bits(dinp.contiguous()) == want.tobytes()
    # the contiguous layout (always the scatter) agrees
    plain = ft.ops.max_pool2d_backward(None, t(dy).to(dtype), t(idx, np.int64), (H, W))
    if not accumulate:
        assert bits(plain) == want.tobytes()


def test_deterministic_across_thread_counts(threads):
    x = t(rng.normal(size=(8, 64, 32, 32)))
    xl = nhwc(n(x))
    dy = t(rng.normal(size=(8, 64, 16, 16)))
    res = []
    for nt in (1, 2):
        threads(nt)
        r = []
        for inp in (x, xl):
            out, idx = ft.ops.max_pool2d_forward(None, None, inp, 3, 2, 1)
            r += [bits(out.contiguous()), bits(idx.contiguous()),
                  bits(ft.ops.max_pool2d_backward(None, dy, idx, (32, 32)).contiguous()),
                  bits(ft.ops.avg_pool2d_forward(None, inp, 3, 2, 1).contiguous()),
                  bits(ft.ops.avg_pool2d_backward(None, dy, (32, 32), 3, 2, 1).contiguous()),
                  bits(F.adaptive_avg_pool2d(inp, 1).contiguous())]
        res.append(r)
    assert res[0] == res[1]


def test_empty_batch_and_channels():
    for shape in [(0, 3, 8, 8), (2, 0, 8, 8)]:
        x = ft.zeros(*shape)
        assert F.max_pool2d(x, 2).shape == shape[:2] + (4, 4)
        assert F.avg_pool2d(x, 2).shape == shape[:2] + (4, 4)
        assert F.adaptive_avg_pool2d(x, 3).shape == shape[:2] + (3, 3)
        out, idx = F.adaptive_max_pool2d(x, 3, return_indices=True)
        assert ft.ops.adaptive_max_pool2d_backward(None, out, idx, shape).shape == shape
        assert ft.ops.avg_pool2d_backward(None, ft.zeros(*shape[:2], 4, 4), shape, 2).shape == shape


def test_bad_input():
    x = ft.zeros(1, 2, 5, 5)
    with pytest.raises(ValueError, match="max_pool2d: pad should be at most half of kernel size"):
        F.max_pool2d(x, 2, padding=2)
    with pytest.raises(ValueError, match="kernel_size, stride and dilation must be positive"):
        F.max_pool2d(x, 0)
    with pytest.raises(ValueError, match="avg_pool2d: given an input of 2 x 2, the calculated output size"):
        F.avg_pool2d(ft.zeros(1, 1, 2, 2), 3)
    with pytest.raises(ValueError, match="expected a 3-d"):
        F.max_pool2d(ft.zeros(5, 5), 2)
    with pytest.raises(ValueError, match=r"max_pool2d: inp should have 4 dimensions \(N, C, H, W\), got shape"):
        ft.ops.max_pool2d_forward(ft.zeros(1, 2, 2, 2), False, ft.zeros(2, 5, 5), 2)
    with pytest.raises(TypeError, match=r"max_pool2d: inp must be float32 or bfloat16 \(or float16 on CUDA\), "
                                        r"got float64"):
        F.max_pool2d(ft.zeros(1, 1, 4, 4, dtype=ft.float64), 2)
    with pytest.raises(ValueError, match=r"max_pool2d: out should have shape \(1, 2, 2, 2\), got \(1, 2, 3, 3\)"):
        ft.ops.max_pool2d_forward(ft.zeros(1, 2, 3, 3), False, x, 2)
    with pytest.raises(TypeError, match="indices must be int64 or int32, got float32"):
        ft.ops.max_pool2d_forward(None, ft.zeros(1, 2, 2, 2), x, 2)
    out, idx = ft.ops.max_pool2d_forward(None, None, x, 2)
    idx.fill_(25)
    with pytest.raises(IndexError, match=r"max_pool2d_backward: indices holds 25, outside \[0, 25\)"):
        ft.ops.max_pool2d_backward(None, out, idx, (5, 5))
    idx.fill_(-2)  # -1 marks a window with nothing in it; below that is an error too
    with pytest.raises(IndexError, match=r"max_pool2d_backward: indices holds -2, outside \[0, 25\)"):
        ft.ops.max_pool2d_backward(None, out, idx, (5, 5))
    with pytest.raises(ValueError, match=r"max_pool2d_backward: indices should have shape \(1, 2, 3, 2\), got \(1, 2, 2, "):
        ft.ops.max_pool2d_backward(None, ft.zeros(1, 2, 3, 2), idx, (5, 5))
    with pytest.raises(ValueError, match="input_size is needed"):
        ft.ops.max_pool2d_backward(None, out, idx)
    with pytest.raises(ValueError, match="avg_pool2d_backward: pad should be at most half"):
        ft.ops.avg_pool2d_backward(None, ft.zeros(1, 2, 2, 2), (5, 5), 2, padding=3)
    with pytest.raises(ValueError, match="output_size is needed"):
        ft.ops.adaptive_avg_pool2d_forward(None, x)
    with pytest.raises(ValueError, match="height and width must be at least 1"):
        F.adaptive_avg_pool2d(ft.zeros(1, 2, 0, 4), 1)
    with pytest.raises(TypeError, match="kernel_size must be an int or a pair of ints"):
        F.max_pool2d(x, "2")


@pytest.mark.skipif(torch is None, reason="torch is not installed")
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_against_torch(layout):
    import torch.nn.functional as TF
    make = t if layout == "nchw" else nhwc
    x = rng.normal(size=(2, 3, 9, 8)).astype(np.float32)
    for c in MAX_CASES:
        a = max_args(c)
        xt = torch.tensor(x, requires_grad=True)
        y, i = TF.max_pool2d(xt, a["kernel_size"], a["stride"], a["padding"], a["dilation"], a["ceil_mode"], True)
        dy = rng.normal(size=y.shape).astype(np.float32)
        y.backward(torch.tensor(dy))
        out, idx = ft.ops.max_pool2d_forward(None, None, make(x), **a)
        np.testing.assert_array_equal(n(out), y.detach().numpy())
        np.testing.assert_array_equal(idx.numpy(), i.numpy())
        np.testing.assert_allclose(n(ft.ops.max_pool2d_backward(None, make(dy), idx, x.shape)), xt.grad.numpy(),
                                   rtol=1e-6, atol=1e-6)
    for c in AVG_CASES:
        a = avg_args(c)
        xt = torch.tensor(x, requires_grad=True)
        y = TF.avg_pool2d(xt, a["kernel_size"], a["stride"], a["padding"], a["ceil_mode"], a["count_include_pad"],
                          a["divisor_override"])
        dy = rng.normal(size=y.shape).astype(np.float32)
        y.backward(torch.tensor(dy))
        np.testing.assert_allclose(n(ft.ops.avg_pool2d_forward(None, make(x), **a)), y.detach().numpy(), rtol=1e-6,
                                   atol=1e-6)
        np.testing.assert_allclose(n(ft.ops.avg_pool2d_backward(None, make(dy), x.shape, **a)), xt.grad.numpy(),
                                   rtol=1e-6, atol=1e-6)
    for size in [(1, 1), (4, 3), (5, 7)]:
        xt = torch.tensor(x, requires_grad=True)
        y = TF.adaptive_avg_pool2d(xt, size)
        np.testing.assert_allclose(n(F.adaptive_avg_pool2d(make(x), size)), y.detach().numpy(), rtol=1e-6, atol=1e-6)
        y, i = TF.adaptive_max_pool2d(xt, size, True)
        out, idx = F.adaptive_max_pool2d(make(x), size, True)
        np.testing.assert_array_equal(n(out), y.detach().numpy())
        np.testing.assert_array_equal(idx.numpy(), i.numpy())
