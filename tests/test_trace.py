"""model.compile() on a user's own nn.Module: forward traced once into the C program (torch.fx style), with
PyTorch's parameter names, the operators and functional calls of everyday PyTorch code, and clear errors."""
import math
import warnings

import numpy as np
import pytest

import fasttrain as ft
from fasttrain import nn
from fasttrain.nn import functional as F
from fasttrain.testing import gradcheck
from _programref import assert_gradients_match

CLASSES = 5


class Block(nn.Module):
    """A residual block as a PyTorch user writes it."""

    def __init__(self, c):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + x)


class Net(nn.Module):
    def __init__(self, depth=2, width=6):
        super().__init__()
        self.stem = nn.Conv2d(3, width, 3, padding=1)
        self.layer1 = nn.ModuleList([Block(width) for _ in range(depth)])
        self.fc = nn.Linear(width, CLASSES)

    def forward(self, x):
        x = F.relu(self.stem(x))
        for block in self.layer1:  # unrolled: the loop depends on the constructor only
            x = block(x)
        if x.shape[1] == 6:  # control flow on shapes is fine
            x = F.adaptive_avg_pool2d(x, 1)
        return self.fc(x.view(x.size(0), -1))


def functional_twin(net):
    """The same network as an ft.nn.Model graph over the same layer objects."""
    x = nn.Input((3, 8, 8))
    h = nn.ReLU()(net.stem(x))
    for b in net.layer1:
        o = nn.ReLU()(b.bn1(b.conv1(h)))
        h = nn.ReLU()(b.bn2(b.conv2(o)) + h)
    return nn.Model(x, net.fc(nn.Flatten()(nn.AdaptiveAvgPool2d(1)(h))))


def batch(n, shape=(3, 8, 8), seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, *shape)).astype(np.float32), rng.integers(0, CLASSES, n)


def grads(model):
    return {k: p.grad.numpy().copy() for k, p in model.named_parameters()}


def test_a_user_module_compiles_with_pytorch_names():
    ft.manual_seed(0)
    net = Net()
    keys = list(net.state_dict())
    assert keys[:4] == ["stem.weight", "stem.bias", "layer1.0.conv1.weight", "layer1.0.bn1.weight"]
    assert "layer1.1.bn2.running_mean" in keys and "layer1.1.bn2.num_batches_tracked" in keys
    program = net.compile(ft.optim.SGD(net.parameters(), lr=0.1), batch_size=4, input_shape=(3, 8, 8))
    table = program.summary()
    assert "Conv2d" in table and "+relu fused" in table
    x, y = batch(8)
    losses = [program.train_step(x, y) for _ in range(10)]
    assert losses[-1] < losses[0]


def test_traced_module_runs_the_same_program_as_its_graph():
    """Tracing records exactly the graph one would build by hand: bitwise equal losses and gradients."""
    x, y = batch(8, seed=1)
    results = []
    for build in (lambda n: n, functional_twin):
        ft.manual_seed(3)
        net = Net()
        model = build(net)
        program = model.compile(ft.optim.SGD(net.parameters(), lr=0.1), batch_size=8, input_shape=(3, 8, 8))
        loss = program.backward(x, y)
        results.append((loss, grads(net), [(e.kind, e.shape, e.act) for e in program.entries]))
    assert results[0][0] == results[1][0]
    for k in results[0][1]:
        assert np.array_equal(results[0][1][k], results[1][1][k]), k
    assert results[0][2] == results[1][2]


def test_traced_gradients_match_finite_differences():
    ft.manual_seed(4)
    net = Net(depth=1, width=6)
    program = net.compile(ft.optim.SGD(net.parameters(), lr=0.1), batch_size=4, input_shape=(3, 8, 8),
                          memory_format="contiguous")
    x, y = batch(4, seed=5)
    # eps small: ReLU and max pooling have kinks a wide step would cross
    assert gradcheck(program, x, y, eps=1e-3, rtol=3e-2, atol=3e-3)


class Tokens(nn.Module):
    """Sequence operations: a parameter as a value, a class token, permute, slicing, products and scales."""

    def __init__(self, c=8, t=4):
        super().__init__()
        self.proj = nn.Conv2d(1, c, 2, stride=2)  # patches of a 4x4 image: t = 4
        self.register_parameter("cls", nn.init.normal_(ft.empty(1, 1, c), std=0.1))
        self.register_parameter("pos", nn.init.normal_(ft.empty(1, t + 1, c), std=0.1))
        self.norm = nn.LayerNorm(c)
        self.gate = nn.Linear(c, c)
        self.head = nn.Linear(c, CLASSES)

    def forward(self, x):
        x = self.proj(x).flatten(2).transpose(1, 2)  # (N, T, C)
        x = ft.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        h = self.norm(x)
        x = x + F.gelu(self.gate(h)) * F.sigmoid(h) - 0.5 * h / 2
        return self.head(x[:, 0] + x[:, 2])


def test_sequence_operations_match_finite_differences():
    ft.manual_seed(6)
    model = Tokens()
    names = [k for k, _ in model.named_parameters()]
    assert names[:3] == ["cls", "pos", "proj.weight"]  # own parameters first, as PyTorch lists them
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=4, input_shape=(1, 4, 4),
                            memory_format="contiguous")
    x, y = batch(4, shape=(1, 4, 4), seed=7)
    assert gradcheck(program, x, y, eps=2e-3, rtol=3e-2, atol=3e-3)
    losses = [program.train_step(x, y) for _ in range(20)]
    assert losses[-1] < losses[0]


class ValueBranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, CLASSES)

    def forward(self, x):
        if x.mean((1,)) > 0:  # noqa: the line the error must name
            return self.fc(x)
        return self.fc(-x)


def test_control_flow_on_values_names_the_line():
    model = ValueBranch()
    with pytest.raises(ft.nn.TracingError) as info:
        model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=2, input_shape=(4,))
    assert "test_trace.py" in str(info.value) and "if x.mean((1,)) > 0" in str(info.value)


class Unsupported(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, CLASSES)

    def forward(self, x):
        return self.fc(x).cumsum(-1)


def test_an_unsupported_call_names_the_line():
    model = Unsupported()
    with pytest.raises(ft.nn.TracingError, match=r"x\.cumsum.*test_trace\.py:\d+"):
        model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=2, input_shape=(4,))


def test_batch_dimension_must_stay_whole():
    class Mixer(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, CLASSES)

        def forward(self, x):
            return self.fc(x.view(-1, 8))  # would mix samples when the features are not 8

    model = Mixer()
    with pytest.raises(ValueError, match="do not fit"):
        model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=2, input_shape=(4,))
    ok = Mixer()
    ok.compile(ft.optim.SGD(ok.parameters(), lr=0.1), batch_size=2, input_shape=(2, 4))


def test_sequential_of_user_modules_and_nested_models():
    ft.manual_seed(8)
    model = nn.Sequential(Block(3), nn.Flatten(), nn.Linear(3 * 8 * 8, CLASSES))
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=4, input_shape=(3, 8, 8))
    x, y = batch(4, seed=9)
    losses = [program.train_step(x, y) for _ in range(8)]
    assert losses[-1] < losses[0]
    assert "0.conv1.weight" in model.state_dict()


try:  # an optional oracle
    import torch
except ImportError:  # pragma: no cover - depends on the environment
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch is not installed")


def torch_twins():
    """The models above written in PyTorch, with the same attribute names."""
    tn, tf = torch.nn, torch.nn.functional

    class TBlock(tn.Module):
        def __init__(self, c):
            super().__init__()
            self.conv1 = tn.Conv2d(c, c, 3, padding=1, bias=False)
            self.bn1 = tn.BatchNorm2d(c)
            self.conv2 = tn.Conv2d(c, c, 3, padding=1, bias=False)
            self.bn2 = tn.BatchNorm2d(c)

        def forward(self, x):
            return tf.relu(self.bn2(self.conv2(tf.relu(self.bn1(self.conv1(x))))) + x)

    class TNet(tn.Module):
        def __init__(self, depth=2, width=6):
            super().__init__()
            self.stem = tn.Conv2d(3, width, 3, padding=1)
            self.layer1 = tn.ModuleList([TBlock(width) for _ in range(depth)])
            self.fc = tn.Linear(width, CLASSES)

        def forward(self, x):
            x = tf.relu(self.stem(x))
            for block in self.layer1:
                x = block(x)
            return self.fc(tf.adaptive_avg_pool2d(x, 1).view(x.size(0), -1))

    class TTokens(tn.Module):
        def __init__(self, c=8, t=4):
            super().__init__()
            self.proj = tn.Conv2d(1, c, 2, stride=2)
            self.cls = tn.Parameter(torch.zeros(1, 1, c))
            self.pos = tn.Parameter(torch.zeros(1, t + 1, c))
            self.norm = tn.LayerNorm(c)
            self.gate = tn.Linear(c, c)
            self.head = tn.Linear(c, CLASSES)

        def forward(self, x):
            x = self.proj(x).flatten(2).transpose(1, 2)
            x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
            h = self.norm(x)
            x = x + tf.gelu(self.gate(h)) * torch.sigmoid(h) - 0.5 * h / 2
            return self.head(x[:, 0] + x[:, 2])

    return {"Net": (Net, TNet, (3, 8, 8)), "Tokens": (Tokens, TTokens, (1, 4, 4))}


@needs_torch
@pytest.mark.parametrize("name", ["Net", "Tokens"])
def test_matches_pytorch_with_state_dicts_both_ways(name):
    """The same model written in PyTorch: state_dict has its keys in the same order and loads with strict=True both
    ways; one step's loss, every gradient and the updated weights agree to float32 tolerance."""
    ours_cls, theirs_cls, shape = torch_twins()[name]
    ft.manual_seed(10)
    ours = ours_cls()
    theirs = theirs_cls().double()
    assert list(ours.state_dict()) == list(theirs.state_dict())  # code that pairs two state_dicts by position
    theirs.load_state_dict({k: torch.tensor(v, dtype=torch.float64) for k, v in ours.state_dict().items()},
                           strict=True)
    back = ours_cls()
    back.load_state_dict({k: v.float().numpy() for k, v in theirs.state_dict().items()}, strict=True)
    for k, v in back.state_dict().items():
        assert np.array_equal(v, ours.state_dict()[k]), k
    program = ours.compile(ft.optim.SGD(ours.parameters(), lr=0.1), batch_size=4, input_shape=shape,
                           memory_format="contiguous")
    x, y = batch(4, shape=shape, seed=11)
    loss = program.backward(x, y)
    tloss = torch.nn.functional.cross_entropy(theirs(torch.tensor(x, dtype=torch.float64)), torch.tensor(y))
    tloss.backward()
    assert abs(loss - tloss.item()) < 1e-5 * max(1.0, abs(tloss.item()))
    tgrads = {k: p.grad.numpy() for k, p in theirs.named_parameters()}
    for k, p in ours.named_parameters():
        np.testing.assert_allclose(p.grad.numpy(), tgrads[k], rtol=1e-4, atol=1e-6, err_msg=k)


class ScaledConv(nn.Conv2d):
    """A layer subclass whose forward adds to the layer's (as timm's and LoRA wrappers do)."""

    def forward(self, x):
        return super().forward(x) * 2.0 + 1.0


class BatchNormAct2d(nn.BatchNorm2d):
    """timm's BatchNormAct2d: the batch norm, then an activation, in a subclass's forward."""

    def __init__(self, c):
        super().__init__(c)
        self.act = nn.SiLU()  # smooth: central differences cross no kink

    def forward(self, x):
        return self.act(super().forward(x))


class LayerNorm2d(nn.LayerNorm):
    """timm's LayerNorm2d: a LayerNorm over the channels of (N, C, H, W) maps."""

    def forward(self, x):
        x = x.permute(0, 2, 3, 1)
        x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)


class HalfLinear(nn.Linear):
    def forward(self, x):
        return F.linear(x, self.weight, self.bias).tanh() * 0.5


class Subclassed(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn, self.norm = ScaledConv(3, 4, 3, padding=1), BatchNormAct2d(4), LayerNorm2d(4)
        self.fc = HalfLinear(4, CLASSES)

    def forward(self, x):
        return self.fc(self.norm(self.bn(self.conv(x))).mean((2, 3)))


def test_a_layer_subclass_overriding_forward_compiles_its_forward():
    """A subclass of a layer the compiler knows, whose forward differs from the layer's (calling super().forward or
    the functional form, then more), compiles as that forward, not as the layer: the program's predictions are the
    eager model's and its gradients central differences'."""
    ft.manual_seed(12)
    model = Subclassed()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=4, input_shape=(3, 8, 8),
                            memory_format="contiguous")
    x, y = batch(4, seed=13)
    predicted = program.predict(x).numpy()
    eager = model.eval()(ft.tensor(x)).numpy()
    model.train()
    assert np.abs(eager).max() <= 0.5  # HalfLinear's forward
    np.testing.assert_allclose(predicted, eager, rtol=1e-5, atol=1e-6)
    assert gradcheck(program, x, y, eps=1e-3, rtol=3e-2, atol=3e-3)


def test_model_graphs_name_layers_after_their_classes():
    """nn.Model names each layer (or block called as one module) after its class, as Keras does."""
    x = nn.Input((3, 8, 8))
    h = nn.ReLU()(nn.BatchNorm2d(6)(nn.Conv2d(3, 6, 3, padding=1)(x)))
    h = Block(6)(Block(6)(h))
    model = nn.Model(x, nn.Linear(6, CLASSES)(nn.Flatten()(nn.AdaptiveAvgPool2d(1)(h))))
    names = [n for n, _ in model.named_parameters()]
    assert names == ["conv2d.weight", "conv2d.bias", "batch_norm2d.weight", "batch_norm2d.bias",
                     "block.conv1.weight", "block.bn1.weight", "block.bn1.bias", "block.conv2.weight",
                     "block.bn2.weight", "block.bn2.bias", "block_1.conv1.weight", "block_1.bn1.weight",
                     "block_1.bn1.bias", "block_1.conv2.weight", "block_1.bn2.weight", "block_1.bn2.bias",
                     "linear.weight", "linear.bias"]
    assert "(re_lu)" not in repr(model) and "(relu): ReLU()" in repr(model)


class FunctionsNet(nn.Module):
    """A forward written with ft.* functions (RMSNorm, a variance, ft.var_mean's layer norm, a softmax) rather than
    methods."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, CLASSES)
        self.w = nn.Parameter(nn.init.normal_(ft.empty(6), 1.0, 0.1))

    def forward(self, x):
        h = x * ft.rsqrt(ft.mean(ft.pow(x, 2), dim=-1, keepdim=True) + 1e-6) * self.w
        h = ft.div(h, ft.sqrt(ft.var(h, dim=-1, keepdim=True) + 1.0))
        var, mean = ft.var_mean(h, dim=-1, keepdim=True, unbiased=False)
        h = h + (h - mean) / (var + 1e-5).sqrt() * ft.std_mean(h, 1, keepdim=True)[0]
        h = ft.add(h, ft.exp(ft.sum(h, 1, keepdim=True) * 0.01), alpha=0.5)
        return self.fc(ft.mean(ft.softmax(h, -1) + ft.log(ft.abs(h) + 1), 1))


def test_ft_functions_of_traced_values_compile_and_match_finite_differences():
    ft.manual_seed(0)
    x = np.random.default_rng(1).standard_normal((4, 5, 6)).astype(np.float32)
    y = np.arange(4) % CLASSES
    assert gradcheck(FunctionsNet(), x, y, rtol=3e-2, atol=1e-3)


def test_std_of_equal_values_passes_no_gradient():
    """std over values that are all equal (a constant feature; in bf16-mixed, near-constant ones rounded to one
    bfloat16) has gradient 0 there, as PyTorch's std (sqrt's own derivative at 0 is infinite: the gradient was NaN
    and every step was refused); elsewhere (x - mean) / ((n - 1) std), by finite differences."""
    class Spread(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.w = nn.Linear(3, CLASSES), nn.Parameter(ft.ones(3))

        def forward(self, x):
            return self.fc((x * self.w).std(1))

    x = np.random.default_rng(26).standard_normal((4, 6, 3)).astype(np.float32)
    x[:, :, 1] = 0.5
    y = np.arange(4) % CLASSES
    for precision in ("32-true", "bf16-mixed"):
        ft.manual_seed(27)
        model = Spread()
        program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=4, input_shape=(6, 3),
                                precision=precision)
        program.backward(x, y)
        g = model.w.grad.numpy()
        assert np.all(np.isfinite(g)) and g[1] == 0 and abs(g[0]) > 1e-3, (precision, g)
    assert gradcheck(Spread(), x, y, rtol=3e-2, atol=1e-3)


def test_broadcast_sum_and_division_values_match_numpy():
    """The forward values of broadcasting, sums over dimensions, division and powers, against NumPy."""
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.one = nn.Parameter(ft.ones(4))  # for the optimizer: x * 1

        def forward(self, x):  # x: (N, 3, 4)
            x = x * self.one
            col = x.sum(1, keepdim=True)  # (N, 1, 4)
            row = x.mean(-1, keepdim=True)  # (N, 3, 1)
            return (x / (col.abs() + 1) - row * col + x.std(2, keepdim=True) ** 3).sum((1, 2), keepdim=False)

    x = np.random.default_rng(2).standard_normal((5, 3, 4)).astype(np.float32)
    net = Net()
    program = net.compile(ft.optim.SGD(net.parameters(), lr=0.1), nn.MSELoss(), batch_size=5, input_shape=(3, 4))
    col, row = x.sum(1, keepdims=True), x.mean(-1, keepdims=True)
    want = (x / (np.abs(col) + 1) - row * col + x.std(2, ddof=1, keepdims=True) ** 3).sum((1, 2))
    np.testing.assert_allclose(np.asarray(program.predict(x)), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("forward, error, match", [
    (lambda x: x + x.sum(1), ft.nn.TracingError, r"broadcasting values of shapes \(N, 3, 4\) and \(N, 4\)"),
    (lambda x: x * x[:, :2], ValueError, r"shapes \(N, 3, 4\) and \(N, 2, 4\) do not broadcast"),
    (lambda x: x ** x, ft.nn.TracingError, "a traced value to a traced power"),
    (lambda x: ft.div(x, x, rounding_mode="floor"), ft.nn.TracingError, "rounding_mode='floor'"),
    (lambda x: x.var(), ft.nn.TracingError, r"var\(\) over the batch"),
    (lambda x: x / x.shape[0], ft.nn.TracingError, "arithmetic on the batch size"),
    (lambda x: x.shape[0] / x, ft.nn.TracingError, "arithmetic on the batch size"),
])
def test_broadcasts_and_reductions_that_cannot_compile_say_why(forward, error, match):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return forward(self.fc(x)).flatten(1)

    net = Net()
    with pytest.raises(error, match=match):
        net.compile(ft.optim.SGD(net.parameters(), lr=0.1), nn.MSELoss(), batch_size=2, input_shape=(3, 4))


class CatAnywhere(nn.Module):
    """Concatenation along the features of (T, C) steps, and of a class-token parameter along the steps."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.fc = nn.Linear(4, 3), nn.Linear(4, 2), nn.Linear(6 * 5, CLASSES)
        self.cls = nn.Parameter(nn.init.normal_(ft.empty(1, 1, 5), std=0.5))

    def forward(self, x):  # (N, 6, 4)
        h = ft.cat([self.a(x), self.b(x)], dim=-1)  # (N, 6, 5)
        h = ft.cat([self.cls, h[:, 1:]], dim=1).softmax(-1)  # (N, 6, 5)
        return self.fc(h.flatten(1))


def test_cat_along_any_dimension_and_softmax_methods_match_finite_differences():
    x = np.random.default_rng(3).standard_normal((4, 6, 4)).astype(np.float32)
    model = CatAnywhere()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=4, input_shape=(6, 4))
    assert gradcheck(program, x, np.arange(4) % CLASSES, rtol=3e-2, atol=1e-3)


class Dense(nn.Module):
    """A DenseNet block's concatenation of every earlier feature map: more values than one node reads."""

    def __init__(self, growth=2, layers=11):
        super().__init__()
        self.convs = nn.ModuleList([nn.Conv2d(1 + k * growth, growth, 3, padding=1) for k in range(layers)])
        self.head = nn.Linear(1 + layers * growth, CLASSES)

    def forward(self, x):
        features = [x]
        for conv in self.convs:
            features.append(F.relu(conv(ft.cat(features, 1))))
        return self.head(ft.cat(features, 1).mean((2, 3)))


def test_a_concatenation_of_more_values_than_a_node_reads_matches_finite_differences():
    ft.manual_seed(15)
    model = Dense()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=2, input_shape=(1, 4, 4))
    x, y = batch(2, shape=(1, 4, 4), seed=16)
    np.testing.assert_allclose(program.predict(x).numpy(), model.eval()(ft.tensor(x)).numpy(), rtol=1e-5, atol=1e-6)
    model.train()
    assert gradcheck(program, x, y, eps=1e-3, rtol=3e-2, atol=3e-3)


def _one_step(loss, x, y, classes=3, **compile_args):
    """The loss of one SGD step of a Linear(4, classes) under loss, and the weight after it."""
    ft.manual_seed(0)
    model = nn.Linear(4, classes)
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.5), loss, input_shape=(4,), **compile_args)
    return program.train_step(x, y), model.weight.numpy().copy()


def test_a_loss_summed_over_the_batch_and_divided_by_its_size_is_its_mean():
    rng = np.random.default_rng(5)
    x, y = rng.standard_normal((6, 4)).astype(np.float32), rng.integers(0, 3, 6)
    mean = _one_step(lambda out, y: F.cross_entropy(out, y) + 0.5 * out.square().sum(1).mean(), x, y, batch_size=6)
    for divided in (lambda out, y: (F.cross_entropy(out, y, reduction="sum") + 0.5 * out.square().sum()) / out.shape[0],
                    lambda out, y: F.cross_entropy(out, y, reduction="none").sum() / out.size(0)
                    + 0.5 * out.square().sum() / out.size(0)):
        loss, weight = _one_step(divided, x, y, batch_size=8)  # N is the batch's size, not the compiled one
        assert loss == pytest.approx(mean[0], rel=1e-6)
        ft.testing.assert_close(weight, mean[1])


def test_a_summed_loss_with_ignored_labels_is_divided_by_the_whole_batch():
    """PyTorch's sum / N counts every sample; reduction='mean' would count only those not ignored."""
    rng = np.random.default_rng(6)
    x, y = rng.standard_normal((6, 4)).astype(np.float32), np.array([0, 2, -100, 1, -100, 2])
    w = np.array([0.5, 1.0, 2.0], np.float32)
    loss, _ = _one_step(lambda out, y: F.cross_entropy(out, y, ft.tensor(w), reduction="sum") / out.shape[0], x, y,
                        batch_size=6)
    ft.manual_seed(0)
    logits = nn.Linear(4, 3)(ft.tensor(x)).numpy().astype(np.float64)
    logp = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    kept = y != -100
    assert loss == pytest.approx(-(w[y[kept]] * logp[kept, y[kept]]).sum() / 6, rel=1e-5)


@pytest.mark.parametrize("loss, message", [
    (lambda out, y: F.cross_entropy(out, y) / out.shape[0], "divide a loss with reduction='sum' by N"),
    (lambda out, y: (out / out.shape[0]).sum(), "reduce a loss over the batch first"),
    (lambda out, y: F.cross_entropy(out, y, reduction="sum") * (1 / out.shape[0]), "can be divided by it"),
])
def test_other_arithmetic_on_the_batch_size_names_the_way_that_compiles(loss, message):
    model = nn.Linear(4, 3)
    with pytest.raises(ft.nn.TracingError, match=message):
        model.compile(ft.optim.SGD(model.parameters(), lr=0.1), loss, batch_size=2, input_shape=(4,))

class LayerScaled(nn.Module):
    """A per-channel scale used through a view of it, as ConvNeXt-style code writes it."""

    def __init__(self, how):
        super().__init__()
        self.how = how
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.g = nn.Parameter(ft.tensor(np.linspace(0.5, 2.0, 4).astype(np.float32)))
        self.fc = nn.Linear(4, CLASSES)

    def forward(self, x):
        g = {"view": lambda: self.g.view(1, -1, 1, 1), "index": lambda: self.g[:, None, None],
             "unsqueeze": lambda: self.g.unsqueeze(-1).unsqueeze(-1), "reshape": lambda: self.g.reshape(-1, 1, 1)}
        return self.fc((self.conv(x) * g[self.how]()).mean((2, 3)))


@pytest.mark.parametrize("how", ["view", "index", "unsqueeze", "reshape"])
def test_a_view_of_a_parameter_trains_the_parameter(how):
    x = np.random.default_rng(7).standard_normal((4, 3, 6, 6)).astype(np.float32)
    model = LayerScaled(how)
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=4, input_shape=(3, 6, 6))
    assert gradcheck(program, x, np.arange(4) % CLASSES, atol=1e-3)
    program.backward(x, np.arange(4) % CLASSES)
    assert np.abs(model.g.grad.numpy()).max() > 1e-3


class Transformed(nn.Module):
    def __init__(self, use):
        super().__init__()
        self.use = use
        self.fc = nn.Linear(4, CLASSES)
        self.scale = nn.Parameter(ft.zeros(1))
        self.pos = nn.Embedding(3, 4)
        self.teacher = nn.Linear(4, CLASSES)

    def forward(self, x):
        if self.use == "scaled":
            return F.linear(x, self.fc.weight * 2.0)
        if self.use == "part":
            return self.fc(x) + self.fc.weight[:, :1].sum()
        if self.use == "positions":
            return self.fc(x + self.pos(ft.arange(3)).sum(0))
        if self.use == "ids":  # not a range of positions
            return self.fc(x + self.pos(ft.tensor([2, 0])).sum(0))
        if self.use == "array":  # the buffer protocol, which NumPy reads before __array__
            return self.fc(x) + ft.from_numpy(np.array(self.fc.bias))
        if self.use == "memoryview":
            return self.fc(x) + float(memoryview(self.scale)[0])
        with ft.no_grad():
            t = self.teacher(x)
        return self.fc(x) + t


@pytest.mark.parametrize("use, message", [
    ("array", "a NumPy array of a trainable parameter outside the traced graph"),
    ("memoryview", r"a NumPy array \(or memoryview\) of a trainable parameter outside the traced graph"),
    ("no_grad", r"ft.no_grad\(\) around traced ops that train"),
])
def test_a_parameter_computed_on_outside_the_graph_is_refused_not_frozen(use, message):
    """Each would otherwise be a constant of the program, silently never trained (PyTorch trains through it)."""
    model = Transformed(use)
    with pytest.raises(ft.nn.TracingError, match=message):
        model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=2, input_shape=(4,))


@pytest.mark.parametrize("use", ["scaled", "part", "positions", "ids"])
def test_a_weight_or_rows_computed_from_parameters_alone_train(use):
    """A layer's weight computed in forward (F.linear(x, 2 w)), a part of a weight summed, a table's rows (a range,
    or at fixed ids) summed over its own dimension 0: values of the parameters alone, through which they train."""
    ft.manual_seed(3)
    model = Transformed(use)
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=2, input_shape=(4,))
    x, y = np.random.default_rng(9).standard_normal((2, 4)).astype(np.float32), np.array([0, 3])
    np.testing.assert_allclose(program.predict(x).numpy(), model(ft.tensor(x)).numpy(), rtol=1e-5, atol=1e-6)
    assert gradcheck(program, x, y, rtol=3e-2, atol=1e-3)


def test_a_part_of_a_weight_used_as_a_value_trains():
    """self.fc.weight[:, :1].sum() added to the logits: the column's elements train through it (it was refused)."""
    model = Transformed("part")
    x = np.random.default_rng(9).standard_normal((2, 4)).astype(np.float32)
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=2, input_shape=(4,))
    want = x @ model.fc.weight.numpy().T + model.fc.bias.numpy() + model.fc.weight.numpy()[:, 0].sum()
    np.testing.assert_allclose(program.predict(x).numpy(), want, rtol=1e-5, atol=1e-6)
    assert gradcheck(program, x, np.array([1, 3]), rtol=3e-2, atol=1e-3)


