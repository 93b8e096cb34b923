"""The one gradient rule (ops/gradient.h): every backward op writes its gradient outputs, or adds to them with
accumulate=True; compiled programs build micro-batches, residual forks and tied weights on it, with no scratch
copy of the gradients."""
import numpy as np
import pytest

import fasttrain as ft
from fasttrain import nn
from fasttrain.testing import gradcheck

from _opref import n, nhwc, t

RNG = np.random.default_rng(11)


def _conv(layout):
    x = RNG.standard_normal((3, 4, 6, 5))
    w = RNG.standard_normal((6, 4, 3, 3))
    wrap = nhwc if layout == "nhwc" else t
    dy = ft.ops.conv2d_forward(None, wrap(x), t(w), None, padding=1)
    dy = wrap(RNG.standard_normal(tuple(dy.shape)))
    return lambda outs, acc: ft.ops.conv2d_backward(*outs, dy, wrap(x), t(w), padding=1, accumulate=acc), \
        [(wrap, x.shape), (t, w.shape), (t, (6,))]


def _linear(layout):
    x, w, dy = RNG.standard_normal((7, 5)), RNG.standard_normal((4, 5)), RNG.standard_normal((7, 4))
    return lambda outs, acc: ft.ops.linear_backward(*outs, t(dy), t(x), t(w), accumulate=acc), \
        [(t, x.shape), (t, w.shape), (t, (4,))]


def _batch_norm(layout):
    shape = (4, 3) if layout == "2d" else (3, 5, 4, 4)
    wrap = nhwc if layout == "nhwc" else t
    x, w, dy = RNG.standard_normal(shape), RNG.standard_normal(shape[1]), RNG.standard_normal(shape)
    _, mean, invstd = ft.ops.batch_norm_forward(None, None, None, wrap(x), t(w), None)
    return lambda outs, acc: ft.ops.batch_norm_backward(*outs, wrap(dy), wrap(x), None, t(w), None, mean, invstd,
                                                        accumulate=acc), \
        [(wrap, shape), (t, shape[1:2]), (t, shape[1:2])]


def _layer_norm(layout):
    x, w, dy = RNG.standard_normal((4, 3, 8)), RNG.standard_normal(8), RNG.standard_normal((4, 3, 8))
    _, mean, rstd = ft.ops.layer_norm_forward(None, None, None, t(x), t(w), None, (8,))
    return lambda outs, acc: ft.ops.layer_norm_backward(*outs, t(dy), t(x), t(w), mean, rstd, (8,),
                                                        accumulate=acc), \
        [(t, x.shape), (t, (8,)), (t, (8,))]


CASES = [(_conv, "nchw"), (_conv, "nhwc"), (_linear, "2d"), (_batch_norm, "nchw"), (_batch_norm, "nhwc"),
         (_batch_norm, "2d"), (_layer_norm, "3d")]


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("make, layout", CASES, ids=[f"{m.__name__[1:]}-{lay}" for m, lay in CASES])
def test_backward_writes_or_adds(make, layout, deterministic):
    """accumulate=False writes whatever the outputs held; accumulate=True gives what they held plus the same
    contribution, in every output, in the outputs' own memory layout."""
    run, likes = make(layout)
    ft.use_deterministic_algorithms(deterministic)
    try:
        # outputs pre-filled with NaN: writing must not read them
        fresh = [n(g) for g in run([wrap(np.full(shape, np.nan)) for wrap, shape in likes], False)]
        held = [RNG.standard_normal(shape) for _, shape in likes]
        outs = [wrap(h) for (wrap, _), h in zip(likes, held)]
        strides = [o.stride() for o in outs]
        added = run(outs, True)
    finally:
        ft.use_deterministic_algorithms(False)
    for a, o, f, h, st in zip(added, outs, fresh, held, strides):
        assert a is o and o.stride() == st  # into the given tensors, in their layout
        np.testing.assert_allclose(n(o), h + f, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("make, layout", CASES[:1] + CASES[2:4] + CASES[-1:], ids=["conv", "linear", "bn", "ln"])
def test_accumulate_needs_tensors_to_add_into(make, layout):
    run, likes = make(layout)
    with pytest.raises(ValueError, match="accumulate"):
        run([None, None, None], True)


# ---------------------------------------------------------------- compiled programs

def test_tied_weights_and_residual_fork_match_finite_differences():
    """One weight applied twice (tied), and a residual fork around both uses."""
    ft.manual_seed(2)
    inp, shared, again, head = nn.Linear(6, 8), nn.Linear(8, 8), nn.Linear(8, 8, bias=False), nn.Linear(8, 5)
    again.register_parameter("weight", shared.weight)
    x = nn.Input((6,))
    h = nn.GELU()(inp(x))  # smooth: central differences see no kink
    model = nn.Model(x, head(nn.Tanh()(again(nn.Tanh()(shared(h)))) + h))
    names = [k for k, _ in model.named_parameters()]
    assert len(names) == 6 and len(model.state_dict()) == 7  # the tied weight: one parameter, two state keys
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=4, input_shape=(6,))
    rng = np.random.default_rng(3)
    assert gradcheck(program, rng.standard_normal((4, 6)).astype(np.float32), rng.integers(0, 5, 4), eps=1e-2,
                     rtol=2e-2, atol=2e-3)


def _mlp(seed):
    ft.manual_seed(seed)
    return nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 16), nn.GELU(), nn.LayerNorm(16),
                         nn.Linear(16, 5))


@pytest.mark.parametrize("deterministic", [False, True])
def test_micro_batches_match_one_big_batch(deterministic):
    rng = np.random.default_rng(4)
    x, y = rng.standard_normal((8, 12)).astype(np.float32), rng.integers(0, 5, 8)
    grads = []
    ft.use_deterministic_algorithms(deterministic)
    try:
        for steps in (1, 4):
            model = _mlp(7)
            program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=8, input_shape=(12,),
                                    accumulate_steps=steps)
            program.backward(x, y)
            program.optimizer.zero_grad()
            program.backward(x, y)  # after zero_grad a backward writes anew: it does not add to the first
            grads.append({k: p.grad.numpy().copy() for k, p in model.named_parameters()})
    finally:
        ft.use_deterministic_algorithms(False)
    for k in grads[0]:
        np.testing.assert_allclose(grads[1][k], grads[0][k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_micro_batches_keep_no_scratch_copy_of_the_gradients():
    """Compiling holds the flat parameters, the flat gradients and the activation arenas: no second gradient
    buffer for micro-batches and no scratch activation for forks."""
    ft.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
    nbytes = 4 * sum(p.numel() for p in model.parameters())
    before = ft.memory_stats("cpu")["allocated_bytes"]
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=64, input_shape=(256,),
                            accumulate_steps=4)
    grew = ft.memory_stats("cpu")["allocated_bytes"] - before
    train, evaluation, _ = program._c.memory()
    assert grew <= 2 * nbytes + train + evaluation + 2**20, (grew, nbytes)
