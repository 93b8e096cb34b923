"""bfloat16 and float16 on CUDA. Attention runs its float32 kernels on float32 copies made on the device; the other
kernels (batch, layer and group norm, pooling, upsampling, embeddings, the pointwise and row kernels) load 16-bit
values as float and round their results once, those that add into an output in place (an accumulating gradient,
the max pool's backward) after adding in float: each result must be the float32 kernels' result on the same values,
rounded once. Convolutions and matmuls (cuDNN, cuBLASLt, float32
accumulation) within the 16-bit format's tolerance of float32. compile(precision="bf16-mixed" / "16-mixed") on a
GPU against the float32 program (losses within the format's tolerance, docs/precision.md), bitwise repeatable in
deterministic mode, the traced zoo in bf16-mixed, ft.autocast("cuda"), and the device's compute capability."""
import numpy as np
import pytest

import fasttrain as ft
from _cudaref import host
from _cudaref import full_fp32  # noqa: F401 (an autouse fixture)
from _opref import bf16_round

pytestmark = pytest.mark.cuda
nn, ops = ft.nn, ft.ops


LOW = [ft.bfloat16, ft.float16]


def rounded(a, dtype):
    """float32 values rounded to dtype (to nearest even), as float32."""
    a = np.asarray(a, np.float32)
    return bf16_round(a) if dtype is ft.bfloat16 else a.astype(np.float16).astype(np.float32)


def maker(dtype, seed, layout, low):
    """mk(*shape, act=True, positive=False, image=True): CUDA tensors of seeded values that bfloat16 and float16 both
    hold exactly; activations (act) in `dtype` (the 16-bit `low`, or float32), parameters and statistics in float32;
    4-d images in `layout`. mk.saved(t): a forward's result as a backward reads it, holding `low`'s values in
    either run, so that both backwards read the same values."""
    r = np.random.default_rng(seed)

    def mk(*shape, act=True, positive=False, image=True):
        a = rounded(rounded(r.standard_normal(shape), ft.float16), ft.bfloat16)
        if positive:
            a = np.abs(a) + 0.5
        nhwc = layout == "nhwc" and len(shape) == 4 and image
        t = ft.from_numpy(np.ascontiguousarray(np.moveaxis(a, 1, 3) if nhwc else a)).to("cuda")
        t = t.permute(0, 3, 1, 2) if nhwc else t
        return t.to(dtype) if act else t
    mk.saved = lambda t: t if t.dtype is low else t.to(low).to(ft.float32)
    return mk


def batch_norm(mk):
    x, dy, old = mk(8, 6, 5, 5), mk(8, 6, 5, 5), mk(8, 6, 5, 5)
    w, b, rm, rv = mk(6, act=False), mk(6, act=False), mk(6, act=False), mk(6, act=False, positive=True)
    out, mean, invstd = ops.batch_norm_forward(None, None, None, x, w, b, rm, rv, act="relu")
    y = mk.saved(out)
    dx, dw, db = ops.batch_norm_backward(None, None, None, dy, x, y, w, b, mean, invstd, act="relu")
    ops.batch_norm_backward(old, False, False, dy, x, y, w, b, mean, invstd, act="relu", accumulate=True)
    return out, mean, invstd, rm, rv, dx, dw, db, old


def layer_norm(mk):
    x, dy = mk(4, 7, 32), mk(4, 7, 32)
    w, b = mk(32, act=False), mk(32, act=False)
    out, mean, rstd = ops.layer_norm_forward(None, None, None, x, w, b, (32,))
    return (out, mean, rstd) + tuple(ops.layer_norm_backward(None, None, None, dy, x, w, mean, rstd, (32,)))


def group_norm(mk):
    x, dy, old = mk(4, 6, 5, 5), mk(4, 6, 5, 5), mk(4, 6, 5, 5)
    w, b = mk(6, act=False), mk(6, act=False)
    out, mean, rstd = ops.group_norm_forward(None, None, None, x, w, b, 3)
    grads = ops.group_norm_backward(None, None, None, dy, x, mean, rstd, w, 3)
    ops.group_norm_backward(old, False, False, dy, x, mean, rstd, w, 3, accumulate=True)
    return (out, mean, rstd) + tuple(grads) + (old,)


