"""A forward of several inputs, as PyTorch models take them (forward(x, z), Hugging Face's forward(input_ids,
attention_mask)): compile(input_shape=(shape, shape, ...), input_dtype=(...)) and batches (x1, ..., y)."""
import numpy as np
import pytest

import fasttrain as ft
from fasttrain import nn
from fasttrain.nn import functional as F

RNG = np.random.default_rng(7)
X = RNG.standard_normal((48, 4)).astype(np.float32)
Z = RNG.standard_normal((48, 3)).astype(np.float32)
Y = (X[:, 0] + Z[:, 1] > 0).astype(np.int64)


class Two(nn.Module):
    """Two feature inputs, each through its own layer (one bias: two would train as one twice as fast):
    relu(a(x) + b(z)) -> head."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.head = nn.Linear(4, 8), nn.Linear(3, 8, bias=False), nn.Linear(8, 2)

    def forward(self, x, z):
        return self.head(F.relu(self.a(x) + self.b(z)))


def two(seed=0, **options):
    ft.manual_seed(seed)
    m = Two()
    return m, m.compile(ft.optim.SGD(m.parameters(), lr=0.1, momentum=0.9), batch_size=16,
                        input_shape=((4,), (3,)), **options)


def concatenated(m):
    """The same function of one input, [x, z]: a's and b's weights side by side."""
    one = nn.Sequential(nn.Linear(7, 8), nn.ReLU(), nn.Linear(8, 2))
    with ft.no_grad():
        one[0].weight.copy_(ft.tensor(np.concatenate([m.a.weight.numpy(), m.b.weight.numpy()], 1)))
        one[0].bias.copy_(m.a.bias)
        one[2].weight.copy_(m.head.weight)
        one[2].bias.copy_(m.head.bias)
    return one, one.compile(ft.optim.SGD(one.parameters(), lr=0.1, momentum=0.9), batch_size=16, input_shape=(7,))


def test_two_inputs_train_as_the_same_function_of_one_concatenated_input():
    m, p = two()
    one, q = concatenated(m)
    for s in range(0, 48, 16):
        loss = p.train_step((X[s:s + 16], Z[s:s + 16]), Y[s:s + 16])
        ref = q.train_step(np.concatenate([X[s:s + 16], Z[s:s + 16]], 1), Y[s:s + 16])
        assert loss == pytest.approx(ref, rel=1e-5)
    np.testing.assert_allclose(np.concatenate([m.a.weight.numpy(), m.b.weight.numpy()], 1), one[0].weight.numpy(),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(m.head.weight.numpy(), one[2].weight.numpy(), rtol=1e-5, atol=1e-6)
    out = p.predict((X, Z)).numpy()
    np.testing.assert_allclose(out, q.predict(np.concatenate([X, Z], 1)).numpy(), rtol=1e-5, atol=1e-6)
    m.eval()
    np.testing.assert_allclose(out, m(ft.tensor(X), ft.tensor(Z)).numpy(), rtol=1e-6, atol=1e-6)  # eager


def test_gradients_of_each_input_branch_match_central_differences():
    ft.manual_seed(0)
    assert ft.testing.gradcheck(Two(), (X[:16].astype(np.float64), Z[:16]), Y[:16], atol=2e-4)
    ids, y = tokens(n=8)
    ft.manual_seed(0)  # the keys masked where the ids were padded, but no id the padding row (no gradient by design)
    assert ft.testing.gradcheck(Encoder("bool"), (np.maximum(ids, 1), ids == 0), y, atol=2e-4)


def test_predict_evaluate_and_one_sample():
    m, p = two()
    batch = p.predict((X[:5], Z[:5])).numpy()
    assert batch.shape == (5, 2)
    np.testing.assert_array_equal(p.predict((X[3], Z[3])).numpy(), batch[3])
    loss, acc = p.evaluate((X, Z), Y)
    assert loss == pytest.approx(ft.evaluate(p, ((X, Z), Y))[0], rel=1e-6)
    assert acc == np.mean(p.predict((X, Z)).numpy().argmax(1) == Y)
    with pytest.raises(ValueError, match=r"one sample of shape \(4,\) and \(3,\) or a batch of shape \(N, 4\) and "
                                         r"\(N, 3\), got \(2, 5\) and \(2, 3\)"):
        p.predict((np.zeros((2, 5), np.float32), Z[:2]))


def test_fit_takes_arrays_and_batches_in_either_form_and_shuffles_as_for_one_input():
    """fit over (X, Z, y) arrays visits the samples in the order fit over one input's (XZ, y) arrays does (both
    Loaders seeded from the global seed), so the two programs train alike; ((X, Z), y) is the same data."""
    m, p = two()
    one, q = concatenated(m)
    ft.manual_seed(3)
    h = ft.fit(p, (X, Z, Y), epochs=2, batch_size=8, progress=False)
    ft.manual_seed(3)
    g = ft.fit(q, (np.concatenate([X, Z], 1), Y), epochs=2, batch_size=8, progress=False)
    np.testing.assert_allclose(h["train_loss"], g["train_loss"], rtol=1e-5)
    assert h["train_accuracy"] == g["train_accuracy"]
    m2, p2 = two()
    ft.manual_seed(3)
    h2 = ft.fit(p2, ((X, Z), Y), epochs=2, batch_size=8, progress=False)
    assert h2["train_loss"] == h["train_loss"]
    m3, p3 = two()
    batches = [(X[s:s + 8], Z[s:s + 8], Y[s:s + 8]) if s % 16 else ((X[s:s + 8], Z[s:s + 8]), Y[s:s + 8])
               for s in range(0, 48, 8)]
    assert len(ft.fit(p3, batches, epochs=1, progress=False, val_loader=batches)["val_loss"]) == 1


class Encoder(nn.Module):
    """Token ids through attention whose padded keys are masked: the mask derived from the ids in forward, given
    as a bool input, or as Hugging Face's int64 attention_mask (1: attend), compared with 0 or negated as bool."""

    def __init__(self, mask="derived"):
        super().__init__()
        self.mask = mask
        self.emb = nn.Embedding(50, 16, padding_idx=0)
        self.att = nn.MultiheadAttention(16, 2, batch_first=True)
        self.head = nn.Linear(16, 3)

    def forward(self, input_ids, attention_mask=None):
        pad = input_ids == 0 if attention_mask is None else attention_mask if self.mask == "bool" \
            else ~attention_mask.bool() if self.mask == "hf_bool" else attention_mask == 0
        h = self.emb(input_ids)
        a, _ = self.att(h, h, h, key_padding_mask=pad, need_weights=False)
        return self.head(a.mean(1))


