"""RNN, LSTM and GRU: PyTorch's parameters and formulas, eagerly against NumPy and PyTorch, compiled (an LSTM
layer as one node, the others' steps unrolled into the program) against finite differences and PyTorch's
gradients."""
import numpy as np
import pytest

import fasttrain as ft
from fasttrain.testing import gradcheck
from _programref import assert_gradients_match

nn = ft.nn
try:  # an optional oracle
    import torch
except ImportError:
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch is not installed")


def sigmoid(v):
    return 1 / (1 + np.exp(-v))


def reference(mode, x, w_ih, w_hh, b_ih, b_hh):
    """One layer, one direction, zero initial state, in float64: PyTorch's documented cell equations."""
    N, T, _ = x.shape
    H = w_hh.shape[1]
    h, c, out = np.zeros((N, H)), np.zeros((N, H)), []
    for t in range(T):
        gi, gh = x[:, t] @ w_ih.T + b_ih, h @ w_hh.T + b_hh
        if mode == "LSTM":
            i, f, g, o = np.split(gi + gh, 4, axis=1)
            c = sigmoid(f) * c + sigmoid(i) * np.tanh(g)
            h = sigmoid(o) * np.tanh(c)
        elif mode == "GRU":
            (i_r, i_z, i_n), (h_r, h_z, h_n) = np.split(gi, 3, axis=1), np.split(gh, 3, axis=1)
            r, z = sigmoid(i_r + h_r), sigmoid(i_z + h_z)
            h = (1 - z) * np.tanh(i_n + r * h_n) + z * h
        else:
            h = np.tanh(gi + gh)
        out.append(h)
    return np.stack(out, 1), h


@pytest.mark.parametrize("mode", ["RNN", "LSTM", "GRU"])
def test_one_layer_matches_the_cell_equations(mode):
    ft.manual_seed(1)
    rnn = getattr(nn, mode)(4, 5, batch_first=True)
    gates = {"RNN": 1, "LSTM": 4, "GRU": 3}[mode]
    assert [(k, tuple(v.shape)) for k, v in rnn.named_parameters()] == [
        ("weight_ih_l0", (gates * 5, 4)), ("weight_hh_l0", (gates * 5, 5)), ("bias_ih_l0", (gates * 5,)),
        ("bias_hh_l0", (gates * 5,))]
    assert all(np.abs(p.numpy()).max() <= 1 / np.sqrt(5) for p in rnn.parameters())  # U(-1/sqrt(H), 1/sqrt(H))
    x = np.random.default_rng(2).standard_normal((3, 6, 4))
    out, state = rnn(ft.tensor(x.astype(np.float32)))
    h = state[0] if mode == "LSTM" else state
    want_out, want_h = reference(mode, x, *(p.numpy().astype(np.float64) for p in rnn.parameters()))
    np.testing.assert_allclose(out.numpy(), want_out, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(h.numpy(), want_h[None], rtol=1e-5, atol=1e-6)


class Tagger(nn.Module):
    """Tokens through an embedding and a recurrent layer; the last layer's final state and the mean output."""

    def __init__(self, mode, **kw):
        super().__init__()
        self.bidirectional = kw.get("bidirectional", False)
        self.emb = nn.Embedding(9, 4)
        self.rnn = getattr(nn, mode)(4, 5, batch_first=True, **kw)
        self.head = nn.Linear(5 * (1 + self.bidirectional) * 2, 3)

    def forward(self, ids):
        out, state = self.rnn(self.emb(ids))
        h = state[0] if isinstance(state, tuple) else state
        last = ft.cat((h[-2], h[-1]), 1) if self.bidirectional else h[-1]
        return self.head(ft.cat((last, out.mean(1)), 1))


KINDS = [("RNN", {}), ("LSTM", {}), ("GRU", {}), ("LSTM", {"num_layers": 2, "bidirectional": True}),
         ("GRU", {"num_layers": 2, "bias": False})]


def compiled_as_eager(model, ids, y):
    """The model compiled for token ids like ids: its predictions the eager model's, its gradients central
    differences'."""
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=ids.shape[0],
                            input_shape=ids.shape[1:], input_dtype=ft.int64)
    np.testing.assert_allclose(program.predict(ids).numpy(), model(ft.tensor(ids)).numpy(), rtol=1e-5, atol=1e-6)
    assert gradcheck(program, ids, y, eps=1e-3, rtol=3e-2, atol=1e-3)
    return program


