"""Values of the parameters alone in a traced forward (graph.Common): a weight standardized, normalized, masked or
merged with a low-rank update in forward, reductions over a parameter's own dimensions, parts, stacks and products
of parameters. They have PyTorch's shapes and dimensions, train through what they are computed from, and are
computed once per step, not once per sample."""
import numpy as np
import pytest

import fasttrain as ft
from fasttrain import nn
from fasttrain.nn import functional as F
from fasttrain.testing import gradcheck
from _programref import assert_gradients_match

try:  # an optional oracle
    import torch
except ImportError:
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch is not installed")

CLASSES = 4


def std_conv(lib):
    """BiT's weight-standardized convolution, written out."""
    L, G = (nn, F) if lib is ft else (lib.nn, lib.nn.functional)

    class Net(L.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.fc = L.Conv2d(3, 4, 3, padding=1), L.Linear(4, CLASSES)

        def forward(self, x):
            w = self.conv.weight
            w = (w - w.mean((1, 2, 3), keepdim=True)) / (w.var((1, 2, 3), keepdim=True, unbiased=False) + 1e-5).sqrt()
            return self.fc(G.conv2d(x, w, self.conv.bias, padding=1).mean((2, 3)))

    return Net(), (3, 6, 6)


def timm_std_conv(lib):
    """timm's StdConv2d: the weight normalized as a batch of one by F.batch_norm."""
    L, G = (nn, F) if lib is ft else (lib.nn, lib.nn.functional)

    class Net(L.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.fc = L.Conv2d(3, 4, 3, padding=1, bias=False), L.Linear(4, CLASSES)

        def forward(self, x):
            w = G.batch_norm(self.conv.weight.reshape(1, 4, -1), None, None, training=True, momentum=0.,
                             eps=1e-6).reshape_as(self.conv.weight)
            return self.fc(G.conv2d(x, w, None, padding=1).mean((2, 3)))

    return Net(), (3, 6, 6)


def weight_norm(lib):
    """A weight-normalized linear layer (DINO's head), g * v / |v| per output row."""
    L, G = (nn, F) if lib is ft else (lib.nn, lib.nn.functional)

    class Net(L.Module):
        def __init__(self):
            super().__init__()
            self.v = L.Parameter(lib.linspace(-1, 1, CLASSES * 5).reshape(CLASSES, 5))
            self.g = L.Parameter(lib.full((CLASSES, 1), 2.0))
            self.b = L.Parameter(lib.zeros(CLASSES))

        def forward(self, x):
            return G.linear(x, self.g * self.v / self.v.norm(dim=1, keepdim=True), self.b)

    return Net(), (5,)


def masked_conv(lib):
    """PixelCNN's masked convolution: the weight times a fixed mask buffer."""
    L, G = (nn, F) if lib is ft else (lib.nn, lib.nn.functional)

    class Net(L.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.fc = L.Conv2d(2, 4, 3, padding=1), L.Linear(4 * 16, CLASSES)
            mask = np.ones((4, 2, 3, 3), np.float32)
            mask[:, :, 1, 2:], mask[:, :, 2:] = 0, 0
            self.register_buffer("mask", lib.tensor(mask))

        def forward(self, x):
            return self.fc(G.conv2d(x, self.conv.weight * self.mask, self.conv.bias, padding=1).flatten(1))

    return Net(), (2, 4, 4)


def lora(lib):
    """A low-rank update merged into the weight: W + B A * scale."""
    L, G = (nn, F) if lib is ft else (lib.nn, lib.nn.functional)

    class Net(L.Module):
        def __init__(self):
            super().__init__()
            self.fc = L.Linear(6, CLASSES)
            self.A = L.Parameter(lib.linspace(-0.3, 0.3, 12).reshape(2, 6))
            self.B = L.Parameter(lib.linspace(0.2, -0.2, CLASSES * 2).reshape(CLASSES, 2))

        def forward(self, x):
            return G.linear(x, self.fc.weight + self.B @ self.A * 0.5, self.fc.bias)

    return Net(), (6,)


def normalized_up(lib):
    """A transposed convolution whose weight is divided by each input channel's norm."""
    L, G = (nn, F) if lib is ft else (lib.nn, lib.nn.functional)

    class Net(L.Module):
        def __init__(self):
            super().__init__()
            self.up, self.fc = L.ConvTranspose2d(3, 2, 2, stride=2), L.Linear(2 * 8 * 8, CLASSES)

        def forward(self, x):
            w = self.up.weight / self.up.weight.flatten(1).norm(dim=1).view(3, 1, 1, 1)
            return self.fc(G.conv_transpose2d(x, w, self.up.bias, stride=2).flatten(1))

    return Net(), (3, 4, 4)


def own_dimensions(lib):
    """Reductions, softmax, transposes and parts over a parameter's own dimensions, parameters stacked and joined:
    PyTorch's dimensions, not shifted by a batch (a sum over dimension 1 of a square weight summed its columns)."""
    L = nn if lib is ft else lib.nn

    class Net(L.Module):
        def __init__(self):
            super().__init__()
            self.w = L.Parameter(lib.linspace(-1.1, 0.9, 9).reshape(3, 3) + lib.eye(3))  # no ties
            self.a, self.b = L.Parameter(lib.ones(3)), L.Parameter(lib.full((3,), 2.0))
            self.fc = L.Linear(3, CLASSES)

        def forward(self, x):
            w = self.w
            r = (w * 2).sum(1) + w.mean(0) + w.t()[:, 1] + w.softmax(1)[2] + w.amax(0) - w.abs().amin(1) + \
                lib.stack((self.a, self.b)).view(-1)[1:4] + lib.cat([self.a, self.b])[2:5] + w.var(1) + \
                w.norm(dim=0) + w.exp().logsumexp(1)
            return self.fc(x * r)

    return Net(), (3,)


def scan(lib):
    """Mamba's discretized state matrix, einsum("bld,dn->bldn", delta, -exp(A))."""
    L = nn if lib is ft else lib.nn

    class Net(L.Module):
        def __init__(self):
            super().__init__()
            self.A_log = L.Parameter(lib.linspace(-1, 0.5, 15).reshape(5, 3))
            self.fc = L.Linear(15, CLASSES)

        def forward(self, x):
            return self.fc(lib.einsum("bld,dn->bldn", x, -lib.exp(self.A_log)).sum(1).flatten(1))

    return Net(), (2, 5)


def spectral(lib):
    """A weight divided by u W v, its largest singular value as a spectral norm's power iteration estimates it
    (u and v fixed buffers), and a learned mask token chosen by ft.where."""
    L, G = (nn, F) if lib is ft else (lib.nn, lib.nn.functional)

    class Net(L.Module):
        def __init__(self):
            super().__init__()
            self.fc = L.Linear(5, CLASSES)
            self.token = L.Parameter(lib.linspace(0.5, -0.5, 5))
            self.register_buffer("u", lib.linspace(0.2, 0.8, CLASSES))
            self.register_buffer("v", lib.linspace(0.5, -0.5, 5))

        def forward(self, x):
            w = self.fc.weight
            sigma = self.u @ (w @ self.v)
            return G.linear(lib.where(x > 1.0, self.token, x), w / sigma, self.fc.bias)

    return Net(), (5,)


def position_mlp(lib):
    """Swin V2's continuous position bias: an MLP of a constant table of coordinates (a buffer), called as a
    module (self.cpb_mlp(self.coords)) and written with F.linear, 16 * sigmoid of it added to the scores."""
    L, G = (nn, F) if lib is ft else (lib.nn, lib.nn.functional)

    class Net(L.Module):
        def __init__(self):
            super().__init__()
            self.fc = L.Linear(5, CLASSES)
            self.cpb_mlp = L.Sequential(L.Linear(2, 8), L.ReLU(inplace=True), L.Linear(8, 1, bias=False))
            self.register_buffer("coords", lib.linspace(-1, 1, 2 * CLASSES).reshape(1, CLASSES, 2))

        def forward(self, x):
            first, _, last = self.cpb_mlp
            table = self.cpb_mlp(self.coords) + G.linear(G.relu(G.linear(self.coords, first.weight, first.bias)),
                                                         last.weight)
            return self.fc(x) + 16 * lib.sigmoid(table.view(-1))

    return Net(), (5,)


MODELS = [std_conv, timm_std_conv, weight_norm, masked_conv, lora, normalized_up, own_dimensions, scan, spectral,
          position_mlp]


def data(shape, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((3, *shape)).astype(np.float32), np.arange(3) % CLASSES


@pytest.mark.parametrize("build", MODELS, ids=[b.__name__ for b in MODELS])
def test_values_of_the_parameters_alone_train_as_finite_differences_say(build):
    ft.manual_seed(0)
    model, shape = build(ft)
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=3,
                            input_shape=shape)
    x, y = data(shape)
    np.testing.assert_allclose(program.predict(x).numpy(), model(ft.tensor(x)).numpy(), rtol=1e-4, atol=1e-5)
    assert gradcheck(program, x, y, rtol=3e-2, atol=1e-3)


@needs_torch
@pytest.mark.parametrize("build", MODELS, ids=[b.__name__ for b in MODELS])
def test_values_of_the_parameters_alone_match_pytorch(build):
    (tm, shape), (model, _) = build(torch), build(ft)
    model.load_state_dict({k: v.detach().numpy() for k, v in tm.state_dict().items()})
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=3,
                            input_shape=shape)
    x, y = data(shape, 1)
    assert_gradients_match(program, tm, x, y, torch.nn.CrossEntropyLoss())
    for _ in range(3):  # and the weights they are computed from after steps
        program.train_step(x, y)
    opt = torch.optim.SGD(tm.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        torch.nn.CrossEntropyLoss()(tm(torch.from_numpy(x)), torch.from_numpy(y)).backward()
        opt.step()
    for name, p in tm.named_parameters():
        np.testing.assert_allclose(dict(model.named_parameters())[name].numpy(), p.detach().numpy(), rtol=1e-4,
                                   atol=1e-5, err_msg=name)


def test_a_computed_weight_is_one_row_computed_once_per_step():
    model, shape = std_conv(ft)
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=64,
                            input_shape=shape)
    nodes = program.memory_plan()["nodes"]
    common = [e.common for e in program.entries]
    assert any(common) and not common[program.output]
    for e, n in zip(program.entries, nodes):
        if e.common and n["output"]:
            assert n["output"] == 4 * int(np.prod(e.shape))  # one row, not 64
    assert "of the parameters alone: once per step" in str(program.summary())


def test_a_computed_weight_in_mixed_precision_and_recomputed_trains_as_in_float32():
    x, y = data((3, 6, 6), 2)
    losses = {}
    for options in ({}, {"precision": "bf16-mixed"}, {"recompute": "auto"}):
        ft.manual_seed(0)
        model, shape = std_conv(ft)
        program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=3,
                                input_shape=shape, **options)
        losses[str(options)] = [program.train_step(x, y) for _ in range(4)]
    plain, low, again = losses.values()
    assert again == plain  # recomputation changes no bit
    np.testing.assert_allclose(low, plain, rtol=2e-2)
    assert plain[-1] < plain[0]


class Misused(nn.Module):
    def __init__(self, use):
        super().__init__()
        self.use, self.w, self.fc = use, nn.Parameter(ft.ones(2, 3)), nn.Linear(3, CLASSES)
        self.bn = nn.BatchNorm1d(2)

    def forward(self, x):
        if self.use == "batch":  # (2, 3) against (N, 3): its leading 2 would be the batch's
            return self.fc(x * self.w.exp())
        if self.use == "in place":
            return self.fc(x * F.relu_(self.w * 2)[0])
        if self.use == "output":
            return self.w.exp()
        if self.use == "running":
            return self.fc(x * self.bn(self.w.exp().unsqueeze(0)).sum(1)[0])
        if self.use == "branch":
            return self.fc(x) if self.w.sum() > 0 else self.fc(-x)
        return self.fc(x * (self.w * 2).as_strided((3,), (2,))[0])


@pytest.mark.parametrize("use, message", [
    ("batch", r"a value of the parameters alone of shape \(2, 3\) with values of the samples \(of rank 1 each\)"),
    ("in place", "an in-place op on a value of the parameters alone"),
    ("output", r"returned a value of the parameters alone \(of shape \(2, 3\)\)"),
    ("running", "a batch norm with running statistics, or of a batch other than 1, on a value of the parameters alone"),
    ("branch", r"Python control flow or conversion on a value of the parameters alone \(if/bool/int/float\)"),
    ("strided", r"x.as_strided of a value of the parameters alone"),
])
def test_misused_values_of_the_parameters_alone_are_refused(use, message):
    model = Misused(use)
    with pytest.raises(ft.nn.TracingError, match=message):
        model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=2, input_shape=(3,))


