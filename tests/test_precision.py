"""precision="bf16-mixed": each node's dtype, gradients and loss curves against float32, float32 weights and
optimizer state, bitwise reproducibility, the low-precision weight copy kept current, and bad input."""
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import fasttrain as ft
import fasttrain.nn.functional as F
from _opref import bf16_round, torch
from fasttrain import backends, nn

# bfloat16 keeps 8 significant bits: one rounding is a relative error of at most 2^-8. Activations and their
# gradients are rounded at every layer, and a gradient that is a difference of near-equal terms (softmax minus
# one-hot) amplifies that: these nets' parameter gradients differ from float32's by 1-6% (relative L2). A wrong
# dtype, offset or conversion gives errors of order 100%, far past the tolerances below.
GRAD_RTOL = 1e-1
LOSS_RTOL = 3e-2

needs_bf16 = pytest.mark.skipif(not backends.cpu_has_bf16(), reason="this CPU has no AVX512-BF16: bf16-mixed "
                                                                    "runs as 32-true")


def conv_net():
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 5))


def data(n=32, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 5, n)
    x = rng.standard_normal((n, 3, 12, 12)) + y[:, None, None, None] * 0.3  # learnable
    return x.astype(np.float32), y


def compiled(precision, seed=0, make=conv_net, lr=0.05, loss=None, **kw):
    ft.manual_seed(seed)
    model = make()
    opt = ft.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    kw.setdefault("input_shape", (3, 12, 12))
    return model, model.compile(opt, loss or nn.CrossEntropyLoss(), batch_size=32, precision=precision, seed=1,
                                **kw)


def gradients_follow_float32(x, y, **kw):
    """The bf16-mixed program of compiled(precision, **kw), after checking that its parameter gradients of one
    backward of (x, y) are those of the float32 program within GRAD_RTOL (relative L2)."""
    grads = {}
    for precision in ("32-true", "bf16-mixed"):
        model, prog = compiled(precision, **kw)
        prog.backward(x, y)
        grads[precision] = {n: np.array(p.grad) for n, p in model.named_parameters()}
    for name, g32 in grads["32-true"].items():
        err = np.linalg.norm(grads["bf16-mixed"][name] - g32) / max(np.linalg.norm(g32), 1e-12)
        assert err < GRAD_RTOL, (name, err)
    return prog


def weights(model):
    return {k: np.array(v) for k, v in model.state_dict().items()}


@needs_bf16
def test_summary_shows_each_node_dtype():
    model, prog = compiled("bf16-mixed")
    dtypes = prog._c.node_dtypes()
    kinds = [type(e.module).__name__ if e.module is not None else "input" for e in prog.entries]
    by_kind = dict(zip(kinds, dtypes))
    for kind in ("input", "Conv2d", "BatchNorm2d", "MaxPool2d", "AdaptiveAvgPool2d", "Linear"):
        assert by_kind[kind] == "bfloat16", (kind, by_kind)
    assert by_kind["CrossEntropyLoss"] == "float32"
    text = prog.summary()
    assert "precision: bf16-mixed" in text and "bfloat16" in text
    assert "bfloat16" not in compiled("32-true")[1].summary()


@needs_bf16
def test_activation_arena_about_halves():
    train32, eval32, _ = compiled("32-true")[1]._c.memory()
    train16, eval16, _ = compiled("bf16-mixed")[1]._c.memory()
    assert train16 < 0.65 * train32 and eval16 < 0.65 * eval32


@needs_bf16
def test_weights_gradients_and_state_stay_float32():
    model, prog = compiled("bf16-mixed")
    x, y = data()
    for _ in range(3):
        prog.train_step(x, y)
    for name, p in model.named_parameters():
        assert p.dtype is ft.float32 and p.grad.dtype is ft.float32, name
    assert all(v.dtype == np.float32 for k, v in weights(model).items() if "num_batches" not in k)
    for state in prog.optimizer.state_dict()["state"].values():
        assert np.asarray(state["momentum_buffer"]).dtype == np.float32


@needs_bf16
def test_gradients_match_float32():
    gradients_follow_float32(*data())


@needs_bf16
def test_loss_curve_follows_float32_and_learns():
    x, y = data(seed=1)
    curves = {}
    for precision in ("32-true", "bf16-mixed"):
        _, prog = compiled(precision)
        curves[precision] = np.array([prog.train_step(x, y) for _ in range(25)])
    np.testing.assert_allclose(curves["bf16-mixed"], curves["32-true"], rtol=LOSS_RTOL, atol=0.02)
    assert curves["bf16-mixed"][-1] < 0.5 * curves["bf16-mixed"][0]


@needs_bf16
@pytest.mark.parametrize("deterministic", [False, True])
def test_bitwise_reproducible_across_runs_and_threads(deterministic):
    """Two runs give the same bits; 1 and 2 threads too in deterministic mode (by default oneDNN splits the
    convolutions' weight-gradient sums by thread count)."""
    x, y = data()
    threads = ft.get_num_threads()
    results = []
    try:
        ft.use_deterministic_algorithms(deterministic)
        for n in (2, 2, 1) if deterministic else (threads, threads):
            ft.set_num_threads(n)
            model, prog = compiled("bf16-mixed")
            losses = [prog.train_step(x, y) for _ in range(4)]
            results.append((losses, weights(model)))
    finally:
        ft.set_num_threads(threads)
        ft.use_deterministic_algorithms(False)
    for losses, w in results[1:]:
        assert losses == results[0][0]
        for k in w:
            np.testing.assert_array_equal(w[k], results[0][1][k], err_msg=k)


@needs_bf16
def test_fit_writes_the_copy_as_a_conversion_would():
    """ft.fit's epoch has the optimizer write the bfloat16 weights as it updates; train_step by hand converts
    them each call. Both give the same bits."""
    rng = np.random.default_rng(0)
    images, labels = rng.integers(0, 256, (64, 12, 12, 3), dtype=np.uint8), rng.integers(0, 5, 64)
    batches = list(ft.data.Loader(ft.data.from_arrays(images, labels), 32, num_workers=1))
    by_hand, prog = compiled("bf16-mixed")
    for xb, yb in batches:
        prog.train_step(xb, yb)
    fitted, prog = compiled("bf16-mixed")
    ft.fit(prog, ft.data.Loader(ft.data.from_arrays(images, labels), 32, num_workers=1), 1, progress=False)
    a, b = weights(by_hand), weights(fitted)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