def test_the_export_check_takes_a_callable_and_leaves_exports_free_after_a_trace():
    """The hook a trace sets on buffer exports (np.array of a parameter): a non-callable is refused, and none stays
    set once compile is done."""
    with pytest.raises(TypeError, match="_set_export_check takes a callable or None, got int"):
        ft._C._set_export_check(3)
    model = Transformed("array")
    with pytest.raises(ft.nn.TracingError):
        model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=2, input_shape=(4,))
    assert np.array(model.fc.bias).shape == (CLASSES,) and memoryview(model.scale).nbytes == 4


def test_what_no_grad_holds_back_may_be_frozen_and_a_penalty_in_the_loss_trains():
    model = Transformed("no_grad")
    model.teacher.requires_grad_(False)
    model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=2, input_shape=(4,))  # nothing to hold back
    ft.manual_seed(0)
    plain = nn.Linear(4, CLASSES)
    program = plain.compile(ft.optim.SGD(plain.parameters(), lr=0.1),
                            lambda out, y: F.cross_entropy(out, y) + 0.1 * (plain.weight ** 3).sum(), batch_size=2,
                            input_shape=(4,))
    x, y = np.random.default_rng(8).standard_normal((2, 4)).astype(np.float32), np.array([0, 2])
    out = model_logits(plain, x)
    want = (np.log(np.exp(out).sum(1)) - out[np.arange(2), y]).mean() + 0.1 * (np.asarray(plain.weight,
                                                                                         np.float64) ** 3).sum()
    assert program.evaluate(x, y)[0] == pytest.approx(want, rel=1e-5)  # the penalty once, not once per sample
    assert gradcheck(program, x, y, rtol=3e-2, atol=1e-3)
    rows = plain.compile(ft.optim.SGD(plain.parameters(), lr=0.1),  # over the weight's own dimension 1: its rows
                         lambda out, y: F.cross_entropy(out, y) + 0.1 * plain.weight.sum(1).square().sum(),
                         batch_size=2, input_shape=(4,))
    w = np.asarray(plain.weight, np.float64)
    assert rows.evaluate(x, y)[0] == pytest.approx(want - 0.1 * (w ** 3).sum() + 0.1 * (w.sum(1) ** 2).sum(),
                                                   rel=1e-5)
    assert gradcheck(rows, x, y, rtol=3e-2, atol=1e-3)
    assert not ft.nn.graph._trainable  # tracing leaves eager ops free again
    assert (plain.weight ** 3).shape == (CLASSES, 4)


def model_logits(model, x):
    """A Linear model's logits of x, in float64 NumPy."""
    return x.astype(np.float64) @ np.asarray(model.weight, np.float64).T + np.asarray(model.bias)


class Gated(nn.Module):
    """Parameters computed on in forward: CLIP's learned temperature (logit_scale.exp()), a gate (sigmoid, tanh of
    a vector broadcast over the features), and a learned loss weight (Kendall et al.'s uncertainty weighting)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.logit_scale, self.gate = nn.Parameter(ft.tensor(0.5)), nn.Parameter(ft.full((3,), 0.3))
        self.log_var = nn.Parameter(ft.tensor(0.2))

    def forward(self, x):
        h = self.fc(x)
        return h * self.logit_scale.exp() + h * ft.sigmoid(self.gate) + (-self.gate).tanh() + (self.gate ** 2).sum()


def test_parameters_computed_on_in_forward_and_loss_train_through_the_computation():
    """Elementwise ops on a parameter (and its whole sum) are traced values the same for every sample: predict
    and the loss as NumPy (the learned weight multiplies the loss, its term is added once), gradients by central
    differences."""
    ft.manual_seed(9)
    m = Gated()
    program = m.compile(ft.optim.SGD(m.parameters(), lr=0.1),
                        lambda out, y: F.cross_entropy(out, y) * (-m.log_var).exp() + m.log_var, batch_size=4,
                        input_shape=(4,))
    x, y = np.random.default_rng(10).standard_normal((4, 4)).astype(np.float32), np.arange(4) % 3
    h, g = model_logits(m.fc, x), np.asarray(m.gate, np.float64)
    out = h * np.exp(0.5) + h / (1 + np.exp(-g)) + np.tanh(-g) + (g ** 2).sum()
    np.testing.assert_allclose(program.predict(x).numpy(), out, rtol=1e-5, atol=1e-6)
    ce = (np.log(np.exp(out).sum(1)) - out[np.arange(4), y]).mean()
    assert program.evaluate(x, y)[0] == pytest.approx(ce * np.exp(-0.2) + 0.2, rel=1e-5)
    assert gradcheck(program, x, y, rtol=3e-2, atol=1e-3)
    program.backward(x, y)
    assert all(abs(float(np.asarray(p.grad).sum())) > 1e-4 for p in (m.logit_scale, m.gate, m.log_var))


@pytest.mark.parametrize("compare", [lambda a, b: a == b, lambda a, b: a != b, lambda a, b: a > b,
                                     lambda a, b: a <= b])
def test_comparisons_of_traced_values_with_numbers_are_masks_not_one_bool(compare):
    """Python's default == of two objects is one bool, which would make a padding mask (y != 0) silently 1: a
    comparison with a number is a mask per element (the loss below against NumPy's), one with a tensor is
    refused."""
    ft.manual_seed(34)
    model = nn.Linear(4, 3)
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1),
                            lambda out, y: (F.cross_entropy(out, y, reduction="none") * compare(y, 1)).mean(),
                            batch_size=4, input_shape=(4,))
    x, y = np.random.default_rng(35).standard_normal((4, 4)).astype(np.float32), np.array([0, 1, 2, 1])
    out = model(ft.tensor(x)).numpy().astype(np.float64)
    per_sample = np.log(np.exp(out).sum(1)) - out[np.arange(4), y]
    assert program.backward(x, y) == pytest.approx((per_sample * compare(y, 1)).mean(), rel=1e-6)
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1),  # a 0-d tensor compares as its number
                            lambda out, y: (F.cross_entropy(out, y, reduction="none") * compare(y, ft.ones(()))).mean(),
                            batch_size=4, input_shape=(4,))
    assert program.backward(x, y) == pytest.approx((per_sample * compare(y, 1)).mean(), rel=1e-6)
    with pytest.raises(ft.nn.TracingError, match="a comparison of a bool mask with values that are not one"):
        model.compile(ft.optim.SGD(model.parameters(), lr=0.1), lambda out, y: (out * ((out > 0) == out)).sum(),
                      batch_size=2, input_shape=(4,))


class Extremes(nn.Module):
    """torch.maximum and minimum of two traced values and of a traced value and a tensor, a comparison of two
    traced values as a mask, and torch.roll of a traced value (Swin's cyclic shift)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 6), nn.Linear(4, 6)
        self.floor = ft.tensor(np.linspace(-0.5, 0.5, 6, dtype=np.float32))

    def forward(self, x):
        p, q = self.a(x), self.b(x)
        h = ft.maximum(p, q) + ft.minimum(self.floor, q) + p * (p > q).float() - q.maximum(self.floor) * (q <= p)
        rolled = ft.roll(h.view(-1, 2, 3), shifts=(1, -1), dims=(1, 2)).flatten(1)
        return rolled + p.view(-1, 2, 3).roll(1, 2).flatten(1)


def test_maximum_minimum_comparisons_and_roll_of_traced_values_match_numpy_and_finite_differences():
    ft.manual_seed(36)
    model = Extremes()
    x = np.random.default_rng(37).standard_normal((5, 4)).astype(np.float32)
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.MSELoss(), batch_size=5, input_shape=(4,))
    p, q = ((x.astype(np.float64) @ layer.weight.numpy().T + layer.bias.numpy()) for layer in (model.a, model.b))
    floor = model.floor.numpy()
    h = np.maximum(p, q) + np.minimum(floor, q) + p * (p > q) - np.maximum(q, floor) * (q <= p)
    want = np.roll(h.reshape(5, 2, 3), (1, -1), (1, 2)).reshape(5, 6) + np.roll(p.reshape(5, 2, 3), 1, 2).reshape(5, 6)
    np.testing.assert_allclose(program.predict(x).numpy(), want, rtol=1e-5, atol=1e-6)
    assert gradcheck(program, x, np.zeros((5, 6), np.float32), rtol=3e-2, atol=1e-3)
    linear = nn.Linear(4, 6)
    for loss, message in ((lambda out, y: out.roll(1).sum(), r"roll without dims .*x.roll\(s, dims=2\)"),
                          (lambda out, y: ft.maximum(out, 0.5).sum(), r"maximum with a number .*clamp\(min=number\)"),
                          (lambda out, y: out.cumsum(1).sum(), r"x.cumsum cannot be .*ft.ones\(T, T\).triu\(\)"),
                          (lambda out, y: out.topk(2).values.sum(), r"x.topk .* does not sort: .*x.amax\(dim\)")):
        with pytest.raises(ft.nn.TracingError, match=message):
            linear.compile(ft.optim.SGD(linear.parameters(), lr=0.1), loss, batch_size=5, input_shape=(4,))
    with pytest.raises(TypeError, match="minimum: expected a tensor, got list"):
        linear.compile(ft.optim.SGD(linear.parameters(), lr=0.1), lambda out, y: ft.minimum(out, [0.5] * 6).sum(),
                       batch_size=5, input_shape=(4,))


def _relative_index(w):
    """Swin's relative position index of a w x w window: (w*w, w*w) rows of a ((2w - 1)**2, heads) table."""
    coords = np.stack(np.meshgrid(np.arange(w), np.arange(w), indexing="ij")).reshape(2, -1)
    rel = (coords[:, :, None] - coords[:, None, :]).transpose(1, 2, 0) + (w - 1)
    return rel[..., 0] * (2 * w - 1) + rel[..., 1]


class RelativeBias(nn.Module):
    """Attention scores plus a learned relative position bias, written as Swin/BEiT (table[index].view(T, T,
    -1).permute(2, 0, 1)), as T5 (an Embedding of bucket ids), or through F.scaled_dot_product_attention's
    attn_mask; and parts of a parameter as values (its transpose, a block, a one-column table)."""

    def __init__(self, how, w=2, heads=2):
        super().__init__()
        self.how, self.T, self.heads = how, w * w, heads
        self.qk = nn.Linear(4, 2 * 2 * heads)
        self.table = nn.Parameter(ft.randn((2 * w - 1) ** 2, heads))
        self.buckets = nn.Embedding((2 * w - 1) ** 2, heads)
        self.w = nn.Parameter(ft.randn(4, 6) * 0.5)
        self.column = nn.Parameter(ft.randn(9, 1))
        self.register_buffer("index", ft.tensor(_relative_index(w)))

    def forward(self, x):
        B, T, H = x.shape[0], self.T, self.heads
        q, k = self.qk(x).view(B, T, 2, H, 2).permute(2, 0, 3, 1, 4)
        if self.how == "swin":
            bias = self.table[self.index.view(-1)].view(T, T, -1).permute(2, 0, 1).contiguous().unsqueeze(0)
        elif self.how == "t5":
            bias = self.buckets(self.index).permute([2, 0, 1])[None]
        else:
            v = q + self.w.T[:1, :2]  # a part of a transposed parameter
            return F.scaled_dot_product_attention(q, k, v, attn_mask=self.table[self.index].permute(2, 0, 1)) \
                + (x @ self.w[:, 1:6:2])[:, None, :, :2] + self.column[self.index[0]].view(T, 1)
        return (q @ k.transpose(-2, -1) + bias).softmax(-1)

    def reference(self, x):
        """The forward in NumPy, float64."""
        B, T, H = x.shape[0], self.T, self.heads
        q, k = (x.astype(np.float64) @ self.qk.weight.numpy().T + self.qk.bias.numpy()).reshape(B, T, 2, H, 2) \
            .transpose(2, 0, 3, 1, 4)
        table = (self.buckets.weight if self.how == "t5" else self.table).numpy().astype(np.float64)
        s = q @ k.transpose(0, 1, 3, 2) * (1 if self.how != "sdpa" else 2 ** -0.5) + \
            table[self.index.numpy()].transpose(2, 0, 1)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        if self.how != "sdpa":
            return p
        w = self.w.numpy().astype(np.float64)
        return p @ (q + w.T[:1, :2]) + (x @ w[:, 1:6:2])[:, None, :, :2] + \
            self.column.numpy()[self.index.numpy()[0]].reshape(T, 1)


@pytest.mark.parametrize("how", ["swin", "t5", "sdpa"])
def test_a_relative_position_bias_and_parts_of_parameters_train_through_their_positions(how):
    """A trainable table read at a fixed index buffer (Swin's and BEiT's relative position bias, T5's buckets, a
    bias given as SDPA's attn_mask), and a transposed parameter's part, a block of columns and a one-column table
    as values: each trains, its gradient the sum over the samples and positions reading each element (it compiled
    to a constant that never trained, then was refused)."""
    ft.manual_seed(40)
    model = RelativeBias(how)
    x = np.random.default_rng(41).standard_normal((3, 4, 4)).astype(np.float32)
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.MSELoss(), batch_size=3, input_shape=(4, 4))
    np.testing.assert_allclose(program.predict(x).numpy(), model.reference(x), rtol=1e-5, atol=1e-6)
    y = np.random.default_rng(42).standard_normal(model.reference(x).shape).astype(np.float32)
    assert gradcheck(program, x, y, rtol=3e-2, atol=1e-4)
    table = model.buckets.weight if how == "t5" else model.table
    before = table.numpy().copy()
    program.train_step(x, y)
    assert not np.array_equal(table.numpy(), before)


def test_gathered_parameters_name_what_compiles():
    """A table's elements at positions that are neither rows nor evenly spaced columns are refused naming the line
    and the form that compiles; a view folding windows into the batch names its."""
    class Bias(nn.Module):
        def __init__(self, how):
            super().__init__()
            self.table, self.how, self.fc = nn.Parameter(ft.zeros(7, 2)), how, nn.Linear(4, 4)
            self.register_buffer("index", ft.tensor(np.arange(16).reshape(4, 4) % 7))

        def forward(self, x):
            h = self.fc(x)
            if self.how == "scattered":
                return h + self.table.view(-1)[self.index]
            return h.view(-1, 2, 4)  # two rows of each sample into the batch

    for how, message in (("scattered", r"elements at positions that are neither rows nor evenly spaced columns"),
                         ("window", r"folds 2 parts of each sample into the batch .* x.view\(x.size\(0\), 2, 2, 4\)")):
        model = Bias(how)
        with pytest.raises(ft.nn.TracingError, match=message):
            model.compile(ft.optim.SGD(model.parameters(), lr=0.1), lambda o, y: o.sum(), batch_size=2,
                          input_shape=(4, 4))


def test_a_tie_of_maximum_gives_each_side_half_the_gradient_as_pytorch():
    """maximum(p, p * 1) is p with the whole gradient: half through each operand, as torch's rule splits a tie; the
    value at a tie is the operand itself, infinite ones included (minimum likewise)."""
    class Tied(nn.Module):
        def __init__(self, tie):
            super().__init__()
            self.fc, self.tie = nn.Linear(4, 3), tie

        def forward(self, x):
            h = self.fc(x)
            return ft.maximum(h, h * 1.0) if self.tie == "max" else ft.minimum(h * 1.0, h) if self.tie else h

    x = np.random.default_rng(38).standard_normal((4, 4)).astype(np.float32)
    x[0] = np.inf
    runs = []
    for tie in (None, "max", "min"):
        ft.manual_seed(39)
        model = Tied(tie)
        program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), lambda out, y: out.sum(), batch_size=4,
                                input_shape=(4,))
        runs.append((program.predict(x).numpy(), program.backward(x[1:], None), model.fc.weight.grad.numpy()))
    for out, loss, grad in runs[1:]:
        np.testing.assert_array_equal(out, runs[0][0])
        assert loss == runs[0][1]
        np.testing.assert_array_equal(grad, runs[0][2])


def hand_attention(lib=ft, C=8, H=2, T=4):
    """nanoGPT's causal self-attention, written by hand: heads as a leading dimension, a causal mask buffer."""
    L = nn if lib is ft else lib.nn

    class HandAttention(L.Module):
        def __init__(self):
            super().__init__()
            self.c_attn, self.c_proj = L.Linear(C, 3 * C), L.Linear(C, C)
            self.register_buffer("bias", lib.tril(lib.ones(T, T)).view(1, 1, T, T))
            self.out = L.Parameter(lib.ones(C, CLASSES) * 0.1)

        def forward(self, x):
            B, T, C = x.size()
            q, k, v = self.c_attn(x).split(C, dim=2)
            q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf")).softmax(dim=-1)
            y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
            return (self.c_proj(y) @ self.out).mean(1)  # a sequence times a 2-d parameter

    return HandAttention()


def test_hand_written_causal_attention_matches_finite_differences():
    x = np.random.default_rng(8).standard_normal((3, 4, 8)).astype(np.float32)
    ft.manual_seed(0)
    model = hand_attention()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=3, input_shape=(4, 8),
                            memory_format="contiguous")
    assert gradcheck(program, x, np.arange(3) % CLASSES)
    # the causal buffer is read as the constant mask of one masked fill (not products of expanded 0/1 masks)
    kinds = [type(e.module).__name__ for e in program.entries]
    assert kinds.count("MaskedFill") == 1 and "Expand" not in kinds and "Mul" not in kinds


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_hand_written_attention_is_one_batched_matmul_and_deterministic(threads, precision):
    """The heads' products run as one batched matmul over dense copies of the strided views (per-head calls ran
    oneDNN's reference kernel, 100x slower): in deterministic mode the steps are bitwise the same at 1 and 2
    threads."""
    x = np.random.default_rng(10).standard_normal((16, 4, 8)).astype(np.float32)
    y = np.arange(16) % CLASSES
    runs = []
    ft.use_deterministic_algorithms(True)
    try:
        for n in (1, 2):
            threads(n)
            ft.manual_seed(0)
            model = hand_attention()
            program = model.compile(ft.optim.AdamW(model.parameters(), lr=0.01), batch_size=16, input_shape=(4, 8),
                                    memory_format="contiguous", precision=precision)
            runs.append(([program.train_step(x, y) for _ in range(3)], program.flat_params.numpy().tobytes()))
    finally:
        ft.use_deterministic_algorithms(False)
    assert runs[0] == runs[1]


@needs_torch
def test_hand_written_causal_attention_matches_pytorch():
    x = np.random.default_rng(9).standard_normal((3, 4, 8)).astype(np.float32)
    y = np.arange(3) % CLASSES
    tm = hand_attention(torch)
    model = hand_attention()
    model.load_state_dict({k: v.detach().numpy() for k, v in tm.state_dict().items()})
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=3, input_shape=(4, 8),
                            memory_format="contiguous")
    assert_gradients_match(program, tm, x, y, torch.nn.functional.cross_entropy)


class HandLinear(nn.Module):
    def __init__(self, how):
        super().__init__()
        self.how = how
        self.W = nn.Parameter(ft.tensor(np.linspace(-1, 1, 4 * CLASSES).reshape(4, CLASSES).astype(np.float32)))
        self.Wt = nn.Parameter(ft.tensor(np.linspace(1, -1, 4 * CLASSES).reshape(CLASSES, 4).astype(np.float32)))
        self.b = nn.Parameter(ft.zeros(CLASSES))

    def forward(self, x):
        return (x @ self.W if self.how == "W" else x @ self.Wt.T if self.how == "T" else x @ self.Wt.t()) + self.b


@pytest.mark.parametrize("how", ["W", "T", "t"])
def test_a_linear_layer_written_with_at_trains_as_pytorch_computes_it(how):
    """x @ W of (N, K) samples, and x @ W.T (a linear layer's product of the parameter itself)."""
    x = np.random.default_rng(10).standard_normal((5, 4)).astype(np.float32)
    y = np.arange(5) % CLASSES
    model = HandLinear(how)
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=5, input_shape=(4,))
    W = model.W.numpy() if how == "W" else model.Wt.numpy().T
    logits = x.astype(np.float64) @ W
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    assert program.evaluate(x, y)[0] == pytest.approx(-np.log(p[np.arange(5), y]).mean(), rel=1e-5)
    assert gradcheck(program, x, y)


def test_where_with_a_fixed_mask_takes_traced_values_and_constants():
    mask = ft.tensor(np.array([True, False, True]))

    class Chosen(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 3)

        def forward(self, x):
            h = self.fc(x)
            return ft.where(mask, h, -2.0 * h) + ft.where(~mask, 1.5, h)

    x = np.random.default_rng(11).standard_normal((4, 4)).astype(np.float32)
    model = Chosen()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=4, input_shape=(4,))
    h = x.astype(np.float64) @ model.fc.weight.numpy().T + model.fc.bias.numpy()
    np.testing.assert_allclose(program.predict(x).numpy(), np.where(mask.numpy(), 2 * h, -2 * h + 1.5), rtol=1e-5,
                               atol=1e-6)
    assert gradcheck(program, x, np.arange(4) % 3)
    with pytest.raises(ft.nn.TracingError, match="a condition of traced values other than a bool mask"):
        model.compile(ft.optim.SGD(model.parameters(), lr=0.1), lambda out, y: ft.where(out, out, 0.0).mean(),
                      batch_size=4, input_shape=(4,))


class PaddedPool(nn.Module):
    """Token features pooled under the padding mask of the ids (ids == 0), in one of the ways people write it."""

    def __init__(self, kind):
        super().__init__()
        self.kind = kind
        self.table, self.score, self.head = nn.Embedding(12, 8), nn.Linear(8, 1), nn.Linear(8, 3)
        self.token = nn.Parameter(ft.linspace(-1, 1, 8))  # BERT's mask token
        self.register_buffer("causal", ft.triu(ft.ones(6, 6, dtype=ft.bool), diagonal=1))

    def forward(self, ids):
        h, pad = self.table(ids), ids == 0
        if self.kind == "max":
            z = h.masked_fill(pad.unsqueeze(-1), -1e9).max(1).values
        elif self.kind == "attention pooling":
            z = (h * self.score(h).squeeze(-1).masked_fill(pad, float("-inf")).softmax(1).unsqueeze(-1)).sum(1)
        elif self.kind == "where":
            z = ft.where(pad.unsqueeze(-1), 0.0, h).sum(1) + ft.where(~pad.unsqueeze(-1), h, h * 0.5).sum(1)
        elif self.kind == "broadcast":  # a mask token (D,), a mean (N, 1, D), an expanded mask, masks combined
            z = ft.where(pad.unsqueeze(-1), self.token, h).sum(1) + ft.where(pad[..., None], h.mean(1, keepdim=True),
                                                                              h).sum(1)
            z = z + h.masked_fill(pad.unsqueeze(-1).expand(-1, -1, 8) | (h > 0.5), -3.0).sum(1)
            z = z + ft.where(ft.logical_and(~pad, ids > 4), 1.0, 0.0).sum(1, keepdim=True)
        elif self.kind == "causal | pad":
            s = (h @ h.transpose(-2, -1) / 8 ** 0.5).masked_fill(self.causal | pad[:, None, :], float("-inf"))
            z = (s.softmax(-1).masked_fill(pad[:, :, None], 0.0) @ h).sum(1)
        else:  # self-attention, causal and over the keys that are not padding
            causal = ft.triu(ft.ones(6, 6, dtype=ft.bool), diagonal=1)
            s = (h @ h.transpose(-2, -1) / 8 ** 0.5).masked_fill(causal, float("-inf"))
            s = s.masked_fill(pad[:, None, :], float("-inf")).softmax(-1).masked_fill(pad[:, :, None], 0.0)
            z = (s @ h).sum(1)
        return self.head(z)


def padded_pool_reference(model, ids):
    """PaddedPool's forward in float64 NumPy."""
    h = model.table.weight.numpy().astype(np.float64)[ids]
    pad = ids == 0

    def softmax(s, axis):
        e = np.exp(s - s.max(axis, keepdims=True))
        return e / e.sum(axis, keepdims=True)

    if model.kind == "max":
        z = np.where(pad[..., None], -1e9, h).max(1)
    elif model.kind == "attention pooling":
        s = (h @ model.score.weight.numpy().T.astype(np.float64))[..., 0] + model.score.bias.numpy()[0]
        z = (h * softmax(np.where(pad, -np.inf, s), 1)[..., None]).sum(1)
    elif model.kind == "where":
        z = np.where(pad[..., None], 0.0, h).sum(1) + np.where(pad[..., None], h * 0.5, h).sum(1)
    elif model.kind == "broadcast":
        token = model.token.numpy().astype(np.float64)
        z = np.where(pad[..., None], token, h).sum(1) + np.where(pad[..., None], h.mean(1, keepdims=True), h).sum(1)
        z = z + np.where(pad[..., None] | (h > 0.5), -3.0, h).sum(1)
        z = z + (~pad & (ids > 4)).sum(1, keepdims=True)
    else:
        s = h @ h.transpose(0, 2, 1) / 8 ** 0.5
        s = np.where(np.triu(np.ones((6, 6), bool), 1) | pad[:, None, :], -np.inf, s)
        z = (np.where(pad[:, :, None], 0.0, softmax(s, -1)) @ h).sum(1)
    return z @ model.head.weight.numpy().T.astype(np.float64) + model.head.bias.numpy()


@pytest.mark.parametrize("kind", ["max", "attention pooling", "where", "broadcast", "self-attention", "causal | pad"])
def test_a_padding_mask_computed_from_the_ids_fills_and_selects(kind):
    """masked_fill and ft.where with a mask of each sample (ids == 0): the value is selected, not multiplied in, so
    -inf fills exactly (also over an earlier -inf fill); predict as NumPy, gradients by central differences, and the
    padded rows of the table get no gradient."""
    rng = np.random.default_rng(14)
    ids = rng.integers(1, 12, (5, 6))
    ids[0, 3:], ids[2, 1:], ids[4, 5:] = 0, 0, 0
    ft.manual_seed(3)
    model = PaddedPool(kind)
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=5, input_shape=(6,),
                            input_dtype=ft.int64)
    np.testing.assert_allclose(program.predict(ids).numpy(), padded_pool_reference(model, ids), rtol=1e-5,
                               atol=1e-6)
    y = np.arange(5) % 3
    eps = 1e-2 if kind == "broadcast" else 1e-3  # a loss near 9 rounds in float32 by more than 1e-3 resolves
    assert gradcheck(program, ids, y, eps=eps, rtol=3e-2, atol=1e-4)
    program.backward(ids, y)
    assert kind in ("where", "broadcast") or not model.table.weight.grad.numpy()[0].any()
    other = PaddedPool(kind)
    other.load_state_dict(model.state_dict())
    low = other.compile(ft.optim.SGD(other.parameters(), lr=0.1), batch_size=5, input_shape=(6,),
                        input_dtype=ft.int64, precision="bf16-mixed")
    np.testing.assert_allclose(low.predict(ids).numpy(), program.predict(ids).numpy(), rtol=3e-2, atol=3e-2)


def test_detach_passes_no_gradient_back():
    """mean(out * out.detach()) has the gradient of mean(out^2) / 2 (each factor's share, one of them held);
    a branch reached only through .detach() gets no gradient, as in PyTorch."""
    x = np.random.default_rng(12).standard_normal((4, 4)).astype(np.float32)
    grads = []
    for loss in (lambda out, y: (out * out.detach()).mean(), lambda out, y: 0.5 * out.square().mean()):
        ft.manual_seed(0)
        model = nn.Linear(4, 3)
        program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), loss, batch_size=4, input_shape=(4,))
        program.backward(x, None)
        grads.append(model.weight.grad.numpy())
    np.testing.assert_allclose(grads[0], grads[1], rtol=1e-6, atol=1e-7)

    class Branch(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem, self.head = nn.Linear(4, 4), nn.Linear(4, 3)

        def forward(self, x):
            return self.head(self.stem(x).data)

    model = Branch()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=4, input_shape=(4,))
    before = model.stem.weight.numpy().copy()
    program.train_step(x, np.arange(4) % 3)
    np.testing.assert_array_equal(model.stem.weight.numpy(), before)
    assert np.abs(model.head.weight.grad.numpy()).max() > 0


