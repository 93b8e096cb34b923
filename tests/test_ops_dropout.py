"""Dropout: the mask is Philox4x32-10 of (seed, offset + i / 4), checked against an independent NumPy Philox,
regenerated exactly by backward, the same for any layout and thread count."""
import numpy as np
import pytest

import fasttrain as ft
from _opref import bits, n, nhwc, strided, t

F = ft.nn.functional


def philox_words(seed, first_block, nblocks):
    """The 4 * nblocks 32-bit words of Philox4x32-10 blocks first_block.. under key `seed`, stream 0."""
    m = np.uint64(0xFFFFFFFF)
    idx = np.arange(first_block, first_block + nblocks, dtype=np.uint64)
    c = np.stack([idx & m, idx >> np.uint64(32), np.zeros_like(idx), np.zeros_like(idx)], axis=1)
    k0, k1 = np.uint64(seed & 0xFFFFFFFF), np.uint64(seed >> 32)
    for _ in range(10):
        p0, p1 = c[:, 0] * np.uint64(0xD2511F53), c[:, 2] * np.uint64(0xCD9E8D57)
        c = np.stack([(p1 >> np.uint64(32)) ^ c[:, 1] ^ k0, p1 & m, (p0 >> np.uint64(32)) ^ c[:, 3] ^ k1, p0 & m],
                     axis=1)
        k0, k1 = (k0 + np.uint64(0x9E3779B9)) & m, (k1 + np.uint64(0xBB67AE85)) & m
    return c.astype(np.uint32).reshape(-1)


def reference(x, p, seed, offset):
    words = philox_words(seed, offset, (x.size + 3) // 4)[:x.size].reshape(x.shape)
    keep = (words >> 8).astype(np.float64) / 2.0 ** 24 >= p
    scale = np.float32(1.0 / (1.0 - p)) if p < 1 else np.float32(0)
    return np.where(keep, x.astype(np.float32) * scale, np.float32(0) * x.astype(np.float32)), keep


def test_reference_philox_matches_random123():
    # Random123's known-answer vector for a zero counter and key
    assert philox_words(0, 0, 1).tolist() == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]


@pytest.mark.parametrize("shape,p,seed,offset", [((7, 13), 0.5, 1, 0), ((3, 5, 4, 2), 0.1, 2 ** 40 + 3, 17),
                                                   ((1001,), 0.9, 12345, 2 ** 33 + 5)])
def test_forward_backward_match_reference(shape, p, seed, offset):
    rng = np.random.default_rng(0)
    x, dy = rng.normal(size=shape), rng.normal(size=shape)
    want, keep = reference(x, p, seed, offset)
    got = ft.ops.dropout_forward(None, t(x), p, seed, offset)
    np.testing.assert_array_equal(n(got), want)
    dx = ft.ops.dropout_backward(None, t(dy), p, seed, offset)
    np.testing.assert_array_equal(n(dx), reference(dy, p, seed, offset)[0])
    # the gradient is the mask times the scale: analytic, and exact finite differences of a linear map
    np.testing.assert_allclose(n(dx), dy * keep / (1 - p), rtol=1e-6)


def test_mask_is_the_generators_uniform_draw():
    g = ft.Generator().manual_seed(77)
    u = n(ft.rand(6, 11, generator=g))
    x = np.ones((6, 11))
    got = n(ft.ops.dropout_forward(None, t(x), 0.3, 77, 0))
    np.testing.assert_array_equal(got != 0, u >= 0.3)
    # the draw advanced g by the number of blocks dropout_blocks reports
    assert g._offset == ft.ops.dropout_blocks(66) == 17 and ft.ops.dropout_blocks(0) == 0


@pytest.mark.parametrize("make", [nhwc, strided])
def test_layout_does_not_change_the_mask(make):
    x = np.random.default_rng(1).normal(size=(2, 6, 5, 3))
    want = n(ft.ops.dropout_forward(None, t(x), 0.4, 9, 3))
    got = ft.ops.dropout_forward(None, make(x), 0.4, 9, 3)
    np.testing.assert_array_equal(n(got), want)
    out = make(np.zeros_like(x))
    ft.ops.dropout_backward(out, make(x), 0.4, 9, 3)
    np.testing.assert_array_equal(n(out), want)


def test_in_place_accumulate_and_bfloat16():
    x = np.random.default_rng(2).normal(size=(4, 9)).astype(np.float32)
    want = reference(x, 0.25, 5, 0)[0]
    xt = t(x)
    assert ft.ops.dropout_forward(xt, xt, 0.25, 5, 0) is xt
    np.testing.assert_array_equal(n(xt), want)
    g = t(np.ones((4, 9)))
    ft.ops.dropout_backward(g, t(x), 0.25, 5, 0, accumulate=True)
    np.testing.assert_allclose(n(g), 1 + want, rtol=1e-6)
    xb = t(x).bfloat16()
    yb = ft.ops.dropout_forward(None, xb, 0.25, 5, 0)
    assert yb.dtype is ft.bfloat16
    np.testing.assert_allclose(n(yb), reference(n(xb), 0.25, 5, 0)[0], rtol=1e-2)