@needs_bf16
def test_fit_takes_float16_batches_as_train_step_does():
    """A Loader's float16 batches convert to the program's bfloat16 in C as train_step's do."""
    rng = np.random.default_rng(0)
    images, labels = rng.integers(0, 256, (64, 12, 12, 3), dtype=np.uint8), rng.integers(0, 5, 64)

    def loader():
        return ft.data.Loader(ft.data.from_arrays(images, labels), 32, num_workers=1, dtype="float16",
                              transforms=[ft.data.Normalize(128.0, 64.0)])
    by_hand, prog = compiled("bf16-mixed")
    for xb, yb in loader():
        assert xb.dtype is ft.float16
        prog.train_step(xb, yb)
    fitted, prog = compiled("bf16-mixed")
    ft.fit(prog, loader(), 1, progress=False)
    a, b = weights(by_hand), weights(fitted)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


@needs_bf16
def test_loader_bfloat16_batches_feed_fit_directly():
    """A Loader delivering bfloat16 batches trains a bf16-mixed program as the float32 Loader does: the program
    rounds float32 batches exactly as the loader rounds its own."""
    rng = np.random.default_rng(0)
    images, labels = rng.integers(0, 256, (64, 12, 12, 3), dtype=np.uint8), rng.integers(0, 5, 64)
    results = []
    for kw in ({}, {"dtype": "bfloat16"}, {"dtype": "bfloat16", "channels_last": True}):
        model, prog = compiled("bf16-mixed")
        loader = ft.data.Loader(ft.data.from_arrays(images, labels), 32, num_workers=1,
                                transforms=[ft.data.Normalize(128.0, 64.0)], **kw)
        if kw:
            assert next(iter(loader))[0].dtype is ft.bfloat16
        history = ft.fit(prog, loader, 2, progress=False)
        results.append((history["train_loss"], weights(model)))
    for other in results[1:]:
        assert other[0] == results[0][0]
        for k in results[0][1]:
            np.testing.assert_array_equal(other[1][k], results[0][1][k], err_msg=k)


@needs_bf16
def test_a_weight_written_between_steps_is_read():
    """The program's bfloat16 copy follows the float32 weights whatever wrote them."""
    x, y = data()
    model, prog = compiled("bf16-mixed")
    prog.train_step(x, y)
    np.asarray(model[-1].bias)[:] = [0, 0, 0, 0, 50]  # by NumPy, after compile
    assert (np.asarray(prog.predict(x)).argmax(1) == 4).all()
    model.load_state_dict({k: v * 0 if k.endswith("weight") and v.ndim == 2 else v for k, v in weights(model).items()})
    out = np.asarray(prog.predict(x))
    np.testing.assert_allclose(out, np.broadcast_to([0, 0, 0, 0, 50], out.shape), atol=1e-6)


@needs_bf16
def test_bfloat16_batches_go_straight_in():
    x, y = data()
    losses = []
    for batch in (x, ft.tensor(x).to("bfloat16")):
        _, prog = compiled("bf16-mixed")
        losses.append(prog.train_step(batch, y))
    assert losses[0] == losses[1]  # the program rounds a float32 batch as .to("bfloat16") does
    # a float32 program widens a bfloat16 batch exactly, in C as train_step does in Python
    _, prog32 = compiled("32-true")
    got = prog32._c.train_step(ft.tensor(x).to("bfloat16"), ft.tensor(y), prog32.optimizer)[0]
    assert got == compiled("32-true")[1].train_step(bf16_round(x), y)


class HandAttention(nn.Module):
    """Attention written with @, softmax and a parameter matrix, as PyTorch code often has it."""

    def __init__(self):
        super().__init__()
        self.qk = nn.Linear(144, 16)
        self.w = nn.Parameter(nn.init.normal_(ft.empty(16, 5), std=0.5))

    def forward(self, x):
        h = self.qk(x.flatten(2))  # (N, 3, 16)
        scores = h @ h.transpose(1, 2) * 0.25
        return (F.softmax(scores, dim=-1) @ h @ self.w).mean(1)


@needs_bf16
def test_matmuls_by_hand_in_bfloat16():
    """x @ y of two activations and of an activation and a parameter run in bfloat16 (the parameter's copy);
    gradients follow float32's, the parameter's included."""
    from fasttrain.nn.program import MATMUL, PARAM
    prog = gradients_follow_float32(*data(), make=HandAttention)
    dtypes = prog._c.node_dtypes()
    assert {dtypes[i] for i, e in enumerate(prog.entries) if e.kind in (MATMUL, PARAM)} == {"bfloat16"}


@needs_bf16
@pytest.mark.parametrize("normalize", [lambda x: (x - 1000.0) / 2,
                                       lambda x: ft.cat([x[:, :4] - 1000.0, x[:, 4:] - 1000.0], 1),
                                       lambda x: (x - x.mean(1, keepdim=True)) / x.std(1, keepdim=True)],
                         ids=["offset", "slices", "standardized"])
