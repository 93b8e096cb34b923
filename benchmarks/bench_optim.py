"""One optimizer step over a flat buffer of 10M float32 params: fasttrain's fused pass against the memory
bandwidth bound of this machine and against torch.optim (when torch imports), in the same process.

Prints one JSON object per line, {"name", "value", "unit"} and for comparisons "reference" and "ratio":

  stream_triad            GB/s of a[i] = b[i] + s * c[i] over three 10M-float arrays, compiled here with
                          gcc -O3 -march=native -fopenmp and run on the same thread count, counted as STREAM
                          counts (12 bytes per element: the write-allocate read of a is not counted).
  <opt>_step              ms of ft.optim.<opt>.step(); "reference" is the bound: the bytes the step must move
                          (each buffer read once, each updated one written once) divided by the triad
                          bandwidth; "ratio" = step time / bound time (1.0: at the bound; below 1 is
                          possible because in-place updates need no write-allocate reads while the triad's
                          output does).
  <opt>_step_GBps         those bytes / the step time.
  <opt>_step_vs_torch_*   the same step against torch.optim on the same params and thread count:
                          "reference" = torch's ms, "ratio" = fasttrain ms / torch ms (< 1: faster).

Every figure is the best of its repetitions (as STREAM reports), over several rounds that interleave all the
measurements: other processes on a shared machine slow some rounds down, and the best round is what the
machine can do.

Bytes per param: SGD with momentum 20 (read p, g, buf; write p, buf); AdamW 28 (read p, g, m, v; write p, m,
v); the _checked variants (the default step(): the grad norm is computed to refuse non-finite grads) and the
_clip variants (max_grad_norm) read the grads once more: +4.

With --device cuda (cudabench.py has the options and the timing) the params, grads and state live on the
CUDA device, torch's too (plus torch_sgd_fused), and the bound is the device's: "device_copy", GB/s of a
1 GiB device-to-device copy counted as 2 x its size, replaces stream_triad. The buffers are 100M params
(25M with --quick) so that they do not fit in the L2 cache. A sample is the mean step time over enough steps
between two device synchronisations to last about 20 ms (5 ms with --quick); the figure is the best sample.
The target is a step within 1.2x of the bound (the "target" field of the _step lines); it is reported, not
asserted.

    python benchmarks/bench_optim.py            # 10M params
    python benchmarks/bench_optim.py --quick    # 1M params, fewer repetitions
    python benchmarks/bench_optim.py --device cuda [--quick]
"""
import argparse
import ctypes
import gc
import json
import os
import subprocess
import tempfile
import time

import numpy as np

import fasttrain as ft
import cudabench

try:
    import torch
except Exception:  # not installed, or a broken install: run without the reference
    torch = None

TRIAD_C = r"""
#include <stdint.h>
#include <omp.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
/* Best seconds of `reps` triads; arrays first touched by the threads that use them. */
double triad(float *a, float *b, float *c, int64_t n, int reps) {
    #pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) { a[i] = 0.0f; b[i] = 1.0f; c[i] = 2.0f; }
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t = now();
        #pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; i++) a[i] = b[i] + 3.0f * c[i];
        t = now() - t;
        if (t < best) best = t;
    }
    return best;
}
"""


def compile_triad():
    """The triad kernel, built with the machine's compiler (the loaded library outlives its file)."""
    with tempfile.TemporaryDirectory() as tmp:
        src, lib = os.path.join(tmp, "triad.c"), os.path.join(tmp, "triad.so")
        with open(src, "w") as f:
            f.write(TRIAD_C)
        subprocess.check_call(["gcc", "-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", src, "-o", lib])
        triad = ctypes.CDLL(lib).triad
    triad.restype = ctypes.c_double
    triad.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int]
    return triad


def best_ms(fn, reps, warmup=2):
    """The fastest of `reps` calls, in ms."""
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
    finally:
        if gc_was_enabled:
            gc.enable()
    return min(times) * 1e3


def flat_ft(values, dev="cpu"):
    """A tensor first touched by the pool's threads (a parallel copy), as a training run's buffers are."""
    t = ft.empty(values.shape, device=dev)
    t.copy_(ft.from_numpy(values))
    return t


def flat_torch(values, dev="cpu"):
    t = torch.empty(values.shape, device=dev)
    t.copy_(torch.from_numpy(values))
    return t


def emit(name, value, unit, reference=None, ratio=None, **extra):
    line = {"name": name, "value": round(value, 4), "unit": unit}
    if reference is not None:
        line.update(reference=round(reference, 4), ratio=round(ratio, 4))
    line.update(extra)
    print(json.dumps(line), flush=True)


