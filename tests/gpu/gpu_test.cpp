// GPU tests: kernels launched through the Runtime against the host model, bit for bit, across
// dtypes, index types, vector paths, table views and shapes; the bad-index path (reported with the
// op's name, context still usable); launch-time argument errors. Every test skips cleanly when no
// CUDA driver or GPU is present.
#include "kernels/det_linear.hpp"
#include "kernels/det_linear_backward.hpp"
#include "kernels/gate_residual.hpp"
#include "kernels/gate_residual_backward.hpp"
#include "kernels/gate_residual_rms_norm.hpp"
#include "kernels/host_model.hpp"
#include "kernels/rms_norm.hpp"
#include "kernels/rms_norm_backward.hpp"
#include "runtime/device_buffer.hpp"
#include "runtime/driver.hpp"
#include "runtime/errors.hpp"
#include "selftest/selftest.hpp"
#include "selftest/support.hpp"
#include "templates/numerics.cuh"

#include <fmt/format.h>
#include <gtest/gtest.h>

namespace exactjit {
namespace {

class Gpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!Driver::available()) GTEST_SKIP() << "no CUDA driver or GPU";
  }
  static Runtime& runtime() {
    static Runtime instance;
    return instance;
  }
  // A runtime that compiles PTX for compute_80, so det_linear's bf16 forward runs its register
  // kernel on this GPU.
  static RuntimeOptions register_kernel_options() {
    RuntimeOptions options = RuntimeOptions::from_environment();
    options.arch = "compute_80";
    return options;
  }
  void expect_pass(const GateResidualCase& c) {
    auto outcome = run_gate_residual_case(runtime(), 0, c);
    ASSERT_TRUE(static_cast<bool>(outcome)) << llvm::toString(outcome.takeError());
    EXPECT_TRUE(outcome->launch.ok()) << c.name() << ": " << outcome->launch.message();
    EXPECT_TRUE(outcome->passed) << c.name() << ": " << outcome->detail;
  }
  void check_det_linear_forward(DType dtype, int64_t K, int64_t N) {
    using namespace selftest;
    const int64_t T = 8;
    const std::string name = fmt::format("{} K={} N={}", dtype_name(dtype), K, N);
    Generator gen{static_cast<uint64_t>(11 + K + N)};
    std::vector<uint8_t> x = random_storage(gen, DType::F32, T * K, false);
    std::vector<uint8_t> w = random_storage(gen, dtype, N * K, false);
    std::vector<uint8_t> b = random_storage(gen, dtype, N, false);
    auto arena = DeviceArena::open(0);
    ASSERT_TRUE(static_cast<bool>(arena)) << llvm::toString(arena.takeError());
    const size_t out_elem = dtype_size(dtype);
    DeviceBuffer* d_x = arena->upload(x, x.size());
    DeviceBuffer* d_w = arena->upload(w, w.size());
    DeviceBuffer* d_b = arena->upload(b, b.size());
    DeviceBuffer* d_out = arena->upload({}, static_cast<size_t>(T * N) * out_elem);
    DeviceBuffer* d_pre = arena->upload({}, static_cast<size_t>(T * N) * 4);
    ASSERT_FALSE(static_cast<bool>(arena->take_error()));
    int64_t w_shape[2] = {N, K}, b_shape[1] = {N};
    const DLTensor t_w = device_tensor(*d_w, 0, 0, 2, w_shape, nullptr, dl_dtype(dtype));
    const DLTensor t_b = device_tensor(*d_b, 0, 0, 1, b_shape, nullptr, dl_dtype(dtype));
    auto run = [&](int64_t rows, bool silu, std::vector<uint8_t>& out, std::vector<float>& pre) {
      int64_t x_shape[2] = {rows, K}, out_shape[2] = {rows, N};
      const DLTensor t_x = device_tensor(*d_x, 0, 0, 2, x_shape, nullptr, dl_dtype(DType::F32));
      const DLTensor t_out = device_tensor(*d_out, 0, 0, 2, out_shape, nullptr, dl_dtype(dtype));
      const DLTensor t_pre = device_tensor(*d_pre, 0, 0, 2, out_shape, nullptr, dl_dtype(DType::F32));
      const Status status = runtime().launch(
          plan_det_linear({t_x, t_w, &t_b, t_out, &t_pre, silu}, runtime().traits(t_x.device)), nullptr);
      ASSERT_TRUE(status.ok()) << status.message();
      ASSERT_TRUE(runtime().synchronize(0, nullptr).ok());
      out.resize(static_cast<size_t>(rows * N) * out_elem);
      pre.resize(static_cast<size_t>(rows * N));
      ASSERT_FALSE(static_cast<bool>(d_out->download(out.data(), out.size())));
      ASSERT_FALSE(static_cast<bool>(d_pre->download(pre.data(), pre.size() * 4)));
    };
    std::vector<float> model;
    if (dtype == DType::F32) {
      model.resize(static_cast<size_t>(T * N));
      det_linear_fp32_model(reinterpret_cast<const float*>(x.data()), reinterpret_cast<const float*>(w.data()),
                            reinterpret_cast<const float*>(b.data()), T, K, N, model.data());
    }
    for (bool silu : {false, true}) {
      std::vector<uint8_t> full, again, part;
      std::vector<float> full_pre, again_pre, part_pre;
      run(T, silu, full, full_pre);
      run(T, silu, again, again_pre);
      EXPECT_EQ(full, again) << name << ": a second run differs";
      for (int64_t rows = 1; rows < T; ++rows) {
        run(rows, silu, part, part_pre);
        EXPECT_EQ(0, std::memcmp(part.data(), full.data(), part.size())) << name << " T=" << rows;
        EXPECT_EQ(0, std::memcmp(part_pre.data(), full_pre.data(), part_pre.size() * 4)) << name << " T=" << rows;
      }
      if (dtype == DType::F32) {
        EXPECT_EQ(0, std::memcmp(model.data(), full_pre.data(), model.size() * 4))
            << name << ": pre-activation vs the host model";
        if (!silu) {
          EXPECT_EQ(0, std::memcmp(model.data(), full.data(), model.size() * 4)) << name;
        }
      } else if (!silu) {
        int64_t off = 0;
        for (int64_t t = 0; t < T; ++t)
          for (int64_t n = 0; n < N; n += 97) {
            long double ref = xj::to_float(reinterpret_cast<const xj::bf16*>(b.data())[n]), magnitude = std::fabs(ref);
            for (int64_t k = 0; k < K; ++k) {
              const long double term =
                  static_cast<long double>(xj::to_float(reinterpret_cast<const xj::bf16*>(w.data())[n * K + k])) *
                  xj::to_float(xj::round_to<xj::bf16>(reinterpret_cast<const float*>(x.data())[t * K + k]));
              ref += term;
              magnitude += std::fabs(term);
            }
            off += !(std::fabs(static_cast<double>(ref) - full_pre[t * N + n]) <=
                     256 * 0x1p-24 * static_cast<double>(magnitude));
          }
        EXPECT_EQ(off, 0) << name << ": bf16 pre-activations far from the fp64 reference";
      }
    }
  }
  // The bf16 forward on this GPU's bulk-copy kernel and on the register kernel (`registers`, a
  // runtime compiling PTX for compute_80) give the same bits for each row count (at most 11).
  void check_bulk_matches_registers(Runtime& registers, int64_t K, int64_t N,
                                    std::initializer_list<int64_t> rows_list) {
    using namespace selftest;
    const int64_t T = 11;
    ASSERT_TRUE(det_linear_geometry(DType::BF16, K, N, 90).bulk);
    Generator gen{static_cast<uint64_t>(7 + K + N)};
    std::vector<uint8_t> x = random_storage(gen, DType::F32, T * K, false);
    std::vector<uint8_t> w = random_storage(gen, DType::BF16, N * K, false);
    std::vector<uint8_t> b = random_storage(gen, DType::BF16, N, false);
    auto arena = DeviceArena::open(0);
    ASSERT_TRUE(static_cast<bool>(arena)) << llvm::toString(arena.takeError());
    DeviceBuffer* d_x = arena->upload(x, x.size());
    DeviceBuffer* d_w = arena->upload(w, w.size());
    DeviceBuffer* d_b = arena->upload(b, b.size());
    DeviceBuffer* d_out = arena->upload({}, static_cast<size_t>(T * N) * 2);
    DeviceBuffer* d_pre = arena->upload({}, static_cast<size_t>(T * N) * 4);
    ASSERT_FALSE(static_cast<bool>(arena->take_error()));
    int64_t w_shape[2] = {N, K}, b_shape[1] = {N};
    const DLTensor t_w = device_tensor(*d_w, 0, 0, 2, w_shape, nullptr, dl_dtype(DType::BF16));
    const DLTensor t_b = device_tensor(*d_b, 0, 0, 1, b_shape, nullptr, dl_dtype(DType::BF16));
    auto run = [&](Runtime& rt, int64_t rows, bool silu, std::vector<uint8_t>& out) {
      int64_t x_shape[2] = {rows, K}, out_shape[2] = {rows, N};
      const DLTensor t_x = device_tensor(*d_x, 0, 0, 2, x_shape, nullptr, dl_dtype(DType::F32));
      const DLTensor t_out = device_tensor(*d_out, 0, 0, 2, out_shape, nullptr, dl_dtype(DType::BF16));
      const DLTensor t_pre = device_tensor(*d_pre, 0, 0, 2, out_shape, nullptr, dl_dtype(DType::F32));
      const Status status =
          rt.launch(plan_det_linear({t_x, t_w, &t_b, t_out, &t_pre, silu}, rt.traits(t_x.device)), nullptr);
      ASSERT_TRUE(status.ok()) << status.message();
      ASSERT_TRUE(rt.synchronize(0, nullptr).ok());
      out.resize(static_cast<size_t>(rows * N) * 6);
      ASSERT_FALSE(static_cast<bool>(d_out->download(out.data(), static_cast<size_t>(rows * N) * 2)));
      ASSERT_FALSE(static_cast<bool>(d_pre->download(out.data() + rows * N * 2, static_cast<size_t>(rows * N) * 4)));
    };
    for (bool silu : {false, true})
      for (int64_t rows : rows_list) {
        std::vector<uint8_t> bulk, reg;
        run(runtime(), rows, silu, bulk);
        run(registers, rows, silu, reg);
        EXPECT_TRUE(bulk == reg) << "K=" << K << " N=" << N << " T=" << rows << " silu=" << silu;
      }
  }
};

