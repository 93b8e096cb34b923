"""Compiled training programs (model.compile, issue 4): gradients and loss of a residual BN net against an
independent float64 NumPy forward/backward (and torch when importable), every optimizer through train_step
against PyTorch's update formula, gradient accumulation, clipping, bitwise reproducibility for 1 and 2 threads,
checkpoints (round trip, exact resume, safetensors interchange, mismatches, corrupt files), a short Fashion-MNIST
run, bad input, summary() and eval-mode predict."""
import json
import math
import os
import re
import struct

import numpy as np
import pytest

import fasttrain as ft
from fasttrain.testing import gradcheck

from _opref import torch

nn = ft.nn
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")

CLASSES = 5
SMOOTHING = 0.1


# ---------------------------------------------------------------- helpers

def params_of(model):
    """{name: float64 copy} of the parameters."""
    return {k: np.array(p.numpy(), dtype=np.float64) for k, p in model.named_parameters()}


def grads_of(model):
    return {k: np.array(p.grad.numpy(), dtype=np.float64) for k, p in model.named_parameters()}


def state_bits(model):
    """The raw bytes of every parameter and buffer, to compare runs bitwise."""
    return {k: np.ascontiguousarray(v).tobytes() for k, v in model.state_dict().items()}


def set_params(model, values):
    """Writes float32 copies of `values` ({name: array}) into the model's parameters (the flat buffer views)."""
    own = dict(model.named_parameters())
    for k, v in values.items():
        own[k].copy_(ft.from_numpy(np.ascontiguousarray(v, dtype=np.float32)))


def batch(n, shape=(3, 8, 8), classes=CLASSES, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, *shape)).astype(np.float32)
    y = rng.integers(0, classes, n).astype(np.int64)
    return x, y


def assert_grad_close(got, want, name, rtol=2e-4):
    """Elementwise: |got - want| <= rtol * max|want| + 1e-7 (float32 library against a float64 reference)."""
    scale = max(np.abs(want).max(), 1e-3)
    err = np.abs(got - want).max()
    assert err <= rtol * scale + 1e-7, f"{name}: max error {err:.3g} for values up to {scale:.3g}"


# ---------------------------------------------------------------- an independent float64 NumPy network

def windows(x, k, pad):
    """(N, C, Ho, Wo, k, k) sliding windows of x padded by `pad` (stride 1)."""
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    return np.lib.stride_tricks.sliding_window_view(xp, (k, k), axis=(2, 3))


def conv_f(x, w, b, pad):
    y = np.einsum("nchwij,ocij->nohw", windows(x, w.shape[2], pad), w)
    return y if b is None else y + b[None, :, None, None]


def conv_b(dy, x, w, pad):
    """(dx, dw, db) of conv_f with stride 1: dw by einsum over the windows, dx by a direct loop over the taps."""
    k = w.shape[2]
    dw = np.einsum("nchwij,nohw->ocij", windows(x, k, pad), dy)
    db = dy.sum(axis=(0, 2, 3))
    N, C, H, W = x.shape
    Ho, Wo = dy.shape[2:]
    dxp = np.zeros((N, C, H + 2 * pad, W + 2 * pad))
    for i in range(k):
        for j in range(k):
            dxp[:, :, i:i + Ho, j:j + Wo] += np.einsum("nohw,oc->nchw", dy, w[:, :, i, j])
    return dxp[:, :, pad:pad + H, pad:pad + W], dw, db


def bn_f(x, g, b, eps=1e-5):
    """Training-mode batch norm: batch mean and biased variance over (N, H, W)."""
    mean = x.mean(axis=(0, 2, 3))
    var = x.var(axis=(0, 2, 3))
    xhat = (x - mean[None, :, None, None]) / np.sqrt(var + eps)[None, :, None, None]
    return g[None, :, None, None] * xhat + b[None, :, None, None], (xhat, var, mean)


def bn_b(dy, g, cache, eps=1e-5):
    xhat, var, _ = cache
    m = dy.shape[0] * dy.shape[2] * dy.shape[3]
    dxhat = dy * g[None, :, None, None]
    dx = (m * dxhat - dxhat.sum(axis=(0, 2, 3), keepdims=True)
          - xhat * (dxhat * xhat).sum(axis=(0, 2, 3), keepdims=True)) / (m * np.sqrt(var + eps)[None, :, None, None])
    return dx, (dy * xhat).sum(axis=(0, 2, 3)), dy.sum(axis=(0, 2, 3))


