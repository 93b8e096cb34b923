"""Every op of the CUDA backend against the CPU implementation, through the same Python calls (ft.ops.* and
ft.nn.functional): forward and backward on seeded random inputs, NCHW, channels-last, strided and transposed
layouts, bfloat16 where the CPU takes it, accumulation and in-place use, special values, and bad input
(mixed devices, out-of-range targets and indices). Tolerances (docs/cuda.md): pointwise ops, dropout,
concatenation and pooling indices bitwise or within 2 ulp; reductions 1e-5 relative; convolution and matmul
(TF32 off) 1e-4 of the output's scale. The GPU build's make test-gpu runs this file under compute-sanitizer."""
import numpy as np
import pytest

import fasttrain as ft
from _cudaref import LAYOUTS, assert_close, assert_same, assert_ulp, host, mixed_devices, pair, rng, same_error
from _cudaref import full_fp32  # noqa: F401 (an autouse fixture)
from _poolcases import AVG_CASES, MAX_CASES, avg_args, max_args

pytestmark = pytest.mark.cuda
F = ft.nn.functional
ops = ft.ops


# ================================================================ activations

ACTS = ["relu", "leaky_relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh"]
EXACT_ACTS = {"relu", "leaky_relu", None, "identity"}
FROM_OUTPUT = {"relu", "leaky_relu", "sigmoid", "tanh"}
ALPHA = 0.07
SPECIALS = [0.0, -0.0, np.nan, np.inf, -np.inf, 1e-30, -1e-30, 88.0, -88.0, 100.0, -100.0, 20.0, -20.0, 9.0, -9.0,
            0.625, -0.625, 1e-6, -1e-6]


def act_input(shape, seed, specials=True):
    x = rng(seed).normal(0, 3, shape)
    if specials and x.size >= len(SPECIALS):
        x.reshape(-1)[:len(SPECIALS)] = SPECIALS
    return x


def fwd_scale(act, x):
    """The magnitude of the terms of act(x): gelu_tanh's 1 + tanh cancels for negative x."""
    return np.abs(np.asarray(x, np.float32)) if act == "gelu_tanh" else 0.0


def bwd_scale(act, x, dy):
    """The magnitude of the terms of dy * act'(x): the derivatives of gelu and silu cross zero."""
    x, dy = np.abs(np.asarray(x, np.float32)), np.abs(np.asarray(dy, np.float32))
    with np.errstate(invalid="ignore", over="ignore"):
        return dy * (1 + x) if act in ("gelu", "gelu_tanh", "silu") else dy


def check_act(gpu, cpu, act, scale):
    if act in EXACT_ACTS:
        assert_same(gpu, cpu)
    else:
        assert_ulp(gpu, cpu, 2, scale)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("act", ACTS)
def test_activation_forward_backward(act, layout):
    x = act_input((2, 3, 5, 7), 1)
    dy = rng(2).normal(size=x.shape)
    xc, xg = pair(x, layout)
    dyc, dyg = pair(dy, layout)
    yc, yg = ops.activation_forward(None, xc, act, ALPHA), ops.activation_forward(None, xg, act, ALPHA)
    check_act(yg, yc, act, fwd_scale(act, x))
    dc = ops.activation_backward(None, dyc, xc, None, act, ALPHA)
    dg = ops.activation_backward(None, dyg, xg, None, act, ALPHA)
    check_act(dg, dc, act, bwd_scale(act, x, dy))
    if act in FROM_OUTPUT:  # the derivative from the output alone (what an in-place forward leaves)
        dc = ops.activation_backward(None, dyc, None, yc, act, ALPHA)
        dg = ops.activation_backward(None, dyg, None, yg, act, ALPHA)
        check_act(dg, dc, act, bwd_scale(act, x, dy))


@pytest.mark.parametrize("act", ACTS)
def test_activation_large_and_strided(act):
    """Sizes that are no multiple of a block or a vector width, and a view with a stride of 3."""
    x = act_input((1_000_003,), 3)
    xc, xg = pair(x)
    check_act(ops.activation_forward(None, xg, act, ALPHA), ops.activation_forward(None, xc, act, ALPHA), act,
              fwd_scale(act, x))
    wide = act_input((301, 3 * 257), 4)
    wc, wg = pair(wide)
    vc, vg = wc[:, 1::3], wg[:, 1::3]
    dy = rng(5).normal(size=vc.shape)
    dyc, dyg = pair(dy)
    check_act(ops.activation_backward(None, dyg, vg, None, act, ALPHA),
              ops.activation_backward(None, dyc, vc, None, act, ALPHA), act, bwd_scale(act, host(vc), dy))


@pytest.mark.parametrize("act", ACTS)
def test_activation_accumulate_and_in_place(act):
    x = act_input((4, 33), 6)
    dy, g0 = rng(7).normal(size=x.shape), rng(8).normal(size=x.shape)
    xc, xg = pair(x)
    dyc, dyg = pair(dy)
    gc, gg = pair(g0)
    assert ops.activation_backward(gg, dyg, xg, None, act, ALPHA, accumulate=True) is gg
    ops.activation_backward(gc, dyc, xc, None, act, ALPHA, accumulate=True)
    assert_ulp(gg, gc, 2, np.abs(g0) + bwd_scale(act, x, dy))
    # in place: the output over the input, the gradient over dout
    ic, ig = pair(x)
    assert ops.activation_forward(ig, ig, act, ALPHA) is ig
    ops.activation_forward(ic, ic, act, ALPHA)
    check_act(ig, ic, act, fwd_scale(act, x))
    dc, dg = pair(dy)
    assert ops.activation_backward(dg, dg, xg, None, act, ALPHA) is dg
    ops.activation_backward(dc, dc, xc, None, act, ALPHA)
    check_act(dg, dc, act, bwd_scale(act, x, dy))


@pytest.mark.parametrize("act", ACTS)
def test_activation_bfloat16(act):
    x = act_input((3, 7, 11), 9, specials=False)
    dy = rng(10).normal(size=x.shape)
    xc, xg = pair(x, dtype=ft.bfloat16)
    dyc, dyg = pair(dy, dtype=ft.bfloat16)
    yc, yg = ops.activation_forward(None, xc, act, ALPHA), ops.activation_forward(None, xg, act, ALPHA)
    assert yg.dtype is ft.bfloat16
    assert_ulp(yg, yc, 1, fwd_scale(act, host(xc)))
    assert_ulp(ops.activation_backward(None, dyg, xg, None, act, ALPHA),
               ops.activation_backward(None, dyc, xc, None, act, ALPHA), 1, bwd_scale(act, host(xc), host(dyc)))
    # a float32 output of a bfloat16 input
    oc, og = ft.empty(*x.shape), ft.empty(*x.shape, device="cuda")
    ops.activation_forward(og, xg, act, ALPHA)
    ops.activation_forward(oc, xc, act, ALPHA)
    check_act(og, oc, act, fwd_scale(act, host(xc)))


def test_activation_empty():
    for shape in [(0,), (0, 3), (2, 0, 4)]:
        z = ft.zeros(*shape, device="cuda")
        y = F.relu(z)
        assert y.is_cuda and y.shape == shape
        assert ops.activation_backward(None, z, z, None, "gelu").shape == shape


# ================================================================ add, mul, concat

ADD_ACTS = [None, "relu", "leaky_relu", "gelu", "silu", "tanh", "sigmoid"]
PAIR_LAYOUTS = [("contiguous", "contiguous"), ("nhwc", "nhwc"), ("strided", "strided"), ("transposed", "transposed"),
                ("nhwc", "contiguous")]


@pytest.mark.parametrize("layouts", PAIR_LAYOUTS, ids=lambda p: "-".join(p))
@pytest.mark.parametrize("act", ADD_ACTS)
def test_add_forward_backward(act, layouts):
    a, b = rng(11).normal(size=(2, 5, 3, 7)), rng(12).normal(size=(2, 5, 3, 7))
    dy = rng(13).normal(size=a.shape)
    (ac, ag), (bc, bg) = pair(a, layouts[0]), pair(b, layouts[1])
    dyc, dyg = pair(dy, layouts[0])
    s = np.float32(a) + np.float32(b)
    yc, yg = ops.add_forward(None, ac, bc, act, 0.2), ops.add_forward(None, ag, bg, act, 0.2)
    check_act(yg, yc, act, fwd_scale(act, s))
    dac, dbc = ops.add_backward(None, None, dyc, ac, bc, None, act, 0.2)
    dag, dbg = ops.add_backward(None, None, dyg, ag, bg, None, act, 0.2)
    check_act(dag, dac, act, bwd_scale(act, s, dy))
    check_act(dbg, dbc, act, bwd_scale(act, s, dy))
    if act in FROM_OUTPUT:
        dac, _ = ops.add_backward(None, False, dyc, out=yc, act=act, alpha=0.2)
        dag, _ = ops.add_backward(None, False, dyg, out=yg, act=act, alpha=0.2)
        check_act(dag, dac, act, bwd_scale(act, s, dy))


def test_add_accumulate_skip_and_in_place():
    dy, g = rng(14).normal(size=(3, 70)), rng(15).normal(size=(3, 70))
    dyc, dyg = pair(dy)
    gc, gg = pair(g)
    da, db = ops.add_backward(gg, False, dyg, accumulate_a=True)
    assert da is gg and db is None
    ops.add_backward(gc, False, dyc, accumulate_a=True)
    assert_same(gg, gc)
    # the residual's gradient flows through: da may be dout itself
    dc, dg = pair(dy)
    da, db = ops.add_backward(dg, None, dg)
    assert da is dg
    assert_same(db, ops.add_backward(dc, None, dc)[1])
    assert_same(dg, dc)
    # a fused ReLU, both gradients accumulated
    a, b = rng(16).normal(size=dy.shape), rng(17).normal(size=dy.shape)
    (ac, ag), (bc, bg) = pair(a), pair(b)
    g1c, g1g = pair(g)
    g2c, g2g = pair(-g)
    ops.add_backward(g1c, g2c, dyc, ac, bc, None, "relu", accumulate_a=True, accumulate_b=True)
    ops.add_backward(g1g, g2g, dyg, ag, bg, None, "relu", accumulate_a=True, accumulate_b=True)
    assert_same(g1g, g1c)
    assert_same(g2g, g2c)