def test_an_input_read_first_by_elementwise_ops_stays_float32(normalize):
    """Features around 1000 normalized in forward ((x - 1000) / 2, slices of it, each sample standardized by its
    mean and deviation): those ops read the float32 batch and write float32, as torch.autocast keeps them (rounded
    to bfloat16 first, 3 of 512 values would stay distinct); the model's predictions follow float32's and it learns
    as float32 does. An input only a convolution reads still rounds as it is copied in."""
    class Offset(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(8, 32), nn.Linear(32, 2)

        def forward(self, x):
            return self.b(F.relu(self.a(normalize(x))))

    rng = np.random.default_rng(0)
    z = rng.standard_normal((256, 8)).astype(np.float32)
    x, y = 1000 + 2 * z, (z[:, 0] + 0.5 * z[:, 1] > 0).astype(np.int64)
    runs = {}
    for precision in ("32-true", "bf16-mixed"):
        ft.manual_seed(0)
        model = Offset()
        prog = model.compile(ft.optim.Adam(model.parameters(), lr=1e-2), nn.CrossEntropyLoss(), batch_size=64,
                             input_shape=(8,), precision=precision)
        before = np.asarray(prog.predict(x))
        losses = [prog.train_step(x[i % 4 * 64:][:64], y[i % 4 * 64:][:64]) for i in range(40)]
        runs[precision] = before, losses, (np.asarray(prog.predict(x)).argmax(1) == y).mean(), prog
    assert runs["bf16-mixed"][3]._c.node_dtypes()[0] == "float32"
    np.testing.assert_allclose(runs["bf16-mixed"][0], runs["32-true"][0], rtol=0.05, atol=0.02)
    assert runs["32-true"][2] > 0.85 and runs["bf16-mixed"][2] >= runs["32-true"][2] - 0.03
    assert abs(np.mean(runs["bf16-mixed"][1][-5:]) - np.mean(runs["32-true"][1][-5:])) < 0.05
    assert compiled("bf16-mixed")[1]._c.node_dtypes()[0] == "bfloat16"


@needs_bf16
def test_copies_of_a_float32_product_stay_float32_so_they_compare_equal():
    """x @ x^T of an input read in float32 (it is read by a transpose too) is a float32 product: its slices,
    concatenations and rolls were rounded to bfloat16, so a comparison of it with its own row max or with an exact
    copy found them unequal everywhere (0 ones per row); autocast and float32 find one per row."""
    class Copies(nn.Module):
        def __init__(self):
            super().__init__()
            self.s = nn.Parameter(ft.ones(1))

        def forward(self, x):
            h = x @ x.transpose(1, 2)
            top = (h == h.amax(-1, keepdim=True)).float()
            same = (h.roll(1, 2).roll(-1, 2) == h).float()
            return ft.cat([top, same], 2) * self.s

    x = np.random.default_rng(8).standard_normal((2, 4, 4)).astype(np.float32)
    model = Copies()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.0), lambda out: out.mean(), batch_size=2,
                            input_shape=(4, 4), precision="bf16-mixed")
    out = program.predict(x).numpy()
    np.testing.assert_array_equal(out[..., :4].sum(-1), 1)
    assert out[..., 4:].all()


@needs_bf16
@pytest.mark.parametrize("shape", [(8, 4, 5, 5, 6), (8, 4, 5, 1, 60), (8, 16, 3, 5, 6), (8, 4, 16, 5, 6)])
def test_bfloat16_data_gradient_of_a_channels_last_1x1_convolution(shape):
    """oneDNN's bfloat16 1x1 backward-data kernel gave errors of the gradient's own size for channels-last planes of
    channels that are no multiple of 16 (5 output channels over 5 x 6 pixels): within bfloat16's rounding of the
    float64 product now."""
    N, C, CO, H, W = shape
    rng = np.random.default_rng(7)
    w = rng.standard_normal((CO, C, 1, 1)).astype(np.float32)
    dout = rng.standard_normal((N, CO, H, W)).astype(np.float32)
    want = np.einsum("nohw,oc->nchw", bf16_round(dout).astype(np.float64), bf16_round(w)[:, :, 0, 0])

    def last(a):
        return ft.tensor(a).bfloat16().contiguous(memory_format=ft.channels_last)
    dinp = ft.empty(N, C, H, W, dtype=ft.bfloat16).contiguous(memory_format=ft.channels_last)
    ft._C.conv2d_backward(dinp, None, None, last(dout), last(np.zeros((N, C, H, W), np.float32)),
                          ft.tensor(w).bfloat16())
    np.testing.assert_allclose(dinp.float().numpy(), want, rtol=2 ** -7, atol=2 ** -7 * np.abs(want).max())


@needs_bf16
def test_layers_without_bfloat16_fall_back_to_float32():
    """NLLLoss reads float32 log-probabilities: the LogSoftmax it reads writes float32, the linear layer before
    it stays bfloat16, and the model trains."""
    def make():
        return nn.Sequential(*list(conv_net()), nn.LogSoftmax(1))
    model, prog = compiled("bf16-mixed", make=make, loss=nn.NLLLoss())
    by_kind = {type(e.module).__name__: d for e, d in zip(prog.entries, prog._c.node_dtypes())}
    assert by_kind["LogSoftmax"] == "float32" and by_kind["Linear"] == by_kind["Conv2d"] == "bfloat16"
    x, y = data()
    losses = [prog.train_step(x, y) for _ in range(10)]
    assert np.isfinite(losses).all() and losses[-1] < losses[0]


@needs_bf16
def test_embeddings_in_bfloat16():
    def make():
        return nn.Sequential(nn.Embedding(20, 8), nn.Flatten(), nn.Linear(48, 16), nn.ReLU(), nn.Linear(16, 5))
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 20, (32, 6)), rng.integers(0, 5, 32)
    prog = gradients_follow_float32(x, y, make=make, input_shape=(6,), input_dtype=ft.int64,
                                    memory_format="contiguous")
    assert set(prog._c.node_dtypes()[1:prog.output + 1]) == {"bfloat16"}


@needs_bf16
def test_group_norm_and_upsampling_in_bfloat16():
    def make():
        return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.GroupNorm(2, 8), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Upsample(scale_factor=2), nn.Upsample(size=(13, 11), mode="bilinear"),
                             nn.ConvTranspose2d(8, 8, 3, stride=2, padding=1, output_padding=1),
                             nn.Conv2d(8, 4, 3, padding=1), nn.AdaptiveAvgPool2d(1),
                             nn.Flatten(), nn.Linear(4, 5))
    prog = gradients_follow_float32(*data(), make=make)
    assert set(prog._c.node_dtypes()[:prog.output + 1]) == {"bfloat16"}


@needs_bf16
def test_broadcasts_and_sums_over_dimensions_in_bfloat16():
    """Squeeze-and-excitation gates and sums over channels (expand and sum_dims nodes) read and write bfloat16."""
    import test_zoo as zoo
    x, y = data()
    prog = gradients_follow_float32(x, y % 4, make=zoo.SENet)  # four classes
    dtypes = prog._c.node_dtypes()[:prog.output + 1]
    assert dtypes.count("float32") == 1 and set(dtypes) == {"bfloat16", "float32"}, dtypes  # the constant 1.0


@needs_bf16
def test_transformer_layers_in_bfloat16():
    """An encoder layer (attention, LayerNorm, GELU MLP) runs every node in bfloat16; gradients follow
    float32's."""
    def make():
        return nn.Sequential(nn.Flatten(2), nn.Linear(144, 32),
                             nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, activation="gelu", batch_first=True,
                                                        norm_first=True),
                             nn.LayerNorm(32), nn.Flatten(), nn.Linear(96, 5))
    prog = gradients_follow_float32(*data(), make=make)
    kinds = {}
    for e, d in zip(prog.entries[1:prog.output + 1], prog._c.node_dtypes()[1:prog.output + 1]):
        kinds.setdefault(type(e.module).__name__, set()).add(d)
    assert {"Attention", "LayerNorm", "Linear", "GELU"} <= set(kinds), kinds
    assert set().union(*kinds.values()) == {"bfloat16"}, kinds


