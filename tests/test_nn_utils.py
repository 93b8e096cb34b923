"""Module.apply / zero_grad, nn.init.trunc_normal_ / orthogonal_ and nn.utils.clip_grad_norm_ against their
definitions (and PyTorch when it is installed)."""
import math

import numpy as np
import pytest

import fasttrain as ft
from fasttrain import nn
from _opref import torch


def test_apply_visits_children_before_parents_and_returns_the_module():
    model = nn.Sequential(nn.Linear(2, 3), nn.Sequential(nn.ReLU(), nn.Linear(3, 1)))
    seen = []
    assert model.apply(lambda m: seen.append(type(m).__name__)) is model
    assert seen == ["Linear", "ReLU", "Linear", "Sequential", "Sequential"]
    model.apply(lambda m: nn.init.zeros_(m.weight) if isinstance(m, nn.Linear) else None)
    assert not np.asarray(model[0].weight).any() and not np.asarray(model[1][1].weight).any()


def test_a_module_reachable_twice_is_visited_once_and_saved_under_each_name():
    """Sequential(l, ReLU(), l): apply, modules() and named_modules() visit l once, under its first name (as
    PyTorch's; remove_duplicate=False lists each path), while state_dict keeps both names (as PyTorch's)."""
    shared = nn.Linear(3, 3)
    model = nn.Sequential(shared, nn.ReLU(), shared)
    nn.init.ones_(shared.weight)
    model.apply(lambda m: m.weight.mul_(0.5) if isinstance(m, nn.Linear) else None)
    np.testing.assert_array_equal(np.asarray(shared.weight), np.full((3, 3), 0.5, np.float32))
    assert [n for n, _ in model.named_modules()] == ["", "0", "1"] and len(list(model.modules())) == 3
    assert [n for n, _ in model.named_modules(remove_duplicate=False)] == ["", "0", "1", "2"]
    assert list(model.state_dict()) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert len(list(model.parameters())) == 2


def test_sequential_slices_and_changes_in_place_as_pytorchs():
    """model[:-1] is a Sequential of those modules under their names (it runs them); append, insert, pop,
    assignment and deletion as PyTorch's, an insertion or deletion renumbering the children; a non-module refused;
    a program compiled before a change refuses to run on (a parameterless layer replaced too)."""
    a, b, c = nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1)
    model = nn.Sequential(a, b, c)
    head = model[:-1]
    assert isinstance(head, nn.Sequential) and list(head) == [a, b]
    assert list(head.state_dict()) == ["0.weight", "0.bias"]
    x = ft.tensor(np.ones((1, 2), np.float32))
    np.testing.assert_array_equal(np.asarray(head(x)), np.asarray(b(a(x))))
    d = nn.Tanh()
    model.insert(1, d)
    assert list(model) == [a, d, b, c] and list(model.state_dict()) == ["0.weight", "0.bias", "3.weight", "3.bias"]
    assert model.pop(1) is d and list(model) == [a, b, c]
    model[1] = d
    del model[0]
    assert list(model) == [d, c] and list(model.state_dict()) == ["1.weight", "1.bias"]
    model.append(b).extend([nn.Identity()])
    assert len(model) == 4 and model[2] is b
    with pytest.raises(TypeError, match="Sequential takes Modules, got int"):
        model.append(3)
    with pytest.raises(IndexError, match="out of range"):
        model.insert(9, b)
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.MSELoss(), batch_size=1, input_shape=(3,))
    model[0] = nn.Sigmoid()
    with pytest.raises(ValueError, match="the model's modules changed after compile"):
        program.predict(np.ones((1, 3), np.float32))


def test_module_lookups_take_pytorchs_arguments():
    """get_submodule by dotted path, named_parameters/named_buffers with prefix= and recurse=."""
    model = nn.Sequential(nn.Linear(2, 3), nn.Sequential(nn.BatchNorm1d(3), nn.Linear(3, 1)))
    assert model.get_submodule("1.0") is model[1][0] and model.get_submodule("") is model
    with pytest.raises(AttributeError, match="Sequential has no submodule '7'"):
        model.get_submodule("1.7")
    assert [n for n, _ in model.named_parameters(prefix="net")][:2] == ["net.0.weight", "net.0.bias"]
    assert list(model.parameters(recurse=False)) == [] and len(list(model[0].parameters(recurse=False))) == 2
    assert [n for n, _ in model[1].named_buffers(recurse=True)] == ["0.running_mean", "0.running_var",
                                                                     "0.num_batches_tracked"]
    assert model[0].weight.is_floating_point() and not ft.tensor([1]).is_floating_point()


