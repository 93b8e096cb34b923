"""ft.optim: SGD, Adam, AdamW, RMSprop, Adadelta, Adagrad, Adamax, NAdam, RAdam, LAMB and LARS against NumPy
implementations of their documented formulas over several steps (param groups, nesterov, dampening, amsgrad,
maximize, weight decay, grad scaling, clipping, skipped params), against torch.optim when torch imports, bitwise
equality for 1 and 2 threads, non-finite grads, state_dict round trips, the weight EMA, every lr_scheduler against
NumPy closed forms (and torch), and bad input."""
import math

import numpy as np
import pytest

import fasttrain as ft
from _optimref import REFS, hyper
from fasttrain.optim import lr_scheduler as ls

try:
    import torch
except Exception:  # not installed, or a broken install
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")

SHAPES = [(3, 4), (5,), (), (2, 3, 2), (40000,)]  # the last spans several blocks of the fused pass
STEPS = 5


def f32(a):
    """A float32 ndarray copy (0-d arrays included, which NumPy arithmetic turns into scalars)."""
    return np.array(a, dtype=np.float32)


def make_params(shapes=SHAPES, seed=0):
    rng = np.random.default_rng(seed)
    return [f32(rng.standard_normal(s)) for s in shapes]


def make_grads(shapes, steps, seed=1, scale=1.0):
    rng = np.random.default_rng(seed)
    return [[f32(scale * rng.standard_normal(s)) for s in shapes] for _ in range(steps)]


def to_ft(arrays):
    return [ft.from_numpy(f32(a)) for a in arrays]


def close(got, want, rtol=2e-5, atol=2e-6):
    np.testing.assert_allclose(np.asarray(got, dtype=np.float64), want, rtol=rtol, atol=atol)


def run_reference(cls, groups, params, grads, grad_scale=1.0, max_grad_norm=None):
    """groups: [(param indices, full hyperparameter dict)]; grads[step][i] may be None (skipped)."""
    ps = [p.astype(np.float64) for p in params]
    states = [{} for _ in params]
    for step_grads in grads:
        gs = [None if g is None else g.astype(np.float32) * np.float32(grad_scale) for g in step_grads]
        gs = [None if g is None else g.astype(np.float64) for g in gs]
        if max_grad_norm:
            norm = math.sqrt(sum(float(np.sum(g * g)) for g in gs if g is not None))
            coef = min(1.0, max_grad_norm / (norm + 1e-6))
            gs = [None if g is None else g * coef for g in gs]
        for indices, h in groups:
            for i in indices:
                if gs[i] is not None:
                    ps[i] = REFS[cls](ps[i], gs[i], states[i], h)
    return ps


def run_ft(cls, param_groups, params, grads, **step_kwargs):
    """param_groups: [(indices, overrides)]; returns the optimizer and the ft params."""
    tensors = to_ft(params)
    spec = [dict(params=[tensors[i] for i in idx], **over) for idx, over in param_groups]
    opt = cls(spec, **CTOR[cls])
    for step_grads in grads:
        for t, g in zip(tensors, step_grads):
            t.grad = None if g is None else ft.from_numpy(f32(g))
        opt.step(**step_kwargs)
    return opt, tensors


CTOR = {ft.optim.SGD: dict(lr=0.05), ft.optim.AdamW: dict(lr=1e-2), ft.optim.LAMB: dict(lr=1e-2),
        ft.optim.LARS: dict(lr=0.5), ft.optim.Adam: dict(lr=1e-2), ft.optim.RMSprop: dict(lr=1e-2),
        ft.optim.Adadelta: dict(lr=1.0), ft.optim.Adagrad: dict(lr=0.1), ft.optim.Adamax: dict(lr=1e-2),
        ft.optim.NAdam: dict(lr=1e-2), ft.optim.RAdam: dict(lr=1e-2)}

# (class, [(param indices, group overrides)])
CASES = [
    (ft.optim.SGD, [([0, 1, 2, 3, 4], {})]),
    (ft.optim.SGD, [([0, 1, 2, 3, 4], dict(momentum=0.9, weight_decay=1e-2))]),
    (ft.optim.SGD, [([0, 1], dict(momentum=0.9, dampening=0.3)),
                    ([2, 3, 4], dict(momentum=0.8, nesterov=True, weight_decay=5e-4, lr=0.1, maximize=True))]),
    (ft.optim.AdamW, [([0, 1, 2, 3, 4], {})]),
    (ft.optim.AdamW, [([0, 4], dict(amsgrad=True, weight_decay=0.1)),
                      ([1, 2, 3], dict(betas=(0.8, 0.99), eps=1e-6, weight_decay=0.0, maximize=True, lr=3e-3))]),
    (ft.optim.Adam, [([0, 1, 2, 3, 4], {})]),
    (ft.optim.Adam, [([0, 4], dict(amsgrad=True, weight_decay=0.1)),
                     ([1, 2, 3], dict(betas=(0.8, 0.99), eps=1e-6, weight_decay=1e-2, maximize=True, lr=3e-3))]),
    (ft.optim.LAMB, [([0, 1, 2, 3, 4], {})]),
    (ft.optim.LAMB, [([0, 3, 4], dict(weight_decay=0.1)), ([1, 2], dict(lars_exclude=True, weight_decay=0.0))]),
    (ft.optim.LARS, [([0, 1, 2, 3, 4], {})]),
    (ft.optim.LARS, [([0, 3, 4], dict(weight_decay=5e-4, trust_coefficient=0.02)),
                     ([1, 2], dict(lars_exclude=True, lr=0.05, momentum=0.5, maximize=True))]),
    (ft.optim.RMSprop, [([0, 1, 2, 3, 4], {})]),
    (ft.optim.RMSprop, [([0, 4], dict(momentum=0.9, weight_decay=0.1)),
                        ([1, 2, 3], dict(alpha=0.9, centered=True, eps=1e-4, maximize=True, lr=3e-3, momentum=0.5))]),
    (ft.optim.Adadelta, [([0, 1, 2, 3, 4], {})]),
    (ft.optim.Adadelta, [([0, 4], dict(rho=0.5, weight_decay=0.1)), ([1, 2, 3], dict(eps=1e-4, maximize=True,
                                                                                    lr=0.5))]),
    (ft.optim.Adagrad, [([0, 1, 2, 3, 4], {})]),
    (ft.optim.Adagrad, [([0, 4], dict(lr_decay=0.1, weight_decay=0.1, initial_accumulator_value=0.5)),
                        ([1, 2, 3], dict(eps=1e-3, maximize=True, lr=0.5, initial_accumulator_value=0.5))]),
    (ft.optim.Adamax, [([0, 1, 2, 3, 4], {})]),
    (ft.optim.Adamax, [([0, 4], dict(weight_decay=0.1, betas=(0.8, 0.9))), ([1, 2, 3], dict(eps=1e-3, maximize=True,
                                                                                           lr=0.1))]),
    (ft.optim.NAdam, [([0, 1, 2, 3, 4], {})]),
    (ft.optim.NAdam, [([0, 4], dict(weight_decay=0.1, momentum_decay=0.05)),
                      ([1, 2, 3], dict(weight_decay=0.1, decoupled_weight_decay=True, maximize=True, lr=3e-3))]),
    # betas[1] 0.9: the variance's length passes 5 at step 4, so the steps before and after both run
    (ft.optim.RAdam, [([0, 1, 2, 3, 4], dict(betas=(0.9, 0.9)))]),
    (ft.optim.RAdam, [([0, 4], dict(weight_decay=0.1, betas=(0.8, 0.8))),
                      ([1, 2, 3], dict(weight_decay=0.1, decoupled_weight_decay=True, maximize=True, lr=3e-3,
                                       betas=(0.9, 0.85)))]),
]