def tokens(n=24, t=10, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, 50, (n, t))
    for r in range(n):
        ids[r, rng.integers(3, t):] = 0
    return ids, rng.integers(0, 3, n)


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_a_mask_input_trains_bit_for_bit_as_the_mask_derived_in_forward(precision):
    ids, y = tokens()
    runs = {}
    for mask, shape, dtype, x in [("derived", (10,), ft.int64, ids),
                                  ("bool", ((10,), (10,)), (ft.int64, ft.bool), (ids, ids == 0)),
                                  ("hf", ((10,), (10,)), ft.int64, (ids, (ids != 0).astype(np.int64))),
                                  ("hf_bool", ((10,), (10,)), ft.int64, (ids, (ids != 0).astype(np.int64)))]:
        ft.manual_seed(0)
        m = Encoder(mask)
        with pytest.warns(RuntimeWarning) if precision == "bf16-mixed" and not ft.backends.cpu_has_bf16() else \
                _nothing():
            p = m.compile(ft.optim.Adam(m.parameters(), lr=1e-2), batch_size=12, input_shape=shape,
                          input_dtype=dtype, precision=precision)
        losses = [p.train_step(x, y) for _ in range(3)]
        runs[mask] = losses, m.att.in_proj_weight.numpy().copy()
    for mask in ("bool", "hf", "hf_bool"):
        assert runs[mask][0] == runs["derived"][0]
        np.testing.assert_array_equal(runs[mask][1], runs["derived"][1])


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class Pair(nn.Module):
    """Two image inputs of different channels, summed after their convolutions (a two-stream net)."""

    def __init__(self):
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(1, 4, 3, padding=1)
        self.bn, self.fc = nn.BatchNorm2d(4), nn.Linear(4, 2)

    def forward(self, rgb, depth):
        h = F.relu(self.bn(self.c1(rgb) + self.c2(depth)))
        return self.fc(F.adaptive_avg_pool2d(h, 1).flatten(1))


