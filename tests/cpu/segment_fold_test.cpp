// segment_fold, the fold of given tile partials (sequence parallelism): what it plans and the rules
// it refuses by name (fake device addresses: planning touches no memory).
#include "kernels/segment_fold.hpp"
#include "kernels/segment_plan.hpp"
#include "runtime/errors.hpp"
#include "support/fake_tensor.hpp"

#include <gtest/gtest.h>

namespace exactjit {
namespace {

using test::FakeTensor;
using test::GiB;
constexpr int64_t H = 5376;

// M = 14 rows (B = 2 copies of S = 7), R = 9 table rows: the plan has at most 1 + 9 tiles.
struct FoldCall {
  FakeTensor partials{1 * GiB, {10, H}, test::kF32};
  FakeTensor index{2 * GiB, {7}, test::kI64};
  int64_t rows = 14;
  FakeTensor out{3 * GiB, {9, H}, test::kBF16};
  FakeTensor workspace{4 * GiB, {segment_fold_workspace(14, 7, 9)}, test::kU8};
  llvm::Expected<LaunchSequence> plan() { return plan_segment_fold({partials.t, index.t, rows, out.t, &workspace.t}); }
  std::string message() { return test::message_of(plan()); }
};

TEST(SegmentFold, PlansTheIndexsPlanThenOneFoldRowPerTableRow) {
  FoldCall call;
  auto sequence = call.plan();
  ASSERT_TRUE(static_cast<bool>(sequence)) << llvm::toString(sequence.takeError());
  ASSERT_EQ(sequence->count, 4);
  const OpCode expected[] = {Op::SegmentCount, Op::SegmentScan, Op::SegmentScatter, Op::SegmentFold};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(sequence->steps[i].spec.op, expected[i]) << i;
  EXPECT_EQ(sequence->steps[0].params[kSegmentCountReportCode], op_code(Op::SegmentFold));  // bad keys: its own
  EXPECT_EQ(sequence->steps[0].params[4], 9u);  // keys checked against R
  EXPECT_EQ(sequence->steps[3].spec.dtype, DType::BF16);
  EXPECT_EQ(sequence->steps[3].grid_y, 9u);
  EXPECT_EQ(sequence->steps[3].params[0], 1 * GiB);  // the given partials
  EXPECT_EQ(sequence->steps[3].params[4], static_cast<uint64_t>(H));
}

TEST(SegmentFold, TheBoundsFollowThePlan) {
  EXPECT_EQ(segment_fold_tiles(14, 7, 9), 10);
  EXPECT_EQ(segment_fold_tiles(2 * 131072, 131072, 9), 2 * 512 + 9);
  EXPECT_EQ(segment_fold_workspace(14, 7, 9), segment_layout(14, 7, 9).end);
  for (auto [rows, seq, table_rows] : {std::array<int64_t, 3>{15, 7, 9}, {0, 7, 9}, {7, 0, 9}, {7, 7, 0}}) {
    EXPECT_EQ(segment_fold_tiles(rows, seq, table_rows), -1) << rows << " " << seq << " " << table_rows;
    EXPECT_EQ(segment_fold_workspace(rows, seq, table_rows), -1) << rows << " " << seq << " " << table_rows;
  }
}

TEST(SegmentFold, RefusesBrokenArgumentsByName) {
  EXPECT_EQ(FoldCall().message(), "accepted");
  {
    FoldCall call;
    call.partials.shape[0] = 9;  // fewer rows than the plan may have tiles: the fold could read past them
    EXPECT_EQ(call.message(), "segment_fold: partials must be (P, 5376) float32 contiguous with P >= ceil(M / 256) "
                              "+ R = 10 (got fp32 (9, 5376))");
  }
  {
    FoldCall call;
    call.partials.t.dtype = test::kBF16;
    EXPECT_NE(call.message().find("segment_fold: partials must be (P, 5376) float32"), std::string::npos);
  }
  {
    FoldCall call;
    call.partials.shape[1] = H + 1;
    EXPECT_NE(call.message().find("segment_fold: partials must be (P, 5376)"), std::string::npos);
  }
  {
    FoldCall call;
    call.rows = 15;
    EXPECT_EQ(call.message(), "segment_fold: rows must be a positive multiple of S = 7 (got 15)");
  }
  {
    FoldCall call;
    call.index.t.dtype = test::kF32;
    EXPECT_NE(call.message().find("segment_fold: index"), std::string::npos);
  }
  {
    FoldCall call;
    call.out.t.dtype = test::kI32;
    EXPECT_NE(call.message().find("segment_fold: out"), std::string::npos);
  }
  {
    FoldCall call;
    call.workspace.shape[0] -= 1;
    EXPECT_NE(call.message().find("segment_fold: workspace must hold at least"), std::string::npos);
  }
  {
    FoldCall call;
    call.out.t.data = reinterpret_cast<void*>(1 * GiB + 64);  // inside the partials
    EXPECT_NE(call.message().find("must not overlap out"), std::string::npos);
  }
}

}  // namespace
}  // namespace exactjit
