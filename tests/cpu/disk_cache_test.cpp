// Disk cache faults: every corrupt, truncated or missing piece of an entry is a reported miss that
// gets rebuilt; read-only layers are searched first and never written; offline misses name the
// spec and the prewarm command; an unwritable cache still yields a working kernel; prune and clear
// touch only what they should.
#include "codegen/digest.hpp"
#include "codegen/render.hpp"
#include "kernels/catalog.hpp"
#include "runtime/disk_cache.hpp"
#include "runtime/errors.hpp"
#include "runtime/kernel_cache.hpp"
#include "support/test_support.hpp"

#include "runtime/bounded_input.hpp"
#include "runtime/content_key.hpp"
#include "kernels/gate_residual.hpp"

#include <llvm/Support/FileSystem.h>
#include <llvm/Support/Path.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <chrono>
#include <random>
#include <regex>

namespace exactjit {
namespace {

KernelSource bf16_source(int64_t stride = 6 * kDefaultHidden) {
  return codegen::render(
      spec_family(Op::GateResidual, rows_sizes(DType::BF16, kDefaultHidden, stride), Target{90, false}).front());
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
              [](const std::string& p) {
                std::string s = test::read_text(p);
                s[s.size() / 2] ^= 0x40;
                test::write_text(p, s);
              },
              "does not match its SHA-256"},
        Fault{"TruncatedCubin", "kernel.cubin",
              [](const std::string& p) {
                std::string s = test::read_text(p);
                test::write_text(p, s.substr(0, s.size() / 3));
              },
              "truncated"},
        Fault{"EmptyCubin", "kernel.cubin", [](const std::string& p) { test::write_text(p, ""); }, "truncated"},
        Fault{"MissingCubin", "kernel.cubin", [](const std::string& p) { llvm::sys::fs::remove(p); }, "cannot read"},
        Fault{"GarbageManifest", "manifest.json", [](const std::string& p) { test::write_text(p, "{not json"); },
              "not valid JSON"},
        Fault{"TruncatedManifest", "manifest.json",
              [](const std::string& p) { std::string s = test::read_text(p); test::write_text(p, s.substr(0, 40)); },
              "not valid JSON"},
        Fault{"EditedSource", "kernel.cu",
              [](const std::string& p) { test::write_text(p, test::read_text(p) + "// tampered\n"); }, "kernel.cu"},
        // Untrusted files: parsed with bounds, never trusted to be sane.
        Fault{"DeeplyNestedManifest", "manifest.json",
              [](const std::string& p) { test::write_text(p, std::string(200000, '[') + std::string(200000, ']')); },
              "nests deeper than 64"},
        Fault{"DuplicateManifestKey", "manifest.json",
              [](const std::string& p) {
                std::string s = test::read_text(p);
                test::write_text(p, "{\"entry\": \"evil\"," + s.substr(s.find('{') + 1));
              },
              "repeats the key \"entry\""},
        Fault{"NegativeImageBytes", "manifest.json",
              [](const std::string& p) {
                test::write_text(p, std::regex_replace(test::read_text(p), std::regex("\"image_bytes\": [0-9]+"),
                                                       "\"image_bytes\": -1"));
              },
              "image_bytes is -1; it must be positive"},
        Fault{"HugeSparseCubin", "kernel.cubin",
              [](const std::string& p) { ASSERT_EQ(::truncate(p.c_str(), int64_t{4} << 30), 0); },
              "more than the 268435456 allowed"},
        // A writer of the layer replaces kernel.cu and its hashes together: still not the spec's source.
        Fault{"ForgedSourceWithMatchingManifest", "kernel.cu",
              [](const std::string& p) {
                test::forge_source(p.substr(0, p.rfind('/')), test::read_text(p) + "// forged\n");
              },
              "differs from the source exactjit renders"},
        Fault{"ForgedEntryPoint", "manifest.json",
              [](const std::string& p) {
                test::write_text(p, std::regex_replace(test::read_text(p), std::regex("\"entry\": \"[^\"]+\""),
                                                       "\"entry\": \"someone_elses_kernel\""));
              },
              "the spec's is"},
        Fault{"FifoManifest", "manifest.json",
              [](const std::string& p) { llvm::sys::fs::remove(p); ASSERT_EQ(::mkfifo(p.c_str(), 0644), 0); },
              "not a regular file"}),
    [](const ::testing::TestParamInfo<Fault>& param) { return std::string(param.param.name); });