def maxpool2_f(x):
    """2x2, stride 2; the index of the first maximum in row-major window order (PyTorch's tie rule)."""
    N, C, H, W = x.shape
    win = x.reshape(N, C, H // 2, 2, W // 2, 2).transpose(0, 1, 2, 4, 3, 5).reshape(N, C, H // 2, W // 2, 4)
    idx = win.argmax(axis=-1)  # argmax returns the first occurrence
    return np.take_along_axis(win, idx[..., None], -1)[..., 0], idx


def maxpool2_b(dy, idx, shape):
    N, C, H, W = shape
    dwin = np.zeros((N, C, H // 2, W // 2, 4))
    np.put_along_axis(dwin, idx[..., None], dy[..., None], -1)
    return dwin.reshape(N, C, H // 2, W // 2, 2, 2).transpose(0, 1, 2, 4, 3, 5).reshape(shape)


def ce_f(z, y, eps):
    """Mean cross-entropy with label smoothing and its gradient with respect to the logits."""
    n, c = z.shape
    logp = z - z.max(axis=1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(axis=1, keepdims=True))
    target = np.full((n, c), eps / c)
    target[np.arange(n), y] += 1 - eps
    loss = -(target * logp).sum() / n
    return loss, (np.exp(logp) - target) / n


def ref_net(P, x, y, eps=SMOOTHING, bn_eps=1e-5, aux=None):
    """The residual net of make_resnet() in float64: the loss, the gradient of every parameter (PyTorch's
    state_dict names), and the batch mean and unbiased variance that batch norm tracks. `aux` (a dict) gets
    the smallest gap between the largest and the second largest value of the max-pool windows whose maximum
    is positive (a near-tie there could make float32 and float64 pick different elements)."""
    x = x.astype(np.float64)
    c1 = conv_f(x, P["conv2d.weight"], P["conv2d.bias"], 1)
    b1, bn_cache = bn_f(c1, P["batch_norm2d.weight"], P["batch_norm2d.bias"], bn_eps)
    h1 = np.maximum(b1, 0)
    c2 = conv_f(h1, P["conv2d_1.weight"], P["conv2d_1.bias"], 1)
    s = np.maximum(h1 + c2, 0)
    mp, mp_idx = maxpool2_f(s)
    if aux is not None:
        N, C, H, W = s.shape
        top2 = np.sort(s.reshape(N, C, H // 2, 2, W // 2, 2).transpose(0, 1, 2, 4, 3, 5).reshape(-1, 4))[:, -2:]
        aux["pool_gap"] = np.min(np.diff(top2[top2[:, 1] > 0], axis=1), initial=np.inf)
    c3 = conv_f(mp, P["conv2d_2.weight"], P["conv2d_2.bias"], 1)
    h3 = np.maximum(c3, 0)
    g = h3.mean(axis=(2, 3))  # AdaptiveAvgPool2d(1) + Flatten
    z = g @ P["linear.weight"].T + P["linear.bias"]
    loss, dz = ce_f(z, y, eps)
    G = {"linear.weight": dz.T @ g, "linear.bias": dz.sum(0)}
    dg = dz @ P["linear.weight"]
    dh3 = np.broadcast_to(dg[:, :, None, None] / (h3.shape[2] * h3.shape[3]), h3.shape)
    dc3 = dh3 * (c3 > 0)
    dmp, G["conv2d_2.weight"], G["conv2d_2.bias"] = conv_b(dc3, mp, P["conv2d_2.weight"], 1)
    ds = maxpool2_b(dmp, mp_idx, s.shape) * (h1 + c2 > 0)
    dh1, G["conv2d_1.weight"], G["conv2d_1.bias"] = conv_b(ds, h1, P["conv2d_1.weight"], 1)
    dh1 = dh1 + ds  # the residual path
    db1 = dh1 * (b1 > 0)
    dc1, G["batch_norm2d.weight"], G["batch_norm2d.bias"] = bn_b(db1, P["batch_norm2d.weight"], bn_cache, bn_eps)
    _, G["conv2d.weight"], G["conv2d.bias"] = conv_b(dc1, x, P["conv2d.weight"], 1)
    m = c1.shape[0] * c1.shape[2] * c1.shape[3]
    return loss, G, (bn_cache[2], bn_cache[1] * m / (m - 1)), z


def ref_predict(S, x, bn_eps=1e-5):
    """Eval-mode logits of make_resnet() in float64 from a state_dict (running statistics)."""
    x = x.astype(np.float64)
    S = {k: np.asarray(v, dtype=np.float64) for k, v in S.items()}
    c1 = conv_f(x, S["conv2d.weight"], S["conv2d.bias"], 1)
    inv = 1 / np.sqrt(S["batch_norm2d.running_var"] + bn_eps)
    h1 = np.maximum(S["batch_norm2d.weight"][None, :, None, None]
                    * (c1 - S["batch_norm2d.running_mean"][None, :, None, None])
                    * inv[None, :, None, None] + S["batch_norm2d.bias"][None, :, None, None], 0)
    s = np.maximum(h1 + conv_f(h1, S["conv2d_1.weight"], S["conv2d_1.bias"], 1), 0)
    h3 = np.maximum(conv_f(maxpool2_f(s)[0], S["conv2d_2.weight"], S["conv2d_2.bias"], 1), 0)
    return h3.mean(axis=(2, 3)) @ S["linear.weight"].T + S["linear.bias"]


def make_resnet(seed=0):
    """conv -> BN -> ReLU -> (+ conv) -> ReLU -> maxpool -> conv -> ReLU -> global avg pool -> linear."""
    ft.manual_seed(seed)
    x = nn.Input((3, 8, 8))
    h1 = nn.ReLU()(nn.BatchNorm2d(6)(nn.Conv2d(3, 6, 3, padding=1)(x)))
    s = nn.ReLU()(h1 + nn.Conv2d(6, 6, 3, padding=1)(h1))
    h3 = nn.ReLU()(nn.Conv2d(6, 8, 3, padding=1)(nn.MaxPool2d(2)(s)))
    out = nn.Linear(8, CLASSES)(nn.Flatten()(nn.AdaptiveAvgPool2d(1)(h3)))
    return nn.Model(x, out)


def perturb_bn(model, seed=5):
    """Non-trivial BN affine parameters (they start at 1 and 0)."""
    rng = np.random.default_rng(seed)
    set_params(model, {"batch_norm2d.weight": 1 + 0.3 * rng.standard_normal(6),
                       "batch_norm2d.bias": 0.2 * rng.standard_normal(6)})


def compile_resnet(model, opt=None, batch_size=8, **kw):
    opt = opt or ft.optim.SGD(model.parameters(), lr=0.1)
    return model.compile(opt, nn.CrossEntropyLoss(label_smoothing=SMOOTHING), batch_size=batch_size, **kw)


# ---------------------------------------------------------------- 1. loss and gradients

@pytest.mark.parametrize("memory_format", ["channels_last", "contiguous"])
def test_backward_matches_numpy_reference(memory_format):
    model = make_resnet()
    perturb_bn(model)
    program = compile_resnet(model, memory_format=memory_format)
    x, y = batch(8)
    P = params_of(model)
    aux = {}
    want_loss, want, _, _ = ref_net(P, x, y, aux=aux)
    # the sanity of the reference itself: every parameter has a gradient, no near-tie inside a max-pool window
    assert set(want) == set(P) and aux["pool_gap"] > 1e-4
    loss = program.backward(x, y)
    assert abs(loss - want_loss) <= 1e-5 * abs(want_loss), (loss, want_loss)
    got = grads_of(model)
    for name in P:
        assert_grad_close(got[name], want[name], name)
    # the conv bias that batch norm cancels has (mathematically) zero gradient
    assert np.abs(got["conv2d.bias"]).max() <= 1e-6
    # as PyTorch's backward: a second call adds the same gradients (twice them, exactly), and after zero_grad
    # it writes them anew
    program.backward(x, y)
    for name in P:
        np.testing.assert_array_equal(grads_of(model)[name], 2 * got[name])
    program.optimizer.zero_grad()
    program.backward(x, y)
    for name in P:
        np.testing.assert_array_equal(grads_of(model)[name], got[name])


@pytest.mark.parametrize("pool", ["max_pool_2x2", "global_max_pool"])
@pytest.mark.parametrize("memory_format", ["channels_last", "contiguous"])
def test_max_pool_ties_route_the_gradient_to_the_first_maximum(pool, memory_format):
    """PyTorch's rule: among equal maxima the first in row-major window order takes the gradient. A 1x1 conv
    with weights (1, 1) makes exact ties out of different inputs, so the conv weight's gradient tells which
    element was picked."""
    ft.manual_seed(0)
    layer = nn.MaxPool2d(2) if pool == "max_pool_2x2" else nn.AdaptiveMaxPool2d(1)
    model = nn.Sequential(nn.Conv2d(2, 1, 1), layer, nn.Flatten(), nn.Linear(1, 3))
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=2,
                            input_shape=(2, 2, 2), memory_format=memory_format)
    set_params(model, {"0.weight": np.ones((1, 2, 1, 1)), "0.bias": np.zeros(1),
                       "3.weight": np.array([[1.0], [-0.5], [0.25]]), "3.bias": np.zeros(3)})
    # channel sums: sample 0 [[1, 3], [3, 2]] (tie at (0, 1) and (1, 0)), sample 1 [[4, 0], [4, 4]]
    x = np.array([[[[1, 1], [2, 0]], [[0, 2], [1, 2]]],
                  [[[1, 0], [3, 2]], [[3, 0], [1, 2]]]], dtype=np.float32)
    y = np.array([1, 2])
    first = [(0, 1), (0, 0)]  # row-major first maximum of each sample
    last = [(1, 0), (1, 1)]
    P = params_of(model)
    pooled = np.array([[3.0], [4.0]])  # the maxima
    _, dz = ce_f(pooled @ P["3.weight"].T, y, 0.0)
    dpool = dz @ P["3.weight"]

    def dw(picks):
        return sum(dpool[n, 0] * x[n, :, i, j] for n, (i, j) in enumerate(picks)).reshape(1, 2, 1, 1)

    assert np.abs(dw(first) - dw(last)).max() > 0.1  # the rule is observable here
    program.backward(x, y)
    np.testing.assert_allclose(grads_of(model)["0.weight"], dw(first), rtol=1e-5, atol=1e-6)


def test_backward_splits_into_micro_batches_and_averages():
    """backward on a batch larger than the compiled micro-batch: gradients of the mean loss over all samples,
    batch norm normalising each micro-batch by its own statistics. (The dropped conv bias is checked by
    test_dropped_bias_gradient_with_micro_batches.)"""
    model = make_resnet(seed=3)
    program = compile_resnet(model, batch_size=4)  # micro-batches of 4
    x, y = batch(8, seed=4)
    P = params_of(model)
    loss = program.backward(x, y)
    l0, g0, _, _ = ref_net(P, x[:4], y[:4])
    l1, g1, _, _ = ref_net(P, x[4:], y[4:])
    assert abs(loss - (l0 + l1) / 2) <= 1e-5 * abs(loss)
    got = grads_of(model)
    for name in P:
        if name != "conv2d.bias":
            assert_grad_close(got[name], (g0[name] + g1[name]) / 2, name)


@needs_torch
def test_backward_matches_torch():
    model = make_resnet(seed=1)
    perturb_bn(model)
    program = compile_resnet(model)
    x, y = batch(8, seed=2)
    P = params_of(model)
    tm = torch_resnet(P)
    tx = torch.tensor(x, dtype=torch.float64)
    out = tm(tx)
    tloss = torch.nn.functional.cross_entropy(out, torch.tensor(y), label_smoothing=SMOOTHING)
    tloss.backward()
    loss = program.backward(x, y)
    assert abs(loss - tloss.item()) <= 1e-5 * abs(loss)
    got = grads_of(model)
    for name, p in tm.named_parameters():
        assert_grad_close(got[name], p.grad.numpy(), name)
    # the running variance after one training forward (the running mean: see
    # test_running_statistics_and_predict_with_the_conv_bias)
    assert_grad_close(model.state_dict()["batch_norm2d.running_var"].astype(np.float64),
                      tm["batch_norm2d"].running_var.numpy(), "running_var")


def torch_resnet(P):
    """make_resnet() in torch (float64), with the parameters P."""
    T = torch.nn

    class Net(T.Module):
        def __init__(self):
            super().__init__()
            self.m = T.ModuleDict({"conv2d": T.Conv2d(3, 6, 3, padding=1), "batch_norm2d": T.BatchNorm2d(6),
                                   "conv2d_1": T.Conv2d(6, 6, 3, padding=1), "conv2d_2": T.Conv2d(6, 8, 3, padding=1),
                                   "linear": T.Linear(8, CLASSES)})

        def __getitem__(self, k):
            return self.m[str(k)]

        def named_parameters(self, *a, **k):
            for name, p in super().named_parameters(*a, **k):
                yield name[2:], p

        def forward(self, x):
            m = self.m
            h1 = torch.relu(m["batch_norm2d"](m["conv2d"](x)))
            s = torch.relu(h1 + m["conv2d_1"](h1))
            h3 = torch.relu(m["conv2d_2"](torch.nn.functional.max_pool2d(s, 2)))
            return m["linear"](h3.mean(dim=(2, 3)))

    net = Net().double()
    with torch.no_grad():
        for name, p in net.named_parameters():
            p.copy_(torch.tensor(P[name]))
    return net


def test_dropped_bias_is_not_in_the_forward_pass():
    """The conv bias dropped before batch norm: in training mode batch norm cancels any per-channel constant, so
    the loss and every other gradient do not depend on it (checked against the reference with the bias present,
    and with the bias changed)."""
    model = make_resnet(seed=2)
    program = compile_resnet(model)
    x, y = batch(8, seed=3)
    loss = program.backward(x, y)
    set_params(model, {"conv2d.bias": params_of(model)["conv2d.bias"] + 5.0})
    P = params_of(model)
    want_loss, want, _, _ = ref_net(P, x, y)
    program.optimizer.zero_grad()
    assert abs(program.backward(x, y) - want_loss) <= 1e-5 * want_loss
    assert abs(loss - want_loss) <= 1e-5 * want_loss
    got = grads_of(model)
    for name in P:
        assert_grad_close(got[name], want[name], name)


def big_bias_net(seed=0):
    """A conv whose bias batch norm cancels, in a model of more than 2**18 parameters (1 MiB of float32: the
    flat buffers come from the size-cached allocator)."""
    ft.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(),
                         nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, CLASSES))


def test_dropped_bias_gradient_with_micro_batches():
    model = big_bias_net()
    numel = sum(p.numel() for p in model.parameters())
    # freed blocks of the flat buffers' size holding 1.0: what a later allocation of that size may get back
    junk = [ft.full((numel,), 1.0) for _ in range(6)]
    del junk
    opt = ft.optim.SGD(model.parameters(), lr=0.1)
    program = model.compile(opt, nn.CrossEntropyLoss(), batch_size=8, input_shape=(3, 8, 8), accumulate_steps=2)
    x, y = batch(8, seed=1)
    bias = params_of(model)["0.bias"]
    program.backward(x, y)
    assert np.abs(grads_of(model)["0.bias"]).max() == 0  # batch norm cancels the bias: its gradient is zero
    program.train_step(x, y)
    np.testing.assert_array_equal(params_of(model)["0.bias"], bias)  # so plain SGD leaves it as it is


def avgpool3_pad1(x):
    """AvgPool2d(3, stride=1, padding=1) with count_include_pad=True: the zero padding counts in every window."""
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    return np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(2, 3)).sum(axis=(-2, -1)) / 9


def test_bias_kept_before_padded_average_pool():
    ft.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.AvgPool2d(3, stride=1, padding=1), nn.BatchNorm2d(3),
                          nn.Flatten(), nn.Linear(48, 4))
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=4,
                            input_shape=(2, 4, 4))
    set_params(model, {"0.bias": np.array([1.0, -2.0, 3.0])})
    P = params_of(model)
    x, y = batch(4, shape=(2, 4, 4), classes=4)
    h = bn_f(avgpool3_pad1(conv_f(x.astype(np.float64), P["0.weight"], P["0.bias"], 1)), P["2.weight"], P["2.bias"])[0]
    want, _ = ce_f(h.reshape(4, -1) @ P["4.weight"].T + P["4.bias"], y, 0.0)
    assert abs(program.backward(x, y) - want) <= 1e-5 * want


