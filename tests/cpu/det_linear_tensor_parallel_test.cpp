// det_linear over column shards (tensor parallelism, docs/tensor-parallel.md): the per-chunk
// partials entry (det_linear_backward with `partials`) and the fold of given partials
// (det_linear_input_fold, the fold kernel's entry point). What they plan, that the fold is the
// single-GPU backward's own fold launch, and the rules they refuse by name (fake device addresses:
// planning touches no memory).
#include "kernels/det_linear_backward.hpp"
#include "kernels/segment_plan.hpp"  // Op::SegmentFold, the fp32 fold
#include "runtime/errors.hpp"
#include "support/fake_tensor.hpp"

#include <gtest/gtest.h>

#include <algorithm>

namespace exactjit {
namespace {

using test::FakeTensor;
using test::GiB;
using test::kBF16;
using test::kF32;
using test::message_of;

// The H3 block projection (2688 -> 18H) over 3 ranks: a shard of 32256 outputs, 126 bf16 chunks.
constexpr int64_t kK = 2688, kN = 18 * 5376, kShard = kN / 3;


// One rank's backward: its (T, shard) gradient columns, its weight rows, its partials.
struct PartialsCall {
  int64_t rows, n;
  FakeTensor grad, x, weight, partials, d_weight, d_bias;
  PartialsCall(int64_t t, int64_t out, DLDataType weight_dtype, int64_t chunk)
      : rows(t), n(out), grad{1 * GiB, {t, out}, weight_dtype.code == kDLBfloat ? kBF16 : kF32},
        x{2 * GiB, {t, kK}, kF32}, weight{3 * GiB, {out, kK}, weight_dtype},
        partials{4 * GiB, {(out + chunk - 1) / chunk, t, kK}, kF32}, d_weight{5 * GiB, {out, kK}, weight_dtype},
        d_bias{6 * GiB, {out}, weight_dtype} {}
  DetLinearBackwardArgs args(bool silu) {
    return {grad.t, nullptr, x.t, weight.t, nullptr, &d_weight.t, &d_bias.t, nullptr, silu, &partials.t};
  }
};

TEST(DetLinearTensorParallel, ChunksAreTheBackwardsFoldedUnits) {
  EXPECT_EQ(det_linear_input_chunk(true), kDetLinearBf16Chunk);
  EXPECT_EQ(det_linear_input_chunk(true), 256);
  EXPECT_EQ(det_linear_input_chunk(false), 64);
}

// bf16: the input pass alone, writing the given partials (and d_weight, d_bias in the same read of
// W), no fold; the kernel is the single-GPU backward's for the shard's N and T's row tile.
TEST(DetLinearTensorParallel, Bf16PartialsAreTheInputPassAlone) {
  PartialsCall call(3, kShard, kBF16, 256);
  auto sequence = plan_det_linear_backward(call.args(true));
  ASSERT_TRUE(static_cast<bool>(sequence)) << llvm::toString(sequence.takeError());
  ASSERT_EQ(sequence->count, 1);
  const LaunchPlan& pass = sequence->steps[0];
  EXPECT_EQ(pass.spec, det_linear_backward_spec(DType::BF16, kK, kShard, true, Op::DetLinearInputGrad, DType::BF16, 3));
  EXPECT_EQ(pass.grid, 7u);                 // 672 vectors of 4 inputs, 96-thread blocks
  EXPECT_EQ(pass.grid_y, 126u);             // the shard's chunks
  EXPECT_EQ(pass.params[0], 1 * GiB);       // grad
  EXPECT_EQ(pass.params[1], 2 * GiB);       // x (temb)
  EXPECT_EQ(pass.params[2], 3 * GiB);       // weight
  EXPECT_EQ(pass.params[3], 4 * GiB);       // the given partials
  EXPECT_EQ(pass.params[4], 0u);            // no d_input
  EXPECT_EQ(pass.params[5], 5 * GiB);       // d_weight
  EXPECT_EQ(pass.params[6], 6 * GiB);       // d_bias
  EXPECT_EQ(pass.params[7], 3u);            // rows
  // The single-GPU backward's input pass over the same shard: the same launch but the partials.
  FakeTensor d_input{7 * GiB, {3, kK}, kF32};
  FakeTensor workspace{8 * GiB, {det_linear_backward_workspace(3, kK, kShard)}, test::kU8};
  auto single = plan_det_linear_backward({call.grad.t, nullptr, call.x.t, call.weight.t, &d_input.t, &call.d_weight.t,
                                          &call.d_bias.t, &workspace.t, true});
  ASSERT_TRUE(static_cast<bool>(single)) << llvm::toString(single.takeError());
  EXPECT_EQ(single->steps[0].spec, pass.spec);
  EXPECT_EQ(single->steps[0].grid, pass.grid);
  EXPECT_EQ(single->steps[0].grid_y, pass.grid_y);
  EXPECT_EQ(single->steps[0].threads, pass.threads);
}

// fp32: the input-grad kernel into the given partials (64-output chunks), then the weight chains.
TEST(DetLinearTensorParallel, Fp32PartialsAreTheInputGradAndTheWeightChains) {
  PartialsCall call(3, 2688, kF32, 64);
  FakeTensor pre{9 * GiB, {3, 2688}, kF32};
  DetLinearBackwardArgs args = call.args(true);
  args.pre_activation = &pre.t;
  auto sequence = plan_det_linear_backward(args);
  ASSERT_TRUE(static_cast<bool>(sequence)) << llvm::toString(sequence.takeError());
  ASSERT_EQ(sequence->count, 2);
  EXPECT_EQ(sequence->steps[0].spec.op, Op::DetLinearInputGrad);
  EXPECT_EQ(sequence->steps[0].grid_y, 42u);
  EXPECT_EQ(sequence->steps[0].params[1], 9 * GiB);  // the pre-activation: SiLU's derivative in the partials
  EXPECT_EQ(sequence->steps[0].params[4], 4 * GiB);  // the given partials
  EXPECT_EQ(sequence->steps[1].spec.op, Op::DetLinearWeightGrad);
  EXPECT_EQ(sequence->steps[1].params[5], 5 * GiB);
  EXPECT_EQ(sequence->steps[1].params[6], 6 * GiB);
}

TEST(DetLinearTensorParallel, PartialsRefuseBrokenArgumentsByName) {
  EXPECT_EQ(message_of(plan_det_linear_backward(PartialsCall(3, kShard, kBF16, 256).args(true))), "accepted");
  {
    PartialsCall call(3, kShard, kBF16, 256);
    call.partials.shape[0] = 125;  // one chunk short: the pass would write past it
    EXPECT_EQ(message_of(plan_det_linear_backward(call.args(true))),
              "det_linear_backward_partials: partials must be (126, 3, 2688) in fp32 (got (125, 3, 2688) fp32)");
  }
  {
    PartialsCall call(3, 2688, kF32, 256);  // fp32 weights have 64-output chunks: 42, not 11
    EXPECT_EQ(message_of(plan_det_linear_backward(call.args(false))),
              "det_linear_backward_partials: partials must be (42, 3, 2688) in fp32 (got (11, 3, 2688) fp32)");
  }
  {
    PartialsCall call(3, kShard, kBF16, 256);
    call.partials.t.dtype = kBF16;
    EXPECT_NE(message_of(plan_det_linear_backward(call.args(true))).find("det_linear_backward_partials: partials"),
              std::string::npos);
  }
  {
    PartialsCall call(3, kShard, kBF16, 256);
    FakeTensor d_input{7 * GiB, {3, kK}, kF32};
    DetLinearBackwardArgs args = call.args(true);
    args.d_input = &d_input.t;
    EXPECT_EQ(message_of(plan_det_linear_backward(args)),
              "det_linear_backward_partials: partials replace d_input and the workspace (they are not folded "
              "here): pass neither");
  }
  {
    PartialsCall call(3, kShard, kBF16, 256);
    call.partials.t.data = reinterpret_cast<void*>(5 * GiB + 256);  // inside d_weight
    EXPECT_NE(message_of(plan_det_linear_backward(call.args(true))).find("must not overlap"), std::string::npos);
  }
  {
    PartialsCall call(9, kShard, kBF16, 256);
    EXPECT_EQ(message_of(plan_det_linear_backward(call.args(true))),
              "det_linear_backward_partials: x must have 1..8 rows (got 9)");
  }
}

// The fold of C given chunks, (C, T, K).
struct FoldCall {
  FakeTensor partials, x, d_input;
  bool bf16_weights, silu;
  FoldCall(int64_t chunks, int64_t t, int64_t k, bool bf16 = true, bool with_silu = true)
      : partials{1 * GiB, {chunks, t, k}, kF32}, x{2 * GiB, {t, k}, kF32}, d_input{3 * GiB, {t, k}, kF32},
        bf16_weights(bf16), silu(with_silu) {}
  llvm::Expected<LaunchSequence> plan() {
    return plan_det_linear_input_fold({partials.t, x.t, d_input.t, bf16_weights, silu});
  }
};

// The fold of every rank's gathered chunks is the single-GPU backward's fold launch: the same
// kernel (spec) and geometry, reading the given partials, writing d_input.
TEST(DetLinearTensorParallel, Bf16FoldIsTheSingleGpuFold) {
  for (int64_t rows : {1, 3, 8}) {
    FoldCall call(kN / 256, rows, kK);
    auto sequence = call.plan();
    ASSERT_TRUE(static_cast<bool>(sequence)) << llvm::toString(sequence.takeError());
    ASSERT_EQ(sequence->count, 1);
    const LaunchPlan& fold = sequence->steps[0];
    EXPECT_EQ(fold.spec.op, Op::DetLinearInputFold);
    EXPECT_EQ(fold.spec.out_features, kN);  // 378 chunks of the whole projection
    EXPECT_TRUE(fold.spec.silu);
    EXPECT_EQ(fold.grid, static_cast<uint32_t>(rows * kK / 16));
    EXPECT_EQ(fold.threads, 256u);
    EXPECT_EQ(fold.params[1], 2 * GiB);  // x: SiLU's derivative at temb
    EXPECT_EQ(fold.params[3], 1 * GiB);  // the given partials
    EXPECT_EQ(fold.params[4], 3 * GiB);  // d_input
    EXPECT_EQ(fold.params[7], static_cast<uint64_t>(rows));

    FakeTensor grad{4 * GiB, {rows, kN}, kBF16}, weight{5 * GiB, {kN, kK}, kBF16};
    FakeTensor workspace{6 * GiB, {det_linear_backward_workspace(rows, kK, kN)}, test::kU8};
    auto single = plan_det_linear_backward(
        {grad.t, nullptr, call.x.t, weight.t, &call.d_input.t, nullptr, nullptr, &workspace.t, true});
    ASSERT_TRUE(static_cast<bool>(single)) << llvm::toString(single.takeError());
    ASSERT_EQ(single->count, 2);
    const LaunchPlan& own = single->steps[1];
    EXPECT_EQ(own.spec, fold.spec);
    EXPECT_EQ(own.grid, fold.grid);
    EXPECT_EQ(own.threads, fold.threads);
    EXPECT_EQ(own.params[3], 6 * GiB);  // its partials are in the workspace
    for (int p : {1, 4, 7}) EXPECT_EQ(own.params[p], fold.params[p]) << p;
  }
}

TEST(DetLinearTensorParallel, Fp32FoldIsTheSingleGpuSegmentFold) {
  FoldCall call(42, 3, 5376, false, true);
  auto sequence = call.plan();
  ASSERT_TRUE(static_cast<bool>(sequence)) << llvm::toString(sequence.takeError());
  ASSERT_EQ(sequence->count, 1);
  const LaunchPlan& fold = sequence->steps[0];
  EXPECT_EQ(fold.spec.op, Op::SegmentFold);
  EXPECT_EQ(fold.params[0], 1 * GiB);  // the given partials
  EXPECT_EQ(fold.params[1], 0u);       // one row of tiles, no plan
  EXPECT_EQ(fold.params[2], 42u);      // the chunks
  EXPECT_EQ(fold.params[4], 3u * 5376);
  EXPECT_EQ(fold.params[5], 3 * GiB);  // d_input

  FakeTensor grad{4 * GiB, {3, 2688}, kF32}, weight{5 * GiB, {2688, 5376}, kF32}, pre{7 * GiB, {3, 2688}, kF32};
  FakeTensor workspace{6 * GiB, {det_linear_backward_workspace(3, 5376, 2688)}, test::kU8};
  auto single = plan_det_linear_backward(
      {grad.t, &pre.t, call.x.t, weight.t, &call.d_input.t, nullptr, nullptr, &workspace.t, true});
  ASSERT_TRUE(static_cast<bool>(single)) << llvm::toString(single.takeError());
  ASSERT_EQ(single->count, 2);
  const LaunchPlan& own = single->steps[1];
  EXPECT_EQ(own.spec, fold.spec);
  EXPECT_EQ(own.grid, fold.grid);
  EXPECT_EQ(own.grid_y, fold.grid_y);
  EXPECT_EQ(own.params[0], 6 * GiB);
  for (int p : {1, 2, 3, 4, 5}) EXPECT_EQ(own.params[p], fold.params[p]) << p;
}

TEST(DetLinearTensorParallel, FoldRefusesBrokenArgumentsByName) {
  auto message = [](FoldCall call) { return message_of(call.plan()); };
  EXPECT_EQ(message(FoldCall(378, 3, kK)), "accepted");
  {
    FoldCall call(378, 3, kK);
    call.partials.shape[1] = 2;  // another T than x's
    EXPECT_EQ(message(call),
              "det_linear_input_fold: partials must be (378, 3, 2688) in fp32 (got (378, 2, 2688) fp32)");
  }
  {
    FoldCall call(378, 3, kK);
    call.partials.t.ndim = 2;
    EXPECT_EQ(message(call), "det_linear_input_fold: partials must be (C, 3, 2688) with C >= 1 chunks (got (378, 3))");
  }
  {
    FoldCall call(0, 3, kK);
    EXPECT_NE(message(call).find("with C >= 1 chunks"), std::string::npos);
  }
  {
    FoldCall call(8193, 3, kK);  // past N's cap: 8192 chunks of 256
    EXPECT_EQ(message(call),
              "det_linear_input_fold: partials must have at most 8192 chunks of 256 outputs (N <= 2097152; got 8193)");
  }
  {
    FoldCall call(378, 3, kK);
    call.partials.t.dtype = kBF16;
    EXPECT_EQ(message(call),
              "det_linear_input_fold: partials must be (378, 3, 2688) in fp32 (got (378, 3, 2688) bf16)");
  }
  {
    FoldCall call(378, 3, kK);
    call.partials.strides = {3 * kK, 1, 3};  // not contiguous
    call.partials.t.strides = call.partials.strides.data();
    EXPECT_EQ(message(call), "det_linear_input_fold: partials must be contiguous");
  }
  EXPECT_EQ(message(FoldCall(378, 9, kK)), "det_linear_input_fold: x must have 1..8 rows (got 9)");
  EXPECT_EQ(message(FoldCall(378, 3, 2680)),
            "det_linear_input_fold: x in_features must be a multiple of 16 for bf16 weights (got 2680)");
  EXPECT_EQ(message(FoldCall(42, 3, 2680, false)), "accepted");  // fp32 weights: multiples of 4
  {
    FoldCall call(378, 3, kK);
    call.d_input.t.dtype = kBF16;
    EXPECT_EQ(message(call), "det_linear_input_fold: d_input must be (3, 2688) in fp32 (got (3, 2688) bf16)");
  }
  {
    FoldCall call(378, 3, kK);
    call.d_input.t.data = reinterpret_cast<void*>(1 * GiB + 4096);  // inside the partials
    EXPECT_NE(message(call).find("must not overlap"), std::string::npos) << message(call);
  }
  {
    FoldCall call(378, 3, kK);
    call.x.t.device = {kDLCPU, 0};
    EXPECT_NE(message(call).find("det_linear_input_fold: x"), std::string::npos) << message(call);
  }
}

}  // namespace
}  // namespace exactjit
