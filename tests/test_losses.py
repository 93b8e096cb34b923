"""Losses compiled into the training program: every ft.nn loss (reductions, class weights, ignore_index,
label smoothing, pos_weight), a user's own loss function or Module, several outputs, and their errors. Each
loss and gradient is checked against a float64 NumPy reference differentiated by finite differences, and
against PyTorch where it imports."""
import numpy as np
import pytest

import fasttrain as ft
from fasttrain import nn
from fasttrain.nn import functional as F
from fasttrain.testing import gradcheck

IN, OUT, N = 4, 3, 8


def softplus(z):
    return np.maximum(z, 0) + np.log1p(np.exp(-np.abs(z)))


def log_softmax(z):
    z = z - z.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def reduce(values, reduction, divisor=None):
    if reduction == "none":
        return values
    if reduction == "sum":
        return values.sum()
    if reduction == "batchmean":
        return values.sum() / values.shape[0]
    return values.sum() / (values.size if divisor is None else divisor)


def class_loss(logp, y, weight, ignore, reduction, smoothing=0.0):
    """PyTorch's cross-entropy (nll of log-probabilities when smoothing is 0) with class weights."""
    C = logp.shape[1]
    w = np.ones(C) if weight is None else weight
    keep = y != ignore
    t = np.where(keep, y, 0)
    nll = -logp[np.arange(len(y)), t] * w[t]
    smooth = -(logp * w).sum(axis=1) / C
    values = ((1 - smoothing) * nll + smoothing * smooth) * keep
    return reduce(values, reduction, divisor=(w[t] * keep).sum())


LOSSES = {
    "cross_entropy": (lambda: nn.CrossEntropyLoss(), "class",
                      lambda z, y: class_loss(log_softmax(z), y, None, -100, "mean")),
    "cross_entropy weighted": (
        lambda: nn.CrossEntropyLoss(weight=ft.tensor([0.5, 2.0, 1.0]), ignore_index=1, label_smoothing=0.1),
        "class", lambda z, y: class_loss(log_softmax(z), y, np.array([0.5, 2.0, 1.0]), 1, "mean", 0.1)),
    "cross_entropy sum": (lambda: nn.CrossEntropyLoss(reduction="sum"), "class",
                          lambda z, y: class_loss(log_softmax(z), y, None, -100, "sum")),
    "nll weighted": (lambda: nn.NLLLoss(weight=ft.tensor([1.0, 3.0, 0.5])), "class",
                     lambda z, y: class_loss(z, y, np.array([1.0, 3.0, 0.5]), -100, "mean")),
    "mse": (lambda: nn.MSELoss(), "real", lambda z, t: reduce((z - t) ** 2, "mean")),
    "mse sum": (lambda: nn.MSELoss(reduction="sum"), "real", lambda z, t: reduce((z - t) ** 2, "sum")),
    "l1": (lambda: nn.L1Loss(), "real", lambda z, t: reduce(np.abs(z - t), "mean")),
    "smooth_l1": (lambda: nn.SmoothL1Loss(beta=0.5), "real",
                  lambda z, t: reduce(np.where(np.abs(z - t) < 0.5, 0.5 * (z - t) ** 2 / 0.5, np.abs(z - t) - 0.25),
                                      "mean")),
    "huber": (lambda: nn.HuberLoss(delta=0.7, reduction="sum"), "real",
              lambda z, t: reduce(np.where(np.abs(z - t) < 0.7, 0.5 * (z - t) ** 2, 0.7 * (np.abs(z - t) - 0.35)),
                                  "sum")),
    "bce_with_logits": (
        lambda: nn.BCEWithLogitsLoss(weight=ft.tensor([1.0, 0.5, 2.0]), pos_weight=ft.tensor([3.0, 1.0, 0.5])),
        "prob", lambda z, t: reduce(np.array([1.0, 0.5, 2.0]) * (
            -np.array([3.0, 1.0, 0.5]) * t * -softplus(-z) - (1 - t) * -softplus(z)), "mean")),
    "kl_div batchmean": (lambda: nn.KLDivLoss(reduction="batchmean"), "prob_rows",
                         lambda z, t: reduce(np.where(t > 0, t * np.log(np.where(t > 0, t, 1)), 0) - t * z,
                                             "batchmean")),
}


def targets(kind, n=N, seed=1):
    rng = np.random.default_rng(seed)
    if kind == "class":
        return rng.integers(0, OUT, n)
    if kind == "real":
        return rng.standard_normal((n, OUT)).astype(np.float32)
    if kind == "prob":
        return rng.uniform(0, 1, (n, OUT)).astype(np.float32)
    p = rng.uniform(0, 1, (n, OUT))
    p[0, 1] = 0  # a zero probability: its x log x term is 0
    return (p / p.sum(axis=1, keepdims=True)).astype(np.float32)


def make_model(seed=0):
    ft.manual_seed(seed)
    model = nn.Linear(IN, OUT)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N, IN)).astype(np.float32)
    return model, x


def reference_grads(ref, W, b, x, y):
    """The reference loss in float64 and its gradient by central differences."""
    def loss(W, b):
        return ref(x.astype(np.float64) @ W.T + b, y)

    eps = 1e-6
    gW, gb = np.zeros_like(W), np.zeros_like(b)
    for p, g in ((W, gW), (b, gb)):
        for i in np.ndindex(p.shape):
            old = p[i]
            p[i] = old + eps
            hi = loss(W, b)
            p[i] = old - eps
            lo = loss(W, b)
            p[i] = old
            g[i] = (hi - lo) / (2 * eps)
    return loss(W, b), gW, gb


@pytest.mark.parametrize("name", LOSSES)
def test_compiled_loss_and_gradient_match_the_reference(name):
    make, kind, ref = LOSSES[name]
    model, x = make_model()
    y = targets(kind)
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), make(), batch_size=N, input_shape=(IN,))
    loss = program.backward(x, y)
    W, b = model.weight.numpy().astype(np.float64), model.bias.numpy().astype(np.float64)
    want, gW, gb = reference_grads(ref, W, b, x, y)
    assert loss == pytest.approx(want, rel=1e-5, abs=1e-6)
    np.testing.assert_allclose(model.weight.grad.numpy(), gW, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(model.bias.grad.numpy(), gb, rtol=1e-4, atol=1e-5)
    # eval mode computes the same loss (no batch norm or dropout here); accuracy only for class targets
    val, acc = program.evaluate(x, y)
    assert val == pytest.approx(want, rel=1e-5, abs=1e-6)
    assert (acc is None) == (kind != "class")
    # the eager forward of the same loss agrees
    eager = make()(ft.tensor(x @ W.T.astype(np.float32) + b.astype(np.float32)), ft.tensor(y))
    assert float(eager.item()) == pytest.approx(want, rel=1e-4, abs=1e-5)


@pytest.mark.parametrize("name", ["cross_entropy weighted", "nll weighted", "mse", "bce_with_logits",
                                  "kl_div batchmean"])
def test_micro_batches_normalize_by_the_whole_batch(name):
    """accumulate_steps splits the batch, yet the loss and gradient are the whole batch's: a weighted mean's
    divisor is the weights of all its labels, not a micro-batch's."""
    make, kind, _ = LOSSES[name]
    y = targets(kind)
    results = []
    for steps in (1, 4):
        model, x = make_model()
        program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), make(), batch_size=N, input_shape=(IN,),
                                 accumulate_steps=steps)
        results.append((program.backward(x, y), model.weight.grad.numpy().copy()))
    assert results[1][0] == pytest.approx(results[0][0], rel=1e-6)
    np.testing.assert_allclose(results[1][1], results[0][1], rtol=1e-5, atol=1e-7)


class TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(IN, 6)
        self.cls = nn.Linear(6, OUT)
        self.aux = nn.Linear(6, 2)

    def forward(self, x):
        h = F.relu(self.body(x))
        return self.cls(h), self.aux(h)


