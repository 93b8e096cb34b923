"""Eval mode and the training loops: batch norm's running statistics after training forwards, predict and
evaluate against a float64 NumPy eval forward (and torch when importable), flip test-time augmentation, ft.fit
over the C loader against train_step with the schedule's closed form, and a short Fashion-MNIST run fed by the C
loader or by a Python iterable."""
import numpy as np
import pytest

import fasttrain as ft
from _opref import torch
from _programref import (CLASSES, SMOOTHING, batch, ce_f, compile_resnet, make_resnet, needs_torch, params_of,
                         ref_net, ref_predict, set_params, state_bits, torch_resnet)

nn = ft.nn
F = nn.functional


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
    """A conv bias that a batch norm cancels is dropped at compile time and moved into the running mean (bias 0,
    running mean - bias): the saved model, its running statistics and the compiled program's eval-mode forward
    describe the function PyTorch trains with the bias in place, before and after a step."""
    model = make_resnet(seed=4)
    sd = {k: v.copy() for k, v in model.state_dict().items()}
    bias = sd["conv2d.bias"]
    assert np.abs(bias).max() > 0.01  # PyTorch's default initialisation
    sd["batch_norm2d.running_mean"] = np.linspace(-1, 1, len(bias)).astype(np.float32)  # a pretrained model's
    model.load_state_dict(sd)
    program = compile_resnet(model)
    ours = model.state_dict()
    assert np.abs(ours["conv2d.bias"]).max() == 0
    np.testing.assert_allclose(ours["batch_norm2d.running_mean"], sd["batch_norm2d.running_mean"] - bias,
                               rtol=1e-6, atol=1e-7)
    xt, _ = batch(6, seed=6)
    np.testing.assert_allclose(program.predict(xt).numpy(), ref_predict(sd, xt), rtol=1e-4, atol=1e-5)
    x, y = batch(8, seed=5)
    _, _, stats, _ = ref_net({k: v.astype(np.float64) for k, v in sd.items()}, x, y)  # the batch mean holds the bias
    program.backward(x, y)
    for name, batch_value in zip(("running_mean", "running_var"), stats):
        sd[f"batch_norm2d.{name}"] = 0.9 * sd[f"batch_norm2d.{name}"] + 0.1 * batch_value
    np.testing.assert_allclose(model.state_dict()["batch_norm2d.running_mean"],
                               sd["batch_norm2d.running_mean"] - bias, rtol=1e-4, atol=1e-6)
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


@pytest.mark.parametrize("reduction", ["sum", "mean", "sums combined"])
def test_evaluate_of_a_split_does_not_depend_on_its_batches(reduction):
    """A loss summed over the batch is the split's sum, a mean the mean over it: as over one batch of the whole
    split, whatever batches a loader cuts it into (a sum's was the batch sums weighed by their samples, growing
    with the batch size)."""
    ft.manual_seed(4)
    model = ft.nn.Sequential(ft.nn.Linear(8, 16), ft.nn.ReLU(), ft.nn.Linear(16, 3))
    F = ft.nn.functional
    loss = (lambda o, y: 0.5 * F.cross_entropy(o, y, reduction="sum") + F.cross_entropy(o, y, reduction="sum")) \
        if reduction == "sums combined" else ft.nn.CrossEntropyLoss(reduction=reduction)
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), loss, batch_size=10, input_shape=(8,))
    rng = np.random.default_rng(5)
    x, y = rng.standard_normal((23, 8)).astype(np.float32), rng.integers(0, 3, 23)
    want = ce_f(program.predict(x).numpy().astype(np.float64), y, 0.0)[0] * {"sum": 23, "sums combined": 34.5}.get(
        reduction, 1)
    assert program.evaluate(x, y)[0] == pytest.approx(want, rel=1e-5)
    for size in (4, 10, 23):
        loss, _ = ft.evaluate(program, ft.data.Loader((x, y), batch_size=size))
        assert loss == pytest.approx(want, rel=1e-5)
        assert ft.evaluate(program, [(x[i:i + size], y[i:i + size]) for i in range(0, 23, size)])[0] == \
            pytest.approx(want, rel=1e-5)