@pytest.mark.parametrize("layout", ["contiguous", "nhwc", "strided"])
def test_mul_forward_backward(layout):
    a, b, dy = (rng(s).normal(size=(2, 4, 5, 6)) for s in (18, 19, 20))
    (ac, ag), (bc, bg), (dyc, dyg) = pair(a, layout), pair(b, layout), pair(dy, layout)
    assert_same(ops.mul_forward(None, ag, bg), ops.mul_forward(None, ac, bc))
    dac, dbc = ops.mul_backward(None, None, dyc, ac, bc)
    dag, dbg = ops.mul_backward(None, None, dyg, ag, bg)
    assert_same(dag, dac)
    assert_same(dbg, dbc)
    g = rng(21).normal(size=a.shape)
    gc, gg = pair(g, layout)
    assert ops.mul_backward(False, gg, dyg, ag, None, accumulate_b=True) == (None, gg)
    ops.mul_backward(False, gc, dyc, ac, None, accumulate_b=True)
    assert_ulp(gg, gc, 1, np.abs(g) + np.abs(dy * a))
    # in place over the saved inputs: da over a, db over b
    (ac, ag), (bc, bg) = pair(a, layout), pair(b, layout)
    ops.mul_backward(ag, bg, dyg, ag, bg)
    ops.mul_backward(ac, bc, dyc, ac, bc)
    assert_same(ag, ac)
    assert_same(bg, bc)


def test_add_mul_bfloat16_and_large():
    a, b = rng(22).normal(size=(5, 9)), rng(23).normal(size=(5, 9))
    (ac, ag), (bc, bg) = pair(a, dtype=ft.bfloat16), pair(b, dtype=ft.bfloat16)
    assert_same(F.add(ag, bg, "relu"), F.add(ac, bc, "relu"))
    assert_same(F.mul(ag, bg), F.mul(ac, bc))
    big_a, big_b = rng(24).normal(size=(3_000_017,)), rng(25).normal(size=(3_000_017,))
    (ac, ag), (bc, bg) = pair(big_a), pair(big_b)
    assert_same(F.add(ag, bg), F.add(ac, bc))
    assert_same(F.mul(ag, bg), F.mul(ac, bc))


CAT_PERM = {1: (0, 1, 2, 3), -3: (0, 1, 2, 3), 0: (1, 0, 2, 3), 3: (0, 2, 3, 1), -1: (0, 2, 3, 1)}


@pytest.mark.parametrize("layout", ["contiguous", "nhwc", "strided"])
@pytest.mark.parametrize("dim", [1, -3, 0, 3, -1])
def test_concat_forward_backward(dim, layout):
    parts = [rng(30 + c).normal(size=(2, c, 3, 4)).transpose(*CAT_PERM[dim]) for c in (1, 3, 2)]
    pairs = [pair(p, layout) for p in parts]
    yc = F.cat([p[0] for p in pairs], dim)
    yg = F.cat([p[1] for p in pairs], dim)
    assert_same(yg, yc)
    sizes = [p.shape[dim] for p in parts]
    dy = rng(35).normal(size=yc.shape)
    dyc, dyg = pair(dy, layout)
    gcs, ggs = ops.concat_backward(None, dyc, sizes, dim), ops.concat_backward(None, dyg, sizes, dim)
    for gg, gc in zip(ggs, gcs):
        assert_same(gg, gc)


def test_concat_modes():
    parts = [rng(36).normal(size=(2, c, 3, 3)) for c in (4, 2)]
    want = np.concatenate(parts, axis=1)
    (p0c, p0g), (p1c, p1g) = pair(parts[0], "nhwc"), pair(parts[1], "contiguous")
    outc, outg = pair(np.zeros_like(want), "nhwc")
    ops.concat_forward(outc, [p0c, p1c], 1)
    ops.concat_forward(outg, [p0g, p1g], 1)
    assert_same(outg, outc)
    # an input that already is its slice of out is not copied (DenseNet-style buffers)
    bufc, bufg = pair(np.zeros_like(want))
    bufc[:, 0:4].copy_(p0c)
    bufg[:, 0:4].copy_(p0g)
    ops.concat_forward(bufc, [bufc[:, 0:4], p1c], 1)
    ops.concat_forward(bufg, [bufg[:, 0:4], p1g], 1)
    assert_same(bufg, bufc)
    # backward: skip a part, accumulate into another
    dy, g1 = rng(37).normal(size=want.shape), rng(38).normal(size=(2, 2, 3, 3))
    dyc, dyg = pair(dy, "nhwc")
    g1c, g1g = pair(g1)
    got = ops.concat_backward([False, g1g], dyg, [4, 2], 1, accumulate=True)
    assert got[0] is None and got[1] is g1g
    ops.concat_backward([False, g1c], dyc, [4, 2], 1, accumulate=True)
    assert_same(g1g, g1c)
    # bfloat16
    (bc0, bg0), (bc1, bg1) = pair(parts[0], dtype=ft.bfloat16), pair(parts[1], dtype=ft.bfloat16)
    assert_same(F.cat([bg0, bg1], 1), F.cat([bc0, bc1], 1))


# ================================================================ dropout

DROP_CASES = [((7, 13), 0.5, 1, 0), ((3, 5, 4, 2), 0.1, 2 ** 40 + 3, 17), ((1001,), 0.9, 12345, 2 ** 33 + 5),
              ((2, 6, 5, 3), 0.4, 9, 3), ((4, 9), 0.0, 1, 0), ((4, 9), 1.0, 3, 4), ((512, 1000), 0.3, 99, 7)]


@pytest.mark.parametrize("shape,p,seed,offset", DROP_CASES)
def test_dropout_masks_are_the_cpus(shape, p, seed, offset):
    """The mask is Philox of (seed, offset + index / 4): the same bits on both devices."""
    x, dy = rng(40).normal(size=shape), rng(41).normal(size=shape)
    (xc, xg), (dyc, dyg) = pair(x), pair(dy)
    assert_same(ops.dropout_forward(None, xg, p, seed, offset), ops.dropout_forward(None, xc, p, seed, offset))
    assert_same(ops.dropout_backward(None, dyg, p, seed, offset), ops.dropout_backward(None, dyc, p, seed, offset))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_dropout_layouts_accumulate_in_place_bfloat16(layout):
    x, g = rng(42).normal(size=(2, 6, 5, 3)), rng(43).normal(size=(2, 6, 5, 3))
    xc, xg = pair(x, layout)
    want = ops.dropout_forward(None, xc, 0.4, 9, 3)
    assert_same(ops.dropout_forward(None, xg, 0.4, 9, 3), want)
    gc, gg = pair(g, layout)
    ops.dropout_backward(gc, xc, 0.4, 9, 3, accumulate=True)
    ops.dropout_backward(gg, xg, 0.4, 9, 3, accumulate=True)
    assert_ulp(gg, gc, 1, np.abs(g) + 2 * np.abs(x))
    ic, ig = pair(x, layout)
    assert ops.dropout_forward(ig, ig, 0.4, 9, 3) is ig
    ops.dropout_forward(ic, ic, 0.4, 9, 3)
    assert_same(ig, ic)
    bc, bg = pair(x, layout, ft.bfloat16)
    assert_same(ops.dropout_forward(None, bg, 0.25, 5, 0), ops.dropout_forward(None, bc, 0.25, 5, 0))


def test_functional_dropout_on_cuda_follows_the_generator():
    x = ft.ones(40, 50, device="cuda")
    ft.manual_seed(123)
    a = host(F.dropout(x, 0.5))
    ft.manual_seed(123)
    np.testing.assert_array_equal(host(F.dropout(ft.ones(40, 50), 0.5)), a)
    assert set(np.unique(a)) <= {0.0, 2.0} and abs((a == 0).mean() - 0.5) < 0.05


# ================================================================ softmax

SOFTMAX_CASES = [((5, 7), 1), ((5, 7), 0), ((2, 3, 4), -1), ((2, 3, 4), 1), ((2, 5, 3, 4), 1), ((3, 40), -1),
                 ((6,), 0), ((64, 5000), 1), ((4, 21, 33, 33), 1), ((1000, 3), 1), ((2, 3, 4, 1030), 3)]


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("shape,dim,layout", [(shape, dim, layout) for shape, dim in SOFTMAX_CASES
                                              for layout in ("contiguous", "strided", "nhwc")
                                              if layout != "nhwc" or len(shape) == 4], ids=str)
def test_softmax_forward_backward(shape, dim, layout, log):
    fwd, bwd = (ops.log_softmax_forward, ops.log_softmax_backward) if log else (ops.softmax_forward,
                                                                                  ops.softmax_backward)
    x, dy = rng(50).normal(0, 3, shape), rng(51).normal(size=shape)
    (xc, xg), (dyc, dyg) = pair(x, layout), pair(dy, layout)
    yc, yg = fwd(None, xc, dim), fwd(None, xg, dim)
    assert_close(yg, yc, 1e-5, 1e-6)
    assert_close(bwd(None, dyg, yg, dim), bwd(None, dyc, yc, dim), 1e-5, 1e-5)


