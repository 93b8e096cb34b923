"""Compiled training programs on CUDA against the same programs on the CPU: losses, gradients, parameters and
batch-norm statistics after several steps of each optimizer (clipping, micro-batches, dropout, both memory
formats), an MLP with LayerNorm, GELU and MSE, predict/evaluate, bitwise repeatable steps in deterministic
mode, device inputs, steady memory, checkpoints that move between devices, and ft.fit.

The API is PyTorch's: model.to("cuda") moves the parameters and buffers (the same Tensor objects); an
optimizer built and a program compiled afterwards run on the device, with the flat parameter and gradient
buffers there; train_step, backward, predict and evaluate take host (NumPy) or device batches."""
import numpy as np
import pytest

import fasttrain as ft
from _cudaref import assert_close, host, mixed_devices, rng
from _cudaref import full_fp32  # noqa: F401 (an autouse fixture)

pytestmark = pytest.mark.cuda
nn = ft.nn
CLASSES = 5


def resnet(seed, width=6, dropout=0.2):
    """conv -> BN -> ReLU -> (+ conv) -> ReLU -> maxpool -> conv -> ReLU -> global avg pool -> dropout -> linear."""
    ft.manual_seed(seed)
    x = nn.Input((3, 16, 16))
    h1 = nn.ReLU()(nn.BatchNorm2d(width)(nn.Conv2d(3, width, 3, padding=1)(x)))
    s = nn.ReLU()(h1 + nn.Conv2d(width, width, 3, padding=1)(h1))
    h3 = nn.ReLU()(nn.Conv2d(width, 2 * width, 3, padding=1)(nn.MaxPool2d(2)(s)))
    out = nn.Linear(2 * width, CLASSES)(nn.Dropout(dropout)(nn.Flatten()(nn.AdaptiveAvgPool2d(1)(h3))))
    return nn.Model(x, out)


def mlp(seed):
    ft.manual_seed(seed)
    return nn.Sequential(nn.Linear(20, 64), nn.LayerNorm(64), nn.GELU(), nn.Dropout(0.1), nn.Linear(64, 48),
                         nn.SiLU(), nn.Linear(48, 3))


OPTIMIZERS = {
    "sgd": lambda p: ft.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4),
    "adamw": lambda p: ft.optim.AdamW(p, lr=1e-2),
    "lamb": lambda p: ft.optim.LAMB(p, lr=1e-2),
    "lars": lambda p: ft.optim.LARS(p, lr=0.5, weight_decay=1e-4),
}


def compiled(model, device, opt="sgd", loss=None, batch_size=16, input_shape=None, **kw):
    assert model.to(device) is model
    optimizer = OPTIMIZERS[opt](model.parameters())
    loss = loss or nn.CrossEntropyLoss(label_smoothing=0.1)
    kwargs = dict(batch_size=batch_size, seed=1234, **kw)
    if input_shape is not None:
        kwargs["input_shape"] = input_shape
    return model.compile(optimizer, loss, **kwargs)


def batch(n, seed, shape=(3, 16, 16), classes=CLASSES):
    r = rng(seed)
    return r.standard_normal((n, *shape)).astype(np.float32), r.integers(0, classes, n).astype(np.int64)


def state_of(model):
    """{name: float64 array} of every parameter and buffer, read from any device."""
    named = list(model.named_parameters()) + list(model.named_buffers())
    return {k: host(t).astype(np.float64) for k, t in named}


def assert_models_close(got, want, rtol=1e-4):
    g, w = state_of(got), state_of(want)
    assert g.keys() == w.keys()
    for name in w:
        scale = max(np.abs(w[name]).max(initial=0.0), 1e-3)
        err = np.abs(g[name] - w[name]).max(initial=0.0)
        assert err <= rtol * scale, f"{name}: max difference {err:.3g} for values up to {scale:.3g}"


def assert_losses_close(got, want, rtol=1e-4):
    np.testing.assert_allclose(got, want, rtol=rtol, atol=1e-6)


