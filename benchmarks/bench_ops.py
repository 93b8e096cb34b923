"""Throughput of the CPU training ops (ft.ops.<op>_forward / _backward) at training shapes, against this
machine's limits measured in the same run and against PyTorch's CPU ops when torch imports.

Prints one JSON object per line: {"name", "value", "unit", "ms", "peak_fraction"} and, when torch ran the same
op in the same process, "reference" (torch's figure, same unit) and "ratio" = ours / torch (> 1: fasttrain is
faster). Each round takes one sample of the two machine limits and then one sample of every op, fasttrain's
and torch's back to back (7 rounds after a warm-up; 3 with --quick), so a load that comes and goes on a
shared machine hits all the figures alike. Small problems time several calls per sample, after one untimed
call. Every figure is a median over rounds.

Other processes on this 2-core machine skew every figure (an OpenMP barrier waits for a descheduled thread:
small ops then take whole scheduler ticks). Each round therefore records the CPU time other processes took
meanwhile (/proc/stat, steal included, minus this process's own), and the medians are over the quiet rounds
(others under QUIET = 0.25 cores) when there are at least 3, else over all rounds. The "contention" line says
how many rounds were quiet and which were used, and the others' cores per round.

Machine limits (lines "fma_peak_<avx512|avx2>" and "stream_triad"), from a small C file compiled here at run
time with the system gcc (-O2 -mavx512f -fopenmp, or -O2 -mfma -mavx2 where AVX-512 is missing) and loaded with ctypes:

  fma_peak      GFLOP/s of a loop of 16 independent vector FMAs per iteration, one copy per thread of the
                same thread count as the ops; 2 flops per FMA lane.
  stream_triad  GB/s of a[i] = b[i] + s * c[i] over three arrays far larger than the last-level cache
                (ft.empty: huge-page backed, like the ops' tensors; best of 3 triads per round), counted as
                STREAM counts (12 bytes per element: the write-allocate read of a is not counted).

Their "value" is the median over the rounds used ("best": the fastest sample of all); "peak_fraction" = the
op's median / the limit's median from the same rounds (fma_peak for GFLOP/s, stream_triad for GB/s).

Compute-bound ops, GFLOP/s (2 flops per multiply-add, no bias where a batch norm follows):
  conv3x3_<layout>_n<N>_c<C>_h<H>_{fwd,bwd_data,bwd_weights}   3x3, stride 1, padding 1, C = K channels,
      2*N*K*C*9*H*W flops each (the nominal count, as usual: it includes the taps that fall on the zero
      padding, which the kernels skip: (3H-2)(3W-2)/(9HW) of it is real work, 92% at 16x16, 96% at 32x32,
      so "peak_fraction" can read slightly above 1); fwd = conv2d_forward, bwd_data = conv2d_backward(dinp
      only), bwd_weights = conv2d_backward(dweight only). torch: F.conv2d and aten.convolution_backward with
      the same output mask (what autograd calls), inputs and weights in torch.channels_last for nhwc. The
      _bf16 cases (small planes, on a CPU with AVX512-BF16) run both in bfloat16; their "peak_fraction" is
      over the float32 FMA peak, as the sdpa _bf16 cases'.
  linear_n<N>_<in>x<out>_{fwd,bwd}   y = x @ W^T + b: fwd 2*N*in*out flops; bwd (dx, dW, db) 4*N*in*out.
      torch: F.linear; mm(dy, W) + mm(dy^T, x) + dy.sum(0) (what autograd runs for addmm).

  sdpa_n<N>_h<H>_t<T>_d<D>[_causal|_dropout]_{fwd,fwd_bwd}   scaled dot-product attention, q, k, v (N, H, T, D):
      fwd 4*N*H*T*T*D flops (two products), fwd_bwd 3.5 times that (the backward's five products), with
      causal counting only the T*(T+1)/2 scores a query sees; fwd = sdpa_forward with the lse kept, fwd_bwd =
      sdpa_forward + sdpa_backward. torch: F.scaled_dot_product_attention (1.13: its private
      _scaled_dot_product_attention) and torch.autograd.grad of its output for (q, k, v); _dropout with
      dropout_p=0.1 on the attention weights on both sides (the same flops counted). The _bf16 cases
      run the same in bfloat16 (on a CPU with AVX512-BF16), torch in bfloat16 too; "peak_fraction" is
      still over the float32 FMA peak, which the bfloat16 products can pass (their rate is twice it).

Memory-bound ops, GB/s over the bytes the op must move at least (each input read once, each output written
once, float32 values, int64 indices and targets; no write-allocate reads, as STREAM). An op that reads its
input twice (a two-pass batch or layer norm over a tensor larger than the cache) cannot reach 1.0:
  relu fwd 8 B/elem, relu bwd (dy, y -> dx) 12; batch_norm (training; NHWC, and NCHW planes of 32x32 and
  7x7) fwd 8, bwd (dy, x -> dx) 12;
  max_pool2d 2x2 fwd (x -> y, indices) 7 B per input element, bwd (dy, indices -> dx) 7; add 12;
  cross_entropy_fused (logits, target -> loss, dlogits: softmax + CE forward and its gradient in one call)
  8 B/elem + 8 B/row; layer_norm fwd 8, bwd (dy, x -> dx) 12; group_norm (NCHW, 8 groups) fwd 8, bwd
  (dy, x -> dx, dweight, dbias) 12; embedding fwd (ids -> rows) 8 B per id + 8 B per output element (the
  table rows read, the output written), bwd (dout, ids -> dense dweight) 4 B per dout element + 8 B per id +
  4 B per table element (the dense gradient written once).
  torch: relu / threshold_backward, F.batch_norm / native_batch_norm_backward, max_pool2d_with_indices and
  its backward, torch.add, _log_softmax + nll_loss + nll_loss_backward + _log_softmax_backward_data (the
  four ops F.cross_entropy + backward run), native_layer_norm and its backward, native_group_norm and its
  backward, F.embedding and embedding_dense_backward.

Outputs are allocated by each call, as a user calls the ops: fasttrain's outputs passed as None, served by its
caching allocator; torch's plain calls, with glibc's malloc made to keep freed memory (keep_freed_memory:
what jemalloc or tcmalloc, which PyTorch's CPU tuning guide recommends, also give). Without that (flag
--torch-default-malloc) every torch output over 32 MiB is a fresh mapping that page-faults in on each call,
10-20 ms per 64 MiB output here, which would be counted against torch. "reference_faults_per_call" (minor page
faults per torch call, median) shows which torch figures include such faults.

With --device cuda (cudabench.py has the options and the timing) the same ops run on the CUDA device, and
torch's on the same device beside them, at batch 256 with or without --quick (the device needs training-size
problems; --quick takes 3 rounds instead of 7). Each sample times enough calls between two device
synchronisations to last about 2 ms (10 ms without --quick); the figures are medians over the rounds. The
limits are the device's, measured once before the ops: "device_copy" (GB/s of a large device-to-device copy,
2 x its size moved) for the GB/s ops and "fp32_fma_peak" (an FMA kernel built with nvcc) for the GFLOP/s ones.
No contention figures and no page-fault counts there (the host only queues the work).

    python benchmarks/bench_ops.py            # batch 256: about 30 s on a quiet 2-core machine, 70 s under load
    python benchmarks/bench_ops.py --quick    # batch 32 and fewer repetitions: a smoke run
    python benchmarks/bench_ops.py --device cuda [--quick] [--tf32]
"""
import argparse
import ctypes
import gc
import json
import os
import re
import resource
import statistics
import subprocess
import tempfile
import time