TEST_F(Gpu, GateResidualMatchesHostModelBitwise) {
  uint64_t seed = 100;
  for (DType dtype : {DType::BF16, DType::F16, DType::F32}) {
    for (IndexType index : {IndexType::I64, IndexType::I32}) {
      for (int64_t seq : {1, 7, 4097}) {
        for (int64_t batch : {1, 2}) {
          for (bool misaligned : {false, true}) {
            GateResidualCase c;
            c.dtype = dtype;
            c.index = index;
            c.seq = seq;
            c.batch = batch;
            c.misaligned = misaligned;
            c.table_stride = (seed % 2) ? 6 * c.hidden : 2 * c.hidden;
            c.table_rows = (seed % 2) ? 9 : 3;
            c.seed = seed++;
            expect_pass(c);
          }
        }
      }
    }
  }
}

TEST_F(Gpu, GateResidualOtherHiddenSizesAndStrides) {
  uint64_t seed = 500;
  for (int64_t hidden : {1, 12, 64, 1000, 1024, 3072, 4096, 5377}) {
    for (DType dtype : {DType::BF16, DType::F32}) {
      GateResidualCase c;
      c.dtype = dtype;
      c.hidden = hidden;
      c.table_stride = 6 * hidden + (hidden % 2);  // odd strides force the scalar path
      c.table_rows = 5;
      c.seq = 33;
      c.batch = 2;
      c.seed = seed++;
      expect_pass(c);
    }
  }
}

TEST_F(Gpu, BadIndexIsReportedAndContextStaysUsable) {
  for (IndexType index : {IndexType::I64, IndexType::I32}) {
    GateResidualCase bad;
    bad.index = index;
    bad.bad_position = 5;
    auto outcome = run_gate_residual_case(runtime(), 0, bad);
    ASSERT_TRUE(static_cast<bool>(outcome)) << llvm::toString(outcome.takeError());
    EXPECT_TRUE(outcome->launch.ok());
    EXPECT_EQ(outcome->sync.code(), static_cast<int>(ErrorCode::BadIndex));
    EXPECT_NE(outcome->sync.message().find("gate_residual: index[5] = 12 is out of range [0, 9)"), std::string::npos)
        << outcome->sync.message();
    EXPECT_TRUE(outcome->passed) << outcome->detail;  // the good rows are still exact
    // The record was cleared and the context works.
    GateResidualCase good;
    good.index = index;
    expect_pass(good);
  }
}

// A bad index fails the next exactjit call on the stream it was launched on, with no exactjit
// synchronisation in between (the report reaches the record's host-mapped mirror), and no call on
// another stream; the failing call launches nothing. The legacy default stream and the per-thread
// default stream are two streams.
TEST_F(Gpu, BadIndexFailsTheNextCallOnItsStreamOnly) {
  using namespace selftest;
  auto driver = Driver::get();
  ASSERT_TRUE(static_cast<bool>(driver)) << llvm::toString(driver.takeError());
  constexpr int64_t S = 8, H = 64, R = 9;
  auto arena = DeviceArena::open(0);
  ASSERT_TRUE(static_cast<bool>(arena)) << llvm::toString(arena.takeError());
  Generator gen{20261203};
  const std::vector<uint8_t> rows = random_storage(gen, DType::BF16, S * H, false);
  std::vector<int64_t> good(S, 1), bad(S, 1);
  bad[3] = 12;
  DeviceBuffer* d_residual = arena->upload(rows, rows.size());
  DeviceBuffer* d_gate = arena->upload(random_storage(gen, DType::BF16, R * H, false), R * H * 2);
  DeviceBuffer* d_good = arena->upload(index_bytes(IndexType::I64, good), S * 8);
  DeviceBuffer* d_bad = arena->upload(index_bytes(IndexType::I64, bad), S * 8);
  DeviceBuffer* d_out = arena->upload({}, rows.size());
  ASSERT_FALSE(static_cast<bool>(arena->take_error()));
  int64_t shape[2] = {S, H}, gate_shape[2] = {R, H}, index_shape[1] = {S};
  const DLTensor residual = device_tensor(*d_residual, 0, 0, 2, shape, nullptr, dl_dtype(DType::BF16));
  const DLTensor gate = device_tensor(*d_gate, 0, 0, 2, gate_shape, nullptr, dl_dtype(DType::BF16));
  const DLTensor good_index = device_tensor(*d_good, 0, 0, 1, index_shape, nullptr, dl_index(IndexType::I64));
  const DLTensor bad_index = device_tensor(*d_bad, 0, 0, 1, index_shape, nullptr, dl_index(IndexType::I64));
  const DLTensor out = device_tensor(*d_out, 0, 0, 2, shape, nullptr, dl_dtype(DType::BF16));
  auto call = [&](const DLTensor& index, CUstream stream) {
    return runtime().launch(plan_gate_residual({residual, gate, index, residual, out}), stream);
  };
  const CUstream mine = CU_STREAM_PER_THREAD, other = nullptr;
  auto context = primary_context(**driver, 0);
  ASSERT_TRUE(static_cast<bool>(context)) << llvm::toString(context.takeError());
  ScopedContext scope(**driver, *context);  // for the test's own stream waits

  ASSERT_TRUE(call(bad_index, mine).ok());
  ASSERT_EQ((*driver)->cuStreamSynchronize(mine), CUDA_SUCCESS);  // the kernel is done: a plain wait
  EXPECT_TRUE(call(good_index, other).ok());  // another stream's call is not told
  ASSERT_TRUE(runtime().synchronize(0, other).ok());
  ASSERT_FALSE(static_cast<bool>(d_out->fill(0xAB)));
  const Status next = call(good_index, mine);
  EXPECT_EQ(next.code(), static_cast<int>(ErrorCode::BadIndex));
  EXPECT_NE(next.message().find("gate_residual: index[3] = 12 is out of range [0, 9)"), std::string::npos)
      << next.message();
  ASSERT_EQ((*driver)->cuStreamSynchronize(mine), CUDA_SUCCESS);
  std::vector<uint8_t> after(rows.size());
  ASSERT_FALSE(static_cast<bool>(d_out->download(after.data(), after.size())));
  EXPECT_EQ(after, std::vector<uint8_t>(rows.size(), 0xAB));  // the failing call launched nothing
  EXPECT_TRUE(call(good_index, mine).ok());  // reported once; the stream is usable
  EXPECT_TRUE(runtime().synchronize(0, mine).ok());
}