EXPRESSIONS = {  # of x (N, 4) and the parameters w (3, 4), u (2, 3, 4), v (4,), a bool buffer m (3, 4)
    "where of a broadcast mask": lambda L, s, x: x * L.where(s.m[0, 0], s.u, s.u * 2.0).sum(2)[1, :, None].sum(0),
    "where of a column mask": lambda L, s, x: x * L.where(s.m[:, :1], s.w, -s.w).softmax(1)[2],
    "a bool mask in arithmetic": lambda L, s, x: s.fc(x) * (s.w * s.m).sum(1)[:2].sum(),
    "a comparison of the parameter": lambda L, s, x: x * L.where(s.w > 0, s.w, 0.1 * s.w)[1],
    "a run of its memory": lambda L, s, x: x * s.w.view(-1)[3:7].exp() + x * s.u.view(6, 4)[1:5].sigmoid()[2],
    "a strided run": lambda L, s, x: x * s.w.reshape(-1)[::3].exp(),
    "an expanded part": lambda L, s, x: x * s.w[:, :1].expand(-1, 4).exp()[0] + x * s.v[1:2].expand(4).exp(),
    "a copy of a transpose": lambda L, s, x: x * L.softmax(s.w.t().reshape(-1), 0)[4:8] + x * s.w.t().contiguous()
    .exp()[1:, 0].sum() + x * L.cat([s.v, s.w.t().flatten()])[2:6],
    "rows at fixed ids": lambda L, s, x: x * s.table(L.tensor([2, 0])).sum(0),
    "products of any ranks": lambda L, s, x: ((x[:, None] * s.v).expand(-1, 2, -1) @ (s.w * 2.0).t()).sum(1) @ s.w
    + x * (s.u @ s.v).sum() + ((s.w * 0.5) @ (x[:, :, None] * s.v)).sum(1),
    "expanded over the batch": lambda L, s, x: L.cat([(s.v * 2).expand(x.size(0), 1, -1), x[:, None]], 1).mean(1),
    "converted, powers": lambda L, s, x: x * (s.v[None] * 1.0).type_as(x).sum(0) + x * 2.0 ** s.v
    + x * abs(s.w * 1.0)[0],
    "a layer of a parameter": lambda L, s, x: x * s.fc(s.w).sum(0),
    "einsum of parameters": lambda L, s, x: x * L.einsum("ij,kj->ik", s.w, s.u[0]).sum(0)[:, None].expand(3, 4)[1]
    + x * L.einsum("ij->j", s.w),
}


