"""ft.nn.Parameter and freezing, as PyTorch users know them: parameters registered on assignment, and
requires_grad=False (per tensor or module.requires_grad_) compiled into a program that computes no gradient
for them and never updates them, without changing anything else."""
import numpy as np
import pytest

import fasttrain as ft
from fasttrain import nn
from fasttrain.nn import functional as F


def net(seed=0):
    ft.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                         nn.Conv2d(4, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(4, 5))


def batch(n=6, seed=1):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 3, 6, 6)).astype(np.float32), rng.integers(0, 5, n)


def compiled(model, **opt):
    optimizer = ft.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-2, **opt)
    return model.compile(optimizer, nn.CrossEntropyLoss(), batch_size=6, input_shape=(3, 6, 6))


class Affine(nn.Module):
    """Parameters assigned as attributes, used through F.linear."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(ft.tensor(np.arange(12, dtype=np.float32).reshape(3, 4) / 10))
        self.b = nn.Parameter(ft.zeros(3))
        self.scale = ft.ones(3)  # a plain tensor attribute is not a parameter

    def forward(self, x):
        return F.linear(x, self.w, self.b)


def test_parameter_registers_on_assignment_and_shares_memory():
    source = ft.zeros(3)
    p = nn.Parameter(source)
    assert isinstance(p, nn.Parameter) and isinstance(p, ft.Tensor) and p.requires_grad
    assert p.data_ptr() == source.data_ptr()
    assert not source.requires_grad and not ft.ones(2).requires_grad  # plain tensors, as torch's
    m = Affine()
    assert [n for n, _ in m.named_parameters()] == ["w", "b"]
    assert list(m.state_dict()) == ["w", "b"]
    assert all(isinstance(q, nn.Parameter) for q in nn.Linear(2, 2).parameters())
    assert repr(nn.Parameter(ft.ones(2))).startswith("Parameter containing:\ntensor([1., 1.])")
    with pytest.raises(TypeError, match="Parameter wraps a fasttrain Tensor"):
        nn.Parameter(np.zeros(2))
    with pytest.raises(TypeError, match=r"cannot assign Tensor as parameter 'w' \(nn.Parameter or None expected\)"):
        m.w = ft.ones(3, 4)  # as PyTorch: a plain tensor cannot silently take a parameter's place
    m.w = nn.Parameter(ft.ones(3, 4))  # a replaced parameter keeps its place in the order
    assert [n for n, _ in m.named_parameters()] == ["w", "b"] and m.w.shape == (3, 4)
    del m.w
    assert [n for n, _ in m.named_parameters()] == ["b"] and not hasattr(m, "w")


def test_assigned_parameters_train_in_a_compiled_program():
    m = Affine()
    x = np.random.default_rng(0).standard_normal((6, 4)).astype(np.float32)
    y = np.array([0, 1, 2, 0, 1, 2])
    program = m.compile(ft.optim.SGD(m.parameters(), lr=0.5), nn.CrossEntropyLoss(), batch_size=6, input_shape=(4,))
    first = program.train_step(x, y)
    for _ in range(10):
        last = program.train_step(x, y)
    assert last < first
    assert not np.array_equal(m.w.numpy(), np.arange(12, dtype=np.float32).reshape(3, 4) / 10)


@pytest.mark.parametrize("how", ["tensor", "module"])
def test_frozen_parameters_stay_bitwise_and_the_rest_trains_as_before(how):
    x, y = batch()
    reference = net()
    ref_program = compiled(reference)
    ref_program.backward(x, y)
    model = net()
    if how == "tensor":
        model[0].weight.requires_grad = False
        model[0].bias.requires_grad = False
        model[1].weight.requires_grad = False
    else:
        model[0].requires_grad_(False)
        model[1].weight.requires_grad_(False)
    frozen = [model[0].weight, model[0].bias, model[1].weight]
    before = [p.numpy().copy() for p in frozen]
    program = compiled(model)
    program.backward(x, y)
    for p in frozen:  # no gradient, as PyTorch leaves a frozen parameter's
        assert p.grad is None
    # the gradients of what trains are those of the unfrozen model (to rounding: the unfrozen model drops the
    # conv bias the batch norm cancels, a frozen bias is kept as it is)
    for name in ("1.bias", "3.weight", "3.bias", "7.weight"):
        np.testing.assert_allclose(dict(model.named_parameters())[name].grad.numpy(),
                                   dict(reference.named_parameters())[name].grad.numpy(), rtol=1e-5, atol=1e-8)
    rm = model[1].running_mean.numpy().copy()
    for _ in range(3):
        program.train_step(x, y)
    for p, b in zip(frozen, before):
        np.testing.assert_array_equal(p.numpy(), b)  # no update, not even weight decay
    assert not np.array_equal(model[3].weight.numpy(), reference[3].weight.numpy())
    # a frozen batch norm still normalizes by batch statistics and tracks them in training, as PyTorch's
    assert not np.array_equal(model[1].running_mean.numpy(), rm)


def test_a_frozen_first_layer_runs_no_backward():
    """The first conv reads the batch (no input gradient) and is frozen (no weight gradient): its backward is
    not run at all, which the program's per-node profile shows."""
    x, y = batch()
    model = net()
    model[0].requires_grad_(False)
    program = compiled(model)
    for _ in range(3):
        program.backward(x, y)
    table = program.profile()
    assert table[1][0] == "Conv2d" and table[1][2] == 0.0 and table[1][1] > 0.0
    assert table[3][0] == "Conv2d" and table[3][2] > 0.0


