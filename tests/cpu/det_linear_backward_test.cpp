// det_linear backward with bf16 weights on the CPU (templates/det_linear_grad_bf16.cuh): the
// planner's rules (dtypes, shapes, a bf16 or fp32 gradient, T <= 8, the row tile T selects), the
// spec rules and names of the row tiles, the PTX audit of every new spec and row tile (no TF32, no
// mma, no atomics, nothing approximate but libdevice's expf, exactly the written fma and TwoSums
// of its R row slots, 16-byte weight loads and stores), the default catalog's projection specs,
// and the host model against long double and against itself (a row alone vs in a batch).
#include "codegen/render.hpp"
#include "kernels/catalog.hpp"
#include "kernels/det_linear.hpp"
#include "kernels/det_linear_backward.hpp"
#include "kernels/host_model.hpp"
#include "runtime/content_key.hpp"
#include "runtime/errors.hpp"
#include "runtime/kernel_cache.hpp"
#include "runtime/nvrtc.hpp"
#include "support/fake_tensor.hpp"
#include "support/ptx.hpp"

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <regex>

#include "templates/numerics.cuh"
#include "templates/fixed_order_sum.cuh"
#include "kernels/segment_plan.hpp"

namespace exactjit {
namespace {

using test::FakeTensor;
using test::GiB;
using test::kBF16;
using test::kF32;

constexpr double kUlp = 1.0 / (1 << 24);
constexpr int64_t kK = 2688, kBlockN = 18 * 5376, kFinalN = 2 * 5376;

using test::count;
using test::ptx_of;

// ---- the planner ----

struct BackwardCall {
  int64_t rows = 3, n = kBlockN;
  DLDataType grad_dtype = kBF16;
  FakeTensor grad, temb, weight, d_input, d_weight, d_bias, workspace;
  explicit BackwardCall(int64_t t = 3, DLDataType g = kBF16, int64_t out = kBlockN)
      : rows(t), n(out), grad_dtype(g), grad{1 * GiB, {t, out}, g}, temb{2 * GiB, {t, kK}, kF32},
        weight{3 * GiB, {out, kK}, kBF16}, d_input{8 * GiB, {t, kK}, kF32}, d_weight{9 * GiB, {out, kK}, kBF16},
        d_bias{10 * GiB, {out}, kBF16},
        workspace{11 * GiB, {std::max<int64_t>(det_linear_backward_workspace(t, kK, out), 1)}, test::kU8} {}
  DetLinearBackwardArgs args() {
    return {grad.t, nullptr, temb.t, weight.t, &d_input.t, &d_weight.t, &d_bias.t, &workspace.t, true};
  }
};

std::string error_of(llvm::Expected<LaunchSequence> sequence) {
  if (sequence) return "";
  return llvm::toString(sequence.takeError());
}

// The input pass's block: the size of 3 to 6 warps that leaves the fewest threads past K.
TEST(DetLinearBf16BackwardGeometry, InputPassBlocksLeaveTheFewestThreadsIdle) {
  EXPECT_EQ(det_linear_bf16_backward_threads(Op::DetLinearInputGrad, 2688), 96);   // 672 vectors: 7 blocks
  EXPECT_EQ(det_linear_bf16_backward_threads(Op::DetLinearInputGrad, 640), 160);   // 160 vectors: 1 block
  EXPECT_EQ(det_linear_bf16_backward_threads(Op::DetLinearInputGrad, 4096), 128);  // 1024 vectors: 8 blocks of 4 warps
  EXPECT_EQ(det_linear_bf16_backward_column_blocks(Op::DetLinearInputGrad, 2688), 7);
  EXPECT_EQ(det_linear_bf16_backward_threads(Op::DetLinearWeightGrad, 2688), 128);
  EXPECT_EQ(det_linear_bf16_backward_threads(Op::DetLinearInputFold, 2688), 256);
}

// Every gradient asked for: the input pass (d_input partials, d_weight and d_bias in one read of
// W) and the fold.
TEST(DetLinearBf16BackwardValidation, PlansTheInputPassAndTheFold) {
  for (DLDataType g : {kBF16, kF32})
    for (int64_t n : {kBlockN, kFinalN}) {
      BackwardCall call(3, g, n);
      auto sequence = plan_det_linear_backward(call.args());
      ASSERT_TRUE(static_cast<bool>(sequence)) << llvm::toString(sequence.takeError());
      ASSERT_EQ(sequence->count, 2);
      const DType grad_dtype = g.code == kDLBfloat ? DType::BF16 : DType::F32;
      const OpCode ops[] = {Op::DetLinearInputGrad, Op::DetLinearInputFold};
      for (int i = 0; i < 2; ++i) {
        const KernelSpec& spec = sequence->steps[i].spec;
        EXPECT_EQ(spec.op, ops[i]);
        EXPECT_EQ(spec.dtype, DType::BF16);
        EXPECT_EQ(spec.grad_dtype, grad_dtype);
        EXPECT_TRUE(spec.silu);
        EXPECT_EQ(spec.out_features, n);
        EXPECT_EQ(spec.row_tile, ops[i] == Op::DetLinearInputFold ? 8 : 3) << "3 rows: 3 row slots";
        EXPECT_EQ(sequence->steps[i].params[7], 3u) << "rows";
      }
      // 672 vectors of 4 inputs over 96-thread blocks, none idle (128 would leave 96 idle threads)
      EXPECT_EQ(sequence->steps[0].grid, 7u);
      EXPECT_EQ(sequence->steps[0].grid_y, static_cast<uint32_t>(n / 256));
      EXPECT_EQ(sequence->steps[0].threads, 96u);
      EXPECT_EQ(sequence->steps[1].grid, static_cast<uint32_t>(3 * kK / 16));  // 16 of the T x K columns each
      EXPECT_EQ(sequence->steps[1].grid_y, 1u);
      EXPECT_EQ(sequence->steps[1].threads, 256u);
      // The partials go to the workspace and the fold reads them from there; the input pass
      // writes d_weight and d_bias.
      EXPECT_EQ(sequence->steps[0].params[3], 11 * GiB);
      EXPECT_EQ(sequence->steps[1].params[3], 11 * GiB);
      EXPECT_EQ(sequence->steps[1].params[4], 8 * GiB);
      EXPECT_EQ(sequence->steps[0].params[5], 9 * GiB);
      EXPECT_EQ(sequence->steps[0].params[6], 10 * GiB);
    }
}

// The input pass and the weight grad run the smallest row tile >= T; the fold's code does not
// depend on the rows (row tile 8).
TEST(DetLinearBf16BackwardValidation, RowsSelectTheRowTile) {
  const int tiles[] = {1, 2, 3, 4, 8, 8, 8, 8}, weight_tiles[] = {1, 2, 4, 4, 8, 8, 8, 8};
  for (int64_t rows = 1; rows <= 8; ++rows) {
    BackwardCall call(rows);
    auto sequence = plan_det_linear_backward(call.args());
    ASSERT_TRUE(static_cast<bool>(sequence)) << llvm::toString(sequence.takeError());
    ASSERT_EQ(sequence->count, 2);
    EXPECT_EQ(sequence->steps[0].spec.row_tile, tiles[rows - 1]) << rows << " rows";
    EXPECT_EQ(sequence->steps[1].spec.row_tile, 8) << rows << " rows";
    for (int i = 0; i < 2; ++i) EXPECT_EQ(sequence->steps[i].params[7], static_cast<uint64_t>(rows));
    auto weight_only = plan_det_linear_backward(
        {call.grad.t, nullptr, call.temb.t, call.weight.t, nullptr, &call.d_weight.t, &call.d_bias.t, nullptr, true});
    ASSERT_TRUE(static_cast<bool>(weight_only)) << llvm::toString(weight_only.takeError());
    EXPECT_EQ(weight_only->steps[0].spec.row_tile, weight_tiles[rows - 1]) << rows << " rows";
  }
}

TEST(DetLinearBf16BackwardValidation, OnlyTheAskedOutputs) {
  BackwardCall call;
  auto only_weight = plan_det_linear_backward(
      {call.grad.t, nullptr, call.temb.t, call.weight.t, nullptr, &call.d_weight.t, nullptr, nullptr, true});
  ASSERT_TRUE(static_cast<bool>(only_weight)) << llvm::toString(only_weight.takeError());
  ASSERT_EQ(only_weight->count, 1);
  EXPECT_EQ(only_weight->steps[0].spec.op, Op::DetLinearWeightGrad);
  EXPECT_EQ(only_weight->steps[0].params[6], 0u) << "no d_bias";
  auto only_input = plan_det_linear_backward(
      {call.grad.t, nullptr, call.temb.t, call.weight.t, &call.d_input.t, nullptr, nullptr, &call.workspace.t, false});
  ASSERT_TRUE(static_cast<bool>(only_input)) << llvm::toString(only_input.takeError());
  ASSERT_EQ(only_input->count, 2);
  EXPECT_FALSE(only_input->steps[1].spec.silu);
  EXPECT_EQ(only_input->steps[0].params[5], 0u) << "no d_weight";
  EXPECT_EQ(only_input->steps[0].params[6], 0u) << "no d_bias";
  // d_weight alone: row ranges of whole 64-row stages, at most 704: 18H = 1512 stages, 3 a range.
  EXPECT_EQ(only_weight->steps[0].grid, 3u);  // 336 vectors of 8 inputs over 128-thread blocks
  EXPECT_EQ(only_weight->steps[0].grid_y, 504u);
}

// The caps (kernels/spec_limits.hpp) hold for the backward and its workspace query, which answers
// exactly -1 past them: its product of sizes used to overflow into a wrapped or negative size.
TEST(DetLinearBf16BackwardValidation, FeaturesAreCappedAndTheWorkspaceQueryNeverWraps) {
  auto plan = [](int64_t k, int64_t n) {
    FakeTensor grad{1 * GiB, {3, n}, kBF16}, temb{2 * GiB, {3, k}, kF32}, weight{1024 * GiB, {n, k}, kBF16};
    FakeTensor d_input{3 * GiB, {3, k}, kF32};
    FakeTensor workspace{2048 * GiB, {std::max<int64_t>(det_linear_backward_workspace(3, k, n), 1)}, test::kU8};
    return error_of(plan_det_linear_backward(
        {grad.t, nullptr, temb.t, weight.t, &d_input.t, nullptr, nullptr, &workspace.t, true}));
  };
  EXPECT_EQ(plan(65536, int64_t{1} << 21), "");
  EXPECT_EQ(plan(65552, kBlockN), "det_linear_backward: x in_features K must be in [1, 65536] (got 65552)");
  EXPECT_EQ(plan(kK, (int64_t{1} << 21) + 64),
            "det_linear_backward: weight out_features N must be in [1, 2097152] (got 2097216)");
  EXPECT_EQ(det_linear_backward_workspace(8, 65536, int64_t{1} << 21), int64_t{1} << 36);  // 2^15 chunks x 8 x K x 4
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  for (const auto& [k, n] : {std::pair{kMax, kMax}, {int64_t{1} << 40, int64_t{1} << 40}, {kMax, int64_t{64}},
                             {int64_t{64}, kMax}, {int64_t{65552}, int64_t{64}}, {int64_t{0}, int64_t{64}}})
    EXPECT_EQ(det_linear_backward_workspace(8, k, n), -1) << k << " x " << n;
}

TEST(DetLinearBf16BackwardValidation, RejectsBadArguments) {
  auto expect_error = [](BackwardCall& call, DetLinearBackwardArgs args, const char* needle) {
    const std::string error = error_of(plan_det_linear_backward(args));
    EXPECT_NE(error.find(needle), std::string::npos) << "got: " << error;
    (void)call;
  };
  {
    BackwardCall call(3, DLDataType{kDLFloat, 16, 1});
    expect_error(call, call.args(), "grad");
  }
  {
    BackwardCall call(9);
    expect_error(call, call.args(), "rows");
  }
  {
    BackwardCall call;
    FakeTensor pre{12 * GiB, {3, kBlockN}, kF32};
    auto args = call.args();
    DetLinearBackwardArgs with_pre{args.grad, &pre.t, args.x, args.weight, args.d_input, args.d_weight, args.d_bias,
                                   args.workspace, true};
    expect_error(call, with_pre, "pre_activation must be null");
  }
  {
    BackwardCall call;
    FakeTensor d_weight32{9 * GiB, {kBlockN, kK}, kF32};
    auto args = call.args();
    expect_error(call, {args.grad, nullptr, args.x, args.weight, args.d_input, &d_weight32.t, args.d_bias,
                        args.workspace, true}, "d_weight");
  }
  {
    BackwardCall call;
    FakeTensor d_bias32{10 * GiB, {kBlockN}, kF32};
    auto args = call.args();
    expect_error(call, {args.grad, nullptr, args.x, args.weight, args.d_input, args.d_weight, &d_bias32.t,
                        args.workspace, true}, "d_bias");
  }
  {
    BackwardCall call;
    FakeTensor grad_wrong{1 * GiB, {2, kBlockN}, kBF16};
    auto args = call.args();
    expect_error(call, {grad_wrong.t, nullptr, args.x, args.weight, args.d_input, args.d_weight, args.d_bias,
                        args.workspace, true}, "grad");
  }
  {
    BackwardCall call;
    FakeTensor small{11 * GiB, {1024}, test::kU8};
    auto args = call.args();
    expect_error(call, {args.grad, nullptr, args.x, args.weight, args.d_input, args.d_weight, args.d_bias, &small.t,
                        true}, "workspace");
  }
  {
    BackwardCall call;
    FakeTensor d_input_bf16{8 * GiB, {3, kK}, kBF16};
    auto args = call.args();
    expect_error(call, {args.grad, nullptr, args.x, args.weight, &d_input_bf16.t, args.d_weight, args.d_bias,
                        args.workspace, true}, "d_input");
  }
  {  // K not a multiple of 16
    FakeTensor grad{1 * GiB, {2, 64}, kBF16}, temb{2 * GiB, {2, 40}, kF32}, weight{3 * GiB, {64, 40}, kBF16};
    FakeTensor d_weight{9 * GiB, {64, 40}, kBF16};
    const std::string error = error_of(
        plan_det_linear_backward({grad.t, nullptr, temb.t, weight.t, nullptr, &d_weight.t, nullptr, nullptr, true}));
    EXPECT_NE(error.find("multiple of 16"), std::string::npos) << error;
  }
  {  // an fp32 weight still takes only an fp32 gradient
    FakeTensor grad{1 * GiB, {2, 64}, kBF16}, x{2 * GiB, {2, 32}, kF32}, weight{3 * GiB, {64, 32}, kF32};
    FakeTensor d_weight{9 * GiB, {64, 32}, kF32};
    const std::string error = error_of(
        plan_det_linear_backward({grad.t, nullptr, x.t, weight.t, nullptr, &d_weight.t, nullptr, nullptr, false}));
    EXPECT_NE(error.find("grad"), std::string::npos) << error;
  }
}

TEST(DetLinearBf16BackwardValidation, Fp32PathIsUnchanged) {
  FakeTensor grad{1 * GiB, {3, 2688}, kF32}, x{2 * GiB, {3, 5376}, kF32}, w{3 * GiB, {2688, 5376}, kF32};
  FakeTensor d_input{4 * GiB, {3, 5376}, kF32}, d_weight{5 * GiB, {2688, 5376}, kF32}, d_bias{6 * GiB, {2688}, kF32};
  FakeTensor workspace{7 * GiB, {det_linear_backward_workspace(3, 5376, 2688)}, test::kU8};
  auto sequence =
      plan_det_linear_backward({grad.t, nullptr, x.t, w.t, &d_input.t, &d_weight.t, &d_bias.t, &workspace.t, false});
  ASSERT_TRUE(static_cast<bool>(sequence)) << llvm::toString(sequence.takeError());
  ASSERT_EQ(sequence->count, 3);
  EXPECT_EQ(sequence->steps[1].spec.op, Op::SegmentFold);
  for (int i : {0, 2}) EXPECT_EQ(sequence->steps[i].spec.grad_dtype, DType::F32);
}

// ---- specs, catalog ----

constexpr OpCode kOps[] = {Op::DetLinearInputGrad, Op::DetLinearInputFold, Op::DetLinearWeightGrad};

// The default catalog's projection backwards: both shapes and gradient dtypes, every row tile.
std::vector<KernelSpec> projection_specs() {
  std::vector<KernelSpec> specs;
  for (int64_t n : {kBlockN, kFinalN})
    for (OpCode op : kOps)
      for (DType grad : {DType::BF16, DType::F32})
        for (int rows : det_linear_backward_row_tiles(DType::BF16, op))
          specs.push_back(det_linear_backward_spec(DType::BF16, kK, n, true, op, grad, rows));
  return specs;
}

TEST(DetLinearBf16BackwardSpec, CatalogHasTheProjectionBackwardsForEveryT) {
  const Target target{90, false};
  const std::vector<KernelSpec> catalog = default_catalog(target);
  EXPECT_EQ(projection_specs().size(), 2u * 2 * (5 + 1 + 4));  // shapes x gradient dtypes x (tiles per kernel)
  for (KernelSpec spec : projection_specs()) {
    spec.target = target;
    EXPECT_NE(std::find(catalog.begin(), catalog.end(), spec), catalog.end()) << spec.describe();
    EXPECT_FALSE(static_cast<bool>(validate_spec(spec))) << spec.describe();
  }
  // No other bf16 backward kernel.
  auto bf16_backward = [](const KernelSpec& spec) {
    return spec.dtype == DType::BF16 && std::find(std::begin(kOps), std::end(kOps), spec.op) != std::end(kOps);
  };
  EXPECT_EQ(std::count_if(catalog.begin(), catalog.end(), bf16_backward),
            static_cast<std::ptrdiff_t>(projection_specs().size()));
}

// An --op prewarm (spec_family) builds every row tile of the partials and weight grad.
TEST(DetLinearBf16BackwardSpec, FamilyHasEveryRowTile) {
  for (OpCode op : kOps) {
    const std::vector<KernelSpec> family = spec_family(op, linear_sizes(DType::BF16, kK, kBlockN), Target{90, false});
    const size_t tiles = op == Op::DetLinearInputFold ? 1 : op == Op::DetLinearInputGrad ? 5 : 4;
    EXPECT_EQ(family.size(), 2 * 2 * tiles) << op_name(op);  // activations x gradient dtypes x row tiles
    for (const KernelSpec& spec : family) EXPECT_FALSE(static_cast<bool>(validate_spec(spec))) << spec.describe();
  }
}

TEST(DetLinearBf16BackwardSpec, RowTileIsOneOfTheCompiledTiles) {
  auto error = [](KernelSpec spec, int row_tile) {
    spec.target = Target{90, false};
    spec.row_tile = row_tile;
    llvm::Error err = validate_spec(spec);
    return err ? take_error(std::move(err)).message : std::string("accepted");
  };
  for (OpCode op : {Op::DetLinearInputGrad, Op::DetLinearWeightGrad}) {
    const KernelSpec spec = det_linear_backward_spec(DType::BF16, kK, kBlockN, true, op, DType::BF16, 1);
    const bool input_pass = op == Op::DetLinearInputGrad;
    for (int tile : input_pass ? std::vector<int>{1, 2, 3, 4, 8} : std::vector<int>{1, 2, 4, 8})
      EXPECT_EQ(error(spec, tile), "accepted") << tile;
    for (int tile : input_pass ? std::vector<int>{0, 5, 16} : std::vector<int>{0, 3, 16}) {
      const std::string message = error(spec, tile);
      EXPECT_NE(message.find(fmt::format("rows (the row tile) must be in {{{}}} (got {})",
                                         input_pass ? "1, 2, 3, 4, 8" : "1, 2, 4, 8", tile)),
                std::string::npos)
          << message;
    }
  }
  // The fold's code and the fp32 kernels' do not depend on the rows: one row tile, 8.
  const KernelSpec fold =
      det_linear_backward_spec(DType::BF16, kK, kBlockN, true, Op::DetLinearInputFold, DType::BF16, 3);
  EXPECT_EQ(fold.row_tile, 8);
  EXPECT_NE(error(fold, 4).find("rows (the row tile) must be in {8} (got 4)"), std::string::npos) << error(fold, 4);
  const KernelSpec fp32 = det_linear_spec(DType::F32, 5376, 2688, false, Op::DetLinearInputGrad);
  EXPECT_NE(error(fp32, 4).find("rows (the row tile) must be in {8} (got 4)"), std::string::npos) << error(fp32, 4);
}

TEST(DetLinearBf16BackwardSpec, RowTileNamesTheKernelAndItsCacheKey) {
  std::vector<KernelSpec> specs;
  for (int rows : {1, 2, 3, 4, 8})
    specs.push_back(
        det_linear_backward_spec(DType::BF16, kK, kBlockN, true, Op::DetLinearInputGrad, DType::BF16, rows));
  for (size_t i = 0; i < specs.size(); ++i) {
    const KernelSource source = codegen::render(specs[i]);
    EXPECT_NE(source.text.find(fmt::format("constexpr int kRowTile = {};", specs[i].row_tile)), std::string::npos);
    for (size_t j = 0; j < i; ++j) {
      EXPECT_FALSE(specs[i] == specs[j]);
      EXPECT_NE(specs[i].describe(), specs[j].describe());
      EXPECT_NE(specs[i].stem(), specs[j].stem());
      EXPECT_NE(codegen::entry_name(specs[i]), codegen::entry_name(specs[j]));
      EXPECT_NE(KernelSpecHash{}(specs[i]), KernelSpecHash{}(specs[j]));
      EXPECT_NE(source_key(source), source_key(codegen::render(specs[j])));
    }
  }
}

// An offline miss (a T the cache was not prewarmed for) names a command whose family holds the kernel.
TEST(DetLinearBf16BackwardSpec, PrewarmCommandBuildsAMissingRowTile) {
  KernelSpec spec = det_linear_backward_spec(DType::BF16, kK, kBlockN, true, Op::DetLinearWeightGrad, DType::F32, 1);
  spec.target = Target{90, false};
  EXPECT_EQ(prewarm_command(spec), "exactjit prewarm --op det_linear_weight_grad --dtype bf16 --in-features 2688 "
                                   "--out-features 96768 --arch sm_90");
  const std::vector<KernelSpec> family = spec_family(spec.op, linear_sizes(DType::BF16, kK, kBlockN), spec.target);
  EXPECT_NE(std::find(family.begin(), family.end(), spec), family.end());
}

TEST(DetLinearBf16BackwardSpec, GradDtypeNamesTheKernel) {
  const KernelSpec a =
      det_linear_backward_spec(DType::BF16, kK, kBlockN, true, Op::DetLinearInputGrad, DType::BF16, kDefaultTimesteps);
  const KernelSpec b =
      det_linear_backward_spec(DType::BF16, kK, kBlockN, true, Op::DetLinearInputGrad, DType::F32, kDefaultTimesteps);
  EXPECT_FALSE(a == b);
  EXPECT_NE(a.describe(), b.describe());
  EXPECT_NE(a.stem(), b.stem());
  EXPECT_NE(codegen::entry_name(a), codegen::entry_name(b));
  EXPECT_NE(KernelSpecHash{}(a), KernelSpecHash{}(b));
  // fp32 specs keep their names (and so their cached binaries).
  const KernelSpec f = det_linear_spec(DType::F32, 5376, 2688, false, Op::DetLinearInputGrad);
  EXPECT_EQ(f.describe().find("grad="), std::string::npos);
  KernelSpec bad =
      det_linear_backward_spec(DType::BF16, kK, kBlockN, true, Op::DetLinearInputGrad, DType::F16, kDefaultTimesteps);
  bad.target = Target{90, false};
  EXPECT_TRUE(static_cast<bool>(validate_spec(bad)));
  KernelSpec fp32_fold = det_linear_spec(DType::F32, 5376, 2688, false, Op::DetLinearInputFold);
  fp32_fold.target = Target{90, false};
  EXPECT_TRUE(static_cast<bool>(validate_spec(fp32_fold)));
  const std::string text = codegen::render(a).text;
  EXPECT_NE(text.find("constexpr bool kGradBf16 = true;"), std::string::npos);
  EXPECT_NE(codegen::render(b).text.find("constexpr bool kGradBf16 = false;"), std::string::npos);
}

// ---- the PTX audit ----

// Written instructions per kernel (templates/det_linear_grad_bf16.cuh) for its R row slots:
// - input pass: per slot, 8 rows x 4 inputs of partial chains (fma) and 4 TwoSums (4 sub each)
//   after them; the same rows' d_weight, 4 fma per row and slot (the compiler may also keep a
//   copy of the loop without d_weight: 32 fma per slot more); the bias's TwoSum per slot; 8-byte
//   async weight copies, 8 rows x kStages (3) issue sites; one 16-byte partials store per slot;
//   with SiLU, 4 expf per slot (x for d_weight);
// - fold: a run of 8 TwoSums (4 sub each) and, with SiLU, one sub and one expf;
// - weight grad: 8 fma per slot; one 16-byte store; the bias's TwoSum per slot; with SiLU, 8 expf
//   per slot.
struct Written {
  size_t fma = 0, loop_copy_fma = 0, sub = 0, expf = 0, async_copies = 0, stores_v4 = 0;
};
Written written(OpCode op, bool silu, size_t slots) {
  Written w;
  switch (op) {
    case Op::DetLinearInputGrad:
      w.fma = slots * 8 * 4 + slots * 8 * 4;
      w.loop_copy_fma = slots * 8 * 4;
      w.sub = slots * 4 * 4 + 4 * slots;
      w.expf = silu ? 4 * slots : 0;
      w.async_copies = 8 * 3;
      w.stores_v4 = slots;
      break;
    case Op::DetLinearInputFold:
      w.sub = 4 * 8 + (silu ? 1 : 0);
      w.expf = silu ? 1 : 0;
      break;
    default:
      w.fma = 8 * slots;
      w.sub = 4 * slots;
      w.expf = silu ? 8 * slots : 0;
      w.stores_v4 = 1;
      break;
  }
  return w;
}

// The catalog's specs, and every row tile with and without SiLU: each kernel holds the
// instructions of its own R row slots only.
TEST(DetLinearBf16BackwardPtx, IsTheWrittenChainsAndCompensatedSumsOfItsRowSlots) {
  std::vector<KernelSpec> specs = projection_specs();
  for (OpCode op : kOps)
    for (bool silu : {false, true})
      for (int rows : det_linear_backward_row_tiles(DType::BF16, op)) {
        const KernelSpec spec = det_linear_backward_spec(DType::BF16, kK, kBlockN, silu, op, DType::BF16, rows);
        if (std::find(specs.begin(), specs.end(), spec) == specs.end()) specs.push_back(spec);
      }
  for (KernelSpec spec : specs) {
    spec.target = Target{90, false};
    const std::string ptx = ptx_of(spec);
    ASSERT_FALSE(ptx.empty()) << spec.describe();
    const Written w = written(spec.op, spec.silu, static_cast<size_t>(spec.row_tile));
    const size_t exps = count(ptx, "ex2\\.approx\\.ftz\\.f32");
    EXPECT_EQ(exps, w.expf) << spec.describe();
    EXPECT_EQ(count(ptx, "tf32|\\bmma\\.|\\batom\\.|\\bred\\."), 0u) << spec.describe();
    EXPECT_EQ(count(ptx, "\\.approx"), exps) << spec.describe() << ": only expf's ex2 is approximate";
    EXPECT_EQ(count(ptx, "\\.ftz"), exps) << spec.describe() << ": only expf's ex2 flushes";
    // No flushing or contracted float arithmetic (integer mad.lo address arithmetic is fine).
    EXPECT_EQ(count(ptx, "\\bfma\\.rn\\.ftz|\\bmad(\\.[a-z]+)*\\.(f16|bf16|f32|f64)\\b|\\bmul\\.rn\\.ftz"), 0u)
        << spec.describe();
    const size_t fma = count(ptx, "fma\\.rn\\.f32");
    // The written chains (with or without the compiler's copy of the loop), plus the same fma's
    // libdevice's expf brings to each call.
    bool explained = false;
    for (size_t chains : {w.fma, w.fma + w.loop_copy_fma})
      explained |= fma >= chains && (exps == 0 ? fma == chains : (fma - chains) % exps == 0);
    EXPECT_TRUE(explained) << spec.describe() << ": " << fma << " fma";
    EXPECT_EQ(count(ptx, "sub\\.rn\\.f32"), w.sub) << spec.describe();
    EXPECT_EQ(count(ptx, "cp\\.async\\.ca\\.shared\\.global"), w.async_copies) << spec.describe();
    if (spec.op == Op::DetLinearInputGrad) {
      EXPECT_EQ(count(ptx, "st\\.global\\.v4\\.f32"), w.stores_v4) << spec.describe();
    }
    if (spec.op == Op::DetLinearWeightGrad) {
      EXPECT_GE(count(ptx, "st\\.global\\.v4\\.(u32|b32)"), w.stores_v4) << spec.describe();  // loop copies
    }
    // 16-byte stores, the input pass's 8-byte d_weight rows, and the bias: one bf16 per row (the
    // compiler may copy the bias loop once).
    const size_t bf16_stores = count(ptx, "st\\.global\\.(u16|b16)");
    EXPECT_EQ(bf16_stores > 0, spec.op != Op::DetLinearInputFold) << spec.describe();
    EXPECT_LE(bf16_stores, 2u) << spec.describe();
    EXPECT_EQ(count(ptx, "st\\.global\\.v2") > 0, spec.op == Op::DetLinearInputGrad) << spec.describe();
  }
}

// ---- the host model ----

uint16_t bf16_bits(float f) { return xj::round_to<xj::bf16>(f).bits; }
float widen(uint16_t bits) { return xj::to_float(xj::bf16{bits}); }

struct Problem {
  int64_t T, K, N;
  std::vector<float> grad, temb;
  std::vector<uint16_t> weight;
  Problem(int64_t t, int64_t k, int64_t n, unsigned seed) : T(t), K(k), N(n) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0, 1);
    for (int64_t i = 0; i < T * N; ++i) grad.push_back(widen(bf16_bits(normal(rng))));
    for (int64_t i = 0; i < T * K; ++i) temb.push_back(2 * normal(rng));
    for (int64_t i = 0; i < N * K; ++i) weight.push_back(bf16_bits(0.02f * normal(rng)));
  }
};