# ---------------------------------------------------------------- running statistics and eval mode

def test_running_statistics_without_the_dropped_bias():
    """BN's running mean and variance after training forwards: (1 - momentum) * old + momentum * batch value,
    with the unbiased batch variance (PyTorch). The conv bias is zero here (see the next test)."""
    model = make_resnet(seed=4)
    set_params(model, {"conv2d.bias": np.zeros(6)})
    program = compile_resnet(model)
    x, y = batch(8, seed=5)
    P = params_of(model)
    _, _, (mean, var), _ = ref_net(P, x, y)
    program.backward(x, y)
    program.backward(x, y)  # twice: the second update starts from the first
    sd = model.state_dict()
    np.testing.assert_allclose(sd["batch_norm2d.running_mean"], 0.19 * mean, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(sd["batch_norm2d.running_var"], 0.81 + 0.19 * var, rtol=1e-4, atol=1e-6)


def test_num_batches_tracked_counts_training_forwards():
    model = make_resnet(seed=4)
    program = compile_resnet(model)
    for k in range(3):
        program.train_step(*batch(8, seed=k))
    program.predict(batch(8)[0])  # eval mode: not counted
    assert int(model.state_dict()["batch_norm2d.num_batches_tracked"]) == 3


def test_running_statistics_and_predict_with_the_conv_bias():
    """A conv bias that a batch norm cancels is dropped and zeroed at compile time, so the saved model, its
    running statistics and the compiled program's eval-mode forward all describe the same function."""
    model = make_resnet(seed=4)
    assert np.abs(params_of(model)["conv2d.bias"]).max() > 0.01  # PyTorch's default initialisation
    program = compile_resnet(model)
    x, y = batch(8, seed=5)
    P = params_of(model)
    assert np.abs(P["conv2d.bias"]).max() == 0
    _, _, (mean, _), _ = ref_net(P, x, y)
    program.backward(x, y)
    sd = model.state_dict()
    np.testing.assert_allclose(sd["batch_norm2d.running_mean"], 0.1 * mean, rtol=1e-4, atol=1e-6)
    xt, _ = batch(6, seed=6)
    np.testing.assert_allclose(program.predict(xt).numpy(), ref_predict(sd, xt), rtol=1e-4, atol=1e-5)


def test_predict_and_evaluate_match_numpy_eval_forward():
    """Eval mode: running statistics (after a few training steps), no batch statistics; batches larger and
    smaller than the compiled one; evaluate's mean loss and accuracy; flip test-time augmentation."""
    model = make_resnet(seed=6)
    set_params(model, {"conv2d.bias": np.zeros(6)})
    opt = ft.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    program = compile_resnet(model, opt)
    for k in range(3):
        program.train_step(*batch(8, seed=10 + k))
    sd = model.state_dict()
    assert np.abs(sd["batch_norm2d.running_mean"]).max() > 1e-3
    assert np.abs(sd["batch_norm2d.running_var"] - 1).max() > 1e-3
    for n in (3, 8, 13):
        x, y = batch(n, seed=20 + n)
        want = ref_predict(sd, x)
        got = program.predict(x).numpy()
        assert got.shape == (n, CLASSES)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
        # the eval forward must not depend on the other samples of the batch
        np.testing.assert_allclose(program.predict(x[:1]).numpy(), want[:1], rtol=1e-4, atol=1e-5)
        loss, acc = program.evaluate(x, y)
        assert abs(loss - ce_f(want, y, SMOOTHING)[0]) <= 1e-5 * loss
        assert acc == np.mean(want.argmax(1) == y)
        loss_sum, correct, count = _eval_with_flip(program, x, y)
        both = (want + ref_predict(sd, x[..., ::-1])) / 2
        assert count == n and correct == np.sum(both.argmax(1) == y)
        assert abs(loss_sum / n - ce_f(both, y, SMOOTHING)[0]) <= 1e-5 * loss_sum / n
    # predict keeps the model's parameters and statistics as they are
    assert state_bits(model) == {k: np.ascontiguousarray(v).tobytes() for k, v in sd.items()}


def _eval_with_flip(program, x, y):
    loss, acc = ft.evaluate(program, [(x, y)], tta_flip=True)
    return loss * len(y), round(acc * len(y)), len(y)


@needs_torch
def test_predict_matches_torch_eval():
    model = make_resnet(seed=7)
    set_params(model, {"conv2d.bias": np.zeros(6)})
    program = compile_resnet(model, ft.optim.AdamW(model.parameters(), lr=0.01))
    for k in range(2):
        program.train_step(*batch(8, seed=30 + k))
    sd = model.state_dict()
    tm = torch_resnet({k: v for k, v in sd.items()})
    with torch.no_grad():
        tm["batch_norm2d"].running_mean.copy_(torch.tensor(sd["batch_norm2d.running_mean"], dtype=torch.float64))
        tm["batch_norm2d"].running_var.copy_(torch.tensor(sd["batch_norm2d.running_var"], dtype=torch.float64))
        tm.eval()
        x, _ = batch(5, seed=40)
        want = tm(torch.tensor(x, dtype=torch.float64)).numpy()
    np.testing.assert_allclose(program.predict(x).numpy(), want, rtol=1e-4, atol=1e-5)


def test_nan_input_propagates_through_batch_norm_relu():
    x = np.random.default_rng(41).standard_normal((4, 3, 5, 5)).astype(np.float32)
    x[0, 1, 3, 3] = np.nan
    rm, rv = ft.zeros(3), ft.ones(3)
    out, _, _ = ft.ops.batch_norm_forward(None, None, None, ft.tensor(x), None, None, rm, rv, False, act="relu")
    out = out.numpy()
    assert np.isnan(out[0, 1, 3, 3])  # relu(nan) = nan, as in NumPy and PyTorch
    assert np.isfinite(np.delete(out.reshape(-1), np.ravel_multi_index((0, 1, 3, 3), out.shape))).all()


# ---------------------------------------------------------------- 2. optimizers through train_step

def ref_sgd(p, g, st, h):
    """torch.optim.SGD's documented update, float64."""
    d = g + h.get("weight_decay", 0.0) * p
    mu = h.get("momentum", 0.0)
    if mu:
        st["buf"] = d.copy() if "buf" not in st else mu * st["buf"] + (1 - h.get("dampening", 0.0)) * d
        d = d + mu * st["buf"] if h.get("nesterov") else st["buf"]
    return p - h["lr"] * d


def ref_adamw(p, g, st, h):
    """torch.optim.AdamW's documented update, float64."""
    b1, b2 = h.get("betas", (0.9, 0.999))
    t = st["t"] = st.get("t", 0) + 1
    p = p * (1 - h["lr"] * h.get("weight_decay", 1e-2))
    st["m"] = b1 * st.get("m", 0) + (1 - b1) * g
    st["v"] = b2 * st.get("v", 0) + (1 - b2) * g * g
    v = st["v"]
    if h.get("amsgrad"):
        v = st["vmax"] = np.maximum(st.get("vmax", 0), v)
    mhat, vhat = st["m"] / (1 - b1 ** t), v / (1 - b2 ** t)
    return p - h["lr"] * mhat / (np.sqrt(vhat) + h.get("eps", 1e-8))


def ref_lamb(p, g, st, h):
    """LAMB (You et al. 2019, Algorithm 2, bias-corrected Adam moments, phi(x) = x): the update
    u = mhat / (sqrt(vhat) + eps) + weight_decay * p scaled by the per-tensor trust ratio ||p|| / ||u||
    (1 when a norm is zero)."""
    b1, b2 = h.get("betas", (0.9, 0.999))
    t = st["t"] = st.get("t", 0) + 1
    st["m"] = b1 * st.get("m", 0) + (1 - b1) * g
    st["v"] = b2 * st.get("v", 0) + (1 - b2) * g * g
    u = st["m"] / (1 - b1 ** t) / (np.sqrt(st["v"] / (1 - b2 ** t)) + h.get("eps", 1e-6)) \
        + h.get("weight_decay", 1e-2) * p
    pn, un = np.linalg.norm(p), np.linalg.norm(u)
    return p - h["lr"] * (pn / un if pn > 0 and un > 0 else 1.0) * u


def ref_lars(p, g, st, h):
    """LARS (You, Gitman, Ginsburg 2017, Algorithm 1): local_lr = eta ||p|| / (||g|| + wd ||p|| + eps) per tensor
    (1 when a norm is zero), v = momentum v + lr local_lr (g + wd p), p = p - v."""
    wd = h.get("weight_decay", 0.0)
    pn, gn = np.linalg.norm(p), np.linalg.norm(g)
    local = h.get("trust_coefficient", 1e-3) * pn / (gn + wd * pn + h.get("eps", 0.0)) if pn > 0 and gn > 0 else 1.0
    st["v"] = h.get("momentum", 0.9) * st.get("v", 0) + h["lr"] * local * (g + wd * p)
    return p - st["v"]


OPTIMIZERS = {
    "sgd": (ft.optim.SGD, ref_sgd, dict(lr=0.1)),
    "sgd_momentum_dampening_wd": (ft.optim.SGD, ref_sgd, dict(lr=0.05, momentum=0.8, dampening=0.2,
                                                              weight_decay=1e-2)),
    "sgd_nesterov_wd": (ft.optim.SGD, ref_sgd, dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-3)),
    "adamw": (ft.optim.AdamW, ref_adamw, dict(lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.05)),
    "adamw_amsgrad": (ft.optim.AdamW, ref_adamw, dict(lr=0.01, amsgrad=True)),
    "lamb": (ft.optim.LAMB, ref_lamb, dict(lr=0.01, weight_decay=0.01)),
    "lars": (ft.optim.LARS, ref_lars, dict(lr=2.0, momentum=0.9, weight_decay=1e-3, trust_coefficient=0.02)),
}


