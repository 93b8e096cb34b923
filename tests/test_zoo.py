"""A zoo of models as PyTorch users write them, each compiled by tracing its forward: its gradients match
finite differences on a tiny instance, a few steps lower the loss, and where torch imports the same model
built in PyTorch (weights copied by name) gives the same loss and gradients."""
import numpy as np
import pytest

import fasttrain as ft
from fasttrain import nn
from fasttrain.nn import functional as F
from fasttrain.testing import gradcheck


class AudioCNN(nn.Module):
    """A 1-d CNN over (channels, time) signals."""

    def __init__(self, classes=4):
        super().__init__()
        self.conv1 = nn.Conv1d(2, 8, 5, padding=2)
        self.bn1 = nn.BatchNorm1d(8)
        self.pool = nn.MaxPool1d(2)
        self.conv2 = nn.Conv1d(8, 8, 3, padding=2, dilation=2, bias=False)
        self.bn2 = nn.BatchNorm1d(8)
        self.head = nn.Linear(8, classes)

    def forward(self, x):
        x = self.pool(F.relu(self.bn1(self.conv1(x))))
        x = F.relu(self.bn2(self.conv2(x)) + x)
        return self.head(x.mean(2))


class LogSoftmaxMLP(nn.Module):
    """log_softmax outputs trained with NLLLoss, features through BatchNorm1d."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(6, 16)
        self.bn = nn.BatchNorm1d(16)
        self.fc2 = nn.Linear(16, 4)
        self.out = nn.LogSoftmax(dim=1)

    def forward(self, x):
        return self.out(self.fc2(F.silu(self.bn(self.fc1(x)))))


class SequenceMLP(nn.Module):
    """Per-step features (T, C): a linear over the last dimension, layer norm, softmax attention-free pooling."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(5, 8)
        self.norm = nn.LayerNorm(8)
        self.score = nn.Linear(8, 8)
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        h = self.norm(F.gelu(self.proj(x)))
        w = F.softmax(self.score(h), dim=1)  # over the steps
        return self.head((h * w).mean(1))


class TinySegNet(nn.Module):
    """Group norm and nearest upsampling: an encoder-decoder classifying pixels' sums."""

    def __init__(self):
        super().__init__()
        self.down = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.gn = nn.GroupNorm(4, 8)
        self.up = nn.Upsample(scale_factor=2)
        self.mix = nn.Conv2d(11, 4, 3, padding=1)

    def forward(self, x):
        h = self.up(F.silu(self.gn(self.down(x))))
        return self.mix(ft.cat([h, x], dim=1)).mean((2, 3))


class TokenCNN(nn.Module):
    """Token ids through an embedding (padding row 0), a 1-d convolution over the steps, mean pooling."""

    def __init__(self, vocab=11):
        super().__init__()
        self.embed = nn.Embedding(vocab, 6, padding_idx=0)
        self.conv = nn.Conv1d(6, 8, 3, padding=1)
        self.norm = nn.GroupNorm(2, 8)
        self.head = nn.Linear(8, 4)

    def forward(self, ids):
        h = self.embed(ids).transpose(1, 2)  # (N, T, D) -> (N, D, T)
        return self.head(F.gelu(self.norm(self.conv(h))).mean(2))


class ViTTiny(nn.Module):
    """Patch embedding by a strided convolution, a class token, learned positions, two pre-norm encoder
    layers, the class token's features classified."""

    def __init__(self, dim=16, heads=4, classes=4):
        super().__init__()
        self.patch = nn.Conv2d(3, dim, 4, stride=4)  # 8x8 images: 2x2 patches
        self.cls_token = nn.Parameter(ft.zeros(1, 1, dim))
        self.pos = nn.Parameter(nn.init.normal_(ft.empty(1, 5, dim), std=0.1))
        self.blocks = nn.ModuleList([nn.TransformerEncoderLayer(dim, heads, 32, dropout=0.0, activation="gelu",
                                                                batch_first=True, norm_first=True)
                                     for _ in range(2)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)  # (N, 4, dim)
        x = ft.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)[:, 0])