TEST_F(Gpu, AdalnRowGatherMatchesHostModelBitwise) {
  uint64_t seed = 900;
  for (DType dtype : {DType::BF16, DType::F16, DType::F32}) {
    for (IndexType index : {IndexType::I64, IndexType::I32}) {
      for (int64_t seq : {1, 7, 4097}) {
        for (bool misaligned : {false, true}) {
          AdalnRowGatherCase c;
          c.dtype = dtype;
          c.index = index;
          c.seq = seq;
          c.misaligned = misaligned;
          c.table_stride = (seed % 2) ? 6 * c.hidden : 6 * c.hidden + 8;
          c.seed = seed++;
          auto outcome = run_adaln_row_gather_case(runtime(), 0, c);
          ASSERT_TRUE(static_cast<bool>(outcome)) << llvm::toString(outcome.takeError());
          EXPECT_TRUE(outcome->passed) << c.name() << ": " << outcome->detail;
        }
      }
    }
  }
}

TEST_F(Gpu, AdalnRowGatherChecksEachIndexBeforeCombining) {
  AdalnRowGatherCase bad_t;
  bad_t.bad_timestep = 3;
  auto outcome = run_adaln_row_gather_case(runtime(), 0, bad_t);
  ASSERT_TRUE(static_cast<bool>(outcome)) << llvm::toString(outcome.takeError());
  EXPECT_NE(outcome->sync.message().find("adaln_row_gather: timestep_indices[3] = 3 is out of range [0, 3)"),
            std::string::npos)
      << outcome->sync.message();
  EXPECT_TRUE(outcome->passed) << outcome->detail;
  AdalnRowGatherCase bad_tag;
  bad_tag.bad_tag = 6;
  outcome = run_adaln_row_gather_case(runtime(), 0, bad_tag);
  ASSERT_TRUE(static_cast<bool>(outcome)) << llvm::toString(outcome.takeError());
  EXPECT_NE(outcome->sync.message().find("adaln_row_gather: token_tags[6] = 3 is out of range [0, 3)"),
            std::string::npos)
      << outcome->sync.message();
  EXPECT_TRUE(outcome->passed) << outcome->detail;
}

TEST_F(Gpu, CheckAfterLaunchReportsAtTheCall) {
  RuntimeOptions options = RuntimeOptions::from_environment();
  options.check_after_launch = true;
  Runtime checked(options);
  GateResidualCase bad;
  bad.bad_position = 0;
  auto outcome = run_gate_residual_case(checked, 0, bad);
  ASSERT_TRUE(static_cast<bool>(outcome)) << llvm::toString(outcome.takeError());
  EXPECT_EQ(outcome->launch.code(), static_cast<int>(ErrorCode::BadIndex)) << outcome->launch.message();
}

TEST_F(Gpu, BackwardMatchesHostModelBitwiseAndRepeats) {
  uint64_t seed = 9000;
  auto check = [](llvm::Expected<CaseOutcome> outcome, const std::string& name) {
    ASSERT_TRUE(static_cast<bool>(outcome)) << llvm::toString(outcome.takeError());
    EXPECT_TRUE(outcome->launch.ok()) << name << ": " << outcome->launch.message();
    EXPECT_TRUE(outcome->passed) << name << ": " << outcome->detail;
  };
  for (DType dtype : {DType::BF16, DType::F16, DType::F32}) {
    for (int64_t seq : {1, 7, 300, 4097}) {
      for (int64_t batch : {1, 2}) {
        GateResidualCase g;
        g.dtype = dtype;
        g.seq = seq;
        g.batch = batch;
        g.index = batch == 1 ? IndexType::I64 : IndexType::I32;
        g.table_rows = seq == 300 ? 1 : 9;  // one table row: every position in one segment
        g.table_stride = g.table_rows == 1 ? g.hidden : 6 * g.hidden;
        g.seed = seed++;
        check(run_gate_residual_backward_case(runtime(), 0, g), "backward " + g.name());
        RmsNormCase n;
        n.dtype = dtype;
        n.seq = seq;
        n.batch = batch;
        n.table_stride = (seq % 2) ? 6 * n.hidden : 0;
        n.weighted = batch == 2 || n.table_stride == 0;
        n.index = batch == 1 ? IndexType::I64 : IndexType::I32;
        n.seed = seed++;
        check(run_rms_norm_backward_case(runtime(), 0, n), "backward " + n.name());
        if (dtype == DType::BF16 && n.table_stride != 0) {  // the one-pass kernel: the same model
          n.path = TilePath::OnePass;
          n.seed = seed++;
          check(run_rms_norm_backward_case(runtime(), 0, n), "backward " + n.name());
        }
        n.path = TilePath::Narrow;  // the parameter tiles one column a thread: the same model
        n.seed = seed++;
        check(run_rms_norm_backward_case(runtime(), 0, n), "backward " + n.name());
      }
      AdalnRowGatherCase a;
      a.dtype = dtype;
      a.seq = seq;
      a.seed = seed++;
      check(run_adaln_row_gather_backward_case(runtime(), 0, a), "backward " + a.name());
    }
  }
  // Other widths: the scalar path (H not a multiple of 8) and short rows.
  for (int64_t hidden : {12, 128, 1000, 1024}) {
    GateResidualCase g;
    g.hidden = hidden;
    g.table_stride = 2 * hidden + 4;
    g.seed = seed++;
    check(run_gate_residual_backward_case(runtime(), 0, g), "backward " + g.name());
    RmsNormCase n;
    n.hidden = hidden;
    n.table_stride = 2 * hidden;
    n.table_rows = 3;
    n.seed = seed++;
    check(run_rms_norm_backward_case(runtime(), 0, n), "backward " + n.name());
    n.path = TilePath::OnePass;  // H = 12 keeps the two kernels (16-byte rows); the others take one pass
    n.seed = seed++;
    check(run_rms_norm_backward_case(runtime(), 0, n), "backward " + n.name());
    n.path = TilePath::Narrow;
    n.seed = seed++;
    check(run_rms_norm_backward_case(runtime(), 0, n), "backward " + n.name());
    AdalnRowGatherCase a;
    a.hidden = hidden;
    a.seed = seed++;
    check(run_adaln_row_gather_backward_case(runtime(), 0, a), "backward " + a.name());
  }
}

