"""Images/s of whole training steps (forward, loss, backward, SGD update) on Fashion-MNIST-shaped batches, for the
demo network and a ResNet-style network (also written as a PyTorch-style subclass and traced), at batch 256 and 512,
against the FMA peak of this machine and against the same network, recipe and thread count in PyTorch
(channels_last) when torch imports; then AdamW steps of a ViT on 32x32 images (batch 64), of the same with BEiT's
relative position biases given to F.scaled_dot_product_attention as attn_mask ("beit"), and of GPT-2 blocks on
128-token sequences (batch 16, next-token cross-entropy; "gpt" with nn.MultiheadAttention, "mingpt" with minGPT's
attention written out: q @ k.transpose(-2, -1), a mask buffer, att @ v) and of an nn.Transformer translating
64-token sources into 64-token targets (batch 16; two inputs, PyTorch's masks and default dropout), against the same
models in PyTorch; and DCGAN iterations on 28x28 images (batch 64; a discriminator step, then a generator step, two
programs that read each other's modules: "images/s" is generated images per second of iterations).

JSON lines: {"name", "value", "unit"} plus "peak_fraction" (the step's model FLOPs per second, 3x the forward
FLOPs, over the FMA peak measured in the same run with bench_ops.Limits; the nominal count includes the
zero-padding taps, so small images overstate the work a little) and, with torch, "reference" (torch's
images/s) and "ratio" (ours / torch). Medians of timed steps after warm-up; fasttrain and torch steps
alternate so that load on a shared machine hits both alike.

Where the CPU has AVX512-BF16, each demo, ResNet, ViT, BEiT, GPT, minGPT, seq2seq and DCGAN line has a "_bf16" twin: the
same step
compiled with precision="bf16-mixed", with "ratio_float32" (over fasttrain's float32 step), "ratio" over
PyTorch's step under torch.autocast("cpu", dtype=torch.bfloat16) (channels_last for the CNNs), and
"peak_fraction" over "bf16_matmul_peak", a large bfloat16 matmul's GFLOP/s measured in the same run.

With --full it also trains both to accuracy with the demo's recipe (examples/demo.py against
benchmarks/reference/torch_fashion_mnist.py) and reports the time to 92% and 93% test accuracy.

With --device cuda (cudabench.py has the options and the timing) the models, optimizers and batches live
on the CUDA device (model.to("cuda") before the optimizer is built; torch's model and batches on the same
device, channels_last), at batch 256 and 512 with or without --quick (--quick takes fewer samples). A sample
is the mean step time over enough steps between two device synchronisations to last about 20 ms (50 ms
without --quick), after 5 warm-up steps; fasttrain and torch samples alternate; the figure is the median
sample. "peak_fraction" is against the device's "fp32_fma_peak" (an FMA kernel built with nvcc; absent
without nvcc). fasttrain's train_step returns the loss as a float, so each of its steps waits for the
device once; torch's step leaves its loss on the device. The issue's target, a demo-network step at 1.2x
torch's images/s or more, is the "target" field of the demo lines: reported, not asserted. --full trains
on the CPU only.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE PYTHONPATH=python python benchmarks/bench_train.py [--quick] [--full]
    PYTHONPATH=python python benchmarks/bench_train.py --device cuda [--quick] [--tf32]
"""
import argparse
import functools
import json
import math
import os
import statistics
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [HERE, os.path.join(ROOT, "examples"), os.path.join(HERE, "reference")]

import cudabench  # noqa: E402
import fasttrain as ft  # noqa: E402
import gan  # noqa: E402
from bench_ops import Limits  # noqa: E402

try:
    import torch
except ImportError:
    torch = None


def emit(name, value, unit, **extra):
    print(json.dumps({"name": name, "value": round(value, 4) if isinstance(value, float) else value, "unit": unit,
                      **extra}), flush=True)


