"""compile(..., grad_scaler=ft.amp.GradScaler()): dynamic loss scaling in the C step, as torch.amp.GradScaler.
A power-of-two scale trains bitwise as no scaling; an overflow skips the step (weights, optimizer state and
batch-norm statistics unchanged) and backs the scale off; steps without one grow it; ft.fit reports both; the
state round-trips through state_dict and checkpoints; bad arguments fail."""
import numpy as np
import pytest

import fasttrain as ft
from _programref import state_bits

nn = ft.nn
GradScaler = ft.amp.GradScaler


def bits(program):
    """The bytes of the model's parameters and buffers and of the optimizer's state, to compare runs bitwise."""
    out = state_bits(program.model)
    for i, state in program.optimizer.state_dict()["state"].items():
        for k, v in state.items():
            out[f"optimizer.{i}.{k}"] = np.ascontiguousarray(v.numpy() if hasattr(v, "numpy") else v).tobytes()
    return out


def net(p=0.2):
    return nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Dropout(p), nn.Flatten(),
                         nn.Linear(4 * 25, 3))


def batch(seed=0, n=8, scale=1.0):
    r = np.random.default_rng(seed)
    return (r.normal(size=(n, 2, 5, 5)) * scale).astype(np.float32), r.integers(0, 3, n)


def trained(scaler, steps, opt="sgd", loss=None, data=None, lr=0.05, dropout=0.2, **kw):
    ft.manual_seed(0)
    m = net(dropout)
    o = ft.optim.SGD(m.parameters(), lr=lr, momentum=0.9) if opt == "sgd" else \
        ft.optim.AdamW(m.parameters(), lr=1e-3)
    p = m.compile(o, loss or nn.CrossEntropyLoss(), batch_size=8, input_shape=(2, 5, 5), grad_scaler=scaler, **kw)
    x, y = data or batch()
    losses = [p.train_step(x, y) for _ in range(steps)]
    return p, losses


@pytest.mark.parametrize("opt", ["sgd", "adamw"])
def test_a_power_of_two_scale_trains_bitwise_as_none(opt):
    plain, want = trained(None, 7, opt)
    scaler = GradScaler(init_scale=2.0 ** 10, growth_interval=3)
    scaled, got = trained(scaler, 7, opt)
    assert got == want
    assert bits(scaled) == bits(plain)
    assert scaler.get_scale() == 2.0 ** 12 and scaler.get_growth_tracker() == 1  # grew after steps 3 and 6
    assert scaled.skipped_steps == 0


def mse_data():
    """Regression targets of 100: gradients up to about 80 (2**6.3), which overflow float32 times 2**122."""
    x, _ = batch(1)
    return x, np.full((8, 3), 100.0, np.float32)


def test_overflow_skips_the_step_and_backs_off():
    """From 2**127 the scale halves on each overflowed step until the gradients fit; the steps that ran train as
    unscaled steps on the same batch, the skipped ones left no trace (weights, momentum, running statistics).
    Without dropout: a skipped step's forward has drawn its mask, as in PyTorch, so the masks would differ."""
    steps = 20
    scaler = GradScaler(init_scale=2.0 ** 127)
    scaled, losses = trained(scaler, steps, loss=nn.MSELoss(), data=mse_data(), lr=1e-5, dropout=0.0)
    skipped = scaled.skipped_steps
    assert 1 <= skipped <= steps - 5
    assert scaler.get_scale() == 2.0 ** (127 - skipped)
    plain, want = trained(None, steps - skipped, loss=nn.MSELoss(), data=mse_data(), lr=1e-5, dropout=0.0)
    assert bits(scaled) == bits(plain)
    assert losses[skipped:] == want  # a skipped step's loss is its forward's, the same as the next one's
    assert scaled.step_count == steps


def test_overflow_leaves_batch_norm_statistics_as_they_were():
    scaler = GradScaler(init_scale=2.0 ** 127)
    p, _ = trained(scaler, 0, loss=nn.MSELoss(), data=mse_data())
    bn = p.model[1]
    compiled = bn.running_mean.numpy().copy()  # the conv bias before it folded in
    p.train_step(*mse_data())
    assert p.skipped_steps == 1
    assert (bn.running_mean.numpy() == compiled).all() and (bn.running_var.numpy() == 1).all()
    assert bn.num_batches_tracked.item() == 0


def test_a_non_finite_loss_is_skipped_and_backs_off():
    """A NaN input makes every step's loss NaN: each is skipped and halves the scale, down to 2**-126, where it
    stays (1 / scale must stay a float)."""
    x, y = batch()
    x[0, 0, 0, 0] = np.nan
    scaler = GradScaler(init_scale=2.0 ** -124)
    p, losses = trained(scaler, 4, data=(x, y))
    assert all(np.isnan(v) for v in losses) and p.skipped_steps == 4
    assert scaler.get_scale() == 2.0 ** -126


def test_fit_reports_skipped_steps_and_the_scale():
    scaler = GradScaler(init_scale=2.0 ** 127, growth_interval=2)
    ft.manual_seed(0)
    m = net()
    p = m.compile(ft.optim.SGD(m.parameters(), lr=1e-5), nn.MSELoss(), batch_size=8, input_shape=(2, 5, 5),
                  grad_scaler=scaler)
    r = np.random.default_rng(2)
    x, y = r.normal(size=(32, 2, 5, 5)).astype(np.float32), np.full((32, 3), 100.0, np.float32)
    h = ft.fit(p, (x, y), epochs=4, progress=False)
    assert sum(h["skipped_steps"]) == p.skipped_steps >= 1
    assert h["skipped_steps"][0] >= 1
    assert h["loss_scale"][-1] == scaler.get_scale()
    # skipped steps' losses are not averaged in: an epoch whose every step was skipped has no loss (NaN)
    steps = 32 // 8
    for loss, skipped in zip(h["train_loss"], h["skipped_steps"]):
        assert np.isnan(loss) == (skipped == steps)


