// det_linear on the CPU: the PTX audit (fp32: exactly the written fma chains, no TF32; bf16: the
// m16n8k16 bf16 mma, nothing fused; the only approximate instruction is expf's ex2 under SiLU),
// the planner's rules, and the fp32 host model against a long-double dot product.
#include "codegen/render.hpp"
#include "kernels/catalog.hpp"
#include "kernels/det_linear.hpp"
#include "kernels/det_linear_backward.hpp"
#include "kernels/host_model.hpp"
#include "kernels/segment_plan.hpp"
#include "runtime/errors.hpp"
#include "runtime/kernel_cache.hpp"
#include "runtime/nvrtc.hpp"
#include "support/fake_tensor.hpp"
#include "support/ptx.hpp"

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cmath>
#include <random>
#include <regex>

namespace exactjit {
namespace {

using test::FakeTensor;
using test::GiB;
using test::kBF16;
using test::kF32;

using test::count;
using test::ptx_of;

// The fp32 forward's written instructions (templates/det_linear_fp32.cuh), per row
// specialisation R = 1, 2, 4, 8: one copy of the group body per pipeline slot and per leftover
// group, each 8 fma per (column, row) and one TwoSum (4 sub) after them; then the reduce-scatter's
// combines (one TwoSum and 2 shuffles each): slots - 1 halving combines over the values padded to
// a power of two, then one per remaining butterfly step. Loads: 16 bytes each.
struct Fp32Counts {
  size_t fma = 0, two_sums = 0, combines = 0, weight_loads = 0, x_loads = 0;
};
Fp32Counts fp32_forward_counts(int64_t in_features, int64_t out_features) {
  const DetLinearGeometry g = det_linear_geometry(DType::F32, in_features, out_features, 90);
  const int64_t full_groups = in_features / 4 / 64;
  EXPECT_EQ(in_features % 256, 0) << "the counts below assume no partial group";
  const int64_t copies = g.depth + full_groups % g.depth;
  Fp32Counts c;
  for (int rows : {1, 2, 4, 8}) {
    c.fma += static_cast<size_t>(copies * g.columns_per_warp * rows * 8);
    c.two_sums += static_cast<size_t>(copies * g.columns_per_warp * rows);
    c.x_loads += static_cast<size_t>(copies * rows * 2);  // a 16-byte x load per chunk and row
    // 16-byte weight loads: the prefetch of the pipeline, and its refill when there is more to load.
    c.weight_loads += static_cast<size_t>(g.depth * g.columns_per_warp * 2 * (full_groups > g.depth ? 2 : 1));
    int slots = 1, halvings = 0;
    while (slots < g.columns_per_warp * rows) slots *= 2, ++halvings;
    c.combines += static_cast<size_t>(slots - 1 + 5 - halvings);
  }
  return c;
}

TEST(DetLinearPtx, Fp32IsTheWrittenCompensatedFmaChainsAndNoTf32) {
  // The MLP's two layers (one group per lane and 4 columns per warp; 21 groups, 2 columns, 4 deep).
  for (auto [K, N] : {std::pair<int64_t, int64_t>{5376, 2688}, {256, 5376}}) {
    const Fp32Counts written = fp32_forward_counts(K, N);
    size_t plain_fma = 0;
    for (bool silu : {false, true}) {
      KernelSpec spec = det_linear_spec(DType::F32, K, N, silu);
      spec.target = Target{90, false};
      const std::string ptx = ptx_of(spec);
      EXPECT_EQ(count(ptx, "tf32"), 0u);
      EXPECT_EQ(count(ptx, "mma"), 0u);
      EXPECT_EQ(count(ptx, "\\.approx"), count(ptx, "ex2\\.approx\\.ftz\\.f32"));  // expf only
      EXPECT_EQ(count(ptx, "sub\\.rn\\.f32"), 4 * (written.two_sums + written.combines)) << K;  // TwoSums kept
      EXPECT_EQ(count(ptx, "shfl\\.sync\\.bfly"), 2 * written.combines) << K;
      EXPECT_EQ(count(ptx, "ld\\.global\\.nc\\.L1::no_allocate\\.v4\\.f32"), written.weight_loads) << K;
      EXPECT_EQ(count(ptx, "ld\\.global\\.nc\\.v4\\.f32"), written.x_loads) << K;
      EXPECT_EQ(count(ptx, "bar\\.sync|ld\\.shared"), 0u) << "x comes through the read-only cache";
      if (!silu) {
        plain_fma = count(ptx, "fma\\.rn\\.f32");
        EXPECT_EQ(plain_fma, written.fma) << K;
        EXPECT_EQ(count(ptx, "\\.approx|\\.ftz"), 0u);
      } else {  // expf's own fma's: the same number at each of its call sites
        const size_t exps = count(ptx, "ex2\\.approx\\.ftz\\.f32");
        EXPECT_GT(exps, 0u);
        EXPECT_EQ((count(ptx, "fma\\.rn\\.f32") - plain_fma) % exps, 0u) << K;
      }
    }
  }
}

TEST(DetLinearPtx, Bf16UsesTheBf16MmaOn16ByteLoadsAndFusesNothing) {
  // Through registers (sm_80 to sm_89): the AdaLN projection (8-warp blocks, 4 chunks deep) and
  // the final one (4 warps, 12 deep).
  for (int64_t N : {18 * kDefaultHidden, 2 * kDefaultHidden}) {
    const DetLinearGeometry g = det_linear_geometry(DType::BF16, 2688, N, 80);
    ASSERT_FALSE(g.bulk);
    const size_t copies = static_cast<size_t>(g.depth + 2688 / 32 % g.depth);  // chunk bodies
    for (bool silu : {false, true}) {
      KernelSpec spec = det_linear_spec(DType::BF16, 2688, N, silu);
      spec.target = Target{80, false};
      const std::string ptx = ptx_of(spec);
      EXPECT_EQ(count(ptx, "mma\\.sync\\.aligned\\.m16n8k16\\.row\\.col\\.f32\\.bf16\\.bf16\\.f32"), 2 * copies) << N;
      EXPECT_EQ(count(ptx, "\\bmma\\."), 2 * copies);
      // Weights: two 16-byte loads per chunk (features g and g + 8), for the prefetch and the refills.
      EXPECT_EQ(count(ptx, "ld\\.global\\.nc\\.L1::no_allocate\\.v4\\.u32"), 2 * 2 * static_cast<size_t>(g.depth)) << N;
      EXPECT_EQ(count(ptx, "ld\\.global(\\.nc)?(\\.L1::no_allocate)?(\\.v2)?\\.[ub]32\\s"), 0u)
          << "narrow weight loads";
      EXPECT_EQ(count(ptx, "ld\\.shared\\.v4\\.u32"), copies) << "one 16-byte x load per chunk";
      EXPECT_EQ(count(ptx, "bar\\.sync"), 1u) << "x staged once";
      EXPECT_EQ(count(ptx, "cp\\.async"), 0u);
      EXPECT_EQ(count(ptx, "tf32"), 0u);
      EXPECT_EQ(count(ptx, "\\.approx"), count(ptx, "ex2\\.approx\\.ftz\\.f32"));
      if (!silu) {
        EXPECT_EQ(count(ptx, "fma\\.rn\\.f32|\\.approx|\\.ftz"), 0u);
      }
    }
  }
}

TEST(DetLinearPtx, Bf16OnSm90StreamsTheWeightsByBulkCopies) {
  for (int64_t N : {18 * kDefaultHidden, 2 * kDefaultHidden}) {
    const DetLinearGeometry g = det_linear_geometry(DType::BF16, 2688, N, 90);
    ASSERT_TRUE(g.bulk);
    const size_t chunks = static_cast<size_t>(g.stage_chunks);  // one slot's chunk bodies
    for (bool silu : {false, true}) {
      KernelSpec spec = det_linear_spec(DType::BF16, 2688, N, silu);
      spec.target = Target{90, false};
      const std::string ptx = ptx_of(spec);
      EXPECT_EQ(count(ptx, "mma\\.sync\\.aligned\\.m16n8k16\\.row\\.col\\.f32\\.bf16\\.bf16\\.f32"), 2 * chunks) << N;
      EXPECT_EQ(count(ptx, "\\bmma\\."), 2 * chunks);
      // One bulk copy per lane 0..15 and stage, for the first slots and for the refills, each
      // announced on its slot's barrier; no weight reaches a register from global memory.
      EXPECT_EQ(count(ptx, "cp\\.async\\.bulk\\.shared::cluster\\.global\\.mbarrier::complete_tx::bytes"), 2u);
      EXPECT_EQ(count(ptx, "mbarrier\\.arrive\\.expect_tx"), 2u);
      EXPECT_EQ(count(ptx, "mbarrier\\.try_wait\\.parity"), 1u);
      EXPECT_EQ(count(ptx, "ld\\.global[.a-z0-9:]*\\.[ub](16|32)\\s|ld\\.global[.a-z0-9:]*\\.v[24]\\.[ub]32"),
                count(ptx, "ld\\.global\\.nc\\.u16")) << "only the bias is read as integers";
      EXPECT_EQ(count(ptx, "ld\\.shared\\.v4\\.u32"), 3 * chunks) << "W[g], W[g + 8] and x: 16 bytes each per chunk";
      EXPECT_EQ(count(ptx, "bar\\.sync"), 1u) << "x staged once";
      EXPECT_EQ(count(ptx, "tf32"), 0u);
      EXPECT_EQ(count(ptx, "\\.approx"), count(ptx, "ex2\\.approx\\.ftz\\.f32"));
      if (!silu) {
        EXPECT_EQ(count(ptx, "fma\\.rn\\.f32|\\.approx|\\.ftz"), 0u);
      }
    }
  }
}

// An offline miss names the command that builds the kernel: the forward's own size flags.
TEST(DetLinearSpec, PrewarmCommandNamesTheShape) {
  KernelSpec spec = det_linear_spec(DType::BF16, 1152, 6 * 1152, false);
  spec.target = Target{90, false};
  EXPECT_EQ(prewarm_command(spec),
            "exactjit prewarm --op det_linear --dtype bf16 --in-features 1152 --out-features 6912 "
            "--activation none --arch sm_90");
}

TEST(DetLinearSpec, Bf16NeedsSm80) {
  KernelSpec spec = det_linear_spec(DType::BF16, 2688, 5376, true);
  spec.target = Target{75, false};
  auto err = validate_spec(spec);
  ASSERT_TRUE(static_cast<bool>(err));
  EXPECT_NE(llvm::toString(std::move(err)).find("needs sm_80 or newer"), std::string::npos);
}

struct LinearCall {
  FakeTensor x{1 * GiB, {3, 2688}, kF32};
  FakeTensor weight{2 * GiB, {18 * 5376, 2688}, kBF16};
  FakeTensor bias{3 * GiB, {18 * 5376}, kBF16};
  FakeTensor out{4 * GiB, {3, 18 * 5376}, kBF16};
  llvm::Expected<LaunchPlan> plan() { return plan_det_linear({x.t, weight.t, &bias.t, out.t, nullptr, true}); }
};

TEST(DetLinearValidation, RefusesOutWithEmptyLanesOrAliasingAnInput) {
  {
    LinearCall call;  // lanes = 0 used to skip out's alignment and overlap checks
    call.out.t.dtype.lanes = 0;
    call.out.t.data = call.x.t.data;
    auto plan = call.plan();
    ASSERT_FALSE(static_cast<bool>(plan));
    EXPECT_NE(llvm::toString(plan.takeError()).find("out must have one lane of whole bytes"), std::string::npos);
  }
  {
    LinearCall call;  // out written over the bias
    call.out.t.data = call.bias.t.data;
    auto plan = call.plan();
    ASSERT_FALSE(static_cast<bool>(plan));
    EXPECT_NE(llvm::toString(plan.takeError()).find("must not overlap out"), std::string::npos);
  }
}

TEST(DetLinearValidation, PlansTheAdalnProjection) {
  LinearCall call;
  auto plan = call.plan();  // the device unknown: streaming through registers
  ASSERT_TRUE(static_cast<bool>(plan)) << llvm::toString(plan.takeError());
  EXPECT_EQ(plan->spec.op, Op::DetLinear);
  EXPECT_EQ(plan->grid, static_cast<uint32_t>(18 * 5376 / 128));  // 8 warps x 16 features
  EXPECT_EQ(plan->grid_y, 1u);
  EXPECT_EQ(plan->threads, 256u);
  EXPECT_EQ(plan->shared_bytes, 0u);
  EXPECT_EQ(plan->spec.describe().rfind("det_linear dtype=bf16 in_features=2688 out_features=96768 activation=silu", 0),
            0u);
  // An H200: one persistent block of 8 warps per SM, x (8 rows of 340 16-byte vectors) and 8 rings
  // of 2 slots of 16 x 704 bytes with their barriers in dynamic shared memory.
  auto h200 =
      plan_det_linear({call.x.t, call.weight.t, &call.bias.t, call.out.t, nullptr, true}, DeviceTraits{90, 132});
  ASSERT_TRUE(static_cast<bool>(h200)) << llvm::toString(h200.takeError());
  EXPECT_EQ(h200->grid, 132u);
  EXPECT_EQ(h200->threads, 256u);
  EXPECT_EQ(h200->shared_bytes, 8u * 340 * 16 + 8 * 2 * (16 * 704 + 8));
  EXPECT_LE(h200->shared_bytes, 232448u);
  EXPECT_EQ(h200->spec, plan->spec) << "the target picks the kernel, the spec is the same";
  KernelSpec spec = h200->spec;
  spec.target = Target{90, false};
  EXPECT_NE(codegen::render(spec).text.find("---- templates/det_linear_bf16_bulk.cuh ----"), std::string::npos);
  spec.target = Target{80, false};
  EXPECT_EQ(codegen::render(spec).text.find("---- templates/det_linear_bf16_bulk.cuh ----"), std::string::npos);
}

// Grids and blocks follow det_linear_geometry, which the renderer bakes into the kernels.
TEST(DetLinearValidation, PlansTheOtherCatalogShapes) {
  {
    LinearCall call;  // the final projection: fewer features, 4-warp blocks
    call.weight.shape[0] = call.bias.shape[0] = call.out.shape[1] = 2 * 5376;
    auto plan = call.plan();
    ASSERT_TRUE(static_cast<bool>(plan)) << llvm::toString(plan.takeError());
    EXPECT_EQ(plan->grid, static_cast<uint32_t>(2 * 5376 / 64));
    EXPECT_EQ(plan->threads, 128u);
    // On an H200 its 672 tasks take one warp each: 6-warp blocks on 112 SMs.
    auto h200 =
        plan_det_linear({call.x.t, call.weight.t, &call.bias.t, call.out.t, nullptr, true}, DeviceTraits{90, 132});
    ASSERT_TRUE(static_cast<bool>(h200)) << llvm::toString(h200.takeError());
    EXPECT_EQ(h200->grid, 112u);
    EXPECT_EQ(h200->threads, 192u);
    EXPECT_EQ(h200->shared_bytes, 8u * 340 * 16 + 6 * 2 * (16 * 704 + 8));
  }
  {
    // x too long to leave room for a ring next to it: through registers on sm_90 too.
    const DetLinearGeometry g = det_linear_geometry(DType::BF16, 16384, 4096, 90);
    EXPECT_FALSE(g.bulk);
    EXPECT_TRUE(det_linear_geometry(DType::BF16, 8192, 4096, 90).bulk);
  }
  for (auto [K, N] : {std::pair<int64_t, int64_t>{256, 5376}, {5376, 2688}}) {  // the timestep MLP
    FakeTensor x{1 * GiB, {3, K}, kF32}, w{2 * GiB, {N, K}, kF32}, b{3 * GiB, {N}, kF32}, out{4 * GiB, {3, N}, kF32};
    auto plan = plan_det_linear({x.t, w.t, &b.t, out.t, nullptr, K == 256});
    ASSERT_TRUE(static_cast<bool>(plan)) << llvm::toString(plan.takeError());
    const int64_t columns = K == 256 ? 4 : 2;  // per warp; 2 warps per block
    EXPECT_EQ(plan->grid, static_cast<uint32_t>(N / (2 * columns))) << K;
    EXPECT_EQ(plan->threads, 64u);
    const std::string source = codegen::render(plan->spec).text;
    EXPECT_NE(source.find(fmt::format("constexpr int kColumnsPerWarp = {};", columns)), std::string::npos);
    EXPECT_NE(source.find("constexpr int kWarps = 2;"), std::string::npos);
  }
}

TEST(DetLinearValidation, RefusesWhatTheKernelsCannotDo) {
  auto message = [](llvm::Expected<LaunchPlan> plan) {
    return plan ? std::string("accepted") : llvm::toString(plan.takeError());
  };
  {
    LinearCall call;
    call.out.t.dtype = kF32;  // bf16 weights write a bf16 table
    EXPECT_NE(message(call.plan()).find("out must be (3, 96768) contiguous in bfloat16"), std::string::npos);
  }
  {
    LinearCall call;
    call.x.shape[1] = call.weight.shape[1] = 2680;  // not a multiple of 16
    EXPECT_NE(message(call.plan()).find("multiple of 16"), std::string::npos);
  }
  {
    LinearCall call;
    call.weight.t.dtype = {kDLFloat, 16, 1};
    EXPECT_NE(message(call.plan()).find("must be float32 or bfloat16"), std::string::npos);
  }
}

// The caps (kernels/spec_limits.hpp): K = 65536 and N = 2^21 (18H at the H cap) plan; one step
// past either is refused with the field and the cap named, not planned up to 2^31 as before.
TEST(DetLinearValidation, FeaturesAreCappedWithTheFieldNamed) {
  auto plan = [](int64_t k, int64_t n) {
    FakeTensor x{1 * GiB, {3, k}, kF32}, weight{1024 * GiB, {n, k}, kBF16}, bias{3 * GiB, {n}, kBF16};
    FakeTensor out{4 * GiB, {3, n}, kBF16};
    auto planned = plan_det_linear({x.t, weight.t, &bias.t, out.t, nullptr, true});
    return planned ? std::string("accepted") : llvm::toString(planned.takeError());
  };
  EXPECT_EQ(plan(65536, int64_t{1} << 21), "accepted");
  EXPECT_EQ(plan(65552, 96768), "det_linear: x in_features K must be in [1, 65536] (got 65552)");
  EXPECT_EQ(plan(2688, (int64_t{1} << 21) + 1),
            "det_linear: weight out_features N must be in [1, 2097152] (got 2097153)");
}

constexpr double kUlp = 0x1p-24;  // unit roundoff of fp32

// The model against a long-double dot product: within the order's bound (each group's fma chain of
// <= 8 terms: 8u of its terms' magnitudes; the compensated sums and the butterfly: exact up to u^2
// terms; value() and the bias add: one rounding each), and a row's bits are its own. K = 416 has
// a partial last group (40 chunks: lanes 0..7 hold two, the rest one).
TEST(DetLinearModel, Fp32ModelIsADotProductAndRowIndependent) {
  constexpr int64_t T = 3, K = 416, N = 5;
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> x(T * K), w(N * K), b(N), v(T * N), v1(N);
  for (float& f : x) f = u(rng);
  for (float& f : w) f = u(rng);
  for (float& f : b) f = u(rng);
  det_linear_fp32_model(x.data(), w.data(), b.data(), T, K, N, v.data());
  for (int64_t t = 0; t < T; ++t) {
    det_linear_fp32_model(x.data() + t * K, w.data(), b.data(), 1, K, N, v1.data());  // the row alone
    for (int64_t n = 0; n < N; ++n) {
      long double exact = b[n], magnitude = 0;
      for (int64_t k = 0; k < K; ++k) {
        const long double term = static_cast<long double>(w[n * K + k]) * x[t * K + k];
        exact += term;
        magnitude += std::fabs(term);
      }
      const double bound = static_cast<double>(8 * kUlp * magnitude + 3 * kUlp * std::fabs(exact)) + 1e-30;
      EXPECT_LE(std::fabs(v[t * N + n] - static_cast<double>(exact)), bound) << t << ", " << n;
      EXPECT_EQ(v[t * N + n], v1[n]);
    }
  }
}

// The reason for the compensated sums: over a long row (the MLP's second layer, K = 5376) the
// error is about one rounding (~1u rel-L2); the former plain lane chains (168 fma each, then the
// butterfly) measured ~4u on these inputs, and cuBLAS ~3u in the MLP benchmark.
TEST(DetLinearModel, Fp32ModelIsAboutOneRoundingOnLongRows) {
  constexpr int64_t T = 2, K = 5376, N = 48;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0, 1);
  std::vector<float> x(T * K), w(N * K), v(T * N);
  for (float& f : x) f = normal(rng);
  for (float& f : w) f = normal(rng) / std::sqrt(static_cast<float>(K));
  det_linear_fp32_model(x.data(), w.data(), nullptr, T, K, N, v.data());
  double error = 0, norm = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n) {
      long double exact = 0;
      for (int64_t k = 0; k < K; ++k) exact += static_cast<long double>(w[n * K + k]) * x[t * K + k];
      error += std::pow(v[t * N + n] - static_cast<double>(exact), 2);
      norm += std::pow(static_cast<double>(exact), 2);
    }
  EXPECT_LT(std::sqrt(error / norm), 2 * kUlp);
}