class GPTBlock(nn.Module):
    """A GPT-2 style model of one block: token and position embeddings, causal self-attention and an MLP with
    pre-norms, the output projection tied to the token embedding."""

    def __init__(self, vocab=13, dim=16, heads=2, steps=8):
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Parameter(nn.init.normal_(ft.empty(1, steps, dim), std=0.1))
        self.ln_1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.ln_2 = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, 4 * dim)
        self.proj = nn.Linear(4 * dim, dim)
        self.ln_f = nn.LayerNorm(dim)

    def forward(self, ids):
        x = self.wte(ids) + self.wpe
        h = self.ln_1(x)
        x = x + self.attn(h, h, h, need_weights=False, is_causal=True)[0]
        x = x + self.proj(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))
        return F.linear(self.ln_f(x), self.wte.weight)  # tied: the embedding's transpose


class HandAttention(nn.Module):
    """Attention written with @ (per-sample matrix products), softmax and a parameter matrix."""

    def __init__(self):
        super().__init__()
        self.qk = nn.Linear(5, 6)
        self.w = nn.Parameter(nn.init.normal_(ft.empty(6, 4), std=0.5))

    def forward(self, x):
        h = self.qk(x)  # (N, T, 6)
        scores = h @ h.transpose(1, 2) * (6 ** -0.5)
        return (F.softmax(scores, dim=-1) @ h @ self.w).mean(1)


class LayerScaleNet(nn.Module):
    """Tensors broadcast against samples: a per-channel (C, 1, 1) layer scale of images, a (C, 1) scale of
    sequences, a per-feature bias of (T, D) steps."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.gamma = nn.Parameter(nn.init.normal_(ft.empty(4, 1, 1), 1.0, 0.2))
        self.seq_scale = nn.Parameter(nn.init.normal_(ft.empty(4, 1), 1.0, 0.2))
        self.bias = nn.Parameter(nn.init.normal_(ft.empty(6), 0.0, 0.2))
        self.head = nn.Linear(6, 4)

    def forward(self, x):
        h = F.relu(self.conv(x) * self.gamma)  # (N, 4, 6, 6)
        s = h.flatten(2)[:, :, :6] * self.seq_scale  # (N, 4, 6) sequences
        return self.head(F.gelu(s + self.bias)).mean(1)


class SENet(nn.Module):
    """Broadcasting between traced values: a squeeze-and-excitation gate (N, C, 1, 1) over (N, C, H, W) maps, a
    division by a sum over channels, a mean over the channels of every pixel."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.fc1, self.fc2 = nn.Linear(8, 4), nn.Linear(4, 8)
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        h = F.silu(self.bn(self.conv(x)))
        w = h.mean((2, 3), keepdim=True).flatten(1)
        gate = F.sigmoid(self.fc2(F.relu(self.fc1(w)))).reshape(x.shape[0], -1, 1, 1)
        h = h * gate
        h = h / (h.abs().sum(1, keepdim=True) + 1.0) - h.mean(1, keepdim=True)
        return self.head(h.mean((2, 3)))


class NormByHand(nn.Module):
    """Normalizations written out on (T, C) steps: RMSNorm with rsqrt, layer norm with var and sqrt, a
    logsumexp with exp and log, a standard deviation and a cube."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(5, 6)
        self.weight = nn.Parameter(nn.init.normal_(ft.empty(6), 1.0, 0.1))
        self.head = nn.Linear(6, 4)

    def forward(self, x):
        h = self.proj(x)  # (N, T, 6)
        h = h * (h.pow(2).mean(-1, keepdim=True) + 1e-6).rsqrt() * self.weight
        h = (h - h.mean(-1, keepdim=True)) / (h.var(-1, unbiased=False, keepdim=True) + 1e-5).sqrt()
        lse = (h.exp().sum(1) + 1.0).log()  # (N, 6) over the steps
        return self.head(lse + 0.1 * h.std(1) + 0.01 * (h ** 3).sum(1))


def next_token_loss(logits, targets):
    """Cross-entropy of every position's logits (N, T, V) against the next tokens (N, T)."""
    return F.cross_entropy(logits.transpose(1, 2), targets)


