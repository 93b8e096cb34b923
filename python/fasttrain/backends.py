"""ft.backends.benchmark: like torch.backends.cudnn.benchmark, on the CPU.

With benchmark on, the first call of each convolution shape times the
candidate implementations (the caller's memory layout or oneDNN's blocked
layout with reorders, each with the direct algorithm or the one oneDNN
picks, such as Winograd) and later calls use the fastest. Choices are
kept for the process and, with FASTTRAIN_CACHE_DIR set, in
$FASTTRAIN_CACHE_DIR/fasttrain-autotune.txt across runs. With it off (the
default) the caller's layout is used directly. As with cudnn.benchmark, the
choice follows timings, so two runs may round differently;
ft.use_deterministic_algorithms(True) turns the tuning off. On CUDA the
same switch lets cuDNN time its algorithms per convolution shape.

ft.backends.allow_tf32 (off by default): float32 convolutions and matmuls
on CUDA may run on TF32 tensor cores, as torch.backends.cuda.matmul.allow_tf32
and torch.backends.cudnn.allow_tf32 allow together.

ft.backends.cpu_capability(): the instruction sets fasttrain's kernels use that
this CPU has (as torch.backends.cpu.get_cpu_capability). ft.backends.cpu_has_bf16():
whether it multiplies bfloat16 in hardware (AVX512-BF16, unless ONEDNN_MAX_CPU_ISA
caps the instruction sets below it), which precision="bf16-mixed" programs run on."""
import functools
import sys
import types

from . import _C


@functools.cache
def _cpu_flags():
    """The instruction-set flags of /proc/cpuinfo (none where it cannot be read)."""
    try:
        with open("/proc/cpuinfo") as f:
            return frozenset(next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), []))
    except OSError:
        return frozenset()


def cpu_capability() -> tuple:
    """The instruction sets among avx2, avx512f, avx512_bf16 and amx_bf16 that the CPU has (/proc/cpuinfo)."""
    return tuple(f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in _cpu_flags())


def cpu_has_bf16() -> bool:
    """Whether bfloat16 products run on the AVX512-BF16 instructions: the CPU has them, and ONEDNN_MAX_CPU_ISA
    (or DNNL_MAX_CPU_ISA), oneDNN's cap on the instruction sets it uses, which fasttrain's own kernels follow
    too, does not exclude them (as ONEDNN_MAX_CPU_ISA=AVX512_CORE does)."""
    return _C.cpu_bf16()


class _Backends(types.ModuleType):
    @property
    def benchmark(self) -> bool:
        """Whether convolutions pick their implementation by timing (see the module's docstring)."""
        return _C.get_benchmark()

    @benchmark.setter
    def benchmark(self, value: bool) -> None:
        _C.set_benchmark(bool(value))

    @property
    def allow_tf32(self) -> bool:
        """Whether float32 convolutions and matmuls on CUDA may use TF32 tensor cores."""
        return _C.get_allow_tf32()

    @allow_tf32.setter
    def allow_tf32(self, value: bool) -> None:
        _C.set_allow_tf32(bool(value))


sys.modules[__name__].__class__ = _Backends