def test_image_inputs_in_either_memory_format_and_as_eager():
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((8, 3, 6, 6)).astype(np.float32), rng.standard_normal((8, 1, 6, 6)).astype(np.float32)
    y = rng.integers(0, 2, 8)
    outs = []
    for fmt in ("channels_last", "contiguous"):
        ft.manual_seed(0)
        m = Pair()
        p = m.compile(ft.optim.SGD(m.parameters(), lr=0.1), batch_size=8, input_shape=((3, 6, 6), (1, 6, 6)),
                      memory_format=fmt)
        losses = [p.train_step((a, b), y) for _ in range(2)]
        outs.append((losses, p.predict((a, b)).numpy()))
        m.eval()
        np.testing.assert_allclose(outs[-1][1], m(ft.tensor(a), ft.tensor(b)).numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(outs[0][0], outs[1][0], rtol=1e-5)


def test_an_input_forward_ignores_is_still_an_input():
    class Ignores(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def forward(self, x, unused):
            return self.fc(x)

    ft.manual_seed(0)
    m = Ignores()
    p = m.compile(ft.optim.SGD(m.parameters(), lr=0.1), batch_size=4, input_shape=((4,), (9,)))
    assert p.input_shape == ((4,), (9,))
    assert p.train_step((X[:4], np.zeros((4, 9), np.float32)), Y[:4]) > 0
    with pytest.raises(ValueError, match=r"input 1 should be a batch of samples of shape \(9,\)"):
        p.train_step((X[:4], np.zeros((4, 3), np.float32)), Y[:4])


def weights(m):
    return [t.numpy().copy() for t in m.parameters()]


def test_bad_batches_are_refused_and_change_nothing():
    m, p = two()
    before = weights(m)
    with pytest.raises(TypeError, match="forward takes 2 inputs: give x as a tuple of as many batches, got ndarray"):
        p.train_step(X[:16], Y[:16])
    with pytest.raises(TypeError, match="got a tuple of 3"):
        p.train_step((X[:16], Z[:16], Z[:16]), Y[:16])
    with pytest.raises(ValueError, match="input 1 has 15 samples, input 0 16"):
        p.train_step((X[:16], Z[:15]), Y[:16])
    with pytest.raises(ValueError, match=r"input 1 should be a batch of samples of shape \(3,\)"):
        p.train_step((X[:16], X[:16]), Y[:16])
    with pytest.raises(TypeError, match=r"a fasttrain Loader's batches are \(x, y\)"):
        ft.fit(p, ft.data.Loader((X, Y), 16), progress=False)
    with pytest.raises(TypeError, match=r"epoch 1, step 2: a batch must be \(x1, ..., x2, y\)"):
        ft.fit(p, [(X[:16], Z[:16], Y[:16]), (X[:16], Z[:16], Y[:16], Y[:16])], progress=False)
    after_one_step = weights(m)
    assert any(not np.array_equal(u, v) for u, v in zip(before, after_one_step))  # the first step ran
    with pytest.raises(ValueError, match="test-time flipping needs one input, of images"):
        ft.evaluate(p, ((X, Z), Y), tta_flip=True)
    for u, v in zip(after_one_step, weights(m)):
        np.testing.assert_array_equal(u, v)


def test_a_mask_input_must_be_bool_and_ids_in_range_in_any_input():
    ids, y = tokens(n=12)
    ft.manual_seed(0)
    m = Encoder("bool")
    p = m.compile(ft.optim.SGD(m.parameters(), lr=0.1), batch_size=12, input_shape=((10,), (10,)),
                  input_dtype=(ft.int64, ft.bool))
    before = weights(m)
    with pytest.raises(TypeError, match="masks must be bool, got float32"):
        p.train_step((ids, (ids == 0).astype(np.float32)), y)
    bad = ids.copy()
    bad[3, 1] = 50
    with pytest.raises(IndexError, match="50"):
        p.train_step((bad, ids == 0), y)
    for u, v in zip(before, weights(m)):
        np.testing.assert_array_equal(u, v)


def test_compile_says_what_the_input_shapes_and_dtypes_must_be():
    m = Two()
    sgd = ft.optim.SGD(m.parameters(), lr=0.1)
    with pytest.raises(ft.nn.TracingError, match=r"Two.forward takes z besides the 1 input\(s\) compile was given "
                                                 r"shapes of: give input_shape=\(shape of each input"):
        m.compile(sgd, batch_size=4, input_shape=(4,))
    with pytest.raises(ft.nn.TracingError, match=r"given 3 input shapes, but Two.forward takes 2 input\(s\)"):
        m.compile(sgd, batch_size=4, input_shape=((4,), (3,), (3,)))
    with pytest.raises(ValueError, match="input_dtype gives 3 dtypes for 2 input shapes"):
        m.compile(sgd, batch_size=4, input_shape=((4,), (3,)), input_dtype=("float32",) * 3)
    with pytest.raises(TypeError, match="input_dtype must be float32, int64 .token ids. or bool .masks., got float16"):
        m.compile(sgd, batch_size=4, input_shape=((4,), (3,)), input_dtype=("float32", "float16"))
    assert "input" in str(m.summary(((4,), (3,))))


V, S, T, D = 12, 7, 6, 16


def seq2seq(lib, norm_first=False, dropout=0.0, activation="relu"):
    """Source and target token ids (with learned positions) through nn.Transformer with PyTorch's masks: causal
    over the target, padding (id 0) over the source's keys in both attentions and over the target's, then a
    projection to the vocabulary. lib is fasttrain.nn or torch.nn."""
    class Seq2Seq(lib.Module):
        def __init__(self):
            super().__init__()
            self.src_emb, self.tgt_emb = lib.Embedding(V, D, padding_idx=0), lib.Embedding(V, D, padding_idx=0)
            self.src_pos, self.tgt_pos = lib.Parameter(self.src_emb.weight[:S] * 1), \
                lib.Parameter(self.tgt_emb.weight[:T] * 1)  # N(0, 1), as the embeddings' rows
            self.tf = lib.Transformer(D, 2, 2, 2, 32, dropout=dropout, batch_first=True, norm_first=norm_first,
                                      activation=activation)
            self.out = lib.Linear(D, V)

        def forward(self, src, tgt):
            causal = self.tf.generate_square_subsequent_mask(tgt.shape[1])
            h = self.tf(self.src_emb(src) + self.src_pos, self.tgt_emb(tgt) + self.tgt_pos, tgt_mask=causal,
                        src_key_padding_mask=src == 0, memory_key_padding_mask=src == 0,
                        tgt_key_padding_mask=tgt == 0)
            return self.out(h)

    return Seq2Seq()


def pairs(n=8, seed=0):
    rng = np.random.default_rng(seed)
    src, tgt = rng.integers(1, V, (n, S)), rng.integers(1, V, (n, T))
    for r in range(n):
        src[r, rng.integers(2, S + 1):] = 0
        tgt[r, rng.integers(2, T + 1):] = 0
    return src, tgt, rng.integers(1, V, (n, T))


def sequence_loss(out, y):
    return F.cross_entropy(out.transpose(1, 2), y)


def compiled_seq2seq(norm_first=False, dropout=0.0, n=8):
    ft.manual_seed(0)
    m = seq2seq(nn, norm_first, dropout)
    return m, m.compile(ft.optim.SGD(m.parameters(), lr=0.1), sequence_loss, batch_size=n,
                        input_shape=((S,), (T,)), input_dtype=ft.int64)


@pytest.mark.parametrize("norm_first", [False, True])
def test_a_transformer_seq2seq_matches_pytorch(norm_first):
    torch = pytest.importorskip("torch")
    m, p = compiled_seq2seq(norm_first)
    ref = seq2seq(torch.nn, norm_first)
    ref.load_state_dict({k: torch.tensor(np.asarray(v)) for k, v in m.state_dict().items()})  # PyTorch's names
    src, tgt, y = pairs()
    loss = p.backward((src, tgt), y)
    expected = sequence_loss_torch = torch.nn.functional.cross_entropy(
        ref(torch.tensor(src), torch.tensor(tgt)).transpose(1, 2), torch.tensor(y))
    sequence_loss_torch.backward()
    assert loss == pytest.approx(expected.item(), rel=1e-5)
    grads = dict(ref.named_parameters())
    for name, t in m.named_parameters():
        np.testing.assert_allclose(t.grad.numpy(), grads[name].grad.numpy(), rtol=1e-4, atol=2e-6, err_msg=name)
    m.eval()
    ref.eval()
    with torch.no_grad():
        out = ref(torch.tensor(src), torch.tensor(tgt)).numpy()
    np.testing.assert_allclose(p.predict((src, tgt)).numpy(), out, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(m(ft.tensor(src), ft.tensor(tgt)).numpy(), out, rtol=1e-4, atol=1e-5)  # eager


def test_a_transformer_seq2seq_gradients_match_central_differences():
    ft.manual_seed(0)
    src, tgt, y = pairs(n=4)
    m = seq2seq(nn, activation="gelu")  # smooth: no ReLU kink within eps of a sample
    m.src_emb.padding_idx = m.tgt_emb.padding_idx = None  # the padding rows' gradients too (0 by design otherwise)
    assert ft.testing.gradcheck(m, (src, tgt), y, sequence_loss, eps=1e-2, rtol=2e-2, count=6)


def test_a_transformer_learns_to_copy_its_source():
    """With PyTorch's default dropout (0.1, in every place), teacher forcing: the target is the source, fed
    shifted right after a start token (1); trained, the next-token accuracy (in eval mode) is far above chance."""
    rng = np.random.default_rng(3)
    src = rng.integers(2, V, (1024, S - 1))
    src = np.concatenate([src, np.zeros((1024, 1), np.int64)], 1)  # a padded position at the end
    tgt_in = np.concatenate([np.ones((1024, 1), np.int64), src[:, :T - 1]], 1)
    y = src[:, :T]
    m, p = compiled_seq2seq(dropout=0.1, n=32)
    p.optimizer = ft.optim.Adam(m.parameters(), lr=3e-3)
    p = m.compile(p.optimizer, sequence_loss, batch_size=32, input_shape=((S,), (T,)), input_dtype=ft.int64)
    ft.fit(p, (src, tgt_in, y), epochs=8, progress=False)
    accuracy = np.mean(p.predict((src, tgt_in)).numpy().argmax(-1) == y)
    assert accuracy > 0.9, accuracy  # chance: 1 / 10


def test_fit_on_input_arrays_goes_on_from_epoch_to_epoch_and_from_a_stop():
    """fit(1) twice is fit(2) (the next epoch's order, not the first's again), and a fit a step callback stopped
    goes on with the step after it, as over one input's arrays."""
    histories, losses = [], []
    for calls in ([2], [1, 1]):
        m, p = two()
        ft.manual_seed(5)
        h = [ft.fit(p, (X, Z, Y), epochs=n, batch_size=8, progress=False) for n in calls]
        histories.append([e for g in h for e in g["epoch"]])
        losses.append([v for g in h for v in g["train_loss"]])
    assert histories == [[1, 2], [1, 2]] and losses[0] == losses[1]
    steps = []
    for stop in (None, 2):
        m, p = two()
        ft.manual_seed(5)
        seen = []

        def record(step, metrics):
            seen.append(metrics["loss"])
            return step == stop

        ft.fit(p, (X, Z, Y), epochs=1, batch_size=8, progress=False, step_callbacks=[record])
        if stop:
            ft.fit(p, (X, Z, Y), epochs=1, batch_size=8, progress=False, step_callbacks=[record])
        steps.append(seen)
    assert len(steps[0]) == 6 and steps[1] == steps[0]


def test_what_cannot_feed_several_inputs_is_refused_before_training():
    m, p = two()
    before = weights(m)
    with pytest.raises(TypeError, match=r"a fasttrain Loader's batches are \(x, y\)"):
        ft.fit(p, (X, Z, Y), val_loader=ft.data.Loader((X, Y), 16), progress=False)
    images = (RNG.random((48, 4)) * 255).astype(np.uint8)
    with pytest.raises(TypeError, match=r"uint8 arrays for a float input are images .* \(x / 255\)"):
        ft.fit(p, (images, Z, Y), progress=False)
    for u, v in zip(before, weights(m)):
        np.testing.assert_array_equal(u, v)


def test_a_bad_id_in_a_later_micro_batch_leaves_the_gradients():
    """backward adds into .grad as PyTorch's does: an id out of range in the second micro-batch is refused before
    the first one's gradients are added."""
    ids, y = tokens(n=12)
    ft.manual_seed(0)
    m = Encoder("bool")
    p = m.compile(ft.optim.SGD(m.parameters(), lr=0.1), batch_size=12, input_shape=((10,), (10,)),
                  input_dtype=(ft.int64, ft.bool), accumulate_steps=2)
    p.backward((ids, ids == 0), y)
    grads = [t.grad.numpy().copy() for t in m.parameters()]
    bad = ids.copy()
    bad[9, 0] = 50
    with pytest.raises(IndexError, match=r"\[9, 0\]"):
        p.backward((bad, ids == 0), y)
    for g, t in zip(grads, m.parameters()):
        np.testing.assert_array_equal(g, t.grad.numpy())


def functional_two(seed=0):
    """Two's graph as an nn.Model of two nn.Inputs (Keras's functional form)."""
    ft.manual_seed(seed)
    x, z = nn.Input((4,)), nn.Input((3,))
    a, b, head = nn.Linear(4, 8), nn.Linear(3, 8, bias=False), nn.Linear(8, 2)
    return nn.Model([x, z], head(nn.ReLU()(a(x) + b(z))))


def test_an_nn_model_of_two_inputs_trains_as_the_module_of_two():
    """nn.Model([x, z], out) takes its inputs in the listed order, eagerly and compiled: the steps of the
    subclass with forward(x, z) and the same weights (which train as one concatenated input's, above)."""
    g = functional_two()
    m, p = two()
    m.load_state_dict({k: v for k, v in zip(m.state_dict(), g.state_dict().values())})
    q = g.compile(ft.optim.SGD(g.parameters(), lr=0.1, momentum=0.9), batch_size=16)
    assert g.input_shape == ((4,), (3,)) and q.input_shape == ((4,), (3,))
    for s in range(0, 48, 16):
        assert q.train_step((X[s:s + 16], Z[s:s + 16]), Y[s:s + 16]) == p.train_step((X[s:s + 16], Z[s:s + 16]),
                                                                                        Y[s:s + 16])
    for got, want in zip(g.state_dict().values(), m.state_dict().values()):
        np.testing.assert_array_equal(got, want)
    g.eval()
    np.testing.assert_allclose(g(ft.tensor(X), ft.tensor(Z)).numpy(), q.predict((X, Z)).numpy(), rtol=1e-6, atol=1e-6)


def test_an_nn_model_compiles_with_its_inputs_dtypes():
    """An nn.Input of token ids (int64) and one of a bool mask: compile reads their dtypes from the inputs."""
    ids, keep = nn.Input((6,), ft.int64), nn.Input((6,), ft.bool)
    h = nn.Embedding(20, 4)(ids) * keep.float().unsqueeze(2)
    model = nn.Model([ids, keep], nn.Linear(4, 2)(h.sum(1)))
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=4)
    t = np.random.default_rng(0).integers(0, 20, (4, 6))
    mask = t % 3 != 0
    w = model.state_dict()
    want = (w["embedding.weight"][t] * mask[..., None]).sum(1) @ w["linear.weight"].T + w["linear.bias"]
    np.testing.assert_allclose(program.predict((t, mask)).numpy(), want, rtol=1e-5, atol=1e-6)


def test_what_an_nn_model_of_several_inputs_refuses():
    x, z, other = nn.Input((4,)), nn.Input((3,)), nn.Input((3,))
    out = nn.Linear(4, 2)(x)
    with pytest.raises(ValueError, match="does not depend on input 1"):
        nn.Model([x, z], out)
    with pytest.raises(ValueError, match="an nn.Input that is not among the model's inputs"):
        nn.Model([x], out + nn.Linear(3, 2)(other))
    with pytest.raises(ValueError, match="given twice"):
        nn.Model([x, x], out)
    with pytest.raises(TypeError, match=r"takes 2 input\(s\), got 1"):
        functional_two()(ft.tensor(X))


class Conditioned(nn.Module):
    """Features scaled by a per-sample float (a diffusion model's time) and a per-sample class label's
    embedding: inputs of per-sample shape ()."""

    def __init__(self):
        super().__init__()
        self.emb, self.fc = nn.Embedding(3, 4), nn.Linear(5 + 4, 2)

    def forward(self, x, t, c):
        return self.fc(ft.cat([x * t.unsqueeze(1), self.emb(c)], 1))


def test_inputs_of_one_value_per_sample():
    """Inputs of per-sample shape () (compile(input_shape=((5,), (), ()))): batches (N,), one sample a 0-d value;
    the output is NumPy's, eager equals compiled, and a batch of (N, 1) or a label out of range is refused."""
    ft.manual_seed(0)
    model = Conditioned()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), batch_size=4,
                            input_shape=((5,), (), ()), input_dtype=(ft.float32, ft.float32, ft.int64))
    r = np.random.default_rng(0)
    x, t, c, y = (r.standard_normal((16, 5)).astype(np.float32), r.random(16).astype(np.float32),
                  r.integers(0, 3, 16), r.integers(0, 2, 16))
    w = model.state_dict()
    want = np.concatenate([x * t[:, None], w["emb.weight"][c]], 1) @ w["fc.weight"].T + w["fc.bias"]
    np.testing.assert_allclose(program.predict((x, t, c)).numpy(), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(program.predict((x[3], t[3], c[3])).numpy(), want[3], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(model(ft.tensor(x), ft.tensor(t), ft.tensor(c)).numpy(), want, rtol=1e-5, atol=1e-6)
    ft.fit(program, (x, t, c, y), 2, progress=False)
    before = weights(model)
    with pytest.raises(IndexError, match=r"ids\[2\] = 3 is out of range"):
        program.train_step((x[:4], t[:4], np.array([0, 1, 3, 0])), y[:4])
    with pytest.raises(ValueError, match=r"input 1 should be a batch of samples of shape \(\), got \(4, 1\)"):
        program.train_step((x[:4], t[:4, None], c[:4]), y[:4])
    assert all(np.array_equal(a, b) for a, b in zip(before, weights(model)))


def test_one_input_of_one_value_per_sample_fits_from_arrays():
    """A forward of one label per sample (input_shape=()) trains from (labels, y) arrays, which a Loader's
    features cannot hold, batched in a Loader's order: it learns the labels' parity."""
    class Parity(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.fc = nn.Embedding(5, 3), nn.Linear(3, 2)

        def forward(self, c):
            return self.fc(self.emb(c))
    ft.manual_seed(0)
    model = Parity()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.5), nn.CrossEntropyLoss(), batch_size=4,
                            input_shape=(), input_dtype=ft.int64)
    c = np.random.default_rng(0).integers(0, 5, 64)
    history = ft.fit(program, (c, c % 2), 5, progress=False)
    assert history["train_loss"][-1] < history["train_loss"][0] / 10
    assert ft.evaluate(program, (c, c % 2))[1] == 1.0
    assert program.predict(c[0]).shape == (2,)


@pytest.mark.parametrize("returns", ["pair", "b - a"])
def test_a_batch_norm_called_twice_updates_its_statistics_in_call_order(returns):
    """A shared encoder's batch norm called on a, then on b (a siamese network): its running statistics move
    with a's batch, then b's, as PyTorch's, whatever order the loss reads the outputs in (they followed the loss's
    order: b's update first)."""
    class Siamese(nn.Module):
        def __init__(self):
            super().__init__()
            self.bn = nn.BatchNorm1d(2, momentum=0.1)

        def forward(self, a, b):
            ya, yb = self.bn(a), self.bn(b)
            return (ya, yb) if returns == "pair" else yb - ya

    a = np.arange(8, dtype=np.float32).reshape(4, 2)
    b = 10 + 3 * a ** 2
    model = Siamese()
    loss = (lambda o, y: ((o[1] - o[0]) ** 2).mean()) if returns == "pair" else (lambda o, y: (o ** 2).mean())
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.0), loss, batch_size=4, input_shape=((2,), (2,)))
    program.train_step((a, b), None)
    mean, var = np.zeros(2), np.ones(2)
    for x in (a, b):  # PyTorch's update: the batch mean, and the unbiased batch variance
        mean, var = 0.9 * mean + 0.1 * x.mean(0), 0.9 * var + 0.1 * x.var(0, ddof=1)
    np.testing.assert_allclose(model.bn.running_mean.numpy(), mean, rtol=1e-6)
    np.testing.assert_allclose(model.bn.running_var.numpy(), var, rtol=1e-6)
    if returns == "pair":  # the first output (through the view that ends the model's nodes) in eval mode
        np.testing.assert_allclose(program.predict((a, b)).numpy(), (a - mean) / np.sqrt(var + 1e-5), rtol=1e-5)


