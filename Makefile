# fp8mix — build and test the C core on its own, plus the top-level commands.
#
#   make demo     set up the environment (idempotent), build, run the demo
#   make test     set up the environment (idempotent), build, run every test
#   make core     build the static C core library (used by setup.py too)
#   make test-c   build and run the standalone C tests
#   make SAN=1 test-c   the same under AddressSanitizer + UBSan
#   make cuda-check     compile every .cu file with nvcc (no GPU needed)

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
isa_flags = $(if $(findstring _avx512bf16,$1),$(ISA_avx512bf16),$(if $(findstring _avx512,$1),$(ISA_avx512),$(if $(findstring _avx2,$1),$(ISA_avx2))))

HDRS := csrc/include/fp8mix.h csrc/core/internal.h csrc/core/gemm_internal.h

.PHONY: core test-c demo test cuda-check clean venv
core: $(CORE_LIB)

$(BUILD)/%.o: csrc/%.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(ALLCFLAGS) $(call isa_flags,$<) -c $< -o $@

$(CORE_LIB): $(CORE_OBJ)
	@rm -f $@
	ar rcs $@ $^

CTEST_SRC := $(wildcard tests/c/test_*.c)
CTEST_BIN := $(patsubst tests/c/%.c,$(BUILD)/tests/%,$(CTEST_SRC))

$(BUILD)/tests/%: tests/c/%.c tests/c/check.h $(CORE_LIB)
	@mkdir -p $(dir $@)
	$(CC) $(ALLCFLAGS) -Itests/c $< $(CORE_LIB) -o $@ -lpthread -lm $(LDFLAGS_SAN)

test-c: $(CTEST_BIN)
	@set -e; for t in $(CTEST_BIN); do echo "== $$t"; $$t; done

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
	  for a in 89 90; do echo "nvcc -arch=sm_$$a $$f"; \
	    $(NVCC) -std=c++17 -arch=sm_$$a -Icsrc/include -I"$$inc" -c $$f -o /dev/null; done; done

# ---- the two commands of the README -------------------------------------
$(VENV)/.ready: requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q -r requirements-dev.txt
	touch $@

venv: $(VENV)/.ready

install: venv
	$(VENV)/bin/pip install -q --no-build-isolation -e .

demo: install
	$(VENV)/bin/python -m fp8mix demo

test: install test-c
	$(VENV)/bin/python -m pytest -q tests

clean:
	rm -rf build *.egg-info fp8mix/_C*.so