def test_unknown_and_unavailable_precisions_are_refused():
    with pytest.raises(ValueError, match="precision must be one of '32-true', 'bf16-mixed', '16-mixed' \\(or "
                                         "Lightning's short forms '32', 32, 'bf16', '16', 16\\), got 'fp8'"):
        compiled("fp8")
    for bad in (["bf16-mixed"], None, True, 64, b"32", "bf16-true"):
        with pytest.raises(ValueError, match=f"precision must be one of .*got {re.escape(repr(bad))}"):
            compiled(bad)
    for short in (16, "16", "16-mixed"):
        with pytest.raises(ValueError, match="'16-mixed' computes in float16, which fasttrain runs on CUDA only"):
            compiled(short)
    for short, name in ((32, "32-true"), ("32", "32-true"), ("bf16", "bf16-mixed" if ft.backends.cpu_has_bf16()
                                                                  else "32-true")):
        assert compiled(short)[1].precision == name  # Lightning's short forms, shown by their names


def test_float16_is_refused_on_the_cpu():
    """The CPU has no float16 arithmetic: ops refuse float16 tensors with a pointer to bfloat16 (on CUDA they take
    them, tests/test_cuda_precision.py)."""
    x = ft.randn(2, 3).to(ft.float16)
    with pytest.raises(TypeError, match="relu: inp is float16, which fasttrain computes in on CUDA only"):
        ft.nn.functional.relu(x)
    with pytest.raises(TypeError, match="linear: input is float16.*use bfloat16"):
        ft.nn.functional.linear(x, ft.randn(4, 3).to(ft.float16))


CAPPED = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper() in ("SSE41", "AVX", "AVX2", "AVX512_CORE")


def test_cpu_capability_reads_the_cpu_flags():
    with open("/proc/cpuinfo") as f:
        flags = set(next(line for line in f if line.startswith("flags")).split(":", 1)[1].split())
    want = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    assert list(backends.cpu_capability()) == want
    assert backends.cpu_has_bf16() == ("avx512_bf16" in flags and not CAPPED)


def test_without_bf16_instructions_it_runs_as_float32(monkeypatch):
    monkeypatch.setattr(backends, "cpu_has_bf16", lambda: False)
    with pytest.warns(RuntimeWarning, match="AVX512-BF16"):
        _, prog = compiled("bf16-mixed")
    assert prog.precision == "32-true" and set(prog._c.node_dtypes()) <= {"float32", "int64"}
    x, y = data()
    assert np.isfinite(prog.train_step(x, y))


@pytest.mark.skipif(CAPPED, reason="already the capped run")
def test_capped_below_avx512_bf16_the_float_paths_run():
    """ONEDNN_MAX_CPU_ISA=AVX512_CORE caps fasttrain's own kernels as it caps oneDNN's, so that this machine runs
    what a CPU without AVX512-BF16 runs: in a process with the cap, cpu_has_bf16() is False, bf16-mixed warns and
    trains as float32, and bfloat16 attention takes its float path (this file's tests of those, run again)."""
    env = dict(os.environ, ONEDNN_MAX_CPU_ISA="AVX512_CORE")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k",
                           "cpu_capability or attention_bfloat16 or bf16_mixed_warns_when_capped"],
                          env=env, capture_output=True, text=True, timeout=600, cwd=os.path.dirname(__file__))
    assert done.returncode == 0 and " passed" in done.stdout, done.stdout[-3000:] + done.stderr[-2000:]


@pytest.mark.skipif(not CAPPED, reason="runs in the capped process of the test above")
def test_bf16_mixed_warns_when_capped():
    with pytest.warns(RuntimeWarning, match="ONEDNN_MAX_CPU_ISA"):
        _, prog = compiled("bf16-mixed")
    assert prog.precision == "32-true"
    x, y = data()
    assert np.isfinite(prog.train_step(x, y))


_AVX2_PRODUCTS = """
import numpy as np, fasttrain as ft
F = ft.nn.functional
rng = np.random.default_rng(0)
def bf(*shape):
    return ft.tensor(rng.standard_normal(shape).astype(np.float32)).bfloat16()
x, w, b = bf(5, 7), bf(3, 7), bf(3)
i, k, kt = bf(2, 3, 6, 6), bf(4, 3, 3, 3), bf(3, 4, 3, 3)
for got, want in ((F.linear(x, w, b), F.linear(x.float(), w.float(), b.float())),
                  (F.conv2d(i, k, padding=1), F.conv2d(i.float(), k.float(), padding=1)),
                  (F.conv_transpose2d(i, kt, stride=2), F.conv_transpose2d(i.float(), kt.float(), stride=2))):
    assert got.dtype == ft.bfloat16 and np.array_equal(got.float().numpy(), want.bfloat16().float().numpy())
with ft.autocast():
    assert ft.nn.Linear(7, 3)(x.float()).dtype == ft.bfloat16
print("ok")
"""