def best_ms_cuda(steps, rounds, target_s):
    """{name: ms} of each (fn, sync) in steps: the best over `rounds` of the mean step time of enough steps
    between two synchronisations to last about target_s; the rounds interleave all the steps."""
    calls = {}
    for name, (fn, sync) in steps.items():
        fn()
        fn()
        calls[name] = cudabench.calls_for(fn, sync, target_s)
    best = {}
    for _ in range(rounds):
        for name, (fn, sync) in steps.items():
            ms = cudabench.samples(fn, sync, calls[name], 1)[0] * 1e3
            best[name] = min(best.get(name, ms), ms)
    return best


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="1M params and fewer repetitions (with --device cuda: 25M params)")
    cudabench.add_arguments(parser)
    args = parser.parse_args()
    torch_cuda = cudabench.setup(args, parser, torch)
    cuda, dev = args.device == "cuda", args.device
    if cuda:
        n, rounds = (25_000_000, 3) if args.quick else (100_000_000, 8)
        label = "25M" if args.quick else "100M"
    else:
        n, reps, rounds = (1_000_000, 10, 2) if args.quick else (10_000_000, 20, 8)
        label = "1M" if args.quick else "10M"
        threads = ft.get_num_threads()
        if torch is not None:
            torch.set_num_threads(threads)
        emit("threads", threads, "threads")

    rng = np.random.default_rng(0)
    p0 = rng.standard_normal(n).astype(np.float32)
    g0 = (1e-3 * rng.standard_normal(n)).astype(np.float32)

    ours = [  # (name, optimizer class, kwargs, step kwargs, bytes per param)
        ("sgd_momentum", ft.optim.SGD, dict(lr=1e-3, momentum=0.9), dict(check_finite=False), 20),
        ("sgd_momentum_checked", ft.optim.SGD, dict(lr=1e-3, momentum=0.9), {}, 24),
        ("adamw", ft.optim.AdamW, dict(lr=1e-3), dict(check_finite=False), 28),
        ("adamw_checked", ft.optim.AdamW, dict(lr=1e-3), {}, 32),
        ("adamw_clip", ft.optim.AdamW, dict(lr=1e-3), dict(max_grad_norm=1.0), 32),
    ]
    steps = {}
    if not cuda:
        triad_kernel = compile_triad()
        a, b, c = (ft.empty(n) for _ in range(3))
        steps["triad"] = lambda: triad_kernel(a.data_ptr(), b.data_ptr(), c.data_ptr(), n, reps) * 1e3
    for name, cls, kwargs, step_kwargs, _ in ours:
        p = flat_ft(p0, dev)
        p.grad = flat_ft(g0, dev)
        opt = cls([p], **kwargs)
        steps[name] = lambda opt=opt, kw=step_kwargs: opt.step(**kw)

    theirs = [  # (name, fasttrain case it is compared with, optimizer factory, clip first)
        ("torch_sgd_foreach", "sgd_momentum", lambda ps: torch.optim.SGD(ps, lr=1e-3, momentum=0.9, foreach=True),
         False),
        ("torch_adamw_foreach", "adamw", lambda ps: torch.optim.AdamW(ps, lr=1e-3, foreach=True), False),
        ("torch_adamw_fused", "adamw", lambda ps: torch.optim.AdamW(ps, lr=1e-3, fused=True), False),
        ("torch_clip_adamw_foreach", "adamw_clip", lambda ps: torch.optim.AdamW(ps, lr=1e-3, foreach=True), True),
    ] if (torch_cuda if cuda else torch is not None) else []
    if theirs and cuda:
        theirs.insert(1, ("torch_sgd_fused", "sgd_momentum",
                          lambda ps: torch.optim.SGD(ps, lr=1e-3, momentum=0.9, fused=True), False))
    skipped = {}
    for name, _, make, clip in theirs:
        p = flat_torch(p0, dev).requires_grad_(True)
        p.grad = flat_torch(g0, dev)
        try:
            opt = make([p])
        except (RuntimeError, TypeError, ValueError) as e:  # e.g. a torch without the CPU fused AdamW
            skipped[name] = str(e)
            continue

        def step(opt=opt, p=p, clip=clip):
            with torch.no_grad():
                if clip:
                    torch.nn.utils.clip_grad_norm_([p], 1.0, foreach=True)
                opt.step()
        steps[name] = step

    if cuda:
        ours_names = {name for name, *_ in ours}
        limits = cudabench.DeviceLimits(torch_cuda, fma=False)
        limits.emit()
        bandwidth = limits.copy
        best = best_ms_cuda({name: (fn, cudabench.ft_sync if name in ours_names else cudabench.torch_sync)
                             for name, fn in steps.items()}, rounds, 0.005 if args.quick else 0.02)
    else:
        best = {}
        for _ in range(rounds):
            for name, fn in steps.items():
                ms = fn() if name == "triad" else best_ms(fn, reps)
                best[name] = min(best.get(name, ms), ms)
        bandwidth = 12 * n / (best["triad"] * 1e-3) / 1e9
        emit("stream_triad", bandwidth, "GB/s")
    target = {"target": "ratio <= 1.2"} if cuda else {}
    for name, _, _, _, bytes_per_param in ours:
        ms, bound_ms = best[name], bytes_per_param * n / (bandwidth * 1e9) * 1e3
        emit(f"{name}_step_{label}", ms, "ms", bound_ms, ms / bound_ms, **target)
        emit(f"{name}_step_{label}_GBps", bytes_per_param * n / (ms * 1e-3) / 1e9, "GB/s")
    for name, mine, _, _ in theirs:
        key = f"{mine}_step_{label}_vs_{name}"
        if name in skipped:
            print(json.dumps({"name": key, "skipped": skipped[name]}), flush=True)
        else:
            emit(key, best[mine], "ms", best[name], best[mine] / best[name])


if __name__ == "__main__":
    main()