@pytest.mark.parametrize("mode,kw", KINDS)
def test_compiled_steps_match_finite_differences_and_the_eager_forward(mode, kw):
    ft.manual_seed(3)
    compiled_as_eager(Tagger(mode, **kw), np.random.default_rng(4).integers(0, 9, (3, 7)), np.array([0, 2, 1]))


@needs_torch
@pytest.mark.parametrize("mode,kw", KINDS)
@pytest.mark.parametrize("batch_first", [True, False])
def test_eager_layers_match_pytorch_with_states_passed_on(mode, kw, batch_first):
    torch.manual_seed(5)
    theirs = getattr(torch.nn, mode)(4, 5, batch_first=batch_first, **kw)
    ours = getattr(nn, mode)(4, 5, batch_first=batch_first, **kw)
    assert list(ours.state_dict()) == list(theirs.state_dict()) and repr(ours) == repr(theirs)
    ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()}, strict=True)
    x = np.random.default_rng(6).standard_normal((6, 3, 4)).astype(np.float32)
    t_out, t_state = theirs(torch.from_numpy(x))
    out, state = ours(ft.tensor(x))
    np.testing.assert_allclose(out.numpy(), t_out.detach().numpy(), rtol=1e-5, atol=1e-6)
    t_out, _ = theirs(torch.from_numpy(x), t_state)  # the final states as the next call's initial ones
    out, _ = ours(ft.tensor(x), state)
    np.testing.assert_allclose(out.numpy(), t_out.detach().numpy(), rtol=1e-5, atol=1e-6)
    t_out, _ = theirs(torch.from_numpy(x[:, 0]))  # one unbatched sequence
    np.testing.assert_allclose(ours(ft.tensor(x[:, 0]))[0].numpy(), t_out.detach().numpy(), rtol=1e-5, atol=1e-6)


@needs_torch
@pytest.mark.parametrize("mode,kw", KINDS)
def test_compiled_gradients_match_pytorch(mode, kw):
    class Theirs(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bidirectional = kw.get("bidirectional", False)
            self.emb = torch.nn.Embedding(9, 4)
            self.rnn = getattr(torch.nn, mode)(4, 5, batch_first=True, **kw)
            self.head = torch.nn.Linear(5 * (1 + self.bidirectional) * 2, 3)

        def forward(self, ids):
            out, state = self.rnn(self.emb(ids))
            h = state[0] if isinstance(state, tuple) else state
            last = torch.cat((h[-2], h[-1]), 1) if self.bidirectional else h[-1]
            return self.head(torch.cat((last, out.mean(1)), 1))

    torch.manual_seed(7)
    theirs, model = Theirs(), Tagger(mode, **kw)
    model.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()}, strict=True)
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=4, input_shape=(7,),
                            input_dtype=ft.int64)
    ids, y = np.random.default_rng(8).integers(0, 9, (4, 7)), np.array([0, 2, 1, 1])
    assert_gradients_match(program, theirs, ids, y, torch.nn.functional.cross_entropy)


@pytest.mark.parametrize("kw", [{}, {"bidirectional": True, "num_layers": 2}], ids=["one", "two_bidirectional"])
@pytest.mark.parametrize("mode", ["LSTM", "GRU"])
def test_a_compiled_layer_gives_the_eager_layers_bits(mode, kw):
    """The compiled layer's steps (one node per layer and direction, one pass over each step's rows, ops/rnn.c)
    compute what the eager layer's ops compute, in the same order: the same float32 bits."""
    class Seq(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.rnn = nn.Embedding(9, 8), getattr(nn, mode)(8, 16, batch_first=True, **kw)

        def forward(self, ids):
            return self.rnn(self.emb(ids))[0]
    ft.manual_seed(22)
    model = Seq()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.MSELoss(), batch_size=16, input_shape=(5,),
                            input_dtype=ft.int64)
    ids = np.random.default_rng(23).integers(0, 9, (16, 5))
    np.testing.assert_array_equal(program.predict(ids).numpy(), model(ft.tensor(ids)).numpy())
    layers = sum(type(e.module).__name__ == f"{mode}Layer" for e in program.entries)
    assert layers == model.rnn.num_layers * (1 + model.rnn.bidirectional)


