"""Builds fasttrain._C from csrc/, when nvcc is found the CUDA backend
libfasttrain_cuda.so from cuda/, and when mpicc is found the MPI backend
libfasttrain_mpi.so from dist/ (both loaded at run time, so that a machine
without CUDA or MPI still imports fasttrain).

Environment:
  FASTTRAIN_CUDA=0|1    force the CUDA backend off / on (default: on when nvcc is found)
  FASTTRAIN_MPI=0       build without the MPI backend (default: built when mpicc is found)
  FASTTRAIN_NATIVE=1    compile the C core with -march=native
  FASTTRAIN_SANITIZE=1  compile and link with AddressSanitizer and UBSan
  CUDNN_HOME, NCCL_HOME where cuDNN's / NCCL's include/ and lib/ are, when not beside the CUDA toolkit
                        (default: found there, in /usr or in NVIDIA's pip packages)
"""
import glob
import os
import sysconfig
from concurrent.futures import ThreadPoolExecutor
import shutil
import subprocess
import sys

import numpy
from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))
# Turing (7.5, the oldest CUDA 13 builds for: float32 and float16; bf16-mixed runs 32-true there), Ampere,
# Hopper, and PTX for what comes after.
CUDA_ARCHS = ["-gencode", "arch=compute_75,code=sm_75", "-gencode", "arch=compute_80,code=sm_80",
              "-gencode", "arch=compute_90,code=sm_90", "-gencode", "arch=compute_90,code=compute_90"]


def cuda_toolchain():
    """(nvcc, [(include dir, lib dir, -l name) of cuDNN and of NCCL]), or (None, None) to build without the
    CUDA backend."""
    flag = os.environ.get("FASTTRAIN_CUDA")
    if flag == "0":
        return None, None
    nvcc = shutil.which("nvcc") or (os.path.exists("/usr/local/cuda/bin/nvcc") and "/usr/local/cuda/bin/nvcc")
    if not nvcc:
        if flag == "1":
            sys.exit("FASTTRAIN_CUDA=1 but nvcc was not found on PATH")
        return None, None
    cuda_home = os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))
    libraries = []
    for name, header, version, env in (("cudnn", "cudnn.h", 9, "CUDNN_HOME"), ("nccl", "nccl.h", 2, "NCCL_HOME")):
        found = find_library(cuda_home, name, header, version, env)
        if not found:
            message = (f"{name} {version} was not found beside the CUDA toolkit, in /usr, in {env} or in NVIDIA's "
                       "pip packages")
            if flag == "1":
                sys.exit(f"FASTTRAIN_CUDA=1 but {message}")
            print(f"warning: {message}: building without the CUDA backend", file=sys.stderr)
            return None, None
        libraries.append(found)
    return nvcc, libraries


def c_flags():
    # -fno-math-errno: without the errno branch, sqrtf and friends vectorise
    # (nothing reads errno after a math call).
    flags = ["-std=c11", "-D_GNU_SOURCE", "-O3", "-fno-math-errno", "-Wall", "-Wextra", "-Wno-unused-parameter",
             "-Wno-missing-field-initializers", "-fopenmp", "-fvisibility=hidden"]
    if os.environ.get("FASTTRAIN_NATIVE") == "1":
        flags.append("-march=native")
    if os.environ.get("FASTTRAIN_SANITIZE") == "1":
        flags += ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-g"]
    return flags


