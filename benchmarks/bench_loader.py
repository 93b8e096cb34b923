"""Throughput of ft.data.Loader, with the limit it is measured against and PyTorch's DataLoader beside it.

Prints one JSON object per line: {"name", "value", "unit"} and, where a reference ran in the same process,
"reference", "reference_name" and "ratio" = value / reference (> 1: fasttrain is faster).

  fmnist_raw_{N}t       Fashion-MNIST record file (raw pixels) -> normalized float32 batches of 256,
                        reference: torch DataLoader over the same uint8 arrays with the same transforms
  fmnist_jpeg_{N}t      Fashion-MNIST encoded as JPEG records -> float32 batches of 256,
                        reference: raw TurboJPEG decode rate of the same JPEGs on N threads (the limit)
  photos_{N}t           ~500x375 photos (crops of Debian's sklearn photos, re-encoded) in a record file ->
                        RandomResizedCrop(224) + flip + Normalize, batches of 64, reference: the raw decode limit
  photos_{N}t_torch     the same with torchvision's ImageFolder + PIL + DataLoader(num_workers=N),
                        reference: that, ratio = fasttrain / torch

With --device cuda (cudabench.py has the options) every batch is delivered on the CUDA device: fasttrain's
Loader(device="cuda") (page-locked batch buffers, an asynchronous copy per batch), and torch's DataLoader with
pin_memory=True and .cuda(non_blocking=True) on each batch; each timing ends with a device synchronisation,
so the figures count the copies. The "h2d_pinned_copy" line is the device's limit for those copies: GB/s of a
64 MiB page-locked host -> device copy (fasttrain's copy_, non_blocking).

Without Debian's Fashion-MNIST (a GPU machine may lack it) the fmnist lines run on synthetic images of its
shape (60000 28x28 uint8 images of 4x4 blocks, random labels), and an "fmnist" line says so.

    python benchmarks/bench_loader.py [--quick]
    PYTHONPATH=python /opt/torchref/bin/python benchmarks/bench_loader.py   # with torch/torchvision
    python benchmarks/bench_loader.py --device cuda [--quick]
"""
import argparse
import json
import os
import statistics
import tempfile
import time

import numpy as np

import fasttrain as ft
import cudabench

D = ft.data
try:
    import torch
    import torch.utils.data
except Exception:  # not installed: run without the reference
    torch = None
try:
    import torchvision
    import PIL.Image  # noqa: F401 (torchvision's ImageFolder decodes with it)
except Exception:
    torchvision = None

PHOTOS = "/usr/lib/python3/dist-packages/sklearn/datasets/images"
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def emit(name, value, unit, reference=None, reference_name=None):
    row = {"name": name, "value": round(value, 1), "unit": unit}
    if reference:
        row.update(reference=round(reference, 1), reference_name=reference_name, ratio=round(value / reference, 3))
    print(json.dumps(row), flush=True)


def no_sync():
    pass


def loader_rate(make, min_images, repeats, sync=no_sync):
    """Median images/s over `repeats` timings of whole epochs adding up to at least min_images, after one
    warm-up epoch (which faults in the batch ring and the page cache); each timing ends with sync()."""
    loader = make()
    for _ in loader:
        pass
    rates = []
    for _ in range(repeats):
        sync()
        n, t = 0, time.perf_counter()
        while n < min_images:
            for x, y in loader:
                n += len(y)
        sync()
        rates.append(n / (time.perf_counter() - t))
    loader.close()
    return statistics.median(rates)


