"""cross_entropy (fused softmax, gradient in the same pass) and mse_loss: PyTorch's formulas written in NumPy
(weights, ignore_index and label smoothing in the 'mean' normaliser), gradients against the analytic formula,
central differences and the unfused log_softmax path, layouts, determinism and bad input."""
import numpy as np
import pytest

import fasttrain as ft
from _opref import bits, fd_grad, n, nhwc, strided, t, torch

F = ft.nn.functional
rng = np.random.default_rng(0)


def log_softmax(x, axis):
    m = x.max(axis=axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=axis, keepdims=True))


def ref_ce(x, target, weight=None, reduction="mean", ignore_index=-100, eps=0.0):
    """PyTorch's cross_entropy for class-index targets, from its definition (nll + smoothing term)."""
    axis = 0 if x.ndim == 1 else 1
    C = x.shape[axis]
    logp = np.moveaxis(log_softmax(x, axis), axis, -1)  # (..., C)
    w = np.ones(C) if weight is None else np.asarray(weight, np.float64)
    valid = target != ignore_index
    tc = np.where(valid, target, 0)
    wt = np.where(valid, w[tc], 0.0)
    nll = -wt * np.take_along_axis(logp, tc[..., None], -1)[..., 0]
    smooth = np.where(valid, -(logp * w).sum(-1), 0.0)
    loss = (1 - eps) * nll + eps / C * smooth
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / wt.sum()


def ref_ce_grad(x, target, weight=None, reduction="mean", ignore_index=-100, eps=0.0, dloss=1.0):
    """The analytic gradient: scale * ((1 - eps) w[t] (p - onehot) + eps / C (W p - w))."""
    axis = 0 if x.ndim == 1 else 1
    C = x.shape[axis]
    xm = np.moveaxis(x, axis, -1)
    p = np.exp(log_softmax(xm, -1))
    w = np.ones(C) if weight is None else np.asarray(weight, np.float64)
    valid = target != ignore_index
    tc = np.where(valid, target, 0)
    wt = np.where(valid, w[tc], 0.0)
    onehot = np.eye(C)[tc]
    g = (1 - eps) * wt[..., None] * (p - onehot) + eps / C * (w.sum() * p - w) * valid[..., None]
    scale = np.broadcast_to(np.asarray(dloss, np.float64), valid.shape)
    if reduction == "mean":
        scale = scale / wt.sum()
    return np.moveaxis(g * scale[..., None], -1, axis)


CE_CASES = [
    dict(),
    dict(reduction="sum"),
    dict(reduction="none"),
    dict(weight=True),
    dict(ignore_index=2),
    dict(eps=0.1),
    dict(weight=True, ignore_index=1, eps=0.2),
    dict(weight=True, ignore_index=0, eps=0.3, reduction="sum"),
    dict(weight=True, ignore_index=3, eps=0.15, reduction="none"),
]


def ce_args(case, C):
    w = rng.uniform(0.2, 2.0, C) if case.get("weight") else None
    return w, dict(reduction=case.get("reduction", "mean"), ignore_index=case.get("ignore_index", -100),
                   label_smoothing=case.get("eps", 0.0))


def refkw(kw):
    return dict(reduction=kw["reduction"], ignore_index=kw["ignore_index"], eps=kw["label_smoothing"])


@pytest.mark.parametrize("case", CE_CASES)
@pytest.mark.parametrize("shape", [(6, 5), (3, 5, 2, 3), (5,)])
def test_cross_entropy_forward_and_fused_gradient(case, shape):
    C = shape[0] if len(shape) == 1 else shape[1]
    x = rng.normal(0, 2, shape)
    tshape = () if len(shape) == 1 else shape[:1] + shape[2:]
    target = rng.integers(0, C, tshape)
    w, kw = ce_args(case, C)
    want = ref_ce(x, target, w, **refkw(kw))
    loss, dlogits = ft.ops.cross_entropy_forward(None, None, t(x), t(target, np.int64),
                                                 None if w is None else t(w), **kw)
    np.testing.assert_allclose(n(loss), want, rtol=2e-6, atol=1e-6)
    analytic = ref_ce_grad(x, target, w, **refkw(kw))
    dl = rng.normal(size=np.shape(want)) if kw["reduction"] == "none" else 1.0
    fd = fd_grad(lambda v: ref_ce(v, target, w, **refkw(kw)), x, dl)
    np.testing.assert_allclose(ref_ce_grad(x, target, w, dloss=dl, **refkw(kw)), fd, atol=1e-6)
    np.testing.assert_allclose(n(dlogits), analytic, rtol=1e-5, atol=1e-6)
    # the separate backward with a non-trivial dloss
    dlt = t(dl) if kw["reduction"] == "none" else ft.tensor(2.5)
    dlv = dl if kw["reduction"] == "none" else 2.5
    got = ft.ops.cross_entropy_backward(None, dlt, t(x), t(target, np.int64), None if w is None else t(w), **kw)
    np.testing.assert_allclose(n(got), ref_ce_grad(x, target, w, dloss=dlv, **refkw(kw)), rtol=1e-5, atol=1e-6)
    # the functional form gives the same loss
    assert bits(F.cross_entropy(t(x), t(target, np.int64), None if w is None else t(w), **kw)) == bits(loss)


