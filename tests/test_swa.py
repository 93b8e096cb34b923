"""ft.optim.swa_utils: AveragedModel, SWALR and update_bn against NumPy's averages and formulas (and torch's
swa_utils when torch imports)."""
import math

import numpy as np
import pytest

import fasttrain as ft
from fasttrain import nn
from fasttrain.optim.swa_utils import SWALR, AveragedModel, get_ema_avg_fn, get_ema_multi_avg_fn, update_bn

try:  # an optional oracle
    import torch
except ImportError:
    torch = None


def net(seed):
    ft.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2))


def test_the_averaged_model_holds_the_equal_average_and_the_models_buffers():
    """update_parameters copies the first weights, then keeps their running mean; buffers follow the model's last
    ones (use_buffers=False); the copy's forward is the averaged weights'."""
    model, seen = net(1), []
    swa = AveragedModel(model)
    for k in range(3):
        with ft.no_grad():
            for p in model.parameters():
                p.mul_(1.5).add_(0.1 * k)
            model[1].running_mean.fill_(k)
        seen.append({n: p.numpy().copy() for n, p in model.named_parameters()})
        swa.update_parameters(model)
    assert int(swa.n_averaged) == 3
    for name, p in swa.module.named_parameters():
        np.testing.assert_allclose(p.numpy(), np.mean([s[name] for s in seen], 0), rtol=1e-6, atol=1e-7)
    assert swa.module[1].running_mean.tolist() == [2.0] * 4
    assert "n_averaged" in swa.state_dict() and "module.0.weight" in swa.state_dict()
    x = ft.tensor(np.random.default_rng(2).standard_normal((5, 3)).astype(np.float32))
    swa.eval()
    np.testing.assert_array_equal(swa(x).numpy(), swa.module(x).numpy())


@pytest.mark.parametrize("how", ["avg_fn", "multi_avg_fn"])
def test_an_exponential_average_and_the_buffers_averaged_too(how):
    model = net(3)
    fn = dict(avg_fn=get_ema_avg_fn(0.9)) if how == "avg_fn" else dict(multi_avg_fn=get_ema_multi_avg_fn(0.9))
    ema = AveragedModel(model, use_buffers=True, **fn)
    want = None
    for k in range(3):
        with ft.no_grad():
            for t in (*model.parameters(), model[1].running_mean):
                t.add_(1.0 + k)
        now = [t.numpy().copy() for t in (*model.parameters(), model[1].running_mean)]
        want = now if want is None else [0.9 * w + 0.1 * n for w, n in zip(want, now)]
        ema.update_parameters(model)
    for got, w in zip((*ema.module.parameters(), ema.module[1].running_mean), want):
        np.testing.assert_allclose(got.numpy(), w, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="avg_fn or multi_avg_fn, not both"):
        AveragedModel(model, avg_fn=get_ema_avg_fn(), multi_avg_fn=get_ema_multi_avg_fn())


@pytest.mark.parametrize("strategy", ["cos", "linear"])
@pytest.mark.parametrize("anneal_epochs", [0, 1, 3])
def test_swalr_anneals_to_swa_lr_as_pytorchs(strategy, anneal_epochs):
    """The learning rates of 6 steps from lr 0.5 to swa_lr 0.05: PyTorch's formula (and torch's SWALR)."""
    opt = ft.optim.SGD([ft.zeros(2)], lr=0.5)
    sched = SWALR(opt, swa_lr=0.05, anneal_epochs=anneal_epochs, anneal_strategy=strategy)
    got = [opt.param_groups[0]["lr"]]
    for _ in range(6):
        opt.step()
        sched.step()
        got.append(opt.param_groups[0]["lr"])
    f = (lambda t: (1 - math.cos(math.pi * t)) / 2) if strategy == "cos" else (lambda t: t)
    want, lr = [], 0.5
    for step in range(7):
        s = max(1, step) if anneal_epochs == 0 else step
        prev, alpha = f(max(0, min(1, (s - 1) / max(1, anneal_epochs)))), f(max(0, min(1, s / max(1, anneal_epochs))))
        start = 0.05 if prev == 1 else (lr - prev * 0.05) / (1 - prev)
        lr = 0.05 * alpha + start * (1 - alpha)
        want.append(lr)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert got[-1] == pytest.approx(0.05)
    if torch is not None:
        t_opt = torch.optim.SGD([torch.zeros(2, requires_grad=True)], lr=0.5)
        t_sched = torch.optim.swa_utils.SWALR(t_opt, swa_lr=0.05, anneal_epochs=anneal_epochs,
                                              anneal_strategy=strategy)
        theirs = [t_opt.param_groups[0]["lr"]]
        for _ in range(6):
            t_opt.step()
            t_sched.step()
            theirs.append(t_opt.param_groups[0]["lr"])
        np.testing.assert_allclose(got, theirs, rtol=1e-12)
    with pytest.raises(ValueError, match="anneal_strategy"):
        SWALR(opt, 0.05, anneal_strategy="step")


def test_update_bn_recomputes_the_running_statistics_over_the_loader():
    """A cumulative average over the batches: the batches' means, and their unbiased variances; the model's mode
    and its norms' momenta are as they were; (x, y) batches and plain ones alike."""
    model = net(4)
    x = np.random.default_rng(5).standard_normal((12, 3)).astype(np.float32)
    batches = [(ft.tensor(x[k:k + 4]), ft.tensor(np.zeros(4, np.int64))) for k in range(0, 12, 4)]
    model.eval()
    update_bn(batches, model)
    assert not model.training and model[1].momentum == 0.1 and int(model[1].num_batches_tracked) == 3
    with ft.no_grad():
        h = [model[0](b[0]).numpy() for b in batches]
    np.testing.assert_allclose(model[1].running_mean.numpy(), np.mean([b.mean(0) for b in h], 0), rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(model[1].running_var.numpy(), np.mean([b.var(0, ddof=1) for b in h], 0), rtol=1e-5,
                               atol=1e-6)
    again = net(4)
    update_bn([b[0] for b in batches], again)
    np.testing.assert_array_equal(again[1].running_mean.numpy(), model[1].running_mean.numpy())


def test_swa_over_a_compiled_program():
    """The recipe: train, average the compiled model's weights each epoch, anneal the rate, recompute the batch
    norm statistics of the average; the averaged copy predicts with them."""
    model = net(6)
    opt = ft.optim.SGD(model.parameters(), lr=0.1)
    program = model.compile(opt, nn.CrossEntropyLoss(), batch_size=4, input_shape=(3,))
    rng = np.random.default_rng(7)
    x, y = rng.standard_normal((16, 3)).astype(np.float32), rng.integers(0, 2, 16)
    swa, sched = AveragedModel(model), SWALR(opt, swa_lr=0.05, anneal_epochs=2)
    snapshots = []
    for _ in range(3):
        ft.fit(program, (x, y), epochs=1, progress=False)
        swa.update_parameters(model)
        sched.step()
        snapshots.append(model[0].weight.numpy().copy())
    np.testing.assert_allclose(swa.module[0].weight.numpy(), np.mean(snapshots, 0), rtol=1e-6, atol=1e-7)
    trained = model[1].running_mean.numpy().copy()
    update_bn([(ft.tensor(x[k:k + 4]), None) for k in range(0, 16, 4)], swa)
    assert np.isfinite(swa.module[1].running_var.numpy()).all() and int(swa.module[1].num_batches_tracked) == 4
    np.testing.assert_array_equal(model[1].running_mean.numpy(), trained)  # the copy's statistics, not the model's
    assert not np.allclose(swa.module[1].running_mean.numpy(), trained)
