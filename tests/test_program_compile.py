"""What model.compile makes of a model: the conv bias that batch norm cancels is dropped (and kept before a
padded average pool), ReLUs are fused into the layer before them, summary() of a compiled program and of a
model before compiling, and a model compiled again after zero_grad."""
import numpy as np
import pytest

import fasttrain as ft
from _programref import (CLASSES, assert_grad_close, batch, bn_f, ce_f, compile_resnet, conv_f, grads_of,
                         make_resnet, params_of, ref_net, set_params)

nn = ft.nn


# ---------------------------------------------------------------- the dropped conv bias

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


def test_a_batch_larger_than_compiled_with_batch_norm_warns_once():
    """A batch of 16 on a program compiled for 8 trains as two micro-batches: with a batch norm in training mode
    each is normalized by its own statistics, which differs from a step of 16 at once: one warning says so (a batch
    of the compiled size, or no batch norm, none)."""
    import warnings
    x, y = batch(16, seed=2)
    model = big_bias_net()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=8,
                            input_shape=(3, 8, 8))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        program.train_step(x[:8], y[:8])
    with pytest.warns(UserWarning, match=r"a batch of 16 samples trains as micro-batches of at most 8 .* \(compile "
                                         r"with batch_size=16") as record:
        program.train_step(x, y)
        program.backward(x, y)
    assert len(record) == 1 and record[0].filename == __file__
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=8,
                            input_shape=(3, 8, 8))
    images = (x.transpose(0, 2, 3, 1) * 255).clip(0, 255).astype(np.uint8)
    with pytest.warns(UserWarning, match=r"a batch of 16 samples trains as micro-batches of at most 8") as record:
        ft.fit(program, ft.data.Loader((images, y), batch_size=16), progress=False)  # a Loader's batches in fit too
    assert len(record) == 1 and record[0].filename == __file__
    plain = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, CLASSES))
    program = plain.compile(ft.optim.SGD(plain.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=8,
                            input_shape=(3, 8, 8))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        program.train_step(x, y)


def test_a_split_leaving_one_sample_to_batch_norm1d_is_refused_before_any_change():
    """A batch of 9 on a program compiled for 4 runs as micro-batches of 4, 4 and 1: BatchNorm1d cannot normalize
    a single sample's features (PyTorch raises for a batch of 1 too), so the step is refused before it runs, naming
    the split, with the weights as they were; BatchNorm2d normalizes one image's pixels, and 9 runs."""
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(9, 6)).astype(np.float32), np.arange(9) % 3
    model = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=4,
                            input_shape=(6,))
    before = params_of(model)
    with pytest.raises(ValueError, match=r"micro-batches of 4, the last of 1 sample.*batch_size=9"):
        program.train_step(x, y)
    for name, value in params_of(model).items():
        np.testing.assert_array_equal(value, before[name])
    with pytest.warns(UserWarning, match="micro-batches"):
        assert np.isfinite(program.train_step(x[:8], y[:8]))
    images = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Flatten(), nn.Linear(2 * 4 * 4, 3))
    program = images.compile(ft.optim.SGD(images.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=4,
                             input_shape=(1, 6, 6))
    with pytest.warns(UserWarning, match="micro-batches"):
        assert np.isfinite(program.train_step(rng.normal(size=(9, 1, 6, 6)).astype(np.float32), y))


def test_a_last_batch_of_one_sample_for_batch_norm1d_is_refused_or_dropped():
    """ft.fit on 9 samples in batches of 4 ends on a batch of 1, which BatchNorm1d cannot normalize (PyTorch
    raises there too): refused with the way out, and fit(..., drop_last=True) trains on the two full batches per
    epoch; drop_last with a loader of its own batches is refused."""
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(9, 6)).astype(np.float32), np.arange(9) % 3
    model = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=4,
                            input_shape=(6,))
    with pytest.raises(ValueError, match=r"a batch of 1 sample, which a batch norm .*drop_last=True"):
        program.train_step(x[:1], y[:1])
    with pytest.raises(ValueError, match="a batch of 1 sample"):
        ft.fit(program, (x, y), epochs=1, progress=False)
    seen = []
    history = ft.fit(program, (x, y), epochs=2, progress=False, drop_last=True,
                     step_callbacks=[lambda step, metrics: seen.append(step)])
    assert len(seen) == 4 and all(np.isfinite(history["train_loss"]))
    with pytest.raises(ValueError, match="drop_last applies to"):
        ft.fit(program, [(x[:4], y[:4])], drop_last=True, progress=False)
    with pytest.raises(ValueError, match="micro-batches of 4, the last of 1 sample"):  # batches of 5 split 4 + 1
        ft.fit(program, (x, y), batch_size=5, drop_last=True, progress=False)


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


