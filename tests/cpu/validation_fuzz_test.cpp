// Host validation under random garbage: every op's planner, fed random DLTensors (odd ranks,
// negative, zero and huge dimensions and strides, null shapes and pointers, misaligned or
// wrapping addresses, foreign dtypes and devices), either plans a launch or refuses with
// InvalidArgument — it never crashes, overflows or returns another kind of error.
#include "kernels/adaln_row_gather.hpp"
#include "kernels/adaln_row_gather_backward.hpp"
#include "kernels/det_linear.hpp"
#include "kernels/det_linear_backward.hpp"
#include "kernels/gate_residual_backward.hpp"
#include "kernels/rms_norm_backward.hpp"
#include "kernels/gate_residual.hpp"
#include "kernels/rms_norm.hpp"
#include "kernels/timestep_sinusoid.hpp"
#include "runtime/errors.hpp"

#include <gtest/gtest.h>

#include <array>
#include <random>
#include <vector>

namespace exactjit {
namespace {

class RandomTensor {
 public:
  explicit RandomTensor(std::mt19937_64& rng) {
    auto pick = [&rng](uint64_t n) { return static_cast<int64_t>(rng() % n); };
    const int64_t dims_choice[] = {0, 1, 2, 3, 4, 7, 12, 5376, 32256, 1LL << 31, 1LL << 40, -1, -5376};
    t_.ndim = pick(10) == 0 ? static_cast<int>(pick(12)) - 2 : static_cast<int>(1 + pick(3));
    const int rank = std::max(0, std::min(t_.ndim, 10));
    shape_.resize(static_cast<size_t>(rank) + 1);
    strides_.resize(static_cast<size_t>(rank) + 1);
    for (int d = 0; d < rank; ++d) {
      shape_[d] = pick(4) == 0 ? dims_choice[pick(std::size(dims_choice))] : 1 + pick(64);
      strides_[d] = pick(5) == 0 ? dims_choice[pick(std::size(dims_choice))] : 1 + pick(70000);
    }
    t_.shape = pick(20) == 0 ? nullptr : shape_.data();
    t_.strides = pick(2) == 0 ? nullptr : strides_.data();
    const uint64_t bases[] = {0, 1ull << 30, (1ull << 30) + 2, ~0ull - 64, 16, 3};
    t_.data = reinterpret_cast<void*>(bases[pick(std::size(bases))]);
    t_.byte_offset = pick(4) == 0 ? static_cast<uint64_t>(pick(33)) : 0;
    const DLDataType dtypes[] = {{kDLBfloat, 16, 1}, {kDLFloat, 16, 1}, {kDLFloat, 32, 1}, {kDLInt, 32, 1},
                                 {kDLInt, 64, 1},    {kDLFloat, 64, 1}, {kDLUInt, 8, 1},  {kDLFloat, 32, 4}};
    t_.dtype = dtypes[pick(std::size(dtypes))];
    t_.device = {pick(8) == 0 ? kDLCPU : kDLCUDA, static_cast<int32_t>(pick(8) == 0 ? 1 : 0)};
  }
  const DLTensor& get() const { return t_; }
  const DLTensor* maybe(std::mt19937_64& rng) const { return rng() % 3 == 0 ? nullptr : &t_; }