@pytest.mark.parametrize("memory_format", ["channels_last", "contiguous"])
@pytest.mark.parametrize("opt", list(OPTIMIZERS))
def test_train_steps_match_cpu(opt, memory_format):
    mc, mg = resnet(0), resnet(0)
    pc = compiled(mc, "cpu", opt, memory_format=memory_format, clip_grad_norm=2.0 if opt != "sgd" else None)
    pg = compiled(mg, "cuda", opt, memory_format=memory_format, clip_grad_norm=2.0 if opt != "sgd" else None)
    assert all(p.is_cuda and p.grad.is_cuda for p in mg.parameters())
    assert all(b.is_cuda for b in mg.buffers())
    losses_c, losses_g = [], []
    for step in range(4):
        x, y = batch(16, seed=10 + step)
        losses_c.append(pc.train_step(x, y))
        losses_g.append(pg.train_step(x, y))
    assert all(isinstance(v, float) for v in losses_g)
    assert_losses_close(losses_g, losses_c)
    assert_models_close(mg, mc)


def test_micro_batches_match_cpu():
    mc, mg = resnet(1), resnet(1)
    pc = compiled(mc, "cpu", "sgd", batch_size=16, accumulate_steps=2)
    pg = compiled(mg, "cuda", "sgd", batch_size=16, accumulate_steps=2)
    for step in range(3):
        x, y = batch(16, seed=20 + step)
        assert_losses_close([pg.train_step(x, y)], [pc.train_step(x, y)])
    assert_models_close(mg, mc)


def test_backward_gradients_match_cpu():
    mc, mg = resnet(2, width=16), resnet(2, width=16)
    pc, pg = compiled(mc, "cpu", batch_size=32), compiled(mg, "cuda", batch_size=32)
    x, y = batch(32, seed=30)
    assert_losses_close([pg.backward(x, y)], [pc.backward(x, y)], 1e-5)
    for (name, p_g), (_, p_c) in zip(mg.named_parameters(), mc.named_parameters()):
        assert p_g.grad.is_cuda
        assert_close(p_g.grad, p_c.grad, 1e-4, 1e-4)
    # the conv bias that batch norm cancels is dropped: zero gradient
    assert np.abs(host(dict(mg.named_parameters())["conv2d.bias"].grad)).max() <= 1e-6


def test_mse_mlp_with_layer_norm_and_dropout_matches_cpu():
    mc, mg = mlp(3), mlp(3)
    kw = dict(opt="adamw", loss=nn.MSELoss(), batch_size=24, input_shape=(20,), clip_grad_norm=1.0)
    pc, pg = compiled(mc, "cpu", **kw), compiled(mg, "cuda", **kw)
    r = rng(40)
    losses_c, losses_g = [], []
    for _ in range(4):
        x, y = r.standard_normal((24, 20)).astype(np.float32), r.standard_normal((24, 3)).astype(np.float32)
        losses_c.append(pc.train_step(x, y))
        losses_g.append(pg.train_step(x, y))
    assert_losses_close(losses_g, losses_c)
    # AdamW divides by sqrt(v): a gradient's relative difference between the devices (reduction order) passes
    # whole into its update, where SGD's would be scaled by lr
    assert_models_close(mg, mc, rtol=5e-4)
    xe = r.standard_normal((24, 20)).astype(np.float32)
    assert_close(pg.predict(xe), pc.predict(xe), 1e-4, 1e-4)


def test_predict_and_evaluate_match_cpu():
    mc, mg = resnet(4), resnet(4)
    pc, pg = compiled(mc, "cpu"), compiled(mg, "cuda")
    for step in range(2):
        x, y = batch(16, seed=50 + step)
        pc.train_step(x, y)
        pg.train_step(x, y)
    x, y = batch(16, seed=59)
    logits = pg.predict(x)
    assert logits.is_cuda and logits.shape == (16, CLASSES)
    assert_close(logits, pc.predict(x), 1e-4, 1e-4)
    (lg, ag), (lc, ac) = pg.evaluate(x, y), pc.evaluate(x, y)
    assert abs(lg - lc) <= 1e-4 * abs(lc) and ag == ac
    assert "Conv2d" in pg.summary()


