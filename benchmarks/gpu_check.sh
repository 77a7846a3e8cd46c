#!/usr/bin/env bash
# gpu_check.sh — the one GPU check of the fp8mix CUDA backend, for a machine with an
# NVIDIA GPU (sm_89 / sm_90), torch 2.11+ built for CUDA 13, Python 3.12, nvcc, and no
# internet.  Stages, each with a time cap taken from one budget (GPU_CHECK_BUDGET,
# default 480 s, the whole run):
#   1 environment        GPU, driver, torch, nvcc, ninja
#   2 build              pip install --no-build-isolation --no-deps --no-index -e .
#                        (FP8MIX_FORCE_CUDA=1, only this GPU's arch: FP8MIX_CUDA_ARCHS)
#   3 self-check         fp8mix.cuda.run_selfcheck: every kernel vs the C core
#   4 tests              tests/test_cuda.py: the smoke tests first, then the whole file
#                        (no --maxfail: every group reports); junit xml and a
#                        per-function pass/fail count
#   5 training           benchmarks/gpu_train_check.py: the seed's SimpleModel loop and
#                        `python -m fp8mix demo --device cuda`
#   6 benchmarks         benchmarks/bench_gpu.py: casts vs copy, scaled_mm vs
#                        torch._scaled_mm / bf16 mm, Linear vs bf16 / torchao, launches;
#                        prints the ONE table, with every earlier stage's rows first
# Every row is PASS/FAIL against its target; the exit status is 0 only if all pass
# (2: build failed, 3: no GPU).  Logs and results go to $OUT (default
# /tmp/fp8mix_gpu_check): build.log, selfcheck.log, pytest_smoke.log, pytest.log,
# cuda.xml, test_summary.txt, train.log, bench.log, table.json, demo/.
# Without a GPU (or with a CPU-only torch) the build stage still runs (a CPU build,
# same offline pip command), then the script exits 3 naming the reason;
# GPU_CHECK_DRY_RUN=1 then also runs the Python stages on the CPU (verdict DRY; the
# self-check and part of tests/test_cuda.py with the CPU as the device).
# GPU_CHECK_BUILD=inplace builds with setup.py build_ext --inplace instead of pip (no
# install: for a shared interpreter).
#
# Usage: bash benchmarks/gpu_check.sh   (from anywhere; env PYTHON picks the interpreter)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${OUT:-/tmp/fp8mix_gpu_check}
BUDGET=${GPU_CHECK_BUDGET:-480}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the scripts under benchmarks/ import fp8mix from here
ROWS="$OUT/rows.jsonl"
: > "$ROWS"
T0=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - T0 ))s] $*"; }
elapsed() { echo $(( $(date +%s) - T0 )); }
# cap MAX RESERVE: seconds for a stage, at most MAX, leaving RESERVE for the stages after it
cap() { local c=$1 l=$(( BUDGET - $(elapsed) - $2 )); [ "$l" -lt "$c" ] && c=$l; [ "$c" -lt 15 ] && c=15; echo "$c"; }
# row KIND WHAT VALUE TARGET VERDICT [REFERENCE]: one line of the final table
row() {
  $PY - "$ROWS" "$@" <<'EOF'
import json, sys
path, kind, what, value, target, verdict = sys.argv[1:7]
ref = sys.argv[7] if len(sys.argv) > 7 else ""
with open(path, "a") as f:
    f.write(json.dumps({"kind": kind, "what": what, "value": value, "reference": ref, "ratio": "",
                        "target": target, "verdict": verdict}) + "\n")
EOF
}
# table: print the rows gathered so far (no fp8mix import: also after a failed build)
table() {
  $PY - "$ROWS" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
keys = ("kind", "what", "value", "reference", "ratio", "target", "verdict")
w = [max([len(k)] + [len(str(r.get(k, ""))) for r in rows]) for k in keys]
for r in [dict(zip(keys, keys))] + rows:
    print("  ".join(str(r.get(k, "")).ljust(n) for k, n in zip(keys, w)).rstrip())
PYEOF
}

