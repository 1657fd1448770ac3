// Every catalog spec compiles with NVRTC for sm_80, sm_90 and sm_100; the PTX shows the exact-math
// policy (gate_residual: no fma at all, nothing .approx or .ftz, RNE conversions); a compile
// failure names the spec and carries NVRTC's log and the options.
#include "codegen/geometry.hpp"
#include "codegen/render.hpp"
#include "kernels/adaln_row_gather.hpp"
#include "kernels/adaln_row_gather_backward.hpp"
#include "kernels/catalog.hpp"
#include "kernels/gate_residual.hpp"
#include "kernels/gate_residual_backward.hpp"
#include "kernels/gate_residual_rms_norm.hpp"
#include "kernels/rms_norm.hpp"
#include "kernels/rms_norm_backward.hpp"
#include "kernels/segment_plan.hpp"
#include "kernels/timestep_sinusoid.hpp"
#include "runtime/errors.hpp"
#include "runtime/nvrtc.hpp"
#include "support/ptx.hpp"

#include <gtest/gtest.h>

#include <regex>
#include <sstream>

namespace exactjit {
namespace {

const Nvrtc& nvrtc() {
  auto loaded = Nvrtc::get();
  if (!loaded) {
    ADD_FAILURE() << llvm::toString(loaded.takeError());
    std::abort();
  }
  return **loaded;
}

using test::count;

class CatalogCompile : public ::testing::TestWithParam<int> {};

// Every shipped kernel compiles to a cubin, and ptxas's report of it (asked for with -v, which
// changes nothing in the code it emits) shows no register spills (issue 17).
TEST_P(CatalogCompile, EverySpecCompilesToACubinWithoutSpills) {
  const std::regex function("Function properties for (\\w+)");
  const std::regex spills("(\\d+) bytes spill stores, (\\d+) bytes spill loads");
  for (const KernelSpec& spec : default_catalog(Target{GetParam(), false})) {
    KernelSource source = codegen::render(spec);
    source.options.push_back("--ptxas-options=-v");
    auto output = nvrtc().compile(source);
    ASSERT_TRUE(static_cast<bool>(output)) << llvm::toString(output.takeError());
    EXPECT_FALSE(output->is_ptx);
    ASSERT_GT(output->image.size(), 4u);
    EXPECT_EQ(output->image.substr(0, 4), std::string("\x7f" "ELF", 4)) << spec.describe();
    EXPECT_EQ(count(output->log, function), 1u) << spec.describe() << ": " << output->log;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(output->log, m, spills)) << spec.describe() << ": " << output->log;
    EXPECT_TRUE(m[1].str() == "0" && m[2].str() == "0") << spec.describe() << ": " << m[0].str();
  }
}

INSTANTIATE_TEST_SUITE_P(Archs, CatalogCompile, ::testing::Values(80, 90, 100));

// Floating-point fused multiply-adds (integer mad.lo / mad.wide address arithmetic is fine).
const std::regex kFloatFma("\\b(fma|mad)(\\.r[nzmp])?(\\.ftz)?(\\.sat)?\\.(f16|bf16|f32|f64)");

// Arithmetic instructions (not declarations, comments, loads, stores or moves) on floating-point
// types.
size_t float_instructions(const std::string& ptx) {
  const std::regex floating("\\.(f16|bf16|f32|f64)(x2)?\\b");
  size_t n = 0;
  std::istringstream lines(ptx);
  for (std::string line; std::getline(lines, line);) {
    const size_t first = line.find_first_not_of(" \t");
    if (first == std::string::npos || line[first] == '.' || line[first] == '/' || line[first] == '}' ||
        line[first] == '{' || line[first] == ')' || line[first] == '$' || line.compare(first, 3, "ld.") == 0 ||
        line.compare(first, 3, "st.") == 0 || line.compare(first, 4, "mov.") == 0)
      continue;
    if (std::regex_search(line, floating)) ++n;
  }
  return n;
}

std::vector<KernelSpec> catalog_of(OpCode op) {
  std::vector<KernelSpec> specs;
  for (const KernelSpec& spec : default_catalog(Target{90, false}))
    if (spec.op == op) specs.push_back(spec);
  EXPECT_FALSE(specs.empty());
  return specs;
}

TEST(PtxAudit, GateResidualHasNoFmaNoApproxNoFtz) {
  const std::regex approx("\\.approx");
  const std::regex ftz("\\.ftz");
  for (const KernelSpec& spec : catalog_of(Op::GateResidual)) {
    auto ptx = nvrtc().ptx(codegen::render(spec));
    ASSERT_TRUE(static_cast<bool>(ptx)) << llvm::toString(ptx.takeError());
    EXPECT_EQ(count(*ptx, kFloatFma), 0u) << spec.describe();
    EXPECT_EQ(count(*ptx, approx), 0u) << spec.describe();
    EXPECT_EQ(count(*ptx, ftz), 0u) << spec.describe();
    // Exactly one multiply and one add per element, each rounded to nearest even.
    const codegen::RowGeometry g = codegen::row_geometry(spec);
    const size_t steps = static_cast<size_t>((spec.hidden / spec.vec + g.threads_per_row - 1) / g.threads_per_row);
    const size_t per_thread_elements = steps * static_cast<size_t>(spec.vec);  // fully unrolled
    EXPECT_EQ(count(*ptx, std::regex("\\bmul\\.rn\\.f32")), per_thread_elements) << spec.describe();
    EXPECT_EQ(count(*ptx, std::regex("\\badd\\.rn\\.f32")), per_thread_elements) << spec.describe();
    if (spec.dtype == DType::BF16) {
      EXPECT_GT(count(*ptx, std::regex("cvt\\.rn\\.bf16\\.f32")), 0u);
    }
    if (spec.dtype == DType::F16) {
      EXPECT_GT(count(*ptx, std::regex("cvt\\.rn\\.f16\\.f32")), 0u);
    }
    if (spec.vec > 1) {
      EXPECT_GT(count(*ptx, std::regex("ld\\.global\\.nc\\.v4")), 0u);  // the 16-byte path
    }
  }
}

TEST(PtxAudit, AdalnRowGatherDoesNoFloatingPointArithmetic) {
  for (const KernelSpec& spec : catalog_of(Op::AdalnRowGather)) {
    auto ptx = nvrtc().ptx(codegen::render(spec));
    ASSERT_TRUE(static_cast<bool>(ptx)) << llvm::toString(ptx.takeError());
    EXPECT_EQ(float_instructions(*ptx), 0u) << spec.describe();
    if (spec.vec > 1) {
      EXPECT_GT(count(*ptx, std::regex("st\\.global\\.v4")), 0u);  // the 16-byte path
    }
  }
  // The audit itself can see float instructions: gate_residual has them.
  auto ptx = nvrtc().ptx(codegen::render(catalog_of(Op::GateResidual).front()));
  ASSERT_TRUE(static_cast<bool>(ptx));
  EXPECT_GT(float_instructions(*ptx), 0u);
}

TEST(PtxAudit, RmsNormFusesOnlyTheSumOfSquaresAndApproximatesOnlyRsqrt) {
  for (const KernelSpec& spec : catalog_of(Op::RmsNorm)) {
    auto ptx = nvrtc().ptx(codegen::render(spec));
    ASSERT_TRUE(static_cast<bool>(ptx)) << llvm::toString(ptx.takeError());
    const size_t quads_per_thread = static_cast<size_t>((spec.hidden / 4 + 127) / 128);
    EXPECT_EQ(count(*ptx, kFloatFma), 4 * quads_per_thread) << spec.describe();  // s = fma(x, x, s)
    EXPECT_EQ(count(*ptx, std::regex("\\.approx")), 1u) << spec.describe();
    EXPECT_EQ(count(*ptx, std::regex("rsqrt\\.approx\\.f32")), 1u) << spec.describe();
    EXPECT_EQ(count(*ptx, std::regex("\\.ftz")), 0u) << spec.describe();
    EXPECT_EQ(count(*ptx, std::regex("div\\.rn\\.f32")), 1u) << spec.describe();  // true division by H
    EXPECT_EQ(count(*ptx, std::regex("shfl\\.sync\\.down")), 5u) << spec.describe();
    EXPECT_EQ(count(*ptx, std::regex("\\b(ld|st)\\.local")), 0u) << spec.describe();  // the row stays in registers
  }
}

// The fused op: gate_residual's two rounded operations, then rms_norm's: the sum of squares is the
// only fma, rsqrt the only approximation.
TEST(PtxAudit, GateResidualRmsNormFusesOnlyTheSumOfSquares) {
  for (const KernelSpec& spec : catalog_of(Op::GateResidualRmsNorm)) {
    auto ptx = nvrtc().ptx(codegen::render(spec));
    ASSERT_TRUE(static_cast<bool>(ptx)) << llvm::toString(ptx.takeError());
    const size_t quads_per_thread = static_cast<size_t>((spec.hidden / 4 + 127) / 128);
    EXPECT_EQ(count(*ptx, kFloatFma), 4 * quads_per_thread) << spec.describe();  // s = fma(h, h, s)
    EXPECT_EQ(count(*ptx, std::regex("\\.approx")), 1u) << spec.describe();
    EXPECT_EQ(count(*ptx, std::regex("rsqrt\\.approx\\.f32")), 1u) << spec.describe();
    EXPECT_EQ(count(*ptx, std::regex("\\.ftz")), 0u) << spec.describe();
    EXPECT_EQ(count(*ptx, std::regex("div\\.rn\\.f32")), 1u) << spec.describe();
    EXPECT_EQ(count(*ptx, std::regex("shfl\\.sync\\.down")), 5u) << spec.describe();
    EXPECT_EQ(count(*ptx, std::regex("\\b(ld|st)\\.local")), 0u) << spec.describe();
    // h = rT(residual + rT(gate * y)): its multiply and add per element, at least.
    EXPECT_GE(count(*ptx, std::regex("\\bmul\\.rn\\.f32")), 4 * quads_per_thread) << spec.describe();
    // Every residual, y and gate quad is loaded before the first h store: a gate quad loaded beside
    // the stores waits out its own L1/L2 round trip (the stores' asm keeps the loads behind them).
    const size_t first_store = ptx->find("st.global.v");
    ASSERT_NE(first_store, std::string::npos) << spec.describe();
    EXPECT_EQ(count(ptx->substr(0, first_store), "ld\\.global\\.nc\\.v[24]"), 3 * quads_per_thread) << spec.describe();
  }
}

TEST(PtxAudit, SinusoidUsesOnlyLibdevicePreciseMath) {
  for (const KernelSpec& spec : catalog_of(Op::TimestepSinusoid)) {
    auto ptx = nvrtc().ptx(codegen::render(spec));
    ASSERT_TRUE(static_cast<bool>(ptx)) << llvm::toString(ptx.takeError());
    // libdevice's precise expf is the only approximate instruction: its ex2.approx.ftz.
    EXPECT_EQ(count(*ptx, std::regex("\\.approx")), 1u) << spec.describe();
    EXPECT_EQ(count(*ptx, std::regex("ex2\\.approx\\.ftz\\.f32")), 1u) << spec.describe();
    EXPECT_EQ(count(*ptx, std::regex("\\.ftz")), 1u) << spec.describe();
    EXPECT_EQ(count(*ptx, std::regex("\\b(sin|cos|lg2|rcp|rsqrt|sqrt)\\.approx")), 0u) << spec.describe();
    EXPECT_EQ(count(*ptx, std::regex("\\bdiv\\.(approx|full)")), 0u) << spec.describe();
  }
}

// Backward: no contraction anywhere except the written fma's: the dx reduction's chain, dx's
// final fma's and the exact product errors (product_error) of dx and of the compensated sums
// (fixed_order_sum.cuh); no approximate or flush-to-zero arithmetic except what libdevice's
// precise sinf/cosf/expf contain.
TEST(PtxAudit, BackwardKernelsFuseOnlyWhatTheyWrite) {
  for (OpCode op : {Op::GateResidualBackward, Op::AdalnRowGatherBackward, Op::RmsNormTableGrad, Op::RmsNormWeightGrad,
                Op::SegmentCount, Op::SegmentScan, Op::SegmentScatter, Op::SegmentFold}) {
    for (const KernelSpec& spec : catalog_of(op)) {
      auto ptx = nvrtc().ptx(codegen::render(spec));
      ASSERT_TRUE(static_cast<bool>(ptx)) << llvm::toString(ptx.takeError());
      // Compensated tile sums of products (fp32 segment sums; the plain dweight tiles): one
      // product_error per element a thread owns (its pack or quad, or one column) for each of
      // the rows loaded at a time; bf16/fp16 segment sums are plain, and the modulated dweight
      // adds plain sums of those rows compensated (no product error). The weighted table-grad
      // tiles' row loop is compiled twice (with and without dweight), so fp32 dscale's
      // product_error appears in both copies.
      const bool fp32 = spec.dtype == DType::F32;
      const size_t products = op == Op::RmsNormWeightGrad ? 1
                              : op == Op::RmsNormTableGrad ? (fp32 ? (spec.weighted ? 2 : 1) : 0)
                              : op == Op::GateResidualBackward && fp32 ? 1 : 0;
      const size_t per_row = static_cast<size_t>(spec.vec);
      const size_t rows = static_cast<size_t>(codegen::backward_row_unroll(spec));
      EXPECT_EQ(count(*ptx, kFloatFma), products * rows * per_row) << spec.describe();
      EXPECT_EQ(count(*ptx, std::regex("\\.(approx|ftz)")), 0u) << spec.describe();
      EXPECT_EQ(count(*ptx, std::regex("\\b(atom|red)\\.[a-z.]*\\.f(16|32|64)")), 0u)
          << spec.describe();  // no float atomics
      EXPECT_EQ(count(*ptx, std::regex("\\b(ld|st)\\.local")), 0u) << spec.describe();
    }
  }
  // rms_norm's dx and gate_residual_rms_norm's (the same, plus one rounded add of the residual
  // gradient per element: no fma).
  std::vector<KernelSpec> dx_specs = catalog_of(Op::RmsNormBackward);
  for (const KernelSpec& spec : catalog_of(Op::GateResidualRmsNormBackward)) dx_specs.push_back(spec);
  for (const KernelSpec& spec : dx_specs) {
    auto ptx = nvrtc().ptx(codegen::render(spec));
    ASSERT_TRUE(static_cast<bool>(ptx)) << llvm::toString(ptx.takeError());
    const size_t quads_per_thread = static_cast<size_t>((spec.hidden / 4 + 127) / 128);
    // Per element: the dot chain's fma and dx's final fma; with a modulation or a weight also the
    // wd_lo fma and one product_error per product (modulated and weighted: one more fma to
    // combine them); fp32 (rstd recomputed) also the squares' product_error and rstd_lo's fma.
    const bool modulated = spec.table_stride > 0, fp32 = spec.dtype == DType::F32;
    const size_t products = (modulated ? 1 : 0) + (spec.weighted ? 1 : 0);
    const size_t per_element = 2 + (products ? 1 + products + (products == 2 ? 1 : 0) : 0) + (fp32 ? 2 : 0);
    EXPECT_EQ(count(*ptx, kFloatFma), 4 * per_element * quads_per_thread) << spec.describe();
    EXPECT_EQ(count(*ptx, std::regex("sub\\.rn\\.f32")), fp32 ? 4 * 4 * quads_per_thread : 0u)
        << spec.describe();  // TwoSum
    EXPECT_EQ(count(*ptx, std::regex("\\.(approx|ftz)")), 0u) << spec.describe();
    // coef / H in fp32; fp32: rstd and coef in fp64 (1 / sqrt as an IEEE rcp, squares / H, coef / H).
    EXPECT_EQ(count(*ptx, std::regex("div\\.rn\\.f32")), fp32 ? 0u : 1u) << spec.describe();
    EXPECT_EQ(count(*ptx, std::regex("sqrt\\.rn\\.f64")), fp32 ? 1u : 0u) << spec.describe();
    EXPECT_EQ(count(*ptx, std::regex("rcp\\.rn\\.f64")), fp32 ? 1u : 0u) << spec.describe();
    EXPECT_EQ(count(*ptx, std::regex("div\\.rn\\.f64")), fp32 ? 2u : 0u) << spec.describe();
  }
  for (const KernelSpec& spec : catalog_of(Op::TimestepSinusoidBackward)) {
    auto ptx = nvrtc().ptx(codegen::render(spec));
    ASSERT_TRUE(static_cast<bool>(ptx)) << llvm::toString(ptx.takeError());
    EXPECT_EQ(count(*ptx, std::regex("\\.approx")), 1u) << spec.describe();  // expf's ex2.approx.ftz
    EXPECT_EQ(count(*ptx, std::regex("ex2\\.approx\\.ftz\\.f32")), 1u) << spec.describe();
    EXPECT_EQ(count(*ptx, std::regex("\\b(sin|cos|lg2|rcp|rsqrt|sqrt)\\.approx")), 0u) << spec.describe();
  }
}

TEST(PtxAudit, PtxTargetCompilesToPtxText) {
  KernelSpec spec = default_catalog(Target{90, true}).front();
  auto output = nvrtc().compile(codegen::render(spec));
  ASSERT_TRUE(static_cast<bool>(output)) << llvm::toString(output.takeError());
  EXPECT_TRUE(output->is_ptx);
  EXPECT_NE(output->image.find(".target sm_90"), std::string::npos);
}

TEST(CompileErrors, NameTheSpecAndCarryTheLogAndOptions) {
  KernelSource broken = codegen::render(default_catalog(Target{90, false}).front());
  broken.text += "\nthis is not CUDA;\n";
  auto output = nvrtc().compile(broken);
  ASSERT_FALSE(static_cast<bool>(output));
  const ErrorReport report = take_error(output.takeError());
  EXPECT_EQ(report.code, ErrorCode::CompileFailed);
  EXPECT_NE(report.message.find(broken.spec.describe()), std::string::npos) << report.message;
  EXPECT_NE(report.message.find("--fmad=false"), std::string::npos) << report.message;
  EXPECT_NE(report.message.find("error"), std::string::npos) << report.message;  // NVRTC's log
}

TEST(Nvrtc, IdentityNamesVersionAndBuild) {
  const CompilerIdentity& id = nvrtc().identity();
  EXPECT_GE(id.major, 12);
  EXPECT_GT(id.library_size, 0u);
  EXPECT_TRUE(std::regex_match(id.tag(), std::regex("nvrtc-[0-9]+\\.[0-9]+-[0-9a-f]{8}"))) << id.tag();
  EXPECT_FALSE(nvrtc().supported_archs().empty());
}

}  // namespace
}  // namespace exactjit