def test_p_zero_one_and_eval():
    x = t(np.random.default_rng(3).normal(size=(5, 5)))
    np.testing.assert_array_equal(n(ft.ops.dropout_forward(None, x, 0.0, 1, 0)), n(x))
    np.testing.assert_array_equal(n(ft.ops.dropout_forward(None, x, 1.0, 1, 0)), np.zeros((5, 5)))
    assert F.dropout(x, 0.5, training=False) is x
    assert F.dropout(x, 0.0) is x
    y = F.dropout(x, 0.5, inplace=False)
    assert y is not x and y.shape == x.shape


def test_functional_uses_and_advances_the_default_generator():
    x = t(np.ones((40, 50)))
    ft.manual_seed(123)
    a, b = n(F.dropout(x, 0.5)), n(F.dropout(x, 0.5))
    assert not np.array_equal(a, b)
    ft.manual_seed(123)
    np.testing.assert_array_equal(n(F.dropout(x, 0.5)), a)
    assert abs((a == 0).mean() - 0.5) < 0.05 and set(np.unique(a)) <= {0.0, 2.0}
    g = ft.Generator().manual_seed(4)
    c = n(F.dropout(x, 0.5, generator=g))
    np.testing.assert_array_equal(c, n(ft.ops.dropout_forward(None, x, 0.5, 4, 0)))


def test_deterministic_across_thread_counts(threads):
    x = t(np.random.default_rng(4).normal(size=(512, 1000)))
    res = []
    for nt in (1, 2):
        threads(nt)
        res.append((bits(ft.ops.dropout_forward(None, x, 0.3, 99, 7)),
                    bits(ft.ops.dropout_forward(None, nhwc(n(x).reshape(8, 64, 50, 20)), 0.3, 99, 7))))
    assert res[0] == res[1]
    assert res[0][0] == np.ascontiguousarray(n(ft.ops.dropout_forward(None, t(n(x).reshape(8, 64, 50, 20)), 0.3, 99,
                                                                          7)).astype(np.float32)).tobytes()


@pytest.mark.parametrize("make", [t, nhwc])
def test_channel_dropout_keeps_or_drops_each_channel_with_one_draw(make):
    """span = H W: channel j of the (N C) channels in C order has the draw u_j, whatever the layout."""
    x = np.random.default_rng(5).normal(size=(3, 8, 4, 5))

    def keep(offset):
        words = philox_words(21, offset, (24 + 3) // 4)[:24]
        return np.repeat((words >> 8).astype(np.float64) / 2.0 ** 24 >= 0.4, 20).reshape(x.shape)
    want = np.where(keep(6), x.astype(np.float32) * np.float32(1 / 0.6), np.float32(0))
    np.testing.assert_array_equal(n(ft.ops.dropout_forward(None, make(x), 0.4, 21, 6, span=20)), want)
    np.testing.assert_array_equal(n(ft.ops.dropout_backward(None, make(x), 0.4, 21, 6, span=20)), want)
    ft.manual_seed(21)
    g = ft.random.default_generator
    before = g._offset
    np.testing.assert_array_equal(n(F.dropout2d(make(x), 0.4)) != 0, keep(before))
    assert g._offset - before == ft.ops.dropout_blocks(24)  # one draw per channel
    y = n(F.dropout1d(t(x[0, :, 0]), 0.5))  # (C, L): a row each
    assert np.all((y == 0).all(1) | (y != 0).all(1)) and 0 < (y == 0).mean() < 1
    with pytest.warns(UserWarning, match="Received a 3D input to dropout2d"):
        y = n(F.dropout2d(t(x[:, :, 0]), 0.5))  # read as (N, C, L), as PyTorch does
    assert np.all((y == 0) == (y[:, :, :1] == 0))


def test_empty_and_bad_input():
    assert ft.ops.dropout_forward(None, ft.zeros(0, 4), 0.5, 1, 0).shape == (0, 4)
    for p in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="dropout probability has to be between 0 and 1"):
            ft.ops.dropout_forward(None, ft.zeros(3), p, 1, 0)
    with pytest.raises(ValueError, match="dropout probability"):
        F.dropout(ft.zeros(3), 2.0)
    with pytest.raises(TypeError, match="dropout: inp must be float32 or bfloat16 \\(or float16 on CUDA\\), got int64"):
        ft.ops.dropout_forward(None, ft.zeros(3, dtype=ft.int64), 0.5, 1, 0)
    with pytest.raises(ValueError, match=r"dropout_backward: dinp should have shape \(3,\), got \(4,\)"):
        ft.ops.dropout_backward(ft.zeros(4), ft.zeros(3), 0.5, 1, 0)
    with pytest.raises(ValueError, match="dropout: span must be at least 1, got 0"):
        ft.ops.dropout_forward(None, ft.zeros(3), 0.5, 1, 0, span=0)
    with pytest.raises(ValueError, match=r"dropout2d: expected a 3-d \(unbatched\) or 4-d \(batched\) input, got 2-d"):
        F.dropout2d(ft.zeros(3, 4))
    with pytest.raises(ValueError, match="Dropout1d takes samples of 2 dimensions"):
        ft.nn.Sequential(ft.nn.Dropout1d()).compile(ft.optim.SGD([ft.nn.Parameter(ft.zeros(1))], lr=0.1),
                                                    ft.nn.MSELoss(), batch_size=2, input_shape=(3, 4, 5))


