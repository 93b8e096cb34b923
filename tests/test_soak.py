"""Bounded soaks: many bridge round trips and loader lifetimes leave memory, reference counts and threads where
they were (benchmarks/bench_soak.py runs the same loops at a large size)."""
import gc
import os
import sys
import threading

import numpy as np

import fasttrain as ft
from fasttrain import data as D


def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def bridge_round_trips(n):
    """NumPy -> fasttrain -> NumPy (and DLPack both ways) n times over one array."""
    a = np.arange(4096, dtype=np.float32)
    for _ in range(n):
        t = ft.from_numpy(a)
        b = t.numpy()
        c = np.from_dlpack(t)
        d = ft.from_dlpack(b)
        assert b.ctypes.data == a.ctypes.data == c.ctypes.data == d.data_ptr()
    return a


def loader_cycles(path, n):
    """n loaders created over a record file, iterated part way (a broken epoch) and closed."""
    for k in range(n):
        loader = D.Loader(path, batch_size=4, num_workers=2, shuffle=True)
        it = iter(loader)
        for _ in range(k % 3 + 1):
            next(it)
        loader.close()


def test_bridge_round_trips_leak_nothing():
    a = bridge_round_trips(2000)  # warm-up: allocator pools and caches settle
    gc.collect()
    refs, rss = sys.getrefcount(a), rss_mb()
    bridge_round_trips(20000)
    gc.collect()
    assert sys.getrefcount(a) == refs
    assert rss_mb() - rss < 8, f"RSS grew {rss_mb() - rss:.1f} MB over 20000 round trips"


def test_loader_lifetimes_leave_no_threads_or_memory(tmp_path):
    path = tmp_path / "soak.rec"
    D.write_records(path, (np.zeros((64, 16, 16), np.uint8), np.arange(64) % 10))
    loader_cycles(path, 5)
    gc.collect()
    threads, rss = threading.active_count(), rss_mb()
    native = len(os.listdir("/proc/self/task"))
    loader_cycles(path, 40)
    gc.collect()
    assert threading.active_count() == threads
    assert len(os.listdir("/proc/self/task")) <= native  # every worker thread joined
    assert rss_mb() - rss < 16, f"RSS grew {rss_mb() - rss:.1f} MB over 40 loader lifetimes"