TEST(DiskCache, ReadOnlyLayerIsSearchedFirstAndNeverWritten) {
  test::TempDir shipped, local;
  const std::string shipped_manifest = test::read_text(publish_one(shipped.path()) + "/manifest.json");
  // The writable layer holds a valid entry of the same kernel too: searching it first would pick
  // that one (with an empty local layer, the order could not be told).
  publish_one(local.path());
  CacheConfig config = writable(local.path());
  config.read_only_dirs = {shipped.path()};
  Collected collected;
  const CacheLookup lookup = get_with(config, collected);
  EXPECT_EQ(lookup.origin, Origin::Disk);
  EXPECT_EQ(lookup.kernel->directory.rfind(shipped.path(), 0), 0u) << lookup.kernel->directory;
  EXPECT_TRUE(collected.problems.empty());
  // Never written: as root chmod cannot prove it, so compare the shipped entry's bytes.
  EXPECT_EQ(test::read_text(lookup.kernel->directory + "/manifest.json"), shipped_manifest);
  EXPECT_EQ(DiskCache(writable(local.path())).scan(false).size(), 1u);
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
      spec_family(Op::GateResidual, rows_sizes(DType::BF16, kDefaultHidden, 6 * kDefaultHidden), Target{90, true})
          .front());
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

TEST(DiskCache, EntriesAreReadableByOthersWhereTheUmaskAllows) {
  const mode_t umask_was = ::umask(022);
  test::TempDir dir;
  const std::string entry = publish_one(dir.path());
  ::umask(umask_was);
  const std::string key_folder(llvm::sys::path::parent_path(entry));
  for (const std::string& path : {std::string(dir / kCacheFormatDir), key_folder, entry, entry + "/kernel.cubin"}) {
    llvm::sys::fs::file_status st;
    ASSERT_FALSE(llvm::sys::fs::status(path, st)) << path;
    EXPECT_TRUE(st.permissions() & llvm::sys::fs::others_read) << path;  // 0750 hid it from other users
  }
}

TEST(DiskCache, PublishThatLosesTheRaceUsesTheWinnerAndLeavesNoTemporary) {
  // Processes racing through prewarm never reach this path (the build lock serialises them), so
  // it is driven here directly: a second publish of the same content finds the winner's entry.
  test::TempDir dir;
  const KernelSource source = bf16_source();
  const std::string key = source_key(source);
  const Nvrtc* nvrtc = test::expect_value(Nvrtc::get());
  const CompileOutput output = test::expect_value(nvrtc->compile(source));
  const DiskCache cache(writable(dir.path()));
  const DiskEntry winner = test::expect_value(cache.publish(source, key, nvrtc->identity(), output, "none"));
  const std::string winner_manifest = test::read_text(winner.directory + "/manifest.json");
  const DiskEntry loser = test::expect_value(cache.publish(source, key, nvrtc->identity(), output, "none"));
  EXPECT_EQ(loser.directory, winner.directory);
  EXPECT_EQ(test::read_text(winner.directory + "/manifest.json"), winner_manifest);  // the winner's, untouched
  std::error_code ec;
  for (llvm::sys::fs::recursive_directory_iterator it(dir.path(), ec), end; it != end && !ec; it.increment(ec))
    EXPECT_EQ(it->path().find("/.tmp-"), std::string::npos) << it->path();
}

TEST(DiskCache, StaleLockOfAnotherHostIsBrokenAndPruned) {
  test::TempDir dir;
  const std::string key = source_key(bf16_source());
  const std::string folder = dir / (std::string(kCacheFormatDir) + "/" + key);
  llvm::sys::fs::create_directories(folder);
  // LockFileManager waits out a lock of another host (it cannot tell whether that process lives):
  // 120 s per kernel, every time, before this change.
  const std::string lock = folder + "/build.lock";
  test::write_text(lock, "some-other-host 4242");
  const auto hour_ago = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now() - std::chrono::hours(2));
  const timeval times[2] = {{hour_ago, 0}, {hour_ago, 0}};
  ASSERT_EQ(::utimes(lock.c_str(), times), 0);
  const auto start = std::chrono::steady_clock::now();
  Collected collected;
  EXPECT_EQ(get_with(writable(dir.path()), collected).origin, Origin::Compiled);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60));
  ASSERT_FALSE(collected.problems.empty());
  EXPECT_NE(collected.problems[0].find("stale build lock"), std::string::npos) << collected.problems[0];
  // A lock file nobody released is pruned once it is an hour old.
  test::write_text(lock, "some-other-host 4242");
  ASSERT_EQ(::utimes(lock.c_str(), times), 0);
  EXPECT_TRUE(static_cast<bool>(DiskCache(writable(dir.path())).prune("prune_after=1000h")));
  EXPECT_FALSE(llvm::sys::fs::exists(lock));
}

