"""compile(..., recompute=...): activation recomputation (gradient checkpointing). Recomputed and kept outputs give
bitwise the same losses, weights and batch-norm statistics (dropout masks and batch statistics regenerate, running
statistics move once) for listed modules, "auto" and budgets, under SGD with momentum and AdamW, micro-batches and
bf16-mixed; the planned training arena shrinks and the allocator holds what the plan says; bad requests fail
clearly."""
import gc
import re

import numpy as np
import pytest

import fasttrain as ft
from _programref import state_bits
from fasttrain.utils.checkpoint import checkpoint, checkpoint_sequential

nn = ft.nn
MiB = 1 << 20
HUGE_PAGE = 2 << 20


class Block(nn.Module):
    """conv-BN-ReLU-dropout-conv-BN plus the input, then ReLU: a residual block as PyTorch code writes it."""

    def __init__(self, width, p=0.2):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(width, width, 3, padding=1, bias=False), nn.BatchNorm2d(width)
        self.drop = nn.Dropout(p)
        self.c2, self.b2 = nn.Conv2d(width, width, 3, padding=1, bias=False), nn.BatchNorm2d(width)

    def forward(self, x):
        y = self.drop(nn.functional.relu(self.b1(self.c1(x))))
        return nn.functional.relu(self.b2(self.c2(y)) + x)


class ResNet(nn.Module):
    """A stem, `depth` residual blocks, a strided convolution, two more blocks, pooling, dropout and a linear
    head: a traced subclass with residual adds."""

    def __init__(self, depth=2, width=8):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        self.blocks = nn.ModuleList([Block(width) for _ in range(depth)])
        self.down = nn.Conv2d(width, 2 * width, 3, stride=2, padding=1)
        self.deep = nn.Sequential(Block(2 * width), Block(2 * width))
        self.head = nn.Linear(2 * width, 5)
        self.drop = nn.Dropout(0.3)

    def forward(self, x):
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        x = self.deep(nn.functional.relu(self.down(x)))
        return self.head(self.drop(nn.functional.adaptive_avg_pool2d(x, 1).flatten(1)))


def sequential(width=8):
    """A plain Sequential with batch norm, dropout, pooling and a MLP head."""
    return nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(), nn.Dropout(0.25),
        nn.Conv2d(width, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(width, 2 * width, 3, padding=1), nn.BatchNorm2d(2 * width), nn.GELU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * width, 32), nn.ReLU(), nn.Dropout(0.5),
        nn.Linear(32, 5))


class Checkpointed(ResNet):
    """The ResNet's forward with its blocks run through torch.utils.checkpoint's checkpoint, as Hugging Face's and
    timm's gradient checkpointing write it, and the deep stage through checkpoint_sequential."""

    def forward(self, x):
        x = self.stem(x)
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False)
        x = checkpoint_sequential(self.deep, 2, nn.functional.relu(self.down(x)))
        return self.head(self.drop(nn.functional.adaptive_avg_pool2d(x, 1).flatten(1)))


def make(kind):
    """The ResNet, the Sequential, the ResNet with its stem frozen, or the ResNet checkpointing its blocks."""
    ft.manual_seed(3)
    if kind == "sequential":
        return sequential()
    model = Checkpointed() if kind == "checkpointed" else ResNet()
    if kind == "frozen":
        model.stem.requires_grad_(False)
    return model


def blocks_of(model):
    """The modules a user would wrap in torch.utils.checkpoint: the residual blocks, or the Sequential's layers in
    two runs (as checkpoint_sequential would)."""
    if isinstance(model, ResNet):
        return [*model.blocks, *model.deep]
    layers = list(model)
    return [layers[:8], layers[8:12]]


OPTIMIZERS = {
    "sgd": lambda ps: ft.optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-4),
    "adam": lambda ps: ft.optim.AdamW(ps, lr=1e-2, weight_decay=0.0),
}


