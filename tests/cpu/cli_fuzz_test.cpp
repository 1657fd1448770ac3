// The exactjit command under random command lines and random manifests: subcommands, flags and
// values drawn from pools that mix the valid with the extreme (huge, negative, overflowing, empty,
// malformed numbers, unknown names), and `prewarm --manifest` files mutated from the corpus in
// tests/fuzz/manifests (deep nesting, duplicate keys, zero/negative/huge sizes, wrong types,
// truncation). NVRTC is pointed at nothing, so an accepted request fails fast instead of
// compiling. Every run exits 0, 1 or 2 (the documented codes) within the time limit, never by a
// signal, and a failure says why on stderr. EXACTJIT_FUZZ_SEED and EXACTJIT_FUZZ_ITERATIONS
// explore more.
#include <gtest/gtest.h>
#include <llvm/Support/FileSystem.h>
#include <llvm/Support/Path.h>

#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "support/test_support.hpp"

namespace exactjit {
namespace {

uint64_t env_or(const char* name, uint64_t fallback) {
  const char* value = std::getenv(name);
  return value && *value ? std::strtoull(value, nullptr, 10) : fallback;
}

template <size_t N>
const char* any(const char* const (&pool)[N], std::mt19937_64& rng) {
  return pool[rng() % N];
}

const char* const kNumbers[] = {"0",
                                "1",
                                "-1",
                                "4",
                                "5376",
                                "32256",
                                "2147483647",
                                "2147483648",
                                "9223372036854775807",
                                "99999999999999999999",
                                "-9223372036854775808",
                                "1e9",
                                "0x10",
                                "",
                                "abc",
                                "3.5"};
const char* const kOps[] = {"gate_residual",
                            "adaln_row_gather",
                            "rms_norm",
                            "timestep_sinusoid",
                            "det_linear",
                            "gate_residual_backward",
                            "rms_norm_backward",
                            "nope",
                            ""};
const char* const kDtypes[] = {"bf16", "fp16", "fp32", "fp8", ""};
const char* const kArchs[] = {"sm_90", "compute_80", "90", "sm_", "sm_99999999999", "compute_-1", "",
                              "sm_80,sm_90", "sm_90,", ","};
const char* const kEmits[] = {"source", "options", "key", "ptx", "sass", "manifest", "binary", ""};
const char* const kPolicies[] = {"cache_size_bytes=10g",
                                 "prune_after=1s",
                                 "cache_size=1%",
                                 "prune_interval=1h",
                                 "cache_size_bytes=-1",
                                 "cache_size_bytes=99999999999999999999g",
                                 "=",
                                 "",
                                 ":::"};
const char* const kFlagsWithValue[] = {
    "--op",         "--hidden",     "--dtype",       "--table-stride", "--arch",     "--manifest",    "-j",
    "--emit",       "--policy",     "--out",         "--device",       "--channels", "--in-features", "--out-features",
    "--activation", "--index-type", "--vector-width"};

/// A random argument list for the exactjit command (never `bench` or `selftest`, which run GPU
/// work and scripts; never an output path outside `scratch`).
std::vector<std::string> random_args(std::mt19937_64& rng, const std::string& scratch,
                                     const std::vector<std::string>& manifests) {
  const char* const commands[] = {"prewarm", "inspect", "cache", "info", "frobnicate", "--help", "--version", ""};
  const char* const cache_commands[] = {"ls", "stat", "verify", "index", "prune", "clear", "rm", ""};
  std::vector<std::string> args{any(commands, rng)};
  if (args[0] == "cache") args.emplace_back(any(cache_commands, rng));
  const int flags = static_cast<int>(rng() % 7);
  for (int k = 0; k < flags; ++k) {
    const std::string flag = rng() % 10 == 0 ? "--" + std::string(any(kOps, rng)) : any(kFlagsWithValue, rng);
    args.push_back(flag);
    if (rng() % 12 == 0) continue;  // a flag missing its value
    if (flag == "--op")
      args.emplace_back(any(kOps, rng));
    else if (flag == "--dtype")
      args.emplace_back(any(kDtypes, rng));
    else if (flag == "--arch")
      args.emplace_back(any(kArchs, rng));
    else if (flag == "--emit")
      args.emplace_back(any(kEmits, rng));
    else if (flag == "--policy")
      args.emplace_back(any(kPolicies, rng));
    else if (flag == "--out")
      args.push_back(scratch + "/out-" + std::to_string(rng() % 4));
    else if (flag == "--manifest")
      args.push_back(manifests.empty() || rng() % 6 == 0 ? "/nonexistent" : manifests[rng() % manifests.size()]);
    else
      args.emplace_back(any(kNumbers, rng));
  }
  if (rng() % 8 == 0) args.emplace_back("--rebuild");
  if (rng() % 6 == 0) args.emplace_back("--check");
  if (rng() % 4 == 0) args.emplace_back("--json");
  return args;
}

/// The corpus, and one mutation of a corpus file written to `dir` per call.
class Manifests {
 public:
  explicit Manifests(std::mt19937_64& rng) : rng_(rng) {
    const std::string corpus = std::string(EXACTJIT_SOURCE_DIR) + "/tests/fuzz/manifests";
    std::error_code ec;
    for (llvm::sys::fs::directory_iterator it(corpus, ec), end; !ec && it != end; it.increment(ec))
      seeds_.push_back(test::read_text(it->path()));
  }
  size_t seeds() const { return seeds_.size(); }

