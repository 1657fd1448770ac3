// exactjit self-test (see selftest.hpp).
#include "selftest/selftest.hpp"

#include "selftest/support.hpp"
#include "kernels/catalog.hpp"
#include "kernels/host_model.hpp"
#include "runtime/device_buffer.hpp"
#include "runtime/errors.hpp"
#include "templates/numerics.cuh"
#include "kernels/adaln_row_gather.hpp"
#include "kernels/gate_residual.hpp"
#include "kernels/rms_norm.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace exactjit {

using namespace selftest;

namespace {
std::string_view path_name(TilePath path) {
  return path == TilePath::OnePass ? " one-pass" : path == TilePath::Narrow ? " narrow-tiles" : "";
}
}  // namespace

DeviceTraits planned_traits(TilePath path, int sm) {
  switch (path) {
    case TilePath::OnePass:
      return {sm, 1};
    case TilePath::Narrow:
      return {sm, 1 << 20};
    case TilePath::Unknown:
      break;
  }
  return {};
}

std::string GateResidualCase::name() const {
  return fmt::format("gate_residual {} H={} stride={} R={} S={} B={} index={}{}{}{}", dtype_name(dtype), hidden,
                     table_stride, table_rows, seq, batch, index_type_name(index), misaligned ? " scalar" : "",
                     fp32_table_grad ? " d_gate=fp32" : "",
                     bad_position >= 0 ? fmt::format(" bad-index@{}", bad_position) : "");
}

llvm::Expected<CaseOutcome> run_gate_residual_case(Runtime& runtime, int device_id, const GateResidualCase& c) {
  auto arena = DeviceArena::open(device_id);
  if (!arena) return arena.takeError();

  const size_t elem = dtype_size(c.dtype);
  const int64_t rows = c.seq * c.batch;
  const int64_t count = rows * c.hidden;
  const int64_t shift = c.misaligned ? 1 : 0;  // elements
  const int64_t table_count = (c.table_rows - 1) * c.table_stride + c.hidden;

  Generator gen{c.seed};
  const std::vector<uint8_t> residual = random_storage(gen, c.dtype, count);
  const std::vector<uint8_t> y = random_storage(gen, c.dtype, count);
  const std::vector<uint8_t> table = random_storage(gen, c.dtype, table_count);
  const std::vector<int64_t> index_values = random_indices(gen, c.seq, c.table_rows, c.bad_position, c.table_rows + 3);
  const std::vector<uint8_t> index = index_bytes(c.index, index_values);

  const size_t act_bytes = static_cast<size_t>(count + shift) * elem;
  DeviceBuffer* d_residual = arena->upload(residual, act_bytes, shift * elem);
  DeviceBuffer* d_y = arena->upload(y, act_bytes, shift * elem);
  DeviceBuffer* d_out = arena->upload({}, act_bytes);
  DeviceBuffer* d_table = arena->upload(table, table.size());
  DeviceBuffer* d_index = arena->upload(index, index.size());
  if (auto err = arena->take_error()) return err;
  if (auto err = d_out->fill(0xFF)) return err;  // poison: unwritten elements show up

  int64_t act_shape[3] = {c.batch, c.seq, c.hidden};
  int64_t table_shape[2] = {c.table_rows, c.hidden};
  int64_t table_strides[2] = {c.table_stride, 1};
  int64_t index_shape[1] = {c.seq};
  const DLDataType dt = dl_dtype(c.dtype);
  const DLTensor t_residual = device_tensor(*d_residual, shift * elem, device_id, 3, act_shape, nullptr, dt);
  const DLTensor t_y = device_tensor(*d_y, shift * elem, device_id, 3, act_shape, nullptr, dt);
  const DLTensor t_out = device_tensor(*d_out, shift * elem, device_id, 3, act_shape, nullptr, dt);
  const DLTensor t_gate = device_tensor(*d_table, 0, device_id, 2, table_shape, table_strides, dt);
  const DLTensor t_index = device_tensor(*d_index, 0, device_id, 1, index_shape, nullptr, dl_index(c.index));

  CaseOutcome outcome;
  outcome.launch = runtime.launch(plan_gate_residual({t_residual, t_gate, t_index, t_y, t_out}), nullptr);
  outcome.sync = runtime.synchronize(device_id, nullptr);
  if (!outcome.launch.ok()) {
    outcome.detail = "launch failed: " + outcome.launch.message();
    return outcome;
  }

  std::vector<uint8_t> expected(act_bytes - shift * elem, 0xFF), actual(expected.size());
  gate_residual_model(c.dtype, residual.data(), table.data(), c.table_stride, c.table_rows, index.data(), c.index,
                      y.data(), expected.data(), rows, c.seq, c.hidden);
  if (auto err = d_out->download(actual.data(), actual.size(), shift * elem)) return err;
  judge(outcome, expected, actual, elem, c.bad_position >= 0 ? "gate_residual: index[" : "");
  return outcome;
}

