"""nn.InPlaceABN: batch norm and an invertible activation whose backward takes the input back from the output.
Its gradients equal those of the two-op version (BatchNorm2d with weight |w| + eps, then LeakyReLU) and of finite
differences; a step trains the same; the compiled program frees the layer's input after the forward (a smaller
arena); eager use, channels-last, (N, C) features, eval mode and bad arguments behave."""
import numpy as np
import pytest

import fasttrain as ft

nn = ft.nn
EPS = 1e-5


def abn_net(act="leaky_relu", slope=0.1, width=6):
    return nn.Sequential(nn.Conv2d(3, width, 3, padding=1, bias=False),
                         nn.InPlaceABN(width, eps=EPS, activation=act, activation_param=slope),
                         nn.Conv2d(width, width, 3, padding=1, bias=False),
                         nn.InPlaceABN(width, eps=EPS, activation=act, activation_param=slope),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, 4))


def two_op_net(abn, act="leaky_relu", slope=0.1):
    """The same function with BatchNorm2d (weight |w| + eps) and LeakyReLU (or nothing) as separate layers."""
    layers = []
    for m in abn:
        if isinstance(m, nn.InPlaceABN):
            bn = nn.BatchNorm2d(m.num_features, eps=EPS)
            bn.weight.copy_(np.abs(m.weight.numpy()) + EPS)
            bn.bias.copy_(m.bias)
            layers.append(bn)
            if act == "leaky_relu":
                layers.append(nn.LeakyReLU(slope))
        else:
            layers.append(m)  # the same module object: shared weights, compiled twice below
    return nn.Sequential(*layers)


def perturbed(model, seed):
    """Random affine parameters of both signs (a negative weight checks |w|'s gradient), in place."""
    r = np.random.default_rng(seed)
    for m in model:
        if isinstance(m, nn.InPlaceABN):
            m.weight.copy_(r.choice([-1, 1], m.num_features) * r.uniform(0.5, 1.5, m.num_features))
            m.bias.copy_(r.normal(0, 0.5, m.num_features))
    return model


def data(n=8, seed=3):
    r = np.random.default_rng(seed)
    return r.normal(size=(n, 3, 6, 6)).astype(np.float32), r.integers(0, 4, n)


def grads(program, model, x, y):
    loss = program.backward(x, y)
    return loss, {n: p.grad.numpy().copy() for n, p in model.named_parameters()}


@pytest.mark.parametrize("act", ["leaky_relu", "identity"])
@pytest.mark.parametrize("fmt", ["contiguous", "channels_last"])
def test_gradients_equal_the_two_op_version(act, fmt):
    ft.manual_seed(0)
    abn = perturbed(abn_net(act), 1)
    x, y = data()
    opts = dict(batch_size=8, input_shape=(3, 6, 6), memory_format=fmt)
    loss, got = grads(abn.compile(ft.optim.SGD(abn.parameters(), lr=0.1), nn.CrossEntropyLoss(), **opts), abn, x, y)
    ref = two_op_net(abn, act)
    want_loss, want = grads(ref.compile(ft.optim.SGD(ref.parameters(), lr=0.1), nn.CrossEntropyLoss(), **opts),
                            ref, x, y)
    assert loss == pytest.approx(want_loss, rel=1e-6)
    names = {n: r for n, r in zip(dict(abn.named_parameters()), dict(ref.named_parameters()))}
    for (n, g), m in zip(got.items(), abn.named_parameters()):
        w = want[names[n]]
        if n.endswith("weight") and isinstance(dict(abn.named_modules())[n.rsplit(".", 1)[0]], nn.InPlaceABN):
            w = w * np.sign(m[1].numpy())  # d|w|/dw
        np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-5 * np.abs(w).max(), err_msg=n)


