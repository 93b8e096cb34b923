"""add (+ fused activation), mul and concat: forward against NumPy, backward against the analytic gradient
and central differences, fused vs unfused, layouts, accumulation, determinism and bad input."""
import numpy as np
import pytest

import fasttrain as ft
from _opref import bits, fd_grad, n, nhwc, strided, t, torch

F = ft.nn.functional
rng = np.random.default_rng(0)


def relu(x):
    return np.maximum(x, 0)


def sig(x):
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def test_add_forward_and_fused_activations():
    a, b = rng.normal(size=(3, 4, 5)), rng.normal(size=(3, 4, 5))
    s = (a.astype(np.float32) + b.astype(np.float32)).astype(np.float64)
    np.testing.assert_array_equal(n(ft.ops.add_forward(None, t(a), t(b))), s)
    np.testing.assert_array_equal(n(F.add(t(a), t(b), "relu")), relu(s))
    np.testing.assert_allclose(n(ft.ops.add_forward(None, t(a), t(b), "sigmoid")), sig(s), rtol=1e-6)
    np.testing.assert_allclose(n(ft.ops.add_forward(None, t(a), t(b), "leaky_relu", 0.1)),
                               np.where(s > 0, s, 0.1 * s), rtol=1e-6)


@pytest.mark.parametrize("act", ["identity", "relu", "gelu", "silu", "tanh", "leaky_relu"])
def test_fused_add_act_equals_add_then_act(act):
    a, b = rng.normal(size=(2, 8, 33)), rng.normal(size=(2, 8, 33))
    dy = rng.normal(size=a.shape)
    fused = ft.ops.add_forward(None, t(a), t(b), act, 0.2)
    plain = ft.ops.activation_forward(None, ft.ops.add_forward(None, t(a), t(b)), act, 0.2)
    assert bits(fused) == bits(plain)
    s = ft.ops.add_forward(None, t(a), t(b))
    ds = ft.ops.activation_backward(None, t(dy), s, plain, act, 0.2)
    for saved in ({"a": t(a), "b": t(b)}, {"out": fused}):
        if "out" in saved and act in ("gelu", "silu"):
            continue  # their derivative needs the input: the binding recomputes a + b
        da, db = ft.ops.add_backward(None, None, t(dy), act=act, alpha=0.2, **saved)
        assert bits(da) == bits(ds) and bits(db) == bits(ds)


def test_add_relu_backward_analytic_and_fd():
    a, b = rng.normal(size=(4, 5)), rng.normal(size=(4, 5))
    dy = rng.normal(size=a.shape)
    analytic = dy * (a + b > 0)
    np.testing.assert_allclose(analytic, fd_grad(lambda v: relu(v + b), a, dy), atol=1e-6)
    np.testing.assert_allclose(analytic, fd_grad(lambda v: relu(a + v), b, dy), atol=1e-6)
    da, db = ft.ops.add_backward(None, None, t(dy), t(a), t(b), None, "relu")
    np.testing.assert_allclose(n(da), analytic, atol=1e-6)
    np.testing.assert_allclose(n(db), analytic, atol=1e-6)


def test_add_backward_accumulate_skip_and_in_place():
    dy = rng.normal(size=(3, 7)).astype(np.float32)
    g = rng.normal(size=(3, 7)).astype(np.float32)
    ga = t(g)
    da, db = ft.ops.add_backward(ga, False, t(dy), accumulate_a=True)
    assert da is ga and db is None
    np.testing.assert_allclose(n(ga), g + dy, rtol=1e-6)
    # the residual's gradient flows through: da may be dout itself
    d = t(dy)
    da, db = ft.ops.add_backward(d, None, d)
    assert da is d
    np.testing.assert_array_equal(n(da), dy)
    np.testing.assert_array_equal(n(db), dy)


