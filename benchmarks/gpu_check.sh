#!/usr/bin/env bash
# gpu_check.sh — the one GPU check of the fp8mix CUDA backend, for a machine with an
# NVIDIA GPU (sm_89/sm_90), torch 2.11+ built for CUDA 13, Python 3.12, nvcc, and no
# internet.  Builds the CUDA extension, runs the GPU tests, prints one benchmark table.
# Budget: 8 minutes in all (build ~2-3 min, tests ~2 min, benchmarks ~1-2 min).
#
# Targets (checked by benchmarks/bench_gpu.py, FAIL rows make the script exit 1):
#   casts (cast+amax, cast+transpose+amax)  >= 85% of device-to-device copy bandwidth
#   scaled_mm (per-tensor scales)           >= 95% of torch._scaled_mm TFLOP/s
#   fp8mix.Linear fwd+bwd at 8192^3         >= 1.3x faster than nn.Linear in bf16
#
# Usage: bash benchmarks/gpu_check.sh   (from anywhere; env PYTHON picks the interpreter)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
T0=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - T0 ))s] $*"; }

stamp "environment"
nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader || true
$PY -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'gpu', torch.cuda.is_available())"
command -v nvcc >/dev/null && nvcc --version | tail -1 || echo "nvcc not on PATH (setup.py also looks in CUDA_HOME)"

stamp "build (FP8MIX_FORCE_CUDA=1, pip install --no-build-isolation -e .)"
# pip without network: setuptools and wheel must already be installed (no build isolation).
$PY -c "import setuptools, wheel" 2>/dev/null || echo "warning: setuptools/wheel missing; pip may fail offline"
export MAX_JOBS=${MAX_JOBS:-16}
if ! FP8MIX_FORCE_CUDA=1 timeout 300 $PY -m pip install --no-build-isolation --no-deps --no-index -e . \
      > /tmp/fp8mix_build.log 2>&1; then
  tail -60 /tmp/fp8mix_build.log
  stamp "BUILD FAILED"
  exit 2
fi
grep -E "warning|error" /tmp/fp8mix_build.log | grep -v "^  " | head -20 || true
$PY -c "import torch, fp8mix; assert torch._C._dispatch_has_kernel_for_dispatch_key('fp8mix::cast', 'CUDA'), 'no CUDA kernels registered'; print('fp8mix CUDA ops registered')" || exit 2

stamp "GPU tests (tests/test_cuda.py)"
timeout 200 $PY -m pytest -q --maxfail=25 --no-header -p no:cacheprovider tests/test_cuda.py 2>&1 | tail -25
TEST_RC=${PIPESTATUS[0]}

stamp "benchmarks"
timeout 170 $PY benchmarks/bench_gpu.py
BENCH_RC=$?

stamp "done: tests rc=$TEST_RC, benchmarks rc=$BENCH_RC"
[ "$TEST_RC" = 0 ] && [ "$BENCH_RC" = 0 ]