def batches(n, steps, seed=0, shape=(3, 12, 12)):
    rng = np.random.default_rng(seed)
    return [(ft.tensor(rng.standard_normal((n, *shape)).astype(np.float32)), ft.tensor(rng.integers(0, 5, n)))
            for _ in range(steps)]


def train(kind, recompute, opt="sgd", steps=4, batch=16, device="cpu", **options):
    """(losses, the raw bytes of the model's state, its last gradients and the optimizer's state, the program)
    after `steps` steps from the same start and batches."""
    model = make(kind)
    if device != "cpu":
        model.to(device)
    optimizer = OPTIMIZERS[opt](model.parameters())
    program = model.compile(optimizer, nn.CrossEntropyLoss(label_smoothing=0.1),
                            batch_size=batch, input_shape=(3, 12, 12), seed=7,
                            recompute=recompute(model) if callable(recompute) else recompute, **options)
    losses = [program.train_step(x.to(device), y.to(device)) for x, y in batches(batch, steps)]
    state = state_bits(model)
    state["gradients"] = np.array(program.flat_grads.cpu()).tobytes()
    for k, v in optimizer.state_dict()["state"].items():
        for name, t in v.items():
            state[f"optimizer.{k}.{name}"] = np.array(t.cpu() if hasattr(t, "cpu") else t).tobytes()
    return losses, state, program


def assert_same_training(kind, recompute, opt="sgd", **options):
    want_losses, want_state, plain = train(kind, None, opt, **options)
    losses, state, program = train(kind, recompute, opt, **options)
    assert any(program._c.recomputed()), "nothing was recomputed: the test would compare a program with itself"
    assert not any(plain._c.recomputed())
    assert losses == want_losses
    assert state.keys() == want_state.keys()
    for k in state:
        assert state[k] == want_state[k], k  # weights, statistics, gradients, optimizer state: bitwise
    return program, plain


MODES = ["modules", "auto", "budget"]


def mode(name, kind):
    """The recompute= of a mode: the model's blocks, "auto", or a budget halfway between the least arena the
    planner reaches and the arena that keeps every output."""
    if name != "budget":
        return blocks_of if name == "modules" else name
    plain = train(kind, None, steps=0)[2].memory_plan()["activations"]
    least = least_arena(kind)
    return (plain + least) // 2


def least_arena(kind, **options):
    """The least training arena the planner reaches, read from the error of a budget of one byte."""
    with pytest.raises(ValueError, match="below the least training arena") as info:
        train(kind, 1, steps=0, **options)
    return int(re.search(r": (\d+) bytes", str(info.value)).group(1))


@pytest.mark.parametrize("kind", ["sequential", "resnet"])
@pytest.mark.parametrize("name", MODES)
@pytest.mark.parametrize("opt", list(OPTIMIZERS))
def test_recompute_trains_bitwise_as_keeping_every_output(kind, name, opt):
    program, plain = assert_same_training(kind, mode(name, kind), opt)
    assert program.memory_plan()["activations"] < plain.memory_plan()["activations"]


def test_torch_checkpoint_in_a_forward_recomputes_those_modules():
    """ft.utils.checkpoint.checkpoint(block, x) and checkpoint_sequential in a forward (the names of
    torch.utils.checkpoint) make those modules the recomputed segments, as compile(recompute=[...]) listing them:
    bitwise the same training, a smaller arena; recompute= given to compile takes precedence."""
    want_losses, want_state, plain = train("resnet", None)
    losses, state, program = train("checkpointed", None)
    assert any(program._c.recomputed()) and not any(plain._c.recomputed())
    assert losses == want_losses and state == want_state
    assert program.memory_plan()["activations"] < plain.memory_plan()["activations"]
    assert program.memory_plan() == train("resnet", blocks_of, steps=0)[2].memory_plan()
    assert train("checkpointed", "auto", steps=0)[2].memory_plan() == train("resnet", "auto", steps=0)[2].memory_plan()
    with pytest.raises(ValueError, match="checkpoint_sequential: segments must be at least 1, got 0"):
        checkpoint_sequential(nn.Sequential(nn.ReLU()), 0, ft.ones(2))