def lm(lib=ft, V=11, D=8):
    L = nn if lib is ft else lib.nn

    class LM(L.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.head = L.Embedding(V, D), L.Linear(D, V)

        def forward(self, idx):
            return self.head(self.emb(idx))

    return LM()


def gpt_loss(logits, targets, F=F):
    """nanoGPT's loss: the batch and the positions merged into rows."""
    return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)


def masked_rows_loss(logits, targets, F=F):
    """The mean of the rows' per-position losses over the positions a mask of the labels keeps."""
    per = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1, reduction="none")
    mask = (targets.view(-1) != -1).float()
    return (per * mask).sum() / mask.sum()


def test_a_loss_over_rows_merged_from_the_batch_is_the_sequence_loss():
    rng = np.random.default_rng(13)
    x, y = rng.integers(0, 11, (3, 5)), rng.integers(0, 11, (3, 5))
    y[0, 2] = -1
    losses, grads = [], []
    forms = [  # (the loss, compile's target arguments)
        (gpt_loss, {}), (lambda out, y: F.cross_entropy(out.transpose(1, 2), y, ignore_index=-1), {}),
        (lambda out, y: nn.CrossEntropyLoss(ignore_index=-1)(out.reshape(-1, 11), y.view(-1)), {}),
        # pytorch/examples' word language model: log_softmax of the rows, then nll_loss
        (lambda out, y: F.nll_loss(F.log_softmax(out.view(-1, 11), dim=1), y.view(-1), ignore_index=-1), {}),
        # a target_shape without target_dtype: the class loss reads int64 labels
        (lambda out, y: F.cross_entropy(out.transpose(1, 2), y, ignore_index=-1), {"target_shape": (5,)}),
        # the rows' per-position losses, masked by hand: their mean over the positions kept
        (masked_rows_loss, {})]
    for loss, targets in forms:
        ft.manual_seed(0)
        model = lm()
        program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), loss, batch_size=3, input_shape=(5,),
                                input_dtype=ft.int64, **targets)
        losses.append(program.backward(x, y))
        grads.append(model.head.weight.grad.numpy())
    assert len(set(losses)) == 1
    for g in grads[1:]:
        np.testing.assert_array_equal(grads[0], g)


@needs_torch
@pytest.mark.parametrize("sequence_loss", [gpt_loss, masked_rows_loss])
def test_the_gpt_loss_matches_pytorch(sequence_loss):
    rng = np.random.default_rng(14)
    x, y = rng.integers(0, 11, (3, 5)), rng.integers(0, 11, (3, 5))
    y[1, 4] = -1
    tm, model = lm(torch), lm()
    model.load_state_dict({k: v.detach().numpy() for k, v in tm.state_dict().items()})
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), sequence_loss, batch_size=3,
                            input_shape=(5,), input_dtype=ft.int64)
    loss = program.backward(x, y)
    want = sequence_loss(tm(torch.from_numpy(x)), torch.from_numpy(y), torch.nn.functional)
    want.backward()
    assert loss == pytest.approx(want.item(), rel=1e-6)
    np.testing.assert_allclose(model.emb.weight.grad.numpy(), tm.emb.weight.grad.numpy(), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("loss, message", [
    (lambda o, y: F.cross_entropy(o.view(-1, 11), y), "view both: logits.view"),
    (lambda o, y: (F.cross_entropy(o.view(-1, 11), y.view(-1), reduction="none") * o.sum(-1)).sum(),
     "merged from the batch with values that are not"),
    (lambda o, y: o.view(-1, 11).relu().sum(), "only a class loss takes it"),
    (lambda o, y: F.nll_loss(o.view(-1, 11), y.view(-1)), "merged from values that are not log_softmax's"),
    (lambda o, y: F.softmax(o.view(-1, 11), 1).sum(), "only a class loss takes it"),
])
def test_other_uses_of_rows_merged_from_the_batch_are_refused(loss, message):
    model = lm()
    with pytest.raises(ft.nn.TracingError, match=message):
        model.compile(ft.optim.SGD(model.parameters(), lr=0.1), loss, batch_size=3, input_shape=(5,),
                      input_dtype=ft.int64)


def test_labels_viewed_as_a_column_of_one_per_sample_are_the_labels():
    model = nn.Linear(4, 3)
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1),
                            lambda out, y: F.cross_entropy(out, y.view(-1)), batch_size=2, input_shape=(4,))
    x, y = np.ones((2, 4), np.float32), np.array([0, 2])
    assert program.evaluate(x, y)[0] == pytest.approx(F.cross_entropy(model(ft.tensor(x)), ft.tensor(y)).item())


def activations(lib=ft):
    """clamp and the activations and functions written with it, traced through a user's forward."""
    L, Fn = (nn, F) if lib is ft else (lib.nn, lib.nn.functional)

    class Clamped(L.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = L.Linear(4, 6), L.Linear(6, CLASSES)
            self.relu6, self.elu, self.hardtanh = L.ReLU6(), L.ELU(0.7), L.Hardtanh(-0.5, 0.4)

        def forward(self, x):
            h = self.a(x) * 4
            h = (self.relu6(h) + self.elu(h) + self.hardtanh(h) + Fn.normalize(h, dim=1) + h.clamp(-0.3, 0.5)
                 + lib.clamp(h, min=0.1) + h.clamp_max(0.2) + h.logsumexp(1, keepdim=True))
            return self.b(h).sigmoid()  # an output whose activation fuses into the layer before it

    return Clamped()


def test_clamp_and_the_activations_written_with_it_match_finite_differences():
    x = np.random.default_rng(15).standard_normal((5, 4)).astype(np.float32)
    ft.manual_seed(1)
    model = activations()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.MSELoss(), batch_size=5, input_shape=(4,))
    y = np.random.default_rng(16).uniform(0, 1, (5, CLASSES)).astype(np.float32)
    assert gradcheck(program, x, y, eps=1e-3, rtol=3e-2, atol=1e-4)
    np.testing.assert_allclose(program.predict(x).numpy(), model(ft.tensor(x)).numpy(), rtol=1e-5, atol=1e-6)


@needs_torch
def test_clamp_and_the_activations_written_with_it_match_pytorch():
    x = np.random.default_rng(17).standard_normal((5, 4)).astype(np.float32)
    y = np.random.default_rng(18).uniform(0, 1, (5, CLASSES)).astype(np.float32)
    tm, model = activations(torch), activations()
    model.load_state_dict({k: v.detach().numpy() for k, v in tm.state_dict().items()})
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.MSELoss(), batch_size=5, input_shape=(4,))
    assert_gradients_match(program, tm, x, y, torch.nn.MSELoss())  # (BCE of outputs near 1 amplifies rounding)


@pytest.mark.parametrize("loss", [
    lambda o, y: F.binary_cross_entropy(o.sigmoid(), y), lambda o, y: F.mse_loss(o.relu(), y),
    lambda o, y: ((o.tanh() - y) ** 2).mean(), lambda o, y: F.mse_loss(F.leaky_relu(o, 0.1), y)],
    ids=["sigmoid", "relu", "tanh", "leaky_relu"])
def test_an_activation_only_the_loss_applies_leaves_predict_the_models_output(loss):
    """The loss's activation of the logits is not folded into the layer that makes them (predict gave the
    activated values), in either precision; the loss and the gradients are the activated values'."""
    x = np.random.default_rng(27).standard_normal((4, 5)).astype(np.float32)
    y = np.random.default_rng(28).uniform(0, 1, (4, 3)).astype(np.float32)
    for precision in ("32-true", "bf16-mixed"):
        ft.manual_seed(29)
        model = nn.Sequential(nn.Linear(5, 6), nn.ReLU(), nn.Linear(6, 3))
        program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), loss, batch_size=4, input_shape=(5,),
                                precision=precision)
        tol = 1e-5 if precision == "32-true" else 3e-2
        np.testing.assert_allclose(program.predict(x).numpy(), model(ft.tensor(x)).numpy(), rtol=tol, atol=tol)
        assert program.evaluate(x, y)[0] == pytest.approx(loss(model(ft.tensor(x)), ft.tensor(y)).item(), rel=tol)
    assert gradcheck(program.model.float().compile(ft.optim.SGD(model.parameters(), lr=0.1), loss, batch_size=4,
                                                   input_shape=(5,)), x, y, rtol=3e-2, atol=1e-4)


class GatheredPositions(nn.Module):
    """Values indexed by index (constant positions among them), then a linear layer, so that every position's
    gradient differs."""

    def __init__(self, index):
        super().__init__()
        self.fc, self.index = nn.Linear(4, 5), index
        self.head = nn.Linear(self.gathered(ft.zeros(1, 5, 5)).numel(), 3)

    def gathered(self, h):
        return self.index(h) if callable(self.index) else h[self.index]

    def forward(self, x):
        return self.head(self.gathered(self.fc(x)).flatten(1))


GATHERS = {
    "nanoGPT's [:, [-1], :]": (slice(None), [-1], slice(None)),
    "evenly spaced": (slice(None), [0, 2, 4]),
    "out of order": (slice(None), [2, 0, 0]),
    "paired lists": (slice(None), [0, 1, 4], [0, 1, 2]),
    "DLRM's tril_indices pairs": (slice(None), *ft.tril_indices(5, 5, -1)),
    "a 2-d tensor": (slice(None), slice(None), ft.tensor([[0, 3], [4, 1]])),
    "an int beside a list": (slice(None), 2, [0, 4, 1]),
    "an int apart from a list (PyTorch takes it first)": (slice(None), 1, None, [3, 0]),
    "None and an ellipsis": (Ellipsis, None, np.array([3, 1])),
    "index_select": lambda h: h.index_select(2, ft.tensor([4, 1, 1])),
    "ft.index_select": lambda h: ft.index_select(h, 1, ft.tensor([2])),
}


@pytest.mark.parametrize("name", list(GATHERS))
def test_constant_positions_index_as_pytorch_does(name):
    """x[:, ids], x[:, rows, cols] of lists, arrays and tensors of positions (the same for every sample), and
    index_select: predict equals the eager forward (PyTorch's advanced indexing, integers first), the gradients
    finite differences'."""
    x = np.random.default_rng(24).standard_normal((2, 5, 4)).astype(np.float32)
    ft.manual_seed(25)
    model = GatheredPositions(GATHERS[name])
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.MSELoss(), batch_size=2, input_shape=(5, 4))
    np.testing.assert_allclose(program.predict(x).numpy(), model(ft.tensor(x)).numpy(), rtol=1e-6, atol=1e-6)
    assert gradcheck(program, x, np.zeros((2, 3), np.float32))


class Windowed(nn.Module):
    """PatchTST's patches: a convolution's output unfolded into windows along dimension dim, then a linear layer
    over each window's elements."""

    def __init__(self, dim, size, step):
        super().__init__()
        self.conv, self.window = nn.Conv1d(3, 4, 1), (dim, size, step)
        self.fc = nn.Linear(size, 2)

    def forward(self, x):
        return self.fc(self.conv(x).unfold(*self.window)).flatten(1)


@pytest.mark.parametrize("window", [(-1, 4, 2), (2, 3, 3), (1, 2, 1), (-1, 9, 1)])
def test_unfold_windows_as_tensor_unfold(window):
    """x.unfold(dim, size, step) of a traced value: predict equals the eager forward (a strided view, checked
    against NumPy's sliding windows), the gradients finite differences'."""
    x = np.random.default_rng(26).standard_normal((2, 3, 9)).astype(np.float32)
    dim, size, step = window
    windows = np.lib.stride_tricks.sliding_window_view(x, size, axis=dim)
    np.testing.assert_array_equal(ft.tensor(x).unfold(dim, size, step).numpy(),
                                  windows[(slice(None),) * (dim % 3) + (slice(None, None, step),)])
    ft.manual_seed(27)
    model = Windowed(dim, size, step)
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), lambda out, y: (out ** 2).mean(),
                            batch_size=2, input_shape=(3, 9))
    np.testing.assert_allclose(program.predict(x).numpy(), model(ft.tensor(x)).numpy(), rtol=1e-5, atol=1e-6)
    assert gradcheck(program, x, np.zeros(2, np.float32), eps=1e-3, rtol=3e-2, atol=1e-3)
    with pytest.raises(RuntimeError, match="unfold: maximum size for tensor at dimension 2 is 9 but size is 10"):
        ft.tensor(x).unfold(2, 10, 1)


class DegreeNormalized(nn.Module):
    """Kipf's GCN normalisation of an adjacency given per sample: deg^-1/2 with the isolated nodes' inf set to 0
    in each of PyTorch's spellings."""

    def __init__(self, how):
        super().__init__()
        self.how, self.fc = how, nn.Linear(5, 2)

    def forward(self, x, adj):
        d = adj.sum(-1).pow(-0.5)
        if self.how == "setitem":
            d[ft.isinf(d)] = 0.
        elif self.how == "masked_fill":
            d = d.masked_fill(d.isinf(), 0.)
        elif self.how == "isfinite":
            d = ft.where(ft.isfinite(d), d, 0.)
        else:
            d = ft.where(ft.isnan(d * 0), 0., d)  # inf * 0 is NaN
        d = d * adj.new_tensor([0.5, 0.7, 0.9, 1.1, 1.3, 1.5])  # a constant of each node, adj's dtype and device
        return self.fc((d.unsqueeze(-1) * adj * d.unsqueeze(-2) @ x).mean(1))


@pytest.mark.parametrize("how", ["setitem", "masked_fill", "isfinite", "isnan"])
def test_isinf_isnan_and_isfinite_are_masks(how):
    """ft.isinf / isnan / isfinite of traced values, and d[mask] = 0. as masked_fill_: an isolated node's
    infinite scale is zeroed as in the eager forward, the gradients finite differences'; x.new_tensor(data) is a
    constant."""
    rng = np.random.default_rng(28)
    x = rng.standard_normal((2, 6, 5)).astype(np.float32)
    adj = (rng.random((2, 6, 6)) < 0.5).astype(np.float32)
    adj[:, 0] = 0
    ft.manual_seed(29)
    model = DegreeNormalized(how)
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=2,
                            input_shape=((6, 5), (6, 6)))
    out = program.predict((x, adj)).numpy()
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, model(ft.tensor(x), ft.tensor(adj)).numpy(), rtol=1e-5, atol=1e-6)
    assert gradcheck(program, (x, adj), np.array([0, 1]), eps=1e-3, rtol=3e-2, atol=1e-3)


def test_an_int_between_index_arrays_is_indexed_with_them():
    """x[:, rows, k, cols]: the int is an index of no dimensions among the arrays, all three broadcast together
    (NumPy's and PyTorch's rule), not k applied after rows and cols paired on the first two dimensions."""
    class Between(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 60)

        def forward(self, x):
            return self.fc(x).view(x.size(0), 3, 4, 5)[:, [0, 2], 1, [1, 2]]

    x = np.random.default_rng(32).standard_normal((2, 3)).astype(np.float32)
    ft.manual_seed(33)
    model = Between()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.MSELoss(), batch_size=2, input_shape=(3,),
                            target_shape=(2,))
    h = (x @ model.fc.weight.numpy().T + model.fc.bias.numpy()).reshape(2, 3, 4, 5)
    np.testing.assert_allclose(program.predict(x).numpy(), h[:, [0, 2], 1, [1, 2]], rtol=1e-5, atol=1e-6)
    assert gradcheck(program, x, np.zeros((2, 2), np.float32))


def test_in_place_ops_on_an_input_and_views_read_after_one():
    """An in-place op on the forward's input (x.mul_(2), x[ft.isnan(x)] = 0) is the input changed, as in
    PyTorch (it failed inside compile); a view taken before an in-place op on its base (a reshape of it, or
    windows of x.unfold) and read after it is refused, as PyTorch would read the changed memory."""
    class Cleaned(nn.Module):
        def __init__(self, how):
            super().__init__()
            self.how, self.fc = how, nn.Linear(4, 12)

        def forward(self, x):
            if self.how == "input":
                x[ft.isnan(x)] = 0.0
                x.mul_(2)
                return self.fc(x)
            h = self.fc(x).view(x.size(0), 3, 4)
            a = h[:, 1] if self.how == "reshape" else h.unfold(2, 2, 2)
            h.mul_(2.0)
            return a.reshape(x.size(0), -1)

    x = np.array([[1, np.nan, 2, 3], [np.nan, 0, 1, 1]], np.float32)
    model = Cleaned("input")
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.MSELoss(), batch_size=2, input_shape=(4,),
                            target_shape=(12,))
    want = np.nan_to_num(x) * 2 @ model.fc.weight.numpy().T + model.fc.bias.numpy()
    np.testing.assert_allclose(program.predict(x).numpy(), want, rtol=1e-5, atol=1e-6)
    for how in ("reshape", "unfold"):
        with pytest.raises(nn.TracingError, match="a value read after an in-place op on a value sharing its memory"):
            Cleaned(how).compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.MSELoss(), batch_size=2,
                                 input_shape=(4,), target_shape=(4,))


def test_assignments_by_a_mask_that_cannot_compile_say_so():
    """d[mask] = v takes a traced bool mask of the value's leading sizes and a number: a mask of other sizes, a
    constant mask (PyTorch would index the batch with it) or a traced value assigned are refused."""
    class Assigned(nn.Module):
        def __init__(self, how):
            super().__init__()
            self.how, self.fc = how, nn.Linear(4, 6)

        def forward(self, x):
            d = self.fc(x).view(x.size(0), 2, 3)
            if self.how == "sizes":
                d[(d > 0)[:, :, :2]] = 0.0
            elif self.how == "constant":
                d[ft.tensor([True, False])] = 0.0
            else:
                d[d > 0] = d * 2
            return d.flatten(1)

    for how, error, match in (("sizes", IndexError, r"the mask of shape \(N, 2, 2\) does not match"),
                              ("constant", nn.TracingError, "assigning into a traced value"),
                              ("value", nn.TracingError, "assigning into a traced value")):
        model = Assigned(how)
        with pytest.raises(error, match=match):
            model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.MSELoss(), batch_size=2, input_shape=(4,))


def test_positions_that_cannot_index_say_so():
    model = GatheredPositions((slice(None), [0]))
    for index, error, match in (((slice(None), [True, False]), ft.nn.TracingError, "indexing with list"),
                                ((slice(None), np.uint8([1, 0])), ft.nn.TracingError, "deprecated form of a mask"),
                                ((slice(None), [0, 1], None, [2, 3]), ft.nn.TracingError, "index arrays apart"),
                                ((slice(None), [4, 3, 2, 1] * 100), ft.nn.TracingError,
                                 r"400 positions in \d+ runs \(more than 256\)"),
                                ((slice(None), [5]), IndexError, "index 5 is out of range for size 5")):
        model.index = index
        with pytest.raises(error, match=match):
            model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.MSELoss(), batch_size=2, input_shape=(5, 4))


class AtTheBounds(nn.Module):
    """Values exactly at clamp bounds (0 and 6): a shift parameter b added to them, then an activation, alone or
    after a batch norm in eval mode (which frozen layers of a fine-tuned model are)."""

    def __init__(self, act, frozen_bn):
        super().__init__()
        self.b = nn.Parameter(ft.zeros(6))
        self.bn = nn.BatchNorm1d(6).eval() if frozen_bn else nn.Identity()
        self.act, self.fc = act, nn.Linear(6, 2)

    def forward(self, x):
        return self.fc(self.act(self.bn(x + self.b)))


@pytest.mark.parametrize("frozen_bn", [False, True])
@pytest.mark.parametrize("act, lo, hi", [(F.relu6, 0.0, 6.0), (lambda h: F.hardtanh(h, 0.0, 6.0), 0.0, 6.0),
                                         (lambda h: h.clamp(0.0, 6.0), 0.0, 6.0), (lambda h: h.clamp(min=0.0), 0.0,
                                                                                   math.inf)],
                         ids=["relu6", "hardtanh", "clamp", "clamp_min"])
def test_clamps_pass_no_gradient_at_their_bounds(act, lo, hi, frozen_bn):
    """PyTorch 2's clamp, hardtanh and relu6 pass the gradient strictly within the bounds: none where a value lies
    on one (a zero region of an image after a frozen batch norm), checked against NumPy."""
    ft.manual_seed(3)
    model = AtTheBounds(act, frozen_bn)
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.MSELoss(), batch_size=2, input_shape=(6,))
    x = np.array([[0, 6, 3, -1, 7, 0], [6, 0, 0.5, 6, -2, 5]], np.float32)
    y = np.zeros((2, 2), np.float32)
    program.backward(x, y)
    scale = 1 / np.sqrt(1 + 1e-5, dtype=np.float32) if frozen_bn else np.float32(1)
    h = x * scale  # exactly 0 and 6 * scale where x is 0 and 6: bounds only at 0 after the batch norm
    out = np.clip(h, lo, hi) @ model.fc.weight.numpy().T + model.fc.bias.numpy()
    d_act = (2 * (out - y) / out.size) @ model.fc.weight.numpy()
    want = (d_act * ((h > lo) & (h < hi)) * scale).sum(0)
    np.testing.assert_allclose(model.b.grad.numpy(), want, rtol=1e-5, atol=1e-7)


class Indexed(nn.Module):
    """Indexing with new dimensions (None), a leading or inner ellipsis, and ft.stack of traced values."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 6)

    def forward(self, x):
        h = self.fc(x).view(x.size(0), 2, 3)  # (N, 2, 3)
        a = h[:, :, None][..., 0, 1:]  # (N, 2, 2)
        b = h[..., None, 0:2][:, 1]  # (N, 1, 2)
        return ft.stack([a[:, 0], b[:, 0], h[:, 1, ::2]], dim=1).flatten(1)  # (N, 3, 2) -> (N, 6)


def test_indexing_with_none_and_ellipsis_and_stack_match_numpy():
    x = np.random.default_rng(19).standard_normal((3, 4)).astype(np.float32)
    model = Indexed()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=3, input_shape=(4,))
    h = (x.astype(np.float64) @ model.fc.weight.numpy().T + model.fc.bias.numpy()).reshape(3, 2, 3)
    a, b = h[:, :, None][..., 0, 1:], h[..., None, 0:2][:, 1]
    want = np.stack([a[:, 0], b[:, 0], h[:, 1, ::2]], axis=1).reshape(3, 6)
    np.testing.assert_allclose(program.predict(x).numpy(), want, rtol=1e-5, atol=1e-6)
    assert gradcheck(program, x, np.arange(3) % 6)


def test_mistakes_in_a_forward_name_the_line_and_the_way_out():
    model = nn.Linear(4, 3)
    sgd = ft.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ft.nn.TracingError, match=r"len\(\) of a traced value .* x.size\(0\) is the batch size"):
        model.compile(sgd, lambda out, y: F.cross_entropy(out, y, reduction="sum") / len(out), batch_size=2,
                      input_shape=(4,))
    with pytest.raises(ValueError, match=r"Linear expects 5 input features, got 3 \(at .*test_trace.py"):
        model.compile(sgd, lambda out, y: nn.Linear(5, 2)(out).sum(), batch_size=2, input_shape=(4,))
    with pytest.raises(IndexError, match=r"too many indices for a value of shape \(N, 3\)"):
        model.compile(sgd, lambda out, y: out[:, 0, 1].sum(), batch_size=2, input_shape=(4,))
    program = model.compile(sgd, nn.CrossEntropyLoss(), batch_size=2, input_shape=(4,))
    with pytest.raises(ValueError, match="the loss reads targets: give them"):
        program.train_step(np.ones((2, 4), np.float32), None)


class Tiled(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 6)

    def forward(self, x):
        h = self.fc(x).view(x.size(0), 2, 3)
        return F.normalize(h.mT.repeat(1, 2, 1).flatten(1), dim=1)  # (N, 3, 2) tiled to (N, 6, 2)


def test_repeat_mt_and_normalize_match_numpy_with_a_finite_gradient_at_a_zero_row():
    x = np.random.default_rng(20).standard_normal((3, 4)).astype(np.float32)
    x[0] = 0
    model = Tiled()
    model.fc.bias.copy_(ft.zeros(6))  # sample 0's row is the zero vector
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.MSELoss(), batch_size=3, input_shape=(4,))
    h = (x.astype(np.float64) @ model.fc.weight.numpy().T).reshape(3, 2, 3)
    z = np.tile(h.transpose(0, 2, 1), (1, 2, 1)).reshape(3, 12)
    want = z / np.maximum(np.linalg.norm(z, axis=1, keepdims=True), 1e-12)
    np.testing.assert_allclose(program.predict(x).numpy(), want, rtol=1e-5, atol=1e-6)
    program.backward(x, np.ones((3, 12), np.float32))
    assert np.isfinite(model.fc.weight.grad.numpy()).all()


def positions(lib=ft, V=11, T=6, D=8, how="embedding"):
    """GPT-2's token and position embeddings: positions from arange(t) (minGPT's with .unsqueeze(0), or expanded
    over the batch), or the table's rows, the head tied to the token table."""
    L = nn if lib is ft else lib.nn

    class Positions(L.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = L.Embedding(V, D), L.Embedding(T, D)
            self.head = L.Linear(D, V, bias=False)
            self.head.weight = self.wte.weight

        def forward(self, idx):
            b, t = idx.size()
            pos = lib.arange(0, t, dtype=lib.long, device=idx.device)
            if how in ("minGPT", "scaled"):
                pos = pos.unsqueeze(0)
            elif how == "expanded":  # Hugging Face's position_ids.expand(b, t)
                pos = pos.unsqueeze(0).expand(b, t)
            p = self.wpe.weight[:t] if how == "rows" else self.wpe(pos)
            return self.head(self.wte(idx) + (p * 2.0 if how == "scaled" else p))

    return Positions()


@pytest.mark.parametrize("how", ["embedding", "minGPT", "expanded", "rows", "scaled"])
def test_position_embeddings_of_a_range_train_their_rows(how):
    rng = np.random.default_rng(21)
    x, y = rng.integers(0, 11, (3, 4)), rng.integers(0, 11, (3, 4))
    ft.manual_seed(0)
    model = positions(how=how)
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), gpt_loss, batch_size=3, input_shape=(4,),
                            input_dtype=ft.int64)
    assert gradcheck(program, x, y, eps=1e-2)  # a float32 loss of 11 moves in steps of 1e-6: eps=1e-3 is noise
    program.backward(x, y)
    grad = model.wpe.weight.grad.numpy()
    assert np.abs(grad[:4]).min() > 0 and (grad[4:] == 0).all()  # the rows of positions 0..3 only
    # sequences longer than the table (T=8 > block size 6): the eager lookup's IndexError, not a refusal to trace
    # (the table's rows sliced are 6, which do not broadcast, as in PyTorch)
    error, match = (ValueError, "do not broadcast") if how == "rows" else \
        (IndexError, r"ids\[6\] = 6 is out of range for a weight of 6 rows")
    with pytest.raises(error, match=match):
        positions(how=how).compile(ft.optim.SGD(model.parameters(), lr=0.1), gpt_loss, batch_size=3,
                                   input_shape=(8,), input_dtype=ft.int64)


@needs_torch
@pytest.mark.parametrize("how", ["embedding", "minGPT", "expanded", "scaled"])
def test_position_embeddings_of_a_range_match_pytorch(how):
    rng = np.random.default_rng(22)
    x, y = rng.integers(0, 11, (3, 4)), rng.integers(0, 11, (3, 4))
    tm, model = positions(torch, how=how), positions(how=how)
    model.load_state_dict({k: v.detach().numpy() for k, v in tm.state_dict().items()})
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), gpt_loss, batch_size=3, input_shape=(4,),
                            input_dtype=ft.int64)
    assert_gradients_match(program, tm, x, y, lambda out, y: gpt_loss(out, y, torch.nn.functional))