# ---------------------------------------------------------------- summary

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
    assert "bias folded" in by[1] and "bias folded" not in by[3] and "bias folded" not in by[6]
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
    assert "bias folded" in convs[0]  # max pooling commutes with a per-channel constant
    assert "bias folded" not in convs[1] and "relu fused" in convs[1]  # a ReLU stands between it and the BN
    assert "relu fused" in [r for r in rows if r.split()[1] == "BatchNorm2d"][0]


def test_model_summary_before_compiling():
    ft.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                          nn.Linear(4 * 8 * 8, CLASSES))
    bias = model[0].bias.numpy().copy()
    text = model.summary((1, 8, 8), batch_size=2)
    assert "bias folded" in text and "relu fused" in text
    assert f"parameters: {sum(p.numel() for p in model.parameters()):,}" in text
    assert "MFLOP" in text and "(4, 8, 8)" in text
    np.testing.assert_array_equal(model[0].bias.numpy(), bias)  # summary changes nothing


# ---------------------------------------------------------------- compiling again

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


def test_compile_refuses_a_model_left_in_eval_mode():
    """Every batch norm and dropout would be frozen in the training step: almost always an .eval() left behind."""
    m = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Dropout(0.5), nn.Linear(144, 5))
    m.eval()
    with pytest.raises(ValueError, match=r"compile: the model is in eval mode .*call \.train\(\) first"):
        m.compile(ft.optim.SGD(m.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=2, input_shape=(3, 8, 8))
    m.train()
    m.compile(ft.optim.SGD(m.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=2, input_shape=(3, 8, 8))


def test_layers_put_in_eval_mode_stay_frozen_in_the_training_step():
    """A batch norm in eval mode normalizes by its running statistics and leaves them as they are, and a dropout in
    eval mode is the identity, in the step too (a frozen teacher, frozen batch norms): the step is the function
    written in NumPy, the conv bias before such a batch norm trains, and ft.fit keeps those layers in eval mode."""
    ft.manual_seed(13)
    m = nn.Sequential(nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3), nn.Flatten(), nn.Dropout(0.5), nn.Linear(12, 2))
    rng = np.random.default_rng(14)
    m[1].running_mean.copy_(rng.standard_normal(3).astype(np.float32))
    m[1].running_var.copy_(rng.uniform(0.5, 2.0, 3).astype(np.float32))
    m[1].eval(), m[3].eval()
    program = m.compile(ft.optim.SGD(m.parameters(), lr=0.1), nn.MSELoss(), batch_size=2, input_shape=(2, 4, 4))
    x, y = rng.standard_normal((2, 2, 4, 4)).astype(np.float32), rng.standard_normal((2, 2)).astype(np.float32)
    w, b = m[0].weight.numpy().astype(np.float64), m[0].bias.numpy().astype(np.float64)
    stats = m[1].running_mean.numpy().copy(), m[1].running_var.numpy().copy()
    win = np.lib.stride_tricks.sliding_window_view(x, (3, 3), axis=(2, 3))
    h = np.einsum("nchwij,kcij->nkhw", win, w) + b[:, None, None]
    scale = m[1].weight.numpy() / np.sqrt(stats[1] + 1e-5)
    h = (h - stats[0][:, None, None]) * scale[:, None, None] + m[1].bias.numpy()[:, None, None]
    head = m[4].weight.numpy().astype(np.float64)  # before the step updates it
    out = h.reshape(2, -1) @ head.T + m[4].bias.numpy()
    assert program.train_step(x, y) == pytest.approx(((out - y) ** 2).mean(), rel=1e-5)
    dout = 2 * (out - y) / out.size  # back to the conv bias through the fixed scale
    want_db = ((dout @ head).reshape(2, 3, 2, 2) * scale[:, None, None]).sum((0, 2, 3))
    np.testing.assert_allclose(m[0].bias.grad.numpy(), want_db, rtol=1e-4, atol=1e-7)
    np.testing.assert_array_equal(m[1].running_mean.numpy(), stats[0])  # not updated
    ft.fit(program, (x, y), epochs=1, progress=False)
    assert m.training and not m[1].training and not m[3].training
    m[1].train()
    with pytest.raises(ValueError, match=r"BatchNorm2d '[0-9.]*' is in training mode, but was in eval mode at compile"):
        program.train_step(x, y)


def test_memory_formats_as_pytorch_names_them():
    """model.to(memory_format=ft.channels_last) (a PyTorch speed guide's line) and compile(memory_format=) with
    ft.channels_last or ft.contiguous_format choose the program's layout; a model whose LayerNorm reads (C, H, W)
    samples in order, which channels_last would move, takes the preference as contiguous. Tensors lay themselves
    out so, as PyTorch's."""
    def conv():
        return nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(24, 2))

    def run(model, **kw):
        return model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=2,
                             input_shape=(3, 4, 5), **kw).memory_format

    assert run(conv()) == "channels_last" and run(conv().to(memory_format=ft.contiguous_format)) == "contiguous"
    assert run(conv(), memory_format=ft.contiguous_format) == "contiguous"
    normed = nn.Sequential(nn.Conv2d(3, 4, 3), nn.LayerNorm((4, 2, 3)), nn.Flatten(), nn.Linear(24, 2))
    assert run(normed.to(memory_format=ft.channels_last)) == "contiguous"
    with pytest.raises(ValueError, match="memory_format must be ft.channels_last"):
        conv().to(memory_format="nhwc")
    x = ft.tensor(np.arange(120, dtype=np.float32).reshape(2, 3, 4, 5))
    y = x.to(memory_format=ft.channels_last)
    assert y.stride() == (60, 1, 15, 3) and y.is_contiguous(memory_format=ft.channels_last)
    assert np.array_equal(y.numpy(), x.numpy()) and y.contiguous().is_contiguous()
    assert x.contiguous(memory_format=ft.channels_last).stride() == (60, 1, 15, 3)


