"""What the benchmarks share for `--device cuda`: the options, the checks before a run, timing of work queued
on a device, and the device's limits measured in the same run.

  --device cuda   fasttrain on the CUDA device, and torch beside it on the same device when torch imports and
                  sees one (else the figures come without a reference, and a "reference" line says why).
                  Without a usable device the benchmark exits with status 2 and ft.cuda.unavailable_reason().
  --tf32          TF32 tensor cores for float32 convolutions and matmuls, on both sides
                  (ft.backends.allow_tf32, torch.backends.cuda.matmul.allow_tf32 and
                  torch.backends.cudnn.allow_tf32); off by default, so that both compute in float32.
  --benchmark     cuDNN times its algorithms per convolution shape, on both sides (ft.backends.benchmark,
                  torch.backends.cudnn.benchmark); off by default, as in both libraries.

Timing: a sample is perf_counter around `inner` back-to-back calls between two device synchronisations
(ft.cuda.synchronize for fasttrain, torch.cuda.synchronize for torch), so it covers the queued work and not
only its launch; `inner` is picked so that a sample lasts a few milliseconds, which keeps the cost of the
synchronisation itself out of the figure.

Limits (DeviceLimits):
  device_copy     GB/s of a device-to-device copy of a buffer far larger than the L2 cache (dst.copy_(src),
                  fasttrain's and, with torch, torch's; the faster is the limit), counting the bytes read and
                  the bytes written: the bandwidth a memory-bound pass can reach.
  fp32_fma_peak   GFLOP/s of a kernel of independent FMA chains filling every SM (2 flops per FMA), compiled
                  here at run time with nvcc (the CPU benchmarks do the same with gcc); absent without nvcc.
                  With --tf32 a matmul or convolution can exceed it: its peak_fraction can read above 1.
"""
import ctypes
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import fasttrain as ft


def add_arguments(parser):
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="where fasttrain (and torch beside it) runs (default: cpu)")
    parser.add_argument("--tf32", action="store_true",
                        help="with --device cuda: TF32 tensor cores for float32 convolutions and matmuls, in "
                             "fasttrain and torch alike (off by default)")
    parser.add_argument("--benchmark", action="store_true",
                        help="with --device cuda: cuDNN picks convolution algorithms by timing them, in fasttrain "
                             "(ft.backends.benchmark) and torch (torch.backends.cudnn.benchmark) alike")


def setup(args, parser, torch):
    """After parsing: for --device cuda, exits with status 2 (and the reason) when fasttrain cannot use a CUDA
    device, sets TF32 and cuDNN's autotuning on both sides as asked, prints a "device" line, and returns whether
    torch runs beside it on the device; False on the CPU."""
    if args.device != "cuda":
        for flag in ("tf32", "benchmark"):
            if getattr(args, flag):
                parser.error(f"--{flag} applies to --device cuda")
        return False
    if not ft.cuda.is_available():
        print(f"{parser.prog}: --device cuda: {ft.cuda.unavailable_reason()}", file=sys.stderr, flush=True)
        sys.exit(2)
    ft.backends.allow_tf32 = args.tf32
    ft.backends.benchmark = args.benchmark
    torch_cuda = torch is not None and torch.cuda.is_available()
    if torch_cuda:
        torch.backends.cuda.matmul.allow_tf32 = args.tf32
        torch.backends.cudnn.allow_tf32 = args.tf32
        torch.backends.cudnn.benchmark = args.benchmark
    line = {"name": "device", "value": ft.cuda.get_device_name(), "unit": "device", "tf32": args.tf32,
            "benchmark": args.benchmark}
    if torch is not None:
        line["torch_version"] = torch.__version__
    if torch_cuda:  # read back: what torch will do, whichever of its precision settings it goes by
        line["torch_tf32"] = {"matmul": torch.backends.cuda.matmul.allow_tf32,
                              "cudnn": torch.backends.cudnn.allow_tf32}
    print(json.dumps(line), flush=True)
    if not torch_cuda:
        why = "torch does not import" if torch is None else f"torch {torch.__version__} sees no CUDA device"
        print(json.dumps({"name": "reference", "skipped": why}), flush=True)
    return torch_cuda


def ft_sync():
    ft.cuda.synchronize()


def torch_sync():
    import torch
    torch.cuda.synchronize()


def per_call(fn, sync, inner):
    """Seconds per call of `inner` calls between two synchronisations (the first one waits for earlier work)."""
    sync()
    t = time.perf_counter()
    for _ in range(inner):
        fn()
    sync()
    return (time.perf_counter() - t) / inner


def calls_for(fn, sync, target_s, cap=10000):
    """Calls per sample so that a sample lasts about target_s (at least 1, at most cap)."""
    one = per_call(fn, sync, 5)
    return max(1, min(cap, int(target_s / max(one, 1e-7))))


def samples(fn, sync, inner, count):
    """`count` samples of per_call, with the garbage collector off."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return [per_call(fn, sync, inner) for _ in range(count)]
    finally:
        if was_enabled:
            gc.enable()


FMA_CU = r"""
#include <cuda_runtime.h>

#define CHAINS 8

/* CHAINS independent FMA chains per thread, from distinct values so that
 * none can be merged; a runtime a and b keep the compiler from folding them. */
__global__ void fma_chains(float *out, int iters, float a, float b) {
    float r[CHAINS];
#pragma unroll
    for (int k = 0; k < CHAINS; k++)
        r[k] = (float)(threadIdx.x + k);
#pragma unroll 8
    for (int i = 0; i < iters; i++) {
#pragma unroll
        for (int k = 0; k < CHAINS; k++)
            r[k] = fmaf(r[k], a, b);
    }
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < CHAINS; k++)
        s += r[k];
    out[(size_t)blockIdx.x * blockDim.x + threadIdx.x] = s;
}

