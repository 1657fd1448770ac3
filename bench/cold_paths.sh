#!/usr/bin/env bash
# exactjit cold paths, each timed as whole processes on this machine (no GPU needed):
#   1. first compile of every default-catalog kernel (`exactjit prewarm -j 1` into an empty cache;
#      the per-kernel times it prints), median per op;
#   2. the whole catalog pre-warmed with -j 1 and -j 2;
#   3. a fresh process that finds its kernel on disk (build/tests/exactjit_cache_probe): time to
#      ready (kernel image in memory) and whether NVRTC was loaded, over 20 processes.
# Writes a markdown report to stdout.   bench/cold_paths.sh [build-dir]
set -euo pipefail
build="${1:-build}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
unset EXACTJIT_CACHE_PATH EXACTJIT_OFFLINE
commit="$(git rev-parse HEAD 2>/dev/null || echo unknown)"

echo "# exactjit cold paths"
echo
echo "- commit: $commit"
echo "- machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "- nvrtc: $("$build/exactjit" info 2>/dev/null | grep -m1 nvrtc | xargs)"
echo

# 1 and 2: -j 1 (per-kernel times), then -j 2 into another empty cache.
"$build/exactjit" prewarm --arch sm_90 --cache-dir "$work/j1" -j 1 >"$work/j1.out" 2>"$work/j1.err"
"$build/exactjit" prewarm --arch sm_90 --cache-dir "$work/j2" -j 2 >"$work/j2.out" 2>"$work/j2.err"
echo "## First compile per catalog kernel (-j 1, ms)"
echo
echo "| op | kernels | median | min | max |"
echo "|---|---|---|---|---|"
sed -n 's/^\[[0-9]*\/[0-9]*\] compiled \([a-z_0-9]*\) .* (\([0-9]*\) ms)$/\1 \2/p' "$work/j1.err" |
  sort -k1,1 -k2,2n | awk '
    { v[$1] = v[$1] " " $2; n[$1]++ }
    END { for (op in n) { split(substr(v[op], 2), a, " "); m = a[int((n[op] + 1) / 2)];
          printf "| %s | %d | %d | %d | %d |\n", op, n[op], m, a[1], a[n[op]] } }' | sort
all=$(sed -n 's/^\[[0-9]*\/[0-9]*\] compiled .* (\([0-9]*\) ms)$/\1/p' "$work/j1.err" | sort -n)
count=$(echo "$all" | wc -l)
echo "| **all** | $count | **$(echo "$all" | sed -n "$(( (count + 1) / 2 ))p")** | $(echo "$all" | head -1) | $(echo "$all" | tail -1) |"
echo
echo "## Whole default catalog"
echo
echo '```'
cat "$work/j1.out" "$work/j2.out"
echo '```'
echo

# 3: fresh processes hitting the disk cache (bf16 and fp32 entries exist now).
echo "## Ready from disk in a fresh process (exactjit_cache_probe, 20 runs)"
echo
echo "| run | origin | NVRTC loaded (flag / mapped) | in-process ms | process wall ms |"
echo "|---|---|---|---|---|"
for i in $(seq 1 20); do
  start=$(date +%s%N)
  line=$(EXACTJIT_CACHE_DIR="$work/j2" EXACTJIT_OFFLINE=1 "$build/tests/exactjit_cache_probe" bf16 32256)
  wall=$(( ($(date +%s%N) - start) / 1000 ))
  set -- $line
  printf '| %d | %s | %s / %s | %s | %d.%03d |\n' "$i" "$2" "$4" "$6" "$8" $((wall / 1000)) $((wall % 1000))
done
