// The exactjit command: every subcommand, its output, its exit codes (0 ok, 1 failed, 2 usage).
#include "codegen/op_row.hpp"
#include "kernels/catalog.hpp"
#include "kernels/gate_residual.hpp"
#include "kernels/op_families.hpp"
#include "runtime/environment.hpp"
#include "support/test_support.hpp"

#include <fmt/format.h>

#include <llvm/Support/FileSystem.h>
#include <llvm/Support/JSON.h>
#include <llvm/Support/Path.h>

#include <algorithm>
#include <regex>
#include <tuple>

namespace exactjit {
namespace {

struct Cli {
  test::TempDir cache;
  std::vector<std::string> env() const {
    return {"EXACTJIT_CACHE_DIR=" + cache.path(), "EXACTJIT_CACHE_PATH=", "EXACTJIT_OFFLINE="};
  }
  test::CommandResult run(const std::vector<std::string>& args, std::vector<std::string> extra = {}) const {
    std::vector<std::string> e = env();
    e.insert(e.end(), extra.begin(), extra.end());
    return test::run_command(EXACTJIT_CLI, args, e);
  }
};

/// The JSON object a --json run printed, after checking the envelope every command shares:
/// format, command and the exit code the process returned.
llvm::json::Object json_of(const test::CommandResult& result, const std::string& command) {
  auto parsed = llvm::json::parse(result.out);
  if (!parsed) {
    ADD_FAILURE() << llvm::toString(parsed.takeError()) << "\n" << result.out;
    return {};
  }
  llvm::json::Object* object = parsed->getAsObject();
  if (!object) {
    ADD_FAILURE() << "not an object: " << result.out;
    return {};
  }
  EXPECT_EQ(object->getString("format"), llvm::Optional<llvm::StringRef>("exactjit-cli-1"));
  EXPECT_EQ(object->getString("command"), llvm::Optional<llvm::StringRef>(command));
  EXPECT_EQ(object->getInteger("exit_code"), llvm::Optional<int64_t>(result.exit_code));
  return std::move(*object);
}

TEST(Cli, HelpAndUsageErrors) {
  Cli cli;
  const auto help = cli.run({"--help"});
  EXPECT_EQ(help.exit_code, 0);
  for (const char* word : {"prewarm", "inspect", "cache", "info", "selftest", "Exit codes"})
    EXPECT_NE(help.out.find(word), std::string::npos) << word;
  const auto sub_help = cli.run({"prewarm", "--help"});
  EXPECT_EQ(sub_help.exit_code, 0);
  EXPECT_NE(sub_help.out.find("--table-stride"), std::string::npos);

  EXPECT_EQ(cli.run({}).exit_code, 2);
  EXPECT_EQ(cli.run({"frobnicate"}).exit_code, 2);
  EXPECT_EQ(cli.run({"prewarm", "--no-such-flag"}).exit_code, 2);
  const auto bad_dtype = cli.run({"prewarm", "--op", "gate_residual", "--dtype", "fp8"});
  EXPECT_EQ(bad_dtype.exit_code, 2);
  EXPECT_NE(bad_dtype.err.find("unknown dtype 'fp8'"), std::string::npos) << bad_dtype.err;
  const auto bad_op = cli.run({"inspect", "--op", "softmax"});
  EXPECT_EQ(bad_op.exit_code, 2);
  EXPECT_NE(bad_op.err.find("unknown op 'softmax'"), std::string::npos);
  const auto bad_stride = cli.run({"prewarm", "--op", "gate_residual", "--hidden", "64", "--table-stride", "32"});
  EXPECT_EQ(bad_stride.exit_code, 2);
  EXPECT_NE(bad_stride.err.find("row stride must be >= H = 64 (got 32)"), std::string::npos) << bad_stride.err;
  EXPECT_EQ(cli.run({"prewarm", "--arch", "banana"}).exit_code, 2);
  EXPECT_EQ(cli.run({"inspect", "--emit", "assembly"}).exit_code, 2);
  EXPECT_EQ(cli.run({"cache", "shred"}).exit_code, 2);
  EXPECT_EQ(cli.run({"cache"}).exit_code, 2);
}

TEST(Cli, PrewarmDefaultCatalogThenEverythingIsCached) {
  Cli cli;
  const size_t n = default_catalog(Target{90, false}).size();
  const auto first = cli.run({"prewarm", "--arch", "sm_90", "-j", "2"});
  ASSERT_EQ(first.exit_code, 0) << first.err;
  EXPECT_TRUE(std::regex_search(
      first.out,
      std::regex(fmt::format("prewarm: {0} kernels: {0} compiled, 0 cached, 0 failed in [0-9.]+ s \\(-j 2\\)", n))))
      << first.out;
  EXPECT_NE(first.err.find(fmt::format("[{0}/{0}]", n)), std::string::npos) << first.err;  // progress
  const auto second = cli.run({"prewarm", "--arch", "sm_90", "--quiet"});
  EXPECT_EQ(second.exit_code, 0);
  EXPECT_NE(second.out.find(fmt::format("{0} kernels: 0 compiled, {0} cached, 0 failed", n)), std::string::npos)
      << second.out;
  EXPECT_TRUE(second.err.empty()) << second.err;
}

TEST(Cli, PrewarmFromManifestFile) {
  Cli cli;
  test::write_text(cli.cache / "specs.json",
                   R"([{"op": "gate_residual", "hidden": 3072, "dtype": "fp32", "arch": "sm_80"},
                       {"op": "gate_residual", "hidden": 64, "dtype": "bf16", "table_stride": 128}])");
  const auto result = cli.run({"prewarm", "--manifest", cli.cache / "specs.json", "--arch", "sm_90", "--quiet"});
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.out.find("8 kernels: 8 compiled"), std::string::npos) << result.out;
  const auto ls = cli.run({"cache", "ls"});
  EXPECT_NE(ls.out.find("hidden=3072 table_stride=18432 vec=4 index=int64 target=sm_80"), std::string::npos) << ls.out;
  EXPECT_NE(ls.out.find("hidden=64 table_stride=128 vec=8 index=int32 target=sm_90"), std::string::npos) << ls.out;
  test::write_text(cli.cache / "bad.json", R"([{"op": "gate_residual", "colour": "blue"}])");
  const auto bad = cli.run({"prewarm", "--manifest", cli.cache / "bad.json"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("unknown or mistyped field 'colour'"), std::string::npos) << bad.err;
}

TEST(Cli, PrewarmManifestIsBoundedAndDeduplicated) {
  Cli cli;
  // A spec listed twice is built once.
  test::write_text(cli.cache / "twice.json",
                   R"([{"op": "gate_residual", "hidden": 64, "dtype": "bf16", "table_stride": 128},
                       {"op": "gate_residual", "hidden": 64, "dtype": "bf16", "table_stride": 128}])");
  const auto twice = cli.run({"prewarm", "--manifest", cli.cache / "twice.json", "--arch", "sm_90", "--quiet"});
  EXPECT_EQ(twice.exit_code, 0) << twice.err;
  EXPECT_NE(twice.out.find("4 kernels: 4 compiled"), std::string::npos) << twice.out;
  // Deep nesting and repeated keys are refused with the file named, not a crash.
  test::write_text(cli.cache / "deep.json", std::string(100000, '[') + std::string(100000, ']'));
  const auto deep = cli.run({"prewarm", "--manifest", cli.cache / "deep.json"});
  EXPECT_EQ(deep.exit_code, 2);
  EXPECT_NE(deep.err.find("deep.json nests deeper than 64 levels"), std::string::npos) << deep.err;
  test::write_text(cli.cache / "repeat.json", R"([{"op": "gate_residual", "op": "rms_norm"}])");
  const auto repeat = cli.run({"prewarm", "--manifest", cli.cache / "repeat.json"});
  EXPECT_EQ(repeat.exit_code, 2);
  EXPECT_NE(repeat.err.find("repeats the key \"op\""), std::string::npos) << repeat.err;
}