def test_zero_grad_as_pytorch_and_a_program_writes_anew():
    model = nn.Sequential(nn.Linear(4, 3))
    opt = ft.optim.SGD(model.parameters(), lr=0.1)
    program = model.compile(opt, nn.MSELoss(), batch_size=8, input_shape=(4,))
    x, y = np.random.default_rng(0).standard_normal((8, 4), np.float32), np.zeros((8, 3), np.float32)
    program.backward(x, y)
    once = np.array(model[0].weight.grad)
    program.backward(x, y)  # adds, as loss.backward() does
    np.testing.assert_allclose(np.asarray(model[0].weight.grad), 2 * once, rtol=1e-6)
    model.zero_grad(set_to_none=False)
    assert not np.asarray(model[0].weight.grad).any()
    model.zero_grad()
    assert model[0].weight.grad is None
    program.backward(x, y)
    np.testing.assert_allclose(np.asarray(model[0].weight.grad), once, rtol=1e-6)


def truncated_moments(mean, std, a, b):
    """Mean and standard deviation of N(mean, std^2) truncated to [a, b]."""
    al, be = (a - mean) / std, (b - mean) / std
    pdf = lambda z: math.exp(-z * z / 2) / math.sqrt(2 * math.pi)  # noqa: E731
    cdf = lambda z: 0.5 * (1 + math.erf(z / math.sqrt(2)))  # noqa: E731
    z = cdf(be) - cdf(al)
    m = (pdf(al) - pdf(be)) / z
    var = 1 + (al * pdf(al) - be * pdf(be)) / z - m * m
    return mean + std * m, std * math.sqrt(var)


@pytest.mark.parametrize("mean, std, a, b", [(0.0, 1.0, -2.0, 2.0), (0.0, 0.02, -0.04, 0.04), (1.0, 2.0, 0.0, 5.0)])
def test_trunc_normal_has_the_truncated_moments(mean, std, a, b):
    t = nn.init.trunc_normal_(ft.empty(200, 500), mean, std, a, b)
    v = np.asarray(t, np.float64)
    assert v.min() >= a and v.max() <= b
    want_mean, want_std = truncated_moments(mean, std, a, b)
    assert abs(v.mean() - want_mean) < 5 * want_std / math.sqrt(v.size)
    assert abs(v.std() - want_std) < 0.01 * want_std
    ft.manual_seed(3)
    first = np.array(nn.init.trunc_normal_(ft.empty(50), mean, std, a, b))
    ft.manual_seed(3)
    np.testing.assert_array_equal(np.asarray(nn.init.trunc_normal_(ft.empty(50), mean, std, a, b)), first)


def test_trunc_normal_bad_arguments():
    with pytest.raises(ValueError, match="std > 0 and a < b"):
        nn.init.trunc_normal_(ft.empty(3), 0.0, 1.0, 2.0, -2.0)
    with pytest.raises(ValueError, match="more than 5 standard deviations"):
        nn.init.trunc_normal_(ft.empty(3), 0.0, 1.0, 10.0, 11.0)


@pytest.mark.parametrize("shape", [(6, 4), (4, 6), (8, 3, 3, 3)])
def test_orthogonal_rows_or_columns_are_orthonormal(shape):
    w = np.asarray(nn.init.orthogonal_(ft.empty(*shape), gain=2.0), np.float64).reshape(shape[0], -1)
    small = min(w.shape)
    gram = w.T @ w if w.shape[0] >= w.shape[1] else w @ w.T
    np.testing.assert_allclose(gram, 4.0 * np.eye(small), atol=1e-5)
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        nn.init.orthogonal_(ft.empty(5))
    assert nn.init.orthogonal_(ft.empty(0, 3)).shape == (0, 3)  # nothing to fill, as PyTorch's


@pytest.mark.parametrize("fill", [nn.init.kaiming_uniform_, nn.init.kaiming_normal_])
def test_kaiming_reads_the_fan_mode_names_and_refuses_others(fill):
    """mode='fan_out' of a (64, 4) weight draws with std sqrt(2 / 64) (relu's gain), 'fan_in' sqrt(2 / 4); a
    misspelt mode is refused rather than read as one of them."""
    ft.manual_seed(5)
    for mode, fan in (("fan_in", 4), ("fan_out", 64)):
        w = np.asarray(fill(ft.empty(64, 4), mode=mode, nonlinearity="relu"))
        assert w.std() == pytest.approx(math.sqrt(2 / fan), rel=0.1)
    with pytest.raises(ValueError, match="mode 'fan_ot' not supported"):
        fill(ft.empty(64, 4), mode="fan_ot")