@pytest.mark.parametrize("kind", ["sequential", "resnet"])
def test_recompute_with_micro_batches(kind):
    assert_same_training(kind, "auto", batch=24, accumulate_steps=3)


@pytest.mark.parametrize("kind", ["sequential", "resnet"])
def test_recompute_in_bf16_mixed(kind):
    if not ft.backends.cpu_has_bf16():
        pytest.skip("this CPU has no AVX512-BF16: bf16-mixed runs as 32-true")
    program, plain = assert_same_training(kind, "auto", precision="bf16-mixed")
    assert program._c.node_dtypes() == plain._c.node_dtypes()


@pytest.mark.cuda
@pytest.mark.parametrize("kind", ["sequential", "resnet"])
@pytest.mark.parametrize("name", MODES)
def test_recompute_trains_bitwise_on_cuda(kind, name, ft_deterministic):
    assert_same_training(kind, mode(name, kind), device="cuda")


def test_predict_and_evaluate_are_unchanged():
    _, _, plain = train("resnet", None)
    _, _, program = train("resnet", "auto")
    x, y = batches(10, 1, seed=4)[0]
    assert np.array_equal(program.predict(x).numpy(), plain.predict(x).numpy())
    assert program.evaluate(x, y) == plain.evaluate(x, y)


def deep(depth=12, width=16):
    ft.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
                         *[Block(width, p=0.0) for _ in range(depth)],
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, 5))


def compile_deep(recompute, batch=32):
    model = deep()
    return model.compile(ft.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), nn.CrossEntropyLoss(),
                         batch_size=batch, input_shape=(3, 12, 12), recompute=recompute)


def test_sqrt_segments_shrink_a_deep_net_arena():
    plain = compile_deep(None).memory_plan()["activations"]
    auto = compile_deep("auto")
    assert auto.memory_plan()["activations"] < 0.7 * plain
    # about sqrt(N) segments: every block but a few recomputes its inner outputs, and the last part is kept
    recomputed = auto._c.recomputed()
    assert 0.3 * len(recomputed) < sum(recomputed) < len(recomputed)
    assert not recomputed[auto.output] and not recomputed[-1]


def test_a_budget_is_met_at_less_recomputation_than_the_least_arena():
    plain = compile_deep(None).memory_plan()["activations"]
    budget = int(0.6 * plain)
    program = compile_deep(budget)
    assert program.memory_plan()["activations"] <= budget
    with pytest.raises(ValueError, match="below the least training arena") as info:
        compile_deep(1)
    least = int(re.search(r": (\d+) bytes", str(info.value)).group(1))
    assert least < budget
    tightest = compile_deep(least)
    assert tightest.memory_plan()["activations"] == least
    # the looser budget recomputes fewer FLOPs: compute-bound outputs it can keep are kept
    flops = lambda p: sum(p._nodes[i]["flops"] for i, r in enumerate(p._c.recomputed()) if r)  # noqa: E731
    assert flops(program) < flops(tightest)
    # a budget the plain plan meets recomputes nothing
    assert not any(compile_deep(plain)._c.recomputed())


def test_arenas_stay_linear_in_the_batch_with_sqrt_segments():
    sizes = {b: compile_deep("auto", b).memory_plan()["activations"] for b in (8, 16, 32)}
    assert abs((sizes[32] - sizes[16]) - 2 * (sizes[16] - sizes[8])) <= 64 * 5 * 60


def test_listed_modules_recompute_only_what_their_own_nodes_read():
    model = make("resnet")
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=8,
                            input_shape=(3, 12, 12), recompute=[model.blocks[0]])
    inside = [any(s is model.blocks[0] for s in e.scope) for e in program.entries]  # recorded by its call
    recomputed = program._c.recomputed()
    # conv, BN, dropout, conv; not the second BN, whose output no backward reads (the add's passes its gradient
    # through), so it is freed after the add's forward anyway, nor the add, which the next block reads
    assert sum(recomputed) == 4
    for i, r in enumerate(recomputed):
        if r:  # a node of the block, read by nodes of the block only
            assert inside[i] and all(inside[j] for j, f in enumerate(program.entries) if i in f.inputs)
    last = max(i for i, x in enumerate(inside) if x)
    assert not recomputed[last]


