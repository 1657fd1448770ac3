// Disk cache faults: every corrupt, truncated or missing piece of an entry is a reported miss that
// gets rebuilt; read-only layers are searched first and never written; offline misses name the
// spec and the prewarm command; an unwritable cache still yields a working kernel; prune and clear
// touch only what they should.
#include "codegen/render.hpp"
#include "kernels/catalog.hpp"
#include "runtime/disk_cache.hpp"
#include "runtime/errors.hpp"
#include "runtime/kernel_cache.hpp"
#include "support/test_support.hpp"

#include <llvm/Support/FileSystem.h>

namespace exactjit {
namespace {

KernelSource bf16_source(int64_t stride = 6 * kDefaultHidden) {
  return codegen::render(spec_family(Op::GateResidual, DType::BF16, kDefaultHidden, stride, Target{90, false}).front());
}

CacheConfig writable(const std::string& dir) {
  CacheConfig config;
  config.writable_dir = dir;
  return config;
}

struct Collected {
  std::vector<std::string> problems;
  std::function<void(const std::string&)> sink() {
    return [this](const std::string& p) { problems.push_back(p); };
  }
};

// Builds one entry in `dir` and returns its folder.
std::string publish_one(const std::string& dir, const KernelSource& source = bf16_source()) {
  KernelCache cache(writable(dir));
  auto lookup = test::expect_value(cache.get(source));
  EXPECT_EQ(lookup.origin, Origin::Compiled);
  return lookup.kernel ? lookup.kernel->directory : std::string();
}

CacheLookup get_with(const CacheConfig& config, Collected& collected, const KernelSource& source = bf16_source()) {
  KernelCache cache(config, collected.sink());
  return test::expect_value(cache.get(source));
}

TEST(DiskCache, MissPublishesThenHitsFromDiskAndMemory) {
  test::TempDir dir;
  const std::string folder = publish_one(dir.path());
  ASSERT_FALSE(folder.empty());
  for (const char* file : {"manifest.json", "kernel.cu", "kernel.cubin"})
    EXPECT_TRUE(llvm::sys::fs::exists(folder + "/" + file)) << file;
  EXPECT_EQ(test::read_text(folder + "/kernel.cu"), bf16_source().text);

  KernelCache cache(writable(dir.path()));
  EXPECT_EQ(test::expect_value(cache.get(bf16_source())).origin, Origin::Disk);
  EXPECT_EQ(test::expect_value(cache.get(bf16_source())).origin, Origin::Memory);
}

TEST(DiskCache, ManifestRecordsProvenance) {
  test::TempDir dir;
  const std::string manifest = test::read_text(publish_one(dir.path()) + "/manifest.json");
  for (const char* field : {"\"format\": \"exactjit-cache-1\"", "\"spec\": \"gate_residual dtype=bf16", "\"options\"",
                            "--fmad=false", "\"compiler_tag\": \"nvrtc-", "\"target\": \"sm_90\"", "\"driver_seen\"",
                            "\"image_sha256\"", "\"source_sha256\"", "\"image_bytes\"", "\"created\"", "\"entry\""})
    EXPECT_NE(manifest.find(field), std::string::npos) << field << " in\n" << manifest;
}

struct Fault {
  const char* name;
  const char* file;
  std::function<void(const std::string& path)> apply;
  const char* expect;
};

class DiskCacheFault : public ::testing::TestWithParam<Fault> {};

TEST_P(DiskCacheFault, IsReportedAndRebuilt) {
  const Fault& fault = GetParam();
  test::TempDir dir;
  const std::string folder = publish_one(dir.path());
  fault.apply(folder + "/" + fault.file);

  Collected collected;
  const CacheLookup lookup = get_with(writable(dir.path()), collected);
  EXPECT_EQ(lookup.origin, Origin::Compiled);
  ASSERT_EQ(collected.problems.size(), 1u);
  EXPECT_NE(collected.problems[0].find(fault.expect), std::string::npos) << collected.problems[0];
  EXPECT_NE(collected.problems[0].find("rebuilding"), std::string::npos);
  // The rebuilt entry verifies, and is the only one.
  const std::vector<EntryStatus> entries = DiskCache(writable(dir.path())).scan(true);
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_TRUE(entries[0].problem.empty()) << entries[0].problem;
}

INSTANTIATE_TEST_SUITE_P(
    Faults, DiskCacheFault,
    ::testing::Values(
        Fault{"FlippedCubinByte", "kernel.cubin",
              [](const std::string& p) { std::string s = test::read_text(p); s[s.size() / 2] ^= 0x40; test::write_text(p, s); },
              "does not match its SHA-256"},
        Fault{"TruncatedCubin", "kernel.cubin",
              [](const std::string& p) { std::string s = test::read_text(p); test::write_text(p, s.substr(0, s.size() / 3)); },
              "truncated"},
        Fault{"EmptyCubin", "kernel.cubin", [](const std::string& p) { test::write_text(p, ""); }, "truncated"},
        Fault{"MissingCubin", "kernel.cubin", [](const std::string& p) { llvm::sys::fs::remove(p); }, "cannot read"},
        Fault{"GarbageManifest", "manifest.json", [](const std::string& p) { test::write_text(p, "{not json"); },
              "not valid JSON"},
        Fault{"TruncatedManifest", "manifest.json",
              [](const std::string& p) { std::string s = test::read_text(p); test::write_text(p, s.substr(0, 40)); },
              "not valid JSON"},
        Fault{"EditedSource", "kernel.cu",
              [](const std::string& p) { test::write_text(p, test::read_text(p) + "// tampered\n"); }, "kernel.cu"}),
    [](const ::testing::TestParamInfo<Fault>& param) { return std::string(param.param.name); });

TEST(DiskCache, ReadOnlyLayerIsSearchedFirstAndNeverWritten) {
  test::TempDir shipped, local;
  publish_one(shipped.path());
  test::run_command("/bin/chmod", {"-R", "a-w", shipped.path()});
  CacheConfig config = writable(local.path());
  config.read_only_dirs = {shipped.path()};
  Collected collected;
  const CacheLookup lookup = get_with(config, collected);
  EXPECT_EQ(lookup.origin, Origin::Disk);
  EXPECT_EQ(lookup.kernel->directory.rfind(shipped.path(), 0), 0u);
  EXPECT_TRUE(collected.problems.empty());
  EXPECT_TRUE(DiskCache(writable(local.path())).scan(false).empty());
}

TEST(DiskCache, BadEntryInReadOnlyLayerIsSkippedAndBuiltLocally) {
  test::TempDir shipped, local;
  const std::string folder = publish_one(shipped.path());
  test::write_text(folder + "/kernel.cubin", "garbage");
  CacheConfig config = writable(local.path());
  config.read_only_dirs = {shipped.path()};
  Collected collected;
  const CacheLookup lookup = get_with(config, collected);
  EXPECT_EQ(lookup.origin, Origin::Compiled);
  ASSERT_EQ(collected.problems.size(), 1u);
  EXPECT_NE(collected.problems[0].find("read-only layer; skipped"), std::string::npos) << collected.problems[0];
  EXPECT_TRUE(llvm::sys::fs::exists(folder + "/kernel.cubin"));  // untouched
  EXPECT_EQ(lookup.kernel->directory.rfind(local.path(), 0), 0u);
}

TEST(DiskCache, OfflineMissNamesSpecAndPrewarmCommand) {
  test::TempDir dir;
  CacheConfig config = writable(dir.path());
  config.offline = true;
  KernelCache cache(config);
  auto lookup = cache.get(bf16_source());
  ASSERT_FALSE(static_cast<bool>(lookup));
  const ErrorReport report = take_error(lookup.takeError());
  EXPECT_EQ(report.code, ErrorCode::OfflineMiss);
  EXPECT_NE(report.message.find(bf16_source().spec.describe()), std::string::npos) << report.message;
  EXPECT_NE(report.message.find("exactjit prewarm --op gate_residual --hidden 5376 --dtype bf16 --table-stride 32256 "
                                "--arch sm_90"),
            std::string::npos)
      << report.message;
}

TEST(DiskCache, OfflineHitFromShippedLayer) {
  test::TempDir shipped, local;
  publish_one(shipped.path());
  CacheConfig config = writable(local.path());
  config.read_only_dirs = {shipped.path()};
  config.offline = true;
  Collected collected;
  EXPECT_EQ(get_with(config, collected).origin, Origin::Disk);
}

TEST(DiskCache, UnwritableCacheStillYieldsTheKernel) {
  test::TempDir dir;
  test::write_text(dir / "a-file", "x");
  Collected collected;
  const CacheLookup lookup = get_with(writable(dir / "a-file/cache"), collected);
  EXPECT_EQ(lookup.origin, Origin::Compiled);
  ASSERT_TRUE(lookup.kernel);
  EXPECT_FALSE(lookup.kernel->image.empty());
  ASSERT_EQ(collected.problems.size(), 1u);
  EXPECT_NE(collected.problems[0].find("could not cache"), std::string::npos) << collected.problems[0];
}

TEST(DiskCache, PruneBySizeAndAgeAndPolicyErrors) {
  test::TempDir dir;
  publish_one(dir.path(), bf16_source(6 * kDefaultHidden));
  publish_one(dir.path(), bf16_source(2 * kDefaultHidden));
  const DiskCache cache(writable(dir.path()));
  auto kept = test::expect_value(cache.prune("prune_after=1h"));
  EXPECT_EQ(kept.removed_entries, 0u);
  EXPECT_EQ(cache.scan(false).size(), 2u);
  auto pruned = test::expect_value(cache.prune("cache_size_bytes=1"));
  EXPECT_EQ(pruned.removed_entries, 2u);
  EXPECT_TRUE(cache.scan(false).empty());
  auto bad = cache.prune("prune_after=yesterday");
  ASSERT_FALSE(static_cast<bool>(bad));
  EXPECT_EQ(take_error(bad.takeError()).code, ErrorCode::InvalidArgument);
}

TEST(DiskCache, VirtualTargetEntriesHoldPtx) {
  test::TempDir dir;
  const KernelSource ptx_source = codegen::render(
      spec_family(Op::GateResidual, DType::BF16, kDefaultHidden, 6 * kDefaultHidden, Target{90, true}).front());
  const std::string folder = publish_one(dir.path(), ptx_source);
  EXPECT_TRUE(llvm::sys::fs::exists(folder + "/kernel.ptx"));
  EXPECT_FALSE(llvm::sys::fs::exists(folder + "/kernel.cubin"));
  KernelCache cache(writable(dir.path()));
  const CacheLookup lookup = test::expect_value(cache.get(ptx_source));
  EXPECT_EQ(lookup.origin, Origin::Disk);
  EXPECT_TRUE(lookup.kernel->is_ptx);
  EXPECT_NE(lookup.kernel->image.find(".target sm_90"), std::string::npos);
  // The real-target kernel of the same spec is a different entry.
  EXPECT_EQ(test::expect_value(cache.get(bf16_source())).origin, Origin::Compiled);
}

TEST(DiskCache, ClearRemovesOnlyOurFolder) {
  test::TempDir dir;
  publish_one(dir.path());
  test::write_text(dir / "someone-elses-file", "keep me");
  ASSERT_FALSE(static_cast<bool>(DiskCache(writable(dir.path())).clear()));
  EXPECT_FALSE(llvm::sys::fs::exists(dir / kCacheFormatDir));
  EXPECT_TRUE(llvm::sys::fs::exists(dir / "someone-elses-file"));
}

}  // namespace
}  // namespace exactjit
