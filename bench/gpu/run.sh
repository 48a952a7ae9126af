#!/usr/bin/env bash
# The GPU campaign, one device call per invocation (each well inside 9 minutes):
#     bash bench/gpu/run.sh STEP...
# STEPs, run in order: tests (the GPU-marked tests and the Triton kernel tests on the GPU),
# ceilings, gemm-bf16, gemm-fp16, rows, startup, decode (M = 1, 8, 16), decode2 (M = 32, 64),
# launch-gap (a decode GEMM's device time against its launch path's host time),
# throughput (200-config tunes through the compile farm: wall time per key), throughput-no-farm
# (the same, each candidate compiled in its timing worker). Each step's output goes to $OUT/log.txt;
# the tables to $OUT. A step that fails does not stop the next. Needs the carried wheels
# (bash bench/gpu/prepare.sh here; carry [".whl"]): without them it stops at once, exit 2.
set -u
started=$(date +%s)
budget=${BUDGET_S:-540}
OUT=${OUT:-bench/results}
mkdir -p "$OUT"
log="$OUT/log.txt"
# Sourced in this shell (not in a pipeline's subshell), so its PYTHONPATH and its failure hold.
source .whl/gpu-env.sh > >(tee -a "$log") 2>&1 || { echo "wheel install failed" >&2; exit 9; }
# Every step starts the embedded server: a missing wheel would fail each of them, one by one.
if ! python3 -c "import cache_server.embedded, tuner" 2>>"$log"; then
  echo "the carried wheels lack a dependency (see $log): on the machine that prepared them," \
    "run bash bench/gpu/prepare.sh and carry .whl again" | tee -a "$log"
  exit 2
fi
ceilings=bench/results/ceilings-gpu.json
left() { echo $(( budget - ($(date +%s) - started) )); }
for step in "$@"; do
  echo "=== $step ($(left) s left)" | tee -a "$log"
  case $step in
    tests)
      timeout 240 python3 -m pytest -q -p no:cacheprovider -n 8 -m "gpu or not gpu" \
        tests/test_gpu.py tests/test_triton_kernels.py tests/test_output_buffers.py \
        tests/test_devicelock.py::test_a_timing_waits_for_another_processs_timing_on_its_device 2>&1 \
        | tail -40 | tee -a "$log" ;;
    ceilings)
      timeout 120 python3 -m bench.gpu.ceilings 2>&1 | tee -a "$log"
      [ -f "$OUT/ceilings.json" ] && ceilings="$OUT/ceilings.json" ;;
    gemm-bf16|gemm-fp16)
      dtype=$([ "$step" = gemm-bf16 ] && echo bfloat16 || echo float16)
      stop=$(( $(left) - 100 ))
      timeout $(( $(left) - 10 )) python3 -m bench.gpu.kernels gemm --dtypes $dtype \
        --ceilings "$ceilings" --stop-after $stop 2>&1 | tee -a "$log" | grep -v "^|" ;;
    rows)
      stop=$(( $(left) - 90 ))
      timeout $(( $(left) - 10 )) python3 -m bench.gpu.kernels rows --ceilings "$ceilings" \
        --stop-after $stop 2>&1 | tee -a "$log" | grep -v "^|" ;;
    launch-gap)
      timeout 200 python3 -m bench.gpu.launch_gap 2>&1 | tee -a "$log" ;;
    startup)
      timeout $(( $(left) - 10 )) python3 -m bench.gpu.startup 2>&1 | tee -a "$log" ;;
    decode|decode2)
      ms=$([ "$step" = decode ] && echo 1,8,16 || echo 32,64)
      timeout $(( $(left) - 10 )) python3 -m bench.gpu.decode_gemm --ms $ms \
        --ceilings "$ceilings" --stop-after $(( $(left) - 100 )) 2>&1 | tee -a "$log" \
        | grep -v "^|" ;;
    throughput)
      timeout $(( $(left) - 10 )) python3 -m bench.gpu.tuning_throughput 2>&1 | tee -a "$log" ;;
    throughput-no-farm)
      timeout $(( $(left) - 10 )) python3 -m bench.gpu.tuning_throughput --no-farm 2>&1 \
        | tee -a "$log" ;;
    *) echo "unknown step $step" | tee -a "$log" ;;
  esac
done
echo "=== done in $(( $(date +%s) - started )) s" | tee -a "$log"
