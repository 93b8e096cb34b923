#!/usr/bin/env bash
# What a GPU machine runs (`make test-gpu`), in one command of a few minutes:
#
#   1. unpacks the Debian packages of the bundle (`make gpu-bundle` on a Debian
#      machine) into a local prefix: oneDNN and TurboJPEG, which the C core links;
#   2. builds fasttrain in place with that machine's python, against the prefix
#      (CPATH, LDFLAGS) and the CUDA toolkit and cuDNN found there;
#   3. runs every test marked `cuda`, then the CUDA op tests again under
#      compute-sanitizer's memcheck (slow, so only those), then each benchmark
#      that takes --device, with --device cuda --quick.
#
# Stages 1, 2 and the import check stop the run when they fail; later stages
# all run, and the exit status is 1 when any of them failed or ran out of
# time. The whole run keeps within GPU_TIME_LIMIT seconds: each later stage
# gets at most what is left (and its own cap), in the order above, so the
# cheap and telling checks come first. GPU_LOG_DIR gets six files: build.log,
# pytest-cuda.log and cuda.xml, sanitizer.log and sanitizer.xml (JUnit), and
# benchmarks.log.
#
# Environment (all optional):
#   GPU_PYTHON       the interpreter to build and test with (python3)
#   GPU_BUNDLE       the folder of .deb files (build/gpu-bundle)
#   GPU_PREFIX       where they are unpacked (build/gpu-prefix)
#   GPU_LOG_DIR      logs, JUnit XML, benchmark output (build/gpu-logs)
#   GPU_TIME_LIMIT   seconds for the whole run (570)
#   GPU_SANITIZE=0   skip the compute-sanitizer stage
#   GPU_SANITIZE_K   a pytest -k expression choosing the tests run under it
#   GPU_BENCH=0      skip the benchmarks
#   GPU_PYTEST_ARGS  extra pytest arguments for both pytest stages (e.g. "-x")
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

PY=${GPU_PYTHON:-python3}
BUNDLE=$(realpath -m "${GPU_BUNDLE:-build/gpu-bundle}")
PREFIX=$(realpath -m "${GPU_PREFIX:-build/gpu-prefix}")
LOGS=$(realpath -m "${GPU_LOG_DIR:-build/gpu-logs}")
LIBDIR=$PREFIX/usr/lib/x86_64-linux-gnu
SANITIZE_OPS=tests/test_cuda_ops.py
mkdir -p "$LOGS"

start=$SECONDS
deadline=$((start + ${GPU_TIME_LIMIT:-570}))
failed=()
stage() { echo; echo "==== $* ($((SECONDS - start)) s)"; }
die() { echo "test-gpu: $*" >&2; exit 1; }
# limited CAP CMD...: CMD under `timeout` for CAP seconds or what is left of
# the run, whichever is less; status 124 when it ran out, 125 when less than
# half a minute was left to start it.
limited() {
    local cap=$1 left=$((deadline - SECONDS))
    shift
    [ "$left" -ge 30 ] || return 125
    timeout "$((left < cap ? left : cap))" "$@"
}
# note STATUS WHAT: records a failed stage.
note() {
    case $1 in
        0) ;;
        124) failed+=("$2: timed out") ;;
        125) failed+=("$2: not run, no time left") ;;
        *) failed+=("$2 (status $1)") ;;
    esac
}

stage "machine"
command -v nvidia-smi >/dev/null && nvidia-smi -L
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
[ -x "$NVCC" ] || die "nvcc was not found on PATH or in /usr/local/cuda/bin"
export PATH="$(dirname "$NVCC"):$PATH"
"$NVCC" --version | tail -n 2
# where the headers and libraries the build looks for are (setup.py's find_library says which it takes)
find /usr /opt \( -name cudnn.h -o -name nccl.h -o -name 'libnccl.so*' -o -name 'libcudnn.so*' \) 2>/dev/null | head -n 20
"$PY" - <<'EOF' || die "$PY cannot import numpy and pytest"
import sys, numpy, pytest
print("python", sys.version.split()[0], "at", sys.executable)
print("numpy", numpy.__version__, "| pytest", pytest.__version__)
try:
    import torch
    print("torch", torch.__version__, "| cuda", torch.version.cuda, "| cudnn", torch.backends.cudnn.version())
except Exception as e:  # torch is only an optional oracle
    print("torch unavailable:", e)
EOF