def assigned_into_a_tensor(x):
    """A decoder's outputs[:, t] = y."""
    out = ft.zeros(2, 4)
    out[:, 0] = x[:, 0]
    return out


def assigned_into_a_traced_value(x):
    x[:, 0] = 0.0
    return x


@pytest.mark.parametrize("forward, error, message", [
    (lambda x: x.clamp(), ValueError, "at least one of 'min' or 'max'"),
    (lambda x: x.clamp(min=x), ft.nn.TracingError, "clamp to bounds that are not numbers"),
    (lambda x: F.hardtanh(x, 1.0, -1.0), ValueError, "min_val 1.0 must not exceed max_val -1.0"),
    (lambda x: F.normalize(x, p=1), NotImplementedError, r"normalize: p=1 \(only the Euclidean norm"),
    (lambda x: x.repeat(2, 1), ft.nn.TracingError, r"repeat\(2, 1\) of a traced value"),
    (lambda x: x.expand(x.size(0), 8), ValueError, r"Expand: \(4,\) does not broadcast to \(8,\)"),
    (lambda x: x.to(ft.int64), ft.nn.TracingError, r"x.to\(int64\) of a traced value"),
    (lambda x: ft.where(x, x, 0.0), ft.nn.TracingError, "a condition of traced values other than a bool mask"),
    (lambda x: x.masked_fill(x[:, :2] > 0, 0.0), ft.nn.TracingError, r"a mask of shape \(N, 2\) for values of "
     r"shape \(N, 4\) .* mask\[:, None, None, :\]"),
    (lambda x: x.unsqueeze(1).masked_fill(x > 0, 0.0), ft.nn.TracingError, r"a mask of shape \(N, 4\) for values "
     r"of shape \(N, 1, 4\)"),
    (lambda x: x.masked_fill(ft.ones(4), 0.0), TypeError, "where: expected condition to be a bool tensor"),
    (lambda x: x.max(1)[1] * 1.0, ft.nn.TracingError, r"the indices of max\(dim\) .* x.max\(dim\).values"),
    (lambda x: x.min(1).indices.float(), ft.nn.TracingError, r"the indices of min\(dim\)"),
    (lambda x: x.max(), ft.nn.TracingError, r"max\(\) of a traced value over the batch"),
    (lambda x: x.amax(()), ft.nn.TracingError, r"a reduction over every dimension \(dim=\(\)\)"),
    (lambda x: x.norm(), ft.nn.TracingError, r"norm\(\) of a traced value over the batch"),
    (lambda x: x.norm(3, dim=1), ft.nn.TracingError, r"norm\(p=3\) of a traced value"),
    (lambda x: x.gather(1, ft.zeros(2, 1, dtype=ft.int64)), ft.nn.TracingError, "gather\\(\\) with an index other"),
    (lambda x: x[x > 0], ft.nn.TracingError, r"indexing with a traced value .* \(x \* mask\).sum\(\) / mask.sum\(\)"),
    (lambda x: x[ft.arange(x.size(0)), 0], ft.nn.TracingError, r"ft.arange of the batch size other than as "
     r"x\[ft.arange\(N\), y\] of \(N, C\) scores cannot be compiled"),
    (lambda x: F.interpolate(x.view(x.size(0), 1, 2, 2), scale_factor=2, mode="bilinear", antialias=True),
     NotImplementedError, r"interpolate: antialias=True is not supported"),
    (lambda x: F.adaptive_max_pool2d(x.view(x.size(0), 1, 2, 2), 1, return_indices=True)[0], TypeError,
     r"adaptive_max_pool2d: return_indices=True cannot be traced"),
    (assigned_into_a_tensor, ft.nn.TracingError, r"assigning .* \(outputs\[:, t\] = y\).* ft.stack\(steps, dim=1\)"),
    (assigned_into_a_traced_value, ft.nn.TracingError, r"assigning into a traced value"),
    (lambda x: x.argmax(1), ft.nn.TracingError, r"x.argmax cannot be compiled .*\(teacher forcing"),
])
def test_the_traced_math_refuses_what_it_cannot_record(forward, error, message):
    """Each refused rather than recorded without the option (a silently different function)."""
    class Bad(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return forward(self.fc(x))

    model = Bad()
    with pytest.raises(error, match=message):
        model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.MSELoss(), batch_size=2, input_shape=(4,))


class Broadcast(nn.Module):
    """expand, expand_as, and the dtype conversions a compiled program takes as the value itself."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        h = self.fc(x)  # (N, 3)
        assert h.dtype is ft.float32 and h.device == self.fc.weight.device
        col = h[:, :1]  # (N, 1)
        return (col.expand(x.size(0), 3) + col.expand_as(h) * h).to(ft.float32).type_as(h).float()


def test_expand_and_dtype_conversions_of_traced_values_match_numpy():
    x = np.random.default_rng(23).standard_normal((3, 4)).astype(np.float32)
    model = Broadcast()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=3, input_shape=(4,))
    h = x.astype(np.float64) @ model.fc.weight.numpy().T + model.fc.bias.numpy()
    np.testing.assert_allclose(program.predict(x).numpy(), h[:, :1] + h[:, :1] * h, rtol=1e-5, atol=1e-6)
    assert gradcheck(program, x, np.arange(3) % 3)


def reductions(lib=ft):
    """max/min over a dimension, amax/amin, norms and the cosine similarity, traced through a user's forward."""
    L = nn if lib is ft else lib.nn

    class Reduced(L.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = L.Linear(4, 12), L.Linear(6, CLASSES)
            self.cos = L.CosineSimilarity(dim=-1)

        def forward(self, x):
            h = self.a(x).view(x.size(0), 2, 6)
            m = h.max(dim=1).values + lib.amax(h, (1, 2), keepdim=True)[:, 0] - h.amin(-1).sum(1, keepdim=True)
            m = m + h.norm(dim=1) + lib.norm(h, 1, dim=1) + h.norm(float("inf"), 1)
            values, _ = lib.min(h, dim=2, keepdim=True)  # (N, 2, 1)
            return self.b(m * self.cos(h[:, 0], h[:, 1]).unsqueeze(1)) + values.sum(1)

    return Reduced()


def test_max_amax_norms_and_cosine_similarity_match_finite_differences_and_numpy():
    x = np.random.default_rng(24).standard_normal((5, 4)).astype(np.float32)
    ft.manual_seed(2)
    model = reductions()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=5, input_shape=(4,))
    assert gradcheck(program, x, np.arange(5) % CLASSES, rtol=3e-2, atol=1e-4)
    h = (x.astype(np.float64) @ model.a.weight.numpy().T + model.a.bias.numpy()).reshape(5, 2, 6)
    m = h.max(1) + h.max((1, 2))[:, None] - h.min(2).sum(1, keepdims=True)
    m = m + np.sqrt((h * h).sum(1)) + np.abs(h).sum(1) + np.abs(h).max(1)
    cos = (h[:, 0] * h[:, 1]).sum(1) / np.linalg.norm(h[:, 0], axis=1) / np.linalg.norm(h[:, 1], axis=1)
    want = (m * cos[:, None]) @ model.b.weight.numpy().T + model.b.bias.numpy() + h.min(2).sum(1, keepdims=True)
    np.testing.assert_allclose(program.predict(x).numpy(), want, rtol=1e-5, atol=1e-5)


class TiedMax(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(ft.ones(4))

    def forward(self, x):
        return (x * self.w).amax(1, keepdim=True)


def test_amax_gives_the_gradient_of_tied_maxima_to_the_first():
    """Exact ties (3 at positions 1 and 2): the gradient goes to the first of them only, as torch.max(dim)'s does
    (torch.amax would split it), as docs/models.md says."""
    model = TiedMax()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.MSELoss(), batch_size=2, input_shape=(4,))
    x = np.array([[1, 3, 3, 0], [2, 5, 1, 5]], np.float32)
    program.backward(x, np.zeros((2, 1), np.float32))
    d = 2 * x.max(1) / 2  # d(mean of squares) / d(each sample's max)
    want = np.zeros(4, np.float32)
    for row, g in zip(x, d):
        want[np.argmax(row)] += g * row[np.argmax(row)]  # argmax: the first of tied maxima
    np.testing.assert_allclose(model.w.grad.numpy(), want, rtol=1e-6)
    assert model.w.grad.numpy()[2] == 0 and model.w.grad.numpy()[3] == 0


@needs_torch
def test_max_amax_norms_and_cosine_similarity_match_pytorch():
    x = np.random.default_rng(25).standard_normal((5, 4)).astype(np.float32)
    y = np.arange(5) % CLASSES
    tm, model = reductions(torch), reductions()
    model.load_state_dict({k: v.detach().numpy() for k, v in tm.state_dict().items()})
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=5,
                            input_shape=(4,))
    assert_gradients_match(program, tm, x, y, torch.nn.CrossEntropyLoss())


def hand_written_losses(lib=ft):
    """Losses people write themselves from the labels: label smoothing and a stable cross entropy picking the
    true class with gather, and a focal loss from the per-sample cross entropy."""
    Fn = lib.nn.functional

    def smoothing(out, y):
        logp = Fn.log_softmax(out, dim=-1)
        nll = -logp.gather(dim=-1, index=y.unsqueeze(1)).squeeze(1)
        return (0.9 * nll - 0.1 * logp.mean(dim=-1)).mean()

    def stable(out, y):
        z = out - out.max(dim=1, keepdim=True)[0].detach()
        return -(z.gather(1, y.long().view(-1, 1)) - z.exp().sum(1, keepdim=True).log()).mean()

    def focal(out, y):
        ce = Fn.cross_entropy(out, y, reduction="none")
        return ((1 - lib.exp(-ce)) ** 2 * ce).mean()

    return {"smoothing": smoothing, "stable": stable, "focal": focal}


@pytest.mark.parametrize("classes_last", [True, False])
def test_gather_of_a_sequences_labels_is_the_sequence_class_loss(classes_last):
    """Label smoothing written by hand over (N, T, C) log-probabilities (logp.gather(2, y.unsqueeze(2))) or
    (N, C, T) ones (gather(1, y.unsqueeze(1))): the cross-entropy node's own label smoothing over the sequence."""
    rng = np.random.default_rng(27)
    ids, y = rng.integers(0, 7, (3, 5)), rng.integers(0, CLASSES, (3, 5))
    c = -1 if classes_last else 1

    def smoothing(logits, y):
        logp = F.log_softmax(logits if classes_last else logits.transpose(1, 2), dim=c)
        nll = -logp.gather(c, y.unsqueeze(c)).squeeze(c)
        return (0.9 * nll - 0.1 * logp.mean(dim=c)).mean()

    ft.manual_seed(18)
    model = nn.Sequential(nn.Embedding(7, 4), nn.Linear(4, CLASSES))
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), smoothing, batch_size=3, input_shape=(5,),
                            input_dtype=ft.int64, target_shape=(5,), target_dtype=ft.int64)
    want = F.cross_entropy(model(ft.tensor(ids)).transpose(1, 2), ft.tensor(y), label_smoothing=0.1).item()
    assert program.evaluate(ids, y)[0] == pytest.approx(want, rel=1e-5)
    assert gradcheck(program, ids, y, eps=1e-3, rtol=3e-2, atol=1e-3)
    with pytest.raises(IndexError, match=rf"outside \[0, {CLASSES}\)"):
        program.train_step(ids, np.full((3, 5), CLASSES))


@pytest.mark.parametrize("name", ["smoothing", "stable", "focal"])
def test_hand_written_class_losses_match_the_built_in_ones(name):
    """Against the cross-entropy node's own label smoothing, its plain form, and NumPy's focal loss."""
    rng = np.random.default_rng(26)
    x, y = rng.standard_normal((6, 4)).astype(np.float32), rng.integers(0, CLASSES, 6)
    model = nn.Linear(4, CLASSES)
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), hand_written_losses()[name], batch_size=6,
                            input_shape=(4,))
    out = model(ft.tensor(x))
    if name == "focal":
        z = out.numpy().astype(np.float64)
        ce = np.log(np.exp(z).sum(1)) - z[np.arange(6), y]
        want = ((1 - np.exp(-ce)) ** 2 * ce).mean()
    else:
        want = F.cross_entropy(out, ft.tensor(y), label_smoothing=0.1 if name == "smoothing" else 0.0).item()
    assert program.evaluate(x, y)[0] == pytest.approx(want, rel=1e-5)
    assert gradcheck(program, x, y, rtol=3e-2, atol=1e-4)
    before = model.weight.numpy().copy()
    with pytest.raises(IndexError, match=rf"label {CLASSES} at position 0 is outside \[0, {CLASSES}\)"):
        program.train_step(x, np.full(6, CLASSES))  # gather's index past the classes
    np.testing.assert_array_equal(model.weight.numpy(), before)


@needs_torch
@pytest.mark.parametrize("name", ["smoothing", "stable", "focal"])
def test_hand_written_class_losses_match_pytorch(name):
    rng = np.random.default_rng(27)
    x, y = rng.standard_normal((6, 4)).astype(np.float32), rng.integers(0, CLASSES, 6)
    tm, model = torch.nn.Linear(4, CLASSES), nn.Linear(4, CLASSES)
    model.load_state_dict({k: v.detach().numpy() for k, v in tm.state_dict().items()})
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), hand_written_losses()[name], batch_size=6,
                            input_shape=(4,))
    assert_gradients_match(program, tm, x, y, hand_written_losses(torch)[name])


@pytest.mark.parametrize("view", [lambda y: y.unsqueeze(1), lambda y: y.view(-1, 1), lambda y: y[:, None],
                                  lambda y: y.float().reshape(y.size(0), 1)])
def test_targets_viewed_as_a_column_before_a_loss_reads_them_are_one_value_per_sample(view):
    rng = np.random.default_rng(28)
    x, y = rng.standard_normal((6, 4)).astype(np.float32), rng.standard_normal(6).astype(np.float32)
    model = nn.Linear(4, 1)
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), lambda out, t: F.mse_loss(out, view(t)),
                            batch_size=6, input_shape=(4,))
    want = ((model(ft.tensor(x)).numpy()[:, 0].astype(np.float64) - y) ** 2).mean()
    assert program.evaluate(x, y)[0] == pytest.approx(want, rel=1e-5)
    labels = (y > 0).astype(np.float32)
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1),
                            lambda out, t: F.binary_cross_entropy_with_logits(out, view(t)), batch_size=6,
                            input_shape=(4,))
    z = model(ft.tensor(x)).numpy()[:, 0].astype(np.float64)
    want = (np.logaddexp(0, z) - labels * z).mean()
    assert program.evaluate(x, labels)[0] == pytest.approx(want, rel=1e-5)
    with pytest.raises(ft.nn.TracingError, match=r"the targets viewed as \(-1, 10\) .* target_shape="):
        model.compile(ft.optim.SGD(model.parameters(), lr=0.1), lambda out, t: F.mse_loss(out, t.view(-1, 10)),
                      batch_size=6, input_shape=(4,))


def triplets(lib=ft):
    """One encoder over an anchor, a positive and a negative: three outputs, and a loss that reads no labels."""
    L = nn if lib is ft else lib.nn

    class Siamese(L.Module):
        def __init__(self):
            super().__init__()
            self.enc = L.Linear(4, 5)

        def forward(self, x):
            return self.enc(x[:, 0]), self.enc(x[:, 1]), self.enc(x[:, 2])

    return Siamese()


@needs_torch
def test_a_triplet_margin_loss_over_three_outputs_matches_pytorch():
    x = np.random.default_rng(29).standard_normal((6, 3, 4)).astype(np.float32)
    tm, model = triplets(torch), triplets()
    model.load_state_dict({k: v.detach().numpy() for k, v in tm.state_dict().items()})
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1),
                            lambda outs, y: nn.TripletMarginLoss(margin=2.0)(*outs), batch_size=6, input_shape=(3, 4))
    loss = program.backward(x, None)
    want = torch.nn.TripletMarginLoss(margin=2.0)(*tm(torch.from_numpy(x)))
    want.backward()
    assert loss == pytest.approx(want.item(), rel=1e-5)
    grads = dict(model.named_parameters())
    for name, p in tm.named_parameters():
        np.testing.assert_allclose(grads[name].grad.numpy(), p.grad.numpy(), rtol=1e-4, atol=1e-6, err_msg=name)


def unet(lib=ft):
    """A small U-Net's decoder step: bilinear upsampling (as nn.Upsample, and F.interpolate to a skip's size with
    align_corners), concatenated with the skip connection; and a sequence resampled linearly."""
    L, Fn = (nn, F) if lib is ft else (lib.nn, lib.nn.functional)

    class Up(L.Module):
        def __init__(self):
            super().__init__()
            self.down = L.Conv2d(2, 4, 3, stride=2, padding=1)
            self.up = L.Upsample(scale_factor=2, mode="bilinear")
            self.mix = L.Conv2d(6, 3, 3, padding=1)
            self.head = L.Linear(3 * 5 + 3 * 12, CLASSES)

        def forward(self, x):
            d = lib.relu(self.down(x))  # (N, 4, 4, 4)
            u = lib.cat([self.up(d)[:, :, :7, :7], x], dim=1)  # (N, 6, 7, 7)
            m = self.mix(Fn.interpolate(u, size=(9, 5), mode="bilinear", align_corners=True))
            seq = Fn.interpolate(m.mean(2), size=12, mode="linear")  # (N, 3, 12)
            return self.head(lib.cat([m.amax(2).flatten(1), seq.flatten(1)], dim=1))

    return Up()


def test_bilinear_upsampling_in_a_model_matches_finite_differences_and_its_eager_forward():
    x = np.random.default_rng(30).standard_normal((3, 2, 7, 7)).astype(np.float32)
    ft.manual_seed(3)
    model = unet()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=3, input_shape=(2, 7, 7))
    assert gradcheck(program, x, np.arange(3) % CLASSES, rtol=3e-2, atol=1e-4)
    d = F.relu(F.conv2d(ft.tensor(x), model.down.weight, model.down.bias, stride=2, padding=1))
    u = ft.cat([F.interpolate(d, scale_factor=2, mode="bilinear")[:, :, :7, :7], ft.tensor(x)], dim=1)
    m = F.conv2d(F.interpolate(u, size=(9, 5), mode="bilinear", align_corners=True), model.mix.weight,
                 model.mix.bias, padding=1)
    seq = F.interpolate(m.mean(2), size=12, mode="linear")
    want = F.linear(ft.cat([m.amax(2).flatten(1), seq.flatten(1)], dim=1), model.head.weight,
                    model.head.bias)
    np.testing.assert_allclose(program.predict(x).numpy(), want.numpy(), rtol=1e-5, atol=1e-5)


@needs_torch
def test_bilinear_upsampling_in_a_model_matches_pytorch():
    x = np.random.default_rng(31).standard_normal((3, 2, 7, 7)).astype(np.float32)
    y = np.arange(3) % CLASSES
    tm, model = unet(torch), unet()
    model.load_state_dict({k: v.detach().numpy() for k, v in tm.state_dict().items()})
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=3,
                            input_shape=(2, 7, 7))
    assert_gradients_match(program, tm, x, y, torch.nn.CrossEntropyLoss())


def test_token_ids_read_int64_while_tracing():
    class Tokens(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.fc = nn.Embedding(10, 4), nn.Linear(4, CLASSES)

        def forward(self, ids):
            assert ids.dtype is ft.int64
            return self.fc(self.emb(ids.long() if ids.dtype == ft.int64 else ids).mean(1))

    model = Tokens()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=2, input_shape=(3,),
                            input_dtype=ft.int64)
    ids = np.array([[1, 2, 3], [9, 0, 4]])
    np.testing.assert_allclose(program.predict(ids).numpy(), model(ft.tensor(ids)).numpy(), rtol=1e-6, atol=1e-6)


def einsums(lib=ft):
    """torch.einsum as attention and mixer code writes it: head matmuls, a parameter on either side, a dot
    product, and an elementwise product summed."""
    L = nn if lib is ft else lib.nn

    class Mixer(L.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = L.Linear(4, 12), L.Linear(4, 12)
            self.w, self.v = L.Parameter(lib.ones(3, 5) * 0.3), L.Parameter(lib.ones(3, 5) * 0.2)
            self.head = L.Linear(27, CLASSES)

        def forward(self, x):
            h, g = self.a(x).view(x.size(0), 2, 2, 3), self.b(x).view(x.size(0), 2, 2, 3)  # (N, heads, T, D)
            scores = lib.einsum("bhqd,bhkd->bhqk", h, g).softmax(-1)
            mixed = lib.einsum("bhqk,bhkd->bhqd", scores, g)
            wide = lib.einsum("bhtd,de->bhte", h, self.w)
            back = lib.einsum("bhte,fe->bhtf", wide, self.v)  # x @ v.T
            dot = lib.einsum("bi,bi->b", h.flatten(1), g.flatten(1))
            gated = lib.einsum("bhtd,bhtd->bt", h, mixed)
            return self.head(lib.cat([mixed.flatten(1), back.flatten(1), dot.unsqueeze(1), gated], dim=1))

    return Mixer()


def test_einsum_matches_finite_differences_and_its_eager_forward():
    x = np.random.default_rng(33).standard_normal((3, 4)).astype(np.float32)
    ft.manual_seed(4)
    model = einsums()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=3, input_shape=(4,))
    assert gradcheck(program, x, np.arange(3) % CLASSES, rtol=3e-2, atol=1e-4)
    np.testing.assert_allclose(program.predict(x).numpy(), model(ft.tensor(x)).numpy(), rtol=1e-5, atol=1e-6)


@needs_torch
def test_einsum_matches_pytorch():
    x = np.random.default_rng(34).standard_normal((3, 4)).astype(np.float32)
    tm, model = einsums(torch), einsums()
    model.load_state_dict({k: v.detach().numpy() for k, v in tm.state_dict().items()})
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=3,
                            input_shape=(4,))
    assert_gradients_match(program, tm, x, np.arange(3) % CLASSES, torch.nn.CrossEntropyLoss())


@pytest.mark.parametrize("equation, message", [
    ("bij,bjk->ik", "index the batch first"),
    ("bii->bi", "a repeated index, a diagonal"),
    ("b...->b", "an ellipsis"),
    ("bij,bjk,bkl->bil", "einsum of 2 operands"),
])
def test_einsum_that_cannot_be_recorded_says_why(equation, message):
    class Bad(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            h = self.fc(x).view(x.size(0), 2, 2)
            return ft.einsum(equation, h, h).flatten(1) if "," in equation else ft.einsum(equation, h)

    model = Bad()
    with pytest.raises(ft.nn.TracingError, match=message):
        model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.MSELoss(), batch_size=2, input_shape=(4,))


class Sampler(nn.Module):
    """A VAE's encoder and sampling: mu + eps * std with eps = ft.randn_like(std), and uniform noise added."""

    def __init__(self):
        super().__init__()
        self.mu, self.logvar = nn.Linear(4, 3), nn.Linear(4, 3)

    def forward(self, x):
        mu, logvar = self.mu(x), self.logvar(x)
        std = ft.exp(0.5 * logvar)
        return mu + ft.randn_like(std) * std + 0.1 * ft.rand_like(mu), mu, logvar


class Reparameterized(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc, self.dec = Sampler(), nn.Linear(3, 4)

    def forward(self, x):
        z, mu, logvar = self.enc(x)
        return self.dec(z), mu, logvar


def vae_loss(out, x):
    recon, mu, logvar = out
    return F.mse_loss(recon, x) - 0.5 * (1 + logvar - mu ** 2 - logvar.exp()).sum(1).mean()


def test_noise_is_drawn_afresh_each_step_from_the_programs_seed():
    x = np.random.default_rng(35).standard_normal((8, 4)).astype(np.float32)
    ft.manual_seed(5)
    start = Reparameterized().state_dict()

    def run(lr, recompute=False):
        model = Reparameterized()
        model.load_state_dict(start)
        program = model.compile(ft.optim.SGD(model.parameters(), lr=lr), vae_loss, batch_size=8, input_shape=(4,),
                                seed=7, recompute=[model.enc] if recompute else None)
        return [program.train_step(x, x) for _ in range(3)], model.state_dict()
    still = run(0.0)[0]
    assert len(set(still)) == 3  # fresh noise in every step (a zero learning rate changes nothing else)
    losses, weights = run(0.1)
    assert run(0.1)[0] == losses  # the same seed, the same noise
    # a recomputed forward draws what the first one drew: the steps are the plain program's, bit for bit
    again, recomputed = run(0.1, recompute=True)
    assert again == losses
    for k in weights:
        np.testing.assert_array_equal(recomputed[k], weights[k], err_msg=k)


def test_noise_of_a_traced_value_has_the_distribution_asked_for():
    class Draws(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(2, 2048)

        def forward(self, x):
            h = self.fc(x)
            return ft.cat([ft.randn_like(h), ft.rand_like(h)], dim=1)

    model = Draws()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=4, input_shape=(2,))
    out = program.predict(np.zeros((4, 2), np.float32)).numpy().astype(np.float64)
    normal, uniform = out[:, :2048].ravel(), out[:, 2048:].ravel()
    assert abs(normal.mean()) < 0.05 and abs(normal.std() - 1) < 0.05
    assert abs(np.mean(np.abs(normal) < 1) - 0.6827) < 0.02  # the mass within one sigma
    assert uniform.min() >= 0 and uniform.max() < 1 and abs(uniform.mean() - 0.5) < 0.02
    assert len(np.unique(normal)) > 0.99 * normal.size  # every sample and position its own draw


@pytest.mark.parametrize("draw", [lambda h: h + ft.randn(4), lambda h: h + ft.randn(h.shape),
                                  lambda h: h * ft.rand(1), lambda h: h[:, ft.randperm(4)],
                                  lambda h: h + ft.randint(0, 2, (4,))])
def test_a_random_draw_in_a_forward_is_refused_not_frozen(draw):
    class Drawn(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return draw(self.fc(x))

    model = Drawn()
    with pytest.raises(ft.nn.TracingError, match=r"ft\.rand\w* in a traced forward .* ft.randn_like\(x\)"):
        model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.MSELoss(), batch_size=2, input_shape=(4,))
    assert ft.randn(3).shape == (3,)  # outside compile, as before


def segmentation_loss(out, t):
    """A dice-style loss on one-hot pixel labels, as segmentation code writes it."""
    oh = F.one_hot(t, 3).permute(0, 3, 1, 2).float()
    return -(oh * F.log_softmax(out, 1)).sum(1).mean()


@pytest.mark.parametrize("memory_format", ["channels_last", "contiguous"])
def test_one_hot_pixel_labels_and_embedded_grids_in_either_layout(memory_format):
    """Rows of one-hot classes and of an embedding are written whole, in channels-last programs too (they were
    refused there as non-contiguous outputs)."""
    rng = np.random.default_rng(36)
    x, y = rng.random((2, 1, 4, 5)).astype(np.float32), rng.integers(0, 3, (2, 4, 5))
    ft.manual_seed(6)
    model = nn.Conv2d(1, 3, 3, padding=1)
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), segmentation_loss, batch_size=2,
                            input_shape=(1, 4, 5), target_shape=(4, 5), target_dtype=ft.int64,
                            memory_format=memory_format)
    logp = F.log_softmax(model(ft.tensor(x)), 1).numpy().astype(np.float64)
    want = -np.take_along_axis(logp, y[:, None], 1).mean()
    assert program.evaluate(x, y)[0] == pytest.approx(want, rel=1e-5)

    class Grid(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.fc = nn.Embedding(10, 4), nn.Linear(4, 3)

        def forward(self, ids):
            return self.fc(self.emb(ids).mean((1, 2)))

    grid = Grid()
    program = grid.compile(ft.optim.SGD(grid.parameters(), lr=0.1), batch_size=2, input_shape=(3, 5),
                           input_dtype=ft.int64, memory_format=memory_format)
    ids = rng.integers(0, 10, (2, 3, 5))
    np.testing.assert_allclose(program.predict(ids).numpy(), grid(ft.tensor(ids)).numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("norm", [lambda: nn.BatchNorm2d(4), lambda: nn.GroupNorm(2, 4),
                                  lambda: nn.InstanceNorm2d(4, affine=True)], ids=["batch", "group", "instance"])
def test_norms_of_a_reshaped_vector_in_a_channels_last_program(norm):
    """A norm reads and writes one layout: fed a vector reshaped into an image (a decoder's first block), it keeps
    the reshape's order (the step was refused with "out must have the input's memory layout")."""

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.norm, self.conv = nn.Linear(6, 64), norm(), nn.Conv2d(4, CLASSES, 3, padding=1)

        def forward(self, x):
            h = F.relu(self.norm(self.fc(x).view(-1, 4, 4, 4)))
            return self.conv(h).mean((2, 3))

    ft.manual_seed(8)
    model = Decoder()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=4, input_shape=(6,))
    x, y = batch(4, shape=(6,), seed=9)
    assert gradcheck(program, x, y, eps=1e-3, rtol=3e-2, atol=3e-3)
    model.eval()
    np.testing.assert_allclose(program.predict(x).numpy(), model(ft.tensor(x)).numpy(), rtol=1e-5, atol=1e-6)


def padded(lib=ft):
    """The padding modes PyTorch code uses: a reflection pad layer, convolutions padding by replication and
    wrapping around, and F.pad with mode='circular'."""
    L, Fn = (nn, F) if lib is ft else (lib.nn, lib.nn.functional)
    return L.Sequential(L.ReflectionPad2d((1, 2, 2, 1)), L.Conv2d(2, 4, 3, padding_mode="replicate", padding=1),
                        L.ReLU(), L.Conv2d(4, 3, (3, 1), padding=(2, 0), padding_mode="circular"),
                        L.ReplicationPad2d((0, 1, 0, 0)), L.Flatten(), L.Linear(3 * 11 * 10, CLASSES))


def test_same_padding_pads_an_odd_total_on_the_right_as_pytorch():
    """padding='same' of an even kernel: one element more on the right and bottom; 'valid' none."""
    x = np.random.default_rng(49).standard_normal((2, 2, 5, 6)).astype(np.float32)
    ft.manual_seed(16)
    conv = nn.Conv2d(2, 3, (4, 3), padding="same", dilation=(1, 2))
    assert repr(conv).endswith("padding=same, dilation=(1, 2))")
    w, b = conv.weight.numpy().astype(np.float64), conv.bias.numpy()
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 2), (2, 2)))  # totals 3 (1 + 2) and 4 (2 + 2)
    win = np.lib.stride_tricks.sliding_window_view(xp, (4, 5), axis=(2, 3))[..., ::1, ::2]
    want = np.einsum("nchwij,kcij->nkhw", win, w) + b[:, None, None]
    np.testing.assert_allclose(conv(ft.tensor(x)).numpy(), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(F.conv2d(ft.tensor(x), conv.weight, conv.bias, padding="same", dilation=(1, 2)).numpy(),
                               want, rtol=1e-5, atol=1e-5)
    model = nn.Sequential(conv, nn.ReLU(), nn.Conv2d(3, 2, 2, padding="valid"), nn.Flatten(),
                          nn.Linear(2 * 4 * 5, CLASSES))
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=2, input_shape=(2, 5, 6))
    np.testing.assert_allclose(program.predict(x).numpy(), model(ft.tensor(x)).numpy(), rtol=1e-5, atol=1e-5)
    assert gradcheck(program, x, np.array([0, 1]), eps=1e-3, rtol=3e-2, atol=3e-3)


