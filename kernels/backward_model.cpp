// exactjit host models of the backward passes (see backward_model.hpp).
#include "kernels/backward_model.hpp"

#include "codegen/op_row.hpp"
#include "kernels/rms_norm_backward.hpp"
#include "kernels/row_reduction_model.hpp"
#include "kernels/segment_plan.hpp"
#include "kernels/segment_plan_model.hpp"
#include "templates/fixed_order_sum.cuh"
#include "templates/numerics.cuh"

#include <algorithm>

namespace exactjit {
namespace {

// Runs `body` with the storage type of `dtype`.
template <typename Body> void with_storage(DType dtype, Body body) {
  switch (dtype) {
    case DType::BF16: return body(xj::bf16{});
    case DType::F16: return body(xj::fp16{});
    case DType::F32: return body(float{});
  }
}

template <typename T> float at(const void* data, int64_t k) { return xj::to_float(static_cast<const T*>(data)[k]); }

void put(DType dtype, void* data, int64_t k, float v) {
  with_storage(dtype, [&](auto tag) {
    using T = decltype(tag);
    static_cast<T*>(data)[k] = xj::round_to<T>(v);
  });
}

// out(k, j) for every table row k and column j < width: the fold, from 0, of row k's tile
// partials, each the sum from 0 of the terms add_term(row, j, sum) adds over the tile's rows in
// plan order. Tiles accumulate in SegmentSumFor<T>, the fold is compensated, as in the kernels.
template <typename T, typename AddTerm, typename Put>
void segment_sums(const SegmentPlanModel& plan, int64_t table_rows, int64_t width, AddTerm add_term, Put out) {
  std::vector<xj::CompensatedSum> fold(static_cast<size_t>(width));
  using Tile = typename xj::SegmentSumFor<T>::type;
  std::vector<Tile> partial(static_cast<size_t>(width));
  for (int64_t k = 0; k < table_rows; ++k) {
    std::fill(fold.begin(), fold.end(), xj::CompensatedSum{});
    for (int64_t t = plan.row_tile_start[k]; t < plan.row_tile_start[k + 1]; ++t) {
      std::fill(partial.begin(), partial.end(), Tile{});
      for (int64_t row : segment_tile_rows(plan, t))
        for (int64_t j = 0; j < width; ++j) add_term(row, j, partial[j]);
      for (int64_t j = 0; j < width; ++j) fold[j].add(partial[j].value());
    }
    for (int64_t j = 0; j < width; ++j) out(k, j, fold[j].value());
  }
}

}  // namespace

std::vector<int64_t> keys_of(const void* index, IndexType index_type, int64_t seq, int64_t table_rows) {
  std::vector<int64_t> keys(static_cast<size_t>(seq));
  for (int64_t s = 0; s < seq; ++s) {
    const int64_t i = index_type == IndexType::I32 ? static_cast<const int32_t*>(index)[s]
                                                   : static_cast<const int64_t*>(index)[s];
    keys[s] = i >= 0 && i < table_rows ? i : -1;
  }
  return keys;
}

void gate_residual_backward_model(DType dtype, const void* grad, const void* gate, int64_t table_stride,
                                  const std::vector<int64_t>& keys, int64_t table_rows, const void* y, int64_t rows,
                                  int64_t hidden, void* d_y, void* d_gate, DType d_gate_dtype) {
  const int64_t seq = static_cast<int64_t>(keys.size());
  with_storage(dtype, [&](auto tag) {
    using T = decltype(tag);
    if (d_y)
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t k = keys[r % seq];
        if (k < 0) continue;
        for (int64_t j = 0; j < hidden; ++j)
          put(dtype, d_y, r * hidden + j, xj::mul(at<T>(grad, r * hidden + j), at<T>(gate, k * table_stride + j)));
      }
    if (d_gate)
      segment_sums<T>(
          segment_plan_model(keys, table_rows, rows / seq), table_rows, hidden,
          [&](int64_t r, int64_t j, auto& sum) {
            sum.add_product(at<T>(grad, r * hidden + j), at<T>(y, r * hidden + j));
          },
          [&](int64_t k, int64_t j, float v) { put(d_gate_dtype, d_gate, k * hidden + j, v); });
  });
}

