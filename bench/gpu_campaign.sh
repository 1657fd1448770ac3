#!/usr/bin/env bash
# One GPU campaign on the device machine: GPU test suite, compute-sanitizer on it, the CLI
# self-test, PyTorch parity (forward) and gradient checks (backward), benchmarks, optionally a
# profile. Binaries come
# prebuilt in .carry/ (built on the CPU machine); markdown reports go to $OUT, logs and JSON to
# $OUT/logs.tgz. Prints a short table last. STEPS=a,b,... runs only the steps named (the names in
# the summary table); a whole campaign no longer fits one 10-minute command, so split it in two.
# Wheels in .whl/ (diffusers 0.42.1 for the MiniMax-H3 checks; bench/fetch_wheels.sh fills it) are
# installed into /tmp/site.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/out}"
LOGS="$OUT/logs"
mkdir -p "$LOGS"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/python" EXACTJIT_CACHE_DIR=/tmp/xj-cache EXACTJIT_LIBRARY="$PWD/.carry/libexactjit.so" \
  EXACTJIT_COMMIT="$(cat .carry/commit)"
summary=()
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl &&
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
step() {  # step NAME LOG COMMAND...
  local name=$1 log=$2
  shift 2
  [ -z "${STEPS:-}" ] || [[ ",$STEPS," == *",$name,"* ]] || return 0
  local start=$SECONDS
  "$@" >"$LOGS/$log" 2>&1
  local rc=$?
  summary+=("$(printf '%-22s rc=%-3s %4ss  %s' "$name" "$rc" "$((SECONDS - start))" "$log")")
  tail -n 3 "$LOGS/$log"
}
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; ./.carry/exactjit info; echo "commit: $(cat .carry/commit)"; } >"$OUT/info.txt" 2>&1
if [ "${RECORD_GOLDEN:-0}" = 1 ]; then  # only when the recorder changed
  step golden golden.log python3 tests/golden/record_golden.py --out /tmp/golden
  tar -C /tmp -cf "$OUT/golden.tar" golden 2>/dev/null
fi
step prewarm prewarm.log ./.carry/exactjit prewarm -j 16
step gpu-tests gpu_tests.log ./.carry/exactjit_gpu_tests
# compute-sanitizer over the whole GPU suite (every catalog kernel, forward and backward, bad
# indices included), one tool per step; SANITIZER_FILTER narrows it. racecheck tracks every
# shared-memory access, so it runs det_linear's forward geometries at the sanitizer size
# (Gpu.DetLinearEveryGeometryAtSanitizerSize) instead of the two full-size tests.
full_size_det_linear="Gpu.DetLinearIsBatchInvariantAndMatchesTheFp32Model:Gpu.DetLinearBf16BulkAndRegisterKernelsGiveTheSameBits"
for tool in memcheck racecheck synccheck; do
  filter="Gpu.*"
  [ "$tool" = racecheck ] && filter="Gpu.*:-$full_size_det_linear"
  step "sanitizer-$tool" "sanitizer_$tool.log" timeout "${SANITIZER_TIMEOUT:-280}" compute-sanitizer --tool "$tool" \
    --error-exitcode 9 ./.carry/exactjit_gpu_tests --gtest_filter="${SANITIZER_FILTER:-$filter}"
done
# GTEST_FILTER (googletest reads it) narrows the GPU suite for a short campaign.
[ "${SKIP_SELFTEST:-0}" = 1 ] || step selftest selftest.log ./.carry/exactjit selftest  # also inside the GPU tests
if [ "${TUNE:-0}" = 1 ]; then
  step tune-rms-norm tune_rms_norm.log ./.carry/tune_rms_norm 131072 30
  step tune-gate tune_gate_residual.log ./.carry/tune_gate_residual 131072 30
  cat "$LOGS/tune_rms_norm.log" "$LOGS/tune_gate_residual.log"
fi
step parity parity.log python3 tests/gpu/parity_torch.py --report "$OUT/parity.md" --json "$LOGS/parity.json"
[ "${SKIP_GRAD:-0}" = 1 ] || step grad grad.log timeout "${GRAD_TIMEOUT:-300}" python3 tests/gpu/grad_torch.py \
  --report "$OUT/grad.md" --json "$LOGS/grad.json"
[ "${SKIP_DET_LINEAR:-0}" = 1 ] || step det-linear det_linear.log timeout 300 python3 tests/gpu/det_linear_torch.py \
  --report "$OUT/det_linear.md" --json "$LOGS/det_linear.json"
