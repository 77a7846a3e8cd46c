# fp8mix — build and test the C core on its own, plus the top-level commands.
#
#   make demo     set up the environment (idempotent), build, run the demo
#   make test     set up the environment (idempotent), build, run every test
#   make core     build the static C core library (used by setup.py too)
#   make test-c   build and run the standalone C tests
#   make SAN=1 test-c   the same under AddressSanitizer + UBSan
#   make check-circles  fail if two files of the C core call each other (tests/c/circles.py)
#   make cuda-check     compile every .cu file with nvcc (no GPU needed; the MX file also for sm_100)
#   make cuda-ops-check type-check the CUDA code of the op layer (csrc/torch) against torch's headers
#   make fuzz FUZZ_SECONDS=60   libFuzzer targets (clang) over the C API
#   make valgrind       the C tests under valgrind memcheck

PYTHON   ?= python3
VENV     ?= .venv
CC       ?= cc
BUILD    ?= build/core$(if $(SAN),-san)
# No fast-math anywhere: it breaks NaN and saturation semantics.
CFLAGS_BASE = -std=c11 -O2 -fPIC -ffp-contract=off -fno-fast-math -Wall -Wextra \
              -Wno-unused-parameter -D_POSIX_C_SOURCE=200809L -Icsrc/include -Icsrc/core
ifdef SAN
CFLAGS_BASE += -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all
LDFLAGS_SAN = -fsanitize=address,undefined
endif
CFLAGS ?=
ALLCFLAGS = $(CFLAGS_BASE) $(CFLAGS)