def resnet(M, traced=False):
    """A small ResNet for 1x28x28: a stem, per stage a residual block and a strided transition, global average
    pooling and a linear classifier. M is ft.nn or torch.nn; ft builds it as an nn.Model graph, or with
    traced=True as PyTorch's code is written (an nn.Module subclass in nn.Sequential, traced by compile)."""
    widths = (32, 64, 128)
    if M is ft.nn and not traced:
        x = M.Input((1, 28, 28))
        h = M.ReLU()(M.BatchNorm2d(32)(M.Conv2d(1, 32, 3, padding=1, bias=False)(x)))
        for i, w in enumerate(widths):
            y = M.ReLU()(M.BatchNorm2d(w)(M.Conv2d(w, w, 3, padding=1, bias=False)(h)))
            y = M.BatchNorm2d(w)(M.Conv2d(w, w, 3, padding=1, bias=False)(y))
            h = M.ReLU()(y + h)
            if i + 1 < len(widths):
                h = M.ReLU()(M.BatchNorm2d(widths[i + 1])(M.Conv2d(w, widths[i + 1], 3, stride=2, padding=1,
                                                                    bias=False)(h)))
        out = M.Linear(widths[-1], 10)(M.Flatten()(M.AdaptiveAvgPool2d(1)(h)))
        return M.Model(x, out)

    class Block(M.Module):
        def __init__(self, w):
            super().__init__()
            self.c1, self.b1 = M.Conv2d(w, w, 3, padding=1, bias=False), M.BatchNorm2d(w)
            self.c2, self.b2 = M.Conv2d(w, w, 3, padding=1, bias=False), M.BatchNorm2d(w)

        def forward(self, h):
            y = M.functional.relu(self.b1(self.c1(h)))
            return M.functional.relu(self.b2(self.c2(y)) + h)

    layers = [M.Conv2d(1, 32, 3, padding=1, bias=False), M.BatchNorm2d(32), M.ReLU()]
    for i, w in enumerate(widths):
        layers.append(Block(w))
        if i + 1 < len(widths):
            layers += [M.Conv2d(w, widths[i + 1], 3, stride=2, padding=1, bias=False), M.BatchNorm2d(widths[i + 1]),
                       M.ReLU()]
    return M.Sequential(*layers, M.AdaptiveAvgPool2d(1), M.Flatten(), M.Linear(widths[-1], 10))


def ft_step(net, batch, dev="cpu", precision="32-true"):
    import demo
    model = demo.make_model() if net == "demo" else resnet(ft.nn, traced=net == "resnet_traced")
    if dev != "cpu":
        model.to(dev)  # in place, before the optimizer takes the parameters
    opt = ft.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-4)
    program = model.compile(opt, ft.nn.CrossEntropyLoss(label_smoothing=0.1), batch_size=batch,
                            input_shape=(1, 28, 28), precision=precision)
    rng = np.random.default_rng(0)
    x = ft.tensor(rng.standard_normal((batch, 1, 28, 28)).astype(np.float32)).to(dev)
    y = ft.tensor(rng.integers(0, 10, batch)).to(dev)
    return (lambda: program.train_step(x, y)), 3 * program.flops_per_sample()