# ---- 1 environment ---------------------------------------------------------------------
stamp "environment"
nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader 2>&1 | head -4 || true
$PY -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'gpu', torch.cuda.is_available())"
command -v nvcc >/dev/null && nvcc --version | tail -1 || echo "nvcc not on PATH (setup.py also looks in CUDA_HOME)"
{ command -v ninja >/dev/null || $PY -c "import ninja" 2>/dev/null; } && echo "ninja: yes (parallel build)" \
  || echo "ninja: no (sources compile one after another)"
uptime
NOGPU=$($PY -c "
import torch
if torch.version.cuda is None: print('torch', torch.__version__, 'is a CPU-only build')
elif not torch.cuda.is_available(): print('no CUDA device is visible (torch.cuda.is_available() is False)')
" 2>&1)

# ---- 2 build ---------------------------------------------------------------------------
$PY -c "import setuptools, wheel" 2>/dev/null || echo "warning: setuptools/wheel missing; pip may fail offline"
export MAX_JOBS=${MAX_JOBS:-16}
if [ -z "$NOGPU" ]; then
  ARCH=$($PY -c "import torch; a, b = torch.cuda.get_device_capability(); print(f'{a}{b}')")
  export FP8MIX_FORCE_CUDA=1 FP8MIX_CUDA_ARCHS=${FP8MIX_CUDA_ARCHS:-$ARCH}
  export NVCC_APPEND_FLAGS="${NVCC_APPEND_FLAGS:-} --threads 2"  # nvcc compiles SASS and PTX side by side
  stamp "build (CUDA, arch $FP8MIX_CUDA_ARCHS, pip install --no-build-isolation --no-deps --no-index -e .)"
else
  stamp "build (CPU only: $NOGPU)"
fi
TB=$(date +%s)
BUILD_HOW="pip install -e . offline"
build_ok=0
if [ "${GPU_CHECK_BUILD:-pip}" = inplace ]; then
  # no install at all (a shared interpreter, e.g. a CPU dry run on a development machine)
  BUILD_HOW="setup.py build_ext --inplace (GPU_CHECK_BUILD=inplace)"
  timeout "$(cap 300 150)" $PY setup.py build_ext --inplace > "$OUT/build.log" 2>&1 && build_ok=1
elif timeout "$(cap 300 150)" $PY -m pip install --no-build-isolation --no-deps --no-index -e . \
    > "$OUT/build.log" 2>&1; then
  build_ok=1
elif grep -qE "bdist_wheel|No module named .(wheel|setuptools)." "$OUT/build.log"; then
  # pip's editable install needs setuptools >= 70.1 (or wheel); setup.py itself does not
  echo "pip could not build offline (packaging tools missing); falling back to setup.py build_ext --inplace"
  BUILD_HOW="setup.py build_ext --inplace (pip lacked bdist_wheel)"
  timeout "$(cap 300 150)" $PY setup.py build_ext --inplace >> "$OUT/build.log" 2>&1 && build_ok=1
fi
if [ "$build_ok" != 1 ]; then
  grep -nE "error|Error" "$OUT/build.log" | head -40
  tail -60 "$OUT/build.log"
  stamp "BUILD FAILED (log: $OUT/build.log)"
  row build "$BUILD_HOW ($(( $(date +%s) - TB )) s)" "failed" "builds" FAIL "see build.log"
  table
  exit 2
fi
grep -E "warning|error" "$OUT/build.log" | grep -v "^  " | head -20 || true
row build "$BUILD_HOW" "$(( $(date +%s) - TB )) s" "builds" PASS
if [ -n "$NOGPU" ]; then
  stamp "NO GPU: $NOGPU; the CUDA stages cannot run here"
  if [ "${GPU_CHECK_DRY_RUN:-0}" = 1 ]; then
    stamp "dry run of the Python stages on the CPU"
    $PY -c "from fp8mix.cuda import selfcheck; print('self-check (CPU as device):', selfcheck.run_selfcheck('cpu'))"
    FP8MIX_CUDA_TESTS_ON=cpu timeout "$(cap 200 60)" $PY -m pytest -q --no-header -p no:cacheprovider \
      -p no:randomly tests/test_cuda.py -k "smoke or delayed or grad_cast or rng or recipe or tracks_cpu or captures" \
      > "$OUT/pytest_dry.log" 2>&1
    DRY_RC=$?
    tail -3 "$OUT/pytest_dry.log"
    row tests "tests/test_cuda.py on the CPU (FP8MIX_CUDA_TESTS_ON=cpu, recipe ops)" \
      "$(tail -1 "$OUT/pytest_dry.log" | cut -c1-80)" "all pass" "$([ "$DRY_RC" = 0 ] && echo DRY || echo FAIL)"
    $PY benchmarks/gpu_train_check.py --device cpu --epochs 2 --rows "$ROWS"
    $PY benchmarks/bench_gpu.py --dry-run --rows "$ROWS" --json "$OUT/table.json"
  else
    table
  fi
  stamp "done: NO GPU ($NOGPU)"
  exit 3
fi
$PY -c "import torch, fp8mix; assert torch._C._dispatch_has_kernel_for_dispatch_key('fp8mix::cast', 'CUDA'), 'no CUDA kernels registered'; print('fp8mix CUDA ops registered')" \
  || { row build "CUDA ops registered" "no" "yes" FAIL; table; exit 2; }

# ---- 3 self-check ----------------------------------------------------------------------
stamp "self-check (fp8mix.cuda.run_selfcheck)"
if timeout "$(cap 60 300)" $PY -c "
import sys, torch
from fp8mix.cuda import compare, selfcheck
bad = compare.failures(selfcheck.collect_cases(torch.device('cuda', 0)))  # every failing kernel, not just the first
for msg in bad:
    print('MISMATCH', msg)
if bad:
    sys.exit(f'SelfCheckError: {len(bad)} kernel outputs differ from the CPU oracle (first: {bad[0][:300]})')
print('self-check passed:', selfcheck.run_selfcheck(torch.device('cuda', 0)))
" > "$OUT/selfcheck.log" 2>&1; then
  cat "$OUT/selfcheck.log"
  row selfcheck "run_selfcheck(cuda:0)" "$(grep -o "'cases': [0-9]*" "$OUT/selfcheck.log" | head -1), $(grep -o "'ms': [0-9.]*" "$OUT/selfcheck.log" | cut -c1-12)" "no mismatch" PASS
else
  tail -30 "$OUT/selfcheck.log"
  row selfcheck "run_selfcheck(cuda:0)" "$(grep -E "Error" "$OUT/selfcheck.log" | tail -1 | cut -c1-150)" "no mismatch" FAIL
fi

# ---- 4 tests ---------------------------------------------------------------------------
PYTEST=(-m pytest -q -rfE --no-header -p no:cacheprovider -p no:randomly)
stamp "smoke tests (tests/test_cuda.py -k smoke)"
timeout -s INT -k 10 "$(cap 60 260)" $PY "${PYTEST[@]}" --tb=short -k smoke tests/test_cuda.py \
  > "$OUT/pytest_smoke.log" 2>&1
SMOKE_RC=$?
tail -25 "$OUT/pytest_smoke.log"
stamp "tests (tests/test_cuda.py, every group; log: $OUT/pytest.log)"
TT=$(date +%s)
timeout -s INT -k 10 "$(cap 200 200)" $PY "${PYTEST[@]}" --tb=line --junitxml="$OUT/cuda.xml" tests/test_cuda.py \
  > "$OUT/pytest.log" 2>&1
TEST_RC=$?
tail -5 "$OUT/pytest.log"
case "$TEST_RC" in  # timeout's codes: the groups after the cut have no row of their own below
  124|137) row tests "tests/test_cuda.py cut by its time cap" "after $(( $(date +%s) - TT )) s" \
             "the whole file runs" FAIL "later test functions did not run (see pytest.log)" ;;