std::string pin(const std::string& layer, const std::string& index_file) {
  std::vector<std::pair<std::string, std::string>> listed;
  for (const EntryStatus& e : DiskCache(writable(layer)).scan(true)) {
    const std::string folder(llvm::sys::path::filename(e.directory));
    const std::string key(llvm::sys::path::filename(llvm::sys::path::parent_path(e.directory)));
    listed.emplace_back(key + "/" + folder, e.image_sha256);
  }
  test::write_text(index_file, format_layer_index(listed));
  return index_file;
}

TEST(DiskCachePinnedIndex, OnlyListedImagesOfReadOnlyLayersAreServed) {
  test::TempDir shipped, local, outside;
  const std::string entry = publish_one(shipped.path());
  CacheConfig config = writable(local.path());
  config.read_only_dirs = {shipped.path()};
  config.pinned_index = pin(shipped.path(), outside / "layer.index");
  {
    Collected collected;
    EXPECT_EQ(get_with(config, collected).origin, Origin::Disk);
    EXPECT_TRUE(collected.problems.empty());
  }
  // A forged image with a matching manifest: accepted without the pin, refused with it.
  test::forge_image(entry,
                    test::read_text(publish_one(outside.path(), bf16_source(2 * kDefaultHidden)) + "/kernel.cubin"));
  CacheConfig unpinned = config;
  unpinned.pinned_index.clear();
  unpinned.writable_dir.clear();
  {
    Collected collected;
    EXPECT_EQ(get_with(unpinned, collected).origin, Origin::Disk);  // the hole the pin closes
  }
  {
    Collected collected;
    const CacheLookup lookup = get_with(config, collected);
    EXPECT_EQ(lookup.origin, Origin::Compiled);
    ASSERT_FALSE(collected.problems.empty());
    EXPECT_NE(collected.problems[0].find("its image differs from the pinned index"), std::string::npos)
        << collected.problems[0];
  }
  // An entry the index does not list, and an index that does not load, are refused too.
  test::write_text(outside / "empty.index", std::string(kLayerIndexFormat) + "\n");
  config.pinned_index = outside / "empty.index";
  config.writable_dir.clear();
  config.offline = true;
  Collected unlisted;
  KernelCache cache(config, unlisted.sink());
  EXPECT_EQ(take_error(cache.get(bf16_source()).takeError()).code, ErrorCode::OfflineMiss);
  ASSERT_FALSE(unlisted.problems.empty());
  EXPECT_NE(unlisted.problems[0].find("not listed in the pinned index"), std::string::npos) << unlisted.problems[0];
  test::write_text(outside / "bad.index", "exactjit-cache-index-1\nno-slash 1234\n");
  config.pinned_index = outside / "bad.index";
  Collected unusable;
  KernelCache bad(config, unusable.sink());
  EXPECT_FALSE(static_cast<bool>(bad.get(bf16_source())));
  ASSERT_FALSE(unusable.problems.empty());
  EXPECT_NE(unusable.problems[0].find("bad.index line 2"), std::string::npos) << unusable.problems[0];
}

TEST(DiskCache, ReadOnlyLayerAnyoneMayWriteIsReportedOrRefused) {
  test::TempDir shipped, local;
  publish_one(shipped.path());
  ASSERT_FALSE(llvm::sys::fs::setPermissions(shipped / kCacheFormatDir, llvm::sys::fs::all_all));  // 0777
  CacheConfig config = writable(local.path());
  config.read_only_dirs = {shipped.path()};
  {
    Collected collected;  // warn (the default): used, reported once per cache
    KernelCache cache(config, collected.sink());
    EXPECT_EQ(test::expect_value(cache.get(bf16_source())).origin, Origin::Disk);
    EXPECT_EQ(test::expect_value(cache.get(bf16_source(2 * kDefaultHidden))).origin, Origin::Compiled);
    ASSERT_EQ(collected.problems.size(), 1u);
    EXPECT_NE(collected.problems[0].find("writable by every user"), std::string::npos) << collected.problems[0];
    EXPECT_NE(collected.problems[0].find("used anyway"), std::string::npos);
  }
  config.layer_check = CacheConfig::LayerCheck::Refuse;
  {
    Collected collected;
    EXPECT_EQ(get_with(config, collected).origin, Origin::Compiled);
    ASSERT_FALSE(collected.problems.empty());
    EXPECT_NE(collected.problems[0].find("skipped"), std::string::npos) << collected.problems[0];
  }
  config.layer_check = CacheConfig::LayerCheck::Off;
  {
    Collected collected;
    const CacheLookup lookup = get_with(config, collected);
    EXPECT_EQ(lookup.origin, Origin::Disk);
    EXPECT_EQ(lookup.kernel->directory.rfind(shipped.path(), 0), 0u) << lookup.kernel->directory;
    EXPECT_TRUE(collected.problems.empty());
  }
}