import numpy as np

import fasttrain as ft
import cudabench

try:
    import torch
    import torch.nn.functional as F
except Exception:  # not installed, or a broken install: run without the reference
    torch = None

THREADS = 2
QUIET = 0.25  # a round is quiet when other processes took less than this many cores meanwhile

LIMITS_C = r"""
#include <immintrin.h>
#include <stdint.h>
#include <omp.h>
#include <time.h>

#ifdef __AVX512F__
typedef __m512 vec;
#define LANES 16
#define SET1 _mm512_set1_ps
#define FMA _mm512_fmadd_ps
#define ADD _mm512_add_ps
#define LOAD _mm512_loadu_ps
#define STORE _mm512_storeu_ps
#else
typedef __m256 vec;
#define LANES 8
#define SET1 _mm256_set1_ps
#define FMA _mm256_fmadd_ps
#define ADD _mm256_add_ps
#define LOAD _mm256_loadu_ps
#define STORE _mm256_storeu_ps
#endif

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }

int lanes(void) { return LANES; }

/* 16 independent FMA chains (distinct starting values, so that the compiler cannot merge them): enough to
 * cover the FMA latency times the number of FMA pipes. */
static float fma_loop(int64_t iters) {
    vec a = SET1(0.999999f), b = SET1(1e-6f);
    vec r0 = SET1(0), r1 = SET1(1), r2 = SET1(2), r3 = SET1(3), r4 = SET1(4), r5 = SET1(5), r6 = SET1(6),
        r7 = SET1(7), r8 = SET1(8), r9 = SET1(9), r10 = SET1(10), r11 = SET1(11), r12 = SET1(12),
        r13 = SET1(13), r14 = SET1(14), r15 = SET1(15);
    for (int64_t i = 0; i < iters; i++) {
#define S(r) r = FMA(r, a, b);
        S(r0) S(r1) S(r2) S(r3) S(r4) S(r5) S(r6) S(r7) S(r8) S(r9) S(r10) S(r11) S(r12) S(r13) S(r14) S(r15)
    }
    vec s = ADD(ADD(ADD(ADD(r0, r1), ADD(r2, r3)), ADD(ADD(r4, r5), ADD(r6, r7))),
                ADD(ADD(ADD(r8, r9), ADD(r10, r11)), ADD(ADD(r12, r13), ADD(r14, r15))));
    float out[LANES], sum = 0;
    STORE(out, s);
    for (int i = 0; i < LANES; i++) sum += out[i];
    return sum;
}

/* Seconds for every thread to run `iters` iterations (one copy per thread, started together). */
double fma_seconds(int64_t iters, int threads, float *sink) {
    double t0 = 0, t1 = 0;
    #pragma omp parallel num_threads(threads)
    {
        #pragma omp barrier
        #pragma omp master
        t0 = now();
        sink[omp_get_thread_num()] = fma_loop(iters);
        #pragma omp barrier
        #pragma omp master
        t1 = now();
    }
    return t1 - t0;
}

/* The arrays first touched by the threads that use them (static schedule, as the triad). */
void triad_init(float *a, float *b, float *c, int64_t n, int threads) {
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t i = 0; i < n; i++) { a[i] = 0.0f; b[i] = 1.0f; c[i] = 2.0f; }
}

/* Seconds of one triad a = b + 3 c (n a multiple of LANES * threads). */
double triad_seconds(float *a, const float *b, const float *c, int64_t n, int threads) {
    vec s = SET1(3.0f);
    double t = now();
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t i = 0; i < n; i += LANES) STORE(a + i, FMA(s, LOAD(c + i), LOAD(b + i)));
    return now() - t;
}
"""