stage "unpack the bundle into $PREFIX"
ls "$BUNDLE"/*.deb >/dev/null 2>&1 ||
    die "no .deb files in $BUNDLE: run 'make gpu-bundle' on a Debian machine and bring that folder along"
if [ -f "$BUNDLE/SHA256SUMS" ]; then
    (cd "$BUNDLE" && sha256sum --quiet -c SHA256SUMS) || die "the bundle's files do not match its SHA256SUMS"
fi
rm -rf "$PREFIX" && mkdir -p "$PREFIX"
for deb in "$BUNDLE"/*.deb; do
    dpkg-deb -x "$deb" "$PREFIX" || die "could not unpack $deb"
done
for f in "$PREFIX"/usr/include/{dnnl,turbojpeg,png}.h "$LIBDIR"/lib{dnnl,turbojpeg,png}.so; do
    [ -e "$f" ] || die "the bundle lacks $f"
done
ls "$LIBDIR"

stage "build in place with $PY"
PYINC=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['include'])")
[ -f "$PYINC/Python.h" ] || die "$PYINC/Python.h is missing: this python has no development headers"
# gcc searches CPATH like -I, before the system's headers. setuptools adds
# LDFLAGS to the link command: -L there comes before the system's folders
# (LIBRARY_PATH would come after them), and the rpath lets the extension find
# the libraries without the environment; LD_LIBRARY_PATH lets them find the
# libraries they link in turn (oneDNN's OpenCL loader).
export CPATH="$PREFIX/usr/include${CPATH:+:$CPATH}"
export LDFLAGS="-L$LIBDIR -Wl,-rpath,$LIBDIR${LDFLAGS:+ $LDFLAGS}"
export LD_LIBRARY_PATH="$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
FASTTRAIN_CUDA=${FASTTRAIN_CUDA:-1} "$PY" setup.py -q build_ext --inplace --parallel "$(nproc)" 2>&1 |
    tee "$LOGS/build.log"
[ "${PIPESTATUS[0]}" = 0 ] || die "the build failed (log: $LOGS/build.log)"

stage "import"
"$PY" - <<'EOF' || die "fasttrain does not see the GPU"
import fasttrain as ft
print("fasttrain", ft.__version__, "from", ft.__file__)
if not ft.cuda.is_available():
    raise SystemExit("CUDA is unavailable: " + ft.cuda.unavailable_reason())
print(ft.cuda.device_count(), "device(s):", ft.cuda.get_device_name(0))
EOF

# cuBLASLt and cuDNN say why they refuse a call (their error logs, on stderr
# into the logs), which their status codes do not
export CUBLASLT_LOG_MASK=${CUBLASLT_LOG_MASK:-1} CUDNN_LOGLEVEL_DBG=${CUDNN_LOGLEVEL_DBG:-1}
export CUDNN_LOGDEST_DBG=${CUDNN_LOGDEST_DBG:-stderr}
PYTEST=("$PY" -m pytest -p no:cacheprovider -q -ra --durations=20)
# pytest-timeout, where installed, turns a hung test into a failure
"$PY" -c "import pytest_timeout" 2>/dev/null && PYTEST+=(--timeout=300)
read -r -a EXTRA <<< "${GPU_PYTEST_ARGS:-}"

stage "pytest -m cuda"
limited 300 "${PYTEST[@]}" -m cuda --junitxml="$LOGS/cuda.xml" "${EXTRA[@]}" tests 2>&1 | tee "$LOGS/pytest-cuda.log"
note "${PIPESTATUS[0]}" "pytest -m cuda"

if [ "${GPU_SANITIZE:-1}" != 0 ]; then
    stage "compute-sanitizer memcheck: $SANITIZE_OPS"
    SAN=$(command -v compute-sanitizer || echo "$(dirname "$NVCC")/compute-sanitizer")
    if [ -x "$SAN" ]; then
        # API errors are left to the tests (bad input must raise, not crash);
        # memcheck reports out-of-bounds and misaligned device accesses.
        K=()
        [ -n "${GPU_SANITIZE_K:-}" ] && K=(-k "$GPU_SANITIZE_K")
        limited 300 "$SAN" --tool memcheck --report-api-errors no --error-exitcode 86 --print-limit 20 \
            "${PYTEST[@]}" -m cuda --junitxml="$LOGS/sanitizer.xml" "${K[@]}" "${EXTRA[@]}" "$SANITIZE_OPS" \
            2>&1 | tee "$LOGS/sanitizer.log"
        rc=${PIPESTATUS[0]}
        if [ "$rc" = 86 ]; then
            failed+=("memcheck found errors (log: $LOGS/sanitizer.log)")
        else
            note "$rc" "pytest under memcheck"
        fi
    else
        failed+=("compute-sanitizer not found")
    fi
fi

if [ "${GPU_BENCH:-1}" != 0 ]; then
    : > "$LOGS/benchmarks.log"
    for b in benchmarks/bench_*.py; do
        if "$PY" "$b" --help 2>/dev/null | grep -q -- "--device"; then
            stage "$b --device cuda --quick" | tee -a "$LOGS/benchmarks.log"
            limited 120 "$PY" "$b" --device cuda --quick 2>&1 | tee -a "$LOGS/benchmarks.log"
            note "${PIPESTATUS[0]}" "$b"
        else
            echo "($b has no --device option: skipped)"
        fi
    done
fi

stage "done"
if [ ${#failed[@]} -gt 0 ]; then
    printf 'FAILED: %s\n' "${failed[@]}"
    exit 1
fi
echo "all GPU stages passed"