// A manifest names every size its op needs: 0 used to read as "absent" and become H3's 5376, a
// missing "op" a gate_residual. Each refusal names the file, the element and the field. NVRTC is
// pointed at nothing, so a manifest that slipped through fails fast (1) instead of compiling.
TEST(Cli, PrewarmManifestSizesArePositiveAndRequired) {
  Cli cli;
  const std::vector<std::pair<const char*, const char*>> cases = {
      {R"([{"op": "gate_residual", "hidden": 0, "table_stride": 32256}])",
       R"(element 0: "hidden" must be a positive integer (got 0))"},
      {R"([{"op": "rms_norm", "hidden": 64}, {"op": "rms_norm", "hidden": -5376}])",
       R"(element 1: "hidden" must be a positive integer (got -5376))"},
      {R"([{"op": "gate_residual", "dtype": "bf16"}])", R"(element 0: gate_residual needs "hidden")"},
      {R"([{"hidden": 64, "dtype": "bf16"}])", R"(element 0: needs "op")"},
      {R"([{"op": "det_linear", "in_features": 256}])", R"(element 0: det_linear needs "out_features")"},
      {R"([{"op": "timestep_sinusoid", "channels": 0}])", R"(element 0: "channels" must be a positive integer)"},
      {R"([{"op": "rms_norm_backward", "hidden": 70000}])",
       "element 0: hidden size H must be in [1, 65536] (got 70000)"},
      {R"([{"op": "rms_norm", "hidden": 64, "in_features": 64}])",
       R"(element 0: "in_features" does not size rms_norm (its sizes: --hidden H)"},
  };
  for (size_t k = 0; k < cases.size(); ++k) {
    const std::string file = cli.cache / fmt::format("sizes-{}.json", k);
    test::write_text(file, cases[k].first);
    const auto result = cli.run({"prewarm", "--manifest", file, "--arch", "sm_90", "--quiet"},
                                {"EXACTJIT_NVRTC_LIBRARY=/nonexistent/libnvrtc.so"});
    EXPECT_EQ(result.exit_code, 2) << cases[k].first << "\n" << result.err;
    EXPECT_NE(result.err.find(fmt::format("manifest {}: {}", file, cases[k].second)), std::string::npos)
        << result.err;
  }
}

// Sizes are capped before the CLI computes with them: `6 * hidden` of a 64-bit H overflowed (undefined
// behaviour; the spec then said table_stride=-9223372036854775808) and H up to 2^31 was accepted.
TEST(Cli, SizeFlagsAreCappedBeforeAnyArithmetic) {
  Cli cli;
  const auto huge = cli.run({"prewarm", "--op", "gate_residual", "--hidden", "4611686018427387904", "--arch", "sm_90"});
  EXPECT_EQ(huge.exit_code, 2);
  EXPECT_NE(huge.err.find("hidden size H must be in [1, 65536] (got 4611686018427387904)"), std::string::npos)
      << huge.err;
  EXPECT_EQ(huge.err.find("table_stride=-"), std::string::npos) << huge.err;
  auto source = [&](const char* op, const char* flag, const char* value) {
    return cli.run({"inspect", "--op", op, flag, value, "--dtype", "fp32", "--arch", "sm_90", "--emit", "source"});
  };
  EXPECT_EQ(source("rms_norm_backward", "--hidden", "65536").exit_code, 0);
  const auto past = source("rms_norm_backward", "--hidden", "65540");
  EXPECT_EQ(past.exit_code, 2);
  EXPECT_NE(past.err.find("hidden size H must be in [1, 65536] (got 65540)"), std::string::npos) << past.err;
  const auto wide = source("det_linear", "--out-features", "2097156");
  EXPECT_EQ(wide.exit_code, 2);
  EXPECT_NE(wide.err.find("out_features N must be in [1, 2097152] (got 2097156)"), std::string::npos) << wide.err;
}

TEST(Cli, PrewarmThatStoresNothingFails) {
  Cli cli;
  test::write_text(cli.cache / "a-file", "x");  // the cache folder cannot be made (even as root)
  const auto result = cli.run({"prewarm", "--op", "gate_residual", "--hidden", "64", "--dtype", "bf16",
                               "--table-stride", "128", "--arch", "sm_90", "--quiet"},
                              {"EXACTJIT_CACHE_DIR=" + (cli.cache / "a-file/cache")});
  EXPECT_EQ(result.exit_code, 1) << result.out << result.err;
  EXPECT_NE(result.out.find("0 compiled, 0 cached, 4 failed"), std::string::npos) << result.out;
  EXPECT_NE(result.err.find("compiled but not stored"), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("could not cache"), std::string::npos) << result.err;
}