def test_layer_norm_without_bias_has_no_bias_parameter_and_trains():
    ft.manual_seed(17)
    model = nn.Sequential(nn.Linear(4, 6), nn.LayerNorm(6, bias=False), nn.Linear(6, CLASSES))
    assert list(model.state_dict()) == ["0.weight", "0.bias", "1.weight", "2.weight", "2.bias"]
    assert repr(model[1]) == "LayerNorm((6,), eps=1e-05, elementwise_affine=True, bias=False)"
    model[1].weight.copy_(np.linspace(0.5, 2.0, 6, dtype=np.float32))
    x, y = batch(3, shape=(4,), seed=18)
    h = x.astype(np.float64) @ model[0].weight.numpy().T + model[0].bias.numpy()
    h = (h - h.mean(1, keepdims=True)) / np.sqrt(h.var(1, keepdims=True) + 1e-5) * model[1].weight.numpy()
    want = h @ model[2].weight.numpy().T + model[2].bias.numpy()
    np.testing.assert_allclose(model(ft.tensor(x)).numpy(), want, rtol=1e-5, atol=1e-5)
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=3, input_shape=(4,))
    np.testing.assert_allclose(program.predict(x).numpy(), want, rtol=1e-5, atol=1e-5)
    assert gradcheck(program, x, y, eps=1e-3, rtol=3e-2, atol=1e-3)


def encoder(lib=ft):
    """A TransformerEncoder of copies of one layer over pretrained (frozen) embeddings."""
    L = nn if lib is ft else lib.nn
    table = lib.linspace(-1.0, 1.0, 11 * 8).reshape(11, 8)

    class Encoder(L.Module):
        def __init__(self):
            super().__init__()
            self.emb = L.Embedding.from_pretrained(table, padding_idx=0)
            layer = L.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True, norm_first=True)
            self.enc = L.TransformerEncoder(layer, 2, norm=L.LayerNorm(8))
            self.head = L.Linear(8, CLASSES)

        def forward(self, ids):
            return self.head(self.enc(self.emb(ids)).mean(1))
    return Encoder()


def test_transformer_encoder_copies_its_layer_and_pretrained_embeddings_stay_frozen():
    ft.manual_seed(19)
    model = encoder()
    layers = model.enc.layers
    assert len(layers) == 2 and layers[0].linear1.weight.data_ptr() != layers[1].linear1.weight.data_ptr()
    assert not model.emb.weight.requires_grad and model.emb.weight[1].tolist() == ft.linspace(-1, 1, 88)[8:16].tolist()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=2, input_shape=(5,),
                            input_dtype=ft.int64)
    ids, y = np.random.default_rng(20).integers(0, 11, (2, 5)), np.array([0, 3])
    assert gradcheck(program, ids, y, eps=1e-3, rtol=3e-2, atol=1e-3)
    program.backward(ids, y)
    assert all(np.abs(p.grad.numpy()).max() > 0 for p in layers[1].parameters())


@needs_torch
def test_transformer_encoder_matches_pytorch():
    torch.manual_seed(30)  # PyTorch's initial weights whatever tests ran before in this process
    tm, model = encoder(torch), encoder()
    assert list(model.state_dict()) == list(tm.state_dict())
    model.load_state_dict({k: v.detach().numpy() for k, v in tm.state_dict().items()})
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=2, input_shape=(5,),
                            input_dtype=ft.int64)
    ids, y = np.random.default_rng(21).integers(0, 11, (2, 5)), np.array([1, 2])
    assert_gradients_match(program, tm, ids, y, torch.nn.CrossEntropyLoss())


def test_padding_modes_match_finite_differences_and_their_eager_forward():
    x, y = batch(3, shape=(2, 6, 6), seed=43)
    ft.manual_seed(10)
    model = padded()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=3, input_shape=(2, 6, 6))
    assert gradcheck(program, x, y, eps=1e-3, rtol=3e-2, atol=3e-3)  # eps crosses few of ReLU's kinks
    np.testing.assert_allclose(program.predict(x).numpy(), model(ft.tensor(x)).numpy(), rtol=1e-5, atol=1e-5)


@needs_torch
def test_padding_modes_match_pytorch():
    x, y = batch(3, shape=(2, 6, 6), seed=44)
    tm, model = padded(torch), padded()
    model.load_state_dict({k: v.detach().numpy() for k, v in tm.state_dict().items()})
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=3, input_shape=(2, 6, 6))
    assert_gradients_match(program, tm, x, y, torch.nn.CrossEntropyLoss())


SELU_ALPHA, SELU_SCALE = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946
WRITTEN_ACTIVATIONS = {  # PyTorch's definitions, in NumPy
    "SELU": ({}, lambda x: SELU_SCALE * np.where(x > 0, x, SELU_ALPHA * np.expm1(x))),
    "CELU": ({"alpha": 0.7}, lambda x: np.maximum(x, 0) + np.minimum(0, 0.7 * np.expm1(x / 0.7))),
    "LogSigmoid": ({}, lambda x: -np.logaddexp(0, -x)),
    "Softsign": ({}, lambda x: x / (1 + np.abs(x))),
    "Tanhshrink": ({}, lambda x: x - np.tanh(x)),
    "Softmax2d": ({}, lambda x: np.exp(x) / np.exp(x).sum(-3, keepdims=True)),
    "Softplus": ({"beta": 2.5}, lambda x: np.logaddexp(0, 2.5 * x) / 2.5),
}


def activation_net(name, lib=ft):
    L = nn if lib is ft else lib.nn
    return L.Sequential(L.Conv2d(3, 4, 3), getattr(L, name)(**WRITTEN_ACTIVATIONS[name][0]), L.Flatten(),
                        L.Linear(36, CLASSES))


@pytest.mark.parametrize("name", WRITTEN_ACTIVATIONS)
def test_activations_written_with_other_ops_match_numpy_and_finite_differences(name):
    x = np.random.default_rng(45).standard_normal((2, 3, 5, 5)) * 3
    got = getattr(nn, name)(**WRITTEN_ACTIVATIONS[name][0])(ft.tensor(x.astype(np.float32))).numpy()
    np.testing.assert_allclose(got, WRITTEN_ACTIVATIONS[name][1](x), rtol=1e-5, atol=1e-6)
    ft.manual_seed(11)
    model = activation_net(name)
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=2, input_shape=(3, 5, 5))
    x, y = batch(2, shape=(3, 5, 5), seed=46)
    assert gradcheck(program, x, y, eps=1e-3, rtol=3e-2, atol=1e-3)


@needs_torch
@pytest.mark.parametrize("name", WRITTEN_ACTIVATIONS)
def test_activations_written_with_other_ops_match_pytorch(name):
    tm, model = activation_net(name, torch), activation_net(name)
    model.load_state_dict({k: v.detach().numpy() for k, v in tm.state_dict().items()})
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=2, input_shape=(3, 5, 5))
    x, y = batch(2, shape=(3, 5, 5), seed=47)
    assert_gradients_match(program, tm, x, y, torch.nn.CrossEntropyLoss())
    assert repr(model[1]) == repr(tm[1])


def test_softplus_threshold_is_linear_above_it_eagerly_and_refused_below_15_compiled():
    x = np.linspace(-4.0, 4.0, 33).astype(np.float32)
    want = np.where(2 * x > 1.0, x, np.logaddexp(0, 2 * x.astype(np.float64)) / 2)
    np.testing.assert_allclose(nn.Softplus(beta=2.0, threshold=1.0)(ft.tensor(x)).numpy(), want, rtol=1e-6)
    np.testing.assert_allclose(F.softplus(ft.tensor(x), 2.0, 1.0).numpy(), want, rtol=1e-6)
    model = nn.Sequential(nn.Linear(4, 4), nn.Softplus(beta=2.0, threshold=1.0))
    with pytest.raises(ft.nn.TracingError, match=r"Softplus\(threshold=1.0\) in a compiled model .* 15 or more"):
        model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.MSELoss(), batch_size=2, input_shape=(4,))


def pair_losses(outputs, y, Fn=F):
    """Ranking and embedding losses of targets 1 or -1, written as PyTorch code writes them: the library's and by
    hand, arithmetic on the targets before any loss fixes their shape."""
    a, b = outputs[:, :3], outputs[:, 3:]
    by_hand = (-y * (a[:, 0] - b[:, 0]) + 0.3).clamp(min=0).mean()
    return (Fn.margin_ranking_loss(a[:, 1], b[:, 1], y, margin=0.2) + Fn.cosine_embedding_loss(a, b, y, margin=0.1)
            + by_hand)


def test_pair_losses_of_plus_minus_one_targets_match_numpy():
    rng = np.random.default_rng(48)
    x, y = rng.standard_normal((6, 5)).astype(np.float32), np.array([1, -1, 1, 1, -1, -1], np.float32)
    ft.manual_seed(12)
    model = nn.Linear(5, 6)
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), pair_losses, batch_size=6, input_shape=(5,))
    o = model(ft.tensor(x)).numpy().astype(np.float64)
    a, b = o[:, :3], o[:, 3:]
    cos = (a * b).sum(1) / np.sqrt((a * a).sum(1) * (b * b).sum(1))
    want = (np.maximum(0, -y * (a[:, 1] - b[:, 1]) + 0.2).mean() + np.where(y > 0, 1 - cos, np.maximum(0, cos - 0.1))
            .mean() + np.maximum(0, -y * (a[:, 0] - b[:, 0]) + 0.3).mean())
    assert program.evaluate(x, y)[0] == pytest.approx(want, rel=1e-5)
    assert pair_losses(ft.tensor(o.astype(np.float32)), ft.tensor(y)).item() == pytest.approx(want, rel=1e-5)
    assert gradcheck(program, x, y, eps=1e-3, rtol=3e-2, atol=1e-3)


def test_labels_read_both_as_classes_and_as_float_values_are_refused_at_compile():
    class TwoHeads(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 3), nn.Linear(4, 1)

        def forward(self, x):
            return self.a(x), self.b(x)

    model = TwoHeads()
    for loss in (lambda o, y: F.cross_entropy(o[0], y) + F.mse_loss(o[1], y.float().unsqueeze(1)),
                 lambda o, y: F.mse_loss(o[1], y.float().unsqueeze(1)) + F.cross_entropy(o[0], y)):
        with pytest.raises(ft.nn.TracingError, match=r"read as int64 labels at .* and as float values \(y\.float\(\)\)"
                                                     r" at .*: a compiled program reads its targets in one dtype"):
            model.compile(ft.optim.SGD(model.parameters(), lr=0.1), loss, batch_size=2, input_shape=(4,))


@pytest.mark.parametrize("key", [0, "cls"])
def test_targets_taken_apart_as_a_tuple_or_dict_name_the_packed_form(key):
    model = nn.Linear(4, 3)
    with pytest.raises(ft.nn.TracingError, match=r"the targets taken apart as y\[.*\] \(a tuple or dict of targets\)"
                                                 r".*for several targets give each one's per-sample shape, "
                                                 r"compile\(..., target_shape=\(\(\), \(4,\)\)"):
        model.compile(ft.optim.SGD(model.parameters(), lr=0.1), lambda o, y: F.cross_entropy(o, y[key]),
                      batch_size=2, input_shape=(4,))


def test_targets_unpacked_or_labels_cast_from_float_targets_name_several_targets():
    """A multi-task loss written for a tuple of targets (yc, yr = y), or for class labels in a float column
    (y[:, 0].long()), compiled for one target, names the target_shape of several that compiles."""
    def unpacked(o, y):
        yc, yr = y
        return F.cross_entropy(o[:, :3], yc) + F.mse_loss(o[:, 3:], yr)

    model = nn.Linear(4, 5)
    for loss, what in ((unpacked, r"the targets taken apart \(yc, yr = y"),
                       (lambda o, y: F.cross_entropy(o[:, :3], y[:, 0].long()) + F.mse_loss(o[:, 3:], y[:, 1:]),
                        r"class labels computed from float targets \(y\[:, 0\].to\(int64\)\)")):
        with pytest.raises(ft.nn.TracingError, match=what + r".*target_dtype=\(ft.int64, ft.float32\)\), and batches "
                                                        r"\(x, \(labels, boxes\)\)"):
            model.compile(ft.optim.SGD(model.parameters(), lr=0.1), loss, batch_size=2, input_shape=(4,),
                          target_shape=(3,), target_dtype=ft.float32)


def test_targets_taken_as_one_value_per_sample_say_so_when_they_do_not_fit():
    model = nn.Conv2d(1, 3, 3, padding=1)
    with pytest.raises(ft.nn.TracingError, match=r"permute.*the targets were taken as one value per sample.*"
                                                 r"target_shape="):
        model.compile(ft.optim.SGD(model.parameters(), lr=0.1), segmentation_loss, batch_size=2,
                      input_shape=(1, 4, 5))


def test_attribute_probes_and_the_batch_transpose():
    class Probe(nn.Module):
        def __init__(self, use):
            super().__init__()
            self.fc, self.use = nn.Linear(4, 4), use

        def forward(self, x):
            h = self.fc(x)
            assert not hasattr(h, "some_flag")  # duck typing sees a missing attribute
            return self.use(h)

    model = Probe(lambda h: h * 2)
    model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.MSELoss(), batch_size=2, input_shape=(4,))
    for use in (lambda h: h @ h.T, lambda h: h.t(), lambda h: h.some_flag):
        model = Probe(use)
        with pytest.raises(ft.nn.TracingError, match=r"x\.T / x\.t\(\) .* across the batch|x\.some_flag"):
            model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.MSELoss(), batch_size=2, input_shape=(4,))


def aliased(lib=ft):
    """In-place ops on a value that another name still holds: PyTorch changes the one tensor both names read."""
    L, Fn = (nn, F) if lib is ft else (lib.nn, lib.nn.functional)

    class Aliased(L.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.act = L.Linear(4, 4), L.ReLU(inplace=True)

        def forward(self, x):
            h = self.fc(x)
            a = self.act(h) + h  # h is relu(h) now
            g = self.fc(x)
            kept = g
            g += a  # kept is g + a too
            Fn.leaky_relu(g, 0.1, inplace=True)
            k = self.fc(x)
            k.mul_(2).clamp_(min=-0.5)
            Fn.relu6(k, inplace=True)
            return kept + g + k

    return Aliased()


def test_in_place_ops_change_every_name_of_the_value_as_eagerly():
    x = np.random.default_rng(37).standard_normal((3, 4)).astype(np.float32)
    ft.manual_seed(7)
    model = aliased()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.MSELoss(), batch_size=3, input_shape=(4,))
    np.testing.assert_allclose(program.predict(x).numpy(), model(ft.tensor(x)).numpy(), rtol=1e-5, atol=1e-6)
    h = x.astype(np.float64) @ model.fc.weight.numpy().T + model.fc.bias.numpy()
    g = h + 2 * np.maximum(h, 0)
    g = np.where(g > 0, g, 0.1 * g)
    k = np.clip(np.maximum(2 * h, -0.5), 0, 6)
    np.testing.assert_allclose(program.predict(x).numpy(), 2 * g + k, rtol=1e-5, atol=1e-6)


@needs_torch
def test_in_place_ops_match_pytorch():
    x = np.random.default_rng(38).standard_normal((3, 4)).astype(np.float32)
    tm, model = aliased(torch), aliased()
    model.load_state_dict({k: v.detach().numpy() for k, v in tm.state_dict().items()})
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.MSELoss(), batch_size=3, input_shape=(4,))
    assert_gradients_match(program, tm, x, np.zeros((3, 4), np.float32), torch.nn.MSELoss())


def timm_attention(lib=ft):
    """timm's ViT attention: the packed projection permuted with q/k/v before the batch, taken apart with unbind
    and indexing; both F.scaled_dot_product_attention and the softmax written out."""
    L, Fn = (nn, F) if lib is ft else (lib.nn, lib.nn.functional)

    class Attention(L.Module):
        def __init__(self, dim=8, heads=2):
            super().__init__()
            self.heads, self.qkv, self.proj = heads, L.Linear(dim, dim * 3), L.Linear(dim, dim)
            self.head = L.Linear(dim, CLASSES)

        def forward(self, x):
            B, N, C = x.shape
            qkv = self.qkv(x).reshape(B, N, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
            q, k, v = qkv.unbind(0)
            a = Fn.scaled_dot_product_attention(q, k, v)
            att = (qkv[0] @ qkv[1].transpose(-2, -1) * 0.5).softmax(-1) @ qkv[2]
            y = (a + att).transpose(1, 2).reshape(B, N, C)
            first, *rest = y.unbind(1)  # the class token's row
            return self.head(self.proj(first) + lib.stack(rest, dim=1).mean(1))

    return Attention()


def test_timm_attention_matches_finite_differences():
    x = np.random.default_rng(39).standard_normal((3, 4, 8)).astype(np.float32)
    ft.manual_seed(8)
    model = timm_attention()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=3, input_shape=(4, 8))
    assert gradcheck(program, x, np.arange(3) % CLASSES, rtol=3e-2, atol=1e-4)
    np.testing.assert_allclose(program.predict(x).numpy(), model(ft.tensor(x)).numpy(), rtol=1e-5, atol=1e-6)


@needs_torch
def test_timm_attention_matches_pytorch():
    x = np.random.default_rng(40).standard_normal((3, 4, 8)).astype(np.float32)
    tm, model = timm_attention(torch), timm_attention()
    model.load_state_dict({k: v.detach().numpy() for k, v in tm.state_dict().items()})
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=3,
                            input_shape=(4, 8))
    assert_gradients_match(program, tm, x, np.arange(3) % CLASSES, torch.nn.CrossEntropyLoss())


def test_a_permute_moving_the_batch_is_only_taken_apart():
    class Moved(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 6)

        def forward(self, x):
            return self.fc(x).view(x.size(0), 3, 2).permute(1, 0, 2).sum(-1)

    model = Moved()
    with pytest.raises(ft.nn.TracingError, match=r"permute\(1, 0, 2\) \(the batch not first\).*unbind\(0\)"):
        model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.MSELoss(), batch_size=2, input_shape=(4,))


def more_layers(lib=ft):
    """Layers written with other ops: InstanceNorm2d, PReLU, PixelShuffle/Unshuffle, RMSNorm, GLU, Hardsigmoid,
    Mish, Unflatten, a ParameterList and F.pad (a negative pad crops)."""
    L, Fn = (nn, F) if lib is ft else (lib.nn, lib.nn.functional)

    class Layers(L.Module):
        def __init__(self):
            super().__init__()
            self.conv = L.Conv2d(2, 8, 3, padding=1)
            self.inorm, self.prelu, self.prelu1 = L.InstanceNorm2d(8, affine=True), L.PReLU(8), L.PReLU()
            self.shuffle, self.unshuffle = L.PixelShuffle(2), L.PixelUnshuffle(2)
            self.flat, self.rms, self.glu = L.Flatten(2), L.RMSNorm(36), L.GLU()
            self.act1, self.act2, self.unflat = L.Hardsigmoid(), L.Mish(), L.Unflatten(2, (3, 6))
            self.scales = L.ParameterList([L.Parameter(lib.ones(6) * 1.5), L.Parameter(lib.ones(6) * 0.1)])
            self.head = L.Linear(128, CLASSES)

        def forward(self, x):
            h = self.prelu(self.inorm(self.conv(x)))
            h = self.unshuffle(self.shuffle(h))
            h = self.glu(self.rms(self.flat(h)))  # (N, 8, 18)
            h = self.act1(h) + self.act2(h) + self.prelu1(h)
            h = self.unflat(h) * self.scales[0] + self.scales[1]  # (N, 8, 3, 6)
            return self.head(Fn.pad(h, (1, 1, 0, -1), value=0.5).flatten(1))  # (N, 8, 2, 8)

    return Layers()


def test_layers_written_with_other_ops_match_finite_differences_and_their_eager_forward():
    x = np.random.default_rng(41).standard_normal((3, 2, 6, 6)).astype(np.float32)
    ft.manual_seed(9)
    model = more_layers()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=3, input_shape=(2, 6, 6))
    assert gradcheck(program, x, np.arange(3) % CLASSES, rtol=3e-2, atol=1e-4)
    np.testing.assert_allclose(program.predict(x).numpy(), model(ft.tensor(x)).numpy(), rtol=1e-5, atol=1e-5)


@needs_torch
def test_layers_written_with_other_ops_match_pytorch():
    x = np.random.default_rng(42).standard_normal((3, 2, 6, 6)).astype(np.float32)
    tm, model = more_layers(torch), more_layers()
    model.load_state_dict({k: v.detach().numpy() for k, v in tm.state_dict().items()})
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=3,
                            input_shape=(2, 6, 6))
    assert_gradients_match(program, tm, x, np.arange(3) % CLASSES, torch.nn.CrossEntropyLoss())
    np.testing.assert_allclose(model(ft.tensor(x)).numpy(), tm(torch.from_numpy(x)).detach().numpy(), rtol=1e-5,
                               atol=1e-5)


def dice_loss(out, y, constant=1.0):
    p, oh = F.softmax(out, 1), F.one_hot(y, CLASSES).float()
    dice = (2 * (p * oh).sum(1) + 1) / (p.sum(1) + oh.sum(1) + 1)
    return constant - dice.mean()


@pytest.mark.parametrize("rows", [6, 4])
def test_a_constant_added_to_a_loss_is_its_value_whatever_the_batch(rows):
    """1 - dice.mean(): the constant is each sample's share of it, so the loss reads as written for any batch
    (and micro-batches), and the gradients are the loss's without it."""
    rng = np.random.default_rng(43)
    x, y = rng.standard_normal((rows, 4)).astype(np.float32), rng.integers(0, CLASSES, rows)
    model = nn.Linear(4, CLASSES)
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), dice_loss, batch_size=6, input_shape=(4,),
                            accumulate_steps=2 if rows == 6 else 1)
    p = F.softmax(model(ft.tensor(x)), 1).numpy().astype(np.float64)
    oh = np.eye(CLASSES)[y]
    want = 1 - ((2 * (p * oh).sum(1) + 1) / (p.sum(1) + oh.sum(1) + 1)).mean()
    assert program.evaluate(x, y)[0] == pytest.approx(want, rel=1e-5)
    program.backward(x, y)
    with_constant = model.weight.grad.numpy().copy()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), lambda o, t: dice_loss(o, t, 0.0),
                            batch_size=6, input_shape=(4,))
    model.zero_grad()  # (backward adds into .grad, as PyTorch's)
    program.backward(x, y)
    np.testing.assert_allclose(model.weight.grad.numpy(), with_constant, rtol=1e-6, atol=1e-7)


def test_a_traced_value_is_a_tensor_to_isinstance():
    """A forward that checks for a tensor takes the branch it takes eagerly (it was silently skipped)."""
    class Checked(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            h = self.fc(x)
            if isinstance(h, ft.Tensor):
                h = h * 2.0
            assert not isinstance(h, nn.Parameter)
            return h

    x = np.random.default_rng(44).standard_normal((2, 4)).astype(np.float32)
    model = Checked()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.MSELoss(), batch_size=2, input_shape=(4,))
    np.testing.assert_allclose(program.predict(x).numpy(), model(ft.tensor(x)).numpy(), rtol=1e-6)


def decoder(lib=ft):
    """A decoder's upsampling by transposed convolutions (a U-Net's, a VAE's or a GAN's), images and sequences."""
    L = nn if lib is ft else lib.nn

    class Decoder(L.Module):
        def __init__(self):
            super().__init__()
            self.up = L.ConvTranspose2d(3, 4, 3, stride=2, padding=1, output_padding=1)
            self.bn = L.BatchNorm2d(4)
            self.up2 = L.ConvTranspose2d(4, 4, 2, stride=2, groups=2, bias=False)
            self.seq = L.ConvTranspose1d(4, 2, 3, stride=2)
            self.head = L.Linear(2 * 33, CLASSES)

        def forward(self, x):
            h = self.up2(lib.relu(self.bn(self.up(x))))  # (N, 4, 16, 16)
            return self.head(self.seq(h.mean(2)).flatten(1))  # (N, 2, 33)

    return Decoder()


def test_transposed_convolutions_match_finite_differences_and_their_eager_forward():
    x = np.random.default_rng(45).standard_normal((3, 3, 4, 4)).astype(np.float32)
    ft.manual_seed(10)
    model = decoder()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=3, input_shape=(3, 4, 4))
    assert gradcheck(program, x, np.arange(3) % CLASSES, rtol=3e-2, atol=5e-4)  # (float32 differences through BN)
    model.eval()
    np.testing.assert_allclose(program.predict(x).numpy(), model(ft.tensor(x)).numpy(), rtol=1e-4, atol=1e-5)