def test_eager_bfloat16_products_are_float32_rounded_where_onednn_has_none():
    """A CPU without AVX-512 (a process capped to AVX2 here) has no oneDNN bfloat16 inner products or convolutions:
    eager F.linear, F.conv2d and F.conv_transpose2d of bfloat16 tensors, and ft.autocast code calling them, multiply
    as float32 and round the result once (they raised oneDNN's "no implementation")."""
    env = dict(os.environ, ONEDNN_MAX_CPU_ISA="AVX2")
    done = subprocess.run([sys.executable, "-c", _AVX2_PRODUCTS], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stdout[-2000:] + done.stderr[-3000:]


# ---------------------------------------------------------------- the ops' bfloat16 paths against float32

def test_batch_norm_bfloat16_matches_float32_of_the_rounded_input():
    rng = np.random.default_rng(0)
    x = bf16_round(rng.standard_normal((4, 6, 5, 5)) * 3 + 1)
    w, b = rng.standard_normal(6).astype(np.float32), rng.standard_normal(6).astype(np.float32)
    outs = []
    for dtype in ("float32", "bfloat16"):
        rm, rv = ft.zeros(6), ft.ones(6)
        out = F.batch_norm(ft.tensor(x).to(dtype), rm, rv, ft.tensor(w), ft.tensor(b), training=True)
        assert out.dtype.name == dtype
        outs.append((np.asarray(out.to("float32")), np.array(rm), np.array(rv)))
    np.testing.assert_allclose(outs[1][0], outs[0][0], rtol=2 ** -8, atol=2 ** -8 * 4)
    np.testing.assert_array_equal(outs[1][1], outs[0][1])  # statistics in float32 from the same values
    np.testing.assert_array_equal(outs[1][2], outs[0][2])


def test_layer_norm_bfloat16_matches_float32_of_the_rounded_input():
    rng = np.random.default_rng(2)
    x = bf16_round(rng.standard_normal((6, 40)) * 2 + 3)
    w, b = rng.standard_normal(40).astype(np.float32), rng.standard_normal(40).astype(np.float32)
    ref = np.asarray(F.layer_norm(ft.tensor(x), (40,), ft.tensor(w), ft.tensor(b)))
    out = F.layer_norm(ft.tensor(x).to("bfloat16"), (40,), ft.tensor(w), ft.tensor(b))
    assert out.dtype is ft.bfloat16
    np.testing.assert_array_equal(np.asarray(out.to("float32")), bf16_round(ref))  # computed in float, rounded once


@pytest.mark.parametrize("shape,causal", [((2, 3, 70, 70, 16), False), ((2, 3, 70, 70, 16), True),
                                          ((1, 2, 130, 200, 33), True), ((3, 1, 1, 7, 1), False)], ids=str)
def test_attention_bfloat16_follows_float32_of_the_rounded_inputs(shape, causal):
    """With AVX512-BF16 the products run in bfloat16 pairs with float32 sums (P and dS rounded to bfloat16, as
    PyTorch's bfloat16 attention): out and the gradients within 2^-6 of each one's largest float32 magnitude,
    the log-sum-exp (from float32 sums of exact products) within 1e-6 (relative and absolute); without, computed in float32 and
    rounded once."""
    N, H, Tq, Tk, D = shape
    rng = np.random.default_rng(3)
    q, dout = (bf16_round(rng.standard_normal((N, H, Tq, D))) for _ in range(2))
    k, v = (bf16_round(rng.standard_normal((N, H, Tk, D))) for _ in range(2))
    res = []
    for dtype in ("float32", "bfloat16"):
        tq, tk, tv, tdout = (ft.tensor(a).to(dtype) for a in (q, k, v, dout))
        out, lse = ft.ops.sdpa_forward(None, None, tq, tk, tv, causal=causal)
        grads = ft.ops.sdpa_backward(None, None, None, tdout, tq, tk, tv, out, lse, causal=causal)
        assert {x.dtype.name for x in (out, *grads)} == {dtype} and lse.dtype is ft.float32
        res.append([np.asarray(x.to("float32")) for x in (out, lse, *grads)])
    (out, lse, *grads), (out16, lse16, *grads16) = res
    if not backends.cpu_has_bf16():
        np.testing.assert_array_equal(out16, bf16_round(out))
        return
    np.testing.assert_allclose(lse16, lse, rtol=1e-6, atol=1e-6)
    for name, ref, got in zip(("out", "dq", "dk", "dv"), (out, *grads), (out16, *grads16)):
        np.testing.assert_allclose(got, ref, rtol=0, atol=2 ** -6 * np.abs(ref).max(), err_msg=name)
    assert not np.array_equal(out16, bf16_round(out))  # the bfloat16 products ran


def test_group_norm_bfloat16_matches_float32_of_the_rounded_input():
    rng = np.random.default_rng(4)
    x = bf16_round(rng.standard_normal((3, 6, 5, 5)) * 2 + 1)
    w, b = rng.standard_normal(6).astype(np.float32), rng.standard_normal(6).astype(np.float32)
    ref = np.asarray(F.group_norm(ft.tensor(x), 3, ft.tensor(w), ft.tensor(b)))
    out = F.group_norm(ft.tensor(x).to("bfloat16"), 3, ft.tensor(w), ft.tensor(b))
    assert out.dtype is ft.bfloat16
    np.testing.assert_array_equal(np.asarray(out.to("float32")), bf16_round(ref))
    # an empty batch still writes its (zero) parameter gradients
    empty = ft.zeros(0, 6, 5, 5).to("bfloat16")
    y, m, r = ft.ops.group_norm_forward(None, None, None, empty, ft.tensor(w), ft.tensor(b), 3)
    _, dw, db = ft.ops.group_norm_backward(None, ft.full((6,), 7.0), ft.full((6,), 7.0), y, empty, m, r,
                                           ft.tensor(w), 3)
    assert y.shape == (0, 6, 5, 5) and not np.asarray(dw).any() and not np.asarray(db).any()


def test_upsample_bfloat16_copies_exactly():
    x = bf16_round(np.random.default_rng(5).standard_normal((2, 3, 4, 5)))
    out = F.interpolate(ft.tensor(x).to("bfloat16"), scale_factor=2, mode="nearest")
    assert out.dtype is ft.bfloat16
    np.testing.assert_array_equal(np.asarray(out.to("float32")), x.repeat(2, axis=2).repeat(2, axis=3))


@pytest.mark.parametrize("pool", ["max", "avg", "adaptive_max", "adaptive_avg"])
def test_pools_bfloat16_match_float32_of_the_rounded_input(pool):
    x = bf16_round(np.random.default_rng(1).standard_normal((3, 4, 9, 9)))
    run = {"max": lambda t: F.max_pool2d(t, 3, 2), "avg": lambda t: F.avg_pool2d(t, 3, 2),
           "adaptive_max": lambda t: F.adaptive_max_pool2d(t, 2),
           "adaptive_avg": lambda t: F.adaptive_avg_pool2d(t, 2)}[pool]
    ref = np.asarray(run(ft.tensor(x)))
    out = run(ft.tensor(x).to("bfloat16"))
    assert out.dtype is ft.bfloat16
    np.testing.assert_array_equal(np.asarray(out.to("float32")), bf16_round(ref))  # one rounding of the result



@pytest.mark.parametrize("kernel,stride", [(2, 2), (3, 2)])
@pytest.mark.parametrize("accumulate", [False, True])
def test_channels_last_max_pool_runs_on_bfloat16_as_float32_rounded_once(kernel, stride, accumulate):
    """The channels-last max pool reads and writes bfloat16 in place: its output and indices are float32's; its
    backward adds every window's share (overlapping windows: several into one input) in float before one
    rounding, into zeros or (accumulate) into what dinp held."""
    rng = np.random.default_rng(2)
    x, start = (bf16_round(rng.standard_normal((3, 70, 9, 9))) for _ in range(2))
    last = lambda a, dtype: ft.tensor(np.ascontiguousarray(a.transpose(0, 2, 3, 1))).to(dtype).permute(0, 3, 1, 2)  # noqa: E731
    y, ind = ft.ops.max_pool2d_forward(None, None, last(x, "float32"), kernel, stride)
    y16, ind16 = ft.ops.max_pool2d_forward(None, None, last(x, "bfloat16"), kernel, stride)
    assert y16.dtype is ft.bfloat16 and y16.stride()[1] == 1
    np.testing.assert_array_equal(np.asarray(y16.to("float32")), np.asarray(y))
    np.testing.assert_array_equal(np.asarray(ind16), np.asarray(ind))
    dy = bf16_round(rng.standard_normal(y.shape))
    dx = last(start if accumulate else np.zeros(x.shape), "float32")
    ft.ops.max_pool2d_backward(dx, last(dy, "float32"), ind, accumulate=accumulate)
    dx16 = last(start if accumulate else np.full(x.shape, 7.0), "bfloat16")
    ft.ops.max_pool2d_backward(dx16, last(dy, "bfloat16"), ind, accumulate=accumulate)
    np.testing.assert_array_equal(np.asarray(dx16.to("float32")), bf16_round(np.asarray(dx)))

# ---------------------------------------------------------------- bfloat16 inference copies

def test_bfloat16_inference_copy(tmp_path):
    model, prog = compiled("32-true")
    x, y = data()
    prog.train_step(x, y)
    full, half = tmp_path / "full.safetensors", tmp_path / "half.safetensors"
    ft.save(full, prog)
    ft.save(half, prog, dtype="bf16")
    tensors, meta = ft.load(half)
    for k, v in weights(model).items():
        want = bf16_round(v) if v.dtype == np.float32 else v
        np.testing.assert_array_equal(tensors[k], want, err_msg=k)
    assert not any(k.startswith("optimizer") for k in tensors) and "optimizer.class" not in meta
    weights_only = sum(v.nbytes for v in weights(model).values())
    assert half.stat().st_size < 0.6 * weights_only + 4096 < full.stat().st_size
    import json
    raw = half.read_bytes()
    header = json.loads(raw[8:8 + int.from_bytes(raw[:8], "little")])
    assert header["0.weight"]["dtype"] == "BF16" and header["1.num_batches_tracked"]["dtype"] == "I64"
    fresh = conv_net()
    ft.load(half, fresh)  # widened exactly into a float32 model
    np.testing.assert_array_equal(np.asarray(fresh[0].weight), bf16_round(np.asarray(model[0].weight)))


def test_float16_inference_copy(tmp_path):
    """dtype="float16" (or "fp16", "half"): float32 values rounded to nearest even as NumPy rounds, stored as F16,
    read back as float16 by ft.load (as safetensors.numpy reads them), widened exactly into a float32 model; a
    value beyond float16's range is refused, naming the tensor."""
    model, prog = compiled("32-true")
    prog.train_step(*data())
    ft.save(tmp_path / "half.safetensors", prog, dtype="fp16")
    tensors, meta = ft.load(tmp_path / "half.safetensors")
    for k, v in weights(model).items():
        want = v.astype(np.float16) if v.dtype == np.float32 else v
        np.testing.assert_array_equal(tensors[k], want, err_msg=k)
        assert tensors[k].dtype == want.dtype and tensors[k].flags.writeable
    import json
    raw = (tmp_path / "half.safetensors").read_bytes()
    assert json.loads(raw[8:8 + int.from_bytes(raw[:8], "little")])["0.weight"]["dtype"] == "F16"
    fresh = conv_net()
    ft.load(tmp_path / "half.safetensors", fresh)
    np.testing.assert_array_equal(np.asarray(fresh[0].weight),
                                  np.asarray(model[0].weight).astype(np.float16).astype(np.float32))
    with ft.no_grad():
        model[0].weight[0, 0, 0, 0] = -70000.0
    with pytest.raises(ValueError, match=r"0.weight holds values of magnitude up to 70000, beyond float16's largest"):
        ft.save(tmp_path / "big.safetensors", model, dtype=ft.float16)
    assert not (tmp_path / "big.safetensors").exists()


def test_bfloat16_inference_copy_refuses_training_state(tmp_path):
    model, prog = compiled("32-true")
    with pytest.raises(ValueError, match="a bfloat16 inference copy holds the model only"):
        ft.save(tmp_path / "a.safetensors", model, optimizer=prog.optimizer, dtype="bfloat16")
    with pytest.raises(ValueError, match="a float16 inference copy holds the model only"):
        ft.save(tmp_path / "a.safetensors", model, scheduler=object(), dtype="half")
    with pytest.raises(ValueError, match="dtype must be 'bfloat16' or 'float16'"):
        ft.save(tmp_path / "a.safetensors", model, dtype="int8")
    assert not list(tmp_path.iterdir())


def test_inference_copies_read_in_torch(tmp_path):
    torch = pytest.importorskip("torch")
    st = pytest.importorskip("safetensors.torch")
    model = conv_net()
    ft.save(tmp_path / "bf16.safetensors", model, dtype="bf16")
    ft.save(tmp_path / "fp16.safetensors", model, dtype="fp16")
    loaded = st.load_file(str(tmp_path / "bf16.safetensors"))
    assert loaded["0.weight"].dtype == torch.bfloat16
    np.testing.assert_array_equal(loaded["0.weight"].float().numpy(), bf16_round(np.asarray(model[0].weight)))
    loaded = st.load_file(str(tmp_path / "fp16.safetensors"))
    assert loaded["0.weight"].dtype == torch.float16
    np.testing.assert_array_equal(loaded["0.weight"].numpy(), np.asarray(model[0].weight).astype(np.float16))


# ---------------------------------------------------------------- ft.autocast for eager ops

def test_autocast_runs_products_in_bfloat16_and_nests():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 10 * 10, 5))
    x = ft.tensor(data(4)[0])
    ref = np.asarray(model(x))
    with ft.autocast():
        out = model(x)
        assert out.dtype is ft.bfloat16
        with ft.autocast(enabled=False):
            assert model(x).dtype is ft.float32
        assert F.linear(x.flatten(1), ft.randn(5, 432)).dtype is ft.bfloat16
        a, b = ft.randn(4, 6), ft.randn(6, 3)
        for product in (a @ b, ft.mm(a, b), ft.bmm(a[None], b[None]), ft.einsum("ij,jk->ik", a, b),
                        a @ b.to(ft.bfloat16)):  # torch.autocast's products of either dtype
            assert product.dtype is ft.bfloat16
            np.testing.assert_array_equal(np.asarray(product.float()).reshape(4, 3),
                                          bf16_round(bf16_round(a.numpy()) @ bf16_round(b.numpy())))
        v = ft.randn(6)  # what torch.autocast leaves alone: mv, dot, einsums that contract nothing
        for kept in (ft.mv(b.T, v), ft.dot(v, v), ft.einsum("ij->ji", a), ft.einsum("ij,ij->ij", a, a)):
            assert kept.dtype is ft.float32
        assert ft.einsum("ij,jk", a, b).dtype is ft.bfloat16
    assert model(x).dtype is ft.float32 and (a @ b).dtype is ft.float32
    np.testing.assert_allclose(np.asarray(out.to("float32")), ref, rtol=0.03, atol=0.03)

    @ft.autocast()
    def predict(t):
        return model(t)
    assert predict(x).dtype is ft.bfloat16
    y = ft.tensor(np.arange(4) % 5)
    with ft.autocast():  # the losses of bfloat16 logits in float32, as torch.autocast's
        loss = F.cross_entropy(model(x), y)
        assert loss.dtype is ft.float32 and F.mse_loss(out, out * 0).dtype is ft.float32
        assert loss.item() == F.cross_entropy(model(x).float(), y).item()
    assert F.cross_entropy(out, y).dtype is ft.bfloat16  # outside autocast, the inputs' dtype


