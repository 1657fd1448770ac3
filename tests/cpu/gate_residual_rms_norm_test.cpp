// gate_residual_rms_norm host planning: the forward's spec and parameters, every rule of the two
// parts reported in this op's terms (h for gate_residual's out and rms_norm's x), the rules only
// the fused call has, and the backward's sequence (rms_norm's with the residual gradient added,
// then gate_residual's on d_residual, in one split workspace). Fake device addresses suffice.
#include "codegen/render.hpp"
#include "kernels/catalog.hpp"
#include "kernels/gate_residual_backward.hpp"
#include "kernels/gate_residual_rms_norm.hpp"
#include "kernels/rms_norm_backward.hpp"
#include "kernels/segment_plan.hpp"
#include "runtime/errors.hpp"
#include "support/fake_tensor.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace exactjit {
namespace {

using test::FakeTensor;
using test::GiB;
using test::kBF16;
using test::kF32;
using test::kI32;
using test::kI64;
using test::kU8;
using test::message_of;
constexpr int64_t H = 5376;


// The H3 block's call: the attention residual into norm2, gate/shift/scale chunks of one (9, 6H)
// table, B = 2 sequences of S = 7.
struct ForwardCall {
  FakeTensor residual{1 * GiB, {2, 7, H}, kBF16};
  FakeTensor gate{2 * GiB + 2 * H * 2, {9, H}, kBF16, {6 * H, 1}};
  FakeTensor shift{2 * GiB + 3 * H * 2, {9, H}, kBF16, {6 * H, 1}};
  FakeTensor scale{2 * GiB + 4 * H * 2, {9, H}, kBF16, {6 * H, 1}};
  FakeTensor index{3 * GiB, {7}, kI64};
  FakeTensor y{4 * GiB, {2, 7, H}, kBF16};
  FakeTensor weight{5 * GiB, {H}, kBF16};
  FakeTensor h{6 * GiB, {2, 7, H}, kBF16};
  FakeTensor out{7 * GiB, {2, 7, H}, kBF16};
  FakeTensor rstd{8 * GiB, {14}, kF32};
  bool modulated = true, with_scale = true;
  double eps = 1e-6;

