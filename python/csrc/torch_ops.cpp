// The CUDA kernels of the torch.ops.exactjit operators, in C++ on torch's stable ABI.
//
// python/exactjit/_ops.py defines the operators (schemas, fake kernels, autograd) and registers a
// Python implementation over ctypes for every device. This library, when it is built and loaded,
// registers a CUDA implementation of each operator that does the same work below Python: it
// describes the tensors as DLTensors (no copies), allocates the outputs and the backward's
// workspace from torch's caching allocator, and calls the C ABI on torch's current stream. The
// outputs, placeholders and argument rules are the Python implementation's, one for one, so either
// path gives the same tensors and errors (the GPU tests run both).
//
// Only the stable C shim (aoti_torch_*, torch_library_impl) and torch's header-only types are
// used, built for the 2.10 stable ABI (TORCH_TARGET_VERSION), so one binary serves torch 2.10 and
// later. A failure throws std::runtime_error("exactjit status <code>: <message>"), which
// python/exactjit/_extension.py turns back into the exactjit.Error subclass of <code>.
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>

#include "exactjit/exactjit.h"

namespace {

using torch::headeronly::ScalarType;
using torch::stable::Tensor;
using OptionalTensor = std::optional<Tensor>;

[[noreturn]] void fail(int status, const std::string& message) {
  throw std::runtime_error("exactjit status " + std::to_string(status) + ": " + message);
}

[[noreturn]] void invalid(const std::string& message) { fail(XJ_ERROR_INVALID_ARGUMENT, message); }

// A shape as Python prints a tuple ("(6, 4)", "(4,)", "()"), so messages match the ctypes path's.
std::string shape(const Tensor& t) {
  std::string text = "(";
  for (int64_t k = 0; k < t.dim(); ++k) text += (k ? ", " : "") + std::to_string(t.size(k));
  return text + (t.dim() == 1 ? ",)" : ")");
}

void check(exactjit_status_t status, const char* call) {
  if (status == XJ_OK) return;
  std::string message = xj_last_error();
  if (message.empty())
    message = std::string(call) + " failed with status " + std::to_string(status) + " and no message";
  fail(status, message);
}

// exactjit.runtime()'s xj_runtime, set by python/exactjit/_extension.py when it loads this library:
// one set of caches and one device-error record per process, whichever path launched a kernel.
std::atomic<xj_runtime*> shared_runtime{nullptr};

xj_runtime* runtime() {
  xj_runtime* rt = shared_runtime.load(std::memory_order_acquire);
  if (!rt)
    fail(XJ_ERROR_INTERNAL,
         "libexactjit_torch.so has no runtime: load it through exactjit (import exactjit.ops), "
         "not with torch.ops.load_library alone");
  return rt;
}

std::optional<DLDataType> dl_type(ScalarType type) {
  auto code = [](uint8_t c, uint8_t bits) { return DLDataType{c, bits, 1}; };
  switch (type) {
    case ScalarType::BFloat16:
      return code(kDLBfloat, 16);
    case ScalarType::Half:
      return code(kDLFloat, 16);
    case ScalarType::Float:
      return code(kDLFloat, 32);
    case ScalarType::Double:
      return code(kDLFloat, 64);
    case ScalarType::Char:
      return code(kDLInt, 8);
    case ScalarType::Short:
      return code(kDLInt, 16);
    case ScalarType::Int:
      return code(kDLInt, 32);
    case ScalarType::Long:
      return code(kDLInt, 64);
    case ScalarType::Byte:
      return code(kDLUInt, 8);
    case ScalarType::UInt16:
      return code(kDLUInt, 16);
    case ScalarType::UInt32:
      return code(kDLUInt, 32);
    case ScalarType::UInt64:
      return code(kDLUInt, 64);
    case ScalarType::ComplexFloat:
      return code(kDLComplex, 64);
    case ScalarType::ComplexDouble:
      return code(kDLComplex, 128);
    default:
      return std::nullopt;
  }
}

// One tensor argument of a C ABI call; `tensor` is null for an optional argument not given.
struct Arg {
  Arg(const char* name_, const Tensor& t) : name(name_), tensor(&t) {}
  Arg(const char* name_, const OptionalTensor& t) : name(name_), tensor(t ? &*t : nullptr) {}
  const char* name;
  const Tensor* tensor;
};

// The DLTensors of one call's tensor arguments, described in the order given (so the first bad
// argument is the one named, as on the ctypes path). They point at the tensors' own size and
// stride arrays, so the tensors must outlive the call (they do: they are the kernel's locals).
class Described {
 public:
  Described(const char* op, std::initializer_list<Arg> args) {
    if (args.size() > tensors_.size()) fail(XJ_ERROR_INTERNAL, std::string(op) + ": too many tensors for one call");
    size_t k = 0;
    for (const Arg& a : args) {
      present_[k] = a.tensor != nullptr;
      if (a.tensor) describe(op, a.name, *a.tensor, tensors_[k]);
      ++k;
    }
  }