def full_groups(cls, param_groups):
    return [(idx, hyper(cls, **{**CTOR[cls], **over})) for idx, over in param_groups]


@pytest.mark.parametrize("cls, groups", CASES, ids=lambda c: getattr(c, "__name__", None))
@pytest.mark.parametrize("clip", [None, 1.5])
def test_against_numpy(cls, groups, clip):
    params = make_params()
    grads = make_grads(SHAPES, STEPS)
    _, got = run_ft(cls, groups, params, grads, max_grad_norm=clip)
    want = run_reference(cls, full_groups(cls, groups), params, grads, max_grad_norm=clip)
    for i, (g, w) in enumerate(zip(got, want)):
        close(g.numpy(), w)


@pytest.mark.parametrize("cls", [ft.optim.SGD, ft.optim.AdamW, ft.optim.Adam, ft.optim.LAMB, ft.optim.LARS,
                                 ft.optim.Adamax, ft.optim.NAdam])
def test_grad_scale_and_skipped_params(cls):
    params = make_params()
    groups = [([0, 1, 2, 3, 4], dict(weight_decay=1e-3) if cls is not ft.optim.SGD else dict(momentum=0.9))]
    grads = make_grads(SHAPES, STEPS, scale=8.0)
    for s, step_grads in enumerate(grads):  # param 1 has no grad at first, param 3 only at step 2
        if s < 2:
            step_grads[1] = None
        if s != 2:
            step_grads[3] = None
    opt, got = run_ft(cls, groups, params, grads, grad_scale=0.125)
    want = run_reference(cls, full_groups(cls, groups), params, grads, grad_scale=0.125)
    for g, w in zip(got, want):
        close(g.numpy(), w)
    state = opt.state_dict()["state"]
    if cls is not ft.optim.SGD:
        assert [int(state[i]["step"]) for i in range(5)] == [5, 3, 5, 1, 5]
    # A power-of-two grad_scale is exact: the same as pre-scaled grads, bit for bit.
    scaled = [[None if g is None else f32(g * np.float32(0.125)) for g in sg] for sg in grads]
    _, direct = run_ft(cls, groups, params, scaled)
    for a, b in zip(got, direct):
        assert a.numpy().tobytes() == b.numpy().tobytes()


def test_param_group_lr_changes_take_effect():
    p = ft.from_numpy(np.zeros(4, np.float32))
    opt = ft.optim.SGD([p], lr=0.5)
    total = 0.0
    for lr in (0.5, 0.25, 0.0, 2.0):
        opt.param_groups[0]["lr"] = lr
        p.grad = ft.ones(4)
        opt.step()
        total -= lr
        np.testing.assert_allclose(p.numpy(), total)
    opt.param_groups[0]["momentum"] = 0.9  # switching momentum on allocates its buffer
    p.grad = ft.ones(4)
    opt.step()
    np.testing.assert_allclose(p.numpy(), total - 2.0)
    assert opt.state_dict()["state"][0]["momentum_buffer"].tolist() == [1, 1, 1, 1]


@pytest.mark.parametrize("kind", ["SGD", "Adam"])
def test_params_taken_out_of_a_group_after_a_step_are_left_alone(kind):
    """A param taken out of param_groups after steps is not updated again, by optimizer.step() and by a compiled
    step, while the others go on with their state (Adam's step count, SGD's momentum: the same values as an
    optimizer that never held it). A str learning rate is refused."""
    def run(drop):
        a, b = ft.from_numpy(np.ones(3, np.float32)), ft.from_numpy(np.ones(2, np.float32))
        opt = getattr(ft.optim, kind)([a, b] if drop else [a], lr=0.1, **({"momentum": 0.9} if kind == "SGD" else {}))
        for step in range(3):
            if drop and step == 1:
                opt.param_groups[0]["params"] = [a]
            a.grad, b.grad = ft.full((3,), 1.0 + step), ft.ones(2)
            opt.step()
        return a.numpy().copy(), b.numpy().copy(), opt

    a, b, opt = run(True)
    a_alone = run(False)[0]
    np.testing.assert_array_equal(a, a_alone)
    np.testing.assert_allclose(b, 0.9, rtol=1e-6)  # one step of a unit gradient (Adam's first step is lr too)
    opt.param_groups[0]["lr"] = "0.5"
    with pytest.raises(TypeError, match="param group 0: lr must be a number, got str"):
        opt.step()

    p, q = ft.ones(3), ft.ones(2)
    two = getattr(ft.optim, kind)([{"params": [p]}, {"params": [q], "lr": 0.5}], lr=0.1,
                                  **({"momentum": 0.9} if kind == "SGD" else {}))
    p.grad, q.grad = ft.ones(3), ft.ones(2)
    two.step()
    del two.param_groups[1]  # a whole group taken out
    kept = q.numpy().copy()
    two.step()
    assert np.array_equal(q.numpy(), kept) and list(two.state_dict()["state"]) == [0]

    model = ft.nn.Sequential(ft.nn.Linear(4, 8), ft.nn.ReLU(), ft.nn.Linear(8, 3))
    opt = getattr(ft.optim, kind)(model.parameters(), lr=0.1)
    program = model.compile(opt, ft.nn.CrossEntropyLoss(), batch_size=8, input_shape=(4,))
    x, y = np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32), np.arange(8) % 3
    program.train_step(x, y)
    opt.param_groups[0]["params"] = opt.param_groups[0]["params"][:2]  # the first layer only
    last = model[2].weight.numpy().copy(), model[0].weight.numpy().copy()
    program.train_step(x, y)
    assert np.array_equal(model[2].weight.numpy(), last[0]) and not np.array_equal(model[0].weight.numpy(), last[1])


def test_torch_2_implementation_arguments_are_taken():
    """Arguments torch 2 configs pass: capturable= (no effect: one fused pass in any case), decoupled_weight_decay=True
    (Adam's update becomes AdamW's, bit for bit), differentiable=True refused."""
    def run(make):
        p = ft.from_numpy(np.linspace(-1, 1, 5).astype(np.float32))
        opt = make([p])
        for step in range(3):
            p.grad = ft.full((5,), 0.5 - step)
            opt.step()
        return p.numpy().tobytes()

    adamw = run(lambda ps: ft.optim.AdamW(ps, lr=0.1, weight_decay=0.1))
    assert run(lambda ps: ft.optim.Adam(ps, lr=0.1, weight_decay=0.1, decoupled_weight_decay=True)) == adamw
    assert run(lambda ps: ft.optim.Adam(ps, lr=0.1, weight_decay=0.1)) != adamw
    assert run(lambda ps: ft.optim.AdamW(ps, lr=0.1, weight_decay=0.1, capturable=True, foreach=False)) == adamw
    for make in (ft.optim.SGD, ft.optim.Adam, ft.optim.RMSprop):
        with pytest.raises(NotImplementedError, match="differentiable=True: a fasttrain optimizer step records no"):
            make([ft.zeros(2)], lr=0.1, differentiable=True)