def encoder_decoder(lib, mode="LSTM", **kw):
    """Sequence to sequence: an encoder LSTM's (or GRU's) final states as the initial states of a decoder over the
    last tokens (the states' gradient flows back into the encoder)."""
    class EncoderDecoder(lib.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = lib.nn.Embedding(9, 4)
            self.enc, self.dec = (getattr(lib.nn, mode)(4, 5, 2, batch_first=True, **kw) for _ in range(2))
            self.head = lib.nn.Linear(5 * (1 + kw.get("bidirectional", False)), 3)

        def forward(self, ids):
            _, state = self.enc(self.emb(ids[:, :4]))
            out, _ = self.dec(self.emb(ids[:, 4:]), state)
            return self.head(out.mean(1))
    return EncoderDecoder()


@pytest.mark.parametrize("kw", [{}, {"bidirectional": True}], ids=["forward", "bidirectional"])
@pytest.mark.parametrize("mode", ["LSTM", "GRU"])
def test_states_passed_from_an_encoder_to_a_decoder_compile(mode, kw):
    ft.manual_seed(16)
    model = encoder_decoder(ft, mode, **kw)
    ids, y = np.random.default_rng(17).integers(0, 9, (3, 7)), np.array([2, 0, 1])
    program = compiled_as_eager(model, ids, y)
    if torch is not None:
        torch.manual_seed(18)
        theirs = encoder_decoder(torch, mode, **kw)
        model.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()}, strict=True)
        assert_gradients_match(program, theirs, ids, y, torch.nn.functional.cross_entropy)


@pytest.mark.skipif(not ft.backends.cpu_has_bf16(), reason="bf16-mixed runs as float32 on this CPU")
@pytest.mark.parametrize("mode", ["LSTM", "GRU"])
def test_a_bf16_mixed_rnn_trains_as_the_float32_one_within_bfloat16s_precision(mode):
    """An LSTM's or GRU's products in bfloat16 with float32 sums (its steps' gates and states stored in bfloat16):
    the loss and every gradient near float32's, and training from the same weights lowers the loss alike."""
    ids = np.random.default_rng(19).integers(0, 9, (16, 7))
    y = ids[:, 0] % 3  # learnable: the first token's class
    programs = []
    for precision in ("32-true", "bf16-mixed"):
        ft.manual_seed(20)
        model = encoder_decoder(ft, mode, bidirectional=True)
        programs.append(model.compile(ft.optim.Adam(model.parameters(), lr=1e-2), batch_size=16, input_shape=(7,),
                                      input_dtype=ft.int64, precision=precision))
    (p32, m32), (p16, m16) = ((p, p.model) for p in programs)
    l32, l16 = p32.backward(ids, y), p16.backward(ids, y)
    assert abs(l16 - l32) <= 2e-2 * abs(l32)
    for (name, a), (_, b) in zip(m32.named_parameters(), m16.named_parameters()):
        g32, g16 = a.grad.numpy(), b.grad.numpy()
        assert np.abs(g16 - g32).max() <= 5e-2 * np.abs(g32).max() + 1e-6, name
    curves = [[p.train_step(ids, y) for _ in range(30)] for p in programs]
    assert curves[0][-1] < 0.5 * curves[0][0] and curves[1][-1] < 0.5 * curves[1][0]
    np.testing.assert_allclose(curves[1], curves[0], rtol=0.1, atol=2e-2)
    # what a layer saves for its backward, an LSTM's steps' gates, h and c (T, N, 6H), a GRU's r, z, n, h W_n + b_n
    # and h (T, N, 5H), takes 2 bytes an element in bfloat16
    saved = [[n["saved"] for n in p.memory_plan()["nodes"] if n["node"] == f"{mode}Layer"] for p in programs]
    width = 6 if mode == "LSTM" else 5
    assert saved[0] and saved[0] == [2 * s for s in saved[1]] and saved[1][0] == 2 * 4 * 16 * width * 5  # encoder