class Limits:
    """The FMA peak and the STREAM triad, from LIMITS_C compiled with the system gcc."""

    def __init__(self, threads, fma_iters, triad_elems):
        avx512 = "avx512f" in open("/proc/cpuinfo").read().split()
        flags = ["-mavx512f"] if avx512 else ["-mfma", "-mavx2"]
        with tempfile.TemporaryDirectory() as tmp:  # the loaded library outlives its file
            src, lib = os.path.join(tmp, "limits.c"), os.path.join(tmp, "limits.so")
            with open(src, "w") as f:
                f.write(LIMITS_C)
            subprocess.check_call(["gcc", "-O2", *flags, "-fopenmp", "-shared", "-fPIC", src, "-o", lib])
            self.lib = ctypes.CDLL(lib)  # ctypes releases the GIL around each call
        self.isa = "avx512" if avx512 else "avx2"
        self.lib.fma_seconds.restype = ctypes.c_double
        self.lib.fma_seconds.argtypes = [ctypes.c_int64, ctypes.c_int, ctypes.c_void_p]
        self.lib.triad_seconds.restype = ctypes.c_double
        self.lib.triad_seconds.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64, ctypes.c_int]
        self.lib.triad_init.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64, ctypes.c_int]
        self.threads, self.fma_iters = threads, fma_iters
        self.lanes = self.lib.lanes()
        step = self.lanes * threads
        self.n = triad_elems // step * step
        self.arrays = [ft.empty(self.n) for _ in range(3)]  # memory like the ops' (huge-page backed)
        self.lib.triad_init(*(a.data_ptr() for a in self.arrays), self.n, threads)
        self.sink = (ctypes.c_float * 64)()

    def fma_sample(self):
        """GFLOP/s of one run of the FMA loop on every thread (after a short one that wakes them up)."""
        flops = 2.0 * self.lanes * 16 * self.fma_iters * self.threads
        self.lib.fma_seconds(self.fma_iters // 4, self.threads, self.sink)
        return flops / self.lib.fma_seconds(self.fma_iters, self.threads, self.sink) / 1e9

    def triad_sample(self, reps=3):
        """GB/s of the best of `reps` triads (after an untimed one)."""
        a, b, c = (x.data_ptr() for x in self.arrays)
        self.lib.triad_seconds(a, b, c, self.n, self.threads)
        return 12.0 * self.n / min(self.lib.triad_seconds(a, b, c, self.n, self.threads) for _ in range(reps)) / 1e9


class CpuMeter:
    """CPU time that other processes (and the hypervisor: steal) took on this machine while it ran, in cores:
    all busy time in /proc/stat minus this process's own."""

    def __init__(self):
        self.tick = os.sysconf("SC_CLK_TCK")

    @staticmethod
    def _busy():
        try:
            with open("/proc/stat") as f:
                v = [int(x) for x in f.readline().split()[1:9]]
        except (OSError, ValueError):  # not Linux: no contention figure
            return None
        return v[0] + v[1] + v[2] + v[5] + v[6] + v[7]  # user nice system irq softirq steal

    def start(self):
        t = os.times()
        self.t0, self.busy0, self.own0 = time.perf_counter(), self._busy(), t.user + t.system

    def others(self):
        t = os.times()
        busy, wall = self._busy(), time.perf_counter() - self.t0
        if busy is None or self.busy0 is None or wall <= 0:
            return 0.0
        return max(0.0, ((busy - self.busy0) / self.tick - (t.user + t.system - self.own0)) / wall)


def keep_freed_memory():
    """glibc malloc as a caching allocator: large blocks from the heap (M_MMAP_MAX = 0), freed memory kept
    (M_TRIM_THRESHOLD = 2^31 - 1). Without it every torch output over 32 MiB is a fresh mmap whose pages fault
    in on first write (16384 faults, 10-20 ms for a 64 MiB output here), on each call. fasttrain's own
    allocator caches large blocks itself (mmap'd directly, not affected by this)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-4, 0)
        libc.mallopt(-1, 2**31 - 1)
    except (OSError, AttributeError):  # not glibc
        pass


def sample(fn, inner):
    """(seconds, minor page faults) per call over `inner` back-to-back calls (one untimed call first when
    inner > 1: the small, in-cache problems are timed warm)."""
    if inner > 1:
        fn()
    f = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t = time.perf_counter()
    for _ in range(inner):
        fn()
    t = time.perf_counter() - t
    return t / inner, (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f) / inner


def emit(name, value, unit, **extra):
    line = {"name": name, "value": round(value, 4), "unit": unit}
    line.update({k: (round(v, 4) if isinstance(v, float) else v) for k, v in extra.items() if v is not None})
    print(json.dumps(line), flush=True)


# ---------------------------------------------------------------- tensors

RNG = np.random.default_rng(0)


def randn(*shape):
    return RNG.standard_normal(shape, dtype=np.float32)


def ft_nhwc(a, dev="cpu"):
    """An (N, C, H, W) fasttrain tensor on dev stored channels-last, holding a's values."""
    return ft.from_numpy(np.ascontiguousarray(a.transpose(0, 2, 3, 1))).to(dev).permute(0, 3, 1, 2)


def ft_plain(a, dev="cpu"):
    return ft.from_numpy(np.ascontiguousarray(a)).to(dev)


def th(a, channels_last=False, dev="cpu"):
    t = torch.from_numpy(np.array(a, copy=True)).to(dev)
    return t.contiguous(memory_format=torch.channels_last) if channels_last else t


# ---------------------------------------------------------------- cases


class Case:
    """One line of output: `amount` flops or bytes per call of `ours`; `theirs` the same op in torch (None
    without torch); `inner` calls per sample on the CPU (on a device, calls_by_key: picked per function)."""

    def __init__(self, name, unit, amount, ours, theirs=None, inner=1):
        self.name, self.unit, self.amount, self.inner = name, unit, float(amount), inner
        self.fns = {"ours": ours, "theirs": theirs}
        self.calls_by_key = {}


def conv_cases(N, C, H, channels_last, kinds, dev="cpu", dtype="float32"):
    K = C
    x, w, dy = randn(N, C, H, H), randn(K, C, 3, 3) * (1 / (9 * C)) ** 0.5, randn(N, K, H, H)
    to_ft = ft_nhwc if channels_last else ft_plain
    fx, fdy, fw = (t.to(dtype) for t in (to_ft(x, dev), to_ft(dy, dev), ft_plain(w, dev)))
    flops = 2.0 * N * K * C * 9 * H * H
    ours = {
        "fwd": lambda: ft.ops.conv2d_forward(None, fx, fw, None, 1, 1),
        "bwd_data": lambda: ft.ops.conv2d_backward(None, False, False, fdy, fx, fw, 1, 1),
        "bwd_weights": lambda: ft.ops.conv2d_backward(False, None, False, fdy, fx, fw, 1, 1),
    }
    theirs = {}
    if torch is not None:
        tx, tw, tdy = (th(a, channels_last, dev).to(getattr(torch, dtype)) for a in (x, w, dy))

        def tbwd(mask):
            return lambda: torch.ops.aten.convolution_backward(tdy, tx, tw, None, [1, 1], [1, 1], [1, 1], False,
                                                              [0, 0], 1, mask)
        theirs = {"fwd": lambda: F.conv2d(tx, tw, None, 1, 1), "bwd_data": tbwd([True, False, False]),
                  "bwd_weights": tbwd([False, True, False])}
    layout = "nhwc" if channels_last else "nchw"
    low = "_bf16" if dtype == "bfloat16" else ""
    return [Case(f"conv3x3_{layout}_n{N}_c{C}_h{H}{low}_{k}", "GFLOP/s", flops, ours[k], theirs.get(k)) for k in kinds]


def linear_cases(N, I, O, dev="cpu"):
    x, w, b, dy = randn(N, I), randn(O, I) * (1 / I) ** 0.5, randn(O), randn(N, O)
    fx, fw, fb, fdy = ft_plain(x, dev), ft_plain(w, dev), ft_plain(b, dev), ft_plain(dy, dev)
    flops = 2.0 * N * I * O
    inner = max(1, int(2e9 // flops))  # small problems: several calls per sample
    ours_f = lambda: ft.ops.linear_forward(None, fx, fw, fb)
    ours_b = lambda: ft.ops.linear_backward(None, None, None, fdy, fx, fw)
    theirs_f = theirs_b = None
    if torch is not None:
        tx, tw, tb, tdy = th(x, dev=dev), th(w, dev=dev), th(b, dev=dev), th(dy, dev=dev)
        theirs_f = lambda: F.linear(tx, tw, tb)
        theirs_b = lambda: (torch.mm(tdy, tw), torch.mm(tdy.t(), tx), tdy.sum(0))
    name = f"linear_n{N}_{I}x{O}"
    return [Case(f"{name}_fwd", "GFLOP/s", flops, ours_f, theirs_f, inner),
            Case(f"{name}_bwd", "GFLOP/s", 2 * flops, ours_b, theirs_b, inner)]


def attention_cases(N, H, T, D, dev="cpu", dtype="float32"):
    q, k, v, dy = randn(N, H, T, D), randn(N, H, T, D), randn(N, H, T, D), randn(N, H, T, D)
    fq, fk, fv, fdy = (ft_plain(a, dev).to(dtype) for a in (q, k, v, dy))
    sdpa = None
    if torch is not None:
        tq, tk, tv = (th(a, dev=dev).to(getattr(torch, dtype)).requires_grad_() for a in (q, k, v))
        tdy = th(dy, dev=dev).to(getattr(torch, dtype))
        if hasattr(F, "scaled_dot_product_attention"):
            sdpa = lambda causal, p: F.scaled_dot_product_attention(tq, tk, tv, dropout_p=p, is_causal=causal)
        else:
            sdpa = lambda causal, p: F._scaled_dot_product_attention(tq, tk, tv, None, p, False, causal)[0]

        def sdpa_no_grad(causal, p):
            with torch.no_grad():
                return sdpa(causal, p)
    cases = []
    for causal, p in ((False, 0.0), (True, 0.0), (False, 0.1)):
        scores = N * H * (T * (T + 1) // 2 if causal else T * T)
        flops = 4.0 * scores * D
        kw = dict(causal=causal, dropout_p=p, seed=1, offset=0)

        def fwd(kw=kw):
            return ft.ops.sdpa_forward(None, None, fq, fk, fv, **kw)

        def fwd_bwd(kw=kw):
            out, lse = ft.ops.sdpa_forward(None, None, fq, fk, fv, **kw)
            return ft.ops.sdpa_backward(None, None, None, fdy, fq, fk, fv, out, lse, **kw)
        theirs_f = theirs_fb = None
        if sdpa is not None:
            theirs_f = lambda causal=causal, p=p: sdpa_no_grad(causal, p)
            theirs_fb = lambda causal=causal, p=p: torch.autograd.grad(sdpa(causal, p), (tq, tk, tv), tdy)
        name = f"sdpa_n{N}_h{H}_t{T}_d{D}{'_causal' if causal else ''}{'_dropout' if p else ''}" \
               f"{'_bf16' if dtype == 'bfloat16' else ''}"
        inner = max(1, int(2e9 // flops))
        cases += [Case(f"{name}_fwd", "GFLOP/s", flops, fwd, theirs_f, inner),
                  Case(f"{name}_fwd_bwd", "GFLOP/s", 3.5 * flops, fwd_bwd, theirs_fb, inner)]
    return cases


def memory_cases(N, C, H, rows, D, classes, dev="cpu"):
    n = N * C * H * H
    shape = f"{N}x{C}x{H}x{H}"
    x, dy, other = randn(N, C, H, H), randn(N, C, H, H), randn(N, C, H, H)
    fx, fdy, fother = ft_nhwc(x, dev), ft_nhwc(dy, dev), ft_nhwc(other, dev)
    wn, bn = RNG.random(C, dtype=np.float32) + 0.5, randn(C)
    w, b = ft_plain(wn, dev), ft_plain(bn, dev)
    rm, rv = ft.zeros(C, device=dev), ft.ones(C, device=dev)
    fy = ft.ops.activation_forward(None, fx, "relu")
    _, fmean, finvstd = ft.ops.batch_norm_forward(None, None, None, fx, w, b, None, None, training=True)
    pdyn = randn(N, C, H // 2, H // 2)
    pdy = ft_nhwc(pdyn, dev)
    _, find = ft.ops.max_pool2d_forward(None, None, fx, 2)
    logits = [(r, k, randn(r, k), RNG.integers(0, k, r)) for r, k in classes]
    lx, ldy = randn(rows, D), randn(rows, D)
    flx, fldy = ft_plain(lx, dev), ft_plain(ldy, dev)
    lwn, lbn = RNG.random(D, dtype=np.float32) + 0.5, randn(D)
    lw, lb = ft_plain(lwn, dev), ft_plain(lbn, dev)
    _, lmean, lrstd = ft.ops.layer_norm_forward(None, None, None, flx, lw, lb, (D,))

    ours = {  # name: (bytes, fn)
        f"relu_nhwc_{shape}_fwd": (8 * n, lambda: ft.ops.activation_forward(None, fx, "relu")),
        f"relu_nhwc_{shape}_bwd": (12 * n, lambda: ft.ops.activation_backward(None, fdy, None, fy, "relu")),
        f"batch_norm_nhwc_{shape}_fwd": (
            8 * n, lambda: ft.ops.batch_norm_forward(None, None, None, fx, w, b, rm, rv, training=True)),
        f"batch_norm_nhwc_{shape}_bwd": (
            12 * n, lambda: ft.ops.batch_norm_backward(None, None, None, fdy, fx, None, w, None, fmean, finvstd)),
        f"max_pool2d_2x2_nhwc_{shape}_fwd": (7 * n, lambda: ft.ops.max_pool2d_forward(None, None, fx, 2)),
        f"max_pool2d_2x2_nhwc_{shape}_bwd": (
            7 * n, lambda: ft.ops.max_pool2d_backward(None, pdy, find, input_size=(H, H))),
        f"add_nhwc_{shape}": (12 * n, lambda: ft.ops.add_forward(None, fx, fother)),
    }
    for r, k, lg, tg in logits:
        flg, ftg = ft_plain(lg, dev), ft_plain(tg.astype(np.int64), dev)
        ours[f"cross_entropy_fused_{r}x{k}"] = (
            8 * r * k + 8 * r, lambda flg=flg, ftg=ftg: ft.ops.cross_entropy_forward(None, None, flg, ftg))
    ours[f"layer_norm_{rows}x{D}_fwd"] = (
        8 * rows * D, lambda: ft.ops.layer_norm_forward(None, None, None, flx, lw, lb, (D,)))
    ours[f"layer_norm_{rows}x{D}_bwd"] = (
        12 * rows * D, lambda: ft.ops.layer_norm_backward(None, None, None, fldy, flx, lw, lmean, lrstd, (D,)))

    theirs = {}
    if torch is not None:
        aten = torch.ops.aten
        tx, tdy, tother = th(x, True, dev), th(dy, True, dev), th(other, True, dev)
        tw, tb = th(wn, dev=dev), th(bn, dev=dev)
        trm, trv = torch.zeros(C, device=dev), torch.ones(C, device=dev)
        ty = torch.relu(tx)
        _, tmean, tinvstd = aten.native_batch_norm(tx, tw, tb, trm.clone(), trv.clone(), True, 0.1, 1e-5)
        tpdy = th(pdyn, True, dev)
        _, tind = aten.max_pool2d_with_indices(tx, [2, 2], [2, 2])
        tlx, tldy, tlw, tlb = th(lx, dev=dev), th(ldy, dev=dev), th(lwn, dev=dev), th(lbn, dev=dev)
        _, tlmean, tlrstd = aten.native_layer_norm(tlx, [D], tlw, tlb, 1e-5)
        theirs = {
            f"relu_nhwc_{shape}_fwd": lambda: torch.relu(tx),
            f"relu_nhwc_{shape}_bwd": lambda: aten.threshold_backward(tdy, ty, 0),
            f"batch_norm_nhwc_{shape}_fwd": lambda: F.batch_norm(tx, trm, trv, tw, tb, training=True),
            f"batch_norm_nhwc_{shape}_bwd": lambda: aten.native_batch_norm_backward(
                tdy, tx, tw, trm, trv, tmean, tinvstd, True, 1e-5, [True, True, True]),
            f"max_pool2d_2x2_nhwc_{shape}_fwd": lambda: aten.max_pool2d_with_indices(tx, [2, 2], [2, 2]),
            f"max_pool2d_2x2_nhwc_{shape}_bwd": lambda: aten.max_pool2d_with_indices_backward(
                tpdy, tx, [2, 2], [2, 2], [0, 0], [1, 1], False, tind),
            f"add_nhwc_{shape}": lambda: torch.add(tx, tother),
            f"layer_norm_{rows}x{D}_fwd": lambda: aten.native_layer_norm(tlx, [D], tlw, tlb, 1e-5),
            f"layer_norm_{rows}x{D}_bwd": lambda: aten.native_layer_norm_backward(
                tldy, tlx, [D], tlmean, tlrstd, tlw, tlb, [True, True, True]),
        }
        for r, k, lg, tg in logits:
            tlg, ttg, one = th(lg, dev=dev), th(tg.astype(np.int64), dev=dev), torch.ones((), device=dev)

            def ce(tlg=tlg, ttg=ttg, one=one):  # what F.cross_entropy and its backward run, op by op
                ls = aten._log_softmax(tlg, 1, False)
                loss, total = aten.nll_loss_forward(ls, ttg, None, 1, -100)
                dls = aten.nll_loss_backward(one, ls, ttg, None, 1, -100, total)
                return loss, aten._log_softmax_backward_data(dls, ls, 1, torch.float32)
            theirs[f"cross_entropy_fused_{r}x{k}"] = ce

    # group norm over the (N, C, H, H) input in NCHW, 8 groups
    gx, gdy = ft_plain(x, dev), ft_plain(dy, dev)
    _, gmean, grstd = ft.ops.group_norm_forward(None, None, None, gx, w, b, 8)
    ours[f"group_norm_g8_{shape}_fwd"] = (8 * n, lambda: ft.ops.group_norm_forward(None, None, None, gx, w, b, 8))
    ours[f"group_norm_g8_{shape}_bwd"] = (
        12 * n, lambda: ft.ops.group_norm_backward(None, None, None, gdy, gx, gmean, grstd, w, 8))
    # embedding: GPT-2's vocabulary, (ids_n, 128) ids
    V, E, ids_n, ids_t = 50257, 256, N, 128
    table, eids, edy = randn(V, E), RNG.integers(0, V, (ids_n, ids_t)), randn(ids_n, ids_t, E)
    ftable, fids, fedy = ft_plain(table, dev), ft_plain(eids.astype(np.int64), dev), ft_plain(edy, dev)
    T = ids_n * ids_t
    ours[f"embedding_{V}x{E}_ids{ids_n}x{ids_t}_fwd"] = (
        8 * T + 8 * T * E, lambda: ft.ops.embedding_forward(None, fids, ftable))
    ours[f"embedding_{V}x{E}_ids{ids_n}x{ids_t}_bwd"] = (
        4 * T * E + 8 * T + 4 * V * E, lambda: ft.ops.embedding_backward(None, fedy, fids, V))

    if torch is not None:
        tgx, tgdy = th(x, dev=dev), th(dy, dev=dev)
        _, tgmean, tgrstd = aten.native_group_norm(tgx, tw, tb, N, C, H * H, 8, 1e-5)
        ttable, tids, tedy = th(table, dev=dev), th(eids.astype(np.int64), dev=dev), th(edy, dev=dev)
        theirs.update({
            f"group_norm_g8_{shape}_fwd": lambda: aten.native_group_norm(tgx, tw, tb, N, C, H * H, 8, 1e-5),
            f"group_norm_g8_{shape}_bwd": lambda: aten.native_group_norm_backward(
                tgdy, tgx, tgmean, tgrstd, tw, N, C, H * H, 8, [True, True, True]),
            f"embedding_{V}x{E}_ids{ids_n}x{ids_t}_fwd": lambda: F.embedding(tids, ttable),
            f"embedding_{V}x{E}_ids{ids_n}x{ids_t}_bwd": lambda: aten.embedding_dense_backward(
                tedy, tids, V, -1, False),
        })

    # in-cache problems: several calls per sample
    return [Case(name, "GB/s", nbytes, fn, theirs.get(name), max(1, int(64e6 // nbytes)))
            for name, (nbytes, fn) in ours.items()]


def batch_norm_nchw_cases(N, C, H, dev="cpu"):
    """Batch norm (training) over NCHW planes of H x H: what eager code on NumPy-ordered tensors runs."""
    n, shape = N * C * H * H, f"{N}x{C}x{H}x{H}"
    x, dy, wn, bn = randn(N, C, H, H), randn(N, C, H, H), RNG.random(C, dtype=np.float32) + 0.5, randn(C)
    fx, fdy, w, b = ft_plain(x, dev), ft_plain(dy, dev), ft_plain(wn, dev), ft_plain(bn, dev)
    _, fmean, finvstd = ft.ops.batch_norm_forward(None, None, None, fx, w, b, None, None, training=True)
    ours = {
        f"batch_norm_nchw_{shape}_fwd": (8 * n, lambda: ft.ops.batch_norm_forward(None, None, None, fx, w, b)),
        f"batch_norm_nchw_{shape}_bwd": (
            12 * n, lambda: ft.ops.batch_norm_backward(None, None, None, fdy, fx, None, w, None, fmean, finvstd)),
    }
    theirs = {}
    if torch is not None:
        aten = torch.ops.aten
        tx, tdy, tw, tb = th(x, dev=dev), th(dy, dev=dev), th(wn, dev=dev), th(bn, dev=dev)
        _, tmean, tinvstd = aten.native_batch_norm(tx, tw, tb, None, None, True, 0.1, 1e-5)
        theirs = {
            f"batch_norm_nchw_{shape}_fwd": lambda: aten.native_batch_norm(tx, tw, tb, None, None, True, 0.1, 1e-5),
            f"batch_norm_nchw_{shape}_bwd": lambda: aten.native_batch_norm_backward(
                tdy, tx, tw, None, None, tmean, tinvstd, True, 1e-5, [True, True, True]),
        }
    return [Case(name, "GB/s", nbytes, fn, theirs.get(name), max(1, int(64e6 // nbytes)))
            for name, (nbytes, fn) in ours.items()]


# ---------------------------------------------------------------- main


def all_cases(N, dev="cpu"):
    cases = []
    for C, H in [(32, 32), (64, 32), (128, 16), (256, 16)]:
        cases += conv_cases(N, C, H, True, ("fwd", "bwd_data", "bwd_weights"), dev)
    cases += conv_cases(N, 64, 32, False, ("fwd",), dev)
    for width in (512, 1024, 4096):
        cases += linear_cases(N, width, width, dev)
    cases += attention_cases(8, 4, 256, 64, dev)
    if dev == "cpu" and ft.backends.cpu_has_bf16():  # the CUDA kernels are float32 only
        cases += attention_cases(8, 4, 256, 64, dev, "bfloat16")
        for C, H in [(32, 14), (64, 7), (128, 4)]:  # small planes: the weight gradient by matmuls from 64 positions
            cases += conv_cases(N, C, H, True, ("fwd", "bwd_data", "bwd_weights"), dev, "bfloat16")
    cases += memory_cases(N, 64, 32, rows=N * 64, D=1024, classes=[(N, 1000), (N, 32768)], dev=dev)
    for C, H in [(64, 32), (64, 7)]:
        cases += batch_norm_nchw_cases(N, C, H, dev)
    return cases


def run_cpu(args):
    if torch is not None and not args.torch_default_malloc:
        keep_freed_memory()
    q = args.quick
    N = 32 if q else 256
    rounds = 3 if q else 7
    limits = Limits(THREADS, fma_iters=2_000_000 if q else 10_000_000, triad_elems=(8 if q else 32) << 20)

    ft.set_num_threads(THREADS)
    if torch is not None:
        torch.set_num_threads(THREADS)
    start = time.perf_counter()
    emit("threads", THREADS, "threads")
    emit("loadavg_1min_start", os.getloadavg()[0], "load")
    if torch is not None:
        print(json.dumps({"name": "torch_version", "value": torch.__version__, "unit": "version"}), flush=True)

    cases = [c for c in all_cases(N) if re.search(args.only, c.name)]

    gc.disable()
    for case in cases:  # warm-up: oneDNN primitives built, caches and pools filled
        for fn in case.fns.values():
            if fn is not None:
                fn()
                fn()
    # Rounds over every case and the two limits, fasttrain and torch back to back within a case: a load that
    # comes and goes hits all the figures alike. Each round also records how much CPU other processes took
    # meanwhile; the figures are medians over the quiet rounds (others below QUIET cores) when there are at
    # least 3 of them, else over all rounds.
    meter = CpuMeter()
    rows = []  # per round: {"others", "fma", "triad", (case index, fn key): (seconds, faults)}
    for _ in range(rounds):
        meter.start()
        row = {"fma": limits.fma_sample(), "triad": limits.triad_sample()}
        for i, case in enumerate(cases):
            for key, fn in case.fns.items():
                if fn is not None:
                    row[i, key] = sample(fn, case.inner)
        row["others"] = meter.others()
        rows.append(row)
    gc.enable()

    quiet = [r for r in rows if r["others"] < QUIET]
    used = quiet if len(quiet) >= 3 else rows
    emit("contention", statistics.mean(r["others"] for r in rows), "cores", rounds=len(rows),
         quiet_rounds=len(quiet), used_rounds=len(used), rounds_others_cores=[round(r["others"], 2) for r in rows])
    fma = statistics.median(r["fma"] for r in used)
    triad = statistics.median(r["triad"] for r in used)
    emit(f"fma_peak_{limits.isa}", fma, "GFLOP/s", best=max(r["fma"] for r in rows))
    emit("stream_triad", triad, "GB/s", best=max(r["triad"] for r in rows))
    for i, case in enumerate(cases):
        def rate(key):
            return case.amount / statistics.median(r[i, key][0] for r in used) / 1e9

        value = rate("ours")
        extra = {"ms": case.amount / value / 1e6,
                 "peak_fraction": value / (fma if case.unit == "GFLOP/s" else triad)}
        if case.fns["theirs"] is not None:
            ref = rate("theirs")
            extra.update(reference=ref, ratio=value / ref,
                         reference_faults_per_call=round(statistics.median(r[i, "theirs"][1] for r in used)))
        emit(case.name, value, case.unit, **extra)
    emit("loadavg_1min_end", os.getloadavg()[0], "load")
    emit("total_seconds", time.perf_counter() - start, "s")


def run_cuda(args, torch_cuda):
    """The same cases on the CUDA device (torch's on it too when torch_cuda), timed between synchronisations."""
    rounds = 3 if args.quick else 7
    target = 0.002 if args.quick else 0.01
    start = time.perf_counter()
    limits = cudabench.DeviceLimits(torch_cuda)
    limits.emit()
    cases = [c for c in all_cases(256, "cuda") if re.search(args.only, c.name)]
    syncs = {"ours": cudabench.ft_sync, "theirs": cudabench.torch_sync}
    for case in cases:
        if not torch_cuda:
            case.fns["theirs"] = None
        for key, fn in case.fns.items():
            if fn is not None:  # warm-up: cuDNN/cuBLAS plans, allocator caches; then the calls per sample
                fn()
                fn()
                case.calls_by_key[key] = cudabench.calls_for(fn, syncs[key], target)
    # Rounds over every case, fasttrain and torch back to back within a case, as on the CPU.
    gc.disable()
    rows = []  # per round: {(case index, fn key): seconds per call}
    for _ in range(rounds):
        row = {}
        for i, case in enumerate(cases):
            for key, fn in case.fns.items():
                if fn is not None:
                    row[i, key] = cudabench.per_call(fn, syncs[key], case.calls_by_key[key])
        rows.append(row)
    gc.enable()
    for i, case in enumerate(cases):
        def rate(key):
            return case.amount / statistics.median(r[i, key] for r in rows) / 1e9

        value = rate("ours")
        limit = limits.fma if case.unit == "GFLOP/s" else limits.copy
        extra = {"ms": case.amount / value / 1e6, "peak_fraction": value / limit if limit else None}
        if case.fns["theirs"] is not None:
            ref = rate("theirs")
            extra.update(reference=ref, ratio=value / ref)
        emit(case.name, value, case.unit, **extra)
    emit("total_seconds", time.perf_counter() - start, "s")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="batch 32, fewer repetitions: a smoke run (with "
                                                             "--device cuda: batch 256, fewer rounds)")
    parser.add_argument("--torch-default-malloc", action="store_true",
                        help="leave glibc's malloc as it is: torch then maps (and page-faults) every output over "
                             "32 MiB afresh on each call")
    parser.add_argument("--only", default="", metavar="REGEX", help="run the cases whose name matches REGEX")
    cudabench.add_arguments(parser)
    args = parser.parse_args()
    torch_cuda = cudabench.setup(args, parser, torch)
    if args.device == "cuda":
        run_cuda(args, torch_cuda)
    else:
        run_cpu(args)


if __name__ == "__main__":
    main()