// gate_residual_rms_norm against its two ops on the same device, bit for bit: h and out (and
// rstd) as gate_residual then rms_norm give them; the backward's d_residual as rT(grad_h + the
// norm's dx), its d_y and d_gate as gate_residual_backward of that sum, its d_weight, d_shift and
// d_scale as rms_norm_backward's. Then a bad index is reported under this op's name.
TEST_F(Gpu, GateResidualRmsNormEqualsItsTwoOpsBitwise) {
  using namespace selftest;
  uint64_t seed = 7000;
  const int64_t R = 9;
  for (DType dtype : {DType::BF16, DType::F16, DType::F32})
    for (int64_t hidden : {int64_t{5376}, int64_t{1000}, int64_t{128}})
      for (int variant = 0; variant < 3; ++variant) {
        const bool modulated = variant != 1, weighted = variant != 2, with_grad_h = variant != 2;
        const int64_t seq = variant == 0 ? 4097 : 300, batch = variant == 1 ? 2 : 1, rows = seq * batch;
        const int64_t stride = 6 * hidden;
        const IndexType index_type = variant == 1 ? IndexType::I32 : IndexType::I64;
        const std::string name = fmt::format("{} H={} S={} B={} modulated={} weighted={} grad_h={}", dtype_name(dtype),
                                             hidden, seq, batch, modulated, weighted, with_grad_h);
        Generator gen{seed++};
        const size_t elem = dtype_size(dtype), act = static_cast<size_t>(rows * hidden) * elem;
        auto arena = DeviceArena::open(0);
        ASSERT_TRUE(static_cast<bool>(arena)) << llvm::toString(arena.takeError());
        std::vector<uint8_t> table = random_storage(gen, dtype, R * stride, false);
        DeviceBuffer* d_residual_in = arena->upload(random_storage(gen, dtype, rows * hidden, false), act);
        DeviceBuffer* d_y_in = arena->upload(random_storage(gen, dtype, rows * hidden, false), act);
        DeviceBuffer* d_table = arena->upload(table, table.size());
        DeviceBuffer* d_weight_in = arena->upload(random_storage(gen, dtype, hidden, false), hidden * elem);
        DeviceBuffer* d_index = arena->upload(index_bytes(index_type, random_indices(gen, seq, R, -1, 0)),
                                              static_cast<size_t>(seq) * (index_type == IndexType::I32 ? 4 : 8));
        DeviceBuffer* d_grad_out = arena->upload(random_storage(gen, dtype, rows * hidden, false), act);
        DeviceBuffer* d_grad_h = arena->upload(random_storage(gen, dtype, rows * hidden, false), act);
        // Outputs: [fused, reference] each.
        DeviceBuffer* h[2] = {arena->upload({}, act), arena->upload({}, act)};
        DeviceBuffer* out[2] = {arena->upload({}, act), arena->upload({}, act)};
        DeviceBuffer* rstd[2] = {arena->upload({}, rows * 4), arena->upload({}, rows * 4)};
        DeviceBuffer* d_res[2] = {arena->upload({}, act), arena->upload({}, act)};
        DeviceBuffer* d_y[2] = {arena->upload({}, act), arena->upload({}, act)};
        // Zeroed: a gradient a variant does not compute stays zero in both.
        const std::vector<uint8_t> zero_grads(static_cast<size_t>((3 * R + 1) * hidden) * elem, 0);
        DeviceBuffer* grads[2] = {arena->upload(zero_grads, zero_grads.size()),
                                  arena->upload(zero_grads, zero_grads.size())};
        const int64_t ws_bytes = gate_residual_rms_norm_backward_workspace(rows, seq, R, hidden, weighted, modulated);
        ASSERT_GT(ws_bytes, 0);
        DeviceBuffer* d_ws = arena->upload({}, static_cast<size_t>(ws_bytes));
        ASSERT_FALSE(static_cast<bool>(arena->take_error()));

        int64_t act_shape[3] = {batch, seq, hidden}, table_shape[2] = {R, hidden}, table_strides[2] = {stride, 1};
        int64_t weight_shape[1] = {hidden}, index_shape[1] = {seq}, rstd_shape[1] = {rows}, ws_shape[1] = {ws_bytes};
        int64_t grad_shape[2] = {R, hidden};
        const DLDataType dt = dl_dtype(dtype);
        auto act_tensor = [&](DeviceBuffer* b) { return device_tensor(*b, 0, 0, 3, act_shape, nullptr, dt); };
        auto chunk = [&](int c) {
          return device_tensor(*d_table, c * hidden * elem, 0, 2, table_shape, table_strides, dt);
        };
        auto grad_tensor = [&](DeviceBuffer* b, int k) {  // d_gate, d_shift, d_scale, then d_weight
          return device_tensor(*b, static_cast<uint64_t>(k * R * hidden) * elem, 0, 2, grad_shape, nullptr, dt);
        };
        const DLTensor residual = act_tensor(d_residual_in), y = act_tensor(d_y_in), gate = chunk(2),
                       shift = chunk(3), scale = chunk(4), grad_out = act_tensor(d_grad_out),
                       grad_h = act_tensor(d_grad_h);
        const DLTensor weight = device_tensor(*d_weight_in, 0, 0, 1, weight_shape, nullptr, dt);
        const DLTensor index = device_tensor(*d_index, 0, 0, 1, index_shape, nullptr, dl_index(index_type));
        const DLTensor workspace = device_tensor(*d_ws, 0, 0, 1, ws_shape, nullptr, DLDataType{kDLUInt, 8, 1});
        DLTensor t_h[2], t_out[2], t_rstd[2], t_dres[2], t_dy[2], t_dgate[2], t_dshift[2], t_dscale[2], t_dweight[2];
        for (int k = 0; k < 2; ++k) {
          t_h[k] = act_tensor(h[k]);
          t_out[k] = act_tensor(out[k]);
          t_rstd[k] = device_tensor(*rstd[k], 0, 0, 1, rstd_shape, nullptr, DLDataType{kDLFloat, 32, 1});
          t_dres[k] = act_tensor(d_res[k]);
          t_dy[k] = act_tensor(d_y[k]);
          t_dgate[k] = grad_tensor(grads[k], 0);
          t_dshift[k] = grad_tensor(grads[k], 1);
          t_dscale[k] = grad_tensor(grads[k], 2);
          t_dweight[k] = device_tensor(*grads[k], static_cast<uint64_t>(3 * R * hidden) * elem, 0, 1, weight_shape,
                                       nullptr, dt);
        }
        const DLTensor* w = weighted ? &weight : nullptr;
        const double eps = 1e-6;
        // Forward: fused, then the two ops.
        Status status = runtime().launch(
            plan_gate_residual_rms_norm({residual, gate, index, y, w, modulated ? &shift : nullptr,
                                         modulated ? &scale : nullptr, t_h[0], t_out[0], &t_rstd[0], eps}),
            nullptr);
        ASSERT_TRUE(status.ok()) << name << ": " << status.message();
        status = runtime().launch(plan_gate_residual({residual, gate, index, y, t_h[1]}), nullptr);
        ASSERT_TRUE(status.ok()) << status.message();
        status = runtime().launch(plan_rms_norm({t_h[1], w, modulated ? &shift : nullptr, modulated ? &scale : nullptr,
                                                 modulated ? &index : nullptr, t_out[1], &t_rstd[1], eps}),
                                  nullptr);
        ASSERT_TRUE(status.ok()) << status.message();
        // Backward: fused, then the two ops with the residual gradient added on the host. The fused
        // call is planned as for a device one plan tile fills, so it runs the one-pass kernel
        // wherever that applies; the two ops run the dx kernel and the parameter tiles.
        const DeviceTraits one_tile_fills{runtime().traits(grad_out.device).sm, 1};
        auto fused_backward = plan_gate_residual_rms_norm_backward(
            {grad_out, with_grad_h ? &grad_h : nullptr, t_h[0], y, gate, index, w, modulated ? &scale : nullptr,
             t_rstd[0], eps, t_dres[0], &t_dy[0], &t_dgate[0], weighted ? &t_dweight[0] : nullptr,
             modulated ? &t_dshift[0] : nullptr, modulated ? &t_dscale[0] : nullptr, &workspace},
            one_tile_fills);
        ASSERT_TRUE(static_cast<bool>(fused_backward)) << llvm::toString(fused_backward.takeError());
        // It asks for d_y and d_gate, so the one-pass kernel takes the gate part too.
        bool one_pass = false;
        for (int k = 0; k < fused_backward->count; ++k)
          one_pass |= fused_backward->steps[k].spec.op == Op::GateResidualRmsNormOnePass;
        EXPECT_EQ(one_pass, modulated && dtype == DType::BF16 && hidden % 8 == 0 && one_tile_fills.sm == 90)
            << name;
        status = runtime().launch(std::move(fused_backward), nullptr);
        ASSERT_TRUE(status.ok()) << name << ": " << status.message();
        ASSERT_TRUE(runtime().synchronize(0, nullptr).ok());
        const int64_t norm_ws = rms_norm_backward_workspace(rows, seq, modulated ? R : 0, hidden, weighted);
        int64_t norm_ws_shape[1] = {std::max<int64_t>(norm_ws, 1)};
        const DLTensor norm_workspace =
            device_tensor(*d_ws, 0, 0, 1, norm_ws_shape, nullptr, DLDataType{kDLUInt, 8, 1});
        status = runtime().launch(
            plan_rms_norm_backward({grad_out, t_h[1], w, modulated ? &scale : nullptr, modulated ? &index : nullptr,
                                    t_rstd[1], eps, &t_dres[1], weighted ? &t_dweight[1] : nullptr,
                                    modulated ? &t_dshift[1] : nullptr, modulated ? &t_dscale[1] : nullptr,
                                    &norm_workspace}),
            nullptr);
        ASSERT_TRUE(status.ok()) << status.message();
        ASSERT_TRUE(runtime().synchronize(0, nullptr).ok());
        std::vector<uint8_t> sum(act), g_h(act);
        ASSERT_FALSE(static_cast<bool>(d_res[1]->download(sum.data(), act)));
        ASSERT_FALSE(static_cast<bool>(d_grad_h->download(g_h.data(), act)));
        if (with_grad_h)
          for (int64_t k = 0; k < rows * hidden; ++k) {
            float a = 0, b = 0;
            if (dtype == DType::F32) {
              std::memcpy(&a, &sum[k * 4], 4);
              std::memcpy(&b, &g_h[k * 4], 4);
            } else {
              uint16_t ab, bb;
              std::memcpy(&ab, &sum[k * 2], 2);
              std::memcpy(&bb, &g_h[k * 2], 2);
              a = dtype == DType::BF16 ? xj::to_float(xj::bf16{ab}) : xj::to_float(xj::fp16{ab});
              b = dtype == DType::BF16 ? xj::to_float(xj::bf16{bb}) : xj::to_float(xj::fp16{bb});
            }
            store(sum, k, dtype, xj::add(a, b));
          }
        DeviceBuffer* d_sum = arena->upload(sum, act);
        ASSERT_FALSE(static_cast<bool>(arena->take_error()));
        const DLTensor t_sum = act_tensor(d_sum);
        const int64_t gate_ws = gate_residual_backward_workspace(rows, seq, R, hidden);
        int64_t gate_ws_shape[1] = {gate_ws};
        const DLTensor gate_workspace =
            device_tensor(*d_ws, 0, 0, 1, gate_ws_shape, nullptr, DLDataType{kDLUInt, 8, 1});
        status = runtime().launch(
            plan_gate_residual_backward({t_sum, gate, index, y, &t_dy[1], &t_dgate[1], &gate_workspace}), nullptr);
        ASSERT_TRUE(status.ok()) << status.message();
        ASSERT_TRUE(runtime().synchronize(0, nullptr).ok());

        auto same = [&](DeviceBuffer* a, const std::vector<uint8_t>* expected_host, DeviceBuffer* b, size_t bytes,
                        const char* what) {
          std::vector<uint8_t> x(bytes), e(bytes);
          ASSERT_FALSE(static_cast<bool>(a->download(x.data(), bytes)));
          if (expected_host) e = *expected_host;
          else ASSERT_FALSE(static_cast<bool>(b->download(e.data(), bytes)));
          EXPECT_TRUE(x == e) << name << ": " << what << " differs";
        };
        // The host model: gate_residual's, then rms_norm's rows at the kernel's rstd (the GPU's
        // rsqrt.approx has no bit-exact host equivalent).
        std::vector<uint8_t> residual_host(act), y_host(act), weight_host(hidden * elem), index_host, h_model(act),
            out_model(act), rstd_host(static_cast<size_t>(rows) * 4);
        index_host.resize(static_cast<size_t>(seq) * (index_type == IndexType::I32 ? 4 : 8));
        ASSERT_FALSE(static_cast<bool>(d_residual_in->download(residual_host.data(), act)));
        ASSERT_FALSE(static_cast<bool>(d_y_in->download(y_host.data(), act)));
        ASSERT_FALSE(static_cast<bool>(d_weight_in->download(weight_host.data(), weight_host.size())));
        ASSERT_FALSE(static_cast<bool>(d_index->download(index_host.data(), index_host.size())));
        ASSERT_FALSE(static_cast<bool>(rstd[0]->download(rstd_host.data(), rstd_host.size())));
        EXPECT_EQ(gate_residual_model(dtype, residual_host.data(), table.data() + 2 * hidden * elem, stride, R,
                                      index_host.data(), index_type, y_host.data(), h_model.data(), rows, seq, hidden),
                  0);
        for (int64_t r = 0; r < rows; ++r) {
          int64_t i = 0;
          if (index_type == IndexType::I32) {
            int32_t v;
            std::memcpy(&v, &index_host[(r % seq) * 4], 4);
            i = v;
          } else {
            std::memcpy(&i, &index_host[(r % seq) * 8], 8);
          }
          float r_std;
          std::memcpy(&r_std, &rstd_host[r * 4], 4);
          const uint8_t* table_row = table.data() + static_cast<size_t>(i * stride) * elem;
          rms_norm_row_model(dtype, h_model.data() + r * hidden * elem, weighted ? weight_host.data() : nullptr,
                             modulated ? table_row + 3 * hidden * elem : nullptr,
                             modulated ? table_row + 4 * hidden * elem : nullptr, hidden, r_std,
                             out_model.data() + r * hidden * elem);
        }
        same(h[0], &h_model, nullptr, act, "h vs the host model");
        same(out[0], &out_model, nullptr, act, "out vs the host model");
        same(h[0], nullptr, h[1], act, "h");
        same(out[0], nullptr, out[1], act, "out");
        same(rstd[0], nullptr, rstd[1], static_cast<size_t>(rows) * 4, "rstd");
        same(d_res[0], &sum, nullptr, act, "d_residual");
        same(d_y[0], nullptr, d_y[1], act, "d_y");
        same(grads[0], nullptr, grads[1], static_cast<size_t>((3 * R + 1) * hidden) * elem,
             "d_gate, d_shift, d_scale, d_weight");
      }
}