def test_mul_forward_backward():
    a, b = rng.normal(size=(3, 6)), rng.normal(size=(3, 6))
    dy = rng.normal(size=a.shape)
    np.testing.assert_allclose(n(F.mul(t(a), t(b))), a * b, rtol=1e-6)
    np.testing.assert_allclose(dy * b, fd_grad(lambda v: v * b, a, dy), atol=1e-6)
    np.testing.assert_allclose(dy * a, fd_grad(lambda v: a * v, b, dy), atol=1e-6)
    da, db = ft.ops.mul_backward(None, None, t(dy), t(a), t(b))
    np.testing.assert_allclose(n(da), dy * b, rtol=1e-6)
    np.testing.assert_allclose(n(db), dy * a, rtol=1e-6)
    # in place over the saved inputs: da over a, db over b
    at, bt = t(a), t(b)
    ft.ops.mul_backward(at, bt, t(dy), at, bt)
    np.testing.assert_allclose(n(at), dy * b, rtol=1e-6)
    np.testing.assert_allclose(n(bt), dy * a, rtol=1e-6)
    g = rng.normal(size=a.shape).astype(np.float32)
    gb = t(g)
    assert ft.ops.mul_backward(False, gb, t(dy), t(a), None, accumulate_b=True) == (None, gb)
    np.testing.assert_allclose(n(gb), g + dy * a, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("make", [nhwc, strided])
def test_layouts_agree(make):
    a, b = rng.normal(size=(2, 5, 3, 4)), rng.normal(size=(2, 5, 3, 4))
    want = n(ft.ops.add_forward(None, t(a), t(b), "relu"))
    got = ft.ops.add_forward(None, make(a), make(b), "relu")
    np.testing.assert_array_equal(n(got), want)
    mixed = ft.ops.add_forward(None, nhwc(a), t(b), "relu")  # different layouts in one op
    np.testing.assert_array_equal(n(mixed), want)
    np.testing.assert_array_equal(n(ft.ops.mul_forward(None, make(a), make(b))), n(F.mul(t(a), t(b))))


def test_bfloat16_add():
    a, b = rng.normal(size=(4, 9)), rng.normal(size=(4, 9))
    ab, bb = t(a).bfloat16(), t(b).bfloat16()
    y = F.add(ab, bb, "relu")
    assert y.dtype is ft.bfloat16
    np.testing.assert_allclose(n(y), relu(n(ab) + n(bb)), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("dim", [1, -3, 0, 3])
def test_concat_and_split_backward(dim):
    parts = [rng.normal(size=(2, c, 3, 4)) for c in (1, 3, 2)]
    parts = [p.transpose(*{1: (0, 1, 2, 3), -3: (0, 1, 2, 3), 0: (1, 0, 2, 3), 3: (0, 2, 3, 1)}[dim])
             for p in parts]
    want = np.concatenate(parts, axis=dim)
    y = F.cat([t(p) for p in parts], dim)
    np.testing.assert_array_equal(n(y), want.astype(np.float32))
    sizes = [p.shape[dim] for p in parts]
    dy = rng.normal(size=want.shape)
    grads = ft.ops.concat_backward(None, t(dy), sizes, dim)
    for g, want_g in zip(grads, np.split(dy, np.cumsum(sizes)[:-1], axis=dim)):
        np.testing.assert_array_equal(n(g), want_g.astype(np.float32))


def test_concat_nhwc_and_backward_modes():
    parts = [rng.normal(size=(2, c, 3, 3)) for c in (4, 2)]
    want = np.concatenate(parts, axis=1).astype(np.float32)
    y = ft.ops.concat_forward(None, [nhwc(p) for p in parts])
    assert y.stride()[1] == 1  # channels_last in, channels_last out
    np.testing.assert_array_equal(n(y), want)
    out = nhwc(np.zeros_like(want))
    ft.ops.concat_forward(out, [t(parts[0]), nhwc(parts[1])], 1)
    np.testing.assert_array_equal(n(out), want)
    # an input that already is its slice of out is not copied (DenseNet-style buffers)
    buf = t(np.zeros_like(want))
    first = buf[:, 0:4]
    first.copy_(t(parts[0]))
    ft.ops.concat_forward(buf, [first, t(parts[1])], 1)
    np.testing.assert_array_equal(n(buf), want)
    # backward: skip a part, accumulate into another
    dy = rng.normal(size=want.shape).astype(np.float32)
    g1 = rng.normal(size=(2, 2, 3, 3)).astype(np.float32)
    g1t = t(g1)
    got = ft.ops.concat_backward([False, g1t], nhwc(dy), [4, 2], 1, accumulate=True)
    assert got[0] is None and got[1] is g1t
    np.testing.assert_allclose(n(g1t), g1 + dy[:, 4:], rtol=1e-6)


def test_deterministic_across_thread_counts(threads):
    a, b = t(rng.normal(size=(64, 40000))), t(rng.normal(size=(64, 40000)))
    dy = t(rng.normal(size=(64, 40000)))
    res = []
    for nt in (1, 2):
        threads(nt)
        res.append((bits(F.add(a, b, "gelu")), *map(bits, ft.ops.add_backward(None, None, dy, a, b, None, "gelu")),
                    *map(bits, ft.ops.mul_backward(None, None, dy, a, b)), bits(F.cat([a, b], 1))))
    assert res[0] == res[1]


def test_empty():
    z = ft.zeros(0, 3)
    assert F.add(z, z, "relu").shape == (0, 3) and F.mul(z, z).shape == (0, 3)
    assert F.cat([z, ft.zeros(0, 2)], 1).shape == (0, 5)
    assert ft.ops.add_backward(None, None, z)[0].shape == (0, 3)
    assert [g.shape for g in ft.ops.concat_backward(None, ft.zeros(2, 0), [0, 0], 1)] == [(2, 0), (2, 0)]


def test_bad_input():
    a = ft.zeros(2, 3)
    with pytest.raises(ValueError, match=r"add: b should have shape \(2, 3\), got \(3, 2\)"):
        F.add(a, ft.zeros(3, 2))
    with pytest.raises(TypeError, match="add: b must be float32 or bfloat16 \\(or float16 on CUDA\\), got int32"):
        F.add(a, ft.zeros(2, 3, dtype=ft.int32))
    with pytest.raises(ValueError, match="mul_backward: da needs b"):
        ft.ops.mul_backward(None, False, a, a, None)
    with pytest.raises(ValueError, match="add_backward: the derivative of gelu needs the inputs a and b"):
        ft.ops.add_backward(None, None, a, None, None, a, "gelu")
    with pytest.raises(ValueError, match="da and db must not share memory"):
        ft.ops.add_backward(a, a, ft.zeros(2, 3))
    with pytest.raises(ValueError, match=r"concat: inputs\[1\] should have shape \(2, 4\), got \(3, 4\)"):
        ft.ops.concat_forward(ft.zeros(2, 7), [a, ft.zeros(3, 4)], 1)
    with pytest.raises(ValueError, match="concat: out has size 7 along dim 1 but the inputs add up to 6"):
        ft.ops.concat_forward(ft.zeros(2, 7), [a, a], 1)
    with pytest.raises(IndexError, match="dim 5 is out of range"):
        F.cat([a, a], 5)
    with pytest.raises(ValueError, match="concat_backward: dout has size 3 along dim 1 but the sizes add up to 4"):
        ft.ops.concat_backward(None, a, [2, 2], 1)
    with pytest.raises(ValueError, match="concat_backward: sizes"):
        ft.ops.concat_backward(None, a, [4, -1], 1)
    buf = ft.zeros(2, 6)
    with pytest.raises(ValueError, match="partly overlaps"):
        ft.ops.concat_forward(buf, [a, buf[:, 1:4]], 1)


@pytest.mark.skipif(torch is None, reason="torch is not installed")
def test_against_torch():
    a, b = rng.normal(size=(3, 4, 5, 6)).astype(np.float32), rng.normal(size=(3, 4, 5, 6)).astype(np.float32)
    ta, tb = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
    y = torch.relu(ta + tb) * tb
    dy = rng.normal(size=y.shape).astype(np.float32)
    y.backward(torch.tensor(dy))
    s = F.add(t(a), t(b), "relu")
    got_y = F.mul(s, t(b))
    np.testing.assert_allclose(n(got_y), y.detach().numpy(), rtol=1e-6)
    ds, db2 = ft.ops.mul_backward(None, None, t(dy), s, t(b))
    da, db = ft.ops.add_backward(None, db2, ds, out=s, act="relu", accumulate_b=True)
    np.testing.assert_allclose(n(da), ta.grad.numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(n(db), tb.grad.numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(n(F.cat([t(a), t(b)], 1)), torch.cat([ta, tb], 1).detach().numpy())
