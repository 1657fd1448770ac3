// gate_residual host validation: every rule gives InvalidArgument with a message naming the op,
// the argument and the rule; valid calls get the right spec (vector width from alignment, table
// stride from the view, index type) and geometry. Planning touches no memory, so fake device
// addresses suffice.
#include "codegen/render.hpp"
#include "kernels/adaln_row_gather.hpp"
#include "kernels/catalog.hpp"
#include "kernels/det_linear.hpp"
#include "kernels/det_linear_backward.hpp"
#include "kernels/gate_residual.hpp"
#include "kernels/rms_norm.hpp"
#include "kernels/rms_norm_backward.hpp"
#include "kernels/timestep_sinusoid.hpp"
#include "runtime/errors.hpp"
#include "support/fake_tensor.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

namespace exactjit {
namespace {

using test::FakeTensor;
using test::kBF16;
using test::kF32;
using test::kI64;
using test::kI32;
using test::GiB;
constexpr int64_t H = 5376;

struct Call {
  FakeTensor residual{1 * GiB, {2, 7, H}, kBF16};
  FakeTensor gate{2 * GiB + 2 * H * 2, {9, H}, kBF16, {6 * H, 1}};  // chunk 2 of a (9, 6H) table
  FakeTensor index{3 * GiB, {7}, kI64};
  FakeTensor y{4 * GiB, {2, 7, H}, kBF16};
  FakeTensor out{5 * GiB, {2, 7, H}, kBF16};
  llvm::Expected<LaunchPlan> plan() { return plan_gate_residual({residual.t, gate.t, index.t, y.t, out.t}); }
};

std::string invalid_message(llvm::Expected<LaunchPlan> plan) {
  if (plan) return "accepted";
  ErrorReport report = take_error(plan.takeError());
  EXPECT_EQ(report.code, ErrorCode::InvalidArgument) << report.message;
  EXPECT_EQ(report.message.rfind("gate_residual: ", 0), 0u) << report.message;
  return report.message;
}

TEST(GateResidualValidation, AcceptsTheH3BlockCall) {
  Call call;
  auto plan = call.plan();
  ASSERT_TRUE(static_cast<bool>(plan)) << llvm::toString(plan.takeError());
  EXPECT_EQ(plan->spec.hidden, H);
  EXPECT_EQ(plan->spec.table_stride, 6 * H);
  EXPECT_EQ(plan->spec.vec, 8);
  EXPECT_EQ(plan->spec.index, IndexType::I64);
  EXPECT_EQ(plan->grid, 14u);  // one row per block
  EXPECT_EQ(plan->threads, 224u);
  EXPECT_EQ(plan->param_count, 8);
  EXPECT_EQ(plan->params[1], 2 * GiB + 2 * H * 2);
  EXPECT_EQ(plan->params[5], 14u);  // rows
  EXPECT_EQ(plan->params[6], 7u);   // S
  EXPECT_EQ(plan->params[7], 9u);   // R
}

TEST(GateResidualValidation, MisalignedPointerSelectsScalarPath) {
  Call call;
  call.y.t.byte_offset = 2;  // one bf16 element
  call.residual.t.byte_offset = 2;
  call.out.t.byte_offset = 2;
  auto plan = call.plan();
  ASSERT_TRUE(static_cast<bool>(plan));
  EXPECT_EQ(plan->spec.vec, 1);
  EXPECT_EQ(plan->params[0], 1 * GiB + 2);
}

TEST(GateResidualValidation, OddTableStrideSelectsScalarPath) {
  Call call;
  call.gate.strides[0] = 6 * H + 1;
  auto plan = call.plan();
  ASSERT_TRUE(static_cast<bool>(plan));
  EXPECT_EQ(plan->spec.vec, 1);
  EXPECT_EQ(plan->spec.table_stride, 6 * H + 1);
}

TEST(GateResidualValidation, SingleRowTableStrideIsCanonical) {
  Call call;
  call.gate.shape[0] = 1;
  call.gate.strides[0] = 12345;
  auto plan = call.plan();
  ASSERT_TRUE(static_cast<bool>(plan));
  EXPECT_EQ(plan->spec.table_stride, H);
}

TEST(GateResidualValidation, Int32IndexAnd2DActivations) {
  Call call;
  call.index.t.dtype = kI32;
  for (FakeTensor* t : {&call.residual, &call.y, &call.out}) {
    t->shape = {14, H};
    t->t.ndim = 2;
    t->t.shape = t->shape.data();
  }
  auto plan = call.plan();
  ASSERT_TRUE(static_cast<bool>(plan));
  EXPECT_EQ(plan->spec.index, IndexType::I32);
}

TEST(GateResidualValidation, InPlaceIsAllowed) {
  Call call;
  call.out.t.data = call.residual.t.data;
  EXPECT_TRUE(static_cast<bool>(call.plan()));
}

TEST(GateResidualValidation, EmptyBatchLaunchesNothing) {
  Call call;
  for (FakeTensor* t : {&call.residual, &call.y, &call.out}) t->shape[0] = 0;
  auto plan = call.plan();
  ASSERT_TRUE(static_cast<bool>(plan));
  EXPECT_EQ(plan->grid, 0u);
}

TEST(GateResidualValidation, RefusesEachBrokenRuleByName) {
  struct Case {
    const char* expect;
    void (*mutate)(Call&);
  };
  const Case cases[] = {
      {"residual must be a CUDA device tensor", [](Call& c) { c.residual.t.device.device_type = kDLCPU; }},
      {"y is on CUDA device 1 but residual is on device 0", [](Call& c) { c.y.t.device.device_id = 1; }},
      {"gate must have residual's dtype bf16 (got fp32)", [](Call& c) { c.gate.t.dtype = kF32; }},
      {"out must have residual's dtype", [](Call& c) { c.out.t.dtype = kF32; }},
      {"residual must be bfloat16, float16 or float32", [](Call& c) { c.residual.t.dtype = kI32; }},
      {"index must be int32 or int64", [](Call& c) { c.index.t.dtype = kBF16; }},
      {"y must have residual's shape", [](Call& c) { c.y.shape[1] = 8; }},
      {"residual must be (M, H) or (B, S, H)", [](Call& c) { c.residual.t.ndim = 1; }},
      {"gate must be (R, 5376)", [](Call& c) { c.gate.shape[1] = 5375; }},
      {"gate must have unit column stride", [](Call& c) { c.gate.strides[1] = 2; }},
      {"gate row stride must be >= H", [](Call& c) { c.gate.strides[0] = H - 8; }},
      {"index length S = 5 must divide",
       [](Call& c) {
         c.index.shape[0] = 5;
         for (FakeTensor* t : {&c.residual, &c.y, &c.out}) {
           t->shape = {14, H};
           t->t.ndim = 2;
           t->t.shape = t->shape.data();
         }
       }},
      {"index length 14 must equal residual's S dimension 7", [](Call& c) { c.index.shape[0] = 14; }},
      {"index must be (S,) with S >= 1", [](Call& c) { c.index.shape[0] = 0; }},
      {"residual must be contiguous",
       [](Call& c) { c.residual.strides = {7 * H, H, 2}; c.residual.t.strides = c.residual.strides.data(); }},
      {"out must not overlap gate", [](Call& c) { c.out.t.data = reinterpret_cast<void*>(2 * GiB); }},
      {"out must be residual itself or not overlap it",
       [](Call& c) { c.out.t.byte_offset = 2 * H * 2; c.out.t.data = c.residual.t.data; }},
      {"y must be aligned to its element size", [](Call& c) { c.y.t.byte_offset = 1; }},
      {"index has a null data pointer", [](Call& c) { c.index.t.data = nullptr; }},
  };
  for (const Case& c : cases) {
    Call call;
    c.mutate(call);
    const std::string message = invalid_message(call.plan());
    EXPECT_NE(message.find(c.expect), std::string::npos) << "expected '" << c.expect << "' in: " << message;
  }
}

struct GatherCall {
  FakeTensor rows{1 * GiB, {9, 6 * H}, kBF16, {6 * H, 1}};  // (T, 18H) viewed as (3T, 6H)
  FakeTensor ti{2 * GiB, {7}, kI64};
  FakeTensor tags{3 * GiB, {7}, kI64};
  FakeTensor out{4 * GiB, {6, 7, H}, kBF16};
  llvm::Expected<LaunchPlan> plan() { return plan_adaln_row_gather({rows.t, ti.t, tags.t, out.t}); }
};

TEST(AdalnRowGatherValidation, AcceptsTheH3Table) {
  GatherCall call;
  auto plan = call.plan();
  ASSERT_TRUE(static_cast<bool>(plan)) << llvm::toString(plan.takeError());
  EXPECT_EQ(plan->spec.op, Op::AdalnRowGather);
  EXPECT_EQ(plan->spec.hidden, H);
  EXPECT_EQ(plan->spec.table_stride, 6 * H);
  EXPECT_EQ(plan->spec.vec, 8);
  EXPECT_EQ(plan->grid, 7u);
  EXPECT_EQ(plan->params[4], 7u);  // S
  EXPECT_EQ(plan->params[5], 3u);  // T
}

TEST(AdalnRowGatherValidation, RefusesEachBrokenRuleByName) {
  struct Case {
    const char* expect;
    void (*mutate)(GatherCall&);
  };
  const Case cases[] = {
      {"rows must have 3T rows", [](GatherCall& c) { c.rows.shape[0] = 8; }},
      {"rows must be (3T, 6H)", [](GatherCall& c) { c.rows.shape[1] = 6 * H + 1; }},
      {"rows row stride must be >= 6H", [](GatherCall& c) { c.rows.strides[0] = 5 * H; }},
      {"rows must have unit column stride", [](GatherCall& c) { c.rows.strides[1] = 2; }},
      {"token_tags must have timestep_indices' dtype int64 (got int32)", [](GatherCall& c) { c.tags.t.dtype = kI32; }},
      {"token_tags must be (S,) = (7,)", [](GatherCall& c) { c.tags.shape[0] = 8; }},
      {"out must be (6, 7, 5376)", [](GatherCall& c) { c.out.shape[0] = 5; }},
      {"out must have rows' dtype", [](GatherCall& c) { c.out.t.dtype = kF32; }},
      {"out must not overlap rows", [](GatherCall& c) { c.out.t.data = reinterpret_cast<void*>(1 * GiB); }},
      {"timestep_indices must be int32 or int64", [](GatherCall& c) { c.ti.t.dtype = kBF16; }},
  };
  for (const Case& c : cases) {
    GatherCall call;
    c.mutate(call);
    auto plan = call.plan();
    ASSERT_FALSE(static_cast<bool>(plan)) << c.expect;
    const ErrorReport report = take_error(plan.takeError());
    EXPECT_EQ(report.code, ErrorCode::InvalidArgument);
    EXPECT_NE(report.message.find(std::string("adaln_row_gather: ") + c.expect), std::string::npos)
        << "expected '" << c.expect << "' in: " << report.message;
  }
}

struct NormCall {
  FakeTensor x{1 * GiB, {2, 7, H}, kBF16};
  FakeTensor weight{2 * GiB, {H}, kBF16};
  FakeTensor shift{3 * GiB, {9, H}, kBF16, {6 * H, 1}};
  FakeTensor scale{3 * GiB + 2 * H * 2, {9, H}, kBF16, {6 * H, 1}};
  FakeTensor index{4 * GiB, {7}, kI64};
  FakeTensor out{5 * GiB, {2, 7, H}, kBF16};
  FakeTensor rstd{6 * GiB, {2, 7}, kF32};
  bool modulated = true;
  bool weighted = false;
  double eps = 1e-5;
  llvm::Expected<LaunchPlan> plan() {
    return plan_rms_norm({x.t, weighted ? &weight.t : nullptr, modulated ? &shift.t : nullptr,
                          modulated ? &scale.t : nullptr, modulated ? &index.t : nullptr, out.t, &rstd.t, eps});
  }
};

// qk-norm's rows (H = 128, 32 quads) take one warp each, four to a 128-thread block; the kernel
// is generated for that shape (row_sum.cuh's one-warp sum).
TEST(RmsNormValidation, RowsOfAtMost32QuadsTakeOneWarpEach) {
  for (int64_t hidden : {int64_t{128}, int64_t{132}}) {
    FakeTensor x{1 * GiB, {2, 7, hidden}, kBF16}, weight{2 * GiB, {hidden}, kBF16};
    FakeTensor out{5 * GiB, {2, 7, hidden}, kBF16}, rstd{6 * GiB, {2, 7}, kF32};
    auto plan = plan_rms_norm({x.t, &weight.t, nullptr, nullptr, nullptr, out.t, &rstd.t, 1e-5});
    ASSERT_TRUE(static_cast<bool>(plan)) << llvm::toString(plan.takeError());
    const bool warp_rows = hidden == 128;
    EXPECT_EQ(plan->grid, warp_rows ? 4u : 14u) << hidden;  // 14 rows
    EXPECT_EQ(plan->threads, 128u);
    const std::string text = codegen::render(plan->spec).text;
    EXPECT_NE(text.find(warp_rows ? "constexpr int kRowThreads = 32;" : "constexpr int kRowThreads = 128;"),
              std::string::npos) << hidden;
    EXPECT_NE(text.find(warp_rows ? "constexpr int kRowsPerBlock = 4;" : "constexpr int kRowsPerBlock = 1;"),
              std::string::npos) << hidden;
  }
}

TEST(RmsNormValidation, AcceptsPlainAndModulatedCalls) {
  NormCall modulated;
  auto plan = modulated.plan();
  ASSERT_TRUE(static_cast<bool>(plan)) << llvm::toString(plan.takeError());
  EXPECT_EQ(plan->spec.op, Op::RmsNorm);
  EXPECT_EQ(plan->spec.table_stride, 6 * H);
  EXPECT_FALSE(plan->spec.weighted);
  EXPECT_EQ(plan->grid, 14u);  // one 128-thread row per block (H > 128)
  EXPECT_EQ(plan->threads, 128u);
  float eps = 0;
  std::memcpy(&eps, &plan->params[10], sizeof eps);
  EXPECT_EQ(eps, 1e-5f);
  NormCall plain;
  plain.modulated = false;
  plain.weighted = true;
  auto plain_plan = plain.plan();
  ASSERT_TRUE(static_cast<bool>(plain_plan)) << llvm::toString(plain_plan.takeError());
  EXPECT_EQ(plain_plan->spec.table_stride, 0);
  EXPECT_TRUE(plain_plan->spec.weighted);
  EXPECT_EQ(plain_plan->params[2], 0u);  // no shift
}

TEST(RmsNormValidation, RefusesEachBrokenRuleByName) {
  struct Case {
    const char* expect;
    void (*mutate)(NormCall&);
  };
  const Case cases[] = {
      {"x hidden size must be a multiple of 4", [](NormCall& c) { c.x.shape[2] = 5374; c.out.shape[2] = 5374; }},
      {"x must be aligned to 4 elements", [](NormCall& c) { c.x.t.byte_offset = 2; }},
      {"scale must have shift's row stride", [](NormCall& c) { c.scale.strides[0] = 2 * H; }},
      {"index length S = 5 must divide", [](NormCall& c) { c.index.shape[0] = 5; }},
      {"weight must be (5376,) contiguous", [](NormCall& c) { c.weighted = true; c.weight.shape[0] = 12; }},
      {"rstd must hold one float per row", [](NormCall& c) { c.rstd.shape[1] = 8; }},
      {"rstd must be float32", [](NormCall& c) { c.rstd.t.dtype = kBF16; }},
      {"eps must be finite and >= 0", [](NormCall& c) { c.eps = -1; }},
      {"shift must be (R, 5376)", [](NormCall& c) { c.shift.shape[1] = 64; }},
      {"out must have x's shape", [](NormCall& c) { c.out.shape[1] = 8; }},
  };
  for (const Case& c : cases) {
    NormCall call;
    c.mutate(call);
    auto plan = call.plan();
    ASSERT_FALSE(static_cast<bool>(plan)) << c.expect;
    const ErrorReport report = take_error(plan.takeError());
    EXPECT_EQ(report.code, ErrorCode::InvalidArgument);
    EXPECT_NE(report.message.find(std::string("rms_norm: ") + c.expect), std::string::npos)
        << "expected '" << c.expect << "' in: " << report.message;
  }
}

// An op's rules are written once, in its row: the planner reports the rule validate_spec (and so
// the CLI and prewarm manifests) reports, against the tensor that carries the size.
TEST(RmsNormValidation, PlannerReportsTheRowsRule) {
  NormCall call;
  call.x.shape[2] = call.out.shape[2] = call.shift.shape[1] = call.scale.shape[1] = 5374;
  auto plan = call.plan();
  ASSERT_FALSE(static_cast<bool>(plan));
  const std::string planned = take_error(plan.takeError()).message;
  const RuleBreak broken = op_row(Op::RmsNorm).rule(rms_norm_spec(DType::BF16, IndexType::I64, 5374, 0, false));
  EXPECT_EQ(broken.subject, RuleSubject::Sizes);
  EXPECT_EQ(planned, "rms_norm: x " + broken.rule);
  EXPECT_NE(broken.rule.find("got 5374"), std::string::npos) << broken.rule;

  NormCall strided;  // the table view's stride: reported against shift
  strided.shift.strides[0] = strided.scale.strides[0] = H + 2;
  plan = strided.plan();
  ASSERT_FALSE(static_cast<bool>(plan));
  const RuleBreak stride_break = op_row(Op::RmsNorm).rule(rms_norm_spec(DType::BF16, IndexType::I64, H, H + 2, false));
  EXPECT_EQ(stride_break.subject, RuleSubject::TableStride);
  EXPECT_EQ(take_error(plan.takeError()).message, "rms_norm: shift " + stride_break.rule);
}

TEST(TimestepSinusoidValidation, ScalarsAreRoundedAsPyTorchRoundsThem) {
  FakeTensor t{1 * GiB, {3}, kF32};
  FakeTensor out{2 * GiB, {3, 256}, kF32};
  SinusoidParams params;
  params.downscale_freq_shift = 1;
  auto plan = plan_timestep_sinusoid({t.t, out.t, params});
  ASSERT_TRUE(static_cast<bool>(plan)) << llvm::toString(plan.takeError());
  EXPECT_EQ(plan->spec.op, Op::TimestepSinusoid);
  EXPECT_EQ(plan->spec.channels, 256);
  EXPECT_EQ(plan->grid, 3u);  // 3 x 128 frequencies, 128 per block
  float neg_log = 0, inv = 0;
  std::memcpy(&neg_log, &plan->params[3], 4);
  std::memcpy(&inv, &plan->params[4], 4);
  EXPECT_EQ(neg_log, static_cast<float>(-std::log(10000.0)));
  EXPECT_EQ(inv, 1.0f / 127.0f);
  EXPECT_EQ(plan->params[6], 1u);  // flip_sin_to_cos
}

TEST(TimestepSinusoidValidation, RefusesEachBrokenRuleByName) {
  auto message = [](FakeTensor t, FakeTensor out, SinusoidParams params = {}) {
    auto plan = plan_timestep_sinusoid({t.t, out.t, params});
    if (plan) return std::string("accepted");
    return take_error(plan.takeError()).message;
  };
  EXPECT_NE(message({1 * GiB, {3}, kBF16}, {2 * GiB, {3, 256}, kF32}).find("timestep_sinusoid: t must be float32"),
            std::string::npos);
  EXPECT_NE(message({1 * GiB, {3, 1}, kF32}, {2 * GiB, {3, 256}, kF32}).find("t must be 1-D"), std::string::npos);
  EXPECT_NE(message({1 * GiB, {3}, kF32}, {2 * GiB, {4, 256}, kF32}).find("out must be (3, C)"), std::string::npos);
  EXPECT_NE(message({1 * GiB, {3}, kF32}, {2 * GiB, {3, 1}, kF32}).find("out channels C must be >= 2 (got 1)"),
            std::string::npos);
  SinusoidParams bad;
  bad.max_period = 0;
  EXPECT_NE(message({1 * GiB, {3}, kF32}, {2 * GiB, {3, 256}, kF32}, bad).find("max_period must be finite and > 0"),
            std::string::npos);
}

// The size caps (kernels/spec_limits.hpp): a size at its cap plans, one step past it is refused
// with the field and the cap named. H used to go up to INT_MAX, which planned and then failed in
// NVRTC or compiled for minutes.
TEST(SpecLimits, ForwardPlannersTakeTheCapAndRefuseOnePast) {
  auto gate = [](int64_t h, int64_t stride) {
    Call call;
    for (FakeTensor* t : {&call.residual, &call.y, &call.out}) t->shape[2] = h;
    call.gate.t.data = reinterpret_cast<void*>(64 * GiB);  // a wide table overlaps nothing
    call.gate.shape[1] = h;
    call.gate.strides[0] = stride;
    auto plan = call.plan();
    return plan ? std::string("accepted") : take_error(plan.takeError()).message;
  };
  EXPECT_EQ(gate(65536, 6 * 65536), "accepted");
  EXPECT_EQ(gate(65537, 6 * 65537), "gate_residual: residual hidden size H must be in [1, 65536] (got 65537)");
  EXPECT_EQ(gate(64, 2147483647), "accepted");
  EXPECT_EQ(gate(64, int64_t{1} << 31), "gate_residual: gate table stride must be in [1, 2147483647] (got 2147483648)");

  auto gather = [](int64_t h) {
    GatherCall call;
    call.rows.shape[1] = 6 * h;
    call.rows.strides[0] = 6 * h;
    call.out.shape[2] = h;
    auto plan = call.plan();
    return plan ? std::string("accepted") : take_error(plan.takeError()).message;
  };
  EXPECT_EQ(gather(65536), "accepted");
  EXPECT_EQ(gather(65537), "adaln_row_gather: rows hidden size H must be in [1, 65536] (got 65537)");

  auto norm = [](int64_t h) {
    NormCall call;
    call.x.shape[2] = call.out.shape[2] = h;
    for (FakeTensor* t : {&call.shift, &call.scale}) {
      t->shape[1] = h;
      t->strides[0] = 6 * h;
    }
    auto plan = call.plan();
    return plan ? std::string("accepted") : take_error(plan.takeError()).message;
  };
  EXPECT_EQ(norm(65536), "accepted");
  EXPECT_EQ(norm(65540), "rms_norm: x hidden size H must be in [1, 65536] (got 65540)");

  auto sinusoid = [](int64_t channels) {
    FakeTensor t{1 * GiB, {3}, kF32}, out{2 * GiB, {3, channels}, kF32};
    auto plan = plan_timestep_sinusoid({t.t, out.t, SinusoidParams{}});
    return plan ? std::string("accepted") : take_error(plan.takeError()).message;
  };
  EXPECT_EQ(sinusoid(65536), "accepted");
  EXPECT_EQ(sinusoid(65538), "timestep_sinusoid: out channels C must be in [1, 65536] (got 65538)");
}

// validate_spec (the CLI, prewarm manifests) applies the same caps to every size field, by what
// the op's `hidden` means; nothing in the default catalog comes near them.
TEST(SpecLimits, ValidateSpecNamesTheFieldAndTheCap) {
  auto rule = [](KernelSpec spec) {
    spec.target = Target{90, false};
    llvm::Error err = validate_spec(spec);
    return err ? take_error(std::move(err)).message : std::string("accepted");
  };
  EXPECT_EQ(rule(rms_norm_spec(DType::BF16, IndexType::I64, 65536, 0, true)), "accepted");
  KernelSpec backward = make_spec(Op::RmsNormBackward, DType::F32, IndexType::I64, 65540, 0, 4, true);
  EXPECT_NE(rule(backward).find(": hidden size H must be in [1, 65536] (got 65540)"), std::string::npos);
  backward.hidden = 2147483644;  // passed before, then ran NVRTC for minutes
  EXPECT_NE(rule(backward).find("hidden size H must be in [1, 65536]"), std::string::npos);
  EXPECT_NE(rule(make_spec(Op::GateResidual, DType::BF16, IndexType::I64, 64, int64_t{1} << 31, 8))
                .find("table stride must be in [1, 2147483647] (got 2147483648)"),
            std::string::npos);
  EXPECT_NE(rule(timestep_sinusoid_spec(65538)).find("channels C must be in [1, 65536] (got 65538)"),
            std::string::npos);
  EXPECT_EQ(rule(det_linear_spec(DType::BF16, 65536, int64_t{1} << 21, true)), "accepted");
  EXPECT_NE(rule(det_linear_spec(DType::BF16, 65552, 96768, true)).find("in_features K must be in [1, 65536]"),
            std::string::npos);
  EXPECT_NE(rule(det_linear_spec(DType::F32, 2688, (int64_t{1} << 21) + 1, false, Op::DetLinearWeightGrad))
                .find("out_features N must be in [1, 2097152] (got 2097153)"),
            std::string::npos);
  for (int sm : {80, 90, 100})
    for (const KernelSpec& spec : default_catalog(Target{sm, false}))
      EXPECT_FALSE(static_cast<bool>(validate_spec(spec))) << spec.describe();
}

}  // namespace
}  // namespace exactjit