def test_user_loss_function_with_two_outputs_and_two_losses():
    """A weighted sum of cross-entropy on one head and an L2 penalty on the other: part of the traced graph."""
    def loss_fn(outputs, y):
        logits, aux = outputs
        return 0.7 * F.cross_entropy(logits, y) + 0.3 * (aux * aux).mean()

    ft.manual_seed(3)
    model = TwoHeads()
    x, y = make_model()[1], targets("class")
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), loss_fn, batch_size=N, input_shape=(IN,))
    loss = program.backward(x, y)
    p = {k: v.astype(np.float64) for k, v in model.state_dict().items()}

    def ref(p):
        h = np.maximum(x @ p["body.weight"].T + p["body.bias"], 0)
        logits, aux = h @ p["cls.weight"].T + p["cls.bias"], h @ p["aux.weight"].T + p["aux.bias"]
        return 0.7 * class_loss(log_softmax(logits), y, None, -100, "mean") + 0.3 * (aux ** 2).mean()

    assert loss == pytest.approx(ref(p), rel=1e-5)
    eps = 1e-6
    for name in ("aux.weight", "body.bias", "cls.weight"):
        got = dict(model.named_parameters())[name].grad.numpy()
        for i in np.ndindex(p[name].shape):
            q = {k: v.copy() for k, v in p.items()}
            q[name][i] += eps
            hi = ref(q)
            q[name][i] -= 2 * eps
            assert got[i] == pytest.approx((hi - ref(q)) / (2 * eps), rel=1e-3, abs=1e-5), (name, i)
    assert program.predict(x).shape == (N, OUT)  # the first output
    assert program.evaluate(x, y)[1] is not None


class ContrastiveLoss(nn.Module):
    """A user's loss Module: per-sample cross-entropy (reduction='none') weighted, then reduced by hand."""

    def __init__(self):
        super().__init__()
        self.ce = nn.CrossEntropyLoss(reduction="none")

    def forward(self, logits, y):
        return (self.ce(logits, y) * 2.0).mean() + F.l1_loss(logits, logits * 0.5)


def test_user_loss_module_reduces_per_sample_losses():
    model, x = make_model()
    y = targets("class")
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), ContrastiveLoss(), batch_size=N,
                            input_shape=(IN,))
    loss = program.backward(x, y)
    z = x.astype(np.float64) @ model.weight.numpy().T.astype(np.float64) + model.bias.numpy()
    want = 2 * class_loss(log_softmax(z), y, None, -100, "mean") + np.abs(0.5 * z).mean()
    assert loss == pytest.approx(want, rel=1e-5)


def test_a_loss_of_the_outputs_alone_reads_no_targets():
    model, x = make_model()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), lambda out, y: (out * out).sum(),
                            batch_size=N, input_shape=(IN,))
    z = x @ model.weight.numpy().T + model.bias.numpy()
    assert program.backward(x, None) == pytest.approx(float((z.astype(np.float64) ** 2).sum()), rel=1e-5)
    np.testing.assert_allclose(model.bias.grad.numpy(), 2 * z.sum(axis=0), rtol=1e-4, atol=1e-5)
    assert program.evaluate(x, np.zeros(N)) [1] is None


def test_training_with_each_loss_lowers_it():
    for name, (make, kind, _) in LOSSES.items():
        model, x = make_model()
        y = targets(kind)
        program = model.compile(ft.optim.SGD(model.parameters(), lr=0.05), make(), batch_size=N, input_shape=(IN,))
        first = program.train_step(x, y)
        for _ in range(20):
            last = program.train_step(x, y)
        assert last < first, name


@pytest.mark.parametrize("loss, error, match", [
    (nn.CrossEntropyLoss(reduction="none"), ft.nn.TracingError, r"per-sample values.*reduce them"),
    (lambda out, y: F.mse_loss(out, y) * F.mse_loss(out, y), ft.nn.TracingError, r"already reduced.*linearly"),
    (lambda out, y: out, ft.nn.TracingError, r"per-sample values"),
    (lambda out, y: F.cross_entropy(out, y) + F.mse_loss(out, y), ft.nn.TracingError, r"targets are read as"),
    (nn.CrossEntropyLoss(weight=ft.tensor([1.0, 2.0])), ValueError, r"2 class weights for 3 classes"),
    ("mse", TypeError, r"loss must be"),
])
def test_bad_losses_are_refused_naming_the_problem(loss, error, match):
    model, _ = make_model()
    with pytest.raises(error, match=match):
        model.compile(ft.optim.SGD(model.parameters(), lr=0.1), loss, batch_size=N, input_shape=(IN,))


def test_bad_targets_are_refused_and_change_nothing():
    model, x = make_model()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.MSELoss(), batch_size=N, input_shape=(IN,))
    before = model.weight.numpy().copy()
    with pytest.raises(ValueError, match=r"targets should be a batch of samples of shape \(3,\)"):
        program.train_step(x, np.zeros((N, 2), np.float32))
    classes = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.NLLLoss(ignore_index=0), batch_size=N,
                            input_shape=(IN,))
    with pytest.raises(IndexError, match=r"label 3 at position 2 is outside \[0, 3\)"):
        classes.train_step(x, np.array([0, 1, 3, 0, 0, 0, 0, 0]))
    with pytest.raises(ValueError, match=r"every target of the batch is ignored"):
        classes.train_step(x, np.zeros(N, np.int64))
    np.testing.assert_array_equal(model.weight.numpy(), before)