void rms_norm_dx_row_model(DType dtype, const void* grad_row, const void* x_row, const void* weight,
                           const void* scale_row, int64_t hidden, float rstd, double eps, void* dx_row) {
  with_storage(dtype, [&](auto tag) {
    using T = decltype(tag);
    constexpr bool exact_rstd = sizeof(T) == 4;  // fp32 recomputes rstd (see the template)
    // wd(j) = w * d_n as the kernel rounds it; `lo` receives its rounding error (see the template).
    auto wd = [&](int64_t j, float* lo) {
      const float grad = at<T>(grad_row, j);
      float d = grad, d_lo = 0.0f;
      if (scale_row) {
        const float m = xj::to_float(xj::round_to<T>(xj::add(1.0f, at<T>(scale_row, j))));
        d = xj::mul(grad, m);
        d_lo = xj::product_error(grad, m, d);
      }
      if (!weight) {
        if (lo) *lo = d_lo;
        return d;
      }
      const float w = at<T>(weight, j), product = xj::mul(w, d);
      if (lo) *lo = scale_row ? xj::fma(w, d_lo, xj::product_error(w, d, product)) : xj::product_error(w, d, product);
      return product;
    };
    const float dot = block_fma_reduce_model(hidden, [&](int64_t j, float& a, float& b) {
      a = wd(j, nullptr);
      b = at<T>(x_row, j);
    });
    float r = rstd, r_lo = 0.0f, coef;
    if (exact_rstd) {
      const double squares = block_reduce_model<double, xj::CompensatedSum>(
          hidden, [&](int64_t j, xj::CompensatedSum& s) { s.add_product(at<T>(x_row, j), at<T>(x_row, j)); },
          [](const xj::CompensatedSum& s) { return static_cast<double>(s.value()); });
      const double h = static_cast<double>(hidden);
      const double rd = xj::div(1.0, xj::sqrt_rn(xj::add(xj::div(squares, h), eps)));
      r = xj::to_float(rd);
      r_lo = xj::to_float(xj::add(rd, -static_cast<double>(r)));
      coef = xj::to_float(xj::div(xj::mul(xj::mul(xj::mul(rd, rd), rd), static_cast<double>(dot)), h));
    } else {
      coef = xj::div(xj::mul(xj::mul(xj::mul(r, r), r), dot), static_cast<float>(hidden));
    }
    for (int64_t j = 0; j < hidden; ++j) {
      float lo = 0.0f;
      const float product = wd(j, &lo);
      float small = xj::mul(-at<T>(x_row, j), coef);
      if (exact_rstd) small = xj::fma(r_lo, product, small);
      if (scale_row || weight) small = xj::fma(r, lo, small);
      put(dtype, dx_row, j, xj::fma(r, product, small));
    }
  });
}

void rms_norm_table_grads_model(DType dtype, const void* grad, const void* x, const void* weight, const float* rstd,
                                const std::vector<int64_t>& keys, int64_t table_rows, int64_t rows, int64_t hidden,
                                void* dshift, void* dscale, DType out_dtype) {
  const int64_t seq = static_cast<int64_t>(keys.size());
  const SegmentPlanModel plan = segment_plan_model(keys, table_rows, rows / seq);
  with_storage(dtype, [&](auto tag) {
    using T = decltype(tag);
    if (dshift)
      segment_sums<T>(
          plan, table_rows, hidden, [&](int64_t r, int64_t j, auto& sum) { sum.add(at<T>(grad, r * hidden + j)); },
          [&](int64_t k, int64_t j, float v) { put(out_dtype, dshift, k * hidden + j, v); });
    if (dscale)
      segment_sums<T>(
          plan, table_rows, hidden,
          [&](int64_t r, int64_t j, auto& sum) {
            float n = xj::mul(rstd[r], at<T>(x, r * hidden + j));
            if (weight) n = xj::mul(at<T>(weight, j), n);
            sum.add_product(at<T>(grad, r * hidden + j), xj::to_float(xj::round_to<T>(n)));
          },
          [&](int64_t k, int64_t j, float v) { put(out_dtype, dscale, k * hidden + j, v); });
  });
}