TEST_F(Gpu, GateResidualRmsNormReportsABadIndexByName) {
  using namespace selftest;
  const int64_t H = 5376, R = 3, S = 64;
  Generator gen{77};
  auto arena = DeviceArena::open(0);
  ASSERT_TRUE(static_cast<bool>(arena)) << llvm::toString(arena.takeError());
  const size_t act = static_cast<size_t>(S * H) * 2;
  DeviceBuffer* d_x = arena->upload(random_storage(gen, DType::BF16, S * H, false), act);
  DeviceBuffer* d_table = arena->upload(random_storage(gen, DType::BF16, R * H, false), R * H * 2);
  DeviceBuffer* d_index = arena->upload(index_bytes(IndexType::I64, random_indices(gen, S, R, 5, 1 << 20)), S * 8);
  DeviceBuffer* d_h = arena->upload({}, act);
  DeviceBuffer* d_out = arena->upload({}, act);
  ASSERT_FALSE(static_cast<bool>(arena->take_error()));
  int64_t act_shape[2] = {S, H}, table_shape[2] = {R, H}, index_shape[1] = {S};
  const DLDataType bf16 = dl_dtype(DType::BF16);
  const DLTensor x = device_tensor(*d_x, 0, 0, 2, act_shape, nullptr, bf16);
  const DLTensor table = device_tensor(*d_table, 0, 0, 2, table_shape, nullptr, bf16);
  const DLTensor index = device_tensor(*d_index, 0, 0, 1, index_shape, nullptr, dl_index(IndexType::I64));
  const DLTensor h = device_tensor(*d_h, 0, 0, 2, act_shape, nullptr, bf16);
  const DLTensor out = device_tensor(*d_out, 0, 0, 2, act_shape, nullptr, bf16);
  Status status = runtime().launch(
      plan_gate_residual_rms_norm({x, table, index, x, nullptr, nullptr, nullptr, h, out, nullptr, 1e-6}), nullptr);
  ASSERT_TRUE(status.ok()) << status.message();
  status = runtime().synchronize(0, nullptr);
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.message().find("gate_residual_rms_norm: index[5]"), std::string::npos) << status.message();
  EXPECT_TRUE(runtime().synchronize(0, nullptr).ok());  // reported once; the context still works
}