def expressed(lib, name):
    L = nn if lib is ft else lib.nn

    class Net(L.Module):
        def __init__(self):
            super().__init__()
            self.w = L.Parameter(lib.linspace(-1.2, 1.1, 12).reshape(3, 4))
            self.u = L.Parameter(lib.linspace(0.9, -1.3, 24).reshape(2, 3, 4))
            self.v = L.Parameter(lib.linspace(-0.4, 0.7, 4))
            self.table = L.Embedding(3, 4)
            self.fc = L.Linear(4, 4)
            self.register_buffer("m", lib.tensor(np.arange(12).reshape(3, 4) % 3 == 1))

        def forward(self, x):
            return self.fc(EXPRESSIONS[name](lib, self, x))

    return Net()


@pytest.mark.parametrize("name", list(EXPRESSIONS))
def test_parts_masks_and_comparisons_of_parameters(name):
    """Masks that broadcast against values of the parameters alone, bool buffers in arithmetic, comparisons of a
    parameter, and any view of one (a run of its memory, a strided or expanded part, a copy of a transpose)."""
    ft.manual_seed(2)
    model = expressed(ft, name)
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=3,
                            input_shape=(4,))
    x, y = data((4,), 3)
    np.testing.assert_allclose(program.predict(x).numpy(), model(ft.tensor(x)).numpy(), rtol=1e-5, atol=1e-6)
    assert gradcheck(program, x, y, rtol=3e-2, atol=1e-3)
    if torch is not None:
        tm = expressed(torch, name)
        model.load_state_dict({k: v.detach().numpy() for k, v in tm.state_dict().items()})
        assert_gradients_match(program, tm, x, y, torch.nn.CrossEntropyLoss())