def test_softmax_special_rows():
    x = np.array([[1000.0, 1001.0, 1002.0], [-1000.0, -1001.0, -1e30], [0.0, -np.inf, 1.0],
                  [-np.inf, -np.inf, -np.inf], [np.nan, 1.0, 2.0], [np.inf, 1.0, 2.0]])
    xc, xg = pair(x)
    for fwd in (F.softmax, F.log_softmax):
        assert_close(fwd(xg, 1), fwd(xc, 1), 1e-6, 0)


def test_softmax_accumulate_in_place_bfloat16():
    x, dy, g0 = (rng(s).normal(size=(4, 300)) for s in (52, 53, 54))
    (xc, xg), (dyc, dyg), (gc, gg) = pair(x), pair(dy), pair(g0)
    ops.log_softmax_backward(gc, dyc, F.log_softmax(xc, 1), 1, accumulate=True)
    ops.log_softmax_backward(gg, dyg, F.log_softmax(xg, 1), 1, accumulate=True)
    assert_close(gg, gc, 1e-5, 1e-6)
    ic, ig = pair(x)
    assert ops.softmax_forward(ig, ig, 1) is ig
    ops.softmax_forward(ic, ic, 1)
    assert_close(ig, ic, 1e-5, 1e-7)
    dc, dg = pair(dy)
    ops.softmax_backward(dc, dc, F.softmax(xc, 1), 1)
    ops.softmax_backward(dg, dg, F.softmax(xg, 1), 1)
    assert_close(dg, dc, 1e-5, 1e-6)
    bc, bg = pair(x, dtype=ft.bfloat16)
    assert_ulp(F.softmax(bg, 1), F.softmax(bc, 1), 1)
    oc, og = ft.empty(4, 300), ft.empty(4, 300, device="cuda")
    ops.log_softmax_forward(oc, bc, 1)
    ops.log_softmax_forward(og, bg, 1)
    assert_close(og, oc, 1e-5, 1e-6)


def test_softmax_empty_and_scalar():
    assert F.softmax(ft.zeros(0, 5, device="cuda"), 1).shape == (0, 5)
    assert F.log_softmax(ft.zeros(3, 0, device="cuda"), 1).shape == (3, 0)
    assert host(F.softmax(ft.tensor(2.5, device="cuda"), 0)) == 1.0


# ================================================================ cross-entropy and MSE

CE_CASES = [dict(), dict(reduction="sum"), dict(reduction="none"), dict(weight=True), dict(ignore_index=2),
            dict(eps=0.1), dict(weight=True, ignore_index=1, eps=0.2),
            dict(weight=True, ignore_index=0, eps=0.3, reduction="sum"),
            dict(weight=True, ignore_index=3, eps=0.15, reduction="none")]
CE_SHAPES = [((6, 5), "contiguous"), ((3, 5, 2, 3), "contiguous"), ((3, 5, 2, 3), "nhwc"), ((5,), "contiguous"),
             ((7, 9), "strided"), ((1024, 1000), "contiguous"), ((8, 21, 32, 32), "nhwc")]


def ce_args(case, C, seed):
    w = rng(seed).uniform(0.2, 2.0, C) if case.get("weight") else None
    return w, dict(reduction=case.get("reduction", "mean"), ignore_index=case.get("ignore_index", -100),
                   label_smoothing=case.get("eps", 0.0))


def ce_inputs(shape, layout, case, seed=60):
    C = shape[0] if len(shape) == 1 else shape[1]
    x = rng(seed).normal(0, 2, shape)
    tshape = () if len(shape) == 1 else shape[:1] + shape[2:]
    target = rng(seed + 1).integers(0, C, tshape)
    w, kw = ce_args(case, C, seed + 2)
    xs = pair(x, layout)
    ts = pair(target, dtype=ft.int64)
    ws = pair(w) if w is not None else (None, None)
    return xs, ts, ws, kw


@pytest.mark.parametrize("case", CE_CASES, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()) or "plain")
@pytest.mark.parametrize("shape,layout", CE_SHAPES, ids=lambda v: str(v))
def test_cross_entropy(shape, layout, case):
    (xc, xg), (tc, tg), (wc, wg), kw = ce_inputs(shape, layout, case)
    lc, dc = ops.cross_entropy_forward(None, None, xc, tc, wc, **kw)
    lg, dg = ops.cross_entropy_forward(None, None, xg, tg, wg, **kw)
    assert_close(lg, lc, 1e-5, 1e-6)
    assert_close(dg, dc, 1e-5, 1e-6)
    # the separate backward with a non-trivial dloss
    if kw["reduction"] == "none":
        dlc, dlg = pair(rng(63).normal(size=lc.shape))
    else:
        dlc, dlg = ft.tensor(2.5), ft.tensor(2.5, device="cuda")
    assert_close(ops.cross_entropy_backward(None, dlg, xg, tg, wg, **kw),
                 ops.cross_entropy_backward(None, dlc, xc, tc, wc, **kw), 1e-5, 1e-6)
    assert_close(F.cross_entropy(xg, tg, wg, **kw), lc, 1e-5, 1e-6)


def test_cross_entropy_int32_accumulate_and_in_place():
    (xc, xg), (tc, tg), _, kw = ce_inputs((5, 4), "contiguous", dict(eps=0.1))
    tg32 = tg.to(ft.int32)
    lg, dg = ops.cross_entropy_forward(None, None, xg, tg, **kw)
    l32, d32 = ops.cross_entropy_forward(None, None, xg, tg32, **kw)
    assert_same(l32, lg)
    assert_same(d32, dg)
    g0 = rng(64).normal(size=(5, 4))
    gc, gg = pair(g0)
    ops.cross_entropy_backward(gc, ft.tensor(1.0), xc, tc, accumulate=True, **kw)
    ops.cross_entropy_backward(gg, ft.tensor(1.0, device="cuda"), xg, tg, accumulate=True, **kw)
    assert_close(gg, gc, 1e-5, 1e-6)
    ic, ig = pair(host(xc))  # the gradient written over the logits themselves
    lc, dc = ops.cross_entropy_forward(None, ic, ic, tc, **kw)
    lg, dg = ops.cross_entropy_forward(None, ig, ig, tg, **kw)
    assert dg is ig
    assert_close(lg, lc, 1e-5, 1e-6)
    assert_close(dg, dc, 1e-5, 1e-6)


def test_cross_entropy_ignored_empty_and_bfloat16():
    xc, xg = pair(rng(65).normal(size=(4, 3)))
    ignc, igng = pair(np.full(4, -100), dtype=ft.int64)
    for kw in (dict(), dict(reduction="sum", label_smoothing=0.1)):
        lc, dc = ops.cross_entropy_forward(None, None, xc, ignc, **kw)
        lg, dg = ops.cross_entropy_forward(None, None, xg, igng, **kw)
        assert_close(lg, lc, 0, 0)  # NaN for the mean of nothing, 0 for the sum
        assert not host(dg).any()
    empty, no_t = ft.zeros(0, 3, device="cuda"), ft.zeros(0, dtype=ft.int64, device="cuda")
    assert np.isnan(host(F.cross_entropy(empty, no_t)))
    assert host(F.cross_entropy(empty, no_t, reduction="sum")) == 0
    assert F.cross_entropy(empty, no_t, reduction="none").shape == (0,)
    assert ops.cross_entropy_backward(None, ft.tensor(1.0, device="cuda"), empty, no_t).shape == (0, 3)
    (bc, bg), (tc, tg), _, kw = ce_inputs((7, 9), "contiguous", dict(eps=0.1))
    bc, bg = bc.bfloat16(), bg.bfloat16()
    lc, dc = ops.cross_entropy_forward(None, None, bc, tc, **kw)
    lg, dg = ops.cross_entropy_forward(None, None, bg, tg, **kw)
    assert_ulp(lg, lc, 1)
    assert_ulp(dg, dc, 1, np.abs(host(dc)).max())


@pytest.mark.parametrize("bad", [3, -1, 2 ** 40])
def test_cross_entropy_out_of_range_target(bad):
    """The same IndexError (and message) as on the CPU; the device works normally afterwards."""
    (xc, xg), _, _, _ = ce_inputs((4, 3), "contiguous", {})
    target = np.array([0, 1, bad, 1])
    tc, tg = pair(target, dtype=ft.int64)
    same_error(lambda: F.cross_entropy(xc, tc), lambda: F.cross_entropy(xg, tg), IndexError)
    same_error(lambda: ops.cross_entropy_backward(None, ft.tensor(1.0), xc, tc),
               lambda: ops.cross_entropy_backward(None, ft.tensor(1.0, device="cuda"), xg, tg), IndexError)
    tc, tg = pair(target, dtype=ft.int32) if abs(bad) < 2 ** 31 else pair(target, dtype=ft.int64)
    same_error(lambda: F.cross_entropy(xc, tc, reduction="none"), lambda: F.cross_entropy(xg, tg, reduction="none"),
               IndexError)
    ok_c, ok_g = pair(np.array([0, 1, 2, 1]), dtype=ft.int64)
    assert_close(F.cross_entropy(xg, ok_g), F.cross_entropy(xc, ok_c), 1e-5, 1e-6)


MSE_LAYOUTS = [("contiguous", "contiguous"), ("nhwc", "nhwc"), ("strided", "strided"), ("nhwc", "contiguous")]