ARCH := $(shell uname -m)
CORE_SRC := $(wildcard csrc/core/*.c)
ifeq ($(ARCH),x86_64)
CORE_SRC += $(wildcard csrc/core/x86/*.c)
endif
CORE_OBJ := $(patsubst csrc/%.c,$(BUILD)/%.o,$(CORE_SRC))
CORE_LIB := $(BUILD)/libfp8mix_core.a

# Per-file ISA flags: only the variant files are compiled for wider ISAs.
ISA_avx2       = -mavx2 -mfma -mf16c
ISA_avx512     = -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512dq
ISA_avx512bf16 = $(ISA_avx512) -mavx512bf16
ISA_amx        = $(ISA_avx512bf16) -mamx-tile -mamx-bf16
isa_flags = $(if $(findstring x86/gemm_amx,$1),$(ISA_amx),$(if $(findstring _avx512bf16,$1),$(ISA_avx512bf16),$(if $(findstring _avx512,$1),$(ISA_avx512),$(if $(findstring _avx2,$1),$(ISA_avx2)))))

# Every object depends on every internal header (internal.h, fp8_rules.h, gemm_internal.h,
# fused.h, stats_kernels.h, x86/*.h ...): a new header is picked up without an edit here.
HDRS := csrc/include/fp8mix.h $(wildcard csrc/core/*.h csrc/core/x86/*.h)

.PHONY: core test-c check-circles demo test cuda-check cuda-ops-check clean venv lint
core: $(CORE_LIB)

$(BUILD)/%.o: csrc/%.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(ALLCFLAGS) $(call isa_flags,$<) -c $< -o $@

$(CORE_LIB): $(CORE_OBJ)
	@rm -f $@
	ar rcs $@ $^

CTEST_SRC := $(wildcard tests/c/test_*.c)
CTEST_BIN := $(patsubst tests/c/%.c,$(BUILD)/tests/%,$(CTEST_SRC))

$(BUILD)/tests/%: tests/c/%.c $(wildcard tests/c/*.h) $(CORE_LIB)
	@mkdir -p $(dir $@)
	$(CC) $(ALLCFLAGS) -Itests/c $< $(CORE_LIB) -o $@ -lpthread -lm $(LDFLAGS_SAN)

test-c: $(CTEST_BIN)
	@set -e; for t in $(CTEST_BIN); do echo "== $$t"; $$t; done

# No import circles between the core's files, read from the objects' symbols:
# prints each circle with its edges and fails when there is one.
check-circles: $(CORE_LIB)
	$(PYTHON) tests/c/circles.py $(BUILD)

# ---- fuzzing: libFuzzer + ASan + UBSan, clang ------------------------------
# Needs clang and libFuzzer (Debian: apt-get install clang libfuzzer-14-dev).
FUZZ_CC      ?= clang
FUZZ_SECONDS ?= 60
FUZZ_BUILD   ?= build/fuzz
FUZZ_TARGETS := cast quantize gemm philox stats nvfp4 grouped
FUZZ_CFLAGS  := -std=c11 -g -O1 -fno-omit-frame-pointer -ffp-contract=off -fno-fast-math \
                -D_POSIX_C_SOURCE=200809L -Icsrc/include -Icsrc/core \
                -fsanitize=address,undefined -fno-sanitize-recover=all
FUZZ_CORE_OBJ := $(patsubst csrc/%.c,$(FUZZ_BUILD)/%.o,$(CORE_SRC))
FUZZ_BIN     := $(patsubst %,$(FUZZ_BUILD)/fuzz_%,$(FUZZ_TARGETS))
.SECONDARY: $(FUZZ_CORE_OBJ)

$(FUZZ_BUILD)/%.o: csrc/%.c $(HDRS)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -fno-sanitize-coverage=trace-cmp $(call isa_flags,$<) -c $< -o $@

$(FUZZ_BUILD)/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/fuzz_common.h $(wildcard tests/c/*.h) $(FUZZ_CORE_OBJ)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer -Itests/fuzz $< $(FUZZ_CORE_OBJ) -o $@ -lpthread -lm

.PHONY: fuzz fuzz-build valgrind
fuzz-build: $(FUZZ_BIN)

fuzz: $(FUZZ_BIN)
	@mkdir -p $(FUZZ_BUILD)/artifacts; failed=""; \
	for t in $(FUZZ_TARGETS); do \
	  work=$$(mktemp -d); cp tests/fuzz/corpus/$$t/* $$work/; \
	  log=$(FUZZ_BUILD)/fuzz_$$t.log; \
	  echo "== fuzz_$$t: $(FUZZ_SECONDS) s (log: $$log)"; \
	  if $(FUZZ_BUILD)/fuzz_$$t -max_total_time=$(FUZZ_SECONDS) -timeout=60 -print_final_stats=1 \
	       -artifact_prefix=$(FUZZ_BUILD)/artifacts/$$t- $$work > $$log 2>&1; then \
	    grep -E '^#[0-9]+.*DONE' $$log | tail -n 1; \
	    grep -E '^stat::number_of_executed_units' $$log; \
	  else \
	    grep -E 'runtime error|ERROR:|FUZZ_CHECK|SUMMARY|Test unit written' $$log | head -n 8; \
	    failed="$$failed $$t"; \
	  fi; \
	  rm -rf $$work; \
	done; \
	if [ -n "$$failed" ]; then echo "fuzz FAILED:$$failed (inputs in $(FUZZ_BUILD)/artifacts/, logs in $(FUZZ_BUILD)/)"; exit 1; fi

# valgrind cannot run ASan binaries: the plain build only.  FP8MIX_QUICK=1 asks
# test_gemm for its smaller big-shape set (valgrind runs ~50x slower, one thread).
ifdef SAN
valgrind:
	@echo "make valgrind: run it without SAN=1 (valgrind and ASan binaries do not mix)"; exit 1
else
# The thread pool's workers live until the process exits (they are never joined), so
# valgrind reports their TLS blocks as "possibly lost"; only definite and indirect leaks fail.
valgrind: $(CTEST_BIN)
	@set -e; for t in $(CTEST_BIN); do echo "== valgrind $$t"; \
	  FP8MIX_QUICK=1 valgrind -q --error-exitcode=1 --leak-check=full --show-possibly-lost=no \
	    --errors-for-leak-kinds=definite,indirect $$t; done
endif

NVCC ?= nvcc
CU_SRC := $(wildcard csrc/cuda/*.cu)
# cuBLASLt headers for the GEMM file: CUBLAS_INCLUDE=<dir with cublasLt.h>, else nvcc's own include dir.
CUBLAS_INCLUDE ?=
cuda-check:
	@set -e; if [ -z "$(CU_SRC)" ]; then echo "no .cu files"; exit 0; fi; \
	inc="$(CUBLAS_INCLUDE)"; [ -n "$$inc" ] || inc="$$(dirname "$$(command -v $(NVCC))")/../include"; \
	for f in $(CU_SRC); do \
	  if grep -q '<cublasLt.h>' $$f && [ ! -f "$$inc/cublasLt.h" ]; then \
	    echo "SKIP $$f: cublasLt.h not found (set CUBLAS_INCLUDE=<dir>)"; continue; fi; \
	  archs="89 90"; case $$f in */mx.cu) archs="$$archs 100";; esac; \
	  for a in $$archs; do echo "nvcc -arch=sm_$$a $$f"; \
	    $(NVCC) -std=c++17 -arch=sm_$$a -Icsrc/include -I"$$inc" -c $$f -o /dev/null; done; done