class AuxHead(nn.Module):
    """A model returning (logits, auxiliary logits), the auxiliary head computed before or after the main one."""

    def __init__(self, aux_first):
        super().__init__()
        self.aux_first, self.stem, self.fc = aux_first, nn.Conv2d(3, 8, 3, padding=1), nn.Linear(8, 5)
        self.aux, self.aux_fc = nn.Conv2d(8, 8, 3, padding=1), nn.Linear(8, 5)

    def forward(self, x):
        h = F.relu(self.stem(x))
        aux = self.aux_fc(F.relu(self.aux(h)).mean((2, 3))) if self.aux_first else None
        logits = self.fc(h.mean((2, 3)))
        return logits, aux if aux is not None else self.aux_fc(F.relu(self.aux(h)).mean((2, 3)))


@pytest.mark.parametrize("aux_first", [True, False])
def test_an_auxiliary_heads_products_run_in_bfloat16_too(aux_first):
    """Every output's nodes are the model's (deep supervision, an auxiliary classifier): their products run in
    bfloat16, in whichever order forward computes them (after the first output they counted as the loss's: the
    auxiliary convolutions, and the stem they read, ran in float32), and the FLOPs count them."""
    ft.manual_seed(3)
    model = AuxHead(aux_first)
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1),
                            lambda out, y: F.cross_entropy(out[0], y) + 0.4 * F.cross_entropy(out[1], y),
                            batch_size=4, input_shape=(3, 8, 8), precision="bf16-mixed")
    if program.precision != "bf16-mixed":
        pytest.skip("no AVX512-BF16 on this CPU")
    dtypes = {type(e.module).__name__: set() for e in program.entries}
    for e, d in zip(program.entries, program._c.node_dtypes()):
        dtypes[type(e.module).__name__].add(d)
    assert dtypes["Conv2d"] == dtypes["Linear"] == {"bfloat16"}, dtypes
    assert program.flops_per_sample() > 2 * (8 * 27 * 64 + 8 * 72 * 64)  # both convolutions' multiply-adds
    x, y = data(4)
    assert np.isfinite(program.train_step(x[:, :, :8, :8], y))


