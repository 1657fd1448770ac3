// Codegen: deterministic text, constants baked in, self-contained, readable unique entry names,
// the canonical exact-math options.
#include "codegen/geometry.hpp"
#include "codegen/render.hpp"
#include "kernels/catalog.hpp"
#include "kernels/gate_residual.hpp"

#include <gtest/gtest.h>

#include <regex>
#include <set>

namespace exactjit {
namespace {

KernelSpec bf16_block_spec() {
  return spec_family(Op::GateResidual, rows_sizes(DType::BF16, 5376, 6 * 5376), Target{90, false}).front();
}

TEST(Codegen, SameSpecGivesSameBytes) {
  const KernelSource a = codegen::render(bf16_block_spec());
  const KernelSource b = codegen::render(bf16_block_spec());
  EXPECT_EQ(a.text, b.text);
  EXPECT_EQ(a.entry, b.entry);
  EXPECT_EQ(a.options, b.options);
}

TEST(Codegen, BakesEveryConstantIn) {
  KernelSpec spec = bf16_block_spec();
  spec.index = IndexType::I32;
  spec.target = Target{100, false};
  const std::string text = codegen::render(spec).text;
  EXPECT_NE(text.find("constexpr int kHidden = 5376;"), std::string::npos);
  EXPECT_NE(text.find("constexpr long long kTableStride = 32256;"), std::string::npos);
  EXPECT_NE(text.find("constexpr int kVec = 8;"), std::string::npos);
  EXPECT_NE(text.find("constexpr int kDType = 1;"), std::string::npos);
  EXPECT_NE(text.find("constexpr int kIndexBytes = 4;"), std::string::npos);
  EXPECT_NE(text.find("constexpr int kTargetArch = 100;"), std::string::npos);
  spec.hidden = 3072;
  spec.table_stride = 2 * 3072;
  spec.dtype = DType::F32;
  spec.vec = 4;
  const std::string other = codegen::render(spec).text;
  EXPECT_NE(other.find("constexpr int kHidden = 3072;"), std::string::npos);
  EXPECT_NE(other.find("constexpr long long kTableStride = 6144;"), std::string::npos);
  EXPECT_NE(other.find("constexpr int kDType = 0;"), std::string::npos);
}

TEST(Codegen, SourceIsSelfContained) {
  for (const KernelSpec& spec : default_catalog(Target{90, false})) {
    const std::string text = codegen::render(spec).text;
    EXPECT_EQ(text.find("#include"), std::string::npos) << spec.describe();
    EXPECT_EQ(text.find("cuda_bf16"), std::string::npos) << spec.describe();
  }
}

TEST(Codegen, EntryNamesAreReadableUniqueIdentifiers) {
  std::set<std::string> names;
  const std::regex identifier("[A-Za-z_][A-Za-z0-9_]*");
  for (int sm : {80, 90, 100}) {
    for (const KernelSpec& spec : default_catalog(Target{sm, false})) {
      const std::string entry = codegen::entry_name(spec);
      EXPECT_TRUE(std::regex_match(entry, identifier)) << entry;
      EXPECT_EQ(entry.rfind(spec.stem(), 0), 0u) << entry;
      EXPECT_TRUE(names.insert(entry).second) << "duplicate " << entry;
    }
  }
  EXPECT_EQ(codegen::entry_name(bf16_block_spec()).substr(0, 44), "gate_residual_bf16_h5376_ts32256_v8_i64_sm90");
}

// parse_spec is describe()'s inverse: cache verify reads a manifest's spec back to render it.
TEST(Codegen, EverySpecReadsBackFromItsDescription) {
  size_t specs = 0;
  for (Target target : {Target{75, false}, Target{90, false}, Target{90, true}, Target{120, false}}) {
    for (const KernelSpec& spec : default_catalog(target)) {
      const std::optional<KernelSpec> back = parse_spec(spec.describe());
      ASSERT_TRUE(back.has_value()) << spec.describe();
      EXPECT_TRUE(*back == spec) << spec.describe() << " read back as " << back->describe();
      ++specs;
    }
  }
  EXPECT_GT(specs, 400u);
}

TEST(Codegen, ATextDescribeDidNotWriteIsNoSpec) {
  const std::string good = default_catalog(Target{90, false}).front().describe();
  ASSERT_TRUE(parse_spec(good).has_value());
  for (const std::string& bad :
       {std::string(), std::string("nope dtype=bf16 target=sm_90"), good + " ", " " + good, good + " extra=1",
        good.substr(0, good.rfind(" target=")),                         // no target
        std::regex_replace(good, std::regex("hidden=(\\d+)"), "hidden=0$1"),   // not canonical
        std::regex_replace(good, std::regex("hidden=\\d+"), "hidden=99999999999999999999"),
        std::regex_replace(good, std::regex("dtype=\\w+"), "dtype=fp8")})
    EXPECT_FALSE(parse_spec(bad).has_value()) << bad;
}

TEST(Codegen, OptionsAreTheExactMathPolicy) {
  const std::vector<std::string> options = codegen::render(bf16_block_spec()).options;
  const std::vector<std::string> expected = {"--gpu-architecture=sm_90", "--std=c++17", "--fmad=false",
                                             "--prec-div=true", "--prec-sqrt=true", "--ftz=false"};
  EXPECT_EQ(options, expected);
  KernelSpec ptx = bf16_block_spec();
  ptx.target.ptx = true;
  EXPECT_EQ(codegen::render(ptx).options.front(), "--gpu-architecture=compute_90");
}

TEST(Codegen, GeometryCoversTheRowWithFewIdleLanes) {
  for (int64_t hidden : {12, 64, 1024, 3072, 4096, 5376, 5377, 16384}) {
    for (int vec : {1, 8}) {
      if (hidden % vec) continue;
      KernelSpec spec = bf16_block_spec();
      spec.hidden = hidden;
      spec.vec = vec;
      const codegen::RowGeometry g = codegen::row_geometry(spec);
      const int64_t packs = hidden / vec;
      EXPECT_GE(g.threads_per_row * 1LL * g.rows_per_block, 32) << hidden;
      EXPECT_LE(g.threads(), 256) << hidden;
      if (packs >= 128) EXPECT_EQ(g.rows_per_block, 1);
      else EXPECT_GE(g.threads_per_row, packs);
      const int64_t steps = (packs + g.threads_per_row - 1) / g.threads_per_row;
      EXPECT_TRUE(steps % g.unroll == 0) << hidden << " unroll " << g.unroll;
    }
  }
  KernelSpec h3 = bf16_block_spec();
  const codegen::RowGeometry g = codegen::row_geometry(h3);
  EXPECT_EQ(g.threads_per_row, 224);  // 672 packs = 3 x 224, no idle lane
  EXPECT_EQ(g.unroll, 3);
}

}  // namespace
}  // namespace exactjit
