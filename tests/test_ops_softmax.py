"""softmax and log_softmax along any dim: forward against NumPy float64, backward against the analytic
gradient and central differences, layouts, in-place use, determinism and bad input."""
import warnings

import numpy as np
import pytest

import fasttrain as ft
from _opref import bits, fd_grad, n, nhwc, strided, t, torch

F = ft.nn.functional
rng = np.random.default_rng(0)


def ref_softmax(x, dim):
    e = np.exp(x - x.max(axis=dim, keepdims=True))
    return e / e.sum(axis=dim, keepdims=True)


def ref_log_softmax(x, dim):
    m = x.max(axis=dim, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=dim, keepdims=True))


CASES = [((5, 7), 1), ((5, 7), 0), ((2, 3, 4), -1), ((2, 3, 4), 1), ((2, 5, 3, 4), 1), ((3, 40), -1), ((6,), 0)]


@pytest.mark.parametrize("shape,dim", CASES)
def test_forward(shape, dim):
    x = rng.normal(0, 3, shape)
    np.testing.assert_allclose(n(F.softmax(t(x), dim)), ref_softmax(x, dim), rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(n(F.log_softmax(t(x), dim)), ref_log_softmax(x, dim), rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("shape,dim", CASES[:5])
def test_backward(shape, dim):
    x, dy = rng.normal(size=shape), rng.normal(size=shape)
    y = ref_softmax(x, dim)
    analytic = y * (dy - (dy * y).sum(axis=dim, keepdims=True))
    np.testing.assert_allclose(analytic, fd_grad(lambda v: ref_softmax(v, dim), x, dy), atol=1e-6)
    out = F.softmax(t(x), dim)
    np.testing.assert_allclose(n(ft.ops.softmax_backward(None, t(dy), out, dim)), analytic, rtol=1e-5, atol=1e-6)
    analytic = dy - np.exp(ref_log_softmax(x, dim)) * dy.sum(axis=dim, keepdims=True)
    np.testing.assert_allclose(analytic, fd_grad(lambda v: ref_log_softmax(v, dim), x, dy), atol=1e-6)
    out = F.log_softmax(t(x), dim)
    np.testing.assert_allclose(n(ft.ops.log_softmax_backward(None, t(dy), out, dim)), analytic, rtol=1e-5,
                               atol=1e-6)


def test_large_values_are_stable_and_special_rows():
    x = np.array([[1000.0, 1001.0, 1002.0], [-1000.0, -1001.0, -1e30], [0.0, -np.inf, 1.0]])
    np.testing.assert_allclose(n(F.softmax(t(x), 1)), ref_softmax(x, 1), rtol=1e-6, atol=1e-30)
    np.testing.assert_allclose(n(F.log_softmax(t(x), 1)), ref_log_softmax(x, 1), rtol=1e-6)
    y = n(F.softmax(t([[-np.inf, -np.inf], [np.nan, 1.0]]), 1))
    assert np.isnan(y).all()


@pytest.mark.parametrize("make", [nhwc, strided])
def test_layouts_are_bitwise_equal(make):
    x, dy = rng.normal(size=(2, 6, 5, 3)), rng.normal(size=(2, 6, 5, 3))
    for dim in (1, 3, 0):
        for fwd, bwd in ((ft.ops.softmax_forward, ft.ops.softmax_backward),
                         (ft.ops.log_softmax_forward, ft.ops.log_softmax_backward)):
            want = fwd(None, t(x), dim)
            got = fwd(None, make(x), dim)
            assert bits(got.contiguous()) == bits(want)
            want_g = bwd(None, t(dy), want, dim)
            got_g = bwd(make(np.zeros(x.shape)), make(dy), got, dim)
            assert bits(got_g.contiguous()) == bits(want_g)


def test_in_place_accumulate_bfloat16():
    x, dy = rng.normal(size=(4, 9)), rng.normal(size=(4, 9))
    xt = t(x)
    assert ft.ops.softmax_forward(xt, xt, 1) is xt
    np.testing.assert_allclose(n(xt), ref_softmax(x, 1), rtol=2e-6)
    g0 = rng.normal(size=x.shape).astype(np.float32)
    g = t(g0)
    ft.ops.log_softmax_backward(g, t(dy), F.log_softmax(t(x), 1), 1, accumulate=True)
    want = g0 + dy - ref_softmax(x, 1) * dy.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(n(g), want, rtol=1e-5, atol=1e-6)
    d = t(dy)  # the gradient over dout itself
    ft.ops.softmax_backward(d, d, F.softmax(t(x), 1), 1)
    y = ref_softmax(x, 1)
    np.testing.assert_allclose(n(d), y * (dy - (dy * y).sum(1, keepdims=True)), rtol=1e-5, atol=1e-6)
    xb = t(x).bfloat16()
    yb = F.softmax(xb, 1)
    assert yb.dtype is ft.bfloat16
    np.testing.assert_allclose(n(yb), ref_softmax(n(xb), 1), rtol=1e-2, atol=1e-3)
    out = ft.empty(4, 9)
    ft.ops.log_softmax_forward(out, xb, 1)
    np.testing.assert_allclose(n(out), ref_log_softmax(n(xb), 1), rtol=1e-5, atol=1e-5)


def test_implicit_dim_warns_like_torch():
    x = t(rng.normal(size=(3, 4)))
    with pytest.warns(UserWarning, match="Implicit dimension"):
        y = F.softmax(x)
    np.testing.assert_allclose(n(y), ref_softmax(n(x), 1), rtol=2e-6)


def _softmax_through_a_helper(fn, x, stacklevel):
    return fn(x, _stacklevel=stacklevel)


@pytest.mark.parametrize("fn", [F.softmax, F.log_softmax])
def test_implicit_dim_warning_follows_stacklevel(fn):
    """_stacklevel, as in torch: 3 (the default) names softmax's caller, 2 softmax itself."""
    x = t(rng.normal(size=(3, 4)))
    helper = _softmax_through_a_helper.__code__
    for stacklevel in (3, 2):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _softmax_through_a_helper(fn, x, stacklevel)
        assert len(caught) == 1 and "Implicit dimension" in str(caught[0].message)
        if stacklevel == 3:
            assert (caught[0].filename, caught[0].lineno) == (helper.co_filename, helper.co_firstlineno + 1)
        else:
            assert caught[0].filename == F.__file__


def test_deterministic_across_thread_counts(threads):
    x = t(rng.normal(size=(256, 1000)))
    x4 = t(rng.normal(size=(16, 21, 32, 32)))
    res = []
    for nt in (1, 2):
        threads(nt)
        y = F.softmax(x, 1)
        ly = F.log_softmax(x4, 1)
        res.append((bits(y), bits(ly), bits(ft.ops.softmax_backward(None, x, y, 1)),
                    bits(ft.ops.log_softmax_backward(None, x4, ly, 1))))
    assert res[0] == res[1]


def test_empty_and_scalar():
    assert F.softmax(ft.zeros(0, 5), 1).shape == (0, 5)
    assert F.log_softmax(ft.zeros(3, 0), 1).shape == (3, 0)
    assert n(F.softmax(ft.tensor(2.5), 0)) == 1.0
    assert ft.ops.softmax_backward(None, ft.zeros(0, 5), ft.zeros(0, 5), 1).shape == (0, 5)


def test_bad_input():
    x = ft.zeros(2, 3)
    with pytest.raises(IndexError, match="softmax: dim 2 is out of range for a 2-d tensor"):
        F.softmax(x, 2)
    with pytest.raises(IndexError, match="log_softmax: dim -3 is out of range"):
        F.log_softmax(x, -3)
    with pytest.raises(TypeError, match="softmax: input must be a floating point tensor, got int64"):
        F.softmax(ft.zeros(2, 3, dtype=ft.int64), 1)
    with pytest.raises(ValueError, match=r"softmax_backward: out should have shape \(2, 3\), got \(3, 2\)"):
        ft.ops.softmax_backward(None, x, ft.zeros(3, 2), 1)
    with pytest.raises(ValueError, match=r"log_softmax: out should have shape \(2, 3\), got \(2, 4\)"):
        ft.ops.log_softmax_forward(ft.zeros(2, 4), x, 1)


@pytest.mark.skipif(torch is None, reason="torch is not installed")
def test_against_torch():
    for shape, dim in CASES:
        x = rng.normal(0, 2, shape).astype(np.float32)
        dy = rng.normal(size=shape).astype(np.float32)
        for fn, fwd, bwd in ((torch.softmax, ft.ops.softmax_forward, ft.ops.softmax_backward),
                             (torch.log_softmax, ft.ops.log_softmax_forward, ft.ops.log_softmax_backward)):
            xt = torch.tensor(x, requires_grad=True)
            y = fn(xt, dim)
            y.backward(torch.tensor(dy))
            out = fwd(None, t(x), dim)
            np.testing.assert_allclose(n(out), y.detach().numpy(), rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(n(bwd(None, t(dy), out, dim)), xt.grad.numpy(), rtol=1e-5, atol=1e-5)