  const DLTensor* operator[](size_t k) const { return present_[k] ? &tensors_[k] : nullptr; }

 private:
  static void describe(const char* op, const char* name, const Tensor& t, DLTensor& d) {
    std::optional<DLDataType> type = dl_type(t.scalar_type());
    if (!type)
      invalid(std::string(op) + ": " + name + ": dtype " + torch::headeronly::toString(t.scalar_type()) +
              " has no DLPack 0.6 type code");
    DLDevice device{kDLCPU, 0};
    if (t.is_cuda()) {
      device = DLDevice{kDLCUDA, t.get_device_index()};
    } else if (!t.is_cpu()) {
      invalid(std::string(op) + ": " + name +
              ": a tensor on a device other than CUDA or CPU cannot be passed; "
              "exactjit takes CUDA tensors");
    }
    d.data = t.data_ptr();
    d.device = device;
    d.ndim = static_cast<int32_t>(t.dim());
    d.dtype = *type;
    d.shape = const_cast<int64_t*>(t.sizes().data());
    d.strides = const_cast<int64_t*>(t.strides().data());
    d.byte_offset = 0;  // data_ptr() includes the storage offset
  }

  std::array<DLTensor, 16> tensors_{};
  std::array<bool, 16> present_{};
};

void* current_stream(const Tensor& t) {
  if (!t.is_cuda()) return nullptr;
  void* stream = nullptr;
  TORCH_ERROR_CODE_CHECK(aoti_torch_get_current_cuda_stream(t.get_device_index(), &stream));
  return stream;
}

// A new tensor of `sizes`, contiguous, in `type`, on t's device.
Tensor empty_on(const Tensor& t, torch::headeronly::IntHeaderOnlyArrayRef sizes, ScalarType type) {
  std::array<int64_t, 16> strides{};
  if (sizes.size() > strides.size()) invalid("a tensor of more than 16 dimensions cannot be allocated");
  int64_t stride = 1;
  for (size_t k = sizes.size(); k-- > 0;) {
    strides[k] = stride;
    stride *= sizes[k] > 1 ? sizes[k] : 1;
  }
  int32_t device_type = 0;
  TORCH_ERROR_CODE_CHECK(aoti_torch_get_device_type(t.get(), &device_type));
  AtenTensorHandle handle = nullptr;
  TORCH_ERROR_CODE_CHECK(aoti_torch_empty_strided(static_cast<int64_t>(sizes.size()), sizes.data(), strides.data(),
                                                  static_cast<int32_t>(type), device_type, t.get_device_index(),
                                                  &handle));
  return Tensor(handle);
}

Tensor empty_like_contiguous(const Tensor& t) { return empty_on(t, t.sizes(), t.scalar_type()); }

// The fp32 rstd of every row of x: x's sizes but the last.
Tensor rstd_like(const Tensor& x) {
  auto sizes = x.sizes();
  return empty_on(x, torch::headeronly::IntHeaderOnlyArrayRef(sizes.data(), sizes.empty() ? 0 : sizes.size() - 1),
                  ScalarType::Float);
}

// The (0,) placeholder for an output that was not asked for (the schema fixes the outputs).
Tensor placeholder(const Tensor& like, ScalarType type) {
  std::array<int64_t, 1> zero{0};
  return empty_on(like, zero, type);
}

Tensor made_contiguous(const Tensor& t) { return t.is_contiguous() ? t : torch::stable::contiguous(t); }

Tensor as_float_contiguous(const Tensor& t) {
  return made_contiguous(t.scalar_type() == ScalarType::Float ? t : torch::stable::to(t, ScalarType::Float));
}

// A uint8 workspace of the bytes `query` returned (at least one, so the library never sees NULL);
// -1 (invalid shapes) names the op, the query and the counts, as the ctypes path does.
Tensor workspace(const Tensor& like, const char* op, const char* query, long long bytes, const std::string& counts) {
  if (bytes < 0)
    invalid(std::string(op) + ": " + (query + 3) + ": invalid shapes (" + counts + "); " + query + " returned " +
            std::to_string(bytes));
  std::array<int64_t, 1> size{bytes > 0 ? static_cast<int64_t>(bytes) : 1};
  return empty_on(like, size, ScalarType::Byte);
}

std::string counts(std::initializer_list<std::pair<const char*, long long>> values) {
  std::string text;
  for (const auto& [name, value] : values) {
    if (!text.empty()) text += ", ";
    text += std::string(name) + "=" + std::to_string(value);
  }
  return text;
}

// --- gate_residual ---------------------------------------------------------------------------------

void gate_residual_into(const Tensor& residual, const Tensor& gate, const Tensor& index, const Tensor& y,
                        const Tensor& out) {
  Described d("gate_residual", {{"residual", residual}, {"gate", gate}, {"index", index}, {"y", y}, {"out", out}});
  check(xj_gate_residual(runtime(), d[0], d[1], d[2], d[3], d[4], current_stream(residual)), "xj_gate_residual");
}

Tensor gate_residual(Tensor residual, Tensor gate, Tensor index, Tensor y) {
  Tensor out = empty_like_contiguous(residual);
  gate_residual_into(residual, gate, index, y, out);
  return out;
}

void gate_residual_out(Tensor residual, Tensor gate, Tensor index, Tensor y, Tensor out) {
  gate_residual_into(residual, gate, index, y, out);
}

std::tuple<Tensor, Tensor> gate_residual_backward(Tensor grad, Tensor gate, Tensor index, Tensor y, bool need_d_y,
                                                  bool need_d_gate) {
  const char* op = "gate_residual_backward";
  if (!(need_d_y || need_d_gate)) return {placeholder(y, y.scalar_type()), placeholder(gate, gate.scalar_type())};
  grad = made_contiguous(grad);
  std::optional<Tensor> d_y, d_gate;
  if (need_d_y) d_y = empty_like_contiguous(y);
  if (need_d_gate) d_gate = empty_on(gate, gate.sizes(), gate.scalar_type());
  long long hidden = y.dim() >= 1 ? y.size(y.dim() - 1) : 0;
  long long rows = hidden ? y.numel() / hidden : 0;
  long long seq = index.dim() == 1 ? index.size(0) : 0;
  long long table_rows = gate.dim() == 2 ? gate.size(0) : 0;
  Tensor space = workspace(grad, op, "xj_gate_residual_backward_workspace_bytes",
                           xj_gate_residual_backward_workspace_bytes(rows, seq, table_rows, hidden),
                           counts({{"rows", rows}, {"seq", seq}, {"table_rows", table_rows}, {"hidden", hidden}}));
  Described d(op, {{"grad", grad},
                   {"gate", gate},
                   {"index", index},
                   {"y", y},
                   {"d_y", d_y},
                   {"d_gate", d_gate},
                   {"workspace", space}});
  check(xj_gate_residual_backward(runtime(), d[0], d[1], d[2], d[3], d[4], d[5], d[6], current_stream(grad)),
        "xj_gate_residual_backward");
  return {d_y ? *d_y : placeholder(y, y.scalar_type()), d_gate ? *d_gate : placeholder(gate, gate.scalar_type())};
}

// --- adaln_row_gather ------------------------------------------------------------------------------

Tensor adaln_row_gather(Tensor rows, Tensor timestep_indices, Tensor token_tags) {
  const char* op = "adaln_row_gather";
  if (rows.dim() != 2 || rows.size(1) % 6 != 0 || timestep_indices.dim() != 1)
    invalid(std::string(op) + ": rows must be (3T, 6H) and timestep_indices (S,) (got " + shape(rows) + " and " +
            shape(timestep_indices) + ")");
  std::array<int64_t, 3> sizes{6, timestep_indices.size(0), rows.size(1) / 6};
  Tensor out = empty_on(rows, sizes, rows.scalar_type());
  Described d(op, {{"rows", rows}, {"timestep_indices", timestep_indices}, {"token_tags", token_tags}, {"out", out}});
  check(xj_adaln_row_gather(runtime(), d[0], d[1], d[2], d[3], current_stream(rows)), "xj_adaln_row_gather");
  return out;
}

Tensor adaln_row_gather_backward(Tensor grad, Tensor timestep_indices, Tensor token_tags, int64_t table_rows,
                                 ScalarType dtype) {
  const char* op = "adaln_row_gather_backward";
  if (grad.dim() != 3 || grad.size(0) != 6)
    invalid(std::string(op) + ": grad must be (6, S, H), got shape " + shape(grad));
  grad = made_contiguous(grad);
  long long seq = grad.size(1), hidden = grad.size(2);
  if (table_rows < 0) invalid(std::string(op) + ": table_rows must be >= 0, got " + std::to_string(table_rows));
  std::array<int64_t, 2> sizes{table_rows, 6 * hidden};
  Tensor d_rows = empty_on(grad, sizes, dtype);
  Tensor space = workspace(grad, op, "xj_adaln_row_gather_backward_workspace_bytes",
                           xj_adaln_row_gather_backward_workspace_bytes(seq, table_rows, hidden),
                           counts({{"seq", seq}, {"table_rows", table_rows}, {"hidden", hidden}}));
  Described d(op, {{"grad", grad},
                   {"timestep_indices", timestep_indices},
                   {"token_tags", token_tags},
                   {"d_rows", d_rows},
                   {"workspace", space}});
  check(xj_adaln_row_gather_backward(runtime(), d[0], d[1], d[2], d[3], d[4], current_stream(grad)),
        "xj_adaln_row_gather_backward");
  return d_rows;
}

// --- rms_norm --------------------------------------------------------------------------------------

std::tuple<Tensor, Tensor> rms_norm(Tensor x, OptionalTensor weight, double eps, OptionalTensor shift,
                                    OptionalTensor scale, OptionalTensor index, bool compute_rstd) {
  Tensor out = empty_like_contiguous(x);
  std::optional<Tensor> rstd;
  if (compute_rstd) rstd = rstd_like(x);
  Described d("rms_norm", {{"x", x},
                           {"weight", weight},
                           {"shift", shift},
                           {"scale", scale},
                           {"index", index},
                           {"out", out},
                           {"rstd", rstd}});
  check(xj_rms_norm(runtime(), d[0], d[1], d[2], d[3], d[4], d[5], d[6], eps, current_stream(x)), "xj_rms_norm");
  return {out, rstd ? *rstd : placeholder(x, ScalarType::Float)};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> rms_norm_backward(Tensor grad, Tensor x, OptionalTensor weight,
                                                             OptionalTensor scale, OptionalTensor index, Tensor rstd,
                                                             double eps, bool need_dx, bool need_dweight,
                                                             bool need_dshift, bool need_dscale) {
  const char* op = "rms_norm_backward";
  if (need_dweight && !weight) invalid(std::string(op) + ": dweight asked for but the forward had no weight");
  if ((need_dshift || need_dscale) && !scale)
    invalid(std::string(op) +
            ": dshift/dscale asked for but scale and index were not given (the plain norm has "
            "no table)");
  auto none = [&] { return placeholder(x, x.scalar_type()); };
  if (!(need_dx || need_dweight || need_dshift || need_dscale)) return {none(), none(), none(), none()};
  grad = made_contiguous(grad);
  if (rstd.dim() != 1) {  // (M,), as the C ABI documents it
    std::array<int64_t, 1> flat{rstd.numel()};
    rstd = torch::stable::reshape(rstd, flat);
  }
  long long hidden = x.dim() >= 1 ? x.size(x.dim() - 1) : 0;
  long long rows = hidden ? x.numel() / hidden : 0;
  long long table_rows = scale && scale->dim() == 2 ? scale->size(0) : 0;
  long long seq = index ? (index->dim() == 1 ? index->size(0) : 0) : 1;  // plain: S = 1, as the forward
  std::optional<Tensor> dx, dweight, dshift, dscale;
  std::array<int64_t, 1> h{hidden};
  std::array<int64_t, 2> table{table_rows, hidden};
  if (need_dx) dx = empty_like_contiguous(x);
  if (need_dweight) dweight = empty_on(*weight, h, weight->scalar_type());
  if (need_dshift) dshift = empty_on(*scale, table, scale->scalar_type());
  if (need_dscale) dscale = empty_on(*scale, table, scale->scalar_type());
  int weighted = weight.has_value();
  Tensor space = workspace(
      grad, op, "xj_rms_norm_backward_workspace_bytes",
      xj_rms_norm_backward_workspace_bytes(rows, seq, table_rows, hidden, weighted),
      counts({{"rows", rows}, {"seq", seq}, {"table_rows", table_rows}, {"hidden", hidden}, {"weighted", weighted}}));
  Described d(op, {{"grad", grad},
                   {"x", x},
                   {"weight", weight},
                   {"scale", scale},
                   {"index", index},
                   {"rstd", rstd},
                   {"dx", dx},
                   {"dweight", dweight},
                   {"dshift", dshift},
                   {"dscale", dscale},
                   {"workspace", space}});
  check(xj_rms_norm_backward(runtime(), d[0], d[1], d[2], d[3], d[4], d[5], eps, d[6], d[7], d[8], d[9], d[10],
                             current_stream(grad)),
        "xj_rms_norm_backward");
  return {dx ? *dx : none(), dweight ? *dweight : none(), dshift ? *dshift : none(), dscale ? *dscale : none()};
}

// --- gate_residual_rms_norm ------------------------------------------------------------------------

std::tuple<Tensor, Tensor, Tensor> gate_residual_rms_norm(Tensor residual, Tensor gate, Tensor index, Tensor y,
                                                          OptionalTensor weight, double eps, OptionalTensor shift,
                                                          OptionalTensor scale, bool compute_rstd) {
  Tensor h = empty_like_contiguous(residual);
  Tensor out = empty_like_contiguous(residual);
  std::optional<Tensor> rstd;
  if (compute_rstd) rstd = rstd_like(residual);
  Described d("gate_residual_rms_norm", {{"residual", residual},
                                         {"gate", gate},
                                         {"index", index},
                                         {"y", y},
                                         {"weight", weight},
                                         {"shift", shift},
                                         {"scale", scale},
                                         {"h", h},
                                         {"out", out},
                                         {"rstd", rstd}});
  check(xj_gate_residual_rms_norm(runtime(), d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7], d[8], d[9], eps,
                                  current_stream(residual)),
        "xj_gate_residual_rms_norm");
  return {h, out, rstd ? *rstd : placeholder(residual, ScalarType::Float)};
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> gate_residual_rms_norm_backward(
    Tensor grad_out, OptionalTensor grad_h, Tensor h, Tensor y, Tensor gate, Tensor index, OptionalTensor weight,
    OptionalTensor scale, Tensor rstd, double eps, bool need_d_y, bool need_d_gate, bool need_d_weight,
    bool need_d_shift, bool need_d_scale) {
  const char* op = "gate_residual_rms_norm_backward";
  if (need_d_weight && !weight) invalid(std::string(op) + ": d_weight asked for but the forward had no weight");
  if ((need_d_shift || need_d_scale) && !scale)
    invalid(std::string(op) + ": d_shift/d_scale asked for but scale was not given (the forward was not modulated)");
  grad_out = made_contiguous(grad_out);
  if (grad_h) grad_h = made_contiguous(*grad_h);
  if (rstd.dim() != 1) {  // (M,), as the C ABI documents it
    std::array<int64_t, 1> flat{rstd.numel()};
    rstd = torch::stable::reshape(rstd, flat);
  }
  long long hidden = h.dim() >= 1 ? h.size(h.dim() - 1) : 0;
  long long rows = hidden ? h.numel() / hidden : 0;
  long long seq = index.dim() == 1 ? index.size(0) : 0;
  long long table_rows = gate.dim() == 2 ? gate.size(0) : 0;
  Tensor d_residual = empty_like_contiguous(h);  // always: d_y and d_gate are taken from it
  std::optional<Tensor> d_y, d_gate, d_weight, d_shift, d_scale;
  std::array<int64_t, 1> hsize{hidden};
  if (need_d_y) d_y = empty_like_contiguous(y);
  if (need_d_gate) d_gate = empty_on(gate, gate.sizes(), gate.scalar_type());
  if (need_d_weight) d_weight = empty_on(*weight, hsize, weight->scalar_type());
  if (need_d_shift) d_shift = empty_on(*scale, scale->sizes(), scale->scalar_type());
  if (need_d_scale) d_scale = empty_on(*scale, scale->sizes(), scale->scalar_type());
  int weighted = weight.has_value(), modulated = scale.has_value();
  Tensor space =
      workspace(grad_out, op, "xj_gate_residual_rms_norm_backward_workspace_bytes",
                xj_gate_residual_rms_norm_backward_workspace_bytes(rows, seq, table_rows, hidden, weighted, modulated),
                counts({{"rows", rows},
                        {"seq", seq},
                        {"table_rows", table_rows},
                        {"hidden", hidden},
                        {"weighted", weighted},
                        {"modulated", modulated}}));
  Described d(op, {{"grad_out", grad_out},
                   {"grad_h", grad_h},
                   {"h", h},
                   {"y", y},
                   {"gate", gate},
                   {"index", index},
                   {"weight", weight},
                   {"scale", scale},
                   {"rstd", rstd},
                   {"d_residual", d_residual},
                   {"d_y", d_y},
                   {"d_gate", d_gate},
                   {"d_weight", d_weight},
                   {"d_shift", d_shift},
                   {"d_scale", d_scale},
                   {"workspace", space}});
  check(xj_gate_residual_rms_norm_backward(runtime(), d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7], d[8], eps, d[9],
                                           d[10], d[11], d[12], d[13], d[14], d[15], current_stream(grad_out)),
        "xj_gate_residual_rms_norm_backward");
  auto none = [&] { return placeholder(h, h.scalar_type()); };
  return {d_residual,
          d_y ? *d_y : placeholder(y, y.scalar_type()),
          d_gate ? *d_gate : placeholder(gate, gate.scalar_type()),
          d_weight ? *d_weight : none(),
          d_shift ? *d_shift : none(),
          d_scale ? *d_scale : none()};
}

// --- timestep_sinusoid -----------------------------------------------------------------------------

Tensor timestep_sinusoid(Tensor t, int64_t num_channels, double max_period, bool flip_sin_to_cos,
                         double downscale_freq_shift, double scale, bool check_range) {
  const char* op = "timestep_sinusoid";
  if (t.dim() != 1) invalid(std::string(op) + ": t must be 1-D (T,), got shape " + shape(t));
  if (num_channels < 0) invalid(std::string(op) + ": num_channels must be >= 0, got " + std::to_string(num_channels));
  t = as_float_contiguous(t);
  std::array<int64_t, 2> sizes{t.size(0), num_channels};
  Tensor out = empty_on(t, sizes, ScalarType::Float);
  Described d(op, {{"t", t}, {"out", out}});
  check(xj_timestep_sinusoid(runtime(), d[0], d[1], max_period, flip_sin_to_cos, downscale_freq_shift, scale,
                             check_range, current_stream(t)),
        "xj_timestep_sinusoid");
  return out;
}

Tensor timestep_sinusoid_backward(Tensor t, Tensor grad, double max_period, bool flip_sin_to_cos,
                                  double downscale_freq_shift, double scale) {
  const char* op = "timestep_sinusoid_backward";
  if (t.dim() != 1) invalid(std::string(op) + ": t must be 1-D (T,), got shape " + shape(t));
  t = as_float_contiguous(t);
  grad = made_contiguous(grad);
  std::array<int64_t, 1> sizes{t.size(0)};
  Tensor d_t = empty_on(t, sizes, ScalarType::Float);
  Described d(op, {{"t", t}, {"grad", grad}, {"d_t", d_t}});
  check(xj_timestep_sinusoid_backward(runtime(), d[0], d[1], d[2], max_period, flip_sin_to_cos, downscale_freq_shift,
                                      scale, current_stream(t)),
        "xj_timestep_sinusoid_backward");
  return d_t;
}

// --- det_linear ------------------------------------------------------------------------------------

// x (T, K) and weight (N, K) are matrices, so their sizes can be read.
void require_matrices(const char* op, const Tensor& x, const Tensor& weight) {
  if (x.dim() != 2 || weight.dim() != 2)
    invalid(std::string(op) + ": x must be (T, K) and weight (N, K), got shapes " + shape(x) + " and " + shape(weight));
}

std::tuple<Tensor, Tensor> det_linear(Tensor x, Tensor weight, OptionalTensor bias, bool silu, bool compute_pre) {
  const char* op = "det_linear";
  require_matrices(op, x, weight);
  x = as_float_contiguous(x);
  std::array<int64_t, 2> sizes{x.size(0), weight.size(0)};
  Tensor out = empty_on(x, sizes, weight.scalar_type());
  std::optional<Tensor> pre;
  if (compute_pre) pre = empty_on(x, sizes, ScalarType::Float);
  Described d(op, {{"x", x}, {"weight", weight}, {"bias", bias}, {"out", out}, {"pre_activation", pre}});
  check(xj_det_linear(runtime(), d[0], d[1], d[2], d[3], d[4], silu, current_stream(x)), "xj_det_linear");
  return {out, pre ? *pre : placeholder(out, ScalarType::Float)};
}

std::tuple<Tensor, Tensor, Tensor> det_linear_backward(Tensor grad, Tensor x, Tensor weight,
                                                       OptionalTensor pre_activation, bool silu, bool need_input,
                                                       bool need_weight, bool need_bias) {
  const char* op = "det_linear_backward";
  require_matrices(op, x, weight);
  bool bf16 = weight.scalar_type() == ScalarType::BFloat16;
  if (bf16) {
    if (pre_activation) invalid(std::string(op) + ": pre_activation must be None for bfloat16 weights");
    ScalarType g = grad.scalar_type();
    grad = (g == ScalarType::BFloat16 || g == ScalarType::Float) ? made_contiguous(grad) : as_float_contiguous(grad);
  } else {
    grad = as_float_contiguous(grad);
  }
  x = as_float_contiguous(x);
  long long rows = x.size(0), in_features = x.size(1), out_features = weight.size(0);
  ScalarType grad_type = bf16 ? weight.scalar_type() : ScalarType::Float;
  std::optional<Tensor> d_input, d_weight, d_bias, space;
  std::array<int64_t, 1> n{out_features};
  if (need_input) d_input = empty_on(x, x.sizes(), ScalarType::Float);
  if (need_weight) d_weight = empty_on(weight, weight.sizes(), grad_type);
  if (need_bias) d_bias = empty_on(x, n, grad_type);
  if (need_input)
    space = workspace(x, op, "xj_det_linear_backward_workspace_bytes",
                      xj_det_linear_backward_workspace_bytes(rows, in_features, out_features),
                      counts({{"rows", rows}, {"in_features", in_features}, {"out_features", out_features}}));
  Described d(op, {{"grad", grad},
                   {"pre_activation", pre_activation},
                   {"x", x},
                   {"weight", weight},
                   {"d_input", d_input},
                   {"d_weight", d_weight},
                   {"d_bias", d_bias},
                   {"workspace", space}});
  check(xj_det_linear_backward(runtime(), d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7], silu, current_stream(x)),
        "xj_det_linear_backward");
  return {d_input ? *d_input : placeholder(x, ScalarType::Float),
          d_weight ? *d_weight : placeholder(weight, weight.scalar_type()),
          d_bias ? *d_bias : placeholder(weight, weight.scalar_type())};
}

}  // namespace