class BuildExt(build_ext):
    """Also builds the CUDA backend beside the extension when nvcc is present, and the MPI backend when mpicc
    is."""

    def run(self):
        super().run()
        if NVCC:
            self.build_cuda()
        if MPICC:
            self.build_mpi()

    def build_mpi(self):
        out = os.path.join(os.path.dirname(self.get_ext_fullpath("fasttrain._C")), "libfasttrain_mpi.so")
        sources = glob.glob(os.path.join(ROOT, "dist", "*.c"))
        deps = sources + [os.path.join(ROOT, "csrc", "core", "dist.h")]
        if not self.force and os.path.exists(out) and all(os.path.getmtime(d) <= os.path.getmtime(out)
                                                          for d in deps):
            return
        os.makedirs(os.path.dirname(out), exist_ok=True)
        cmd = [MPICC, "-O2", "-std=c11", "-Wall", "-Werror", "-fPIC", "-shared", "-fvisibility=hidden",
               "-I", os.path.join(ROOT, "csrc"), *sources, "-o", out, "-Wl,--no-undefined"]
        print(" ".join(cmd), flush=True)
        subprocess.check_call(cmd)

    def build_cuda(self):
        """Compiles each .cu file on its own (in parallel, only when it or a
        header changed), then links them with cuBLAS(Lt), cuDNN and NCCL."""
        ext_path = self.get_ext_fullpath("fasttrain._C")
        out = os.path.join(os.path.dirname(ext_path), "libfasttrain_cuda.so")
        objdir = os.path.join(self.build_temp, "cuda")
        os.makedirs(objdir, exist_ok=True)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        cuda_home = os.path.dirname(os.path.dirname(os.path.realpath(NVCC)))
        headers = glob.glob(os.path.join(ROOT, "cuda", "*.h")) + glob.glob(os.path.join(ROOT, "csrc", "*", "*.h"))
        newest_header = max(os.path.getmtime(h) for h in headers)

        def compile_one(src):
            obj = os.path.join(objdir, os.path.basename(src) + ".o")
            if (not self.force and os.path.exists(obj)
                    and os.path.getmtime(obj) >= max(os.path.getmtime(src), newest_header)):
                return obj
            # --fmad=false: the FT_HD math shared with the CPU loops never
            # contracts a * b + c implicitly there, so the kernels must not
            # either, or their results differ from the CPU's in the last bit.
            cmd = [NVCC, "-O3", "-std=c++17", "--expt-relaxed-constexpr", "--fmad=false", "-Xcompiler",
                   "-fPIC,-Wall,-fvisibility=hidden", *CUDA_ARCHS, "-I", os.path.join(ROOT, "csrc"),
                   *(f"-I{inc}" for inc, _, _ in CUDA_LIBRARIES), "-c", src, "-o", obj]
            print(" ".join(cmd), flush=True)
            subprocess.check_call(cmd)
            return obj

        sources = sorted(glob.glob(os.path.join(ROOT, "cuda", "*.cu")))
        with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
            objects = list(pool.map(compile_one, sources))
        if os.path.exists(out) and all(os.path.getmtime(o) <= os.path.getmtime(out) for o in objects):
            return
        libdir = os.path.join(cuda_home, "lib64")
        # --no-undefined: the library may call nothing of the core's but
        # through the host table, so a stray core symbol fails the build here
        # instead of the dlopen at import.
        cmd = [NVCC, "-shared", *CUDA_ARCHS, *objects, "-o", out, "-Xlinker=--no-undefined", "-L", libdir,
               f"-Xlinker=-rpath,{libdir}",
               *(flag for _, lib, _ in CUDA_LIBRARIES for flag in ("-L", lib, f"-Xlinker=-rpath,{lib}")),
               "-lcublasLt", "-lcublas", *(f"-l{name}" for _, _, name in CUDA_LIBRARIES), "-lcudart"]
        print(" ".join(cmd), flush=True)
        subprocess.check_call(cmd)


def find_library(cuda_home, name, header, version, env):
    """(include dir, lib dir, -l name) of lib<name> from the folder named by env, the CUDA toolkit, the system,
    or NVIDIA's pip packages (whose libraries have only a versioned name, in layouts that differ between
    CUDA releases); None when there is none."""
    site = {sysconfig.get_paths()["purelib"], *glob.glob("/usr/local/lib/python3*/*-packages"),
            "/usr/lib/python3/dist-packages"}
    pip_homes = sorted(os.path.dirname(os.path.dirname(h)) for base in site
                       for h in glob.glob(os.path.join(base, "nvidia", "**", "include", header), recursive=True))
    for home in filter(None, [os.environ.get(env), cuda_home, "/usr", *pip_homes]):
        if not os.path.exists(os.path.join(home, "include", header)):
            continue
        for lib in ("lib64", "lib", "lib/x86_64-linux-gnu"):
            libdir = os.path.join(home, lib)
            if os.path.exists(os.path.join(libdir, f"lib{name}.so")):
                return os.path.join(home, "include"), libdir, name
            if os.path.exists(os.path.join(libdir, f"lib{name}.so.{version}")):
                return os.path.join(home, "include"), libdir, f":lib{name}.so.{version}"
    return None


NVCC, CUDA_LIBRARIES = cuda_toolchain()
MPICC = os.environ.get("FASTTRAIN_MPI", "1") != "0" and shutil.which("mpicc")


# Every layer of csrc/ (bind last: it is the only one that sees Python).
LAYERS = ["core", "ops", "optim", "nn", "data", "bind"]
sources = sorted(f for layer in LAYERS for f in glob.glob(f"csrc/{layer}/*.c"))
link = ["-fopenmp", "-ldl", "-ldnnl", "-lturbojpeg", "-lpng", "-lm"]
if os.environ.get("FASTTRAIN_SANITIZE") == "1":
    link += ["-fsanitize=address,undefined"]

setup(
    package_dir={"": "python"},
    packages=find_packages("python"),
    # the extension's type stub and the PEP 561 marker that makes type checkers read it
    package_data={"fasttrain": ["_C.pyi", "py.typed"]},
    ext_modules=[
        Extension(
            "fasttrain._C",
            sources=sources,
            include_dirs=["csrc", numpy.get_include()],
            define_macros=[("FT_WITH_CUDA", "1" if NVCC else "0")],
            extra_compile_args=c_flags(),
            extra_link_args=link,
            depends=glob.glob("csrc/**/*.h", recursive=True),
        )
    ],
    cmdclass={"build_ext": BuildExt},
    # The plugin's name is its module's, so that a conftest's pytest_plugins naming the module finds it
    # registered (fasttrain/pytest_plugin.py).
    entry_points={"pytest11": ["fasttrain.pytest_plugin = fasttrain.pytest_plugin"]},
)
