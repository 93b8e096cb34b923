"""The optimizers (each of ft.optim's; param groups, clipping, grad scaling, skipped params) and the weight
EMA on CUDA parameters against the same optimizers on CPU copies after several steps, the optimizer state
living on the device, non-finite gradients, bitwise repeatability, state_dict interchange with a CPU
optimizer, and mixed devices refused.

The API is PyTorch's: parameters and their .grad are CUDA tensors, opt.step() updates them on the device."""
import numpy as np
import pytest

import fasttrain as ft
from _cudaref import assert_close, host, mixed_devices, rng

pytestmark = pytest.mark.cuda

SHAPES = [(3, 4), (5,), (), (2, 3, 2), (40000,), (300, 257)]  # (40000,) and (300, 257) span many blocks
STEPS = 5
CTOR = {ft.optim.SGD: dict(lr=0.05), ft.optim.AdamW: dict(lr=1e-2), ft.optim.LAMB: dict(lr=1e-2),
        ft.optim.LARS: dict(lr=0.5), ft.optim.Adam: dict(lr=1e-2), ft.optim.RMSprop: dict(lr=1e-2),
        ft.optim.Adadelta: dict(lr=1.0), ft.optim.Adagrad: dict(lr=0.1), ft.optim.Adamax: dict(lr=1e-2),
        ft.optim.NAdam: dict(lr=1e-2), ft.optim.RAdam: dict(lr=1e-2)}
ALL = list(range(len(SHAPES)))
# (class, [(param indices, group overrides)])
CASES = [
    (ft.optim.SGD, [(ALL, {})]),
    (ft.optim.SGD, [(ALL, dict(momentum=0.9, weight_decay=1e-2))]),
    (ft.optim.SGD, [([0, 1, 5], dict(momentum=0.9, dampening=0.3)),
                    ([2, 3, 4], dict(momentum=0.8, nesterov=True, weight_decay=5e-4, lr=0.1, maximize=True))]),
    (ft.optim.AdamW, [(ALL, {})]),
    (ft.optim.AdamW, [([0, 4], dict(amsgrad=True, weight_decay=0.1)),
                      ([1, 2, 3, 5], dict(betas=(0.8, 0.99), eps=1e-6, weight_decay=0.0, maximize=True, lr=3e-3))]),
    (ft.optim.Adam, [([0, 4], dict(amsgrad=True, weight_decay=0.1)), ([1, 2, 3, 5], dict(weight_decay=1e-2))]),
    (ft.optim.LAMB, [(ALL, {})]),
    (ft.optim.LAMB, [([0, 3, 4], dict(weight_decay=0.1)), ([1, 2, 5], dict(lars_exclude=True, weight_decay=0.0))]),
    (ft.optim.LARS, [(ALL, {})]),
    (ft.optim.LARS, [([0, 3, 4, 5], dict(weight_decay=5e-4, trust_coefficient=0.02)),
                     ([1, 2], dict(lars_exclude=True, lr=0.05, momentum=0.5, maximize=True))]),
    (ft.optim.RMSprop, [([0, 4], dict(momentum=0.9, weight_decay=0.1)),
                        ([1, 2, 3, 5], dict(alpha=0.9, centered=True, eps=1e-4, maximize=True, momentum=0.5))]),
    (ft.optim.Adadelta, [([0, 4], dict(rho=0.5, weight_decay=0.1)), ([1, 2, 3, 5], dict(eps=1e-4, maximize=True))]),
    (ft.optim.Adagrad, [([0, 4], dict(lr_decay=0.1, weight_decay=0.1)),
                        ([1, 2, 3, 5], dict(initial_accumulator_value=0.5, maximize=True))]),
    (ft.optim.Adamax, [([0, 4], dict(weight_decay=0.1)), ([1, 2, 3, 5], dict(betas=(0.8, 0.9), maximize=True))]),
    (ft.optim.NAdam, [([0, 4], dict(weight_decay=0.1)), ([1, 2, 3, 5], dict(weight_decay=0.1,
                                                                           decoupled_weight_decay=True))]),
    (ft.optim.RAdam, [([0, 4], dict(weight_decay=0.1, betas=(0.9, 0.8))),
                      ([1, 2, 3, 5], dict(decoupled_weight_decay=True, weight_decay=0.1, maximize=True))]),
]


def f32(a):
    return np.array(a, dtype=np.float32)