// prewarm --check, and plain prewarm under EXACTJIT_OFFLINE: nothing compiles (NVRTC points at
// nothing, so a compile would fail, not miss), every missing kernel is named, exit 1; once the
// layers hold them all, exit 0 (also from a shipped layer, read-only).
TEST(Cli, PrewarmCheckNamesEveryMissingKernelAndCompilesNothing) {
  Cli cli;
  const std::vector<std::string> family = {"prewarm", "--op", "gate_residual", "--hidden", "64", "--dtype", "bf16",
                                           "--table-stride", "128", "--arch", "sm_90"};
  const std::vector<std::string> no_nvrtc = {"EXACTJIT_NVRTC_LIBRARY=/nonexistent/libnvrtc.so"};
  auto with = [&](std::vector<std::string> args, const std::vector<std::string>& more) {
    args.insert(args.end(), more.begin(), more.end());
    return args;
  };
  for (const auto& [args, env] : {std::pair{with(family, {"--check"}), no_nvrtc},
                                  std::pair{family, with(no_nvrtc, {"EXACTJIT_OFFLINE=1"})}}) {
    const auto missing = cli.run(args, env);
    EXPECT_EQ(missing.exit_code, 1) << missing.err;
    EXPECT_EQ(std::count(missing.out.begin(), missing.out.end(), '\n'), 5) << missing.out;  // 4 named + summary
    EXPECT_NE(missing.out.find("missing gate_residual dtype=bf16 hidden=64 table_stride=128 vec=8 index=int32 "
                               "target=sm_90\n"),
              std::string::npos)
        << missing.out;
    EXPECT_NE(missing.out.find("check: 4 kernels: 0 present, 4 missing, 0 failed"), std::string::npos) << missing.out;
    EXPECT_TRUE(cli.run({"cache", "ls"}).out.empty());  // nothing was compiled
  }
  ASSERT_EQ(cli.run(with(family, {"--quiet"})).exit_code, 0);
  const auto present = cli.run(with(family, {"--check"}), no_nvrtc);
  EXPECT_EQ(present.exit_code, 0) << present.out << present.err;
  EXPECT_NE(present.out.find("check: 4 kernels: 4 present, 0 missing"), std::string::npos) << present.out;
  const auto shipped = test::run_command(
      EXACTJIT_CLI, family, {"EXACTJIT_CACHE_DIR=", "EXACTJIT_CACHE_PATH=" + cli.cache.path(), "EXACTJIT_OFFLINE=on"});
  EXPECT_EQ(shipped.exit_code, 0) << shipped.out << shipped.err;
  EXPECT_NE(shipped.out.find("4 present, 0 missing"), std::string::npos) << shipped.out;
  // One more target in the list: its kernels are the missing ones.
  const auto two = cli.run({"prewarm", "--op", "gate_residual", "--hidden", "64", "--dtype", "bf16",
                            "--table-stride", "128", "--arch", "sm_90,sm_80", "--check"});
  EXPECT_EQ(two.exit_code, 1);
  EXPECT_NE(two.out.find("check: 8 kernels: 4 present, 4 missing"), std::string::npos) << two.out;
  EXPECT_EQ(two.out.find("target=sm_90\n"), std::string::npos) << two.out;
}

// --arch takes a list: each target is built, each once; a bad element is named; inspect takes one.
TEST(Cli, ArchListBuildsEveryTarget) {
  Cli cli;
  const auto built = cli.run({"prewarm", "--op", "gate_residual", "--hidden", "64", "--dtype", "bf16",
                              "--table-stride", "128", "--arch", "sm_80,sm_90,90", "--quiet"});
  EXPECT_EQ(built.exit_code, 0) << built.err;
  EXPECT_NE(built.out.find("8 kernels: 8 compiled"), std::string::npos) << built.out;
  const auto ls = cli.run({"cache", "ls"}).out;
  EXPECT_EQ(std::count(ls.begin(), ls.end(), '\n'), 8) << ls;
  EXPECT_NE(ls.find("target=sm_80"), std::string::npos);
  EXPECT_NE(ls.find("target=sm_90"), std::string::npos);
  const auto bad = cli.run({"prewarm", "--arch", "sm_90,banana"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("bad --arch 'banana'"), std::string::npos) << bad.err;
  const auto inspect = cli.run({"inspect", "--op", "rms_norm", "--arch", "sm_80,sm_90"});
  EXPECT_EQ(inspect.exit_code, 2);
  EXPECT_NE(inspect.err.find("give --arch one target"), std::string::npos) << inspect.err;
}

// A spec list (what EXACTJIT_RECORD_MANIFEST writes) is a prewarm manifest: exactly its specs are
// built, checked, and with --arch rebuilt for other targets; a bad line is named.
TEST(Cli, PrewarmTakesARecordedSpecList) {
  Cli cli;
  const std::vector<KernelSpec> family =
      spec_family(Op::GateResidual, rows_sizes(DType::BF16, 64, 128), Target{90, false});
  const std::string list = cli.cache / "used.specs";
  test::write_text(list, fmt::format("exactjit-spec-list-1\n{0}\n{1}\n{0}\n", family[0].describe(),
                                     family[2].describe()));
  const auto before = cli.run({"prewarm", "--manifest", list, "--check"});
  EXPECT_EQ(before.exit_code, 1);
  EXPECT_NE(before.out.find("check: 2 kernels: 0 present, 2 missing"), std::string::npos) << before.out;
  const auto built = cli.run({"prewarm", "--manifest", list, "--quiet"});
  EXPECT_EQ(built.exit_code, 0) << built.err;
  EXPECT_NE(built.out.find("2 kernels: 2 compiled"), std::string::npos) << built.out;
  EXPECT_EQ(cli.run({"prewarm", "--manifest", list, "--check"}).exit_code, 0);
  const auto retargeted = cli.run({"prewarm", "--manifest", list, "--arch", "sm_80,sm_90", "--quiet"});
  EXPECT_NE(retargeted.out.find("4 kernels: 2 compiled, 2 cached"), std::string::npos) << retargeted.out;

  test::write_text(list, fmt::format("exactjit-spec-list-1\n{}\ngate_residual hidden=64\n", family[0].describe()));
  const auto bad = cli.run({"prewarm", "--manifest", list});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("manifest " + list + ": line 3 is not a kernel spec exactjit writes"), std::string::npos)
      << bad.err;
  test::write_text(list, "exactjit-spec-list-1\ngate_residual dtype=bf16 hidden=70000 table_stride=70000 vec=1 "
                         "index=int64 target=sm_90\n");
  const auto huge = cli.run({"prewarm", "--manifest", list});
  EXPECT_EQ(huge.exit_code, 2);
  EXPECT_NE(huge.err.find("hidden size H must be in [1, 65536] (got 70000)"), std::string::npos) << huge.err;
}

