// exactjit self-test, backward passes: each gradient against its host model (kernels/
// backward_model.hpp) bit for bit, which pins the segment plan's order, the tile partials and the
// fold; every op runs twice and both runs must give the same bits.
#include "selftest/selftest.hpp"
#include "kernels/adaln_row_gather_backward.hpp"
#include "kernels/backward_model.hpp"
#include "kernels/gate_residual_backward.hpp"
#include "kernels/rms_norm.hpp"
#include "kernels/rms_norm_backward.hpp"
#include "runtime/errors.hpp"
#include "selftest/support.hpp"

#include <fmt/format.h>

#include <cstring>

namespace exactjit {

using namespace selftest;

namespace {

// One output of a backward case: its device buffer, the model's bytes and its element size.
struct Output {
  std::string name;
  DeviceBuffer* buffer;
  std::vector<uint8_t> expected;
  size_t elem;
};

constexpr uint8_t kPoison = 0xFF;
constexpr double kEps = 1e-5;  // rms_norm's

// Runs `call` twice; each output must equal the model and both runs must agree, bit for bit.
llvm::Expected<CaseOutcome> judge_backward(Runtime& runtime, int device_id, const std::function<Status()>& call,
                                           std::vector<Output>& outputs, const std::string& expected_error) {
  CaseOutcome outcome;
  std::vector<std::vector<uint8_t>> first;
  for (int run = 0; run < 2; ++run) {
    for (Output& o : outputs)
      if (auto err = o.buffer->fill(kPoison)) return err;
    outcome.launch = call();
    outcome.sync = runtime.synchronize(device_id, nullptr);
    if (!outcome.launch.ok()) {
      outcome.detail = "launch failed: " + outcome.launch.message();
      return outcome;
    }
    std::vector<std::vector<uint8_t>> got;
    for (Output& o : outputs) {
      got.emplace_back(o.expected.size());
      if (auto err = o.buffer->download(got.back().data(), got.back().size())) return err;
    }
    if (run == 0) {
      first = std::move(got);
      continue;
    }
    outcome.passed = true;
    for (size_t k = 0; k < outputs.size(); ++k) {
      CaseOutcome part;
      part.sync = outcome.sync;
      judge(part, outputs[k].expected, got[k], outputs[k].elem, expected_error);
      const bool repeatable = got[k] == first[k];
      outcome.passed = outcome.passed && part.passed && repeatable;
      if (!part.passed || !repeatable)
        outcome.detail += fmt::format("{}{}: {}{}", outcome.detail.empty() ? "" : "; ", outputs[k].name, part.detail,
                                      repeatable ? "" : " (run 2 differs from run 1)");
      else if (k == 0 && !expected_error.empty())
        outcome.detail = part.detail;
    }
  }
  return outcome;
}

DLTensor workspace_tensor(const DeviceBuffer& buffer, int device_id, int64_t* shape) {
  return device_tensor(buffer, 0, device_id, 1, shape, nullptr, DLDataType{kDLUInt, 8, 1});
}

}  // namespace

llvm::Expected<CaseOutcome> run_gate_residual_backward_case(Runtime& runtime, int device_id,
                                                            const GateResidualCase& c) {
  auto arena = DeviceArena::open(device_id);
  if (!arena) return arena.takeError();
  const size_t elem = dtype_size(c.dtype);
  const int64_t rows = c.seq * c.batch, count = rows * c.hidden;
  const int64_t table_count = (c.table_rows - 1) * c.table_stride + c.hidden;
  Generator gen{c.seed};
  const std::vector<uint8_t> grad = random_storage(gen, c.dtype, count, /*specials=*/false);
  const std::vector<uint8_t> y = random_storage(gen, c.dtype, count, /*specials=*/false);
  const std::vector<uint8_t> table = random_storage(gen, c.dtype, table_count, /*specials=*/false);
  const std::vector<int64_t> index_values = random_indices(gen, c.seq, c.table_rows, c.bad_position, c.table_rows + 3);
  const std::vector<uint8_t> index = index_bytes(c.index, index_values);
  const int64_t ws_bytes = gate_residual_backward_workspace(rows, c.seq, c.table_rows, c.hidden);

  DeviceBuffer* d_grad = arena->upload(grad, grad.size());
  DeviceBuffer* d_y = arena->upload(y, y.size());
  DeviceBuffer* d_table = arena->upload(table, table.size());
  DeviceBuffer* d_index = arena->upload(index, index.size());
  DeviceBuffer* d_dy = arena->upload({}, grad.size());
  const DType d_gate_dtype = c.fp32_table_grad ? DType::F32 : c.dtype;
  const size_t d_gate_elem = dtype_size(d_gate_dtype);
  DeviceBuffer* d_dgate = arena->upload({}, static_cast<size_t>(c.table_rows * c.hidden) * d_gate_elem);
  DeviceBuffer* d_ws = arena->upload({}, static_cast<size_t>(ws_bytes));
  if (auto err = arena->take_error()) return err;

  int64_t act_shape[3] = {c.batch, c.seq, c.hidden}, table_shape[2] = {c.table_rows, c.hidden};
  int64_t table_strides[2] = {c.table_stride, 1}, index_shape[1] = {c.seq}, ws_shape[1] = {ws_bytes};
  const DLDataType dt = dl_dtype(c.dtype);
  const DLTensor t_grad = device_tensor(*d_grad, 0, device_id, 3, act_shape, nullptr, dt);
  const DLTensor t_y = device_tensor(*d_y, 0, device_id, 3, act_shape, nullptr, dt);
  const DLTensor t_gate = device_tensor(*d_table, 0, device_id, 2, table_shape, table_strides, dt);
  const DLTensor t_index = device_tensor(*d_index, 0, device_id, 1, index_shape, nullptr, dl_index(c.index));
  const DLTensor t_dy = device_tensor(*d_dy, 0, device_id, 3, act_shape, nullptr, dt);
  const DLTensor t_dgate = device_tensor(*d_dgate, 0, device_id, 2, table_shape, nullptr, dl_dtype(d_gate_dtype));
  const DLTensor t_ws = workspace_tensor(*d_ws, device_id, ws_shape);

  std::vector<Output> outputs = {{"d_y", &*d_dy, std::vector<uint8_t>(grad.size(), kPoison), elem},
                                 {"d_gate", &*d_dgate,
                                  std::vector<uint8_t>(static_cast<size_t>(c.table_rows * c.hidden) * d_gate_elem),
                                  d_gate_elem}};
  const std::vector<int64_t> keys = keys_of(index.data(), c.index, c.seq, c.table_rows);
  gate_residual_backward_model(c.dtype, grad.data(), table.data(), c.table_stride, keys, c.table_rows, y.data(), rows,
                               c.hidden, outputs[0].expected.data(), outputs[1].expected.data(), d_gate_dtype);
  return judge_backward(
      runtime, device_id,
      [&] {
        return runtime.launch(plan_gate_residual_backward({t_grad, t_gate, t_index, t_y, &t_dy, &t_dgate, &t_ws}),
                              nullptr);
      },
      outputs, c.bad_position >= 0 ? "gate_residual_backward: index[" : "");
}

llvm::Expected<CaseOutcome> run_rms_norm_backward_case(Runtime& runtime, int device_id, const RmsNormCase& c) {
  auto arena = DeviceArena::open(device_id);
  if (!arena) return arena.takeError();
  const size_t elem = dtype_size(c.dtype);
  const int64_t rows = c.seq * c.batch, count = rows * c.hidden;
  const bool modulated = c.table_stride > 0;
  const int64_t table_count = modulated ? (c.table_rows - 1) * c.table_stride + 2 * c.hidden : 2 * c.hidden;
  Generator gen{c.seed};
  const std::vector<uint8_t> x = random_storage(gen, c.dtype, count, /*specials=*/false);
  const std::vector<uint8_t> grad = random_storage(gen, c.dtype, count, /*specials=*/false);
  const std::vector<uint8_t> weight = random_storage(gen, c.dtype, c.hidden, /*specials=*/false);
  const std::vector<uint8_t> table = random_storage(gen, c.dtype, table_count, /*specials=*/false);
  const std::vector<int64_t> index_values = random_indices(gen, c.seq, c.table_rows, c.bad_position, c.table_rows);
  const std::vector<uint8_t> index = index_bytes(c.index, index_values);
  const int64_t table_rows = modulated ? c.table_rows : 0;
  const int64_t ws_bytes = rms_norm_backward_workspace(rows, c.seq, table_rows, c.hidden, c.weighted);

  DeviceBuffer* d_x = arena->upload(x, x.size());
  DeviceBuffer* d_grad = arena->upload(grad, grad.size());
  DeviceBuffer* d_weight = arena->upload(weight, weight.size());
  DeviceBuffer* d_table = arena->upload(table, table.size());
  DeviceBuffer* d_index = arena->upload(index, index.size());
  DeviceBuffer* d_out = arena->upload({}, x.size());
  DeviceBuffer* d_rstd = arena->upload({}, static_cast<size_t>(rows) * 4);
  DeviceBuffer* d_dx = arena->upload({}, x.size());
  // The parameter gradients in x's dtype, or float32 (fp32_param_grads).
  const DType param_grad_dtype = c.fp32_param_grads ? DType::F32 : c.dtype;
  const size_t param_elem = dtype_size(param_grad_dtype);
  DeviceBuffer* d_dweight = arena->upload({}, static_cast<size_t>(c.hidden) * param_elem);
  const size_t table_grad_bytes = static_cast<size_t>(c.table_rows * c.hidden) * param_elem;
  DeviceBuffer* d_dshift = arena->upload({}, table_grad_bytes);
  DeviceBuffer* d_dscale = arena->upload({}, table_grad_bytes);
  DeviceBuffer* d_ws = arena->upload({}, static_cast<size_t>(std::max<int64_t>(ws_bytes, 256)));
  if (auto err = arena->take_error()) return err;

  int64_t x_shape[3] = {c.batch, c.seq, c.hidden}, weight_shape[1] = {c.hidden}, rstd_shape[1] = {rows};
  int64_t table_shape[2] = {c.table_rows, c.hidden}, table_strides[2] = {c.table_stride, 1}, index_shape[1] = {c.seq};
  int64_t ws_shape[1] = {std::max<int64_t>(ws_bytes, 256)};
  const DLDataType dt = dl_dtype(c.dtype);
  const DLTensor t_x = device_tensor(*d_x, 0, device_id, 3, x_shape, nullptr, dt);
  const DLTensor t_grad = device_tensor(*d_grad, 0, device_id, 3, x_shape, nullptr, dt);
  const DLTensor t_out = device_tensor(*d_out, 0, device_id, 3, x_shape, nullptr, dt);
  const DLTensor t_weight = device_tensor(*d_weight, 0, device_id, 1, weight_shape, nullptr, dt);
  const DLTensor t_shift = device_tensor(*d_table, 0, device_id, 2, table_shape, table_strides, dt);
  const DLTensor t_scale = device_tensor(*d_table, c.hidden * elem, device_id, 2, table_shape, table_strides, dt);
  const DLTensor t_index = device_tensor(*d_index, 0, device_id, 1, index_shape, nullptr, dl_index(c.index));
  const DLTensor t_rstd = device_tensor(*d_rstd, 0, device_id, 1, rstd_shape, nullptr, DLDataType{kDLFloat, 32, 1});
  const DLTensor t_dx = device_tensor(*d_dx, 0, device_id, 3, x_shape, nullptr, dt);
  const DLDataType param_dt = dl_dtype(param_grad_dtype);
  const DLTensor t_dweight = device_tensor(*d_dweight, 0, device_id, 1, weight_shape, nullptr, param_dt);
  const DLTensor t_dshift = device_tensor(*d_dshift, 0, device_id, 2, table_shape, nullptr, param_dt);
  const DLTensor t_dscale = device_tensor(*d_dscale, 0, device_id, 2, table_shape, nullptr, param_dt);
  const DLTensor t_ws = workspace_tensor(*d_ws, device_id, ws_shape);

  // The forward gives the rstd the backward uses; the models take it from the device too.
  const Status forward = runtime.launch(
      plan_rms_norm({t_x, c.weighted ? &t_weight : nullptr, modulated ? &t_shift : nullptr,
                     modulated ? &t_scale : nullptr, modulated ? &t_index : nullptr, t_out, &t_rstd, kEps}),
      nullptr);
  const Status forward_sync = runtime.synchronize(device_id, nullptr);
  if (!forward.ok() || (c.bad_position < 0 && !forward_sync.ok())) {
    CaseOutcome outcome;
    outcome.launch = forward.ok() ? forward_sync : forward;
    outcome.detail = "forward failed: " + outcome.launch.message();
    return outcome;
  }
  std::vector<float> rstd(static_cast<size_t>(rows));
  if (auto err = d_rstd->download(rstd.data(), rstd.size() * 4)) return err;

  const std::vector<int64_t> keys = keys_of(index.data(), c.index, c.seq, c.table_rows);
  const size_t row_bytes = static_cast<size_t>(c.hidden) * elem;
  std::vector<Output> outputs = {{"dx", &*d_dx, std::vector<uint8_t>(x.size(), kPoison), elem}};
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t k = modulated ? keys[r % c.seq] : 0;
    if (k < 0) continue;
    const uint8_t* scale_row = modulated ? &table[static_cast<size_t>(k * c.table_stride) * elem + row_bytes] : nullptr;
    rms_norm_dx_row_model(c.dtype, &grad[r * row_bytes], &x[r * row_bytes], c.weighted ? weight.data() : nullptr,
                          scale_row, c.hidden, rstd[r], kEps, &outputs[0].expected[r * row_bytes]);
  }
  if (c.weighted) {
    outputs.push_back(
        {"dweight", &*d_dweight, std::vector<uint8_t>(static_cast<size_t>(c.hidden) * param_elem), param_elem});
    rms_norm_weight_grad_model(c.dtype, grad.data(), x.data(), modulated ? table.data() + row_bytes : nullptr,
                               c.table_stride, keys, c.table_rows, rstd.data(), rows, c.hidden,
                               outputs.back().expected.data(), param_grad_dtype);
  }
  if (modulated) {
    outputs.push_back({"dshift", &*d_dshift, std::vector<uint8_t>(table_grad_bytes), param_elem});
    outputs.push_back({"dscale", &*d_dscale, std::vector<uint8_t>(table_grad_bytes), param_elem});
    rms_norm_table_grads_model(c.dtype, grad.data(), x.data(), c.weighted ? weight.data() : nullptr, rstd.data(), keys,
                               c.table_rows, rows, c.hidden, outputs[outputs.size() - 2].expected.data(),
                               outputs.back().expected.data(), param_grad_dtype);
  }
  return judge_backward(
      runtime, device_id,
      [&] {
        return runtime.launch(
            plan_rms_norm_backward({t_grad, t_x, c.weighted ? &t_weight : nullptr, modulated ? &t_scale : nullptr,
                                    modulated ? &t_index : nullptr, t_rstd, kEps, &t_dx,
                                    c.weighted ? &t_dweight : nullptr, modulated ? &t_dshift : nullptr,
                                    modulated ? &t_dscale : nullptr, &t_ws},
                                   planned_traits(c.path, runtime.traits(t_x.device).sm)),
            nullptr);
      },
      outputs, c.bad_position >= 0 ? "rms_norm_backward: index[" : "");
}