def test_blocks_of_a_functional_model_are_recognized():
    ft.manual_seed(0)
    block, head = Block(4), nn.Linear(4, 5)
    x = nn.Input((3, 8, 8))
    h = nn.ReLU()(nn.BatchNorm2d(4)(nn.Conv2d(3, 4, 3, padding=1)(x)))
    out = head(nn.Flatten()(nn.AdaptiveAvgPool2d(1)(block(block(h)))))
    model = nn.Model(x, out)
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=8,
                            recompute=[block])
    # a module called twice is one segment spanning both calls (the add between them included)
    assert sum(program._c.recomputed()) >= 4


def test_memory_plan_and_summary_report_recomputation():
    _, _, program = train("resnet", "auto", steps=0)
    plan = program.memory_plan()
    assert [n["recomputed"] for n in plan["nodes"]] == program._c.recomputed()
    text = program.summary()
    assert "recomputed in the backward" in text
    assert re.search(r"recompute: \d+ node outputs computed again in the backward, [\d.]+ MFLOP per sample", text)
    _, _, plain = train("resnet", None, steps=0)
    assert "recompute" not in plain.summary()
    assert not any(n["recomputed"] for n in plain.memory_plan()["nodes"])


def granted(n):
    """The bytes the CPU allocator grants for a request of n (alloc.c)."""
    return -(-n // HUGE_PAGE) * HUGE_PAGE if n >= MiB else -(-n // 64) * 64


@pytest.mark.parametrize("recompute", ["auto", "budget"])
def test_the_allocator_holds_the_smaller_plan_and_peaks_within_a_step_of_it(recompute):
    B = 128
    x, y = batches(B, 1)[0]
    model = deep(depth=4)
    opt = ft.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    compile_ = lambda b, r: model.compile(opt, nn.CrossEntropyLoss(), batch_size=b,  # noqa: E731
                                          input_shape=(3, 12, 12), recompute=r)
    plain = compile_(B, None).memory_plan()["activations"]
    budget = "auto" if recompute == "auto" else int(0.7 * plain)
    gc.collect()
    ft.empty_cache()
    before = ft.memory_stats("cpu")["allocated_bytes"]
    program = compile_(B, budget)
    plan = program.memory_plan()
    assert plan["activations"] < plain
    ft.reset_peak_memory_stats("cpu")
    program.train_step(x, y)
    stats = ft.memory_stats("cpu")
    held, peak = stats["allocated_bytes"] - before, stats["peak_bytes"] - before
    expected = sum(granted(plan[k]) for k in ("activations", "evaluation", "optimizer_state"))
    assert 0 <= held - expected <= 4096, (held, expected)
    # a residual input's gradient that a convolution writes second is staged (test_memory.py)
    staged = max(granted(n["gradient"]) for n in plan["nodes"])
    assert 0 <= peak - held <= staged + MiB, (peak - held, staged)


# ---------------------------------------------------------------- bad requests

def compile_small(recompute, model=None):
    model = model or make("resnet")
    return model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=8,
                         input_shape=(3, 12, 12), recompute=recompute)


@pytest.mark.parametrize("recompute, error, match", [
    ("sqrt", ValueError, "recompute must be None, 'auto', a budget in bytes or a list of the model's modules, got "
                         "'sqrt'"),
    (-1, ValueError, "a recompute budget is the bytes the training activations may take"),
    (True, TypeError, "recompute must be None, 'auto'"),
    (1.5e6, TypeError, "got float"),
    ([nn.Linear(2, 2)], ValueError, "recompute lists a Linear that is not a submodule of the model"),
    ([[nn.Linear(2, 2)]], ValueError, "recompute lists a Linear that is not a submodule of the model"),
    (["blocks"], TypeError, "got list"),
])
def test_bad_recompute_requests_fail_clearly(recompute, error, match):
    with pytest.raises(error, match=re.escape(match)):
        compile_small(recompute)