def make_params(shapes=SHAPES, seed=0):
    r = rng(seed)
    return [f32(r.standard_normal(s)) for s in shapes]


def make_grads(shapes=SHAPES, steps=STEPS, seed=1, scale=1.0):
    r = rng(seed)
    return [[f32(scale * r.standard_normal(s)) for s in shapes] for _ in range(steps)]


def tensor_on(a, device):
    t = ft.from_numpy(f32(a))
    return t.to(device) if device != "cpu" else t


def run(cls, groups, params, grads, device, **step_kwargs):
    """The optimizer, its params and the grad norm of each step, on `device`."""
    tensors = [tensor_on(p, device) for p in params]
    opt = cls([dict(params=[tensors[i] for i in idx], **over) for idx, over in groups], **CTOR[cls])
    norms = []
    for step_grads in grads:
        for t, g in zip(tensors, step_grads):
            t.grad = None if g is None else tensor_on(g, device)
        opt.step(**step_kwargs)
        norms.append(opt.grad_norm)
    return opt, tensors, norms


def assert_params_close(got, want, rtol=1e-5):
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.is_cuda and g.shape == w.shape, (i, g.device, g.shape, w.shape)
        assert_close(g, w, rtol, 1e-6)


@pytest.mark.parametrize("clip", [None, 1.5])
@pytest.mark.parametrize("cls, groups", CASES, ids=lambda c: getattr(c, "__name__", None))
def test_optimizer_on_cuda_matches_cpu(cls, groups, clip):
    params, grads = make_params(), make_grads()
    _, want, want_norms = run(cls, groups, params, grads, "cpu", max_grad_norm=clip)
    _, got, got_norms = run(cls, groups, params, grads, "cuda", max_grad_norm=clip)
    assert_params_close(got, want)
    np.testing.assert_allclose(got_norms, want_norms, rtol=1e-5)


@pytest.mark.parametrize("cls", list(CTOR))
def test_grad_scale_and_skipped_params(cls):
    groups = [(ALL, dict(weight_decay=1e-3) if cls is not ft.optim.SGD else dict(momentum=0.9))]
    params, grads = make_params(), make_grads(scale=8.0)
    for s, step_grads in enumerate(grads):  # param 1 has no grad at first, param 3 only at step 2
        if s < 2:
            step_grads[1] = None
        if s != 2:
            step_grads[3] = None
    _, want, _ = run(cls, groups, params, grads, "cpu", grad_scale=0.125)
    opt, got, _ = run(cls, groups, params, grads, "cuda", grad_scale=0.125)
    assert_params_close(got, want)
    if cls is not ft.optim.SGD:
        state = opt.state_dict()["state"]
        assert [int(state[i]["step"]) for i in range(len(SHAPES))] == [5, 3, 5, 1, 5, 5]


def test_optimizer_state_lives_on_the_device():
    p = ft.zeros(1 << 20, device="cuda")
    opt = ft.optim.AdamW([p])
    p.grad = ft.ones(1 << 20, device="cuda")
    ft.cuda.synchronize()
    before, cpu_before = ft.memory_stats("cuda:0")["allocated_bytes"], ft.memory_stats("cpu")["allocated_bytes"]
    opt.step()
    ft.cuda.synchronize()
    assert ft.memory_stats("cuda:0")["allocated_bytes"] - before >= 2 * (4 << 20)  # exp_avg, exp_avg_sq
    assert ft.memory_stats("cpu")["allocated_bytes"] - cpu_before < 4 << 20  # not on the host
    del opt
    assert ft.memory_stats("cuda:0")["allocated_bytes"] == before


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nonfinite_grads_change_nothing(bad):
    params = make_params()
    _, tensors, _ = run(ft.optim.AdamW, [(ALL, {})], params, make_grads(steps=1), "cuda")
    opt = ft.optim.AdamW(tensors, lr=1e-2)
    grads = make_grads(steps=1, seed=2)[0]
    grads[4][123] = bad
    for t, g in zip(tensors, grads):
        t.grad = tensor_on(g, "cuda")
    before = [host(t) for t in tensors]
    for kwargs in ({}, dict(max_grad_norm=1.0)):
        with pytest.raises(ValueError, match="gradient norm is"):
            opt.step(**kwargs)
    for t, b in zip(tensors, before):
        assert host(t).tobytes() == b.tobytes()
    opt.step(check_finite=False)  # as torch.optim: the value goes through
    assert not np.isfinite(host(tensors[4])[123])


