"""Helpers of the compiled-program tests (test_program_*.py): the parameters, gradients and raw state bytes
of a model, seeded batches, an independent float64 NumPy forward/backward of the residual batch-norm net that
most of them train (the same net in torch when importable), and that net and a plain one without batch norm."""
import numpy as np
import pytest

import fasttrain as ft
from _opref import torch

nn = ft.nn
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")


CLASSES = 5


SMOOTHING = 0.1


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

def assert_gradients_match(program, tm, x, y, torch_loss, atol=1e-6):
    """The program's loss and every parameter's gradient on (x, y) against the PyTorch twin tm's with torch_loss; x
    a tuple of the inputs of a forward of several."""
    loss = program.backward(x, y)
    want = torch_loss(tm(*map(torch.from_numpy, x if isinstance(x, tuple) else (x,))), torch.from_numpy(y))
    want.backward()
    assert loss == pytest.approx(want.item(), rel=1e-5)
    grads = dict(program.model.named_parameters())
    for name, p in tm.named_parameters():
        assert grads[name].requires_grad == p.requires_grad, name
        if p.grad is None:  # frozen, or read by nothing the loss reaches: None in both
            assert grads[name].grad is None, name
        else:
            np.testing.assert_allclose(grads[name].grad.numpy(), p.grad.numpy(), rtol=1e-4, atol=atol, err_msg=name)


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


# ---------------------------------------------------------------- the networks under test

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