def test_what_compile_fixed_changing_afterwards_is_refused_not_ignored():
    """Freezing a layer, putting a batch norm in eval mode or setting the program's precision, batch size or
    accumulation after compile would not reach the compiled step (the program reported the precision set)."""
    m = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(144, 5))
    program = m.compile(ft.optim.SGD(m.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=2,
                        input_shape=(3, 8, 8))
    x, y = np.ones((2, 3, 8, 8), np.float32), np.array([0, 1])
    m[0].requires_grad_(False)
    before = m[0].weight.numpy().copy()
    for step in (program.train_step, program.backward, lambda x, y: ft.fit(program, (x, y), progress=False)):
        with pytest.raises(ValueError, match=r"0.weight.requires_grad became False after compile.*compile again"):
            step(x, y)
    np.testing.assert_array_equal(m[0].weight.numpy(), before)
    predicted = program.predict(x).numpy()  # inference reads the weights whichever train
    np.testing.assert_allclose(predicted, m.eval()(ft.tensor(x)).numpy(), rtol=1e-5, atol=1e-6)
    assert program.evaluate(x, y)[0] > 0
    m.train()
    m[0].requires_grad_(True)
    m[1].eval()
    with pytest.raises(ValueError, match=r"^BatchNorm2d '[0-9.]*' is in eval mode, but was in training mode at "
                       r"compile"):
        program.train_step(x, y)
    m.train()
    program.train_step(x, y)
    assert not np.array_equal(m[0].weight.numpy(), before)
    for name, value in (("precision", "bf16-mixed"), ("batch_size", 4), ("accumulate_steps", 2),
                        ("model", nn.Linear(2, 2)), ("loss", nn.MSELoss())):
        kept = getattr(program, name)
        with pytest.raises(AttributeError, match=rf"program.{name} is fixed at compile .*compile the model again "
                                                 rf"with {name}="):
            setattr(program, name, value)
        assert getattr(program, name) == kept
    m[1].momentum = 0.5  # a node's hyperparameter: the step would keep 0.1
    with pytest.raises(ValueError, match=r"BatchNorm2d.momentum changed from 0.1 to 0.5 after compile"):
        program.train_step(x, y)
    m[1].momentum = 0.1
    d = nn.Sequential(nn.Flatten(), nn.Dropout(0.9), nn.Linear(192, 5))
    dropped = d.compile(ft.optim.SGD(d.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=2,
                        input_shape=(3, 8, 8))
    d[1].p = 0.0
    with pytest.raises(ValueError, match=r"Dropout.p changed from 0.9 to 0.0 after compile"):
        ft.fit(dropped, (x, y), progress=False)


class ModeReading(nn.Module):
    """Dropout by the forward's own reading of the mode, and an LSTM's dropout between its layers."""

    def __init__(self):
        super().__init__()
        self.rnn, self.head = nn.LSTM(4, 6, num_layers=2, dropout=0.5, batch_first=True), nn.Linear(6, 3)

    def forward(self, x):
        h = self.rnn(x)[0][:, -1]
        return self.head(nn.functional.dropout(h, 0.5, self.training))


@pytest.mark.parametrize("changed", ["model", "rnn"])
def test_a_mode_the_training_step_reads_changing_after_compile_is_refused(changed):
    """F.dropout(h, p, self.training) and an LSTM's dropout=: a module put in eval mode after compile (or back in
    training mode) would keep dropping (or not) in the compiled step; the step is refused, and goes on once the mode
    is back. An RNN without dropout runs alike in both modes."""
    x, y = np.ones((2, 5, 4), np.float32), np.array([0, 1])
    m = ModeReading()
    program = m.compile(ft.optim.SGD(m.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=2,
                        input_shape=(5, 4))
    module = m if changed == "model" else m.rnn
    module.eval()
    m.rnn.train(changed == "model")
    name = "ModeReading" if changed == "model" else "LSTM 'rnn'"
    with pytest.raises(ValueError, match=f"^{name} is in eval mode, but was in training mode at compile"):
        program.train_step(x, y)
    m.train()
    program.train_step(x, y)
    m.rnn.eval()
    frozen = m.compile(ft.optim.SGD(m.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=2,
                       input_shape=(5, 4)) if changed == "rnn" else None
    if frozen is not None:
        m.rnn.train()
        with pytest.raises(ValueError, match="^LSTM 'rnn' is in training mode, but was in eval mode at compile"):
            frozen.train_step(x, y)
    plain = nn.LSTM(4, 6, batch_first=True)
    steps = plain.compile(ft.optim.SGD(plain.parameters(), lr=0.1), lambda out: out[0].mean(), batch_size=2,
                          input_shape=(5, 4))
    plain.eval()
    steps.train_step(x, None)


def test_a_forward_may_return_nested_tuples_and_a_dict_or_merged_rows_say_what_to_return():
    """An LSTM's (out, (h, c)) compiles as it is (predict returns out, the loss gets the whole); a dict, and scores
    merged with the batch (logits.view(-1, C)), are refused with what to return instead."""
    x = np.random.default_rng(3).standard_normal((2, 5, 4)).astype(np.float32)
    rnn = nn.LSTM(4, 6, batch_first=True)
    program = rnn.compile(ft.optim.SGD(rnn.parameters(), lr=0.1),
                          lambda out: out[0].mean() + out[1][0][-1].pow(2).mean() + out[1][1][-1].abs().mean(),
                          batch_size=2, input_shape=(5, 4))
    out, (h, c) = rnn(ft.tensor(x))
    np.testing.assert_allclose(program.predict(x).numpy(), out.numpy(), rtol=1e-5, atol=1e-6)
    want = out.numpy().mean() + (h.numpy()[-1] ** 2).mean() + np.abs(c.numpy()[-1]).mean()
    assert program.evaluate(x, None)[0] == pytest.approx(want, rel=1e-5)

    class Returns(nn.Module):
        def __init__(self, how):
            super().__init__()
            self.how, self.fc = how, nn.Linear(4, 3)

        def forward(self, x):
            z = self.fc(x)
            return {"logits": z} if self.how == "dict" else z.view(-1, 3) if self.how == "rows" else (z, 2.0)

    for how, message in (("dict", r"returned a dict: return a tuple \(or a namedtuple\)"),
                         ("rows", r"returned scores merged with the batch \(x.view\(-1, C\)\): return the "
                                  r"\(N, T, C\) scores and view them in the loss"),
                         ("number", r"returned a tuple holding a float: return the output")):
        m = Returns(how)
        with pytest.raises(ft.nn.TracingError, match=f"Returns.forward {message}"):
            m.compile(ft.optim.SGD(m.parameters(), lr=0.1), lambda out: out[0].mean(), batch_size=2,
                      input_shape=(5, 4))


def test_a_parameter_replaced_after_compile_is_refused_by_every_call():
    m = nn.Sequential(nn.Flatten(), nn.Linear(12, 3))
    program = m.compile(ft.optim.SGD(m.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=2,
                        input_shape=(3, 4))
    x, y = np.ones((2, 3, 4), np.float32), np.array([0, 1])
    m[1].weight = nn.Parameter(ft.zeros(3, 12))
    for call in (program.train_step, program.evaluate, lambda x, y: program.predict(x),
                 lambda x, y: ft.evaluate(program, (x, y))):
        with pytest.raises(ValueError, match=r"1\.weight was replaced after compile .*\.copy_\(\)"):
            call(x, y)
    m[1].extra = nn.Linear(2, 2)
    with pytest.raises(ValueError, match=r"parameters changed after compile \(added \['1\.extra\.bias', "
                                         r"'1\.extra\.weight'\], removed \[\]\)"):
        program.predict(x)


def test_a_buffer_replaced_after_compile_is_refused():
    """A batch norm's running mean or a loss's class weights rebound to new tensors would be read by nothing (the
    program keeps the ones it compiled, so predict and the eager model would disagree): refused as a parameter's
    replacement is; copied in place, they are what the program reads."""
    m = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))
    loss = nn.CrossEntropyLoss(weight=ft.ones(3))
    program = m.compile(ft.optim.SGD(m.parameters(), lr=0.1), loss, batch_size=4, input_shape=(4,))
    x, y = np.random.default_rng(5).standard_normal((4, 4)).astype(np.float32), np.array([0, 1, 2, 0])
    program.train_step(x, y)
    m[1].running_mean = ft.zeros(3)
    with pytest.raises(ValueError, match=r"1\.running_mean was replaced after compile by a new tensor"):
        program.predict(x)
    m[1].running_mean = None
    with pytest.raises(ValueError, match=r"1\.running_mean was replaced after compile by None"):
        program.train_step(x, y)
    m = nn.Linear(4, 3)
    program = m.compile(ft.optim.SGD(m.parameters(), lr=0.0), loss, batch_size=4, input_shape=(4,))
    compiled = loss.weight
    loss.weight = ft.tensor([1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match=r"loss\.weight was replaced after compile"):
        program.train_step(x, y)
    loss.weight = compiled
    loss.weight.copy_(ft.tensor([1.0, 2.0, 3.0]))
    logits = program.predict(x).numpy().astype(np.float64)
    nll = np.log(np.exp(logits).sum(1)) - logits[np.arange(4), y]
    w = np.array([1.0, 2.0, 3.0])[y]
    np.testing.assert_allclose(program.train_step(x, y), (w * nll).sum() / w.sum(), rtol=1e-5)

    """compile moves such a conv's bias into the batch norm's running mean; a bias loaded afterwards (PyTorch weights
    loaded into a compiled model) is moved too before the program runs, so eval outputs are the loaded model's."""
    ft.manual_seed(3)
    m = nn.Sequential(nn.Conv2d(2, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4 * 4 * 4, 3))
    x = np.random.default_rng(4).standard_normal((2, 2, 6, 6)).astype(np.float32)
    rng = np.random.default_rng(5)
    loaded = {k: np.asarray(v) + rng.standard_normal(np.shape(v)).astype(np.asarray(v).dtype)
              for k, v in m.state_dict().items() if k != "1.num_batches_tracked"}
    loaded["1.running_var"] = np.abs(loaded["1.running_var"]) + 0.5
    program = m.compile(ft.optim.SGD(m.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=2,
                        input_shape=(2, 6, 6))
    m.load_state_dict(loaded, strict=False)
    # the loaded model's eval output in NumPy: conv + bias, then the running statistics
    w, b = loaded["0.weight"], loaded["0.bias"]
    win = np.lib.stride_tricks.sliding_window_view(x, (3, 3), axis=(2, 3))  # (N, C, 4, 4, 3, 3)
    h = np.einsum("nchwij,kcij->nkhw", win, w) + b[:, None, None]
    h = (h - loaded["1.running_mean"][:, None, None]) / np.sqrt(loaded["1.running_var"][:, None, None] + 1e-5)
    h = h * loaded["1.weight"][:, None, None] + loaded["1.bias"][:, None, None]
    want = h.reshape(2, -1) @ loaded["3.weight"].T + loaded["3.bias"]
    np.testing.assert_allclose(program.predict(x).numpy(), want, rtol=1e-4, atol=1e-4)
    assert not m[0].bias.numpy().any()  # moved into the running mean again



# ---------------------------------------------------------------- layouts

class Decoder(nn.Module):
    """A linear layer's values viewed as maps, then convolutions (a GAN's generator, a VAE's decoder), and maps
    flattened back."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 8 * 3 * 3)
        self.up = nn.ConvTranspose2d(8, 4, 4, 2, 1)
        self.conv = nn.Conv2d(4, 5, 3, padding=1)
        self.out = nn.Linear(5 * 6 * 6, 3)

    def forward(self, z):
        h = self.up(self.fc(z).view(-1, 8, 3, 3)).tanh()
        return self.out(self.conv(h).flatten(1))


def test_values_viewed_as_maps_are_laid_out_as_the_convolutions_read_them():
    """In a channels-last program the view of a vector as maps copies it into channels-last order, so that the
    convolutions read one layout (in two layouts oneDNN's reference convolution runs, hundreds of times slower);
    the loss and every gradient are those of the contiguous program, and of finite differences."""
    x = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)
    y = np.array([0, 2, 1, 2])
    runs = []
    for memory_format in ("channels_last", "contiguous"):
        ft.manual_seed(3)
        model = Decoder()
        program = model.compile(ft.optim.SGD(model.parameters(), lr=0.0), nn.CrossEntropyLoss(), batch_size=4,
                                input_shape=(6,), memory_format=memory_format)
        runs.append((program.backward(x, y), grads_of(model)))
    (loss, grads), (want_loss, want) = runs
    np.testing.assert_allclose(loss, want_loss, rtol=1e-6)
    for name, g in want.items():
        np.testing.assert_allclose(grads[name], g, rtol=1e-5, atol=1e-6, err_msg=name)
    ft.manual_seed(3)
    ft.testing.gradcheck(Decoder(), x, y)


@pytest.mark.parametrize("frozen", [False, True])
def test_a_batch_norm_without_running_statistics_normalizes_by_the_batch_in_eval_mode_too(frozen):
    """BatchNorm2d(track_running_stats=False), as PyTorch: the batch's statistics in predict and evaluate, and in
    a step whether the layer is in training or eval mode (its gradient through them, against finite
    differences)."""
    from fasttrain.testing import gradcheck
    ft.manual_seed(5)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, bias=False), nn.BatchNorm2d(4, track_running_stats=False),
                          nn.Flatten(), nn.Linear(4 * 4 * 4, 3))
    if frozen:
        model[1].eval()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=4,
                            input_shape=(3, 6, 6), memory_format="contiguous")
    x = np.random.default_rng(6).standard_normal((4, 3, 6, 6)).astype(np.float32)
    h = model[0](ft.tensor(x)).numpy().astype(np.float64)
    norm = (h - h.mean((0, 2, 3), keepdims=True)) / np.sqrt(h.var((0, 2, 3), keepdims=True) + 1e-5)
    norm = norm * model[1].weight.numpy()[:, None, None] + model[1].bias.numpy()[:, None, None]
    want = norm.reshape(4, -1) @ model[3].weight.numpy().T + model[3].bias.numpy()
    np.testing.assert_allclose(program.predict(x).numpy(), want, rtol=1e-4, atol=1e-5)
    assert gradcheck(program, x, np.arange(4) % 3)


class ConvNeXtBlock(nn.Module):
    """ConvNeXt's block: a depthwise convolution, then LayerNorm and Linear layers over the channels of
    x.permute(0, 2, 3, 1)."""

    def __init__(self, dim):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pw1, self.pw2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        y = self.dwconv(x).permute(0, 2, 3, 1)
        return x + self.pw2(ft.nn.functional.gelu(self.pw1(self.norm(y)))).permute(0, 3, 1, 2)


def test_a_convnext_block_compiles_by_default_and_refuses_channels_last_by_name():
    """The default memory format is channels_last unless a LayerNorm or Linear reads 3-d samples in their own
    order: a ConvNeXt block compiles without saying so, with finite-difference gradients, and an explicit
    channels_last names the layer."""
    from fasttrain.testing import gradcheck
    ft.manual_seed(7)
    model = nn.Sequential(nn.Conv2d(3, 4, 2, 2), ConvNeXtBlock(4), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(4, 3))
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=2, input_shape=(3, 8, 8))
    x = np.random.default_rng(8).standard_normal((2, 3, 8, 8)).astype(np.float32)
    assert gradcheck(program, x, np.array([0, 2]))
    with pytest.raises(ValueError, match=r"a LayerNorm over 3-d samples of shape \(4, 4, 4\) .* needs "
                                         r"memory_format='contiguous'"):
        model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=2, input_shape=(3, 8, 8),
                      memory_format="channels_last")


def test_attributes_a_forward_rebinds_are_put_back_and_state_it_would_carry_is_refused():
    """A traced forward's plain attributes: values kept to look at (d2l's self.attention_weights, as a tensor left by
    an eager call before, a new list of them, an entry of a list) are put back as they were before compile, not left
    traced objects; an attribute the forward reads and rebinds to a value it computes (a running statistic kept by
    hand, an RNN state carried across batches, as a tensor or a tuple of them), which each step would carry to the
    next, is refused; a number it sets (a shape it keeps) stays."""
    class Net(nn.Module):
        def __init__(self, kind):
            super().__init__()
            self.lin, self.kind, self.kept = nn.Linear(4, 3), kind, [None]
            self.moving, self.pair = ft.zeros(3), (ft.zeros(3), ft.ones(3))

        def forward(self, x):
            y = self.lin(x)
            self.features = x.size(1)
            if self.kind == "look":
                self.attention_weights = ft.softmax(y, -1)
                self.kept[0] = y
                self.layers = [[y], {"w": y}]
            elif self.kind == "moving":  # PyTorch's moves with every step; a compiled one would read zeros forever
                self.moving = 0.9 * self.moving + 0.1 * self.lin.bias.detach()
            elif self.kind == "state":
                y = y + self.state
                self.state = y
            elif self.kind == "pair":  # a running mean and square, kept together
                self.pair = (0.9 * self.pair[0] + 0.1 * self.lin.bias.detach(), self.pair[1])
            return y

    x, y = np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32), np.arange(4) % 3

    def compiled(model):
        return model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=4,
                             input_shape=(4,))

    model = Net("look")
    model(ft.tensor(x))  # an eager call first (the dry run of lazy layers), which binds a tensor of the same shape
    eager = model.attention_weights
    program = compiled(model)
    assert model.attention_weights is eager and model.kept[0].shape == (4, 3) and model.features == 4
    assert all(isinstance(v, ft.Tensor) for v in (model.layers[0][0], model.layers[1]["w"]))
    program.train_step(x, y)
    model = Net("look")
    compiled(model)
    assert not hasattr(model, "attention_weights") and model.kept == [None] and not hasattr(model, "layers")
    for kind, name in (("moving", "Net.moving"), ("state", "Net.state"), ("pair", "Net.pair")):
        model = Net(kind)
        model.state = ft.zeros(3)
        with pytest.raises(ft.nn.TracingError, match=f"forward reads {name} and rebinds it to a value computed in "
                                                     "the traced forward: a compiled step runs no Python"):
            compiled(model)
        assert model.state.shape == (3,) and isinstance(model.pair[0], ft.Tensor)  # as they were


def test_lazy_layers_take_their_size_from_a_dry_run_then_compile():
    """d2l 1.0's models are made of lazy layers: the first (eager) call gives each its input size and parameters,
    initialised as the layer's constructor does, in its training mode, and the model compiles and trains as the one
    of the sized layers; compiled before that call, it is refused with PyTorch's rule."""
    def lazy():
        return nn.Sequential(nn.LazyConv2d(4, 3, padding=1), nn.LazyBatchNorm2d(), nn.ReLU(), nn.Flatten(),
                             nn.LazyLinear(5))

    x = np.random.default_rng(0).standard_normal((4, 3, 6, 6)).astype(np.float32)
    with pytest.raises(ft.nn.TracingError, match="LazyConv2d before its first call cannot be compiled .* run the "
                                                 "model once on a batch"):
        m = lazy()
        m.compile(ft.optim.SGD([ft.nn.Parameter(ft.zeros(1))], lr=0.1), nn.CrossEntropyLoss(), batch_size=4,
                  input_shape=(3, 6, 6))
    ft.manual_seed(5)
    m = lazy()
    m[1].eval()
    m(ft.tensor(x))
    assert [type(c).__name__ for c in m] == ["Conv2d", "BatchNorm2d", "ReLU", "Flatten", "Linear"]
    assert (m[0].in_channels, m[1].num_features, m[4].in_features) == (3, 4, 4 * 36)
    assert not m[1].training and m[0].training
    assert np.abs(m[4].weight.numpy()).max() <= 1 / 12  # PyTorch's bound 1 / sqrt(in_features)
    ft.manual_seed(5)
    sized = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(144, 5))
    for a, b in zip(m.parameters(), sized.parameters()):  # the same draws, in the same order
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    late = nn.Sequential(nn.Flatten(), nn.LazyLinear(8), nn.ReLU(), nn.Linear(8, 5))
    optimizer = ft.optim.SGD(late.parameters(), lr=0.1)  # before the dry run: it lacks the lazy layer's parameters
    late(ft.tensor(x))
    with pytest.raises(ValueError, match="the optimizer lacks the parameters of 1, a lazy layer that its first call "
                                         "sized after the optimizer was made"):
        late.compile(optimizer, nn.CrossEntropyLoss(), batch_size=4, input_shape=(3, 6, 6))
    grouped = nn.LazyConv2d(4, 3, groups=2)  # checked when sized, with the input's channels
    assert grouped(ft.randn(1, 2, 5, 5)).shape == (1, 4, 3, 3)
    with pytest.raises(ValueError, match="divisible by groups"):
        nn.LazyConv2d(4, 3, groups=2)(ft.randn(1, 3, 5, 5))
    m[1].train()
    losses = [net.compile(ft.optim.SGD(net.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=4,
                          input_shape=(3, 6, 6)).train_step(x, np.arange(4) % 5) for net in (m, sized)]
    assert losses[0] == losses[1]
