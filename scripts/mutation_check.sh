#!/usr/bin/env bash
# Mutation check of the cache and validation code: applies one one-line mutation at a time to a
# source file, rebuilds the CPU suites, runs the tests that guard that code (the dispatch suite,
# with the fake driver, whole), and restores the file.
# A mutant the tests do not fail "survives": a rule the suite does not really check. Prints one
# line per mutant and the totals; exits 1 if any mutant survives. Needs a configured build/
# (scripts/setup.sh). Takes about a minute per mutant on two cores.
#
#   scripts/mutation_check.sh [build-dir]
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
filter='*DiskCache*:BoundedInput*:*Validation*:Cli.*:Codegen.*:KernelCache.*:SegmentPlan.*:SpecLimits.*'

# Each mutant is four words: file, text to replace (fixed, must occur exactly once), replacement,
# and what it breaks.
mutants=(
  runtime/disk_cache.cpp '  if (!looks_like_entry(path::filename(directory)) || is_link(directory)) return;'
  '  if (!looks_like_entry(path::filename(directory))) return;' 'discard follows links'
  runtime/disk_cache.cpp '  if (*bytes <= 0) return' '  if (false) return' 'non-positive sizes accepted'
  runtime/disk_cache.cpp '    if (*source != expected->text)' '    if (false)' 'forged kernel.cu accepted'
  runtime/disk_cache.cpp '  if (!expiry_given) policy->Expiration = std::chrono::seconds(0);' '' 'prune adds a default expiry'
  runtime/disk_cache.cpp '        else if (pinned->second != sha256_hex(entry->image))' '        else if (false)'
  'pinned index ignores image hashes'
  runtime/disk_cache.cpp '      if (!looks_like_entry(path::filename(directory))) continue;  // not ours to prune' ''
  'prune deletes folders that are not entries'
  runtime/bounded_input.cpp '      if (stack.size() >= static_cast<size_t>(kMaxJsonDepth))' '      if (false)' 'no JSON depth cap'
  runtime/bounded_input.cpp '        if (!stack.back().keys.insert(key).second)' '        if (false)' 'repeated JSON keys accepted'
  runtime/bounded_input.cpp '  if (st.getSize() > max_bytes)' '  if (false)' 'no size cap'
  runtime/bounded_input.cpp '  return code.category() != exactjit_category() && code != std::errc::no_such_file_or_directory;'
  '  return false;' 'read errors delete entries'
  kernels/tensor_check.cpp '    if (address == 0) return invalid' '    if (false) return invalid' 'null address accepted'
  kernels/tensor_check.cpp '  if (t.dtype.lanes != 1 || t.dtype.bits == 0' '  if (t.dtype.bits == 0' 'lanes unchecked'
  kernels/tensor_check.cpp '      if (other.name != out.name && overlaps' '      if (other.tensor != out.tensor && overlaps'
  'outputs told apart by pointer'
  runtime/device_errors.cpp '  if (auto err = take_pending_at(slot, stream)) return err;' '' \
  "a launch ignores its stream's report"
  runtime/device_errors.cpp '  if (__atomic_load_n(&mirror->claimed, __ATOMIC_ACQUIRE) == 0) return llvm::Error::success();'
  '  if (__atomic_load_n(&mirror->claimed, __ATOMIC_ACQUIRE) == 0 || true) return llvm::Error::success();'
  'reports are never taken'
  runtime/device_errors.cpp '  const int next = static_cast<int>(slots_.size());' '  const int next = 0;' 'every stream shares one record'
  runtime/kernel_cache.cpp '      return make_error(slot->failure.code, slot->failure.message);' ''
  'waiters rebuild a failed build'
  runtime/disk_cache.cpp '          } else if (auto entry = read_entry(directory, key, &*rendered)) {'
  '          } else if (auto entry = read_entry(directory, key)) {' 'verify trusts kernel.cu'
  codegen/kernel_spec.cpp '  if (!have_target || spec.describe() != text) return std::nullopt;'
  '  if (!have_target) return std::nullopt;' 'non-canonical spec text read'
)

killed=0
survived=()
for ((k = 0; k < ${#mutants[@]}; k += 4)); do
  file=${mutants[k]} from=${mutants[k + 1]} to=${mutants[k + 2]} what=${mutants[k + 3]}
  cp "$file" "$file.orig"
  if ! python3 - "$file" "$from" "$to" <<'PY'
import sys
path, old, new = sys.argv[1:4]
text = open(path).read()
if text.count(old) != 1:
    sys.exit(f"mutation text found {text.count(old)} times in {path}: {old!r}")
open(path, "w").write(text.replace(old, new))
PY
  then
    mv "$file.orig" "$file"
    echo "ERROR  $what: the mutation does not apply (the code changed; update this script)"
    exit 2
  fi
  if ninja -C "$build" exactjit_cpu_tests exactjit_dispatch_tests >/dev/null 2>&1 &&
     timeout 600 "$build/tests/exactjit_cpu_tests" --gtest_filter="$filter" >/dev/null 2>&1 &&
     timeout 300 "$build/tests/exactjit_dispatch_tests" >/dev/null 2>&1; then
    survived+=("$what ($file)")
    echo "SURVIVED  $what"
  else
    killed=$((killed + 1))
    echo "killed    $what"
  fi
  mv "$file.orig" "$file"
  touch "$file"
done
ninja -C "$build" exactjit_cpu_tests exactjit_dispatch_tests >/dev/null 2>&1
echo "mutation check: $((${#mutants[@]} / 4)) mutants, $killed killed, ${#survived[@]} survived"
for s in "${survived[@]}"; do echo "  survived: $s"; done
[ ${#survived[@]} -eq 0 ]
