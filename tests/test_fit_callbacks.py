"""ft.fit's per-step callbacks, its training accuracy and the gradient norm of the compiled step, against a float64
NumPy reference of the same training (a linear softmax classifier, SGD with clipping and a LinearLR schedule):
each reported loss, lr and pre-clipping gradient norm, the per-epoch training accuracy of the steps' own
forwards, and the weights. The C epoch (a fasttrain Loader) and a Python iterable of the same batches report
the same; a callback returning True stops training, and the next fit goes on from that step exactly."""
import functools
import math

import numpy as np
import pytest

import fasttrain as ft
from _programref import state_bits

nn = ft.nn
fit = functools.partial(ft.fit, scheduler_interval="step")  # the schedules here are of steps
N, F, C, B, LR, MAX_NORM = 60, 4, 3, 10, 0.5, 0.3
rng = np.random.default_rng(7)
X = rng.standard_normal((N, F)).astype(np.float32)
Y = rng.integers(0, C, N)


def lr_at(k):
    """LinearLR(start_factor=0.25, total_iters=5) at step k (counted from 0)."""
    return LR * (0.25 + 0.75 * min(k, 5) / 5)


def setup(clip=MAX_NORM, total_iters=5):
    ft.manual_seed(3)
    model = nn.Linear(F, C)
    opt = ft.optim.SGD(model.parameters(), lr=LR)
    program = model.compile(opt, nn.CrossEntropyLoss(), batch_size=B, input_shape=(F,), clip_grad_norm=clip)
    sched = ft.optim.lr_scheduler.LinearLR(opt, start_factor=0.25, total_iters=total_iters)
    loader = ft.data.Loader((X, Y), B, shuffle=True, seed=9, num_workers=1)
    return model, program, sched, loader


def epoch_batches(epoch):
    loader = ft.data.Loader((X, Y), B, shuffle=True, seed=9, num_workers=0)
    loader.set_epoch(epoch)
    return [(x.numpy(), y.numpy()) for x, y in loader]


def reference(model, epochs):
    """float64 NumPy training from the model's weights: per step (loss, lr, gradient norm before clipping), per
    epoch the fraction of samples whose logits (before their step's update) have the argmax at the label."""
    W, b = model.weight.numpy().astype(np.float64), model.bias.numpy().astype(np.float64)
    steps, accuracy, k = [], [], 0
    for epoch in range(epochs):
        correct = 0
        for x, y in epoch_batches(epoch):
            logits = x @ W.T + b
            correct += int(np.sum(logits.argmax(1) == y))
            p = np.exp(logits - logits.max(1, keepdims=True))
            p /= p.sum(1, keepdims=True)
            loss = -np.mean(np.log(p[np.arange(len(y)), y]))
            g = p.copy()
            g[np.arange(len(y)), y] -= 1
            g /= len(y)
            gW, gb = g.T @ x, g.sum(0)
            norm = np.sqrt(np.sum(gW ** 2) + np.sum(gb ** 2))
            scale = min(1.0, MAX_NORM / (norm + 1e-6))
            W, b = W - lr_at(k) * scale * gW, b - lr_at(k) * scale * gb
            steps.append((loss, lr_at(k), norm))
            k += 1
        accuracy.append(correct / N)
    return steps, accuracy, W, b