TEST(Cli, InspectEmitsEveryView) {
  Cli cli;
  const std::vector<std::string> spec = {"inspect", "--op", "gate_residual", "--hidden", "5376", "--dtype", "bf16",
                                         "--table-stride", "32256", "--arch", "sm_90"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = spec;
    args.insert(args.end(), extra.begin(), extra.end());
    return cli.run(args);
  };
  const auto source = with({"--emit", "source"});
  EXPECT_EQ(source.exit_code, 0);
  EXPECT_NE(source.out.find("constexpr int kHidden = 5376;"), std::string::npos);
  EXPECT_NE(source.out.find("#define XJ_ENTRY gate_residual_bf16_h5376_ts32256_v8_i64_sm90_"), std::string::npos);
  const auto scalar = with({"--vec", "1", "--index-type", "int32"});
  EXPECT_NE(scalar.out.find("#define XJ_ENTRY gate_residual_bf16_h5376_ts32256_v1_i32_sm90_"), std::string::npos);
  const auto options = with({"--emit", "options"});
  EXPECT_EQ(options.out,
            "--gpu-architecture=sm_90\n--std=c++17\n--fmad=false\n--prec-div=true\n--prec-sqrt=true\n--ftz=false\n");
  const auto key = with({"--emit", "key"});
  EXPECT_EQ(key.exit_code, 0);
  EXPECT_TRUE(std::regex_search(key.out, std::regex("source key:  [0-9a-f]{64}\n"
                                                    "compiler:    nvrtc-[0-9.]+-[0-9a-f]{8}\n"
                                                    "content key: [0-9a-f]{64}")))
      << key.out;
  const auto ptx = with({"--emit", "ptx"});
  EXPECT_EQ(ptx.exit_code, 0);
  EXPECT_NE(ptx.out.find(".entry gate_residual_bf16_h5376_ts32256_v8_i64_sm90_"), std::string::npos);
  const auto manifest = with({"--emit", "manifest"});
  EXPECT_EQ(manifest.exit_code, 0) << manifest.err;
  EXPECT_NE(manifest.out.find("\"format\": \"exactjit-cache-1\""), std::string::npos);
  const auto bad_vec = with({"--vec", "3"});
  EXPECT_EQ(bad_vec.exit_code, 2);
}

// The bf16 det_linear backward's partials and weight grad are compiled per row tile: --rows T
// picks the one a call of T rows runs (default 3, the catalog's); the fold has one.
// --unweighted reaches the rms_norm backward kernels too (their describe() names no weight).
TEST(Cli, InspectPicksTheUnweightedRmsNormBackwardKernels) {
  Cli cli;
  for (const char* op : {"rms_norm", "rms_norm_backward", "rms_norm_table_grad"})
    for (bool unweighted : {false, true}) {
      std::vector<std::string> args = {"inspect", "--op", op, "--dtype", "bf16", "--hidden", "5376",
                                       "--arch", "sm_90", "--emit", "source"};
      if (unweighted) args.push_back("--unweighted");
      const auto result = cli.run(args);
      EXPECT_EQ(result.exit_code, 0) << op << ": " << result.err;
      EXPECT_NE(result.out.find(fmt::format("constexpr bool kWeighted = {};", !unweighted)), std::string::npos)
          << op << " unweighted=" << unweighted;
    }
}

// A size flag or manifest field the op's shape does not take is refused, naming it and the op's
// sizes; it used to be ignored (or, for det_linear's backward, read as K or N).
TEST(Cli, RefusesSizesTheOpDoesNotTake) {
  Cli cli;
  const auto linear = cli.run({"inspect", "--op", "det_linear_input_grad", "--hidden", "2688", "--emit", "key"});
  EXPECT_EQ(linear.exit_code, 2);
  EXPECT_NE(
      linear.err.find("--hidden does not size det_linear_input_grad (its sizes: --in-features K --out-features N"),
      std::string::npos)
      << linear.err;
  const auto sinusoid = cli.run({"inspect", "--op", "timestep_sinusoid", "--table-stride", "8", "--emit", "key"});
  EXPECT_EQ(sinusoid.exit_code, 2);
  EXPECT_NE(sinusoid.err.find("--table-stride does not size timestep_sinusoid (its sizes: --channels C)"),
            std::string::npos)
      << sinusoid.err;
  EXPECT_EQ(cli.run({"inspect", "--op", "gate_residual", "--channels", "256", "--emit", "key"}).exit_code, 2);
  EXPECT_EQ(cli.run({"inspect", "--op", "timestep_sinusoid", "--channels", "256", "--emit", "key"}).exit_code, 0);
}