def test_a_contrastive_loss_over_the_batch_trains_with_the_batch_as_one_sample():
    """InfoNCE's similarities across the batch (z1 @ z2.T) have no per-sample form; with the batch as one sample
    (batch_size=1, input_shape=(B, D), what the TracingError for z2.T suggests) they are a sample's own matmul:
    the loss is NumPy's and the gradients central differences'."""
    B, D = 6, 5

    class Siamese(nn.Module):
        def __init__(self):
            super().__init__()
            self.enc = nn.Linear(D, 4)

        def forward(self, x1, x2):
            z1, z2 = F.normalize(self.enc(x1), dim=-1), F.normalize(self.enc(x2), dim=-1)
            return z1 @ z2.transpose(-2, -1) / 0.5

    class AcrossTheBatch(Siamese):
        def forward(self, x1, x2):
            return self.enc(x1) @ self.enc(x2).T

    across = AcrossTheBatch()
    with pytest.raises(ft.nn.TracingError, match=r"batch_size=1, input_shape=\(B, \.\.\.\)"):
        across.compile(ft.optim.SGD(across.parameters(), lr=0.1), nn.MSELoss(), batch_size=B, input_shape=((D,), (D,)))
    ft.manual_seed(0)
    model = Siamese()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1),
                            lambda logits, y: F.cross_entropy(logits.view(-1, B), y.view(-1)), batch_size=1,
                            input_shape=((B, D), (B, D)), target_shape=(B,))
    x1, x2 = np.random.default_rng(4).standard_normal((2, 1, B, D)).astype(np.float32)
    y = np.arange(B)[None]
    w, b = model.enc.weight.numpy().astype(np.float64), model.enc.bias.numpy().astype(np.float64)

    def enc(x):
        z = x[0] @ w.T + b
        return z / np.linalg.norm(z, axis=1, keepdims=True)

    s = enc(x1) @ enc(x2).T / 0.5
    assert program.backward((x1, x2), y) == pytest.approx(np.mean(np.log(np.exp(s).sum(1)) - np.diag(s)), rel=1e-5)
    assert ft.testing.gradcheck(program, (x1, x2), y)


