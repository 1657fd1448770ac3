// Segment plan rules on the host model (stable order, tiles that never span rows and hold at most
// 256 positions, empty rows, one row, every position in one row, S = 1, bad keys left out), the
// workspace layout, and the backward planners' validation (fake device addresses: planning
// touches no memory).
#include "kernels/adaln_row_gather_backward.hpp"
#include "kernels/backward_check.hpp"
#include "kernels/catalog.hpp"
#include "kernels/gate_residual_backward.hpp"
#include "kernels/rms_norm_backward.hpp"
#include "kernels/segment_plan.hpp"
#include "kernels/segment_plan_model.hpp"
#include "runtime/errors.hpp"
#include "support/fake_tensor.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <random>

namespace exactjit {
namespace {

// Checks every rule of a plan built from `keys` with `batch` copies.
void expect_valid_plan(const std::vector<int64_t>& keys, int64_t table_rows, int64_t batch) {
  const SegmentPlanModel plan = segment_plan_model(keys, table_rows, batch);
  const int64_t seq = static_cast<int64_t>(keys.size());
  // Each row's tiles, concatenated, are its positions for b = 0..B-1 in ascending order.
  for (int64_t k = 0; k < table_rows; ++k) {
    std::vector<int64_t> expected;
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t s = 0; s < seq; ++s)
        if (keys[s] == k) expected.push_back(b * seq + s);
    std::vector<int64_t> got;
    for (int64_t t = plan.row_tile_start[k]; t < plan.row_tile_start[k + 1]; ++t) {
      EXPECT_EQ(plan.tile_row[t], k);
      const std::vector<int64_t> rows = segment_tile_rows(plan, t);
      EXPECT_GE(rows.size(), 1u);
      EXPECT_LE(static_cast<int64_t>(rows.size()), kTilePositions);
      // Only the last tile of a row may be short.
      if (t + 1 < plan.row_tile_start[k + 1]) {
        EXPECT_EQ(static_cast<int64_t>(rows.size()), kTilePositions);
      }
      got.insert(got.end(), rows.begin(), rows.end());
    }
    EXPECT_EQ(got, expected) << "row " << k;
  }
  // The launch's tile bound covers every plan.
  const SegmentLayout layout = segment_layout(seq * batch, seq, table_rows);
  EXPECT_LE(static_cast<int64_t>(plan.tile_row.size()), layout.max_tiles);
}

TEST(SegmentPlan, StableOrderAndTileRulesOnRandomKeys) {
  std::mt19937_64 rng(7);
  for (int64_t seq : {1, 2, 255, 256, 257, 1000, 4097}) {
    for (int64_t batch : {1, 2, 3}) {
      std::vector<int64_t> keys(static_cast<size_t>(seq));
      for (int64_t& k : keys) k = static_cast<int64_t>(rng() % 9);
      expect_valid_plan(keys, 9, batch);
    }
  }
}

TEST(SegmentPlan, EmptyRowsOneRowAndEverythingInOneRow) {
  std::vector<int64_t> keys(1000, 4);  // every position in row 4 of 9; rows 0-3 and 5-8 empty
  expect_valid_plan(keys, 9, 2);
  const SegmentPlanModel plan = segment_plan_model(keys, 9, 2);
  for (int64_t k = 0; k < 9; ++k)
    EXPECT_EQ(plan.row_tile_start[k + 1] - plan.row_tile_start[k], k == 4 ? (2000 + 255) / 256 : 0);
  expect_valid_plan(std::vector<int64_t>(300, 0), 1, 1);  // one table row
  expect_valid_plan({0}, 1, 1);                           // S = 1
  expect_valid_plan({2}, 3, 5);                           // S = 1, batch 5
}

TEST(SegmentPlan, BadKeysAreInNoRow) {
  std::vector<int64_t> keys = {0, -1, 1, -1, 0, 2};
  const SegmentPlanModel plan = segment_plan_model(keys, 3, 1);
  EXPECT_EQ(plan.sorted, (std::vector<int32_t>{0, 4, 2, 5}));
  expect_valid_plan(keys, 3, 2);
}

TEST(SegmentPlan, WorkspaceRegionsAreAlignedAndDisjoint) {
  const SegmentLayout l = segment_layout(2 * 131072, 131072, 24);
  const int64_t offsets[] = {l.keys, l.chunk_counts, l.row_count, l.row_start, l.row_tile_start, l.tile_row, l.sorted,
                             l.end};
  for (int64_t offset : offsets) EXPECT_EQ(offset % 256, 0);
  for (size_t i = 0; i + 1 < std::size(offsets); ++i) EXPECT_LT(offsets[i], offsets[i + 1]);
  EXPECT_GE(l.chunk_counts - l.keys, 4 * 131072);
  EXPECT_EQ(l.chunks, 131072 / kChunkPositions);
  EXPECT_EQ(l.max_tiles, 2 * 131072 / 256 + 24);
  EXPECT_GE(l.end - l.sorted, 4 * 131072);
}

TEST(SegmentPlan, WorkspaceSizesRefuseInvalidShapes) {
  EXPECT_EQ(gate_residual_backward_workspace(10, 3, 9, 64), -1);  // S does not divide M
  EXPECT_EQ(gate_residual_backward_workspace(10, 5, 0, 64), -1);
  EXPECT_GT(gate_residual_backward_workspace(10, 5, 9, 64), 0);
  EXPECT_EQ(rms_norm_backward_workspace(8, 4, 3, 6, false), -1);  // H % 4 != 0
  EXPECT_GT(rms_norm_backward_workspace(8, 4, 3, 8, true), rms_norm_backward_workspace(8, 4, 3, 8, false));
  EXPECT_EQ(adaln_row_gather_backward_workspace(5, 4, 8), -1);  // R not a multiple of 3
  EXPECT_GT(adaln_row_gather_backward_workspace(5, 9, 8), 0);
}

// Sizes whose workspace needs more than 64 bits: the queries answer exactly -1 (the documented
// "invalid"), never a wrapped or other negative size a caller would allocate and hand back.
TEST(SegmentPlan, WorkspaceSizesThatOverflowAreMinusOne) {
  constexpr int64_t kHuge = int64_t{1} << 62, kMax = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(gate_residual_backward_workspace(kHuge, kHuge, 9, 64), -1);  // 4 bytes per position
  EXPECT_EQ(gate_residual_backward_workspace(kHuge, 1, 9, 65536), -1);  // tiles x H partials
  EXPECT_EQ(gate_residual_backward_workspace(kHuge, 1, kMax, 64), -1);
  EXPECT_EQ(rms_norm_backward_workspace(kHuge, 1, 0, 65536, true), -1);  // the dweight tiles
  EXPECT_EQ(rms_norm_backward_workspace(kHuge, kHuge, 9, 64, false), -1);
  EXPECT_EQ(rms_norm_backward_workspace(kMax - 7, 1, kMax, 8, false), -1);
  EXPECT_EQ(adaln_row_gather_backward_workspace(kHuge, 9, 65536), -1);
  EXPECT_EQ(adaln_row_gather_backward_workspace(kMax, kMax - 1, 1), -1);  // R a multiple of 3
  // Large but representable: a size, 256-byte aligned.
  const int64_t big = gate_residual_backward_workspace(int64_t{1} << 40, int64_t{1} << 20, 4096, 65536);
  EXPECT_GT(big, int64_t{1} << 40);
  EXPECT_EQ(big % 256, 0);
  const SegmentLayout layout = segment_layout(kHuge, kHuge, 9);
  EXPECT_EQ(layout.end, -1);
}

// A planner handed a query's -1 must not accept whatever workspace it gets (any size is >= -1).
TEST(SegmentPlan, AWorkspaceThatCannotBeSizedIsRefused) {
  test::FakeTensor workspace{test::GiB, {1 << 20}, test::kU8};
  auto err = require_workspace({"op", "workspace"}, &workspace.t, -1);
  ASSERT_TRUE(static_cast<bool>(err));
  const ErrorReport report = take_error(std::move(err));
  EXPECT_EQ(report.code, ErrorCode::InvalidArgument);
  EXPECT_NE(report.message.find("op: workspace cannot be sized for these shapes"), std::string::npos) << report.message;
  EXPECT_FALSE(static_cast<bool>(require_workspace({"op", "workspace"}, &workspace.t, 1 << 20)));
}

// --- backward planners ------------------------------------------------------------------------

using test::FakeTensor;
using test::kBF16;
using test::kF32;
using test::kI64;
using test::kU8;
using test::GiB;
using test::message_of;
constexpr int64_t H = 5376;

struct GateBackwardCall {
  FakeTensor grad{1 * GiB, {2, 7, H}, kBF16};
  FakeTensor gate{2 * GiB + 2 * H * 2, {9, H}, kBF16, {6 * H, 1}};
  FakeTensor index{3 * GiB, {7}, kI64};
  FakeTensor y{4 * GiB, {2, 7, H}, kBF16};
  FakeTensor d_y{5 * GiB, {2, 7, H}, kBF16};
  FakeTensor d_gate{6 * GiB, {9, H}, kBF16};
  FakeTensor workspace{7 * GiB, {gate_residual_backward_workspace(14, 7, 9, H)}, kU8};
  llvm::Expected<LaunchSequence> plan() {
    return plan_gate_residual_backward({grad.t, gate.t, index.t, y.t, &d_y.t, &d_gate.t, &workspace.t});
  }
};


TEST(GateResidualBackwardValidation, PlansPlanTilesAndFold) {
  GateBackwardCall call;
  auto sequence = call.plan();
  ASSERT_TRUE(static_cast<bool>(sequence)) << llvm::toString(sequence.takeError());
  ASSERT_EQ(sequence->count, 5);
  const OpCode expected[] = {Op::SegmentCount, Op::SegmentScan, Op::SegmentScatter, Op::GateResidualBackward,
                             Op::SegmentFold};
  for (int i = 0; i < 5; ++i) EXPECT_EQ(sequence->steps[i].spec.op, expected[i]) << i;
  EXPECT_EQ(sequence->steps[3].spec.vec, 8);
  EXPECT_EQ(sequence->steps[3].spec.table_stride, 6 * H);
  EXPECT_EQ(sequence->steps[3].grid_y, 6u);  // column slices of 128 packs (H / 8 = 672)
  EXPECT_EQ(sequence->steps[4].grid_y, 9u);  // one fold row per table row
}

// d_gate may be float32 (the fold's one rounding to fp32; the tiles are the same); fp16 for bf16
// activations is refused by name.
TEST(GateResidualBackwardValidation, TakesAFloat32TableGradient) {
  GateBackwardCall call;
  call.d_gate.t.dtype = test::kF32;
  auto sequence = call.plan();
  ASSERT_TRUE(static_cast<bool>(sequence)) << llvm::toString(sequence.takeError());
  EXPECT_EQ(sequence->steps[3].spec.dtype, DType::BF16);  // the tiles read bf16 grad and y
  EXPECT_EQ(sequence->steps[4].spec.op, Op::SegmentFold);
  EXPECT_EQ(sequence->steps[4].spec.dtype, DType::F32);  // the fold writes fp32
  call.d_gate.t.dtype = test::kF16;
  EXPECT_EQ(message_of(call.plan()), "gate_residual_backward: d_gate must be in y's dtype bf16 or float32 (got fp16)");
}

TEST(GateResidualBackwardValidation, RefusesBadWorkspaceAndTables) {
  {
    GateBackwardCall call;
    call.workspace.shape[0] -= 1;
    EXPECT_NE(message_of(call.plan()).find("gate_residual_backward: workspace must hold at least"), std::string::npos);
  }
  {
    GateBackwardCall call;
    call.workspace.t.dtype = kF32;
    EXPECT_NE(message_of(call.plan()).find("uint8"), std::string::npos);
  }
  {
    GateBackwardCall call;
    call.gate.shape[0] = kMaxPlanTableRows + 1;
    call.d_gate.shape[0] = kMaxPlanTableRows + 1;
    EXPECT_NE(message_of(call.plan()).find("rows for the backward's segment plan"), std::string::npos);
  }
  {
    GateBackwardCall call;
    call.d_gate.shape[0] = 8;
    EXPECT_NE(message_of(call.plan()).find("d_gate must be (9, 5376) in bf16"), std::string::npos);
  }
  {
    GateBackwardCall call;
    call.d_y.t.data = call.y.t.data;  // d_y over an input
    EXPECT_NE(message_of(call.plan()).find("must not overlap"), std::string::npos);
  }
}

// Holes an adversarial review found: each call below used to be accepted.
TEST(GateResidualBackwardValidation, RefusesAliasedOutputsWrappedAddressesAndEmptyLanes) {
  {
    GateBackwardCall call;  // the workspace is d_y's memory
    call.workspace.t.data = call.d_y.t.data;
    EXPECT_NE(message_of(call.plan()).find("must not overlap"), std::string::npos);
  }
  {
    GateBackwardCall call;  // lanes = 0 made the element size 0: no alignment or overlap check
    call.workspace.t.dtype.lanes = 0;
    call.workspace.t.data = call.d_y.t.data;
    EXPECT_NE(message_of(call.plan()).find("workspace must have one lane of whole bytes"), std::string::npos);
  }
  {
    GateBackwardCall call;  // data + byte_offset wraps past 2^64 (to null)
    call.grad.t.byte_offset = ~uint64_t{0} - (1 * GiB) + 1;
    EXPECT_NE(message_of(call.plan()).find("grad has data + byte_offset beyond 64 bits"), std::string::npos);
  }
}

// dx of qk-norm's rows (H = 128): one warp per row, four rows to a block.
TEST(RmsNormBackwardValidation, RowsOfAtMost32QuadsTakeOneWarpEach) {
  constexpr int64_t kHead = 128;
  FakeTensor grad{1 * GiB, {2, 7, kHead}, kBF16}, x{2 * GiB, {2, 7, kHead}, kBF16}, weight{3 * GiB, {kHead}, kBF16};
  FakeTensor rstd{5 * GiB, {14}, kF32}, dx{6 * GiB, {2, 7, kHead}, kBF16};
  auto sequence = plan_rms_norm_backward(
      {grad.t, x.t, &weight.t, nullptr, nullptr, rstd.t, 1e-5, &dx.t, nullptr, nullptr, nullptr, nullptr});
  ASSERT_TRUE(static_cast<bool>(sequence)) << llvm::toString(sequence.takeError());
  ASSERT_EQ(sequence->count, 1);
  EXPECT_EQ(sequence->steps[0].grid, 4u);  // ceil(14 / 4)
  EXPECT_EQ(sequence->steps[0].threads, 128u);
}

// Each parameter gradient may be float32 on its own (its fold writes fp32); fp16 for bf16 x is
// refused by name.
TEST(RmsNormBackwardValidation, ParameterGradientsMayBeFloat32) {
  FakeTensor grad{1 * GiB, {2, 7, H}, kBF16}, x{2 * GiB, {2, 7, H}, kBF16}, weight{10 * GiB, {H}, kBF16};
  FakeTensor scale{3 * GiB + H * 2, {9, H}, kBF16, {6 * H, 1}}, index{4 * GiB, {7}, kI64};
  FakeTensor rstd{5 * GiB, {14}, kF32}, dx{6 * GiB, {2, 7, H}, kBF16}, dshift{7 * GiB, {9, H}, kF32};
  FakeTensor dscale{8 * GiB, {9, H}, kBF16}, dweight{11 * GiB, {H}, kF32};
  FakeTensor workspace{9 * GiB, {rms_norm_backward_workspace(14, 7, 9, H, true)}, kU8};
  auto plan = [&] {
    return plan_rms_norm_backward({grad.t, x.t, &weight.t, &scale.t, &index.t, rstd.t, 1e-5, &dx.t, &dweight.t,
                                   &dshift.t, &dscale.t, &workspace.t});
  };
  auto sequence = plan();
  ASSERT_TRUE(static_cast<bool>(sequence)) << llvm::toString(sequence.takeError());
  ASSERT_EQ(sequence->count, 8);  // plan (3), dx, tiles, folds of dshift, dscale, dweight
  EXPECT_EQ(sequence->steps[4].spec.dtype, DType::BF16);  // the tiles read bf16
  EXPECT_EQ(sequence->steps[5].spec.dtype, DType::F32);   // dshift
  EXPECT_EQ(sequence->steps[6].spec.dtype, DType::BF16);  // dscale
  EXPECT_EQ(sequence->steps[7].spec.dtype, DType::F32);   // dweight
  dscale.t.dtype = test::kF16;
  EXPECT_EQ(message_of(plan()), "rms_norm_backward: dscale must be in x's dtype bf16 or float32 (got fp16)");
}

// rms_norm's parameter tiles own one column a thread where their launch would give the device's
// SMs fewer than four blocks each (a tile's walk over its rows is serial; the sums are the same),
// quads otherwise and for an unknown device.
TEST(BackwardTiles, OneColumnAThreadWhereTheLaunchDoesNotFillTheDevice) {
  auto tiles_of = [](llvm::Expected<LaunchSequence> sequence, OpCode op) {
    EXPECT_TRUE(static_cast<bool>(sequence)) << llvm::toString(sequence.takeError());
    for (int k = 0; sequence && k < sequence->count; ++k)
      if (sequence->steps[k].spec.op == op) return std::pair{sequence->steps[k].spec.vec, sequence->steps[k].grid_y};
    ADD_FAILURE() << "no tile launch";
    return std::pair{0, 0u};
  };
  // Modulated: 14 rows, 9 table rows: 1 + 9 = 10 plan tiles x 11 slices of 128 quads = 110 blocks.
  FakeTensor grad{1 * GiB, {2, 7, H}, kBF16}, x{2 * GiB, {2, 7, H}, kBF16}, weight{10 * GiB, {H}, kBF16};
  FakeTensor scale{3 * GiB + H * 2, {9, H}, kBF16, {6 * H, 1}}, index{4 * GiB, {7}, kI64};
  FakeTensor rstd{5 * GiB, {14}, kF32}, dx{6 * GiB, {2, 7, H}, kBF16}, dshift{7 * GiB, {9, H}, kBF16};
  FakeTensor dscale{8 * GiB, {9, H}, kBF16}, dweight{11 * GiB, {H}, kBF16};
  FakeTensor workspace{9 * GiB, {rms_norm_backward_workspace(14, 7, 9, H, true)}, kU8};
  auto modulated = [&](DeviceTraits device) {
    return plan_rms_norm_backward({grad.t, x.t, &weight.t, &scale.t, &index.t, rstd.t, 1e-5, &dx.t, &dweight.t,
                                   &dshift.t, &dscale.t, &workspace.t},
                                  device);
  };
  EXPECT_EQ(tiles_of(modulated({}), Op::RmsNormTableGrad), std::pair(4, 11u));
  EXPECT_EQ(tiles_of(modulated({90, 27}), Op::RmsNormTableGrad), std::pair(4, 11u));
  EXPECT_EQ(tiles_of(modulated({90, 28}), Op::RmsNormTableGrad), std::pair(1, 42u));
  // plain: one tile of 14 consecutive rows x 11 slices = 11 blocks.
  FakeTensor plain_workspace{9 * GiB, {rms_norm_backward_workspace(14, 14, 0, H, true)}, kU8};
  auto plain = [&](DeviceTraits device) {
    return plan_rms_norm_backward({grad.t, x.t, &weight.t, nullptr, nullptr, rstd.t, 1e-5, &dx.t, &dweight.t, nullptr,
                                   nullptr, &plain_workspace.t},
                                  device);
  };
  EXPECT_EQ(tiles_of(plain({90, 2}), Op::RmsNormWeightGrad), std::pair(4, 11u));
  EXPECT_EQ(tiles_of(plain({90, 3}), Op::RmsNormWeightGrad), std::pair(1, 42u));
  // Both widths are catalog kernels that every target builds.
  KernelSpec narrow = make_spec(Op::RmsNormTableGrad, DType::BF16, IndexType::I64, H, 0, 1, true);
  narrow.target = Target{90, false};
  EXPECT_EQ(llvm::toString(validate_spec(narrow)), "");
  narrow.vec = 2;
  EXPECT_NE(llvm::toString(validate_spec(narrow)).find("a quad or one column a thread"), std::string::npos);
}

// The one-pass kernel replaces dx and the parameter tiles on sm_90 (bulk copies) where the plan's
// tiles fill at least half its SMs, for modulated bf16 rows of 16 bytes; everything
// else keeps the two kernels. Its launch: one block per plan tile, 128 dot threads, 32 per 64
// column quads and a producer warp, stages of three rows and the weight and m rows in shared
// memory.
TEST(RmsNormBackwardValidation, OnePassWhereTheDeviceAndTheCallAllowIt) {
  constexpr int64_t kS = 4096;
  auto ops_of = [](const LaunchSequence& sequence) {
    std::vector<OpCode> ops;
    for (int k = 0; k < sequence.count; ++k) ops.push_back(sequence.steps[k].spec.op);
    return ops;
  };
  FakeTensor grad{1 * GiB, {kS, H}, kBF16}, x{2 * GiB, {kS, H}, kBF16}, weight{10 * GiB, {H}, kBF16};
  FakeTensor scale{3 * GiB + H * 2, {9, H}, kBF16, {6 * H, 1}}, index{4 * GiB, {kS}, kI64};
  FakeTensor rstd{5 * GiB, {kS}, kF32}, dx{6 * GiB, {kS, H}, kBF16}, dshift{7 * GiB, {9, H}, kBF16};
  FakeTensor dscale{8 * GiB, {9, H}, kBF16}, dweight{11 * GiB, {H}, kBF16};
  FakeTensor workspace{9 * GiB, {rms_norm_backward_workspace(kS, kS, 9, H, true)}, kU8};
  auto plan = [&](DeviceTraits device) {
    return plan_rms_norm_backward({grad.t, x.t, &weight.t, &scale.t, &index.t, rstd.t, 1e-5, &dx.t, &dweight.t,
                                   &dshift.t, &dscale.t, &workspace.t},
                                  device);
  };
  // max_tiles = 16 + 9 = 25 plan tiles.
  auto one_pass = plan({90, 50});
  ASSERT_TRUE(static_cast<bool>(one_pass)) << llvm::toString(one_pass.takeError());
  const std::vector<OpCode> fused = {Op::SegmentCount, Op::SegmentScan, Op::SegmentScatter, Op::RmsNormOnePass,
                                     Op::SegmentFold,  Op::SegmentFold, Op::SegmentFold};
  EXPECT_EQ(ops_of(*one_pass), fused);
  const LaunchPlan& pass = one_pass->steps[3];
  EXPECT_EQ(pass.grid, 25u);
  EXPECT_EQ(pass.threads, 128u + 672u + 32u);  // 1344 quads, two per element thread; the producer
  EXPECT_EQ(pass.shared_bytes, (4u * 3 + 2) * H * 2);
  EXPECT_EQ(pass.params[1], 0u);  // no residual gradient
  KernelSpec on_hopper = pass.spec;
  on_hopper.target = Target{90, false};
  EXPECT_EQ(llvm::toString(validate_spec(on_hopper)), "");
  const std::vector<OpCode> two_kernels = {Op::SegmentCount, Op::SegmentScan, Op::SegmentScatter,
                                           Op::RmsNormBackward, Op::RmsNormTableGrad, Op::SegmentFold,
                                           Op::SegmentFold,  Op::SegmentFold};
  for (DeviceTraits device :
       {DeviceTraits{}, DeviceTraits{80, 50}, DeviceTraits{100, 50}, DeviceTraits{90, 52}, DeviceTraits{90, 132}}) {
    auto sequence = plan(device);  // unknown, not sm_90, 25 tiles for 52 or 132 SMs
    ASSERT_TRUE(static_cast<bool>(sequence)) << llvm::toString(sequence.takeError());
    EXPECT_EQ(ops_of(*sequence), two_kernels) << device.sm << " " << device.multiprocessors;
  }
  {
    FakeTensor x8{2 * GiB + 8, {kS, H}, kBF16};  // rows 8-byte aligned only: no bulk copies
    auto sequence = plan_rms_norm_backward({grad.t, x8.t, &weight.t, &scale.t, &index.t, rstd.t, 1e-5, &dx.t,
                                            &dweight.t, &dshift.t, &dscale.t, &workspace.t},
                                           {90, 50});
    ASSERT_TRUE(static_cast<bool>(sequence)) << llvm::toString(sequence.takeError());
    EXPECT_EQ(ops_of(*sequence), two_kernels);
  }
  {
    // fp32 rows keep the two kernels.
    FakeTensor g32{1 * GiB, {kS, H}, kF32}, x32{2 * GiB, {kS, H}, kF32}, w32{10 * GiB, {H}, kF32};
    FakeTensor scale32{3 * GiB + H * 4, {9, H}, kF32, {6 * H, 1}}, dx32{6 * GiB, {kS, H}, kF32};
    FakeTensor dshift32{7 * GiB, {9, H}, kF32}, dscale32{8 * GiB, {9, H}, kF32};
    auto sequence = plan_rms_norm_backward({g32.t, x32.t, &w32.t, &scale32.t, &index.t, rstd.t, 1e-5, &dx32.t,
                                            nullptr, &dshift32.t, &dscale32.t, &workspace.t},
                                           {90, 50});
    ASSERT_TRUE(static_cast<bool>(sequence)) << llvm::toString(sequence.takeError());
    EXPECT_EQ(ops_of(*sequence)[3], Op::RmsNormBackward);
    EXPECT_EQ(ops_of(*sequence)[4], Op::RmsNormTableGrad);
  }
  // The rule names what the kernel needs.
  KernelSpec old_target = pass.spec;
  old_target.target = Target{80, false};
  EXPECT_NE(llvm::toString(validate_spec(old_target)).find("is built for sm_90 (bulk copies; the target is sm_80)"),
            std::string::npos);
}

TEST(RmsNormBackwardValidation, ModulatedCallPlansEveryGradient) {
  FakeTensor grad{1 * GiB, {2, 7, H}, kBF16}, x{2 * GiB, {2, 7, H}, kBF16};
  FakeTensor scale{3 * GiB + H * 2, {9, H}, kBF16, {6 * H, 1}}, index{4 * GiB, {7}, kI64};
  FakeTensor rstd{5 * GiB, {14}, kF32}, dx{6 * GiB, {2, 7, H}, kBF16}, dshift{7 * GiB, {9, H}, kBF16};
  FakeTensor dscale{8 * GiB, {9, H}, kBF16};
  FakeTensor workspace{9 * GiB, {rms_norm_backward_workspace(14, 7, 9, H, false)}, kU8};
  auto sequence = plan_rms_norm_backward(
      {grad.t, x.t, nullptr, &scale.t, &index.t, rstd.t, 1e-5, &dx.t, nullptr, &dshift.t, &dscale.t, &workspace.t});
  ASSERT_TRUE(static_cast<bool>(sequence)) << llvm::toString(sequence.takeError());
  const OpCode expected[] = {Op::SegmentCount,     Op::SegmentScan, Op::SegmentScatter, Op::RmsNormBackward,
                             Op::RmsNormTableGrad, Op::SegmentFold, Op::SegmentFold};
  ASSERT_EQ(sequence->count, 7);
  for (int i = 0; i < 7; ++i) EXPECT_EQ(sequence->steps[i].spec.op, expected[i]) << i;
  EXPECT_EQ(sequence->steps[3].grid, 14u);  // dx: one row per block
  // dweight without the forward's weight is refused.
  FakeTensor dweight{10 * GiB, {H}, kBF16};
  EXPECT_NE(message_of(plan_rms_norm_backward({grad.t, x.t, nullptr, &scale.t, &index.t, rstd.t, 1e-5, &dx.t,
                                               &dweight.t, nullptr, nullptr, &workspace.t}))
                .find("rms_norm_backward: dweight needs the forward's weight"),
            std::string::npos);
  // One tensor passed as both dshift and dscale (the same DLTensor: it used to skip the check).
  EXPECT_NE(message_of(plan_rms_norm_backward({grad.t, x.t, nullptr, &scale.t, &index.t, rstd.t, 1e-5, &dx.t, nullptr,
                                               &dshift.t, &dshift.t, &workspace.t}))
                .find("must not overlap dshift"),
            std::string::npos);
  // eps must be what a forward accepts.
  EXPECT_NE(message_of(plan_rms_norm_backward({grad.t, x.t, nullptr, &scale.t, &index.t, rstd.t, -1.0, &dx.t, nullptr,
                                               &dshift.t, &dscale.t, &workspace.t}))
                .find("rms_norm_backward: eps must be finite and >= 0"),
            std::string::npos);
  // The dx kernel takes eps as a double after grad, the residual gradient (none: 0), x, weight,
  // scale, index and rstd.
  EXPECT_EQ(sequence->steps[3].params[1], 0u);
  double eps = 0;
  std::memcpy(&eps, &sequence->steps[3].params[7], sizeof eps);
  EXPECT_EQ(eps, 1e-5);
}

// Sequence parallelism folds a shard's tile partials elsewhere: given tile_partials, the backward
// writes each asked gradient's partials to the caller's tensor and runs no dx and no fold; on sm_90
// too (the one-pass kernel needs dx). Plain, dweight's tiles of consecutive rows.
TEST(RmsNormBackwardValidation, TilePartialsGoToTheCallersTensorsUnfolded) {
  constexpr int64_t kS = 4096;
  FakeTensor grad{1 * GiB, {kS, H}, kBF16}, x{2 * GiB, {kS, H}, kBF16}, weight{10 * GiB, {H}, kBF16};
  FakeTensor scale{3 * GiB + H * 2, {9, H}, kBF16, {6 * H, 1}}, index{4 * GiB, {kS}, kI64}, rstd{5 * GiB, {kS}, kF32};
  const int64_t tiles = rms_norm_backward_partial_tiles(kS, kS, 9);
  EXPECT_EQ(tiles, 16 + 9);
  EXPECT_EQ(rms_norm_backward_partial_tiles(kS, kS, 0), 16);
  EXPECT_EQ(rms_norm_backward_partial_tiles(kS, 7, 9), -1);
  FakeTensor shift_p{6 * GiB, {tiles, H}, kF32}, scale_p{7 * GiB, {tiles, H}, kF32},
             weight_p{8 * GiB, {tiles, H}, kF32};
  FakeTensor workspace{9 * GiB, {rms_norm_backward_workspace(kS, kS, 9, H, true)}, kU8};
  auto plan = [&](const RmsNormTilePartials& partials, const DLTensor* scale_t, const DLTensor* weight_t,
                  const DLTensor* dx = nullptr) {
    RmsNormBackwardArgs args{grad.t, x.t, weight_t, scale_t, scale_t ? &index.t : nullptr, rstd.t, 0.0, dx,
                             nullptr, nullptr, nullptr, &workspace.t};
    args.tile_partials = &partials;
    return plan_rms_norm_backward(args, {90, 50});
  };
  auto modulated = plan({&shift_p.t, &scale_p.t, &weight_p.t}, &scale.t, &weight.t);
  ASSERT_TRUE(static_cast<bool>(modulated)) << llvm::toString(modulated.takeError());
  ASSERT_EQ(modulated->count, 4);  // the plan (3), the tiles; no fold
  const LaunchPlan& tile_pass = modulated->steps[3];
  EXPECT_EQ(tile_pass.spec.op, Op::RmsNormTableGrad);
  EXPECT_EQ(tile_pass.grid, static_cast<uint32_t>(tiles));
  EXPECT_EQ(tile_pass.params[5], 6 * GiB);  // dshift's, dscale's, dweight's partials
  EXPECT_EQ(tile_pass.params[6], 7 * GiB);
  EXPECT_EQ(tile_pass.params[7], 8 * GiB);
  auto weight_only = plan({nullptr, nullptr, &weight_p.t}, &scale.t, &weight.t);
  ASSERT_TRUE(static_cast<bool>(weight_only)) << llvm::toString(weight_only.takeError());
  EXPECT_EQ(weight_only->steps[3].params[5], 0u);
  EXPECT_EQ(weight_only->steps[3].params[7], 8 * GiB);
  auto plain = plan({nullptr, nullptr, &weight_p.t}, nullptr, &weight.t);
  ASSERT_TRUE(static_cast<bool>(plain)) << llvm::toString(plain.takeError());
  ASSERT_EQ(plain->count, 1);
  EXPECT_EQ(plain->steps[0].spec.op, Op::RmsNormWeightGrad);
  EXPECT_EQ(plain->steps[0].grid, 16u);
  EXPECT_EQ(plain->steps[0].params[5], 8 * GiB);

  FakeTensor dx{11 * GiB, {kS, H}, kBF16};
  EXPECT_EQ(message_of(plan({&shift_p.t, nullptr, nullptr}, &scale.t, &weight.t, &dx.t)),
            "rms_norm_backward: tile_partials are asked for alone: dx and the folded gradients must be null");
  EXPECT_EQ(message_of(plan({nullptr, nullptr, &weight_p.t}, &scale.t, nullptr)),
            "rms_norm_backward: weight_partials needs the forward's weight");
  EXPECT_EQ(message_of(plan({&shift_p.t, nullptr, nullptr}, nullptr, &weight.t)),
            "rms_norm_backward: shift_partials needs scale and index (the modulated form)");
  FakeTensor short_p{6 * GiB, {tiles - 1, H}, kF32};
  EXPECT_EQ(message_of(plan({&short_p.t, nullptr, nullptr}, &scale.t, &weight.t)),
            "rms_norm_backward: shift_partials must be (P, 5376) float32 contiguous with P >= 25 tiles (got fp32 "
            "(24, 5376))");
  FakeTensor bf16_p{6 * GiB, {tiles, H}, kBF16};
  EXPECT_NE(message_of(plan({nullptr, &bf16_p.t, nullptr}, &scale.t, &weight.t))
                .find("scale_partials must be (P, 5376) float32"),
            std::string::npos);
  EXPECT_NE(message_of(plan({&shift_p.t, &shift_p.t, nullptr}, &scale.t, &weight.t)).find("must not overlap"),
            std::string::npos);
}

TEST(AdalnRowGatherBackwardValidation, PlansTwoIndexKeysAndSixChunks) {
  FakeTensor grad{1 * GiB, {6, 7, H}, kBF16}, ti{2 * GiB, {7}, kI64}, tags{3 * GiB, {7}, kI64};
  FakeTensor d_rows{4 * GiB, {9, 6 * H}, kF32};
  FakeTensor workspace{5 * GiB, {adaln_row_gather_backward_workspace(7, 9, H)}, kU8};
  auto sequence = plan_adaln_row_gather_backward({grad.t, ti.t, tags.t, d_rows.t, &workspace.t});
  ASSERT_TRUE(static_cast<bool>(sequence)) << llvm::toString(sequence.takeError());
  ASSERT_EQ(sequence->count, 5);
  EXPECT_EQ(sequence->steps[0].spec.key_tensors, 2);  // key = t * 3 + tag
  EXPECT_EQ(sequence->steps[0].params[4], 3u);   // t is checked against T = R / 3
  EXPECT_EQ(sequence->steps[3].grid_y, 6u * 6u);  // six chunks x six slices of 128 packs (H / 8 = 672)
  EXPECT_EQ(sequence->steps[4].spec.dtype, DType::F32);
}

// The size caps (kernels/spec_limits.hpp): H = 65536 plans, one step past it is refused with the
// field and the cap named (a spec past it would fail in NVRTC or compile for minutes).
TEST(BackwardValidation, HiddenSizeIsCappedAt65536) {
  auto gate_backward = [](int64_t h) {
    FakeTensor grad{1 * GiB, {1, 7, h}, kBF16}, gate{2 * GiB, {9, h}, kBF16}, index{3 * GiB, {7}, kI64};
    FakeTensor y{4 * GiB, {1, 7, h}, kBF16}, d_y{5 * GiB, {1, 7, h}, kBF16};
    FakeTensor workspace{6 * GiB, {1 << 30}, kU8};
    return message_of(plan_gate_residual_backward({grad.t, gate.t, index.t, y.t, &d_y.t, nullptr, &workspace.t}));
  };
  auto norm_backward = [](int64_t h) {
    FakeTensor grad{1 * GiB, {7, h}, kBF16}, x{2 * GiB, {7, h}, kBF16}, rstd{3 * GiB, {7}, kF32};
    FakeTensor dx{4 * GiB, {7, h}, kBF16};
    return message_of(plan_rms_norm_backward(
        {grad.t, x.t, nullptr, nullptr, nullptr, rstd.t, 1e-5, &dx.t, nullptr, nullptr, nullptr, nullptr}));
  };
  auto gather_backward = [](int64_t h) {
    FakeTensor grad{1 * GiB, {6, 7, h}, kBF16}, ti{2 * GiB, {7}, kI64}, tags{3 * GiB, {7}, kI64};
    FakeTensor d_rows{4 * GiB, {9, 6 * h}, kF32}, workspace{6 * GiB, {1 << 30}, kU8};
    return message_of(plan_adaln_row_gather_backward({grad.t, ti.t, tags.t, d_rows.t, &workspace.t}));
  };
  EXPECT_EQ(gate_backward(65536), "accepted");
  EXPECT_NE(gate_backward(65537).find("gate_residual_backward: y hidden size H must be in [1, 65536] (got 65537)"),
            std::string::npos);
  EXPECT_EQ(norm_backward(65536), "accepted");
  EXPECT_NE(norm_backward(65540).find("rms_norm_backward: x hidden size H must be in [1, 65536] (got 65540)"),
            std::string::npos);
  EXPECT_EQ(gather_backward(65536), "accepted");
  EXPECT_NE(gather_backward(65537).find("adaln_row_gather_backward: grad hidden size H must be in [1, 65536]"),
            std::string::npos);
  // The workspace queries agree: no size for a shape the planners refuse.
  EXPECT_GT(gate_residual_backward_workspace(7, 7, 9, 65536), 0);
  EXPECT_EQ(gate_residual_backward_workspace(7, 7, 9, 65537), -1);
  EXPECT_EQ(rms_norm_backward_workspace(7, 7, 9, 65540, true), -1);
  EXPECT_EQ(adaln_row_gather_backward_workspace(7, 9, 65537), -1);
}

}  // namespace
}  // namespace exactjit