llvm::Expected<CaseOutcome> run_adaln_row_gather_backward_case(Runtime& runtime, int device_id,
                                                               const AdalnRowGatherCase& c) {
  auto arena = DeviceArena::open(device_id);
  if (!arena) return arena.takeError();
  const size_t elem = dtype_size(c.dtype);
  const int64_t table_rows = 3 * c.timesteps;
  Generator gen{c.seed};
  const std::vector<uint8_t> grad = random_storage(gen, c.dtype, 6 * c.seq * c.hidden, /*specials=*/false);
  std::vector<int64_t> ti(static_cast<size_t>(c.seq)), tags(static_cast<size_t>(c.seq)),
                       keys(static_cast<size_t>(c.seq));
  for (int64_t s = 0; s < c.seq; ++s) {
    ti[s] = s == c.bad_timestep ? c.timesteps : static_cast<int64_t>(gen.next() % static_cast<uint64_t>(c.timesteps));
    tags[s] = s == c.bad_tag ? 3 : static_cast<int64_t>(gen.next() % 3);
    keys[s] = s == c.bad_timestep || s == c.bad_tag ? -1 : ti[s] * 3 + tags[s];
  }
  const std::vector<uint8_t> ti_bytes = index_bytes(c.index, ti), tag_bytes = index_bytes(c.index, tags);
  const int64_t ws_bytes = adaln_row_gather_backward_workspace(c.seq, table_rows, c.hidden);
  DeviceBuffer* d_grad = arena->upload(grad, grad.size());
  DeviceBuffer* d_ti = arena->upload(ti_bytes, ti_bytes.size());
  DeviceBuffer* d_tags = arena->upload(tag_bytes, tag_bytes.size());
  const int64_t out_count = table_rows * 6 * c.hidden;
  DeviceBuffer* d_rows = arena->upload({}, static_cast<size_t>(out_count) * elem);
  DeviceBuffer* d_rows32 = arena->upload({}, static_cast<size_t>(out_count) * 4);
  DeviceBuffer* d_ws = arena->upload({}, static_cast<size_t>(ws_bytes));
  if (auto err = arena->take_error()) return err;

  int64_t grad_shape[3] = {6, c.seq, c.hidden}, index_shape[1] = {c.seq}, rows_shape[2] = {table_rows, 6 * c.hidden};
  int64_t ws_shape[1] = {ws_bytes};
  const DLTensor t_grad = device_tensor(*d_grad, 0, device_id, 3, grad_shape, nullptr, dl_dtype(c.dtype));
  const DLTensor t_ti = device_tensor(*d_ti, 0, device_id, 1, index_shape, nullptr, dl_index(c.index));
  const DLTensor t_tags = device_tensor(*d_tags, 0, device_id, 1, index_shape, nullptr, dl_index(c.index));
  const DLTensor t_rows = device_tensor(*d_rows, 0, device_id, 2, rows_shape, nullptr, dl_dtype(c.dtype));
  const DLTensor t_rows32 = device_tensor(*d_rows32, 0, device_id, 2, rows_shape, nullptr, dl_dtype(DType::F32));
  const DLTensor t_ws = workspace_tensor(*d_ws, device_id, ws_shape);

  std::vector<Output> outputs = {
      {"d_rows", &*d_rows, std::vector<uint8_t>(static_cast<size_t>(out_count) * elem), elem},
      {"d_rows fp32", &*d_rows32, std::vector<uint8_t>(static_cast<size_t>(out_count) * 4), 4}};
  adaln_row_gather_backward_model(c.dtype, c.dtype, grad.data(), keys, table_rows, c.hidden,
                                  outputs[0].expected.data());
  adaln_row_gather_backward_model(c.dtype, DType::F32, grad.data(), keys, table_rows, c.hidden,
                                  outputs[1].expected.data());
  const std::string error = c.bad_timestep >= 0 ? "adaln_row_gather_backward: timestep_indices["
                            : c.bad_tag >= 0    ? "adaln_row_gather_backward: token_tags["
                                                : "";
  return judge_backward(
      runtime, device_id,
      [&]() -> Status {
        const Status first =
            runtime.launch(plan_adaln_row_gather_backward({t_grad, t_ti, t_tags, t_rows, &t_ws}), nullptr);
        if (!first.ok()) return first;
        // The first launch's bad-index report would fail the second call on the stream at its
        // entry: take it here (it is the one expected); judge checks the second launch's.
        const Status between = runtime.synchronize(device_id, nullptr);
        if (!between.ok() && error.empty()) return between;
        return runtime.launch(plan_adaln_row_gather_backward({t_grad, t_ti, t_tags, t_rows32, &t_ws}), nullptr);
      },
      outputs, error);
}

}  // namespace exactjit