def grads_model():
    model = nn.Sequential(nn.Linear(5, 4), nn.Linear(4, 2))
    rng = np.random.default_rng(1)
    for p in model.parameters():
        p.grad = ft.tensor(rng.standard_normal(p.shape).astype(np.float32))
    return model


@pytest.mark.parametrize("norm_type", [2.0, 1.0, math.inf])
def test_clip_grad_norm_matches_its_definition(norm_type):
    model = grads_model()
    before = [np.array(p.grad) for p in model.parameters()]
    flat = np.concatenate([g.ravel() for g in before]).astype(np.float64)
    want = np.abs(flat).max() if norm_type == math.inf else np.linalg.norm(flat, norm_type)
    total = nn.utils.clip_grad_norm_(model.parameters(), 0.5, norm_type)
    assert total.item() == pytest.approx(want, rel=1e-6)
    for g, old in zip(model.parameters(), before):
        np.testing.assert_allclose(np.asarray(g.grad), old * (0.5 / (want + 1e-6)), rtol=1e-5)
    assert nn.utils.clip_grad_norm_(model.parameters(), 1e9, norm_type).item() == pytest.approx(0.5, rel=1e-5)


def test_clip_grad_norm_matches_torch():
    torch = pytest.importorskip("torch")
    model = grads_model()
    tparams = [torch.nn.Parameter(torch.zeros(p.shape)) for p in model.parameters()]
    for tp, p in zip(tparams, model.parameters()):
        tp.grad = torch.from_numpy(np.array(p.grad))
    want = torch.nn.utils.clip_grad_norm_(tparams, 0.7)
    got = nn.utils.clip_grad_norm_(model.parameters(), 0.7)
    assert got.item() == pytest.approx(want.item(), rel=1e-6)
    for tp, p in zip(tparams, model.parameters()):
        np.testing.assert_allclose(np.asarray(p.grad), tp.grad.numpy(), rtol=1e-6, atol=1e-7)


def test_clip_grad_norm_bad_input():
    model = grads_model()
    next(iter(model.parameters())).grad.fill_(float("nan"))
    with pytest.raises(RuntimeError, match="total norm"):
        nn.utils.clip_grad_norm_(model.parameters(), 1.0, error_if_nonfinite=True)
    with pytest.raises(ValueError, match="norm_type must be positive"):
        nn.utils.clip_grad_norm_(model.parameters(), 1.0, norm_type=0)


def test_clip_grad_value_and_parameter_vectors():
    a, b = nn.Parameter(ft.zeros(2, 3)), nn.Parameter(ft.zeros(4))
    a.grad = ft.tensor([[-3.0, 0.5, 2.0], [1.0, -0.25, 9.0]])
    nn.utils.clip_grad_value_([a, b], 1.0)  # b has no grad: skipped
    assert a.grad.tolist() == [[-1.0, 0.5, 1.0], [1.0, -0.25, 1.0]] and b.grad is None
    a.copy_(ft.arange(6.0).reshape(2, 3))
    v = nn.utils.parameters_to_vector([a, b])
    assert v.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 0.0, 0.0, 0.0, 0.0]
    nn.utils.vector_to_parameters(ft.arange(10.0), [a, b])
    assert a.tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]] and b.tolist() == [6.0, 7.0, 8.0, 9.0]
    with pytest.raises(ValueError, match="1-d with 10 elements"):
        nn.utils.vector_to_parameters(ft.zeros(9), [a, b])


