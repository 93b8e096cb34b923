"""Bad input to a compiled program: batches of the wrong shape or type, labels out of range, non-finite losses
and gradients (nan_policy "raise" and "skip", in train_step and in ft.fit), a NaN through batch norm, an
optimizer of another model, bad learning rates and compile options. What is refused changes neither the model
nor the optimizer."""
import json
import math
import re
import warnings

import numpy as np
import pytest

import fasttrain as ft
from fasttrain.nn import functional as F
from _programref import CLASSES, batch, compile_resnet, make_resnet, state_bits

nn = ft.nn


# ---------------------------------------------------------------- bad batches

def snapshot(program):
    """Weights, buffers (BN running statistics), optimizer state and hyperparameters, as bytes."""
    sd = program.optimizer.state_dict()
    state = {(i, k): np.asarray(v).tobytes() for i, e in sd["state"].items() for k, v in e.items()}
    return state_bits(program.model), state, json.dumps(sd["param_groups"])


@pytest.fixture
def trained():
    """The residual net after one AdamW step (so that the optimizer has state to protect)."""
    model = make_resnet(seed=15)
    program = compile_resnet(model, ft.optim.AdamW(model.parameters(), lr=0.01))
    program.train_step(*batch(8, seed=1))
    return program


@pytest.mark.parametrize("what,make,error,match", [
    ("spatial size", lambda x, y: (x[:, :, :7], y), ValueError, r"samples of shape \(3, 8, 8\)"),
    ("channels", lambda x, y: (x[:, :2], y), ValueError, r"images have 2 channels, the model takes 3"),
    ("channels last", lambda x, y: (x.transpose(0, 2, 3, 1), y), ValueError, r"the batch's images are \(N, H, W, "
     r"C\), channels last; the model takes \(N, C, H, W\): give x.transpose\(0, 3, 1, 2\)"),
    ("no batch dim", lambda x, y: (x[0], y), ValueError, r"shape"),
    ("empty batch", lambda x, y: (x[:0], y[:0]), ValueError, r"empty"),
    ("0-d input", lambda x, y: (ft.tensor(1.0), y[:1]), ValueError,
     r"the input must be a batch \(N, \.\.\.\) of samples, got a 0-d tensor"),
    ("complex input", lambda x, y: (x.astype(np.complex64), y), TypeError, r"complex"),
    ("string input", lambda x, y: (np.full(x.shape, "a"), y), TypeError, None),
    ("uint8 images", lambda x, y: ((np.clip(x, 0, 1) * 255).astype(np.uint8), y), TypeError,
     r"inputs must be floating point, got uint8: .* scaled to \[0, 1\] \(x / 255\)"),
    ("integer input", lambda x, y: (x.astype(np.int32), y), TypeError, r"inputs must be floating point, got int32"),
    ("labels too few", lambda x, y: (x, y[:4]), ValueError, r"the batch has 8 input samples and 4 labels \(one "
     r"each\)"),
    ("labels 2-d", lambda x, y: (x, y[:, None]), ValueError, r"labels"),
    ("label = classes", lambda x, y: (x, np.where(np.arange(8) == 5, CLASSES, y)), IndexError,
     r"label 5 at position 5 is outside \[0, 5\)"),
    ("negative label", lambda x, y: (x, np.where(np.arange(8) == 2, -1, y)), IndexError, r"label -1 at position 2"),
    ("uint64 label past int64", lambda x, y: (x, np.where(np.arange(8) == 2, 2**63 + 1, y).astype(np.uint64)),
     ValueError, r"labels are read as int64: 9223372036854775809 \(uint64\) does not fit"),
])
def test_bad_batches_raise_and_change_nothing(trained, what, make, error, match):
    x, y = batch(8, seed=2)
    before = snapshot(trained)
    for call in (trained.train_step, trained.backward):
        with pytest.raises(error, match=match):
            call(*make(x, y))
        assert snapshot(trained) == before, f"{what}: {call.__name__} changed the model or optimizer"
    with pytest.raises(error):
        trained.evaluate(*make(x, y))
    assert snapshot(trained) == before
    # and the program still trains afterwards
    trained.train_step(x, y)
    assert snapshot(trained)[0] != before[0]