TEST(Cli, InspectPicksTheDetLinearBackwardRowTile) {
  Cli cli;
  auto source = [&](const char* op, std::vector<std::string> extra) {
    std::vector<std::string> args = {"inspect", "--op", op, "--dtype", "bf16", "--in-features", "2688",
                                     "--out-features", "10752", "--arch", "sm_90", "--emit", "source"};
    args.insert(args.end(), extra.begin(), extra.end());
    return cli.run(args);
  };
  // The input pass has a tile for T = 3 (the default rows); the weight grad takes 4 there.
  for (const auto& [rows, tile, weight_tile] :
       {std::tuple{"", 3, 4}, {"1", 1, 1}, {"2", 2, 2}, {"3", 3, 4}, {"5", 8, 8}, {"8", 8, 8}}) {
    const std::vector<std::string> flags =
        *rows ? std::vector<std::string>{"--rows", rows} : std::vector<std::string>{};
    const auto result = source("det_linear_input_grad", flags);
    EXPECT_EQ(result.exit_code, 0) << result.err;
    EXPECT_NE(result.out.find(fmt::format("constexpr int kRowTile = {};", tile)), std::string::npos) << rows;
    const auto weight = source("det_linear_weight_grad", flags);
    EXPECT_EQ(weight.exit_code, 0) << weight.err;
    EXPECT_NE(weight.out.find(fmt::format("constexpr int kRowTile = {};", weight_tile)), std::string::npos) << rows;
  }
  const auto fold = source("det_linear_input_fold", {"--rows", "1"});
  EXPECT_EQ(fold.exit_code, 0) << fold.err;
  EXPECT_NE(fold.out.find("constexpr int kRowTile = 8;"), std::string::npos);
  const auto too_many = source("det_linear_weight_grad", {"--rows", "9"});
  EXPECT_EQ(too_many.exit_code, 2);
  EXPECT_NE(too_many.err.find("--rows: rows T must be in [1, 8] (got 9)"), std::string::npos) << too_many.err;
  EXPECT_NE(cli.run({"inspect", "--help"}).out.find("--rows"), std::string::npos);
  // --activation picks the backward kernels' SiLU variant as it does the forward's.
  for (const auto& [activation, silu] : {std::pair{"silu", true}, {"none", false}}) {
    const auto grad = source("det_linear_weight_grad", {"--activation", activation});
    EXPECT_EQ(grad.exit_code, 0) << grad.err;
    EXPECT_NE(grad.out.find(fmt::format("constexpr bool kSilu = {};", silu)), std::string::npos) << activation;
  }
  EXPECT_EQ(source("det_linear_weight_grad", {"--activation", "gelu"}).exit_code, 2);
}

// The det_linear backward kernels are sized like the forward: --in-features/--out-features, with
// the H3 AdaLN projection (2688 -> 18 x 5376) as the default.
TEST(Cli, DetLinearBackwardTakesTheForwardsSizeFlags) {
  Cli cli;
  auto spec_line = [&](std::vector<std::string> sizes) {
    std::vector<std::string> args = {"inspect", "--op", "det_linear_weight_grad", "--dtype", "bf16", "--arch", "sm_90",
                                     "--emit", "source"};
    args.insert(args.end(), sizes.begin(), sizes.end());
    const auto result = cli.run(args);
    EXPECT_EQ(result.exit_code, 0) << result.err;
    return result.out.substr(0, result.out.find('\n', result.out.find("// spec:")));
  };
  EXPECT_NE(spec_line({"--in-features", "1152", "--out-features", "6912"}).find("in_features=1152 out_features=6912"),
            std::string::npos);
  EXPECT_NE(spec_line({}).find("in_features=2688 out_features=96768"), std::string::npos);
  const auto fp16 = cli.run({"inspect", "--op", "det_linear_input_grad", "--dtype", "fp16", "--emit", "key"});
  EXPECT_EQ(fp16.exit_code, 2);
  EXPECT_NE(fp16.err.find("bf16 or fp32"), std::string::npos) << fp16.err;
}

TEST(Cli, CacheVerifyRebuildProvesEachImageComesFromItsSource) {
  Cli cli;
  ASSERT_EQ(cli.run({"prewarm", "--op", "gate_residual", "--hidden", "64", "--dtype", "bf16", "--table-stride", "128",
                     "--arch", "sm_90", "--quiet"}).exit_code, 0);
  // NVRTC is deterministic for one build: every fresh entry rebuilds to the same bytes.
  const auto clean = cli.run({"cache", "verify", "--rebuild"});
  EXPECT_EQ(clean.exit_code, 0) << clean.out << clean.err;
  EXPECT_NE(clean.out.find("verify --rebuild: 4 entries, 0 bad"), std::string::npos) << clean.out;

  // Swap one entry's cubin for another's, hashes and sizes updated: the manifest check passes,
  // the rebuild does not.
  std::vector<std::string> cubins;
  std::error_code ec;
  for (llvm::sys::fs::recursive_directory_iterator it(cli.cache.path(), ec), end; it != end && !ec; it.increment(ec))
    if (llvm::sys::path::filename(it->path()) == "kernel.cubin") cubins.push_back(it->path());
  ASSERT_EQ(cubins.size(), 4u);
  test::forge_image(std::string(llvm::sys::path::parent_path(cubins[0])), test::read_text(cubins[1]));
  EXPECT_EQ(cli.run({"cache", "verify"}).exit_code, 0);
  const auto forged = cli.run({"cache", "verify", "--rebuild"});
  EXPECT_EQ(forged.exit_code, 1) << forged.out;
  EXPECT_NE(forged.out.find("rebuilt image differs from the stored one"), std::string::npos) << forged.out;
  EXPECT_NE(forged.out.find("4 entries, 1 bad"), std::string::npos) << forged.out;
  EXPECT_EQ(cli.run({"cache", "ls", "--rebuild"}).exit_code, 2);
}

// The forgery the manifest cannot catch: kernel.cu replaced and the manifest's source hash and size
// rewritten to match. verify renders the manifest's spec and compares, as a lookup does.
TEST(Cli, CacheVerifyComparesKernelCuWithTheRenderedSource) {
  Cli cli;
  ASSERT_EQ(cli.run({"prewarm", "--op", "gate_residual", "--hidden", "64", "--dtype", "bf16", "--table-stride", "128",
                     "--arch", "sm_90", "--quiet"}).exit_code, 0);
  EXPECT_EQ(cli.run({"cache", "verify"}).exit_code, 0);
  std::string source_file;
  std::error_code ec;
  for (llvm::sys::fs::recursive_directory_iterator it(cli.cache.path(), ec), end; it != end && !ec; it.increment(ec))
    if (llvm::sys::path::filename(it->path()) == "kernel.cu") source_file = it->path();
  ASSERT_FALSE(source_file.empty());
  test::forge_source(std::string(llvm::sys::path::parent_path(source_file)),
                     test::read_text(source_file) + "\n// one more line\n");
  const auto verify = cli.run({"cache", "verify"});
  EXPECT_EQ(verify.exit_code, 1) << verify.out;
  EXPECT_NE(verify.out.find("kernel.cu differs from the source exactjit renders"), std::string::npos) << verify.out;
  EXPECT_NE(verify.out.find("4 entries, 1 bad"), std::string::npos) << verify.out;
}