std::string AdalnRowGatherCase::name() const {
  return fmt::format("adaln_row_gather {} H={} T={} stride={} S={} index={}{}{}{}", dtype_name(dtype), hidden,
                     timesteps, table_stride, seq, index_type_name(index), misaligned ? " scalar" : "",
                     bad_timestep >= 0 ? fmt::format(" bad-timestep@{}", bad_timestep) : "",
                     bad_tag >= 0 ? fmt::format(" bad-tag@{}", bad_tag) : "");
}

llvm::Expected<CaseOutcome> run_adaln_row_gather_case(Runtime& runtime, int device_id, const AdalnRowGatherCase& c) {
  auto arena = DeviceArena::open(device_id);
  if (!arena) return arena.takeError();
  const size_t elem = dtype_size(c.dtype);
  const int64_t shift = c.misaligned ? 1 : 0;
  const int64_t table_rows = 3 * c.timesteps;
  const int64_t table_count = (table_rows - 1) * c.table_stride + 6 * c.hidden;
  Generator gen{c.seed};
  const std::vector<uint8_t> rows = random_storage(gen, c.dtype, table_count);
  std::vector<int64_t> ti(static_cast<size_t>(c.seq)), tags(static_cast<size_t>(c.seq));
  for (int64_t s = 0; s < c.seq; ++s) {
    ti[s] = static_cast<int64_t>(gen.next() % static_cast<uint64_t>(c.timesteps));
    tags[s] = static_cast<int64_t>(gen.next() % 3);
  }
  if (c.bad_timestep >= 0) ti[c.bad_timestep] = c.timesteps;
  if (c.bad_tag >= 0) tags[c.bad_tag] = 3;
  const std::vector<uint8_t> ti_bytes = index_bytes(c.index, ti), tag_bytes = index_bytes(c.index, tags);
  const size_t out_count = static_cast<size_t>(6 * c.seq * c.hidden);

  DeviceBuffer* d_rows = arena->upload(rows, (table_count + shift) * elem, shift * elem);
  DeviceBuffer* d_ti = arena->upload(ti_bytes, ti_bytes.size());
  DeviceBuffer* d_tags = arena->upload(tag_bytes, tag_bytes.size());
  DeviceBuffer* d_out = arena->upload({}, (out_count + shift) * elem);
  if (auto err = arena->take_error()) return err;
  if (auto err = d_out->fill(0xFF)) return err;

  int64_t rows_shape[2] = {table_rows, 6 * c.hidden}, rows_strides[2] = {c.table_stride, 1};
  int64_t index_shape[1] = {c.seq}, out_shape[3] = {6, c.seq, c.hidden};
  const DLTensor t_rows =
      device_tensor(*d_rows, shift * elem, device_id, 2, rows_shape, rows_strides, dl_dtype(c.dtype));
  const DLTensor t_ti = device_tensor(*d_ti, 0, device_id, 1, index_shape, nullptr, dl_index(c.index));
  const DLTensor t_tags = device_tensor(*d_tags, 0, device_id, 1, index_shape, nullptr, dl_index(c.index));
  const DLTensor t_out = device_tensor(*d_out, shift * elem, device_id, 3, out_shape, nullptr, dl_dtype(c.dtype));

  CaseOutcome outcome;
  outcome.launch = runtime.launch(plan_adaln_row_gather({t_rows, t_ti, t_tags, t_out}), nullptr);
  outcome.sync = runtime.synchronize(device_id, nullptr);
  if (!outcome.launch.ok()) {
    outcome.detail = "launch failed: " + outcome.launch.message();
    return outcome;
  }
  std::vector<uint8_t> expected(out_count * elem, 0xFF), actual(out_count * elem);
  adaln_row_gather_model(elem, rows.data(), c.table_stride, c.timesteps, ti.data(), tags.data(), IndexType::I64,
                         expected.data(), c.seq, c.hidden);
  if (auto err = d_out->download(actual.data(), actual.size(), shift * elem)) return err;
  const char* bad_argument = c.bad_timestep >= 0 ? "timestep_indices[" : c.bad_tag >= 0 ? "token_tags[" : nullptr;
  judge(outcome, expected, actual, elem, bad_argument ? std::string("adaln_row_gather: ") + bad_argument : "");
  return outcome;
}