esac
$PY - "$OUT/cuda.xml" "$ROWS" "$OUT/test_summary.txt" <<'EOF'
import collections, json, sys, xml.etree.ElementTree as ET
xml_path, rows_path, txt_path = sys.argv[1:4]
try:
    cases = ET.parse(xml_path).getroot().iter("testcase")
except (OSError, ET.ParseError) as e:
    cases, err = [], e
else:
    err = None
count = collections.OrderedDict()
for c in cases:
    fn = c.get("name", "?").split("[")[0]
    d = count.setdefault(fn, {"passed": 0, "failed": 0, "skipped": 0, "first": ""})
    bad = c.find("failure") if c.find("failure") is not None else c.find("error")
    if bad is not None:
        d["failed"] += 1
        if not d["first"]:
            d["first"] = (c.get("name", "") + ": " + (bad.get("message") or bad.text or "")).replace("\n", " ")
    elif c.find("skipped") is not None:
        d["skipped"] += 1
    else:
        d["passed"] += 1
with open(txt_path, "w") as out, open(rows_path, "a") as rows:
    if err is not None:
        rows.write(json.dumps({"kind": "tests", "what": "tests/test_cuda.py", "value": f"no junit xml ({err})",
                               "reference": "", "ratio": "", "target": "all pass", "verdict": "FAIL"}) + "\n")
    for fn, d in count.items():
        n = d["passed"] + d["failed"] + d["skipped"]
        line = f"{fn}: {d['passed']}/{n} passed, {d['failed']} failed, {d['skipped']} skipped  {d['first'][:300]}"
        print(line)
        out.write(line + "\n")
        verdict = "FAIL" if d["failed"] or d["passed"] == 0 and not d["skipped"] else "PASS"
        rows.write(json.dumps({"kind": "tests", "what": fn, "value": f"{d['passed']}/{n} passed"
                               + (f", {d['skipped']} skipped" if d["skipped"] else ""),
                               "reference": d["first"][:100], "ratio": "", "target": "all pass",
                               "verdict": verdict}) + "\n")