def _linear_dtypes(model, loss):
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), loss, batch_size=4, input_shape=(8,),
                            precision="bf16-mixed")
    if program.precision != "bf16-mixed":
        pytest.skip("no AVX512-BF16 on this CPU")
    return [d for e, d in zip(program.entries, program._c.node_dtypes()) if type(e.module).__name__ == "Linear"]


def test_a_float32_node_moves_the_products_feeding_it_to_float32():
    """NLL reading the last linear layer directly (a node of float32 only): it and the products before it run in
    float32, up to a node that converts as it runs (a layer norm)."""
    def loss(out, y):
        return F.nll_loss(out, y)

    assert _linear_dtypes(nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3)), loss) == ["float32", "float32"]
    assert _linear_dtypes(nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8), nn.Linear(8, 3)), loss) == \
        ["bfloat16", "float32"]


def test_a_mean_of_the_outputs_in_the_loss_keeps_the_products_bfloat16():
    """A plain mean or sum of the logits in the loss (a regularizer, a hand-written MSE) reads bfloat16 and sums in
    float64: the layers stay bfloat16, and the loss and gradients are the float32 program's within bf16 rounding."""
    def loss(out, y):
        return F.cross_entropy(out, y) + 0.1 * out.mean() + 0.01 * (out ** 2).sum()

    def net():
        ft.manual_seed(3)
        return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))

    assert _linear_dtypes(net(), loss) == ["bfloat16", "bfloat16"]
    x, y = np.random.default_rng(0).normal(size=(4, 8)).astype(np.float32), np.array([0, 1, 2, 1])
    got = {}
    for precision in ("32-true", "bf16-mixed"):
        model = net()
        program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), loss, batch_size=4, input_shape=(8,),
                                precision=precision)
        got[precision] = program.backward(x, y), model[0].weight.grad.numpy().copy()
    (l32, g32), (l16, g16) = got["32-true"], got["bf16-mixed"]
    assert abs(l16 - l32) <= 2e-2 * abs(l32)
    np.testing.assert_allclose(g16, g32, rtol=0.05, atol=0.02 * np.abs(g32).max())