@pytest.mark.parametrize("feed", ["c_loader", "python_iterable"])
def test_step_callbacks_accuracy_and_gradient_norm_match_numpy(feed):
    model, program, sched, loader = setup()
    steps, accuracy, W, b = reference(model, 2)
    seen = []

    def record(step, metrics):
        assert step == metrics["step"] == program.step_count and metrics["grad_norm"] == program.last_grad_norm
        seen.append((step, metrics["epoch"], metrics["loss"], metrics["lr"], metrics["grad_norm"]))

    if feed == "c_loader":
        history = fit(program, loader, 2, scheduler=sched, step_callbacks=[record], every_n_steps=4,
                         progress=False)
    else:
        history = {"train_accuracy": []}
        for epoch in range(2):
            h = fit(program, epoch_batches(epoch), 1, scheduler=sched, step_callbacks=[record], every_n_steps=4,
                       progress=False)
            history["train_accuracy"] += h["train_accuracy"]
    second = 2 if feed == "c_loader" else 1  # a plain iterable's epochs are counted within each fit call
    assert [s[:2] for s in seen] == [(4, 1), (8, second), (12, second)]  # 6 steps an epoch
    for step, _, loss, lr, norm in seen:
        want_loss, want_lr, want_norm = steps[step - 1]
        assert loss == pytest.approx(want_loss, rel=1e-5)
        assert lr == pytest.approx(want_lr, rel=1e-12)
        assert norm == pytest.approx(want_norm, rel=1e-5)
    assert history["train_accuracy"] == accuracy  # counts of argmax: exact
    np.testing.assert_allclose(model.weight.numpy(), W, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(model.bias.numpy(), b, rtol=1e-5, atol=1e-6)
    assert program.last_grad_norm == pytest.approx(steps[-1][2], rel=1e-5)


def test_c_and_python_feeds_report_the_same():
    runs = []
    for feed in ("c_loader", "python_iterable"):
        model, program, sched, loader = setup()
        seen = []
        data = loader if feed == "c_loader" else epoch_batches(0)
        h = fit(program, data, 1, scheduler=sched, step_callbacks=[lambda s, m: seen.append(dict(m))],
                   progress=False)
        runs.append((seen, h["train_loss"], h["train_accuracy"], state_bits(model)))
    assert len(runs[0][0]) == 6 and runs[0] == runs[1]


def test_a_callback_stops_training_and_fit_goes_on_from_there():
    """Stopped at step 8 of 12 (in the second epoch, the learning rate still rising), then fit(1) finishes that
    epoch: the weights, the scheduler's learning rate and the loader's position are those of an uninterrupted
    fit(2)."""
    model, program, sched, loader = setup(total_iters=11)
    history = fit(program, loader, 2, scheduler=sched, step_callbacks=[lambda step, m: step == 8],
                     progress=False)
    assert program.step_count == 8 and history["epoch"] == [1, 2]
    assert loader.state_dict()["epoch"] == 1 and loader.state_dict()["batch"] == 2
    assert sched.last_epoch == 8
    assert program.optimizer.param_groups[0]["lr"] == pytest.approx(LR * (0.25 + 0.75 * 8 / 11))
    history = fit(program, loader, 1, scheduler=sched, progress=False)
    assert program.step_count == 12 and history["epoch"] == [2] and loader.epoch == 2
    whole, program_w, sched_w, loader_w = setup(total_iters=11)
    fit(program_w, loader_w, 2, scheduler=sched_w, progress=False)
    assert state_bits(model) == state_bits(whole)
    assert sched.state_dict() == sched_w.state_dict()
    assert program.optimizer.param_groups[0]["lr"] == program_w.optimizer.param_groups[0]["lr"] == pytest.approx(LR)
    # A Python iterable stops as well, after the callback's step.
    model, program, sched, _ = setup()
    fit(program, epoch_batches(0), 1, step_callbacks=[lambda step, m: True], every_n_steps=2, progress=False)
    assert program.step_count == 2


def uninterrupted():
    """(model, program, scheduler) of setup(total_iters=11) after fit(2) without a stop."""
    model, program, sched, loader = setup(total_iters=11)
    fit(program, loader, 2, scheduler=sched, progress=False)
    return model, program, sched


@pytest.mark.parametrize("exc", [RuntimeError, KeyboardInterrupt])
def test_an_exception_in_the_epoch_keeps_count_and_fit_goes_on_from_there(exc):
    """A step callback raising at step 8 (as Ctrl-C, or a bug in it, would) after the optimizer applied 8 steps:
    the program's count, the scheduler and the loader's position say so, and fit(1) then finishes the epoch as
    an uninterrupted fit(2)."""
    def boom(step, metrics):
        if step == 8:
            raise exc("stop here")
    model, program, sched, loader = setup(total_iters=11)
    with pytest.raises(exc, match="stop here"):
        fit(program, loader, 2, scheduler=sched, step_callbacks=[boom], progress=False)
    assert program.step_count == 8 and sched.last_epoch == 8
    assert loader.state_dict()["epoch"] == 1 and loader.state_dict()["batch"] == 2
    fit(program, loader, 1, scheduler=sched, progress=False)
    whole, _, sched_w = uninterrupted()
    assert program.step_count == 12 and state_bits(model) == state_bits(whole)
    assert sched.state_dict() == sched_w.state_dict()


@pytest.mark.parametrize("kind", ["StepLR", "ReduceLROnPlateau"])
@pytest.mark.parametrize("how", ["returns True", "raises"])
def test_a_stop_at_an_epochs_last_step_takes_its_scheduler_step(how, kind):
    """An epoch a step callback ends at its last step is over. Returning True, fit takes its end (the epoch's
    scheduler step, a ReduceLROnPlateau's of the validation loss) at once; raising, as Ctrl-C would, leaves it to the
    next fit (as a checkpoint saved there does). Either way the next fit runs as the rest of an uninterrupted run."""
    def stopping(step, m):
        if step == 6 and how == "raises":
            raise KeyboardInterrupt
        return step == 6

    def run(stop):
        ft.manual_seed(3)
        model = nn.Linear(F, C)
        program = model.compile(ft.optim.SGD(model.parameters(), lr=LR), nn.CrossEntropyLoss(), batch_size=B,
                                input_shape=(F,))
        sched = ft.optim.lr_scheduler.StepLR(program.optimizer, 1, 0.5) if kind == "StepLR" else \
            ft.optim.lr_scheduler.ReduceLROnPlateau(program.optimizer, factor=0.5, patience=0, threshold=10.0)
        loader = ft.data.Loader((X, Y), B, shuffle=True, seed=9, num_workers=1)
        options = dict(scheduler=sched, progress=False, val_loader=(X, Y), scheduler_interval="epoch")
        try:
            fit(program, loader, 3, step_callbacks=[stopping] if stop else [], **options)
        except KeyboardInterrupt:
            pass
        if stop:
            assert program.step_count == 6
            assert program.optimizer.param_groups[0]["lr"] == (LR if how == "raises" else LR / 2)
            assert loader.epoch == 1  # its batches are done: fit(3 - loader.epoch) resumes the run
            fit(program, loader, 3 - loader.epoch, **options)
        return model, program
    (model, program), (whole, program_w) = run(True), run(False)
    assert program.step_count == 18 and state_bits(model) == state_bits(whole)
    assert program.optimizer.param_groups[0]["lr"] == program_w.optimizer.param_groups[0]["lr"] == LR / 8


def test_a_batch_taken_by_hand_after_a_stopped_fit_is_passed_over_alike_by_fit_and_a_checkpoint(tmp_path):
    """fit stopped at step 3 of an epoch of 6, then one batch taken by hand (next(iter(loader))): the loader stands
    at batch 4, from which the next fit goes on, as a fit from a checkpoint saved then does (the first restarted
    the epoch, training its first 3 batches twice). A batch taken before any fit changes nothing (a fresh epoch)."""
    path = str(tmp_path / "peek.safetensors")
    runs = []
    for route in ("fit", "checkpoint"):
        model, program, sched, loader = setup()
        fit(program, loader, 1, step_callbacks=[lambda step, m: step == 3], progress=False)
        next(iter(loader))
        assert loader.state_dict()["batch"] == 4
        if route == "checkpoint":
            ft.save(path, program, loader=loader)
            model, program, sched, loader = setup()
            ft.load(path, program, loader=loader)
        fit(program, loader, 2, progress=False)
        runs.append((program.step_count, state_bits(model)))
    assert runs[0] == runs[1] and runs[0][0] == 3 + 2 + 6
    model, program, sched, loader = setup()
    next(iter(loader))
    fit(program, loader, 1, progress=False)
    assert program.step_count == 6 and loader.epoch == 1


def test_ctrl_c_at_any_moment_of_a_c_epoch_counts_the_steps_applied():
    """An alarm raising KeyboardInterrupt while fit runs short C epochs (whose end comes before the loop next looks
    for signals): whenever it lands, the program's count and the loader's position say which steps were applied, so
    that fit then finishes the run as an uninterrupted one."""
    import signal

    def interrupt(*_):
        raise KeyboardInterrupt

    def run(after):
        ft.manual_seed(3)
        model = nn.Linear(F, C)
        program = model.compile(ft.optim.SGD(model.parameters(), lr=LR), nn.CrossEntropyLoss(), batch_size=B,
                                input_shape=(F,))
        loader = ft.data.Loader((X, Y), B, shuffle=True, seed=9, num_workers=1)
        if after:
            previous = signal.signal(signal.SIGALRM, interrupt)
            signal.setitimer(signal.ITIMER_REAL, after)
            try:
                fit(program, loader, 400, progress=False)
            except KeyboardInterrupt:
                pass
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, previous)
            fit(program, loader, 400 - program.step_count // 6, progress=False)  # a started epoch counts as one
        else:
            fit(program, loader, 400, progress=False)
        return model, program

    whole, _ = run(0)
    for after in (0.003, 0.011, 0.023, 0.037):
        model, program = run(after)
        assert program.step_count == 2400 and state_bits(model) == state_bits(whole)


def test_a_callback_using_the_loader_fit_trains_on_says_so():
    model, program, sched, loader = setup()
    with pytest.raises(RuntimeError, match="in use by the epoch running it .* use another Loader"):
        fit(program, loader, 1, step_callbacks=[lambda step, m: ft.evaluate(program, loader)], progress=False)


def test_evaluating_on_the_training_loader_keeps_fits_position():
    model, program, sched, loader = setup(total_iters=11)
    fit(program, loader, 2, scheduler=sched, step_callbacks=[lambda step, m: step == 8], progress=False)
    ft.evaluate(program, loader)  # the whole split, then back to where fit stopped
    assert loader.state_dict()["epoch"] == 1 and loader.state_dict()["batch"] == 2
    fit(program, loader, 1, scheduler=sched, progress=False)
    assert program.step_count == 12 and state_bits(model) == state_bits(uninterrupted()[0])
    # between whole epochs too: fit(1), evaluate, fit(1) trains as fit(2)
    model, program, sched, loader = setup(total_iters=11)
    fit(program, loader, 1, scheduler=sched, progress=False)
    ft.evaluate(program, loader)
    fit(program, loader, 1, scheduler=sched, progress=False)
    assert program.step_count == 12 and state_bits(model) == state_bits(uninterrupted()[0])


def test_gradient_norm_of_every_step():
    # every step computes it (it refuses a non-finite one), with or without clipping
    model, program, _, loader = setup(clip=None)
    seen = []
    fit(program, loader, 1, step_callbacks=[lambda s, m: seen.append(m["grad_norm"])], progress=False)
    assert len(seen) == 6 and all(isinstance(v, float) and v > 0 for v in seen)
    assert program.last_grad_norm == seen[-1]
    ft.manual_seed(3)
    model = nn.Linear(F, C)
    program = model.compile(ft.optim.SGD(model.parameters(), lr=LR), batch_size=B, input_shape=(F,))
    assert program.last_grad_norm is None  # before the first step
    steps, _, _, _ = reference(model, 1)
    program.train_step(*epoch_batches(0)[0])
    assert program.last_grad_norm == pytest.approx(steps[0][2], rel=1e-5)


def test_train_accuracy_is_none_for_regression():
    model = nn.Linear(F, 1)
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.01), nn.MSELoss(), batch_size=B,
                            input_shape=(F,))
    history = fit(program, (X, Y.astype(np.float32)), 1, progress=False)
    assert history["train_accuracy"] == [None]