// A seeded fuzz of everything read from a layer, bounded so it runs in every CI: a real manifest
// mutated (bytes flipped, brackets and quotes inserted, lines repeated, cut short), and random
// bytes as a layer index and as JSON. Every read either verifies or reports; none crashes.
TEST(DiskCacheFuzz, MutatedManifestsAndIndexesAreReportedNeverFatal) {
  test::TempDir dir;
  const std::string entry = publish_one(dir.path());
  const std::string manifest = test::read_text(entry + "/manifest.json");
  const KernelSource source = bf16_source();
  const std::string key = source_key(source);
  std::mt19937_64 rng(20261203);
  int verified = 0;
  for (int i = 0; i < 400; ++i) {
    std::string m = manifest;
    for (int edits = 1 + static_cast<int>(rng() % 4); edits > 0; --edits) {
      const size_t at = rng() % (m.size() + 1);
      switch (rng() % 6) {
        case 0: if (!m.empty()) m[at % m.size()] ^= static_cast<char>(1 << (rng() % 8)); break;
        case 1: m.insert(at, std::string(1 + rng() % 200, "[{\"]},:"[rng() % 7])); break;
        case 2: m.resize(at); break;
        case 3: {
          const size_t line = m.find('\n', at);
          if (line != std::string::npos) m.insert(line, m.substr(at, line - at));
        } break;
        case 4: m.insert(at, "\"image_bytes\": " + std::to_string(static_cast<int64_t>(rng()))); break;
        case 5: m.insert(at, "\"entry\": \"x\","); break;
      }
    }
    test::write_text(entry + "/manifest.json", m);
    auto read = read_entry(entry, key, &source);
    if (read) {
      ++verified;
    } else {
      EXPECT_FALSE(llvm::toString(read.takeError()).empty()) << i;
    }
  }
  test::write_text(entry + "/manifest.json", manifest);
  EXPECT_TRUE(static_cast<bool>(read_entry(entry, key, &source)));
  EXPECT_LT(verified, 400);  // mutations that leave a valid manifest exist (inside the log text), but few
  for (int i = 0; i < 400; ++i) {
    std::string bytes(rng() % 300, '\0');
    for (char& c : bytes) c = "exactjit-cache-index-1 /0123456789abcdef\n{}[]\",:"[rng() % 44];
    if (i % 2) bytes = std::string(kLayerIndexFormat) + "\n" + bytes;
    test::write_text(dir / "fuzz.index", bytes);
    auto index = read_layer_index(dir / "fuzz.index");
    if (!index) {
      EXPECT_EQ(take_error(index.takeError()).code, ErrorCode::Io);
    }
    auto json = parse_bounded_json(bytes, "fuzz");
    if (!json) {
      EXPECT_EQ(take_error(json.takeError()).code, ErrorCode::Io);
    }
  }
}

// A folder outside the cache that a link inside it points to: nothing in it may be deleted.
struct Victim {
  test::TempDir dir;
  Victim() {
    test::write_text(dir / "precious.txt", "keep me");
    llvm::sys::fs::create_directories(dir / "nvrtc-13.0-0123456789abcdef");  // named like an entry
    test::write_text(dir / "nvrtc-13.0-0123456789abcdef/manifest.json", "{not json");
  }
  bool intact() const {
    return llvm::sys::fs::exists(dir / "precious.txt") &&
           llvm::sys::fs::exists(dir / "nvrtc-13.0-0123456789abcdef/manifest.json");
  }
};

TEST(DiskCacheLinks, LinkedKeyFolderIsNeverFollowedNorItsTargetDeleted) {
  test::TempDir dir;
  const std::string entry = publish_one(dir.path());
  const std::string key_folder(llvm::sys::path::parent_path(entry));
  Victim victim;
  ASSERT_FALSE(llvm::sys::fs::remove_directories(key_folder));
  ASSERT_FALSE(llvm::sys::fs::create_link(victim.dir.path(), key_folder));

  Collected collected;
  const CacheLookup lookup = get_with(writable(dir.path()), collected);
  EXPECT_EQ(lookup.origin, Origin::Compiled);
  ASSERT_FALSE(collected.problems.empty());
  EXPECT_NE(collected.problems[0].find("symbolic link"), std::string::npos) << collected.problems[0];
  const DiskCache cache(writable(dir.path()));
  EXPECT_TRUE(static_cast<bool>(cache.prune("cache_size_bytes=1")));
  EXPECT_TRUE(cache.scan(true).empty());  // the link is not an entry of the writable layer
  EXPECT_TRUE(victim.intact());
  ASSERT_FALSE(static_cast<bool>(cache.clear()));
  EXPECT_TRUE(victim.intact());
}