def test_predict_one_unbatched_sample():
    """One sample of the input shape (a NumPy array or a tensor) gives its output alone, without the batch dimension;
    a batch gives the batch's outputs, as before; an empty batch an empty one, as PyTorch's forward (training on
    one is refused)."""
    model = make_resnet(seed=6)
    set_params(model, {"conv2d.bias": np.zeros(6)})
    program = compile_resnet(model)
    x, _ = batch(5, seed=8)
    want = ref_predict(model.state_dict(), x)
    for sample in (x[3], ft.from_numpy(np.ascontiguousarray(x[3]))):
        one = program.predict(sample)
        assert one.shape == (CLASSES,)
        np.testing.assert_allclose(one.numpy(), want[3], rtol=1e-4, atol=1e-5)
    assert program.predict(x).shape == (5, CLASSES) and program.predict(x[:1]).shape == (1, CLASSES)
    np.testing.assert_allclose(program.predict(x).numpy(), want, rtol=1e-4, atol=1e-5)
    assert program.predict(x[:0]).shape == (0, CLASSES)
    with pytest.raises(ValueError, match="the batch is empty"):
        program.train_step(x[:0], np.zeros(0, np.int64))


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


# ---------------------------------------------------------------- ft.fit: the C loop and a Python iterable

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
    history = ft.fit(comp(a, opt), loader(), 3, scheduler=sched, scheduler_interval="step", progress=False)
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


# ---------------------------------------------------------------- a loss without targets

def test_a_program_whose_loss_reads_no_targets_fits_its_inputs_alone():
    """A loss of one argument (here the output's squared norm) reads no targets: fit and evaluate take the
    inputs' array alone, (x,), or (x, None), fit(1) twice is fit(2), and the loss is NumPy's for the weights."""
    def run(data, epochs):
        ft.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 4), nn.Tanh(), nn.Linear(4, 8))
        program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), lambda out: (out ** 2).sum(1).mean(),
                                batch_size=16, input_shape=(8,))
        for n in epochs:
            ft.fit(program, data, n, progress=False)
        return model, program
    X = np.random.default_rng(0).standard_normal((64, 8)).astype(np.float32)
    model, program = run(X, [1, 1])
    for data in ((X,), (X, None)):
        assert ft.evaluate(run(data, [2])[1], X) == ft.evaluate(program, X)
    sd = {k: np.asarray(v, np.float64) for k, v in model.state_dict().items()}
    out = np.tanh(X @ sd["0.weight"].T + sd["0.bias"]) @ sd["2.weight"].T + sd["2.bias"]
    loss, accuracy = ft.evaluate(program, X)
    np.testing.assert_allclose(loss, (out ** 2).sum(1).mean(), rtol=1e-5)
    assert accuracy is None
    assert ft.evaluate(program, (X[i:i + 16] for i in range(0, 64, 16))) == (loss, None)  # batches of x alone
    with pytest.raises(TypeError, match=r"got one ndarray: the program's loss reads targets"):
        ft.fit(compile_resnet(make_resnet(seed=1)), X, 1)


def test_a_loss_module_whose_forward_takes_the_output_alone_reads_no_targets():
    """nn.Module losses are read by their forward's signature (the instance's own is *args)."""
    class Energy(nn.Module):
        def forward(self, out):
            return (out ** 2).sum(1).mean()

    class Squared(nn.Module):
        def forward(self, out, y):
            return ((out - y) ** 2).sum(1).mean()

    X = np.random.default_rng(1).standard_normal((16, 8)).astype(np.float32)
    model = nn.Linear(8, 4)
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), Energy(), batch_size=16, input_shape=(8,))
    out = X @ model.weight.numpy().T + model.bias.numpy()
    np.testing.assert_allclose(program.train_step(X, None), (out ** 2).sum(1).mean(), rtol=1e-5)
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), Squared(), batch_size=16, input_shape=(8,),
                            target_shape=(4,))
    out = X @ model.weight.numpy().T + model.bias.numpy()
    np.testing.assert_allclose(program.train_step(X, out + 1), 4.0, rtol=1e-5)


def test_fit_with_validation_leaves_the_modes_compile_found():
    """fit evaluates in eval mode, then puts back the training modes (a batch norm frozen in eval mode stays so):
    a train_step after fit runs as fit's steps did; the message of a mode changed since names the module."""
    ft.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 6), nn.BatchNorm1d(6),
                          nn.Linear(6, 3))
    model[1].eval()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=8,
                            input_shape=(4,))
    x = np.random.default_rng(2).standard_normal((32, 4)).astype(np.float32)
    y = np.arange(32) % 3
    ft.fit(program, (x, y), 1, val_loader=(x, y), progress=False)
    assert model.training and model[4].training and not model[1].training
    program.train_step(x[:8], y[:8])
    model.train()
    with pytest.raises(ValueError, match="BatchNorm1d '1' is in training mode, but was in eval mode at compile"):
        program.train_step(x[:8], y[:8])