def run_against_reference(model, program, groups, ref, steps=4, clip=None, batch_size=8):
    """Per step: the gradient from program.backward at the current parameters, the reference update (with the
    optimizer state carried in float64 over the steps), then train_step; the parameters must agree.
    groups: [(names, hyperparameters)]."""
    state = {name: {} for name in dict(model.named_parameters())}
    hyper = {name: h for names, h in groups for name in names}
    for k in range(steps):
        x, y = batch(batch_size, seed=100 + k)
        P = params_of(model)
        program.optimizer.zero_grad()
        want_loss = program.backward(x, y)
        G = grads_of(model)
        if clip is not None:
            norm = math.sqrt(sum(float(np.sum(g * g)) for g in G.values()))
            coef = min(1.0, clip / (norm + 1e-6))  # torch.nn.utils.clip_grad_norm_
            G = {name: g * coef for name, g in G.items()}
        want = {name: ref(P[name], G[name], state[name], hyper[name]) for name in P}
        loss = program.train_step(x, y)
        assert abs(loss - want_loss) <= 1e-6 * abs(want_loss), f"step {k}: loss {loss} != {want_loss}"
        got = params_of(model)
        for name in P:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6,
                                       err_msg=f"step {k}, {name}")
    return G


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_optimizer_steps_match_pytorch_formula(name):
    cls, ref, h = OPTIMIZERS[name]
    model = make_resnet(seed=11)
    perturb_bn(model)
    program = compile_resnet(model, cls(model.parameters(), **h))
    run_against_reference(model, program, [(list(dict(model.named_parameters())), h)], ref)


@pytest.mark.parametrize("cls", [ft.optim.SGD, ft.optim.AdamW])
def test_param_groups_through_train_step(cls):
    """The demo's grouping: weight decay on conv/linear weights only, another lr for the rest."""
    model = make_resnet(seed=12)
    decay = [n for n, p in model.named_parameters() if p.ndim > 1]
    rest = [n for n, p in model.named_parameters() if p.ndim == 1]
    named = dict(model.named_parameters())
    if cls is ft.optim.SGD:
        base, ref = dict(momentum=0.9, nesterov=True), ref_sgd
    else:
        base, ref = dict(betas=(0.9, 0.99)), ref_adamw
    h0, h1 = dict(base, lr=0.05, weight_decay=0.01), dict(base, lr=0.02, weight_decay=0.0)
    opt = cls([dict(params=[named[n] for n in decay], **h0), dict(params=[named[n] for n in rest], **h1)])
    program = compile_resnet(model, opt)
    run_against_reference(model, program, [(decay, h0), (rest, h1)], ref)


def test_learning_rate_changes_take_effect_between_steps():
    """A scheduler (or the user) changing param_groups[i]['lr'] between train_steps: each step uses the new rate
    (StepLR's closed form lr_k = lr * gamma ** (k // step_size))."""
    model = make_resnet(seed=13)
    opt = ft.optim.SGD(model.parameters(), lr=0.2, momentum=0.5)
    sched = ft.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.1)
    program = compile_resnet(model, opt)
    state = {name: {} for name in dict(model.named_parameters())}
    for k in range(5):
        x, y = batch(8, seed=200 + k)
        P = params_of(model)
        program.optimizer.zero_grad()
        program.backward(x, y)
        G = grads_of(model)
        h = dict(lr=0.2 * 0.1 ** (k // 2), momentum=0.5)
        want = {name: ref_sgd(P[name], G[name], state[name], h) for name in P}
        program.train_step(x, y)
        sched.step()
        got = params_of(model)
        for name in P:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-7, err_msg=f"step {k} {name}")


# ---------------------------------------------------------------- 3. gradient accumulation

def plain_net(seed=0, dropout=0.0):
    """conv -> ReLU -> maxpool -> conv -> ReLU -> global avg pool -> linear: no batch norm."""
    ft.manual_seed(seed)
    layers = [nn.Conv2d(3, 6, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(6, 8, 3, padding=1), nn.ReLU(),
              nn.AdaptiveAvgPool2d(1), nn.Flatten()]
    if dropout:
        layers.append(nn.Dropout(dropout))
    return nn.Sequential(*layers, nn.Linear(8, CLASSES))


def compile_plain(model, opt=None, batch_size=8, **kw):
    opt = opt or ft.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return model.compile(opt, nn.CrossEntropyLoss(label_smoothing=SMOOTHING), batch_size=batch_size,
                         input_shape=(3, 8, 8), **kw)


@pytest.mark.parametrize("k", [2, 3])
def test_accumulated_micro_batches_equal_one_large_batch(k):
    """Without batch norm every sample's gradient is independent of the others, so k micro-batches of b summed
    with weights b / (k b) are the gradient of the mean loss over k b samples: equal up to float32 rounding."""
    b = 4
    m1, mk = plain_net(seed=21), plain_net(seed=21)
    one = compile_plain(m1, ft.optim.SGD(m1.parameters(), lr=0.1, momentum=0.9), batch_size=k * b)
    acc = compile_plain(mk, ft.optim.SGD(mk.parameters(), lr=0.1, momentum=0.9), batch_size=k * b,
                        accumulate_steps=k)
    for step in range(3):
        x, y = batch(k * b, seed=300 + step)
        l1, lk = one.train_step(x, y), acc.train_step(x, y)
        assert abs(l1 - lk) <= 2e-6 * abs(l1), (step, l1, lk)
        p1, pk = params_of(m1), params_of(mk)
        for name in p1:
            np.testing.assert_allclose(pk[name], p1[name], rtol=2e-5, atol=1e-6, err_msg=f"step {step} {name}")
    # and the gradients themselves (backward splits the batch the same way)
    x, y = batch(k * b, seed=399)
    one.optimizer.zero_grad()
    acc.optimizer.zero_grad()
    g1 = (one.backward(x, y), grads_of(m1))
    gk = (acc.backward(x, y), grads_of(mk))
    for name in g1[1]:
        assert_grad_close(gk[1][name], g1[1][name], name, rtol=1e-5)


def bn_net(seed=0):
    ft.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(3, 6, 3, padding=1, bias=False), nn.BatchNorm2d(6), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, CLASSES))