def test_deterministic_steps_are_bitwise_repeatable(ft_deterministic):
    runs = []
    for _ in range(2):
        m = resnet(5, width=16)
        p = compiled(m, "cuda", "adamw", batch_size=32, clip_grad_norm=1.0)
        losses = [p.train_step(*batch(32, seed=60 + s)) for s in range(3)]
        runs.append((losses, {k: v.tobytes() for k, v in state_of(m).items()}))
    assert runs[0][0] == runs[1][0]
    assert runs[0][1] == runs[1][1]


def test_device_batches_equal_host_batches(ft_deterministic):
    ma, mb = resnet(6), resnet(6)
    pa, pb = compiled(ma, "cuda"), compiled(mb, "cuda")
    for step in range(2):
        x, y = batch(16, seed=70 + step)
        la = pa.train_step(x, y)
        lb = pb.train_step(ft.from_numpy(x).to("cuda"), ft.from_numpy(y).to("cuda"))
        assert la == lb
    assert {k: v.tobytes() for k, v in state_of(ma).items()} == {k: v.tobytes() for k, v in state_of(mb).items()}


def test_memory_is_steady_across_steps():
    m = resnet(7, width=16)
    p = compiled(m, "cuda", "adamw", batch_size=32)
    for step in range(2):
        p.train_step(*batch(32, seed=80 + step))
    ft.cuda.synchronize()
    before = ft.memory_stats("cuda:0")["allocated_bytes"]
    for step in range(4):
        p.train_step(*batch(32, seed=90 + step))
    ft.cuda.synchronize()
    assert ft.memory_stats("cuda:0")["allocated_bytes"] == before


def test_state_dict_and_checkpoints_move_between_devices(tmp_path):
    mg, mc = resnet(8), resnet(9)  # different initial values: the checkpoint must overwrite them
    pg, pc = compiled(mg, "cuda", "adamw"), compiled(mc, "cpu", "adamw")
    for step in range(2):
        pg.train_step(*batch(16, seed=100 + step))
    sd = mg.state_dict()
    assert all(isinstance(v, np.ndarray) for v in sd.values())
    for name, value in state_of(mg).items():
        np.testing.assert_array_equal(np.asarray(sd[name], np.float64), value)
    path = tmp_path / "cuda.safetensors"
    ft.save(str(path), pg)
    ft.load(str(path), pc)
    assert_models_close(mc, mg, 0)
    for step in range(2):
        x, y = batch(16, seed=110 + step)
        assert_losses_close([pg.train_step(x, y)], [pc.train_step(x, y)])
    assert_models_close(mg, mc)


def test_fit_matches_cpu():
    mc, mg = resnet(10), resnet(10)
    pc, pg = compiled(mc, "cpu"), compiled(mg, "cuda")
    batches = [batch(16, seed=120 + s) for s in range(4)]
    hc = ft.fit(pc, batches, epochs=2, progress=False, val_loader=batches[:1])
    hg = ft.fit(pg, batches, epochs=2, progress=False, val_loader=batches[:1])
    assert_losses_close(hg["train_loss"], hc["train_loss"])
    assert_losses_close(hg["val_loss"], hc["val_loss"])
    assert_models_close(mg, mc)


def test_a_model_on_two_devices_is_refused():
    m = mlp(11)
    m[0].to("cuda")
    assert m[0].weight.is_cuda and not m[4].weight.is_cuda
    mixed_devices(lambda: m.compile(ft.optim.SGD(m.parameters(), lr=0.1), nn.MSELoss(), batch_size=4,
                                    input_shape=(20,)))
    m.cuda()
    assert all(p.is_cuda for p in m.parameters())
    m.cpu()
    assert not any(p.is_cuda for p in m.parameters())


@pytest.mark.parametrize("name", ["audio_cnn", "tiny_segnet", "token_cnn", "vit_tiny", "gpt_block", "sequence_mlp",
                                  "se_net", "norm_by_hand"])