@needs_torch
def test_transposed_convolutions_match_pytorch():
    x = np.random.default_rng(46).standard_normal((3, 3, 4, 4)).astype(np.float32)
    tm, model = decoder(torch), decoder()
    model.load_state_dict({k: v.detach().numpy() for k, v in tm.state_dict().items()})
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=3,
                            input_shape=(3, 4, 4))
    assert_gradients_match(program, tm, x, np.arange(3) % CLASSES, torch.nn.CrossEntropyLoss())


def skip_sized(lib=ft):
    """A U-Net's upsampling back to the size of its skip connection: ConvTranspose2d(h, output_size=x.size())."""
    L = nn if lib is ft else lib.nn

    class Up(L.Module):
        def __init__(self):
            super().__init__()
            self.down = L.Conv2d(3, 4, 3, stride=2, padding=1)
            self.up = L.ConvTranspose2d(4, 3, 3, stride=2, padding=1)
            self.up1d = L.ConvTranspose1d(4, 2, 3, stride=2, padding=1)
            self.head = L.Linear(3 * 6 * 6 + 2 * 6, CLASSES)

        def forward(self, x):
            h = self.down(x)  # (N, 4, 3, 3): 5 x 5 and 6 x 6 both map here
            skip = self.up(h, output_size=x.size()) + x
            seq = self.up1d(h.mean(3), output_size=[6])
            return self.head(input=lib.cat((skip.flatten(1), seq.flatten(1)), 1))  # by PyTorch's name

    return Up()


def test_transposed_convolution_to_a_given_output_size():
    x = np.random.default_rng(48).standard_normal((2, 3, 6, 6)).astype(np.float32)
    model = skip_sized()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=2,
                            input_shape=(3, 6, 6))
    assert gradcheck(program, x, np.arange(2), rtol=3e-2, atol=5e-4)
    np.testing.assert_allclose(program.predict(x).numpy(), model(ft.tensor(x)).numpy(), rtol=1e-5, atol=1e-6)
    assert model.up(ft.zeros(2, 4, 3, 3), output_size=(5, 5)).shape == (2, 3, 5, 5)
    with pytest.raises(ValueError, match=r"ConvTranspose2d: requested an output size of \(7, 7\), but valid sizes "
                                         r"for this input range from \(5, 5\) to \(6, 6\)"):
        model.up(ft.zeros(1, 4, 3, 3), output_size=(7, 7))


@needs_torch
def test_transposed_convolution_to_a_given_output_size_matches_pytorch():
    x = np.random.default_rng(49).standard_normal((2, 3, 6, 6)).astype(np.float32)
    tm, model = skip_sized(torch), skip_sized()
    model.load_state_dict({k: v.detach().numpy() for k, v in tm.state_dict().items()})
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=2,
                            input_shape=(3, 6, 6))
    assert_gradients_match(program, tm, x, np.arange(2), torch.nn.CrossEntropyLoss())


@needs_torch
def test_layers_take_their_inputs_by_pytorchs_names():
    import inspect
    for name in dir(nn):  # (a lazy layer's forward runs once, to become the layer)
        ours, theirs = getattr(nn, name), getattr(torch.nn, name, None)
        if isinstance(ours, type) and issubclass(ours, nn.Module) and isinstance(theirs, type) and \
                not name.endswith("3d") and not name.startswith("Lazy") and \
                ours not in (nn.Module, nn.ModuleList, nn.ModuleDict, nn.ParameterList, nn.ParameterDict):
            assert list(inspect.signature(ours.forward).parameters) == \
                list(inspect.signature(theirs.forward).parameters), name
    x = ft.randn(2, 3)
    layer = nn.Linear(3, 4)
    np.testing.assert_array_equal(nn.Sequential(layer, nn.GELU())(input=x).numpy(),
                                  F.gelu(layer(x)).numpy())
    assert nn.Identity(54, unused="argument")(x) is x  # its arguments taken and ignored, as torch's


def test_clone_new_tensors_and_like_constants_of_traced_values():
    class Cloned(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 3)

        def forward(self, x):
            h = self.fc(x)
            kept = h.clone()
            h += 1.0  # the clone keeps the value before
            return kept * 2 + h + ft.ones_like(h) + ft.full_like(h, 0.5) + ft.zeros_like(h) + h.new_ones(3)

    x = np.random.default_rng(47).standard_normal((2, 4)).astype(np.float32)
    model = Cloned()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.MSELoss(), batch_size=2, input_shape=(4,))
    h = x.astype(np.float64) @ model.fc.weight.numpy().T + model.fc.bias.numpy()
    np.testing.assert_allclose(program.predict(x).numpy(), 3 * h + 3.5, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(program.predict(x).numpy(), model(ft.tensor(x)).numpy(), rtol=1e-5, atol=1e-6)


def test_in_place_ops_and_views_that_share_memory():
    """x + 0 is a new value; a value viewed (x.view, x[:, :3], x.detach()) and changed in place through another
    name would read the change in PyTorch: reading it after is refused, and a view changed in place alone is
    fine."""
    class Summed(nn.Module):
        def __init__(self):
            super().__init__()
            self.heads = nn.ModuleList([nn.Linear(3, 4) for _ in range(3)])

        def forward(self, x):
            feats = [h(x) for h in self.heads]
            total = 0
            for f in feats:
                total += f  # 0 + f0 is a new value: the next += leaves feats[0] alone
            h = self.heads[0](x).view(x.size(0), 2, 2)
            h += 1.0  # a view changed in place: its base is never read again
            return ft.cat([total] + feats + [h.flatten(1)], 1)

    x = np.random.default_rng(48).standard_normal((2, 3)).astype(np.float32)
    model = Summed()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.MSELoss(), batch_size=2, input_shape=(3,))
    np.testing.assert_allclose(program.predict(x).numpy(), model(ft.tensor(x)).numpy(), rtol=1e-5, atol=1e-6)

    for stale in (lambda h: (h[:, :3], h.relu_())[0], lambda h: (h, h[:, :3].relu_())[0],
                  lambda h: (h, h.detach().mul_(2))[0], lambda h: (h, F.relu(h.view(h.size(0), 2, 2), True))[0]):
        class Stale(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(3, 4)

            def forward(self, x):
                return stale(self.fc(x)) * 2.0

        model = Stale()
        with pytest.raises(ft.nn.TracingError, match="a value read after an in-place op on a value sharing its "
                                                     "memory"):
            model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.MSELoss(), batch_size=2, input_shape=(3,))


@pytest.mark.parametrize("forward, message", [
    (lambda self, x: self.fc(x) + ft.randn_like(self.scale), r"ft\.randn_like in a traced forward"),
    (lambda self, x: self.fc(x).view(x.size(0), 2, 2).log_softmax(-1).gather(2, ft.zeros(2, 2, 1, dtype=ft.int64)),
     r"gather\(\) with an index other than the targets' labels"),
])
def test_draws_of_tensors_and_gather_of_other_indices_are_refused(forward, message):
    class Refused(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 4)
            self.register_buffer("scale", ft.ones(4))

        def forward(self, x):
            return forward(self, x)

    model = Refused()
    with pytest.raises(ft.nn.TracingError, match=message):
        model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.MSELoss(), batch_size=2, input_shape=(3,))


def test_integers_become_floats_and_floats_do_not_become_integers():
    """ids.float() (Hugging Face's mask.to(dtype)) converts as PyTorch's cast (it was refused); x.long() of floats
    is refused where it is written."""
    class Floats(nn.Module):
        def __init__(self, back):
            super().__init__()
            self.fc, self.back = nn.Linear(3, 2), back

        def forward(self, ids):
            out = self.fc(ids.float())
            return out.long() if self.back else out

    model = Floats(False)
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.MSELoss(), batch_size=2, input_shape=(3,),
                            input_dtype=ft.int64)
    ids = np.array([[1, 5, 9], [2 ** 20, 0, -3]])
    want = ids.astype(np.float64) @ model.fc.weight.numpy().T + model.fc.bias.numpy()
    np.testing.assert_allclose(program.predict(ids).numpy(), want, rtol=1e-6)
    model = Floats(True)
    with pytest.raises(ft.nn.TracingError, match=r"x.to\(int64\) of a traced value of float32 .* does not turn "
                                                 r"floats into integers"):
        model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.MSELoss(), batch_size=2, input_shape=(3,),
                      input_dtype=ft.int64)


@pytest.mark.parametrize("ids_of", [lambda ids: ids + 1, lambda ids: ids * 2,
                                    lambda ids: ft.empty(ids.size(0), 1, dtype=ft.long).fill_(3) + 2])
def test_arithmetic_on_integer_values_is_refused_where_it_is_written(ids_of):
    """Token ids shifted, or an integer constant of the batch size, compiled and then failed in every call (the
    program adds in floats): it is refused at compile, naming the line."""
    class Shifted(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.fc = nn.Embedding(10, 4), nn.Linear(4, 2)

        def forward(self, ids):
            return self.fc(self.emb(ids_of(ids)).mean(1))

    model = Shifted()
    with pytest.raises(ft.nn.TracingError, match=r"arithmetic on traced integer values \(int64.*at .*test_trace.py"):
        model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=2, input_shape=(3,), input_dtype=ft.int64)


def test_forwards_with_more_arguments_and_other_pytorch_spellings():
    """A forward with a second required argument names it; a constant expanded as a traced value (a style loss's
    Gram target), torch.bmm of the samples' matrices and view(-1, 1) of one value per sample compile."""
    class Hidden(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 3)

        def forward(self, x, hidden):
            return self.fc(x)

    with pytest.raises(ft.nn.TracingError, match=r"Hidden.forward takes hidden besides the 1 input.*input_shape=.*"
                                                  r"defaults"):
        Hidden().compile(ft.optim.SGD(Hidden().parameters(), lr=0.1), batch_size=2, input_shape=(4,))
    target = ft.tensor(np.eye(2, dtype=np.float32)[None])  # (1, C, C)

    def style(y, t):
        f = y.view(y.size(0), 2, 4)
        gram = f.bmm(f.transpose(1, 2)) / 4
        return F.mse_loss(gram, target.expand_as(gram)) + F.mse_loss(y.view(-1, 8).sum(1).view(-1, 1), t)

    ft.manual_seed(20)
    model = nn.Conv2d(2, 2, 1)
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), style, batch_size=2, input_shape=(2, 2, 2),
                            target_shape=(1,))
    x = np.random.default_rng(21).standard_normal((2, 2, 2, 2)).astype(np.float32)
    t = np.ones((2, 1), np.float32)
    f = model(ft.tensor(x)).numpy().reshape(2, 2, 4).astype(np.float64)
    gram = f @ f.transpose(0, 2, 1) / 4
    want = ((gram - np.eye(2)) ** 2).mean() + ((f.reshape(2, 8).sum(1) - 1) ** 2).mean()
    assert program.evaluate(x, t)[0] == pytest.approx(want, rel=1e-5)
    assert gradcheck(program, x, t, eps=1e-3, rtol=3e-2, atol=1e-3)


@pytest.mark.parametrize("mask", [lambda T: ft.triu(ft.ones(T, T) * float("-inf"), diagonal=1),
                                  lambda T: ft.ones(T, T, dtype=ft.bool).triu(1)], ids=["float", "bool"])
def test_a_causal_mask_tensor_is_is_causal(mask):
    """The mask PyTorch code builds for a causal encoder (nn.Transformer.generate_square_subsequent_mask's, or a
    bool one) is is_causal=True; another mask gives the attention written out (a mask of zeros: no mask)."""
    class Causal(nn.Module):
        def __init__(self, how):
            super().__init__()
            self.how, self.emb = how, nn.Embedding(9, 8)
            self.enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True), 2)
            self.head = nn.Linear(8, CLASSES)

        def forward(self, ids):
            T = ids.shape[1]
            masks = {"flag": None, "mask": mask(T), "none": None, "other": ft.zeros(T, T)}
            return self.head(self.enc(self.emb(ids), masks[self.how], is_causal=self.how == "flag")[:, -1])

    ids, y = np.random.default_rng(22).integers(0, 9, (2, 5)), np.array([1, 3])
    losses = []
    for how in ("flag", "mask", "none"):
        ft.manual_seed(23)
        model = Causal(how)
        program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=2, input_shape=(5,),
                                input_dtype=ft.int64)
        losses.append(program.backward(ids, y))
    assert losses[0] == losses[1] != losses[2]  # unmasked, earlier positions see later ones: the 2nd layer tells
    ft.manual_seed(23)
    model = Causal("other")
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=2, input_shape=(5,),
                            input_dtype=ft.int64)
    assert program.backward(ids, y) == pytest.approx(losses[2], rel=1e-6)


def test_a_forward_returning_logits_and_none_compiles():
    """nanoGPT's forward returns (logits, None) when no targets are given: the first output is the prediction
    and the loss reads it from the tuple; a forward whose first output is not traced is refused, saying what came
    back."""
    class GPTLike(nn.Module):
        def __init__(self):
            super().__init__()
            self.head = nn.Linear(4, CLASSES)

        def forward(self, x, targets=None):
            return self.head(x), None
    ft.manual_seed(38)
    model = GPTLike()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), lambda out, y: F.cross_entropy(out[0], y),
                            batch_size=2, input_shape=(4,))
    x, y = np.random.default_rng(39).standard_normal((2, 4)).astype(np.float32), np.array([0, 2])
    logits = model(ft.tensor(x))[0].numpy().astype(np.float64)
    want = (np.log(np.exp(logits).sum(1)) - logits[np.arange(2), y]).mean()
    assert program.backward(x, y) == pytest.approx(want, rel=1e-6)
    np.testing.assert_allclose(program.predict(x).numpy(), logits, rtol=1e-6)

    class Backwards(GPTLike):
        def forward(self, x, targets=None):
            return None, self.head(x)
    with pytest.raises(ft.nn.TracingError, match=r"returned a tuple whose first item is NoneType: .* whose first is "
                                                 r"what predict returns"):
        Backwards().compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=2, input_shape=(4,))


@pytest.mark.parametrize("use", ["linear", "attention", "layer_norm"])
def test_a_parameter_expanded_over_the_batch_feeds_any_layer(use):
    """Learned queries (DETR, Perceiver): a parameter expanded over the batch, the same for every sample, read by a
    linear layer, as attention's queries (reshaped) or by a layer norm: the compiled step's values are the eager
    model's for every sample, and its gradients central differences'."""
    class Queries(nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.lin, self.norm = nn.Parameter(ft.randn(1, 3, 4)), nn.Linear(4, 4), nn.LayerNorm(4)

        def forward(self, x):
            q = self.q.expand(x.size(0), -1, -1)
            if use == "linear":
                return self.lin(q) + x[:, :3]
            if use == "layer_norm":
                return self.norm(q) * x[:, :3]
            return F.scaled_dot_product_attention(q.unsqueeze(1), x.unsqueeze(1), x.unsqueeze(1)).squeeze(1)
    ft.manual_seed(40)
    model = Queries()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.MSELoss(), batch_size=4, input_shape=(5, 4),
                            target_shape=(3, 4))
    x = np.random.default_rng(41).standard_normal((4, 5, 4)).astype(np.float32)
    y = np.zeros((4, 3, 4), np.float32)
    np.testing.assert_allclose(program.predict(x).numpy(), model(ft.tensor(x)).numpy(), rtol=1e-5, atol=1e-6)
    assert gradcheck(program, x, y, eps=1e-3, rtol=2e-2, atol=1e-4)


def tagger(V, width, log_probs=False):
    """Token ids (N, T) through an embedding and a linear layer: scores (N, T, V), or their log_softmax."""
    class Tagger(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.head = nn.Embedding(V, width), nn.Linear(width, V)

        def forward(self, ids):
            out = self.head(self.emb(ids))
            return F.log_softmax(out, dim=-1) if log_probs else out
    return Tagger()


@pytest.mark.parametrize("reduce", ["mean", "masked_sum", "weighted", "masked_mean"])
def test_per_position_losses_with_reduction_none(reduce):
    """F.cross_entropy(logits.transpose(1, 2), y, reduction='none') of a sequence gives PyTorch's per-position
    losses (N, T) when traced, which reduce as the user writes: .mean() over every position, a sum of the positions
    a mask keeps over N, a weighting per position, a mean over the positions a mask keeps; against NumPy's losses,
    and gradients against central differences."""
    V, T = 6, 4

    def loss(out, y):
        per = F.cross_entropy(out.transpose(1, 2), y, reduction="none", ignore_index=0)
        assert per.shape == (per.shape[0], T)
        if reduce == "mean":
            return per.mean()
        if reduce == "masked_sum":
            return (per * (y > 2)).sum() / y.shape[0]
        if reduce == "masked_mean":
            mask = (y > 2).float()
            return (per * mask).sum() / mask.sum()
        return (per * ft.tensor([1.0, 0.5, 0.25, 2.0])).mean()
    ft.manual_seed(42)
    model = tagger(V, 8)
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), loss, batch_size=3, input_shape=(T,),
                            input_dtype=ft.int64, target_shape=(T,), target_dtype=ft.int64)
    rng = np.random.default_rng(43)
    ids, y = rng.integers(0, V, (3, T)), rng.integers(0, V, (3, T))
    out = model(ft.tensor(ids)).numpy().astype(np.float64)
    per = np.log(np.exp(out).sum(-1)) - np.take_along_axis(out, y[..., None], -1)[..., 0]
    per[y == 0] = 0  # ignored
    want = per.mean() if reduce == "mean" else (per * (y > 2)).sum() / 3 if reduce == "masked_sum" else \
        (per * (y > 2)).sum() / (y > 2).sum() if reduce == "masked_mean" else \
        (per * np.array([1.0, 0.5, 0.25, 2.0])).mean()
    assert program.backward(ids, y) == pytest.approx(want, rel=1e-5)
    assert gradcheck(program, ids, y, eps=1e-3, rtol=2e-2, atol=1e-4)


@pytest.mark.parametrize("form", ["transpose", "view"])
def test_a_sequence_loss_reads_the_scores_in_place(form):
    """Cross-entropy of (N, T, V) scores moved classes first (logits.transpose(1, 2)) or merged into rows
    (logits.view(-1, V)) reads them as they are: the program holds no permuted copy of the scores, and the loss,
    with class weights and label smoothing, is the eager one; gradients against central differences."""
    V, T = 5, 3
    w = ft.tensor([1.0, 0.5, 2.0, 1.5, 0.75])

    def loss(out, y):
        if form == "view":
            return F.cross_entropy(out.view(-1, V), y.view(-1), weight=w, label_smoothing=0.1, ignore_index=4)
        return F.cross_entropy(out.transpose(1, 2), y, weight=w, label_smoothing=0.1, ignore_index=4)
    ft.manual_seed(44)
    model = tagger(V, 6)
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), loss, batch_size=4, input_shape=(T,),
                            input_dtype=ft.int64, target_shape=(T,), target_dtype=ft.int64)
    assert "Permute" not in program.summary()
    rng = np.random.default_rng(45)
    ids, y = rng.integers(0, V, (4, T)), rng.integers(0, V, (4, T))
    want = loss(model(ft.tensor(ids)), ft.tensor(y)).item()
    assert program.backward(ids, y) == pytest.approx(want, rel=1e-5)
    assert gradcheck(program, ids, y, eps=1e-3, rtol=2e-2, atol=1e-4)


@pytest.mark.parametrize("form", ["one_position_rows", "flattened_losses", "nll_of_rows"])
def test_more_ways_of_writing_a_sequence_loss(form):
    """Sequence losses as PyTorch code also writes them: logits.view(-1, V) and y.view(-1) with one position per
    sample, per-position losses flattened before their mean (losses.view(-1).mean()), and F.nll_loss of the rows
    of log-probabilities a forward returned; each the eager loss, gradients against central differences."""
    V, T = 5, 1 if form == "one_position_rows" else 3

    def loss(out, y):
        if form == "flattened_losses":
            return F.cross_entropy(out.transpose(1, 2), y, reduction="none").view(-1).mean()
        if form == "nll_of_rows":
            return F.nll_loss(out.view(-1, V), y.view(-1))
        return F.cross_entropy(out.view(-1, V), y.view(-1))
    ft.manual_seed(46)
    model = tagger(V, 6, log_probs=form == "nll_of_rows")
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), loss, batch_size=4, input_shape=(T,),
                            input_dtype=ft.int64, target_shape=(T,), target_dtype=ft.int64)
    rng = np.random.default_rng(47)
    ids, y = rng.integers(0, V, (4, T)), rng.integers(0, V, (4, T))
    out = model(ft.tensor(ids)).numpy().astype(np.float64)
    logp = out if form == "nll_of_rows" else out - np.log(np.exp(out).sum(-1, keepdims=True))
    want = -np.take_along_axis(logp, y[..., None], -1).mean()
    assert program.backward(ids, y) == pytest.approx(want, rel=1e-5)
    assert gradcheck(program, ids, y, eps=1e-3, rtol=2e-2, atol=1e-4)


def test_token_ids_and_masks_sliced_in_forward():
    """The input's token ids sliced before an embedding (ids[:, :-1], as next-token models feed themselves) and a
    padding mask sliced alike stay ids and a mask: the loss is the eager model's and the gradients central
    differences'."""
    class Shifted(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.attn = nn.Embedding(20, 8), nn.MultiheadAttention(8, 2, batch_first=True)
            self.head = nn.Linear(8, 20)

        def forward(self, ids):
            x, pad = self.emb(ids[:, :-1]), (ids == 0)[:, :-1]
            return self.head(self.attn(x, x, x, key_padding_mask=pad)[0])
    ft.manual_seed(44)
    model = Shifted()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1),
                            lambda out, y: F.cross_entropy(out.transpose(1, 2), y), batch_size=2, input_shape=(6,),
                            input_dtype=ft.int64, target_shape=(5,))
    ids = np.array([[5, 1, 2, 3, 0, 0], [7, 4, 9, 0, 0, 0]])
    y = ids[:, 1:]
    out = model(ft.tensor(ids)).numpy().astype(np.float64)
    want = (np.log(np.exp(out).sum(-1)) - np.take_along_axis(out, y[..., None], -1)[..., 0]).mean()
    assert program.backward(ids, y) == pytest.approx(want, rel=1e-5)
    assert gradcheck(program, ids, y, eps=1e-3, rtol=3e-2, atol=1e-3)  # the keys' bias: 0 up to rounding


def test_a_model_graph_whose_first_operand_is_a_constant():
    """nn.Model of `tensor + x`: the constant is reached before the input, which still comes first."""
    x = nn.Input((4,))
    model = nn.Model(x, nn.Linear(4, 2)(ft.ones(4) + x))
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=2)
    out = program.predict(np.zeros((2, 4), np.float32)).numpy()
    np.testing.assert_allclose(out, np.ones((2, 4)) @ model.linear.weight.numpy().T + model.linear.bias.numpy(),
                               rtol=1e-6)