class Tasks(nn.Module):
    """A trunk with a class head and a box head: forward returns (logits, boxes)."""

    def __init__(self):
        super().__init__()
        self.trunk, self.cls, self.box = nn.Linear(8, 16), nn.Linear(16, 5), nn.Linear(16, 4)

    def forward(self, x):
        f = F.relu(self.trunk(x))
        return self.cls(f), self.box(f)


def tasks_loss(out, y):
    logits, boxes = out
    labels, true_boxes = y
    return F.cross_entropy(logits, labels) + 0.5 * F.mse_loss(boxes, true_boxes)


def tasks_data(n=32, seed=0):
    r = np.random.default_rng(seed)
    x = r.standard_normal((n, 8)).astype(np.float32)
    return x, r.integers(0, 5, n), (x[:, :4] * 0.5).astype(np.float32)


def tasks_reference(model, x, labels, boxes):
    """The loss of Tasks and tasks_loss in float64 NumPy."""
    f = np.maximum(x.astype(np.float64) @ model.trunk.weight.numpy().T + model.trunk.bias.numpy(), 0)
    logits = f @ model.cls.weight.numpy().T + model.cls.bias.numpy()
    out = f @ model.box.weight.numpy().T + model.box.bias.numpy()
    ce = np.log(np.exp(logits).sum(1)) - logits[np.arange(len(x)), labels]
    return ce.mean() + 0.5 * ((out - boxes) ** 2).mean()