@pytest.mark.parametrize("loss", [nn.MSELoss, nn.L1Loss, nn.BCEWithLogitsLoss])
def test_a_column_output_takes_targets_of_shape_n(loss):
    """An (N, 1) output with targets (N,): each sample's value against its own target, exactly as with the explicit
    (N, 1) targets (PyTorch would broadcast the pair to an (N, N) loss): the compiled steps and evaluation bit for
    bit, and the eager loss; the MSE against NumPy."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((N, IN)).astype(np.float32)
    t = rng.random(N).astype(np.float32)
    runs = []
    for target in (t, t[:, None]):
        ft.manual_seed(2)
        model = nn.Linear(IN, 1)
        program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), loss(), batch_size=N, input_shape=(IN,))
        runs.append((program.train_step(x, target), program.train_step(x, target), program.evaluate(x, target),
                     model.weight.numpy().tobytes()))
    assert runs[0] == runs[1]
    out = model(ft.from_numpy(x))
    eager = loss()(out, ft.from_numpy(t)).item()
    assert eager == loss()(out, ft.from_numpy(t[:, None])).item()
    if loss is nn.MSELoss:
        assert eager == pytest.approx(np.mean((out.numpy()[:, 0].astype(np.float64) - t) ** 2), rel=1e-6)
    wide = nn.Linear(IN, 2)  # only a column output reads (N,) targets so
    program = wide.compile(ft.optim.SGD(wide.parameters(), lr=0.1), loss(), batch_size=N, input_shape=(IN,))
    with pytest.raises(ValueError, match=r"targets should be a batch of samples of shape \(2,\)"):
        program.train_step(x, t)
    with pytest.raises(ValueError, match=r"target should have the shape of input \(8, 2\)"):
        loss()(wide(ft.from_numpy(x)), ft.from_numpy(t))


TORCH_LOSSES = {
    "cross_entropy weighted": lambda torch: torch.nn.CrossEntropyLoss(weight=torch.tensor([0.5, 2.0, 1.0]),
                                                                      ignore_index=1, label_smoothing=0.1),
    "nll weighted": lambda torch: torch.nn.NLLLoss(weight=torch.tensor([1.0, 3.0, 0.5])),
    "l1": lambda torch: torch.nn.L1Loss(),
    "smooth_l1": lambda torch: torch.nn.SmoothL1Loss(beta=0.5),
    "huber": lambda torch: torch.nn.HuberLoss(delta=0.7, reduction="sum"),
    "bce_with_logits": lambda torch: torch.nn.BCEWithLogitsLoss(weight=torch.tensor([1.0, 0.5, 2.0]),
                                                                pos_weight=torch.tensor([3.0, 1.0, 0.5])),
    "kl_div batchmean": lambda torch: torch.nn.KLDivLoss(reduction="batchmean"),
}


@pytest.mark.parametrize("name", TORCH_LOSSES)
def test_losses_match_pytorch(name):
    torch = pytest.importorskip("torch")
    make, kind, _ = LOSSES[name]
    model, x = make_model()
    y = targets(kind)
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), make(), batch_size=N, input_shape=(IN,))
    loss = program.backward(x, y)
    tm = torch.nn.Linear(IN, OUT)
    with torch.no_grad():
        tm.weight.copy_(torch.from_numpy(model.weight.numpy()))
        tm.bias.copy_(torch.from_numpy(model.bias.numpy()))
    want = TORCH_LOSSES[name](torch)(tm(torch.from_numpy(x)), torch.from_numpy(y))
    want.backward()
    assert loss == pytest.approx(want.item(), rel=1e-5, abs=1e-6)
    np.testing.assert_allclose(model.weight.grad.numpy(), tm.weight.grad.numpy(), rtol=1e-4, atol=1e-6)


def smoothed_by_hand(out, y, eps=0.1):
    """Label smoothing written with F.one_hot, as PyTorch code did before CrossEntropyLoss(label_smoothing=)."""
    soft = F.one_hot(y, OUT).float() * (1 - eps) + eps / OUT
    return -(soft * F.log_softmax(out, dim=1)).sum(1).mean()


def focal(out, y, gamma=2.0):
    logp = F.log_softmax(out, 1)
    return -(F.one_hot(y, num_classes=OUT) * (1 - logp.exp()) ** gamma * logp).sum(dim=1).mean()


ALPHA = ft.tensor(np.linspace(0.25, 1.0, OUT).astype(np.float32))


@pytest.mark.parametrize("pick", [lambda y: ALPHA.gather(0, y), lambda y: ALPHA[y]], ids=["gather", "index"])
def test_per_class_weights_picked_at_the_labels_weigh_each_sample(pick):
    """A focal loss's alpha_t, alpha.gather(0, y) or alpha[y] of a 1-d tensor: each sample's loss times its class's
    weight, as NumPy; gradients by central differences."""
    model, x = make_model()
    y = targets("class")
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1),
                            lambda out, y: (pick(y) * F.cross_entropy(out, y, reduction="none")).mean(),
                            batch_size=N, input_shape=(IN,))
    logp = log_softmax(x.astype(np.float64) @ model.weight.numpy().T + model.bias.numpy())
    want = (ALPHA.numpy()[y] * -logp[np.arange(N), y]).mean()
    assert program.evaluate(x, y)[0] == pytest.approx(want, rel=1e-5)
    assert gradcheck(program, x, y)


def test_one_hot_targets_in_a_loss_train_as_the_built_in_label_smoothing():
    y = targets("class")
    weights = []
    for loss in (smoothed_by_hand, nn.CrossEntropyLoss(label_smoothing=0.1)):
        model, x = make_model()
        program = model.compile(ft.optim.SGD(model.parameters(), lr=0.5), loss, batch_size=N, input_shape=(IN,))
        for _ in range(3):
            program.train_step(x, y)
        weights.append(model.weight.numpy())
    np.testing.assert_allclose(weights[0], weights[1], rtol=1e-5, atol=1e-6)


def test_a_focal_loss_of_one_hot_targets_matches_numpy_and_finite_differences():
    model, x = make_model()
    y = targets("class")
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), focal, batch_size=N, input_shape=(IN,))
    logp = log_softmax(x.astype(np.float64) @ model.weight.numpy().T + model.bias.numpy())
    want = -((np.eye(OUT)[y] * (1 - np.exp(logp)) ** 2 * logp).sum(1)).mean()
    assert program.evaluate(x, y)[0] == pytest.approx(want, rel=1e-5)
    assert gradcheck(program, x, y)


def test_one_hot_of_per_position_labels_follows_the_target_shape():
    """(N, L) labels given by target_shape become (N, L, C) rows (a segmentation or sequence loss)."""
    ft.manual_seed(0)
    model = nn.Conv1d(2, OUT, 1)
    x = np.random.default_rng(2).standard_normal((N, 2, 5)).astype(np.float32)
    y = np.random.default_rng(3).integers(0, OUT, (N, 5))

    def dice(out, y):
        p, t = out.softmax(1), F.one_hot(y, OUT).permute(0, 2, 1)
        return (1 - 2 * (p * t).sum(2) / (p + t).sum(2)).mean()

    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), dice, batch_size=N, input_shape=(2, 5),
                            target_shape=(5,), target_dtype=ft.int64)
    z = np.einsum("oc,ncl->nol", model.weight.numpy()[..., 0].astype(np.float64), x) + model.bias.numpy()[:, None]
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    t = np.eye(OUT)[y].transpose(0, 2, 1)
    want = (1 - 2 * (p * t).sum(2) / (p + t).sum(2)).mean()
    assert program.evaluate(x, y)[0] == pytest.approx(want, rel=1e-5)
    assert gradcheck(program, x, y)


def test_labels_outside_the_one_hot_classes_are_refused_before_the_step():
    model, x = make_model()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), focal, batch_size=N, input_shape=(IN,))
    before = model.weight.numpy().copy()
    y = targets("class")
    y[5] = OUT
    with pytest.raises(IndexError, match=rf"one_hot: label {OUT} at position 5 is outside \[0, {OUT}\)"):
        program.train_step(x, y)
    np.testing.assert_array_equal(model.weight.numpy(), before)
    assert program.step_count == 0


@pytest.mark.parametrize("loss, message", [
    (lambda out, y: (F.one_hot(y) * out).sum(), "F.one_hot without num_classes"),
    (lambda out, y: F.one_hot(out, OUT).sum(), "F.one_hot of float32 values cannot be compiled"),
    (lambda out, y: (F.one_hot(y.clamp(max=1), OUT) * out).sum(), "F.one_hot of labels computed from the targets "
     "cannot be compiled.* map labels in the data"),
])
def test_one_hot_that_cannot_compile_names_the_way_out(loss, message):
    model, _ = make_model()
    with pytest.raises(ft.nn.TracingError, match=message):
        model.compile(ft.optim.SGD(model.parameters(), lr=0.1), loss, batch_size=N, input_shape=(IN,))


def test_a_focal_loss_matches_pytorch():
    torch = pytest.importorskip("torch")
    model, x = make_model()
    y = targets("class")
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), focal, batch_size=N, input_shape=(IN,))
    loss = program.backward(x, y)
    tm = torch.nn.Linear(IN, OUT)
    with torch.no_grad():
        tm.weight.copy_(torch.from_numpy(model.weight.numpy()))
        tm.bias.copy_(torch.from_numpy(model.bias.numpy()))
    tf = torch.nn.functional
    logp = tf.log_softmax(tm(torch.from_numpy(x)), 1)
    want = -(tf.one_hot(torch.from_numpy(y), OUT) * (1 - logp.exp()) ** 2 * logp).sum(1).mean()
    want.backward()
    assert loss == pytest.approx(want.item(), rel=1e-5)
    np.testing.assert_allclose(model.weight.grad.numpy(), tm.weight.grad.numpy(), rtol=1e-4, atol=1e-6)


SOFT_CASES = [{}, {"label_smoothing": 0.1}, {"weight": [0.5, 1.0, 2.0]}, {"reduction": "sum"}]


def soft_targets():
    return np.random.default_rng(4).dirichlet(np.ones(OUT), N).astype(np.float32)


@pytest.mark.parametrize("case", SOFT_CASES, ids=str)
def test_cross_entropy_of_class_probabilities_matches_numpy(case):
    """Mixup's or a teacher's probabilities as targets (compile(target_shape=(C,), target_dtype=ft.float32)), as
    PyTorch's CrossEntropyLoss takes them, compiled and eagerly (which refused them)."""
    kw = dict(case, weight=ft.tensor(np.array(case["weight"], np.float32))) if "weight" in case else case
    model, x = make_model()
    t = soft_targets()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(**kw), batch_size=N,
                            input_shape=(IN,), target_shape=(OUT,), target_dtype=ft.float32)
    W, b = model.weight.numpy().astype(np.float64), model.bias.numpy().astype(np.float64)
    s = case.get("label_smoothing", 0.0)
    w = np.array(case.get("weight", np.ones(OUT)))

    def ref(z, t):
        per = -((t * (1 - s) + s / OUT) * w * log_softmax(z)).sum(1)
        return per.sum() if case.get("reduction") == "sum" else per.mean()

    loss = program.backward(x, t)
    want, gW, _ = reference_grads(ref, W, b, x, t)
    assert loss == pytest.approx(want, rel=1e-5)
    np.testing.assert_allclose(model.weight.grad.numpy(), gW, rtol=1e-3, atol=1e-5)
    eager = nn.CrossEntropyLoss(**kw)(model(ft.tensor(x)), ft.tensor(t)).item()
    assert eager == pytest.approx(ref(x.astype(np.float64) @ W.T + b, t), rel=1e-5)
    one = F.cross_entropy(model(ft.tensor(x))[0], ft.tensor(t[0]), **kw).item()  # one unbatched sample
    assert one == pytest.approx(ref(x[:1].astype(np.float64) @ W.T + b, t[:1]), rel=1e-5)
    with pytest.raises(TypeError, match=r"or class probabilities of the input's shape \(8, 3\); got float32 of shape "
                                        r"\(8, 2\)"):
        F.cross_entropy(model(ft.tensor(x)), ft.tensor(t[:, :2]))