  llvm::Expected<LaunchPlan> plan() {
    return plan_gate_residual_rms_norm({residual.t, gate.t, index.t, y.t, &weight.t, modulated ? &shift.t : nullptr,
                                        modulated && with_scale ? &scale.t : nullptr, h.t, out.t, &rstd.t, eps});
  }
};

// The launch is rms_norm's plan, so the kernel must be generated for the same rows per block: at
// H = 128 one warp per row, four to a block, in the grid and in the source alike.
TEST(GateResidualRmsNormValidation, NarrowRowsTakeOneWarpEachInGridAndSource) {
  for (int64_t hidden : {int64_t{128}, H}) {
    FakeTensor residual{1 * GiB, {2, 7, hidden}, kBF16}, gate{2 * GiB, {9, hidden}, kBF16, {6 * hidden, 1}};
    FakeTensor index{3 * GiB, {7}, kI64}, y{4 * GiB, {2, 7, hidden}, kBF16}, weight{5 * GiB, {hidden}, kBF16};
    FakeTensor h{6 * GiB, {2, 7, hidden}, kBF16}, out{7 * GiB, {2, 7, hidden}, kBF16}, rstd{8 * GiB, {14}, kF32};
    auto plan = plan_gate_residual_rms_norm({residual.t, gate.t, index.t, y.t, &weight.t, nullptr, nullptr, h.t,
                                             out.t, &rstd.t, 1e-6});
    ASSERT_TRUE(static_cast<bool>(plan)) << llvm::toString(plan.takeError());
    const int rows_per_block = hidden == 128 ? 4 : 1;
    EXPECT_EQ(plan->grid, static_cast<uint32_t>((14 + rows_per_block - 1) / rows_per_block)) << hidden;
    EXPECT_EQ(plan->threads, 128u);
    EXPECT_NE(codegen::render(plan->spec).text.find(fmt::format("constexpr int kRowsPerBlock = {};", rows_per_block)),
              std::string::npos) << hidden;
  }
}

TEST(GateResidualRmsNormValidation, PlansTheH3BlockCall) {
  ForwardCall call;
  auto plan = call.plan();
  ASSERT_TRUE(static_cast<bool>(plan)) << llvm::toString(plan.takeError());
  EXPECT_EQ(plan->spec.op, Op::GateResidualRmsNorm);
  EXPECT_EQ(plan->spec.table_stride, 6 * H);
  EXPECT_EQ(plan->spec.vec, 4);
  EXPECT_TRUE(plan->spec.weighted);
  EXPECT_EQ(plan->spec.index, IndexType::I64);
  EXPECT_EQ(plan->grid, 14u);  // one row per block
  EXPECT_EQ(plan->threads, 128u);
  ASSERT_EQ(plan->param_count, 14);
  const uint64_t expected[] = {1 * GiB, 2 * GiB + 2 * H * 2, 3 * GiB, 4 * GiB, 5 * GiB, 2 * GiB + 3 * H * 2,
                               2 * GiB + 4 * H * 2, 6 * GiB, 7 * GiB, 8 * GiB, 14, 7, 9};
  for (int k = 0; k < 13; ++k) EXPECT_EQ(plan->params[k], expected[k]) << k;
  float eps = 0;
  std::memcpy(&eps, &plan->params[13], sizeof eps);
  EXPECT_EQ(eps, 1e-6f);

  // The plain norm passes no shift and scale; h may be residual itself.
  ForwardCall plain;
  plain.modulated = false;
  plain.h = plain.residual;
  auto plain_plan = plain.plan();
  ASSERT_TRUE(static_cast<bool>(plain_plan)) << llvm::toString(plain_plan.takeError());
  EXPECT_EQ(plain_plan->params[5], 0u);
  EXPECT_EQ(plain_plan->params[6], 0u);
  EXPECT_EQ(plain_plan->params[7], 1 * GiB);
}

TEST(GateResidualRmsNormValidation, RefusesEachRuleInItsOwnTerms) {
  struct Case {
    const char* expected;
    void (*mutate)(ForwardCall&);
  };
  const Case cases[] = {
      // gate_residual's rules, h for its out.
      {"gate_residual_rms_norm: h must have residual's shape", [](ForwardCall& c) { c.h.shape[2] = H - 4; }},
      {"gate_residual_rms_norm: index length S = 5 must divide", [](ForwardCall& c) { c.index.shape[0] = 5; }},
      {"gate_residual_rms_norm: y must have residual's dtype", [](ForwardCall& c) { c.y.t.dtype = kF32; }},
      // rms_norm's rules, h for its x.
      {"gate_residual_rms_norm: eps must be finite", [](ForwardCall& c) { c.eps = -1; }},
      {"gate_residual_rms_norm: weight must be (5376,)", [](ForwardCall& c) { c.weight.shape[0] = 4; }},
      {"gate_residual_rms_norm: shift scale and index must be given together",
       [](ForwardCall& c) { c.with_scale = false; }},
      // The fused call's own.
      {"gate_residual_rms_norm: y must be aligned to 4 elements", [](ForwardCall& c) { c.y.t.byte_offset = 2; }},
      {"gate_residual_rms_norm: gate row stride must be a multiple of 4",
       [](ForwardCall& c) { c.gate.strides[0] = 6 * H + 2; }},
      {"gate_residual_rms_norm: shift must have the gate's 9 rows and row stride 32256",
       [](ForwardCall& c) { c.shift.strides[0] = c.scale.strides[0] = 2 * H; }},
      {"gate_residual_rms_norm: out must not overlap residual",
       [](ForwardCall& c) { c.out.t.data = c.residual.t.data; }},
      {"gate_residual_rms_norm: h must not overlap y", [](ForwardCall& c) { c.h.t.data = c.y.t.data; }},
      {"gate_residual_rms_norm: rstd must not overlap residual",
       [](ForwardCall& c) { c.rstd.t.data = c.residual.t.data; }},
  };
  for (const Case& c : cases) {
    ForwardCall call;
    c.mutate(call);
    const std::string message = message_of(call.plan());
    EXPECT_EQ(message.rfind(c.expected, 0), 0u) << "expected: " << c.expected << "\n     got: " << message;
  }
}

struct BackwardCall {
  FakeTensor grad_out{1 * GiB, {2, 7, H}, kBF16};
  FakeTensor grad_h{2 * GiB, {2, 7, H}, kBF16};
  FakeTensor h{3 * GiB, {2, 7, H}, kBF16};
  FakeTensor y{4 * GiB, {2, 7, H}, kBF16};
  FakeTensor gate{5 * GiB + 2 * H * 2, {9, H}, kBF16, {6 * H, 1}};
  FakeTensor scale{5 * GiB + 4 * H * 2, {9, H}, kBF16, {6 * H, 1}};
  FakeTensor index{6 * GiB, {7}, kI32};
  FakeTensor weight{7 * GiB, {H}, kBF16};
  FakeTensor rstd{8 * GiB, {14}, kF32};
  FakeTensor d_residual{9 * GiB, {2, 7, H}, kBF16};
  FakeTensor d_y{10 * GiB, {2, 7, H}, kBF16};
  FakeTensor d_gate{11 * GiB, {9, H}, kBF16};
  FakeTensor d_weight{12 * GiB, {H}, kBF16};
  FakeTensor d_shift{13 * GiB, {9, H}, kBF16};
  FakeTensor d_scale{14 * GiB, {9, H}, kBF16};
  FakeTensor workspace{16 * GiB, {gate_residual_rms_norm_backward_workspace(14, 7, 9, H, true, true)}, kU8};
  bool with_grad_h = true;