def pools(mk):
    x, dy, old = mk(4, 6, 9, 9), mk(4, 6, 5, 5), mk(4, 6, 9, 9)
    out, idx = ops.max_pool2d_forward(None, None, x, 3, 2, 1)
    ops.max_pool2d_backward(old, dy, idx, (9, 9), accumulate=True)
    return (out, idx, ops.max_pool2d_backward(None, dy, idx, (9, 9)), old,
            ops.avg_pool2d_forward(None, x, 3, 2, 1), ops.avg_pool2d_backward(None, dy, (9, 9), 3, 2, 1),
            ops.adaptive_avg_pool2d_forward(None, x, (5, 5)), ops.adaptive_avg_pool2d_backward(None, dy, (9, 9)))


def max_pool_backward(mk):
    """Stride-1 windows: an input element takes up to nine gradients, from more than one group of 32 outputs (the
    kernel's steps), into a strided dinp and an adaptive pool's; the sums run in float and are rounded once."""
    x, dy, old = mk(3, 5, 9, 9), mk(3, 5, 9, 9), mk(3, 5, 9, 18)[..., ::2]
    _, idx = ops.max_pool2d_forward(None, None, x, 3, 1, 1)
    ops.max_pool2d_backward(old, dy, idx, (9, 9), accumulate=True)
    _, aidx = ops.adaptive_max_pool2d_forward(None, None, x, (4, 4))
    ady, aold = mk(3, 5, 4, 4), mk(3, 5, 9, 9)
    ops.adaptive_max_pool2d_backward(aold, ady, aidx, (9, 9), accumulate=True)
    return (ops.max_pool2d_backward(None, dy, idx, (9, 9)), old,
            ops.adaptive_max_pool2d_backward(None, ady, aidx, (9, 9)), aold)


def upsample(mk):
    x, dy, old = mk(2, 6, 4, 5), mk(2, 6, 8, 10), mk(2, 6, 4, 5)
    ops.upsample_nearest2d_backward(old, dy, 2, accumulate=True)
    wide, wdy = mk(2, 6, 4, 10)[..., ::2], mk(2, 6, 8, 15)  # a strided input; unequal scales
    return (ops.upsample_nearest2d_forward(None, x, 2), ops.upsample_nearest2d_backward(None, dy, 2), old,
            ops.upsample_nearest2d_forward(None, wide, (2, 3)), ops.upsample_nearest2d_backward(None, wdy, (2, 3)))


def attention(mk):
    q, k, v, dy = (mk(2, 3, t, 16, image=False) for t in (10, 12, 12, 10))
    out, lse = ops.sdpa_forward(None, None, q, k, v)
    return (out, lse) + tuple(ops.sdpa_backward(None, None, None, dy, q, k, v, mk.saved(out), lse))


def embedding(mk):
    """A float32 table and gradient, 16-bit rows; ids repeat, so the backward adds several rows into one."""
    w, dy, old = mk(11, 8, act=False), mk(3, 5, 8), mk(11, 8, act=False)
    ids = ft.tensor(np.random.default_rng(3).integers(0, 11, (3, 5))).to("cuda")
    out = ops.embedding_forward(ft.empty(3, 5, 8, dtype=dy.dtype, device="cuda"), ids, w)
    ops.embedding_backward(old, dy, ids, 11, padding_idx=int(host(ids)[0, 0]), accumulate=True)
    return out, ops.embedding_backward(None, dy, ids, 11), old


def pointwise(mk):
    x, y, dy = mk(4, 6, 5, 5), mk(4, 6, 5, 5), mk(4, 6, 5, 5)
    g = ops.activation_forward(None, x, "gelu")
    return (g, ops.activation_backward(None, dy, x, None, "gelu"), ops.add_forward(None, x, y, "relu"),
            ops.mul_forward(None, x, y), ops.concat_forward(None, [x, y], 1))