// Input partials: per row (8), one chain of 4 fma and one TwoSum (4 sub) per group of 4 outputs;
// weight and bias: one fma per row, the bias's compensated sum one TwoSum per row.
TEST(DetLinearPtx, BackwardIsFmaChainsAndCompensatedSumsOnly) {
  for (auto [op, fmas] : {std::pair{Op::DetLinearInputGrad, 32u}, {Op::DetLinearWeightGrad, 8u}}) {
    KernelSpec spec = det_linear_spec(DType::F32, 5376, 2688, false, op);
    spec.target = Target{90, false};
    const std::string ptx = ptx_of(spec);
    EXPECT_EQ(count(ptx, "fma\\.rn\\.f32"), fmas) << spec.describe();
    EXPECT_EQ(count(ptx, "sub\\.rn\\.f32"), 4u * 8u) << spec.describe();
    EXPECT_EQ(count(ptx, "\\.approx|\\.ftz|tf32|\\batom\\.|\\bred\\."), 0u) << spec.describe();
  }
}

TEST(DetLinearBackwardValidation, PlansInputFoldAndWeightChains) {
  FakeTensor grad{1 * GiB, {3, 2688}, kF32}, x{2 * GiB, {3, 5376}, kF32}, w{3 * GiB, {2688, 5376}, kF32};
  FakeTensor d_input{4 * GiB, {3, 5376}, kF32}, d_weight{5 * GiB, {2688, 5376}, kF32}, d_bias{6 * GiB, {2688}, kF32};
  FakeTensor workspace{7 * GiB, {det_linear_backward_workspace(3, 5376, 2688)}, test::kU8};
  auto sequence = plan_det_linear_backward(
      {grad.t, nullptr, x.t, w.t, &d_input.t, &d_weight.t, &d_bias.t, &workspace.t, false});
  ASSERT_TRUE(static_cast<bool>(sequence)) << llvm::toString(sequence.takeError());
  ASSERT_EQ(sequence->count, 3);
  EXPECT_EQ(sequence->steps[0].spec.op, Op::DetLinearInputGrad);
  EXPECT_EQ(sequence->steps[0].grid_y, 2688u / 64u);
  EXPECT_EQ(sequence->steps[1].spec.op, Op::SegmentFold);
  EXPECT_EQ(sequence->steps[2].spec.op, Op::DetLinearWeightGrad);
  auto silu_without_pre =
      plan_det_linear_backward({grad.t, nullptr, x.t, w.t, &d_input.t, nullptr, nullptr, &workspace.t, true});
  ASSERT_FALSE(static_cast<bool>(silu_without_pre));
  EXPECT_NE(llvm::toString(silu_without_pre.takeError()).find("pre_activation is required with silu"),
            std::string::npos);
}

