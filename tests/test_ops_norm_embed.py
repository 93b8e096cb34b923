"""group_norm, embedding and nearest and bilinear 2-d upsampling (forward and backward) against NumPy float64
references and finite differences, the write/add gradient rule, both memory formats, bitwise across thread counts,
bad input, and PyTorch's functional forms when torch imports."""
import numpy as np
import pytest

import fasttrain as ft
from _opref import bits, fd_grad, n, nhwc, t

RNG = np.random.default_rng(11)
F = ft.nn.functional


# ---------------------------------------------------------------- group norm

def gn_ref(x, G, w=None, b=None, eps=1e-5):
    N, C = x.shape[:2]
    g = x.reshape(N, G, -1)
    y = ((g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + eps)).reshape(x.shape)
    shape = (1, C) + (1,) * (x.ndim - 2)
    return y * (1 if w is None else w.reshape(shape)) + (0 if b is None else b.reshape(shape))


GN_CASES = [((3, 6), 3), ((2, 6, 5), 2), ((2, 8, 3, 4), 4), ((2, 4, 3, 3), 1), ((1, 6, 2, 5), 6),
            ((2, 4, 2, 3, 2), 2)]


@pytest.mark.parametrize("shape,G", GN_CASES, ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "nhwc"])
def test_group_norm_forward_backward(shape, G, layout):
    if layout == "nhwc" and len(shape) != 4:
        pytest.skip("channels-last is 4-d")
    mk = nhwc if layout == "nhwc" else t
    C = shape[1]
    x = RNG.standard_normal(shape) * 2 + 3
    w, b = RNG.standard_normal(C), RNG.standard_normal(C)
    out, mean, rstd = ft.ops.group_norm_forward(None, None, None, mk(x), t(w), t(b), G)
    if layout == "nhwc":
        assert out.stride()[1] == 1  # the output keeps the input's memory format
    np.testing.assert_allclose(n(out), gn_ref(x, G, w, b), rtol=1e-4, atol=1e-4)
    g = x.reshape(shape[0], G, -1)
    np.testing.assert_allclose(n(mean), g.mean(-1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(n(rstd), 1 / np.sqrt(g.var(-1) + 1e-5), rtol=1e-4)
    dy = RNG.standard_normal(shape)
    dx, dw, db = ft.ops.group_norm_backward(None, None, None, mk(dy), mk(x), mean, rstd, t(w), G)
    np.testing.assert_allclose(n(dx), fd_grad(lambda v: gn_ref(v, G, w, b), x, dy), rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(n(dw), fd_grad(lambda v: gn_ref(x, G, v, b), w, dy), rtol=1e-3, atol=1e-3)
    axes = (0,) + tuple(range(2, len(shape)))
    np.testing.assert_allclose(n(db), dy.sum(axes), rtol=1e-5, atol=1e-5)


def test_group_norm_without_affine_layouts_agree_and_in_place():
    x, dy = RNG.standard_normal((3, 8, 5, 7)), RNG.standard_normal((3, 8, 5, 7))
    out, mean, rstd = ft.ops.group_norm_forward(None, None, None, t(x), None, None, 4)
    np.testing.assert_allclose(n(out), gn_ref(x, 4), rtol=1e-4, atol=1e-4)
    out_l, mean_l, rstd_l = ft.ops.group_norm_forward(None, None, None, nhwc(x), None, None, 4)
    np.testing.assert_allclose(n(out_l), n(out), rtol=1e-5, atol=1e-5)
    dx = ft.ops.group_norm_backward(None, False, False, t(dy), t(x), mean, rstd, None, 4)[0]
    np.testing.assert_allclose(n(dx), fd_grad(lambda v: gn_ref(v, 4), x, dy), rtol=1e-3, atol=1e-3)
    dx_l = ft.ops.group_norm_backward(None, False, False, nhwc(dy), nhwc(x), mean_l, rstd_l, None, 4)[0]
    np.testing.assert_allclose(n(dx_l), n(dx), rtol=1e-4, atol=1e-5)
    g = t(dy)  # the input gradient written over the output gradient
    ft.ops.group_norm_backward(g, False, False, g, t(x), mean, rstd, None, 4)
    np.testing.assert_array_equal(n(g), n(dx))
    xi = t(x)  # the forward in place
    ft.ops.group_norm_forward(xi, None, None, xi, None, None, 4)
    np.testing.assert_array_equal(n(xi), n(out))


def test_group_norm_gradient_rule():
    x, dy = RNG.standard_normal((2, 6, 4, 4)), RNG.standard_normal((2, 6, 4, 4))
    w, b = t(RNG.standard_normal(6)), t(RNG.standard_normal(6))
    _, mean, rstd = ft.ops.group_norm_forward(None, None, None, t(x), w, b, 3)
    fresh = ft.ops.group_norm_backward(None, None, None, t(dy), t(x), mean, rstd, w, 3)
    start = [RNG.standard_normal(s) for s in ((2, 6, 4, 4), (6,), (6,))]
    held = [t(a) for a in start]
    ft.ops.group_norm_backward(*held, t(dy), t(x), mean, rstd, w, 3, accumulate=True)
    for h, a, f in zip(held, start, fresh):
        np.testing.assert_allclose(n(h), a + n(f), rtol=1e-6, atol=1e-6)
    garbage = [t(np.full(s, np.nan)) for s in ((2, 6, 4, 4), (6,), (6,))]  # written, never read
    ft.ops.group_norm_backward(*garbage, t(dy), t(x), mean, rstd, w, 3)
    for g, f in zip(garbage, fresh):
        np.testing.assert_array_equal(n(g), n(f))
    with pytest.raises(ValueError, match="accumulate=True adds into the gradient tensors given"):
        ft.ops.group_norm_backward(None, None, None, t(dy), t(x), mean, rstd, w, 3, accumulate=True)


def test_group_norm_bad_inputs_write_nothing():
    x = t(RNG.standard_normal((2, 6, 3, 3)))
    out = t(np.full((2, 6, 3, 3), 7.0))
    with pytest.raises(ValueError, match=r"number of channels \(6\) must be divisible by num_groups, got "
                                         r"num_groups=4"):
        ft.ops.group_norm_forward(out, None, None, x, None, None, 4)
    with pytest.raises(ValueError, match="num_groups=0"):
        F.group_norm(x, 0)
    with pytest.raises(TypeError, match="float32"):
        ft.ops.group_norm_forward(None, None, None, x.to(ft.float64), None, None, 3)
    with pytest.raises(ValueError, match="weight must be contiguous with 6 elements"):
        ft.ops.group_norm_forward(out, None, None, x, ft.ones(5), None, 3)
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        ft.ops.group_norm_forward(None, None, None, ft.ones(6), None, None, 3)
    with pytest.raises(ValueError, match="contiguous .* or channels-last"):
        ft.ops.group_norm_forward(None, None, None, x.permute(0, 1, 3, 2), None, None, 3)
    with pytest.raises(ValueError, match="memory layout"):
        ft.ops.group_norm_forward(nhwc(np.zeros((2, 6, 3, 3))), None, None, x, None, None, 3)
    with pytest.raises(ValueError, match="eps must be positive"):
        ft.ops.group_norm_forward(out, None, None, x, None, None, 3, eps=0.0)
    np.testing.assert_array_equal(n(out), 7.0)
    _, mean, rstd = ft.ops.group_norm_forward(None, None, None, x, None, None, 3)
    with pytest.raises(ValueError, match="save_mean must be contiguous with 6 elements"):
        ft.ops.group_norm_backward(None, False, False, x, x, ft.zeros(4), rstd, None, 3)
    # a strided (N, C, L) input is made contiguous by the functional form
    wide = t(RNG.standard_normal((2, 6, 10)))[..., ::2]
    np.testing.assert_allclose(n(F.group_norm(wide, 3)), gn_ref(n(wide), 3), rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- embedding

def ids_tensor(a):
    return ft.from_numpy(np.array(a, dtype=np.int64))


def emb_grad_ref(dy, ids, V, pad=None):
    D = dy.shape[-1]
    g = np.zeros((V, D))
    np.add.at(g, ids.reshape(-1), dy.reshape(-1, D))
    if pad is not None:
        g[pad] = 0
    return g


@pytest.mark.parametrize("ids_shape", [(7,), (3, 5), (2, 3, 4), ()], ids=str)
def test_embedding_forward_backward(ids_shape):
    V, D = 11, 6
    w = RNG.standard_normal((V, D))
    ids = RNG.integers(0, V, ids_shape)
    out = ft.ops.embedding_forward(None, ids_tensor(ids), t(w))
    assert out.shape == ids_shape + (D,)
    np.testing.assert_array_equal(n(out), w.astype(np.float32)[ids])
    dy = RNG.standard_normal(ids_shape + (D,))
    dw = ft.ops.embedding_backward(None, t(dy), ids_tensor(ids), V)
    np.testing.assert_allclose(n(dw), emb_grad_ref(dy, ids, V), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(n(dw), fd_grad(lambda v: v[ids], w, dy), rtol=1e-6, atol=1e-6)


def test_embedding_padding_idx_and_gradient_rule():
    V, D = 9, 20
    w = RNG.standard_normal((V, D))
    ids = np.array([[1, 3, 3, 0], [8, 3, 1, 2]])
    dy = RNG.standard_normal((2, 4, D))
    out = F.embedding(ids_tensor(ids), t(w), padding_idx=3)  # the forward reads the padding row as any
    np.testing.assert_array_equal(n(out), w.astype(np.float32)[ids])
    dw = t(np.full((V, D), np.nan))  # every row written: unreferenced rows and the padding row get 0
    ft.ops.embedding_backward(dw, t(dy), ids_tensor(ids), padding_idx=3)
    np.testing.assert_allclose(n(dw), emb_grad_ref(dy, ids, V, pad=3), rtol=1e-6, atol=1e-6)
    assert (n(dw)[[3, 4, 5, 6, 7]] == 0).all()
    start = RNG.standard_normal((V, D))
    held = t(start)
    ft.ops.embedding_backward(held, t(dy), ids_tensor(ids), padding_idx=-6, accumulate=True)  # -6 is row 3
    want = start + emb_grad_ref(dy, ids, V, pad=3)
    want[3] = start[3]  # the padding row is left as it was
    np.testing.assert_allclose(n(held), want, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="accumulate=True"):
        ft.ops.embedding_backward(None, t(dy), ids_tensor(ids), V, accumulate=True)
    int32 = ft.from_numpy(ids.astype(np.int32))  # the functional form takes int32 ids as PyTorch does
    np.testing.assert_array_equal(n(F.embedding(int32, t(w))), n(out))


def test_embedding_bad_ids_raise_and_write_nothing():
    w = t(RNG.standard_normal((5, 4)))
    out = t(np.full((2, 3, 4), 7.0))
    with pytest.raises(IndexError, match=r"embedding: ids\[1, 2\] = 5 is out of range for a weight of 5 rows"):
        ft.ops.embedding_forward(out, ids_tensor([[0, 1, 2], [3, 4, 5]]), w)
    with pytest.raises(IndexError, match=r"ids\[0, 1\] = -1"):
        ft.ops.embedding_forward(out, ids_tensor([[0, -1, 2], [3, 4, 9]]), w)
    np.testing.assert_array_equal(n(out), 7.0)
    dw = t(np.full((5, 4), 7.0))
    with pytest.raises(IndexError, match=r"embedding_backward: ids\[1, 0\] = 6"):
        ft.ops.embedding_backward(dw, ft.ones(2, 3, 4), ids_tensor([[0, 1, 2], [6, 4, 1]]))
    np.testing.assert_array_equal(n(dw), 7.0)
    with pytest.raises(TypeError, match="ids must be int64, got float32"):
        ft.ops.embedding_forward(None, ft.ones(2, 3), w)
    with pytest.raises(ValueError, match=r"out should have shape \(2, 3, 4\)"):
        ft.ops.embedding_forward(ft.zeros(2, 3, 5), ids_tensor([[0, 1, 2], [3, 4, 0]]), w)
    with pytest.raises(ValueError, match="weight should have 2 dimensions"):
        ft.ops.embedding_forward(None, ids_tensor([1]), ft.ones(5))
    with pytest.raises(ValueError, match="padding_idx must be within the 5 rows"):
        F.embedding(ids_tensor([1]), w, padding_idx=5)
    with pytest.raises(NotImplementedError, match="max_norm"):
        F.embedding(ids_tensor([1]), w, max_norm=1.0)
    with pytest.raises(NotImplementedError, match="sparse"):
        F.embedding(ids_tensor([1]), w, sparse=True)


# ---------------------------------------------------------------- nearest upsampling

@pytest.mark.parametrize("shape, C", [((6,), 4), ((2, 3), 5), ((), 3), ((0,), 2), ((0,), 0)], ids=str)
def test_one_hot_is_rows_of_the_identity(shape, C):
    ids = RNG.integers(0, max(C, 1), shape)
    out = F.one_hot(ids_tensor(ids), C)
    assert out.dtype is ft.int64 and out.shape == (*shape, C)
    np.testing.assert_array_equal(n(out), np.eye(C, dtype=np.int64)[ids])


def test_one_hot_counts_the_classes_and_takes_narrow_integers():
    ids = np.array([[3, 0], [1, 3]])
    np.testing.assert_array_equal(n(F.one_hot(ids_tensor(ids))), np.eye(4, dtype=np.int64)[ids])
    np.testing.assert_array_equal(n(F.one_hot(ft.from_numpy(ids.astype(np.uint8)), 6)), np.eye(6, dtype=np.int64)[ids])


def test_one_hot_bad_input_is_refused_with_its_reason():
    with pytest.raises(IndexError, match=r"one_hot: ids\[1, 0\] = 4 is out of range for 4 classes"):
        F.one_hot(ids_tensor([[0, 1], [4, 2]]), 4)
    with pytest.raises(IndexError, match=r"ids\[1\] = -1"):
        F.one_hot(ids_tensor([2, -1]), 3)
    with pytest.raises(TypeError, match="class indices must be integers, got float32"):
        F.one_hot(ft.ones(3), 3)
    with pytest.raises(ValueError, match="cannot count the classes of an empty tensor"):
        F.one_hot(ids_tensor(np.zeros(0, np.int64)))
    for bad in (-2, 2.0, True, None):
        with pytest.raises(ValueError, match="num_classes must be a number of classes or -1"):
            F.one_hot(ids_tensor([1]), bad)


def up_ref(x, sh, sw):
    return x.repeat(sh, axis=2).repeat(sw, axis=3)


@pytest.mark.parametrize("scale", [(2, 2), (3, 1), (1, 4), (2, 3)], ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "nhwc"])
def test_upsample_nearest2d(scale, layout):
    mk = nhwc if layout == "nhwc" else t
    x = RNG.standard_normal((2, 3, 4, 5))
    out = ft.ops.upsample_nearest2d_forward(None, mk(x), scale)
    if layout == "nhwc":
        assert out.stride()[1] == 1
    np.testing.assert_array_equal(n(out), up_ref(x.astype(np.float32), *scale))
    dy = RNG.standard_normal(out.shape)
    dx = ft.ops.upsample_nearest2d_backward(None, mk(dy), scale)
    np.testing.assert_allclose(n(dx), fd_grad(lambda v: up_ref(v, *scale), x, dy), rtol=1e-5, atol=1e-5)
    start = RNG.standard_normal(x.shape)
    held = mk(start)
    ft.ops.upsample_nearest2d_backward(held, mk(dy), scale, accumulate=True)
    np.testing.assert_allclose(n(held), start + n(dx), rtol=1e-6, atol=1e-6)
    written = mk(np.full(x.shape, np.nan))
    ft.ops.upsample_nearest2d_backward(written, mk(dy), scale)
    np.testing.assert_array_equal(n(written), n(dx))


def test_interpolate_forms_and_bad_input():
    x = t(RNG.standard_normal((1, 2, 3, 4)))
    want = up_ref(n(x), 2, 2)
    np.testing.assert_array_equal(n(F.interpolate(x, scale_factor=2)), want)
    np.testing.assert_array_equal(n(F.interpolate(x, scale_factor=2.0, mode="nearest")), want)
    np.testing.assert_array_equal(n(F.interpolate(x, size=(6, 8))), want)
    strided = t(RNG.standard_normal((1, 2, 3, 8)))[..., ::2]  # any strides
    np.testing.assert_array_equal(n(F.interpolate(strided, scale_factor=(1, 3))), up_ref(n(strided), 1, 3))
    with pytest.raises(NotImplementedError, match="mode='bicubic' is not supported"):
        F.interpolate(x, scale_factor=2, mode="bicubic")
    with pytest.raises(NotImplementedError, match="integer"):
        F.interpolate(x, scale_factor=1.5)
    with pytest.raises(NotImplementedError, match="integer multiple"):
        F.interpolate(x, size=(5, 8))
    with pytest.raises(ValueError, match="exactly one of size and scale_factor"):
        F.interpolate(x)
    with pytest.raises(ValueError, match="positive integers"):
        ft.ops.upsample_nearest2d_forward(None, x, 0)
    out = t(np.full((1, 2, 6, 7), 7.0))
    with pytest.raises(ValueError, match=r"out should have shape \(1, 2, 6, 8\)"):
        ft.ops.upsample_nearest2d_forward(out, x, 2)
    np.testing.assert_array_equal(n(out), 7.0)
    with pytest.raises(ValueError, match="not a multiple of the scale factors"):
        ft.ops.upsample_nearest2d_backward(None, ft.zeros(1, 2, 5, 8), 2)
    with pytest.raises(TypeError, match="float32"):
        ft.ops.upsample_nearest2d_forward(None, x.to(ft.float64), 2)


def lerp_ref(x, P, Q, align_corners=False, scales=(None, None)):
    """Bilinear resampling of (N, C, H, W) to (N, C, P, Q) in float64, written from PyTorch's documented mapping:
    output index p samples input coordinate p (H - 1) / (P - 1) with align_corners, else (p + 0.5) / s - 0.5
    held at 0 (s the scale factor given, or P / H), between its two neighbours (the last repeated at the edge)."""
    def axis(size, out, scale):
        if align_corners:
            src = np.arange(out) * ((size - 1) / (out - 1) if out > 1 else 0.0)
        else:
            src = np.maximum((np.arange(out) + 0.5) * (1.0 / scale if scale else size / out) - 0.5, 0.0)
        i0 = np.minimum(np.floor(src).astype(int), size - 1)
        i1 = np.minimum(i0 + 1, size - 1)
        l1 = np.clip(src - i0, 0.0, 1.0)
        m = np.zeros((out, size))  # the output's rows as weights of the input's
        np.add.at(m, (np.arange(out), i0), 1 - l1)
        np.add.at(m, (np.arange(out), i1), l1)
        return m
    mh, mw = axis(x.shape[2], P, scales[0]), axis(x.shape[3], Q, scales[1])
    return np.einsum("ph,nchw,qw->ncpq", mh, x, mw)


LERP_CASES = [dict(size=(8, 10)), dict(size=(3, 2)), dict(size=(1, 1)), dict(scale_factor=2),
              dict(scale_factor=1.5), dict(scale_factor=(0.5, 2.3))]


@pytest.mark.parametrize("case", LERP_CASES, ids=str)
@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("layout", ["contiguous", "nhwc"])
def test_upsample_bilinear2d(case, align_corners, layout):
    mk = nhwc if layout == "nhwc" else t
    x = RNG.standard_normal((2, 3, 4, 5))
    out = F.interpolate(mk(x), mode="bilinear", align_corners=align_corners, **case)
    P, Q = out.shape[2:]
    f = case.get("scale_factor")
    scales = (None, None) if f is None or align_corners else (f, f) if not isinstance(f, tuple) else f
    if f is not None:
        factors = (f, f) if not isinstance(f, tuple) else f
        assert (P, Q) == (int(4 * factors[0]), int(5 * factors[1]))  # floor(size * scale_factor)
    np.testing.assert_allclose(n(out), lerp_ref(x, P, Q, align_corners, scales), rtol=1e-5, atol=1e-6)
    dy = RNG.standard_normal(tuple(out.shape))
    sh, sw = (0.0, 0.0) if scales[0] is None else (float(scales[0]), float(scales[1]))
    dx = ft.ops.upsample_bilinear2d_backward(None, mk(dy), (4, 5), align_corners, sh, sw)
    np.testing.assert_allclose(n(dx), fd_grad(lambda v: lerp_ref(v, P, Q, align_corners, scales), x, dy),
                               rtol=1e-5, atol=1e-5)
    held = mk(np.ones(x.shape))
    ft.ops.upsample_bilinear2d_backward(held, mk(dy), (4, 5), align_corners, sh, sw, accumulate=True)
    np.testing.assert_allclose(n(held), 1 + n(dx), rtol=1e-6, atol=1e-6)


def test_linear_interpolation_of_sequences_and_bilinear_bad_input():
    x = RNG.standard_normal((2, 3, 6))
    got = F.interpolate(t(x), size=9, mode="linear", align_corners=True)
    np.testing.assert_allclose(n(got), lerp_ref(x[:, :, None], 1, 9, True)[:, :, 0], rtol=1e-5, atol=1e-6)
    assert F.interpolate(t(x), scale_factor=0.5, mode="linear").shape == (2, 3, 3)
    img = t(RNG.standard_normal((1, 2, 3, 4)))
    with pytest.raises(ValueError, match=r"mode='bilinear' takes \(C, H, W\) images, got samples of shape"):
        F.interpolate(t(x), scale_factor=2, mode="bilinear")
    with pytest.raises(ValueError, match=r"mode='linear' takes \(C, L\) sequences"):
        F.interpolate(img, scale_factor=2, mode="linear")
    with pytest.raises(ValueError, match=r"the output size \(0, 1\) .* must be positive"):
        F.interpolate(img, scale_factor=0.25, mode="bilinear")
    with pytest.raises(ValueError, match="scale_factor -2 must be positive"):
        F.interpolate(img, scale_factor=-2, mode="bilinear")
    with pytest.raises(ValueError, match="align_corners can only be set with the interpolating modes"):
        F.interpolate(img, scale_factor=2, align_corners=True)
    with pytest.raises(ValueError, match="the scale factors must be finite, positive and above 1/FLT_MAX"):
        ft.ops.upsample_bilinear2d_forward(None, img, (6, 8), False, -1.0, 0.0)
    with pytest.raises(ValueError, match="the scale factors must be finite, positive and above 1/FLT_MAX"):
        ft.ops.upsample_bilinear2d_forward(None, img, (6, 8), False, 1e-300, 0.0)  # its reciprocal overflows
    with pytest.raises(ValueError, match="out cannot be input itself"):  # it reads neighbours it has written
        ft.ops.upsample_bilinear2d_forward(img, img, (3, 4), False, 1.5, 1.5)
    with pytest.raises(ValueError, match=r"batch and channels \(1, 3\) are not the input's \(1, 2\)"):
        ft.ops.upsample_bilinear2d_forward(ft.zeros(1, 3, 6, 8), img, (6, 8))
    with pytest.raises(ValueError, match="an empty input image cannot be resampled"):
        ft.ops.upsample_bilinear2d_forward(None, ft.zeros(1, 2, 0, 4), (6, 8))
    with pytest.raises(TypeError, match="float32"):
        ft.ops.upsample_bilinear2d_forward(None, img.to(ft.float64), (6, 8))
    bf = F.interpolate(img.to(ft.bfloat16), size=(5, 7), mode="bilinear")  # bfloat16 in float32, rounded once
    assert bf.dtype is ft.bfloat16
    np.testing.assert_array_equal(n(bf.float()), n(F.interpolate(img.to(ft.bfloat16).float(), size=(5, 7),
                                                                  mode="bilinear").to(ft.bfloat16).float()))


# ---------------------------------------------------------------- determinism

@pytest.mark.parametrize("op", ["group_norm", "group_norm_nhwc", "embedding", "upsample", "bilinear"])
def test_bitwise_identical_across_thread_counts(op, threads):
    x = RNG.standard_normal((16, 32, 12, 12)).astype(np.float32)
    w, b = RNG.standard_normal(32).astype(np.float32), RNG.standard_normal(32).astype(np.float32)
    table = RNG.standard_normal((1000, 96)).astype(np.float32)
    ids = RNG.integers(0, 50, (64, 40))  # many repeats: each row sums many positions
    edy = RNG.standard_normal((64, 40, 96)).astype(np.float32)

    def run():
        if op.startswith("group_norm"):
            mk = nhwc if op.endswith("nhwc") else t
            out, m, s = ft.ops.group_norm_forward(None, None, None, mk(x), t(w), t(b), 8)
            grads = ft.ops.group_norm_backward(None, None, None, out, mk(x), m, s, t(w), 8)
            return [bits(out), bits(m), bits(s)] + [bits(g) for g in grads]
        if op == "embedding":
            out = ft.ops.embedding_forward(None, ids_tensor(ids), t(table))
            return [bits(out), bits(ft.ops.embedding_backward(None, t(edy), ids_tensor(ids), 1000))]
        if op == "bilinear":
            out = ft.ops.upsample_bilinear2d_forward(None, t(x), (29, 17), True)
            return [bits(out), bits(ft.ops.upsample_bilinear2d_backward(None, out, (12, 12), True))]
        out = ft.ops.upsample_nearest2d_forward(None, t(x), 2)
        return [bits(out), bits(ft.ops.upsample_nearest2d_backward(None, out, 2))]

    one = (threads(1), run())[1]
    two = (threads(2), run())[1]
    assert one == two


# ---------------------------------------------------------------- PyTorch

def test_against_torch():
    torch = pytest.importorskip("torch")
    TF = torch.nn.functional
    x, w, b = RNG.standard_normal((4, 12, 6, 5)), RNG.standard_normal(12), RNG.standard_normal(12)
    dy = RNG.standard_normal(x.shape)
    for mk, fmt in ((t, torch.contiguous_format), (nhwc, torch.channels_last)):
        tx = torch.tensor(x, dtype=torch.float32).contiguous(memory_format=fmt).requires_grad_()
        tw = torch.tensor(w, dtype=torch.float32, requires_grad=True)
        tb = torch.tensor(b, dtype=torch.float32, requires_grad=True)
        ty = TF.group_norm(tx, 3, tw, tb, 1e-5)
        ty.backward(torch.tensor(dy, dtype=torch.float32))
        out, mean, rstd = ft.ops.group_norm_forward(None, None, None, mk(x), t(w), t(b), 3)
        np.testing.assert_allclose(n(out), ty.detach().numpy(), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(n(F.group_norm(mk(x), 3, t(w), t(b))), ty.detach().numpy(), rtol=1e-5,
                                   atol=1e-5)
        dx, dw, db = ft.ops.group_norm_backward(None, None, None, mk(dy), mk(x), mean, rstd, t(w), 3)
        for got, want in ((dx, tx.grad), (dw, tw.grad), (db, tb.grad)):
            np.testing.assert_allclose(n(got), want.numpy(), rtol=1e-4, atol=1e-4)

    V, D = 30, 8
    table = RNG.standard_normal((V, D))
    ids = RNG.integers(0, V, (5, 7))
    ids[0, :3] = 2
    tt = torch.tensor(table, dtype=torch.float32, requires_grad=True)
    ty = TF.embedding(torch.tensor(ids), tt, padding_idx=2)
    edy = RNG.standard_normal(ty.shape)
    ty.backward(torch.tensor(edy, dtype=torch.float32))
    np.testing.assert_array_equal(n(F.embedding(ids_tensor(ids), t(table), padding_idx=2)), ty.detach().numpy())
    dw = ft.ops.embedding_backward(None, t(edy), ids_tensor(ids), V, padding_idx=2)
    np.testing.assert_allclose(n(dw), tt.grad.numpy(), rtol=1e-5, atol=1e-5)

    ux = RNG.standard_normal((2, 3, 5, 4))
    tux = torch.tensor(ux, dtype=torch.float32, requires_grad=True)
    tuy = TF.interpolate(tux, scale_factor=2, mode="nearest")
    udy = RNG.standard_normal(tuy.shape)
    tuy.backward(torch.tensor(udy, dtype=torch.float32))
    np.testing.assert_array_equal(n(F.interpolate(t(ux), scale_factor=2)), tuy.detach().numpy())
    np.testing.assert_array_equal(n(F.interpolate(t(ux), size=(15, 8))),
                                  TF.interpolate(tux, size=(15, 8), mode="nearest").detach().numpy())
    np.testing.assert_allclose(n(ft.ops.upsample_nearest2d_backward(None, t(udy), 2)), tux.grad.numpy(), rtol=1e-6,
                               atol=1e-6)
    for kw in (dict(scale_factor=2), dict(size=(7, 3)), dict(scale_factor=(1.7, 0.6)),
               dict(scale_factor=2.5, recompute_scale_factor=True)):
        for align_corners in (False, True):
            tux.grad = None
            tuy = TF.interpolate(tux, mode="bilinear", align_corners=align_corners, **kw)
            udy = RNG.standard_normal(tuy.shape)
            tuy.backward(torch.tensor(udy, dtype=torch.float32))
            got = F.interpolate(t(ux), mode="bilinear", align_corners=align_corners, **kw)
            np.testing.assert_allclose(n(got), tuy.detach().numpy(), rtol=1e-6, atol=1e-6)
            f = kw.get("scale_factor", 0.0) if not kw.get("recompute_scale_factor") else 0.0
            sh, sw = f if isinstance(f, tuple) else (f, f)
            dx = ft.ops.upsample_bilinear2d_backward(None, t(udy), (5, 4), align_corners, sh, sw)
            np.testing.assert_allclose(n(dx), tux.grad.numpy(), rtol=1e-5, atol=1e-5)