// The runtime every kernel of this library launches on (exactjit.runtime()'s, which lives until
// the process exits).
extern "C" __attribute__((visibility("default"))) void exactjit_torch_use_runtime(xj_runtime* runtime) {
  shared_runtime.store(runtime, std::memory_order_release);
}

STABLE_TORCH_LIBRARY_IMPL(exactjit, CUDA, m) {
  m.impl("gate_residual", TORCH_BOX(&gate_residual));
  m.impl("gate_residual_out", TORCH_BOX(&gate_residual_out));
  m.impl("gate_residual_backward", TORCH_BOX(&gate_residual_backward));
  m.impl("adaln_row_gather", TORCH_BOX(&adaln_row_gather));
  m.impl("adaln_row_gather_backward", TORCH_BOX(&adaln_row_gather_backward));
  m.impl("rms_norm", TORCH_BOX(&rms_norm));
  m.impl("rms_norm_backward", TORCH_BOX(&rms_norm_backward));
  m.impl("gate_residual_rms_norm", TORCH_BOX(&gate_residual_rms_norm));
  m.impl("gate_residual_rms_norm_backward", TORCH_BOX(&gate_residual_rms_norm_backward));
  m.impl("timestep_sinusoid", TORCH_BOX(&timestep_sinusoid));
  m.impl("timestep_sinusoid_backward", TORCH_BOX(&timestep_sinusoid_backward));
  m.impl("det_linear", TORCH_BOX(&det_linear));
  m.impl("det_linear_backward", TORCH_BOX(&det_linear_backward));
}