@pytest.mark.parametrize("weight", [lambda m: m.V.t(), lambda m: m.W.view(4, 16)[:2], lambda m: m.W.reshape(16, 4).t()])
def test_a_view_of_a_parameter_as_a_layers_weight_trains(weight):
    """F.linear(h, self.V.t()) (a tied decoder's F.linear(h, enc.weight.t())), a part or a transposed reshape of a
    parameter as the weight: a computed weight, through which the parameter trains (it was refused, as the layer
    would have read a constant copy)."""
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 16)
            self.V = nn.Parameter(ft.linspace(-1, 1, 64).reshape(16, 4))
            self.W = nn.Parameter(ft.linspace(1, -0.5, 64).reshape(4, 16))

        def forward(self, x):
            return ft.nn.functional.linear(self.fc(x), weight(self))
    ft.manual_seed(9)
    m = Net()
    program = m.compile(ft.optim.SGD(m.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=4, input_shape=(8,))
    x = np.random.default_rng(54).standard_normal((4, 8)).astype(np.float32)
    np.testing.assert_allclose(program.predict(x).numpy(), m(ft.tensor(x)).numpy(), rtol=1e-5, atol=1e-5)
    assert gradcheck(program, x, np.array([0, 1, 0, 1]), rtol=3e-2, atol=1e-3)


@pytest.mark.parametrize("read", [lambda w: w.numpy(), lambda w: w.tolist()])
def test_a_parameters_values_read_in_forward_are_refused_not_frozen(read):
    """A spectral-norm-like scale from the weight's values: computed once at compile it would be a constant."""
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(6, 3)

        def forward(self, x):
            return self.fc(x) / float(np.linalg.norm(np.array(read(self.fc.weight)), 2))
    m = Scaled()
    with pytest.raises(nn.TracingError, match="of a trainable parameter outside the traced graph"):
        m.compile(ft.optim.SGD(m.parameters(), lr=0.1), nn.MSELoss(), batch_size=4, input_shape=(6,),
                  target_shape=(3,))


def test_a_forward_changing_a_trainable_parameter_in_place_is_refused_and_undone():
    """Swin V2's qkv_bias = self.qkv.bias.clone(); qkv_bias[k:2 * k].zero_(): the clone of a parameter reads as
    the parameter, so the zeroing would have written the weights once, at compile, and every step would train
    the entries PyTorch zeroes. Refused naming the parameter and the way out; the weights are as before."""
    class Zeroed(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(4, 6)

        def forward(self, x):
            qkv_bias = self.qkv.bias.clone()
            qkv_bias[2:4].zero_()
            return F.linear(x, self.qkv.weight, qkv_bias)

    m = Zeroed()
    with ft.no_grad():
        m.qkv.bias.copy_(ft.arange(1.0, 7.0))
    with pytest.raises(nn.TracingError, match=r"zero_ on a trainable parameter \(or a view or \.clone\(\) of it\) "
                                              r".*ft\.cat"):
        m.compile(ft.optim.SGD(m.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=2, input_shape=(4,))
    assert m.qkv.bias.tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]

    class Drawn(nn.Module):  # a write no op refuses as it runs (a draw into the weight) is found after the trace
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def forward(self, x):
            self.fc.weight.uniform_()
            return self.fc(x)

    m = Drawn()
    before = m.fc.weight.numpy().copy()
    with pytest.raises(nn.TracingError, match=r"changed trainable parameter fc\.weight in place"):
        m.compile(ft.optim.SGD(m.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=2, input_shape=(4,))
    np.testing.assert_array_equal(m.fc.weight.numpy(), before)

    class Scaled(nn.Module):  # a buffer written in forward and read as a value: the write would run once
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 2)
            self.register_buffer("scale", ft.tensor([1.0, 2.0]))

        def forward(self, x):
            self.scale.fill_(1.0)
            return self.fc(x) * self.scale

    m = Scaled()
    with pytest.raises(nn.TracingError, match="writes buffer scale in place and reads it as a value"):
        m.compile(ft.optim.SGD(m.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=2, input_shape=(4,))
    assert m.scale.tolist() == [1.0, 2.0]


def test_torchvisions_spellings_of_containers_axes_and_draws():
    """maxvit's nn.parameter.Parameter, self.layers += [...] (and insert) on a ModuleList and torch.swapaxes (and
    movedim) of traced values compile as in PyTorch; stochastic_depth's mode="batch" draw (one for the whole
    batch) is refused as a draw made once at compile, and bernoulli_ draws eagerly."""
    class Block(nn.Module):
        def __init__(self, mode):
            super().__init__()
            self.mode, self.layers = mode, nn.ModuleList([nn.Linear(3, 3)])
            self.layers += [nn.Linear(3, 3)]
            self.layers.insert(1, nn.Tanh())
            self.scale = nn.parameter.Parameter(ft.ones(3))

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            x = ft.movedim(ft.swapaxes(x, 1, 2).swapdims(1, 2), 1, 2).moveaxis(2, 1).transpose(1, 2)  # 5 swaps
            x = x.mean(2) * self.scale * ft.bernoulli(ft.ones_like(x[:, :, 0]))  # (a draw of 1 at p = 1)
            if self.mode == "batch":
                x = x * ft.empty([1] * x.ndim).bernoulli_(0.5)
            return x

    m = Block("row")
    assert [k for k, _ in m.named_parameters()] == ["scale", "layers.0.weight", "layers.0.bias", "layers.2.weight",
                                                    "layers.2.bias"]
    x = np.random.default_rng(30).standard_normal((2, 3, 3)).astype(np.float32)
    program = m.compile(ft.optim.SGD(m.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=2, input_shape=(3, 3))
    np.testing.assert_allclose(program.predict(x).numpy(), m(ft.tensor(x)).numpy(), rtol=1e-6, atol=1e-6)
    h = x
    for layer in m.layers:
        h = layer(ft.tensor(h)).numpy()
    np.testing.assert_allclose(program.predict(x).numpy(), h.mean(1), rtol=1e-5, atol=1e-6)  # the swaps' transpose
    with pytest.raises(nn.TracingError, match="ft.bernoulli_ in a traced forward .* drawn once, at compile"):
        Block("batch").compile(ft.optim.SGD(m.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=2,
                               input_shape=(3, 3))
    ft.manual_seed(31)
    drawn = ft.empty(20000).bernoulli_(0.25)
    assert set(np.unique(drawn.numpy())) == {0.0, 1.0} and abs(float(drawn.mean()) - 0.25) < 0.01
    with pytest.raises(ValueError, match=r"p must be in \[0, 1\]"):
        ft.empty(2).bernoulli_(1.5)


class Shifted(nn.Module):
    """A forward that branches on self.training: +shift in training mode only."""

    def __init__(self, shift=1.0):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.shift = shift

    def forward(self, x):
        h = self.fc(x)
        if self.training:
            h = h + self.shift
        return h


def _affine(m, x):
    return x @ m.fc.weight.numpy().T + m.fc.bias.numpy()


class AuxHead(nn.Module):
    """PSPNet's auxiliary head: (main, aux) in training, main alone in eval mode."""

    def __init__(self):
        super().__init__()
        self.body, self.cls, self.aux = nn.Linear(4, 6), nn.Linear(6, 3), nn.Linear(6, 3)

    def forward(self, x):
        f = F.relu(self.body(x))
        return (self.cls(f), self.aux(f)) if self.training else self.cls(f)


def test_a_loss_written_for_the_training_outputs_only_leaves_predict_and_refuses_evaluate():
    """A loss taking main, aux = out apart cannot read the eval-mode output (it failed compile): training and
    predict run, evaluate (and fit with a validation split, before any step) says why and what to write; a loss
    that takes both forms evaluates."""
    def loss(out, y):
        main, aux = out
        return F.cross_entropy(main, y) + 0.4 * F.cross_entropy(aux, y)

    def guarded(out, y):
        return F.cross_entropy(out, y) if not isinstance(out, tuple) else loss(out, y)

    rng = np.random.default_rng(50)
    x, y = rng.standard_normal((4, 4)).astype(np.float32), np.array([0, 1, 2, 0])
    ft.manual_seed(51)
    model = AuxHead()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), loss, batch_size=4, input_shape=(4,))
    assert np.isfinite(program.train_step(x, y))
    model.eval()
    np.testing.assert_allclose(program.predict(x).numpy(), model(ft.tensor(x)).numpy(), rtol=1e-6, atol=1e-6)
    for call in (lambda: program.evaluate(x, y), lambda: ft.evaluate(program, (x, y)),
                 lambda: ft.fit(program, (x, y), val_loader=(x, y), progress=False)):
        with pytest.raises(nn.TracingError, match=r"the loss cannot read the model's eval-mode output .*main, aux"):
            call()
    model.train()
    both = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), guarded, batch_size=4, input_shape=(4,))
    logits = both.predict(x).numpy().astype(np.float64)
    want = np.mean(np.log(np.exp(logits).sum(1)) - logits[np.arange(4), y])
    np.testing.assert_allclose(both.evaluate(x, y)[0], want, rtol=1e-5)


def test_a_branch_on_training_runs_in_the_training_step_and_not_in_predict_or_evaluate():
    ft.manual_seed(0)
    rng = np.random.default_rng(0)
    x, y = rng.random((8, 4), dtype=np.float32), rng.random((8, 3), dtype=np.float32)
    m = Shifted()
    program = m.compile(ft.optim.SGD(m.parameters(), lr=0.1), nn.MSELoss(), batch_size=8, input_shape=(4,))
    W, b = m.fc.weight.numpy().copy(), m.fc.bias.numpy().copy()
    np.testing.assert_allclose(program.predict(x).numpy(), _affine(m, x), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(program.predict(x[0]).numpy(), _affine(m, x[:1])[0], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(program.evaluate(x, y)[0], ((_affine(m, x) - y) ** 2).mean(), rtol=1e-5)
    out = _affine(m, x) + 1.0
    np.testing.assert_allclose(program.train_step(x, y), ((out - y) ** 2).mean(), rtol=1e-5)
    g = 2 * (out - y) / out.size  # the step's gradient follows the training branch too
    np.testing.assert_allclose(m.fc.weight.numpy(), W - 0.1 * g.T @ x, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(m.fc.bias.numpy(), b - 0.1 * g.sum(0), rtol=1e-5, atol=1e-6)
    # predict reads the weights the step wrote
    np.testing.assert_allclose(program.predict(x).numpy(), _affine(m, x), rtol=1e-5, atol=1e-6)
    assert "eval mode: the forward reads self.training" in str(program.summary())
    loss, _ = ft.evaluate(program, ft.data.Loader(ft.data.from_arrays(x, y), 8, num_workers=1))
    np.testing.assert_allclose(loss, ((_affine(m, x) - y) ** 2).mean(), rtol=1e-5)
    history = ft.fit(program, (x, y), epochs=1, val_loader=[(x, y)], progress=False)
    np.testing.assert_allclose(history["val_loss"][-1], ((_affine(m, x) - y) ** 2).mean(), rtol=1e-5)


class DropPath(nn.Module):
    """timm's drop path: each sample's residual branch dropped with probability p while training."""

    def __init__(self, p):
        super().__init__()
        self.p = p

    def forward(self, x):
        if not self.training or self.p == 0.0:
            return x
        keep = (ft.rand_like(x[:, :1]) >= self.p).float()
        return x * keep / (1 - self.p)


class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.head = nn.Linear(6, 2)
        self.drop = DropPath(0.5)

    def forward(self, x):
        return self.head(x + self.drop(self.fc(x).relu()))


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_drop_path_is_random_in_training_and_the_identity_in_predict(precision):
    ft.manual_seed(1)
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((16, 6), dtype=np.float32), rng.integers(0, 2, 16)
    m = Residual()
    program = m.compile(ft.optim.AdamW(m.parameters(), lr=1e-2), nn.CrossEntropyLoss(), batch_size=16,
                        input_shape=(6,), precision=precision)
    for _ in range(3):
        program.train_step(x, y)

    def reference(x):
        h = np.maximum(x @ m.fc.weight.numpy().T + m.fc.bias.numpy(), 0)
        return (x + h) @ m.head.weight.numpy().T + m.head.bias.numpy()

    tol = 1e-5 if precision == "32-true" else 3e-2
    first = program.predict(x).numpy().astype(np.float32)
    np.testing.assert_array_equal(program.predict(x).numpy(), program.predict(x).numpy())
    np.testing.assert_allclose(first, reference(x), rtol=tol, atol=tol)
    # the training step's forward drops paths: its loss differs from the eval-mode loss of the same weights
    eval_loss = program.evaluate(x, y)[0]
    assert program.backward(x, y) != pytest.approx(eval_loss, rel=1e-3)


def test_dropout_given_self_training_needs_no_graph_of_its_own():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 3)

        def forward(self, x):
            return F.dropout(self.fc(x), 0.5, self.training)

    m = Net()
    program = m.compile(ft.optim.SGD(m.parameters(), lr=0.1), nn.MSELoss(), batch_size=8, input_shape=(4,))
    assert "eval mode" not in str(program.summary())
    x = np.random.default_rng(2).random((8, 4), dtype=np.float32)
    np.testing.assert_allclose(program.predict(x).numpy(), _affine(m, x), rtol=1e-6, atol=1e-6)


def test_a_branch_on_training_between_a_convolution_and_its_batch_norm_is_refused():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(1, 2, 3)
            self.bn = nn.BatchNorm2d(2)

        def forward(self, x):
            h = self.conv(x)
            return (self.bn(h) if self.training else h).flatten(1)

    m = Net()
    with pytest.raises(NotImplementedError, match="bias=False"):
        m.compile(ft.optim.SGD(m.parameters(), lr=0.1), nn.MSELoss(), batch_size=2, input_shape=(1, 5, 5))
    bias = m.conv.bias.numpy().copy()

    class Unbiased(Net):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(1, 2, 3, bias=False)

    m = Unbiased()
    program = m.compile(ft.optim.SGD(m.parameters(), lr=0.1), nn.MSELoss(), batch_size=2, input_shape=(1, 5, 5))
    x = np.random.default_rng(3).random((2, 1, 5, 5), dtype=np.float32)
    assert np.any(bias != 0)
    assert program.predict(x).shape == (2, 18)


def test_rows_of_a_table_indexed_by_traced_ids_are_an_embedding():
    """self.table[ids] of a 2-d parameter is F.embedding(ids, self.table): it trains as nn.Embedding does."""
    class Indexed(nn.Module):
        def __init__(self):
            super().__init__()
            self.table = nn.Parameter(ft.randn(10, 4))

        def forward(self, ids):
            return self.table[ids].sum(1)

    class Embedded(nn.Module):
        def __init__(self):
            super().__init__()
            self.table = nn.Embedding(10, 4)

        def forward(self, ids):
            return self.table(ids).sum(1)

    ft.manual_seed(4)
    a, b = Indexed(), Embedded()
    b.table.weight.copy_(a.table)
    ids = np.random.default_rng(4).integers(0, 10, (8, 3))
    y = np.random.default_rng(5).standard_normal((8, 4)).astype(np.float32)
    losses = []
    for m in (a, b):
        program = m.compile(ft.optim.SGD(m.parameters(), lr=0.1), nn.MSELoss(), batch_size=8, input_shape=(3,),
                            input_dtype=ft.int64, target_shape=(4,))
        losses.append([program.train_step(ids, y) for _ in range(3)])
    assert losses[0] == losses[1]
    assert a.table.numpy().tobytes() == b.table.weight.numpy().tobytes()

    class Cube(Indexed):
        def __init__(self):
            super().__init__()
            self.table = nn.Parameter(ft.randn(10, 4, 2))

    m = Cube()
    with pytest.raises(ft.nn.TracingError, match="indexing a 3-d tensor with traced values"):
        m.compile(ft.optim.SGD(m.parameters(), lr=0.1), nn.MSELoss(), batch_size=8, input_shape=(3,),
                  input_dtype=ft.int64)


def test_new_tensors_sized_by_the_batch_are_constants_for_every_sample():
    """ft.ones(x.size(0), 1) and ft.full((x.size(0), 1), v) in a forward: the same constant for every sample; the
    batch size as a number is refused with what to write."""
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def forward(self, x):
            return self.fc(x) + ft.ones(x.size(0), 1) * 3 + ft.full((x.size(0), 2), 0.5)

    m = Net()
    program = m.compile(ft.optim.SGD(m.parameters(), lr=0.1), nn.MSELoss(), batch_size=4, input_shape=(4,))
    x = np.random.default_rng(6).random((4, 4), dtype=np.float32)
    np.testing.assert_allclose(program.predict(x).numpy(), _affine(m, x) + 3.5, rtol=1e-6, atol=1e-6)

    class Counted(Net):
        def forward(self, x):
            return self.fc(x) * float(len(range(x.size(0))))

    m = Counted()
    with pytest.raises(ft.nn.TracingError, match=r"the batch size as a number .* ft.ones\(x.size\(0\), k\)"):
        m.compile(ft.optim.SGD(m.parameters(), lr=0.1), nn.MSELoss(), batch_size=4, input_shape=(4,))

    class Joined(Net):
        def forward(self, x):
            return ft.cat([self.fc(x), self.fc(x)], dim=0)

    m = Joined()
    with pytest.raises(ft.nn.TracingError, match=r"along the batch dimension \(dim=0\) cannot be compiled \(at .*"
                       r"test_trace.py"):
        m.compile(ft.optim.SGD(m.parameters(), lr=0.1), nn.MSELoss(), batch_size=4, input_shape=(4,))


def timm_drop_path(x, drop_prob=0.0, training=False, scale_by_keep=True):
    """timm's drop_path, verbatim."""
    if drop_prob == 0.0 or not training:
        return x
    keep_prob = 1 - drop_prob
    shape = (x.shape[0],) + (1,) * (x.ndim - 1)
    random_tensor = x.new_empty(shape).bernoulli_(keep_prob)
    if keep_prob > 0.0 and scale_by_keep:
        random_tensor.div_(keep_prob)
    return x * random_tensor


def torchvision_stochastic_depth(input, p, mode, training=True):
    """torchvision.ops.stochastic_depth, verbatim but for the checks of p and mode."""
    if not training or p == 0.0:
        return input
    survival_rate = 1.0 - p
    if mode == "row":
        size = [input.shape[0]] + [1] * (input.ndim - 1)
    else:
        size = [1] * input.ndim
    noise = ft.empty(size, dtype=input.dtype, device=input.device)
    noise = noise.bernoulli_(survival_rate)
    if survival_rate > 0.0:
        noise.div_(survival_rate)
    return input * noise


@pytest.mark.parametrize("drop", [lambda x, training: timm_drop_path(x, 0.25, training),
                                  lambda x, training: torchvision_stochastic_depth(x, 0.25, "row", training)],
                         ids=["timm", "torchvision"])
def test_drop_path_draws_one_keep_per_sample_in_training_only(drop):
    """x.new_empty((N, 1, ...)).bernoulli_(keep), or ft.empty of that size, is a draw per sample in every step:
    the gradient of a weight through it counts the kept samples exactly (each 1 / keep or 0), near keep * N, and
    differs between steps; eval mode passes x through."""
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(ft.ones(1))

        def forward(self, x):
            return drop(x * self.w, self.training).sum((1, 2))

    ft.manual_seed(12)
    model = Net()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.0), lambda out: out.mean(), batch_size=512,
                            input_shape=(2, 3))
    x = np.ones((512, 2, 3), np.float32)
    kept = []
    for _ in range(2):
        program.backward(x, None)
        kept.append(float(model.w.grad.numpy()[0]) / 6 * 0.75 * 512)  # d mean / dw = 6 * kept / (0.75 N)
        model.w.grad = None
    assert all(abs(k - round(k)) < 1e-3 and abs(k / 512 - 0.75) < 0.06 for k in kept) and kept[0] != kept[1]
    np.testing.assert_allclose(program.predict(x).numpy(), np.full(512, 6.0))
    assert program.evaluate(x, None)[0] == pytest.approx(6.0)


def test_stochastic_depth_of_token_features_draws_from_the_first_input():
    """ft.empty((N, 1)).bernoulli_(keep) in a forward of token ids: the draw's batch is the first input's, viewed
    to the size asked; other uses of memory sized by the batch are refused, not drawn once at compile."""
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.table = nn.Embedding(10, 4)
            self.w = nn.Parameter(ft.ones(1))

        def forward(self, ids):
            return torchvision_stochastic_depth(self.table(ids).sum(1) * self.w, 0.25, "row", self.training).sum(1)

    ft.manual_seed(13)
    model = Net()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.0), lambda out: out.mean(), batch_size=512,
                            input_shape=(5,), input_dtype=ft.int64)
    ids = np.zeros((512, 5), np.int64)
    program.backward(ids, None)
    kept = float(model.w.grad.numpy()[0]) / (5 * model.table.weight.numpy()[0].sum()) * 0.75 * 512
    assert abs(kept - round(kept)) < 1e-2 and abs(kept / 512 - 0.75) < 0.06

    for fill in ("normal_()", "bernoulli_(0.5)", "uniform_()"):
        class Drawn(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 3)

            def forward(self, x):
                return self.fc(x) * eval(f"ft.empty(x.size(0), 3).{fill}")

        m = Drawn()
        with pytest.raises(ft.nn.TracingError, match=r"new memory of size \(N, 3\) .* ft.rand_like\(x\)"):
            m.compile(ft.optim.SGD(m.parameters(), lr=0.1), nn.MSELoss(), batch_size=4, input_shape=(4,))


@pytest.mark.parametrize("option", [dict(max_norm=1.0), dict(scale_grad_by_freq=True), dict(sparse=True)])
def test_functional_embedding_options_it_cannot_compute_are_refused_when_traced(option):
    """F.embedding's max_norm (which renormalizes rows) and scale_grad_by_freq (which scales the gradient) are refused
    in a traced forward as eagerly, not recorded as a plain lookup."""
    class Looked(nn.Module):
        def __init__(self):
            super().__init__()
            self.table = nn.Parameter(ft.randn(10, 4))

        def forward(self, ids):
            return F.embedding(ids, self.table, **option).sum(1)

    m = Looked()
    name = next(iter(option))
    with pytest.raises(NotImplementedError, match=f"embedding: {name} is not supported"):
        F.embedding(ft.tensor([[1, 2]]), m.table, **option)
    with pytest.raises(NotImplementedError, match=f"embedding: {name} is not supported"):
        m.compile(ft.optim.SGD(m.parameters(), lr=0.1), nn.MSELoss(), batch_size=2, input_shape=(3,),
                  input_dtype=ft.int64)


class Gate(nn.Module):
    """Features scaled by g of a parameter of theirs."""

    def __init__(self, g):
        super().__init__()
        self.g, self.fc, self.w = g, nn.Linear(4, 3), nn.Parameter(ft.tensor([0.3, -0.2, 0.5, 0.1]))

    def forward(self, x):
        return self.fc(x * self.g(self.w))


@pytest.mark.parametrize("g", [F.sigmoid, F.silu, F.gelu, lambda w: F.leaky_relu(w, 0.1), F.softplus, F.tanh,
                               lambda w: w.softmax(0), lambda w: F.softmax(w, 0)],
                         ids=["sigmoid", "silu", "gelu", "leaky_relu", "softplus", "tanh", "softmax", "F.softmax"])
def test_a_functional_activation_of_a_parameter_trains_it(g):
    """F.sigmoid(self.w) and the other F functions of a parameter (a softmax over its own dimension 0) are traced:
    its gradient by central differences, not a constant's zero."""
    ft.manual_seed(2)
    model = Gate(g)
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=4, input_shape=(4,))
    x, y = np.random.default_rng(3).standard_normal((4, 4)).astype(np.float32), np.arange(4) % 3
    assert gradcheck(program, x, y, rtol=3e-2, atol=1e-4)
    program.backward(x, y)
    assert np.abs(model.w.grad.numpy()).min() > 1e-4


@pytest.mark.parametrize("g, name", [(F.relu_, "relu_"), (lambda w: F.relu(w, inplace=True), "relu")])
def test_a_parameter_through_an_op_in_place_is_refused(g, name):
    model = Gate(g)
    with pytest.raises(ft.nn.TracingError, match=f"{name} of a trainable parameter"):
        model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=4, input_shape=(4,))


@pytest.mark.parametrize("layer", [lambda: nn.MultiheadAttention(8, 2), lambda: nn.TransformerEncoderLayer(8, 2),
                                   lambda: nn.TransformerDecoderLayer(8, 2), lambda: nn.Transformer(8, 2)])
def test_attention_layers_without_batch_first_say_which_layer(layer):
    """PyTorch's default is sequence first; fasttrain's values are batch first: each layer says so by its own
    name (the encoder layer's said MultiheadAttention)."""
    name = layer.__code__.co_names[-1]
    with pytest.raises(ValueError, match=rf"^{name}: pass batch_first=True"):
        layer()


class BatchNormAct(nn.BatchNorm2d):
    """timm's BatchNormAct2d: F.batch_norm of the module's own buffers in its forward, num_batches_tracked counted
    eagerly and momentum=None a cumulative average, then the activation."""

    def forward(self, x):
        factor = self.momentum
        if self.training:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:
                factor = 1.0 / float(self.num_batches_tracked)
        x = F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, self.training, factor,
                         self.eps)
        return F.relu(x)


@pytest.mark.parametrize("momentum", [0.1, None])
def test_f_batch_norm_in_a_forward_trains_as_the_layer(momentum):
    """F.batch_norm of traced values (timm's BatchNormAct2d) was refused with "input must be a fasttrain Tensor, got
    Symbolic": it is the batch norm layer's node now, the same losses, weights, running statistics and count, bit
    for bit (momentum=None too, whose 1 / count the forward computes once while traced), predict runs on the
    running statistics, and the trace's own count (add_(1)) is undone."""
    x = np.random.default_rng(70).standard_normal((4, 3, 6, 6)).astype(np.float32)
    y = np.arange(4) % CLASSES
    results = []
    for norm in (BatchNormAct, lambda c: nn.Sequential(nn.BatchNorm2d(c), nn.ReLU())):
        ft.manual_seed(71)
        model = nn.Sequential(nn.Conv2d(3, 4, 3, bias=False), norm(4), nn.Flatten(), nn.Linear(64, CLASSES))
        model[1].momentum = momentum
        if isinstance(model[1], nn.Sequential):
            model[1][0].momentum = momentum
        program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=4,
                                input_shape=(3, 6, 6))
        losses = [program.train_step(x, y) for _ in range(3)]
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # num_batches_tracked counted eagerly is no buffer read into a constant
            results.append((losses, program.predict(x).numpy().tobytes(),
                            [b.numpy().tobytes() for _, b in model.named_buffers()]))
    assert results[0] == results[1]
    assert [b for name, b in model.named_buffers() if "num_batches" in name][0].item() == 3


class PortedPieces(nn.Module):
    """Pieces of Hugging Face and timm models: BEiT's q/v bias joined by ft.cat (as F.linear's bias, added, or
    added in place), GPT-2's Conv1D (addmm of the rows merged from the batch), a submodule called with keyword
    arguments, and an int64 attention mask turned into an additive mask with finfo.min and pooled by its count."""

    def __init__(self, how):
        super().__init__()
        self.how = how
        self.emb = nn.Embedding(20, 8)
        self.qkv = nn.Linear(8, 24, bias=False)
        self.q_bias, self.v_bias = nn.Parameter(ft.zeros(8) + 0.1), nn.Parameter(ft.zeros(8) - 0.2)
        self.register_buffer("k_bias", ft.zeros(8), persistent=False)
        self.conv_w, self.conv_b = nn.Parameter(ft.randn(8, 6) * 0.3), nn.Parameter(ft.randn(6) * 0.1)
        self.head = nn.Linear(6, 3)

    def embed(self, input_ids=None):
        return self.emb(input_ids)

    def forward(self, ids, mask):
        x = self.embed(input_ids=ids)
        bias = ft.cat((self.q_bias, self.k_bias, self.v_bias))
        if self.how == "linear":
            qkv = F.linear(x, self.qkv.weight, bias)
        elif self.how == "add":
            qkv = self.qkv(x) + bias
        else:
            qkv = self.qkv(x)
            qkv += bias
        B, T = ids.shape
        q, k, v = qkv.view(B, T, 3, 2, 4).permute(2, 0, 3, 1, 4)
        additive = (1.0 - mask[:, None, None, :].to(dtype=ft.float32)) * ft.finfo(ft.float32).min
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=additive).transpose(1, 2).reshape(B, T, 8)
        rows = ft.addmm(self.conv_b, o.reshape(-1, 8), self.conv_w)  # GPT-2's Conv1D
        h = rows.view(B, T, 6) * mask[:, :, None].float()
        return self.head(h.sum(1) / mask.sum(1, keepdim=True).float())

    def reference(self, ids, mask):
        """The forward in NumPy, float64."""
        w = {k: np.asarray(v, np.float64) for k, v in self.state_dict().items()}
        x = w["emb.weight"][ids]
        qkv = x @ w["qkv.weight"].T + np.concatenate([w["q_bias"], np.zeros(8), w["v_bias"]])
        B, T = ids.shape
        q, k, v = qkv.reshape(B, T, 3, 2, 4).transpose(2, 0, 3, 1, 4)
        s = q @ k.transpose(0, 1, 3, 2) / 2 + (1.0 - mask[:, None, None, :]) * np.finfo(np.float32).min
        p = np.exp(s - s.max(-1, keepdims=True))
        o = ((p / p.sum(-1, keepdims=True)) @ v).transpose(0, 2, 1, 3).reshape(B, T, 8)
        h = (o @ w["conv_w"] + w["conv_b"]) * mask[:, :, None]
        return h.sum(1) / mask.sum(1, keepdims=True) @ w["head.weight"].T + w["head.bias"]


@pytest.mark.parametrize("how", ["linear", "add", "iadd"])
def test_pieces_of_ported_models_compile_and_train(how):
    """Each was silently frozen (ft.cat of parameters compiled to a constant: BEiT's q_bias and v_bias never
    trained) or refused (Conv1D's addmm of merged rows, a keyword-only submodule call, mask.to(float32), a sum of
    an int64 mask, ft.finfo): now against NumPy float64 and finite differences, through q_bias and v_bias too."""
    ft.manual_seed(72)
    model = PortedPieces(how)
    rng = np.random.default_rng(73)
    ids, mask = rng.integers(0, 20, (3, 5)), np.ones((3, 5), np.int64)
    mask[0, 3:] = mask[2, 1:] = 0
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=3,
                            input_shape=((5,), (5,)), input_dtype=(ft.int64, ft.int64))
    np.testing.assert_allclose(program.predict((ids, mask)).numpy(), model.reference(ids, mask), rtol=1e-4,
                               atol=1e-5)
    assert gradcheck(program, (ids, mask), np.array([0, 2, 1]), rtol=3e-2, atol=1e-4)
    before = model.q_bias.numpy().copy(), model.v_bias.numpy().copy()
    program.train_step((ids, mask), np.array([0, 2, 1]))
    assert not np.array_equal(model.q_bias.numpy(), before[0]) and not np.array_equal(model.v_bias.numpy(), before[1])


def test_bert_relative_key_positions_in_einsum_train():
    """Hugging Face BERT's relative_key_query scores: an Embedding of the fixed distances l - r read through
    ft.einsum with the queries and the keys (it failed with "einsum: expected tensors, got Gathered")."""
    T, D = 5, 4

    class RelativeKey(nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.distance = nn.Linear(D, D), nn.Linear(D, D), nn.Embedding(2 * T - 1, D)

        def forward(self, x):
            q, k = self.q(x), self.k(x)
            distance = ft.arange(T).view(-1, 1) - ft.arange(T).view(1, -1)
            positions = self.distance(distance + T - 1)
            s = q @ k.transpose(-1, -2) + ft.einsum("bld,lrd->blr", q, positions) + \
                ft.einsum("brd,lrd->blr", k, positions)
            return s.softmax(-1) @ x

    ft.manual_seed(75)
    model = RelativeKey()
    x = np.random.default_rng(76).standard_normal((2, T, D)).astype(np.float32)
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.MSELoss(), batch_size=2, input_shape=(T, D))
    q, k = (x.astype(np.float64) @ m.weight.numpy().T + m.bias.numpy() for m in (model.q, model.k))
    pe = model.distance.weight.numpy()[np.arange(T)[:, None] - np.arange(T)[None] + T - 1]
    s = q @ k.transpose(0, 2, 1) + np.einsum("bld,lrd->blr", q, pe) + np.einsum("brd,lrd->blr", k, pe)
    p = np.exp(s - s.max(-1, keepdims=True))
    np.testing.assert_allclose(program.predict(x).numpy(), p / p.sum(-1, keepdims=True) @ x, rtol=1e-5, atol=1e-6)
    assert gradcheck(program, x, np.zeros((2, T, D), np.float32), rtol=3e-2, atol=1e-4)