@pytest.mark.parametrize("feed", ["loader", "batches"])
@pytest.mark.parametrize("watched", ["val_loss", "train_loss", "val_accuracy"])
def test_reduce_lr_on_plateau_steps_each_epoch_by_the_metric_it_watches(feed, watched):
    """Patience 0, factor 0.5, no threshold: the lr halves after every epoch whose watched metric is no better than
    the best before it; each epoch trains at the lr the history records."""
    ft.manual_seed(3)
    model = nn.Linear(F, C)
    opt = ft.optim.SGD(model.parameters(), lr=4.0)  # large enough to make some epochs worse
    program = model.compile(opt, nn.CrossEntropyLoss(), batch_size=B, input_shape=(F,))
    mode = "max" if watched.endswith("accuracy") else "min"
    plateau = ft.optim.lr_scheduler.ReduceLROnPlateau(opt, mode=mode, factor=0.5, patience=0, threshold=0)
    data = ft.data.Loader((X, Y), B, shuffle=True, seed=9, num_workers=1) if feed == "loader" else \
        [(X[i:i + B], Y[i:i + B]) for i in range(0, N, B)]
    val = [(X[:30], Y[:30])] if watched.startswith("val") else None
    history = ft.fit(program, data, 8, scheduler=plateau, val_loader=val, progress=False)
    expected, lr, best = [], 4.0, None
    for value in history[watched]:
        expected.append(lr)
        if best is None or (value < best if mode == "min" else value > best):
            best = value
        else:
            lr /= 2
    assert history["lr"] == expected and min(expected) < 4.0
    assert opt.param_groups[0]["lr"] == lr


