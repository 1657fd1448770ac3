// exactjit host-side costs (Google Benchmark): what a call costs before and around its kernel.
//   - codegen::render and the source key (first use of a spec in a process)
//   - planning the H3 gate_residual call (validation + parameters: every call)
//   - the spec -> function lookup (every call; the hot path's map)
//   - a kernel-cache memory hit, alone and under contention (single flight)
//   - a disk hit: a fresh KernelCache finding the compiled kernel on disk (NVRTC not loaded)
// The dispatch comparison against a bare cuLaunchKernel needs a GPU (tests/gpu, bench campaign).
//
//   bench_host [--benchmark_filter=...] [--benchmark_format=json]
#include "codegen/render.hpp"
#include "kernels/catalog.hpp"
#include "kernels/gate_residual.hpp"
#include "runtime/content_key.hpp"
#include "runtime/kernel_cache.hpp"
#include "tests/support/fake_tensor.hpp"

#include <benchmark/benchmark.h>
#include <dlpack/dlpack.h>
#include <fmt/format.h>
#include <llvm/Support/FileSystem.h>
#include <llvm/Support/Path.h>

#include <cstdlib>
#include <unordered_map>

namespace exactjit {
namespace {

KernelSpec h3_gate_spec() {
  return spec_family(Op::GateResidual, DType::BF16, kDefaultHidden, 6 * kDefaultHidden, Target{90, false}).front();
}

void BM_Render(benchmark::State& state) {
  const KernelSpec spec = h3_gate_spec();
  for (auto _ : state) benchmark::DoNotOptimize(codegen::render(spec));
}
BENCHMARK(BM_Render);

void BM_RenderAndSourceKey(benchmark::State& state) {
  const KernelSpec spec = h3_gate_spec();
  for (auto _ : state) benchmark::DoNotOptimize(source_key(codegen::render(spec)));
}
BENCHMARK(BM_RenderAndSourceKey);

void BM_PlanGateResidual(benchmark::State& state) {
  using test::FakeTensor, test::GiB, test::kBF16, test::kI64;  // planning touches no memory
  const int64_t h = kDefaultHidden, s = 131072;
  FakeTensor residual(1 * GiB, {1, s, h}, kBF16), y(2 * GiB, {1, s, h}, kBF16), out(3 * GiB, {1, s, h}, kBF16);
  FakeTensor gate(4 * GiB + 2 * h * 2, {9, h}, kBF16, {6 * h, 1}), index(5 * GiB, {s}, kI64);
  for (auto _ : state) benchmark::DoNotOptimize(plan_gate_residual({residual.t, gate.t, index.t, y.t, out.t}));
}
BENCHMARK(BM_PlanGateResidual);

void BM_SpecLookup(benchmark::State& state) {
  std::unordered_map<KernelSpec, void*, KernelSpecHash> functions;
  for (const KernelSpec& spec : default_catalog(Target{90, false})) functions.emplace(spec, nullptr);
  const KernelSpec wanted = h3_gate_spec();
  for (auto _ : state) benchmark::DoNotOptimize(functions.find(wanted));
}
BENCHMARK(BM_SpecLookup);

// A writable cache in a fresh temp directory, holding the H3 gate_residual kernel.
std::string prepared_cache() {
  static std::string dir = [] {
    llvm::SmallString<128> path;
    llvm::sys::fs::createUniqueDirectory("exactjit-bench-host", path);
    KernelCache cache(CacheConfig{std::string(path), {}, false}, [](const std::string&) {});
    auto compiled = cache.get(codegen::render(h3_gate_spec()));
    if (!compiled) {
      fmt::print(stderr, "bench_host: {}\n", llvm::toString(compiled.takeError()));
      std::exit(1);
    }
    return std::string(path);
  }();
  return dir;
}

void BM_KernelCacheMemoryHit(benchmark::State& state) {
  static KernelCache* cache = nullptr;
  static KernelSource source;
  if (state.thread_index() == 0) {
    cache = new KernelCache(CacheConfig{prepared_cache(), {}, false}, [](const std::string&) {});
    source = codegen::render(h3_gate_spec());
    (void)cache->get(source);
  }
  for (auto _ : state) {
    auto hit = cache->get(source);
    benchmark::DoNotOptimize(hit);
  }
  if (state.thread_index() == 0) {
    delete cache;
    cache = nullptr;
  }
}
BENCHMARK(BM_KernelCacheMemoryHit)->ThreadRange(1, 8)->UseRealTime();

void BM_DiskHitFreshCache(benchmark::State& state) {
  const std::string dir = prepared_cache();
  const KernelSource source = codegen::render(h3_gate_spec());
  for (auto _ : state) {
    KernelCache cache(CacheConfig{dir, {}, true}, [](const std::string&) {});  // offline: a miss would fail
    auto hit = cache.get(source);
    if (!hit || hit->origin != Origin::Disk) state.SkipWithError("not a disk hit");
    benchmark::DoNotOptimize(hit);
  }
}
BENCHMARK(BM_DiskHitFreshCache)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace exactjit

BENCHMARK_MAIN();
