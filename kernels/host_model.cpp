// exactjit host models (see host_model.hpp).
#include "kernels/host_model.hpp"

#include "kernels/det_linear_backward.hpp"
#include "kernels/row_reduction_model.hpp"

#include "templates/numerics.cuh"
#include "templates/fixed_order_sum.cuh"
#include "templates/gate_residual_math.cuh"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace exactjit {
namespace {

template <typename T, typename I>
int64_t gate_residual_typed(const T* residual, const T* gate, int64_t table_stride, int64_t table_rows,
                            const I* index, const T* y, T* out, int64_t rows, int64_t seq, int64_t hidden) {
  int64_t skipped = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = static_cast<int64_t>(index[r % seq]);
    if (i < 0 || i >= table_rows) {
      ++skipped;
      continue;
    }
    const T* g = gate + i * table_stride;
    for (int64_t j = 0; j < hidden; ++j)
      out[r * hidden + j] = xj::gate_residual_element(residual[r * hidden + j], g[j], y[r * hidden + j]);
  }
  return skipped;
}

template <typename T>
int64_t dispatch_index(const void* residual, const void* gate, int64_t table_stride, int64_t table_rows,
                       const void* index, IndexType index_type, const void* y, void* out, int64_t rows,
                       int64_t seq, int64_t hidden) {
  if (index_type == IndexType::I32)
    return gate_residual_typed(static_cast<const T*>(residual), static_cast<const T*>(gate), table_stride,
                               table_rows, static_cast<const int32_t*>(index), static_cast<const T*>(y),
                               static_cast<T*>(out), rows, seq, hidden);
  return gate_residual_typed(static_cast<const T*>(residual), static_cast<const T*>(gate), table_stride,
                             table_rows, static_cast<const int64_t*>(index), static_cast<const T*>(y),
                             static_cast<T*>(out), rows, seq, hidden);
}

template <typename T> float rsqrt_argument(const T* x, int64_t hidden, float eps) {
  const float total = block_fma_reduce_model(hidden, [x](int64_t j, float& a, float& b) {
    a = b = xj::to_float(x[j]);
  });
  return xj::add(xj::div(total, static_cast<float>(hidden)), eps);
}

template <typename T>
void rms_norm_row(const T* x, const T* weight, const T* shift, const T* scale, int64_t hidden, float rstd, T* out) {
  for (int64_t j = 0; j < hidden; ++j) {
    float n = xj::mul(rstd, xj::to_float(x[j]));
    if (weight) n = xj::mul(xj::to_float(weight[j]), n);
    T rounded = xj::round_to<T>(n);
    if (shift) {
      const float one_plus_scale = xj::to_float(xj::round_to<T>(xj::add(1.0f, xj::to_float(scale[j]))));
      const float scaled = xj::to_float(xj::round_to<T>(xj::mul(xj::to_float(rounded), one_plus_scale)));
      rounded = xj::round_to<T>(xj::add(scaled, xj::to_float(shift[j])));
    }
    out[j] = rounded;
  }
}

}  // namespace

float rms_norm_rsqrt_argument_model(DType dtype, const void* x_row, int64_t hidden, float eps) {
  switch (dtype) {
    case DType::BF16: return rsqrt_argument(static_cast<const xj::bf16*>(x_row), hidden, eps);
    case DType::F16: return rsqrt_argument(static_cast<const xj::fp16*>(x_row), hidden, eps);
    case DType::F32: return rsqrt_argument(static_cast<const float*>(x_row), hidden, eps);
  }
  return 0;
}

void rms_norm_row_model(DType dtype, const void* x_row, const void* weight, const void* shift_row,
                        const void* scale_row, int64_t hidden, float rstd, void* out_row) {
  switch (dtype) {
    case DType::BF16:
      return rms_norm_row(static_cast<const xj::bf16*>(x_row), static_cast<const xj::bf16*>(weight),
                          static_cast<const xj::bf16*>(shift_row), static_cast<const xj::bf16*>(scale_row), hidden,
                          rstd, static_cast<xj::bf16*>(out_row));
    case DType::F16:
      return rms_norm_row(static_cast<const xj::fp16*>(x_row), static_cast<const xj::fp16*>(weight),
                          static_cast<const xj::fp16*>(shift_row), static_cast<const xj::fp16*>(scale_row), hidden,
                          rstd, static_cast<xj::fp16*>(out_row));
    case DType::F32:
      return rms_norm_row(static_cast<const float*>(x_row), static_cast<const float*>(weight),
                          static_cast<const float*>(shift_row), static_cast<const float*>(scale_row), hidden, rstd,
                          static_cast<float*>(out_row));
  }
}

