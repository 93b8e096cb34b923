"""conv2d, linear, batch_norm and layer_norm (forward and backward) against NumPy references and finite
differences, in both memory formats, fused and unfused, and bitwise across thread counts."""
import numpy as np
import pytest

import fasttrain as ft
from _opref import bits, fd_grad, n, nhwc, t, torch
from fasttrain.testing import gradcheck

nn, F = ft.nn, ft.nn.functional

RNG = np.random.default_rng(7)


def conv_ref(x, w, b, stride, pad, dil, groups):
    """A direct float64 convolution: out[n, k, p, q] = sum over c, r, s."""
    N, C, H, W = x.shape
    K, Cg, R, S = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad[0], pad[0]), (pad[1], pad[1])))
    P = (H + 2 * pad[0] - dil[0] * (R - 1) - 1) // stride[0] + 1
    Q = (W + 2 * pad[1] - dil[1] * (S - 1) - 1) // stride[1] + 1
    out = np.zeros((N, K, P, Q))
    Kg = K // groups
    for g in range(groups):
        for r in range(R):
            for s in range(S):
                patch = xp[:, g * Cg:(g + 1) * Cg, r * dil[0]:r * dil[0] + stride[0] * P:stride[0],
                           s * dil[1]:s * dil[1] + stride[1] * Q:stride[1]]
                out[:, g * Kg:(g + 1) * Kg] += np.einsum("nchw,kc->nkhw", patch, w[g * Kg:(g + 1) * Kg, :, r, s])
    return out + (0 if b is None else b[None, :, None, None])


CONV_CASES = [
    dict(N=2, C=3, H=7, W=6, K=4, R=3, S=3, stride=(1, 1), pad=(1, 1), dil=(1, 1), groups=1),
    dict(N=3, C=4, H=9, W=8, K=6, R=3, S=2, stride=(2, 1), pad=(0, 1), dil=(1, 2), groups=2),
    dict(N=2, C=6, H=5, W=5, K=6, R=3, S=3, stride=(1, 1), pad=(1, 1), dil=(1, 1), groups=6),  # depthwise
    dict(N=1, C=2, H=6, W=7, K=3, R=1, S=1, stride=(2, 2), pad=(0, 0), dil=(1, 1), groups=1),
]


def conv_transpose_ref(x, w, b, stride, pad, dil, groups, out_pad):
    """A direct float64 transposed convolution, written as the scatter its definition is: input pixel (h, w) of
    channel c adds w[c, k] at output (h stride - pad + r dil, w stride - pad + s dil) of channel k."""
    N, C, H, W = x.shape
    _, Kg, R, S = w.shape
    P = (H - 1) * stride[0] - 2 * pad[0] + dil[0] * (R - 1) + out_pad[0] + 1
    Q = (W - 1) * stride[1] - 2 * pad[1] + dil[1] * (S - 1) + out_pad[1] + 1
    full = np.zeros((N, Kg * groups, P + 2 * pad[0] + stride[0], Q + 2 * pad[1] + stride[1]))
    Cg = C // groups
    for g in range(groups):
        for r in range(R):
            for s in range(S):
                contrib = np.einsum("nchw,ck->nkhw", x[:, g * Cg:(g + 1) * Cg], w[g * Cg:(g + 1) * Cg, :, r, s])
                full[:, g * Kg:(g + 1) * Kg, r * dil[0]:r * dil[0] + stride[0] * H:stride[0],
                     s * dil[1]:s * dil[1] + stride[1] * W:stride[1]] += contrib
    out = full[:, :, pad[0]:pad[0] + P, pad[1]:pad[1] + Q]
    return out + (0 if b is None else b[None, :, None, None])


CONV_TRANSPOSE_CASES = [
    dict(C=4, K=6, G=1, R=3, stride=(2, 2), pad=(1, 1), dil=(1, 1), out_pad=(1, 1)),  # a U-Net's 2x
    dict(C=4, K=6, G=2, R=2, stride=(2, 2), pad=(0, 0), dil=(1, 1), out_pad=(0, 0)),
    dict(C=3, K=5, G=1, R=3, stride=(1, 2), pad=(1, 0), dil=(2, 1), out_pad=(0, 1)),
    dict(C=4, K=4, G=4, R=4, stride=(3, 3), pad=(1, 1), dil=(1, 1), out_pad=(2, 0)),  # depthwise
]