def decode_rate(files, threads, min_images):
    """Raw TurboJPEG decode rate of the files on `threads` threads (median of 3)."""
    rounds = max(1, min_images // len(files))
    return statistics.median(rounds * len(files) / sum(ft._C.jpeg_decode_time(files, threads) for _ in range(rounds))
                             for _ in range(3))


def torch_rate(dataset, batch, workers, min_images, repeats, cuda=False):
    """As loader_rate for a torch DataLoader; with cuda, pinned batches moved with .cuda(non_blocking=True)."""
    dl = torch.utils.data.DataLoader(dataset, batch_size=batch, shuffle=True, num_workers=workers,
                                     persistent_workers=workers > 0, drop_last=False, pin_memory=cuda)
    sync = cudabench.torch_sync if cuda else no_sync

    def epoch():
        n = 0
        for x, y in dl:
            if cuda:
                x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
            n += len(y)
        return n
    epoch()
    rates = []
    for _ in range(repeats):
        sync()
        n, t = 0, time.perf_counter()
        while n < min_images:
            n += epoch()
        sync()
        rates.append(n / (time.perf_counter() - t))
    return statistics.median(rates)


def h2d_bandwidth(nbytes=64 << 20, rounds=5):
    """GB/s of a page-locked host -> device copy of nbytes, the best of `rounds` samples of 4 copies."""
    host = ft.empty(nbytes // 4, pin_memory=True)
    dev = ft.empty(nbytes // 4, device="cuda")
    return nbytes / min(cudabench.samples(lambda: dev.copy_(host, non_blocking=True), cudabench.ft_sync, 4,
                                          rounds)) / 1e9


def fashion_mnist(n):
    """(images, labels, synthetic): the first n Fashion-MNIST training samples, or images of its shape made
    of random 4x4 blocks (compressible, as photos are) and random labels where the dataset is not installed."""
    try:
        train = D.FashionMNIST(train=True)
    except FileNotFoundError:
        rng = np.random.default_rng(0)
        blocks = rng.integers(0, 256, (n, 7, 7), dtype=np.uint8)
        return blocks.repeat(4, axis=1).repeat(4, axis=2), rng.integers(0, 10, n).astype(np.int64), True
    return np.asarray(train.images[:n]), np.asarray(train.labels[:n]).astype(np.int64), False


def make_photos(folder, count):
    """`count` distinct ~500x375 JPEGs: random crops of the two photos, flipped or not, quality 90, 4:2:0."""
    rng = np.random.default_rng(0)
    sources = [D.decode_jpeg(open(os.path.join(PHOTOS, f), "rb").read()) for f in sorted(os.listdir(PHOTOS))
               if f.endswith(".jpg")]
    files = []
    for k in range(count):
        src = sources[k % len(sources)]
        h, w = 375 - int(rng.integers(0, 40)), 500 - int(rng.integers(0, 60))
        y, x = int(rng.integers(0, src.shape[0] - h + 1)), int(rng.integers(0, src.shape[1] - w + 1))
        img = src[y:y + h, x:x + w]
        if k % 2:
            img = img[:, ::-1]
        data = D.encode_jpeg(np.ascontiguousarray(img), quality=90)
        cls = os.path.join(folder, "tree", f"c{k % 4}")
        os.makedirs(cls, exist_ok=True)
        with open(os.path.join(cls, f"{k:04d}.jpg"), "wb") as f:
            f.write(data)
        files.append(data)
    return files


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer samples and epochs")
    cudabench.add_arguments(ap)
    args = ap.parse_args()
    torch_cuda = cudabench.setup(args, ap, torch)
    cuda = args.device == "cuda"
    sync = cudabench.ft_sync if cuda else no_sync
    if cuda:
        print(json.dumps({"name": "h2d_pinned_copy", "value": round(h2d_bandwidth(), 1), "unit": "GB/s"}),
              flush=True)
    with_torch = torch_cuda if cuda else torch is not None
    repeats = 3
    scale = 0.25 if args.quick else 1.0
    tmp = tempfile.mkdtemp(prefix="ft_bench_loader_")
    threads = (1, 2)

    # (1) Fashion-MNIST.
    n = 60000
    images, labels, synthetic = fashion_mnist(n)
    if synthetic:
        print(json.dumps({"name": "fmnist", "synthetic": "Fashion-MNIST is not installed: the fmnist lines use "
                                                          "synthetic images of its shape"}), flush=True)
    raw = D.write_records(os.path.join(tmp, "fmnist.rec"), (images, labels))
    jpg = D.write_records(os.path.join(tmp, "fmnist-jpeg.rec"), (images, labels), quality=90)
    jpeg_files = [jpg.get(i)[1] for i in range(len(jpg))]
    tf = [D.Normalize(0.286, 0.353)]
    torch_fmnist = {}
    if with_torch:
        class Arrays(torch.utils.data.Dataset):
            def __len__(self):
                return len(labels)

            def __getitem__(self, i):  # ToTensor + Normalize on one sample, as torchvision would
                x = torch.from_numpy(images[i]).float().div_(255).sub_(0.286).div_(0.353)
                return x[None], int(labels[i])
        for t in threads:
            torch_fmnist[t] = torch_rate(Arrays(), 256, t, int(60000 * scale), repeats, cuda)
    for t in threads:
        rate = loader_rate(lambda: D.Loader(raw, batch_size=256, transforms=tf, shuffle=True, num_workers=t,
                                            device=args.device), int(600000 * scale), repeats, sync)
        emit(f"fmnist_raw_{t}t", rate, "images/s", torch_fmnist.get(t), f"torch DataLoader num_workers={t}"
             + (", pin_memory, .cuda(non_blocking=True)" if cuda else ""))
    for t in threads:
        before = decode_rate(jpeg_files, t, int(60000 * scale))
        rate = loader_rate(lambda: D.Loader(jpg, batch_size=256, transforms=tf, shuffle=True, num_workers=t,
                                            device=args.device), int(120000 * scale), repeats, sync)
        limit = (before + decode_rate(jpeg_files, t, int(60000 * scale))) / 2
        emit(f"fmnist_jpeg_{t}t", rate, "images/s", limit, f"TurboJPEG decode, {t} threads")

    # (2) Photos.
    if not os.path.isdir(PHOTOS):
        print(json.dumps({"name": "photos", "skipped": f"{PHOTOS} is absent: install python3-sklearn"}))
        return
    files = make_photos(tmp, 256)
    rec = D.write_records(os.path.join(tmp, "photos.rec"), os.path.join(tmp, "tree"))
    tf = [D.RandomResizedCrop(224), D.RandomHorizontalFlip(), D.Normalize(MEAN, STD)]
    for t in threads:
        before = decode_rate(files, t, int(1000 * scale * t))
        rate = loader_rate(lambda: D.Loader(rec, batch_size=64, transforms=tf, shuffle=True, num_workers=t,
                                            device=args.device), int(1500 * scale * t), repeats, sync)
        limit = (before + decode_rate(files, t, int(1000 * scale * t))) / 2
        emit(f"photos_{t}t", rate, "images/s", limit, f"TurboJPEG decode, {t} threads")
        if torchvision is not None and with_torch:
            T = torchvision.transforms
            ds = torchvision.datasets.ImageFolder(os.path.join(tmp, "tree"), T.Compose(
                [T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)]))
            ref = torch_rate(ds, 64, t, int(600 * scale * t), repeats, cuda)
            emit(f"photos_{t}t_torch", rate, "images/s", ref, f"torchvision ImageFolder+PIL, DataLoader num_workers={t}"
                 + (", pin_memory, .cuda(non_blocking=True)" if cuda else ""))


if __name__ == "__main__":
    main()