def test_clip_grad_value_between_a_programs_backward_and_step_clips_its_update():
    """PyTorch's loop of value clipping, with a compiled program: backward, clip_grad_value_ on the .grad views of
    the program's gradients, then the optimizer's step, which reads them clipped."""
    rng = np.random.default_rng(4)
    x, y = rng.standard_normal((8, 5)).astype(np.float32) * 20, np.arange(8) % 3
    model = nn.Linear(5, 3)
    opt = ft.optim.SGD(model.parameters(), lr=0.5)
    program = model.compile(opt, nn.CrossEntropyLoss(), batch_size=8, input_shape=(5,))
    before = [p.numpy().copy() for p in model.parameters()]
    program.backward(x, y)
    grads = [p.grad.numpy().copy() for p in model.parameters()]
    assert max(np.abs(g).max() for g in grads) > 0.1  # so that the clip below changes some
    nn.utils.clip_grad_value_(model.parameters(), 0.1)
    opt.step()
    for p, w, g in zip(model.parameters(), before, grads):
        np.testing.assert_allclose(p.numpy(), w - 0.5 * np.clip(g, -0.1, 0.1), rtol=1e-6, atol=1e-7)


def test_eye_and_dirac_initialise_identities():
    w = nn.init.eye_(ft.empty(3, 5))
    np.testing.assert_array_equal(w.numpy(), np.eye(3, 5))
    k = nn.init.dirac_(ft.empty(4, 2, 3, 3), groups=2)
    x = np.random.default_rng(3).standard_normal((1, 2, 5, 5)).astype(np.float32)
    out = nn.functional.conv2d(ft.tensor(x), k, padding=1).numpy()  # the identity convolution, once per group
    np.testing.assert_allclose(out, np.concatenate([x, x], 1), rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="eye_: only 2-d"):
        nn.init.eye_(ft.empty(3))