def test_wrong_input_shape_in_predict():
    program = compile_resnet(make_resnet())
    with pytest.raises(ValueError, match="shape"):
        program.predict(np.zeros((2, 3, 8, 9), np.float32))
    with pytest.raises(ValueError, match="1 channels, the model takes 3"):
        program.predict(np.zeros((2, 1, 8, 8), np.float32))
    # the message names both shapes predict takes: one sample, or a batch
    both = r"one sample of shape \(3, 8, 8\) or a batch of shape \(N, 3, 8, 8\), got "
    with pytest.raises(ValueError, match=both + r"\(8, 8\)$"):
        program.predict(np.zeros((8, 8), np.float32))
    with pytest.raises(ValueError, match=both + r"\(1, 2, 3, 8, 8\)$"):
        program.predict(np.zeros((1, 2, 3, 8, 8), np.float32))
    with pytest.raises(TypeError, match="got uint8"):  # ft.fit's Loader scales such images; raw bytes would not be
        program.predict(np.zeros((2, 3, 8, 8), np.uint8))


def test_labels_of_any_integer_dtype_train_as_int64(trained):
    x, y = batch(8, seed=2)
    assert trained.evaluate(x, y.astype(np.uint64)) == trained.evaluate(x, y.astype(np.int8))
    with pytest.raises(ValueError, match=r"labels are read as int64: 18446744073709551615 \(uint64\)"):
        ft.data.Loader((x, np.where(np.arange(8) == 3, 2**64 - 1, y).astype(np.uint64)), batch_size=4)


def test_float_labels_are_refused(trained):
    x, y = batch(8, seed=2)
    before = snapshot(trained)
    with pytest.raises(TypeError, match=r"labels must be integers, got float32; class probabilities .* need "
                                        r"compile\(\.\.\., target_shape=\(classes,\), target_dtype=ft.float32\)"):
        trained.train_step(x, y.astype(np.float32) + 0.5)
    assert snapshot(trained) == before


# ---------------------------------------------------------------- non-finite values

def test_nan_input_propagates_through_batch_norm_relu():
    x = np.random.default_rng(41).standard_normal((4, 3, 5, 5)).astype(np.float32)
    x[0, 1, 3, 3] = np.nan
    rm, rv = ft.zeros(3), ft.ones(3)
    out, _, _ = ft.ops.batch_norm_forward(None, None, None, ft.tensor(x), None, None, rm, rv, False, act="relu")
    out = out.numpy()
    assert np.isnan(out[0, 1, 3, 3])  # relu(nan) = nan, as in NumPy and PyTorch
    assert np.isfinite(np.delete(out.reshape(-1), np.ravel_multi_index((0, 1, 3, 3), out.shape))).all()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("act,alpha", [("relu", 0.0), ("leaky_relu", 0.0), ("leaky_relu", 0.1)])
def test_nan_and_inf_pass_a_linear_or_convolution_fused_activation(dtype, act, alpha):
    """relu(nan) = nan and relu(inf) = inf, as in NumPy and PyTorch: oneDNN's slope-0 ReLU post-op (max(x, 0))
    would give 0 for the NaN."""
    rng = np.random.default_rng(43)
    x = rng.standard_normal((3, 6)).astype(np.float32)
    x[0, 2], x[1, 4] = np.nan, np.inf
    w = np.abs(rng.standard_normal((5, 6))).astype(np.float32)  # inf reaches every output as +inf
    out = ft.ops.linear_forward(None, ft.tensor(x).to(dtype), ft.tensor(w).to(dtype), act=act, alpha=alpha)
    out = out.float().numpy()
    assert np.isnan(out[0]).all() and (out[1] == np.inf).all() and np.isfinite(out[2]).all()
    xi = rng.standard_normal((2, 2, 5, 5)).astype(np.float32)
    xi[0, 1, 2, 2] = np.nan
    wi = ft.tensor(rng.standard_normal((3, 2, 3, 3)).astype(np.float32)).to(dtype)
    out = ft.ops.conv2d_forward(None, ft.tensor(xi).to(dtype), wi, padding=1, act=act, alpha=alpha)
    out = out.float().numpy()
    hit = np.zeros((5, 5), bool)
    hit[1:4, 1:4] = True  # the 3x3 windows that read the NaN pixel
    assert np.isnan(out[0][:, hit]).all() and np.isfinite(out[0][:, ~hit]).all() and np.isfinite(out[1]).all()


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_predict_and_evaluate_of_a_nan_sample_are_nan(precision):
    if precision == "bf16-mixed" and not ft.backends.cpu_has_bf16():
        pytest.skip("bf16-mixed runs 32-true without AVX512-BF16")
    ft.manual_seed(44)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 8 * 8, 16),
                          nn.ReLU(), nn.Linear(16, CLASSES))
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=8,
                            input_shape=(3, 8, 8), precision=precision)
    x, y = batch(8, seed=5)
    x[3, 0, 0, 0] = np.nan
    logits = program.predict(x).float().numpy()
    assert np.isnan(logits[3]).all() and np.isfinite(np.delete(logits, 3, 0)).all()
    assert math.isnan(program.evaluate(x, y)[0])