TEST(Cli, CacheIndexPinsTheLayerAndTheRuntimeHonoursIt) {
  Cli cli;
  ASSERT_EQ(cli.run({"prewarm", "--op", "gate_residual", "--hidden", "64", "--dtype", "bf16", "--table-stride", "128",
                     "--arch", "sm_90", "--quiet"}).exit_code, 0);
  test::TempDir outside;
  const auto written = cli.run({"cache", "index", "--out", outside / "layer.index"});
  EXPECT_EQ(written.exit_code, 0) << written.err;
  EXPECT_NE(written.err.find("index: 4 entries"), std::string::npos) << written.err;
  const std::string index = test::read_text(outside / "layer.index");
  EXPECT_EQ(index.rfind("exactjit-cache-index-1\n", 0), 0u) << index;
  EXPECT_EQ(std::count(index.begin(), index.end(), '\n'), 5);
  EXPECT_EQ(cli.run({"cache", "index"}).out, index);  // standard output by default
  // The shipped layer, pinned, offline: served.
  const std::vector<std::string> shipped = {"EXACTJIT_CACHE_DIR=", "EXACTJIT_CACHE_PATH=" + cli.cache.path(),
                                            "EXACTJIT_OFFLINE=1", "EXACTJIT_CACHE_INDEX=" + (outside / "layer.index")};
  const std::vector<std::string> spec = {"--op", "gate_residual", "--hidden", "64", "--dtype", "bf16",
                                         "--table-stride", "128", "--arch", "sm_90"};
  std::vector<std::string> inspect = {"inspect", "--emit", "manifest"};
  inspect.insert(inspect.end(), spec.begin(), spec.end());
  const auto served = test::run_command(EXACTJIT_CLI, inspect, shipped);
  EXPECT_EQ(served.exit_code, 0) << served.err;
  // A bad entry: no index is written.
  std::string any_cubin;
  std::error_code ec;
  for (llvm::sys::fs::recursive_directory_iterator it(cli.cache.path(), ec), end; it != end && !ec; it.increment(ec))
    if (llvm::sys::path::filename(it->path()) == "kernel.cubin") any_cubin = it->path();
  test::write_text(any_cubin, "garbage");
  const auto refused = cli.run({"cache", "index", "--out", outside / "second.index"});
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_FALSE(llvm::sys::fs::exists(outside / "second.index"));
}

TEST(Cli, CacheSubcommands) {
  Cli cli;
  ASSERT_EQ(
      cli.run({"prewarm", "--op", "gate_residual", "--dtype", "fp16", "--arch", "sm_90", "--quiet"}).exit_code, 0);
  const auto ls = cli.run({"cache", "ls"});
  EXPECT_EQ(ls.exit_code, 0);
  EXPECT_EQ(std::count(ls.out.begin(), ls.out.end(), '\n'), 4) << ls.out;
  const auto stat = cli.run({"cache", "stat"});
  EXPECT_NE(stat.out.find("(4 entries"), std::string::npos) << stat.out;
  EXPECT_EQ(cli.run({"cache", "verify"}).exit_code, 0);

  // Corrupt one cubin: verify names it and fails; the next prewarm rebuilds it and reports it.
  std::string cubin;
  std::error_code ec;
  for (llvm::sys::fs::recursive_directory_iterator it(cli.cache.path(), ec), end; it != end && !ec; it.increment(ec))
    if (llvm::StringRef(it->path()).endswith("kernel.cubin")) cubin = it->path();
  ASSERT_FALSE(cubin.empty());
  test::write_text(cubin, "not an ELF");
  const auto verify = cli.run({"cache", "verify"});
  EXPECT_EQ(verify.exit_code, 1);
  EXPECT_NE(verify.out.find("BAD"), std::string::npos);
  EXPECT_NE(verify.out.find("verify: 4 entries, 1 bad"), std::string::npos) << verify.out;
  const auto rebuild = cli.run({"prewarm", "--op", "gate_residual", "--dtype", "fp16", "--arch", "sm_90", "--quiet"});
  EXPECT_EQ(rebuild.exit_code, 0);
  EXPECT_NE(rebuild.out.find("1 compiled, 3 cached"), std::string::npos) << rebuild.out;
  EXPECT_NE(rebuild.err.find("bad cache entry"), std::string::npos) << rebuild.err;
  EXPECT_EQ(cli.run({"cache", "verify"}).exit_code, 0);

  const auto prune = cli.run({"cache", "prune", "--policy", "cache_size_bytes=1"});
  EXPECT_EQ(prune.exit_code, 0);
  EXPECT_NE(prune.out.find("prune: removed 4 entries"), std::string::npos) << prune.out;
  EXPECT_EQ(cli.run({"cache", "prune", "--policy", "nonsense"}).exit_code, 2);
  const auto clear = cli.run({"cache", "clear"});
  EXPECT_EQ(clear.exit_code, 0);
  EXPECT_NE(clear.out.find("clear: removed"), std::string::npos);
}

// The top-level help is generated from the op-family and environment tables: every kernel name
// --op accepts and every variable, with its kind.
TEST(Cli, HelpListsEveryOpFamilyAndEveryEnvironmentVariable) {
  Cli cli;
  const std::string help = cli.run({"--help"}).out;
  size_t kernels = 0;
  for (const OpFamily& family : op_families()) {
    EXPECT_NE(help.find(std::string(family.name)), std::string::npos) << family.name;
    std::string listed;
    for (OpCode op : family.kernels) listed += (listed.empty() ? "[" : " ") + std::string(op_name(op));
    EXPECT_NE(help.find(listed + "] "), std::string::npos) << listed;
    kernels += family.kernels.size();
  }
  EXPECT_EQ(kernels, op_table().size());  // every op is in a family
  for (const EnvironmentVariable& variable : environment_variables()) {
    const size_t at = help.find(std::string(variable.name) + " ");
    ASSERT_NE(at, std::string::npos) << variable.name;
    const std::string line = help.substr(at, help.find('\n', at) - at);
    EXPECT_NE(line.find(describe_kind(variable)), std::string::npos) << line;
  }
  EXPECT_NE(help.find("EXACTJIT_RECORD_MANIFEST"), std::string::npos);
  EXPECT_NE(help.find("EXACTJIT_CHECK_AFTER_LAUNCH  boolean"), std::string::npos) << help;
}