def test_everything_frozen_computes_the_loss_and_changes_nothing():
    x, y = batch()
    model = net().requires_grad_(False)
    program = compiled(model)
    before = [p.numpy().copy() for p in model.parameters()]
    loss = program.train_step(x, y)
    assert np.isfinite(loss) and loss > 0
    for p, b in zip(model.parameters(), before):
        np.testing.assert_array_equal(p.numpy(), b)


class WithUnused(nn.Module):
    """A layer the forward never calls (BERT's pooler under a masked-LM head, a leftover)."""

    def __init__(self):
        super().__init__()
        self.body, self.unused = net(), nn.Linear(4, 4)

    def forward(self, x):
        return self.body(x)


@pytest.mark.parametrize("loop", ["train_step", "by hand"])
def test_a_parameter_the_forward_never_reads_keeps_no_gradient_and_is_not_updated(loop):
    """As in PyTorch, its .grad stays None, so AdamW's weight decay and state leave it alone, in the compiled step
    and in a loop of program.backward and optimizer.step(); the others train."""
    x, y = batch()
    model = WithUnused()
    opt = ft.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.5)
    program = model.compile(opt, nn.CrossEntropyLoss(), batch_size=6, input_shape=(3, 6, 6))
    before = {k: v.copy() for k, v in model.state_dict().items()}
    for _ in range(2):
        if loop == "train_step":
            program.train_step(x, y)
        else:
            opt.zero_grad()
            program.backward(x, y)
            opt.step()
    after = model.state_dict()
    assert model.unused.weight.grad is None and model.unused.bias.grad is None
    assert np.array_equal(after["unused.weight"], before["unused.weight"])
    assert not np.array_equal(after["body.7.weight"], before["body.7.weight"])
    unused = {i for i, (name, _) in enumerate(model.named_parameters()) if name.startswith("unused.")}
    assert unused and not unused & set(opt.state_dict()["state"])


def test_freezing_matches_pytorch():
    torch = pytest.importorskip("torch")
    x, y = batch()
    model = net()
    model[0].requires_grad_(False)
    program = compiled(model)
    program.backward(x, y)
    tm = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                             torch.nn.Conv2d(4, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                             torch.nn.Flatten(), torch.nn.Linear(4, 5))
    tm.load_state_dict({k: torch.from_numpy(v) for k, v in model.state_dict().items()})
    tm[0].requires_grad_(False)
    torch.nn.functional.cross_entropy(tm(torch.from_numpy(x)), torch.from_numpy(y)).backward()
    assert tm[0].weight.grad is None
    for name, p in tm.named_parameters():
        if p.requires_grad:
            np.testing.assert_allclose(dict(model.named_parameters())[name].grad.numpy(), p.grad.numpy(),
                                       rtol=1e-4, atol=1e-5)