# ---------------------------------------------------------------- means over batches

def _softmax_ce(logits, y, ignore):
    """Per-sample float64 cross-entropy and argmax hits of (N, C) logits, with the kept mask."""
    z = logits.astype(np.float64)
    logp = z - z.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    keep = y != ignore
    ce = -np.take_along_axis(logp, np.where(keep, y, 0)[..., None], -1)[..., 0]
    return ce, keep, logits.argmax(-1) == y


def test_an_ignored_label_counts_in_neither_the_loss_nor_the_accuracy():
    """A classifier whose loss ignores label -1 (unlabelled samples): evaluate's loss is the mean over the labelled
    samples and its accuracy the fraction of them predicted, for one batch and over a split of uneven batches (as
    over one batch of them all); fit's train accuracy counts them alike (lr 0: the training forward is the eval
    one)."""
    rng = np.random.default_rng(21)
    X, y = rng.standard_normal((20, 5)).astype(np.float32), rng.integers(0, 3, 20)
    y[[0, 1, 2, 3, 4, 5, 9, 15]] = -1
    ft.manual_seed(2)
    model = nn.Sequential(nn.Linear(5, 3))
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.0), nn.CrossEntropyLoss(ignore_index=-1),
                            batch_size=8, input_shape=(5,))
    ce, keep, hit = _softmax_ce(program.predict(X).numpy(), y, -1)
    loss, accuracy = program.evaluate(X[:8], y[:8])
    assert loss == pytest.approx(ce[:8][keep[:8]].mean(), rel=1e-5)
    assert accuracy == pytest.approx(hit[:8][keep[:8]].mean())
    for split in ((X, y), [(X[k:k + 8], y[k:k + 8]) for k in (0, 8, 16)]):  # the C loader, a Python iterable
        loss, accuracy = ft.evaluate(program, split)
        assert loss == pytest.approx(ce[keep].mean(), rel=1e-5) and accuracy == pytest.approx(hit[keep].mean())
    history = ft.fit(program, (X, y), 1, batch_size=8, progress=False)
    assert history["train_accuracy"][0] == pytest.approx(hit[keep].mean())
    assert history["train_loss"][0] == pytest.approx(ce[keep].mean(), rel=1e-5)


def test_a_token_loss_averages_over_the_tokens_of_the_split_and_a_padding_batch_counts_for_nothing():
    """Per-position labels with padding (ignore_index=0): ft.evaluate's loss is the mean over every kept token of
    the split, whatever the batches hold, and a batch of padding only adds nothing (a training step refuses it;
    validation in fit goes on)."""
    rng = np.random.default_rng(22)
    ids, y = rng.integers(0, 9, (20, 6)), rng.integers(1, 9, (20, 6))
    y[:, 4:] = 0
    y[[3, 7]] = 0
    y[16:] = 0  # the last batch: padding only
    ft.manual_seed(4)
    model = nn.Sequential(nn.Embedding(9, 4), nn.Linear(4, 9))
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.0),
                            lambda out, y: nn.functional.cross_entropy(out.transpose(1, 2), y, ignore_index=0),
                            batch_size=8, input_shape=(6,), input_dtype=ft.int64)
    ce, keep, _ = _softmax_ce(program.predict(ids).numpy(), y, 0)
    batches = [(ids[k:k + 8], y[k:k + 8]) for k in (0, 8, 16)]
    for split in ((ids, y), batches):
        assert ft.evaluate(program, split)[0] == pytest.approx(ce[keep].mean(), rel=1e-5)
    loss, accuracy = program.evaluate(*batches[2])
    assert np.isnan(loss) and accuracy is None
    with pytest.raises(ValueError, match="every target of the batch is ignored"):
        program.train_step(*batches[2])
    history = ft.fit(program, batches[:2], 1, val_loader=batches, progress=False)
    assert history["val_loss"][0] == pytest.approx(ce[keep].mean(), rel=1e-5)