def captioner(lib, mode, how):
    """Image captioning's decoder (Show and Tell): the initial state made from image features, tanh(Linear(f)) as
    one layer's (unsqueeze(0)), repeated over two layers (.repeat(2, 1, 1), .expand(2, -1, -1)) or stacked
    (torch.stack([h, h])), then the caption's tokens through the RNN."""
    class Captioner(lib.nn.Module):
        def __init__(self):
            super().__init__()
            layers = 1 if how == "one" else 2
            self.init_h, self.init_c, self.emb = lib.nn.Linear(6, 5), lib.nn.Linear(6, 5), lib.nn.Embedding(9, 4)
            self.rnn = getattr(lib.nn, mode)(4, 5, layers, batch_first=True)
            self.head = lib.nn.Linear(5, 3)

        def forward(self, features, ids):
            h0, c0 = (self.layers(lib.tanh(init(features))) for init in (self.init_h, self.init_c))
            out, _ = self.rnn(self.emb(ids), (h0, c0) if mode == "LSTM" else h0)
            return self.head(out[:, -1])

        def layers(self, h):
            return h.unsqueeze(0) if how == "one" else h.unsqueeze(0).repeat(2, 1, 1) if how == "repeat" else \
                h.unsqueeze(0).expand(2, -1, -1).contiguous() if how == "expand" else lib.stack([h, -h])
    return Captioner()


@pytest.mark.parametrize("how", ["one", "repeat", "expand", "stack"])
@pytest.mark.parametrize("mode", ["GRU", "LSTM"])
def test_an_initial_state_made_from_features_compiles(mode, how):
    rng = np.random.default_rng(25)
    feats, ids, y = rng.standard_normal((3, 6)).astype(np.float32), rng.integers(0, 9, (3, 7)), np.array([0, 2, 1])
    ft.manual_seed(26)
    model = captioner(ft, mode, how)
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=3, input_shape=((6,), (7,)),
                            input_dtype=(ft.float32, ft.int64))
    np.testing.assert_allclose(program.predict((feats, ids)).numpy(), model(ft.tensor(feats), ft.tensor(ids)).numpy(),
                               rtol=1e-5, atol=1e-6)
    assert gradcheck(program, (feats, ids), y, eps=1e-3, rtol=3e-2, atol=1e-3)
    if torch is not None:
        theirs = captioner(torch, mode, how)
        model.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()}, strict=True)
        assert_gradients_match(program, theirs, (feats, ids), y, torch.nn.functional.cross_entropy)


FINAL_STATE_FORMS = {
    "h_n[-2, :, :] and h_n[-1, :, :]": lambda h: ft.cat((h[-2, :, :], h[-1, :, :]), 1),
    "h_n.view(layers, directions, N, H)[-1]": lambda h: ft.cat(tuple(h.view(2, 2, -1, 4)[-1]), 1),
    "h_n.view(layers, directions, N, H)[-1, 0] twice": lambda h: ft.cat(
        (h.view(2, 2, h.size(1), 4)[-1, 0], h.view(2, 2, h.size(1), 4)[-1, 1]), 1),
}


@pytest.mark.parametrize("form", list(FINAL_STATE_FORMS))
def test_pytorchs_forms_of_the_last_layers_final_states_compile(form):
    """The last layer's two directions of a 2-layer bidirectional GRU's h_n, in each form PyTorch code takes them:
    predict equals the eager forward, which is the layer's states read by plain indexing; x.ne(0) is a mask, as
    x != 0; flatten_parameters() is taken."""
    class Last(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn, self.head = nn.GRU(3, 4, num_layers=2, bidirectional=True, batch_first=True), nn.Linear(8, 2)

        def forward(self, x):
            self.rnn.flatten_parameters()
            _, h = self.rnn(x * x.ne(0).float())
            return self.head(FINAL_STATE_FORMS[form](h))

    x = np.random.default_rng(4).standard_normal((3, 5, 3)).astype(np.float32)
    model = Last()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=3, input_shape=(5, 3))
    _, h = model.rnn(ft.tensor(x))
    h = np.asarray(h)
    want = np.concatenate((h[2], h[3]), 1) @ np.asarray(model.head.weight).T + np.asarray(model.head.bias)
    np.testing.assert_allclose(program.predict(x).numpy(), want, rtol=1e-5, atol=1e-6)