// Also the compute-sanitizer target of the campaign: bad keys must not send any access out of
// bounds (the plan leaves them out of every tile).
TEST_F(Gpu, BackwardBadIndexIsReported) {
  GateResidualCase g;
  g.bad_position = 4;
  g.seq = 300;
  auto gate = run_gate_residual_backward_case(runtime(), 0, g);
  ASSERT_TRUE(static_cast<bool>(gate)) << llvm::toString(gate.takeError());
  EXPECT_TRUE(gate->passed) << gate->detail;
  RmsNormCase n;
  n.table_stride = 6 * n.hidden;
  n.bad_position = 0;
  auto norm = run_rms_norm_backward_case(runtime(), 0, n);
  ASSERT_TRUE(static_cast<bool>(norm)) << llvm::toString(norm.takeError());
  EXPECT_TRUE(norm->passed) << norm->detail;
  for (bool tag : {false, true}) {
    AdalnRowGatherCase a;
    (tag ? a.bad_tag : a.bad_timestep) = 3;
    auto gather = run_adaln_row_gather_backward_case(runtime(), 0, a);
    ASSERT_TRUE(static_cast<bool>(gather)) << llvm::toString(gather.takeError());
    EXPECT_TRUE(gather->passed) << gather->detail;
  }
  GateResidualCase after;  // the context still works
  auto good = run_gate_residual_backward_case(runtime(), 0, after);
  ASSERT_TRUE(static_cast<bool>(good)) << llvm::toString(good.takeError());
  EXPECT_TRUE(good->passed) << good->detail;
}

// det_linear: the fp32 path equals its host model bit for bit (before the activation); both
// paths give a row the same bits whatever T (1..8) and on a second run; the bf16 path is within
// 256u of the terms' magnitudes of an fp64 reference of the bf16-rounded inputs. The shapes cover
// every geometry (docs/det_linear.md): fp32 with one group per lane (the MLP's first layer, 4
// columns per warp, a partial last block) and with the 4-deep pipeline (the second layer's 21
// groups, plus a leftover group and a partial group: K = 5536; N = 2690 leaves a warp past the
// end); bf16 with 8-warp blocks (the 18H projection), 4-warp blocks 12 deep (the 2H one), and
// x staged in 64-chunk tiles with a half-wide last chunk and warps past the end (K = 4112, N = 2000).
TEST_F(Gpu, DetLinearIsBatchInvariantAndMatchesTheFp32Model) {
  check_det_linear_forward(DType::F32, 256, 5378);
  check_det_linear_forward(DType::F32, 5536, 2690);
  check_det_linear_forward(DType::BF16, 2688, 18 * 5376);
  check_det_linear_forward(DType::BF16, 2688, 2 * 5376);
  check_det_linear_forward(DType::BF16, 4112, 2000);
}