def test_deepcopy_and_pickle_after_steps_go_on_as_the_original():
    """copy.deepcopy (and pickle) of an optimizer that has stepped, of a scheduler holding it and of an EMA: copies
    with their own params and state, which step on bit for bit as the original does (it raised "cannot pickle
    '_C.Optimizer'")."""
    import copy
    import pickle
    p = ft.from_numpy(np.linspace(-1, 1, 4).astype(np.float32))
    opt = ft.optim.Adam([p], lr=0.1)
    for _ in range(2):
        p.grad = ft.ones(4)
        opt.step()
    ema = ft.optim.EMA([p], decay=0.5)
    ema.update()
    for twin in (copy.deepcopy(opt), pickle.loads(pickle.dumps(opt)),
                 copy.deepcopy(ft.optim.lr_scheduler.StepLR(opt, 2)).optimizer):
        q = twin.param_groups[0]["params"][0]
        assert q is not p and q.tolist() == p.tolist()
        q.grad = ft.full((4,), 0.5)
        twin.step()
        assert twin.state_dict()["state"][0]["step"] == 3
    p.grad = ft.full((4,), 0.5)
    opt.step()
    assert q.tolist() == p.tolist()
    copied = copy.deepcopy(ema)
    assert copied.params[0] is not p and copied.num_updates == 1 and copied.shadow[0].tolist() == ema.shadow[0].tolist()


def test_zero_grad_and_closure():
    p = ft.from_numpy(np.ones(3, np.float32))
    opt = ft.optim.SGD([p], lr=0.1)
    p.grad = ft.ones(3)
    opt.zero_grad(set_to_none=False)
    assert p.grad.tolist() == [0, 0, 0]
    opt.zero_grad()
    assert p.grad is None
    assert opt.step(lambda: 42.0) == 42.0  # no grads: nothing changes
    assert p.tolist() == [1, 1, 1]


def test_state_is_pytorchs_per_param_mapping_of_views():
    """optimizer.state as torch's: empty before a step, then {param: {"step", buffers}} with the state_dict's
    values; a buffer changed in place is the optimizer's, an entry cannot be replaced; SGD without momentum keeps
    none."""
    rng = np.random.default_rng(7)
    params = [ft.from_numpy(f32(rng.standard_normal(s))) for s in ((2, 3), (3,))]
    opt = ft.optim.Adam(params, lr=0.1)
    assert len(opt.state) == 0 and opt.state[params[0]] == {}
    with pytest.raises(KeyError):
        opt.state[ft.zeros(2)]
    for _ in range(2):
        for p in params:
            p.grad = ft.from_numpy(f32(rng.standard_normal(p.shape)))
        opt.step()
    state, saved = opt.state, opt.state_dict()["state"]
    assert list(state) == params and list(state[params[0]]) == ["step", "exp_avg", "exp_avg_sq"]
    for i, p in enumerate(params):
        assert float(state[p]["step"]) == 2.0
        for key in ("exp_avg", "exp_avg_sq"):
            assert state[p][key].shape == p.shape
            np.testing.assert_array_equal(state[p][key].numpy(), saved[i][key])
    state[params[1]]["exp_avg"].zero_()
    assert not opt.state_dict()["state"][1]["exp_avg"].any()
    with pytest.raises(TypeError):  # read-only: the state lives in the optimizer's flat buffers
        state[params[1]]["exp_avg"] = ft.zeros(3)
    sgd = ft.optim.SGD(params, lr=0.1)
    sgd.step()
    assert len(sgd.state) == 0


# ---- against torch.optim ----

def torch_pair(cls, groups, params):
    tensors = [torch.tensor(f32(p), requires_grad=True) for p in params]
    spec = [dict(params=[tensors[i] for i in idx], **over) for idx, over in groups]
    # torch.optim.Adagrad reads initial_accumulator_value from its defaults only (the cases give one value to all)
    init = {k: v for _, over in groups for k, v in over.items() if k == "initial_accumulator_value"}
    return getattr(torch.optim, cls.__name__)(spec, foreach=False, **CTOR[cls], **init), tensors


@needs_torch
@pytest.mark.parametrize("cls, groups", [c for c in CASES if c[0] not in (ft.optim.LAMB, ft.optim.LARS)],
                         ids=lambda c: getattr(c, "__name__", None))
def test_against_torch(cls, groups):
    params = make_params()
    grads = make_grads(SHAPES, STEPS)
    grads[1][2] = None  # a skipped param
    topt, tparams = torch_pair(cls, groups, params)
    for step_grads in grads:
        for t, g in zip(tparams, step_grads):
            t.grad = None if g is None else torch.from_numpy(f32(g))
        torch.nn.utils.clip_grad_norm_([t for t in tparams if t.grad is not None], 2.0)
        topt.step()
    opt, got = run_ft(cls, groups, params, grads, max_grad_norm=2.0)
    for g, t in zip(got, tparams):
        np.testing.assert_allclose(g.numpy(), t.detach().numpy(), rtol=1e-5, atol=1e-6)
    # The state_dicts agree in layout and values.
    ours, theirs = opt.state_dict(), topt.state_dict()
    assert set(ours["state"]) == set(theirs["state"])
    for i, entry in theirs["state"].items():
        assert set(ours["state"][i]) == set(entry)
        for key, value in entry.items():
            if value is None:
                assert ours["state"][i][key] is None
            else:  # centered RMSprop divides by sqrt(v - a^2), which cancels: whether a compiler fuses the
                # multiply-add changes its last bits, and the quotient by more where the variance is nearly 0
                rtol = 1e-3 if key == "momentum_buffer" and any(g.get("centered") for _, g in groups) else 1e-5
                np.testing.assert_allclose(ours["state"][i][key], value.numpy(), rtol=rtol, atol=1e-6)
    for og, tg in zip(ours["param_groups"], theirs["param_groups"]):
        assert og["params"] == tg["params"]
        assert all(og[k] == tg[k] for k in og if k != "params")


@needs_torch
@pytest.mark.parametrize("cls, options", [(ft.optim.AdamW, dict(amsgrad=True)),
                                          (ft.optim.NAdam, dict(momentum_decay=0.05)),  # its mu_product state
                                          (ft.optim.Adagrad, dict(initial_accumulator_value=0.1))])
