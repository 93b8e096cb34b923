"""The Loader: order, epochs, determinism across worker counts, sharding,
resuming, caching, shutdown (threads joined, memory returned)."""
import gc
import os
import signal
import threading
import time

import numpy as np
import pytest

import fasttrain as ft

D = ft.data


def threads():
    return len(os.listdir("/proc/self/task"))


def rss_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])


def arrays(n=103, h=12, w=10, c=3):
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, (n, h, w, c), np.uint8), np.arange(n) + 1000


def collect(loader):
    return [(x.numpy().copy(), y.numpy().copy()) for x, y in loader]


def same(a, b):
    return len(a) == len(b) and all(np.array_equal(x, u) and np.array_equal(y, v) for (x, y), (u, v) in zip(a, b))


TF = [D.RandomCrop(10, padding=2, padding_mode="reflect"), D.RandomHorizontalFlip(),
      D.Normalize((0.5, 0.5, 0.5), (0.25, 0.25, 0.25)), D.RandomErasing(value="random")]


def test_order_len_and_partial_batch():
    images, labels = arrays()
    loader = D.Loader((images, labels), batch_size=10, num_workers=3, dtype="uint8", channels_last=True)
    # channels_last as PyTorch's memory format: (N, C, H, W) batches over NHWC memory
    assert len(loader) == 11 and loader.batch_shape == (10, 3, 12, 10)
    batches = collect(loader)
    assert [len(y) for _, y in batches] == [10] * 10 + [3]
    assert np.array_equal(np.concatenate([x for x, _ in batches]).transpose(0, 2, 3, 1), images)
    assert np.array_equal(np.concatenate([y for _, y in batches]), labels)
    dropped = D.Loader((images, labels), batch_size=10, drop_last=True, num_workers=1)
    assert len(dropped) == 10 and len(collect(dropped)) == 10


def test_a_batch_size_beyond_the_dataset_sizes_buffers_for_the_dataset():
    """A batch size larger than the samples (a whole-split batch written as batch_size=10**6, the documented
    largest 2**24 too) gives one batch of them all, in buffers of their size: it reserved gigabytes, or refused."""
    images, labels = arrays(n=10, h=28, w=28)
    for batch_size in (10**6, 2**24):
        loader = D.Loader((images, labels), batch_size=batch_size, num_workers=1, dtype="uint8")
        (x, y), = collect(loader)
        assert np.array_equal(x.transpose(0, 2, 3, 1), images) and np.array_equal(y, labels)
        assert loader.stats()["ring_bytes"] < 10 * images[0].nbytes + 4096


def test_identical_batches_for_any_worker_count():
    images, labels = arrays()
    runs = [collect(D.Loader((images, labels), batch_size=16, transforms=TF, shuffle=True, seed=3, num_workers=w,
                             prefetch=p)) for w, p in ((0, 1), (1, 2), (2, 2), (4, 3))]
    for r in runs[1:]:
        assert same(r, runs[0])


def test_epochs_shuffle_and_set_epoch():
    images, labels = arrays()
    loader = D.Loader((images, labels), batch_size=20, transforms=TF, shuffle=True, seed=1, num_workers=2)
    e0, e1 = collect(loader), collect(loader)
    assert loader.epoch == 2
    assert not same(e0, e1)
    order0 = np.concatenate([y for _, y in e0])
    assert sorted(order0) == list(labels)
    loader.set_epoch(0)
    assert same(collect(loader), e0)
    loader.set_epoch(1)
    assert same(collect(loader), e1)
    # The same seed and epoch in a fresh loader: the same batches.
    other = D.Loader((images, labels), batch_size=20, transforms=TF, shuffle=True, seed=1, num_workers=1)
    other.set_epoch(1)
    assert same(collect(other), e1)


def test_resume_mid_epoch():
    images, labels = arrays()
    kw = dict(batch_size=8, transforms=TF, shuffle=True, seed=9, num_workers=2)
    full = D.Loader((images, labels), **kw)
    full.set_epoch(4)
    want = collect(full)
    loader = D.Loader((images, labels), **kw)
    loader.set_epoch(4)
    it = iter(loader)
    got = [tuple(t.numpy().copy() for t in next(it)) for _ in range(5)]
    state = loader.state_dict()
    assert state["epoch"] == 4 and state["batch"] == 5
    del it, loader
    resumed = D.Loader((images, labels), **kw)
    resumed.load_state_dict(state)
    got += collect(resumed)
    assert same(got, want)
    assert resumed.epoch == 5 and resumed.state_dict()["batch"] == 0
    with pytest.raises(ValueError, match="batch_size"):
        D.Loader((images, labels), batch_size=4, seed=9, shuffle=True).load_state_dict(state)