def test_fit_refuses_a_scheduler_it_cannot_follow():
    model = nn.Linear(F, 1)
    opt = ft.optim.SGD(model.parameters(), lr=0.1)
    program = model.compile(opt, nn.MSELoss(), batch_size=B, input_shape=(F,), target_shape=(1,))
    xy = (X, X[:, :1].copy())
    with pytest.raises(ValueError, match="mode='min'"):
        ft.fit(program, xy, scheduler=ft.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="max"), progress=False)
    other = ft.optim.SGD(nn.Linear(F, 1).parameters(), lr=0.1)
    with pytest.raises(ValueError, match="not one of the program's optimizer"):
        ft.fit(program, xy, scheduler=ft.optim.lr_scheduler.StepLR(other, 1), progress=False)
    assert program.step_count == 0


def test_a_step_callback_sees_the_optimizer_and_scheduler_as_a_python_loop_leaves_them():
    """At each step a callback reads the param groups' lr and the scheduler's position as after that step in a
    Python loop (scheduler.step() after each batch), in the C epoch as with a Python iterable."""
    runs = []
    for feed in ("c_loader", "python_iterable"):
        model, program, sched, loader = setup(total_iters=11)
        seen = []

        def record(step, metrics):
            seen.append((step, program.optimizer.param_groups[0]["lr"], sched.last_epoch, sched.get_last_lr()))

        for epoch in range(2):
            fit(program, loader if feed == "c_loader" else epoch_batches(epoch), 1, scheduler=sched,
                   step_callbacks=[record], progress=False)
        runs.append(seen)
    assert runs[0] == runs[1]
    want = LR * (0.25 + 0.75 * 5 / 11)  # LinearLR(total_iters=11) after 5 steps
    assert runs[0][4] == (5, pytest.approx(want), 5, [pytest.approx(want)])


