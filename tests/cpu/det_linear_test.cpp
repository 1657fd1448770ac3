// det_linear on the CPU: the PTX audit (fp32: exactly the written fma chains, no TF32; bf16: the
// m16n8k16 bf16 mma, nothing fused; the only approximate instruction is expf's ex2 under SiLU),
// the planner's rules, and the fp32 host model against a long-double dot product.
#include "codegen/render.hpp"
#include "kernels/catalog.hpp"
#include "kernels/det_linear.hpp"
#include "kernels/det_linear_backward.hpp"
#include "kernels/host_model.hpp"
#include "runtime/errors.hpp"
#include "runtime/nvrtc.hpp"
#include "support/fake_tensor.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <regex>

namespace exactjit {
namespace {

using test::FakeTensor;
using test::GiB;
using test::kBF16;
using test::kF32;

size_t count(const std::string& text, const char* pattern) {
  const std::regex re(pattern);
  return static_cast<size_t>(std::distance(std::sregex_iterator(text.begin(), text.end(), re), std::sregex_iterator()));
}

std::string ptx_of(const KernelSpec& spec) {
  const Nvrtc* nvrtc = *Nvrtc::get();
  auto ptx = nvrtc->ptx(codegen::render(spec));
  EXPECT_TRUE(static_cast<bool>(ptx)) << (ptx ? "" : llvm::toString(ptx.takeError()));
  return ptx ? *ptx : std::string();
}

TEST(DetLinearPtx, Fp32IsTheWrittenFmaChainsAndNoTf32) {
  for (bool silu : {false, true}) {
    KernelSpec spec = det_linear_spec(DType::F32, 5376, 2688, silu);
    spec.target = Target{90, false};
    const std::string ptx = ptx_of(spec);
    EXPECT_EQ(count(ptx, "tf32"), 0u);
    EXPECT_EQ(count(ptx, "mma"), 0u);
    EXPECT_EQ(count(ptx, "\\.approx"), count(ptx, "ex2\\.approx\\.ftz\\.f32"));  // expf only
    if (!silu) {
      EXPECT_EQ(count(ptx, "fma\\.rn\\.f32"), 4u * 8u * 4u);  // 4 columns x 8 rows x 4 elements per chunk
      EXPECT_EQ(count(ptx, "\\.approx|\\.ftz"), 0u);
    }
  }
}

TEST(DetLinearPtx, Bf16UsesTheBf16MmaAndFusesNothing) {
  for (bool silu : {false, true}) {
    KernelSpec spec = det_linear_spec(DType::BF16, 2688, 18 * kDefaultHidden, silu);
    spec.target = Target{90, false};
    const std::string ptx = ptx_of(spec);
    EXPECT_GT(count(ptx, "mma\\.sync\\.aligned\\.m16n8k16\\.row\\.col\\.f32\\.bf16\\.bf16\\.f32"), 0u);
    EXPECT_EQ(count(ptx, "tf32"), 0u);
    EXPECT_EQ(count(ptx, "\\.approx"), count(ptx, "ex2\\.approx\\.ftz\\.f32"));
    if (!silu) {
      EXPECT_EQ(count(ptx, "fma\\.rn\\.f32|\\.approx|\\.ftz"), 0u);
    }
  }
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

TEST(DetLinearValidation, PlansTheAdalnProjection) {
  LinearCall call;
  auto plan = call.plan();
  ASSERT_TRUE(static_cast<bool>(plan)) << llvm::toString(plan.takeError());
  EXPECT_EQ(plan->spec.op, Op::DetLinear);
  EXPECT_EQ(plan->grid, static_cast<uint32_t>(18 * 5376 / 128));
  EXPECT_EQ(plan->grid_y, 1u);
  EXPECT_EQ(plan->spec.describe().rfind("det_linear dtype=bf16 in_features=2688 out_features=96768 activation=silu", 0),
            0u);
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

TEST(DetLinearModel, Fp32ModelIsADotProductAndRowIndependent) {
  constexpr int64_t T = 3, K = 256, N = 5;
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
      long double exact = b[n];
      for (int64_t k = 0; k < K; ++k) exact += static_cast<long double>(w[n * K + k]) * x[t * K + k];
      EXPECT_NEAR(v[t * N + n], static_cast<double>(exact), 1e-4);
      EXPECT_EQ(v[t * N + n], v1[n]);
    }
  }
}

TEST(DetLinearPtx, BackwardIsFmaChainsAndAddsOnly) {
  for (Op op : {Op::DetLinearInputGrad, Op::DetLinearWeightGrad}) {
    KernelSpec spec = det_linear_spec(DType::F32, 5376, 2688, false, op);
    spec.target = Target{90, false};
    const std::string ptx = ptx_of(spec);
    const size_t fmas = count(ptx, "fma\\.rn\\.f32");  // one chain step per row (the n loop may be unrolled)
    EXPECT_TRUE(fmas > 0 && fmas % 8 == 0) << spec.describe() << ": " << fmas;
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
  auto silu_without_pre = plan_det_linear_backward({grad.t, nullptr, x.t, w.t, &d_input.t, nullptr, nullptr, &workspace.t, true});
  ASSERT_FALSE(static_cast<bool>(silu_without_pre));
  EXPECT_NE(llvm::toString(silu_without_pre.takeError()).find("pre_activation is required with silu"), std::string::npos);
}

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
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < K; ++k) {
      long double exact = 0;
      for (int64_t n = 0; n < N; ++n) exact += static_cast<long double>(g[t * N + n]) * w[n * K + k];
      EXPECT_NEAR(d_input[t * K + k], static_cast<double>(exact), 1e-4);
    }
  for (int64_t n = 0; n < N; ++n) {
    EXPECT_NEAR(d_bias[n], g[n] + g[N + n] + g[2 * N + n], 1e-5);
    EXPECT_NEAR(d_weight[n * K + 7], g[n] * x[7] + g[N + n] * x[K + 7] + g[2 * N + n] * x[2 * K + 7], 1e-5);
  }
}

}  // namespace
}  // namespace exactjit