/* Best GFLOP/s of `reps` launches that fill every SM (8 blocks of 256
 * threads per SM), after one warm-up launch; 0 when a CUDA call failed
 * (*err then holds its cudaError_t). */
extern "C" double fma_gflops(int device, int iters, int reps, int *err) {
    cudaDeviceProp prop;
    float *out = NULL;
    cudaEvent_t start = NULL, stop = NULL;
    double best = 0.0;
    const int threads = 256;
    cudaError_t e = cudaSetDevice(device);
    if (e == cudaSuccess)
        e = cudaGetDeviceProperties(&prop, device);
    int blocks = e == cudaSuccess ? prop.multiProcessorCount * 8 : 0;
    if (e == cudaSuccess)
        e = cudaMalloc((void **)&out, (size_t)blocks * threads * sizeof(float));
    if (e == cudaSuccess)
        e = cudaEventCreate(&start);
    if (e == cudaSuccess)
        e = cudaEventCreate(&stop);
    for (int r = -1; r < reps && e == cudaSuccess; r++) {
        e = cudaEventRecord(start, 0);
        if (e == cudaSuccess) {
            fma_chains<<<blocks, threads>>>(out, iters, 0.999999f, 1e-6f);
            e = cudaGetLastError();
        }
        if (e == cudaSuccess)
            e = cudaEventRecord(stop, 0);
        if (e == cudaSuccess)
            e = cudaEventSynchronize(stop);
        float ms = 0.0f;
        if (e == cudaSuccess)
            e = cudaEventElapsedTime(&ms, start, stop);
        double gflops = ms > 0.0f ? 2.0 * CHAINS * iters * (double)blocks * threads / (ms * 1e-3) / 1e9 : 0.0;
        if (e == cudaSuccess && r >= 0 && gflops > best)
            best = gflops;
    }
    if (start)
        cudaEventDestroy(start);
    if (stop)
        cudaEventDestroy(stop);
    if (out)
        cudaFree(out);
    *err = (int)e;
    return e == cudaSuccess ? best : 0.0;
}
"""


def fma_peak(iters=1 << 19, reps=3):
    """(GFLOP/s, None) of FMA_CU on device 0, or (None, why) when it cannot be built or run."""
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    if not os.path.exists(nvcc):
        return None, "nvcc was not found on PATH or in /usr/local/cuda/bin"
    with tempfile.TemporaryDirectory() as tmp:  # the loaded library outlives its file
        src, lib = os.path.join(tmp, "fma.cu"), os.path.join(tmp, "fma.so")
        with open(src, "w") as f:
            f.write(FMA_CU)
        errors = []
        # the device's own architecture where this nvcc knows it, else nvcc's default (PTX the driver compiles)
        for arch in (["-arch=native"], []):
            r = subprocess.run([nvcc, "-O3", *arch, "-shared", "-Xcompiler", "-fPIC", src, "-o", lib],
                               capture_output=True, text=True)
            if r.returncode == 0:
                break
            errors.append((r.stderr.strip().splitlines() or [f"status {r.returncode}"])[-1])
        else:
            return None, "nvcc failed: " + " / ".join(errors)
        fn = ctypes.CDLL(lib).fma_gflops
    fn.restype = ctypes.c_double
    fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
    err = ctypes.c_int(0)
    gflops = fn(0, iters, reps, ctypes.byref(err))
    if err.value:
        return None, f"the FMA kernel failed with cudaError {err.value}"
    return gflops, None


def copy_bandwidth(nbytes, torch_cuda, rounds=5):
    """{"fasttrain": GB/s, "torch": GB/s (with torch)} of dst.copy_(src) between two device buffers of
    nbytes, the best sample of `rounds`, 2 * nbytes moved per copy."""
    n = nbytes // 4
    ft_src, ft_dst = ft.empty(n, device="cuda"), ft.empty(n, device="cuda")
    sides = {"fasttrain": (lambda: ft_dst.copy_(ft_src), ft_sync)}
    if torch_cuda:
        import torch
        t_src, t_dst = torch.empty(n, device="cuda"), torch.empty(n, device="cuda")
        sides["torch"] = (lambda: t_dst.copy_(t_src), torch_sync)
    out = {}
    for name, (fn, sync) in sides.items():
        fn()
        out[name] = 2.0 * 4 * n / min(samples(fn, sync, 4, rounds)) / 1e9
    return out


class DeviceLimits:
    """The device's copy bandwidth and FP32 FMA peak, measured once; emit() prints them as JSON lines."""

    def __init__(self, torch_cuda, copy_bytes=1 << 30, fma=True):
        self.copies = copy_bandwidth(copy_bytes, torch_cuda)
        self.copy = max(self.copies.values())
        self.fma, self.fma_skipped = fma_peak() if fma else (None, None)

    def emit(self):
        print(json.dumps({"name": "device_copy", "value": round(self.copy, 1), "unit": "GB/s",
                          **{k: round(v, 1) for k, v in self.copies.items()}}), flush=True)
        if self.fma is not None:
            print(json.dumps({"name": "fp32_fma_peak", "value": round(self.fma, 1), "unit": "GFLOP/s"}), flush=True)
        elif self.fma_skipped:
            print(json.dumps({"name": "fp32_fma_peak", "skipped": self.fma_skipped}), flush=True)