def smooth_hinge(out, y):
    """A custom loss: cross-entropy plus a small penalty on the logits' size."""
    return F.cross_entropy(out, y, label_smoothing=0.05) + 0.01 * (out * out).mean()


ZOO = {
    "audio_cnn": (AudioCNN, (2, 16), nn.CrossEntropyLoss(), "contiguous"),
    "logsoftmax_mlp": (LogSoftmaxMLP, (6,), nn.NLLLoss(), "contiguous"),
    "sequence_mlp": (SequenceMLP, (7, 5), smooth_hinge, "contiguous"),
    "tiny_segnet": (TinySegNet, (3, 6, 6), nn.CrossEntropyLoss(), "channels_last"),
    "token_cnn": (TokenCNN, (9,), nn.CrossEntropyLoss(), "contiguous"),
    "vit_tiny": (ViTTiny, (3, 8, 8), nn.CrossEntropyLoss(), "channels_last"),
    "gpt_block": (GPTBlock, (8,), next_token_loss, "contiguous"),
    "hand_attention": (HandAttention, (7, 5), nn.CrossEntropyLoss(), "contiguous"),
    "layer_scale": (LayerScaleNet, (3, 6, 6), nn.CrossEntropyLoss(), "channels_last"),
    "se_net": (SENet, (3, 6, 6), nn.CrossEntropyLoss(), "channels_last"),
    "norm_by_hand": (NormByHand, (7, 5), nn.CrossEntropyLoss(), "contiguous"),
}
TOKENS = {"token_cnn": 11, "gpt_block": 13}  # the vocabularies of the models that read token ids


def data(name, n=8, classes=4, seed=0):
    rng = np.random.default_rng(seed)
    shape = ZOO[name][1]
    if name == "gpt_block":
        tokens = rng.integers(0, TOKENS[name], (n, shape[0] + 1))
        return tokens[:, :-1], tokens[:, 1:]
    x = rng.integers(0, TOKENS[name], (n, *shape)) if name in TOKENS else rng.standard_normal((n, *shape)).astype(
        np.float32)
    return x, rng.integers(0, classes, n)


def build(name, seed=0):
    cls, shape, loss, fmt = ZOO[name]
    ft.manual_seed(seed)
    model = cls()
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), loss, batch_size=8,
                            input_shape=shape, memory_format=fmt,
                            input_dtype=ft.int64 if name in TOKENS else None)
    return model, program, shape


@pytest.mark.parametrize("name", ZOO)
def test_gradients_match_finite_differences(name):
    model, program, shape = build(name)
    x, y = data(name)
    if name == "token_cnn":  # the padding row takes no gradient by definition (as in PyTorch): no padding here
        x = np.maximum(x, 1)
    # eps small: max pooling and ReLU have kinks a wide step would cross
    assert gradcheck(program, x, y, eps=1e-3, rtol=3e-2, atol=2e-3)


@pytest.mark.parametrize("name", ZOO)
def test_a_few_steps_lower_the_loss(name):
    model, program, shape = build(name)
    x, y = data(name)
    first = program.train_step(x, y)
    for _ in range(15):
        last = program.train_step(x, y)
    assert last < first, (first, last)