def test_accumulation_with_batch_norm_is_per_micro_batch():
    """With batch norm, accumulation is NOT one large batch: each micro-batch is normalised by its own mean and
    variance (as in PyTorch with accumulation), and the running statistics are updated once per micro-batch.
    The accumulated gradient is the mean of the micro-batches' gradients, which differs from the large batch's."""
    k, b = 2, 4
    ms, m1, mk = bn_net(3), bn_net(3), bn_net(3)
    small = ms.compile(ft.optim.SGD(ms.parameters(), lr=0.1), batch_size=b, input_shape=(3, 8, 8))
    one = m1.compile(ft.optim.SGD(m1.parameters(), lr=0.1), batch_size=k * b, input_shape=(3, 8, 8))
    acc = mk.compile(ft.optim.SGD(mk.parameters(), lr=0.1), batch_size=k * b, input_shape=(3, 8, 8),
                     accumulate_steps=k)
    x, y = batch(k * b, seed=7)
    lk, l1 = acc.backward(x, y), one.backward(x, y)
    parts, gs = [], []
    for i in range(k):  # each micro-batch on its own, in a program compiled for b samples
        small.optimizer.zero_grad()
        parts.append(small.backward(x[i * b:(i + 1) * b], y[i * b:(i + 1) * b]))
        gs.append(grads_of(ms))
    assert abs(lk - np.mean(parts)) <= 1e-6 * lk
    assert abs(lk - l1) > 1e-4  # a different loss: micro-batch statistics
    gk, g1 = grads_of(mk), grads_of(m1)
    for name in gk:
        assert_grad_close(gk[name], np.mean([g[name] for g in gs], axis=0), name, rtol=1e-5)
    assert max(np.abs(gk[n] - g1[n]).max() for n in gk) > 1e-4
    # running statistics: one update per micro-batch, from (0, 1)
    P = params_of(mk)
    stats = []
    for i in range(k):
        c = conv_f(x[i * b:(i + 1) * b].astype(np.float64), P["0.weight"], None, 1)
        m = c.shape[0] * c.shape[2] * c.shape[3]
        stats.append((c.mean(axis=(0, 2, 3)), c.var(axis=(0, 2, 3)) * m / (m - 1)))
    rm, rv = np.zeros(6), np.ones(6)
    for mean, var in stats:
        rm, rv = 0.9 * rm + 0.1 * mean, 0.9 * rv + 0.1 * var
    sd = mk.state_dict()
    np.testing.assert_allclose(sd["1.running_mean"], rm, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(sd["1.running_var"], rv, rtol=1e-4, atol=1e-6)


# ---------------------------------------------------------------- 4. clipping

@pytest.mark.parametrize("cls,h", [(ft.optim.SGD, dict(lr=0.1, momentum=0.9)), (ft.optim.AdamW, dict(lr=0.01))])
@pytest.mark.parametrize("clip", [0.05, 100.0])
def test_clip_grad_norm_matches_numpy(cls, h, clip):
    model = make_resnet(seed=14)
    program = compile_resnet(model, cls(model.parameters(), **h), clip_grad_norm=clip)
    x, y = batch(8, seed=100)
    program.backward(x, y)
    norm = math.sqrt(sum(float(np.sum(g * g)) for g in grads_of(model).values()))
    assert (norm > 2 * clip) if clip < 1 else (norm < clip / 2)  # the first step clips (or not) for sure
    ref = ref_sgd if cls is ft.optim.SGD else ref_adamw
    run_against_reference(model, program, [(list(dict(model.named_parameters())), h)], ref, clip=clip)


# ---------------------------------------------------------------- 5. reproducibility

def det_net(seed):
    """Wide enough that two threads split the work: conv, BN, ReLU, residual, pool, dropout, linear."""
    ft.manual_seed(seed)
    x = nn.Input((4, 16, 16))
    h = nn.ReLU()(nn.BatchNorm2d(16)(nn.Conv2d(4, 16, 3, padding=1)(x)))
    h = nn.ReLU()(h + nn.Conv2d(16, 16, 3, padding=1)(h))
    h = nn.MaxPool2d(2)(h)
    h = nn.ReLU()(nn.BatchNorm2d(32)(nn.Conv2d(16, 32, 3, padding=1, bias=False)(h)))
    h = nn.Dropout(0.25)(nn.Flatten()(nn.AdaptiveMaxPool2d(1)(h)))
    return nn.Model(x, nn.Linear(32, 10)(h))


def seeded_run(threads, deterministic, seed=0, steps=3):
    before = (ft.get_num_threads(), ft.are_deterministic_algorithms_enabled())
    try:
        ft.set_num_threads(threads)
        ft.use_deterministic_algorithms(deterministic)
        ft.manual_seed(seed)
        model = det_net(seed)
        program = model.compile(ft.optim.AdamW(model.parameters(), lr=1e-2), nn.CrossEntropyLoss(label_smoothing=0.1),
                                batch_size=32)
        rng = np.random.default_rng(seed)
        losses = []
        for _ in range(steps):
            x = rng.standard_normal((32, 4, 16, 16)).astype(np.float32)
            y = rng.integers(0, 10, 32)
            losses.append(program.train_step(x, y))
        return losses, state_bits(model), program.predict(x).numpy().tobytes()
    finally:
        ft.set_num_threads(before[0])
        ft.use_deterministic_algorithms(before[1])


@pytest.mark.parametrize("threads", [1, 2])
def test_same_seed_gives_bitwise_identical_runs(threads):
    a, b = seeded_run(threads, False), seeded_run(threads, False)
    assert a[0] == b[0]
    assert a[1] == b[1] and a[2] == b[2]
    # and the seed matters: a different seed gives a different model
    assert seeded_run(threads, False, seed=1)[1] != a[1]


def test_deterministic_mode_is_bitwise_identical_for_1_and_2_threads():
    before = (ft.get_num_threads(), ft.are_deterministic_algorithms_enabled())
    one, two = seeded_run(1, True), seeded_run(2, True)
    assert one[0] == two[0]
    assert one[1] == two[1] and one[2] == two[2]
    assert (ft.get_num_threads(), ft.are_deterministic_algorithms_enabled()) == before  # settings restored


# ---------------------------------------------------------------- 6. checkpoints

def train(program, first, count, size=8):
    return [program.train_step(*batch(size, seed=500 + k)) for k in range(first, first + count)]


RESUME_CASES = {
    "sgd_nesterov": (plain_net, compile_plain, lambda ps: ft.optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True,
                                                                      weight_decay=1e-3)),
    "adamw": (plain_net, compile_plain, lambda ps: ft.optim.AdamW(ps, lr=0.01)),
    "batchnorm_sgd": (make_resnet, compile_resnet, lambda ps: ft.optim.SGD(ps, lr=0.05, momentum=0.9)),
    "dropout_sgd": (lambda seed: plain_net(seed, dropout=0.3), compile_plain,
                    lambda ps: ft.optim.SGD(ps, lr=0.05, momentum=0.9)),
}

@pytest.mark.parametrize("case", list(RESUME_CASES))
def test_checkpoint_resume_is_bitwise_exact(case, tmp_path):
    make, comp, opt = RESUME_CASES[case]
    n, m = 3, 3
    a = make(0)
    pa = comp(a, opt(a.parameters()))
    train(pa, 0, n)
    path = str(tmp_path / "run.safetensors")
    ft.save(path, pa, epoch=1)
    saved = state_bits(a)
    want_losses = train(pa, n, m)
    b = make(9)  # other initial weights: everything must come from the checkpoint
    pb = comp(b, opt(b.parameters()))
    assert state_bits(b) != saved
    meta = ft.load(path, into=pb)
    assert meta["epoch"] == 1 and pb.step_count == n
    assert state_bits(b) == saved
    assert train(pb, n, m) == want_losses
    assert state_bits(b) == state_bits(a)
    sa, sb = pa.optimizer.state_dict(), pb.optimizer.state_dict()
    assert sa["param_groups"] == sb["param_groups"] and sa["state"].keys() == sb["state"].keys()
    for i in sa["state"]:
        for key in sa["state"][i]:
            assert np.asarray(sa["state"][i][key]).tobytes() == np.asarray(sb["state"][i][key]).tobytes()


def test_checkpoint_round_trip_values(tmp_path):
    """Parameters (PyTorch key names), optimizer state and metadata as written."""
    model = plain_net(1)
    program = compile_plain(model, ft.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    train(program, 0, 2)
    path = str(tmp_path / "c.safetensors")
    ft.save(path, program, epoch=4, step=7, metadata={"note": "hello"})
    tensors, meta = ft.load(path)
    sd = model.state_dict()
    for k, v in sd.items():
        assert tensors[k].dtype == v.dtype and tensors[k].shape == v.shape and tensors[k].tobytes() == v.tobytes()
    state = program.optimizer.state_dict()["state"]
    for i, entry in state.items():
        assert tensors[f"optimizer.state.{i}.momentum_buffer"].tobytes() == entry["momentum_buffer"].tobytes()
    assert meta["epoch"] == 4 and meta["step"] == 7 and meta["note"] == "hello"
    assert json.loads(meta["optimizer.param_groups"])[0]["lr"] == 0.05
    assert not [f for f in os.listdir(tmp_path) if f != "c.safetensors"]  # no temporary file left behind


@pytest.mark.parametrize("make", [plain_net, make_resnet], ids=["plain", "batchnorm"])
def test_checkpoint_opens_with_safetensors_numpy(make, tmp_path):
    st = pytest.importorskip("safetensors.numpy", reason="the safetensors package is not installed")
    model = make(2)
    comp = compile_resnet if make is make_resnet else compile_plain
    program = comp(model, ft.optim.AdamW(model.parameters(), lr=0.01))
    train(program, 0, 1)
    path = str(tmp_path / "c.safetensors")
    ft.save(path, program)
    tensors = st.load_file(path)
    for k, v in model.state_dict().items():
        assert k in tensors
        assert tensors[k].dtype == v.dtype and tensors[k].tobytes() == v.tobytes()
    for k, v in program.optimizer.state_dict()["state"][0].items():
        assert tensors[f"optimizer.state.0.{k}"].tobytes() == np.asarray(v).tobytes()


def test_checkpoint_keeps_scalar_shapes(tmp_path):
    st = pytest.importorskip("safetensors.numpy", reason="the safetensors package is not installed")
    model = make_resnet(2)
    program = compile_resnet(model, ft.optim.AdamW(model.parameters(), lr=0.01))
    train(program, 0, 1)
    path = str(tmp_path / "c.safetensors")
    ft.save(path, program)
    tensors = st.load_file(path)
    assert tensors["batch_norm2d.num_batches_tracked"].shape == ()
    assert tensors["optimizer.state.0.step"].shape == ()


def other_net(seed=0):
    """plain_net with a 5x5 first conv and 7 classes: 0.weight and 6.weight/6.bias differ."""
    ft.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(3, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(6, 8, 3, padding=1),
                         nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 7))


