"""Latency of fasttrain's NumPy/DLPack bridges, side by side with PyTorch when it imports.

Prints one JSON object per line: {"name", "value", "unit"} and, when torch ran in the
same process, "reference" (torch's median), "reference_name" and "ratio" = torch / fasttrain
(> 1 means fasttrain is faster). Zero-copy bridges should cost the same for 1 KiB and 1 GiB.

    python benchmarks/bench_bridge.py            # full run (1 GiB array)
    python benchmarks/bench_bridge.py --quick    # smoke run (64 MiB array, fewer repetitions)
"""
import argparse
import gc
import json
import statistics
import time

import numpy as np

import fasttrain as ft

try:
    import torch
except Exception:  # not installed, or a broken install: run without the reference
    torch = None

UNITS = {"us": 1e3, "ms": 1e6}


def median_ns(fn, inner, samples, warmup=3):
    """Median over `samples` timings of `inner` back-to-back calls, in ns per call (after `warmup` discarded samples)."""
    times = []
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for i in range(warmup + samples):
            start = time.perf_counter_ns()
            for _ in range(inner):
                fn()
            if i >= warmup:
                times.append((time.perf_counter_ns() - start) / inner)
    finally:
        if gc_was_enabled:
            gc.enable()
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="64 MiB instead of 1 GiB, fewer repetitions")
    args = parser.parse_args()

    big_bytes, big_label = (64 << 20, "64MiB") if args.quick else (1 << 30, "1GiB")
    fast = (200, 21) if args.quick else (1000, 101)  # (calls per sample, samples) for the sub-microsecond bridges
    slow = (1, 5) if args.quick else (1, 21)  # the same for the 1e6-element list conversions

    values = np.random.default_rng(0).standard_normal(1_000_000).tolist()  # a list of 1e6 Python floats
    cases = []  # (name, fasttrain fn, torch fn, unit, (inner, samples)); torch fns run only when torch imported
    for label, nbytes in (("1KiB", 1 << 10), (big_label, big_bytes)):
        a = np.ones(nbytes // 4, dtype=np.float32)  # allocated (and touched) once per size
        t = ft.from_numpy(a)
        tt = torch.from_numpy(a) if torch else None
        cases += [
            (f"from_numpy_{label}", lambda a=a: ft.from_numpy(a), lambda a=a: torch.from_numpy(a)),
            (f"as_tensor_ndarray_{label}", lambda a=a: ft.as_tensor(a), lambda a=a: torch.as_tensor(a)),
            (f"tensor_numpy_{label}", lambda t=t: t.numpy(), lambda tt=tt: tt.numpy()),
            (f"np_from_dlpack_{label}", lambda t=t: np.from_dlpack(t), lambda tt=tt: np.from_dlpack(tt)),
            (f"from_dlpack_ndarray_{label}", lambda a=a: ft.from_dlpack(a), lambda a=a: torch.from_dlpack(a)),
        ]
    cases = [(name, f, r, "us", fast) for name, f, r in cases]
    cases += [
        ("as_tensor_list_1e6_floats", lambda: ft.as_tensor(values), lambda: torch.as_tensor(values), "ms", slow),
        ("tensor_list_1e6_floats", lambda: ft.tensor(values), lambda: torch.tensor(values), "ms", slow),
    ]

    for name, fn, ref_fn, unit, (inner, samples) in cases:
        value = median_ns(fn, inner, samples) / UNITS[unit]
        line = {"name": name, "value": round(value, 4), "unit": unit}
        if torch is not None:
            reference = median_ns(ref_fn, inner, samples) / UNITS[unit]
            line.update(reference=round(reference, 4), reference_name=f"torch {torch.__version__}",
                        ratio=round(reference / value, 3))
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