@pytest.mark.parametrize("layouts", MSE_LAYOUTS, ids=lambda p: "-".join(p))
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_mse(reduction, layouts):
    shape = (4, 5, 3, 6)
    x, y = rng(70).normal(size=shape), rng(71).normal(size=shape)
    (xc, xg), (yc, yg) = pair(x, layouts[0]), pair(y, layouts[1])
    assert_close(F.mse_loss(xg, yg, reduction=reduction), F.mse_loss(xc, yc, reduction=reduction), 1e-5, 1e-6)
    if reduction == "none":
        dlc, dlg = pair(rng(72).normal(size=shape), layouts[0])
    else:
        dlc, dlg = ft.tensor(1.7), ft.tensor(1.7, device="cuda")
    dxc, dyc = ops.mse_loss_backward(None, None, dlc, xc, yc, reduction)
    dxg, dyg = ops.mse_loss_backward(None, None, dlg, xg, yg, reduction)
    assert_close(dxg, dxc, 1e-6, 1e-7)
    assert_close(dyg, dyc, 1e-6, 1e-7)
    g0 = rng(73).normal(size=shape)
    gc, gg = pair(g0, layouts[0])
    assert ops.mse_loss_backward(gg, False, dlg, xg, yg, reduction, accumulate_inp=True) == (gg, None)
    ops.mse_loss_backward(gc, False, dlc, xc, yc, reduction, accumulate_inp=True)
    assert_close(gg, gc, 1e-6, 1e-7)


def test_mse_large_sums_and_bfloat16():
    x, y = rng(74).normal(size=(8, 16, 64, 64)), rng(75).normal(size=(8, 16, 64, 64))
    (xc, xg), (yc, yg) = pair(x, "nhwc"), pair(y, "nhwc")
    for reduction in ("mean", "sum"):
        assert_close(F.mse_loss(xg, yg, reduction=reduction), F.mse_loss(xc, yc, reduction=reduction), 1e-5, 0)
    assert np.isnan(host(F.mse_loss(ft.zeros(0, device="cuda"), ft.zeros(0, device="cuda"))))
    (bc, bg), (tc, tg) = pair(x[0, 0], dtype=ft.bfloat16), pair(y[0, 0], dtype=ft.bfloat16)
    assert_ulp(F.mse_loss(bg, tg, reduction="none"), F.mse_loss(bc, tc, reduction="none"), 1)
    assert_close(F.mse_loss(bg, tg), F.mse_loss(bc, tc), 1e-2, 0)


# ================================================================ pooling

@pytest.mark.parametrize("layout", ["contiguous", "nhwc", "strided"])
@pytest.mark.parametrize("case", MAX_CASES, ids=str)
def test_max_pool(case, layout):
    x = rng(80).normal(size=(2, 3, 9, 8))
    xc, xg = pair(x, layout)
    oc, ic = ops.max_pool2d_forward(None, None, xc, **max_args(case))
    og, ig = ops.max_pool2d_forward(None, None, xg, **max_args(case))
    assert_same(og, oc)
    assert_same(ig, ic)
    # int32 indices
    o32, i32 = ops.max_pool2d_forward(None, ft.zeros(*oc.shape, dtype=ft.int32, device="cuda"), xg, **max_args(case))
    assert i32.dtype is ft.int32 and np.array_equal(host(i32), host(ic))
    dy = rng(81).normal(size=oc.shape)
    dyc, dyg = pair(dy, layout)
    dxc = ops.max_pool2d_backward(None, dyc, ic, x.shape)
    dxg = ops.max_pool2d_backward(None, dyg, ig, x.shape)
    assert_close(dxg, dxc, 1e-6, 1e-6)  # overlapping windows add several gradients
    assert_close(ops.max_pool2d_backward(None, dyg, i32, x.shape), dxc, 1e-6, 1e-6)


@pytest.mark.parametrize("layout", ["contiguous", "nhwc", "strided"])
@pytest.mark.parametrize("case", AVG_CASES, ids=str)
def test_avg_pool(case, layout):
    x = rng(82).normal(size=(2, 3, 7, 6))
    xc, xg = pair(x, layout)
    oc, og = ops.avg_pool2d_forward(None, xc, **avg_args(case)), ops.avg_pool2d_forward(None, xg, **avg_args(case))
    assert_close(og, oc, 1e-6, 1e-6)
    dyc, dyg = pair(rng(83).normal(size=oc.shape), layout)
    assert_close(ops.avg_pool2d_backward(None, dyg, x.shape, **avg_args(case)),
                 ops.avg_pool2d_backward(None, dyc, x.shape, **avg_args(case)), 1e-6, 1e-6)


@pytest.mark.parametrize("layout", ["contiguous", "nhwc"])
@pytest.mark.parametrize("size", [1, (2, 3), (3, 5), (7, 4), (5, 8)], ids=str)
def test_adaptive_pools(size, layout):
    x = rng(84).normal(size=(2, 4, 7, 5))
    xc, xg = pair(x, layout)
    oc, og = F.adaptive_avg_pool2d(xc, size), F.adaptive_avg_pool2d(xg, size)
    assert_close(og, oc, 1e-6, 1e-6)
    dyc, dyg = pair(rng(85).normal(size=oc.shape), layout)
    assert_close(ops.adaptive_avg_pool2d_backward(None, dyg, x.shape),
                 ops.adaptive_avg_pool2d_backward(None, dyc, x.shape), 1e-6, 1e-6)
    (mc, ic), (mg, ig) = F.adaptive_max_pool2d(xc, size, True), F.adaptive_max_pool2d(xg, size, True)
    assert_same(mg, mc)
    assert_same(ig, ic)
    assert_close(ops.adaptive_max_pool2d_backward(None, dyg, ig, x.shape),
                 ops.adaptive_max_pool2d_backward(None, dyc, ic, x.shape), 1e-6, 1e-6)


@pytest.mark.parametrize("layout", ["contiguous", "nhwc"])
def test_pools_large(layout):
    x = rng(86).normal(size=(8, 64, 32, 32))
    xc, xg = pair(x, layout)
    oc, ic = ops.max_pool2d_forward(None, None, xc, 3, 2, 1)
    og, ig = ops.max_pool2d_forward(None, None, xg, 3, 2, 1)
    assert_same(og, oc)
    assert_same(ig, ic)
    dyc, dyg = pair(rng(87).normal(size=oc.shape), layout)
    assert_close(ops.max_pool2d_backward(None, dyg, ig, (32, 32)), ops.max_pool2d_backward(None, dyc, ic, (32, 32)),
                 1e-6, 1e-6)
    assert_close(ops.avg_pool2d_forward(None, xg, 3, 2, 1), ops.avg_pool2d_forward(None, xc, 3, 2, 1), 1e-6, 1e-6)
    assert_close(F.adaptive_avg_pool2d(xg, 1), F.adaptive_avg_pool2d(xc, 1), 1e-5, 1e-6)
    assert_same(F.adaptive_max_pool2d(xg, 1), F.adaptive_max_pool2d(xc, 1))


def test_pool_accumulate_special_values_and_empty():
    x = rng(88).normal(size=(1, 2, 4, 4))
    x[0, 0, 0, 1] = np.nan
    x[0, 1, :2, :2] = -np.inf
    xc, xg = pair(x)
    (oc, ic), (og, ig) = ops.max_pool2d_forward(None, None, xc, 2), ops.max_pool2d_forward(None, None, xg, 2)
    assert_same(og, oc)
    assert_same(ig, ic)
    (ac, aic), (ag, aig) = F.adaptive_max_pool2d(xc, 1, True), F.adaptive_max_pool2d(xg, 1, True)
    assert_same(ag, ac)
    assert_same(aig, aic)
    dy, g0 = rng(89).normal(size=(1, 2, 2, 2)), rng(90).normal(size=x.shape)
    dyc, dyg = pair(dy)
    for backward in (lambda g, d, i: ops.max_pool2d_backward(g, d, i, accumulate=True),
                     lambda g, d, i: ops.avg_pool2d_backward(g, d, None, 2, accumulate=True),
                     lambda g, d, i: ops.adaptive_avg_pool2d_backward(g, d, accumulate=True)):
        gc, gg = pair(g0)
        backward(gc, dyc, ic)
        backward(gg, dyg, ig)
        assert_close(gg, gc, 1e-6, 1e-6)
    for shape in [(0, 3, 8, 8), (2, 0, 8, 8)]:
        z = ft.zeros(*shape, device="cuda")
        assert F.max_pool2d(z, 2).shape == shape[:2] + (4, 4)
        assert F.avg_pool2d(z, 2).shape == shape[:2] + (4, 4)
        out, idx = F.adaptive_max_pool2d(z, 3, return_indices=True)
        assert ops.adaptive_max_pool2d_backward(None, out, idx, shape).shape == shape


def test_max_pool_backward_refuses_out_of_range_indices():
    xc, xg = pair(rng(91).normal(size=(1, 2, 5, 5)))
    (oc, ic), (og, ig) = ops.max_pool2d_forward(None, None, xc, 2), ops.max_pool2d_forward(None, None, xg, 2)
    for bad in (25, -3, 2 ** 40):
        ic.fill_(0)
        ig.fill_(0)
        ic[0, 1, 1, 0] = bad
        ig[0, 1, 1, 0] = bad
        same_error(lambda: ops.max_pool2d_backward(None, oc, ic, (5, 5)),
                   lambda: ops.max_pool2d_backward(None, og, ig, (5, 5)), IndexError)
    ic[0, 1, 1, 0] = -1  # no element: the gradient is dropped, as on the CPU
    ig[0, 1, 1, 0] = -1
    assert_same(ops.max_pool2d_backward(None, og, ig, (5, 5)), ops.max_pool2d_backward(None, oc, ic, (5, 5)))
    assert_close(F.max_pool2d(xg, 2), F.max_pool2d(xc, 2), 0, 0)


# ================================================================ batch norm and layer norm