def test_checkpoint_of_another_architecture_is_refused(tmp_path):
    src = other_net(0)
    psrc = compile_plain(src, ft.optim.SGD(src.parameters(), lr=0.1, momentum=0.9))
    train(psrc, 0, 1)
    path = str(tmp_path / "other.safetensors")
    ft.save(path, psrc)
    model = plain_net(1)
    program = compile_plain(model, ft.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    train(program, 0, 1)
    before, opt_before = state_bits(model), program.optimizer.state_dict()
    with pytest.raises(ValueError) as info:
        ft.load(path, into=program)
    msg = str(info.value)
    assert "0.weight" in msg and "(6, 3, 5, 5)" in msg and "(6, 3, 3, 3)" in msg
    assert "7.weight" not in msg  # the first mismatch only
    assert state_bits(model) == before
    opt_after = program.optimizer.state_dict()
    assert all(opt_after["state"][i]["momentum_buffer"].tobytes() == opt_before["state"][i]["momentum_buffer"].tobytes()
               for i in opt_before["state"])
    # a checkpoint that lacks one of the model's tensors
    ft.save(path, nn.Sequential(nn.Conv2d(3, 6, 3, padding=1)))
    with pytest.raises((KeyError, ValueError), match="3.weight"):
        ft.load(path, into=program)
    assert state_bits(model) == before


@pytest.mark.parametrize("mismatch", ["groups", "class"])
def test_failed_optimizer_load_changes_nothing(mismatch, tmp_path):
    src = plain_net(0)
    psrc = compile_plain(src, ft.optim.AdamW(src.parameters(), lr=0.01))
    train(psrc, 0, 1)
    path = str(tmp_path / "c.safetensors")
    ft.save(path, psrc)
    model = plain_net(1)
    params = list(model.parameters())
    if mismatch == "groups":
        opt = ft.optim.AdamW([{"params": params[:2]}, {"params": params[2:], "weight_decay": 0.0}], lr=0.01)
    else:
        opt = ft.optim.SGD(params, lr=0.1, momentum=0.9)
    program = compile_plain(model, opt)
    train(program, 0, 1)
    before = state_bits(model)
    with pytest.raises((ValueError, KeyError, TypeError)):  # the class mismatch gives KeyError('momentum') today
        ft.load(path, into=program)
    assert state_bits(model) == before


def _corruptions(raw):
    """(label, bytes) of damaged versions of a valid checkpoint."""
    (n,) = struct.unpack("<Q", raw[:8])
    out = [(f"truncated to {k} bytes", raw[:k]) for k in (0, 3, 8, 16, 8 + n // 2, 8 + n, 8 + n + 10, len(raw) - 1)]
    out.append(("header length beyond the file", struct.pack("<Q", len(raw)) + raw[8:]))
    out.append(("header length 2**63", struct.pack("<Q", 1 << 63) + raw[8:]))
    out.append(("garbage", bytes(range(256)) * 4))
    out.append(("header not JSON", raw[:8] + b"\xff" * n + raw[8 + n:]))
    out.append(("header a JSON list", raw[:8] + b"[1, 2]".ljust(n) + raw[8 + n:]))
    header = json.loads(raw[8:8 + n])

    def crafted(label, edit):
        h = json.loads(raw[8:8 + n])
        edit(h)
        j = json.dumps(h).encode()
        j += b" " * (-len(j) % 8)
        out.append((label, struct.pack("<Q", len(j)) + j + raw[8 + n:]))

    crafted("a tensor beyond the data", lambda h: h["0.weight"].__setitem__(
        "data_offsets", [h["0.weight"]["data_offsets"][0], len(raw)]))
    crafted("negative offset", lambda h: h["0.weight"].__setitem__("data_offsets", [-4, 644]))
    crafted("overlapping tensors", lambda h: h["0.bias"].__setitem__("data_offsets", [0, 24]))
    crafted("unknown dtype", lambda h: h["0.weight"].__setitem__("dtype", "F99"))
    crafted("wrong dtype size", lambda h: h["0.weight"].__setitem__("dtype", "F16"))
    crafted("entry not a dict", lambda h: h.__setitem__("0.weight", [1, 2]))
    crafted("negative dimension", lambda h: h["0.weight"].__setitem__("shape", [-6, 3, 3, 3]))
    assert "0.weight" in header
    return out


def _crafted_bad_types(raw):
    (n,) = struct.unpack("<Q", raw[:8])
    out = []

    def crafted(label, edit):
        h = json.loads(raw[8:8 + n])
        edit(h)
        j = json.dumps(h).encode()
        j += b" " * (-len(j) % 8)
        out.append((label, struct.pack("<Q", len(j)) + j + raw[8 + n:]))

    crafted("a string offset", lambda h: h["0.weight"].__setitem__("data_offsets", [0, "x"]))
    crafted("a dtype that is a list", lambda h: h["0.weight"].__setitem__("dtype", ["F32"]))
    crafted("a dimension of 10**30", lambda h: h["0.weight"].__setitem__("shape", [10 ** 30]))
    crafted("metadata not a dict", lambda h: h.__setitem__("__metadata__", [1]))
    return out


def _checkpoint(tmp_path):
    model = plain_net(0)
    program = compile_plain(model, ft.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    train(program, 0, 1)
    path = str(tmp_path / "good.safetensors")
    ft.save(path, program)
    with open(path, "rb") as f:
        return f.read()


def test_corrupt_or_truncated_checkpoint_raises_value_error(tmp_path):
    raw = _checkpoint(tmp_path)
    model = plain_net(1)
    program = compile_plain(model, ft.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    train(program, 0, 1)
    before = state_bits(model)
    bad = str(tmp_path / "bad.safetensors")
    for label, data in _corruptions(raw):
        with open(bad, "wb") as f:
            f.write(data)
        with pytest.raises(ValueError):
            ft.load(bad, into=program)
            pytest.fail(f"{label}: loaded")
        with pytest.raises(ValueError):
            ft.load(bad)
        assert state_bits(model) == before, label
    # random damage to the header bytes: an exception (never a crash), and the model unchanged
    (n,) = struct.unpack("<Q", raw[:8])
    rng = np.random.default_rng(0)
    for _ in range(40):
        data = bytearray(raw)
        for pos in rng.integers(8, 8 + n, 3):
            data[pos] = int(rng.integers(0, 256))
        with open(bad, "wb") as f:
            f.write(bytes(data))
        try:
            ft.load(bad, into=program)
        except (ValueError, KeyError):
            assert state_bits(model) == before
        else:  # harmless damage (in padding, or a value that still fits): the checkpoint's weights were loaded
            before = state_bits(model)


def test_corrupt_header_types_raise_value_error(tmp_path):
    raw = _checkpoint(tmp_path)
    bad = str(tmp_path / "bad.safetensors")
    failures = []
    for label, data in _crafted_bad_types(raw):
        with open(bad, "wb") as f:
            f.write(data)
        try:
            ft.load(bad)
        except ValueError:
            continue
        except Exception as e:  # noqa: BLE001 - which exception is the point
            failures.append(f"{label}: {type(e).__name__}: {e}")
        else:
            failures.append(f"{label}: loaded")
    assert not failures, failures


def test_resume_with_loader_position(tmp_path):
    """ft.save/ft.load with a data loader in the middle of an epoch: the resumed run sees the same batches."""
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (40, 8, 8), dtype=np.uint8)
    labels = rng.integers(0, CLASSES, 40)

    def loader():
        return ft.data.Loader(ft.data.from_arrays(images, labels), 8, shuffle=True, seed=3, num_workers=1,
                              transforms=[ft.data.RandomHorizontalFlip(), ft.data.Normalize(0.5, 0.25)])

    def net(seed):
        ft.manual_seed(seed)
        return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(256, CLASSES))

    def comp(m):
        return m.compile(ft.optim.SGD(m.parameters(), lr=0.05, momentum=0.9), batch_size=8, input_shape=(1, 8, 8))

    a, la = net(0), loader()
    pa = comp(a)
    it = iter(la)
    for _ in range(2):
        pa.train_step(*next(it))
    path = str(tmp_path / "c.safetensors")
    ft.save(path, pa, loader=la)
    want = [pa.train_step(x, y) for x, y in it]  # the 3 batches left in the epoch
    want += [pa.train_step(x, y) for x, y in la]  # and the next epoch
    b, lb = net(1), loader()
    pb = comp(b)
    ft.load(path, into=pb, loader=lb)
    got = [pb.train_step(x, y) for x, y in lb]
    got += [pb.train_step(x, y) for x, y in lb]
    assert got == want
    assert state_bits(a) == state_bits(b)


# ---------------------------------------------------------------- 7. ft.fit: the C loop and a Python iterable

def test_fit_with_c_loader_equals_python_steps_with_the_schedule():
    """ft.fit over a fasttrain Loader (the epoch loop in C, per-step learning rates computed up front) trains
    exactly as train_step over the same batches with the schedule's closed form, lr_k = base * (0.25 + 0.75 k / 5)
    for k < 5 (LinearLR), then base."""
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (48, 8, 8), dtype=np.uint8)
    labels = rng.integers(0, CLASSES, 48)

    def loader():
        return ft.data.Loader(ft.data.from_arrays(images, labels), 16, shuffle=True, seed=5, num_workers=1,
                              transforms=[ft.data.RandomCrop(8, padding=1), ft.data.Normalize(0.5, 0.25)])

    def net():
        ft.manual_seed(4)
        return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.ReLU(),
                             nn.MaxPool2d(2), nn.Flatten(), nn.Linear(64, CLASSES))

    def comp(m, opt):
        return m.compile(opt, nn.CrossEntropyLoss(label_smoothing=SMOOTHING), batch_size=16, input_shape=(1, 8, 8))

    a = net()
    opt = ft.optim.SGD(a.parameters(), lr=0.1, momentum=0.9)
    sched = ft.optim.lr_scheduler.LinearLR(opt, start_factor=0.25, total_iters=5)
    history = ft.fit(comp(a, opt), loader(), 3, scheduler=sched, progress=False)
    b = net()
    opt_b = ft.optim.SGD(b.parameters(), lr=0.1, momentum=0.9)
    pb = comp(b, opt_b)
    lb, k, means = loader(), 0, []
    for epoch in range(3):
        lb.set_epoch(epoch)
        total = 0.0
        for x, y in lb:
            opt_b.param_groups[0]["lr"] = 0.1 * (0.25 + 0.75 * min(k, 5) / 5)
            total += pb.train_step(x, y) * len(y)
            k += 1
        means.append(total / 48)
    assert k == 9 and len(history["train_loss"]) == 3
    np.testing.assert_allclose(history["train_loss"], means, rtol=1e-12)
    assert state_bits(a) == state_bits(b)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1)


def fashion(train, count):
    try:
        src = ft.data.FashionMNIST(train=train)
    except FileNotFoundError as e:
        pytest.skip(f"Fashion-MNIST is not installed (Debian package dataset-fashion-mnist): {e}")
    return np.ascontiguousarray(src.images[:count]), np.ascontiguousarray(src.labels[:count]).astype(np.int64)


def fashion_net():
    ft.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
                         nn.AdaptiveMaxPool2d(1), nn.Flatten(), nn.Linear(64, 10))


FASHION_MEAN, FASHION_STD = 0.2860, 0.3530