// One parser for every boolean variable: the CLI refuses a malformed one with exit 2, naming it
// and the accepted values, before any command runs; every spelling of off is off.
TEST(Cli, MalformedEnvironmentVariablesAreUsageErrors) {
  Cli cli;
  for (const char* variable : {"EXACTJIT_OFFLINE", "EXACTJIT_CHECK_AFTER_LAUNCH"}) {
    const auto result = cli.run({"cache", "stat"}, {std::string(variable) + "=maybe"});
    EXPECT_EQ(result.exit_code, 2) << variable;
    EXPECT_NE(result.err.find(std::string(variable) + "='maybe' is not valid: use 1/0, true/false, yes/no, on/off"),
              std::string::npos)
        << result.err;
  }
  for (const char* off : {"0", "false", "No", "OFF"})
    EXPECT_NE(cli.run({"cache", "stat"}, {std::string("EXACTJIT_OFFLINE=") + off}).out.find("offline: no"),
              std::string::npos)
        << off;
  for (const char* on : {"1", "TRUE", "yes", "on"})
    EXPECT_NE(cli.run({"cache", "stat"}, {std::string("EXACTJIT_OFFLINE=") + on}).out.find("offline: yes"),
              std::string::npos)
        << on;
  const auto layer = cli.run({"info"}, {"EXACTJIT_CACHE_LAYER_CHECK=loud"});
  EXPECT_EQ(layer.exit_code, 2);
  EXPECT_NE(layer.err.find("EXACTJIT_CACHE_LAYER_CHECK='loud' is not valid: use one of warn|refuse|off"),
            std::string::npos)
      << layer.err;
}

// Policy keys prune does not enforce are refused (exit 2, the key named), never silently ignored.
TEST(Cli, PrunePolicyKeysThatAreNotEnforcedAreRefused) {
  Cli cli;
  for (const char* key : {"cache_size", "prune_interval", "max_files"}) {
    const auto result = cli.run({"cache", "prune", "--policy", std::string(key) + "=1h"});
    EXPECT_EQ(result.exit_code, 2) << key;
    EXPECT_NE(result.err.find(fmt::format("key '{}' is not supported", key)), std::string::npos) << result.err;
  }
  const auto percent = cli.run({"cache", "prune", "--policy", "prune_after=1h:cache_size=1%", "--json"});
  EXPECT_EQ(percent.exit_code, 2);
  const llvm::json::Object json = json_of(percent, "cache prune");
  EXPECT_NE(json.getString("error").getValueOr("").find("key 'cache_size'"), std::string::npos) << percent.out;
  EXPECT_EQ(cli.run({"cache", "prune", "--policy", "prune_after=1h:cache_size_bytes=1g:cache_size_files=9"}).exit_code,
            0);
}