# The CUDA code of the op layer: every csrc/torch file that mentions FP8MIX_WITH_CUDA
# (ops_cuda.cpp, and the CUDA-only schemas), type-checked with it defined against torch's
# own headers (needs the venv's torch and a CUDA include folder, no GPU). The CPU wheel
# ships c10/cuda's headers but not their generated cmake macros: a stub.
# The Python with torch: the venv's when there is one here, else $(PYTHON) (a worktree
# without its own .venv passes VENV=<path> or PYTHON=<python with torch>).
OPS_PY = $(if $(wildcard $(VENV)/bin/python),$(VENV)/bin/python,$(PYTHON))
cuda-ops-check:
	@set -e; cuinc="$$(dirname "$$(command -v $(NVCC))")/../include"; \
	[ -f "$$cuinc/cuda_runtime_api.h" ] || cuinc="$$(ls -d /usr/local/cuda*/include 2>/dev/null | head -n 1)"; \
	stub=$(BUILD)/c10stub; mkdir -p $$stub/c10/cuda/impl; \
	printf '#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n' > $$stub/c10/cuda/impl/cuda_cmake_macros.h; \
	ti="$$($(OPS_PY) -c 'import torch.utils.cpp_extension as c; print(" ".join("-I" + p for p in c.include_paths()))')"; \
	pi="$$($(OPS_PY) -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"; \
	files="$$(grep -l FP8MIX_WITH_CUDA csrc/torch/*.cpp)"; [ -n "$$files" ] || { echo "no CUDA code in csrc/torch"; exit 1; }; \
	for f in $$files; do echo "c++ -fsyntax-only -DFP8MIX_WITH_CUDA $$f"; \
	  $(CXX) -std=c++20 -fsyntax-only -DFP8MIX_WITH_CUDA $$ti -I$$stub -I$$pi -I"$$cuinc" -Icsrc/include $$f; done

# ---- the two commands of the README -------------------------------------
$(VENV)/.ready: requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q -r requirements-dev.txt
	# DeepSpeed (the ZeRO-2 integration test): its setup imports torch, so no build isolation
	# (which would fetch another torch), and no ops compiled at install
	DS_BUILD_OPS=0 $(VENV)/bin/pip install -q --no-build-isolation torch==2.13.0 deepspeed==0.19.8
	touch $@

venv: $(VENV)/.ready

install: venv
	$(VENV)/bin/pip install -q --no-build-isolation -e .

demo: install
	$(VENV)/bin/python -m fp8mix demo

test: install test-c
	$(VENV)/bin/python -m pytest -q tests

# ruff (pyproject's rules) over the whole tree; mypy over the package
lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy fp8mix

clean:
	rm -rf build *.egg-info fp8mix/_C*.so