@pytest.mark.parametrize("case", CONV_TRANSPOSE_CASES, ids=str)
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_conv_transpose2d_forward_and_backward(case, layout):
    mk = nhwc if layout == "nhwc" else t
    c = case
    x = RNG.standard_normal((2, c["C"], 4, 5))
    w = RNG.standard_normal((c["C"], c["K"] // c["G"], c["R"], c["R"]))
    b = RNG.standard_normal(c["K"])
    args = (c["stride"], c["pad"], c["dil"], c["G"])
    out = ft.ops.conv_transpose2d_forward(None, mk(x), t(w), t(b), *args, c["out_pad"])
    want = conv_transpose_ref(x, w, b, c["stride"], c["pad"], c["dil"], c["G"], c["out_pad"])
    np.testing.assert_allclose(n(out), want, rtol=1e-4, atol=1e-4)
    dy = RNG.standard_normal(want.shape)
    dx, dw, db = ft.ops.conv_transpose2d_backward(None, None, None, mk(dy), mk(x), t(w), *args)

    def ref(xx, ww):
        return conv_transpose_ref(xx, ww, None, c["stride"], c["pad"], c["dil"], c["G"], c["out_pad"])
    np.testing.assert_allclose(n(dx), fd_grad(lambda v: ref(v, w), x, dy), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(n(dw), fd_grad(lambda v: ref(x, v), w, dy), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(n(db), dy.sum((0, 2, 3)), rtol=1e-5, atol=1e-5)
    held = [mk(np.ones(x.shape)), t(np.ones(w.shape)), t(np.ones(b.shape))]
    ft.ops.conv_transpose2d_backward(*held, mk(dy), mk(x), t(w), *args, accumulate=True)
    for h, g in zip(held, (dx, dw, db)):
        np.testing.assert_allclose(n(h), 1 + n(g), rtol=1e-5, atol=1e-5)


def test_conv_transpose2d_bad_input_and_torch():
    x, w = t(RNG.standard_normal((1, 4, 3, 3))), t(RNG.standard_normal((4, 2, 3, 3)))
    with pytest.raises(ValueError, match=r"conv_transpose2d: weight .* has 4 input channels, the input 3"):
        ft.ops.conv_transpose2d_forward(None, x[:, :3], w)
    with pytest.raises(ValueError, match=r"an output of 9 x 9 is not one whose convolution gives the input's 3 x 3"):
        ft.ops.conv_transpose2d_forward(t(np.zeros((1, 2, 9, 9))), x, w, None, 2)
    with pytest.raises(ValueError, match=r"output_padding \(2, 2\) must be smaller than either stride or dilation"):
        ft.nn.ConvTranspose2d(4, 2, 3, stride=2, output_padding=2)
    with pytest.raises(NotImplementedError, match=r"output_padding \(1, 1\) of at least the stride"):
        ft.nn.ConvTranspose2d(4, 2, 3, dilation=2, output_padding=1)
    with pytest.raises(ValueError, match="stride and dilation must be >= 1 and padding >= 0"):
        ft.ops.conv_transpose2d_forward(None, x, w, None, 0)
    with pytest.raises(TypeError, match="bias must be float32, got int64"):
        ft.ops.conv_transpose2d_forward(None, x, w, ft.ones(2, dtype=ft.int64))
    square = t(RNG.standard_normal((1, 2, 3, 3)))
    with pytest.raises(ValueError, match="out cannot be input itself"):  # it reads what it has written
        ft.ops.conv_transpose2d_forward(square, square, t(np.ones((2, 2, 1, 1))), t(np.ones(2)))
    with pytest.raises(ValueError, match=r"ConvTranspose2d: input \(1, 1\) gives an output size \(-3, -3\)"):
        ft.nn.ConvTranspose2d(2, 2, 3, padding=3).compile(ft.optim.SGD([ft.nn.Parameter(ft.zeros(1))], lr=0.1),
                                                          lambda out, y: out.sum(), batch_size=2,
                                                          input_shape=(2, 1, 1))
    if torch is None:
        return
    layer = torch.nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2)
    ours = ft.nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2)
    ours.load_state_dict({k: v.detach().numpy() for k, v in layer.state_dict().items()})
    xs = RNG.standard_normal((2, 4, 5, 5)).astype(np.float32)
    np.testing.assert_allclose(n(ours(ft.tensor(xs))), layer(torch.tensor(xs)).detach().numpy(), rtol=1e-5,
                               atol=1e-5)
    seq = RNG.standard_normal((2, 4, 7)).astype(np.float32)
    l1, o1 = torch.nn.ConvTranspose1d(4, 3, 4, stride=2, padding=1), ft.nn.ConvTranspose1d(4, 3, 4, stride=2, padding=1)
    o1.load_state_dict({k: v.detach().numpy() for k, v in l1.state_dict().items()})
    np.testing.assert_allclose(n(o1(ft.tensor(seq))), l1(torch.tensor(seq)).detach().numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", CONV_CASES)
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_conv2d_forward_and_backward(case, layout):
    c = case
    x = RNG.standard_normal((c["N"], c["C"], c["H"], c["W"]))
    w = RNG.standard_normal((c["K"], c["C"] // c["groups"], c["R"], c["S"])) * 0.3
    b = RNG.standard_normal(c["K"])
    args = (c["stride"], c["pad"], c["dil"], c["groups"])
    want = conv_ref(x, w, b, *args)
    mk = nhwc if layout == "nhwc" else t
    xt, wt, bt = mk(x), t(w), t(b)
    out = ft.ops.conv2d_forward(None, xt, wt, bt, *args)
    if layout == "nhwc":
        assert out.stride()[1] == 1  # the output keeps the input's memory format
    np.testing.assert_allclose(n(out), want, rtol=1e-4, atol=1e-4)
    dy = RNG.standard_normal(want.shape)
    dx, dw, db = ft.ops.conv2d_backward(None, None, None, mk(dy), xt, wt, *args)
    np.testing.assert_allclose(n(dx), fd_grad(lambda v: conv_ref(v, w, b, *args), x, dy), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(n(dw), fd_grad(lambda v: conv_ref(x, v, b, *args), w, dy), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(n(db), dy.sum(axis=(0, 2, 3)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("x_nhwc", [False, True])
def test_convolutions_of_activations_in_two_layouts(x_nhwc, transposed):
    """An input in one layout and the output (and its gradient) in the other, as an image viewed from a vector
    meets a channels-last program: the input is copied into the other's layout, not run through oneDNN's
    reference convolution; values and accumulation are those of one layout."""
    x_mk, y_mk = (nhwc, t) if x_nhwc else (t, nhwc)
    x = RNG.standard_normal((3, 8, 7, 7))
    if transposed:
        w, args = RNG.standard_normal((8, 6, 4, 4)) * 0.2, ((2, 2), (1, 1), (1, 1), 1)
        fwd, bwd = ft.ops.conv_transpose2d_forward, ft.ops.conv_transpose2d_backward
        want = conv_transpose_ref(x, w, None, *args, (0, 0))
    else:
        w, args = RNG.standard_normal((6, 8, 3, 3)) * 0.2, ((2, 2), (1, 1), (1, 1), 1)
        fwd, bwd = ft.ops.conv2d_forward, ft.ops.conv2d_backward
        want = conv_ref(x, w, None, *args)
    out = y_mk(np.zeros(want.shape))
    fwd(out, x_mk(x), t(w), None, *args)
    np.testing.assert_allclose(n(out), want, rtol=1e-4, atol=1e-4)
    dy = RNG.standard_normal(want.shape)
    dx, dw = x_mk(np.ones(x.shape)), t(np.ones(w.shape))
    bwd(dx, dw, False, y_mk(dy), x_mk(x), t(w), *args, accumulate=True)
    ref = (lambda xx, ww: conv_transpose_ref(xx, ww, None, *args, (0, 0))) if transposed else \
        (lambda xx, ww: conv_ref(xx, ww, None, *args))
    np.testing.assert_allclose(n(dx), 1 + fd_grad(lambda v: ref(v, w), x, dy), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(n(dw), 1 + fd_grad(lambda v: ref(x, v), w, dy), rtol=1e-4, atol=1e-4)


def test_conv2d_fused_relu_and_residual_sum():
    x, w, b = RNG.standard_normal((2, 3, 6, 6)), RNG.standard_normal((5, 3, 3, 3)), RNG.standard_normal(5)
    plain = conv_ref(x, w, b, (1, 1), (1, 1), (1, 1), 1)
    fused = ft.ops.conv2d_forward(None, t(x), t(w), t(b), padding=1, act="relu")
    np.testing.assert_allclose(n(fused), np.maximum(plain, 0), rtol=1e-4, atol=1e-4)
    res = RNG.standard_normal(plain.shape)
    out = t(res)
    ft.ops.conv2d_forward(out, t(x), t(w), t(b), padding=1, act="relu", sum=True)
    np.testing.assert_allclose(n(out), np.maximum(plain + res, 0), rtol=1e-4, atol=1e-4)


def test_conv2d_bfloat16_inputs():
    x, w = RNG.standard_normal((2, 16, 8, 8)), RNG.standard_normal((16, 16, 3, 3)) * 0.1
    xb, wb = t(x).bfloat16(), t(w).bfloat16()
    want = conv_ref(n(xb), n(wb), None, (1, 1), (1, 1), (1, 1), 1)
    out = ft.ops.conv2d_forward(None, xb, wb, None, padding=1)  # bfloat16 in, bfloat16 out (as PyTorch)
    assert out.dtype is ft.bfloat16
    np.testing.assert_allclose(n(out.float()), want, rtol=2 ** -7, atol=2 ** -7)
    wide = ft.ops.conv2d_forward(ft.empty(2, 16, 8, 8), xb, wb, None, padding=1)  # or float32, when given
    np.testing.assert_allclose(n(wide), want, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("case", [
    dict(N=8, C=64, H=7, W=7, K=32, R=3, S=3, stride=(1, 1), pad=(1, 1), dil=(1, 1)),
    dict(N=5, C=32, H=9, W=8, K=16, R=3, S=2, stride=(2, 1), pad=(0, 1), dil=(1, 2)),
    dict(N=3, C=48, H=4, W=4, K=8, R=1, S=1, stride=(1, 1), pad=(0, 0), dil=(1, 1)),
    dict(N=12, C=224, H=7, W=7, K=8, R=3, S=3, stride=(1, 1), pad=(1, 1), dil=(1, 1)),  # blocks of im2col rows
])
def test_conv2d_weight_gradient_of_small_bfloat16_planes(case, threads):
    # bfloat16 channels-last convolutions of small output planes take their weight gradient by matmuls over
    # im2col rows (conv2d.c): against float64 of the same bfloat16 values, added onto an existing gradient, and
    # bitwise the same for 1 and 2 threads
    c = case
    args = (c["stride"], c["pad"], c["dil"], 1)
    x = nhwc(RNG.standard_normal((c["N"], c["C"], c["H"], c["W"]))).bfloat16()
    w = t(RNG.standard_normal((c["K"], c["C"], c["R"], c["S"])) * 0.1).bfloat16()
    P, Q = conv_ref(np.zeros((1, 1, c["H"], c["W"])), np.zeros((1, 1, c["R"], c["S"])), None, *args).shape[2:]
    dy = nhwc(RNG.standard_normal((c["N"], c["K"], P, Q))).bfloat16()
    (ph, pw), (sh, sw), (dh, dw_) = c["pad"], c["stride"], c["dil"]
    xp = np.pad(n(x.float()).astype(np.float64), ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    want = np.zeros(w.shape)
    for r in range(c["R"]):
        for s in range(c["S"]):
            patch = xp[:, :, r * dh:r * dh + sh * P:sh, s * dw_:s * dw_ + sw * Q:sw]
            want[:, :, r, s] = np.einsum("nkpq,ncpq->kc", n(dy.float()).astype(np.float64), patch)
    old = RNG.standard_normal(w.shape)
    results = []
    for n_threads in (1, 2):
        threads(n_threads)
        dw = ft.ops.conv2d_backward(False, None, False, dy, x, w, *args)[1]
        acc = t(old)
        ft.ops.conv2d_backward(False, acc, False, dy, x, w, *args, accumulate=True)
        results.append((bits(dw), bits(acc)))
        np.testing.assert_allclose(n(dw), want, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(n(acc), old + want, rtol=1e-4, atol=1e-4)
    assert results[0] == results[1]


@pytest.mark.parametrize("N,C,K", [(5, 8, 8), (7, 12, 12), (3, 8, 32), (5, 32, 12)])
def test_strided_1x1_weight_gradient_of_few_channels_at_odd_batches(threads, N, C, K):
    # ResNet's downsample shortcut with channels not a multiple of 16: oneDNN 2.6's jit_1x1 backward-weights kernel
    # corrupted the heap at odd batch sizes on 2 threads (conv2d.c takes another); against float64, repeatedly
    threads(2)
    x = nhwc(RNG.standard_normal((N, C, 16, 16)))
    w = t(RNG.standard_normal((K, C, 1, 1)) * 0.1)
    dy = nhwc(RNG.standard_normal((N, K, 8, 8)))
    want = np.einsum("nkpq,ncpq->kc", n(dy).astype(np.float64), n(x).astype(np.float64)[:, :, ::2, ::2])
    for _ in range(20):
        dx, dw, _ = ft.ops.conv2d_backward(None, None, False, dy, x, w, 2)
        np.testing.assert_allclose(n(dw)[:, :, 0, 0], want, rtol=1e-4, atol=1e-4)
    dx_want = np.zeros((N, C, 16, 16))
    dx_want[:, :, ::2, ::2] = np.einsum("nkpq,kc->ncpq", n(dy).astype(np.float64), n(w)[:, :, 0, 0])
    np.testing.assert_allclose(n(dx), dx_want, rtol=1e-4, atol=1e-4)


def test_one_channel_inputs_give_outputs_in_the_layout_their_strides_say():
    # (N, 1, H, W) is dense in NCHW and NHWC at once: the size-1 channel's stride decides, as in PyTorch
    x, w = RNG.standard_normal((4, 1, 6, 6)), RNG.standard_normal((8, 1, 3, 3))
    wb = t(w).bfloat16()
    want = conv_ref(n(t(x).bfloat16().float()), n(wb.float()), None, (1, 1), (1, 1), (1, 1), 1)  # the rounded inputs'
    cl = ft.from_numpy(np.ascontiguousarray(x.transpose(0, 2, 3, 1), dtype=np.float32)).bfloat16().permute(0, 3, 1, 2)
    assert cl.stride() == (36, 1, 6, 1)
    nchw = t(x).bfloat16()
    assert nchw.stride() == (36, 36, 6, 1)
    for xb, channels_last in ((cl, True), (nchw, False)):
        out = ft.ops.conv2d_forward(None, xb, wb, None, padding=1)
        assert out.stride() == ((288, 1, 48, 8) if channels_last else (288, 36, 6, 1))  # never N, H, C, W
        np.testing.assert_allclose(n(out.float()), want, rtol=2 ** -8, atol=1e-6)  # the output's rounding


def test_conv2d_bad_inputs():
    x, w = ft.zeros(2, 3, 8, 8), ft.zeros(4, 3, 3, 3)
    with pytest.raises(ValueError, match=r"conv2d: weight has 3 input channels per group, the input gives 1"):
        ft.ops.conv2d_forward(None, x, ft.zeros(6, 3, 3, 3), None, groups=3)
    with pytest.raises(ValueError, match="groups"):
        ft.ops.conv2d_forward(None, x, ft.zeros(4, 1, 3, 3), None, groups=2)
    with pytest.raises(ValueError, match=r"out should have shape \(2, 4, 6, 6\), got \(2, 4, 8, 8\)"):
        ft.ops.conv2d_forward(ft.zeros(2, 4, 8, 8), x, w)
    with pytest.raises(ValueError, match="smaller than the dilated kernel"):
        ft.ops.conv2d_forward(None, ft.zeros(1, 3, 2, 2), w)
    with pytest.raises(TypeError, match="float32"):
        ft.ops.conv2d_forward(None, x.to(ft.float64), w)
    with pytest.raises(ValueError, match="4"):
        ft.ops.conv2d_forward(None, ft.zeros(3, 8, 8), w)
    with pytest.raises(ValueError, match="stride"):
        ft.ops.conv2d_forward(None, x, w, stride=0)
    empty = ft.ops.conv2d_forward(None, ft.zeros(0, 3, 8, 8), w, padding=1)
    assert empty.shape == (0, 4, 8, 8)
    dx, dw, db = ft.ops.conv2d_backward(None, None, None, empty, ft.zeros(0, 3, 8, 8), w, padding=1)
    assert n(dw).sum() == 0 and db.shape == (4,)
    with pytest.raises(ValueError, match="conv2d: zero input channels are not supported"):
        ft.ops.conv2d_forward(None, ft.zeros(2, 0, 4, 4), ft.zeros(3, 0, 3, 3), None, 1, 1)


def test_linear_forward_backward_and_fusion():
    x, w, b = RNG.standard_normal((6, 5)), RNG.standard_normal((4, 5)), RNG.standard_normal(4)
    out = ft.ops.linear_forward(None, t(x), t(w), t(b))
    np.testing.assert_allclose(n(out), x @ w.T + b, rtol=1e-5, atol=1e-5)
    fused = ft.ops.linear_forward(None, t(x), t(w), t(b), act="gelu")
    z = x @ w.T + b
    from math import erf
    np.testing.assert_allclose(n(fused), z * 0.5 * (1 + np.vectorize(erf)(z / np.sqrt(2))), rtol=1e-4, atol=1e-4)
    dy = RNG.standard_normal((6, 4))
    dx, dw, db = ft.ops.linear_backward(None, None, None, t(dy), t(x), t(w))
    np.testing.assert_allclose(n(dx), dy @ w, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(n(dw), dy.T @ x, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(n(db), dy.sum(0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(n(dw), fd_grad(lambda v: x @ v.T + b, w, dy), rtol=1e-5, atol=1e-5)
    # a transposed (non-contiguous) weight view works without a copy
    wt = t(w.T.copy()).t()
    np.testing.assert_allclose(n(ft.ops.linear_forward(None, t(x), wt, None)), x @ w.T, rtol=1e-5, atol=1e-5)
    # functional form with extra leading dimensions
    x3 = RNG.standard_normal((2, 3, 5))
    np.testing.assert_allclose(n(ft.nn.functional.linear(t(x3), t(w), t(b))), x3 @ w.T + b, rtol=1e-5, atol=1e-5)


def test_linear_bad_inputs():
    with pytest.raises(ValueError, match="input has 3 features but weight expects 5"):
        ft.ops.linear_forward(None, ft.zeros(2, 3), ft.zeros(4, 5))
    with pytest.raises(ValueError, match=r"bias should have shape \(4,\)"):
        ft.ops.linear_forward(None, ft.zeros(2, 5), ft.zeros(4, 5), ft.zeros(3))
    with pytest.raises(TypeError):
        ft.ops.linear_forward(None, ft.zeros(2, 5, dtype=ft.int32), ft.zeros(4, 5))
    assert ft.ops.linear_forward(None, ft.zeros(0, 5), ft.zeros(4, 5)).shape == (0, 4)


def bn_ref(x, w, b, eps):
    axes = (0, 2, 3) if x.ndim == 4 else (0,)
    shape = (1, -1, 1, 1) if x.ndim == 4 else (1, -1)
    mean, var = x.mean(axes), x.var(axes)
    return (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps) * w.reshape(shape) + b.reshape(shape)


@pytest.mark.parametrize("layout", ["nchw", "nhwc", "2d"])
def test_batch_norm_training(layout):
    shape = (6, 5) if layout == "2d" else (4, 3, 5, 6)
    C = shape[1]
    x = RNG.standard_normal(shape) * 3 + 10  # a large mean checks the variance's accuracy
    w, b = RNG.standard_normal(C), RNG.standard_normal(C)
    mk = nhwc if layout == "nhwc" else t
    rm, rv = ft.zeros(C), ft.ones(C)
    out, mean, invstd = ft.ops.batch_norm_forward(None, None, None, mk(x), t(w), t(b), rm, rv, True, 0.1, 1e-5)
    np.testing.assert_allclose(n(out), bn_ref(x, w, b, 1e-5), rtol=1e-4, atol=1e-4)
    axes = (0, 2, 3) if x.ndim == 4 else (0,)
    M = x.size // C
    np.testing.assert_allclose(n(rm), 0.1 * x.mean(axes), rtol=1e-5)
    np.testing.assert_allclose(n(rv), 0.9 + 0.1 * x.var(axes) * M / (M - 1), rtol=1e-5)
    dy = RNG.standard_normal(shape)
    dx, dw, db = ft.ops.batch_norm_backward(None, None, None, mk(dy), mk(x), None, t(w), None, mean, invstd)
    np.testing.assert_allclose(n(dx), fd_grad(lambda v: bn_ref(v, w, b, 1e-5), x, dy), rtol=2e-3, atol=2e-3)
    np.testing.assert_allclose(n(dw), fd_grad(lambda v: bn_ref(x, v, b, 1e-5), w, dy), rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(n(db), dy.sum(axes), rtol=1e-5, atol=1e-5)


def test_batch_norm_eval_and_fused_relu():
    x = RNG.standard_normal((2, 4, 3, 3))
    rm, rv, w, b = RNG.standard_normal(4), RNG.random(4) + 0.5, RNG.standard_normal(4), RNG.standard_normal(4)
    out, _, _ = ft.ops.batch_norm_forward(None, None, None, t(x), t(w), t(b), t(rm), t(rv), False)
    want = (x - rm[None, :, None, None]) / np.sqrt(rv[None, :, None, None] + 1e-5) * w[None, :, None, None] \
        + b[None, :, None, None]
    np.testing.assert_allclose(n(out), want, rtol=1e-5, atol=1e-5)
    # BN + ReLU fused equals BN then ReLU, forward and backward
    xt = nhwc(x)
    fused, mean, invstd = ft.ops.batch_norm_forward(None, None, None, xt, t(w), t(b), act="relu")
    plain, _, _ = ft.ops.batch_norm_forward(None, None, None, xt, t(w), t(b))
    np.testing.assert_array_equal(n(fused), np.maximum(n(plain), 0))
    dy = nhwc(RNG.standard_normal(x.shape))
    dfused = ft.ops.batch_norm_backward(None, False, False, dy, xt, fused, t(w), t(b), mean, invstd, act="relu")[0]
    drelu = ft.ops.activation_backward(None, dy, None, fused, "relu")
    dplain = ft.ops.batch_norm_backward(None, False, False, drelu, xt, None, t(w), None, mean, invstd)[0]
    np.testing.assert_allclose(n(dfused), n(dplain), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("out_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_fused_relu_backward_masks_where_the_output_is_positive(layout, out_dtype, training):
    # the CPU recomputes the relu's mask from x, weight and bias rather than reading the output: it must be the
    # output's exactly, the bias included, where a bfloat16 output rounds a positive value to 0, and for NaN
    x = RNG.standard_normal((4, 3, 5, 5)).astype(np.float32)
    x[0, 0, 0] = [2.0**-135, 2.0**-134, 1.5 * 2.0**-134, 2.0**-133, -(2.0**-135)]
    if not training:
        x[1, 0, 1, :2] = [np.nan, np.inf]
    w, b = np.array([1, 0.7, -1.3], np.float32), np.array([0, 0.4, -0.2], np.float32)
    rm, rv = t(np.zeros(3)), t(np.ones(3))
    xt = nhwc(x) if layout == "nhwc" else t(x)
    dt = getattr(ft, out_dtype)
    out = ft.empty(4, 5, 5, 3, dtype=dt).permute(0, 3, 1, 2) if layout == "nhwc" else ft.empty(*x.shape, dtype=dt)
    _, mean, invstd = ft.ops.batch_norm_forward(out, None, None, xt, t(w), t(b), rm, rv, training, act="relu")
    dy = nhwc(RNG.standard_normal(x.shape)) if layout == "nhwc" else t(RNG.standard_normal(x.shape))
    fused = ft.ops.batch_norm_backward(None, None, None, dy, xt, out, t(w), t(b), mean, invstd, training, act="relu")
    dz = ft.ops.activation_backward(None, dy, None, out.to(ft.float32), "relu")
    plain = ft.ops.batch_norm_backward(None, None, None, dz, xt, None, t(w), None, mean, invstd, training)
    if not training:  # 2^-134 and below round to 0 in bfloat16
        positive = [out_dtype == "float32"] * 2 + [True, True, False]
        assert (n(out.to(ft.float32))[0, 0, 0] > 0).tolist() == positive
    for f, p in zip(fused, plain):
        np.testing.assert_array_equal(n(f), n(p))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("act", [None, "relu"])
def test_batch_norm_channels_last_blocks_of_sixteen_channels(dtype, act, threads):
    # channels-last with C a multiple of 16 sums each block of 16 channels in registers and (bfloat16) converts in
    # its loops (batchnorm.c): against float64 of the rounded values, over a partial chunk of rows, NaN kept to
    # its channel, and bitwise the same for 1 and 2 threads
    shape, C = (17, 48, 5, 5), 48
    x = RNG.standard_normal(shape) * 2 + 3
    x[3, 5, 2, 2] = np.nan
    dy, w, b = RNG.standard_normal(shape), RNG.standard_normal(C), RNG.standard_normal(C)
    low = getattr(ft, dtype)
    xt, dyt = nhwc(x).to(low), nhwc(dy).to(low)
    xr, dyr = n(xt.float()).astype(np.float64), n(dyt.float()).astype(np.float64)
    runs = []
    for n_threads in (1, 2):
        threads(n_threads)
        out, mean, invstd = ft.ops.batch_norm_forward(None, None, None, xt, t(w), t(b), act=act)
        dx, dw, db = ft.ops.batch_norm_backward(None, None, None, dyt, xt, out, t(w), t(b), mean, invstd, act=act)
        runs.append([bits(v) for v in (out, mean, invstd, dx, dw, db)])
    assert runs[0] == runs[1]
    tol = dict(rtol=2 ** -8, atol=1e-3) if dtype == "bfloat16" else dict(rtol=1e-4, atol=1e-4)
    m, v = xr.mean((0, 2, 3)), xr.var((0, 2, 3))
    xhat = (xr - m[None, :, None, None]) / np.sqrt(v[None, :, None, None] + 1e-5)
    y = xhat * w[None, :, None, None] + b[None, :, None, None]
    dz = dyr * (n(out.float()) > 0) if act else dyr  # the output's mask: a value at the kink may round either way
    if act:
        y = np.maximum(y, 0)  # keeps NaN, as PyTorch
    np.testing.assert_allclose(n(out.float()), y, **tol)
    assert np.isnan(n(out.float())[:, 5]).all() and np.isfinite(n(out.float())[:, :5]).all()
    keep = np.arange(C) != 5
    g = (dz - dz.mean((0, 2, 3))[None, :, None, None]
         - xhat * (dz * xhat).mean((0, 2, 3))[None, :, None, None]) * (w / np.sqrt(v + 1e-5))[None, :, None, None]
    np.testing.assert_allclose(n(dx.float())[:, keep], g[:, keep], **tol)
    np.testing.assert_allclose(n(dw)[keep], (dz * xhat).sum((0, 2, 3))[keep], rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(n(db), dz.sum((0, 2, 3)), rtol=1e-3, atol=1e-3)


def test_batch_norm_momentum_none_keeps_cumulative_averages():
    """momentum=None, as PyTorch's: after k training batches the running statistics are the plain mean of the k
    batches' (the variance unbiased), eagerly and in a compiled step alike; eval reads them."""
    nn = ft.nn
    rng = np.random.default_rng(31)
    batches = [rng.standard_normal((6, 3, 2, 2)).astype(np.float32) * (k + 1) + k for k in range(3)]
    means = [b.astype(np.float64).mean((0, 2, 3)) for b in batches]
    variances = [b.astype(np.float64).var((0, 2, 3), ddof=1) for b in batches]
    eager = nn.BatchNorm2d(3, momentum=None)
    assert "momentum=None" in repr(eager)
    model = nn.Sequential(nn.BatchNorm2d(3, momentum=None), nn.Flatten(), nn.Linear(12, 2))
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.0), nn.CrossEntropyLoss(), batch_size=6,
                            input_shape=(3, 2, 2))
    for k, b in enumerate(batches):
        eager(ft.tensor(b))
        program.train_step(b, np.zeros(6, np.int64))
        for bn in (eager, model[0]):
            assert int(bn.num_batches_tracked) == k + 1
            np.testing.assert_allclose(bn.running_mean.numpy(), np.mean(means[:k + 1], 0), rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(bn.running_var.numpy(), np.mean(variances[:k + 1], 0), rtol=1e-5)
    # without running statistics, after a convolution whose bias it cancels: batch statistics in eval mode too
    free = nn.Sequential(nn.Conv2d(3, 3, 1), nn.BatchNorm2d(3, momentum=None, track_running_stats=False),
                         nn.Flatten(), nn.Linear(12, 2))
    free_program = free.compile(ft.optim.SGD(free.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=6,
                                input_shape=(3, 2, 2))
    assert np.isfinite(free_program.train_step(batches[0], np.zeros(6, np.int64)))
    np.testing.assert_allclose(free_program.predict(batches[1]).numpy(), free.eval()(ft.tensor(batches[1])).numpy(),
                               rtol=1e-4, atol=1e-5)
    x = batches[0][:2]
    mean, var = model[0].running_mean.numpy()[:, None, None], model[0].running_var.numpy()[:, None, None]
    want = (x - mean) / np.sqrt(var + 1e-5)
    np.testing.assert_allclose(eager.eval()(ft.tensor(x)).numpy(), want, rtol=1e-5, atol=1e-5)


def test_batch_norm_bad_inputs():
    x = ft.zeros(2, 3, 4, 4)
    with pytest.raises(ValueError, match="eval mode needs running_mean"):
        ft.ops.batch_norm_forward(None, None, None, x, training=False)
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        ft.ops.batch_norm_forward(None, None, None, ft.zeros(1, 3))
    with pytest.raises(ValueError, match=r"weight must be a contiguous float32 CPU tensor of shape \(3,\)"):
        ft.ops.batch_norm_forward(None, None, None, x, ft.ones(4))
    with pytest.raises(ValueError, match="layout"):
        ft.ops.batch_norm_backward(None, None, None, nhwc(np.zeros((2, 3, 4, 4))), x, None, None, None,
                                   ft.zeros(3), ft.ones(3))
    out, mean, invstd = ft.ops.batch_norm_forward(None, None, None, x, act="relu")
    with pytest.raises(ValueError, match=r"bias must be a contiguous float32 CPU tensor of shape \(3,\)"):
        ft.ops.batch_norm_backward(None, None, None, x, x, out, None, ft.zeros(4), mean, invstd, act="relu")
    with pytest.raises(TypeError, match="save_invstd"):  # the call before bias: refused, not misread
        ft.ops.batch_norm_backward(None, None, None, x, x, out, None, mean, invstd, act="relu")


@pytest.mark.parametrize("shape", [(4, 0), (4, 0, 3, 3), (0, 5, 3, 3)])
def test_batch_norm_of_empty_tensors(shape):
    # no channel, or (in evaluation) no sample: empty results, as PyTorch's; zero channels ended in SIGFPE
    C = shape[1]
    x, rm, rv = ft.zeros(*shape), ft.zeros(C), ft.ones(C)
    out, mean, invstd = ft.ops.batch_norm_forward(None, None, None, x, ft.ones(C), ft.zeros(C), rm, rv,
                                                  training=shape[0] > 0, act="relu")
    assert out.shape == shape and mean.shape == (C,)
    dx, dw, db = ft.ops.batch_norm_backward(None, None, None, ft.zeros(*shape), x, out, ft.ones(C), ft.zeros(C), mean,
                                            invstd, training=shape[0] > 0, act="relu")
    assert dx.shape == shape and dw.shape == (C,) and db.shape == (C,)
    assert n(rm).tolist() == [0.0] * C and n(rv).tolist() == [1.0] * C  # no statistics from nothing


def test_layer_norm():
    x, w, b = RNG.standard_normal((4, 3, 8)) + 5, RNG.standard_normal(8), RNG.standard_normal(8)

    def ref(v, w=w, b=b):
        m, s = v.mean(-1, keepdims=True), v.var(-1, keepdims=True)
        return (v - m) / np.sqrt(s + 1e-5) * w + b

    out, mean, rstd = ft.ops.layer_norm_forward(None, None, None, t(x), t(w), t(b), (8,))
    np.testing.assert_allclose(n(out), ref(x), rtol=1e-4, atol=1e-4)
    dy = RNG.standard_normal(x.shape)
    dx, dw, db = ft.ops.layer_norm_backward(None, None, None, t(dy), t(x), t(w), mean, rstd, (8,))
    np.testing.assert_allclose(n(dx), fd_grad(ref, x, dy), rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(n(dw), fd_grad(lambda v: ref(x, v, b), w, dy), rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(n(db), dy.sum((0, 1)), rtol=1e-5, atol=1e-5)
    g = t(dy)  # in place: the input gradient over the output gradient leaves the parameter gradients as they were
    ft.ops.layer_norm_backward(g, dw, db, g, t(x), t(w), mean, rstd, (8,))
    np.testing.assert_array_equal(n(g), n(dx))
    np.testing.assert_allclose(n(db), dy.sum((0, 1)), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(n(dw), fd_grad(lambda v: ref(x, v, b), w, dy), rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(n(ft.nn.functional.layer_norm(t(x), 8, t(w), t(b))), ref(x), rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError):
        ft.nn.functional.layer_norm(t(x), (5,))


@pytest.mark.parametrize("op", ["conv", "linear", "bn"])
def test_bitwise_identical_across_thread_counts(op, threads, ft_deterministic):
    x4 = RNG.standard_normal((64, 16, 12, 12)).astype(np.float32)
    w4 = (RNG.standard_normal((32, 16, 3, 3)) * 0.1).astype(np.float32)
    x2, w2 = RNG.standard_normal((512, 256)).astype(np.float32), RNG.standard_normal((128, 256)).astype(np.float32)

    def run():
        if op == "conv":
            y = ft.ops.conv2d_forward(None, nhwc(x4), t(w4), None, padding=1)
            return [bits(g) for g in ft.ops.conv2d_backward(None, None, None, y, nhwc(x4), t(w4), padding=1)]
        if op == "linear":
            y = ft.ops.linear_forward(None, t(x2), t(w2))
            return [bits(y)] + [bits(g) for g in ft.ops.linear_backward(None, None, None, y, t(x2), t(w2))]
        out, m, s = ft.ops.batch_norm_forward(None, None, None, nhwc(x4), None, None)
        return [bits(out)] + [bits(g) for g in ft.ops.batch_norm_backward(None, None, None, out, nhwc(x4), None,
                                                                           None, None, m, s) if g is not None]

    one = (threads(1), run())[1]
    two = (threads(2), run())[1]
    assert one == two


def test_against_torch():
    if torch is None:
        pytest.skip("torch is not installed")
    x, w, b = RNG.standard_normal((2, 4, 9, 9)), RNG.standard_normal((6, 2, 3, 3)), RNG.standard_normal(6)
    want = torch.nn.functional.conv2d(torch.tensor(x), torch.tensor(w), torch.tensor(b), 2, 1, 1, 2).numpy()
    got = ft.nn.functional.conv2d(t(x), t(w), t(b), 2, 1, 1, 2)
    np.testing.assert_allclose(n(got), want, rtol=1e-4, atol=1e-4)


def test_autotuner_gives_the_same_results_and_persists_choices(tmp_path, monkeypatch):
    monkeypatch.setenv("FASTTRAIN_CACHE_DIR", str(tmp_path))
    x, w = RNG.standard_normal((8, 16, 10, 12)), RNG.standard_normal((24, 16, 3, 3)) * 0.2
    plain = ft.ops.conv2d_forward(None, nhwc(x), t(w), None, padding=1)
    dplain = ft.ops.conv2d_backward(None, None, False, plain, nhwc(x), t(w), padding=1)
    assert ft.backends.benchmark is False
    ft.backends.benchmark = True
    try:
        tuned = ft.ops.conv2d_forward(None, nhwc(x), t(w), None, padding=1)
        dtuned = ft.ops.conv2d_backward(None, None, False, tuned, nhwc(x), t(w), padding=1)
    finally:
        ft.backends.benchmark = False
    np.testing.assert_allclose(n(tuned), n(plain), rtol=1e-5, atol=1e-5)
    for a, b in zip(dtuned[:2], dplain[:2]):
        np.testing.assert_allclose(n(a), n(b), rtol=1e-4, atol=1e-4)
    lines = (tmp_path / "fasttrain-autotune.txt").read_text().split()
    assert len(lines) == 6 and set(lines[1::2]) <= {"0", "1", "2", "3"}  # a choice per kind: forward, data, weights


# ---- layers written with other ops: EmbeddingBag, Bilinear, the shrinks, Threshold, Softmin, ChannelShuffle ----

def bags_ref(table, ids, mode, padding_idx=None, weights=None):
    """Each row of ids a bag: the sum, mean or max of its rows of table, padding_idx's ids left out (0 when none)."""
    out = []
    for k, bag in enumerate(ids):
        keep = [j for j, i in enumerate(bag) if i != padding_idx]
        rows = table[bag[keep]] * (1.0 if weights is None else weights[k][keep][:, None])
        out.append(np.zeros(table.shape[1]) if not keep else rows.sum(0) if mode == "sum" else
                   rows.mean(0) if mode == "mean" else rows.max(0))
    return np.array(out)


def test_embedding_bag_reduces_each_bag_as_numpy():
    """Bags of one length (B, L) with padding left out of the sums, means and counts; 1-d ids cut at offsets (the
    text classification tutorial's form, include_last_offset too); per-sample weights in mode 'sum'."""
    ft.manual_seed(30)
    ids = np.random.default_rng(31).integers(0, 10, (5, 4))
    ids[0], ids[1, :2] = 0, 0  # a bag of padding only, and one half padded
    for mode in ("sum", "mean", "max"):
        bag = nn.EmbeddingBag(10, 3, mode=mode, padding_idx=0)
        bag.weight[0].fill_(5.0)  # left out whatever it holds
        table = bag.weight.numpy().astype(np.float64)
        np.testing.assert_allclose(bag(ft.tensor(ids)).numpy(), bags_ref(table, ids, mode, 0), rtol=1e-6, atol=1e-7)
        flat, starts = ids.reshape(-1), [0, 3, 3, 9]  # bags of 3, 0, 6 and 11 ids
        want = [bags_ref(table, flat[a:b][None], mode)[0] if b > a else np.zeros(3)
                for a, b in zip(starts, starts[1:] + [20])]
        plain = nn.EmbeddingBag(10, 3, mode=mode, _weight=bag.weight)
        np.testing.assert_allclose(plain(ft.tensor(flat), ft.tensor(np.array(starts))).numpy(), want, rtol=1e-6,
                                   atol=1e-7)
        last = nn.EmbeddingBag(10, 3, mode=mode, _weight=bag.weight, include_last_offset=True)
        np.testing.assert_allclose(last(ft.tensor(flat), ft.tensor(np.array(starts + [20]))).numpy(), want,
                                   rtol=1e-6, atol=1e-7)
    w = np.random.default_rng(32).random((5, 4)).astype(np.float32)
    bag = nn.EmbeddingBag(10, 3, mode="sum")
    np.testing.assert_allclose(bag(ft.tensor(ids), per_sample_weights=ft.tensor(w)).numpy(),
                               bags_ref(bag.weight.numpy().astype(np.float64), ids, "sum", weights=w), rtol=1e-5)
    with pytest.raises(NotImplementedError, match="per_sample_weights is only supported for mode='sum'"):
        nn.EmbeddingBag(10, 3)(ft.tensor(ids), per_sample_weights=ft.tensor(w))
    with pytest.raises(ValueError, match="offsets must rise from 0"):
        bag(ft.tensor(ids.reshape(-1)), ft.tensor(np.array([0, 5, 2])))
    with pytest.raises(ValueError, match="offsets must rise from 0"):  # leading ids in no bag
        bag(ft.tensor(ids.reshape(-1)), ft.tensor(np.array([2, 5])))
    for offsets, kw in ((np.array([0.0, 2.0]), {}), (np.zeros(0, np.int64), {"include_last_offset": True})):
        with pytest.raises(ValueError, match="1-d ids need 1-d integer offsets"):
            F.embedding_bag(ft.tensor(ids.reshape(-1)), bag.weight, ft.tensor(offsets), **kw)
    with pytest.raises(ValueError, match=r"per_sample_weights must have the ids' shape \(20,\), got \(20, 1\)"):
        F.embedding_bag(ft.tensor(ids.reshape(-1)), bag.weight, ft.tensor(np.array([0, 5])), mode="sum",
                        per_sample_weights=ft.ones(20, 1))
    with pytest.raises(ValueError, match="mode must be 'sum', 'mean' or 'max'"):
        nn.EmbeddingBag(10, 3, mode="median")

    class Text(nn.Module):  # the text-classification tutorial's forward(text, offsets), ids of one sample traced
        def __init__(self):
            super().__init__()
            self.bag, self.offsets = nn.EmbeddingBag(10, 3), ft.tensor([0])

        def forward(self, text):
            return self.bag(text, self.offsets)

    model = Text()
    with pytest.raises(ft.nn.TracingError, match=r"embedding_bag of 1-d ids cut at offsets .* pad the bags to one "
                                                  r"length with padding_idx"):
        model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=2, input_shape=(5,), input_dtype=ft.int64)


def test_bilinear_shrinks_threshold_softmin_and_channel_shuffle_match_numpy():
    x = np.random.default_rng(33).standard_normal((4, 6)).astype(np.float32)
    xd = x.astype(np.float64)
    layer = nn.Bilinear(6, 5, 3)
    x2 = np.random.default_rng(34).standard_normal((4, 5)).astype(np.float32)
    want = np.einsum("ni,kij,nj->nk", xd, layer.weight.numpy().astype(np.float64), x2) + layer.bias.numpy()
    np.testing.assert_allclose(layer(ft.tensor(x), ft.tensor(x2)).numpy(), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(F.hardshrink(ft.tensor(x), 0.4).numpy(), np.where(np.abs(x) > 0.4, x, 0))
    np.testing.assert_allclose(F.softshrink(ft.tensor(x), 0.4).numpy(), np.sign(x) * np.maximum(np.abs(x) - 0.4, 0),
                               atol=1e-7)
    np.testing.assert_array_equal(nn.Threshold(0.1, -2.0)(ft.tensor(x)).numpy(), np.where(x > 0.1, x, -2.0))
    e = np.exp(-xd - (-xd).max(1, keepdims=True))
    np.testing.assert_allclose(nn.Softmin(1)(ft.tensor(x)).numpy(), e / e.sum(1, keepdims=True), rtol=1e-6)
    y = ft.tensor(x.copy())
    assert F.threshold_(y, 0.0, 0.0) is y and np.array_equal(y.numpy(), np.maximum(x, 0))
    for fn, args in ((F.elu_, ()), (F.selu_, ()), (F.celu_, (0.5,)), (F.hardtanh_, (-0.2, 0.3))):
        y = ft.tensor(x.copy())
        assert fn(y, *args) is y
        np.testing.assert_array_equal(y.numpy(), getattr(F, fn.__name__[:-1])(ft.tensor(x), *args).numpy())
    img = np.random.default_rng(35).standard_normal((2, 6, 2, 3)).astype(np.float32)
    np.testing.assert_array_equal(nn.ChannelShuffle(3)(ft.tensor(img)).numpy(),
                                  img.reshape(2, 3, 2, 2, 3).transpose(0, 2, 1, 3, 4).reshape(2, 6, 2, 3))
    nan = ft.tensor(np.array([np.nan, 1.0], np.float32))  # kept, as PyTorch's
    for fn in (lambda v: F.threshold(v, 0.1, -2.0), lambda v: F.hardshrink(v, 0.4), lambda v: F.softshrink(v, 0.4)):
        assert np.isnan(fn(nan).numpy()[0])
    for bad in (0, -2, 4):
        with pytest.raises(ValueError, match="channels do not split into"):
            F.channel_shuffle(ft.tensor(img), bad)
    with pytest.raises(ValueError, match="softshrink: lambd must be at least 0, got -0.1"):
        F.softshrink(ft.tensor(x), -0.1)
    with pytest.raises(ValueError, match="input1 and input2 must have the same leading shape"):
        layer(ft.tensor(x[:1]), ft.tensor(x2))


class BagsAndPairs(nn.Module):
    """A text model of padded bags (EmbeddingBag's compiled form), a bilinear layer over two views of them, the
    shrinks and Threshold, and a ShuffleNet channel shuffle of the features viewed as maps."""

    def __init__(self):
        super().__init__()
        self.bag = nn.EmbeddingBag(12, 8, mode="mean", padding_idx=0)
        self.peak = nn.EmbeddingBag(12, 8, mode="max", padding_idx=0)
        self.pair = nn.Bilinear(8, 8, 8)
        self.acts = nn.Sequential(nn.Softshrink(0.1), nn.Hardshrink(0.05), nn.Threshold(-0.5, 0.25))
        self.conv, self.out = nn.Conv2d(4, 4, 1), nn.Linear(8, 3)

    def forward(self, ids):
        h = self.acts(self.pair(self.bag(ids), self.peak(ids).tanh()))
        maps = self.conv(F.channel_shuffle(h.view(h.size(0), 4, 2, 1), 2))
        return self.out(maps.flatten(1)) + F.softmin(h[:, :3], 1)


def test_layers_written_with_other_ops_compile_and_match_finite_differences():
    ft.manual_seed(36)
    model = BagsAndPairs()
    ids = np.random.default_rng(37).integers(0, 12, (4, 5))
    ids[0, 2:], ids[1] = 0, np.arange(1, 6)
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=4, input_shape=(5,),
                            input_dtype=ft.int64)
    np.testing.assert_allclose(program.predict(ids).numpy(), model(ft.tensor(ids)).numpy(), rtol=1e-5, atol=1e-6)
    assert gradcheck(program, ids, np.array([0, 1, 2, 0]), eps=1e-3, rtol=3e-2, atol=1e-3)
    program.backward(ids, np.array([0, 1, 2, 0]))
    assert not model.bag.weight.grad.numpy()[0].any()  # the padding row


def test_shrinks_pass_no_gradient_at_their_bounds():
    """d/dx softshrink and hardshrink are 0 at |x| = lambd, as PyTorch's, 1 beyond it."""
    class Shrunk(nn.Module):
        def __init__(self, shrink):
            super().__init__()
            self.w, self.shrink = nn.Parameter(ft.ones(4)), shrink

        def forward(self, x):
            return self.shrink(x * self.w).sum(1, keepdim=True)

    x = np.array([[0.5, -0.5, 0.7, 0.2]], np.float32)
    for shrink in (nn.Softshrink(0.5), nn.Hardshrink(0.5)):
        model = Shrunk(shrink)
        program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.MSELoss(), batch_size=1,
                                input_shape=(4,))
        program.backward(x, np.zeros((1, 1), np.float32))
        out = float(shrink(ft.tensor(x)).numpy().sum())
        np.testing.assert_allclose(model.w.grad.numpy(), 2 * out * x[0] * [0, 0, 1, 0], rtol=1e-6)


def test_layers_written_with_other_ops_match_pytorch():
    torch = pytest.importorskip("torch")
    torch.manual_seed(38)
    ft.manual_seed(36)
    model = BagsAndPairs()
    tm = torch.nn.ModuleDict(dict(bag=torch.nn.EmbeddingBag(12, 8, mode="mean", padding_idx=0),
                                  peak=torch.nn.EmbeddingBag(12, 8, mode="max", padding_idx=0),
                                  pair=torch.nn.Bilinear(8, 8, 8), conv=torch.nn.Conv2d(4, 4, 1),
                                  out=torch.nn.Linear(8, 3)))
    with torch.no_grad():
        for name, p in tm.named_parameters():
            p.copy_(torch.from_numpy(dict(model.named_parameters())[name].numpy()))
    ids = np.random.default_rng(37).integers(0, 12, (4, 5))
    ids[0, 2:] = 0
    tf, ti = torch.nn.functional, torch.tensor(ids)
    h = tf.threshold(tf.hardshrink(tf.softshrink(tm["pair"](tm["bag"](ti), tm["peak"](ti).tanh()), 0.1), 0.05),
                     -0.5, 0.25)
    want = tm["out"](tm["conv"](tf.channel_shuffle(h.view(4, 4, 2, 1), 2)).flatten(1)) + tf.softmin(h[:, :3], 1)
    y = np.array([0, 1, 2, 0])
    loss = tf.cross_entropy(want, torch.tensor(y))
    loss.backward()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=4, input_shape=(5,),
                            input_dtype=ft.int64)
    assert program.backward(ids, y) == pytest.approx(loss.item(), rel=1e-5)
    for name, p in tm.named_parameters():
        np.testing.assert_allclose(dict(model.named_parameters())[name].grad.numpy(), p.grad.numpy(), rtol=1e-4,
                                   atol=1e-6, err_msg=name)