@pytest.mark.parametrize("scheduled", [False, True])
def test_an_lr_set_in_a_step_callback_applies_from_the_next_step(scheduled):
    """A callback that sets the lr by hand at step 3 (with a scheduler, one that then goes on from it): the C
    epoch trains the rest with it, as the Python loop does."""
    states = []
    for feed in ("c_loader", "python_iterable"):
        model, program, sched, loader = setup()
        sched = ft.optim.lr_scheduler.ExponentialLR(program.optimizer, 0.9) if scheduled else None

        def slow_down(step, metrics):
            if step == 3:
                program.optimizer.param_groups[0]["lr"] = 0.01

        history = fit(program, loader if feed == "c_loader" else epoch_batches(0), 1, scheduler=sched,
                         step_callbacks=[slow_down], progress=False)
        states.append((state_bits(model), program.optimizer.param_groups[0]["lr"], history["train_loss"]))
    assert states[0] == states[1]
    assert states[0][1] == pytest.approx(0.01 * 0.9 ** 3 if scheduled else 0.01)


def test_a_checkpoint_saved_in_a_step_callback_resumes_at_that_step(tmp_path):
    """ft.save(program, scheduler=, loader=) from a step callback in the C epoch (step 8, mid-epoch), loaded
    into a fresh setup that fits on: the weights, scheduler and loader end as an uninterrupted fit(2)."""
    path = str(tmp_path / "mid.safetensors")
    model, program, sched, loader = setup(total_iters=11)

    def save(step, metrics):
        if step == 8:
            ft.save(path, program, scheduler=sched, loader=loader)

    fit(program, loader, 2, scheduler=sched, step_callbacks=[save], progress=False)
    resumed, program_r, sched_r, loader_r = setup(total_iters=11)
    ft.load(path, program_r, scheduler=sched_r, loader=loader_r)
    assert program_r.step_count == 8 and loader_r.state_dict()["batch"] == 2
    fit(program_r, loader_r, 1, scheduler=sched_r, progress=False)
    assert state_bits(resumed) == state_bits(model)
    assert sched_r.state_dict() == sched.state_dict() and loader_r.epoch == loader.epoch == 2


@pytest.mark.filterwarnings("ignore:.*a Loader whose position this checkpoint does not keep")
def test_a_checkpoint_loaded_in_a_step_callback_sets_the_step_count(tmp_path):
    """ft.load of an earlier step's checkpoint from a step callback in the C epoch (a rollback) puts the program's
    count back: the callbacks after it see the steps counted from there, and the program ends at that count (the
    epoch's end overwrote it with the steps run)."""
    path = str(tmp_path / "early.safetensors")
    model, program, sched, loader = setup(total_iters=11)
    seen = []

    def rollback(step, metrics):
        seen.append(step)
        if step == 2:
            ft.save(path, program, scheduler=sched)
        if step == 4 and len(seen) == 4:
            ft.load(path, program, scheduler=sched)

    fit(program, loader, 1, scheduler=sched, step_callbacks=[rollback], progress=False)
    assert seen == [1, 2, 3, 4, 3, 4] and program.step_count == 4


