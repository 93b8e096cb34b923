# The two commands of the README: `make demo` and `make test`. Each sets up
# what it needs: Debian packages (when root), a virtual environment in .venv,
# the build.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# golang-1.19-src and python3-sklearn: real JPEG files for the data tests
# (Go's image/testdata with every chroma subsampling, sklearn's two photos).
# clang and libomp-14-dev: the libFuzzer harnesses (the core's -fopenmp under
# clang needs LLVM's OpenMP runtime).
SYS_PACKAGES := build-essential python3-dev python3-venv libdnnl-dev libturbojpeg0-dev libpng-dev \
	libjpeg-turbo-progs dataset-fashion-mnist golang-1.19-src python3-sklearn clang libomp-14-dev \
	openmpi-bin libopenmpi-dev

CC ?= gcc
CORE_SRC := $(wildcard csrc/core/*.c csrc/ops/*.c csrc/optim/*.c csrc/nn/*.c csrc/data/*.c)
CORE_HDR := $(wildcard csrc/*/*.h)
C_TESTS := $(patsubst tests/c/%.c,%,$(wildcard tests/c/test_*.c))
CFLAGS_TEST := -std=c11 -D_GNU_SOURCE -O2 -fno-math-errno -g -Wall -Wextra -Werror -Wno-unused-parameter \
	-Wno-missing-field-initializers -fopenmp -Icsrc -Itests/c
C_LIBS := -ldnnl -lturbojpeg -lpng -ldl -lm
SAN_FLAGS := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
# ThreadSanitizer instruments target_clones resolvers, which run before its
# runtime starts: its builds take the plain code paths.
TSAN_FLAGS := -fsanitize=thread -DFT_NO_CLONES
# The tests whose threads are the loader's pthreads (OpenMP's runtime is not
# instrumented, so its regions would only give false reports).
TSAN_TESTS := test_data_loader test_data_record

.PHONY: demo test test-py test-c test-sanitize test-tsan build sysdeps bench clean gpu-bundle test-gpu \
	fuzz fuzz-replay test-stress-sanitize

# make demo PRECISION=bf16-mixed trains in mixed precision (docs/precision.md)
PRECISION ?= 32-true

demo: build
	$(PY) examples/demo.py --precision $(PRECISION)

test: build
	$(MAKE) -j2 test-c test-sanitize
	$(MAKE) fuzz-replay
	$(MAKE) test-stress-sanitize
	$(MAKE) test-py