# exactjit bench: forward, forward + backward, det_linear vs cuBLAS, plots (the issue-6 command).
[ "${SKIP_BENCH:-0}" = 1 ] || step bench bench.log ./.carry/exactjit bench --bench-dir "$PWD/bench" --out "$OUT/bench"
# PROFILE=1: Nsight Compute on the 18H AdaLN projection at T = 3, the bulk-copy kernel and (a
# runtime compiling compute_80) the register kernel; the summary lines go to $OUT/profile.txt.
if [ "${PROFILE:-0}" = 1 ]; then
  for variant in bulk register; do
    arch=""; [ "$variant" = register ] && arch=compute_80
    step "ncu-$variant" "ncu_$variant.log" env EXACTJIT_ARCH="$arch" timeout 150 ncu --clock-control none \
      -k regex:det_linear_bf16_k2688_n96768 -c 1 --section SpeedOfLight --section MemoryWorkloadAnalysis \
      --section WarpStateStats --section LaunchStats --section Occupancy \
      --metrics dram__bytes_read.sum,lts__t_sector_hit_rate.pct \
      python3 bench/bench_det_linear.py --rows 3 --reps 1
    { echo "== $variant"; grep -E "Duration|DRAM Throughput|Memory Throughput|dram__bytes|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|L2 Hit|Block Size|Grid Size|Dynamic Shared|Stall" "$LOGS/ncu_$variant.log"; } >>"$OUT/profile.txt"
  done
  cat "$OUT/profile.txt"
fi
# PROFILE_TILES=1: Nsight Compute on the backward's tile kernels at a small and a mid S (where
# the planner picks one column a thread and where it picks quads); summary lines to
# $OUT/profile_tiles.txt.
if [ "${PROFILE_TILES:-0}" = 1 ]; then
  step ncu-tiles ncu_tiles.log timeout 300 ncu --clock-control none \
    -k 'regex:rms_norm_(table|weight)_grad|gate_residual_backward' -c 32 --section SpeedOfLight \
    --section WarpStateStats --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
    python3 bench/profile_backward_kernels.py --sizes 4097,16384 --steps 1
  grep -E "^  [a-z_]+_bf16.*\(|Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Theoretical Occupancy|Warp Cycles Per Issued|Grid Size" \
    "$LOGS/ncu_tiles.log" >"$OUT/profile_tiles.txt"
fi
# The PyTorch integration: operators (opcheck, torch.compile, CUDA graphs), host cost, diffusers'
# MiniMax-H3 patched (bitwise forward, gradients against fp64, compiled), the end-to-end benchmark.
step python-cpu python_cpu.log python3 tests/python/test_ops_cpu.py
step python-extension python_extension.log python3 tests/python/test_extension_cpu.py
step python-integration python_integration.log python3 tests/python/test_integration_cpu.py
step ops ops.log python3 tests/gpu/ops_torch.py --report "$OUT/ops.md" --json "$LOGS/ops.json"
# The README-level example: one DiT block, bitwise forward, repeatable autograd, one CUDA graph.
step dit-block dit_block.log python3 examples/dit_block.py
# The same checks on the ctypes path (a build without libexactjit_torch.so); report in the logs.
step ops-ctypes ops_ctypes.log env EXACTJIT_TORCH_EXTENSION=off python3 tests/gpu/ops_torch.py \
  --groups opcheck,direct,compile,capture,block \
  --report "$LOGS/ops_ctypes.md" --json "$LOGS/ops_ctypes.json"
step host host.log python3 bench/bench_torch_host.py --profile --report "$OUT/host.md" --json "$LOGS/host.json"
step diffusers diffusers.log timeout 400 python3 tests/gpu/diffusers_torch.py --report "$OUT/diffusers.md" \
  --json "$LOGS/diffusers.json"
# Kernel-by-kernel GPU time of the fwd+bwd steps (torch.profiler): where the backward loses time.
step kernels kernels.log python3 bench/profile_backward_kernels.py --report "$OUT/kernels.md"
step e2e e2e.log timeout 500 python3 bench/bench_e2e.py --profile --report "$OUT/e2e.md" --json "$LOGS/e2e.json" \
  --plot "$OUT/e2e.png"
# bench_host needs libexactjit.so.0.1 (its soname: cp -a build/libexactjit.so* .carry/) and
# libbenchmark.so.1debian carried next to it.
[ -x .carry/bench_host ] && step bench-host bench_host.log env LD_LIBRARY_PATH="$PWD/.carry" ./.carry/bench_host \
  --benchmark_filter=Dispatch \
  --benchmark_repetitions=20 --benchmark_enable_random_interleaving=true --benchmark_report_aggregates_only=true
cat "$OUT"/bench/*.md 2>/dev/null
[ -d "$OUT/bench" ] && mv "$OUT/bench" "$LOGS/bench"
tar -C "$OUT" -czf "$OUT/logs.tgz" logs && rm -rf "$LOGS"  # at most 8 files come back
printf '%s\n' "${summary[@]}"