def test_a_loss_of_two_targets_matches_numpy_and_trains_from_arrays():
    """Class labels and box coordinates as two targets (target_shape=((), (4,))): the loss the tuple of them gives
    is NumPy's, gradients match central differences, and fit over (x, (labels, boxes)) arrays learns both tasks;
    evaluate gives the loss without an accuracy."""
    x, labels, boxes = tasks_data()
    ft.manual_seed(3)
    model = Tasks()
    program = model.compile(ft.optim.Adam(model.parameters(), lr=1e-2), tasks_loss, batch_size=8, input_shape=(8,),
                            target_shape=((), (4,)), target_dtype=(ft.int64, ft.float32))
    assert program.target_shape == ((), (4,)) and program.target_dtype == (ft.int64, ft.float32)
    assert program.backward(x[:8], (labels[:8], boxes[:8])) == pytest.approx(
        tasks_reference(model, x[:8], labels[:8], boxes[:8]), rel=1e-5)
    assert ft.testing.gradcheck(program, x[:8], (labels[:8], boxes[:8]), rtol=3e-2, atol=1e-3)
    history = ft.fit(program, (x, (labels, boxes)), 30, batch_size=8, progress=False)
    assert history["train_loss"][-1] < 0.5 * history["train_loss"][0]
    loss, accuracy = ft.evaluate(program, (x, (labels, boxes)))
    assert accuracy is None and loss == pytest.approx(tasks_reference(model, x, labels, boxes), rel=1e-4)
    batches = [(x[i:i + 8], (labels[i:i + 8], boxes[i:i + 8])) for i in range(0, 32, 8)]
    assert len(ft.fit(program, batches, 1, progress=False)["train_loss"]) == 1

    def stop(step, metrics):  # at the epoch's last step: the error itself reaches the caller
        if step == program.step_count and step % 4 == 0:
            raise RuntimeError("stopped by the callback")
    with pytest.raises(RuntimeError, match="stopped by the callback"):
        ft.fit(program, (x, (labels, boxes)), 2, batch_size=8, step_callbacks=[stop], progress=False)
    assert ft.fit(program, (x, (labels, boxes)), 1, batch_size=8, progress=False)["epoch"] == [32]