std::string RmsNormCase::name() const {
  return fmt::format("rms_norm {} H={} {} {} S={} B={}{}{}{}", dtype_name(dtype), hidden,
                     table_stride ? fmt::format("modulated stride={} R={} index={}", table_stride, table_rows,
                                                index_type_name(index))
                                  : std::string("plain"),
                     weighted ? "weight" : "no-weight", seq, batch, fp32_param_grads ? " param-grads=fp32" : "",
                     bad_position >= 0 ? fmt::format(" bad-index@{}", bad_position) : "", path_name(path));
}

llvm::Expected<CaseOutcome> run_rms_norm_case(Runtime& runtime, int device_id, const RmsNormCase& c) {
  auto arena = DeviceArena::open(device_id);
  if (!arena) return arena.takeError();
  const size_t elem = dtype_size(c.dtype);
  const int64_t rows = c.seq * c.batch, count = rows * c.hidden;
  const bool modulated = c.table_stride > 0;
  const int64_t table_count = modulated ? (c.table_rows - 1) * c.table_stride + 2 * c.hidden : 0;
  Generator gen{c.seed};
  std::vector<uint8_t> x = random_storage(gen, c.dtype, count, /*specials=*/false);
  if (rows >= 2) {  // a NaN in row 0 and an Inf in row 1
    store(x, 5, c.dtype, std::numeric_limits<float>::quiet_NaN());
    store(x, c.hidden + 7, c.dtype, std::numeric_limits<float>::infinity());
  }
  const std::vector<uint8_t> weight = random_storage(gen, c.dtype, c.hidden, /*specials=*/false);
  const std::vector<uint8_t> table = random_storage(gen, c.dtype, table_count, /*specials=*/false);
  const std::vector<int64_t> index_values = random_indices(gen, c.seq, c.table_rows, c.bad_position, c.table_rows);
  const std::vector<uint8_t> index = index_bytes(c.index, index_values);

  DeviceBuffer* d_x = arena->upload(x, x.size());
  DeviceBuffer* d_weight = arena->upload(weight, weight.size());
  DeviceBuffer* d_table = arena->upload(table, std::max<size_t>(table.size(), 16));
  DeviceBuffer* d_index = arena->upload(index, index.size());
  DeviceBuffer* d_out = arena->upload({}, x.size());
  DeviceBuffer* d_rstd = arena->upload({}, static_cast<size_t>(rows) * 4);
  if (auto err = arena->take_error()) return err;
  if (auto err = d_out->fill(0xFF)) return err;
  if (auto err = d_rstd->fill(0xFF)) return err;

  int64_t x_shape[3] = {c.batch, c.seq, c.hidden}, weight_shape[1] = {c.hidden}, rstd_shape[2] = {c.batch, c.seq};
  int64_t table_shape[2] = {c.table_rows, c.hidden}, table_strides[2] = {c.table_stride, 1}, index_shape[1] = {c.seq};
  const DLDataType dt = dl_dtype(c.dtype);
  const DLTensor t_x = device_tensor(*d_x, 0, device_id, 3, x_shape, nullptr, dt);
  const DLTensor t_out = device_tensor(*d_out, 0, device_id, 3, x_shape, nullptr, dt);
  const DLTensor t_weight = device_tensor(*d_weight, 0, device_id, 1, weight_shape, nullptr, dt);
  const DLTensor t_shift = device_tensor(*d_table, 0, device_id, 2, table_shape, table_strides, dt);
  const DLTensor t_scale = device_tensor(*d_table, c.hidden * elem, device_id, 2, table_shape, table_strides, dt);
  const DLTensor t_index = device_tensor(*d_index, 0, device_id, 1, index_shape, nullptr, dl_index(c.index));
  const DLTensor t_rstd = device_tensor(*d_rstd, 0, device_id, 2, rstd_shape, nullptr, DLDataType{kDLFloat, 32, 1});

  CaseOutcome outcome;
  outcome.launch = runtime.launch(
      plan_rms_norm({t_x, c.weighted ? &t_weight : nullptr, modulated ? &t_shift : nullptr,
                     modulated ? &t_scale : nullptr, modulated ? &t_index : nullptr, t_out, &t_rstd, 1e-5}),
      nullptr);
  outcome.sync = runtime.synchronize(device_id, nullptr);
  if (!outcome.launch.ok()) {
    outcome.detail = "launch failed: " + outcome.launch.message();
    return outcome;
  }
  std::vector<uint8_t> actual(x.size()), expected(x.size(), 0xFF);
  std::vector<float> rstd(static_cast<size_t>(rows));
  if (auto err = d_out->download(actual.data(), actual.size())) return err;
  if (auto err = d_rstd->download(rstd.data(), rstd.size() * 4)) return err;
  int64_t rstd_off = 0;
  const size_t row_bytes = static_cast<size_t>(c.hidden) * elem;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = index_values[r % c.seq];
    if (modulated && (i < 0 || i >= c.table_rows)) continue;  // reported, not written
    const float argument = rms_norm_rsqrt_argument_model(c.dtype, &x[r * row_bytes], c.hidden, 1e-5f);
    const float reference = static_cast<float>(1.0 / std::sqrt(static_cast<double>(argument)));
    const bool close = (argument != argument && rstd[r] != rstd[r]) ||
                       std::fabs(static_cast<double>(rstd[r]) - reference) <=
                           4.0 * std::fabs(static_cast<double>(std::nextafter(reference, INFINITY)) - reference);
    rstd_off += close ? 0 : 1;
    const uint8_t* table_row = modulated ? &table[static_cast<size_t>(i * c.table_stride) * elem] : nullptr;
    rms_norm_row_model(c.dtype, &x[r * row_bytes], c.weighted ? weight.data() : nullptr, table_row,
                       table_row ? table_row + row_bytes : nullptr, c.hidden, rstd[r], &expected[r * row_bytes]);
  }
  judge(outcome, expected, actual, elem, c.bad_position >= 0 ? "rms_norm: index[" : "");
  if (rstd_off) {
    outcome.passed = false;
    outcome.detail += fmt::format("{}{} rows have an rstd more than 4 ulp from the model's",
                                  outcome.detail.empty() ? "" : "; ", rstd_off);
  }
  return outcome;
}