def test_what_a_compiled_rnn_cannot_take_is_refused():
    class Uses(nn.Module):
        def __init__(self, how, **kw):
            super().__init__()
            self.how, self.rnn, self.head = how, nn.LSTM(3, 4, **kw), nn.Linear(4, 2)

        def forward(self, x):
            if self.how == "zeros":
                h0 = ft.zeros(1, 2, 4)
                out, (h, c) = self.rnn(x, (h0, h0))
            else:
                out, (h, c) = self.rnn(x)
            return self.head(h.mean(1) if self.how == "mean" else h[-1])

    def compile(model):
        model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=2, input_shape=(5, 3))

    with pytest.raises(ft.nn.TracingError, match=r"LSTM\(batch_first=False\) on a traced value .* batch_first=True"):
        compile(Uses("last"))
    with pytest.raises(ft.nn.TracingError, match="an initial state of tensors for a traced RNN .* hx=None"):
        compile(Uses("zeros", batch_first=True))
    with pytest.raises(ft.nn.TracingError, match=r"this use of values stacked before the batch .*take them apart "
                       r"\(h_n\[-1\]"):
        compile(Uses("mean", batch_first=True))
    class SequenceFirst(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn, self.head = nn.LSTM(3, 4), nn.Linear(4, 2)

        def forward(self, x):
            out, _ = self.rnn(x.transpose(0, 1))
            return self.head(out[-1])

    with pytest.raises(ft.nn.TracingError, match=r"LSTM of a traced value moved sequence first \(x.transpose\(0, 1\)\)"
                       r".* batch_first=True"):
        compile(SequenceFirst())
    with pytest.raises(NotImplementedError, match="proj_size"):
        nn.LSTM(3, 4, proj_size=2)
    with pytest.raises(ValueError, match="input has 2 features, expected input_size=3"):
        nn.GRU(3, 4)(ft.zeros(5, 2, 2))
    with pytest.raises(ValueError, match=r"hx has 1 states, expected num_layers \* directions = 2"):
        nn.GRU(3, 4, bidirectional=True)(ft.zeros(5, 2, 3), ft.zeros(1, 2, 4))


def test_values_stacked_before_the_batch_sum_along_it():
    """WaveNet's skip connections summed as ft.sum(ft.stack(skips), dim=0), and an LSTM's final states averaged
    over its layers (h_n.mean(0)): predict is the eager forward, the gradients finite differences'."""
    class Summed(nn.Module):
        def __init__(self):
            super().__init__()
            self.convs = nn.ModuleList([nn.Conv1d(3, 3, 1) for _ in range(3)])
            self.lstm, self.fc = nn.LSTM(3, 4, 2, batch_first=True), nn.Linear(4, 2)

        def forward(self, x):
            skips = [c(x.transpose(1, 2)) for c in self.convs]
            s = ft.sum(ft.stack(skips), dim=0) + ft.stack(skips).mean(0)
            _, (h, _) = self.lstm(s.transpose(1, 2))
            return self.fc(h.mean(0))

    ft.manual_seed(8)
    matches_eager_and_finite_differences(Summed(), 9)


def test_the_tutorials_zero_initial_state_of_the_batch_size_compiles():
    """h0 = ft.zeros(layers, x.size(0), hidden), as PyTorch tutorials write it (also .requires_grad_() there and
    .detach() at the call), then the last step's output."""
    class Classifier(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm, self.fc = nn.LSTM(3, 4, 2, batch_first=True), nn.Linear(4, 2)

        def forward(self, x):
            h0, c0 = ft.zeros(2, x.size(0), 4), ft.zeros(2, x.size(0), 4).requires_grad_()
            out, _ = self.lstm(x, (h0.to("cpu"), c0.detach()))
            return self.fc(out[:, -1, :])

    ft.manual_seed(9)
    matches_eager_and_finite_differences(Classifier(), 10)


def matches_eager_and_finite_differences(model, seed):
    """model compiled for batches of two (5, 3) sequences: predict is its eager forward, the gradients finite
    differences'. Returns the program and the batch."""
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=2, input_shape=(5, 3))
    x = np.random.default_rng(seed).standard_normal((2, 5, 3)).astype(np.float32)
    np.testing.assert_allclose(program.predict(x).numpy(), model(ft.tensor(x)).numpy(), rtol=1e-5, atol=1e-6)
    assert gradcheck(program, x, np.array([0, 1]), eps=1e-3, rtol=3e-2, atol=1e-3)
    return program, x



class HandWritten(nn.Module):
    """A hand-written RNN over the steps from a zero state, torch.zeros(x.size(0), hidden), as the char-RNN tutorial
    writes it (cat of the input and the state), and a decoder's start tokens torch.empty(N, 1, dtype=long)
    .fill_(SOS) through an embedding; ones(N) scales each sample."""

    def __init__(self):
        super().__init__()
        self.i2h, self.emb, self.fc = nn.Linear(3 + 4, 4), nn.Embedding(5, 4), nn.Linear(4, 2)

    def forward(self, x):
        h = ft.zeros(x.size(0), 4)
        for t in range(x.size(1)):
            h = ft.tanh(self.i2h(ft.cat((x[:, t], h), 1)))
        start = ft.empty(x.size(0), 1, dtype=ft.long).fill_(3)
        return self.fc(h + self.emb(start)[:, 0]) * ft.ones(x.size(0)).unsqueeze(1)


def test_constants_of_the_batch_size_are_values_of_every_sample():
    """zeros/ones/empty().fill_ of a size with the batch first are the constant for every sample (they were refused:
    the state and the start tokens, or failed inside on ft.ones(N)): predict is the eager forward, the gradients
    finite differences'."""
    ft.manual_seed(12)
    model = HandWritten()
    program, x = matches_eager_and_finite_differences(model, 13)
    program.backward(x, np.array([0, 1]))
    grad = model.emb.weight.grad.numpy()
    assert np.abs(grad[3]).max() > 0 and not np.delete(grad, 3, 0).any()  # only the start token's row


@pytest.mark.parametrize("mode", ["RNN", "LSTM", "GRU"])
def test_a_cell_is_one_step_of_its_layer(mode):
    ft.manual_seed(11)
    layer, cell = getattr(nn, mode)(4, 5, batch_first=True), getattr(nn, mode + "Cell")(4, 5)
    assert [k for k, _ in cell.named_parameters()] == ["weight_ih", "weight_hh", "bias_ih", "bias_hh"]
    cell.load_state_dict({k.removesuffix("_l0"): v for k, v in layer.state_dict().items()})
    x = np.random.default_rng(12).standard_normal((3, 2, 4)).astype(np.float32)
    out, _ = layer(ft.tensor(x))
    state = None
    for t in range(2):
        state = cell(ft.tensor(x[:, t]), state)
        h = state[0] if mode == "LSTM" else state
        np.testing.assert_allclose(h.numpy(), out[:, t].numpy(), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose((cell(ft.tensor(x[0, 0]))[0] if mode == "LSTM" else cell(ft.tensor(x[0, 0]))).numpy(),
                               out[0, 0].numpy(), rtol=1e-6, atol=1e-7)  # one unbatched input


def predict_steps(self, input):
    """pytorch/examples' time sequence prediction: two LSTM cells over the steps, zero states of the batch size."""
    lib, outputs = self.lib, []
    h_t, c_t = lib.zeros(input.size(0), 6), lib.zeros(input.size(0), 6)
    h_t2, c_t2 = lib.zeros(input.size(0), 6), lib.zeros(input.size(0), 6)
    for input_t in input.split(1, dim=1):
        h_t, c_t = self.lstm1(input_t, (h_t, c_t))
        h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
        outputs += [self.linear(h_t2)]
    return lib.cat(outputs, dim=1)


class Sequence(nn.Module):
    lib, forward = ft, predict_steps

    def __init__(self):
        super().__init__()
        self.lstm1, self.lstm2, self.linear = nn.LSTMCell(1, 6), nn.LSTMCell(6, 6), nn.Linear(6, 1)


def test_cells_over_the_steps_compile_and_match_finite_differences():
    ft.manual_seed(13)
    model = Sequence()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.MSELoss(), batch_size=3, input_shape=(6,))
    x = np.sin(np.linspace(0, 5, 18)).reshape(3, 6).astype(np.float32)
    y = np.roll(x, -1, 1)
    np.testing.assert_allclose(program.predict(x).numpy(), model(ft.tensor(x)).numpy(), rtol=1e-5, atol=1e-6)
    assert gradcheck(program, x, y, eps=1e-3, rtol=3e-2, atol=1e-4)


@needs_torch
def test_cells_match_pytorch():
    class Theirs(torch.nn.Module):
        lib, forward = torch, predict_steps

        def __init__(self):
            super().__init__()
            self.lstm1, self.lstm2 = torch.nn.LSTMCell(1, 6), torch.nn.LSTMCell(6, 6)
            self.linear = torch.nn.Linear(6, 1)

    torch.manual_seed(14)
    theirs, model = Theirs(), Sequence()
    model.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()}, strict=True)
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), nn.MSELoss(), batch_size=3, input_shape=(6,))
    x = np.cos(np.linspace(0, 4, 18)).reshape(3, 6).astype(np.float32)
    y = np.roll(x, -1, 1)
    assert_gradients_match(program, theirs, x, y, torch.nn.functional.mse_loss, atol=1e-7)
    for mode in ("RNNCell", "GRUCell"):
        t, c = getattr(torch.nn, mode)(3, 4), getattr(nn, mode)(3, 4)
        assert repr(t) == repr(c)
        c.load_state_dict({k: v.detach().numpy() for k, v in t.state_dict().items()})
        h = np.random.default_rng(15).standard_normal((2, 4)).astype(np.float32)
        xs = np.ones((2, 3), np.float32)
        np.testing.assert_allclose(c(ft.tensor(xs), ft.tensor(h)).numpy(),
                                   t(torch.from_numpy(xs), torch.from_numpy(h)).detach().numpy(), rtol=1e-5, atol=1e-6)


