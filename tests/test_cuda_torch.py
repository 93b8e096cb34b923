"""The CUDA ops against PyTorch's CUDA ops (skipped where torch or its CUDA is missing), TF32 off on both
sides, and DLPack exchange of device memory with torch in both directions."""
import numpy as np
import pytest

import fasttrain as ft
from _cudaref import host, pair, rng

pytestmark = pytest.mark.cuda
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # pragma: no cover - depends on the machine
    pytest.skip("torch has no CUDA here", allow_module_level=True)
TF = torch.nn.functional
F = ft.nn.functional
ops = ft.ops


@pytest.fixture(autouse=True)
def fp32_everywhere():
    saved = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32, ft.backends.allow_tf32)
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    ft.backends.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32, ft.backends.allow_tf32 = saved


def tt(a, channels_last=False, grad=True, dtype=torch.float32):
    t = torch.tensor(np.asarray(a), dtype=dtype, device="cuda")
    if channels_last:
        t = t.contiguous(memory_format=torch.channels_last)
    return t.requires_grad_(grad) if dtype.is_floating_point else t


def near(got, want, rtol=1e-5, scaled=1e-5):
    """fasttrain's CUDA result (a Tensor) against torch's (a tensor): rtol elementwise plus scaled * max|want|."""
    w = want.detach().float().cpu().numpy().astype(np.float64)
    g = host(got).astype(np.float64)
    assert g.shape == w.shape, (g.shape, w.shape)
    finite = np.isfinite(w)
    atol = scaled * (np.abs(w[finite]).max() if finite.any() else 0.0)
    np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, equal_nan=True)