def torch_twin(name, torch):
    tnn, tF = torch.nn, torch.nn.functional
    if name == "audio_cnn":
        class T(tnn.Module):
            def __init__(self):
                super().__init__()
                self.conv1, self.bn1 = tnn.Conv1d(2, 8, 5, padding=2), tnn.BatchNorm1d(8)
                self.pool = tnn.MaxPool1d(2)
                self.conv2, self.bn2 = tnn.Conv1d(8, 8, 3, padding=2, dilation=2, bias=False), tnn.BatchNorm1d(8)
                self.head = tnn.Linear(8, 4)

            def forward(self, x):
                x = self.pool(tF.relu(self.bn1(self.conv1(x))))
                x = tF.relu(self.bn2(self.conv2(x)) + x)
                return self.head(x.mean(2))
        return T(), tnn.CrossEntropyLoss()
    if name == "tiny_segnet":
        class G(tnn.Module):
            def __init__(self):
                super().__init__()
                self.down, self.gn = tnn.Conv2d(3, 8, 3, stride=2, padding=1), tnn.GroupNorm(4, 8)
                self.up, self.mix = tnn.Upsample(scale_factor=2), tnn.Conv2d(11, 4, 3, padding=1)

            def forward(self, x):
                h = self.up(tF.silu(self.gn(self.down(x))))
                return self.mix(torch.cat([h, x], dim=1)).mean((2, 3))
        return G(), tnn.CrossEntropyLoss()
    if name == "token_cnn":
        class E(tnn.Module):
            def __init__(self):
                super().__init__()
                self.embed, self.conv = tnn.Embedding(11, 6, padding_idx=0), tnn.Conv1d(6, 8, 3, padding=1)
                self.norm, self.head = tnn.GroupNorm(2, 8), tnn.Linear(8, 4)

            def forward(self, ids):
                return self.head(tF.gelu(self.norm(self.conv(self.embed(ids).transpose(1, 2)))).mean(2))
        return E(), tnn.CrossEntropyLoss()
    if name == "layer_scale":
        class L(tnn.Module):
            def __init__(self):
                super().__init__()
                self.conv, self.head = tnn.Conv2d(3, 4, 3, padding=1), tnn.Linear(6, 4)
                self.gamma, self.seq_scale = tnn.Parameter(torch.ones(4, 1, 1)), tnn.Parameter(torch.ones(4, 1))
                self.bias = tnn.Parameter(torch.zeros(6))

            def forward(self, x):
                h = tF.relu(self.conv(x) * self.gamma)
                s = h.flatten(2)[:, :, :6] * self.seq_scale
                return self.head(tF.gelu(s + self.bias)).mean(1)
        return L(), tnn.CrossEntropyLoss()
    if name == "se_net":
        class SE(tnn.Module):
            def __init__(self):
                super().__init__()
                self.conv, self.bn = tnn.Conv2d(3, 8, 3, padding=1), tnn.BatchNorm2d(8)
                self.fc1, self.fc2, self.head = tnn.Linear(8, 4), tnn.Linear(4, 8), tnn.Linear(8, 4)

            def forward(self, x):
                h = tF.silu(self.bn(self.conv(x)))
                w = h.mean((2, 3), keepdim=True).flatten(1)
                gate = torch.sigmoid(self.fc2(tF.relu(self.fc1(w)))).reshape(x.shape[0], -1, 1, 1)
                h = h * gate
                h = h / (h.abs().sum(1, keepdim=True) + 1.0) - h.mean(1, keepdim=True)
                return self.head(h.mean((2, 3)))
        return SE(), tnn.CrossEntropyLoss()
    if name == "norm_by_hand":
        class NH(tnn.Module):
            def __init__(self):
                super().__init__()
                self.proj, self.head = tnn.Linear(5, 6), tnn.Linear(6, 4)
                self.weight = tnn.Parameter(torch.ones(6))

            def forward(self, x):
                h = self.proj(x)
                h = h * (h.pow(2).mean(-1, keepdim=True) + 1e-6).rsqrt() * self.weight
                h = (h - h.mean(-1, keepdim=True)) / (h.var(-1, unbiased=False, keepdim=True) + 1e-5).sqrt()
                lse = (h.exp().sum(1) + 1.0).log()
                return self.head(lse + 0.1 * h.std(1) + 0.01 * (h ** 3).sum(1))
        return NH(), tnn.CrossEntropyLoss()
    if name == "hand_attention":
        class A(tnn.Module):
            def __init__(self):
                super().__init__()
                self.qk, self.w = tnn.Linear(5, 6), tnn.Parameter(torch.zeros(6, 4))

            def forward(self, x):
                h = self.qk(x)
                return (tF.softmax(h @ h.transpose(1, 2) * (6 ** -0.5), dim=-1) @ h @ self.w).mean(1)
        return A(), tnn.CrossEntropyLoss()
    if name == "vit_tiny":
        class V(tnn.Module):
            def __init__(self):
                super().__init__()
                self.patch = tnn.Conv2d(3, 16, 4, stride=4)
                self.cls_token, self.pos = tnn.Parameter(torch.zeros(1, 1, 16)), tnn.Parameter(torch.zeros(1, 5, 16))
                self.blocks = tnn.ModuleList([tnn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, activation="gelu",
                                                                          batch_first=True, norm_first=True)
                                              for _ in range(2)])
                self.norm, self.head = tnn.LayerNorm(16), tnn.Linear(16, 4)

            def forward(self, x):
                x = self.patch(x).flatten(2).transpose(1, 2)
                x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
                for block in self.blocks:
                    x = block(x)
                return self.head(self.norm(x)[:, 0])
        return V(), tnn.CrossEntropyLoss()
    if name == "gpt_block":
        class G2(tnn.Module):
            def __init__(self):
                super().__init__()
                self.wte, self.wpe = tnn.Embedding(13, 16), tnn.Parameter(torch.zeros(1, 8, 16))
                self.ln_1, self.attn = tnn.LayerNorm(16), tnn.MultiheadAttention(16, 2, batch_first=True)
                self.ln_2, self.fc, self.proj = tnn.LayerNorm(16), tnn.Linear(16, 64), tnn.Linear(64, 16)
                self.ln_f = tnn.LayerNorm(16)

            def forward(self, ids):
                x = self.wte(ids) + self.wpe
                h = self.ln_1(x)
                causal = torch.triu(torch.full((8, 8), float("-inf")), diagonal=1)
                x = x + self.attn(h, h, h, need_weights=False, attn_mask=causal)[0]
                x = x + self.proj(tF.gelu(self.fc(self.ln_2(x)), approximate="tanh"))
                return tF.linear(self.ln_f(x), self.wte.weight)
        return G2(), lambda out, y: tF.cross_entropy(out.transpose(1, 2), y)
    class S(tnn.Module):
        def __init__(self):
            super().__init__()
            self.proj, self.norm = tnn.Linear(5, 8), tnn.LayerNorm(8)
            self.score, self.head = tnn.Linear(8, 8), tnn.Linear(8, 4)

        def forward(self, x):
            h = self.norm(tF.gelu(self.proj(x)))
            return self.head((h * tF.softmax(self.score(h), dim=1)).mean(1))
    return S(), lambda out, y: tF.cross_entropy(out, y, label_smoothing=0.05) + 0.01 * (out * out).mean()