def test_cells_refuse_bad_input():
    with pytest.raises(ValueError, match="RNNCell: unknown nonlinearity 'gelu'"):
        nn.RNNCell(3, 4, nonlinearity="gelu")
    with pytest.raises(ValueError, match=r"LSTMCell: expected an input of \(batch, input_size\) or \(input_size,\)"):
        nn.LSTMCell(3, 4)(ft.zeros(2, 5, 3))
    with pytest.raises(ValueError, match="RNN: unknown nonlinearity"):
        nn.RNN(3, 4, nonlinearity="sigmoid")


# ---- the fused LSTM step (ft.ops.lstm_cell_* and lstm_hidden_*) ----

def lstm_step(gates, c_prev):
    """c and h of gates (N, 4H) and c_prev (or None) in float64, with their derivatives' pieces."""
    i, f, g, o = np.split(gates.astype(np.float64), 4, axis=1)
    c = sigmoid(i) * np.tanh(g) + (0 if c_prev is None else sigmoid(f) * c_prev)
    return c, sigmoid(o) * np.tanh(c), (i, f, g, o)


@pytest.mark.parametrize("with_prev", [True, False])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fused_lstm_step_matches_the_cell_equations(with_prev, dtype):
    """Forward against the equations; backward against their derivatives (checked by central differences of the
    forward below): each backward writes only the gate columns it reads (the rest stay as given), and adds into
    them with accumulate."""
    rng = np.random.default_rng(40)
    N, H = 6, 5
    gates, c_prev, dc, dh = (rng.standard_normal(s).astype(np.float32) for s in ((N, 4 * H), (N, H), (N, H), (N, H)))
    prev = c_prev if with_prev else None
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == "float32" else dict(rtol=2e-2, atol=2e-2)
    t = lambda a: ft.tensor(a).to(dtype)
    n = lambda x: x.float().numpy().astype(np.float64)
    c_want, h_want, (i, f, g, o) = lstm_step(gates, prev)
    c = ft.ops.lstm_cell_forward(None, t(gates), t(prev) if with_prev else None)
    np.testing.assert_allclose(n(c), c_want, **tol)
    h = ft.ops.lstm_hidden_forward(None, t(gates), c)
    np.testing.assert_allclose(n(h), sigmoid(o) * np.tanh(n(c)), **tol)
    ds = lambda v: sigmoid(v) * (1 - sigmoid(v))
    want_cell = np.concatenate([dc * np.tanh(g) * ds(i), dc * (0 if prev is None else prev) * ds(f),
                                dc * sigmoid(i) * (1 - np.tanh(g) ** 2), np.full((N, H), 7.0)], 1)
    given = ft.tensor(np.full((N, 4 * H), 7.0, np.float32)).to(dtype)  # the o columns stay as given
    dgates, dprev = ft.ops.lstm_cell_backward(given, None, t(dc), t(gates), t(prev) if with_prev else None)
    assert dgates is given
    np.testing.assert_allclose(n(dgates), want_cell, **tol)
    if with_prev:
        np.testing.assert_allclose(n(dprev), dc * sigmoid(f), **tol)
    else:
        assert dprev is None
    cc = n(c)
    dgates, dc_h = ft.ops.lstm_hidden_backward(dgates, None, t(dh), t(gates), c, accumulate_gates=True)
    want_o = dh * np.tanh(cc) * ds(o)
    np.testing.assert_allclose(n(dgates), np.concatenate([want_cell[:, :3 * H], 7.0 + want_o], 1), **tol)
    np.testing.assert_allclose(n(dc_h), dh * sigmoid(o) * (1 - np.tanh(cc) ** 2), **tol)