def test_cross_entropy_of_a_teachers_probabilities_trains_the_student_only():
    class Distilled(nn.Module):
        def __init__(self):
            super().__init__()
            self.student, self.teacher = nn.Linear(IN, OUT), nn.Linear(IN, OUT)
            self.teacher.requires_grad_(False)

        def forward(self, x):
            return self.student(x), self.teacher(x)

    model = Distilled()
    _, x = make_model()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1),
                            lambda out, y: F.cross_entropy(out[0], F.softmax(out[1] / 2.0, 1)), batch_size=N,
                            input_shape=(IN,))
    teacher = model.teacher.weight.numpy().copy()
    t = np.exp(log_softmax((x @ teacher.T + model.teacher.bias.numpy()) / 2.0))
    want = -(t * log_softmax(x @ model.student.weight.numpy().T + model.student.bias.numpy())).sum(1).mean()
    assert program.train_step(x, None) == pytest.approx(want, rel=1e-5)
    np.testing.assert_array_equal(model.teacher.weight.numpy(), teacher)


def test_binary_cross_entropy_of_probabilities_matches_numpy_eagerly_and_compiled():
    p = np.array([[0.0, 0.3, 1.0], [0.9, 0.5, 0.2]], np.float32)
    y = np.array([[1.0, 0.5, 0.0], [1.0, 0.0, 0.3]], np.float32)
    w = np.array([1.0, 2.0, 0.5], np.float32)
    with np.errstate(divide="ignore"):  # log(0) = -inf, held at -100
        values = -w * (y * np.maximum(np.log(p.astype(np.float64)), -100)
                       + (1 - y) * np.maximum(np.log(1 - p.astype(np.float64)), -100))
    got = F.binary_cross_entropy(ft.tensor(p), ft.tensor(y), ft.tensor(w)).item()
    assert got == pytest.approx(values.mean(), rel=1e-6)
    assert nn.BCELoss(reduction="sum")(ft.tensor(p), ft.tensor(y)).item() == pytest.approx(
        (values / w).sum(), rel=1e-6)
    with pytest.raises(ValueError, match="every element of input must be a probability"):
        F.binary_cross_entropy(ft.tensor(p + 0.5), ft.tensor(y))
    model, x = make_model()
    yt = targets("prob")
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1),
                            lambda out, y: F.binary_cross_entropy(out.sigmoid(), y), batch_size=N, input_shape=(IN,))
    z = 1 / (1 + np.exp(-(x.astype(np.float64) @ model.weight.numpy().T + model.bias.numpy())))
    want = -(yt * np.log(z) + (1 - yt) * np.log(1 - z)).mean()
    assert program.evaluate(x, yt)[0] == pytest.approx(want, rel=1e-5)
    assert gradcheck(program, x, yt)


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_sigmoid_and_bce_loss_train_through_saturated_outputs(precision):
    """A model ending in nn.Sigmoid with nn.BCELoss (the DCGAN tutorial's discriminator): an output that rounds to
    exactly 1 (a logit of 20 in float32; in bfloat16 any above about 6, which the mixed program no longer stores)
    passes no gradient, as PyTorch's, instead of NaN (which refused every step); the others pass (p - y) / count,
    the loss is NumPy's of float32 probabilities (a log(1 - p) of a p of exactly 1 held at -100)."""
    model = nn.Sequential(nn.Linear(2, 3), nn.Sigmoid())
    w = np.array([[20.0, 0.0], [7.0, 0.0], [0.5, 0.0]], np.float32)  # logits x0 * (20, 7, 0.5)
    model.load_state_dict({"0.weight": w, "0.bias": np.zeros(3, np.float32)})
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.BCELoss(), batch_size=4, input_shape=(2,),
                            precision=precision)
    x = np.array([[1, 0], [1, 1], [-1, 0], [0.5, 0]], np.float32)
    y = np.array([[1, 0.9, 1], [0, 1, 0.5], [0, 0, 1], [1, 1, 0]], np.float32)
    z = x @ w.T
    p = (1 / (1 + np.exp(-z))).astype(np.float64)
    with np.errstate(divide="ignore"):
        want = -(y * np.maximum(np.log(p), -100) + (1 - y) * np.maximum(np.log1p(-p), -100)).mean()
    saturated = p == 1
    dz = np.where(saturated, 0.0, p - y) / y.size
    assert program.backward(x, y) == pytest.approx(want, rel=1e-5 if precision == "32-true" else 1e-3)
    got = model[0].weight.grad.numpy()
    assert np.all(np.isfinite(got)) and saturated.any()
    np.testing.assert_allclose(got, dz.T @ x, rtol=1e-4 if precision == "32-true" else 3e-2, atol=1e-7)


def test_a_sigmoid_auxiliary_output_keeps_float32_probabilities_in_bf16_mixed():
    """A second output of probabilities that only the loss reads computes in float32 as the first output would:
    in bfloat16 p = sigmoid(7) rounded to 1 and BCELoss's log(1 - p) to its floor (a loss of 5.3, not 0.61)."""
    class TwoHeads(nn.Module):
        def __init__(self):
            super().__init__()
            self.main, self.aux = nn.Linear(2, 3), nn.Linear(2, 1)

        def forward(self, x):
            return self.main(x), self.aux(x).sigmoid()

    model = TwoHeads()
    model.load_state_dict({"main.weight": np.zeros((3, 2), np.float32), "main.bias": np.zeros(3, np.float32),
                           "aux.weight": np.array([[7.0, 0.0]], np.float32), "aux.bias": np.zeros(1, np.float32)})
    x, y = np.array([[1, 0], [1, 1], [0.5, 0], [-1, 0]], np.float32), np.array([[0.0], [1.0], [1.0], [0.0]], np.float32)
    p = (1 / (1 + np.exp(-7.0 * x[:, :1]))).astype(np.float64)
    want = -(y * np.log(p) + (1 - y) * np.log1p(-p)).mean()
    for precision in ("32-true", "bf16-mixed"):
        program = model.compile(ft.optim.SGD(model.parameters(), lr=0.0), lambda out, t: F.binary_cross_entropy(
            out[1], t), batch_size=4, input_shape=(2,), target_shape=(1,), precision=precision)
        assert program.backward(x, y) == pytest.approx(want, rel=1e-3), precision


def test_kl_div_of_log_probability_targets_matches_numpy():
    model, x = make_model()
    t = np.log(np.random.default_rng(5).dirichlet(np.ones(OUT), N)).astype(np.float32)
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1),
                            lambda out, y: F.kl_div(F.log_softmax(out, 1), y, reduction="batchmean", log_target=True),
                            batch_size=N, input_shape=(IN,))
    W, b = model.weight.numpy().astype(np.float64), model.bias.numpy().astype(np.float64)
    want, gW, _ = reference_grads(lambda z, t: (np.exp(t) * (t - log_softmax(z))).sum() / N, W, b, x, t)
    assert program.backward(x, t) == pytest.approx(want, rel=1e-5)
    np.testing.assert_allclose(model.weight.grad.numpy(), gW, rtol=1e-3, atol=1e-5)