// det_linear backward (fp32): without SiLU every gradient equals the host model bit for bit. With
// SiLU the host's expf and libdevice's differ in the last bits, so d_v differs by a few ulp of its
// terms' scale |g| s (1 + |v|) (s = sigmoid(v); 1 + v (1 - s) can cancel), and d_input sums 5376
// such terms with cancellation: a bound relative to the result is meaningless. What the order
// guarantees is a bound relative to the terms' magnitudes, computed from the data:
// |got - model| <= 64u * sum over the terms of scale * |other factor| (u = 2^-24). Derivation: each
// side's order is within 5uS + 2u|exact| <= 7uS of the exact sum S of |terms| (d_weight: 3uS +
// 2u|exact|; tests/cpu/det_linear_test.cpp), and the two d_v differ by at most ~26u of their scale
// (expf <= 2 ulp, sigmoid's add and div, then sub, mul, add, mul, mul, each rounding a value the
// scale bounds), so 2 * 7 + 26 = 40u, checked with margin at 64u. Every output repeats bit for bit.
TEST_F(Gpu, DetLinearBackwardMatchesTheModel) {
  using namespace selftest;
  constexpr int64_t T = 3, K = 256, N = 5376;
  Generator gen{21};
  std::vector<uint8_t> g = random_storage(gen, DType::F32, T * N, false),
                       pre = random_storage(gen, DType::F32, T * N, false);
  std::vector<uint8_t> x = random_storage(gen, DType::F32, T * K, false),
                       w = random_storage(gen, DType::F32, N * K, false);
  const int64_t ws_bytes = det_linear_backward_workspace(T, K, N);
  auto arena = DeviceArena::open(0);
  ASSERT_TRUE(static_cast<bool>(arena)) << llvm::toString(arena.takeError());
  DeviceBuffer* d_g = arena->upload(g, g.size());
  DeviceBuffer* d_pre = arena->upload(pre, pre.size());
  DeviceBuffer* d_x = arena->upload(x, x.size());
  DeviceBuffer* d_w = arena->upload(w, w.size());
  DeviceBuffer* d_in = arena->upload({}, x.size());
  DeviceBuffer* d_dw = arena->upload({}, w.size());
  DeviceBuffer* d_db = arena->upload({}, static_cast<size_t>(N) * 4);
  DeviceBuffer* d_ws = arena->upload({}, static_cast<size_t>(ws_bytes));
  ASSERT_FALSE(static_cast<bool>(arena->take_error()));
  int64_t g_shape[2] = {T, N}, x_shape[2] = {T, K}, w_shape[2] = {N, K}, b_shape[1] = {N}, ws_shape[1] = {ws_bytes};
  const DLDataType f32 = dl_dtype(DType::F32);
  const DLTensor t_g = device_tensor(*d_g, 0, 0, 2, g_shape, nullptr, f32),
                 t_pre = device_tensor(*d_pre, 0, 0, 2, g_shape, nullptr, f32);
  const DLTensor t_x = device_tensor(*d_x, 0, 0, 2, x_shape, nullptr, f32),
                 t_w = device_tensor(*d_w, 0, 0, 2, w_shape, nullptr, f32);
  const DLTensor t_in = device_tensor(*d_in, 0, 0, 2, x_shape, nullptr, f32),
                 t_dw = device_tensor(*d_dw, 0, 0, 2, w_shape, nullptr, f32);
  const DLTensor t_db = device_tensor(*d_db, 0, 0, 1, b_shape, nullptr, f32);
  const DLTensor t_ws = device_tensor(*d_ws, 0, 0, 1, ws_shape, nullptr, DLDataType{kDLUInt, 8, 1});
  for (bool silu : {false, true}) {
    std::vector<float> got[2][3];
    for (int run = 0; run < 2; ++run) {
      const Status status = runtime().launch(
          plan_det_linear_backward({t_g, &t_pre, t_x, t_w, &t_in, &t_dw, &t_db, &t_ws, silu}), nullptr);
      ASSERT_TRUE(status.ok()) << status.message();
      ASSERT_TRUE(runtime().synchronize(0, nullptr).ok());
      got[run][0].resize(T * K);
      got[run][1].resize(N * K);
      got[run][2].resize(N);
      ASSERT_FALSE(static_cast<bool>(d_in->download(got[run][0].data(), x.size())));
      ASSERT_FALSE(static_cast<bool>(d_dw->download(got[run][1].data(), w.size())));
      ASSERT_FALSE(static_cast<bool>(d_db->download(got[run][2].data(), N * 4)));
    }
    std::vector<float> model[3] = {std::vector<float>(T * K), std::vector<float>(N * K), std::vector<float>(N)};
    det_linear_fp32_backward_model(reinterpret_cast<const float*>(g.data()), reinterpret_cast<const float*>(pre.data()),
                                   reinterpret_cast<const float*>(x.data()), reinterpret_cast<const float*>(w.data()),
                                   T, K, N, silu, model[0].data(), model[1].data(), model[2].data());
    // bound[o][i] = 64u * sum over output o's terms at i of the d_v scale * |other factor| (+ a
    // subnormal-sized slack for terms that underflow differently).
    std::vector<double> bound[3] = {std::vector<double>(T * K), std::vector<double>(N * K), std::vector<double>(N)};
    if (silu) {
      const float* gf = reinterpret_cast<const float*>(g.data());
      const float* vf = reinterpret_cast<const float*>(pre.data());
      const float* xf = reinterpret_cast<const float*>(x.data());
      const float* wf = reinterpret_cast<const float*>(w.data());
      std::vector<double> scale(T * N);
      for (int64_t i = 0; i < T * N; ++i)
        scale[i] = std::fabs(static_cast<double>(gf[i])) / (1 + std::exp(-static_cast<double>(vf[i]))) *
                   (1 + std::fabs(static_cast<double>(vf[i])));
      for (int64_t t = 0; t < T; ++t)
        for (int64_t n = 0; n < N; ++n) {
          const double d = scale[t * N + n];
          bound[2][n] += d;
          for (int64_t k = 0; k < K; ++k) {
            bound[0][t * K + k] += d * std::fabs(wf[n * K + k]);
            bound[1][n * K + k] += d * std::fabs(xf[t * K + k]);
          }
        }
      for (auto& b : bound)
        for (double& v : b) v = 64 * 0x1p-24 * v + 1e-30;
    }
    for (int o = 0; o < 3; ++o) {
      EXPECT_EQ(got[0][o], got[1][o]) << "output " << o << " repeats";
      if (!silu) {
        EXPECT_EQ(got[0][o], model[o]) << "output " << o << " vs the host model";
        continue;
      }
      size_t outside = 0, first = 0;
      for (size_t i = 0; i < model[o].size(); ++i)
        if (!(std::fabs(static_cast<double>(got[0][o][i]) - model[o][i]) <= bound[o][i]) && outside++ == 0) first = i;
      EXPECT_EQ(outside, 0u) << "output " << o << ": first at " << first << ": got " << got[0][o][first] << ", model "
                             << model[o][first] << ", bound " << bound[o][first];
    }
  }
}