def test_two_class_heads_with_ignored_labels_and_mistaken_targets():
    """Two class heads, the second's labels partly ignored (ignore_index=-1), one dtype given for both: the loss is
    NumPy's; mistaken targets (one array, too few, floats for labels, a label out of range, a Loader's single
    labels, a target the loss never reads) are refused and change nothing."""
    class Heads(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(8, 5), nn.Linear(8, 3)

        def forward(self, x):
            return self.a(x), self.b(x)

    def loss(out, y):
        return F.cross_entropy(out[0], y[0]) + F.cross_entropy(out[1], y[1], ignore_index=-1)

    x, first, _ = tasks_data(8, seed=1)
    second = np.array([0, -1, 2, -1, 1, 1, -1, 0])
    model = Heads()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), loss, batch_size=8, input_shape=(8,),
                            target_shape=((), ()), target_dtype=ft.int64)

    def ce(logits, y):
        keep = y >= 0
        return (np.log(np.exp(logits[keep]).sum(1)) - logits[keep][np.arange(keep.sum()), y[keep]]).mean()

    a = x.astype(np.float64) @ model.a.weight.numpy().T + model.a.bias.numpy()
    b = x.astype(np.float64) @ model.b.weight.numpy().T + model.b.bias.numpy()
    before = weights(model)
    assert program.evaluate(x, (first, second))[0] == pytest.approx(ce(a, first) + ce(b, second), rel=1e-5)
    for y, error, match in (
            (first, TypeError, "the program's loss reads 2 targets: give y as a tuple of as many batches, got ndarray"),
            ((first,), TypeError, "got a tuple of 1"),
            ((first, second.astype(np.float32)), TypeError, "labels of target 1 must be integers, got float32"),
            ((first, np.where(second == 2, 3, second)), IndexError, r"label 3 at position 2 is outside \[0, 3\)")):
        with pytest.raises(error, match=match):
            program.train_step(x, y)
    with pytest.raises(TypeError, match=r"the program's loss reads 2 targets, but a fasttrain Loader's batches"):
        ft.fit(program, ft.data.Loader((x, first), 8), 1, progress=False)
    for u, v in zip(before, weights(model)):
        np.testing.assert_array_equal(u, v)
    with pytest.raises(ft.nn.TracingError, match="the loss reads no value of target 1 of 2"):
        model.compile(ft.optim.SGD(model.parameters(), lr=0.1), lambda out, y: F.cross_entropy(out[0], y[0]),
                      batch_size=8, input_shape=(8,), target_shape=((), ()), target_dtype=ft.int64)