// d_temb within its order's bound of long double, through the exact SiLU derivative (the host's
// expf: a few u); d_weight and d_bias within one bf16 rounding of the exact value (plus the
// chain's Tu of the terms).
TEST(DetLinearBf16BackwardModel, MatchesLongDouble) {
  for (bool silu : {false, true}) {
    Problem p(5, 48, 604, 11);
    std::vector<float> d_input(p.T * p.K);
    std::vector<uint16_t> d_weight(p.N * p.K), d_bias(p.N);
    det_linear_bf16_backward_model(p.grad.data(), p.temb.data(), p.weight.data(), p.T, p.K, p.N, silu, d_input.data(),
                                   d_weight.data(), d_bias.data());
    for (int64_t t = 0; t < p.T; ++t)
      for (int64_t k = 0; k < p.K; ++k) {
        long double exact = 0, magnitude = 0;
        for (int64_t n = 0; n < p.N; ++n) {
          const long double term = static_cast<long double>(p.grad[t * p.N + n]) * widen(p.weight[n * p.K + k]);
          exact += term, magnitude += std::fabs(term);
        }
        long double derivative = 1;
        if (silu) {
          const long double v = p.temb[t * p.K + k], s = 1 / (1 + std::exp(-v));
          derivative = s * (1 + v * (1 - s));
        }
        const double bound = static_cast<double>((9 * magnitude + 2 * std::fabs(exact)) * std::fabs(derivative) * kUlp +
                                                 8 * kUlp * std::fabs(exact * derivative)) + 1e-30;
        EXPECT_LE(std::fabs(d_input[t * p.K + k] - static_cast<double>(exact * derivative)), bound) << t << " " << k;
      }
    for (int64_t n = 0; n < p.N; ++n) {
      long double bias = 0;
      for (int64_t t = 0; t < p.T; ++t) bias += p.grad[t * p.N + n];
      EXPECT_LE(std::fabs(widen(d_bias[n]) - static_cast<double>(bias)),
                std::fabs(static_cast<double>(bias)) / 256 + 1e-30);
      for (int64_t k = 0; k < p.K; ++k) {
        long double exact = 0, magnitude = 0;
        for (int64_t t = 0; t < p.T; ++t) {
          float x = p.temb[t * p.K + k];
          if (silu) x = xj::div(x, xj::add(1.0f, std::exp(-x)));
          const long double term = static_cast<long double>(p.grad[t * p.N + n]) * widen(bf16_bits(x));
          exact += term, magnitude += std::fabs(term);
        }
        const double bound =
            std::fabs(static_cast<double>(exact)) / 256 + static_cast<double>(p.T * kUlp * magnitude) * 2 + 1e-30;
        EXPECT_LE(std::fabs(widen(d_weight[n * p.K + k]) - static_cast<double>(exact)), bound) << n << " " << k;
      }
    }
  }
}