@pytest.mark.parametrize("layout", ["contiguous", "nhwc"])
@pytest.mark.parametrize("stride,pad,dil,groups", [(1, 1, 1, 1), (2, 1, 1, 2), (1, 2, 2, 1), (1, 1, 1, 16)])
def test_conv2d(layout, stride, pad, dil, groups):
    x, w, b = rng(1).standard_normal((8, 16, 15, 14)), rng(2).standard_normal((32, 16 // groups, 3, 3)) * 0.2, \
        rng(3).standard_normal(32)
    xg, wg, bg = pair(x, layout)[1], pair(w)[1], pair(b)[1]
    xt, wt, bt = tt(x, layout == "nhwc"), tt(w), tt(b)
    yt = TF.conv2d(xt, wt, bt, stride, pad, dil, groups)
    yg = ops.conv2d_forward(None, xg, wg, bg, stride, pad, dil, groups)
    near(yg, yt, 1e-4, 1e-4)
    dy = rng(4).standard_normal(yt.shape)
    yt.backward(tt(dy, layout == "nhwc", grad=False))
    dx, dw, db = ops.conv2d_backward(None, None, None, pair(dy, layout)[1], xg, wg, stride, pad, dil, groups)
    for got, want in ((dx, xt.grad), (dw, wt.grad), (db, bt.grad)):
        near(got, want, 1e-4, 1e-4)


@pytest.mark.parametrize("act", [None, "relu", "gelu"])
def test_linear(act):
    x, w, b = rng(5).standard_normal((300, 257)), rng(6).standard_normal((129, 257)) * 0.1, rng(7).standard_normal(129)
    xt, wt, bt = tt(x), tt(w), tt(b)
    z = TF.linear(xt, wt, bt)
    yt = {None: z, "relu": torch.relu(z), "gelu": TF.gelu(z)}[act]
    near(ops.linear_forward(None, pair(x)[1], pair(w)[1], pair(b)[1], act), yt, 1e-4, 1e-4)
    dy = rng(8).standard_normal((300, 129))
    TF.linear(xt, wt, bt).backward(tt(dy, grad=False))
    got = ops.linear_backward(None, None, None, pair(dy)[1], pair(x)[1], pair(w)[1])
    for g, want in zip(got, (xt.grad, wt.grad, bt.grad)):
        near(g, want, 1e-4, 1e-4)


@pytest.mark.parametrize("layout", ["contiguous", "nhwc"])
def test_batch_norm_training(layout):
    x = rng(9).standard_normal((16, 32, 9, 9)) * 2 + 5
    w, b, dy = rng(10).standard_normal(32), rng(11).standard_normal(32), rng(12).standard_normal(x.shape)
    xt, wt, bt = tt(x, layout == "nhwc"), tt(w), tt(b)
    rmt, rvt = torch.zeros(32, device="cuda"), torch.ones(32, device="cuda")
    yt = TF.batch_norm(xt, rmt, rvt, wt, bt, True, 0.1, 1e-5)
    yt.backward(tt(dy, layout == "nhwc", grad=False))
    xg, wg, bg = pair(x, layout)[1], pair(w)[1], pair(b)[1]
    rmg, rvg = ft.zeros(32, device="cuda"), ft.ones(32, device="cuda")
    yg, mean, invstd = ops.batch_norm_forward(None, None, None, xg, wg, bg, rmg, rvg, True, 0.1, 1e-5)
    near(yg, yt)
    near(rmg, rmt)
    near(rvg, rvt)
    dx, dw, db = ops.batch_norm_backward(None, None, None, pair(dy, layout)[1], xg, None, wg, None, mean, invstd)
    near(dx, xt.grad, 1e-4, 1e-5)
    near(dw, wt.grad, 1e-5, 1e-5)
    near(db, bt.grad, 1e-5, 1e-5)


def test_layer_norm():
    x, w, b, dy = rng(13).standard_normal((64, 768)) + 3, rng(14).standard_normal(768), rng(15).standard_normal(768), \
        rng(16).standard_normal((64, 768))
    xt, wt, bt = tt(x), tt(w), tt(b)
    yt = TF.layer_norm(xt, (768,), wt, bt, 1e-5)
    yt.backward(tt(dy, grad=False))
    xg, wg, bg = pair(x)[1], pair(w)[1], pair(b)[1]
    yg, mean, rstd = ops.layer_norm_forward(None, None, None, xg, wg, bg, (768,))
    near(yg, yt)
    dx, dw, db = ops.layer_norm_backward(None, None, None, pair(dy)[1], xg, wg, mean, rstd, (768,))
    near(dx, xt.grad, 1e-4, 1e-5)
    near(dw, wt.grad, 1e-5, 1e-5)
    near(db, bt.grad, 1e-5, 1e-5)


@pytest.mark.parametrize("kw", [dict(), dict(reduction="sum", label_smoothing=0.1),
                                dict(reduction="none", ignore_index=2), dict(weight=True, label_smoothing=0.2)],
                         ids=str)
@pytest.mark.parametrize("shape", [(256, 1000), (4, 21, 17, 9)])
def test_cross_entropy(shape, kw):
    kw = dict(kw)
    C = shape[1]
    x = rng(17).normal(0, 2, shape)
    target = rng(18).integers(0, C, shape[:1] + shape[2:])
    w = rng(19).uniform(0.5, 2, C) if kw.pop("weight", False) else None
    xt = tt(x)
    lt = TF.cross_entropy(xt, tt(target, dtype=torch.int64), None if w is None else tt(w, grad=False), **kw)
    dl = rng(20).standard_normal(lt.shape)
    lt.backward(tt(dl, grad=False))
    xg, tg = pair(x)[1], pair(target, dtype=ft.int64)[1]
    wg = None if w is None else pair(w)[1]
    lg, _ = ops.cross_entropy_forward(None, False, xg, tg, wg, **kw)
    near(lg, lt, 1e-5, 1e-6)
    dlg = pair(dl)[1] if lt.ndim else ft.tensor(float(dl), device="cuda")
    near(ops.cross_entropy_backward(None, dlg, xg, tg, wg, **kw), xt.grad, 1e-5, 1e-6)


@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("shape,dim", [((64, 5000), 1), ((4, 21, 33, 33), 1), ((3, 7, 40), 0)])
def test_softmax(shape, dim, log):
    x, dy = rng(21).normal(0, 3, shape), rng(22).standard_normal(shape)
    xt = tt(x)
    yt = (torch.log_softmax if log else torch.softmax)(xt, dim)
    yt.backward(tt(dy, grad=False))
    fwd, bwd = (ops.log_softmax_forward, ops.log_softmax_backward) if log else (ops.softmax_forward,
                                                                                  ops.softmax_backward)
    yg = fwd(None, pair(x)[1], dim)
    near(yg, yt, 1e-5, 1e-6)
    near(bwd(None, pair(dy)[1], yg, dim), xt.grad, 1e-5, 1e-5)


@pytest.mark.parametrize("layout", ["contiguous", "nhwc"])
def test_pools(layout):
    x = rng(23).standard_normal((4, 8, 17, 15))
    xg, xt = pair(x, layout)[1], tt(x, layout == "nhwc")
    for k, s, p, d, ceil in [(2, 2, 0, 1, False), (3, 2, 1, 1, True), (3, 1, 1, 2, False)]:
        yt, it = TF.max_pool2d(xt, k, s, p, d, ceil, True)
        yg, ig = ops.max_pool2d_forward(None, None, xg, k, s, p, d, ceil)
        np.testing.assert_array_equal(host(yg), yt.detach().cpu().numpy())
        np.testing.assert_array_equal(host(ig), it.cpu().numpy())
        dy = rng(24).standard_normal(yt.shape)
        xt.grad = None
        yt.backward(tt(dy, layout == "nhwc", grad=False))
        near(ops.max_pool2d_backward(None, pair(dy, layout)[1], ig, x.shape), xt.grad, 1e-6, 1e-6)
    for k, s, p, ceil, cip in [(2, 2, 0, False, True), (3, 2, 1, True, False), (3, 2, 1, True, True)]:
        yt = TF.avg_pool2d(xt, k, s, p, ceil, cip)
        near(ops.avg_pool2d_forward(None, xg, k, s, p, ceil, cip), yt, 1e-6, 1e-6)
        # the gradient's reference is torch's contiguous one: torch 2.11's channels-last CUDA backward of a
        # padded ceil-mode window sums into the wrong columns (its CPU backward agrees with both of ours)
        xr = tt(x)
        yr = TF.avg_pool2d(xr, k, s, p, ceil, cip)
        dy = rng(25).standard_normal(yr.shape)
        yr.backward(tt(dy, grad=False))
        near(ops.avg_pool2d_backward(None, pair(dy, layout)[1], x.shape, k, s, p, ceil, cip), xr.grad, 1e-6, 1e-6)
    for size in [(1, 1), (4, 3), (5, 7)]:
        near(F.adaptive_avg_pool2d(xg, size), TF.adaptive_avg_pool2d(xt, size), 1e-6, 1e-6)
        yt, it = TF.adaptive_max_pool2d(xt, size, True)
        yg, ig = F.adaptive_max_pool2d(xg, size, True)
        np.testing.assert_array_equal(host(yg), yt.detach().cpu().numpy())
        np.testing.assert_array_equal(host(ig), it.cpu().numpy())


@pytest.mark.parametrize("act", ["relu", "leaky_relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh"])
def test_activations(act):
    x, dy = rng(26).normal(0, 3, (64, 999)), rng(27).standard_normal((64, 999))
    fn = {"relu": torch.relu, "leaky_relu": lambda v: TF.leaky_relu(v, 0.07), "gelu": TF.gelu,
          "gelu_tanh": lambda v: TF.gelu(v, approximate="tanh"), "silu": TF.silu, "sigmoid": torch.sigmoid,
          "tanh": torch.tanh}[act]
    xt = tt(x)
    yt = fn(xt)
    yt.backward(tt(dy, grad=False))
    xg = pair(x)[1]
    near(ops.activation_forward(None, xg, act, 0.07), yt, 1e-5, 1e-6)
    near(ops.activation_backward(None, pair(dy)[1], xg, None, act, 0.07), xt.grad, 1e-5, 1e-6)


def test_mse():
    x, y = rng(28).standard_normal((32, 100)), rng(29).standard_normal((32, 100))
    for reduction in ("mean", "sum", "none"):
        near(F.mse_loss(pair(x)[1], pair(y)[1], reduction=reduction), TF.mse_loss(tt(x), tt(y), reduction=reduction))


def test_dlpack_exchange_with_torch():
    g = ft.arange(12, dtype=ft.float32).reshape(3, 4).to("cuda")
    t = torch.from_dlpack(g)
    assert t.is_cuda and t.data_ptr() == g.data_ptr() and t.tolist() == g.tolist()
    t.mul_(2)  # torch's stream: fasttrain reads after torch's work is ordered before its own
    torch.cuda.synchronize()
    assert g.tolist() == [[2.0 * v for v in range(r * 4, r * 4 + 4)] for r in range(3)]
    src = torch.arange(6, dtype=torch.float32, device="cuda").reshape(2, 3).t()
    f = ft.from_dlpack(src)
    assert f.is_cuda and f.data_ptr() == src.data_ptr() and f.stride() == (1, 3)
    assert host(F.relu(f)).tolist() == src.cpu().tolist()