def test_inplace_layers_overwrite_their_input_in_eager_calls():
    """inplace=True is honoured as in PyTorch (eager), not accepted and ignored."""
    x = ft.tensor(np.array([-1.0, 2.0], np.float32))
    y = nn.ReLU(inplace=True)(x)
    assert y.data_ptr() == x.data_ptr() and x.numpy().tolist() == [0.0, 2.0]
    x = ft.tensor(np.array([-1.0, 2.0], np.float32))
    nn.LeakyReLU(0.5, inplace=True)(x)
    assert x.numpy().tolist() == [-0.5, 2.0]
    x = ft.tensor(np.array([-1.0, 2.0], np.float32))
    assert nn.ReLU()(x).data_ptr() != x.data_ptr() and x.numpy().tolist() == [-1.0, 2.0]
    x = ft.ones(1000)
    out = nn.Dropout(0.5, inplace=True)(x)
    assert out.data_ptr() == x.data_ptr() and set(np.unique(x.numpy())) == {0.0, 2.0}


def test_assignment_follows_pytorch_for_buffers_and_children():
    """A tensor assigned to a buffer's name stays a buffer (saved), a replaced child keeps its place in the order
    (fine-tuning a new head), add_module registers by name, and a wrong kind under a parameter's or a child's name is
    a TypeError rather than an attribute that silently leaves the state."""
    class Masked(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("mask", ft.ones(3))
            self.body, self.head = nn.Linear(3, 3), nn.Linear(3, 2)

    m = Masked()
    m.mask = m.mask * 0
    assert list(m.state_dict()) == ["mask", "body.weight", "body.bias", "head.weight", "head.bias"]
    assert not m.state_dict()["mask"].any()
    m.body = nn.Linear(3, 3, bias=False)
    assert list(m.state_dict()) == ["mask", "body.weight", "head.weight", "head.bias"]
    m.add_module("extra", nn.Identity())
    assert [n for n, _ in m.named_children()] == ["body", "head", "extra"]
    with pytest.raises(TypeError, match=r"cannot assign int as child 'head' \(nn.Module or None expected\)"):
        m.head = 3
    with pytest.raises(KeyError, match="without '.'"):
        m.add_module("a.b", nn.Identity())
    m.head = None
    assert list(m.state_dict()) == ["mask", "body.weight"] and m.head is None


def test_deep_copies_and_pickles_keep_parameters_trainable():
    """copy.deepcopy (an EMA model, cloned layers) and pickle keep a Parameter a Parameter, with its requires_grad
    (they came back as plain frozen tensors, so a compiled copy trained nothing)."""
    import copy
    import pickle
    layer = nn.Linear(4, 4)
    layer.bias.requires_grad = False
    for clone in (copy.deepcopy, lambda m: pickle.loads(pickle.dumps(m))):
        c = clone(layer)
        assert isinstance(c.weight, nn.Parameter) and c.weight.requires_grad and not c.bias.requires_grad
        assert c.weight.data_ptr() != layer.weight.data_ptr()
        np.testing.assert_array_equal(c.weight.numpy(), layer.weight.numpy())
    model = nn.Sequential(copy.deepcopy(layer), nn.ReLU(), copy.deepcopy(layer), nn.Linear(4, 3))
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=3,
                            input_shape=(4,))
    program.backward(np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32), np.array([0, 1, 2]))
    assert np.abs(model[0].weight.grad.numpy()).max() > 0 and np.abs(model[2].weight.grad.numpy()).max() > 0


def test_a_model_compiled_again_with_its_optimizer_goes_on_counting_steps():
    """Fine-tuning in two stages: the backbone frozen for 3 steps, then unfrozen and the model compiled again with
    the same optimizer: program.step_count goes on from 3 (it started at 0, so step callbacks' every_n_steps and
    checkpoints' step restarted); a program with another optimizer counts its own."""
    model = net()
    for p in model[0].parameters():
        p.requires_grad_(False)
    optimizer = ft.optim.SGD(model.parameters(), lr=0.1)
    program = model.compile(optimizer, nn.CrossEntropyLoss(), batch_size=6, input_shape=(3, 6, 6))
    x, y = batch()
    for _ in range(3):
        program.train_step(x, y)
    for p in model[0].parameters():
        p.requires_grad_(True)
    again = model.compile(optimizer, nn.CrossEntropyLoss(), batch_size=6, input_shape=(3, 6, 6))
    assert again.step_count == 3
    again.train_step(x, y)
    assert again.step_count == 4
    assert compiled(net(1)).step_count == 0