// Without SiLU, d_input is the order NUMERICS.md states, bit for bit: a compensated fold over
// 256-output chunks of each chunk's compensated sum of 8-output fma chains (N = 604: two whole
// chunks, then 92 outputs ending in a short group of 4); a row's d_input does not change with the
// rows around it.
TEST(DetLinearBf16BackwardModel, IsTheChunkedOrderAndBatchInvariant) {
  Problem p(8, 64, 604, 3);
  std::vector<float> d_input(p.T * p.K);
  det_linear_bf16_backward_model(p.grad.data(), p.temb.data(), p.weight.data(), p.T, p.K, p.N, false, d_input.data(),
                                 nullptr, nullptr);
  for (int64_t t = 0; t < p.T; ++t)
    for (int64_t k = 0; k < p.K; ++k) {
      xj::CompensatedSum fold;
      for (int64_t chunk = 0; chunk < 3; ++chunk) {
        xj::CompensatedSum partial;
        for (int64_t group = 256 * chunk; group < std::min<int64_t>(256 * (chunk + 1), p.N); group += 8) {
          float chain = 0.0f;
          for (int64_t n = group; n < std::min<int64_t>(group + 8, p.N); ++n)
            chain = xj::fma(p.grad[t * p.N + n], widen(p.weight[n * p.K + k]), chain);
          partial.add(chain);
        }
        fold.add(partial.value());
      }
      const float expected = fold.value();
      EXPECT_EQ(std::memcmp(&d_input[t * p.K + k], &expected, 4), 0) << t << " " << k;
    }
  for (bool silu : {false, true}) {
    std::vector<float> all(p.T * p.K), one(p.K);
    det_linear_bf16_backward_model(p.grad.data(), p.temb.data(), p.weight.data(), p.T, p.K, p.N, silu, all.data(),
                                   nullptr, nullptr);
    for (int64_t t : {0, 5}) {
      det_linear_bf16_backward_model(p.grad.data() + t * p.N, p.temb.data() + t * p.K, p.weight.data(), 1, p.K, p.N,
                                     silu, one.data(), nullptr, nullptr);
      EXPECT_EQ(std::memcmp(one.data(), all.data() + t * p.K, p.K * 4), 0) << "row " << t;
    }
  }
}

}  // namespace
}  // namespace exactjit