int64_t gate_residual_model(DType dtype, const void* residual, const void* gate, int64_t table_stride,
                            int64_t table_rows, const void* index, IndexType index_type, const void* y,
                            void* out, int64_t rows, int64_t seq, int64_t hidden) {
  switch (dtype) {
    case DType::BF16:
      return dispatch_index<xj::bf16>(residual, gate, table_stride, table_rows, index, index_type, y, out, rows,
                                      seq, hidden);
    case DType::F16:
      return dispatch_index<xj::fp16>(residual, gate, table_stride, table_rows, index, index_type, y, out, rows,
                                      seq, hidden);
    case DType::F32:
      return dispatch_index<float>(residual, gate, table_stride, table_rows, index, index_type, y, out, rows, seq,
                                   hidden);
  }
  return 0;
}

int64_t adaln_row_gather_model(size_t element_bytes, const void* rows, int64_t table_stride, int64_t timesteps,
                               const void* timestep_indices, const void* token_tags, IndexType index_type, void* out,
                               int64_t seq, int64_t hidden) {
  auto read = [index_type](const void* data, int64_t k) -> int64_t {
    return index_type == IndexType::I32 ? static_cast<const int32_t*>(data)[k] : static_cast<const int64_t*>(data)[k];
  };
  const auto* source = static_cast<const uint8_t*>(rows);
  auto* target = static_cast<uint8_t*>(out);
  const size_t row_bytes = static_cast<size_t>(hidden) * element_bytes;
  int64_t skipped = 0;
  for (int64_t s = 0; s < seq; ++s) {
    const int64_t t = read(timestep_indices, s), tag = read(token_tags, s);
    if (t < 0 || t >= timesteps || tag < 0 || tag >= 3) {
      ++skipped;
      continue;
    }
    const uint8_t* row = source + static_cast<size_t>((t * 3 + tag) * table_stride) * element_bytes;
    for (int64_t c = 0; c < 6; ++c)
      std::memcpy(target + static_cast<size_t>(c * seq + s) * row_bytes, row + static_cast<size_t>(c) * row_bytes,
                  row_bytes);
  }
  return skipped;
}

namespace {

// The kernels' butterfly step (templates/det_linear_fp32.cuh): symmetric in a and b.
xj::CompensatedSum combine(xj::CompensatedSum a, const xj::CompensatedSum& b) {
  a.error = xj::add(a.error, b.error);
  a.add(b.sum);
  return a;
}

}  // namespace

void det_linear_fp32_model(const float* x, const float* weight, const float* bias, int64_t rows, int64_t in_features,
                           int64_t out_features, float* v) {
  constexpr int kLanes = 32;
  const int64_t chunks = in_features / 4;
  for (int64_t t = 0; t < rows; ++t) {
    const float* xt = x + t * in_features;
    for (int64_t n = 0; n < out_features; ++n) {
      const float* wn = weight + n * in_features;
      xj::CompensatedSum lanes[kLanes];
      for (int lane = 0; lane < kLanes; ++lane) {
        for (int64_t first = lane; first < chunks; first += 2 * kLanes) {  // group: chunks first, first + 32
          float p = 0.0f;
          for (int64_t c = first; c < chunks && c <= first + kLanes; c += kLanes)
            for (int e = 0; e < 4; ++e) p = xj::fma(wn[4 * c + e], xt[4 * c + e], p);
          lanes[lane].add(p);
        }
      }
      for (int offset = 16; offset > 0; offset /= 2) {
        xj::CompensatedSum next[kLanes];
        for (int lane = 0; lane < kLanes; ++lane) next[lane] = combine(lanes[lane], lanes[lane ^ offset]);
        std::copy(next, next + kLanes, lanes);
      }
      const float dot = lanes[0].value();
      v[t * out_features + n] = bias ? xj::add(dot, bias[n]) : dot;
    }
  }
}