def _softplus(v):
    return np.logaddexp(0, v)


# name: (the loss of (out, y) on (N, 4) outputs, NumPy's value of the same, the targets)
MORE_LOSSES = {
    "soft_margin": (lambda o, y: F.soft_margin_loss(o, y), lambda o, y: _softplus(-y * o).mean(),
                    lambda rng: np.where(rng.random((6, 4)) > 0.5, 1.0, -1.0)),
    "multilabel_soft_margin": (lambda o, y: nn.MultiLabelSoftMarginLoss(weight=ft.tensor([1.0, 2.0, 0.5, 1.0]))(o, y),
                               lambda o, y: ((y * _softplus(-o) + (1 - y) * _softplus(o)) * [1.0, 2.0, 0.5, 1.0])
                               .mean(1).mean(),
                               lambda rng: (rng.random((6, 4)) > 0.5).astype(float)),
    "gaussian_nll": (lambda o, y: nn.GaussianNLLLoss(full=True)(o[:, :2], y[:, :2], o[:, 2:].exp()),
                     lambda o, y: (0.5 * (o[:, 2:] + (o[:, :2] - y[:, :2]) ** 2 / np.exp(o[:, 2:]))
                                   + 0.5 * np.log(2 * np.pi)).mean(),
                     lambda rng: rng.standard_normal((6, 4))),
    "poisson_nll": (lambda o, y: F.poisson_nll_loss(o, y, reduction="sum"), lambda o, y: (np.exp(o) - y * o).sum(),
                    lambda rng: rng.poisson(2.0, (6, 4)).astype(float)),
}


@pytest.mark.parametrize("name", MORE_LOSSES)
def test_losses_written_with_other_ops_match_numpy_eagerly_and_compiled(name):
    loss, reference, targets = MORE_LOSSES[name]
    rng = np.random.default_rng(30)
    x, y = rng.standard_normal((6, 3)).astype(np.float32), targets(rng).astype(np.float32)
    ft.manual_seed(31)
    model = nn.Linear(3, 4)
    out = model(ft.tensor(x))
    want = reference(out.numpy().astype(np.float64), y.astype(np.float64))
    assert loss(out, ft.tensor(y)).item() == pytest.approx(want, rel=1e-5)
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), loss, batch_size=6, input_shape=(3,),
                            target_shape=(4,), target_dtype=ft.float32)
    assert program.evaluate(x, y)[0] == pytest.approx(want, rel=1e-5)
    assert gradcheck(program, x, y, eps=1e-3, rtol=3e-2, atol=1e-3)


def test_losses_written_with_other_ops_match_pytorch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(32)
    x, var = rng.standard_normal((5, 4)).astype(np.float32), rng.uniform(0.1, 2, (5, 4)).astype(np.float32)
    signs, counts = np.where(rng.random((5, 4)) > 0.5, 1.0, -1.0).astype(np.float32), rng.poisson(2, (5, 4))
    counts = counts.astype(np.float32)
    for red in ("mean", "sum", "none"):
        for ours, theirs, args in [
                (nn.SoftMarginLoss(reduction=red), torch.nn.SoftMarginLoss(reduction=red), (x, signs)),
                (nn.MultiLabelSoftMarginLoss(reduction=red), torch.nn.MultiLabelSoftMarginLoss(reduction=red),
                 (x, (signs > 0).astype(np.float32))),
                (nn.GaussianNLLLoss(reduction=red), torch.nn.GaussianNLLLoss(reduction=red), (x, signs, var)),
                (nn.PoissonNLLLoss(reduction=red), torch.nn.PoissonNLLLoss(reduction=red), (x, counts)),
                (nn.PoissonNLLLoss(log_input=False, reduction=red),
                 torch.nn.PoissonNLLLoss(log_input=False, reduction=red), (np.abs(x), counts))]:
            np.testing.assert_allclose(ours(*map(ft.tensor, args)).numpy(),
                                       theirs(*map(torch.from_numpy, args)).numpy(), rtol=1e-5, atol=1e-6)
    model, theirs = nn.Linear(3, 4), torch.nn.Linear(3, 4)  # variances below eps: clamped, the gradient passes on
    model.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})

    def gaussian(o, y, lib):
        return lib.nn.functional.gaussian_nll_loss(o[:, :2], y, o[:, 2:].abs() * 0.5, eps=0.5)
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), lambda o, y: gaussian(o, y, ft), batch_size=5,
                            input_shape=(3,), target_shape=(2,))
    inputs, means = rng.standard_normal((5, 3)).astype(np.float32), rng.standard_normal((5, 2)).astype(np.float32)
    loss = program.backward(inputs, means)
    want = gaussian(theirs(torch.from_numpy(inputs)), torch.from_numpy(means), torch)
    want.backward()
    assert loss == pytest.approx(want.item(), rel=1e-5)
    for ours, p in zip(model.parameters(), theirs.parameters()):
        np.testing.assert_allclose(ours.grad.numpy(), p.grad.numpy(), rtol=1e-4, atol=1e-6)
    with pytest.raises(NotImplementedError, match="full=True"):
        nn.PoissonNLLLoss(full=True)
    with pytest.raises(ValueError, match="eps must be >= 0"):
        F.gaussian_nll_loss(ft.ones(2), ft.ones(2), ft.ones(2), eps=-1.0)


V, T = 7, 5


def tagger(lib=nn):
    """Token ids to per-position scores (N, T, V), and the input's own mask (N, T) as a second output; lib is
    fasttrain.nn or torch.nn."""
    class Tagger(lib.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.out = lib.Embedding(V, 6), lib.Linear(6, V)

        def forward(self, ids, keep):
            return self.out(self.emb(ids)), keep.float()
    return Tagger()


def sequences(n=8, seed=0):
    rng = np.random.default_rng(seed)
    ids, y = rng.integers(0, V, (n, T)), rng.integers(1, V, (n, T))
    y[:, 3:] = 0  # padding
    y[0] = 0      # a sample with nothing to learn from
    return ids, y, rng.random((n, T)) > 0.3


def label_masked(out, y):
    per = F.cross_entropy(out[0].transpose(1, 2), y, reduction="none")
    mask = (y != 0).float()
    return (per * mask).sum() / mask.sum()


def input_masked(out, y):
    scores, keep = out
    return (F.cross_entropy(scores.transpose(1, 2), y, reduction="none") * keep).sum() / keep.sum()


def masked_program(loss, accumulate_steps=1, n=8, **kw):
    ft.manual_seed(0)
    model = tagger()
    return model, model.compile(ft.optim.SGD(model.parameters(), lr=0.1), loss, batch_size=n,
                                input_shape=((T,), (T,)), input_dtype=(ft.int64, ft.bool), target_shape=(T,),
                                target_dtype=ft.int64, accumulate_steps=accumulate_steps, **kw)


@pytest.mark.parametrize("accumulate_steps", [1, 2, 4])
def test_a_masked_mean_is_the_mean_over_the_batchs_kept_positions(accumulate_steps):
    """(loss * mask).sum() / mask.sum(): the sum over the whole batch's kept positions over their count, also when
    the batch runs as micro-batches (each divides by the whole batch's count, counted before the step), equal to
    cross-entropy's ignore_index; evaluate gives the same loss."""
    ids, y, keep = sequences()
    _, p = masked_program(label_masked, accumulate_steps)
    ft.manual_seed(0)
    ref_model = tagger()
    ref = ref_model.compile(ft.optim.SGD(ref_model.parameters(), lr=0.1),
                            lambda out, t: F.cross_entropy(out[0].transpose(1, 2), t, ignore_index=0), batch_size=8,
                            input_shape=((T,), (T,)), input_dtype=(ft.int64, ft.bool), target_shape=(T,),
                            target_dtype=ft.int64)
    loss, want = p.backward((ids, keep), y), ref.backward((ids, keep), y)
    assert loss == pytest.approx(want, rel=1e-6)
    for a, b in zip(p.model.parameters(), ref_model.parameters()):
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-5, atol=1e-7)
    assert p.evaluate((ids, keep), y)[0] == pytest.approx(ref.evaluate((ids, keep), y)[0], rel=1e-6)


