"""bfloat16 on CUDA: the ops without 16-bit kernels of their own (batch, layer and group norm, pooling, upsampling,
attention, embeddings) run their float32 kernels on float32 copies made on the device, so each result must be
the float32 kernels' result on the same values, rounded once; compile(precision="bf16-mixed") on a GPU against
the float32 program (losses within bfloat16's tolerance, docs/precision.md), bitwise repeatable in deterministic
mode, the traced zoo in bf16-mixed, ft.autocast("cuda"), and the device's compute capability."""
import numpy as np
import pytest

import fasttrain as ft
from _cudaref import host
from _cudaref import full_fp32  # noqa: F401 (an autouse fixture)
from _opref import bf16_round

pytestmark = pytest.mark.cuda
nn, ops = ft.nn, ft.ops


def maker(low, seed, layout):
    """mk(*shape, act=True, positive=False, image=True): CUDA tensors of seeded values that bfloat16 holds exactly;
    activations (act) in bfloat16 when `low`, parameters and statistics in float32; 4-d images in `layout`."""
    r = np.random.default_rng(seed)

    def mk(*shape, act=True, positive=False, image=True):
        a = bf16_round(r.standard_normal(shape).astype(np.float32))
        if positive:
            a = np.abs(a) + 0.5
        nhwc = layout == "nhwc" and len(shape) == 4 and image
        t = ft.from_numpy(np.ascontiguousarray(np.moveaxis(a, 1, 3) if nhwc else a)).to("cuda")
        t = t.permute(0, 3, 1, 2) if nhwc else t
        return t.to(ft.bfloat16) if low and act else t
    return mk


def batch_norm(mk):
    x, dy, old = mk(8, 6, 5, 5), mk(8, 6, 5, 5), mk(8, 6, 5, 5)
    w, b, rm, rv = mk(6, act=False), mk(6, act=False), mk(6, act=False), mk(6, act=False, positive=True)
    out, mean, invstd = ops.batch_norm_forward(None, None, None, x, w, b, rm, rv, act="relu")
    dx, dw, db = ops.batch_norm_backward(None, None, None, dy, x, out, w, mean, invstd, act="relu")
    ops.batch_norm_backward(old, False, False, dy, x, out, w, mean, invstd, act="relu", accumulate=True)
    return out, mean, invstd, rm, rv, dx, dw, db, old


def layer_norm(mk):
    x, dy = mk(4, 7, 32), mk(4, 7, 32)
    w, b = mk(32, act=False), mk(32, act=False)
    out, mean, rstd = ops.layer_norm_forward(None, None, None, x, w, b, (32,))
    return (out, mean, rstd) + tuple(ops.layer_norm_backward(None, None, None, dy, x, w, mean, rstd, (32,)))


def group_norm(mk):
    x, dy = mk(4, 6, 5, 5), mk(4, 6, 5, 5)
    w, b = mk(6, act=False), mk(6, act=False)
    out, mean, rstd = ops.group_norm_forward(None, None, None, x, w, b, 3)
    return (out, mean, rstd) + tuple(ops.group_norm_backward(None, None, None, dy, x, mean, rstd, w, 3))


def pools(mk):
    x, dy, old = mk(4, 6, 9, 9), mk(4, 6, 5, 5), mk(4, 6, 9, 9)
    out, idx = ops.max_pool2d_forward(None, None, x, 3, 2, 1)
    ops.max_pool2d_backward(old, dy, idx, (9, 9), accumulate=True)
    return (out, idx, ops.max_pool2d_backward(None, dy, idx, (9, 9)), old,
            ops.avg_pool2d_forward(None, x, 3, 2, 1), ops.avg_pool2d_backward(None, dy, (9, 9), 3, 2, 1),
            ops.adaptive_avg_pool2d_forward(None, x, (5, 5)), ops.adaptive_avg_pool2d_backward(None, dy, (9, 9)))


def upsample(mk):
    x, dy = mk(2, 6, 4, 5), mk(2, 6, 8, 10)
    return ops.upsample_nearest2d_forward(None, x, 2), ops.upsample_nearest2d_backward(None, dy, 2)


def attention(mk):
    q, k, v, dy = (mk(2, 3, t, 16, image=False) for t in (10, 12, 12, 10))
    out, lse = ops.sdpa_forward(None, None, q, k, v)
    return (out, lse) + tuple(ops.sdpa_backward(None, None, None, dy, q, k, v, out, lse))


def embedding(mk):
    w, dy = mk(11, 8, act=False), mk(3, 5, 8)
    ids = ft.tensor(np.random.default_rng(3).integers(0, 11, (3, 5))).to("cuda")
    out = ops.embedding_forward(ft.empty(3, 5, 8, dtype=dy.dtype, device="cuda"), ids, w)
    return out, ops.embedding_backward(None, dy, ids, 11)


CASES = [batch_norm, layer_norm, group_norm, pools, upsample, attention, embedding]


@pytest.mark.parametrize("layout", ["contiguous", "nhwc"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__)
def test_16bit_ops_are_their_float32_kernels_rounded_once(case, layout):
    low, full = case(maker(True, 7, layout)), case(maker(False, 7, layout))
    assert any(t.dtype is ft.bfloat16 for t in low)
    for i, (got, want) in enumerate(zip(low, full)):
        assert got.is_cuda and got.shape == want.shape
        w = host(want)
        if got.dtype is ft.bfloat16:
            w = bf16_round(w)
        else:
            assert got.dtype is want.dtype, (i, got.dtype, want.dtype)
        np.testing.assert_array_equal(host(got), w, err_msg=f"result {i} of {case.__name__}")


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


@pytest.mark.parametrize("name", ["tiny_segnet", "vit_tiny", "gpt_block", "se_net", "audio_cnn"])
def test_traced_zoo_models_in_bf16_mixed(name, bf16_gpu):
    """Upsampling, group and layer norm, attention, embeddings and 1-d convolutions inside a bf16-mixed CUDA
    program: the loss of one backward within bfloat16's tolerance of the float32 program's, finite gradients."""
    import test_zoo as zoo
    cls, shape, loss, fmt = zoo.ZOO[name]
    x, y = zoo.data(name)
    results = []
    for precision in ("bf16-mixed", "32-true"):
        ft.manual_seed(0)
        model = cls().to("cuda")
        program = model.compile(ft.optim.SGD(model.parameters(), lr=0.05), loss, batch_size=8, input_shape=shape,
                                memory_format=fmt, input_dtype=ft.int64 if name in zoo.TOKENS else None,
                                precision=precision)
        results.append((program.backward(x, y), [host(p.grad) for p in model.parameters()]))
    np.testing.assert_allclose(results[0][0], results[1][0], rtol=5e-2)
    assert all(np.isfinite(g).all() for g in results[0][1])


def test_autocast_cuda_runs_cuda_products_in_bfloat16():
    x, w = ft.randn(4, 8), ft.randn(3, 8)
    with ft.autocast("cuda"):
        got = ft.nn.functional.linear(x.to("cuda"), w.to("cuda"))
        assert ft.nn.functional.linear(x, w).dtype is ft.float32
    assert got.dtype is ft.bfloat16 and got.is_cuda
    want = ft.nn.functional.linear(x.to("cuda").to(ft.bfloat16), w.to("cuda").to(ft.bfloat16))
    np.testing.assert_array_equal(host(got), host(want))


def test_device_capability():
    major, minor = ft.cuda.get_device_capability()
    assert isinstance(major, int) and isinstance(minor, int) and major >= 3
    assert ft.cuda.is_bf16_supported() == ((major, minor) >= (8, 0))