def test_non_persistent_buffers_stay_out_of_state_dict_and_checkpoints(tmp_path):
    """register_buffer(persistent=False) as PyTorch's: moved and read like any buffer, not saved; load_state_dict
    returns (missing_keys, unexpected_keys)."""
    class Masked(ft.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = ft.nn.Linear(3, 3)
            self.register_buffer("mask", ft.tril(ft.ones(3, 3)), persistent=False)
            self.register_buffer("scale", ft.ones(3))

        def forward(self, x):
            return (self.fc(x) * self.scale) @ self.mask

    model = Masked()
    assert list(model.state_dict()) == ["scale", "fc.weight", "fc.bias"]
    assert [n for n, _ in model.named_buffers()] == ["mask", "scale"]
    path = str(tmp_path / "masked.safetensors")
    ft.save(path, model)
    assert "mask" not in ft.load(path)[0]
    again = Masked()
    again.mask.fill_(0.5)
    ft.load(path, again)  # strict: the file has every persistent tensor
    assert np.array_equal(again.fc.weight.numpy(), model.fc.weight.numpy()) and again.mask.numpy()[0, 0] == 0.5
    result = again.load_state_dict({"fc.weight": np.zeros((3, 3), np.float32), "extra": np.zeros(1)}, strict=False)
    assert result.missing_keys == ["scale", "fc.bias"] and result.unexpected_keys == ["extra"]
    missing, unexpected = result
    assert missing == result.missing_keys


def test_a_strict_load_names_what_differs_and_takes_a_state_without_batch_norm_counts(tmp_path):
    """A strict load that misses or meets other keys raises PyTorch's RuntimeError with its lines and changes
    nothing; a state without a batch norm's num_batches_tracked (older and converted PyTorch checkpoints, which
    PyTorch's strict load takes) loads, leaving the count as it is, through load_state_dict and ft.load."""
    model = ft.nn.Sequential(ft.nn.Conv2d(1, 2, 3), ft.nn.BatchNorm2d(2))
    model[1].num_batches_tracked.fill_(7)
    state = {k: v + 1 for k, v in model.state_dict().items() if k != "1.num_batches_tracked"}
    before = model.state_dict()
    with pytest.raises(RuntimeError, match="Error\\(s\\) in loading state_dict for Sequential:\n\tMissing key\\(s\\) in "
                       "state_dict: '0.bias'.\n\tUnexpected key\\(s\\) in state_dict: 'extra'."):
        model.load_state_dict({**{k: v for k, v in state.items() if k != "0.bias"}, "extra": np.zeros(1)})
    assert all(np.array_equal(v, before[k]) for k, v in model.state_dict().items())
    with pytest.raises(RuntimeError, match=r"\tsize mismatch for 0.weight: copying a param with shape \(2, 1, 2, 3\) "
                                           r"from checkpoint, the shape in current model is \(2, 1, 3, 3\).\n\tsize "
                                           r"mismatch for 0.bias: copying None"):  # PyTorch's, all listed
        model.load_state_dict({**state, "0.weight": np.zeros((2, 1, 2, 3), np.float32), "0.bias": None})
    assert all(np.array_equal(v, before[k]) for k, v in model.state_dict().items())
    assert model.load_state_dict(state) == ([], [])
    assert int(model[1].num_batches_tracked) == 7
    assert np.array_equal(model[1].running_var.numpy(), state["1.running_var"])
    path = str(tmp_path / "converted.safetensors")
    ft.save(path, ft.nn.Sequential(ft.nn.Conv2d(1, 2, 3), ft.nn.BatchNorm2d(2)))
    tensors, _ = ft.load(path)
    ft.checkpoint.save_file(path, {k: v for k, v in tensors.items() if k != "1.num_batches_tracked"})
    ft.load(path, model)
    assert int(model[1].num_batches_tracked) == 7 and np.array_equal(model[0].weight.numpy(), tensors["0.weight"])


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("side", ["right", "left"])
def test_pad_sequence_pads_each_to_the_longest(batch_first, side):
    """ft.nn.utils.rnn.pad_sequence as PyTorch's: sequences of lengths 3, 1, 0 and 4 in a (L, B, 2) (or batch first)
    block, each padded after (or before) its values; sequences of different trailing shapes are refused."""
    seqs = [np.arange(n * 2, dtype=np.float32).reshape(n, 2) + 10 * n for n in (3, 1, 0, 4)]
    got = np.asarray(nn.utils.rnn.pad_sequence([ft.tensor(s) for s in seqs], batch_first=batch_first,
                                               padding_value=-1, padding_side=side))
    want = np.full((4, 4, 2), -1, np.float32)
    for i, s in enumerate(seqs):
        if len(s):
            want[i, slice(0, len(s)) if side == "right" else slice(4 - len(s), 4)] = s
    np.testing.assert_array_equal(got, want if batch_first else want.transpose(1, 0, 2))
    with pytest.raises(ValueError, match=r"sequence 1 has shape \(2, 3\)"):
        nn.utils.rnn.pad_sequence([ft.zeros(2, 2), ft.zeros(2, 3)])
    mixed = nn.utils.rnn.pad_sequence([ft.tensor([1.5, 2.0]), ft.tensor([3])])  # the first's dtype, as PyTorch's
    assert mixed.dtype is ft.float32 and np.asarray(mixed).tolist() == [[1.5, 3.0], [2.0, 0.0]]


def weight_normed(lib, new):
    """A conv and a linear layer weight-normalized, by PyTorch's older API (weight_g, weight_v) or its
    parametrizations (parametrizations.weight.original0, original1), the linear one over the whole weight."""
    L = nn if lib is ft else lib.nn
    U = L.utils.parametrizations if new else L.utils

    class Net(L.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.fc = U.weight_norm(L.Conv2d(3, 4, 3, padding=1)), U.weight_norm(L.Linear(4, 5), dim=None)

        def forward(self, x):
            return self.fc(self.conv(x).mean((2, 3)))

    return Net()


@pytest.mark.parametrize("new", [False, True], ids=["weight_g", "parametrizations"])
def test_weight_norm_keeps_the_weight_and_trains_through_g_and_v(new):
    from fasttrain.testing import gradcheck
    ft.manual_seed(1)
    conv = nn.Conv2d(3, 4, 3)
    before = conv.weight.numpy().copy()
    normed = (nn.utils.parametrizations if new else nn.utils).weight_norm(conv)
    assert normed is conv and "weight" not in dict(conv.named_parameters())
    np.testing.assert_allclose(conv.weight.numpy(), before, rtol=1e-6, atol=1e-7)  # computed at each access
    g = conv.parametrizations.weight.original0 if new else conv.weight_g
    assert g.shape == (4, 1, 1, 1)
    np.testing.assert_allclose(g.numpy().ravel(), np.sqrt((before ** 2).reshape(4, -1).sum(1)), rtol=1e-5)
    model = weight_normed(ft, new)
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=3,
                            input_shape=(3, 5, 5))
    x = np.random.default_rng(2).standard_normal((3, 3, 5, 5)).astype(np.float32)
    np.testing.assert_allclose(program.predict(x).numpy(), model(ft.tensor(x)).numpy(), rtol=1e-5, atol=1e-6)
    assert gradcheck(program, x, np.arange(3), rtol=3e-2, atol=1e-3)


@pytest.mark.skipif(torch is None, reason="PyTorch is not installed")
@pytest.mark.parametrize("new", [False, True], ids=["weight_g", "parametrizations"])
def test_weight_norm_matches_pytorch_and_its_names(new):
    import warnings
    from _programref import assert_gradients_match
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # (PyTorch's older API is deprecated, not gone)
        tm = weight_normed(torch, new)
    model = weight_normed(ft, new)
    assert list(model.state_dict()) == list(tm.state_dict())
    model.load_state_dict({k: v.detach().numpy() for k, v in tm.state_dict().items()})
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=3,
                            input_shape=(3, 5, 5))
    x = np.random.default_rng(3).standard_normal((3, 3, 5, 5)).astype(np.float32)
    assert_gradients_match(program, tm, x, np.arange(3), torch.nn.CrossEntropyLoss())