  bool with_d_gate = true;

  llvm::Expected<LaunchSequence> plan(const DeviceTraits& device = {}) {
    return plan_gate_residual_rms_norm_backward({grad_out.t, with_grad_h ? &grad_h.t : nullptr, h.t, y.t, gate.t,
                                                 index.t, &weight.t, &scale.t, rstd.t, 1e-6, d_residual.t, &d_y.t,
                                                 with_d_gate ? &d_gate.t : nullptr, &d_weight.t, &d_shift.t,
                                                 &d_scale.t, &workspace.t},
                                                device);
  }
};

std::vector<OpCode> ops_of(const LaunchSequence& sequence) {
  std::vector<OpCode> ops;
  for (int k = 0; k < sequence.count; ++k) ops.push_back(sequence.steps[k].spec.op);
  return ops;
}

TEST(GateResidualRmsNormBackwardValidation, AddsTheResidualGradientThenRunsBothParts) {
  // The workspace is rms_norm's backward's, then gate_residual's at a 256-byte boundary.
  const int64_t norm = rms_norm_backward_workspace(14, 7, 9, H, true);
  const int64_t gated = gate_residual_backward_workspace(14, 7, 9, H);
  EXPECT_EQ(gate_residual_rms_norm_backward_workspace(14, 7, 9, H, true, true), (norm + 255) / 256 * 256 + gated);
  EXPECT_EQ(gate_residual_rms_norm_backward_workspace(14, 5, 9, H, true, true), -1);

  BackwardCall call;
  auto sequence = call.plan();
  ASSERT_TRUE(static_cast<bool>(sequence)) << llvm::toString(sequence.takeError());
  // The table-grad tiles add d_shift, d_scale and d_weight in one pass; three folds.
  const OpCode expected[] = {Op::SegmentCount,     Op::SegmentScan,    Op::SegmentScatter,
                             Op::GateResidualRmsNormBackward, Op::RmsNormTableGrad, Op::SegmentFold,
                             Op::SegmentFold,      Op::SegmentFold,    Op::SegmentCount,
                             Op::SegmentScan,      Op::SegmentScatter, Op::GateResidualBackward,
                             Op::SegmentFold};
  ASSERT_EQ(sequence->count, 13);
  for (int k = 0; k < 13; ++k) EXPECT_EQ(sequence->steps[k].spec.op, expected[k]) << k;
  const LaunchPlan& dx = sequence->steps[3];
  EXPECT_EQ(dx.params[0], 1 * GiB);  // grad_out
  EXPECT_EQ(dx.params[1], 2 * GiB);  // grad_h, added to the norm's dh
  EXPECT_EQ(dx.params[2], 3 * GiB);  // h
  EXPECT_EQ(dx.spec.table_stride, 6 * H);
  EXPECT_TRUE(dx.spec.weighted);
  // gate_residual's part reads d_residual as its grad and writes into the second region.
  const LaunchPlan& gate_tiles = sequence->steps[11];
  EXPECT_EQ(gate_tiles.params[0], 9 * GiB);
  const uint64_t second = 16 * GiB + static_cast<uint64_t>((norm + 255) / 256 * 256);
  EXPECT_EQ(sequence->steps[8].params[6], second + 0);  // segment_count's keys at the region's start
  // Both plans report a bad index as this op's backward.
  for (int k : {0, 8}) EXPECT_EQ(sequence->steps[k].params[kSegmentCountReportCode], 20u) << k;

  // Without grad_h, d_residual is rms_norm's own dx.
  BackwardCall alone;
  alone.with_grad_h = false;
  auto plain = alone.plan();
  ASSERT_TRUE(static_cast<bool>(plain)) << llvm::toString(plain.takeError());
  EXPECT_EQ(plain->steps[3].spec.op, Op::RmsNormBackward);
  EXPECT_EQ(plain->steps[3].params[1], 0u);
}

// Where rms_norm's one-pass kernel runs (sm_90, enough plan tiles), it forms gate_residual's part
// too: d_y and the gate's tile partials, written where gate_residual's tiles would write them and
// folded over rms_norm's plan. One plan and one pass instead of two of each.
TEST(GateResidualRmsNormBackwardValidation, TheOnePassKernelFormsTheGatePartToo) {
  const DeviceTraits hopper{90, 1};
  BackwardCall call;
  auto sequence = call.plan(hopper);
  ASSERT_TRUE(static_cast<bool>(sequence)) << llvm::toString(sequence.takeError());
  const std::vector<OpCode> gated = {Op::SegmentCount, Op::SegmentScan, Op::SegmentScatter,
                                     Op::GateResidualRmsNormOnePass, Op::SegmentFold, Op::SegmentFold,
                                     Op::SegmentFold, Op::SegmentFold};
  ASSERT_EQ(ops_of(*sequence), gated);
  const LaunchPlan& pass = sequence->steps[3];
  const SegmentLayout layout = segment_layout(14, 7, 9);
  const uint64_t second =
      16 * GiB + static_cast<uint64_t>((rms_norm_backward_workspace(14, 7, 9, H, true) + 255) / 256 * 256);
  const uint64_t gate_partials = second + static_cast<uint64_t>(layout.end);
  EXPECT_EQ(pass.grid, static_cast<uint32_t>(layout.max_tiles));
  EXPECT_EQ(pass.threads, 128u + 672u + 32u);
  EXPECT_EQ(pass.shared_bytes, (4u * 4 + 3) * H * 2 + H * 4);  // 4 stages of 4 rows, 3 rows, the gate's sums
  EXPECT_EQ(pass.params[1], 2 * GiB);   // grad_h
  EXPECT_EQ(pass.params[6], 9 * GiB);   // d_residual
  EXPECT_EQ(pass.params[10], 4 * GiB);  // y
  EXPECT_EQ(pass.params[11], 5 * GiB + 2 * H * 2);  // the gate view
  EXPECT_EQ(pass.params[12], 10 * GiB);             // d_y
  EXPECT_EQ(pass.params[13], gate_partials);
  EXPECT_EQ(pass.params[14], static_cast<uint64_t>(6 * H));  // the scale rows' stride
  EXPECT_EQ(pass.params[15], static_cast<uint64_t>(6 * H));  // the gate rows' stride
  KernelSpec on_hopper = pass.spec;
  on_hopper.target = Target{90, false};
  EXPECT_EQ(llvm::toString(validate_spec(on_hopper)), "");
  // The last fold takes the gate's partials into d_gate, over the plan in rms_norm's region.
  const LaunchPlan& fold = sequence->steps[7];
  bool reads_partials = false, writes_d_gate = false;
  for (int k = 0; k < fold.param_count; ++k) {
    reads_partials |= fold.params[k] == gate_partials;
    writes_d_gate |= fold.params[k] == 11 * GiB;
  }
  EXPECT_TRUE(reads_partials && writes_d_gate);
  EXPECT_EQ(sequence->steps[0].params[kSegmentCountReportCode], 20u);

  // Without d_gate, or with y on 8 bytes only (no bulk copy), or d_y on 4 (not a quad), the
  // one-pass kernel leaves the gate part to gate_residual's own plan and tiles.
  const std::vector<OpCode> apart = {Op::SegmentCount, Op::SegmentScan,    Op::SegmentScatter, Op::RmsNormOnePass,
                                     Op::SegmentFold,  Op::SegmentFold,    Op::SegmentFold,    Op::SegmentCount,
                                     Op::SegmentScan,  Op::SegmentScatter, Op::GateResidualBackward};
  BackwardCall no_d_gate;
  no_d_gate.with_d_gate = false;
  auto without = no_d_gate.plan(hopper);
  ASSERT_TRUE(static_cast<bool>(without)) << llvm::toString(without.takeError());
  EXPECT_EQ(ops_of(*without), apart);
  BackwardCall unaligned_y;
  unaligned_y.y.t.byte_offset = 8;
  std::vector<OpCode> apart_and_folded = apart;
  apart_and_folded.push_back(Op::SegmentFold);
  auto unaligned = unaligned_y.plan(hopper);
  ASSERT_TRUE(static_cast<bool>(unaligned)) << llvm::toString(unaligned.takeError());
  EXPECT_EQ(ops_of(*unaligned), apart_and_folded);
  BackwardCall d_y_on_4_bytes;
  d_y_on_4_bytes.d_y.t.byte_offset = 4;
  auto on_4_bytes = d_y_on_4_bytes.plan(hopper);
  ASSERT_TRUE(static_cast<bool>(on_4_bytes)) << llvm::toString(on_4_bytes.takeError());
  EXPECT_EQ(ops_of(*on_4_bytes), apart_and_folded);
}

TEST(GateResidualRmsNormBackwardValidation, RefusesInItsOwnTerms) {
  {
    BackwardCall call;
    call.workspace.shape[0] -= 1;
    EXPECT_EQ(message_of(call.plan()).rfind("gate_residual_rms_norm_backward: workspace must hold at least", 0), 0u);
  }
  {
    BackwardCall call;
    call.grad_h.shape[1] = 6;
    EXPECT_EQ(message_of(call.plan()).rfind("gate_residual_rms_norm_backward: grad_h must have h's shape", 0), 0u);
  }
  {
    BackwardCall call;
    call.grad_out.t.dtype = kF32;
    EXPECT_EQ(message_of(call.plan()).rfind("gate_residual_rms_norm_backward: grad_out", 0), 0u);
  }
  {
    BackwardCall call;  // the gate part's output over the norm part's input
    call.d_y.t.data = call.grad_h.t.data;
    const std::string m = message_of(call.plan());
    EXPECT_EQ(m.rfind("gate_residual_rms_norm_backward: grad_h must not overlap d_y", 0), 0u) << m;
  }
  {
    BackwardCall call;  // a host tensor is refused as such, before any workspace rule
    call.grad_out.t.device = {kDLCPU, 0};
    call.workspace.t.byte_offset = 3;
    EXPECT_EQ(message_of(call.plan()).rfind("gate_residual_rms_norm_backward: grad_out", 0), 0u);
  }
  {
    BackwardCall call;  // the forward gathers shift and scale with the gate's rows
    call.gate.shape[0] = 8;
    call.d_gate.shape[0] = 8;
    const std::string m = message_of(call.plan());
    EXPECT_EQ(m, "gate_residual_rms_norm_backward: scale must have the gate's 8 rows, as in the forward (got 9)") << m;
  }
  {
    BackwardCall call;
    call.d_gate.shape[0] = 8;
    EXPECT_EQ(message_of(call.plan()).rfind("gate_residual_rms_norm_backward: d_gate", 0), 0u);
  }
}

}  // namespace
}  // namespace exactjit