TEST(DiskCacheLinks, LinkedFormatFolderIsRefusedByPruneAndClear) {
  test::TempDir dir;
  Victim victim;
  ASSERT_FALSE(llvm::sys::fs::create_link(victim.dir.path(), dir / kCacheFormatDir));
  const DiskCache cache(writable(dir.path()));
  auto pruned = cache.prune("cache_size_bytes=1");
  ASSERT_FALSE(static_cast<bool>(pruned));
  EXPECT_NE(take_error(pruned.takeError()).message.find("symbolic link"), std::string::npos);
  auto cleared = cache.clear();
  ASSERT_TRUE(static_cast<bool>(cleared));
  EXPECT_NE(take_error(std::move(cleared)).message.find("symbolic link"), std::string::npos);
  Collected collected;
  EXPECT_EQ(get_with(writable(dir.path()), collected).origin, Origin::Compiled);  // not cached through it
  EXPECT_TRUE(victim.intact());
}

TEST(DiskCache, FoldersThatAreNotEntriesAreLeftAlone) {
  test::TempDir dir;
  const std::string entry = publish_one(dir.path());
  const std::string notes = std::string(llvm::sys::path::parent_path(entry)) + "/notes";
  llvm::sys::fs::create_directories(notes);
  test::write_text(notes + "/todo.txt", "mine");
  Collected collected;
  EXPECT_EQ(get_with(writable(dir.path()), collected).origin, Origin::Disk);
  const DiskCache cache(writable(dir.path()));
  EXPECT_EQ(test::expect_value(cache.prune("cache_size_bytes=1")).removed_entries, 1u);
  EXPECT_TRUE(llvm::sys::fs::exists(notes + "/todo.txt"));
}

TEST(DiskCache, PruneAppliesExactlyThePolicyGiven) {
  test::TempDir dir;
  const std::string entry = publish_one(dir.path());
  // Last used a month ago: LLVM's policy parser would add a one-week expiry nobody asked for.
  const auto month_ago = std::chrono::system_clock::now() - std::chrono::hours(24 * 30);
  const timeval times[2] = {{std::chrono::system_clock::to_time_t(month_ago), 0},
                            {std::chrono::system_clock::to_time_t(month_ago), 0}};
  ASSERT_EQ(::utimes(entry.c_str(), times), 0);
  const DiskCache cache(writable(dir.path()));
  EXPECT_EQ(test::expect_value(cache.prune("cache_size_bytes=10g")).removed_entries, 0u);
  EXPECT_EQ(test::expect_value(cache.prune("prune_after=168h")).removed_entries, 1u);
  for (const char* policy : {"cache_size=1%", "prune_interval=1h", "cache_size_bytes=1:prune_interval=1h"}) {
    auto bad = cache.prune(policy);
    ASSERT_FALSE(static_cast<bool>(bad)) << policy;
    const ErrorReport report = take_error(bad.takeError());
    EXPECT_EQ(report.code, ErrorCode::InvalidArgument) << policy;
    EXPECT_NE(report.message.find("not supported"), std::string::npos) << report.message;
  }
}

TEST(BoundedInput, ReadErrorsAreToldFromBadFiles) {
  EXPECT_TRUE(is_transient_read_error(std::make_error_code(std::errc::permission_denied)));
  EXPECT_TRUE(is_transient_read_error(std::make_error_code(std::errc::too_many_files_open)));
  EXPECT_FALSE(is_transient_read_error(std::make_error_code(std::errc::no_such_file_or_directory)));
  EXPECT_FALSE(is_transient_read_error(make_error_code(ErrorCode::Io)));
  test::TempDir dir;
  auto folder = read_bounded_file(dir.path(), 100);
  ASSERT_FALSE(static_cast<bool>(folder));
  const ErrorReport report = take_error(folder.takeError());
  EXPECT_EQ(report.code, ErrorCode::Io);
  EXPECT_NE(report.message.find("not a regular file"), std::string::npos);
  test::write_text(dir / "ten", "0123456789");
  EXPECT_EQ(test::expect_value(read_bounded_file(dir / "ten", 10)), "0123456789");
  EXPECT_FALSE(static_cast<bool>(read_bounded_file(dir / "ten", 9)));
}

}  // namespace
}  // namespace exactjit