def test_remove_weight_norm_and_spectral_norm():
    layer = nn.utils.weight_norm(nn.Linear(3, 2))
    weight = layer.weight.numpy().copy()
    assert nn.utils.remove_weight_norm(layer) is layer
    assert list(dict(layer.named_parameters())) == ["bias", "weight"]
    np.testing.assert_array_equal(layer.weight.numpy(), weight)
    with pytest.raises(ValueError, match="weight_norm of 'weight' not found in Linear"):
        nn.utils.remove_weight_norm(layer)
    for spectral in (nn.utils.spectral_norm, nn.utils.parametrizations.spectral_norm):
        with pytest.raises(NotImplementedError, match="spectral_norm of Linear.weight is not supported: its power "
                                                      "iteration updates buffers"):
            spectral(layer)
    with pytest.raises(ft.nn.TracingError, match="a value computed from parameters as the weight of embedding"):
        table = nn.utils.weight_norm(nn.Embedding(4, 3))
        table.compile(ft.optim.SGD(table.parameters(), lr=0.1), lambda out: out.sum(), batch_size=2, input_shape=(1,),
                      input_dtype=ft.int64)


RESETTABLE = {
    "Linear": lambda lib: lib.nn.Linear(30, 40),
    "Conv2d": lambda lib: lib.nn.Conv2d(6, 8, 3),
    "Conv1d": lambda lib: lib.nn.Conv1d(6, 8, 5, groups=2),
    "ConvTranspose2d": lambda lib: lib.nn.ConvTranspose2d(6, 8, 3),
    "Bilinear": lambda lib: lib.nn.Bilinear(5, 6, 7),
    "BatchNorm2d": lambda lib: lib.nn.BatchNorm2d(4),
    "LayerNorm": lambda lib: lib.nn.LayerNorm(8),
    "GroupNorm": lambda lib: lib.nn.GroupNorm(2, 8),
    "RMSNorm": lambda lib: lib.nn.RMSNorm(8),
    "Embedding": lambda lib: lib.nn.Embedding(50, 8, padding_idx=3),
    "EmbeddingBag": lambda lib: lib.nn.EmbeddingBag(50, 8, mode="sum"),
    "PReLU": lambda lib: lib.nn.PReLU(4, 0.1),
    "LSTM": lambda lib: lib.nn.LSTM(5, 16, 2, bidirectional=True),
    "GRUCell": lambda lib: lib.nn.GRUCell(5, 16),
}


@pytest.mark.parametrize("name", list(RESETTABLE))
def test_reset_parameters_draws_the_initialisation_again(name):
    """layer.reset_parameters() (which PyTorch's layers have, and re-initialising loops call where hasattr finds it)
    gives from one seed the values construction gave, buffers included; a batch norm's reset_running_stats()
    restores its statistics."""
    ft.manual_seed(5)
    layer = RESETTABLE[name](ft)
    made = {k: np.array(v) for k, v in layer.state_dict().items()}
    with ft.no_grad():
        for t in (*layer.parameters(), *layer.buffers()):
            t.fill_(7)
    ft.manual_seed(5)
    layer.reset_parameters()
    for k, v in layer.state_dict().items():
        np.testing.assert_array_equal(np.array(v), made[k], err_msg=k)
    if torch is not None:
        assert hasattr(RESETTABLE[name](torch), "reset_parameters")
    if name == "BatchNorm2d":
        layer.running_mean.fill_(2)
        layer.num_batches_tracked.fill_(3)
        layer.reset_running_stats()
        assert not layer.running_mean.numpy().any() and (layer.running_var.numpy() == 1).all()
        assert int(layer.num_batches_tracked) == 0