@pytest.mark.parametrize("cls", list(CTOR))
def test_bitwise_repeatable(cls):
    params, grads = make_params(), make_grads()
    groups = [(ALL, dict(weight_decay=1e-3))]
    runs = [run(cls, groups, params, grads, "cuda", max_grad_norm=50.0) for _ in range(2)]
    assert [host(t).tobytes() for t in runs[0][1]] == [host(t).tobytes() for t in runs[1][1]]
    assert runs[0][2] == runs[1][2]


@pytest.mark.parametrize("cls", list(CTOR))
def test_state_dict_moves_between_devices(cls):
    """A CUDA optimizer's state_dict (NumPy values, as on the CPU) resumes a CPU optimizer, and back."""
    params, grads = make_params(), make_grads(steps=6)
    groups = [(ALL, dict(momentum=0.9) if cls is ft.optim.SGD else {})]
    opt_g, tg, _ = run(cls, groups, params, grads[:3], "cuda")
    opt_c, tc, _ = run(cls, groups, params, grads[:3], "cpu")
    sd_g, sd_c = opt_g.state_dict(), opt_c.state_dict()
    assert sd_g["param_groups"] == sd_c["param_groups"]
    for i, entry in sd_c["state"].items():
        for key, value in entry.items():
            assert isinstance(sd_g["state"][i][key], np.ndarray)
            np.testing.assert_allclose(sd_g["state"][i][key], value, rtol=1e-5, atol=1e-6)
    # resume on the other device
    on_cpu = [ft.from_numpy(host(t)) for t in tg]
    on_gpu = [ft.from_numpy(host(t)).to("cuda") for t in tc]
    opt_c2 = cls([dict(params=on_cpu)], **CTOR[cls])
    opt_c2.load_state_dict(sd_g)
    opt_g2 = cls([dict(params=on_gpu)], **CTOR[cls])
    opt_g2.load_state_dict(sd_c)
    for step_grads in grads[3:]:
        for a, b, g in zip(on_cpu, on_gpu, step_grads):
            a.grad, b.grad = tensor_on(g, "cpu"), tensor_on(g, "cuda")
        opt_c2.step()
        opt_g2.step()
    assert_params_close(on_gpu, on_cpu)


def test_ema_on_cuda_matches_cpu():
    params = make_params()
    cpu, gpu = [tensor_on(p, "cpu") for p in params], [tensor_on(p, "cuda") for p in params]
    ema_c, ema_g = ft.optim.EMA(cpu, decay=0.9), ft.optim.EMA(gpu, decay=0.9)
    assert all(s.is_cuda for s in ema_g.shadow)
    r = rng(5)
    for step in range(4):
        for c, g in zip(cpu, gpu):
            delta = ft.from_numpy(f32(r.standard_normal(c.shape)))
            c.copy_(ft.ops.add_forward(None, c, delta))
            g.copy_(ft.ops.add_forward(None, g, delta.to("cuda")))
        decay = None if step < 3 else 0.5
        ema_c.update(decay)
        ema_g.update(decay)
    for s_g, s_c in zip(ema_g.shadow, ema_c.shadow):
        assert_close(s_g, s_c, 1e-6, 1e-7)
    sd = ema_g.state_dict()
    assert all(isinstance(a, np.ndarray) for a in sd["shadow"])
    restored = ft.optim.EMA(cpu, decay=0.1)
    restored.load_state_dict(sd)
    for s_r, s_g in zip(restored.shadow, ema_g.shadow):
        np.testing.assert_array_equal(host(s_r), host(s_g))
    ema_g.copy_to()
    for g, s in zip(gpu, ema_g.shadow):
        np.testing.assert_array_equal(host(g), host(s))


def test_mixed_devices_are_refused():
    def grad_on_cpu():
        p = ft.zeros(4, device="cuda")
        opt = ft.optim.SGD([p], lr=0.1)
        p.grad = ft.ones(4)
        opt.step()

    def params_on_both():
        a, b = ft.zeros(4), ft.zeros(4, device="cuda")
        opt = ft.optim.AdamW([a, b])
        a.grad, b.grad = ft.ones(4), ft.ones(4, device="cuda")
        opt.step()

    mixed_devices(grad_on_cpu)
    mixed_devices(params_on_both)
