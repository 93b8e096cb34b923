"""program.memory_plan() and summary()'s memory lines against the CPU allocator's own count, the allocator's peak
over a training step against the plan, and ft.utils.max_batch_size."""
import gc

import numpy as np
import pytest

import fasttrain as ft
from fasttrain import nn

HUGE_PAGE = 2 << 20  # blocks of 1 MiB and more are granted in whole 2 MiB pages
MiB = 1 << 20

needs_bf16 = pytest.mark.skipif(not ft.backends.cpu_has_bf16(),
                                reason="this CPU has no AVX512-BF16: bf16-mixed runs as 32-true")


def net():
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(32, 10))


class Residual(nn.Module):
    """A residual block: the gradient of h has two writers (the add and the first convolution's backward)."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(1, 16, 3, padding=1)
        self.c1, self.b1 = nn.Conv2d(16, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16)
        self.c2, self.b2 = nn.Conv2d(16, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16)
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        h = nn.functional.relu(self.stem(x))
        y = nn.functional.relu(self.b1(self.c1(h)))
        h = nn.functional.relu(self.b2(self.c2(y)) + h)
        return self.head(nn.functional.adaptive_avg_pool2d(h, 1).flatten(1))


def mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(),
                         nn.Linear(256, 10))


def granted(n):
    """The bytes the CPU allocator grants for a request of n (alloc.c)."""
    return -(-n // HUGE_PAGE) * HUGE_PAGE if n >= MiB else -(-n // 64) * 64


# (model, precision, bytes a step may allocate beyond the plan and free again, besides staged gradients)
STEP_CASES = {
    "conv": (net, "32-true", MiB),  # oneDNN's scratchpads and reorders
    "conv-bf16": (net, "bf16-mixed", 6 * MiB),  # + float32 chunks of up to 1M elements for the bf16 loops
    "residual": (Residual, "32-true", MiB),
    "residual-bf16": (Residual, "bf16-mixed", 6 * MiB),
}


@pytest.mark.parametrize("case", list(STEP_CASES))
def test_plan_matches_what_the_allocator_holds_and_its_peak_over_a_step(case):
    make, precision, workspace = STEP_CASES[case]
    if precision == "bf16-mixed" and not ft.backends.cpu_has_bf16():
        pytest.skip("this CPU has no AVX512-BF16: bf16-mixed runs as 32-true")
    B = 256
    x, y = ft.randn(B, 1, 28, 28), ft.tensor(np.random.default_rng(0).integers(0, 10, B))
    model = make()
    opt = ft.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    compile_ = lambda b: model.compile(opt, nn.CrossEntropyLoss(), batch_size=b, input_shape=(1, 28, 28),
                                       precision=precision)
    compile_(1)  # moves the parameters into the flat buffers, once: the count below starts after that
    gc.collect()
    ft.empty_cache()  # a cached block up to 25% larger than asked would be granted, and counted, whole
    before = ft.memory_stats("cpu")["allocated_bytes"]
    program = compile_(B)
    plan = program.memory_plan()
    assert plan["optimizer_state"] == plan["parameters"]  # the momentum buffer, counted before step 1
    ft.reset_peak_memory_stats("cpu")
    program.train_step(x, y)  # the optimizer's state is allocated by its first step
    stats = ft.memory_stats("cpu")
    held, peak = stats["allocated_bytes"] - before, stats["peak_bytes"] - before
    assert program.memory_plan()["optimizer_state"] == plan["optimizer_state"]
    big = [plan[k] for k in ("activations", "evaluation", "parameters", "gradients", "optimizer_state",
                             "weights_copy")]
    assert plan["total"] == sum(big)
    # bf16-mixed: the weights' bfloat16 copy is half the float32 parameters
    assert plan["weights_copy"] == (plan["parameters"] // 2 if precision == "bf16-mixed" else 0)
    # What the program holds after a step is the plan (parameters and gradients existed before), each buffer
    # granted as the allocator grants it; a few small tensors (the loss, the batch-norm statistics' backup) aside.
    expected = sum(granted(plan[k]) for k in ("activations", "evaluation", "optimizer_state", "weights_copy"))
    assert 0 <= held - expected <= 4096, (held, expected, plan)
    # The peak over the step is the plan plus the step's short-lived workspace: a gradient that a library can
    # only write but two nodes add to is staged in a temporary of its size (the residual's), oneDNN's scratchpad
    # and reorders, and bf16-mixed's float32 chunks.
    staged = max(granted(n["gradient"]) for n in plan["nodes"]) if case.startswith("residual") else 0
    assert 0 <= peak - held <= staged + workspace, (peak - held, staged, plan)
    nodes = plan["nodes"]
    assert len(nodes) == len(program.entries) and nodes[0]["node"] == "input"
    # each node's output and gradient bytes follow its shape and dtype; the arena reuses memory
    for e, n, dtype in zip(program.entries, nodes, program._c.node_dtypes()):
        size = B * int(np.prod(e.shape)) * getattr(ft, dtype).itemsize
        assert n["output"] in (0, size) and n["gradient"] in (0, size), (e, n)
    assert sum(n["output"] + n["saved"] + n["gradient"] for n in nodes) >= plan["activations"]
    assert "total" in program.summary().splitlines()[-1]


@pytest.mark.parametrize("make, count", [
    (lambda ps: ft.optim.SGD(ps, lr=0.1), 0),
    (lambda ps: ft.optim.SGD(ps, lr=0.1, momentum=0.9), 1),
    (lambda ps: ft.optim.AdamW(ps), 2),
    (lambda ps: ft.optim.AdamW(ps, amsgrad=True), 3),
    (lambda ps: ft.optim.LAMB(ps), 2),
    (lambda ps: ft.optim.LARS(ps, lr=0.1), 1),
])
def test_optimizer_state_is_counted_before_the_first_step_as_allocated(make, count):
    model = mlp()
    opt = make(model.parameters())
    program = model.compile(opt, nn.CrossEntropyLoss(), batch_size=8, input_shape=(1, 28, 28))
    assert program.memory_plan()["optimizer_state"] == count * program.memory_plan()["parameters"]
    program.train_step(ft.randn(8, 1, 28, 28), ft.tensor(np.arange(8) % 10))
    held = opt._c.state_buffer
    assert sum(b.nbytes for b in map(held, ft._C.OPTIM_STATES.values()) if b is not None) == \
        program.memory_plan()["optimizer_state"]


def encoder():
    return nn.Sequential(nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True, norm_first=True),
                         nn.Flatten(), nn.Linear(17 * 32, 10))


@pytest.mark.parametrize("make, shape, options", [
    (net, (1, 28, 28), {}), (Residual, (1, 28, 28), {"memory_format": "contiguous"}), (mlp, (1, 28, 28), {}),
    (encoder, (17, 32), {"memory_format": "contiguous"}),
    pytest.param(net, (1, 28, 28), {"precision": "bf16-mixed"}, marks=needs_bf16),
    pytest.param(encoder, (17, 32), {"memory_format": "contiguous", "precision": "bf16-mixed"}, marks=needs_bf16),
], ids=["conv", "residual", "mlp", "encoder", "conv-bf16", "encoder-bf16"])
def test_arenas_grow_linearly_with_the_batch(make, shape, options):
    """What max_batch_size's search rests on: both arenas are a + b * batch, up to the planner's placing each
    buffer at a 64-byte boundary (the sizes themselves are exact multiples of the batch)."""
    model = make()
    opt = ft.optim.SGD(model.parameters(), lr=0.1)
    arenas, nodes = {}, 0
    for b in (1, 2, 3, 7, 64, 100, 257, 1000):
        program = model.compile(opt, nn.CrossEntropyLoss(), batch_size=b, input_shape=shape, seed=0, **options)
        plan = program.memory_plan()
        arenas[b] = np.array([plan["activations"], plan["evaluation"]])
        nodes = len(plan["nodes"])
        fixed = [plan[k] for k in ("parameters", "gradients", "optimizer_state", "weights_copy")]
        assert plan["total"] == sum(fixed) + arenas[b].sum()
    slope = (arenas[1000] - arenas[1]) / 999
    for b, got in arenas.items():
        line = arenas[1] + slope * (b - 1)
        assert np.all(np.abs(got - line) <= 3 * 64 * nodes), (b, got, line)


def test_micro_batches_plan_the_arenas_of_one_micro_batch():
    model = Residual()
    opt = ft.optim.AdamW(model.parameters())
    plans = [model.compile(opt, nn.CrossEntropyLoss(), batch_size=b, input_shape=(1, 28, 28), seed=0,
                           accumulate_steps=k).memory_plan() for b, k in ((256, 4), (64, 1))]
    for key in ("activations", "evaluation", "parameters", "gradients", "optimizer_state", "total"):
        assert plans[0][key] == plans[1][key], key


# ---- ft.utils.max_batch_size ----

def plan_total(model, batch, opt=None, **kw):
    opt = opt or ft.optim.SGD(model.parameters(), lr=0.0)
    return model.compile(opt, None, batch_size=batch, input_shape=(1, 28, 28), seed=0, **kw).memory_plan()["total"]


@pytest.mark.parametrize("make", [net, mlp, Residual], ids=["conv", "mlp", "residual"])
@pytest.mark.parametrize("options", [{}, {"memory_format": "contiguous"},
                                     pytest.param({"precision": "bf16-mixed"}, marks=needs_bf16)],
                         ids=["channels_last", "contiguous", "bf16-mixed"])
@pytest.mark.parametrize("budget", [24 * MiB, 300 * MiB + 12345])
def test_max_batch_size_fits_and_one_more_does_not(make, options, budget):
    model = make()
    opt = ft.optim.AdamW(model.parameters())
    rng = ft.get_rng_state()
    batch = ft.utils.max_batch_size(model, (1, 28, 28), budget, opt, **options)
    assert ft.get_rng_state().tolist() == rng.tolist()  # the probes drew no seed from fasttrain's generator
    assert batch >= 1
    assert plan_total(model, batch, opt, **options) <= budget < plan_total(model, batch + 1, opt, **options)


def test_max_batch_size_counts_the_optimizer_state_and_micro_batches():
    model = Residual()
    budget = 64 * MiB
    plain = ft.utils.max_batch_size(model, (1, 28, 28), budget)
    adamw = ft.optim.AdamW(model.parameters())
    with_state = ft.utils.max_batch_size(model, (1, 28, 28), budget, adamw)
    assert with_state <= plain
    # accumulate_steps=4: the arenas hold a quarter of the batch, so about four times the batch fits
    acc = ft.utils.max_batch_size(model, (1, 28, 28), budget, adamw, accumulate_steps=4)
    assert acc % 4 == 0 and acc >= 3 * with_state
    assert plan_total(model, acc, adamw, accumulate_steps=4) <= budget < \
        plan_total(model, acc + 4, adamw, accumulate_steps=4)


def test_max_batch_size_fits_a_program_that_trains_within_the_budget():
    model = net()
    opt = ft.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    batch = ft.utils.max_batch_size(model, (1, 28, 28), 40 * MiB, opt)
    program = model.compile(opt, nn.CrossEntropyLoss(), batch_size=batch, input_shape=(1, 28, 28))
    loss = program.train_step(ft.randn(batch, 1, 28, 28), ft.tensor(np.arange(batch) % 10))
    assert np.isfinite(loss) and program.memory_plan()["total"] <= 40 * MiB


def test_max_batch_size_errors():
    model = net()
    one = plan_total(model, 1)
    with pytest.raises(ValueError, match=f"batch 1 needs {one} bytes"):
        ft.utils.max_batch_size(model, (1, 28, 28), one - 1)
    assert ft.utils.max_batch_size(model, (1, 28, 28), one) == 1
    with pytest.raises(ValueError, match="micro-batches of 1 sample"):
        ft.utils.max_batch_size(model, (1, 28, 28), one - 1, accumulate_steps=2)
    with pytest.raises(TypeError, match="model"):
        ft.utils.max_batch_size("net", (1, 28, 28), 1 << 30)
    with pytest.raises(TypeError, match="budget_bytes"):
        ft.utils.max_batch_size(model, (1, 28, 28), "1GB")
    with pytest.raises(TypeError, match="budget_bytes"):
        ft.utils.max_batch_size(model, (1, 28, 28), True)
    for bad in (0, -5, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="budget_bytes"):
            ft.utils.max_batch_size(model, (1, 28, 28), bad)
    with pytest.raises(TypeError, match="input_shape"):
        ft.utils.max_batch_size(model, 28, 1 << 30)
    with pytest.raises(TypeError, match="input_shape"):
        ft.utils.max_batch_size(model, (1, 28.0, 28), 1 << 30)
    with pytest.raises(ValueError, match="input_shape"):
        ft.utils.max_batch_size(model, (1, 0, 28), 1 << 30)
    with pytest.raises(TypeError, match="batch_size"):
        ft.utils.max_batch_size(model, (1, 28, 28), 1 << 30, batch_size=8)
    with pytest.raises(ValueError, match="accumulate_steps"):
        ft.utils.max_batch_size(model, (1, 28, 28), 1 << 30, accumulate_steps=0)
    with pytest.raises(ValueError, match="memory_format"):  # compile's own checks pass through
        ft.utils.max_batch_size(model, (1, 28, 28), 1 << 30, memory_format="nchw")
    assert ft.utils.max_batch_size(model, (1, 28, 28), 4e8) == ft.utils.max_batch_size(model, (1, 28, 28),
                                                                                         400_000_000)


def frozen_stem(frozen):
    """A convolutional stem, its weights frozen or not, under a linear head."""
    ft.manual_seed(0)
    # no bias before the batch norm: a trained one would be dropped (zeroed), a frozen one kept
    stem = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.Conv2d(16, 16, 3, padding=1), nn.Tanh(), nn.Conv2d(16, 16, 3, padding=1), nn.Tanh())
    for q in stem.parameters():
        q.requires_grad_(not frozen)
    return nn.Sequential(stem, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))


def test_outputs_no_backward_reads_live_as_in_evaluation():
    """A frozen stem's outputs, read by frozen nodes only, are freed after their last reader's forward: the
    training arena holds two of them at once (a layer's input and output) where a stem whose backward runs keeps
    all of them, and the head trains the same (the stem differentiated but not updated: the optimizer does not
    hold its weights)."""
    B = 32
    x, y = ft.randn(B, 1, 28, 28), ft.tensor(np.random.default_rng(0).integers(0, 10, B))
    one = B * 16 * 28 * 28 * 4  # a stem output
    runs = []
    for frozen in (True, False):
        model = frozen_stem(frozen)
        program = model.compile(ft.optim.SGD(model[3].parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=B,
                                input_shape=(1, 28, 28))
        runs.append((program.memory_plan()["activations"], [program.train_step(x, y) for _ in range(3)],
                     [np.array(v) for v in model.state_dict().values()]))
    (arena, losses, state), (kept_arena, kept_losses, kept_state) = runs
    assert arena <= 2 * one + 64 * 1024 and kept_arena >= 4 * one, (arena, kept_arena, one)
    assert losses == kept_losses
    assert all(np.array_equal(a, b) for a, b in zip(state, kept_state))


def _conv_weight_grad(model, xs, ys, between):
    """The conv's weight gradient computed with NumPy in float64: conv, then a 2x2 max pool (the gradient to each
    window's first maximum) or the input added back, flatten, linear, mean cross-entropy."""
    conv = next(m for m in model.modules() if isinstance(m, nn.Conv2d))
    lin = next(m for m in model.modules() if isinstance(m, nn.Linear))
    W, Wl, bl = (t.numpy().astype(np.float64) for t in (conv.weight, lin.weight, lin.bias))
    x = xs.astype(np.float64)
    B, C = x.shape[:2]
    win = np.lib.stride_tricks.sliding_window_view(np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1))), (3, 3), (2, 3))
    h = np.einsum("nihwkl,oikl->nohw", win, W)
    if between == "max_pool":
        cells = h.reshape(B, C, 8, 2, 8, 2).transpose(0, 1, 2, 4, 3, 5).reshape(B, C, 8, 8, 4)
        feat = cells.max(-1).reshape(B, -1)
    else:
        feat = (h + x).reshape(B, -1)
    logits = feat @ Wl.T + bl
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    p[np.arange(B), ys] -= 1
    dfeat = (p / B) @ Wl
    if between == "max_pool":
        dcells = np.zeros_like(cells)
        np.put_along_axis(dcells, cells.argmax(-1)[..., None], dfeat.reshape(B, C, 8, 8, 1), -1)
        dh = dcells.reshape(B, C, 8, 8, 2, 2).transpose(0, 1, 2, 4, 3, 5).reshape(B, C, 16, 16)
    else:
        dh = dfeat.reshape(B, C, 16, 16)
    return np.einsum("nohw,nihwkl->oikl", dh, win)