BN_LAYOUTS = [("2d", (64, 5)), ("contiguous", (4, 3, 5, 6)), ("nhwc", (4, 3, 5, 6)), ("contiguous", (16, 64, 14, 14)),
              ("nhwc", (16, 64, 14, 14)), ("nhwc", (2, 7, 1, 1))]


def bn_pair(x, layout):
    return pair(x, "contiguous" if layout == "2d" else layout)


@pytest.mark.parametrize("layout,shape", BN_LAYOUTS, ids=str)
def test_batch_norm_training(layout, shape):
    C = shape[1]
    x = rng(100).normal(size=shape) * 3 + 10  # a large mean checks the variance's accuracy
    (xc, xg) = bn_pair(x, layout)
    (wc, wg), (bc, bg) = pair(rng(101).normal(size=C)), pair(rng(102).normal(size=C))
    (rmc, rmg), (rvc, rvg) = pair(rng(103).normal(size=C)), pair(rng(104).uniform(0.5, 2, C))
    oc, mc, sc = ops.batch_norm_forward(None, None, None, xc, wc, bc, rmc, rvc, True, 0.1, 1e-5)
    og, mg, sg = ops.batch_norm_forward(None, None, None, xg, wg, bg, rmg, rvg, True, 0.1, 1e-5)
    assert_close(og, oc, 1e-5, 1e-5)
    assert_close(mg, mc, 1e-6, 0)
    assert_close(sg, sc, 1e-5, 0)
    assert_close(rmg, rmc, 1e-6, 1e-7)
    assert_close(rvg, rvc, 1e-5, 0)
    dy = rng(105).normal(size=shape)
    dyc, dyg = bn_pair(dy, layout)
    dxc, dwc, dbc = ops.batch_norm_backward(None, None, None, dyc, xc, None, wc, None, mc, sc)
    dxg, dwg, dbg = ops.batch_norm_backward(None, None, None, dyg, xg, None, wg, None, mg, sg)
    # dx = w invstd (dy - mean(dy) - x_hat mean(dy x_hat)) cancels to rounding noise in a channel of few
    # values (of two, to 0 exactly): its error is measured against the terms, not against dx
    terms = np.abs(dy).max() * np.abs(host(wc) * host(sc)).max()
    assert dxg.stride() == dxc.stride()
    np.testing.assert_allclose(host(dxg), host(dxc), rtol=1e-4, atol=1e-5 * terms)
    assert_close(dwg, dwc, 1e-5, 1e-5)
    assert_close(dbg, dbc, 1e-5, 1e-5)


def test_batch_norm_eval_no_affine_and_fused_relu():
    x = rng(106).normal(size=(2, 4, 3, 3))
    (rmc, rmg), (rvc, rvg) = pair(rng(107).normal(size=4)), pair(rng(108).uniform(0.5, 1.5, 4))
    (wc, wg), (bc, bg) = pair(rng(109).normal(size=4)), pair(rng(110).normal(size=4))
    for layout in ("contiguous", "nhwc"):
        xc, xg = pair(x, layout)
        oc, _, _ = ops.batch_norm_forward(None, None, None, xc, wc, bc, rmc, rvc, False)
        og, _, _ = ops.batch_norm_forward(None, None, None, xg, wg, bg, rmg, rvg, False)
        assert_close(og, oc, 1e-6, 1e-6)
        # no affine parameters, no running statistics
        oc, mc, sc = ops.batch_norm_forward(None, None, None, xc, None, None)
        og, mg, sg = ops.batch_norm_forward(None, None, None, xg, None, None)
        assert_close(og, oc, 1e-5, 1e-5)
        dyc, dyg = pair(rng(111).normal(size=x.shape), layout)
        dc = ops.batch_norm_backward(None, False, False, dyc, xc, None, None, None, mc, sc)[0]
        dg = ops.batch_norm_backward(None, False, False, dyg, xg, None, None, None, mg, sg)[0]
        assert_close(dg, dc, 1e-4, 1e-5)
        # BN + ReLU fused, forward and backward
        fc, mc, sc = ops.batch_norm_forward(None, None, None, xc, wc, bc, act="relu")
        fg, mg, sg = ops.batch_norm_forward(None, None, None, xg, wg, bg, act="relu")
        assert_close(fg, fc, 1e-5, 1e-5)
        assert (host(fg) >= 0).all()
        dc = ops.batch_norm_backward(None, None, None, dyc, xc, fc, wc, bc, mc, sc, act="relu")
        dg = ops.batch_norm_backward(None, None, None, dyg, xg, fg, wg, bg, mg, sg, act="relu")
        for g, c in zip(dg, dc):
            assert_close(g, c, 1e-4, 1e-5)


LN_CASES = [((4, 3, 8), (8,)), ((64, 768), (768,)), ((16, 4096), (4096,)), ((2, 3, 5, 7), (5, 7)), ((33, 1), (1,))]


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("shape,norm", LN_CASES, ids=str)
def test_layer_norm(shape, norm, affine):
    x = rng(120).normal(size=shape) + 5
    xc, xg = pair(x)
    (wc, wg), (bc, bg) = (pair(rng(121).normal(size=norm)), pair(rng(122).normal(size=norm))) if affine else \
        ((None, None), (None, None))
    oc, mc, rc = ops.layer_norm_forward(None, None, None, xc, wc, bc, norm)
    og, mg, rg = ops.layer_norm_forward(None, None, None, xg, wg, bg, norm)
    assert_close(og, oc, 1e-5, 1e-5)
    assert_close(mg, mc, 1e-6, 0)
    assert_close(rg, rc, 1e-5, 0)
    dyc, dyg = pair(rng(123).normal(size=shape))
    dc = ops.layer_norm_backward(None, None if affine else False, None if affine else False, dyc, xc, wc, mc, rc, norm)
    dg = ops.layer_norm_backward(None, None if affine else False, None if affine else False, dyg, xg, wg, mg, rg, norm)
    assert_close(dg[0], dc[0], 1e-4, 1e-5)
    if affine:
        assert_close(dg[1], dc[1], 1e-5, 1e-5)
        assert_close(dg[2], dc[2], 1e-5, 1e-5)


GN_CASES = [("contiguous", (4, 6, 5, 7), 3), ("nhwc", (4, 6, 5, 7), 3), ("contiguous", (8, 64, 16, 16), 8),
            ("nhwc", (8, 64, 16, 16), 8), ("contiguous", (5, 12), 4), ("contiguous", (3, 8, 33), 1),
            ("nhwc", (2, 32, 1, 1), 32)]


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("layout,shape,G", GN_CASES, ids=str)
def test_group_norm(layout, shape, G, affine):
    C = shape[1]
    x = rng(190).normal(size=shape) * 3 + 10  # a large mean checks the variance's accuracy
    xc, xg = pair(x, layout)
    (wc, wg), (bc, bg) = (pair(rng(191).normal(size=C)), pair(rng(192).normal(size=C))) if affine else \
        ((None, None), (None, None))
    oc, mc, rc = ops.group_norm_forward(None, None, None, xc, wc, bc, G)
    og, mg, rg = ops.group_norm_forward(None, None, None, xg, wg, bg, G)
    assert_close(og, oc, 1e-5, 1e-5)
    assert_close(mg, mc, 1e-6, 0)
    assert_close(rg, rc, 1e-5, 0)
    dyc, dyg = pair(rng(193).normal(size=shape), layout)
    skip = None if affine else False
    dc = ops.group_norm_backward(None, skip, skip, dyc, xc, mc, rc, wc, G)
    dg = ops.group_norm_backward(None, skip, skip, dyg, xg, mg, rg, wg, G)
    assert_close(dg[0], dc[0], 1e-4, 1e-5)
    if affine:
        assert_close(dg[1], dc[1], 1e-5, 1e-5)
        assert_close(dg[2], dc[2], 1e-5, 1e-5)
        # accumulation adds to every gradient; in place writes the input gradient over dout
        held = [pair(rng(194 + i).normal(size=a.shape), layout if i == 0 else "contiguous") for i, a in
                enumerate(dc)]
        ops.group_norm_backward(*(h[0] for h in held), dyc, xc, mc, rc, wc, G, accumulate=True)
        ops.group_norm_backward(*(h[1] for h in held), dyg, xg, mg, rg, wg, G, accumulate=True)
        for hc, hg in held:
            assert_close(hg, hc, 1e-4, 1e-5)
        ops.group_norm_backward(dyg, False, False, dyg, xg, mg, rg, wg, G)
        assert_close(dyg, dc[0], 1e-4, 1e-5)


@pytest.mark.parametrize("V,D,shape", [(11, 6, (3, 5)), (50257, 256, (8, 128)), (7, 33, (200,)), (5, 4, ())],
                         ids=str)
def test_embedding(V, D, shape):
    wc, wg = pair(rng(200).normal(size=(V, D)))
    ids = rng(201).integers(0, min(V, 40), shape)  # repeats: rows that sum several positions
    ic, ig = pair(ids, dtype=ft.int64)
    assert_same(ops.embedding_forward(None, ig, wg), ops.embedding_forward(None, ic, wc))
    dyc, dyg = pair(rng(202).normal(size=shape + (D,)))
    for pad in (None, 2):  # the rows of each id add in position order on both: the same bits
        assert_same(ops.embedding_backward(None, dyg, ig, V, padding_idx=pad),
                    ops.embedding_backward(None, dyc, ic, V, padding_idx=pad))
    hc, hg = pair(rng(203).normal(size=(V, D)))
    ops.embedding_backward(hc, dyc, ic, padding_idx=1, accumulate=True)
    ops.embedding_backward(hg, dyg, ig, padding_idx=1, accumulate=True)
    assert_same(hg, hc)