@pytest.mark.parametrize("feed", ["c_loader", "python_iterable"])
def test_fashion_mnist_slice_trains_past_80_percent(feed, threads):
    """6000 training images, 2 epochs, batch 64, SGD Nesterov with a one-cycle schedule, label smoothing 0.1:
    more than 80% accuracy on 2000 test images (about 85% expected), fed by the C loader or by NumPy batches."""
    threads(2)
    xi, yi = fashion(True, 6000)
    xt, yt = fashion(False, 2000)
    model = fashion_net()
    opt = ft.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)
    program = model.compile(opt, nn.CrossEntropyLoss(label_smoothing=0.1), batch_size=64, input_shape=(1, 28, 28))
    sched = ft.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=2 * (6000 // 64), pct_start=0.2,
                                             anneal_strategy="linear", cycle_momentum=False)
    norm = [ft.data.Normalize(FASHION_MEAN, FASHION_STD)]
    if feed == "c_loader":
        train = ft.data.Loader(ft.data.from_arrays(xi, yi), 64, shuffle=True, seed=0, num_workers=1, drop_last=True,
                               transforms=norm)
        test = ft.data.Loader(ft.data.from_arrays(xt, yt), 500, num_workers=1, transforms=norm)
    else:
        def scaled(a):
            return ((a.astype(np.float32) / 255 - FASHION_MEAN) / FASHION_STD)[:, None]

        rng = np.random.default_rng(0)
        order = [rng.permutation(6000) for _ in range(2)]
        train = _Epochs([[(scaled(xi[o[i:i + 64]]), yi[o[i:i + 64]]) for i in range(0, 6000 - 63, 64)]
                         for o in order])
        test = [(scaled(xt[i:i + 500]), yt[i:i + 500]) for i in range(0, 2000, 500)]
    history = ft.fit(program, train, 2, val_loader=test, scheduler=sched, progress=False)
    assert len(history["val_accuracy"]) == 2
    acc = history["val_accuracy"][-1]
    assert acc > 0.80, f"test accuracy {acc:.4f} after 2 epochs on 6000 images"
    assert history["train_loss"][1] < history["train_loss"][0]
    # ft.evaluate agrees with the accuracy of program.predict's logits
    logits = program.predict(((xt.astype(np.float32) / 255 - FASHION_MEAN) / FASHION_STD)[:, None]).numpy()
    assert abs(np.mean(logits.argmax(1) == yt) - ft.evaluate(program, test)[1]) <= 1e-3


class _Epochs:
    """A plain Python iterable of (x, y) NumPy batches, another shuffle each pass."""

    def __init__(self, epochs):
        self.epochs, self.pass_ = epochs, 0

    def __len__(self):
        return len(self.epochs[0])

    def __iter__(self):
        batches = self.epochs[self.pass_ % len(self.epochs)]
        self.pass_ += 1
        return iter(batches)


# ---------------------------------------------------------------- 8. bad input

def snapshot(program):
    """Weights, buffers (BN running statistics), optimizer state and hyperparameters, as bytes."""
    sd = program.optimizer.state_dict()
    state = {(i, k): np.asarray(v).tobytes() for i, e in sd["state"].items() for k, v in e.items()}
    return state_bits(program.model), state, json.dumps(sd["param_groups"])


@pytest.fixture
def trained():
    """The residual net after one AdamW step (so that the optimizer has state to protect)."""
    model = make_resnet(seed=15)
    program = compile_resnet(model, ft.optim.AdamW(model.parameters(), lr=0.01))
    program.train_step(*batch(8, seed=1))
    return program


@pytest.mark.parametrize("what,make,error,match", [
    ("spatial size", lambda x, y: (x[:, :, :7], y), ValueError, r"shape \(8, 3, 8, 8\)"),
    ("channels", lambda x, y: (x[:, :2], y), ValueError, r"images have 2 channels, the model takes 3"),
    ("no batch dim", lambda x, y: (x[0], y), ValueError, r"shape"),
    ("empty batch", lambda x, y: (x[:0], y[:0]), ValueError, r"empty"),
    ("complex input", lambda x, y: (x.astype(np.complex64), y), TypeError, r"complex"),
    ("string input", lambda x, y: (np.full(x.shape, "a"), y), TypeError, None),
    ("labels too few", lambda x, y: (x, y[:4]), ValueError, r"labels"),
    ("labels 2-d", lambda x, y: (x, y[:, None]), ValueError, r"labels"),
    ("label = classes", lambda x, y: (x, np.where(np.arange(8) == 5, CLASSES, y)), IndexError,
     r"label 5 at position 5 is outside \[0, 5\)"),
    ("negative label", lambda x, y: (x, np.where(np.arange(8) == 2, -1, y)), IndexError, r"label -1 at position 2"),
])
def test_bad_batches_raise_and_change_nothing(trained, what, make, error, match):
    x, y = batch(8, seed=2)
    before = snapshot(trained)
    for call in (trained.train_step, trained.backward):
        with pytest.raises(error, match=match):
            call(*make(x, y))
        assert snapshot(trained) == before, f"{what}: {call.__name__} changed the model or optimizer"
    with pytest.raises(error):
        trained.evaluate(*make(x, y))
    assert snapshot(trained) == before
    # and the program still trains afterwards
    trained.train_step(x, y)
    assert snapshot(trained)[0] != before[0]


def test_wrong_input_shape_in_predict():
    program = compile_resnet(make_resnet())
    with pytest.raises(ValueError, match="shape"):
        program.predict(np.zeros((2, 3, 8, 9), np.float32))
    with pytest.raises(ValueError, match="1 channels, the model takes 3"):
        program.predict(np.zeros((2, 1, 8, 8), np.float32))


def test_float_labels_are_refused(trained):
    x, y = batch(8, seed=2)
    before = snapshot(trained)
    with pytest.raises((TypeError, ValueError)):
        trained.train_step(x, y.astype(np.float32) + 0.5)
    assert snapshot(trained) == before


def nan_loss_program(policy, seed=16):
    """No activation between the input and the logits path that could hide a NaN: a NaN pixel gives a NaN loss."""
    ft.manual_seed(seed)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(4, CLASSES))
    opt = ft.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    program = model.compile(opt, nn.CrossEntropyLoss(), batch_size=8, input_shape=(3, 8, 8), nan_policy=policy)
    program.train_step(*batch(8, seed=1))
    return program


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nonfinite_loss_raises_and_changes_nothing(bad):
    program = nan_loss_program("raise")
    x, y = batch(8, seed=3)
    x[2, 1, 4, 4] = bad
    before = snapshot(program)
    with pytest.raises(ValueError, match=r"(?i)loss is [-+]?(nan|inf)") as info:
        program.train_step(x, y)
    assert "skip" in str(info.value)  # it names the way out
    assert snapshot(program) == before
    assert np.isfinite(program.train_step(*batch(8, seed=4)))  # and training goes on


def test_nan_policy_skip_skips_the_step():
    program = nan_loss_program("skip")
    x, y = batch(8, seed=3)
    x[0, 0, 0, 0] = np.nan
    before = snapshot(program)
    steps, skipped = program.step_count, program.skipped_steps
    loss = program.train_step(x, y)
    assert math.isnan(loss)
    assert program.skipped_steps == skipped + 1
    assert snapshot(program) == before  # weights and momentum untouched
    program.train_step(*batch(8, seed=4))
    assert program.skipped_steps == skipped + 1 and program.step_count == steps + 2
    assert snapshot(program)[0] != before[0]


def test_nan_policy_skip_with_adamw_keeps_the_step_count():
    ft.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, CLASSES))
    opt = ft.optim.AdamW(model.parameters(), lr=0.01)
    program = model.compile(opt, batch_size=8, input_shape=(3, 8, 8), nan_policy="skip")
    program.train_step(*batch(8, seed=1))
    x, y = batch(8, seed=3)
    x[1, 2, 3, 4] = np.nan
    before = snapshot(program)
    program.train_step(x, y)
    assert snapshot(program) == before
    assert float(opt.state_dict()["state"][0]["step"]) == 1


@pytest.mark.parametrize("policy", ["raise", "skip"])
def test_nonfinite_step_leaves_running_statistics_alone(policy):
    ft.manual_seed(17)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(4, CLASSES))  # no ReLU after the BN: the NaN reaches the loss
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), batch_size=8,
                            input_shape=(3, 8, 8), nan_policy=policy)
    program.train_step(*batch(8, seed=1))
    before = snapshot(program)
    x, y = batch(8, seed=3)
    x[0, 0, 0, 0] = np.nan
    try:
        assert math.isnan(program.train_step(x, y)) and policy == "skip"
    except ValueError:
        assert policy == "raise"
    assert snapshot(program)[1:] == before[1:]  # the optimizer is untouched (this part holds today)
    assert {k: v for k, v in snapshot(program)[0].items() if "running" not in k} == \
        {k: v for k, v in before[0].items() if "running" not in k}  # and so are the weights
    changed = [k for k, v in snapshot(program)[0].items() if v != before[0][k]]
    assert not changed, f"changed by a step that was not applied: {changed}"  # the running statistics too


def test_nan_policy_skip_skips_nonfinite_gradients():
    model = make_resnet(seed=17)
    program = compile_resnet(model, ft.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), nan_policy="skip")
    program.train_step(*batch(8, seed=1))
    before = snapshot(program)
    x, y = batch(8, seed=3)
    x[0, 0, 0, 0] = np.nan
    skipped = program.skipped_steps
    program.train_step(x, y)  # must not raise
    assert program.skipped_steps == skipped + 1
    assert {k: v for k, v in snapshot(program)[0].items() if "running" not in k} == \
        {k: v for k, v in before[0].items() if "running" not in k}
    assert snapshot(program)[1:] == before[1:]


def test_optimizer_of_another_model_is_refused():
    model, other = make_resnet(seed=18), make_resnet(seed=19)
    with pytest.raises(ValueError, match=r"another model.*conv2d\.weight"):
        compile_resnet(model, ft.optim.SGD(other.parameters(), lr=0.1))
    # holding the model's parameters and another model's too
    with pytest.raises(ValueError, match="another model"):
        compile_resnet(model, ft.optim.SGD(list(model.parameters()) + list(other.parameters()), lr=0.1))
    # a parameter the compiled step does not know (the optimizer was rebuilt around another model since)
    program = compile_resnet(model)
    program.optimizer.param_groups[0]["params"].append(list(other.parameters())[0])
    mine, theirs = state_bits(model), state_bits(other)
    with pytest.raises(ValueError, match="another model"):
        program.train_step(*batch(8))
    assert state_bits(model) == mine and state_bits(other) == theirs