def test_a_mask_from_an_input_matches_numpy_finite_differences_and_pytorch():
    ids, y, keep = sequences(seed=1)
    model, p = masked_program(input_masked)
    scores = model(ft.tensor(ids), ft.tensor(keep))[0].numpy().astype(np.float64)
    per = np.log(np.exp(scores).sum(-1)) - np.take_along_axis(scores, y[..., None], -1)[..., 0]
    assert p.backward((ids, keep), y) == pytest.approx((per * keep).sum() / keep.sum(), rel=1e-5)
    assert gradcheck(p, (ids, keep), y, eps=1e-3, rtol=2e-2, atol=1e-4)
    torch = pytest.importorskip("torch")
    theirs = tagger(torch.nn)
    theirs.load_state_dict({k: torch.tensor(np.asarray(v)) for k, v in model.state_dict().items()})
    model.zero_grad()
    loss = p.backward((ids, keep), y)
    out, kept = theirs(torch.tensor(ids), torch.tensor(keep))
    expected = (torch.nn.functional.cross_entropy(out.transpose(1, 2), torch.tensor(y), reduction="none")
                * kept).sum() / kept.sum()
    expected.backward()
    assert loss == pytest.approx(expected.item(), rel=1e-5)
    for name, t in theirs.named_parameters():
        np.testing.assert_allclose(dict(model.named_parameters())[name].grad.numpy(), t.grad.numpy(), rtol=1e-4,
                                   atol=1e-7, err_msg=name)


@pytest.mark.parametrize("count, guarded", [(lambda s: s.clamp(min=1), lambda c: np.maximum(c, 1)),
                                            (lambda s: s + 1e-3, lambda c: c + 1e-3),
                                            (lambda s: (s + 0.5).clamp(min=2), lambda c: np.maximum(c + 0.5, 2))],
                         ids=["clamp", "offset", "both"])
def test_a_masked_means_count_may_be_guarded_as_pytorch_code_guards_it(count, guarded):
    """mask.sum().clamp(min=1) and mask.sum() + eps: the batch's count so adjusted once, over micro-batches too; a
    batch whose mask keeps nothing then has the loss 0."""
    def loss(out, y):
        per = F.cross_entropy(out[0].transpose(1, 2), y, reduction="none")
        return (per * out[1]).sum() / count(out[1].sum())

    ids, y, keep = sequences(seed=4)
    model, p = masked_program(loss, accumulate_steps=2)
    scores = model(ft.tensor(ids), ft.tensor(keep))[0].numpy().astype(np.float64)
    per = np.log(np.exp(scores).sum(-1)) - np.take_along_axis(scores, y[..., None], -1)[..., 0]
    assert p.backward((ids, keep), y) == pytest.approx((per * keep).sum() / guarded(keep.sum()), rel=1e-5)
    assert p.backward((ids, np.zeros_like(keep)), y) == 0.0


@pytest.mark.skipif(not ft.backends.cpu_has_bf16(), reason="bf16-mixed runs as float32 on this CPU")
def test_a_bf16_mixed_masked_mean_is_near_float32():
    ids, y, keep = sequences(seed=2)
    losses = [masked_program(input_masked, precision=precision)[1].backward((ids, keep), y)
              for precision in ("32-true", "bf16-mixed")]
    assert losses[1] == pytest.approx(losses[0], rel=2e-2)


def test_what_a_masked_mean_cannot_be_is_refused_and_a_batch_that_keeps_nothing_changes_nothing():
    def trained_count(out, y):
        per = F.cross_entropy(out[0].transpose(1, 2), y, reduction="none")
        return per.sum() / out[0].sum()

    with pytest.raises(ValueError, match="denominator of a ratio loss .* depends on a trained parameter"):
        masked_program(trained_count)

    def dropped_count(out, y):
        per = F.cross_entropy(out[0].transpose(1, 2), y, reduction="none")
        keep = F.dropout(out[1], 0.5)
        return (per * keep).sum() / keep.sum()

    with pytest.raises(ValueError, match="passes through a dropout"):
        masked_program(dropped_count)

    def sum_over_mean(out, y):
        return F.cross_entropy(out[0].transpose(1, 2), y, reduction="none").sum() / out[1].mean()

    with pytest.raises(ft.nn.TracingError,
                       match=r"other than sums .* over one count .* 0.5 \* \(loss \* mask\).sum\(\) / mask.sum\(\)"):
        masked_program(sum_over_mean)

    def clamped_loss(out, y):
        return F.cross_entropy(out[0].transpose(1, 2), y, reduction="none").sum().clamp(min=1)

    with pytest.raises(ft.nn.TracingError, match=r"a batch sum clamped other than as a masked mean's count .*at "
                                                 r".*test_losses.py"):
        masked_program(clamped_loss)
    ids, y, keep = sequences()
    model, p = masked_program(input_masked)
    before = [t.numpy().copy() for t in model.parameters()]
    with pytest.raises(ValueError, match=r"count\) is 0 for this batch, not positive: .* nothing was changed"):
        p.train_step((ids, np.zeros_like(keep)), y)
    for a, t in zip(before, model.parameters()):
        np.testing.assert_array_equal(a, t.numpy())


def test_a_masked_means_count_may_be_an_input_or_the_targets_themselves():
    """The denominator's values straight from an input (weights per position, float32) or from the targets
    (a regression's weights): each batch's own sum."""
    class Weighted(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.out = nn.Embedding(V, 6), nn.Linear(6, V)

        def forward(self, ids, weights):
            return self.out(self.emb(ids)), weights

    ids, y, _ = sequences(seed=5)
    weights = np.random.default_rng(5).random((8, T)).astype(np.float32)
    ft.manual_seed(0)
    model = Weighted()
    p = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), input_masked, batch_size=8, input_shape=((T,), (T,)),
                      input_dtype=(ft.int64, ft.float32), target_shape=(T,), target_dtype=ft.int64,
                      accumulate_steps=2)
    scores = model(ft.tensor(ids), ft.tensor(weights))[0].numpy().astype(np.float64)
    per = np.log(np.exp(scores).sum(-1)) - np.take_along_axis(scores, y[..., None], -1)[..., 0]
    assert p.backward((ids, weights), y) == pytest.approx((per * weights).sum() / weights.sum(), rel=1e-5)
    ft.manual_seed(0)
    reg = nn.Linear(T, T)
    q = reg.compile(ft.optim.SGD(reg.parameters(), lr=0.1), lambda out, w: (out * w).sum() / w.sum(), batch_size=8,
                    input_shape=(T,), target_shape=(T,), target_dtype=ft.float32)
    x = np.random.default_rng(6).random((8, T)).astype(np.float32)
    out = reg(ft.tensor(x)).numpy().astype(np.float64)
    assert q.backward(x, weights) == pytest.approx((out * weights).sum() / weights.sum(), rel=1e-5)


class LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.out = nn.Embedding(V, 6), nn.Linear(6, V)

    def forward(self, ids):
        return self.out(self.emb(ids))


