// The C ABI under random calls: every xj_* entry point with random DLTensors (tests/support's
// RandomTensor), required arguments sometimes NULL, random scalars, a NULL runtime, random runtime
// options and extreme workspace-size queries. Against the counting fake driver (so an accepted call
// never touches memory, on any machine) and an offline runtime over an empty cache (so an accepted
// call ends in an offline miss, not in NVRTC). Every call returns one of the statuses its contract
// allows with a message that names the op; a call that gets past validation was sound; a workspace
// query answers a size or exactly -1. EXACTJIT_FUZZ_SEED and EXACTJIT_FUZZ_ITERATIONS explore more.
#include <gtest/gtest.h>

#include <climits>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "exactjit/exactjit.h"
#include "support/fake_cuda.hpp"
#include "support/fake_tensor.hpp"
#include "support/random_tensor.hpp"
#include "support/test_support.hpp"

namespace exactjit {
namespace {

using test::perturb;
using test::RandomTensor;

uint64_t env_or(const char* name, uint64_t fallback) {
  const char* value = std::getenv(name);
  return value && *value ? std::strtoull(value, nullptr, 10) : fallback;
}

/// What a fuzzed call may answer: refused, or accepted and then missed (offline, empty cache), or
/// done when there was nothing to launch. Returns whether it got past validation.
bool expect_allowed(exactjit_status_t status, const char* op, uint64_t iteration) {
  const std::string message = xj_last_error();
  EXPECT_TRUE(status == XJ_ERROR_INVALID_ARGUMENT || status == XJ_ERROR_OFFLINE_MISS || status == XJ_OK)
      << iteration << " " << op << ": status " << status << ": " << message;
  if (status == XJ_ERROR_INVALID_ARGUMENT) {
    EXPECT_EQ(message.rfind(op, 0), 0u) << iteration << ": an error of " << op << " must name it: " << message;
  }
  if (status != XJ_OK) {
    EXPECT_FALSE(message.empty()) << iteration << " " << op;
  }
  return status != XJ_ERROR_INVALID_ARGUMENT;
}

TEST(CAbiFuzz, RandomCallsAreRefusedOrSound) {
  test::FakeCuda fake;  // before anything loads the driver
  test::TempDir cache;
  const xj_runtime_options options{sizeof(xj_runtime_options), cache.path().c_str(), nullptr, 1, nullptr, 0};
  xj_runtime* runtime = nullptr;
  ASSERT_EQ(xj_runtime_create(&options, &runtime), XJ_OK) << xj_last_error();

  const uint64_t seed = env_or("EXACTJIT_FUZZ_SEED", 20261203);
  const uint64_t iterations = env_or("EXACTJIT_FUZZ_ITERATIONS", 30000);
  RecordProperty("seed", std::to_string(seed));
  std::mt19937_64 rng(seed);
  uint64_t accepted = 0;
  for (uint64_t i = 0; i < iterations; ++i) {
    std::vector<RandomTensor> pool;
    for (int k = 0; k < 11; ++k) pool.emplace_back(rng);
    std::vector<const DLTensor*> t;  // required arguments are NULL one time in 16
    for (const RandomTensor& r : pool) t.push_back(rng() % 16 == 0 ? nullptr : &r.get());
    std::vector<const DLTensor*> m;  // optional arguments: present or not
    for (const RandomTensor& r : pool) m.push_back(r.maybe(rng));
    xj_runtime* rt = rng() % 64 == 0 ? nullptr : runtime;
    const double scalar = std::vector<double>{0, 1e-5, -1, 1e300, 10000, 0.5}[rng() % 6];
    const int flag = static_cast<int>(rng() % 3) - (rng() % 8 == 0 ? 5 : 0);  // 0, 1, 2 and odd values
    void* stream = rng() % 4 == 0 ? reinterpret_cast<void*>(rng()) : nullptr;
    test::Given given;  // the tensors the call is given, for the soundness oracle
    const char* op = "";
    exactjit_status_t status = XJ_OK;
    switch (i % 11) {
      case 0:
        op = "gate_residual";
        given = {t[0], t[1], t[2], t[3], t[4]};
        status = xj_gate_residual(rt, t[0], t[1], t[2], t[3], t[4], stream);
        break;
      case 1:
        op = "adaln_row_gather";
        given = {t[0], t[1], t[2], t[3]};
        status = xj_adaln_row_gather(rt, t[0], t[1], t[2], t[3], stream);
        break;
      case 2:
        op = "rms_norm";
        given = {t[0], m[1], m[2], m[3], m[4], t[5], m[6]};
        status = xj_rms_norm(rt, t[0], m[1], m[2], m[3], m[4], t[5], m[6], scalar, stream);
        break;
      case 3:
        op = "timestep_sinusoid";
        given = {t[0], t[1]};
        status = xj_timestep_sinusoid(rt, t[0], t[1], scalar, flag, scalar, scalar, flag, stream);
        break;
      case 4:
        op = "det_linear";
        given = {t[0], t[1], m[2], t[3], m[4]};
        status = xj_det_linear(rt, t[0], t[1], m[2], t[3], m[4], flag, stream);
        break;
      case 5:
        op = "det_linear_backward";
        given = {t[0], m[1], t[2], t[3], m[4], m[5], m[6], m[7]};
        status = xj_det_linear_backward(rt, t[0], m[1], t[2], t[3], m[4], m[5], m[6], m[7], flag, stream);
        break;
      case 6:
        op = "gate_residual_backward";
        given = {t[0], t[1], t[2], t[3], m[4], m[5], m[6]};
        status = xj_gate_residual_backward(rt, t[0], t[1], t[2], t[3], m[4], m[5], m[6], stream);
        break;
      case 7:
        op = "rms_norm_backward";
        given = {t[0], t[1], m[2], m[3], m[4], t[5], m[6], m[7], m[8], m[9], m[10]};
        status =
            xj_rms_norm_backward(rt, t[0], t[1], m[2], m[3], m[4], t[5], scalar, m[6], m[7], m[8], m[9], m[10], stream);
        break;
      case 8:
        op = "adaln_row_gather_backward";
        given = {t[0], t[1], t[2], t[3], m[4]};
        status = xj_adaln_row_gather_backward(rt, t[0], t[1], t[2], t[3], m[4], stream);
        break;
      case 9:
        op = "timestep_sinusoid_backward";
        given = {t[0], t[1], t[2]};
        status = xj_timestep_sinusoid_backward(rt, t[0], t[1], t[2], scalar, flag, scalar, scalar, stream);
        break;
      case 10: {  // workspace queries: a size, or exactly -1 for shapes they call invalid
        const long long extremes[] = {0, 1, 3, 64, 5376, 4097, 1LL << 31, 1LL << 40, LLONG_MAX, -1, LLONG_MIN};
        auto pick = [&] {
          return rng() % 2 ? extremes[rng() % std::size(extremes)] : static_cast<long long>(rng() % 9000);
        };
        const long long a = pick(), b = pick(), c = pick(), d = pick();
        const long long answers[] = {xj_gate_residual_backward_workspace_bytes(a, b, c, d),
                                     xj_rms_norm_backward_workspace_bytes(a, b, c, d, flag),
                                     xj_adaln_row_gather_backward_workspace_bytes(a, b, c),
                                     xj_det_linear_backward_workspace_bytes(a, b, c)};
        for (long long bytes : answers)
          EXPECT_GE(bytes, -1) << i << ": (" << a << ", " << b << ", " << c << ", " << d << ")";
        continue;
      }
    }
    if (expect_allowed(status, op, i)) {  // past validation: the call was sound
      accepted++;
      test::expect_sound(given, static_cast<int>(i));
    }
  }
  RecordProperty("accepted", std::to_string(accepted));
  xj_runtime_destroy(runtime);
}

// One valid H3 call per op through the C ABI, one tensor of it broken in one way (or none): these
// reach every rule and, when accepted, the cache lookup (an offline miss here).
TEST(CAbiFuzz, NearValidCallsAreRefusedOrSound) {
  using test::FakeTensor;
  using test::GiB;
  constexpr int64_t H = 5376, S = 7;
  test::FakeCuda fake;
  test::TempDir cache;
  const xj_runtime_options options{sizeof(xj_runtime_options), cache.path().c_str(), nullptr, 1, nullptr, 0};
  xj_runtime* runtime = nullptr;
  ASSERT_EQ(xj_runtime_create(&options, &runtime), XJ_OK) << xj_last_error();
  std::mt19937_64 rng(env_or("EXACTJIT_FUZZ_SEED", 20261203));
  int accepted = 0;
  for (int i = 0; i < 3000; ++i) {
    FakeTensor x{1 * GiB, {1, S, H}, test::kBF16}, y{4 * GiB, {1, S, H}, test::kBF16};
    FakeTensor rows{2 * GiB, {9, 6 * H}, test::kBF16}, index{3 * GiB, {S}, test::kI64};
    FakeTensor gate{2 * GiB + 2 * H * 2, {9, H}, test::kBF16, {6 * H, 1}};
    FakeTensor shift{2 * GiB, {9, H}, test::kBF16, {6 * H, 1}}, scale{2 * GiB + H * 2, {9, H}, test::kBF16, {6 * H, 1}};
    FakeTensor out{5 * GiB, {1, S, H}, test::kBF16}, gathered{5 * GiB, {6, S, H}, test::kBF16};
    FakeTensor rstd{6 * GiB, {1, S}, test::kF32}, d_gate{6 * GiB, {9, H}, test::kBF16};
    FakeTensor workspace{7 * GiB, {xj_gate_residual_backward_workspace_bytes(S, S, 9, H)}, test::kU8};
    std::vector<DLTensor*> tensors;
    const char* op = "";
    std::function<exactjit_status_t()> call;
    switch (i % 4) {
      case 0:
        op = "gate_residual";
        tensors = {&x.t, &gate.t, &index.t, &y.t, &out.t};
        call = [&] { return xj_gate_residual(runtime, &x.t, &gate.t, &index.t, &y.t, &out.t, nullptr); };
        break;
      case 1:
        op = "adaln_row_gather";
        tensors = {&rows.t, &index.t, &index.t, &gathered.t};
        call = [&] { return xj_adaln_row_gather(runtime, &rows.t, &index.t, &index.t, &gathered.t, nullptr); };
        break;
      case 2:
        op = "rms_norm";
        tensors = {&x.t, &shift.t, &scale.t, &index.t, &out.t, &rstd.t};
        call = [&] {
          return xj_rms_norm(runtime, &x.t, nullptr, &shift.t, &scale.t, &index.t, &out.t, &rstd.t, 1e-5, nullptr);
        };
        break;
      case 3:
        op = "gate_residual_backward";
        tensors = {&y.t, &gate.t, &index.t, &x.t, &out.t, &d_gate.t, &workspace.t};
        call = [&] {
          return xj_gate_residual_backward(runtime, &y.t, &gate.t, &index.t, &x.t, &out.t, &d_gate.t, &workspace.t,
                                           nullptr);
        };
        break;
    }
    if (rng() % 8 != 0) perturb(*tensors[rng() % tensors.size()], rng);
    if (expect_allowed(call(), op, static_cast<uint64_t>(i))) {
      accepted++;
      test::expect_sound(test::Given(tensors.begin(), tensors.end()), i);
    }
  }
  RecordProperty("accepted", accepted);
  EXPECT_GT(accepted, 300);  // the unbroken calls (one in 8) get through, to the offline miss
  xj_runtime_destroy(runtime);
}

TEST(CAbiFuzz, RandomRuntimeOptionsAreRefusedOrWork) {
  test::FakeCuda fake;
  std::mt19937_64 rng(env_or("EXACTJIT_FUZZ_SEED", 20261203));
  const char* strings[] = {nullptr, "", "sm_90", "compute_80", "sm_", "sm_99999999999", "garbage", "/nonexistent"};
  for (int i = 0; i < 300; ++i) {
    xj_runtime_options options{};
    const unsigned sizes[] = {0, 4, sizeof(xj_runtime_options) - 1, sizeof(xj_runtime_options),
                              sizeof(xj_runtime_options) + 64};
    options.struct_size = sizes[rng() % std::size(sizes)];
    options.cache_dir = strings[rng() % std::size(strings)];
    options.read_only_cache_path = strings[rng() % std::size(strings)];
    options.offline = static_cast<int>(rng() % 4) - 1;
    options.arch = strings[rng() % std::size(strings)];
    options.check_after_launch = static_cast<int>(rng() % 4) - 1;
    xj_runtime* runtime = nullptr;
    const exactjit_status_t status = xj_runtime_create(rng() % 8 ? &options : nullptr, &runtime);
    EXPECT_TRUE(status == XJ_OK || status == XJ_ERROR_INVALID_ARGUMENT) << i << ": " << xj_last_error();
    EXPECT_EQ(status == XJ_OK, runtime != nullptr) << i;
    if (runtime) xj_runtime_destroy(runtime);
  }
  EXPECT_EQ(xj_runtime_create(nullptr, nullptr), XJ_ERROR_INVALID_ARGUMENT);
}

}  // namespace
}  // namespace exactjit