class TorchLogSoftmaxMLP:
    @staticmethod
    def make(torch):
        tnn, tF = torch.nn, torch.nn.functional

        class M(tnn.Module):
            def __init__(self):
                super().__init__()
                self.fc1, self.bn, self.fc2 = tnn.Linear(6, 16), tnn.BatchNorm1d(16), tnn.Linear(16, 4)

            def forward(self, x):
                return tF.log_softmax(self.fc2(tF.silu(self.bn(self.fc1(x)))), dim=1)
        return M(), tnn.NLLLoss()


@pytest.mark.parametrize("name", ZOO)
def test_matches_pytorch(name):
    torch = pytest.importorskip("torch")
    model, program, shape = build(name)
    x, y = data(name)
    loss = program.backward(x, y)
    tm, tloss = TorchLogSoftmaxMLP.make(torch) if name == "logsoftmax_mlp" else torch_twin(name, torch)
    tm.load_state_dict({k: torch.from_numpy(v) for k, v in model.state_dict().items()}, strict=True)
    tm.train()
    want = tloss(tm(torch.from_numpy(x)), torch.from_numpy(y))
    want.backward()
    assert loss == pytest.approx(want.item(), rel=1e-4)
    for n, p in tm.named_parameters():
        np.testing.assert_allclose(dict(model.named_parameters())[n].grad.numpy(), p.grad.numpy(), rtol=2e-3,
                                   atol=2e-5, err_msg=n)