def test_a_value_of_the_parameters_alone_as_a_second_output_reaches_the_loss():
    """open_clip's forward returns (features, self.logit_scale.exp()) and its loss scales by the second."""
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.logit_scale = nn.Linear(4, CLASSES), nn.Parameter(ft.tensor(0.5))

        def forward(self, x):
            return self.fc(x), self.logit_scale.exp()

    ft.manual_seed(4)
    model = Scaled()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1),
                            lambda out, y: F.cross_entropy(out[0] * out[1], y), batch_size=3, input_shape=(4,))
    x, y = data((4,), 5)
    np.testing.assert_allclose(program.predict(x).numpy(), model(ft.tensor(x))[0].numpy(), rtol=1e-6)
    assert gradcheck(program, x, y, rtol=3e-2, atol=1e-3)


def test_a_detached_parameter_has_its_own_dimensions_and_no_gradient():
    class Detached(nn.Module):
        def __init__(self):
            super().__init__()
            self.w, self.fc = nn.Parameter(ft.linspace(-1.2, 1.1, 12).reshape(3, 4)), nn.Linear(4, CLASSES)

        def forward(self, x):
            return self.fc(x * self.w.detach().mean(0) + x * self.w.data.sum(1)[:1])

    model = Detached()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=3,
                            input_shape=(4,))
    x, y = data((4,), 6)
    w = model.w.numpy().astype(np.float64)
    h = x * w.mean(0) + x * w.sum(1)[:1]
    np.testing.assert_allclose(program.predict(x).numpy(), h @ model.fc.weight.numpy().T + model.fc.bias.numpy(),
                               rtol=1e-5, atol=1e-6)
    program.backward(x, y)
    assert model.w.grad is None or not model.w.grad.numpy().any()