def nan_loss_program(policy, seed=16):
    """No activation between the input and the logits path that could hide a NaN: a NaN pixel gives a NaN loss."""
    ft.manual_seed(seed)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(4, CLASSES))
    opt = ft.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    program = model.compile(opt, nn.CrossEntropyLoss(), batch_size=8, input_shape=(3, 8, 8), nan_policy=policy)
    program.train_step(*batch(8, seed=1))
    return program


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nonfinite_loss_raises_and_changes_nothing(bad):
    program = nan_loss_program("raise")
    x, y = batch(8, seed=3)
    x[2, 1, 4, 4] = bad
    before = snapshot(program)
    with pytest.raises(ValueError, match=r"(?i)loss is [-+]?(nan|inf)") as info:
        program.train_step(x, y)
    assert "skip" in str(info.value)  # it names the way out
    assert snapshot(program) == before
    assert np.isfinite(program.train_step(*batch(8, seed=4)))  # and training goes on


@pytest.mark.parametrize("set_to_none", [True, False])
def test_backward_of_a_nan_batch_raises_and_leaves_grad_as_it_was(set_to_none):
    """program.backward of a batch whose loss is NaN (in its first micro-batch, or in its second, after the first's
    gradients were added) is refused as train_step refuses it: .grad is what it was (None after
    zero_grad(set_to_none=True), the sum so far when accumulating), the batch-norm-free model and the optimizer
    untouched, and the next batch adds to it as if the bad one had not come."""
    program = nan_loss_program("raise")
    params = list(program.model.parameters())
    good, y = batch(16, seed=3)
    for bad_row in (2, 12):  # micro-batches of 8: the first, the second
        program.optimizer.zero_grad(set_to_none=set_to_none)
        program.backward(good[:8], y[:8])
        want = [np.array(p.grad) for p in params]
        x = good.copy()
        x[bad_row, 1, 4, 4] = np.nan
        before = snapshot(program)
        with pytest.raises(ValueError, match="backward: the loss is nan: no gradient of this batch was kept"):
            program.backward(x, y)
        assert snapshot(program) == before
        assert all(np.array_equal(p.grad, w) for p, w in zip(params, want))
        program.optimizer.zero_grad(set_to_none=set_to_none)
        with pytest.raises(ValueError, match="the loss is nan"):
            program.backward(x, y)
        assert all(p.grad is None for p in params) if set_to_none else all(not np.asarray(p.grad).any() for p in params)


def test_nan_policy_skip_skips_the_step():
    program = nan_loss_program("skip")
    x, y = batch(8, seed=3)
    x[0, 0, 0, 0] = np.nan
    before = snapshot(program)
    steps, skipped = program.step_count, program.skipped_steps
    loss = program.train_step(x, y)
    assert math.isnan(loss)
    assert program.skipped_steps == skipped + 1
    assert snapshot(program) == before  # weights and momentum untouched
    program.train_step(*batch(8, seed=4))
    assert program.skipped_steps == skipped + 1 and program.step_count == steps + 2
    assert snapshot(program)[0] != before[0]


def test_nan_policy_skip_with_adamw_keeps_the_step_count():
    ft.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, CLASSES))
    opt = ft.optim.AdamW(model.parameters(), lr=0.01)
    program = model.compile(opt, batch_size=8, input_shape=(3, 8, 8), nan_policy="skip")
    program.train_step(*batch(8, seed=1))
    x, y = batch(8, seed=3)
    x[1, 2, 3, 4] = np.nan
    before = snapshot(program)
    program.train_step(x, y)
    assert snapshot(program) == before
    assert float(opt.state_dict()["state"][0]["step"]) == 1