def test_fused_gradient_equals_log_softmax_backward():
    x = rng.normal(size=(8, 10))
    target = rng.integers(0, 10, 8)
    w = rng.uniform(0.5, 1.5, 10)
    loss, dlogits = ft.ops.cross_entropy_forward(None, None, t(x), t(target, np.int64), t(w))
    # unfused: log_softmax, then NLL's gradient w.r.t. logp, then log_softmax's backward
    logp = ft.ops.log_softmax_forward(None, t(x), 1)
    dlogp = np.zeros((8, 10))
    dlogp[np.arange(8), target] = -w[target] / w[target].sum()
    unfused = ft.ops.log_softmax_backward(None, t(dlogp), logp, 1)
    np.testing.assert_allclose(n(dlogits), n(unfused), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(n(loss), -(n(logp)[np.arange(8), target] * w[target]).sum() / w[target].sum(),
                               rtol=1e-6)


def test_ignored_samples_and_empty_batches():
    x = t(rng.normal(size=(4, 3)))
    all_ignored = t([-100] * 4, np.int64)
    loss, g = ft.ops.cross_entropy_forward(None, None, x, all_ignored)
    assert np.isnan(n(loss)) and not n(g).any()
    loss, g = ft.ops.cross_entropy_forward(None, None, x, all_ignored, reduction="sum", label_smoothing=0.1)
    assert n(loss) == 0 and not n(g).any()
    empty = ft.zeros(0, 3)
    no_t = ft.zeros(0, dtype=ft.int64)
    assert np.isnan(n(F.cross_entropy(empty, no_t)))
    assert n(F.cross_entropy(empty, no_t, reduction="sum")) == 0
    assert F.cross_entropy(empty, no_t, reduction="none").shape == (0,)
    assert ft.ops.cross_entropy_backward(None, ft.tensor(1.0), empty, no_t).shape == (0, 3)


def test_int32_targets_accumulate_and_dlogits_over_logits():
    x = rng.normal(size=(5, 4))
    target = rng.integers(0, 4, 5)
    want_loss, want_g = ft.ops.cross_entropy_forward(None, None, t(x), t(target, np.int64), label_smoothing=0.1)
    loss, g = ft.ops.cross_entropy_forward(None, None, t(x), t(target, np.int32), label_smoothing=0.1)
    assert bits(loss) == bits(want_loss) and bits(g) == bits(want_g)
    g0 = rng.normal(size=x.shape).astype(np.float32)
    acc = t(g0)
    ft.ops.cross_entropy_backward(acc, ft.tensor(1.0), t(x), t(target, np.int64), label_smoothing=0.1,
                                  accumulate=True)
    np.testing.assert_allclose(n(acc), g0 + n(want_g), rtol=1e-6, atol=1e-7)
    xt = t(x)  # the gradient written over the logits themselves
    loss, g = ft.ops.cross_entropy_forward(None, xt, xt, t(target, np.int64), label_smoothing=0.1)
    assert g is xt and bits(loss) == bits(want_loss) and bits(g) == bits(want_g)


def test_layouts_agree():
    x = rng.normal(size=(3, 6, 4, 5))
    target = t(rng.integers(0, 6, (3, 4, 5)), np.int64)
    for kw in (dict(), dict(reduction="none", label_smoothing=0.1)):
        loss, g = ft.ops.cross_entropy_forward(None, None, t(x), target, **kw)
        loss2, g2 = ft.ops.cross_entropy_forward(None, None, nhwc(x), target, **kw)
        assert bits(loss2) == bits(loss) and g2.stride()[1] == 1 and bits(g2.contiguous()) == bits(g)
    x2 = rng.normal(size=(7, 9))
    tg = t(rng.integers(0, 9, 7), np.int64)
    a = ft.ops.cross_entropy_forward(None, None, t(x2), tg)
    b = ft.ops.cross_entropy_forward(None, None, strided(x2), tg)
    assert bits(a[0]) == bits(b[0]) and bits(a[1]) == bits(b[1].contiguous())
    xb = t(x2).bfloat16()
    lb, gb = ft.ops.cross_entropy_forward(None, None, xb, tg)
    assert lb.dtype is ft.bfloat16 and gb.dtype is ft.bfloat16
    np.testing.assert_allclose(n(lb), ref_ce(n(xb), n(tg).astype(int)), rtol=1e-2)


def test_cross_entropy_deterministic_across_thread_counts(threads):
    x = t(rng.normal(size=(1024, 1000)))
    tg = t(rng.integers(0, 1000, 1024), np.int64)
    x4 = t(rng.normal(size=(8, 21, 32, 32)))
    tg4 = t(rng.integers(0, 21, (8, 32, 32)), np.int64)
    res = []
    for nt in (1, 2):
        threads(nt)
        r = []
        for kw in (dict(), dict(label_smoothing=0.1, reduction="sum")):
            loss, g = ft.ops.cross_entropy_forward(None, None, x, tg, **kw)
            loss4, g4 = ft.ops.cross_entropy_forward(None, None, x4, tg4, **kw)
            r += [bits(loss), bits(g), bits(loss4), bits(g4)]
        res.append(r)
    assert res[0] == res[1]


def test_cross_entropy_bad_input():
    x = ft.zeros(4, 3)
    tg = t([0, 1, 2, 1], np.int64)
    with pytest.raises(IndexError, match=r"cross_entropy: target 3 \(sample 2\) is out of bounds for 3 classes"):
        F.cross_entropy(x, t([0, 1, 3, 1], np.int64))
    with pytest.raises(IndexError, match="target -1 .* out of bounds"):
        F.cross_entropy(x, t([0, -1, 2, 1], np.int64))
    with pytest.raises(IndexError, match="cross_entropy_backward: target 5"):
        ft.ops.cross_entropy_backward(None, ft.tensor(1.0), x, t([0, 5, 2, 1], np.int64))
    with pytest.raises(TypeError, match=r"cross_entropy: target must hold class indices as int64 or int32, or class "
                                        r"probabilities of the input's shape \(4, 3\); got float32 of shape \(4,\)"):
        F.cross_entropy(x, ft.zeros(4))
    with pytest.raises(ValueError, match=r"cross_entropy: target should have shape \(4,\), got \(5,\)"):
        F.cross_entropy(x, t([0] * 5, np.int64))
    with pytest.raises(ValueError, match=r"cross_entropy: weight should have shape \(3,\), got \(4,\)"):
        F.cross_entropy(x, tg, ft.ones(4))
    with pytest.raises(ValueError, match="label_smoothing must be between 0.0 and 1.0"):
        F.cross_entropy(x, tg, label_smoothing=1.5)
    with pytest.raises(ValueError, match="reduction must be 'none', 'mean' or 'sum'"):
        F.cross_entropy(x, tg, reduction="avg")
    with pytest.raises(ValueError, match="logits need at least one class"):
        F.cross_entropy(ft.zeros(4, 0), tg)
    with pytest.raises(TypeError, match=r"cross_entropy: logits must be float32 or bfloat16 \(or float16 on CUDA\), "
                                        r"got float64"):
        F.cross_entropy(ft.zeros(4, 3, dtype=ft.float64), tg)
    with pytest.raises(ValueError, match=r"cross_entropy_backward: dloss should have shape \(\), got \(4,\)"):
        ft.ops.cross_entropy_backward(None, ft.zeros(4), x, tg)
    with pytest.raises(ValueError, match=r"cross_entropy: dlogits should have shape \(4, 3\), got \(3, 4\)"):
        ft.ops.cross_entropy_forward(None, ft.zeros(3, 4), x, tg)


# ---- mse ----

@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_mse(reduction):
    x, y = rng.normal(size=(4, 5, 3)), rng.normal(size=(4, 5, 3))
    d2 = (x.astype(np.float32) - y.astype(np.float32)).astype(np.float64) ** 2
    want = {"mean": d2.mean(), "sum": d2.sum(), "none": d2}[reduction]
    loss = F.mse_loss(t(x), t(y), reduction=reduction)
    np.testing.assert_allclose(n(loss), want, rtol=2e-6)
    dl = rng.normal(size=x.shape) if reduction == "none" else 1.7
    analytic = 2 * (x - y) * dl / (x.size if reduction == "mean" else 1)
    ref = {"mean": lambda v: ((v - y) ** 2).mean(), "sum": lambda v: ((v - y) ** 2).sum(),
           "none": lambda v: (v - y) ** 2}[reduction]
    np.testing.assert_allclose(analytic, fd_grad(ref, x, dl), rtol=1e-5, atol=1e-6)
    dlt = t(dl) if reduction == "none" else ft.tensor(1.7)
    dx, dy = ft.ops.mse_loss_backward(None, None, dlt, t(x), t(y), reduction)
    np.testing.assert_allclose(n(dx), analytic, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(n(dy), -analytic, rtol=1e-5, atol=1e-7)
    g0 = rng.normal(size=x.shape).astype(np.float32)
    g = t(g0)
    dx, none = ft.ops.mse_loss_backward(g, False, dlt, t(x), t(y), reduction, accumulate_inp=True)
    assert dx is g and none is None
    np.testing.assert_allclose(n(g), g0 + analytic, rtol=1e-5, atol=1e-6)


def test_mse_layouts_determinism_and_edges(threads):
    x, y = rng.normal(size=(8, 16, 64, 64)), rng.normal(size=(8, 16, 64, 64))
    res = []
    for nt in (1, 2):
        threads(nt)
        res.append((bits(F.mse_loss(t(x), t(y))), bits(F.mse_loss(nhwc(x), nhwc(y), reduction="sum")),
                    bits(ft.ops.mse_loss_backward(None, None, ft.tensor(1.0), t(x), t(y))[0])))
    assert res[0] == res[1]
    np.testing.assert_allclose(n(F.mse_loss(nhwc(x), t(y))), ((x - y) ** 2).mean(), rtol=1e-5)
    assert np.isnan(n(F.mse_loss(ft.zeros(0), ft.zeros(0))))
    assert n(F.mse_loss(ft.zeros(0), ft.zeros(0), reduction="sum")) == 0
    with pytest.raises(ValueError, match=r"mse_loss: target should have the shape of input \(3,\), got \(4,\)"):
        F.mse_loss(ft.zeros(3), ft.zeros(4))
    with pytest.raises(ValueError, match=r"mse_loss: target should have shape \(3,\), got \(4,\)"):
        ft.ops.mse_loss_forward(None, ft.zeros(3), ft.zeros(4))
    with pytest.raises(TypeError, match=r"mse_loss: target must be float32 or bfloat16 \(or float16 on CUDA\), "
                                        r"got int64"):
        ft.ops.mse_loss_forward(None, ft.zeros(3), ft.zeros(3, dtype=ft.int64))
    with pytest.raises(ValueError, match=r"mse_loss_backward: dloss should have shape \(3,\), got \(\)"):
        ft.ops.mse_loss_backward(None, None, ft.tensor(1.0), ft.zeros(3), ft.zeros(3), "none")


@pytest.mark.skipif(torch is None, reason="torch is not installed")
def test_against_torch():
    import torch.nn.functional as TF
    for shape in [(6, 5), (3, 5, 2, 3)]:
        C = shape[1]
        for case in CE_CASES:
            x = rng.normal(0, 2, shape).astype(np.float32)
            target = rng.integers(0, C, shape[:1] + shape[2:])
            w, kw = ce_args(case, C)
            xt = torch.tensor(x, requires_grad=True)
            want = TF.cross_entropy(xt, torch.tensor(target), None if w is None else torch.tensor(w, dtype=torch.float32),
                                    **kw)
            dl = rng.normal(size=want.shape).astype(np.float32)
            want.backward(torch.tensor(dl))
            loss, _ = ft.ops.cross_entropy_forward(None, False, t(x), t(target, np.int64),
                                                   None if w is None else t(w), **kw)
            np.testing.assert_allclose(n(loss), want.detach().numpy(), rtol=1e-5, atol=1e-6)
            got = ft.ops.cross_entropy_backward(None, t(dl), t(x), t(target, np.int64), None if w is None else t(w),
                                                **kw)
            np.testing.assert_allclose(n(got), xt.grad.numpy(), rtol=1e-5, atol=1e-6)
    # all targets ignored: NaN mean like torch
    x = np.zeros((2, 3), np.float32)
    tg = np.array([-100, -100])
    assert np.isnan(TF.cross_entropy(torch.tensor(x), torch.tensor(tg)).item())
    assert np.isnan(n(F.cross_entropy(t(x), t(tg, np.int64))))
    for reduction in ("mean", "sum", "none"):
        a, b = rng.normal(size=(3, 4)).astype(np.float32), rng.normal(size=(3, 4)).astype(np.float32)
        np.testing.assert_allclose(n(F.mse_loss(t(a), t(b), reduction=reduction)),
                                   TF.mse_loss(torch.tensor(a), torch.tensor(b), reduction=reduction).numpy(),
                                   rtol=1e-6)