def test_a_sum_inside_the_model_writes_bfloat16():
    """A sum between two layers stays in the activations' dtype, as summary() shows it."""
    class Summed(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.out = nn.Linear(8, 30), nn.Linear(3, 2)

        def forward(self, x):
            return self.out(self.fc(x).view(x.size(0), 3, 10).sum(2))

    model = Summed()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.MSELoss(), batch_size=4, input_shape=(8,),
                            precision="bf16-mixed")
    if program.precision != "bf16-mixed":
        pytest.skip("no AVX512-BF16 on this CPU")
    dtypes = {type(e.module).__name__: d for e, d in zip(program.entries, program._c.node_dtypes())}
    assert dtypes["SumDims"] == "bfloat16" and "bfloat16" in program.summary()


def test_subnormal_values_are_zero_to_bfloat16_products():
    """AVX512-BF16's conversions and dot products treat subnormal float32 inputs as zero: a bf16-mixed identity
    layer gives 0 for 1e-40 and 1e-39, where float32 keeps them."""
    x = np.array([[1e-40, 1e-39], [1.0, 2.0]], np.float32)
    got = {}
    for precision in ("32-true", "bf16-mixed"):
        model = nn.Linear(2, 2)
        model.load_state_dict({"weight": np.eye(2, dtype=np.float32), "bias": np.zeros(2, np.float32)})
        program = model.compile(ft.optim.SGD(model.parameters(), lr=0.0), nn.MSELoss(), batch_size=2,
                                input_shape=(2,), precision=precision)
        got[program.precision] = program.predict(x).numpy()
    np.testing.assert_array_equal(got["32-true"], x)
    if "bf16-mixed" in got:
        np.testing.assert_array_equal(got["bf16-mixed"], [[0, 0], [1, 2]])


def test_autocast_matches_explicit_bfloat16_operands():
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((6, 32)).astype(np.float32), rng.standard_normal((8, 32)).astype(np.float32)
    want = F.linear(ft.tensor(x).to("bfloat16"), ft.tensor(w).to("bfloat16"))
    with ft.autocast(dtype=ft.bfloat16):
        got = F.linear(ft.tensor(x), ft.tensor(w))
    np.testing.assert_array_equal(np.asarray(got.to("float32")), np.asarray(want.to("float32")))


def test_autocast_bad_arguments():
    with pytest.raises(ValueError, match="dtype must be bfloat16 on cpu"):
        ft.autocast(dtype=ft.float16)
    with pytest.raises(ValueError, match="dtype must be bfloat16 or float16 on cuda"):
        ft.autocast("cuda", dtype=ft.float32)
    with pytest.raises(ValueError, match="device_type must be 'cpu' or 'cuda'"):
        ft.autocast("tpu")
    for enabled in ("no", 1, None):  # as torch.autocast: bool("no") would turn it on
        with pytest.raises(TypeError, match="enabled must be a bool"):
            ft.autocast(enabled=enabled)


def test_autocast_takes_devices_and_the_arguments_pytorch_code_passes():
    """ft.autocast(x.device), ft.device("cpu") and "cpu:0" stand for their type (a device object turned nothing on),
    cache_enabled is taken, a disabled block's dtype is not checked, and torch dtypes read as theirs (ft.save's
    and .to's too)."""
    x, w = ft.randn(2, 3), ft.randn(4, 3)
    for device in (x.device, ft.device("cpu"), "cpu:0", "cpu"):
        with ft.autocast(device, cache_enabled=False):
            assert F.linear(x, w).dtype == ft.bfloat16, device
    with ft.autocast(dtype=ft.float16, enabled=False):
        assert F.linear(x, w).dtype == ft.float32
    if torch is not None:
        with ft.autocast(dtype=torch.bfloat16):
            assert F.linear(x, w).dtype == ft.bfloat16
        assert x.to(torch.bfloat16).dtype == ft.bfloat16 and ft.zeros(2, dtype=torch.int64).dtype == ft.int64


def test_one_autocast_object_serves_blocks_in_several_threads():
    """Each thread's blocks nest on their own: a block's exit restores what its own entry found, whatever the
    other threads' blocks of the same object do meanwhile."""
    import threading
    shared, x, w = ft.autocast(), ft.randn(4, 8), ft.randn(3, 8)
    start, errors, dtypes = threading.Barrier(4), [], []

    def worker():
        try:
            start.wait()
            for _ in range(200):
                with shared:
                    dtypes.append(F.linear(x, w).dtype)
            dtypes.append(F.linear(x, w).dtype)  # off again after the last block
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)
    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert dtypes.count(ft.bfloat16) == 800 and dtypes.count(ft.float32) == 4
    assert F.linear(x, w).dtype is ft.float32


def test_autocast_acts_on_its_device_type_only():
    """As torch.autocast: a "cuda" block leaves CPU products in float32, and blocks for both device types
    combine (the inner block's device is added to the outer's, not swapped for it)."""
    x, w = ft.randn(4, 8), ft.randn(3, 8)
    with ft.autocast("cuda"):
        assert F.linear(x, w).dtype is ft.float32
        with ft.autocast("cpu"):
            assert F.linear(x, w).dtype is ft.bfloat16
            with ft.autocast("cpu", enabled=False):
                assert F.linear(x, w).dtype is ft.float32
        assert F.linear(x, w).dtype is ft.float32


@pytest.mark.parametrize("memory_format", ["channels_last", "contiguous"])
@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_batches_of_either_layout_and_dtype_train_the_same_bits(memory_format, precision):
    """A batch converts to the program's dtype and layout as it is copied in: NCHW or NHWC, float32 or (for
    bf16-mixed) bfloat16, float16 and float64 values that round to the same bfloat16 give one result."""
    if precision == "bf16-mixed" and not backends.cpu_has_bf16():
        pytest.skip("bf16-mixed runs 32-true without AVX512-BF16")
    x, y = data()
    if precision == "bf16-mixed":  # values a bfloat16 holds exactly, so that every dtype carries the same ones
        x = bf16_round(x)
    dtypes = ["float32", "float64"] + (["bfloat16", "float16"] if precision == "bf16-mixed" else [])
    results = {}
    for dtype in dtypes:
        for layout in ("nchw", "nhwc"):
            t = ft.tensor(x).to(dtype)
            if layout == "nhwc":
                t = t.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)
            model, prog = compiled(precision, memory_format=memory_format)
            losses = [prog.train_step(t, y) for _ in range(2)]
            results[dtype, layout] = losses, weights(model)
    (first, (losses0, w0)), rest = next(iter(results.items())), list(results.items())[1:]
    for key, (losses, w) in rest:
        assert losses == losses0, (key, first)
        for k in w0:
            np.testing.assert_array_equal(w[k], w0[k], err_msg=f"{k}: {key} against {first}")