@pytest.mark.parametrize("merged", [False, True], ids=["per_position", "merged_rows"])
@pytest.mark.parametrize("form", [
    lambda per, m: 0.5 * (per * m).sum() / m.sum(),
    lambda per, m: (per * m).sum() / (2 * m.sum()),
    lambda per, m: ((per * m).sum() + per.sum()) / m.sum(),
    lambda per, m: per.mean() + 0.5 * (per * m).sum() / m.sum(),
    lambda per, m: (per * (2 / (m + 1))).sum() / m.sum(),
    lambda per, m: (-per * m).mean() + (per ** 2 * m).sum() / m.sum(),
    lambda per, m: (abs(per - 2) * m).sum() / m.sum().clip(min=1),
], ids=["scaled", "scaled_count", "two_sums", "plus_mean", "reflected_div", "neg_pow", "abs_clamp"])
def test_masked_means_as_pytorch_code_writes_them(form, merged):
    """Each form on the (N, T) per-position losses, or on the rows merged from them (view(-1, V) and y.view(-1)),
    as NumPy computes it from the model's scores, over two micro-batches."""
    def loss(out, y):
        if merged:
            per, labels = F.cross_entropy(out.view(-1, V), y.view(-1), reduction="none"), y.view(-1)
        else:
            per, labels = F.cross_entropy(out.transpose(1, 2), y, reduction="none"), y
        return form(per, (labels != 0).float())

    ids, y, _ = sequences(seed=7)
    ft.manual_seed(0)
    model = LM()
    p = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), loss, batch_size=8, input_shape=(T,),
                      input_dtype=ft.int64, target_shape=(T,), target_dtype=ft.int64, accumulate_steps=2)
    scores = model(ft.tensor(ids)).numpy().astype(np.float64)
    per = np.log(np.exp(scores).sum(-1)) - np.take_along_axis(scores, y[..., None], -1)[..., 0]
    mask = (y != 0).astype(np.float64)
    want = form(per.reshape(-1), mask.reshape(-1)) if merged else form(per, mask)
    assert p.backward(ids, y) == pytest.approx(want, rel=1e-5)


@pytest.mark.parametrize("spelling", [
    lambda out, y: F.cross_entropy(out.view(-1, out.size(-1)), y.view(-1)),
    lambda out, y: F.cross_entropy(out.view(out.size(0) * out.size(1), out.size(2)),
                                   y.view(y.size(0) * y.size(1))),  # nanoGPT's B * T, C = logits.shape
    lambda out, y: F.cross_entropy(out.flatten(0, 1), y.flatten()),  # "LLMs from scratch"
    lambda out, y: F.cross_entropy(out.reshape(-1, V), y.flatten(0, -1)),
], ids=["view_minus_one", "view_b_times_t", "flatten", "reshape"])
def test_a_sequences_loss_in_each_spelling_of_its_merged_rows(spelling):
    """The merged rows of a language model's loss, written as tutorials write them: each the mean cross entropy of
    every position, as NumPy computes it from the model's scores."""
    ids, y, _ = sequences(seed=8)
    ft.manual_seed(0)
    model = LM()
    p = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), spelling, batch_size=8, input_shape=(T,),
                      input_dtype=ft.int64, target_shape=(T,), target_dtype=ft.int64)
    scores = model(ft.tensor(ids)).numpy().astype(np.float64)
    per = np.log(np.exp(scores).sum(-1)) - np.take_along_axis(scores, y[..., None], -1)[..., 0]
    assert p.backward(ids, y) == pytest.approx(per.mean(), rel=1e-5)


@pytest.mark.parametrize("spelling", [
    lambda out, y: F.nll_loss(F.log_softmax(out, -1).transpose(1, 2), y, ignore_index=0),
    lambda out, y: F.nll_loss(F.log_softmax(out.permute(0, 2, 1), 1), y, ignore_index=0),
], ids=["log_softmax_then_transpose", "transpose_then_log_softmax"])
def test_nll_of_a_sequences_log_probabilities_classes_first(spelling):
    """F.nll_loss of (N, C, T) log-probabilities, compiled (the cross entropy of the scores) and eagerly, as NumPy's
    mean over the positions not ignored; other (N, C, T) values are refused."""
    ids, y, _ = sequences(seed=9)
    ft.manual_seed(0)
    model = LM()
    p = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), spelling, batch_size=8, input_shape=(T,),
                      input_dtype=ft.int64, target_shape=(T,), target_dtype=ft.int64)
    scores = model(ft.tensor(ids))
    s = scores.numpy().astype(np.float64)
    per = np.log(np.exp(s).sum(-1)) - np.take_along_axis(s, y[..., None], -1)[..., 0]
    want = per[y != 0].mean()
    assert p.backward(ids, y) == pytest.approx(want, rel=1e-5)
    assert float(spelling(scores, ft.tensor(y))) == pytest.approx(want, rel=1e-5)
    logp = F.log_softmax(scores, -1).transpose(1, 2)
    with pytest.raises(TypeError, match="expected integer class targets"):
        F.nll_loss(logp, ft.tensor(y).float())
    with pytest.raises(ValueError, match=r"one value per class \(\d+\), got shape \(3,\)"):
        F.nll_loss(logp, ft.tensor(y), weight=ft.ones(3))
    with pytest.raises(ft.nn.TracingError, match=r"F.nll_loss of \(N, C, d...\) values other than a log_softmax"):
        LM().compile(ft.optim.SGD(LM().parameters(), lr=0.1), lambda out, y: F.nll_loss(out.transpose(1, 2), y),
                     batch_size=8, input_shape=(T,), input_dtype=ft.int64, target_shape=(T,),
                     target_dtype=ft.int64)