def test_gradients_match_finite_differences():
    """The compiled gradient of a few parameters of each tensor against central differences of the compiled loss
    (in batch-statistics mode, as the step computes it). The identity activation keeps the loss smooth: a leaky
    ReLU's kinks would put the differences' error above the gradient's (the test above covers it)."""
    ft.manual_seed(0)
    abn = perturbed(abn_net("identity"), 2)
    x, y = data(seed=5)
    program = abn.compile(ft.optim.SGD(abn.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=8,
                          input_shape=(3, 6, 6))
    _, g = grads(program, abn, x, y)
    r = np.random.default_rng(0)
    for name, p in abn.named_parameters():
        flat = p.numpy().reshape(-1)
        for i in r.choice(flat.size, 3, replace=False):
            h = 3e-3 * max(1.0, abs(flat[i]))
            old = float(flat[i])
            flat[i] = old + h
            up = program.backward(x, y)
            flat[i] = old - h
            down = program.backward(x, y)
            flat[i] = old
            fd = (up - down) / (2 * h)
            assert g[name].reshape(-1)[i] == pytest.approx(fd, rel=2e-2, abs=2e-4), (name, i)


def test_one_step_trains_as_the_two_op_version():
    """Three SGD-with-momentum steps: the same losses and running statistics as the two-op version (which holds
    copies of the convolutions and linear, so that each trains its own)."""
    ft.manual_seed(0)
    abn, twin = perturbed(abn_net(), 4), abn_net()
    for a, b in zip(twin.parameters(), abn.parameters()):
        a.copy_(b)
    ref = two_op_net(twin)
    x, y = data(seed=6)
    opts = dict(batch_size=8, input_shape=(3, 6, 6))
    pa = abn.compile(ft.optim.SGD(abn.parameters(), lr=0.1, momentum=0.9), nn.CrossEntropyLoss(), **opts)
    pr = ref.compile(ft.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9), nn.CrossEntropyLoss(), **opts)
    for _ in range(3):
        assert pa.train_step(x, y) == pytest.approx(pr.train_step(x, y), rel=1e-5)
    norms = [m for m in ref if isinstance(m, nn.BatchNorm2d)]
    for m, r in zip([m for m in abn if isinstance(m, nn.InPlaceABN)], norms):
        np.testing.assert_allclose(m.running_mean.numpy(), r.running_mean.numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(m.running_var.numpy(), r.running_var.numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(m.bias.numpy(), r.bias.numpy(), rtol=1e-4, atol=1e-6)


def test_the_input_is_freed_after_the_forward():
    """conv -> ABN -> conv -> ABN: with InPlace-ABN no conv output outlives its forward; with BatchNorm2d +
    LeakyReLU each is kept for the norm's backward."""
    def arena(model):
        p = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=64,
                          input_shape=(3, 16, 16))
        return p.memory_plan()["activations"]

    abn = abn_net(width=32)
    two = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.LeakyReLU(0.1),
                        nn.Conv2d(32, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.LeakyReLU(0.1),
                        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 4))
    one_map = 64 * 32 * 16 * 16 * 4
    assert arena(abn) <= arena(two) - one_map


def test_eager_forward_equals_the_compiled_one():
    ft.manual_seed(0)
    abn = perturbed(abn_net(), 7)
    x, y = data(seed=8)
    program = abn.compile(ft.optim.SGD(abn.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=8,
                          input_shape=(3, 6, 6))
    program.train_step(x, y)
    abn.eval()
    want = program.predict(x)
    np.testing.assert_allclose(abn(ft.from_numpy(x)).numpy(), np.asarray(want), rtol=1e-5, atol=1e-6)


def test_features_and_eval_mode():
    """(N, C) features through an ABN between linears, trained, then evaluated with running statistics."""
    ft.manual_seed(0)
    m = nn.Sequential(nn.Linear(5, 7), nn.InPlaceABN(7, activation_param=0.2), nn.Linear(7, 3))
    r = np.random.default_rng(9)
    x, y = r.normal(size=(16, 5)).astype(np.float32), r.integers(0, 3, 16)
    p = m.compile(ft.optim.SGD(m.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=16, input_shape=(5,))
    first = p.train_step(x, y)
    for _ in range(20):
        last = p.train_step(x, y)
    assert last < first
    m.eval()
    loss, accuracy = p.evaluate(x, y)
    eager = m(ft.from_numpy(x)).numpy()  # eval mode: the running statistics, in both
    shifted = eager - eager.max(1, keepdims=True)
    want = -(shifted[np.arange(16), y] - np.log(np.exp(shifted).sum(1))).mean()
    assert loss == pytest.approx(want, rel=1e-5)
    assert accuracy == pytest.approx((eager.argmax(1) == y).mean())


def test_bad_arguments():
    with pytest.raises(ValueError, match="recompute"):
        nn.InPlaceABN(4, activation="relu")
    with pytest.raises(ValueError, match="positive"):
        nn.InPlaceABN(4, activation_param=0.0)
    with pytest.raises(ValueError, match="eps"):
        nn.InPlaceABN(4, eps=0.0)
    with pytest.raises(ValueError, match="leaky_relu"):
        nn.InPlaceABN(4, activation="elu")


def test_a_following_relu_is_not_fused_into_it():
    """ReLU after an identity ABN stays a node of its own: fused, the ABN's activation would stop being
    invertible."""
    m = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.InPlaceABN(4, activation="identity"), nn.ReLU(),
                      nn.Flatten(), nn.Linear(4 * 36, 2))
    p = m.compile(ft.optim.SGD(m.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=4, input_shape=(3, 6, 6))
    assert any(n["node"] == "ReLU" for n in p.memory_plan()["nodes"])
