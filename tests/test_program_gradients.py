"""program.backward: the loss and every parameter gradient of a residual batch-norm net against an independent
float64 NumPy forward/backward (and torch when importable), max-pool ties, a batch split into micro-batches,
gradient accumulation with and without batch norm, LayerNorm by finite differences and an MSE regression."""
import numpy as np
import pytest

import fasttrain as ft
from fasttrain.testing import gradcheck
from _opref import torch
from _programref import (CLASSES, SMOOTHING, assert_grad_close, batch, ce_f, compile_plain, compile_resnet, conv_f,
                         grads_of, make_resnet, needs_torch, params_of, perturb_bn, plain_net, ref_net, set_params,
                         torch_resnet)

nn = ft.nn


# ---------------------------------------------------------------- loss and gradients

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


# ---------------------------------------------------------------- gradient accumulation

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


# ---------------------------------------------------------------- other layers and losses

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
    if fmt == "channels_last":  # a LayerNorm over images: contiguous by default, channels_last refused
        m2 = nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), nn.LayerNorm((2, 4, 4)), nn.Flatten(),
                           nn.Linear(32, CLASSES))
        m2.compile(ft.optim.SGD(m2.parameters(), lr=0.1), batch_size=4, input_shape=(1, 4, 4))
        with pytest.raises(ValueError, match="contiguous"):
            m2.compile(ft.optim.SGD(m2.parameters(), lr=0.1), batch_size=4, input_shape=(1, 4, 4),
                       memory_format="channels_last")


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