def test_views_merging_the_batch_elsewhere_are_refused_with_the_line():
    class Heads(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(V, 6)

        def forward(self, ids):
            h = self.emb(ids)
            B, L, D = h.shape
            return h.view(B * 2, L, D // 2).sum(-1)  # the heads merged into the batch

    model = Heads()
    with pytest.raises(ft.nn.TracingError, match=r"view merging the batch .* \(at .*test_losses.py"):
        model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.MSELoss(), batch_size=8, input_shape=(T,),
                      input_dtype=ft.int64, target_shape=(T,))
    bad = lambda out, y: F.cross_entropy(out.view(out.size(0) * 3, -1), y.view(-1))  # noqa: E731
    with pytest.raises(ft.nn.TracingError, match=r"merge the batch with the sizes that multiply to it"):
        LM().compile(ft.optim.SGD(LM().parameters(), lr=0.1), bad, batch_size=8, input_shape=(T,),
                     input_dtype=ft.int64, target_shape=(T,), target_dtype=ft.int64)


def test_labels_computed_from_the_targets_are_refused_with_the_way_out():
    """Hugging Face's shifted loss slices the labels inside it; a class loss reads them as given: the refusal
    names the line and says to shift them in the data."""
    def shifted(out, y):
        return F.cross_entropy(out[:, :-1].reshape(-1, V), y[:, 1:].reshape(-1))

    with pytest.raises(ft.nn.TracingError, match=r"class labels computed from the targets .* \(at .*test_losses.py"
                       r".*shift or pick them in the data"):
        LM().compile(ft.optim.SGD(LM().parameters(), lr=0.1), shifted, batch_size=8, input_shape=(T,),
                     input_dtype=ft.int64, target_shape=(T,), target_dtype=ft.int64)


def test_labels_taken_as_an_input_of_forward_are_refused_with_the_way_out():
    """nanoGPT's forward(idx, targets) computes its loss inside forward from a second input: the refusal says to
    return the logits and give the loss to compile."""
    class WithTargets(nn.Module):
        def __init__(self):
            super().__init__()
            self.lm = LM()

        def forward(self, ids, targets):
            logits = self.lm(ids)
            return logits, F.cross_entropy(logits.view(-1, V), targets.view(-1))

    model = WithTargets()
    with pytest.raises(ft.nn.TracingError, match=r"class labels taken as an input of forward .* give the loss to "
                                                 r"compile"):
        model.compile(ft.optim.SGD(model.parameters(), lr=0.1), lambda out: out[1], batch_size=8,
                      input_shape=((T,), (T,)), input_dtype=ft.int64)


def test_eager_losses_promote_infinite_logits_and_unbatched_soft_targets_as_pytorch():
    """mse_loss of a bfloat16 input and a float32 target rounded the target to bfloat16 and returned bfloat16
    (PyTorch promotes to float32); binary_cross_entropy_with_logits of an infinite logit was NaN (the loss is
    infinite, or 0 where the target agrees); an unbatched (C,) input with class probabilities gave (1,) losses."""
    x = ft.tensor([1.5]).to(ft.bfloat16)
    loss = F.mse_loss(x, ft.tensor([0.3]))
    assert loss.dtype == ft.float32 and loss.item() == pytest.approx(1.44, rel=1e-6)
    logits = ft.tensor([float("inf"), float("-inf"), float("inf"), float("-inf"), 2.0])
    target = ft.tensor([0.5, 0.5, 1.0, 0.0, 0.25])
    values = F.binary_cross_entropy_with_logits(logits, target, reduction="none").numpy()
    want = 0.75 * np.log1p(np.exp(2.0)) + 0.25 * np.log1p(np.exp(-2.0))
    np.testing.assert_allclose(values, [np.inf, np.inf, 0.0, 0.0, want], rtol=1e-6)
    scores = ft.tensor([0.3, -1.2, 2.0])
    p = scores.softmax(0)
    loss = F.cross_entropy(scores, p, reduction="none")
    logp = scores.numpy() - np.log(np.exp(scores.numpy().astype(np.float64)).sum())
    assert loss.shape == () and loss.item() == pytest.approx(-(p.numpy() * logp).sum(), rel=1e-6)


@pytest.mark.parametrize("how", ["sigmoid_", "clamp_", "relu_inplace", "iadd"])
def test_a_loss_changing_the_output_or_targets_in_place_leaves_predict_and_the_targets_as_they_are(how):
    """CenterNet's torch.clamp(x.sigmoid_(), 1e-4, 1 - 1e-4) in the loss, fast neural style's y.div_(255.0) of the
    targets: the loss computes as written (NumPy's value, finite differences' gradients), predict still returns
    the model's raw output (it returned the loss's sigmoid of it), and the targets are read as given (the program
    failed inside on them)."""
    def loss(out, y):
        if how == "sigmoid_":
            out = ft.clamp(out.sigmoid_(), 1e-4, 1 - 1e-4)
        elif how == "clamp_":
            out.clamp_(-0.5, 0.5)
        elif how == "relu_inplace":
            out = F.relu(out, inplace=True)
        else:
            out += 1.0
        y.div_(255.0)
        return ((out - y) ** 2).mean()

    rng = np.random.default_rng(40)
    x, y = rng.standard_normal((4, 3)).astype(np.float32), rng.uniform(0, 255, (4, 2)).astype(np.float32)
    ft.manual_seed(41)
    model = nn.Linear(3, 2)
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), loss, batch_size=4, input_shape=(3,),
                            target_shape=(2,))
    raw = x @ model.weight.numpy().T + model.bias.numpy()
    np.testing.assert_allclose(program.predict(x).numpy(), raw, rtol=1e-6, atol=1e-6)
    out = {"sigmoid_": np.clip(1 / (1 + np.exp(-raw)), 1e-4, 1 - 1e-4), "clamp_": np.clip(raw, -0.5, 0.5),
           "relu_inplace": np.maximum(raw, 0), "iadd": raw + 1.0}[how]
    np.testing.assert_allclose(program.evaluate(x, y)[0], ((out - y / 255.0) ** 2).mean(), rtol=1e-5)
    assert gradcheck(program, x, y, eps=1e-3, rtol=3e-2, atol=1e-4)


def test_a_mask_target_of_one_channel_broadcasts_over_the_outputs_channels():
    """A (1, H, W) mask given as target_shape over (C, H, W) outputs, as PyTorch broadcasts it (it was refused as a
    second shape of the targets), alone and as the second of two targets: NumPy's loss, finite differences'
    gradients."""
    rng = np.random.default_rng(42)
    x = rng.standard_normal((2, 3, 6, 6)).astype(np.float32)
    t, mask = rng.standard_normal((2, 2, 6, 6)).astype(np.float32), (rng.random((2, 1, 6, 6)) < 0.5).astype(np.float32)
    ft.manual_seed(43)
    model = nn.Conv2d(3, 2, 3, padding=1)
    alone = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), lambda out, y: ((out - 0.5) ** 2 * y).mean(),
                          batch_size=2, input_shape=(3, 6, 6), target_shape=(1, 6, 6))
    pair = model.compile(ft.optim.SGD(model.parameters(), lr=0.1),
                         lambda out, y: ((out - y[0]) ** 2 * y[1]).sum() / (y[1].sum() + 1), batch_size=2,
                         input_shape=(3, 6, 6), target_shape=((2, 6, 6), (1, 6, 6)),
                         target_dtype=(ft.float32, ft.float32))
    out = alone.predict(x).numpy().astype(np.float64)
    np.testing.assert_allclose(alone.evaluate(x, mask)[0], ((out - 0.5) ** 2 * mask).mean(), rtol=1e-5)
    np.testing.assert_allclose(pair.evaluate(x, (t, mask))[0], ((out - t) ** 2 * mask).sum() / (mask.sum() + 1),
                               rtol=1e-5)
    assert gradcheck(alone, x, mask, eps=1e-3, rtol=3e-2, atol=1e-4)
    assert gradcheck(pair, x, (t, mask), eps=1e-3, rtol=3e-2, atol=1e-4)


def test_a_branch_on_a_count_over_the_batch_says_to_guard_the_quotient():
    """CenterNet's focal loss branches on its count of positives (if num_pos == 0:), which one graph for every batch
    cannot: refused naming the comparison and the guarded count that compiles."""
    def loss(out, y):
        num_pos = (y == 1).float().sum()
        if num_pos == 0:
            return out.sum() * 0
        return ((out - y) ** 2).sum() / num_pos

    model = nn.Linear(3, 2)
    with pytest.raises(ft.nn.TracingError, match=r"a comparison of a value reduced over the batch .*clamp\(min=1\)"):
        model.compile(ft.optim.SGD(model.parameters(), lr=0.1), loss, batch_size=2, input_shape=(3,),
                      target_shape=(2,))


def test_class_rows_of_labels_with_ignored_pixels_as_the_refusals_say():
    """A dice term over label maps with ignored pixels (255): the spellings computing on the integer labels
    (yc[yc == 255] = 0, y * (y != 255)) are refused with the form that compiles, whose rows are zeros at ignored
    pixels; that loss is NumPy's."""
    C = 3

    def loss(how):
        def dice(out, y):
            if how == "setitem":
                yc = y.clone()
                yc[yc == 255] = 0
                rows = F.one_hot(yc, C).permute(0, 3, 1, 2).float()
            elif how == "product":
                rows = F.one_hot(y * (y != 255), C).permute(0, 3, 1, 2).float()
            else:
                rows = ft.stack([(y == c).float() for c in range(C)], 1)
            p = F.softmax(out, 1) * (y != 255).unsqueeze(1).float()
            return 1 - ((2 * (p * rows).sum((2, 3)) + 1) / (p.sum((2, 3)) + rows.sum((2, 3)) + 1)).mean()
        return dice

    model = nn.Conv2d(3, C, 1)
    for how in ("setitem", "product"):
        with pytest.raises(ft.nn.TracingError, match=r"ft\.stack\(\[\(y == c\)\.float\(\) for c in range\(C\)\], 1\)"):
            model.compile(ft.optim.SGD(model.parameters(), lr=0.1), loss(how), batch_size=2, input_shape=(3, 4, 4),
                          target_shape=(4, 4))
    rng = np.random.default_rng(44)
    x, y = rng.standard_normal((2, 3, 4, 4)).astype(np.float32), rng.integers(0, C, (2, 4, 4))
    y[0, 0] = 255
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), loss("stack"), batch_size=2,
                            input_shape=(3, 4, 4), target_shape=(4, 4))
    out = program.predict(x).numpy().astype(np.float64)
    p = np.exp(out - out.max(1, keepdims=True))
    p = p / p.sum(1, keepdims=True) * (y != 255)[:, None]
    rows = np.stack([(y == c) for c in range(C)], 1).astype(np.float64)
    want = 1 - ((2 * (p * rows).sum((2, 3)) + 1) / (p.sum((2, 3)) + rows.sum((2, 3)) + 1)).mean()
    np.testing.assert_allclose(program.evaluate(x, y)[0], want, rtol=1e-5)