 private:
  std::vector<int64_t> shape_, strides_;
  DLTensor t_{};
};

void expect_planned_or_invalid(llvm::Expected<LaunchPlan> plan, int iteration) {
  if (plan) {
    EXPECT_LE(plan->param_count, LaunchPlan::kMaxParams) << iteration;
    EXPECT_GT(plan->threads, 0u) << iteration;
    return;
  }
  const ErrorReport report = take_error(plan.takeError());
  EXPECT_EQ(report.code, ErrorCode::InvalidArgument) << iteration << ": " << report.message;
  EXPECT_FALSE(report.message.empty());
}

TEST(ValidationFuzz, PlannersNeverCrashOnGarbage) {
  std::mt19937_64 rng(20261202);
  int planned = 0;
  for (int i = 0; i < 20000; ++i) {
    std::array<RandomTensor, 7> t{RandomTensor(rng), RandomTensor(rng), RandomTensor(rng), RandomTensor(rng),
                                  RandomTensor(rng), RandomTensor(rng), RandomTensor(rng)};
    auto count = [&planned](llvm::Expected<LaunchPlan> plan, int iteration) {
      planned += plan ? 1 : 0;
      expect_planned_or_invalid(std::move(plan), iteration);
    };
    switch (i % 4) {
      case 0: count(plan_gate_residual({t[0].get(), t[1].get(), t[2].get(), t[3].get(), t[4].get()}), i); break;
      case 1: count(plan_adaln_row_gather({t[0].get(), t[1].get(), t[2].get(), t[3].get()}), i); break;
      case 2:
        count(plan_rms_norm({t[0].get(), t[1].maybe(rng), t[2].maybe(rng), t[3].maybe(rng), t[4].maybe(rng),
                             t[5].get(), t[6].maybe(rng), static_cast<double>(rng() % 3) * 1e-5}),
              i);
        break;
      case 3: count(plan_timestep_sinusoid({t[0].get(), t[1].get(), SinusoidParams{}}), i); break;
    }
  }
  RecordProperty("planned", planned);  // random garbage is almost always refused; that is the point
}

void expect_planned_or_invalid(llvm::Expected<LaunchSequence> sequence, int iteration) {
  if (sequence) {
    EXPECT_LE(sequence->count, LaunchSequence::kMaxSteps) << iteration;
    for (int k = 0; k < sequence->count; ++k) {
      EXPECT_LE(sequence->steps[k].param_count, LaunchPlan::kMaxParams) << iteration;
      EXPECT_GT(sequence->steps[k].threads, 0u) << iteration;
      EXPECT_GT(sequence->steps[k].grid_y, 0u) << iteration;
    }
    return;
  }
  const ErrorReport report = take_error(sequence.takeError());
  EXPECT_EQ(report.code, ErrorCode::InvalidArgument) << iteration << ": " << report.message;
  EXPECT_FALSE(report.message.empty());
}

TEST(ValidationFuzz, BackwardAndDetLinearPlannersNeverCrashOnGarbage) {
  std::mt19937_64 rng(20261203);
  for (int i = 0; i < 20000; ++i) {
    std::vector<RandomTensor> t;
    for (int k = 0; k < 11; ++k) t.emplace_back(rng);
    const bool flag = rng() % 2 == 0;
    switch (i % 6) {
      case 0:
        expect_planned_or_invalid(plan_gate_residual_backward({t[0].get(), t[1].get(), t[2].get(), t[3].get(),
                                                               t[4].maybe(rng), t[5].maybe(rng), t[6].maybe(rng)}),
                                  i);
        break;
      case 1:
        expect_planned_or_invalid(
            plan_rms_norm_backward({t[0].get(), t[1].get(), t[2].maybe(rng), t[3].maybe(rng), t[4].maybe(rng),
                                    t[5].get(), static_cast<double>(rng() % 3) * 1e-5 - 1e-5, t[6].maybe(rng),
                                    t[7].maybe(rng), t[8].maybe(rng), t[9].maybe(rng),
                                    t[10].maybe(rng)}),
            i);
        break;
      case 2:
        expect_planned_or_invalid(
            plan_adaln_row_gather_backward({t[0].get(), t[1].get(), t[2].get(), t[3].get(), t[4].maybe(rng)}), i);
        break;
      case 3:
        expect_planned_or_invalid(plan_timestep_sinusoid_backward({t[0].get(), t[1].get(), t[2].get(), SinusoidParams{}}), i);
        break;
      case 4:
        expect_planned_or_invalid(plan_det_linear({t[0].get(), t[1].get(), t[2].maybe(rng), t[3].get(), t[4].maybe(rng), flag}), i);
        break;
      case 5:
        expect_planned_or_invalid(plan_det_linear_backward({t[0].get(), t[1].maybe(rng), t[2].get(), t[3].get(),
                                                            t[4].maybe(rng), t[5].maybe(rng), t[6].maybe(rng),
                                                            t[7].maybe(rng), flag}),
                                  i);
        break;
    }
  }
}

}  // namespace
}  // namespace exactjit