def test_a_change_at_an_epochs_last_step_does_not_end_fit():
    """A step callback setting the lr (or loading a checkpoint) at an epoch's last step: fit goes on to the next
    epoch (the change stopped the C epoch, which counted as the callback stopping training)."""
    model, program, sched, loader = setup()
    steps = N // B

    def nudge(step, metrics):
        if step == steps:
            program.optimizer.param_groups[0]["lr"] = 0.01

    history = fit(program, loader, 2, step_callbacks=[nudge], progress=False)
    assert history["epoch"] == [1, 2] and program.step_count == 2 * steps
    assert history["lr"][1] == 0.01


@pytest.mark.parametrize("at", [6, 12])
@pytest.mark.parametrize("kind", ["StepLR", "ReduceLROnPlateau"])
def test_a_checkpoint_saved_at_an_epochs_last_step_resumes_with_that_epochs_scheduler_step(kind, at, tmp_path):
    """ft.save in a step callback at an epoch's last step keeps the scheduler as that step left it, before the
    epoch's own scheduler step (a StepLR's, a ReduceLROnPlateau's of the validation loss); fit from the loaded
    checkpoint takes that step before the next epoch, and ends as the uninterrupted run."""
    path = str(tmp_path / "end.safetensors")

    def make():
        model, program, _, loader = setup()
        sched = ft.optim.lr_scheduler.StepLR(program.optimizer, 1, 0.5) if kind == "StepLR" else \
            ft.optim.lr_scheduler.ReduceLROnPlateau(program.optimizer, factor=0.5, patience=0, threshold=10.0)
        return model, program, sched, loader

    def save(step, metrics):
        if step == at:
            ft.save(path, program, scheduler=sched, loader=loader)
            saved.append(program.optimizer.param_groups[0]["lr"])

    saved = []
    model, program, sched, loader = make()
    ft.fit(program, loader, 3, scheduler=sched, val_loader=(X, Y), step_callbacks=[save], progress=False)
    resumed, program_r, sched_r, loader_r = make()
    ft.load(path, program_r, scheduler=sched_r, loader=loader_r)
    assert loader_r.state_dict()["batch"] == len(loader_r) and program_r.optimizer.param_groups[0]["lr"] == saved[0]
    done = at // len(loader)
    assert loader_r.epoch == done  # the epochs whose batches are done, the saved one's included
    history = ft.fit(program_r, loader_r, 3 - done, scheduler=sched_r, val_loader=(X, Y), progress=False)
    assert history["epoch"] == list(range(done + 1, 4))
    assert program_r.step_count == program.step_count == 18 and state_bits(resumed) == state_bits(model)
    # LinearLR's start factor (setup's), then halved after each of the three epochs
    assert program_r.optimizer.param_groups[0]["lr"] == program.optimizer.param_groups[0]["lr"] == LR / 4 / 8
    assert sched_r.state_dict() == sched.state_dict()


@pytest.mark.parametrize("route", ["checkpoint", "in process"])
@pytest.mark.parametrize("at", [4, 6, 9])
def test_a_plateau_scheduler_watching_the_training_loss_resumes_as_the_uninterrupted_run(at, route, tmp_path):
    """Without a val_loader a ReduceLROnPlateau watches each epoch's training loss: a run stopped at step `at` (of
    epochs of 6) keeps the metrics of its epoch's steps with the loader's position (in its state_dict, so in a
    checkpoint saved then), and the fit finishing the epoch reports and watches the whole epoch's, not only its
    own steps' (which halved the lr where the uninterrupted run did not)."""
    path = str(tmp_path / "plateau.safetensors")

    def make():
        model, program, _, loader = setup()
        sched = ft.optim.lr_scheduler.ReduceLROnPlateau(program.optimizer, factor=0.5, patience=0)
        return model, program, sched, loader

    model_w, program_w, sched_w, loader_w = make()
    whole = ft.fit(program_w, loader_w, 3, scheduler=sched_w, progress=False)

    def stop(step, metrics):
        if step == at:
            ft.save(path, program, scheduler=sched, loader=loader)
            return True

    model, program, sched, loader = make()
    ft.fit(program, loader, 3, scheduler=sched, step_callbacks=[stop], progress=False)
    if route == "checkpoint":
        model, program, sched, loader = make()
        ft.load(path, program, scheduler=sched, loader=loader)
    rest = ft.fit(program, loader, 3 - loader.epoch, scheduler=sched, progress=False)
    assert program.step_count == 18 and state_bits(model) == state_bits(model_w)
    assert sched.state_dict() == sched_w.state_dict()
    n = len(rest["epoch"])
    assert rest["epoch"] == whole["epoch"][-n:]
    assert rest["train_loss"] == pytest.approx(whole["train_loss"][-n:], rel=1e-12)
    assert rest["train_accuracy"] == whole["train_accuracy"][-n:]