namespace {
// d_input[t, k] = the compensated fold over `chunk`-output chunks (ascending, from 0) of each
// chunk's compensated sum of fma chains over `group` outputs ascending from 0.
void chunked_input_grad(const float* d_v, const float* weight, int64_t rows, int64_t in_features,
                        int64_t out_features, int64_t chunk, int64_t group, float* d_input) {
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t k = 0; k < in_features; ++k) {
      xj::CompensatedSum fold;
      for (int64_t n0 = 0; n0 < out_features; n0 += chunk) {
        const int64_t end = std::min(n0 + chunk, out_features);
        xj::CompensatedSum partial;
        for (int64_t g = n0; g < end; g += group) {
          float p = 0.0f;
          for (int64_t n = g; n < std::min(g + group, end); ++n)
            p = xj::fma(d_v[t * out_features + n], weight[n * in_features + k], p);
          partial.add(p);
        }
        fold.add(partial.value());
      }
      d_input[t * in_features + k] = fold.value();
    }
}
}  // namespace

void det_linear_fp32_backward_model(const float* grad, const float* pre_activation, const float* x,
                                    const float* weight, int64_t rows, int64_t in_features, int64_t out_features,
                                    bool silu, float* d_input, float* d_weight, float* d_bias) {
  constexpr int64_t kChunk = 64, kGroup = 4;
  std::vector<float> d_v(static_cast<size_t>(rows * out_features));
  for (int64_t i = 0; i < rows * out_features; ++i) {
    d_v[i] = grad[i];
    if (silu) {
      const float v = pre_activation[i];
      const float s = xj::div(1.0f, xj::add(1.0f, std::exp(-v)));
      d_v[i] = xj::mul(grad[i], xj::mul(s, xj::add(1.0f, xj::mul(v, xj::sub(1.0f, s)))));
    }
  }
  if (d_input) chunked_input_grad(d_v.data(), weight, rows, in_features, out_features, kChunk, kGroup, d_input);
  for (int64_t n = 0; n < out_features; ++n) {
    xj::CompensatedSum b;
    for (int64_t t = 0; t < rows; ++t) b.add(d_v[t * out_features + n]);
    if (d_bias) d_bias[n] = b.value();
    for (int64_t k = 0; d_weight && k < in_features; ++k) {
      float w = 0.0f;
      for (int64_t t = 0; t < rows; ++t) w = xj::fma(d_v[t * out_features + n], x[t * in_features + k], w);
      d_weight[n * in_features + k] = w;
    }
  }
}

void det_linear_bf16_backward_model(const float* grad, const float* temb, const uint16_t* weight, int64_t rows,
                                    int64_t in_features, int64_t out_features, bool silu, float* d_input,
                                    uint16_t* d_weight, uint16_t* d_bias) {
  auto widen = [](uint16_t bits) { return xj::to_float(xj::bf16{bits}); };
  if (d_input) {
    std::vector<float> w(static_cast<size_t>(out_features * in_features));
    for (size_t i = 0; i < w.size(); ++i) w[i] = widen(weight[i]);
    chunked_input_grad(grad, w.data(), rows, in_features, out_features, kDetLinearBf16Chunk, kDetLinearBf16Group,
                       d_input);
    for (int64_t i = 0; silu && i < rows * in_features; ++i) {
      const float v = temb[i];
      const float s = xj::div(1.0f, xj::add(1.0f, std::exp(-v)));
      d_input[i] = xj::mul(d_input[i], xj::mul(s, xj::add(1.0f, xj::mul(v, xj::sub(1.0f, s)))));
    }
  }
  std::vector<float> x(static_cast<size_t>(rows * in_features));
  for (size_t i = 0; i < x.size(); ++i) {
    float v = temb[i];
    if (silu) v = xj::div(v, xj::add(1.0f, std::exp(-v)));
    x[i] = xj::to_float(xj::round_to<xj::bf16>(v));
  }
  for (int64_t n = 0; n < out_features; ++n) {
    if (d_bias) {
      xj::CompensatedSum b;
      for (int64_t t = 0; t < rows; ++t) b.add(grad[t * out_features + n]);
      d_bias[n] = xj::round_to<xj::bf16>(b.value()).bits;
    }
    for (int64_t k = 0; d_weight && k < in_features; ++k) {
      float acc = 0.0f;
      for (int64_t t = 0; t < rows; ++t) acc = xj::fma(grad[t * out_features + n], x[t * in_features + k], acc);
      d_weight[n * in_features + k] = xj::round_to<xj::bf16>(acc).bits;
    }
  }
}

}  // namespace exactjit
