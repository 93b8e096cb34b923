"""The soaks of tests/test_soak.py at a large size: 1e6 bridge round trips (NumPy -> fasttrain -> NumPy and
DLPack both ways) and 200 loader lifetimes (created, an epoch broken off, closed), with the growth of RSS,
of the array's reference count and of the process's threads, which should all be 0, and the time per round.

JSON lines: {"name", "value", "unit"} with "rss_growth_mb", "refcount_growth" / "thread_growth".

    PYTHONPATH=python python benchmarks/bench_soak.py [--quick]
"""
import argparse
import gc
import json
import os
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

from test_soak import bridge_round_trips, loader_cycles, rss_mb  # noqa: E402
from fasttrain import data as D  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    trips, lifetimes = (100_000, 40) if args.quick else (1_000_000, 200)
    a = bridge_round_trips(10_000)
    gc.collect()
    refs, rss, t = sys.getrefcount(a), rss_mb(), time.perf_counter()
    bridge_round_trips(trips)
    seconds = time.perf_counter() - t
    gc.collect()
    print(json.dumps({"name": "bridge_round_trip", "value": round(seconds / trips * 1e6, 3), "unit": "us",
                      "rounds": trips, "rss_growth_mb": round(rss_mb() - rss, 1),
                      "refcount_growth": sys.getrefcount(a) - refs}), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "soak.rec")
        D.write_records(path, (np.zeros((64, 16, 16), np.uint8), np.arange(64) % 10))
        loader_cycles(path, 10)
        gc.collect()
        threads, rss, t = len(os.listdir("/proc/self/task")), rss_mb(), time.perf_counter()
        loader_cycles(path, lifetimes)
        seconds = time.perf_counter() - t
        gc.collect()
        print(json.dumps({"name": "loader_lifetime", "value": round(seconds / lifetimes * 1e3, 3), "unit": "ms",
                          "rounds": lifetimes, "rss_growth_mb": round(rss_mb() - rss, 1),
                          "thread_growth": len(os.listdir("/proc/self/task")) - threads}), flush=True)


if __name__ == "__main__":
    main()