def test_integer_lengths_mask_a_sequence_in_forward_and_in_the_loss():
    """d2l's sequence mask, ft.arange(T)[None, :] < valid_len[:, None], of integer lengths: an input of the forward
    (masked attention scores) and a target of the loss (a masked cross entropy); the loss and its gradients are
    those of the eager model's (a length mask from an int64 target failed in the step)."""
    V, D, T, B = 11, 8, 6, 5

    class Masked(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.out = nn.Embedding(V, D), nn.Linear(D, V)

        def forward(self, x, valid_lens):
            h = self.emb(x)
            scores = h @ h.transpose(1, 2) / D ** 0.5
            keep = ft.arange(T)[None, None, :] < valid_lens[:, None, None]
            return self.out(F.softmax(scores.masked_fill(~keep, -1e6), dim=-1) @ h)

    def loss(out, y):
        label, valid_len = y
        weights = (ft.arange(T)[None, :] < valid_len[:, None]).float()
        return (F.cross_entropy(out.permute(0, 2, 1), label, reduction="none") * weights).mean(dim=1).sum()

    rng = np.random.default_rng(0)
    x, label = rng.integers(0, V, (B, T)), rng.integers(0, V, (B, T))
    lens = np.array([1, 6, 3, 4, 2])
    ft.manual_seed(0)
    m = Masked()
    eager = loss(m(ft.tensor(x), ft.tensor(lens)), (ft.tensor(label), ft.tensor(lens)))
    p = m.compile(ft.optim.SGD(m.parameters(), lr=0.1), loss, batch_size=B, input_shape=((T,), ()),
                  input_dtype=(ft.int64, ft.int64), target_shape=((T,), ()), target_dtype=(ft.int64, ft.int64))
    got = p.backward((x, lens), (label, lens))
    np.testing.assert_allclose(got, float(eager), rtol=1e-5)
    grads = [g.grad.numpy().copy() for g in m.parameters()]
    h = 1e-2  # central differences of the eager loss along the gradient of the output layer's bias
    bias = m.out.bias.numpy()
    direction = grads[-1] / np.linalg.norm(grads[-1])
    values = []
    for sign in (1, -1):
        bias += sign * h * direction
        values.append(float(loss(m(ft.tensor(x), ft.tensor(lens)), (ft.tensor(label), ft.tensor(lens)))))
        bias -= sign * h * direction
    np.testing.assert_allclose((values[0] - values[1]) / (2 * h), np.linalg.norm(grads[-1]), rtol=1e-3)
    first = p.train_step((x, lens), (label, lens))
    for _ in range(20):
        last = p.train_step((x, lens), (label, lens))
    assert last < first
