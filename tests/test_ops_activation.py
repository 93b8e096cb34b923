"""Activations (relu, leaky_relu, gelu erf/tanh, silu, sigmoid, tanh): forward against NumPy float64,
backward against the analytic derivative and central differences, in-place use, strides, bfloat16,
thread-count determinism and bad input."""
import math

import numpy as np
import pytest

import fasttrain as ft
from _opref import bits, fd_grad, n, nhwc, strided, t, torch

F = ft.nn.functional
erfc = np.vectorize(math.erfc)
SQRT2PI = math.sqrt(2 * math.pi)


def sig(x):
    e = np.exp(-np.abs(x))  # overflow-free and relatively accurate in both tails
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


# name: (reference, derivative, parameter)
ACTS = {
    "relu": (lambda x, a: np.maximum(x, 0), lambda x, a: (x > 0).astype(float)),
    "leaky_relu": (lambda x, a: np.where(x > 0, x, a * x), lambda x, a: np.where(x > 0, 1.0, a)),
    "gelu": (lambda x, a: 0.5 * x * erfc(-x / math.sqrt(2)),
             lambda x, a: 0.5 * erfc(-x / math.sqrt(2)) + x * np.exp(-x * x / 2) / SQRT2PI),
    "gelu_tanh": (lambda x, a: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))),
                  lambda x, a: (lambda u: 0.5 * (1 + u) + 0.5 * x * (1 - u * u) * math.sqrt(2 / math.pi)
                                * (1 + 3 * 0.044715 * x * x))(
                      np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))),
    "silu": (lambda x, a: x * sig(x), lambda x, a: sig(x) * (1 + x * (1 - sig(x)))),
    "sigmoid": (lambda x, a: sig(x), lambda x, a: sig(x) * (1 - sig(x))),
    "tanh": (lambda x, a: np.tanh(x), lambda x, a: 1 - np.tanh(x) ** 2),
}
FROM_OUTPUT = {"relu", "leaky_relu", "sigmoid", "tanh"}
ALPHA = 0.07


def sample(shape, seed=0, scale=3.0):
    x = np.random.default_rng(seed).normal(0, scale, shape)
    x[np.abs(x) < 1e-3] = 0.5  # keep finite differences away from the kinks
    return x


@pytest.mark.parametrize("act", list(ACTS))
def test_forward_matches_float64_reference(act):
    ref, _ = ACTS[act]
    x = np.concatenate([np.linspace(-30, 30, 20001), [0.0, -0.0, 1e-30, -1e-30, 88.0, -88.0, 100.0, -100.0]])
    got = n(ft.ops.activation_forward(None, t(x), act, ALPHA))
    want = ref(x.astype(np.float32).astype(np.float64), ALPHA)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=2e-7)


@pytest.mark.parametrize("act", ["sigmoid", "silu", "gelu", "tanh", "gelu_tanh"])
def test_tails_are_relatively_accurate(act):
    ref, _ = ACTS[act]
    x = np.concatenate([-np.geomspace(1e-6, 0.7, 2000), np.geomspace(1e-6, 0.7, 2000)])
    if act in ("sigmoid", "silu"):
        x = np.concatenate([x, np.linspace(-87, -5, 2000)])
    if act == "gelu":
        x = np.concatenate([x, np.linspace(-9, -3, 2000)])
    xf = x.astype(np.float32).astype(np.float64)
    got = n(ft.ops.activation_forward(None, t(xf), act))
    np.testing.assert_allclose(got, ref(xf, 0.0), rtol=1e-5 if act == "gelu" else 1e-6, atol=0)


def test_special_values():
    x = t([np.nan, np.inf, -np.inf])
    for act in ACTS:
        y = n(ft.ops.activation_forward(None, x, act, ALPHA))
        assert np.isnan(y[0]), act
    assert n(F.relu(x))[1:].tolist() == [np.inf, 0.0]
    assert n(F.sigmoid(x))[1:].tolist() == [1.0, 0.0]
    assert n(F.tanh(x))[1:].tolist() == [1.0, -1.0]
    assert n(F.gelu(x))[1] == np.inf and n(F.silu(x))[1] == np.inf