def test_a_plateau_scheduler_resumed_at_an_epochs_end_without_its_metrics_warns():
    """Without a val_loader, the epoch-end step of a ReduceLROnPlateau watches the training metrics of the epoch: a
    position restored at its end without them (a state from before they were kept) makes fit say it skips it."""
    model, program, _, loader = setup()
    sched = ft.optim.lr_scheduler.ReduceLROnPlateau(program.optimizer)
    state = loader.state_dict()
    ft.fit(program, loader, 1, scheduler=sched, progress=False, step_callbacks=[
        lambda step, m: state.update(loader.state_dict()) if step == len(loader) else None])
    assert len(state.pop("tally")) == 4
    loader.load_state_dict(state)
    with pytest.warns(UserWarning, match="end of epoch 1, whose ReduceLROnPlateau step"):
        history = ft.fit(program, loader, 1, scheduler=sched, progress=False)
    assert history["epoch"] == [2] and sched.last_epoch == 2


def test_schedulers_step_by_default_as_pytorchs_documentation_steps_them():
    """CosineAnnealingLR(T_max=epochs) given to fit is stepped after each epoch (it finished its cosine within
    the first batches when stepped per batch), OneCycleLR(total_steps=epochs * batches) after each batch."""
    ft.manual_seed(3)
    model = nn.Linear(F, C)
    opt = ft.optim.SGD(model.parameters(), lr=LR)
    program = model.compile(opt, nn.CrossEntropyLoss(), batch_size=B, input_shape=(F,))
    cosine = ft.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=4)
    history = ft.fit(program, (X, Y), 4, scheduler=cosine, progress=False)
    assert history["lr"] == pytest.approx([LR * (1 + math.cos(math.pi * e / 4)) / 2 for e in range(4)])
    one_cycle = ft.optim.lr_scheduler.OneCycleLR(opt, max_lr=LR, total_steps=2 * N // B)
    seen = []
    ft.fit(program, (X, Y), 2, scheduler=one_cycle, step_callbacks=[lambda s, m: seen.append(m["lr"])],
           progress=False)
    assert len(set(seen)) == len(seen) == 2 * N // B and one_cycle.last_epoch == 2 * N // B


def test_a_step_callback_unfreezing_a_layer_is_refused_at_the_next_step_of_a_c_epoch():
    """requires_grad_(True) on a layer frozen at compile, in a step callback of fit's C epoch: the next step is
    refused (it ran as compiled, leaving the layer untrained while it said requires_grad), as a Python loop's
    train_step refuses it; the steps before count."""
    model, program, sched, loader = setup()
    model.weight.requires_grad_(False)
    program = model.compile(ft.optim.SGD([model.bias], lr=LR), nn.CrossEntropyLoss(), batch_size=B,
                            input_shape=(F,))

    def unfreeze(step, metrics):
        if step == 2:
            model.weight.requires_grad_(True)

    with pytest.raises(ValueError, match="requires_grad became True after compile"):
        fit(program, loader, 1, step_callbacks=[unfreeze], progress=False)
    assert program.step_count == 2


def test_only_true_from_a_callback_stops_fit():
    """A callback returning something truthy that is not True (a lambda's tuple, what list.append gave) goes on;
    True, or NumPy's True, stops."""
    seen = []
    for returned, steps in (((1, None), 12), ([0], 12), (np.True_, 1), (True, 1)):
        model, program, sched, loader = setup()
        fit(program, loader, 2, step_callbacks=[lambda step, m: (seen.append(step), returned)[1]], progress=False)
        assert program.step_count == steps, returned
    model, program, sched, loader = setup()
    history = fit(program, loader, 3, callbacks=[lambda epoch, m: "done"], progress=False)
    assert history["epoch"] == [1, 2, 3]


def test_class_labels_for_a_soft_target_program_are_refused_before_any_step():
    """A program of class probabilities (mixup's soft targets) validated on class labels: refused before the first
    step, saying to evaluate a second program compiled with a class loss (which reads the same weights)."""
    ft.manual_seed(3)
    model = nn.Linear(F, C)
    program = model.compile(ft.optim.SGD(model.parameters(), lr=LR), nn.CrossEntropyLoss(), batch_size=B,
                            input_shape=(F,), target_shape=(C,), target_dtype=ft.float32)
    soft = np.eye(C, dtype=np.float32)[Y]
    with pytest.raises(TypeError, match=r"val_loader's targets are class labels.* compile the model a second time"):
        fit(program, (X, soft), 1, val_loader=(X, Y), progress=False)
    with pytest.raises(TypeError, match="evaluate: the targets are class labels"):
        ft.evaluate(program, (X, Y))
    assert program.step_count == 0
    labels = model.compile(ft.optim.SGD(model.parameters(), lr=0.0), nn.CrossEntropyLoss(), batch_size=B,
                           input_shape=(F,))
    fit(program, (X, soft), 1, progress=False)
    loss, accuracy = ft.evaluate(labels, (X, Y))
    assert np.isfinite(loss) and 0 <= accuracy <= 1


def test_fit_updates_an_ema_after_every_step_as_a_loop_does():
    """fit(..., ema=) moves an ft.optim.EMA after every step, in the C epoch of a Loader (no Python per step) and
    in a Python loop over batches: its averages are bitwise a train_step loop's with ema.update() after each step,
    a run stopped by a callback and fit again included."""
    def averages(how):
        model, program, sched, loader = setup()
        ema = ft.optim.EMA(model.parameters(), decay=0.8)
        if how == "loop":
            for _ in range(2):
                for x, y in loader:
                    program.train_step(x, y)
                    ema.update()
        elif how == "stopped":
            fit(program, loader, 2, ema=ema, step_callbacks=[lambda step, m: step == 4], progress=False)
            fit(program, loader, 2, ema=ema, progress=False)
        else:
            fit(program, loader if how == "loader" else [(x.numpy(), y.numpy()) for x, y in loader], 1, ema=ema,
                progress=False)
            fit(program, loader if how == "loader" else [(x.numpy(), y.numpy()) for x, y in loader], 1, ema=ema,
                progress=False)
        return [s.numpy().tobytes() for s in ema.shadow], ema.num_updates, program.step_count

    want = averages("loop")
    assert want[1] == want[2] == 12
    for how in ("loader", "batches", "stopped"):
        assert averages(how) == want, how
    model, program, sched, loader = setup()
    with pytest.raises(TypeError, match="ema must be an ft.optim.EMA"):
        fit(program, loader, 1, ema=model.parameters(), progress=False)


def test_an_ema_that_fit_updates_refuses_an_update_from_another_thread():
    """While fit's C epoch updates the EMA (held here in a step callback), ema.update() from another thread is
    refused naming the EMA, and the averages are a loop's afterwards."""
    import threading
    model, program, sched, loader = setup()
    ema = ft.optim.EMA(model.parameters(), decay=0.8)
    inside, release, errors = threading.Event(), threading.Event(), []

    def hold(step, metrics):
        if step == 2:
            inside.set()
            release.wait(30)

    fitting = threading.Thread(target=fit, args=(program, loader, 1),
                               kwargs=dict(ema=ema, step_callbacks=[hold], progress=False))
    fitting.start()
    try:
        assert inside.wait(30)
        try:
            ema.update()
        except RuntimeError as e:
            errors.append(str(e))
    finally:
        release.set()
        fitting.join(30)
    assert errors == ["the EMA is running a step in another thread"]
    assert ema.num_updates == program.step_count == 6


def test_callbacks_that_are_not_a_list_of_functions_are_refused_before_any_step():
    model, program, _, loader = setup()
    before = state_bits(model)

    def report(epoch, metrics):
        pass

    for given, message in (([1], r"callbacks must be a list of functions, got \[1\]"),
                           (report, r"callbacks must be a list of functions, got <function .* \(give \[report\]\)")):
        with pytest.raises(TypeError, match=message):
            ft.fit(program, loader, epochs=1, callbacks=given, progress=False)
        with pytest.raises(TypeError, match="step_" + message):
            ft.fit(program, loader, epochs=1, step_callbacks=given, progress=False)
    assert state_bits(model) == before and program.step_count == 0