def test_state_dict_interchange_with_torch(cls, options):
    params = make_params()
    grads = make_grads(SHAPES, 6)
    groups = [([0, 1, 2, 3, 4], options)]
    topt, tparams = torch_pair(cls, groups, params)
    for step_grads in grads[:3]:
        for t, g in zip(tparams, step_grads):
            t.grad = torch.from_numpy(f32(g))
        topt.step()
    # torch's state continues in fasttrain ...
    mine = to_ft([t.detach().numpy() for t in tparams])
    opt = cls([dict(params=mine, **options)], **CTOR[cls])
    opt.load_state_dict(topt.state_dict())
    # ... and fasttrain's in torch.
    back = [torch.tensor(t.detach().numpy().copy(), requires_grad=True) for t in tparams]
    topt2 = getattr(torch.optim, cls.__name__)(back, foreach=False, **options, **CTOR[cls])
    sd = opt.state_dict()
    topt2.load_state_dict({"state": {i: {k: torch.from_numpy(np.array(v)) for k, v in e.items()}
                                     for i, e in sd["state"].items()}, "param_groups": sd["param_groups"]})
    for step_grads in grads[3:]:
        for t, t2, m, g in zip(tparams, back, mine, step_grads):
            t.grad, t2.grad, m.grad = torch.from_numpy(f32(g)), torch.from_numpy(f32(g)), ft.from_numpy(f32(g))
        topt.step()
        topt2.step()
        opt.step()
    for t, t2, m in zip(tparams, back, mine):
        np.testing.assert_allclose(m.numpy(), t.detach().numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(t2.detach().numpy(), t.detach().numpy(), rtol=1e-5, atol=1e-6)


# ---- determinism, non-finite grads, state ----

@pytest.mark.parametrize("cls", [ft.optim.SGD, ft.optim.AdamW, ft.optim.LAMB, ft.optim.LARS, ft.optim.RMSprop,
                                 ft.optim.Adagrad, ft.optim.NAdam, ft.optim.RAdam])
def test_bitwise_identical_with_1_and_2_threads(cls, threads):
    shapes = [(300, 500), (7,), (100000,)]
    params, grads = make_params(shapes), make_grads(shapes, 4)
    results = []
    for n in (1, 2):
        threads(n)
        opt, got = run_ft(cls, [([0, 1, 2], dict(weight_decay=1e-3))], params, grads, max_grad_norm=50.0)
        results.append(([t.numpy().tobytes() for t in got], opt.grad_norm))
    assert results[0] == results[1]


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nonfinite_grads_change_nothing(bad):
    params = make_params()
    tensors = to_ft(params)
    opt = ft.optim.AdamW(tensors, lr=1e-2)
    for t, g in zip(tensors, make_grads(SHAPES, 1)[0]):
        t.grad = ft.from_numpy(f32(g))
    opt.step()
    before = [t.numpy().copy() for t in tensors]
    state = opt.state_dict()["state"]
    tensors[4].grad.numpy()[123] = bad
    for kwargs in ({}, dict(max_grad_norm=1.0)):
        with pytest.raises(ValueError, match="gradient norm is"):
            opt.step(**kwargs)
    for t, b in zip(tensors, before):
        assert t.numpy().tobytes() == b.tobytes()
    after = opt.state_dict()["state"]
    for i in state:
        for key in state[i]:
            assert np.array_equal(state[i][key], after[i][key])
    opt.step(check_finite=False)  # as torch.optim: the value goes through
    assert opt.grad_norm is None
    assert not np.isfinite(tensors[4].numpy()[123])


def test_clipping_reports_the_norm():
    p = ft.from_numpy(np.zeros(4, np.float32))
    opt = ft.optim.SGD([p], lr=1.0)
    p.grad = ft.from_numpy(np.array([3, 4, 0, 0], np.float32))
    opt.step(max_grad_norm=1.0)
    assert opt.grad_norm == 5.0
    np.testing.assert_allclose(p.numpy(), [-0.6 / (1 + 2e-7), -0.8 / (1 + 2e-7), 0, 0], rtol=1e-6)
    opt.step(max_grad_norm=10.0)  # below the threshold: unchanged grads
    np.testing.assert_allclose(p.numpy(), [-3.6, -4.8, 0, 0], rtol=1e-6)


@pytest.mark.parametrize("cls", [ft.optim.SGD, ft.optim.AdamW, ft.optim.LAMB, ft.optim.LARS, ft.optim.RMSprop,
                                 ft.optim.Adadelta, ft.optim.Adagrad, ft.optim.Adamax, ft.optim.NAdam,
                                 ft.optim.RAdam])
def test_state_dict_resumes_exactly(cls):
    params = make_params()
    grads = make_grads(SHAPES, 6)
    groups = [([0, 1, 2, 3, 4], dict(momentum=0.9) if cls is ft.optim.SGD else
               dict(momentum=0.5, centered=True) if cls is ft.optim.RMSprop else {})]
    opt, tensors = run_ft(cls, groups, params, grads[:3])
    sd = opt.state_dict()
    resumed = to_ft([t.numpy() for t in tensors])
    opt2 = cls([dict(params=resumed)], **CTOR[cls])
    opt2.load_state_dict(sd)
    for step_grads in grads[3:]:
        for a, b, g in zip(tensors, resumed, step_grads):
            a.grad, b.grad = ft.from_numpy(f32(g)), ft.from_numpy(f32(g))
        opt.step()
        opt2.step()
    for a, b in zip(tensors, resumed):
        assert a.numpy().tobytes() == b.numpy().tobytes()
    assert opt.state_dict()["param_groups"] == opt2.state_dict()["param_groups"]


def test_load_state_dict_mismatches():
    params = make_params()
    opt, _ = run_ft(ft.optim.AdamW, [([0, 1, 2, 3, 4], {})], params, make_grads(SHAPES, 2))
    sd = opt.state_dict()
    other = to_ft(make_params([(3, 4), (6,), (), (2, 3, 2), (40000,)]))
    target = ft.optim.AdamW(other)
    with pytest.raises(ValueError, match=r"param 1: exp_avg has shape \(5,\), but the param has shape \(6,\)"):
        target.load_state_dict(sd)
    assert target.state_dict()["state"] == {}  # nothing was loaded
    with pytest.raises(ValueError, match=r"1 parameter group\(s\), the optimizer 2"):
        ft.optim.AdamW([dict(params=other[:2]), dict(params=other[2:])]).load_state_dict(sd)
    with pytest.raises(ValueError, match="has 5 params in the state_dict and 4"):
        ft.optim.AdamW(other[:4]).load_state_dict(sd)
    same = to_ft(params)
    broken = {"state": {0: {"step": np.float32(1), "exp_avg": np.zeros((3, 4))}}, "param_groups": sd["param_groups"]}
    with pytest.raises(ValueError, match="param 0 has no 'exp_avg_sq'"):
        ft.optim.AdamW(same).load_state_dict(broken)
    broken["state"][0].update(exp_avg_sq=np.zeros((3, 4)), step=-1.0)
    with pytest.raises(ValueError, match="step must be a whole number"):
        ft.optim.AdamW(same).load_state_dict(broken)
    with pytest.raises(ValueError, match="param 9"):
        ft.optim.AdamW(same).load_state_dict({"state": {9: {}}, "param_groups": sd["param_groups"]})
    bad_lr = {"state": {}, "param_groups": [dict(sd["param_groups"][0], lr=float("nan"))]}
    with pytest.raises(ValueError, match="lr must be finite"):
        ft.optim.AdamW(same).load_state_dict(bad_lr)
    with pytest.raises(ValueError, match="'state' and 'param_groups'"):
        ft.optim.AdamW(same).load_state_dict({})


def test_add_param_group_keeps_state():
    params = make_params()
    tensors = to_ft(params)
    opt = ft.optim.AdamW(tensors[:2], lr=1e-2)
    for t, g in zip(tensors[:2], make_grads(SHAPES[:2], 1)[0]):
        t.grad = ft.from_numpy(f32(g))
    opt.step()
    before = opt.state_dict()["state"]
    opt.add_param_group(dict(params=tensors[2:], lr=1e-3))
    after = opt.state_dict()
    assert after["param_groups"][1]["lr"] == 1e-3 and after["param_groups"][1]["params"] == [2, 3, 4]
    for key in ("exp_avg", "exp_avg_sq"):
        assert np.array_equal(after["state"][1][key], before[1][key])
    with pytest.raises(ValueError, match="more than one parameter group"):
        opt.add_param_group(dict(params=[tensors[0]]))


@pytest.mark.skipif(not hasattr(ft.Tensor, "_rebind"), reason="Tensor._rebind is not built")
def test_params_moved_into_a_flat_buffer_keep_their_state():
    params = make_params()
    grads = make_grads(SHAPES, 4)
    opt, moved = run_ft(ft.optim.AdamW, [([0, 1, 2, 3, 4], {})], params, grads[:2])
    flat, offset = ft.zeros(sum(p.size for p in params)), 0
    for t in moved:  # what model.compile() does: the same objects, now views of one buffer
        t._rebind(flat, offset)
        offset += t.numel()
    ref, still = run_ft(ft.optim.AdamW, [([0, 1, 2, 3, 4], {})], params, grads[:2])
    for step_grads in grads[2:]:
        for a, b, g in zip(moved, still, step_grads):
            a.grad, b.grad = ft.from_numpy(f32(g)), ft.from_numpy(f32(g))
        opt.step()
        ref.step()
    assert np.array_equal(flat.numpy(), np.concatenate([t.numpy().ravel() for t in still]))
    assert int(opt.state_dict()["state"][4]["step"]) == 4


def test_state_lives_in_flat_buffers_in_memory_stats():
    ft.empty_cache()
    p = ft.zeros(1 << 20)
    opt = ft.optim.AdamW([p])
    p.grad = ft.ones(1 << 20)
    before = ft.memory_stats("cpu")["allocated_bytes"]
    opt.step()
    assert ft.memory_stats("cpu")["allocated_bytes"] - before >= 2 * (4 << 20)
    del opt
    assert ft.memory_stats("cpu")["allocated_bytes"] == before


# ---- EMA ----

def test_ema_against_numpy():
    params = make_params()
    tensors = to_ft(params)
    ema = ft.optim.EMA(tensors, decay=0.9)
    want = [p.astype(np.float64) for p in params]
    rng = np.random.default_rng(5)
    for step in range(4):
        for t in tensors:
            t.numpy()[...] += rng.standard_normal(t.shape).astype(np.float32)
        decay = 0.9 if step < 3 else 0.5
        ema.update(None if step < 3 else decay)
        want = [w + (1 - decay) * (t.numpy() - w) for w, t in zip(want, tensors)]
    for s, w in zip(ema.shadow, want):
        close(s.numpy(), w, rtol=1e-6, atol=1e-6)
    sd = ema.state_dict()
    restored = ft.optim.EMA(tensors, decay=0.1)
    restored.load_state_dict(sd)
    assert restored.decay == 0.9 and restored.num_updates == 4
    assert all(np.array_equal(a.numpy(), b.numpy()) for a, b in zip(restored.shadow, ema.shadow))
    ema.copy_to()
    assert all(np.array_equal(t.numpy(), s.numpy()) for t, s in zip(tensors, ema.shadow))
    with pytest.raises(ValueError, match="decay"):
        ft.optim.EMA(tensors, decay=1.5)
    with pytest.raises(ValueError, match="decay"):
        ema.update(float("nan"))
    with pytest.raises(ValueError, match=r"average 1 has shape \(4,\)"):
        restored.load_state_dict(dict(sd, shadow=[sd["shadow"][0], np.zeros(4)] + sd["shadow"][2:]))
    with pytest.raises(ValueError, match="param 0 has shape"):
        ema.copy_to([ft.zeros(2)] + tensors[1:])


def test_an_ema_built_before_compile_follows_the_params_into_the_program():
    """An EMA built, as the optimizer, before compile moves the params into one flat buffer: its updates follow them
    there, its averages kept, and it averages as one built after compile."""
    runs = []
    for before in (True, False):
        ft.manual_seed(4)
        model = ft.nn.Sequential(ft.nn.Linear(4, 8), ft.nn.ReLU(), ft.nn.Linear(8, 3))
        ema = ft.optim.EMA(model.parameters(), decay=0.9) if before else None
        program = model.compile(ft.optim.SGD(model.parameters(), lr=0.5), ft.nn.CrossEntropyLoss(), batch_size=8,
                                input_shape=(4,))
        ema = ema or ft.optim.EMA(model.parameters(), decay=0.9)
        x, y = np.random.default_rng(5).standard_normal((8, 4)).astype(np.float32), np.arange(8) % 3
        for _ in range(3):
            program.train_step(x, y)
            ema.update()
        runs.append([s.numpy().copy() for s in ema.shadow])
        assert not np.array_equal(runs[-1][0], model[0].weight.numpy())  # an average, not the weights
    assert all(np.array_equal(a, b) for a, b in zip(*runs))


@needs_torch
def test_ema_against_torch():
    params = make_params()
    tensors = to_ft(params)
    ema = ft.optim.EMA(tensors, decay=0.95)
    tema = [torch.tensor(f32(p)) for p in params]
    for _ in range(3):
        for t in tensors:
            t.numpy()[...] *= np.float32(1.1)
        ema.update()
        torch._foreach_lerp_(tema, [torch.from_numpy(t.numpy()) for t in tensors], 1 - 0.95)
    for s, t in zip(ema.shadow, tema):
        np.testing.assert_allclose(s.numpy(), t.numpy(), rtol=1e-6, atol=1e-7)


@needs_torch
def test_a_first_update_at_decay_zero_is_torchs_averaged_model():
    """AveragedModel(multi_avg_fn=get_ema_multi_avg_fn(d)) copies the params at its first update, where EMA starts
    from them at construction: a first update(decay=0.0) gives AveragedModel's averages (docs/optim.md)."""
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
    params = make_params()
    tensors = to_ft(params)
    ema = ft.optim.EMA(tensors, decay=0.9)
    module = torch.nn.ParameterList([torch.nn.Parameter(torch.tensor(f32(p))) for p in params])
    averaged = AveragedModel(module, multi_avg_fn=get_ema_multi_avg_fn(0.9))
    for step in range(3):
        for t, m in zip(tensors, module):
            t.numpy()[...] *= np.float32(1.1)
            m.data.copy_(torch.from_numpy(t.numpy()))
        ema.update(decay=0.0 if step == 0 else None)
        averaged.update_parameters(module)
    for s, t in zip(ema.shadow, averaged.module):
        np.testing.assert_allclose(s.numpy(), t.detach().numpy(), rtol=1e-6, atol=1e-7)


# ---- bad input ----

@pytest.mark.parametrize("make, match", [
    (lambda p: ft.optim.SGD(p, lr=-0.1), "lr must be finite and >= 0"),
    (lambda p: ft.optim.SGD(p, lr=float("nan")), "lr must be finite"),
    (lambda p: ft.optim.SGD(p, momentum=-1), "momentum"),
    (lambda p: ft.optim.SGD(p, weight_decay=-1e-4), "weight_decay"),
    (lambda p: ft.optim.SGD(p, nesterov=True), "nesterov momentum requires"),
    (lambda p: ft.optim.SGD(p, momentum=0.9, dampening=0.1, nesterov=True), "nesterov momentum requires"),
    (lambda p: ft.optim.AdamW(p, betas=(1.0, 0.999)), r"betas must be in \[0, 1\)"),
    (lambda p: ft.optim.AdamW(p, betas=(0.9, -0.1)), "betas"),
    (lambda p: ft.optim.AdamW(p, eps=0.0), "eps must be finite and > 0"),
    (lambda p: ft.optim.AdamW(p, lr=float("inf")), "lr"),
    (lambda p: ft.optim.LAMB(p, eps=-1.0), "eps"),
    (lambda p: ft.optim.LARS(p, lr=0.1, trust_coefficient=0.0), "trust_coefficient"),
    (lambda p: ft.optim.LARS(p), "required value of 'lr'"),
    (lambda p: ft.optim.RMSprop(p, alpha=1.5), r"alpha must be in \[0, 1\]"),
    (lambda p: ft.optim.RMSprop(p, eps=-1e-8), "eps must be finite and >= 0"),
    (lambda p: ft.optim.RMSprop(p, momentum=-0.5), "momentum must be finite and >= 0"),
    (lambda p: ft.optim.Adadelta(p, rho=1.1), r"rho must be in \[0, 1\]"),
    (lambda p: ft.optim.Adagrad(p, lr_decay=-0.1), "Adagrad group 0: lr_decay must be finite and >= 0"),
    (lambda p: ft.optim.Adagrad(p, initial_accumulator_value=-1), "initial_accumulator_value must be finite and >= 0"),
    (lambda p: ft.optim.Adagrad(p, eps=-1e-10), "Adagrad group 0: eps must be finite and >= 0"),
    (lambda p: ft.optim.Adamax(p, betas=(0.9, 1.0)), r"Adamax group 0: betas must be in \[0, 1\)"),
    (lambda p: ft.optim.Adamax(p, eps=-1.0), "eps must be finite and >= 0"),
    (lambda p: ft.optim.NAdam(p, momentum_decay=-4e-3), "NAdam group 0: momentum_decay must be finite and >= 0"),
    (lambda p: ft.optim.NAdam(p, betas=(-0.1, 0.9)), "betas"),
    (lambda p: ft.optim.RAdam(p, weight_decay=-0.1), "RAdam group 0: weight_decay"),
    (lambda p: ft.optim.AdamW([dict(params=p, lr=-1.0)]), "group 0: lr"),
    (lambda p: ft.optim.AdamW([dict(params=p[:1]), dict(params=p[1:], eps=-1.0)]), "group 1: eps"),
    (lambda p: ft.optim.SGD([]), "empty parameter list"),
    (lambda p: ft.optim.SGD(p + p[:1]), "param group 0 holds a parameter more than once"),
    (lambda p: ft.optim.SGD([dict(params=p), dict(params=p[:1])]), "more than one parameter group"),
])
def test_bad_hyperparameters(make, match):
    with pytest.raises(ValueError, match=match):
        make([ft.zeros(3), ft.zeros(2)])


def test_bad_params_and_grads():
    with pytest.raises(TypeError, match="float32"):
        ft.optim.SGD([ft.zeros(3, dtype=ft.float64)])
    p = ft.zeros(3)
    p.grad = ft.ones(3)
    opt = ft.optim.AdamW([p])
    opt.step()
    sd = opt.state_dict()
    sd["state"][0]["step"] = np.float32("inf")
    with pytest.raises(ValueError, match="step must be a whole number >= 0, got inf"):  # was an OverflowError
        ft.optim.AdamW([ft.zeros(3)]).load_state_dict(sd)
    loader = ft.data.Loader((np.zeros((4, 2), np.float32), np.zeros(4, np.int64)), 2)
    with pytest.raises(ValueError, match=r"the state's epoch must be an integer in \[0, 2\*\*63\)"):
        loader.load_state_dict({**loader.state_dict(), "epoch": 2 ** 64 + 5})
    assert ft.optim.SGD([ft.zeros(3)], momentum=0.9, nesterov=1).param_groups[0]["nesterov"] == 1  # as PyTorch
    with pytest.raises(TypeError, match="amsgrad must be a bool, got 'yes'"):
        ft.optim.AdamW([ft.zeros(3)], amsgrad="yes")
    with pytest.raises(TypeError, match=r"got bfloat16: .*call model.float\(\) first; to train in bfloat16, "
                                        r"compile the float32 model with precision='bf16-mixed'"):
        ft.optim.AdamW(ft.nn.Linear(2, 2).bfloat16().parameters())
    with pytest.raises(TypeError, match="fasttrain Tensor"):
        ft.optim.SGD([np.zeros(3, np.float32)])
    with pytest.raises(TypeError, match="but got a Tensor"):
        ft.optim.SGD(ft.zeros(3))
    with pytest.raises(TypeError, match="ordered"):
        ft.optim.SGD({ft.zeros(3)})
    with pytest.raises(ValueError, match="contiguous"):
        ft.optim.SGD([ft.zeros((3, 4)).t()])
    with pytest.raises(TypeError, match="betas"):
        ft.optim.AdamW([ft.zeros(3)], betas=0.9)
    with pytest.raises(TypeError, match="lr must be a number"):
        ft.optim.AdamW([ft.zeros(3)], lr="fast")
    readonly = np.zeros(3, np.float32)
    readonly.flags.writeable = False
    opt = ft.optim.SGD([ft.from_numpy(readonly)])
    with pytest.raises(ValueError, match="read-only"):
        opt.step()
    p = ft.zeros((2, 3))
    opt = ft.optim.AdamW([ft.zeros(4), p])
    p.grad = ft.zeros((3, 2))
    with pytest.raises(ValueError, match=r"the grad of param 1 should have shape \(2, 3\), got \(3, 2\)"):
        opt.step()
    p.grad = ft.zeros((2, 3), dtype=ft.float64)
    with pytest.raises(TypeError, match="the grad of param 1 must be float32"):
        opt.step()
    p.grad = ft.zeros((3, 2)).t()
    with pytest.raises(ValueError, match="contiguous"):
        opt.step()
    p.grad = p
    with pytest.raises(ValueError, match="overlaps"):
        opt.step()
    p.grad = ft.zeros((2, 3))
    for kwargs, match in ((dict(grad_scale=0.0), "grad_scale"), (dict(grad_scale=float("nan")), "grad_scale"),
                          (dict(max_grad_norm=-1.0), "max_grad_norm"), (dict(max_grad_norm=float("inf")), "max_grad_norm")):
        with pytest.raises(ValueError, match=match):
            opt.step(**kwargs)
    opt.param_groups[0]["lr"] = float("nan")  # a bad value set later is caught at the next step
    with pytest.raises(ValueError, match="lr must be finite"):
        opt.step()
    assert p.tolist() == [[0, 0, 0], [0, 0, 0]]


def test_c_optimizer_is_shared():
    p = ft.zeros(3)
    opt = ft.optim.SGD([p], lr=0.1)
    c = opt._sync()
    assert isinstance(c, ft._C.Optimizer) and opt._sync() is c
    opt.param_groups[0]["lr"] = 0.2
    p.grad = ft.ones(3)
    opt.step()
    assert opt._c is c and c.num_steps == 1
    np.testing.assert_allclose(p.numpy(), -0.2)


# ---- lr schedulers ----

def lrs_of(scheduler, steps, optimizer):
    out = [scheduler.get_last_lr()[0]]
    for _ in range(steps):
        optimizer.step()
        scheduler.step()
        out.append(scheduler.get_last_lr()[0])
    return np.array(out)


def sgd(lr=0.1, **kw):
    return ft.optim.SGD([ft.zeros(2)], lr=lr, **kw)


SCHEDULES = {
    "step": (lambda o: ls.StepLR(o, step_size=3, gamma=0.5), lambda t: 0.1 * 0.5 ** (t // 3)),
    "multistep": (lambda o: ls.MultiStepLR(o, milestones=[2, 5, 5], gamma=0.1),
                  lambda t: 0.1 * 0.1 ** np.searchsorted([2, 5, 5], t, side="right")),
    "cosine": (lambda o: ls.CosineAnnealingLR(o, T_max=10, eta_min=0.01),
               lambda t: 0.01 + (0.1 - 0.01) * (1 + np.cos(np.pi * t / 10)) / 2),
    "linear": (lambda o: ls.LinearLR(o, start_factor=0.25, total_iters=4),
               lambda t: 0.1 * (0.25 + 0.75 * np.minimum(t, 4) / 4)),
    "lambda": (lambda o: ls.LambdaLR(o, lambda e: 0.95 ** e), lambda t: 0.1 * 0.95 ** t),
    "warmup+cosine": (lambda o: ls.SequentialLR(o, [ls.LinearLR(o, start_factor=0.1, total_iters=5),
                                                   ls.CosineAnnealingLR(o, T_max=15)], milestones=[5]),
                      lambda t: np.where(t < 5, 0.1 * (0.1 + 0.9 * t / 5),
                                         0.1 * (1 + np.cos(np.pi * (t - 5) / 15)) / 2)),
    "warmup+linear decay": (lambda o: ls.SequentialLR(o, [ls.LinearLR(o, start_factor=0.2, total_iters=4),
                                                         ls.LinearLR(o, start_factor=1.0, end_factor=0.01,
                                                                     total_iters=16)], milestones=[4]),
                            lambda t: np.where(t < 4, 0.1 * (0.2 + 0.8 * t / 4),
                                               0.1 * (1 + (0.01 - 1) * np.minimum(t - 4, 16) / 16))),
    "polynomial": (lambda o: ls.PolynomialLR(o, total_iters=10, power=2.0),
                   lambda t: 0.1 * (1 - np.minimum(t, 10) / 10) ** 2),
    "constant": (lambda o: ls.ConstantLR(o, factor=0.5, total_iters=4), lambda t: np.where(t < 4, 0.05, 0.1)),
    "multiplicative": (lambda o: ls.MultiplicativeLR(o, lambda e: 0.9), lambda t: 0.1 * 0.9 ** t),
    "chained": (lambda o: ls.ChainedScheduler([ls.ConstantLR(o, factor=0.1, total_iters=3),
                                               ls.ExponentialLR(o, gamma=0.9)]),
                lambda t: 0.1 * np.where(t < 3, 0.1, 1.0) * 0.9 ** t),
    "cyclic": (lambda o: ls.CyclicLR(o, 0.01, 0.1, step_size_up=4, step_size_down=2, mode="triangular2",
                                     cycle_momentum=False),
               lambda t: 0.01 + 0.09 * np.where(t % 6 <= 4, (t % 6) / 4, 1 - (t % 6 - 4) / 2) / 2.0 ** (t // 6)),
}


@pytest.mark.parametrize("name", SCHEDULES)
def test_scheduler_against_closed_form(name):
    make, formula = SCHEDULES[name]
    opt = sgd()
    got = lrs_of(make(opt), 25, opt)
    np.testing.assert_allclose(got, formula(np.arange(26)), rtol=1e-9, atol=1e-15)
    assert opt.param_groups[0]["lr"] == got[-1]


def onecycle_reference(total, max_lr, pct, div, final_div, anneal, three_phase, base_m, max_m):
    init, low = max_lr / div, max_lr / div / final_div
    if three_phase:
        phases = [(pct * total - 1, init, max_lr, max_m, base_m), (2 * pct * total - 2, max_lr, init, base_m, max_m),
                  (total - 1, init, low, max_m, max_m)]
    else:
        phases = [(pct * total - 1, init, max_lr, max_m, base_m), (total - 1, max_lr, low, base_m, max_m)]
    f = (lambda a, b, x: b + (a - b) / 2 * (np.cos(np.pi * x) + 1)) if anneal == "cos" else \
        (lambda a, b, x: (b - a) * x + a)
    lrs, moms = [], []
    for t in range(total):
        start = 0.0
        for i, (end, a, b, ma, mb) in enumerate(phases):
            if t <= end or i == len(phases) - 1:
                x = (t - start) / (end - start)
                lrs.append(f(a, b, x))
                moms.append(f(ma, mb, x))
                break
            start = end
    return np.array(lrs), np.array(moms)


@pytest.mark.parametrize("anneal, three_phase, cls", [("cos", False, "sgd"), ("linear", False, "adamw"),
                                                      ("cos", True, "sgd")])
def test_onecycle(anneal, three_phase, cls):
    opt = sgd(momentum=0.9) if cls == "sgd" else ft.optim.AdamW([ft.zeros(2)])
    sched = ls.OneCycleLR(opt, max_lr=0.5, total_steps=30, anneal_strategy=anneal, three_phase=three_phase)
    lrs, moms = [sched.get_last_lr()[0]], []
    for _ in range(29):
        moms.append(opt.param_groups[0]["momentum"] if cls == "sgd" else opt.param_groups[0]["betas"][0])
        opt.step()
        sched.step()
        lrs.append(sched.get_last_lr()[0])
    moms.append(opt.param_groups[0]["momentum"] if cls == "sgd" else opt.param_groups[0]["betas"][0])
    want_lr, want_m = onecycle_reference(30, 0.5, 0.3, 25.0, 1e4, anneal, three_phase, 0.85, 0.95)
    np.testing.assert_allclose(lrs, want_lr, rtol=1e-12)
    np.testing.assert_allclose(moms, want_m, rtol=1e-12)
    with pytest.raises(ValueError, match="Tried to step 31 times"):
        sched.step()
        sched.step()


def test_schedule_reaches_the_c_optimizer():
    p = ft.from_numpy(np.zeros(3, np.float32))
    opt = ft.optim.SGD([p], lr=1.0)
    sched = ls.StepLR(opt, step_size=2, gamma=0.5)
    total = 0.0
    for t in range(6):
        p.grad = ft.ones(3)
        total -= 0.5 ** (t // 2)
        opt.step()
        sched.step()
    np.testing.assert_allclose(p.numpy(), total, rtol=1e-6)


def test_scheduler_state_dict_and_per_group_lrs():
    opt = ft.optim.SGD([dict(params=[ft.zeros(2)], lr=0.1), dict(params=[ft.zeros(2)], lr=0.01)])
    sched = ls.CosineAnnealingLR(opt, T_max=8)
    for _ in range(3):
        opt.step()
        sched.step()
    np.testing.assert_allclose(sched.get_last_lr(), [0.1 * (1 + math.cos(math.pi * 3 / 8)) / 2,
                                                     0.01 * (1 + math.cos(math.pi * 3 / 8)) / 2], rtol=1e-12)
    sd = sched.state_dict()
    assert "optimizer" not in sd and sd["last_epoch"] == 3
    opt2 = ft.optim.SGD([dict(params=[ft.zeros(2)], lr=0.1), dict(params=[ft.zeros(2)], lr=0.01)])
    sched2 = ls.CosineAnnealingLR(opt2, T_max=8)
    sched2.load_state_dict(sd)
    opt2.load_state_dict(opt.state_dict())
    sched.step()
    sched2.step()
    assert sched.get_last_lr() == sched2.get_last_lr()
    seq = ls.SequentialLR(opt, [ls.LinearLR(opt, total_iters=2), ls.StepLR(opt, 2)], milestones=[2])
    sd = seq.state_dict()
    assert len(sd["_schedulers"]) == 2 and "optimizer" not in sd
    seq.load_state_dict(sd)


@pytest.mark.parametrize("make, error, match", [
    (lambda o: ls.LinearLR(o, start_factor=0), ValueError, "Starting multiplicative factor"),
    (lambda o: ls.LinearLR(o, end_factor=1.5), ValueError, "Ending multiplicative factor"),
    (lambda o: ls.StepLR(o, step_size=0), ValueError, "step_size"),
    (lambda o: ls.OneCycleLR(o, max_lr=1.0), ValueError, "total_steps OR"),
    (lambda o: ls.OneCycleLR(o, max_lr=1.0, total_steps=0), ValueError, "positive integer total_steps"),
    (lambda o: ls.OneCycleLR(o, max_lr=1.0, total_steps=10, pct_start=1), ValueError, "pct_start"),
    (lambda o: ls.OneCycleLR(o, max_lr=1.0, total_steps=10, anneal_strategy="exp"), ValueError, "anneal_strategy"),
    (lambda o: ls.OneCycleLR(o, max_lr=[1.0, 2.0], total_steps=10), ValueError, "one value per param group"),
    (lambda o: ls.SequentialLR(o, [ls.StepLR(o, 2)], milestones=[3]), ValueError, "number of milestone"),
    (lambda o: ls.SequentialLR(o, [], milestones=[]), ValueError, "at least one scheduler"),
    (lambda o: ls.SequentialLR(o, [ls.StepLR(sgd(), 2), ls.StepLR(o, 2)], milestones=[3]), ValueError,
     "same optimizer"),
    (lambda o: ls.LambdaLR(o, [lambda e: 1.0] * 2), ValueError, "Expected 1 lr_lambdas"),
    (lambda o: ls.StepLR(object(), 2), TypeError, "not an ft.optim optimizer"),
    (lambda o: ls.StepLR(o, 2, last_epoch=3), KeyError, "initial_lr"),
    (lambda o: ls.ConstantLR(o, factor=1.5), ValueError, "Constant multiplicative factor"),
    (lambda o: ls.CyclicLR(o, 0.01, 0.1, mode="sawtooth"), ValueError, "mode is invalid"),
    (lambda o: ls.ChainedScheduler([ls.StepLR(sgd(), 2), ls.StepLR(o, 2)]), ValueError, "same optimizer"),
])
def test_bad_scheduler_arguments(make, error, match):
    with pytest.raises(error, match=match):
        make(sgd())


@needs_torch
@pytest.mark.parametrize("name", ["step", "multistep", "cosine", "linear", "lambda", "warmup+cosine", "onecycle",
                                  "exponential", "restarts", "polynomial", "constant", "multiplicative", "chained",
                                  "cyclic", "cyclic2"])
def test_schedulers_against_torch(name):
    def build(mod, opt):
        return {
            "polynomial": lambda: mod.PolynomialLR(opt, total_iters=10, power=2.0),
            "constant": lambda: mod.ConstantLR(opt, factor=0.5, total_iters=4),
            "multiplicative": lambda: mod.MultiplicativeLR(opt, lambda e: 0.9),
            "chained": lambda: mod.ChainedScheduler([mod.ConstantLR(opt, factor=0.1, total_iters=3),
                                                     mod.ExponentialLR(opt, gamma=0.9)]),
            "cyclic": lambda: mod.CyclicLR(opt, 0.01, 0.1, step_size_up=4),  # the momentum cycles too
            "cyclic2": lambda: mod.CyclicLR(opt, 0.001, 0.01, step_size_up=3, step_size_down=5, mode="exp_range",
                                            gamma=0.95),
            "step": lambda: mod.StepLR(opt, step_size=3, gamma=0.5),
            "multistep": lambda: mod.MultiStepLR(opt, milestones=[2, 5, 5], gamma=0.1),
            "cosine": lambda: mod.CosineAnnealingLR(opt, T_max=10, eta_min=0.01),
            "linear": lambda: mod.LinearLR(opt, start_factor=0.25, total_iters=4),
            "lambda": lambda: mod.LambdaLR(opt, lambda e: 0.95 ** e),
            "warmup+cosine": lambda: mod.SequentialLR(opt, [mod.LinearLR(opt, start_factor=0.1, total_iters=5),
                                                            mod.CosineAnnealingLR(opt, T_max=15)], milestones=[5]),
            "onecycle": lambda: mod.OneCycleLR(opt, max_lr=0.5, total_steps=30),
            "exponential": lambda: mod.ExponentialLR(opt, gamma=0.9),
            "restarts": lambda: mod.CosineAnnealingWarmRestarts(opt, T_0=3, T_mult=2, eta_min=0.001),
        }[name]()

    topt = torch.optim.SGD([torch.zeros(2, requires_grad=True)], lr=0.1, momentum=0.9)
    opt = sgd(momentum=0.9)
    tsched, sched = build(torch.optim.lr_scheduler, topt), build(ls, opt)
    for _ in range(25):
        assert sched.get_last_lr() == pytest.approx(tsched.get_last_lr(), rel=1e-14)
        assert opt.param_groups[0]["momentum"] == pytest.approx(topt.param_groups[0]["momentum"], rel=1e-14)
        topt.step()
        opt.step()
        tsched.step()
        sched.step()


@needs_torch
@pytest.mark.parametrize("mode, threshold_mode", [("min", "rel"), ("max", "abs"), ("min", "abs"), ("max", "rel")])
def test_reduce_lr_on_plateau_against_torch(mode, threshold_mode):
    topt = torch.optim.SGD([torch.zeros(2, requires_grad=True)], lr=0.1)
    opt = sgd()
    kw = dict(mode=mode, factor=0.5, patience=2, threshold=0.05, threshold_mode=threshold_mode, cooldown=1,
              min_lr=0.01)
    tsched, sched = torch.optim.lr_scheduler.ReduceLROnPlateau(topt, **kw), ls.ReduceLROnPlateau(opt, **kw)
    metrics = [-1.0, -0.99, -0.98, -0.97, -0.96, -1.2, -1.19, 1.0, 0.99, 0.98, 0.97, 0.96, 0.95, 0.5, 0.5, 0.5]
    for m in metrics + [-x for x in metrics]:
        tsched.step(m)
        sched.step(ft.tensor(m))
        assert sched.get_last_lr() == pytest.approx(tsched.get_last_lr(), rel=1e-14)


def test_restarts_take_fractional_epochs_and_plateau_refuses_bad_arguments():
    opt = sgd()
    sched = ls.CosineAnnealingWarmRestarts(opt, T_0=4, eta_min=0.0)
    sched.step(2.0)  # half way to the first restart
    assert opt.param_groups[0]["lr"] == pytest.approx(0.05)
    sched.step(5.0)  # one epoch into the second period
    assert opt.param_groups[0]["lr"] == pytest.approx(0.05 * (1 + math.cos(math.pi / 4)))
    with pytest.raises(ValueError, match="Factor should be < 1.0"):
        ls.ReduceLROnPlateau(sgd(), factor=1.0)
    with pytest.raises(ValueError, match="positive integer T_0"):
        ls.CosineAnnealingWarmRestarts(sgd(), T_0=0)


@pytest.mark.parametrize("name", ["SGD", "Adam", "AdamW", "RMSprop", "Adadelta"])
def test_torchs_implementation_hints_are_taken_and_change_nothing(name):
    """nanoGPT's AdamW(groups, lr, betas, fused=True) and foreach= run as the default: every step is one fused
    pass already."""
    results = []
    for hints in ({}, {"fused": True}, {"foreach": False}):
        p = ft.nn.Parameter(ft.tensor([1.0, -2.0, 3.0]))
        opt = getattr(ft.optim, name)([p], lr=0.1, **hints)
        for _ in range(3):
            p.grad = ft.tensor([0.5, 0.25, -1.0])
            opt.step()
        results.append(p.numpy().tobytes())
    assert results[0] == results[1] == results[2] and results[0] != ft.tensor([1.0, -2.0, 3.0]).numpy().tobytes()
    p = ft.nn.Parameter(ft.zeros(2))
    with pytest.raises(RuntimeError, match="cannot be `True` together"):
        getattr(ft.optim, name)([p], lr=0.1, fused=True, foreach=True)
    with pytest.raises(TypeError, match="fused must be None or a bool"):
        getattr(ft.optim, name)([p], lr=0.1, fused="yes")