def test_traced_zoo_models_match_cpu(name):
    """The zoo of traced models (1-d convolutions, group norm, upsampling, embeddings, attention, broadcasting,
    sums over dimensions, custom and next-token losses) on CUDA against the CPU: the loss and every gradient of one
    backward."""
    import test_zoo as zoo
    cls, shape, loss, fmt = zoo.ZOO[name]
    x, y = zoo.data(name)
    results = []
    for device in ("cpu", "cuda"):
        ft.manual_seed(0)
        model = cls().to(device)
        program = model.compile(ft.optim.SGD(model.parameters(), lr=0.05), loss, batch_size=8, input_shape=shape,
                                memory_format=fmt, input_dtype=ft.int64 if name in zoo.TOKENS else None)
        loss_value = program.backward(x, y)
        results.append((loss_value, {n: p.grad for n, p in model.named_parameters()}))
    assert_losses_close([results[1][0]], [results[0][0]])
    for n, g in results[0][1].items():
        assert_close(results[1][1][n], g, 1e-4, 1e-4)


def test_a_compiled_lstm_matches_cpu():
    """Whole LSTM layers (ft_lstm_forward / backward over the ops' CUDA kernels), both directions, an encoder's
    final states as a decoder's initial ones: the loss and every gradient of one backward against the CPU."""
    from test_rnn import encoder_decoder
    ids, y = np.random.default_rng(21).integers(0, 9, (5, 7)), np.array([2, 0, 1, 1, 0])
    results = []
    for device in ("cpu", "cuda"):
        ft.manual_seed(0)
        model = encoder_decoder(ft, bidirectional=True).to(device)
        program = model.compile(ft.optim.SGD(model.parameters(), lr=0.05), batch_size=5, input_shape=(7,),
                                input_dtype=ft.int64)
        results.append((program.backward(ids, y), {n: p.grad for n, p in model.named_parameters()}))
    assert_losses_close([results[1][0]], [results[0][0]])
    for n, g in results[0][1].items():
        assert_close(results[1][1][n], g, 1e-4, 1e-4)


def test_several_inputs_match_cpu():
    """A forward of token ids and a bool key mask (one on the host, one on the device) and of two image inputs:
    the loss and every gradient of one backward against the CPU."""
    from test_multi_input import Pair, Encoder, tokens
    ids, y = tokens(n=6)
    r = rng(22)
    a, b = r.standard_normal((6, 3, 6, 6)).astype(np.float32), r.standard_normal((6, 1, 6, 6)).astype(np.float32)
    for make, shape, dtype, x in [(lambda: Encoder("bool"), ((10,), (10,)), (ft.int64, ft.bool), (ids, ids == 0)),
                                  (Pair, ((3, 6, 6), (1, 6, 6)), None, (a, b))]:
        results = []
        for device in ("cpu", "cuda"):
            ft.manual_seed(0)
            model = make().to(device)
            program = model.compile(ft.optim.SGD(model.parameters(), lr=0.05), batch_size=6, input_shape=shape,
                                    input_dtype=dtype)
            xs = x if device == "cpu" else (x[0], ft.from_numpy(x[1]).to("cuda"))
            results.append((program.backward(xs, y), {n: p.grad for n, p in model.named_parameters()}))
        assert_losses_close([results[1][0]], [results[0][0]])
        for n, g in results[0][1].items():
            assert_close(results[1][1][n], g, 1e-4, 1e-4)


def test_a_masked_mean_matches_cpu():
    """(loss * mask).sum() / mask.sum() of a mask input over two micro-batches: the count's first pass over the
    batch on the device, the loss and every gradient against the CPU."""
    from test_losses import T, input_masked, sequences, tagger
    ids, y, keep = sequences(seed=3)
    results = []
    for device in ("cpu", "cuda"):
        ft.manual_seed(0)
        model = tagger().to(device)
        program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), input_masked, batch_size=8,
                                input_shape=((T,), (T,)), input_dtype=(ft.int64, ft.bool), target_shape=(T,),
                                target_dtype=ft.int64, accumulate_steps=2)
        results.append((program.backward((ids, keep), y), {n: p.grad for n, p in model.named_parameters()}))
    assert_losses_close([results[1][0]], [results[0][0]])
    for n, g in results[0][1].items():
        assert_close(results[1][1][n], g, 1e-4, 1e-4)