@pytest.mark.parametrize("policy", ["raise", "skip"])
def test_nonfinite_step_leaves_running_statistics_and_the_dropout_stream_alone(policy):
    ft.manual_seed(17)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Dropout(0.2), nn.Linear(4, CLASSES))  # no ReLU after the BN: the NaN
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), batch_size=8,  # reaches the loss
                            input_shape=(3, 8, 8), nan_policy=policy)
    program.train_step(*batch(8, seed=1))
    before, stream = snapshot(program), program._c.get_dropout_state()
    x, y = batch(8, seed=3)
    x[0, 0, 0, 0] = np.nan
    try:
        assert math.isnan(program.train_step(x, y)) and policy == "skip"
    except ValueError:
        assert policy == "raise"
    assert snapshot(program)[1:] == before[1:]  # the optimizer is untouched (this part holds today)
    assert {k: v for k, v in snapshot(program)[0].items() if "running" not in k} == \
        {k: v for k, v in before[0].items() if "running" not in k}  # and so are the weights
    changed = [k for k, v in snapshot(program)[0].items() if v != before[0][k]]
    assert not changed, f"changed by a step that was not applied: {changed}"  # the running statistics too
    assert program._c.get_dropout_state() == stream  # the next step draws the masks it would have drawn


def test_nan_policy_skip_skips_nonfinite_gradients():
    model = make_resnet(seed=17)
    program = compile_resnet(model, ft.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), nan_policy="skip")
    program.train_step(*batch(8, seed=1))
    before = snapshot(program)
    x, y = batch(8, seed=3)
    x[0, 0, 0, 0] = np.nan
    skipped = program.skipped_steps
    program.train_step(x, y)  # must not raise
    assert program.skipped_steps == skipped + 1
    assert {k: v for k, v in snapshot(program)[0].items() if "running" not in k} == \
        {k: v for k, v in before[0].items() if "running" not in k}
    assert snapshot(program)[1:] == before[1:]


def test_fit_names_the_step_of_a_nonfinite_loss():
    program = nan_loss_program("raise")
    batches = [batch(8, seed=k) for k in range(5)]
    batches[3][0][0, 0, 0, 0] = np.nan
    with pytest.raises(ValueError, match=r"(?i)nan") as info:
        ft.fit(program, batches, 1, progress=False)
    assert re.search(r"(?i)step\D{0,3}(3|4|5)\b", str(info.value)), str(info.value)


def test_fit_with_skipped_steps_reports_a_finite_loss():
    program = nan_loss_program("skip")
    batches = [batch(8, seed=k) for k in range(4)]
    batches[2][0][0, 0, 0, 0] = np.nan
    history = ft.fit(program, batches, 1, progress=False)
    assert program.skipped_steps == 1 and np.isfinite(history["train_loss"][0])


# ---------------------------------------------------------------- optimizers and options

def test_optimizer_of_another_model_is_refused():
    model, other = make_resnet(seed=18), make_resnet(seed=19)
    with pytest.raises(ValueError, match=r"another model.*conv2d\.weight"):
        compile_resnet(model, ft.optim.SGD(other.parameters(), lr=0.1))
    # holding the model's parameters and another model's too
    with pytest.raises(ValueError, match="another model"):
        compile_resnet(model, ft.optim.SGD(list(model.parameters()) + list(other.parameters()), lr=0.1))
    # a parameter the compiled step does not know (the optimizer was rebuilt around another model since)
    program = compile_resnet(model)
    program.optimizer.param_groups[0]["params"].append(list(other.parameters())[0])
    mine, theirs = state_bits(model), state_bits(other)
    with pytest.raises(ValueError, match="another model"):
        program.train_step(*batch(8))
    assert state_bits(model) == mine and state_bits(other) == theirs
    with pytest.raises(TypeError, match=r"compile takes one optimizer, got a list of 2: give one optimizer the "
                                        r"parameters of every module .* program.backward\(x, y\)"):
        compile_resnet(model, [ft.optim.SGD(model.parameters(), lr=0.1), ft.optim.SGD(other.parameters(), lr=0.1)])


@pytest.mark.parametrize("lr", [float("nan"), float("inf"), -0.1])
def test_non_finite_learning_rate_is_refused(trained, lr):
    opt = trained.optimizer
    with pytest.raises(ValueError, match="lr"):
        ft.optim.SGD(trained.model.parameters(), lr=lr)
    before = snapshot(trained)
    opt.param_groups[0]["lr"] = lr  # what a bad scheduler would do
    try:
        with pytest.raises(ValueError, match="lr"):
            trained.train_step(*batch(8, seed=2))
        assert state_bits(trained.model) == before[0] and snapshot(trained)[1] == before[1]
    finally:
        opt.param_groups[0]["lr"] = 0.01