llvm::Expected<std::vector<SelftestLine>> run_selftest(Runtime& runtime, int device_id,
                                                       const std::function<void(const SelftestLine&)>& progress) {
  std::vector<GateResidualCase> cases;
  uint64_t seed = 1;
  for (DType dtype : {DType::BF16, DType::F16, DType::F32}) {
    for (int64_t stride : {6 * kDefaultHidden, 2 * kDefaultHidden}) {
      for (IndexType index : {IndexType::I64, IndexType::I32}) {
        for (bool misaligned : {false, true}) {
          GateResidualCase c;
          c.dtype = dtype;
          c.table_stride = stride;
          c.table_rows = stride == 6 * kDefaultHidden ? 9 : 3;
          c.index = index;
          c.misaligned = misaligned;
          c.seq = misaligned ? 7 : 4097;
          c.batch = misaligned ? 2 : 1;
          c.seed = seed++;
          cases.push_back(c);
        }
      }
    }
  }
  GateResidualCase bad;
  bad.bad_position = 3;
  bad.seed = seed++;
  cases.push_back(bad);
  GateResidualCase after = bad;  // the context must still work after a reported bad index
  after.bad_position = -1;
  after.seed = seed++;
  cases.push_back(after);

  std::vector<AdalnRowGatherCase> gathers;
  for (DType dtype : {DType::BF16, DType::F16, DType::F32}) {
    for (IndexType index : {IndexType::I64, IndexType::I32}) {
      for (bool misaligned : {false, true}) {
        AdalnRowGatherCase c;
        c.dtype = dtype;
        c.index = index;
        c.misaligned = misaligned;
        c.seq = misaligned ? 7 : 4097;
        c.seed = seed++;
        gathers.push_back(c);
      }
    }
  }
  AdalnRowGatherCase bad_timestep;
  bad_timestep.bad_timestep = 2;
  gathers.push_back(bad_timestep);
  AdalnRowGatherCase bad_tag;
  bad_tag.bad_tag = 4;
  gathers.push_back(bad_tag);

  std::vector<RmsNormCase> norms;
  for (DType dtype : {DType::BF16, DType::F16, DType::F32}) {
    for (int64_t stride : {int64_t{0}, 6 * kDefaultHidden, 2 * kDefaultHidden}) {
      for (bool weighted : {true, false}) {
        RmsNormCase c;
        c.dtype = dtype;
        c.table_stride = stride;
        c.table_rows = stride == 2 * kDefaultHidden ? 3 : 9;
        c.weighted = weighted;
        c.index = weighted ? IndexType::I64 : IndexType::I32;
        c.seq = weighted ? 4097 : 7;
        c.batch = weighted ? 1 : 2;
        c.seed = seed++;
        norms.push_back(c);
      }
    }
    // Rows of at most 32 quads (one warp each): qk-norm's head dim, and a short modulated row.
    for (int64_t hidden : {int64_t{128}, int64_t{64}}) {
      RmsNormCase c;
      c.dtype = dtype;
      c.hidden = hidden;
      c.table_stride = hidden == 64 ? 6 * hidden : 0;
      c.weighted = hidden == 128;
      c.seq = 4097;
      c.batch = 2;
      c.seed = seed++;
      norms.push_back(c);
    }
  }
  RmsNormCase bad_norm;
  bad_norm.table_stride = 6 * kDefaultHidden;
  bad_norm.weighted = false;
  bad_norm.bad_position = 3;
  bad_norm.seed = seed++;
  norms.push_back(bad_norm);

  // Backward passes: a few shapes per op (the GPU tests sweep more).
  std::vector<GateResidualCase> gate_backward;
  std::vector<RmsNormCase> norm_backward;
  std::vector<AdalnRowGatherCase> gather_backward;
  for (DType dtype : {DType::BF16, DType::F16, DType::F32}) {
    GateResidualCase g;
    g.dtype = dtype;
    g.seq = 4097;
    g.batch = 1;
    g.seed = seed++;
    gate_backward.push_back(g);
    g.table_stride = 2 * kDefaultHidden;
    g.table_rows = 3;
    g.index = IndexType::I32;
    g.seq = 7;
    g.batch = 2;
    g.seed = seed++;
    gate_backward.push_back(g);
    if (dtype != DType::F32) {  // the table gradient rounded once to fp32
      g.fp32_table_grad = true;
      g.seed = seed++;
      gate_backward.push_back(g);
      g.fp32_table_grad = false;
    }
    for (int64_t stride : {int64_t{0}, 6 * kDefaultHidden, 2 * kDefaultHidden}) {
      RmsNormCase n;
      n.dtype = dtype;
      n.table_stride = stride;
      n.table_rows = stride == 2 * kDefaultHidden ? 3 : 9;
      n.weighted = stride != 6 * kDefaultHidden;
      n.seq = stride == 6 * kDefaultHidden ? 4097 : 7;
      n.batch = stride == 6 * kDefaultHidden ? 1 : 2;
      n.index = stride == 2 * kDefaultHidden ? IndexType::I32 : IndexType::I64;
      n.seed = seed++;
      norm_backward.push_back(n);
      if (dtype != DType::F32 && n.weighted) {  // the parameter gradients rounded once to fp32
        n.fp32_param_grads = true;
        n.seed = seed++;
        norm_backward.push_back(n);
      }
      if (dtype == DType::BF16 && stride != 0) {  // dx and the table sums in one pass: the same bits
        n.path = TilePath::OnePass;
        n.seed = seed++;
        norm_backward.push_back(n);
      }
      n.path = TilePath::Narrow;  // the parameter tiles one column a thread: the same sums
      n.fp32_param_grads = false;
      n.seed = seed++;
      norm_backward.push_back(n);
    }
    RmsNormCase head;  // qk-norm: H = 128, one warp per row
    head.dtype = dtype;
    head.hidden = 128;
    head.seq = 4097;
    head.batch = 2;
    head.seed = seed++;
    norm_backward.push_back(head);
    AdalnRowGatherCase a;
    a.dtype = dtype;
    a.seq = dtype == DType::F32 ? 7 : 4097;
    a.index = dtype == DType::F32 ? IndexType::I32 : IndexType::I64;
    a.seed = seed++;
    gather_backward.push_back(a);
  }
  GateResidualCase bad_gate_backward;
  bad_gate_backward.bad_position = 5;
  bad_gate_backward.seed = seed++;
  gate_backward.push_back(bad_gate_backward);
  RmsNormCase bad_norm_backward;
  bad_norm_backward.table_stride = 6 * kDefaultHidden;
  bad_norm_backward.bad_position = 2;
  bad_norm_backward.seed = seed++;
  norm_backward.push_back(bad_norm_backward);
  bad_norm_backward.path = TilePath::OnePass;
  bad_norm_backward.seed = seed++;
  norm_backward.push_back(bad_norm_backward);
  AdalnRowGatherCase bad_gather_backward;
  bad_gather_backward.bad_tag = 1;
  bad_gather_backward.seed = seed++;
  gather_backward.push_back(bad_gather_backward);

  std::vector<SelftestLine> lines;
  auto record = [&](const std::string& name, const CaseOutcome& outcome) {
    SelftestLine line{name, outcome.passed, outcome.detail};
    if (progress) progress(line);
    lines.push_back(std::move(line));
  };
  for (const GateResidualCase& c : cases) {
    auto outcome = run_gate_residual_case(runtime, device_id, c);
    if (!outcome) return outcome.takeError();
    record(c.name(), *outcome);
  }
  for (const AdalnRowGatherCase& c : gathers) {
    auto outcome = run_adaln_row_gather_case(runtime, device_id, c);
    if (!outcome) return outcome.takeError();
    record(c.name(), *outcome);
  }
  for (const RmsNormCase& c : norms) {
    auto outcome = run_rms_norm_case(runtime, device_id, c);
    if (!outcome) return outcome.takeError();
    record(c.name(), *outcome);
  }
  for (const GateResidualCase& c : gate_backward) {
    auto outcome = run_gate_residual_backward_case(runtime, device_id, c);
    if (!outcome) return outcome.takeError();
    record("backward " + c.name(), *outcome);
  }
  for (const RmsNormCase& c : norm_backward) {
    auto outcome = run_rms_norm_backward_case(runtime, device_id, c);
    if (!outcome) return outcome.takeError();
    record("backward " + c.name(), *outcome);
  }
  for (const AdalnRowGatherCase& c : gather_backward) {
    auto outcome = run_adaln_row_gather_backward_case(runtime, device_id, c);
    if (!outcome) return outcome.takeError();
    record("backward " + c.name(), *outcome);
  }
  return lines;
}

}  // namespace exactjit