@pytest.mark.parametrize("between", ["max_pool", "residual_add"])
def test_outputs_only_passed_through_by_backward_are_not_kept(between):
    """A conv's output read only by a max pool (whose backward reads its indices) or a residual add (whose
    backward passes the gradient through) is freed after that forward: the arena holds it or its gradient,
    never both at once (with the pool: the conv's gradient and the pool's output, gradient and indices, a
    quarter map each; with the add: its output, kept for the linear's backward, its gradient and the conv's;
    keeping the conv's output would add a map to either), and the conv's weight gradient matches NumPy's."""
    B, C = 64, 16
    one = B * C * 16 * 16 * 4  # the conv's output
    ft.manual_seed(0)
    if between == "max_pool":
        model = nn.Sequential(nn.Conv2d(C, C, 3, padding=1, bias=False), nn.MaxPool2d(2), nn.Flatten(),
                              nn.Linear(C * 8 * 8, 10))
    else:
        x = nn.Input((C, 16, 16))
        h = nn.Conv2d(C, C, 3, padding=1, bias=False)(x)
        model = nn.Model(x, nn.Linear(C * 16 * 16, 10)(nn.Flatten()(nn.Add()(h, x))))
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=B,
                            input_shape=(C, 16, 16), memory_format="contiguous")
    arena = program.memory_plan()["activations"]
    assert arena <= (1.75 if between == "max_pool" else 3) * one + 64 * 1024, (arena, one)
    rng = np.random.default_rng(1)
    xs, ys = rng.normal(size=(B, C, 16, 16)).astype(np.float32), rng.integers(0, 10, B)
    program.backward(xs, ys)
    conv = next(m for m in model.modules() if isinstance(m, nn.Conv2d))
    want = _conv_weight_grad(model, xs, ys, between)
    np.testing.assert_allclose(conv.weight.grad.numpy(), want, rtol=1e-3, atol=1e-4 * np.abs(want).max())
