"""Latency of fasttrain's NumPy/DLPack bridges, side by side with PyTorch when it imports.

Prints one JSON object per line: {"name", "value", "unit"} and, when torch ran in the
same process, "reference" (torch's median), "reference_name" and "ratio" = torch / fasttrain
(> 1 means fasttrain is faster). Zero-copy bridges should cost the same for 1 KiB and 1 GiB.

With --device cuda (cudabench.py has the options) the exchanges are those of CUDA tensors over DLPack, of
1 KiB and 1 GiB (64 MiB with --quick) buffers on the device:

  cuda_dlpack_export_<size>           t.__dlpack__() (no stream: no wait), against torch's own
  cuda_from_dlpack_self_<size>        ft.from_dlpack(ft tensor), against torch.from_dlpack(torch tensor)
  cuda_from_dlpack_torch_<size>       ft.from_dlpack(torch tensor), against torch.from_dlpack(torch tensor)
  cuda_torch_from_dlpack_ft_<size>    torch.from_dlpack(ft tensor), against torch.from_dlpack(torch tensor)

They queue no work on the device, so they are timed on the host as the CPU bridges are; a consumer that
names a stream makes fasttrain's export wait for the device (csrc/bind/dlpack.c), which is part of the
figures that import a fasttrain tensor. Without torch on the device only the fasttrain figures are printed.

    python benchmarks/bench_bridge.py            # full run (1 GiB array)
    python benchmarks/bench_bridge.py --quick    # smoke run (64 MiB array, fewer repetitions)
    python benchmarks/bench_bridge.py --device cuda [--quick]
"""
import argparse
import gc
import json
import statistics
import time

import numpy as np

import fasttrain as ft
import cudabench

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


def cuda_cases(sizes, torch_cuda):
    """(name, fasttrain fn, torch fn or None) for the DLPack exchanges of CUDA tensors."""
    cases = []
    for label, nbytes in sizes:
        t = ft.empty(nbytes // 4, device="cuda")  # contents do not matter to an exchange
        ours = [(f"cuda_dlpack_export_{label}", lambda t=t: t.__dlpack__()),
                (f"cuda_from_dlpack_self_{label}", lambda t=t: ft.from_dlpack(t))]
        if not torch_cuda:
            cases += [(name, fn, None) for name, fn in ours]
            continue
        tt = torch.empty(nbytes // 4, device="cuda")

        def own(tt=tt):
            return torch.from_dlpack(tt)
        cases += [
            (ours[0][0], ours[0][1], lambda tt=tt: tt.__dlpack__()),
            (ours[1][0], ours[1][1], own),
            (f"cuda_from_dlpack_torch_{label}", lambda tt=tt: ft.from_dlpack(tt), own),
            (f"cuda_torch_from_dlpack_ft_{label}", lambda t=t: torch.from_dlpack(t), own),
        ]
    return cases


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="64 MiB instead of 1 GiB, fewer repetitions")
    cudabench.add_arguments(parser)
    args = parser.parse_args()
    torch_cuda = cudabench.setup(args, parser, torch)

    big_bytes, big_label = (64 << 20, "64MiB") if args.quick else (1 << 30, "1GiB")
    fast = (200, 21) if args.quick else (1000, 101)  # (calls per sample, samples) for the sub-microsecond bridges
    slow = (1, 5) if args.quick else (1, 21)  # the same for the 1e6-element list conversions
    if args.device == "cuda":
        for name, fn, ref_fn in cuda_cases((("1KiB", 1 << 10), (big_label, big_bytes)), torch_cuda):
            report(name, fn, ref_fn, "us", fast)
        return

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

    for name, fn, ref_fn, unit, repeats in cases:
        report(name, fn, ref_fn if torch is not None else None, unit, repeats)


def report(name, fn, ref_fn, unit, repeats):
    """One JSON line: fn's median, and ref_fn's beside it when there is one."""
    inner, samples = repeats
    value = median_ns(fn, inner, samples) / UNITS[unit]
    line = {"name": name, "value": round(value, 4), "unit": unit}
    if ref_fn is not None:
        reference = median_ns(ref_fn, inner, samples) / UNITS[unit]
        line.update(reference=round(reference, 4), reference_name=f"torch {torch.__version__}",
                    ratio=round(reference / value, 3))
    print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