EOF
[ "$SMOKE_RC" = 0 ] || row tests "smoke tests" "rc $SMOKE_RC" "all pass" FAIL "see pytest_smoke.log"
[ "$TEST_RC" = 0 ] || grep -E "^(FAILED|ERROR) " "$OUT/pytest.log" | head -40

# ---- 5 training --------------------------------------------------------------------------
stamp "training (seed SimpleModel loop, python -m fp8mix demo --device cuda)"
DEMO_T=$(cap 120 90)
timeout -k 10 "$(( DEMO_T + 30 ))" $PY benchmarks/gpu_train_check.py --rows "$ROWS" --out "$OUT" \
  --demo-timeout "$DEMO_T" > "$OUT/train.log" 2>&1 || row train "gpu_train_check.py" "rc $?" "rc 0" FAIL "see train.log"
grep -vE "^\s*\[(fp32|fp8|fp8-all)\] Epoch" "$OUT/train.log" | tail -30

# ---- 6 benchmarks and the table ------------------------------------------------------------
stamp "benchmarks (benchmarks/bench_gpu.py) and the table"
timeout -k 10 "$(cap 150 0)" $PY benchmarks/bench_gpu.py --rows "$ROWS" --json "$OUT/table.json" \
  > "$OUT/bench.log" 2>&1
BENCH_RC=$?
grep -vE "^(W|I)[0-9]{4} " "$OUT/bench.log" | tail -90
[ "$BENCH_RC" = 0 ] || [ "$BENCH_RC" = 1 ] || { echo "bench_gpu.py rc $BENCH_RC (killed or crashed)"; table; }
stamp "done in $(elapsed) s (budget $BUDGET s): tests rc=$TEST_RC, bench rc=$BENCH_RC"
[ "$TEST_RC" = 0 ] && [ "$SMOKE_RC" = 0 ] && [ "$BENCH_RC" = 0 ] && ! grep -q '"verdict": "FAIL"' "$ROWS"