// --json: one object per run, in the documented schema (docs/cli-json.md), with the exit codes of
// the text output.
TEST(Cli, JsonOutputOfEveryCommand) {
  Cli cli;
  const auto info = cli.run({"info", "--json"}, {"EXACTJIT_CACHE_PATH=/opt/shipped", "EXACTJIT_OFFLINE=no"});
  EXPECT_EQ(info.exit_code, 0);
  llvm::json::Object i = json_of(info, "info");
  EXPECT_EQ(i.getString("version"), llvm::Optional<llvm::StringRef>(EXACTJIT_VERSION));
  ASSERT_TRUE(i.getObject("nvrtc") && i.getObject("driver") && i.getObject("cache"));
  EXPECT_EQ(i.getObject("nvrtc")->getBoolean("available"), llvm::Optional<bool>(true));
  EXPECT_NE(i.getObject("nvrtc")->getArray("archs"), nullptr);
  EXPECT_TRUE(i.getObject("driver")->getBoolean("available").hasValue());
  const llvm::json::Object& cache = *i.getObject("cache");
  EXPECT_EQ(cache.getString("writable"), llvm::Optional<llvm::StringRef>(cli.cache.path()));
  EXPECT_EQ((*cache.getArray("read_only"))[0].getAsString(), llvm::Optional<llvm::StringRef>("/opt/shipped"));
  EXPECT_EQ(cache.getBoolean("offline"), llvm::Optional<bool>(false));
  EXPECT_EQ(cache.get("pinned_index")->kind(), llvm::json::Value::Null);

  const std::vector<std::string> family = {"prewarm", "--op", "gate_residual", "--hidden", "64", "--dtype", "fp16",
                                           "--table-stride", "128", "--arch", "sm_90", "--json"};
  auto check_args = family;
  check_args.push_back("--check");
  const auto missing = cli.run(check_args);
  EXPECT_EQ(missing.exit_code, 1);
  llvm::json::Object m = json_of(missing, "prewarm");
  EXPECT_EQ(m.getString("mode"), llvm::Optional<llvm::StringRef>("check"));
  EXPECT_EQ(m.getObject("counts")->getInteger("missing"), llvm::Optional<int64_t>(4));
  const llvm::json::Array& missing_kernels = *m.getArray("kernels");
  ASSERT_EQ(missing_kernels.size(), 4u);
  const llvm::json::Object& first = *missing_kernels[0].getAsObject();
  EXPECT_EQ(first.getString("status"), llvm::Optional<llvm::StringRef>("missing"));
  EXPECT_TRUE(first.getString("spec")->startswith("gate_residual dtype=fp16 hidden=64 table_stride=128"));
  EXPECT_TRUE(first.getString("prewarm_command")->startswith("exactjit prewarm --op gate_residual --hidden 64"));

  const auto built = cli.run(family);
  EXPECT_EQ(built.exit_code, 0) << built.err;
  llvm::json::Object b = json_of(built, "prewarm");
  EXPECT_EQ(b.getString("mode"), llvm::Optional<llvm::StringRef>("build"));
  EXPECT_EQ(b.getObject("counts")->getInteger("compiled"), llvm::Optional<int64_t>(4));
  EXPECT_EQ(b.getObject("counts")->getInteger("total"), llvm::Optional<int64_t>(4));
  for (const llvm::json::Value& kernel : *b.getArray("kernels")) {
    EXPECT_EQ(kernel.getAsObject()->getString("status"), llvm::Optional<llvm::StringRef>("compiled"));
    EXPECT_TRUE(llvm::sys::fs::is_directory(kernel.getAsObject()->getString("directory")->str()));
  }
  const auto present = cli.run(check_args);
  EXPECT_EQ(present.exit_code, 0);
  EXPECT_EQ(json_of(present, "prewarm").getObject("counts")->getInteger("present"), llvm::Optional<int64_t>(4));

  const auto ls = cli.run({"cache", "ls", "--json"});
  EXPECT_EQ(ls.exit_code, 0);
  const llvm::json::Object listed = json_of(ls, "cache ls");
  const llvm::json::Array& entries = *listed.getArray("entries");
  ASSERT_EQ(entries.size(), 4u);
  const llvm::json::Object& entry = *entries[0].getAsObject();
  EXPECT_EQ(entry.getString("layer"), llvm::Optional<llvm::StringRef>("writable"));
  EXPECT_GT(entry.getInteger("bytes").getValueOr(0), 0);
  EXPECT_TRUE(entry.getString("compiler_tag")->startswith("nvrtc-"));
  EXPECT_EQ(entry.get("ok"), nullptr);  // ls does not verify

  const auto stat = cli.run({"cache", "stat", "--json"});
  llvm::json::Object st = json_of(stat, "cache stat");
  EXPECT_EQ(st.getObject("writable")->getInteger("entries"), llvm::Optional<int64_t>(4));
  EXPECT_EQ(st.getObject("read_only")->getInteger("entries"), llvm::Optional<int64_t>(0));
  EXPECT_EQ(st.getBoolean("offline"), llvm::Optional<bool>(false));

  test::write_text(entry.getString("directory")->str() + "/kernel.cubin", "not an ELF");
  const auto verify = cli.run({"cache", "verify", "--json"});
  EXPECT_EQ(verify.exit_code, 1);
  llvm::json::Object v = json_of(verify, "cache verify");
  EXPECT_EQ(v.getObject("counts")->getInteger("bad"), llvm::Optional<int64_t>(1));
  EXPECT_EQ(v.getBoolean("rebuild"), llvm::Optional<bool>(false));
  size_t bad = 0;
  for (const llvm::json::Value& e : *v.getArray("entries")) {
    const llvm::json::Object& o = *e.getAsObject();
    if (o.getBoolean("ok") == llvm::Optional<bool>(false)) {
      ++bad;
      EXPECT_NE(o.getString("problem")->find("kernel.cubin"), std::string::npos);
    } else {
      EXPECT_EQ(o.getString("image_sha256")->size(), 64u);
    }
  }
  EXPECT_EQ(bad, 1u);

  const auto prune = cli.run({"cache", "prune", "--policy", "cache_size_files=1", "--json"});
  EXPECT_EQ(prune.exit_code, 0);
  llvm::json::Object p = json_of(prune, "cache prune");
  EXPECT_EQ(p.getInteger("removed_entries"), llvm::Optional<int64_t>(3));
  EXPECT_EQ(p.getString("policy"), llvm::Optional<llvm::StringRef>("cache_size_files=1"));
  EXPECT_GT(p.getInteger("remaining_bytes").getValueOr(0), 0);

  const auto index = cli.run({"cache", "index", "--json"});  // writes the index format, not JSON
  EXPECT_EQ(index.exit_code, 2);
  EXPECT_NE(index.err.find("drop --json"), std::string::npos) << index.err;
  const auto clear = cli.run({"cache", "clear", "--json"});
  EXPECT_EQ(clear.exit_code, 0);
  EXPECT_EQ(json_of(clear, "cache clear").getString("removed"),
            llvm::Optional<llvm::StringRef>(cli.cache / "exactjit-v1"));

  const auto usage = cli.run({"prewarm", "--op", "softmax", "--json"});
  EXPECT_EQ(usage.exit_code, 2);
  EXPECT_NE(json_of(usage, "prewarm").getString("error")->find("unknown op 'softmax'"), std::string::npos);
}

TEST(Cli, InfoNamesCompilerAndCacheDirectories) {
  Cli cli;
  const auto info = cli.run({"info"}, {"EXACTJIT_CACHE_PATH=/opt/shipped:/srv/more"});
  EXPECT_EQ(info.exit_code, 0);
  EXPECT_NE(info.out.find("nvrtc:     13."), std::string::npos) << info.out;
  EXPECT_NE(info.out.find("sm_90"), std::string::npos);
  EXPECT_NE(info.out.find("driver:"), std::string::npos);
  EXPECT_NE(info.out.find(cli.cache.path() + " (writable)"), std::string::npos) << info.out;
  EXPECT_NE(info.out.find("/opt/shipped (read-only)"), std::string::npos);
  EXPECT_NE(info.out.find("/srv/more (read-only)"), std::string::npos);
}

TEST(Cli, SelftestWithoutGpuSaysSoAndFails) {
  Cli cli;
  const auto result = cli.run({"selftest"}, {"EXACTJIT_CUDA_LIBRARY=/nonexistent/libcuda.so.1"});
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.err.find("needs a CUDA driver and a GPU"), std::string::npos) << result.err;
}

TEST(Cli, BenchWithoutGpuSaysSoAndFails) {
  Cli cli;
  const auto result =
      cli.run({"bench", "--out", cli.cache / "report"}, {"EXACTJIT_CUDA_LIBRARY=/nonexistent/libcuda.so.1"});
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.err.find("no CUDA driver or GPU here"), std::string::npos) << result.err;
  const auto help = cli.run({"bench", "--help"});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.out.find("--sizes"), std::string::npos) << help.out;
}

}  // namespace
}  // namespace exactjit