def test_a_module_and_its_submodule_cannot_both_be_listed():
    model = make("resnet")
    with pytest.raises(ValueError, match=r"recompute lists 'blocks.0' and its submodule 'blocks.0.c1': list one"):
        compile_small([model.blocks[0], model.blocks[0].c1], model)
    with pytest.raises(ValueError, match=r"recompute lists 'blocks.1' and lists it again"):
        compile_small([[model.blocks[1], model.blocks[0]], model.blocks[1]], model)


def test_a_module_list_stands_for_its_modules():
    model = make("resnet")
    listed = compile_small([*model.blocks], model)._c.recomputed()
    assert sum(listed) > 0 and compile_small(model.blocks, model)._c.recomputed() == listed
    assert compile_small([model.blocks], model)._c.recomputed() == listed


def test_a_module_whose_outputs_all_leave_it_warns_that_it_recomputes_nothing():
    model = make("resnet")
    with pytest.warns(RuntimeWarning, match=r"recompute= item\(s\) \[0\] recompute nothing"):
        program = compile_small([model.blocks[0].c1], model)
    assert not any(program._c.recomputed())


def test_a_module_forward_does_not_call_is_refused():
    model = make("resnet")
    model.unused = nn.Linear(3, 3)
    with pytest.raises(ValueError, match="recompute lists 'unused', which the model's forward does not call"):
        compile_small([model.unused], model)


def test_a_budget_below_the_least_arena_says_the_least():
    with pytest.raises(ValueError, match=r"a recompute budget of 1000 bytes is below the least training arena the "
                                         r"planner finds for this model and batch: \d+ bytes \([\d.]+ MiB\)"):
        compile_small(1000)


def test_max_batch_size_plans_with_recompute():
    plain = ft.utils.max_batch_size(deep(), (3, 12, 12), 64 * MiB)
    more = ft.utils.max_batch_size(deep(), (3, 12, 12), 64 * MiB, recompute="auto")
    assert more > 1.4 * plain
    with pytest.raises(ValueError, match="recompute=<budget> fixes the training arena"):
        ft.utils.max_batch_size(deep(), (3, 12, 12), 64 * MiB, recompute=MiB)


def test_a_frozen_stem_is_not_recomputed_and_training_is_unchanged():
    program, _ = assert_same_training("frozen", "auto")
    stem = [any(s is program.model.stem for s in e.scope) for e in program.entries]
    # the stem's convolution, which only its frozen batch norm reads, is kept; its batch norm is read by a
    # block that trains
    assert not program._c.recomputed()[stem.index(True)]


def test_a_frozen_output_a_recomputation_reads_is_kept_for_it():
    """A frozen node read by a recomputed frozen node (itself read by a trained one) is not freed at its last
    reader's forward: the recomputation reads it again in the backward."""
    def make_frozen():
        ft.manual_seed(0)
        seg = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.Tanh(), nn.Conv2d(8, 8, 3, padding=1), nn.Tanh())
        stem = nn.Conv2d(3, 8, 3, padding=1)
        for q in [*stem.parameters(), *seg[0].parameters()]:
            q.requires_grad_(False)
        model = nn.Sequential(stem, nn.Tanh(), seg, nn.Conv2d(8, 8, 3, padding=1), nn.Tanh(),
                              nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5))
        return model, seg
    runs = []
    for listed in (False, True):
        model, seg = make_frozen()
        program = model.compile(ft.optim.SGD([q for q in model.parameters() if q.requires_grad], lr=0.1),
                                nn.CrossEntropyLoss(), batch_size=16, input_shape=(3, 12, 12),
                                recompute=[seg] if listed else None)
        assert any(program._c.recomputed()) == listed
        losses = [program.train_step(x, y) for x, y in batches(16, 3)]
        runs.append((losses, np.array(program.flat_grads).tobytes()))
    assert runs[0] == runs[1]