def test_compiled_dropout2d_drops_whole_channels_in_forward_and_backward():
    """One sample, out = w . dropout2d(x), loss out^2: the gradient dL/dw = 2 out keep x / (1 - p) shows the mask,
    which must be whole channels, fresh each step, and the one the forward used (out recomputed from it)."""
    C, H, W, p = 16, 3, 4, 0.5
    x = np.random.default_rng(6).uniform(0.5, 1.5, (1, C, H, W)).astype(np.float32)
    ft.manual_seed(7)
    model = ft.nn.Sequential(ft.nn.Dropout2d(p), ft.nn.Flatten(), ft.nn.Linear(C * H * W, 1, bias=False))
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.0), ft.nn.MSELoss(), batch_size=1,
                            input_shape=(C, H, W))
    w = model[2].weight.numpy().reshape(C, H, W).astype(np.float64)
    dropped, masks = [], set()
    for _ in range(20):
        loss = program.train_step(x, np.zeros((1, 1), np.float32))
        ratio = model[2].weight.grad.numpy().reshape(C, H, W) / x[0]
        kept = ratio[:, 0, 0] != 0
        assert np.all((ratio != 0) == kept[:, None, None])  # whole channels
        out = (w * x[0] * kept[:, None, None]).sum() / (1 - p)
        assert loss == pytest.approx(out * out, rel=1e-5)
        np.testing.assert_allclose(ratio[kept], 2 * out / (1 - p), rtol=1e-4)
        dropped.append(1 - kept.mean())
        masks.add(kept.tobytes())
    assert len(masks) > 15 and abs(np.mean(dropped) - p) < 0.1
    np.testing.assert_allclose(program.predict(x).numpy(), [[(w * x[0]).sum()]], rtol=1e-5)  # eval: no dropout


def test_p_one_drops_everything_in_compiled_layers():
    """Dropout(1.0), an RNN's dropout=1.0 and attention's dropout_p=1.0 are PyTorch's: every value dropped (they were
    refused). With the hidden layer's output dropped whole, the loss sees only the last bias: its gradient is
    softmax(b) - onehot, and nothing reaches the layers before."""
    x = np.random.default_rng(8).standard_normal((4, 3, 6)).astype(np.float32)
    y = np.arange(4) % 3

    class M(ft.nn.Module):
        def __init__(self):
            super().__init__()
            self.att = ft.nn.MultiheadAttention(6, 2, dropout=1.0, batch_first=True)
            self.gru = ft.nn.GRU(6, 5, num_layers=2, dropout=1.0, batch_first=True)
            self.drop, self.out = ft.nn.Dropout(1.0), ft.nn.Linear(5, 3)

        def forward(self, v):
            a, _ = self.att(v, v, v)
            o, _ = self.gru(v + a)
            return self.out(self.drop(o[:, -1]))

    model = M()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), ft.nn.CrossEntropyLoss(), batch_size=4,
                            input_shape=(3, 6))
    b = model.out.bias.numpy().astype(np.float64)
    loss = program.backward(x, y)
    logp = b - np.log(np.exp(b).sum())
    assert loss == pytest.approx(-logp[y].mean(), rel=1e-6)
    np.testing.assert_allclose(model.out.bias.grad.numpy(), np.exp(logp) - np.bincount(y, minlength=3) / 4,
                               rtol=1e-5, atol=1e-7)
    for name, p in model.named_parameters():
        if name != "out.bias":
            assert not p.grad.numpy().any(), name
    assert program.predict(x).numpy().std(0).max() > 0  # eval mode drops nothing
    with pytest.raises(ValueError, match=r"dropout probability has to be between 0 and 1, but got 1.5"):
        ft.nn.Dropout(1.5)
    with pytest.raises(ValueError, match=r"GRU: dropout must be in \[0, 1\], got -0.5"):
        ft.nn.GRU(6, 5, dropout=-0.5)