def test_fused_lstm_step_derivatives_match_finite_differences():
    rng = np.random.default_rng(41)
    gates, c_prev, dh = (rng.standard_normal(s) for s in ((3, 8), (3, 2), (3, 2)))

    def h_of(gg, cp):
        c = ft.ops.lstm_cell_forward(None, ft.tensor(gg, dtype=ft.float32), ft.tensor(cp, dtype=ft.float32))
        return ft.ops.lstm_hidden_forward(None, ft.tensor(gg, dtype=ft.float32), c).numpy().astype(np.float64)

    f32 = lambda a: ft.tensor(a, dtype=ft.float32)
    c = ft.ops.lstm_cell_forward(None, f32(gates), f32(c_prev))
    dgates, dc = ft.ops.lstm_hidden_backward(None, None, f32(dh), f32(gates), c)
    dgates, dprev = ft.ops.lstm_cell_backward(dgates, None, dc, f32(gates), f32(c_prev), accumulate_gates=True)
    fd_g = np.zeros_like(gates)
    for idx in np.ndindex(*gates.shape):
        e = np.zeros_like(gates)
        e[idx] = 1e-3
        fd_g[idx] = ((h_of(gates + e, c_prev) - h_of(gates - e, c_prev)) * dh).sum() / 2e-3
    np.testing.assert_allclose(dgates.numpy(), fd_g, rtol=1e-2, atol=1e-4)
    fd_c = np.zeros_like(c_prev)
    for idx in np.ndindex(*c_prev.shape):
        e = np.zeros_like(c_prev)
        e[idx] = 1e-3
        fd_c[idx] = ((h_of(gates, c_prev + e) - h_of(gates, c_prev - e)) * dh).sum() / 2e-3
    np.testing.assert_allclose(dprev.numpy(), fd_c, rtol=1e-2, atol=1e-4)