def test_batches_seen_through_negative_strides_are_read_as_their_copies():
    """x[::-1] (a reversed NumPy view or tensor view) trains and predicts as its contiguous copy (it was refused with
    "oneDNN needs non-negative strides")."""
    x, y = batch(8, seed=9)
    results = []
    for viewed in (True, False):
        program = compile_resnet(make_resnet(seed=17))
        xs = (x[::-1], ft.from_numpy(x)[::-1]) if viewed else (x[::-1].copy(), ft.from_numpy(x[::-1].copy()))
        results.append((program.train_step(xs[0], y[::-1]), program.predict(xs[1]).numpy().tobytes()))
    assert results[0] == results[1]


def test_settings_changed_after_compile_are_refused_or_named():
    """A batch norm's eps changed after compile is refused by predict and evaluate too (predict used the old eps
    silently); a number a module holds that its forward reads (a temperature) changed after compile is named in a
    warning, once, since the program keeps the value compile read."""
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.bn, self.temperature = nn.Linear(4, 3), nn.BatchNorm1d(3), 1.0

        def forward(self, x):
            return self.bn(self.fc(x)) / self.temperature

    model = Scaled()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=4,
                            input_shape=(4,))
    x, y = np.ones((4, 4), np.float32), np.arange(4) % 3
    program.train_step(x, y)
    model.temperature = 10.0
    with pytest.warns(RuntimeWarning, match=r"Scaled.temperature changed from 1.0 to 10.0 after compile: the compiled "
                                            r"program keeps the value its forward \(or loss\) read"):
        program.predict(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        program.train_step(x, y)  # named once
    model.bn.eps = 10.0
    for call in (lambda: program.predict(x), lambda: program.evaluate(x, y), lambda: program.train_step(x, y)):
        with pytest.raises(ValueError, match="BatchNorm1d.eps changed from 1e-05 to 10.0 after compile"):
            call()
    model.bn.eps = 1e-5
    program.predict(x)


LAM = 0.5


def test_numbers_the_loss_reads_and_buffers_read_eagerly_are_named_when_they_change():
    """mixup's lam * CE(out, ya) + (1 - lam) * CE(out, yb) read a global (or a loss module's attribute, or a
    closure's variable, or a NumPy number) that compile fixed: a new lam each batch trained with the first one,
    silently. And (1 - self.lam) of a buffer computed eagerly stayed what compile read while the buffer itself was
    read live. Each change is named in a warning now (the program keeps what compile read)."""
    global LAM
    x, y = np.ones((4, 4), np.float32), np.arange(4) % 3

    class Mix(nn.Module):
        def __init__(self):
            super().__init__()
            self.lam = np.float64(0.5)

        def forward(self, out, y):
            return self.lam * F.cross_entropy(out, y)

    def closure():
        lam = 0.5

        def loss(out, y):
            return lam * F.cross_entropy(out, y)

        def change():
            nonlocal lam
            lam = 0.9
        return loss, change

    loss_of_closure, change_closure = closure()
    mix = Mix()
    for loss, change, name in ((lambda out, y: LAM * F.cross_entropy(out, y), lambda: globals().update(LAM=0.9),
                                "the global LAM that .*<lambda> reads"),
                               (mix, lambda: setattr(mix, "lam", np.float64(0.9)), "Mix.lam"),
                               (loss_of_closure, change_closure, "the variable lam that .*loss reads")):
        model = nn.Linear(4, 3)
        program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), loss, batch_size=4, input_shape=(4,))
        program.train_step(x, y)
        change()
        with pytest.warns(RuntimeWarning, match=f"{name} changed from .*0.5.* to .*0.9.* after compile"):
            program.train_step(x, y)
        LAM = 0.5

    class Gate(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 3)
            self.register_buffer("g", ft.tensor([0.5]))
            self.register_buffer("s", ft.tensor(1.0))

        def forward(self, x):
            h = self.fc(x)
            return self.g * h + (1 - self.g) * h * 2.0 * self.s.item()

    model = Gate()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=4,
                            input_shape=(4,))
    program.predict(x)
    model.g.fill_(0.9)
    with pytest.warns(RuntimeWarning, match=r"^g changed after compile, but what forward computed from it by eager "
                                            r"ops \(or copied of it, .*\(1 - self.g\).*\) keeps the value it had at "
                                            r"compile"):
        program.predict(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        program.predict(x)  # named once
    model.s.fill_(2.0)  # read as a Python number by .item()
    with pytest.warns(RuntimeWarning, match=r"^s changed after compile"):
        program.predict(x)


def test_bad_compile_options():
    model = make_resnet()
    with pytest.raises(ValueError, match="multiple"):
        compile_resnet(model, batch_size=8, accumulate_steps=3)
    for steps in (0, -2, 1.5):
        with pytest.raises(ValueError, match="accumulate_steps must be an int of at least 1"):
            compile_resnet(model, batch_size=8, accumulate_steps=steps)
    for size in (0, 3.5, True, "8"):
        with pytest.raises(ValueError, match="batch_size must be a positive int"):
            compile_resnet(model, batch_size=size)
    assert compile_resnet(model, batch_size=np.int64(8)).batch_size == 8
    for seed, error in ((2 ** 64, ValueError), (-2 ** 63 - 1, ValueError), (1.0, TypeError), ("1", TypeError)):
        with pytest.raises(error, match="seed"):  # 2**64 was seed 0
            compile_resnet(model, seed=seed)
    assert compile_resnet(model, seed=np.int64(1))._c.get_dropout_state() == \
        compile_resnet(model, seed=1)._c.get_dropout_state() != compile_resnet(model, seed=2)._c.get_dropout_state()
    with pytest.raises(ValueError):
        compile_resnet(model, memory_format="nchw")
    for kw in (dict(clip_grad_norm=-1.0), dict(clip_grad_norm=float("nan")), dict(nan_policy="ignore")):
        before = state_bits(model)
        with pytest.raises(ValueError):
            compile_resnet(model, **kw).train_step(*batch(8))  # at compile time or at the first step
        assert state_bits(model) == before


def test_fit_refuses_an_epoch_count_that_is_no_count():
    program = compile_resnet(make_resnet())
    before = state_bits(program.model)
    for epochs in (-1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="epochs must be an int >= 0"):
            ft.fit(program, batch(16), epochs, progress=False)
    assert state_bits(program.model) == before
    assert ft.fit(program, batch(16), 0, progress=False)["epoch"] == []


def test_a_finite_loss_with_non_finite_gradients_changes_nothing():
    """An RMSE at an exact fit: the loss is sqrt(0) = 0, its gradient sqrt'(0) * 0 = inf * 0 = NaN (as in
    PyTorch); the step must not apply it."""
    def rmse(out, target):
        return ft.sqrt(nn.functional.mse_loss(out, target, reduction="none")).mean()

    def exact_fit(**options):
        model = nn.Sequential(nn.Linear(4, 3))
        for p in model.parameters():
            p.copy_(ft.zeros(p.shape))
        return model.compile(ft.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), rmse, batch_size=8,
                             input_shape=(4,), **options)
    x, y = np.ones((8, 4), np.float32), np.zeros((8, 3), np.float32)
    program = exact_fit()
    assert program.evaluate(x, y)[0] == 0.0
    before = state_bits(program.model)
    with pytest.raises(ValueError, match=r"the gradient norm is nan; the step was skipped and the params"):
        program.train_step(x, y)
    assert state_bits(program.model) == before
    skipping = exact_fit(nan_policy="skip")
    before = state_bits(skipping.model)
    skipping.train_step(x, y)
    assert skipping.skipped_steps == 1 and state_bits(skipping.model) == before



