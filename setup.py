"""Builds fasttrain._C from csrc/ and, when nvcc is found, the CUDA backend
libfasttrain_cuda.so from cuda/ (loaded at run time, so that a machine
without CUDA still imports fasttrain).

Environment:
  FASTTRAIN_CUDA=0|1    force the CUDA backend off / on (default: on when nvcc is found)
  FASTTRAIN_NATIVE=1    compile the C core with -march=native
  FASTTRAIN_SANITIZE=1  compile and link with AddressSanitizer and UBSan
"""
import glob
import os
import shutil
import subprocess
import sys

import numpy
from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))
CUDA_ARCHS = ["-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=sm_90",
              "-gencode", "arch=compute_90,code=compute_90"]


def nvcc_path():
    flag = os.environ.get("FASTTRAIN_CUDA")
    if flag == "0":
        return None
    nvcc = shutil.which("nvcc") or (os.path.exists("/usr/local/cuda/bin/nvcc") and "/usr/local/cuda/bin/nvcc")
    if flag == "1" and not nvcc:
        sys.exit("FASTTRAIN_CUDA=1 but nvcc was not found on PATH")
    return nvcc or None


NVCC = nvcc_path()


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
    """Also builds the CUDA backend beside the extension, when nvcc is present."""

    def run(self):
        super().run()
        if NVCC:
            self.build_cuda()

    def build_cuda(self):
        ext_path = self.get_ext_fullpath("fasttrain._C")
        out = os.path.join(os.path.dirname(ext_path), "libfasttrain_cuda.so")
        sources = sorted(glob.glob(os.path.join(ROOT, "cuda", "*.cu")))
        deps = sources + [h for d in ("cuda", "csrc/core", "csrc/kernels") for h in glob.glob(os.path.join(ROOT, d, "*.h"))]
        if os.path.exists(out) and not self.force and all(os.path.getmtime(d) <= os.path.getmtime(out) for d in deps):
            return
        cuda_home = os.path.dirname(os.path.dirname(os.path.realpath(NVCC)))
        libdir = os.path.join(cuda_home, "lib64")
        os.makedirs(os.path.dirname(out), exist_ok=True)
        cmd = [NVCC, "-O3", "-std=c++17", "-Xcompiler", "-fPIC,-Wall,-fvisibility=hidden", "-shared",
               *CUDA_ARCHS, "-I", os.path.join(ROOT, "csrc"), *sources, "-o", out,
               "-L", libdir, f"-Xlinker=-rpath,{libdir}", "-lcudart"]
        print(" ".join(cmd))
        subprocess.check_call(cmd)


# Every layer of csrc/ (bind last: it is the only one that sees Python).
LAYERS = ["core", "ops", "optim", "nn", "data", "bind"]
sources = sorted(f for layer in LAYERS for f in glob.glob(f"csrc/{layer}/*.c"))
link = ["-fopenmp", "-ldl", "-ldnnl", "-lturbojpeg", "-lm"]
if os.environ.get("FASTTRAIN_SANITIZE") == "1":
    link += ["-fsanitize=address,undefined"]

setup(
    package_dir={"": "python"},
    packages=find_packages("python"),
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
)