  std::string mutated(const std::string& dir, int k) {
    std::string text = seeds_[rng_() % seeds_.size()];
    const int edits = static_cast<int>(rng_() % 4);
    for (int e = 0; e < edits && !text.empty(); ++e) {
      const size_t at = rng_() % text.size();
      switch (rng_() % 5) {
        case 0:
          text[at] = static_cast<char>(rng_() % 256);
          break;
        case 1:
          text.insert(at, 1, "[]{}\":,0-9e"[rng_() % 11]);
          break;
        case 2:
          text.erase(at, 1 + rng_() % 8);
          break;
        case 3:
          text.insert(at, text.substr(at, rng_() % 64));
          break;  // repeat a stretch
        case 4:
          text.resize(at);
          break;
      }
    }
    const std::string file = dir + "/manifest-" + std::to_string(k) + ".json";
    test::write_text(file, text);
    return file;
  }

 private:
  std::mt19937_64& rng_;
  std::vector<std::string> seeds_;
};

void expect_documented_exit(const test::CommandResult& result, const std::vector<std::string>& args, uint64_t run) {
  std::string line;
  for (const std::string& a : args) line += " '" + a + "'";
  EXPECT_TRUE(result.exit_code == 0 || result.exit_code == 1 || result.exit_code == 2)
      << "run " << run << ": exactjit" << line << " exited " << result.exit_code << " (124: hung; negative: a signal)\n"
      << result.err.substr(0, 2000);
  if (result.exit_code != 0) {
    EXPECT_FALSE(result.err.empty()) << "run " << run << ": exactjit" << line;
  }
}

/// How many runs ended with each exit code, as a test property ("0:12 1:40 2:98").
void record_exits(const std::map<int, int>& exits) {
  std::string text;
  for (const auto& [code, count] : exits)
    text += (text.empty() ? "" : " ") + std::to_string(code) + ":" + std::to_string(count);
  ::testing::Test::RecordProperty("exits", text);
}

std::vector<std::string> fuzz_env(const test::TempDir& cache) {
  return {"EXACTJIT_CACHE_DIR=" + cache.path() + "/cache",
          "EXACTJIT_CACHE_PATH=", "EXACTJIT_OFFLINE=", "EXACTJIT_NVRTC_LIBRARY=/nonexistent/libnvrtc.so",
          "EXACTJIT_CACHE_INDEX="};
}

test::CommandResult run_cli(const std::vector<std::string>& args, const test::TempDir& scratch) {
  std::vector<std::string> command{"60", EXACTJIT_CLI};  // coreutils timeout: a hang exits 124
  command.insert(command.end(), args.begin(), args.end());
  return test::run_command("/usr/bin/timeout", command, fuzz_env(scratch));
}

TEST(CliFuzz, RandomCommandLinesExitWithADocumentedCode) {
  test::TempDir scratch;
  std::mt19937_64 rng(env_or("EXACTJIT_FUZZ_SEED", 20261203));
  Manifests manifests(rng);
  ASSERT_GE(manifests.seeds(), 10u);
  std::vector<std::string> files;
  for (int k = 0; k < 8; ++k) files.push_back(manifests.mutated(scratch.path(), k));
  const uint64_t runs = env_or("EXACTJIT_FUZZ_ITERATIONS", 150);
  std::map<int, int> exits;
  for (uint64_t run = 0; run < runs; ++run) {
    const std::vector<std::string> args = random_args(rng, scratch.path(), files);
    const test::CommandResult result = run_cli(args, scratch);
    expect_documented_exit(result, args, run);
    exits[result.exit_code]++;
  }
  record_exits(exits);
  EXPECT_GT(exits[0], 0);  // some lines are valid (help, info, cache ls) ...
  EXPECT_GT(exits[2], 0);  // ... and many are usage errors
}

TEST(CliFuzz, MutatedManifestsAreRefusedOrPrewarmed) {
  test::TempDir scratch;
  std::mt19937_64 rng(env_or("EXACTJIT_FUZZ_SEED", 20261203) + 1);
  Manifests manifests(rng);
  const uint64_t runs = env_or("EXACTJIT_FUZZ_ITERATIONS", 150) / 2;
  std::map<int, int> exits;
  for (uint64_t run = 0; run < runs; ++run) {
    const std::vector<std::string> args{"prewarm", "--manifest",
                                        manifests.mutated(scratch.path(), static_cast<int>(run)), "--arch", "sm_90"};
    const test::CommandResult result = run_cli(args, scratch);
    expect_documented_exit(result, args, run);
    // NVRTC is absent: a manifest that parses and validates fails to compile (1), never succeeds.
    EXPECT_NE(result.exit_code, 0) << "run " << run << ": " << result.out;
    exits[result.exit_code]++;
  }
  record_exits(exits);
}

}  // namespace
}  // namespace exactjit