void rms_norm_weight_grad_model(DType dtype, const void* grad, const void* x, const void* scale, int64_t table_stride,
                                const std::vector<int64_t>& keys, int64_t table_rows, const float* rstd, int64_t rows,
                                int64_t hidden, void* dweight, DType out_dtype) {
  // The tiles in fold order, (table row, rows): modulated, the plan's tiles of every table row's
  // list, k ascending; plain, kTilePositions consecutive rows.
  std::vector<std::pair<int64_t, std::vector<int64_t>>> tiles;
  if (scale) {
    const SegmentPlanModel plan = segment_plan_model(keys, table_rows, rows / static_cast<int64_t>(keys.size()));
    for (int64_t k = 0; k < table_rows; ++k)
      for (int64_t t = plan.row_tile_start[k]; t < plan.row_tile_start[k + 1]; ++t)
        tiles.emplace_back(k, segment_tile_rows(plan, t));
  } else {
    for (int64_t first = 0; first < rows; first += kTilePositions) {
      std::vector<int64_t> tile;
      for (int64_t r = first; r < std::min(first + kTilePositions, rows); ++r) tile.push_back(r);
      tiles.emplace_back(0, std::move(tile));
    }
  }
  const size_t kRowUnroll = static_cast<size_t>(op_row(Op::RmsNormTableGrad).row_unroll);
  with_storage(dtype, [&](auto tag) {
    using T = decltype(tag);
    std::vector<xj::CompensatedSum> fold(static_cast<size_t>(hidden)), partial(static_cast<size_t>(hidden));
    std::vector<float> group(static_cast<size_t>(hidden));
    for (const auto& [k, tile] : tiles) {
      std::fill(partial.begin(), partial.end(), xj::CompensatedSum{});
      if (!scale) {
        for (int64_t r : tile)
          for (int64_t j = 0; j < hidden; ++j)
            partial[j].add_product(at<T>(grad, r * hidden + j), xj::mul(rstd[r], at<T>(x, r * hidden + j)));
      }
      // Modulated: the table-grad tiles add plain sums of kRowUnroll rows, compensated.
      for (size_t first = 0; scale && first < tile.size(); first += kRowUnroll) {
        std::fill(group.begin(), group.end(), 0.0f);
        for (size_t u = first; u < std::min(tile.size(), first + kRowUnroll); ++u) {
          const int64_t r = tile[u];
          for (int64_t j = 0; j < hidden; ++j) {
            const float m = xj::to_float(xj::round_to<T>(xj::add(1.0f, at<T>(scale, k * table_stride + j))));
            const float d = xj::mul(at<T>(grad, r * hidden + j), m);
            group[j] = xj::add(group[j], xj::mul(d, xj::mul(rstd[r], at<T>(x, r * hidden + j))));
          }
        }
        for (int64_t j = 0; j < hidden; ++j) partial[j].add(group[j]);
      }
      for (int64_t j = 0; j < hidden; ++j) fold[j].add(partial[j].value());
    }
    for (int64_t j = 0; j < hidden; ++j) put(out_dtype, dweight, j, fold[j].value());
  });
}

void adaln_row_gather_backward_model(DType dtype, DType out_dtype, const void* grad, const std::vector<int64_t>& keys,
                                     int64_t table_rows, int64_t hidden, void* d_rows) {
  const int64_t seq = static_cast<int64_t>(keys.size());
  with_storage(dtype, [&](auto tag) {
    using T = decltype(tag);
    segment_sums<T>(
        segment_plan_model(keys, table_rows, 1), table_rows, 6 * hidden,
        [&](int64_t s, int64_t column, auto& sum) {
          const int64_t c = column / hidden, j = column % hidden;
          sum.add(at<T>(grad, (c * seq + s) * hidden + j));
        },
        [&](int64_t k, int64_t column, float v) { put(out_dtype, d_rows, k * 6 * hidden + column, v); });
  });
}

}  // namespace exactjit