@pytest.mark.parametrize("act", list(ACTS))
def test_backward_analytic_and_finite_differences(act):
    ref, dref = ACTS[act]
    x = sample((3, 5), seed=1)
    dy = np.random.default_rng(2).normal(size=x.shape)
    analytic = dy * dref(x, ALPHA)
    np.testing.assert_allclose(analytic, fd_grad(lambda v: ref(v, ALPHA), x, dy), rtol=1e-5, atol=1e-6)
    xt = t(x)
    y = ft.ops.activation_forward(None, xt, act, ALPHA)
    got = ft.ops.activation_backward(None, t(dy), xt, None, act, ALPHA)
    np.testing.assert_allclose(n(got), analytic, rtol=2e-5, atol=1e-5)
    if act in FROM_OUTPUT:  # from the output alone (what an in-place forward leaves)
        got = ft.ops.activation_backward(None, t(dy), None, y, act, ALPHA)
        np.testing.assert_allclose(n(got), analytic, rtol=2e-5, atol=1e-5)


def test_backward_accumulates_and_writes_in_place():
    x, dy = sample((4, 6), 3), np.random.default_rng(4).normal(size=(4, 6))
    g0 = np.random.default_rng(5).normal(size=(4, 6)).astype(np.float32)
    grad = t(g0)
    ft.ops.activation_backward(grad, t(dy), t(x), None, "silu", accumulate=True)
    np.testing.assert_allclose(n(grad), g0 + dy * ACTS["silu"][1](x, 0), rtol=1e-5, atol=1e-5)
    d = t(dy)  # the gradient overwrites dout in place
    assert ft.ops.activation_backward(d, d, t(x), None, "gelu") is d
    np.testing.assert_allclose(n(d), dy * ACTS["gelu"][1](x, 0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("act", list(ACTS))
def test_in_place_forward(act):
    x = sample((2, 3, 4, 5), 6)
    xt = t(x)
    assert ft.ops.activation_forward(xt, xt, act, ALPHA) is xt
    np.testing.assert_allclose(n(xt), ACTS[act][0](x.astype(np.float32), ALPHA), rtol=1e-6, atol=2e-7)


def test_functional_inplace_and_defaults():
    x = sample((5,), 7)
    xt = t(x)
    assert F.relu(xt) is not xt and F.relu(xt, inplace=True) is xt
    np.testing.assert_array_equal(n(xt), np.maximum(x.astype(np.float32), 0))
    y = t(x)
    assert F.relu_(y) is y
    np.testing.assert_allclose(n(F.leaky_relu(t(x))), np.where(x > 0, x, 0.01 * x), rtol=1e-6)
    z = t(x)
    assert F.leaky_relu_(z, 0.2) is z
    np.testing.assert_allclose(n(F.gelu(t(x), approximate="tanh")), ACTS["gelu_tanh"][0](x, 0), rtol=1e-5,
                               atol=1e-6)
    with pytest.raises(ValueError, match="approximate"):
        F.gelu(t(x), approximate="fast")


@pytest.mark.parametrize("layout", ["nhwc", "strided", "transposed"])
def test_layouts_agree(layout):
    x = sample((2, 3, 4, 5), 8)
    dy = np.random.default_rng(9).normal(size=x.shape)
    make = {"nhwc": nhwc, "strided": strided,
            "transposed": lambda a: t(np.asarray(a).transpose(3, 2, 1, 0)).permute(3, 2, 1, 0)}[layout]
    for act in ACTS:
        want = n(ft.ops.activation_forward(None, t(x), act, ALPHA))
        y = ft.ops.activation_forward(None, make(x), act, ALPHA)
        np.testing.assert_array_equal(n(y), want)
        if layout == "nhwc":
            assert y.stride()[1] == 1  # the output keeps the input's memory format
        want_g = n(ft.ops.activation_backward(None, t(dy), t(x), None, act, ALPHA))
        got_g = ft.ops.activation_backward(make(np.zeros_like(x)), make(dy), make(x), None, act, ALPHA)
        np.testing.assert_array_equal(n(got_g), want_g)


def test_bfloat16():
    x = sample((3, 7), 10)
    xb = t(x).bfloat16()
    for act in ACTS:
        y = ft.ops.activation_forward(None, xb, act, ALPHA)
        assert y.dtype is ft.bfloat16
        want = ACTS[act][0](n(xb), ALPHA)
        np.testing.assert_allclose(n(y), want, rtol=1e-2, atol=1e-2)
    # mixed: float32 output of a bfloat16 input
    out = ft.empty(3, 7)
    ft.ops.activation_forward(out, xb, "tanh")
    np.testing.assert_allclose(n(out), np.tanh(n(xb)), rtol=1e-6, atol=1e-7)


def test_deterministic_across_thread_counts(threads):
    x = t(sample((300, 1001), 11))
    dy = t(np.random.default_rng(12).normal(size=(300, 1001)))
    results = []
    for nt in (1, 2):
        threads(nt)
        results.append([(bits(ft.ops.activation_forward(None, x, a, ALPHA)),
                         bits(ft.ops.activation_backward(None, dy, x, None, a, ALPHA))) for a in ACTS])
    assert results[0] == results[1]


def test_empty_and_zero_dim():
    for shape in [(0,), (0, 3), (2, 0, 4)]:
        assert F.relu(ft.zeros(*shape)).shape == shape
        assert ft.ops.activation_backward(None, ft.zeros(*shape), ft.zeros(*shape), None, "gelu").shape == shape
    assert n(F.tanh(ft.tensor(0.5))) == pytest.approx(math.tanh(0.5))


def test_bad_input():
    x = ft.zeros(2, 3)
    with pytest.raises(TypeError, match="relu: inp must be float32 or bfloat16 \\(or float16 on CUDA\\), got int64"):
        F.relu(ft.zeros(2, 3, dtype=ft.int64))
    with pytest.raises(TypeError, match="float32 or bfloat16 \\(or float16 on CUDA\\), got float64"):
        ft.ops.activation_forward(None, ft.zeros(3, dtype=ft.float64), "gelu")
    with pytest.raises(ValueError, match=r"gelu: out should have shape \(2, 3\), got \(3, 2\)"):
        ft.ops.activation_forward(ft.zeros(3, 2), x, "gelu")
    with pytest.raises(ValueError, match=r"silu_backward: inp should have shape \(2, 3\), got \(2, 4\)"):
        ft.ops.activation_backward(None, x, ft.zeros(2, 4), None, "silu")
    with pytest.raises(ValueError, match="gelu_backward: needs the forward input"):
        ft.ops.activation_backward(None, x, None, x, "gelu")
    with pytest.raises(ValueError, match="negative slope"):
        ft.ops.activation_backward(None, x, None, x, "leaky_relu", -0.5)
    with pytest.raises(ValueError, match="unknown activation 'swish'"):
        ft.ops.activation_forward(None, x, "swish")
    with pytest.raises(TypeError, match="inp must be a fasttrain Tensor"):
        ft.ops.activation_forward(None, np.zeros(3, np.float32), "relu")
    with pytest.raises(TypeError, match=r"relu: input must be a fasttrain Tensor, got list$"):
        F.relu([1.0, 2.0])
    with pytest.raises(TypeError, match=r"linear: input must be a fasttrain Tensor, got numpy.ndarray \(convert a "
                                        r"NumPy array with ft.from_numpy\(a\)"):
        ft.nn.Linear(3, 2)(np.zeros((2, 3), np.float32))  # a PyTorch tensor's message names ft.from_dlpack
    big = ft.zeros(8)
    with pytest.raises(ValueError, match="partly overlaps"):
        ft.ops.activation_forward(big[1:5], big[0:4], "relu")
    with pytest.raises(ValueError, match="share memory"):
        ft.ops.activation_forward(ft.zeros(1).expand(4), ft.zeros(4), "relu")
    ro = np.zeros(3, np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        ft.ops.activation_forward(ft.from_numpy(ro), ft.zeros(3), "relu")
    with pytest.raises(TypeError, match="out cannot be skipped"):
        ft.ops.activation_forward(False, x, "relu")


@pytest.mark.skipif(torch is None, reason="torch is not installed")
def test_against_torch():
    import torch.nn.functional as TF
    x = sample((4, 9), 13)
    dy = np.random.default_rng(14).normal(size=x.shape).astype(np.float32)
    fns = {"relu": TF.relu, "leaky_relu": lambda v: TF.leaky_relu(v, ALPHA), "gelu": TF.gelu,
           "gelu_tanh": lambda v: TF.gelu(v, approximate="tanh"), "silu": TF.silu, "sigmoid": torch.sigmoid,
           "tanh": torch.tanh}
    for act, fn in fns.items():
        xt = torch.tensor(x, dtype=torch.float32, requires_grad=True)
        y = fn(xt)
        y.backward(torch.tensor(dy))
        np.testing.assert_allclose(n(ft.ops.activation_forward(None, t(x), act, ALPHA)), y.detach().numpy(),
                                   rtol=1e-5, atol=1e-6)
        got = ft.ops.activation_backward(None, t(dy), t(x), None, act, ALPHA)
        np.testing.assert_allclose(n(got), xt.grad.numpy(), rtol=1e-5, atol=1e-6)
