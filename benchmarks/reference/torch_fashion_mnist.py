"""The demo's network and recipe in PyTorch, for side-by-side figures: the
same BN-ReLU CNN, batch 512, SGD Nesterov 0.9 with weight decay 5e-4 (none on
BN and biases), 20% linear warmup then linear decay, label smoothing 0.1,
flip + pad-2 random-crop augmentation, flip test-time augmentation, channels_last.

    python benchmarks/reference/torch_fashion_mnist.py --epochs 6

Data come from the same Debian files as the demo (through fasttrain's reader,
which only unpacks the IDX files); augmentation runs in torch on whole batches
so that the loader is not what is measured."""
import argparse
import json
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def block(cin, cout):
    return [nn.Conv2d(cin, cout, 3, padding=1), nn.MaxPool2d(2), nn.BatchNorm2d(cout), nn.ReLU(),
            nn.Conv2d(cout, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU()]


def make_model():
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                         *block(16, 32), *block(32, 64), *block(64, 128),
                         nn.AdaptiveMaxPool2d(1), nn.Flatten(), nn.Linear(128, 10))


def load(train):
    import fasttrain as ft
    src = ft.data.FashionMNIST(train=train)
    return np.asarray(src.images), np.asarray(src.labels).astype(np.int64)


def augment(x, gen):
    """Random horizontal flip and a random crop of a 2-pixel zero padding, per image."""
    n = x.shape[0]
    flip = torch.rand(n, generator=gen) < 0.5
    x = torch.where(flip[:, None, None, None], x.flip(3), x)
    padded = F.pad(x, (2, 2, 2, 2))
    dy, dx = torch.randint(0, 5, (n,), generator=gen), torch.randint(0, 5, (n,), generator=gen)
    rows = (dy[:, None] + torch.arange(28)[None, :])[:, None, :, None].expand(n, 1, 28, 32)
    x = padded.gather(2, rows)
    cols = (dx[:, None] + torch.arange(28)[None, :])[:, None, None, :].expand(n, 1, 28, 28)
    return x.gather(3, cols)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--lr", type=float, default=0.4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bf16", action="store_true", help="bfloat16 autocast")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    mean, std = 0.2860, 0.3530
    xtr, ytr = load(True)
    xte, yte = load(False)
    xtr = (torch.tensor(xtr, dtype=torch.float32)[:, None] / 255 - mean) / std
    xte = (torch.tensor(xte, dtype=torch.float32)[:, None] / 255 - mean) / std
    ytr, yte = torch.tensor(ytr), torch.tensor(yte)
    model = make_model().to(memory_format=torch.channels_last)
    decay = [p for p in model.parameters() if p.ndim > 1]
    no_decay = [p for p in model.parameters() if p.ndim == 1]
    opt = torch.optim.SGD([{"params": decay, "weight_decay": 5e-4}, {"params": no_decay, "weight_decay": 0.0}],
                          lr=args.lr, momentum=0.9, nesterov=True)
    bs = 512
    steps_per_epoch = len(xtr) // bs
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=args.epochs * steps_per_epoch,
                                                pct_start=0.2, anneal_strategy="linear", div_factor=25.0,
                                                final_div_factor=1e3, cycle_momentum=False)
    gen = torch.Generator().manual_seed(0)
    history, train_seconds = [], 0.0
    for epoch in range(args.epochs):
        model.train()
        perm = torch.randperm(len(xtr), generator=gen)
        start = time.perf_counter()
        for k in range(steps_per_epoch):
            idx = perm[k * bs:(k + 1) * bs]
            x = augment(xtr[idx], gen).contiguous(memory_format=torch.channels_last)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
                loss = F.cross_entropy(model(x), ytr[idx], label_smoothing=0.1)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
        seconds = time.perf_counter() - start
        train_seconds += seconds
        model.eval()
        correct = 0
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            for k in range(0, len(xte), 1000):
                x = xte[k:k + 1000].contiguous(memory_format=torch.channels_last)
                logits = model(x).float() + model(x.flip(3)).float()
                correct += int((logits.argmax(1) == yte[k:k + 1000]).sum())
        acc = correct / len(xte)
        history.append({"epoch": epoch + 1, "seconds": seconds, "test_accuracy": acc,
                        "images_per_second": steps_per_epoch * bs / seconds})
        print(json.dumps({"name": "torch_epoch", **history[-1]}), flush=True)
    for target in (0.92, 0.93):
        reached = [h for h in history if h["test_accuracy"] >= target]
        t = sum(h["seconds"] for h in history[:history.index(reached[0]) + 1]) if reached else None
        print(json.dumps({"name": f"torch_time_to_{int(target * 100)}", "value": t, "unit": "s"}))
    print(json.dumps({"name": "torch_demo", "test_accuracy": history[-1]["test_accuracy"],
                      "train_seconds": round(train_seconds, 2),
                      "images_per_second": round(args.epochs * steps_per_epoch * bs / train_seconds, 1),
                      "epochs": args.epochs, "bf16": args.bf16}))


if __name__ == "__main__":
    main()
