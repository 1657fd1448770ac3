// Host validation under random garbage: every op's planner, fed random DLTensors (odd ranks,
// negative, zero and huge dimensions and strides, null shapes and pointers, misaligned or
// wrapping addresses, foreign dtypes and devices), either plans a launch or refuses with
// InvalidArgument — it never crashes, overflows or returns another kind of error — and a call it
// accepts is sound: every tensor it was given is a CUDA tensor of one lane whose address (data +
// byte_offset) is non-null, does not wrap and is aligned to its element size (the oracle makes the
// fuzz fail when a planner's check is removed, not only when it crashes).
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
#include "support/fake_tensor.hpp"
#include "support/random_tensor.hpp"

#include <gtest/gtest.h>

#include <array>
#include <random>
#include <vector>

namespace exactjit {
namespace {

using test::expect_sound;
using test::perturb;
using test::Given;
using test::RandomTensor;

void expect_planned_or_invalid(llvm::Expected<LaunchPlan> plan, int iteration, const Given& given) {
  if (plan) {
    expect_sound(given, iteration);
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
    std::array<const DLTensor*, 7> m;  // optional arguments: present or not, drawn up front
    for (size_t k = 0; k < m.size(); ++k) m[k] = t[k].maybe(rng);
    auto count = [&planned](llvm::Expected<LaunchPlan> plan, int iteration, const Given& given) {
      planned += plan ? 1 : 0;
      expect_planned_or_invalid(std::move(plan), iteration, given);
    };
    switch (i % 4) {
      case 0:
        count(plan_gate_residual({t[0].get(), t[1].get(), t[2].get(), t[3].get(), t[4].get()}), i,
              {&t[0].get(), &t[1].get(), &t[2].get(), &t[3].get(), &t[4].get()});
        break;
      case 1:
        count(plan_adaln_row_gather({t[0].get(), t[1].get(), t[2].get(), t[3].get()}), i,
              {&t[0].get(), &t[1].get(), &t[2].get(), &t[3].get()});
        break;
      case 2:
        count(plan_rms_norm(
                  {t[0].get(), m[1], m[2], m[3], m[4], t[5].get(), m[6], static_cast<double>(rng() % 3) * 1e-5}),
              i, {&t[0].get(), m[1], m[2], m[3], m[4], &t[5].get(), m[6]});
        break;
      case 3:
        count(plan_timestep_sinusoid({t[0].get(), t[1].get(), SinusoidParams{}}), i, {&t[0].get(), &t[1].get()});
        break;
    }
  }
  RecordProperty("planned", planned);  // random garbage is almost always refused; that is the point
}

void expect_planned_or_invalid(llvm::Expected<LaunchSequence> sequence, int iteration, const Given& given) {
  if (sequence) {
    expect_sound(given, iteration);
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
    std::vector<const DLTensor*> m;  // optional arguments: present or not, drawn up front
    for (const RandomTensor& r : t) m.push_back(r.maybe(rng));
    auto g = [&t](int k) { return &t[k].get(); };
    switch (i % 6) {
      case 0:
        expect_planned_or_invalid(plan_gate_residual_backward({*g(0), *g(1), *g(2), *g(3), m[4], m[5], m[6]}), i,
                                  {g(0), g(1), g(2), g(3), m[4], m[5], m[6]});
        break;
      case 1:
        expect_planned_or_invalid(
            plan_rms_norm_backward({*g(0), *g(1), m[2], m[3], m[4], *g(5), static_cast<double>(rng() % 3) * 1e-5 - 1e-5,
                                    m[6], m[7], m[8], m[9], m[10]}),
            i, {g(0), g(1), m[2], m[3], m[4], g(5), m[6], m[7], m[8], m[9], m[10]});
        break;
      case 2:
        expect_planned_or_invalid(plan_adaln_row_gather_backward({*g(0), *g(1), *g(2), *g(3), m[4]}), i,
                                  {g(0), g(1), g(2), g(3), m[4]});
        break;
      case 3:
        expect_planned_or_invalid(plan_timestep_sinusoid_backward({*g(0), *g(1), *g(2), SinusoidParams{}}), i,
                                  {g(0), g(1), g(2)});
        break;
      case 4:
        expect_planned_or_invalid(plan_det_linear({*g(0), *g(1), m[2], *g(3), m[4], flag}), i,
                                  {g(0), g(1), m[2], g(3), m[4]});
        break;
      case 5:
        expect_planned_or_invalid(plan_det_linear_backward({*g(0), m[1], *g(2), *g(3), m[4], m[5], m[6], m[7], flag}),
                                  i, {g(0), m[1], g(2), g(3), m[4], m[5], m[6], m[7]});
        break;
    }
  }
}

// Near-valid calls: one valid H3 call per planner, one tensor of it broken in one way (perturb).
// Random garbage is refused on its shape long before an address rule is reached; these reach every
// rule, so removing one (the null-address check, say) makes an accepted call fail the oracle.
TEST(ValidationFuzz, NearValidCallsAreRefusedOrSound) {
  using test::FakeTensor;
  using test::GiB;
  constexpr int64_t H = 5376;
  std::mt19937_64 rng(20261203);
  int refused = 0;
  for (int i = 0; i < 6000; ++i) {
    FakeTensor residual{1 * GiB, {1, 7, H}, test::kBF16}, y{4 * GiB, {1, 7, H}, test::kBF16};
    FakeTensor gate{2 * GiB + 2 * H * 2, {9, H}, test::kBF16, {6 * H, 1}}, index{3 * GiB, {7}, test::kI64};
    FakeTensor out{5 * GiB, {1, 7, H}, test::kBF16}, d_gate{6 * GiB, {9, H}, test::kBF16};
    FakeTensor workspace{7 * GiB, {gate_residual_backward_workspace(7, 7, 9, H)}, test::kU8};
    DLTensor* forward[] = {&residual.t, &gate.t, &index.t, &y.t, &out.t};
    DLTensor* backward[] = {&residual.t, &gate.t, &index.t, &y.t, &out.t, &d_gate.t, &workspace.t};
    const bool is_forward = i % 2 == 0;
    perturb(*(is_forward ? forward[rng() % 5] : backward[rng() % 7]), rng);
    const Given given(is_forward ? std::begin(forward) : std::begin(backward),
                      is_forward ? std::end(forward) : std::end(backward));
    if (is_forward) {
      auto plan = plan_gate_residual({residual.t, gate.t, index.t, y.t, out.t});
      refused += plan ? 0 : 1;
      expect_planned_or_invalid(std::move(plan), i, given);
    } else {
      auto sequence = plan_gate_residual_backward({residual.t, gate.t, index.t, y.t, &out.t, &d_gate.t, &workspace.t});
      refused += sequence ? 0 : 1;
      expect_planned_or_invalid(std::move(sequence), i, given);
    }
  }
  EXPECT_GT(refused, 5000);  // nearly every perturbation breaks a rule (a misaligned pack may not)
}

}  // namespace
}  // namespace exactjit