@pytest.mark.parametrize("drop_last", [False, True])
def test_sharding(drop_last):
    images, labels = arrays(n=101)
    shards = [D.Loader((images, labels), batch_size=6, shuffle=True, seed=2, rank=r, world_size=3,
                       drop_last=drop_last, num_workers=1) for r in range(3)]
    assert len({len(s) for s in shards}) == 1
    got = [np.concatenate([y for _, y in collect(s)]) for s in shards]
    assert len({len(g) for g in got}) == 1
    seen = np.concatenate(got)
    if drop_last:
        assert len(seen) == 90 and len(set(seen)) == 90  # 33 per rank, cut to 5 full batches of 6
    else:
        assert len(seen) == 102 and set(seen) == set(labels)  # 101 padded to 102


def test_cache_decoded_and_encoded(tmp_path):
    folder = "/usr/share/go-1.19/src/image/testdata"
    if not os.path.isdir(folder):
        pytest.skip(f"{folder} is absent: install Debian's golang-1.19-src")
    root = tmp_path / "tree" / "c"
    os.makedirs(root)
    for k, name in enumerate(sorted(f for f in os.listdir(folder) if f.endswith(".jpeg") and "trunc" not in f)):
        with open(os.path.join(folder, name), "rb") as src, open(root / f"{k:02d}.jpg", "wb") as dst:
            dst.write(src.read())
    tf = [D.RandomResizedCrop(32), D.RandomHorizontalFlip()]
    plain = D.Loader(tmp_path / "tree", batch_size=5, transforms=tf, shuffle=True, num_workers=2, dct_scale=False)
    want = [collect(plain), collect(plain)]
    for mode in ("decoded", "encoded"):
        cached = D.Loader(tmp_path / "tree", batch_size=5, transforms=tf, shuffle=True, num_workers=2,
                          dct_scale=False, cache=(mode, 64 << 20))
        assert same(collect(cached), want[0]) and same(collect(cached), want[1])
        st = cached.stats()
        assert st["cache_entries"] == 24 and st["cache_hits"] >= 24 and st["cache_bytes"] <= 64 << 20
    tiny = D.Loader(tmp_path / "tree", batch_size=5, transforms=tf, num_workers=1, cache=("decoded", 100_000))
    collect(tiny)
    assert 0 < tiny.stats()["cache_entries"] < 24 and tiny.stats()["cache_bytes"] <= 100_000


def test_held_batches_outlive_the_loader():
    images, labels = arrays(n=40)
    loader = D.Loader((images, labels), batch_size=4, num_workers=2, prefetch=1, dtype="uint8",
                      channels_last=True)
    held = list(loader)  # every batch kept: the ring grows instead of deadlocking
    assert loader.stats()["ring_buffers"] >= 10
    arr = held[3][0].numpy()
    loader.close()
    del loader
    gc.collect()
    assert np.array_equal(arr.transpose(0, 2, 3, 1), images[12:16]) and list(held[9][1].numpy()) == list(labels[36:40])


def test_shutdown_leaves_no_threads_and_no_memory():
    images, labels = arrays(n=200, h=32, w=32)
    before = threads()
    for k in range(100):
        loader = D.Loader((images, labels), batch_size=32, transforms=TF, shuffle=True, num_workers=4)
        assert threads() == before + 4
        it = iter(loader)
        next(it)
        if k % 3 == 0:
            del it, loader  # mid-epoch
        elif k % 3 == 1:
            with loader:
                pass
        else:
            try:
                for x, y in loader:
                    raise KeyError("consumer failure")
            except KeyError:
                pass
            del loader, it
        gc.collect()
        assert threads() == before
        if k == 10:
            rss = rss_kib()
    assert rss_kib() - rss < 8 * 1024


def test_ctrl_c_while_waiting():
    # Slow samples: a large RandomResizedCrop per sample with one worker.
    images = np.random.default_rng(0).integers(0, 256, (64, 600, 600, 3), np.uint8)
    before = threads()
    loader = D.Loader((images, np.arange(64)), batch_size=64, transforms=[D.Resize((599, 599))], num_workers=1)
    timer = threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        for _ in loader:
            time.sleep(1)
    timer.join()
    loader.close()
    assert threads() == before


def test_errors_and_device():
    images, labels = arrays(n=10)
    with pytest.raises(ValueError, match="on_error"):
        D.Loader((images, labels), on_error="ignore")
    with pytest.raises(ValueError, match="batch_size"):
        D.Loader((images, labels), batch_size=0)
    with pytest.raises(TypeError, match="uint8 images, floating-point features or integer ones .*, got bool"):
        D.from_arrays(images.astype(bool), labels)  # other arrays are features (tests/test_data_features.py)
    if not ft.cuda.is_available():
        with pytest.raises(RuntimeError, match="cuda"):
            D.Loader((images, labels), device="cuda")
    loader = D.Loader((images, labels), batch_size=5)
    loader.close()
    with pytest.raises(ValueError, match="closed"):
        list(loader)


@pytest.mark.cuda
def test_cuda_batches():
    images, labels = arrays(n=40)
    cpu = collect(D.Loader((images, labels), batch_size=8, transforms=TF, shuffle=True, num_workers=2))
    gpu = D.Loader((images, labels), batch_size=8, transforms=TF, shuffle=True, num_workers=2, device="cuda")
    got = [(x.cpu().numpy(), y.cpu().numpy()) for x, y in gpu]
    assert same(got, cpu)