def test_optimizer_over_a_subset_updates_only_its_parameters():
    """As torch.optim: the parameters the optimizer does not hold get their gradient but keep their values."""
    model = make_resnet(seed=18)
    params = dict(model.named_parameters())
    program = compile_resnet(model, ft.optim.SGD([p for n, p in params.items() if n != "linear.bias"], lr=0.1))
    before = {n: p.numpy().copy() for n, p in params.items()}
    program.train_step(*batch(8))
    after = {n: p.numpy() for n, p in params.items()}
    assert np.array_equal(after["linear.bias"], before["linear.bias"])
    assert np.abs(params["linear.bias"].grad.numpy()).max() > 0
    assert not np.array_equal(after["linear.weight"], before["linear.weight"])


@pytest.mark.parametrize("lr", [float("nan"), float("inf"), -0.1])
def test_non_finite_learning_rate_is_refused(trained, lr):
    opt = trained.optimizer
    with pytest.raises(ValueError, match="lr"):
        ft.optim.SGD(trained.model.parameters(), lr=lr)
    before = snapshot(trained)
    opt.param_groups[0]["lr"] = lr  # what a bad scheduler would do
    try:
        with pytest.raises(ValueError, match="lr"):
            trained.train_step(*batch(8, seed=2))
        assert state_bits(trained.model) == before[0] and snapshot(trained)[1] == before[1]
    finally:
        opt.param_groups[0]["lr"] = 0.01


def test_bad_compile_options():
    model = make_resnet()
    with pytest.raises(ValueError, match="multiple"):
        compile_resnet(model, batch_size=8, accumulate_steps=3)
    with pytest.raises(ValueError):
        compile_resnet(model, batch_size=0)
    with pytest.raises(ValueError):
        compile_resnet(model, memory_format="nchw")
    for kw in (dict(clip_grad_norm=-1.0), dict(clip_grad_norm=float("nan")), dict(nan_policy="ignore")):
        before = state_bits(model)
        with pytest.raises(ValueError):
            compile_resnet(model, **kw).train_step(*batch(8))  # at compile time or at the first step
        assert state_bits(model) == before


# ---------------------------------------------------------------- 9. summary

def test_summary_reports_dropped_bias_fusions_shapes_and_counts():
    model = make_resnet()
    program = compile_resnet(model)
    text = program.summary()
    rows = [line for line in text.splitlines() if line[:3].strip().isdigit()]
    kinds = [r.split()[1] for r in rows]
    # the ReLUs are fused away: no node of their own; the loss's nodes follow the model's
    assert kinds == ["input", "Conv2d", "BatchNorm2d", "Conv2d", "Add", "MaxPool2d", "Conv2d",
                     "AdaptiveAvgPool2d", "Flatten", "Linear", "Target", "CrossEntropyLoss"]
    by = dict(zip(range(len(rows)), rows))
    assert "bias dropped" in by[1] and "bias dropped" not in by[3] and "bias dropped" not in by[6]
    for i in (2, 4, 6):
        assert "relu fused" in by[i], by[i]
    assert "fused" not in by[1] and "fused" not in by[9]
    for i, shape in {1: (6, 8, 8), 5: (6, 4, 4), 6: (8, 4, 4), 9: (CLASSES,)}.items():
        assert str(shape) in by[i]
    # parameter counts: 6*3*9+6, 2*6, 6*6*9+6, 8*6*9+8, 8*5+5
    for i, count in {1: 168, 2: 12, 3: 330, 6: 440, 9: 45}.items():
        assert f"{count:,}" in by[i].split(), by[i]
    assert "parameters: 995" in text


def test_summary_of_the_demo_block_drops_the_bias_through_max_pool():
    ft.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.MaxPool2d(2), nn.BatchNorm2d(4), nn.ReLU(),
                          nn.Conv2d(4, 4, 3, padding=1), nn.ReLU(), nn.BatchNorm2d(4),
                          nn.Flatten(), nn.Linear(4 * 14 * 14, 10))
    text = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=4, input_shape=(1, 28, 28)).summary()
    rows = [line for line in text.splitlines() if line[:3].strip().isdigit()]
    convs = [r for r in rows if r.split()[1] == "Conv2d"]
    assert "bias dropped" in convs[0]  # max pooling commutes with a per-channel constant
    assert "bias dropped" not in convs[1] and "relu fused" in convs[1]  # a ReLU stands between it and the BN
    assert "relu fused" in [r for r in rows if r.split()[1] == "BatchNorm2d"][0]


def test_fit_names_the_step_of_a_nonfinite_loss():
    program = nan_loss_program("raise")
    batches = [batch(8, seed=k) for k in range(5)]
    batches[3][0][0, 0, 0, 0] = np.nan
    with pytest.raises(ValueError, match=r"(?i)nan") as info:
        ft.fit(program, batches, 1, progress=False)
    assert re.search(r"(?i)step\D{0,3}(3|4|5)\b", str(info.value)), str(info.value)


@pytest.mark.parametrize("fmt", ["channels_last", "contiguous"])
def test_layer_norm_in_a_program_matches_finite_differences(fmt):
    """LayerNorm inside compiled programs (over features, and over (C, H, W) in NCHW memory): every parameter
    gradient against central differences of the program's own float64-accumulated loss."""
    ft.manual_seed(3)
    if fmt == "channels_last":
        model = nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8), nn.GELU(), nn.Linear(8, CLASSES))
        shape = (6,)
    else:
        model = nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), nn.LayerNorm((2, 4, 4)), nn.ReLU(), nn.Flatten(),
                              nn.Linear(32, CLASSES))
        shape = (1, 4, 4)
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=4, input_shape=shape,
                            memory_format=fmt)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, *shape)).astype(np.float32)
    y = rng.integers(0, CLASSES, 4)
    assert gradcheck(program, x, y, eps=1e-3, rtol=2e-2, atol=2e-3)  # eps small: ReLU's kink
    if fmt == "channels_last":
        with pytest.raises(ValueError, match="contiguous"):
            m2 = nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), nn.LayerNorm((2, 4, 4)), nn.Flatten(),
                               nn.Linear(32, CLASSES))
            m2.compile(ft.optim.SGD(m2.parameters(), lr=0.1), batch_size=4, input_shape=(1, 4, 4))


def test_a_model_compiled_again_after_zero_grad_fills_its_gradients():
    """zero_grad() sets .grad to None; compiling the model again gives each parameter its gradient back."""
    ft.manual_seed(5)
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, CLASSES))
    rng = np.random.default_rng(2)
    x, y = rng.standard_normal((4, 4)).astype(np.float32), rng.integers(0, CLASSES, 4)
    opt = ft.optim.SGD(model.parameters(), lr=0.1)
    model.compile(opt, batch_size=4, input_shape=(4,)).backward(x, y)
    want = [p.grad.numpy().copy() for p in model.parameters()]
    opt.zero_grad()
    model.compile(opt, batch_size=4, input_shape=(4,)).backward(x, y)
    for p, w in zip(model.parameters(), want):
        np.testing.assert_array_equal(p.grad.numpy(), w)


def test_mse_regression_program_matches_numpy():
    """A compiled MLP with MSELoss (mean over every output): loss and gradients against NumPy, and a few steps
    of SGD lower the loss."""
    ft.manual_seed(4)
    model = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.MSELoss(), batch_size=6, input_shape=(5,))
    rng = np.random.default_rng(9)
    x = rng.standard_normal((6, 5)).astype(np.float32)
    t = rng.standard_normal((6, 3)).astype(np.float32)
    P = {k: v.astype(np.float64) for k, v in model.state_dict().items()}
    h = np.tanh(x @ P["0.weight"].T + P["0.bias"])
    out = h @ P["2.weight"].T + P["2.bias"]
    loss = program.backward(x, t)
    np.testing.assert_allclose(loss, ((out - t) ** 2).mean(), rtol=1e-5)
    d_out = 2 * (out - t) / out.size
    d_h = d_out @ P["2.weight"] * (1 - h ** 2)
    grads = {"2.weight": d_out.T @ h, "2.bias": d_out.sum(0), "0.weight": d_h.T @ x, "0.bias": d_h.sum(0)}
    for name, p in model.named_parameters():
        np.testing.assert_allclose(p.grad.numpy(), grads[name], rtol=1e-4, atol=1e-6)
    first = program.train_step(x, t)
    for _ in range(20):
        last = program.train_step(x, t)
    assert last < 0.8 * first
    mean_loss, accuracy = program.evaluate(x, t)
    assert accuracy is None and mean_loss > 0
    with pytest.raises(ValueError, match="targets"):
        program.train_step(x, t[:, :2])


def test_model_summary_before_compiling():
    ft.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                          nn.Linear(4 * 8 * 8, CLASSES))
    bias = model[0].bias.numpy().copy()
    text = model.summary((1, 8, 8), batch_size=2)
    assert "bias dropped" in text and "relu fused" in text
    assert f"parameters: {sum(p.numel() for p in model.parameters()):,}" in text
    assert "MFLOP" in text and "(4, 8, 8)" in text
    np.testing.assert_array_equal(model[0].bias.numpy(), bias)  # summary changes nothing


def test_fit_with_skipped_steps_reports_a_finite_loss():
    program = nan_loss_program("skip")
    batches = [batch(8, seed=k) for k in range(4)]
    batches[2][0][0, 0, 0, 0] = np.nan
    history = ft.fit(program, batches, 1, progress=False)
    assert program.skipped_steps == 1 and np.isfinite(history["train_loss"][0])