def test_a_loss_class_given_for_an_instance_is_refused_by_name():
    model = make_resnet(seed=2)
    with pytest.raises(TypeError, match=r"the loss is the class CrossEntropyLoss; give an instance, "
                                        r"CrossEntropyLoss\(\)"):
        model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss, batch_size=8,
                      input_shape=(3, 8, 8))


def test_a_program_running_in_one_thread_refuses_calls_from_another(tmp_path):
    """While ft.fit runs the program in one thread (held here in a step callback), predict, evaluate,
    train_step, ft.save and ft.load of it from another thread raise instead of sharing its buffers (each returned
    the other's results; a save wrote weights of one step and optimizer state of another); the fit's own callback
    may still predict, and afterwards every call works."""
    import threading
    program = compile_resnet(make_resnet(seed=3))
    x, y = batch(8, seed=4)
    ft.save(tmp_path / "before.safetensors", program)
    inside, release, seen = threading.Event(), threading.Event(), []

    def hold(step, metrics):
        seen.append(program.predict(x).shape)  # the fit's own thread: allowed
        inside.set()
        release.wait(30)

    fitting = threading.Thread(target=ft.fit, args=(program, (np.concatenate([x, x]), np.concatenate([y, y])), 1),
                               kwargs=dict(step_callbacks=[hold], every_n_steps=2, progress=False, batch_size=8))
    fitting.start()
    try:
        assert inside.wait(30)
        for call in (lambda: program.predict(x), lambda: program.evaluate(x, y), lambda: program.train_step(x, y),
                     lambda: ft.save(tmp_path / "during.safetensors", program),
                     lambda: ft.load(tmp_path / "before.safetensors", program)):
            with pytest.raises(RuntimeError, match="running a call in another thread"):
                call()
        assert not (tmp_path / "during.safetensors").exists()
    finally:
        release.set()
        fitting.join(30)
    assert seen == [(8, CLASSES)] and program.step_count == 2
    before = program.evaluate(x, y)
    assert program.evaluate(x, y) == before and program.predict(x).shape == (8, CLASSES)