def rows(mk):
    logits, dy = mk(12, 10, image=False), mk(12, 10, image=False)
    target = ft.tensor(np.random.default_rng(4).integers(0, 10, 12)).to("cuda")
    s = ops.softmax_forward(None, logits, 1)
    loss, dlogits = ops.cross_entropy_forward(None, None, logits, target)
    return s, ops.softmax_backward(None, dy, mk.saved(s), 1), ops.log_softmax_forward(None, logits, 1), loss, dlogits


CASES = [batch_norm, layer_norm, group_norm, pools, max_pool_backward, upsample, attention, embedding, pointwise,
         rows]


@pytest.mark.parametrize("low", LOW, ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "nhwc"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__)
def test_16bit_ops_are_their_float32_kernels_rounded_once(case, layout, low):
    got16, full = case(maker(low, 7, layout, low)), case(maker(ft.float32, 7, layout, low))
    assert any(t.dtype is low for t in got16)
    for i, (got, want) in enumerate(zip(got16, full)):
        assert got.is_cuda and got.shape == want.shape
        w = host(want)
        if got.dtype is low:
            w = rounded(w, low)
        else:
            assert got.dtype is want.dtype, (i, got.dtype, want.dtype)
        np.testing.assert_array_equal(host(got), w, err_msg=f"result {i} of {case.__name__}")


@pytest.mark.parametrize("low", LOW, ids=str)
def test_16bit_products_are_within_the_formats_tolerance(low):
    """Convolution (cuDNN) and linear (cuBLASLt) forward and backward on 16-bit operands, float32 accumulation:
    within a few units of the format's rounding of float32 results; weight gradients float32."""
    tol = 2e-2 if low is ft.bfloat16 else 4e-3
    results = []
    for dtype in (low, ft.float32):
        mk = maker(dtype, 9, "nhwc", low)
        x, w, dy = mk(4, 8, 9, 9), mk(16, 8, 3, 3), mk(4, 16, 9, 9)
        a, lw, ldy = mk(6, 32), mk(12, 32), mk(6, 12)
        dw, ldw = ft.zeros(16, 8, 3, 3, device="cuda"), ft.zeros(12, 32, device="cuda")
        dx, _, _ = ops.conv2d_backward(None, dw, False, dy, x, w, padding=1)
        ldx, _, _ = ops.linear_backward(None, ldw, False, ldy, a, lw)
        results.append([ops.conv2d_forward(None, x, w, None, padding=1), dx, dw, ops.linear_forward(None, a, lw),
                        ldx, ldw])
    for i, (got, want) in enumerate(zip(*results)):
        assert got.dtype is (ft.float32 if i in (2, 5) else low), (i, got.dtype)
        w = host(want)
        np.testing.assert_allclose(host(got), w, atol=tol * np.abs(w).max(), err_msg=f"product {i}")


def demo_cnn(seed):
    ft.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Dropout(0.1), nn.Linear(32, 5))


def train(precision, steps=6, seed=0, **kw):
    model = demo_cnn(seed).to("cuda")
    opt = ft.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    program = model.compile(opt, nn.CrossEntropyLoss(), batch_size=32, input_shape=(3, 16, 16), seed=5,
                            precision=precision, **kw)
    r = np.random.default_rng(seed)
    losses = [program.train_step(r.standard_normal((32, 3, 16, 16)).astype(np.float32),
                                 r.integers(0, 5, 32).astype(np.int64)) for _ in range(steps)]
    return program, model, losses


@pytest.fixture
def bf16_gpu():
    """Skips the test on a GPU without bfloat16 tensor cores (there bf16-mixed runs as 32-true)."""
    if not ft.cuda.is_bf16_supported():
        pytest.skip("the GPU lacks bfloat16 tensor cores (compute capability 8.0 or later)")


def test_bf16_mixed_program_follows_float32(bf16_gpu):
    """The same net, data and seeds in bf16-mixed and in float32 on the GPU: each step's loss within bfloat16's
    tolerance, float32 master weights that moved, bfloat16 activations in the summary."""
    pl, ml, low = train("bf16-mixed")
    _, mf, full = train("32-true")
    assert pl.precision == "bf16-mixed" and "bfloat16" in pl.summary()
    np.testing.assert_allclose(low, full, rtol=3e-2)
    assert all(p.dtype is ft.float32 and p.is_cuda for p in ml.parameters())
    for (name, a), b in zip(ml.named_parameters(), mf.parameters()):
        np.testing.assert_allclose(host(a), host(b), atol=3e-2, err_msg=name)