class Copies(nn.Module):
    """Eager copies and detaches of a trainable parameter's parts in a forward."""

    def __init__(self, how):
        super().__init__()
        self.how, self.fc = how, nn.Linear(6, 6)
        self.w, self.v = nn.Parameter(ft.randn(6, 6)), nn.Parameter(ft.randn(4, 6))

    def forward(self, x):
        h = self.fc(x)
        if self.how == "clone":
            return h + self.w[1:5].clone() + self.v.clone()
        if self.how == "contiguous":
            return h + self.w.T[:, 1:5].contiguous().T
        return h + self.w[1:5].detach() * self.v


@pytest.mark.parametrize("how", ["clone", "contiguous", "detach"])
def test_copies_of_a_parameter_train_and_its_detach_does_not(how):
    """self.w[1:5].clone() (and .contiguous() of a strided part) compiled to a constant: w never trained, where
    PyTorch's copy passes the gradient; self.w[1:5].detach() trained w, where PyTorch's stops it. Against NumPy
    and finite differences, and w's gradient 0 through the detach."""
    ft.manual_seed(77)
    model = Copies(how)
    x = np.random.default_rng(78).standard_normal((3, 4, 6)).astype(np.float32)
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.MSELoss(), batch_size=3, input_shape=(4, 6))
    w, v = model.w.numpy().astype(np.float64), model.v.numpy().astype(np.float64)
    h = x @ model.fc.weight.numpy().T + model.fc.bias.numpy()
    want = h + (w[1:5] + v if how == "clone" else w.T[:, 1:5].T if how == "contiguous" else w[1:5] * v)
    np.testing.assert_allclose(program.predict(x).numpy(), want, rtol=1e-5, atol=1e-6)
    y = np.zeros((3, 4, 6), np.float32)
    assert gradcheck(program, x, y, rtol=3e-2, atol=1e-4) if how != "detach" else True
    program.backward(x, y)
    assert (model.w.grad is None) == (how == "detach")  # no gradient reaches it: .grad stays None, as PyTorch's


class Pooled(nn.Module):
    """sentence-transformers' mean pooling of an int64 attention mask, mask.type_as(h), rows merged from the batch
    through addmm with beta and alpha and viewed back with -1, and BEiT's zeros_like(..., requires_grad=False)."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(20, 8)
        self.W, self.b = nn.Parameter(ft.randn(8, 6) * 0.3), nn.Parameter(ft.randn(6) * 0.1)
        self.fc = nn.Linear(8, 6)

    def forward(self, ids, mask):
        h = self.emb(ids)
        m = mask.unsqueeze(-1).expand(h.size()).float()
        pooled = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
        bias = ft.cat((self.b[:3], ft.zeros_like(self.b[3:], requires_grad=False)))
        rows = ft.addmm(bias, h.view(-1, 8), self.W, beta=0.5, alpha=2.0).view(-1, ids.shape[1], 6)
        return self.fc(pooled) + (rows * mask.type_as(h)[:, :, None]).sum(1)


def test_integer_masks_expand_and_convert_and_merged_rows_come_back():
    """Each compiled and failed in every call (an expand of int64: "broadcast_to: inp must be float32"), or was
    refused: mask.type_as(h) left integers, rows merged by x.view(-1, C) did not come back by view(-1, T, F),
    addmm's beta and alpha of merged rows, zeros_like(requires_grad=False). Against NumPy float64."""
    ft.manual_seed(79)
    model = Pooled()
    rng = np.random.default_rng(80)
    ids, mask = rng.integers(0, 20, (3, 5)), np.ones((3, 5), np.int64)
    mask[1, 2:] = 0
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.MSELoss(), batch_size=3,
                            input_shape=((5,), (5,)), input_dtype=(ft.int64, ft.int64))
    h = model.emb.weight.numpy().astype(np.float64)[ids]
    m = mask[:, :, None].astype(np.float64)
    pooled = (h * m).sum(1) / m.sum(1)
    rows = 0.5 * np.concatenate([model.b.numpy()[:3], np.zeros(3)]) + 2.0 * h @ model.W.numpy()
    want = pooled @ model.fc.weight.numpy().T + model.fc.bias.numpy() + (rows * m).sum(1)
    np.testing.assert_allclose(program.predict((ids, mask)).numpy(), want, rtol=1e-5, atol=1e-5)
    program.train_step((ids, mask), np.zeros((3, 6), np.float32))


class DenseLayer(nn.Module):
    """torchvision's _DenseLayer as written: a list of features in, torch.jit's decorators and is_scripting, the
    features' requires_grad before torch.utils.checkpoint, torch._assert, and CLIP's class embedding expanded with
    new leading dimensions."""

    def __init__(self, c, grow):
        super().__init__()
        self.norm, self.conv = nn.BatchNorm2d(c), nn.Conv2d(c, grow, 3, padding=1, bias=False)
        self.token = nn.Parameter(ft.randn(grow))

    def bn_function(self, inputs):
        return self.conv(F.relu(self.norm(ft.cat(inputs, 1))))

    @ft.jit.unused
    def call_checkpoint_bottleneck(self, inputs):
        return ft.utils.checkpoint.checkpoint(lambda *features: self.bn_function(features), *inputs)

    def forward(self, input):
        features = [input] if isinstance(input, ft.Tensor) else input
        ft._assert(features[0].shape[1] > 0, "no channels")
        if any(f.requires_grad for f in features) and not ft.jit.is_scripting():
            out = self.call_checkpoint_bottleneck(features)
        else:
            out = self.bn_function(features)
        return out + self.token.expand(out.shape[0], 1, 1, -1).permute(0, 3, 1, 2)


def test_torchvisions_dense_layer_compiles_as_written():
    """A module called with a list of traced values was refused as "called on tensors that are not traced";
    ft.jit, ft.utils.checkpoint, ft._assert, a traced value's requires_grad and a (D,) parameter expanded as
    (N, 1, D) were missing or refused. The two-layer block matches NumPy's forward and finite differences."""
    ft.manual_seed(81)
    first, second = DenseLayer(3, 2), DenseLayer(5, 2)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.first, self.second = first, second

        def forward(self, x):
            features = [x]
            features.append(self.first(features))
            features.append(self.second(features))
            return ft.cat(features, 1).mean((2, 3))

    model = Block()
    x = np.random.default_rng(82).standard_normal((2, 3, 4, 4)).astype(np.float32)
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.MSELoss(), batch_size=2,
                            input_shape=(3, 4, 4))
    model.eval()
    np.testing.assert_allclose(program.predict(x).numpy(), model(ft.tensor(x)).numpy(), rtol=1e-5, atol=1e-6)
    model.train()
    assert gradcheck(program, x, np.zeros((2, 7), np.float32), rtol=3e-2, atol=1e-3)
    assert ft.jit.is_scripting() is False and ft.fx.wrap("stochastic_depth") == "stochastic_depth"
    assert ft.divide(ft.ones(2), 4).tolist() == [0.25, 0.25]
    with pytest.raises(AssertionError, match="no channels"):
        ft._assert(False, "no channels")
    with pytest.raises(NotImplementedError, match="model.compile"):
        ft.jit.script(model)


def test_the_error_function_of_traced_values_is_berts_gelu():
    """ft.erf of a traced value (BERT's GELU written out, x * 0.5 * (1 + erf(x / sqrt(2)))) was refused: it is an
    elementwise node now, the same function as F.gelu (losses equal to rounding), its gradient against finite
    differences, and of a parameter too."""
    class Written(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.out, self.s = nn.Linear(4, 5), nn.Linear(5, 3), nn.Parameter(ft.tensor([0.3]))

        def forward(self, x):
            h = self.fc(x)
            return self.out(h * 0.5 * (1.0 + ft.erf(h / math.sqrt(2.0)))) * ft.erf(self.s).exp()

    class Builtin(Written):
        def forward(self, x):
            return self.out(F.gelu(self.fc(x))) * math.exp(math.erf(0.3))

    ft.manual_seed(83)
    written, builtin = Written(), Builtin()
    builtin.load_state_dict(written.state_dict())
    x, y = np.random.default_rng(84).standard_normal((4, 4)).astype(np.float32), np.array([0, 1, 2, 0])
    programs = [m.compile(ft.optim.SGD(m.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=4,
                          input_shape=(4,)) for m in (written, builtin)]
    np.testing.assert_allclose(programs[0].predict(x).numpy(), programs[1].predict(x).numpy(), rtol=1e-6, atol=1e-6)
    assert gradcheck(programs[0], x, y, rtol=3e-2, atol=1e-4)


def grouped_query(lib, flag):
    """Llama's grouped-query attention: 4 query heads, 2 key and value heads repeated by repeat_interleave (the
    method and the function), or given to SDPA with enable_gqa=True."""
    L = nn if lib is ft else lib.nn
    G = L.functional

    class Attention(L.Module):
        def __init__(self):
            super().__init__()
            self.q, self.kv, self.o = L.Linear(8, 8), L.Linear(8, 4), L.Linear(8, CLASSES)

        def forward(self, x):
            n, t, _ = x.shape
            q = self.q(x).view(n, t, 4, 2).transpose(1, 2)
            k = self.kv(x).view(n, t, 2, 2).transpose(1, 2)
            v = k * 2.0
            if not flag:
                k, v = k.repeat_interleave(2, dim=1), lib.repeat_interleave(v, 2, dim=1)
            o = G.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=flag)
            return self.o(o.transpose(1, 2).reshape(n, t, 8)).mean(1)

    return Attention()


@pytest.mark.parametrize("flag", [False, True], ids=["repeat_interleave", "enable_gqa"])
def test_grouped_query_attention_repeats_the_key_heads(flag):
    ft.manual_seed(5)
    model = grouped_query(ft, flag)
    x = np.random.default_rng(50).standard_normal((2, 5, 8)).astype(np.float32)
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=2,
                            input_shape=(5, 8))
    np.testing.assert_allclose(program.predict(x).numpy(), model(ft.tensor(x)).numpy(), rtol=1e-5, atol=1e-6)
    assert gradcheck(program, x, np.arange(2), rtol=3e-2, atol=1e-3)
    if torch is not None:
        tm = grouped_query(torch, flag)
        model.load_state_dict({k: v.detach().numpy() for k, v in tm.state_dict().items()})
        assert_gradients_match(program, tm, x, np.arange(2), torch.nn.CrossEntropyLoss())
    with pytest.raises(ValueError, match=r"enable_gqa needs the query's heads \(4\) a multiple of the key's \(3\)"):
        F.scaled_dot_product_attention(ft.zeros(1, 4, 2, 2), ft.zeros(1, 3, 2, 2), ft.zeros(1, 3, 2, 2),
                                       enable_gqa=True)


def timestep_embedded(lib):
    """DDPM's sinusoidal embedding of integer times computed in forward (sin and cos of t * frequencies), and sin
    and cos of a parameter and of the input."""
    L = nn if lib is ft else lib.nn

    class Embedded(L.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.w = L.Linear(8, CLASSES), L.Parameter(lib.linspace(0.1, 1.0, CLASSES))

        def forward(self, x, t):
            freqs = lib.exp(-math.log(10000.0) * lib.arange(4, dtype=lib.float32) / 4)
            angles = t.float()[:, None] * freqs[None]
            emb = lib.cat([lib.sin(angles), angles.cos()], dim=-1)
            return self.fc(emb * x) + lib.sin(self.w) * lib.cos(x[:, :CLASSES])

    return Embedded()


def test_sin_and_cos_of_traced_values_embed_a_time_in_forward():
    ft.manual_seed(6)
    model = timestep_embedded(ft)
    rng = np.random.default_rng(51)
    x, t = rng.standard_normal((3, 8)).astype(np.float32), np.array([5, 900, 31])
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=3,
                            input_shape=((8,), ()), input_dtype=(ft.float32, ft.int64))
    angles = t[:, None] * np.exp(-math.log(10000.0) * np.arange(4) / 4)[None]
    h = np.concatenate([np.sin(angles), np.cos(angles)], 1) * x
    w = model.w.numpy().astype(np.float64)
    want = h @ model.fc.weight.numpy().T + model.fc.bias.numpy() + np.sin(w) * np.cos(x[:, :CLASSES])
    np.testing.assert_allclose(program.predict((x, t)).numpy(), want, rtol=1e-5, atol=1e-5)
    assert gradcheck(program, (x, t), np.arange(3), rtol=3e-2, atol=1e-3)
    if torch is not None:
        tm = timestep_embedded(torch)
        model.load_state_dict({k: v.detach().numpy() for k, v in tm.state_dict().items()})
        assert_gradients_match(program, tm, (x, t), np.arange(3), torch.nn.CrossEntropyLoss())


def test_a_loss_reduced_over_dim_0_and_eager_functions_named():
    """A VAE's ft.mean(kld, dim=0) of one value per sample is the batch's mean, as .mean(); ft.topk of a traced value
    and floor_ (an older drop path's mask) are refused naming the function and what compiles."""
    class Encoder(nn.Module):
        def __init__(self, use=None):
            super().__init__()
            self.fc, self.use = nn.Linear(4, 6), use

        def forward(self, x):
            h = self.fc(x)
            if self.use == "topk":
                return ft.topk(h, 2).values
            if self.use == "floor":
                return h * (h + 0.5).floor_()
            return h.chunk(2, 1)

    def loss(out, y):
        mu, log_var = out
        kld = ft.mean(-0.5 * ft.sum(1 + log_var - mu ** 2 - log_var.exp(), dim=1), dim=0)
        return F.mse_loss(mu, y, reduction="none").sum(1).sum(dim=0) / 4 + kld

    model = Encoder()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), loss, batch_size=4, input_shape=(4,),
                            target_shape=(3,))
    rng = np.random.default_rng(52)
    x, y = rng.standard_normal((4, 4)).astype(np.float32), rng.standard_normal((4, 3)).astype(np.float32)
    mu, log_var = (v.numpy().astype(np.float64) for v in model(ft.tensor(x)))
    want = ((mu - y) ** 2).sum() / 4 + (-0.5 * (1 + log_var - mu ** 2 - np.exp(log_var)).sum(1)).mean()
    assert program.evaluate(x, y)[0] == pytest.approx(want, rel=1e-5)
    for use, message in (("topk", r"ft.topk of a traced value .* a compiled program does not sort"),
                         ("floor", r"x.floor_ .* x.new_empty\(\(x.size\(0\), 1, 1, 1\)\).bernoulli_\(p\)")):
        with pytest.raises(ft.nn.TracingError, match=message):
            Encoder(use).compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.MSELoss(), batch_size=4,
                                 input_shape=(4,))


class Guided(nn.Module):
    """Classifier-free guidance's label dropout: a learned null embedding where a sample's label is dropped (the ids
    themselves replaced is refused: a program computes no integers)."""

    def __init__(self, ids=False):
        super().__init__()
        self.emb, self.null, self.fc, self.ids = nn.Embedding(4, 3), nn.Parameter(ft.zeros(3)), nn.Linear(3, 2), ids

    def forward(self, x, y):
        drop = x[:, 0] > 0.5
        if self.ids:
            return self.fc(self.emb(ft.where(drop, ft.full_like(y, 3), y)))
        return self.fc(ft.where(drop[:, None], self.null, self.emb(y)))


def test_label_dropout_chooses_a_learned_null_embedding():
    ft.manual_seed(7)
    model = Guided()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=2,
                            input_shape=((1,), ()), input_dtype=(ft.float32, ft.int64))
    x, y = np.array([[0.9], [0.1]], np.float32), np.array([1, 2])
    emb = model.emb.weight.numpy()
    want = np.stack([model.null.numpy(), emb[2]]) @ model.fc.weight.numpy().T + model.fc.bias.numpy()
    np.testing.assert_allclose(program.predict((x, y)).numpy(), want, rtol=1e-6, atol=1e-6)
    program.backward((x, y), np.array([0, 1]))
    assert np.abs(model.null.grad.numpy()).max() > 0 and not model.emb.weight.grad.numpy()[1].any()
    with pytest.raises(ft.nn.TracingError, match=r"ft.where \(or masked_fill\) of integer values .* "
                                                 r"self.null_embedding"):
        Guided(ids=True).compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=2,
                                 input_shape=((1,), ()), input_dtype=(ft.float32, ft.int64))


def test_lerp_of_traced_values_interpolates():
    """torch.lerp in a forward (a learned mix of two branches), the method and the function, of a parameter too."""
    class Mixed(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.w = nn.Linear(4, 3), nn.Linear(4, 3), nn.Parameter(ft.tensor([0.2, 0.5, 0.9]))

        def forward(self, x):
            return self.a(x).lerp(self.b(x), self.w.sigmoid()) + ft.lerp(self.b(x), self.a(x), 0.25)

    ft.manual_seed(8)
    model = Mixed()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=2,
                            input_shape=(4,))
    x = np.random.default_rng(53).standard_normal((2, 4)).astype(np.float32)
    a, b = (x @ m.weight.numpy().T + m.bias.numpy() for m in (model.a, model.b))
    s = 1 / (1 + np.exp(-model.w.numpy()))
    np.testing.assert_allclose(program.predict(x).numpy(), a + s * (b - a) + b + 0.25 * (a - b), rtol=1e-5,
                               atol=1e-6)
    assert gradcheck(program, x, np.array([0, 2]), rtol=3e-2, atol=1e-3)


def test_one_hot_rows_of_the_models_ids_compile_and_check_the_ids():
    """d2l's RNNLMScratch feeds F.one_hot(X, vocab_size).float() of its int64 input: the rows compile (an identity
    table's, as F.embedding(X, ft.eye(V))), give the eager model's loss, and an id out of range is refused before
    the step as an embedding's is (PyTorch raises too); a table of more rows than it is worth is refused."""
    V, T = 6, 5

    class Scratch(nn.Module):
        def __init__(self, classes=V):
            super().__init__()
            self.classes, self.lin = classes, nn.Linear(classes, V)

        def forward(self, X):
            return self.lin(F.one_hot(X, self.classes).type(ft.float32))

    def loss(o, y):
        return F.cross_entropy(o.reshape(-1, V), y.reshape(-1))

    rng = np.random.default_rng(0)
    x, y = rng.integers(0, V, (4, T)), rng.integers(0, V, (4, T))
    m = Scratch()
    p = m.compile(ft.optim.SGD(m.parameters(), lr=0.1), loss, batch_size=4, input_shape=(T,), input_dtype=ft.int64,
                  target_shape=(T,))
    np.testing.assert_allclose(p.backward(x, y), float(loss(m(ft.tensor(x)), ft.tensor(y))), rtol=1e-6)
    before = m.lin.weight.numpy().copy()
    bad = x.copy()
    bad[2, 3] = V
    with pytest.raises(IndexError, match=r"ids\[2, 3\] = 6 is out of range"):
        p.train_step(bad, y)
    np.testing.assert_array_equal(m.lin.weight.numpy(), before)
    big = Scratch(5000)
    with pytest.raises(ft.nn.TracingError, match="F.one_hot of the model's ids into 5000 classes .* nn.Embedding"):
        big.compile(ft.optim.SGD(big.parameters(), lr=0.1), loss, batch_size=4, input_shape=(T,),
                    input_dtype=ft.int64, target_shape=(T,))


def test_max_and_min_of_a_traced_value_and_another_are_maximum_and_minimum():
    """torch.max(X, other) and torch.min(X, other) of a tensor or a traced value (d2l's relu,
    torch.max(X, torch.zeros_like(X))) compile as maximum and minimum: the eager model's loss."""
    class Clipped(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 3), nn.Linear(4, 3)

        def forward(self, x):
            h = ft.max(self.a(x), ft.zeros_like(self.a(x)))
            return ft.min(ft.full((3,), 2.0), ft.min(h, self.b(x)).max(ft.full((3,), -0.5)))  # a tensor first too

    x, y = np.random.default_rng(1).standard_normal((8, 4)).astype(np.float32), np.arange(8) % 3
    m = Clipped()
    p = m.compile(ft.optim.SGD(m.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=8, input_shape=(4,))
    want = float(F.cross_entropy(m(ft.tensor(x)), ft.tensor(y)))
    np.testing.assert_allclose(p.backward(x, y), want, rtol=1e-6)


def test_each_samples_entry_at_its_label_by_arange_of_the_batch():
    """d2l's hand-written cross entropy, -log(y_hat[ft.arange(N), y]) of softmax rows (range(len(y_hat)) says to
    write it so): each sample's entry at its label, as gather's, the loss and gradients of F.cross_entropy."""
    x, y = np.random.default_rng(2).standard_normal((6, 4)).astype(np.float32), np.arange(6) % 3
    losses = []
    for loss in (lambda o, t: -ft.log(F.softmax(o, 1)[ft.arange(o.size(0)), t]).mean(), nn.CrossEntropyLoss()):
        ft.manual_seed(3)
        m = nn.Linear(4, 3)
        p = m.compile(ft.optim.SGD(m.parameters(), lr=0.1), loss, batch_size=6, input_shape=(4,))
        losses.append((p.backward(x, y), m.weight.grad.numpy().copy()))
    np.testing.assert_allclose(losses[0][0], losses[1][0], rtol=1e-6)
    np.testing.assert_allclose(losses[0][1], losses[1][1], rtol=1e-5, atol=1e-7)
    with pytest.raises(ft.nn.TracingError, match=r"y_hat\[range\(len\(y_hat\)\), y\], is y_hat\[ft.arange"):
        m.compile(ft.optim.SGD(m.parameters(), lr=0.1), lambda o, t: -o[range(len(o)), t].mean(), batch_size=6,
                  input_shape=(4,))


def test_two_traced_integer_values_do_not_compare():
    """Integers compare as float32 values, exact below 2 ** 24: a constant is checked, two traced integer values
    (token ids against other ids) cannot be, and are refused."""
    class Same(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 2)

        def forward(self, a, b):
            return self.lin((a == b).float())

    m = Same()
    with pytest.raises(ft.nn.TracingError, match="a comparison of two traced integer values cannot be compiled"):
        m.compile(ft.optim.SGD(m.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=2,
                  input_shape=((3,), (3,)), input_dtype=(ft.int64, ft.int64))

    class Big(Same):
        def forward(self, a, b):
            return self.lin((a < ft.tensor([0, 2 ** 24, 1])).float())

    m = Big()
    with pytest.raises(ft.nn.TracingError, match=r"integers of 2 \*\* 24 or more"):
        m.compile(ft.optim.SGD(m.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=2,
                  input_shape=((3,), (3,)), input_dtype=(ft.int64, ft.int64))


def test_half_bfloat16_and_double_of_traced_values_are_the_value():
    """x.half(), x.bfloat16() and x.double() of traced values, in a forward or of the loss (a loss written
    F.cross_entropy(o, y).half()), are the value, as x.to(dtype) is: the program chooses its dtypes."""
    x, y = np.random.default_rng(3).standard_normal((4, 3)).astype(np.float32), np.arange(4) % 2
    losses = []
    for cast in (lambda v: v, lambda v: v.half(), lambda v: v.bfloat16().double()):
        ft.manual_seed(0)
        m = nn.Linear(3, 2)
        p = m.compile(ft.optim.SGD(m.parameters(), lr=0.1), lambda o, t: cast(F.cross_entropy(cast(o), t)),
                      batch_size=4, input_shape=(3,))
        losses.append(p.backward(x, y))
    assert losses[0] == losses[1] == losses[2]


def test_logsumexp_of_traced_values_with_masked_and_infinite_entries():
    """logsumexp over scores with a masked entry far below the others (-1e9 at the first index, which
    x - log_softmax(x) there cancelled), a row of -inf and a +inf: the eager values, and the gradient softmax(x)."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 2, 4)).astype(np.float32)
    masks = [np.array([[True, False, False, False], [False, False, True, False]]),
             np.array([[True, True, True, True], [False, False, False, False]])]

    class Lse(nn.Module):
        def __init__(self, mask, fill):
            super().__init__()
            self.lin, self.mask, self.fill = nn.Linear(4, 4), ft.tensor(mask), fill

        def forward(self, x):
            return ft.logsumexp(self.lin(x).masked_fill(self.mask, self.fill), 2)

    class Lse2(nn.Module):  # over two dimensions (a tuple), kept
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            return self.lin(x).logsumexp((1, -1), keepdim=True) + self.lin(x).logsumexp((-1,)).unsqueeze(-1)

    m = Lse2()
    p = m.compile(ft.optim.SGD(m.parameters(), lr=0.1), lambda o, t: o.sum(), batch_size=3, input_shape=(2, 4),
                  target_shape=(), target_dtype=ft.float32)
    np.testing.assert_allclose(p.predict(x).numpy(), m(ft.tensor(x)).numpy(), rtol=1e-6, atol=1e-6)
    for mask, fill in ((masks[0], -1e9), (masks[0], float("-inf")), (masks[1], float("-inf")),
                       (masks[0], float("inf"))):
        m = Lse(mask, fill)
        want = m(ft.tensor(x)).numpy()
        p = m.compile(ft.optim.SGD(m.parameters(), lr=0.1), lambda o, t: o.sum(), batch_size=3, input_shape=(2, 4),
                      target_shape=(), target_dtype=ft.float32)
        np.testing.assert_allclose(p.predict(x).numpy(), want, rtol=1e-6, atol=1e-6)
        if np.isfinite(want).all():  # d(sum of lse)/d(bias) = the softmax rows summed
            p.backward(x, np.zeros(3, np.float32))
            s = m.lin(ft.tensor(x)).masked_fill(m.mask, fill).numpy()
            soft = np.exp(s - s.max(-1, keepdims=True))
            soft /= soft.sum(-1, keepdims=True)
            np.testing.assert_allclose(m.lin.bias.grad.numpy(), soft.sum((0, 1)), rtol=1e-5, atol=1e-6)


def test_a_constant_bool_mask_in_arithmetic_and_a_choice_by_it_between_traced_values():
    """A bool tensor the same for every sample multiplies as its 0 and 1 (it compiled, then every step failed in
    the mul node), and ft.where of two traced values by it selects: an infinite value on the side not chosen (a
    score masked to -inf) leaves the chosen value, not NaN (it was their sum of products with 0 and 1)."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    keep = rng.random((3, 4)) < 0.5

    class Masked(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.register_buffer("keep", ft.tensor(keep))

        def forward(self, x):
            h = self.lin(x)
            scores = h.masked_fill(~self.keep, float("-inf"))  # -inf where not kept
            return h * self.keep + ft.where(self.keep, scores, h * 2.0)

    m = Masked()
    want = m(ft.tensor(x)).numpy()
    assert np.isfinite(want).all()
    p = m.compile(ft.optim.SGD(m.parameters(), lr=0.1), nn.MSELoss(), batch_size=2, input_shape=(3, 4))
    np.testing.assert_allclose(p.predict(x).numpy(), want, rtol=1e-6, atol=1e-6)
    y = np.zeros((2, 3, 4), np.float32)
    np.testing.assert_allclose(p.backward(x, y), float((want ** 2).mean()), rtol=1e-5)


def test_elu_selu_and_celu_pass_alphas_gradient_at_zero():
    """At an input of exactly 0 (a zero-initialised layer's output: LoRA's B, ReZero) ELU's derivative is alpha, as
    PyTorch's (SELU's scale * alpha, CELU's 1), not 0: such a layer trains."""
    x = np.random.default_rng(7).standard_normal((3, 4)).astype(np.float32)
    for act, slope in ((F.elu, 1.0), (lambda h: F.elu(h, 0.5), 0.5), (F.selu, 1.0507009873554805 * 1.6732632423543772),
                       (lambda h: F.celu(h, 2.0), 1.0)):
        m = nn.Linear(4, 2)
        m.weight.zero_(), m.bias.zero_()
        p = m.compile(ft.optim.SGD(m.parameters(), lr=0.1), lambda o, t: act(o).sum(), batch_size=3, input_shape=(4,),
                      target_shape=(), target_dtype=ft.float32)
        p.backward(x, np.zeros(3, np.float32))
        np.testing.assert_allclose(m.bias.grad.numpy(), [3 * slope] * 2, rtol=1e-6)