# The stress of concurrent misuse (tests/test_stress.py), the data readers, the ops that read blocks in place or
# convert dtypes (pooling over tiles, batch norm's planes, upsampling's gathers, the eager math's C ops), the fused
# optimizers and the planner (recomputation, InPlace-ABN, lifetimes, several inputs, losses, programs sharing modules),
# against the extension built with ASan + UBSan (CPU only) in a copy of the package, the
# sanitizers preloaded into Python. Leak detection is off: the interpreter's own allocations at exit are not ours.
ASAN_PY := build/asan-py
test-stress-sanitize: build
	FASTTRAIN_SANITIZE=1 FASTTRAIN_CUDA=0 $(PY) setup.py -q build_ext --build-lib build/asan --build-temp build/asan-tmp \
		--parallel 2
	rm -rf $(ASAN_PY) && mkdir -p $(ASAN_PY) && cp -r python/fasttrain $(ASAN_PY)/ && rm -f $(ASAN_PY)/fasttrain/*.so \
		&& cp build/asan/fasttrain/_C*.so $(ASAN_PY)/fasttrain/
	cd tests && LD_PRELOAD="$$($(CC) -print-file-name=libasan.so) $$($(CC) -print-file-name=libubsan.so)" \
		ASAN_OPTIONS=detect_leaks=0 PYTHONPATH=../$(ASAN_PY) ../$(PY) -m pytest -q -p no:cacheprovider test_stress.py \
		test_precision.py test_ops_attention.py test_data_png.py test_data_badfiles.py test_data_jpeg.py test_data_features.py test_fit_callbacks.py \
		test_recompute.py test_inplace_abn.py test_memory.py test_grad_scaler.py test_ops_pool.py test_ops_layers.py \
		test_math_kernels.py test_ops_norm_embed.py test_optim.py test_rnn.py test_multi_input.py test_losses.py \
		test_gan.py test_program_compile.py test_trace.py

test-py: build
	$(PY) -m pytest -q tests

sysdeps:
	@missing=$$(for p in $(SYS_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		if [ "$$(id -u)" = 0 ]; then \
			echo "installing:" $$missing; \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
		else \
			echo "missing Debian packages:" $$missing "- run: sudo apt-get install" $$missing; exit 1; \
		fi; \
	fi

# nbclient, nbformat, ipykernel: tests/test_notebook.py runs examples/quickstart.ipynb in a
# kernel; ipywidgets: the progress bar's notebook widget.
$(VENV)/.ready: pyproject.toml | sysdeps
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip "setuptools>=70.1"
	$(VENV)/bin/pip install -q "numpy>=1.25" pytest matplotlib safetensors nbclient nbformat ipykernel ipywidgets
	touch $@

# An in-place build plus a .pth file: the venv imports python/fasttrain
# directly and rebuilds only what changed.
build: $(VENV)/.ready
	$(PY) setup.py -q build_ext --inplace --parallel 2
	@echo "$(CURDIR)/python" > $$($(PY) -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/fasttrain-dev.pth

# The C core is compiled once per flavour into a static library the C tests link.
OBJ := $(patsubst csrc/%.c,build/obj/%.o,$(CORE_SRC))
OBJ_SAN := $(patsubst csrc/%.c,build/obj-san/%.o,$(CORE_SRC))
OBJ_TSAN := $(patsubst csrc/%.c,build/obj-tsan/%.o,$(CORE_SRC))

build/obj/%.o: csrc/%.c $(CORE_HDR)
	@mkdir -p $(dir $@)
	@echo "  CC $<" && $(CC) $(CFLAGS_TEST) -c $< -o $@

build/obj-san/%.o: csrc/%.c $(CORE_HDR)
	@mkdir -p $(dir $@)
	@echo "  CC $< (sanitized)" && $(CC) $(CFLAGS_TEST) $(SAN_FLAGS) -c $< -o $@

build/obj-tsan/%.o: csrc/%.c $(CORE_HDR)
	@mkdir -p $(dir $@)
	@echo "  CC $< (ThreadSanitizer)" && $(CC) $(CFLAGS_TEST) $(TSAN_FLAGS) -c $< -o $@

build/libftcore.a: $(OBJ)
	@rm -f $@ && ar rcs $@ $^

build/libftcore-san.a: $(OBJ_SAN)
	@rm -f $@ && ar rcs $@ $^

build/libftcore-tsan.a: $(OBJ_TSAN)
	@rm -f $@ && ar rcs $@ $^

build/c/%: tests/c/%.c build/libftcore.a
	@mkdir -p build/c
	@echo "  LD $@" && $(CC) $(CFLAGS_TEST) $< build/libftcore.a -o $@ $(C_LIBS)

build/c-san/%: tests/c/%.c build/libftcore-san.a
	@mkdir -p build/c-san
	@echo "  LD $@" && $(CC) $(CFLAGS_TEST) $(SAN_FLAGS) $< build/libftcore-san.a -o $@ $(C_LIBS)

build/c-tsan/%: tests/c/%.c build/libftcore-tsan.a
	@mkdir -p build/c-tsan
	@echo "  LD $@" && $(CC) $(CFLAGS_TEST) $(TSAN_FLAGS) $< build/libftcore-tsan.a -o $@ $(C_LIBS)

# Every test program runs even when an earlier one fails; the rule fails at the end.
test-c: $(addprefix build/c/,$(C_TESTS))
	@failed=; for t in $^; do echo "== $$t"; $$t || failed="$$failed $$t"; done; \
	if [ -n "$$failed" ]; then echo "FAILED:$$failed"; exit 1; fi

test-sanitize: $(addprefix build/c-san/,$(C_TESTS))
	@failed=; for t in $^; do echo "== $$t (ASan+UBSan)"; \
		ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 $$t || failed="$$failed $$t"; done; \
	if [ -n "$$failed" ]; then echo "FAILED:$$failed"; exit 1; fi

test-tsan: $(addprefix build/c-tsan/,$(TSAN_TESTS))
	@failed=; for t in $^; do echo "== $$t (TSan)"; TSAN_OPTIONS=halt_on_error=1 $$t || failed="$$failed $$t"; done; \
	if [ -n "$$failed" ]; then echo "FAILED:$$failed"; exit 1; fi

# ---- fuzzing ----
# libFuzzer needs clang; the core is compiled once more with clang and
# coverage instrumentation (fuzzer-no-link) so the fuzzer steers by the
# parsers' branches. Only core/ and data/ are needed by the readers.
FUZZ_CC ?= clang
FUZZ_TARGETS := record tar jpeg png
FUZZ_SECONDS ?= 60
FUZZ_SRC := $(wildcard csrc/core/*.c csrc/data/*.c)
FUZZ_FLAGS := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
OBJ_FUZZ := $(patsubst csrc/%.c,build/obj-fuzz/%.o,$(FUZZ_SRC))

build/obj-fuzz/%.o: csrc/%.c $(CORE_HDR)
	@mkdir -p $(dir $@)
	@echo "  CC $< (fuzzing)" && $(FUZZ_CC) $(CFLAGS_TEST) $(FUZZ_FLAGS) -fsanitize=fuzzer-no-link -c $< -o $@

build/libftcore-fuzz.a: $(OBJ_FUZZ)
	@rm -f $@ && ar rcs $@ $^

build/fuzz/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/fuzz_file.h build/libftcore-fuzz.a
	@mkdir -p build/fuzz
	@echo "  LD $@" && $(FUZZ_CC) $(CFLAGS_TEST) $(FUZZ_FLAGS) -fsanitize=fuzzer -Itests/fuzz $< \
		build/libftcore-fuzz.a -o $@ $(C_LIBS)

FUZZ_BINS := $(addprefix build/fuzz/fuzz_,$(FUZZ_TARGETS))

# Each harness for FUZZ_SECONDS, starting from its checked-in corpus; inputs
# it finds go to build/fuzz-corpus/NAME (copy the useful ones into
# tests/fuzz/corpus/NAME), a crash to build/fuzz-crashes/NAME (add it to
# tests/fuzz/crashes/NAME once fixed, so the replay keeps it fixed).
fuzz: $(FUZZ_BINS)
	@failed=; for t in $(FUZZ_TARGETS); do echo "== fuzz_$$t for $(FUZZ_SECONDS) s"; \
		mkdir -p build/fuzz-corpus/$$t build/fuzz-crashes/$$t; \
		build/fuzz/fuzz_$$t -max_total_time=$(FUZZ_SECONDS) -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
			-artifact_prefix=build/fuzz-crashes/$$t/ build/fuzz-corpus/$$t tests/fuzz/corpus/$$t \
			|| failed="$$failed fuzz_$$t"; done; \
	if [ -n "$$failed" ]; then echo "FAILED:$$failed"; exit 1; fi

# Every corpus and crash input once through its harness, without fuzzing.
fuzz-replay: $(FUZZ_BINS)
	@failed=; for t in $(FUZZ_TARGETS); do \
		files=$$(find tests/fuzz/corpus/$$t tests/fuzz/crashes/$$t -type f ! -name .keep | sort); \
		echo "== fuzz_$$t: replaying $$(echo "$$files" | wc -w) inputs (ASan+UBSan)"; \
		[ -n "$$files" ] || { failed="$$failed fuzz_$$t(no-inputs)"; continue; }; \
		build/fuzz/fuzz_$$t -timeout=10 $$files >build/fuzz/replay_$$t.log 2>&1 \
			|| { tail -n 40 build/fuzz/replay_$$t.log; failed="$$failed fuzz_$$t"; }; done; \
	if [ -n "$$failed" ]; then echo "FAILED:$$failed"; exit 1; fi

bench: build
	@for b in benchmarks/bench_*.py; do echo "== $$b"; env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE $(PY) $$b || exit 1; done

clean:
	rm -rf build python/fasttrain/*.so python/fasttrain/__pycache__

# ---- GPU machines ----
# A GPU machine has nvcc, cuDNN (PyTorch's pip package), NumPy and pytest under
# its own python3, but no package registry: the Debian packages the C core
# links (oneDNN, TurboJPEG, libpng, and the OpenCL loader oneDNN links) travel as .deb
# files. `make gpu-bundle` fetches them here into GPU_BUNDLE; that folder goes
# along with the tree (build/ is ignored by git: name it when copying the tree)
# and `make test-gpu` there unpacks, builds in place and runs the GPU checks
# (tools/test-gpu.sh says what, and which variables adjust it).
GPU_BUNDLE ?= build/gpu-bundle
GPU_PYTHON ?= python3
GPU_DEBS := libdnnl-dev libdnnl2 libturbojpeg0-dev libturbojpeg0 libpng-dev libpng16-16 ocl-icd-libopencl1

# (APT::Sandbox::User=root: apt's own download user may not write into the tree)
gpu-bundle:
	@rm -rf $(GPU_BUNDLE) && mkdir -p $(GPU_BUNDLE)
	cd $(GPU_BUNDLE) && { apt-get -q -o APT::Sandbox::User=root download $(GPU_DEBS) || \
		{ [ "$$(id -u)" = 0 ] && apt-get -q update && apt-get -q -o APT::Sandbox::User=root download $(GPU_DEBS); }; }
	cd $(GPU_BUNDLE) && sha256sum *.deb > SHA256SUMS && du -ch *.deb | tail -n 1

test-gpu:
	GPU_BUNDLE=$(GPU_BUNDLE) GPU_PYTHON=$(GPU_PYTHON) bash tools/test-gpu.sh