def test_fused_lstm_step_bad_input():
    g, c = ft.zeros(2, 8), ft.zeros(2, 2)
    with pytest.raises(ValueError, match="lstm_cell: gates must have 4H columns"):
        ft.ops.lstm_cell_forward(None, ft.zeros(2, 7))
    with pytest.raises(ValueError, match=r"lstm_cell: c_prev should have shape \(2, 2\), got \(2, 3\)"):
        ft.ops.lstm_cell_forward(None, g, ft.zeros(2, 3))
    with pytest.raises(ValueError, match=r"lstm_cell: gates should have 2 dimensions"):
        ft.ops.lstm_cell_forward(None, ft.zeros(8))
    with pytest.raises(TypeError, match="lstm_hidden: c must be float32 or bfloat16"):
        ft.ops.lstm_hidden_forward(None, g, ft.zeros(2, 2, dtype=ft.int64))
    with pytest.raises(ValueError, match="lstm_cell_backward: dc_prev needs c_prev"):
        ft.ops.lstm_cell_backward(None, ft.zeros(2, 2), c, g, None)
    with pytest.raises(ValueError, match="accumulate=True adds into the gradient tensors given"):
        ft.ops.lstm_hidden_backward(None, None, c, g, c, accumulate_gates=True)
    with pytest.raises(ValueError, match="lstm_cell: c partly overlaps gates"):
        ft.ops.lstm_cell_forward(g[:, :2], g)
