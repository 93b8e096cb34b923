"""The main job: train a small BN-ReLU CNN on the real Fashion-MNIST (Debian's
dataset-fashion-mnist) with the C data loader and the C training loop, then
report test accuracy and throughput, save a checkpoint and a training curve.

    make demo                      # or: .venv/bin/python examples/demo.py --epochs 12
"""
import argparse
import json
import os
import time

import fasttrain as ft

nn, D = ft.nn, ft.data


def block(cin, cout):
    return [nn.Conv2d(cin, cout, 3, padding=1), nn.MaxPool2d(2), nn.BatchNorm2d(cout), nn.ReLU(),
            nn.Conv2d(cout, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU()]


def make_model():
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                         *block(16, 32), *block(32, 64), *block(64, 128),
                         nn.AdaptiveMaxPool2d(1), nn.Flatten(), nn.Linear(128, 10))


def plot(history, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no training curve")
        return
    epochs = history["epoch"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.plot(epochs, history["train_loss"], label="train")
    a.plot(epochs, history["val_loss"], label="test")
    a.set_xlabel("epoch"), a.set_ylabel("loss"), a.legend()
    b.plot(epochs, [100 * v for v in history["val_accuracy"]])
    b.set_xlabel("epoch"), b.set_ylabel("test accuracy (%)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"training curve: {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--batch-size", type=int, default=512)
    ap.add_argument("--lr", type=float, default=0.4)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="out")
    ap.add_argument("--precision", default="32-true", choices=("32-true", "bf16-mixed"),
                    help="bf16-mixed: bfloat16 convolutions and activations, float32 weights and loss")
    args = ap.parse_args()

    ft.seed_everything(args.seed)
    ft.set_num_threads(args.threads)
    os.makedirs(args.out, exist_ok=True)
    mean, std = 0.2860, 0.3530  # Fashion-MNIST's pixel statistics
    train = D.Loader(D.FashionMNIST(train=True), args.batch_size, shuffle=True, seed=args.seed,
                     num_workers=args.workers, drop_last=True,
                     transforms=[D.RandomCrop(28, padding=2), D.RandomHorizontalFlip(), D.Normalize(mean, std)])
    test = D.Loader(D.FashionMNIST(train=False), 1000, num_workers=args.workers, transforms=[D.Normalize(mean, std)])

    model = make_model()
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if p.ndim == 1 else decay).append(p)  # no weight decay on BN and biases
    opt = ft.optim.SGD([{"params": decay, "weight_decay": 5e-4}, {"params": no_decay, "weight_decay": 0.0}],
                       lr=args.lr, momentum=0.9, nesterov=True)
    steps = args.epochs * len(train)
    sched = ft.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=steps, pct_start=0.2,
                                             anneal_strategy="linear", div_factor=25.0, final_div_factor=1e3,
                                             cycle_momentum=False)
    program = model.compile(opt, nn.CrossEntropyLoss(label_smoothing=0.1), batch_size=args.batch_size,
                            input_shape=(1, 28, 28), precision=args.precision)
    print(program.summary())
    print(f"training on {len(train) * args.batch_size} Fashion-MNIST images, {args.threads} threads, "
          f"{args.epochs} epochs, precision {program.precision}")

    start = time.perf_counter()
    history = ft.fit(program, train, args.epochs, val_loader=test, scheduler=sched, tta_flip=True)
    seconds = sum(history["seconds"])
    wall = time.perf_counter() - start
    acc = history["val_accuracy"][-1]
    images = sum(h * s for h, s in zip(history["images_per_second"], history["seconds"]))
    print(f"test accuracy {100 * acc:.2f}% (flip test-time augmentation) after {args.epochs} epochs; "
          f"training {seconds:.1f} s ({images / seconds:.0f} images/s), {wall:.1f} s with evaluation")
    for target in (0.92, 0.93):
        reached = [i for i, a in enumerate(history["val_accuracy"]) if a >= target]
        when = f"{sum(history['seconds'][:reached[0] + 1]):.1f} s of training (epoch {reached[0] + 1})" \
            if reached else "not reached"
        print(f"time to {100 * target:.0f}%: {when}")
    ft.save(os.path.join(args.out, "demo.safetensors"), program, scheduler=sched, loader=train, epoch=args.epochs)
    print(f"checkpoint: {os.path.join(args.out, 'demo.safetensors')}")
    plot(history, os.path.join(args.out, "demo_curve.png"))
    print(json.dumps({"name": "demo", "test_accuracy": round(acc, 4), "train_seconds": round(seconds, 2),
                      "images_per_second": round(images / seconds, 1), "epochs": args.epochs,
                      "precision": program.precision}))


if __name__ == "__main__":
    main()