// Each gradient within its order's bound of the long-double value (u = 2^-24, S = the sum of the
// terms' magnitudes): d_input 5uS + 2u|exact| (chains of 4 fma: 4uS; each chunk's value(): uS in
// all; the compensated fold: one rounding), d_weight TuS (a chain of T fma), d_bias 2u|exact|
// (compensated). N = 150 leaves a short last chunk and group.
TEST(DetLinearModel, BackwardModelMatchesLongDouble) {
  constexpr int64_t T = 3, K = 40, N = 150;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> g(T * N), x(T * K), w(N * K), d_input(T * K), d_weight(N * K), d_bias(N);
  for (float& f : g) f = u(rng);
  for (float& f : x) f = u(rng);
  for (float& f : w) f = u(rng);
  det_linear_fp32_backward_model(g.data(), nullptr, x.data(), w.data(), T, K, N, false, d_input.data(), d_weight.data(),
                                 d_bias.data());
  auto check = [](float got, long double exact, long double magnitude, double terms_ulps, const char* what) {
    const double bound = static_cast<double>(terms_ulps * kUlp * magnitude + 2 * kUlp * std::fabs(exact)) + 1e-30;
    EXPECT_LE(std::fabs(got - static_cast<double>(exact)), bound) << what;
  };
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < K; ++k) {
      long double exact = 0, magnitude = 0;
      for (int64_t n = 0; n < N; ++n) {
        exact += static_cast<long double>(g[t * N + n]) * w[n * K + k];
        magnitude += std::fabs(static_cast<long double>(g[t * N + n]) * w[n * K + k]);
      }
      check(d_input[t * K + k], exact, magnitude, 5, "d_input");
    }
  for (int64_t n = 0; n < N; ++n) {
    long double bias = 0, bias_magnitude = 0;
    for (int64_t t = 0; t < T; ++t) bias += g[t * N + n], bias_magnitude += std::fabs(g[t * N + n]);
    check(d_bias[n], bias, bias_magnitude, 4 * kUlp, "d_bias");
    for (int64_t k = 0; k < K; ++k) {
      long double exact = 0, magnitude = 0;
      for (int64_t t = 0; t < T; ++t) {
        exact += static_cast<long double>(g[t * N + n]) * x[t * K + k];
        magnitude += std::fabs(static_cast<long double>(g[t * N + n]) * x[t * K + k]);
      }
      check(d_weight[n * K + k], exact, magnitude, T, "d_weight");
    }
  }
}

}  // namespace
}  // namespace exactjit