def test_state_dict_and_checkpoint_round_trip(tmp_path):
    scaler = GradScaler(init_scale=2.0 ** 8, growth_interval=5)
    p, _ = trained(scaler, 7)
    state = scaler.state_dict()
    assert state == {"scale": 2.0 ** 9, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 5,
                     "_growth_tracker": 2}
    ft.save(tmp_path / "ckpt.safetensors", p)
    fresh = GradScaler()
    q, _ = trained(fresh, 0)
    ft.load(tmp_path / "ckpt.safetensors", q)
    assert fresh.state_dict() == state
    other = GradScaler()
    other.load_state_dict(state)  # before any program: kept until compile hands it over
    assert other.get_scale() == 2.0 ** 9 and other.get_growth_tracker() == 2
    with pytest.raises(ValueError):
        fresh.load_state_dict(dict(state, _growth_tracker=5))
    assert fresh.state_dict() == state  # a refused state changes nothing
    for scaler in (None, GradScaler(enabled=False)):  # the scale cannot go anywhere: said, not dropped silently
        r, _ = trained(scaler, 0)
        with pytest.warns(UserWarning, match="holds a GradScaler state .* does not restore"):
            ft.load(tmp_path / "ckpt.safetensors", r)
        np.testing.assert_array_equal(np.asarray(r.model.state_dict()["0.weight"]),
                                      np.asarray(p.model.state_dict()["0.weight"]))  # the rest loads


def test_disabled_scaler_is_no_scaling():
    scaler = GradScaler(enabled=False)
    p, got = trained(scaler, 3)
    plain, want = trained(None, 3)
    assert got == want and bits(p) == bits(plain)
    assert scaler.get_scale() == 1.0 and scaler.state_dict() == {} and p._c.loss_scaler is None


def test_bad_arguments():
    with pytest.raises(ValueError, match="init_scale"):
        GradScaler(init_scale=0.0)
    with pytest.raises(ValueError, match="growth_factor"):
        GradScaler(growth_factor=1.0)
    with pytest.raises(ValueError, match="backoff_factor"):
        GradScaler(backoff_factor=1.0)
    with pytest.raises(ValueError, match="growth_interval"):
        GradScaler(growth_interval=0)
    with pytest.raises(ValueError, match="device"):
        GradScaler("tpu")
    with pytest.raises(TypeError, match="GradScaler"):
        trained(object(), 0)
    scaler = GradScaler()
    trained(scaler, 0)
    with pytest.raises(ValueError, match="another program"):
        trained(scaler, 0)
    with pytest.raises(ValueError, match="state_dict"):
        scaler.load_state_dict({"scale": 1.0})
    with pytest.raises(TypeError, match="init_scale must be a number, got str"):
        GradScaler(init_scale="1")
    with pytest.raises(TypeError, match="backoff_factor must be a number, got NoneType"):
        GradScaler(backoff_factor=None)
    state = scaler.state_dict()
    with pytest.raises(ValueError, match="a count must be an integer, got 2000.7"):  # not cut to 2000
        scaler.load_state_dict(dict(state, growth_interval=2000.7))
    assert scaler.state_dict() == state
    scaler.load_state_dict(dict(state, growth_interval=np.int64(7)))
    assert scaler.state_dict()["growth_interval"] == 7
    for name in ("scale", "step", "update", "unscale_"):  # torch's hand-written loop: the program does it
        with pytest.raises(AttributeError, match=f"GradScaler.{name}: a compiled program scales its own backward"):
            getattr(scaler, name)
    assert not hasattr(scaler, "no_such_method")


@pytest.mark.parametrize("loop", ["c_loader", "python"])
def test_fit_averages_the_loss_over_the_steps_that_ran(loop):
    """Skipped steps count in the speed, not in the epoch's loss: with the first steps overflowing, the epoch's
    train_loss is the mean of the losses of the steps that ran, as the same steps give them one by one (the C
    epoch over a Loader, and the Python one over a list of batches)."""
    r = np.random.default_rng(3)
    x, y = r.normal(size=(64, 2, 5, 5)).astype(np.float32), np.full((64, 3), 100.0, np.float32)
    batches = [(x[i:i + 8], y[i:i + 8]) for i in range(0, 64, 8)]
    results = []
    for by_hand in (False, True):
        scaler = GradScaler(init_scale=2.0 ** 127)
        ft.manual_seed(0)
        m = net(0.0)
        p = m.compile(ft.optim.SGD(m.parameters(), lr=1e-5), nn.MSELoss(), batch_size=8, input_shape=(2, 5, 5),
                      grad_scaler=scaler)
        if by_hand:
            losses = []
            for xb, yb in batches:
                before = p.skipped_steps
                loss = p.train_step(xb, yb)
                if p.skipped_steps == before:
                    losses.append(loss)
            results.append((np.mean(losses), p.skipped_steps))
        else:
            data = ft.data.Loader((x, y), 8, shuffle=False) if loop == "c_loader" else batches
            h = ft.fit(p, data, epochs=1, progress=False)
            results.append((h["train_loss"][0], h["skipped_steps"][0]))
    (fit_loss, fit_skipped), (hand_loss, hand_skipped) = results
    assert 1 <= fit_skipped == hand_skipped < len(batches)
    assert fit_loss == pytest.approx(hand_loss, rel=1e-6)