def test_a_per_pixel_loss_matches_cpu():
    """A per-pixel loss over 32x32 images, each sample's sum over 3,072 values (a block of threads per sample on
    the device): the loss and every gradient against the CPU, and the same loss bit for bit in a second pass."""
    x = rng(40).standard_normal((8, 3, 32, 32)).astype(np.float32)
    y = rng(41).standard_normal((8, 3, 32, 32)).astype(np.float32)
    results = []
    for device in ("cpu", "cuda"):
        ft.manual_seed(0)
        model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 3, 3, padding=1)).to(device)
        program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), lambda out, t: ((out - t) ** 2).mean(),
                                batch_size=8, input_shape=(3, 32, 32), target_shape=(3, 32, 32),
                                target_dtype=ft.float32)
        loss = program.backward(x, y)
        assert program.backward(x, y) == loss
        results.append((loss, {n: p.grad for n, p in model.named_parameters()}))
    assert_losses_close([results[1][0]], [results[0][0]], 1e-5)
    for n, g in results[0][1].items():
        assert_close(results[1][1][n], g, 1e-4, 1e-4)


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_gan_programs_alternate_as_on_the_cpu(precision):
    """Two programs that read each other's modules (the generator's step compiled first, so it follows the
    discriminator into the discriminator's program at its next call): the alternating losses against the CPU's."""
    from test_gan import batches, nets, programs
    runs = []
    for device in ("cpu", "cuda"):
        G, D = nets(batch_norm=True)
        G.to(device), D.to(device)
        pd, pg = programs(G, D, g_first=True, precision=precision)
        runs.append([(pd.train_step((real, z1), None), pg.train_step(z2, None)) for real, z1, z2 in batches(4)])
    assert_losses_close(runs[1], runs[0], rtol=1e-4 if precision == "32-true" else 3e-2)


def test_a_forward_branching_on_training_predicts_its_eval_graph_as_on_the_cpu():
    """timm's drop path (a branch on self.training): training steps as on the CPU, predict of the second,
    eval-mode program equal to the CPU's and deterministic."""
    from test_trace import Residual
    x, y = rng(3).standard_normal((16, 6)).astype(np.float32), rng(4).integers(0, 2, 16)
    runs = []
    for device in ("cpu", "cuda"):
        ft.manual_seed(1)
        model = Residual().to(device)
        program = model.compile(ft.optim.AdamW(model.parameters(), lr=1e-2), nn.CrossEntropyLoss(), batch_size=16,
                                input_shape=(6,))
        program.train_step(x, y)
        runs.append((program.evaluate(x, y)[0], host(program.predict(x)), host(program.predict(x))))
    assert_losses_close([runs[1][0]], [runs[0][0]])
    assert_close(runs[1][1], runs[0][1], 1e-4, 1e-4)
    np.testing.assert_array_equal(runs[1][1], runs[1][2])


@pytest.mark.parametrize("kind", ["max", "attention pooling", "where", "broadcast", "self-attention", "causal | pad"])
def test_a_padding_mask_of_the_ids_matches_cpu(kind):
    """masked_fill and ft.where with each sample's mask (ids == 0), -inf fills included: the loss and every
    gradient against the CPU."""
    from test_trace import PaddedPool
    ids = rng(5).integers(0, 12, (5, 6))
    ids[:, 0] = 1  # no sequence all padding
    y = np.arange(5) % 3
    runs = []
    for device in ("cpu", "cuda"):
        ft.manual_seed(3)
        model = PaddedPool(kind).to(device)
        program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=5, input_shape=(6,),
                                input_dtype=ft.int64)
        runs.append((program.backward(ids, y), {n: p.grad for n, p in model.named_parameters()}))
    assert_losses_close([runs[1][0]], [runs[0][0]])
    for n, g in runs[0][1].items():
        assert_close(runs[1][1][n], g, 1e-4, 1e-4)


def test_nccl_over_one_rank_equals_no_nccl(tmp_path):
    """The NCCL path of a distributed CUDA program (compile(distributed=True) on "cuda"), over a world of one
    MPI rank: the same losses and weights as the program without it."""
    import shutil
    import test_distributed
    if not (shutil.which("mpirun") and ft.distributed.is_available()):
        pytest.skip("needs MPI (openmpi-bin, libopenmpi-dev) and a build with its backend")
    done = test_distributed.mpirun("nccl", tmp_path / "x", ranks=1)
    assert done.returncode == 0 and "world of one equals no NCCL" in done.stdout, done.stdout[-3000:]