def test_one_sample_given_for_a_batch_says_so():
    program = compile_resnet(make_resnet(seed=4))
    x, y = batch(2, seed=5)
    for call in (program.train_step, program.evaluate):
        with pytest.raises(ValueError, match=r"take a batch, got one sample of shape \(3, 8, 8\): add the batch "
                                             r"dimension \(x\[None\], y\[None\]\)"):
            call(x[0], y[0])
    assert program.predict(x[0]).shape == (CLASSES,) and program.step_count == 0


def test_an_optimizer_over_other_tensors_says_whose_they_may_be():
    """An optimizer of another model, and one holding a loss module's own parameters (learned loss weights, which a
    compiled program trains only as the model's)."""
    model, other = nn.Linear(4, 3), nn.Linear(4, 3)
    with pytest.raises(ValueError, match=r"not parameters of this model \(an optimizer of another model\?\)"):
        model.compile(ft.optim.SGD(other.parameters(), lr=0.1), batch_size=2, input_shape=(4,))

    class Weighted(nn.Module):
        def __init__(self):
            super().__init__()
            self.log_var = nn.Parameter(ft.zeros(()))

        def forward(self, out, y):
            return nn.functional.cross_entropy(out, y) * (-self.log_var).exp() + self.log_var

    loss = Weighted()
    with pytest.raises(ValueError, match=r"the loss module's own parameters .* assign them to the model"):
        model.compile(ft.optim.SGD([*model.parameters(), *loss.parameters()], lr=0.1), loss, batch_size=2,
                      input_shape=(4,))


def test_targets_read_in_two_shapes_say_how_to_derive_one_from_the_other():
    model = nn.Linear(4, 3)
    with pytest.raises(ft.nn.TracingError, match=r"the targets are read as .* elsewhere .* F.one_hot\(y, C\)"):
        model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.MSELoss(), batch_size=2, input_shape=(4,),
                      target_shape=(), target_dtype=ft.int64)


def test_attribute_names_are_not_globals_and_a_loss_objects_numbers_are_watched():
    """self.eps and w.t() in a forward made the globals eps and t (unrelated script variables) watched: a warning
    at every step, and a crash once t became an array. A number of the object whose method (or __call__) is the loss
    is watched as a loss module's is."""
    global eps, t
    eps, t = 1.0, 2.0

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.eps = nn.Linear(4, 3), 1e-5

        def forward(self, x):
            return x @ self.fc.weight.t() + self.eps

    class Weighted:
        def __init__(self):
            self.alpha = 1.0

        def loss(self, out, y):
            return F.cross_entropy(out, y) * self.alpha

    x, y = np.ones((4, 4), np.float32), np.arange(4) % 3
    model, weighted = Net(), Weighted()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), weighted.loss, batch_size=4, input_shape=(4,))
    eps, t = 3.0, np.arange(3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        program.train_step(x, y)
    weighted.alpha = 2.0
    with pytest.warns(RuntimeWarning, match=r"Weighted.alpha changed from 1.0 to 2.0 after compile"):
        program.train_step(x, y)
