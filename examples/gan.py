"""A DCGAN on the real Fashion-MNIST (Debian's dataset-fashion-mnist): two compiled programs that read each
other's modules, the discriminator's step and the generator's, alternating as PyTorch's DCGAN loop does; the
C loader feeds the real images. Prints the losses per epoch and the throughput, and saves a grid of samples.

    .venv/bin/python examples/gan.py --epochs 2 [--precision bf16-mixed]
"""
import argparse
import json
import os
import time

import numpy as np

import fasttrain as ft
from fasttrain.progress import ProgressBar

D, F = ft.data, ft.nn.functional


def dcgan(lib, z=100):
    """DCGAN's generator and discriminator for 28x28 images: a linear layer viewed as 7x7 maps, two transposed
    convolutions up; two strided convolutions down; batch norms. The same code builds the PyTorch models
    (lib = torch), as benchmarks/bench_train.py does."""
    nn = lib.nn

    class Generator(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Sequential(nn.Linear(z, 128 * 7 * 7, bias=False), nn.BatchNorm1d(128 * 7 * 7), nn.ReLU())
            self.up = nn.Sequential(nn.ConvTranspose2d(128, 64, 4, 2, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                                    nn.ConvTranspose2d(64, 1, 4, 2, 1), nn.Tanh())

        def forward(self, z):
            return self.up(self.fc(z).view(-1, 128, 7, 7))
    disc = nn.Sequential(nn.Conv2d(1, 64, 4, 2, 1), nn.LeakyReLU(0.2), nn.Conv2d(64, 128, 4, 2, 1, bias=False),
                         nn.BatchNorm2d(128), nn.LeakyReLU(0.2), nn.Flatten(), nn.Linear(128 * 7 * 7, 1))
    return Generator(), disc


class DStep(ft.nn.Module):
    """The discriminator's step: its logits for real images and for generated ones (the generator's output
    detached, as in PyTorch's loop), side by side."""

    def __init__(self, G, D):
        super().__init__()
        self.G, self.D = G, D

    def forward(self, real, z):
        return ft.cat([self.D(real), self.D(self.G(z).detach())], dim=1)


class GStep(DStep):
    """The generator's step, through the discriminator (which the discriminator's program trains)."""

    def forward(self, z):
        return self.D(self.G(z))


def d_loss(logits):
    return (F.softplus(-logits[:, 0]) + F.softplus(logits[:, 1])).mean()  # BCE: real 1, generated 0


def g_loss(logits):
    return F.softplus(-logits[:, 0]).mean()  # BCE: generated 1


def programs(G, disc, batch_size, z=100, precision="32-true", lr=2e-4):
    """The two compiled steps, each with its own Adam (DCGAN's betas)."""
    d_step = DStep(G, disc).compile(ft.optim.Adam(disc.parameters(), lr, betas=(0.5, 0.999)), d_loss,
                                    batch_size=batch_size, input_shape=((1, 28, 28), (z,)), precision=precision)
    g_step = GStep(G, disc).compile(ft.optim.Adam(G.parameters(), lr, betas=(0.5, 0.999)), g_loss,
                                    batch_size=batch_size, input_shape=(z,), precision=precision)
    return d_step, g_step


def save_grid(images, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no samples image")
        return
    rows = np.concatenate([np.concatenate(list(images[r * 8:(r + 1) * 8, 0]), axis=1) for r in range(8)])
    plt.imsave(path, rows, cmap="gray", vmin=-1, vmax=1)
    print(f"samples: {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--steps", type=int, default=0, help="stop each epoch after this many iterations (0: all)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="out")
    ap.add_argument("--precision", default="32-true", choices=("32-true", "bf16-mixed"))
    args = ap.parse_args()
    ft.seed_everything(args.seed)
    ft.set_num_threads(args.threads)
    os.makedirs(args.out, exist_ok=True)
    B, Z = args.batch_size, 100
    train = D.Loader(D.FashionMNIST(train=True), B, shuffle=True, seed=args.seed, drop_last=True,
                     transforms=[D.Normalize(0.5, 0.5)])  # pixels in [-1, 1], the generator's tanh range
    G, disc = dcgan(ft, Z)
    d_step, g_step = programs(G, disc, B, Z, args.precision)
    print(f"DCGAN on {len(train) * B} Fashion-MNIST images, {args.threads} threads, precision {d_step.precision}")
    seconds = images = 0
    for epoch in range(args.epochs):
        steps = min(len(train), args.steps or len(train))
        bar = ProgressBar(steps, f"epoch {epoch + 1}/{args.epochs}")
        d_sum = g_sum = 0.0
        start = time.perf_counter()
        for k, (real, _) in enumerate(train):
            if k == steps:
                break
            d_sum += d_step.train_step((real, ft.randn(B, Z)), None)
            g_sum += g_step.train_step(ft.randn(B, Z), None)
            bar.update(d_loss=d_sum / (k + 1), g_loss=g_sum / (k + 1))
        seconds += time.perf_counter() - start
        images += steps * B
        bar.close(images_per_s=steps * B / (time.perf_counter() - start))
    G.eval()
    with ft.no_grad():
        samples = G(ft.randn(64, Z)).numpy()
    save_grid(samples, os.path.join(args.out, "gan_samples.png"))
    print(json.dumps({"name": "gan", "d_loss": round(d_sum / steps, 4), "g_loss": round(g_sum / steps, 4),
                      "images_per_second": round(images / seconds, 1), "epochs": args.epochs,
                      "precision": d_step.precision}))


if __name__ == "__main__":
    main()