def test_embedding_out_of_range_ids_read_as_on_the_cpu():
    wc, wg = pair(rng(204).normal(size=(6, 3)))
    ic, ig = pair(np.array([[0, 5, 2], [7, -1, 1]]), dtype=ft.int64)
    same_error(lambda: ops.embedding_forward(None, ic, wc), lambda: ops.embedding_forward(None, ig, wg), IndexError)
    dyc, dyg = pair(np.ones((2, 3, 3)))
    same_error(lambda: ops.embedding_backward(None, dyc, ic, 6), lambda: ops.embedding_backward(None, dyg, ig, 6),
               IndexError)


def test_one_hot_rows_and_bad_ids_as_on_the_cpu():
    ic, ig = pair(rng(205).integers(0, 7, (5, 9)), dtype=ft.int64)
    assert_same(ft.nn.functional.one_hot(ig, 7), ft.nn.functional.one_hot(ic, 7))
    for dtype in (ft.bfloat16, ft.float16):  # the rows a 16-bit program's loss reads
        out = ft.empty(5, 9, 7, dtype=dtype, device="cuda")
        ops.one_hot_forward(out, ig)
        assert_same(out.float(), ops.one_hot_forward(None, ic, 7))
    bc, bg = pair(np.array([[0, 5], [7, 1]]), dtype=ft.int64)
    same_error(lambda: ft.nn.functional.one_hot(bc, 6), lambda: ft.nn.functional.one_hot(bg, 6), IndexError)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("scale", [(2, 2), (3, 1), (2, 3)], ids=str)
def test_upsample_nearest2d(layout, scale):
    xc, xg = pair(rng(205).normal(size=(2, 5, 6, 7)), layout)
    oc, og = ops.upsample_nearest2d_forward(None, xc, scale), ops.upsample_nearest2d_forward(None, xg, scale)
    assert_same(og, oc)
    dyc, dyg = pair(rng(206).normal(size=tuple(oc.shape)), layout)
    assert_same(ops.upsample_nearest2d_backward(None, dyg, scale), ops.upsample_nearest2d_backward(None, dyc, scale))
    hc, hg = pair(rng(207).normal(size=(2, 5, 6, 7)), layout)
    ops.upsample_nearest2d_backward(hc, dyc, scale, accumulate=True)
    ops.upsample_nearest2d_backward(hg, dyg, scale, accumulate=True)
    assert_same(hg, hc)
    assert_same(F.interpolate(xg, scale_factor=scale), F.interpolate(xc, scale_factor=scale))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("size, align_corners, scale", [((13, 9), False, (0.0, 0.0)), ((13, 9), True, (0.0, 0.0)),
                                                        ((4, 17), False, (0.7, 2.5))], ids=str)
def test_upsample_bilinear2d(layout, size, align_corners, scale):
    xc, xg = pair(rng(208).normal(size=(2, 5, 6, 7)), layout)
    oc = ops.upsample_bilinear2d_forward(None, xc, size, align_corners, *scale)
    assert_same(ops.upsample_bilinear2d_forward(None, xg, size, align_corners, *scale), oc)
    dyc, dyg = pair(rng(209).normal(size=tuple(oc.shape)), layout)
    assert_same(ops.upsample_bilinear2d_backward(None, dyg, (6, 7), align_corners, *scale),
                ops.upsample_bilinear2d_backward(None, dyc, (6, 7), align_corners, *scale))
    hc, hg = pair(rng(210).normal(size=(2, 5, 6, 7)), layout)
    ops.upsample_bilinear2d_backward(hc, dyc, (6, 7), align_corners, *scale, accumulate=True)
    ops.upsample_bilinear2d_backward(hg, dyg, (6, 7), align_corners, *scale, accumulate=True)
    assert_same(hg, hc)


# ================================================================ convolution, linear, bias gradients

CONV_CASES = [
    dict(N=2, C=3, H=7, W=6, K=4, R=3, S=3, stride=(1, 1), pad=(1, 1), dil=(1, 1), groups=1),
    dict(N=3, C=4, H=9, W=8, K=6, R=3, S=2, stride=(2, 1), pad=(0, 1), dil=(1, 2), groups=2),
    dict(N=2, C=6, H=5, W=5, K=6, R=3, S=3, stride=(1, 1), pad=(1, 1), dil=(1, 1), groups=6),  # depthwise
    dict(N=1, C=2, H=6, W=7, K=3, R=1, S=1, stride=(2, 2), pad=(0, 0), dil=(1, 1), groups=1),
    dict(N=8, C=32, H=16, W=16, K=64, R=3, S=3, stride=(1, 1), pad=(1, 1), dil=(1, 1), groups=1),
    dict(N=4, C=3, H=32, W=32, K=16, R=7, S=7, stride=(2, 2), pad=(3, 3), dil=(1, 1), groups=1),
]