def torch_step(net, batch, dev="cpu", bf16=False):
    import torch_fashion_mnist as ref
    model = (ref.make_model() if net == "demo" else resnet(torch.nn)).to(dev, memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-4)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(batch, 1, 28, 28, generator=gen).to(dev).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (batch,), generator=gen).to(dev)

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = torch.nn.functional.cross_entropy(model(x), y, label_smoothing=0.1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return step


def vit(lib, dim=128, depth=4, heads=4, patch=4, image=32, classes=10):
    """A ViT (pre-norm encoder layers over 4x4 patches of 32x32 images and a class token), written the same
    way for lib = fasttrain or torch."""
    nn = lib.nn
    tokens = (image // patch) ** 2

    class ViT(nn.Module):
        def __init__(self):
            super().__init__()
            self.patch = nn.Conv2d(3, dim, patch, stride=patch)
            self.cls_token = nn.Parameter(lib.zeros(1, 1, dim))
            self.pos = nn.Parameter(lib.zeros(1, tokens + 1, dim))
            self.blocks = nn.ModuleList([nn.TransformerEncoderLayer(dim, heads, 2 * dim, dropout=0.0, activation="gelu",
                                                                    batch_first=True, norm_first=True)
                                         for _ in range(depth)])
            self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, classes)

        def forward(self, x):
            x = self.patch(x).flatten(2).transpose(1, 2)
            x = lib.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
            for block in self.blocks:
                x = block(x)
            return self.head(self.norm(x)[:, 0])
    return ViT()


def gpt(lib, vocab=512, steps=128, dim=128, heads=4, depth=2, hand=False):
    """GPT-2 blocks (causal self-attention and a tanh-GELU MLP, pre-norm) with the output projection tied to
    the token embedding, written the same way for lib = fasttrain or torch (torch's attention takes the causal
    mask as attn_mask, fasttrain's as is_causal). hand: minGPT's attention (nanoGPT's without flash) written
    out instead: q @ k.transpose(-2, -1) of heads viewed from one projection, a causal mask buffer, att @ v."""
    nn, F = lib.nn, lib.nn.functional
    causal = dict(is_causal=True) if lib is ft else dict(
        attn_mask=torch.triu(torch.full((steps, steps), float("-inf")), diagonal=1))

    class HandAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn, self.c_proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
            self.register_buffer("bias", lib.tril(lib.ones(steps, steps)).view(1, 1, steps, steps))

        def forward(self, x):
            B, T, C = x.size()
            q, k, v = self.c_attn(x).split(C, dim=2)
            q, k, v = (t.view(B, T, heads, C // heads).transpose(1, 2) for t in (q, k, v))
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = F.softmax(att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf")), dim=-1)
            return self.c_proj((att @ v).transpose(1, 2).contiguous().view(B, T, C))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(dim)
            self.attn = HandAttention() if hand else nn.MultiheadAttention(dim, heads, batch_first=True)
            self.ln_2, self.fc, self.proj = nn.LayerNorm(dim), nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

        def forward(self, x):
            h = self.ln_1(x)
            x = x + (self.attn(h) if hand else self.attn(h, h, h, need_weights=False, **causal)[0])
            return x + self.proj(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab, dim), nn.Parameter(lib.zeros(1, steps, dim))
            self.blocks = nn.ModuleList([Block() for _ in range(depth)])
            self.ln_f = nn.LayerNorm(dim)

        def forward(self, ids):
            x = self.wte(ids) + self.wpe
            for block in self.blocks:
                x = block(x)
            return F.linear(self.ln_f(x), self.wte.weight)
    return GPT()


def seq2seq(lib, vocab=512, steps=64, dim=128, heads=4, layers=2):
    """nn.Transformer (post-norm, ReLU, PyTorch's default dropout 0.1) between source and target token
    embeddings with learned positions: the target causal, padding (id 0) masked in every attention over its
    keys, then the projection to the vocabulary; the same code for lib = fasttrain or torch."""
    nn = lib.nn

    class Seq2Seq(nn.Module):
        def __init__(self):
            super().__init__()
            self.src_emb, self.tgt_emb = nn.Embedding(vocab, dim), nn.Embedding(vocab, dim)
            self.src_pos, self.tgt_pos = (nn.Parameter(lib.zeros(1, steps, dim)) for _ in range(2))
            self.tf = nn.Transformer(dim, heads, layers, layers, 4 * dim, batch_first=True)
            self.out = nn.Linear(dim, vocab)

        def forward(self, src, tgt):
            causal = self.tf.generate_square_subsequent_mask(tgt.shape[1])
            h = self.tf(self.src_emb(src) + self.src_pos, self.tgt_emb(tgt) + self.tgt_pos, tgt_mask=causal,
                        src_key_padding_mask=src == 0, memory_key_padding_mask=src == 0,
                        tgt_key_padding_mask=tgt == 0)
            return self.out(h)
    return Seq2Seq()


def beit(lib, dim=128, depth=4, heads=4, patch=4, image=32, classes=10):
    """The ViT with BEiT's attention instead of a position embedding: each block's learned relative position bias,
    a ((2W - 1)^2, heads) table read at a fixed index of the W x W patches' offsets, given to
    F.scaled_dot_product_attention as attn_mask (timm's Beit Attention); mean-pooled patches to the head."""
    nn, F = lib.nn, lib.nn.functional
    W = image // patch
    coords = np.stack(np.meshgrid(np.arange(W), np.arange(W), indexing="ij")).reshape(2, -1)
    offsets = (coords[:, :, None] - coords[:, None, :]).transpose(1, 2, 0) + W - 1
    index = offsets[..., 0] * (2 * W - 1) + offsets[..., 1]

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1, self.qkv, self.proj = nn.LayerNorm(dim), nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
            self.norm2, self.fc1, self.fc2 = nn.LayerNorm(dim), nn.Linear(dim, 2 * dim), nn.Linear(2 * dim, dim)
            self.table = nn.Parameter(lib.zeros((2 * W - 1) ** 2, heads))
            self.register_buffer("index", lib.tensor(index))

        def forward(self, x):
            B, T = x.shape[0], W * W
            q, k, v = self.qkv(self.norm1(x)).reshape(B, T, 3, heads, dim // heads).permute(2, 0, 3, 1, 4)
            bias = self.table[self.index.view(-1)].view(T, T, -1).permute(2, 0, 1).contiguous().unsqueeze(0)
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
            x = x + self.proj(a.transpose(1, 2).reshape(B, T, dim))
            return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))

    class Beit(nn.Module):
        def __init__(self):
            super().__init__()
            self.patch = nn.Conv2d(3, dim, patch, stride=patch)
            self.blocks = nn.Sequential(*[Block() for _ in range(depth)])
            self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, classes)

        def forward(self, x):
            x = self.blocks(self.patch(x).flatten(2).transpose(1, 2))
            return self.head(self.norm(x).mean(1))
    return Beit()


MODELS = {"vit": vit, "beit": beit, "gpt": gpt, "mingpt": functools.partial(gpt, hand=True), "seq2seq": seq2seq}


def gan_steps(net, batch, bf16, z=100):
    """As transformer_steps (no FLOP count: "images/s" are generated images) for an iteration of examples/gan.py's
    DCGAN: a discriminator step on real and detached generated images, then a generator step through the
    discriminator, each with its own Adam, as PyTorch's DCGAN loop."""
    rng = np.random.default_rng(0)
    real = rng.uniform(-1, 1, (batch, 1, 28, 28)).astype(np.float32)
    z1, z2 = (rng.standard_normal((batch, z)).astype(np.float32) for _ in range(2))

    def ours(precision):
        ft.manual_seed(0)
        d_step, g_step = gan.programs(*gan.dcgan(ft, z), batch, z, precision)
        x, a, b = ft.tensor(real), ft.tensor(z1), ft.tensor(z2)
        return lambda: (d_step.train_step((x, a), None), g_step.train_step(b, None))
    mine, mine16 = ours("32-true"), ours("bf16-mixed") if bf16 else None
    if torch is None:
        return mine, mine16, None, None, None, "images/s"
    G, D = (m.to(memory_format=torch.channels_last) for m in gan.dcgan(torch, z))
    opt_d = torch.optim.Adam(D.parameters(), 2e-4, betas=(0.5, 0.999))
    opt_g = torch.optim.Adam(G.parameters(), 2e-4, betas=(0.5, 0.999))
    x = torch.from_numpy(real).contiguous(memory_format=torch.channels_last)
    a, b = torch.from_numpy(z1), torch.from_numpy(z2)
    sp = torch.nn.functional.softplus

    def theirs(bf16=False):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            d_loss = (sp(-D(x)[:, 0]) + sp(D(G(a).detach())[:, 0])).mean()
        opt_d.zero_grad(set_to_none=True)
        d_loss.backward()
        opt_d.step()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            g_loss = sp(-D(G(b))[:, 0]).mean()
        opt_g.zero_grad(set_to_none=True)
        g_loss.backward()
        opt_g.step()
    return mine, mine16, None, theirs, lambda: theirs(bf16=True), "images/s"


def next_token_loss(lib):
    return lambda logits, targets: lib.nn.functional.cross_entropy(logits.transpose(1, 2), targets)


def transformer_steps(net, batch, bf16):
    """(fasttrain's float32 step, its bf16-mixed step (with bf16 true, else None), FLOPs per sample, torch's
    eager float32 step and its bf16-autocast step (PyTorch's fastest CPU mode) or None, samples' unit) for the
    ViT, GPT or seq2seq model."""
    rng = np.random.default_rng(0)
    if net in ("vit", "beit"):
        x = rng.standard_normal((batch, 3, 32, 32)).astype(np.float32)
        y = rng.integers(0, 10, batch)
        shape, kw, loss, unit = (3, 32, 32), {}, ft.nn.CrossEntropyLoss(), "images/s"
    elif net in ("gpt", "mingpt"):
        tokens = rng.integers(0, 512, (batch, 129))
        x, y = np.ascontiguousarray(tokens[:, :-1]), np.ascontiguousarray(tokens[:, 1:])
        shape, kw, loss, unit = (128,), dict(input_dtype=ft.int64, memory_format="contiguous"), \
            next_token_loss(ft), "sequences/s"
    else:  # sources and targets of 32-64 tokens, padded with 0 to 64; the target fed shifted right
        src, tgt = (rng.integers(1, 512, (batch, 65)) for _ in range(2))
        for seq in (src, tgt):
            for row, length in zip(seq, rng.integers(32, 65, batch)):
                row[length:] = 0
        x, y = (np.ascontiguousarray(src[:, :64]), np.ascontiguousarray(tgt[:, :-1])), np.ascontiguousarray(tgt[:, 1:])
        shape, kw, loss, unit = ((64,), (64,)), dict(input_dtype=ft.int64, memory_format="contiguous"), \
            next_token_loss(ft), "sequences/s"
    xt, yt = tuple(map(ft.tensor, x)) if isinstance(x, tuple) else ft.tensor(x), ft.tensor(y)

    def step(precision):
        ft.manual_seed(0)
        model = MODELS[net](ft)
        program = model.compile(ft.optim.AdamW(model.parameters(), lr=1e-3), loss, batch_size=batch,
                                input_shape=shape, precision=precision, **kw)
        return (lambda: program.train_step(xt, yt)), 3 * program.flops_per_sample()
    ours, flops = step("32-true")
    ours16 = step("bf16-mixed")[0] if bf16 else None
    if torch is None:
        return ours, ours16, flops, None, None, unit
    tm = MODELS[net](torch)
    if net in ("vit", "beit"):
        tm = tm.to(memory_format=torch.channels_last)
    topt = torch.optim.AdamW(tm.parameters(), lr=1e-3)
    tx = tuple(map(torch.from_numpy, x)) if isinstance(x, tuple) else torch.from_numpy(x)
    tx = tx.contiguous(memory_format=torch.channels_last) if net in ("vit", "beit") else tx
    ty = torch.from_numpy(y)
    tloss = torch.nn.CrossEntropyLoss() if net in ("vit", "beit") else next_token_loss(torch)

    def theirs(bf16=False):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = tloss(tm(*tx) if isinstance(tx, tuple) else tm(tx), ty)
        topt.zero_grad(set_to_none=True)
        out.backward()
        topt.step()
    return ours, ours16, flops, theirs, lambda: theirs(bf16=True), unit


def timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def full_runs(threads, epochs):
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    runs = [("fasttrain", [sys.executable, os.path.join(ROOT, "examples", "demo.py"), "--epochs", str(epochs),
                           "--threads", str(threads), "--out", "/tmp/fasttrain-bench"])]
    if torch is not None:
        runs.append(("torch", [sys.executable, os.path.join(HERE, "reference", "torch_fashion_mnist.py"),
                               "--epochs", str(epochs), "--threads", str(threads)]))
    for name, cmd in runs:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            if line.startswith("time to") or line.startswith("{"):
                print(json.dumps({"name": f"{name}_full_run", "line": line}), flush=True)


def run_cuda(args, torch_cuda):
    limits = cudabench.DeviceLimits(torch_cuda)
    limits.emit()
    warmup, count, target = (5, 5, 0.02) if args.quick else (5, 12, 0.05)
    for net in ("demo", "resnet"):
        for batch in (256, 512):
            ours, flops = ft_step(net, batch, "cuda")
            sides = {"ours": ours}
            if torch_cuda:
                sides["theirs"] = torch_step(net, batch, "cuda")
            syncs = {"ours": cudabench.ft_sync, "theirs": cudabench.torch_sync}
            calls = {}
            for key, fn in sides.items():
                for _ in range(warmup):  # cuDNN plans, the allocators' caches
                    fn()
                calls[key] = cudabench.calls_for(fn, syncs[key], target)
            times = {key: [] for key in sides}
            for _ in range(count):
                for key, fn in sides.items():
                    times[key] += cudabench.samples(fn, syncs[key], calls[key], 1)
            ips = batch / statistics.median(times["ours"])
            extra = {"gflops": round(ips * flops / 1e9, 1)}
            if limits.fma:
                extra = {"peak_fraction": round(ips * flops / 1e9 / limits.fma, 3), **extra}
            if torch_cuda:
                ref = batch / statistics.median(times["theirs"])
                extra.update(reference=round(ref, 1), reference_name=f"torch {torch.__version__} eager",
                             ratio=round(ips / ref, 3))
                if net == "demo":
                    extra["target"] = "ratio >= 1.2"
            emit(f"train_step_{net}_b{batch}", ips, "images/s", **extra)


def bf16_peak(threads):
    """GFLOP/s of a large bfloat16 matmul (oneDNN, float32 accumulation): what this CPU's bfloat16 dot
    products reach, the ceiling of a bf16-mixed step. The best of 5."""
    n = 2048
    a, b = ft.randn(n, n).to("bfloat16"), ft.randn(n, n).to("bfloat16")
    ft.nn.functional.linear(a, b)
    return max(2 * n ** 3 / timed(lambda: ft.nn.functional.linear(a, b)) / 1e9 for _ in range(5))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--full", action="store_true", help="also train both to accuracy (minutes; CPU only)")
    ap.add_argument("--epochs", type=int, default=6)
    cudabench.add_arguments(ap)
    args = ap.parse_args()
    if args.device == "cuda" and args.full:
        ap.error("--full trains on the CPU only (examples/demo.py has no device option)")
    torch_cuda = cudabench.setup(args, ap, torch)
    ft.set_num_threads(args.threads)
    if args.device == "cuda":
        run_cuda(args, torch_cuda)
        return
    if torch is not None:
        torch.set_num_threads(args.threads)
    limits = Limits(args.threads, fma_iters=20_000_000 if not args.quick else 2_000_000, triad_elems=1 << 24)
    fma_peak = statistics.median(limits.fma_sample() for _ in range(3))
    emit("fma_peak", fma_peak, "GFLOP/s", isa=limits.isa, threads=args.threads)
    bf16 = ft.backends.cpu_has_bf16()
    mm_peak = bf16_peak(args.threads) if bf16 else None
    if bf16:
        emit("bf16_matmul_peak", mm_peak, "GFLOP/s", threads=args.threads)
    steps = 3 if args.quick else 12
    for net in ("demo", "resnet"):
        for batch in ((256,) if args.quick else (256, 512)):
            ours, flops = ft_step(net, batch)
            # the same ResNet written as a PyTorch user writes it and traced: tracing should cost nothing per step
            traced = ft_step("resnet_traced", batch)[0] if net == "resnet" else None
            theirs = torch_step(net, batch) if torch is not None else None
            ours16 = ft_step(net, batch, precision="bf16-mixed")[0] if bf16 else None
            theirs16 = torch_step(net, batch, bf16=True) if torch is not None and bf16 else None
            runs = [f for f in (ours, traced, theirs, ours16, theirs16) if f]
            for _ in range(2):  # warm-up: oneDNN JIT, first-touch of buffers
                for f in runs:
                    f()
            times = {f: [] for f in runs}
            for _ in range(steps):
                for f in runs:
                    times[f].append(timed(f))
            ips = batch / statistics.median(times[ours])
            extra = {"peak_fraction": round(ips * flops / 1e9 / fma_peak, 3),
                     "gflops": round(ips * flops / 1e9, 1)}
            if theirs:
                ref = batch / statistics.median(times[theirs])
                extra.update(reference=round(ref, 1), reference_name=f"torch {torch.__version__}",
                             ratio=round(ips / ref, 3))
            emit(f"train_step_{net}_b{batch}", ips, "images/s", **extra)
            if traced:
                t_ips = batch / statistics.median(times[traced])
                emit(f"train_step_{net}_traced_b{batch}", t_ips, "images/s", reference=round(ips, 1),
                     reference_name="the same network as an nn.Model graph", ratio=round(t_ips / ips, 3))
            if ours16:
                ips16 = batch / statistics.median(times[ours16])
                extra = {"precision": "bf16-mixed", "peak_fraction": round(ips16 * flops / 1e9 / mm_peak, 3),
                         "fasttrain_float32": round(ips, 1), "ratio_float32": round(ips16 / ips, 3)}
                if theirs16:
                    ref = batch / statistics.median(times[theirs16])
                    extra.update(reference=round(ref, 1), ratio=round(ips16 / ref, 3),
                                 reference_name=f"torch {torch.__version__} bf16 autocast (channels_last)")
                emit(f"train_step_{net}_b{batch}_bf16", ips16, "images/s", **extra)
    for net, batch in (("vit", 64), ("beit", 64), ("gpt", 16), ("mingpt", 16), ("seq2seq", 16), ("dcgan", 64)):
        ours, ours16, flops, theirs, autocast, unit = (gan_steps if net == "dcgan" else transformer_steps)(net, batch,
                                                                                                           bf16)
        runs = [f for f in (ours, ours16, theirs, autocast) if f]
        for _ in range(2):
            for f in runs:
                f()
        times = {f: [] for f in runs}
        for _ in range(max(steps // 2, 3)):
            for f in runs:
                times[f].append(timed(f))
        ips = batch / statistics.median(times[ours])
        extra = {"peak_fraction": round(ips * flops / 1e9 / fma_peak, 3), "gflops": round(ips * flops / 1e9, 1)} \
            if flops else {}
        if theirs:
            ref = batch / statistics.median(times[theirs])
            auto = batch / statistics.median(times[autocast])
            extra.update(reference=round(ref, 2), reference_name=f"torch {torch.__version__} eager float32",
                         ratio=round(ips / ref, 3), reference_bf16_autocast=round(auto, 2),
                         ratio_bf16_autocast=round(ips / auto, 3))
        emit(f"train_step_{net}_b{batch}", ips, unit, **extra)
        if ours16:
            ips16 = batch / statistics.median(times[ours16])
            extra = {"precision": "bf16-mixed", "fasttrain_float32": round(ips, 2),
                     "ratio_float32": round(ips16 / ips, 3)}
            if flops:
                extra["peak_fraction"] = round(ips16 * flops / 1e9 / mm_peak, 3)
            if theirs:
                extra.update(reference=round(auto, 2), ratio=round(ips16 / auto, 3),
                             reference_name=f"torch {torch.__version__} bf16 autocast")
            emit(f"train_step_{net}_b{batch}_bf16", ips16, unit, **extra)
    if args.full:
        full_runs(args.threads, args.epochs)


if __name__ == "__main__":
    main()