def test_a_training_loop_by_hand_sums_gradients_as_pytorch():
    """zero_grad, backward twice, step: the update uses the sum of both batches' gradients (docs/models.md)."""
    model, program, shape = build("sequence_mlp")
    (x1, y1), (x2, y2) = data("sequence_mlp", seed=1), data("sequence_mlp", seed=2)
    single = []
    for x, y in ((x1, y1), (x2, y2)):
        program.optimizer.zero_grad()
        program.backward(x, y)
        single.append({n: p.grad.numpy().copy() for n, p in model.named_parameters()})
    program.optimizer.zero_grad()
    program.backward(x1, y1)
    program.backward(x2, y2)
    before = {n: p.numpy().copy() for n, p in model.named_parameters()}
    program.optimizer.step()
    for n, p in model.named_parameters():
        np.testing.assert_allclose(p.grad.numpy(), single[0][n] + single[1][n], rtol=1e-6, atol=1e-7, err_msg=n)
        # SGD with momentum 0.9, first step: p - lr * grad
        np.testing.assert_allclose(p.numpy(), before[n] - 0.05 * p.grad.numpy(), rtol=1e-5, atol=1e-7, err_msg=n)


@pytest.mark.parametrize("name", ZOO)
def test_summary_counts_every_parameter_once(name):
    """Parameters read through F.linear, a value node or a tied weight are counted, the tied one once."""
    model, program, _ = build(name)
    total = sum(p.numel() for p in model.parameters())
    assert f"parameters: {total:,}" in program.summary()


@pytest.mark.parametrize("make, error, match", [
    (lambda: nn.MultiheadAttention(8, 2), ValueError, r"batch_first=True"),
    (lambda: nn.MultiheadAttention(8, 2, dropout=1.5, batch_first=True), ValueError, r"dropout must be in \[0, 1\]"),
    (lambda: nn.MultiheadAttention(8, 3, batch_first=True), ValueError, r"divisible by num_heads"),
    (lambda: nn.TransformerEncoderLayer(8, 2, dropout=0.0, activation="tanh", batch_first=True), ValueError,
     r"activation"),
    (lambda: nn.GroupNorm(3, 8), ValueError, r"divisible by num_groups"),
    (lambda: nn.Embedding(10, 4, padding_idx=10), ValueError, r"padding_idx 10"),
    (lambda: nn.Embedding(10, 4, max_norm=1.0), NotImplementedError, r"max_norm"),
    (lambda: nn.Upsample(scale_factor=2, mode="bicubic"), NotImplementedError, r"'nearest', 'bilinear'"),
    (lambda: nn.Upsample(), ValueError, r"exactly one of size and scale_factor"),
    (lambda: nn.InstanceNorm2d(3, track_running_stats=True), NotImplementedError, r"track_running_stats=True"),
    (lambda: ft.nn.functional.pad(ft.ones(1, 1, 2, 2), (2, 2), mode="reflect"), ValueError,
     r"mode='reflect' cannot pad dimension 3 of size 2 by \(2, 2\)"),
    (lambda: nn.Conv1d(2, 4, 3, padding="full"), ValueError,
     r"padding must be a number of elements, 'valid' or 'same'"),
    (lambda: nn.Conv2d(2, 4, 3, stride=2, padding="same"), ValueError, r"'same' is not supported for strided"),
    (lambda: nn.ConvTranspose2d(2, 4, 3, padding="same"), ValueError, r"padding must be a number of elements"),
    (lambda: nn.Softmax(), ValueError, r"give dim"),
    (lambda: nn.Softplus(beta=0.0), ValueError, r"beta must not be 0"),
])
def test_unsupported_layer_arguments_are_refused_at_construction(make, error, match):
    with pytest.raises(error, match=match):
        make()