def conv_inputs(c, layout, seed=130, dtype=ft.float32):
    x = rng(seed).standard_normal((c["N"], c["C"], c["H"], c["W"]))
    w = rng(seed + 1).standard_normal((c["K"], c["C"] // c["groups"], c["R"], c["S"])) * 0.3
    b = rng(seed + 2).standard_normal(c["K"])
    return pair(x, layout, dtype), pair(w, "contiguous", dtype), pair(b)


def conv_args(c):
    return c["stride"], c["pad"], c["dil"], c["groups"]


@pytest.mark.parametrize("layout", ["contiguous", "nhwc"])
@pytest.mark.parametrize("case", CONV_CASES, ids=lambda c: "N{N}C{C}H{H}K{K}R{R}S{S}g{groups}".format(**c))
def test_conv2d(case, layout):
    (xc, xg), (wc, wg), (bc, bg) = conv_inputs(case, layout)
    args = conv_args(case)
    oc, og = ops.conv2d_forward(None, xc, wc, bc, *args), ops.conv2d_forward(None, xg, wg, bg, *args)
    assert_close(og, oc, 1e-4, 1e-4)
    dyc, dyg = pair(rng(133).standard_normal(oc.shape), layout)
    gc = ops.conv2d_backward(None, None, None, dyc, xc, wc, *args)
    gg = ops.conv2d_backward(None, None, None, dyg, xg, wg, *args)
    for g, c in zip(gg, gc):
        assert_close(g, c, 1e-4, 1e-4)


@pytest.mark.parametrize("layout", ["contiguous", "nhwc"])
def test_conv_transpose2d(layout):
    """The transposed convolution runs on the convolution's cuDNN calls with the roles exchanged."""
    xc, xg = pair(rng(144).standard_normal((2, 4, 5, 6)), layout)
    wc, wg = pair(rng(145).standard_normal((4, 3, 3, 3)))
    bc, bg = pair(rng(146).standard_normal(6))
    args = ((2, 2), (1, 1), (1, 1), 2)
    oc = ops.conv_transpose2d_forward(None, xc, wc, bc, *args, (1, 0))
    og = ops.conv_transpose2d_forward(None, xg, wg, bg, *args, (1, 0))
    assert_close(og, oc, 1e-4, 1e-4)
    dyc, dyg = pair(rng(147).standard_normal(oc.shape), layout)
    gc = ops.conv_transpose2d_backward(None, None, None, dyc, xc, wc, *args)
    gg = ops.conv_transpose2d_backward(None, None, None, dyg, xg, wg, *args)
    for g, c in zip(gg, gc):
        assert_close(g, c, 1e-4, 1e-4)


@pytest.mark.parametrize("layout", ["contiguous", "nhwc"])
def test_conv2d_fusions(layout):
    c = dict(N=2, C=3, H=6, W=6, K=5, R=3, S=3, stride=(1, 1), pad=(1, 1), dil=(1, 1), groups=1)
    (xc, xg), (wc, wg), (bc, bg) = conv_inputs(c, layout, 140)
    fc = ops.conv2d_forward(None, xc, wc, bc, padding=1, act="relu")
    fg = ops.conv2d_forward(None, xg, wg, bg, padding=1, act="relu")
    assert_close(fg, fc, 1e-4, 1e-4)
    res = rng(143).standard_normal(fc.shape)
    rc, rg = pair(res, layout)
    ops.conv2d_forward(rc, xc, wc, bc, padding=1, act="relu", sum=True)
    ops.conv2d_forward(rg, xg, wg, bg, padding=1, act="relu", sum=True)
    assert_close(rg, rc, 1e-4, 1e-4)
    assert (host(rg) >= 0).all()


def test_conv2d_bfloat16_and_empty():
    c = dict(N=2, C=16, H=8, W=8, K=16, R=3, S=3, stride=(1, 1), pad=(1, 1), dil=(1, 1), groups=1)
    for layout in ("contiguous", "nhwc"):
        (xc, xg), (wc, wg), _ = conv_inputs(c, layout, 150, ft.bfloat16)
        oc, og = ops.conv2d_forward(None, xc, wc, None, padding=1), ops.conv2d_forward(None, xg, wg, None, padding=1)
        assert og.dtype is oc.dtype is ft.bfloat16
        # float32 sums of exact products in different orders, rounded once to bfloat16: an ulp apart at most
        assert_close(og, oc, 2.0 ** -7, 1e-5)
    w = ft.zeros(4, 3, 3, 3, device="cuda")
    empty = ops.conv2d_forward(None, ft.zeros(0, 3, 8, 8, device="cuda"), w, padding=1)
    assert empty.is_cuda and empty.shape == (0, 4, 8, 8)
    dx, dw, db = ops.conv2d_backward(None, None, None, empty, ft.zeros(0, 3, 8, 8, device="cuda"), w, padding=1)
    assert dw.is_cuda and not host(dw).any() and db.shape == (4,) and not host(db).any()


@pytest.mark.parametrize("layout", ["contiguous", "nhwc"])
def test_bias_gradient_sums_over_batch_and_pixels(layout):
    """db = the channel sums of dout (ops/reduce.h), reached through conv2d_backward and linear_backward."""
    c = dict(N=64, C=8, H=14, W=14, K=256, R=1, S=1, stride=(1, 1), pad=(0, 0), dil=(1, 1), groups=1)
    (xc, xg), (wc, wg), _ = conv_inputs(c, layout, 160)
    dy = rng(163).standard_normal((64, 256, 14, 14)) + 0.5
    dyc, dyg = pair(dy, layout)
    _, _, dbc = ops.conv2d_backward(False, False, None, dyc, xc, wc)
    _, _, dbg = ops.conv2d_backward(False, False, None, dyg, xg, wg)
    assert_close(dbg, dbc, 1e-5, 0)
    (lxc, lxg), (lwc, lwg), (ldc, ldg) = (pair(rng(s).standard_normal(sh)) for s, sh in
                                          ((164, (4099, 16)), (165, (33, 16)), (166, (4099, 33))))
    assert_close(ops.linear_backward(False, False, None, ldg, lxg, lwg)[2],
                 ops.linear_backward(False, False, None, ldc, lxc, lwc)[2], 1e-5, 0)


LINEAR_SHAPES = [(6, 5, 4), (37, 53, 29), (256, 512, 128), (1, 7, 3), (1000, 64, 10)]


@pytest.mark.parametrize("act", [None, "relu", "gelu"])
@pytest.mark.parametrize("N,I,O", LINEAR_SHAPES, ids=str)
def test_linear(N, I, O, act):
    (xc, xg), (wc, wg), (bc, bg) = (pair(rng(s).standard_normal(sh)) for s, sh in
                                    ((170, (N, I)), (171, (O, I)), (172, (O,))))
    oc, og = ops.linear_forward(None, xc, wc, bc, act), ops.linear_forward(None, xg, wg, bg, act)
    assert_close(og, oc, 1e-4, 1e-4)
    dyc, dyg = pair(rng(173).standard_normal((N, O)))
    gc = ops.linear_backward(None, None, None, dyc, xc, wc)
    gg = ops.linear_backward(None, None, None, dyg, xg, wg)
    for g, c in zip(gg, gc):
        assert_close(g, c, 1e-4, 1e-4)


def test_linear_transposed_weight_bfloat16_and_empty():
    x, w = rng(174).standard_normal((9, 5)), rng(175).standard_normal((4, 5))
    (xc, xg), (wtc, wtg) = pair(x), pair(w.T.copy())
    assert_close(ops.linear_forward(None, xg, wtg.t(), None), ops.linear_forward(None, xc, wtc.t(), None), 1e-5, 1e-5)
    (bxc, bxg), (bwc, bwg) = pair(x, dtype=ft.bfloat16), pair(w, dtype=ft.bfloat16)
    og, oc = ops.linear_forward(None, bxg, bwg, None), ops.linear_forward(None, bxc, bwc, None)
    assert og.dtype is oc.dtype is ft.bfloat16
    assert_close(og, oc, 2.0 ** -7, 1e-5)  # float32 sums rounded once to bfloat16, as conv2d's
    e = ops.linear_forward(None, ft.zeros(0, 5, device="cuda"), wtg.t())
    assert e.is_cuda and e.shape == (0, 4)
    x3 = rng(176).standard_normal((2, 3, 5))
    (x3c, x3g), (wc, wg) = pair(x3), pair(w)
    assert_close(F.linear(x3g, wg), F.linear(x3c, wc), 1e-5, 1e-5)


# ================================================================ attention

# (N, H, Tq, Tk, D, causal): partial tiles, a query longer than the keys, D of one lane's worth and of the most
SDPA_CASES = [(2, 3, 70, 70, 20, False), (2, 3, 70, 70, 20, True), (1, 2, 130, 67, 64, True),
              (1, 2, 5, 130, 33, False), (2, 1, 40, 40, 256, True)]


def heads_pair(a):
    """(cpu, cuda) views of (N, H, T, D) values stored as (N, T, H, D), as attention layers feed them."""
    cpu, gpu = pair(np.ascontiguousarray(a.transpose(0, 2, 1, 3)))
    return cpu.transpose(1, 2), gpu.transpose(1, 2)


@pytest.mark.parametrize("variant", ["", "dropout", "key_mask"])
@pytest.mark.parametrize("transposed", [False, True], ids=["contiguous", "heads_view"])
@pytest.mark.parametrize("N,H,Tq,Tk,D,causal", SDPA_CASES, ids=str)
def test_sdpa_forward_backward(N, H, Tq, Tk, D, causal, transposed, variant):
    make = heads_pair if transposed else pair
    r = rng(190)
    (qc, qg), (kc, kg), (vc, vg), (dc, dg) = (make(r.normal(size=s)) for s in
                                              ((N, H, Tq, D), (N, H, Tk, D), (N, H, Tk, D), (N, H, Tq, D)))
    masked = r.random((N, Tk)) < 0.3
    masked[0] = True  # a sample whose every key is masked out
    kw = dict(causal=causal, dropout_p=0.3 if variant == "dropout" else 0.0, seed=21, offset=5)  # one mask on both
    kc_, kg_ = (dict(kw, key_mask=ft.tensor(masked, device=d) if variant == "key_mask" else None)
                for d in ("cpu", "cuda"))
    oc, lc = ops.sdpa_forward(None, None, qc, kc, vc, **kc_)
    og, lg = ops.sdpa_forward(None, None, qg, kg, vg, **kg_)
    assert_close(og, oc, 1e-5, 1e-5)
    assert_close(lg, lc, 1e-5, 1e-5)
    for g, c in zip(ops.sdpa_backward(None, None, None, dg, qg, kg, vg, og, lg, **kg_),
                    ops.sdpa_backward(None, None, None, dc, qc, kc, vc, oc, lc, **kc_)):
        assert_close(g, c, 1e-4, 1e-4)


@pytest.mark.parametrize("variant", ["", "dropout", "key_mask"])
@pytest.mark.parametrize("dtype,rel", [(ft.bfloat16, 2.0 ** -7), (ft.float16, 2.0 ** -10)], ids=["bf16", "f16"])
def test_sdpa_16_bit(dtype, rel, variant):
    """The kernels read and write 16-bit operands themselves: the float32 results over the same (rounded) values,
    each rounded once to the operands' type, within the type's resolution (and the float32 lse exactly as close as
    the float32 kernels' own)."""
    r = rng(192)
    N, H, Tq, Tk, D = 2, 3, 37, 45, 40
    xs = [heads_pair(r.normal(size=s))[1].to(dtype) for s in ((N, H, Tq, D), (N, H, Tk, D), (N, H, Tk, D),
                                                             (N, H, Tq, D))]
    qg, kg, vg, dg = xs
    qc, kc, vc, dc = (x.cpu().float() for x in xs)  # the float32 reference over the same values
    masked = r.random((N, Tk)) < 0.3
    kw = dict(causal=variant == "", dropout_p=0.3 if variant == "dropout" else 0.0, seed=21, offset=5)
    kc_, kg_ = (dict(kw, key_mask=ft.tensor(masked, device=d) if variant == "key_mask" else None)
                for d in ("cpu", "cuda"))
    og, lg = ops.sdpa_forward(None, None, qg, kg, vg, **kg_)
    oc, lc = ops.sdpa_forward(None, None, qc, kc, vc, **kc_)
    assert og.dtype is dtype and og.is_cuda
    assert lg.dtype is ft.float32
    np.testing.assert_allclose(host(lg), host(lc), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(host(og.float()), host(oc), rtol=rel, atol=rel * np.abs(host(oc)).max())
    # the backward from the 16-bit forward's output, against the float32 backward from the float32 one
    grads_g = ops.sdpa_backward(None, None, None, dg, qg, kg, vg, og, lg, **kg_)
    grads_c = ops.sdpa_backward(None, None, None, dc, qc, kc, vc, oc, lc, **kc_)
    for name, g, c in zip("qkv", grads_g, grads_c):
        assert g.dtype is dtype, name
        big = np.abs(host(c)).max()
        np.testing.assert_allclose(host(g.float()), host(c), rtol=4 * rel, atol=4 * rel * big, err_msg="d" + name)


def test_sdpa_accumulate_skip_and_bad_input():
    r = rng(191)
    (qc, qg), (kc, kg), (dc, dg) = (pair(r.normal(size=(2, 2, 9, 16))) for _ in range(3))
    oc, lc = ops.sdpa_forward(None, None, qc, kc, kc, 0.2)
    og, lg = ops.sdpa_forward(None, None, qg, kg, kg, 0.2)
    (ac, ag), (bc, bg) = pair(r.normal(size=(2, 2, 9, 16))), pair(r.normal(size=(2, 2, 9, 16)))
    ops.sdpa_backward(ac, False, bc, dc, qc, kc, kc, oc, lc, 0.2, accumulate=True)
    ops.sdpa_backward(ag, False, bg, dg, qg, kg, kg, og, lg, 0.2, accumulate=True)
    assert_close(ag, ac, 1e-4, 1e-4)
    assert_close(bg, bc, 1e-4, 1e-4)
    y = F.scaled_dot_product_attention(qg[:, 0], kg[:, 0], kg[:, 0], is_causal=True)
    assert_close(y, F.scaled_dot_product_attention(qc[:, 0], kc[:, 0], kc[:, 0], is_causal=True), 1e-5, 1e-5)
    mixed_devices(lambda: ops.sdpa_forward(None, None, qg, kc, kg))
    same_error(lambda: ops.sdpa_forward(None, None, qc, kc, kc[:, :, :4]),
               lambda: ops.sdpa_forward(None, None, qg, kg, kg[:, :, :4]), ValueError)
    with pytest.raises(ValueError, match="the CUDA kernels take a head size D <= 256, got 260"):
        x = ft.zeros(1, 1, 2, 260, device="cuda")
        ops.sdpa_forward(None, None, x, x, x)


# ================================================================ the LSTM step

@pytest.mark.parametrize("with_prev", [True, False])
def test_lstm_step_is_the_cpus(with_prev):
    """The fused LSTM step's kernels run the CPU's formulas in its order (explicit fmaf, --fmad=false): the same
    bits, forward and backward, writing and accumulating, over strided gate columns."""
    r = rng(200)
    (gc, gg), (pc, pg), (dcc, dcg), (dhc, dhg) = (pair(r.normal(size=s)) for s in ((7, 4 * 33), (7, 33), (7, 33),
                                                                                 (7, 33)))
    prev = (pc, pg) if with_prev else (None, None)
    cc, cg = (ops.lstm_cell_forward(None, g, p) for g, p in zip((gc, gg), prev))
    assert_same(cg, cc)
    assert_same(ops.lstm_hidden_forward(None, gg, cg), ops.lstm_hidden_forward(None, gc, cc))
    outs = []
    for g, p, dc, dh, c in ((gc, prev[0], dcc, dhc, cc), (gg, prev[1], dcg, dhg, cg)):
        dgates, dcell = ops.lstm_hidden_backward(None, None, dh, g, c)
        dgates, dprev = ops.lstm_cell_backward(dgates, None if p is None else False, dc, g, p, accumulate_gates=True)
        ops.lstm_cell_backward(dgates, None, dcell, g, p, accumulate_gates=True)
        outs.append(dgates)
    assert_same(outs[1], outs[0])


# ================================================================ bad input

def test_mixed_devices_are_refused_naming_both():
    g, c = ft.zeros(2, 3, 4, 4, device="cuda"), ft.zeros(2, 3, 4, 4)
    gt = ft.zeros(2, 4, 4, dtype=ft.int64, device="cuda")
    calls = [
        lambda: ops.activation_forward(c, g, "relu"),
        lambda: ops.activation_backward(None, g, c, None, "gelu"),
        lambda: F.add(g, c),
        lambda: F.mul(c, g),
        lambda: F.cat([g, c], 1),
        lambda: ops.dropout_forward(c, g, 0.5, 1, 0),
        lambda: ops.softmax_forward(c, g, 1),
        lambda: F.cross_entropy(g, gt.cpu()),
        lambda: F.cross_entropy(c, gt),
        lambda: F.cross_entropy(g, gt, ft.ones(3)),
        lambda: F.mse_loss(g, c),
        lambda: ops.max_pool2d_forward(None, ft.zeros(2, 3, 2, 2, dtype=ft.int64), g, 2),
        lambda: ops.avg_pool2d_backward(c, g, None, 1),
        lambda: ops.batch_norm_forward(None, None, None, g, ft.ones(3), ft.zeros(3)),
        lambda: ops.layer_norm_forward(None, None, None, g, ft.ones(4), None, (4,)),
        lambda: ops.group_norm_forward(None, None, None, g, ft.ones(3), None, 3),
        lambda: ops.embedding_forward(None, gt, ft.ones(4, 3)),
        lambda: ops.upsample_nearest2d_backward(c, g, 2),
        lambda: ops.conv2d_forward(None, g, ft.zeros(5, 3, 3, 3)),
        lambda: ops.conv2d_forward(None, c, ft.zeros(5, 3, 3, 3, device="cuda")),
        lambda: ops.conv2d_forward(None, g, ft.zeros(5, 3, 3, 3, device="cuda"), ft.zeros(5)),
        lambda: ops.linear_forward(None, ft.zeros(2, 3, device="cuda"), ft.zeros(4, 3)),
        lambda: ops.linear_backward(None, None, None, ft.zeros(2, 4), ft.zeros(2, 3, device="cuda"),
                                    ft.zeros(4, 3, device="cuda")),
    ]
    for call in calls:
        mixed_devices(call)


def test_validation_errors_read_as_on_the_cpu():
    a, ag = ft.zeros(2, 3), ft.zeros(2, 3, device="cuda")
    same_error(lambda: F.add(a, ft.zeros(3, 2)), lambda: F.add(ag, ft.zeros(3, 2, device="cuda")), ValueError)
    same_error(lambda: F.softmax(a, 2), lambda: F.softmax(ag, 2), IndexError)
    same_error(lambda: F.relu(a.to(ft.int64)), lambda: F.relu(ag.to(ft.int64)), TypeError)
    same_error(lambda: ops.activation_forward(ft.zeros(3, 2), a, "gelu"),
               lambda: ops.activation_forward(ft.zeros(3, 2, device="cuda"), ag, "gelu"), ValueError)
    same_error(lambda: ops.conv2d_forward(None, ft.zeros(2, 3, 8, 8), ft.zeros(6, 3, 3, 3), None, groups=3),
               lambda: ops.conv2d_forward(None, ft.zeros(2, 3, 8, 8, device="cuda"),
                                          ft.zeros(6, 3, 3, 3, device="cuda"), None, groups=3), ValueError)
    same_error(lambda: ops.linear_forward(None, ft.zeros(2, 3), ft.zeros(4, 5)),
               lambda: ops.linear_forward(None, ft.zeros(2, 3, device="cuda"), ft.zeros(4, 5, device="cuda")),
               ValueError)
    big = ft.zeros(8, device="cuda")
    with pytest.raises(ValueError, match="partly overlaps"):
        ops.activation_forward(big[1:5], big[0:4], "relu")


def test_outputs_allocated_by_the_bindings_are_on_the_device():
    """Every output passed as None is allocated on the inputs' device, in the CPU's memory format."""
    x4, w4 = pair(rng(180).standard_normal((2, 3, 6, 6)), "nhwc"), pair(rng(181).standard_normal((4, 3, 3, 3)))
    x2, w2, b2, d2, w1 = (pair(rng(s).standard_normal(sh)) for s, sh in
                          ((182, (5, 7)), (183, (3, 7)), (184, (3,)), (186, (5, 3)), (187, (3, 3, 1, 1))))
    v, t = pair(rng(185).standard_normal(3)), pair(np.zeros((2, 6, 6)), dtype=ft.int64)
    calls = {
        "conv2d_forward": lambda x4, w4, **_: ops.conv2d_forward(None, x4, w4, None, padding=1),
        "conv2d_backward": lambda x4, w1, **_: ops.conv2d_backward(None, None, None, x4, x4, w1),
        "linear_forward": lambda x2, w2, b2, **_: ops.linear_forward(None, x2, w2, b2),
        "linear_backward": lambda x2, w2, d2, **_: ops.linear_backward(None, None, None, d2, x2, w2),
        "batch_norm_forward": lambda x4, v, **_: ops.batch_norm_forward(None, None, None, x4, v, v),
        "batch_norm_backward": lambda x4, v, **_: ops.batch_norm_backward(None, None, None, x4, x4, None, v, None, v,
                                                                          v),
        "layer_norm_forward": lambda x4, **_: ops.layer_norm_forward(None, None, None, x4.contiguous(), None, None,
                                                                     (6,)),
        "max_pool2d_forward": lambda x4, **_: ops.max_pool2d_forward(None, None, x4, 2),
        "group_norm_forward": lambda x4, v, **_: ops.group_norm_forward(None, None, None, x4, v, v, 3),
        "group_norm_backward": lambda x4, v, **_: ops.group_norm_backward(
            None, None, None, x4, x4, *ops.group_norm_forward(None, None, None, x4, None, None, 1)[1:], v, 1),
        "embedding_backward": lambda t, x2, **_: ops.embedding_backward(None, x2.reshape(1, 5, 7),
                                                                         t[:1, :1, :5].reshape(1, 5), 9),
        "upsample_nearest2d_forward": lambda x4, **_: ops.upsample_nearest2d_forward(None, x4, 2),
        "cross_entropy_forward": lambda x4, t, **_: ops.cross_entropy_forward(None, None, x4, t),
        "mse_loss_forward": lambda x4, **_: ops.mse_loss_forward(None, x4, x4),
        "concat_backward": lambda x4, **_: ops.concat_backward(None, x4, [1, 2], 1),
    }
    problems = []
    for name, call in calls.items():
        args = dict(x4=x4, w4=w4, w1=w1, x2=x2, w2=w2, b2=b2, d2=d2, v=v, t=t)
        want = call(**{k: a[0] for k, a in args.items()})
        try:
            got = call(**{k: a[1] for k, a in args.items()})
        except Exception as e:  # noqa: BLE001 - every binding is checked, then all problems reported
            problems.append(f"{name}: {type(e).__name__}: {e}")
            continue
        want, got = (w if isinstance(w, (tuple, list)) else (w,) for w in (want, got))
        for i, (g, c) in enumerate(zip(got, want)):
            if not g.is_cuda or g.stride() != c.stride():
                problems.append(f"{name}: output {i} on {g.device} with strides {g.stride()} (CPU: {c.stride()})")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("n", [7, 1 << 20])
def test_a_copy_between_overlapping_views_reads_the_source_as_it_was(n):
    """x[1:] = x[:-1] shifts, as on the CPU (the copy kernel alone would read elements it has already written)."""
    xc, xg = pair(rng(206).normal(size=(n,)))
    for x in (xc, xg):
        x[1:].copy_(x[:-1])
    assert_same(xg, xc)