// det_linear backward with bf16 weights, K = 2688: every output equals the host model bit for bit
// without SiLU, for an fp32 and a bf16 upstream gradient; with SiLU (host expf vs libdevice's)
// d_input within 64 units of d_x times SiLU's derivative scale; all repeat. T = 1, 3, 4, 5 and 8
// run the input pass compiled for row tiles 1, 3, 4, 8 and 8 (T = 5: three dead slots). N: the 2H
// projection (whole 256-output chunks) and 1004 (a short last chunk ending in a short group;
// weight-grad row ranges of 63 rows, so partial g stages).
TEST_F(Gpu, DetLinearBf16BackwardMatchesTheModel) {
  using namespace selftest;
  constexpr int64_t kMaxT = 8, K = 2688;
  for (int64_t N : {int64_t{2 * 5376}, int64_t{1004}}) {
    Generator gen{22};
    const std::vector<uint8_t> g32 = random_storage(gen, DType::F32, kMaxT * N, false);
    std::vector<uint8_t> g16(static_cast<size_t>(kMaxT * N) * 2);
    const float* g32f = reinterpret_cast<const float*>(g32.data());
    for (int64_t i = 0; i < kMaxT * N; ++i)
      reinterpret_cast<xj::bf16*>(g16.data())[i] = xj::round_to<xj::bf16>(g32f[i]);
    const std::vector<uint8_t> temb = random_storage(gen, DType::F32, kMaxT * K, false);
    const std::vector<uint8_t> w = random_storage(gen, DType::BF16, N * K, false);
    const int64_t ws_bytes = det_linear_backward_workspace(kMaxT, K, N);
    auto arena = DeviceArena::open(0);
    ASSERT_TRUE(static_cast<bool>(arena)) << llvm::toString(arena.takeError());
    DeviceBuffer* d_g32 = arena->upload(g32, g32.size());
    DeviceBuffer* d_g16 = arena->upload(g16, g16.size());
    DeviceBuffer* d_temb = arena->upload(temb, temb.size());
    DeviceBuffer* d_w = arena->upload(w, w.size());
    DeviceBuffer* d_in = arena->upload({}, temb.size());
    DeviceBuffer* d_dw = arena->upload({}, w.size());
    DeviceBuffer* d_db = arena->upload({}, static_cast<size_t>(N) * 2);
    DeviceBuffer* d_ws = arena->upload({}, static_cast<size_t>(ws_bytes));
    ASSERT_FALSE(static_cast<bool>(arena->take_error()));
    const DLDataType f32 = dl_dtype(DType::F32), b16 = dl_dtype(DType::BF16);
    int64_t w_shape[2] = {N, K}, b_shape[1] = {N}, ws_shape[1] = {ws_bytes};
    const DLTensor t_w = device_tensor(*d_w, 0, 0, 2, w_shape, nullptr, b16);
    const DLTensor t_dw = device_tensor(*d_dw, 0, 0, 2, w_shape, nullptr, b16);
    const DLTensor t_db = device_tensor(*d_db, 0, 0, 1, b_shape, nullptr, b16);
    const DLTensor t_ws = device_tensor(*d_ws, 0, 0, 1, ws_shape, nullptr, DLDataType{kDLUInt, 8, 1});
    for (int64_t T : {1, 3, 4, 5, 8}) {  // the leading T rows; 5: the 8-slot tile with 3 dead slots
      int64_t g_shape[2] = {T, N}, x_shape[2] = {T, K};
      const DLTensor t_g32 = device_tensor(*d_g32, 0, 0, 2, g_shape, nullptr, f32);
      const DLTensor t_g16 = device_tensor(*d_g16, 0, 0, 2, g_shape, nullptr, b16);
      const DLTensor t_temb = device_tensor(*d_temb, 0, 0, 2, x_shape, nullptr, f32);
      const DLTensor t_in = device_tensor(*d_in, 0, 0, 2, x_shape, nullptr, f32);
      for (bool bf16_grad : {false, true}) {
        // The model takes the gradient as fp32 values: a bf16 one widened exactly.
        std::vector<float> grad(static_cast<size_t>(T * N));
        for (int64_t i = 0; i < T * N; ++i)
          grad[i] = bf16_grad ? xj::to_float(reinterpret_cast<const xj::bf16*>(g16.data())[i]) : g32f[i];
        std::vector<float> d_x;  // d_input without SiLU: the sum the SiLU derivative then scales
        for (bool silu : {false, true}) {
          SCOPED_TRACE(
              fmt::format("N = {}, T = {}, {} grad, silu {}", N, T, bf16_grad ? "bf16" : "fp32", silu ? "on" : "off"));
          // Runs 0 and 1: every gradient at once (the input pass writes d_weight and d_bias too);
          // run 2: d_input alone, then d_weight and d_bias alone (the weight-grad kernel), into
          // outputs poisoned with 0xFF first.
          std::vector<float> d_input[3];
          std::vector<uint16_t> d_weight[3], d_bias[3];
          const DLTensor& g = bf16_grad ? t_g16 : t_g32;
          for (int run = 0; run < 3; ++run) {
            for (DeviceBuffer* out : {d_in, d_dw, d_db}) ASSERT_FALSE(static_cast<bool>(out->fill(0xFF)));
            if (run < 2) {
              const Status status = runtime().launch(
                  plan_det_linear_backward({g, nullptr, t_temb, t_w, &t_in, &t_dw, &t_db, &t_ws, silu}), nullptr);
              ASSERT_TRUE(status.ok()) << status.message();
            } else {
              const Status input = runtime().launch(
                  plan_det_linear_backward({g, nullptr, t_temb, t_w, &t_in, nullptr, nullptr, &t_ws, silu}), nullptr);
              ASSERT_TRUE(input.ok()) << input.message();
              const Status weight = runtime().launch(
                  plan_det_linear_backward({g, nullptr, t_temb, t_w, nullptr, &t_dw, &t_db, nullptr, silu}), nullptr);
              ASSERT_TRUE(weight.ok()) << weight.message();
            }
            ASSERT_TRUE(runtime().synchronize(0, nullptr).ok());
            d_input[run].resize(T * K);
            d_weight[run].resize(N * K);
            d_bias[run].resize(N);
            ASSERT_FALSE(static_cast<bool>(d_in->download(d_input[run].data(), static_cast<size_t>(T * K) * 4)));
            ASSERT_FALSE(static_cast<bool>(d_dw->download(d_weight[run].data(), w.size())));
            ASSERT_FALSE(static_cast<bool>(d_db->download(d_bias[run].data(), N * 2)));
          }
          EXPECT_EQ(d_input[0], d_input[1]) << "d_input repeats";
          EXPECT_EQ(d_weight[0], d_weight[1]) << "d_weight repeats";
          EXPECT_EQ(d_bias[0], d_bias[1]) << "d_bias repeats";
          EXPECT_EQ(d_input[0], d_input[2]) << "d_input alone";
          EXPECT_EQ(d_weight[0], d_weight[2]) << "d_weight alone (the weight-grad kernel)";
          EXPECT_EQ(d_bias[0], d_bias[2]) << "d_bias alone (the weight-grad kernel)";
          std::vector<float> model_in(T * K);
          std::vector<uint16_t> model_w(N * K), model_b(N);
          det_linear_bf16_backward_model(grad.data(), reinterpret_cast<const float*>(temb.data()),
                                         reinterpret_cast<const uint16_t*>(w.data()), T, K, N, silu, model_in.data(),
                                         model_w.data(), model_b.data());
          if (!silu) {
            EXPECT_EQ(d_input[0], model_in) << "d_input vs the host model";
            EXPECT_EQ(d_weight[0], model_w) << "d_weight vs the host model";
            EXPECT_EQ(d_bias[0], model_b) << "d_bias vs the host model";
            d_x = model_in;
            continue;
          }
          // |d_x| * sigmoid(v) * (1 + |v|) bounds the derivative's scale (1 + v(1 - s) can cancel).
          const float* v = reinterpret_cast<const float*>(temb.data());
          size_t outside = 0, first = 0;
          for (size_t i = 0; i < model_in.size(); ++i) {
            const double scale = std::fabs(static_cast<double>(d_x[i])) / (1 + std::exp(-static_cast<double>(v[i]))) *
                                 (1 + std::fabs(static_cast<double>(v[i])));
            if (!(std::fabs(static_cast<double>(d_input[0][i]) - model_in[i]) <= 64 * 0x1p-24 * scale + 1e-30) &&
                outside++ == 0)
              first = i;
          }
          EXPECT_EQ(outside, 0u) << "d_input: first at " << first << ": got " << d_input[0][first] << ", model "
                                 << model_in[first];
        }
      }
    }
  }
}

TEST_F(Gpu, SelftestPasses) {
  auto lines = run_selftest(runtime(), 0, {});
  ASSERT_TRUE(static_cast<bool>(lines)) << llvm::toString(lines.takeError());
  for (const SelftestLine& line : *lines) EXPECT_TRUE(line.passed) << line.name << ": " << line.detail;
}

TEST_F(Gpu, MissingDeviceIsAnError) {
  const Status status = runtime().synchronize(63, nullptr);
  EXPECT_EQ(status.code(), static_cast<int>(ErrorCode::InvalidArgument)) << status.message();
}

// The bf16 forward has two kernels with one order of operations: on this sm_90 GPU the weights
// stream by bulk copies through shared memory (persistent blocks, det_linear_bf16_bulk.cuh); a
// runtime that compiles PTX for compute_80 runs the register-streaming kernel
// (det_linear_bf16.cuh) on the same GPU. Every output and pre-activation must be the same bits,
// for T = 1..8 and 11 rows (two row tiles), with and without SiLU, for the two AdaLN projections and
// a K with a 16-wide last chunk.
TEST_F(Gpu, DetLinearBf16BulkAndRegisterKernelsGiveTheSameBits) {
  Runtime registers(register_kernel_options());
  for (int64_t N : {18 * 5376, 2 * 5376})
    check_bulk_matches_registers(registers, 2688, N, {1, 2, 3, 4, 5, 6, 7, 8, 11});
  check_bulk_matches_registers(registers, 4112, 2000, {1, 2, 3, 4, 5, 6, 7, 8, 11});
}

// Every det_linear forward geometry at sizes compute-sanitizer's racecheck finishes in (it tracks
// each shared-memory access, and the full-size tests stream 520 MB through shared memory per
// launch): the same checks as the two tests above, at under ten million weights each. fp32: one
// group per lane with a partial last block, and the pipeline with a leftover and a partial group
// and a warp past the end. bf16: the bulk kernel with whole chunks and with a 16-wide last one;
// the register kernel with 8-warp blocks (N >= 264 blocks of 128), 4-warp blocks, and x staged
// in 64-chunk tiles.
TEST_F(Gpu, DetLinearEveryGeometryAtSanitizerSize) {
  check_det_linear_forward(DType::F32, 256, 130);
  check_det_linear_forward(DType::F32, 5536, 66);
  check_det_linear_forward(DType::BF16, 2688, 272);
  check_det_linear_forward(DType::BF16, 4112, 144);
  Runtime registers(register_kernel_options());
  ASSERT_EQ(det_linear_geometry(DType::BF16, 256, 264 * 128, 80).warps, 8);
  ASSERT_EQ(det_linear_geometry(DType::BF16, 2688, 272, 80).warps, 4);
  ASSERT_EQ(det_linear_geometry(DType::BF16, 4112, 144, 80).tile_chunks, 64);
  check_bulk_matches_registers(registers, 256, 264 * 128, {1, 8, 11});
  check_bulk_matches_registers(registers, 2688, 272, {1, 8, 11});
  check_bulk_matches_registers(registers, 4112, 144, {1, 8, 11});
}

}  // namespace
}  // namespace exactjit