def test_the_accuracy_is_of_the_outputs_argmax_whatever_the_loss_computes_after_it():
    """A loss of two terms (CE of the logits and of twice them), whose nodes may reuse the logits' memory in
    evaluation: the accuracy counts the logits' argmax, as NumPy, over arrays, uneven batches and one sample."""
    rng = np.random.default_rng(23)
    X, y = rng.standard_normal((23, 5)).astype(np.float32), rng.integers(0, 3, 23)
    ft.manual_seed(6)
    model = nn.Sequential(nn.Linear(5, 3))
    F = nn.functional
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.0),
                            lambda o, t: F.cross_entropy(o, t) + 0.5 * F.cross_entropy(o * 2, t), batch_size=8,
                            input_shape=(5,))
    hit = program.predict(X).numpy().argmax(1) == y
    assert ft.evaluate(program, (X, y))[1] == pytest.approx(hit.mean())
    assert ft.evaluate(program, [(X[a:b], y[a:b]) for a, b in ((0, 7), (7, 8), (8, 17), (17, 23))])[1] == \
        pytest.approx(hit.mean())
    for k in range(23):
        assert program.evaluate(X[k:k + 1], y[k:k + 1])[1] == float(hit[k])


def test_fit_on_arrays_takes_targets_as_train_step_does():
    """Integer regression targets (counts, ratings) train as floats through ft.fit on arrays, as through
    train_step (fit refused them), and labels given as floats are refused by both with the same hint."""
    rng = np.random.default_rng(0)
    x, counts = rng.standard_normal((16, 8)).astype(np.float32), rng.integers(0, 10, 16)
    losses = []
    for ints in (True, False):
        ft.manual_seed(0)
        m = nn.Linear(8, 1)
        p = m.compile(ft.optim.SGD(m.parameters(), lr=0.01), nn.MSELoss(), batch_size=8, input_shape=(8,))
        losses.append(ft.fit(p, (x, counts if ints else counts.astype(np.float32)), 2, progress=False)["train_loss"])
    assert losses[0] == losses[1]
    m = nn.Linear(8, 3)
    p = m.compile(ft.optim.SGD(m.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=8, input_shape=(8,))
    for run in (lambda: p.train_step(x[:8], counts[:8].astype(np.float32)),
                lambda: ft.fit(p, (x, counts.astype(np.float32) % 3), 1, progress=False)):
        with pytest.raises(TypeError, match=r"labels must be integers, got float32; class probabilities"):
            run()
    assert p.step_count == 0


def test_a_forward_choosing_its_path_by_is_grad_enabled_evaluates_as_under_no_grad():
    """A batch norm choosing by torch.is_grad_enabled() whether to normalize by the batch (d2l's): a compiled step
    trains on the batch's statistics and predict reads the running ones, as PyTorch evaluating under no_grad does;
    ft.is_grad_enabled() is False in no_grad() and after set_grad_enabled(False), True in an enable_grad() within
    it and elsewhere."""
    class BN(nn.Module):
        def __init__(self, n):
            super().__init__()
            self.gamma, self.beta = nn.Parameter(ft.ones(n)), nn.Parameter(ft.zeros(n))
            self.register_buffer("moving_mean", ft.zeros(n))
            self.register_buffer("moving_var", ft.ones(n))

        def forward(self, x):
            return F.batch_norm(x, self.moving_mean, self.moving_var, self.gamma, self.beta,
                                ft.is_grad_enabled(), 0.1, 1e-5)

    assert ft.is_grad_enabled()
    with ft.no_grad():
        assert not ft.is_grad_enabled()
        with ft.enable_grad():
            assert ft.is_grad_enabled()
        assert not ft.is_grad_enabled()
    with ft.set_grad_enabled(False):
        assert not ft.is_grad_enabled()
    ft.set_grad_enabled(False)  # called, as torch's: until set again
    assert not ft.is_grad_enabled()
    ft.set_grad_enabled(True)
    assert ft.is_grad_enabled()
    rng = np.random.default_rng(0)
    x, y = (3 + 2 * rng.standard_normal((8, 4))).astype(np.float32), np.arange(8) % 3
    ft.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), BN(6), nn.ReLU(), nn.Linear(6, 3))
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=8,
                            input_shape=(4,))
    for _ in range(3):
        program.train_step(x, y)
    assert not np.array_equal(model[1].moving_mean.numpy(), np.zeros(6))  # the steps moved the statistics
    with ft.no_grad():
        want = model(ft.tensor(x)).numpy()
    np.testing.assert_allclose(program.predict(x), want, rtol=1e-5, atol=1e-5)
    assert not np.allclose(program.predict(x), model(ft.tensor(x)).numpy(), atol=1e-3)  # not the batch's statistics