def test_16_mixed_program_follows_float32_with_a_grad_scaler_of_its_own():
    """precision="16-mixed" gets a GradScaler when given none (float16's range needs one; Lightning's 16-mixed
    scales too): each step's loss within float16's tolerance of the float32 program's."""
    p16, m16, low = train("16-mixed")
    _, mf, full = train("32-true")
    assert p16.precision == "16-mixed" and "float16" in p16.summary()
    assert isinstance(p16.grad_scaler, ft.amp.GradScaler) and p16.skipped_steps == 0
    np.testing.assert_allclose(low, full, rtol=1e-2)
    for (name, a), b in zip(m16.named_parameters(), mf.parameters()):
        np.testing.assert_allclose(host(a), host(b), atol=1e-2, err_msg=name)


def test_bf16_mixed_steps_are_bitwise_repeatable(bf16_gpu, ft_deterministic):
    runs = [train("bf16-mixed", steps=3) for _ in range(2)]
    assert runs[0][2] == runs[1][2]
    for a, b in zip(runs[0][1].parameters(), runs[1][1].parameters()):
        assert host(a).tobytes() == host(b).tobytes()


def test_bf16_mixed_with_a_grad_scaler_skips_an_overflowing_step(bf16_gpu):
    program, model, _ = train("bf16-mixed", steps=1, grad_scaler=ft.amp.GradScaler(init_scale=2.0 ** 126))
    before = [host(p) for p in model.parameters()]
    x = np.full((32, 3, 16, 16), 1e30, np.float32)
    program.train_step(x, np.zeros(32, np.int64))
    assert program.grad_scaler.get_scale() < 2.0 ** 126
    for a, b in zip(model.parameters(), before):
        np.testing.assert_array_equal(host(a), b)


@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
@pytest.mark.parametrize("name", ["tiny_segnet", "vit_tiny", "gpt_block", "se_net", "audio_cnn", "hand_attention"])
def test_traced_zoo_models_in_mixed_precision(name, precision, bf16_gpu):
    """Upsampling, group and layer norm, attention, embeddings, 1-d convolutions and matmuls by hand inside a
    mixed-precision CUDA program: the loss of one backward within the format's tolerance of the float32 program's,
    finite gradients."""
    import test_zoo as zoo
    cls, shape, loss, fmt = zoo.ZOO[name]
    x, y = zoo.data(name)
    results = []
    for run in (precision, "32-true"):
        ft.manual_seed(0)
        model = cls().to("cuda")
        program = model.compile(ft.optim.SGD(model.parameters(), lr=0.05), loss, batch_size=8, input_shape=shape,
                                memory_format=fmt, input_dtype=ft.int64 if name in zoo.TOKENS else None,
                                precision=run)
        results.append((program.backward(x, y), [host(p.grad) for p in model.parameters()]))
    np.testing.assert_allclose(results[0][0], results[1][0], rtol=5e-2)
    assert all(np.isfinite(g).all() for g in results[0][1])


@pytest.mark.parametrize("low", [None] + LOW, ids=str)
def test_autocast_cuda_runs_cuda_products_in_16_bits(low):
    """ft.autocast("cuda") takes float16 by default, as torch.autocast("cuda"), or bfloat16; CPU products in the
    block stay float32."""
    x, w = ft.randn(4, 8), ft.randn(3, 8)
    with ft.autocast("cuda", dtype=low):
        got = ft.nn.functional.linear(x.to("cuda"), w.to("cuda"))
        assert ft.nn.functional.linear(x, w).dtype is ft.float32
    low = low or ft.float16
    assert got.dtype is low and got.is_cuda
    want = ft.nn.functional.linear(x.to("cuda").to(low), w.to("cuda").to(low))
    np.testing.assert_array_equal(host(got), host(want))


def test_device_capability():
    major, minor = ft.cuda.get_device_capability()
    assert isinstance(major, int) and isinstance(minor, int) and major >= 3
    assert ft.cuda.is_bf16_supported() == ((major, minor) >= (8, 0))