@pytest.mark.parametrize("build_model, shape, match", [
    (lambda: nn.Conv1d(2, 4, 3), (2, 8, 8), r"Conv1d takes samples of 2 dimensions"),
    (lambda: nn.BatchNorm1d(4), (4, 2, 2), r"BatchNorm1d takes samples of 1 or 2 dimensions"),
    (lambda: nn.Upsample(scale_factor=1.5), (2, 4, 4), r"not an integer factor"),
    (lambda: nn.Sequential(nn.Linear(4, 4), nn.Softmax(dim=2)), (4,), r"out of range"),
])
def test_layers_given_samples_they_cannot_take_say_so_when_compiled(build_model, shape, match):
    model = build_model()
    with pytest.raises((ValueError, NotImplementedError, IndexError), match=match):
        model.compile(ft.optim.SGD(list(model.parameters()) or [ft.nn.Parameter(ft.zeros(1))], lr=0.1),
                      lambda out, y: out.sum(), batch_size=2, input_shape=shape)


def test_layer_reprs_read_as_pytorchs():
    """A layer's repr names its arguments as PyTorch's does (PyTorch's newer `bias=` of the norms aside)."""
    torch = pytest.importorskip("torch")
    tnn = torch.nn
    pairs = [(nn.Conv2d(3, 8, 3, padding=1), tnn.Conv2d(3, 8, 3, padding=1)),
             (nn.Linear(4, 5, bias=False), tnn.Linear(4, 5, bias=False)),
             (nn.BatchNorm2d(8), tnn.BatchNorm2d(8)), (nn.LayerNorm(16), tnn.LayerNorm(16)),
             (nn.Dropout(0.1), tnn.Dropout(0.1)), (nn.MaxPool2d(2), tnn.MaxPool2d(2)),
             (nn.AvgPool2d(3, 2, 1), tnn.AvgPool2d(3, 2, 1)), (nn.Embedding(10, 4, padding_idx=0),
                                                            tnn.Embedding(10, 4, padding_idx=0)),
             (nn.GELU(approximate="tanh"), tnn.GELU(approximate="tanh")), (nn.GELU(), tnn.GELU()),
             (nn.ReLU(), tnn.ReLU()), (nn.ReLU(inplace=True), tnn.ReLU(inplace=True)),
             (nn.LeakyReLU(0.2), tnn.LeakyReLU(0.2)), (nn.Upsample(scale_factor=2), tnn.Upsample(scale_factor=2)),
             (nn.Softmax(dim=-1), tnn.Softmax(dim=-1)), (nn.GroupNorm(2, 8), tnn.GroupNorm(2, 8))]
    for ours, theirs in pairs:
        want = repr(theirs).replace(", bias=True)", ")").replace(", bias=True,", ",")
        assert repr(ours) == want, (repr(ours), want)


def test_pytorch_names_fasttrain_lacks_say_what_to_write_instead():
    """A port reaching for a layer or function fasttrain does not have gets an AttributeError with the way on (it
    was a bare one), and hasattr stays False for them; a 3-d layer's name exists, so that a file naming it as a
    default argument (torchvision's ops/misc.py) imports, and building one says what to write instead."""
    with pytest.raises(NotImplementedError, match=r"nn.Conv3d: 3-d .* fold the depth into the batch"):
        nn.Conv3d(3, 4, 3)
    for get, match in ((lambda: nn.functional.conv3d, "3-d .* fold the depth into the batch"),
                       (lambda: nn.functional.grid_sample, "spatial transformers"),
                       (lambda: ft.nn.utils.rnn.pack_padded_sequence, "pad the batch to one length"),
                       (lambda: nn.LazyConv3d, "3-d .* fold the depth into the batch"),
                       (lambda: nn.NoSuchLayer, "see docs/models.md")):
        with pytest.raises(AttributeError, match=match):
            get()
    assert not hasattr(nn.functional, "conv3d") and hasattr(nn, "Conv2d") and not hasattr(nn.functional, "ctc_loss")
