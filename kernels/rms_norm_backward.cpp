// exactjit op rms_norm, backward: validate, then dx and the parameter gradients: modulated, one
// plan and one pass of tiles for dshift, dscale and dweight, then their folds; plain, dweight's
// tiles of consecutive rows and their fold.
#include "kernels/rms_norm_backward.hpp"

#include "api/c_entry.hpp"
#include "codegen/geometry.hpp"
#include "codegen/render.hpp"
#include "kernels/backward_check.hpp"
#include "kernels/op_rules.hpp"
#include "kernels/segment_plan.hpp"
#include "kernels/spec_limits.hpp"

#include <fmt/format.h>
#include <llvm/ADT/SmallVector.h>

#include <climits>
#include <cmath>
#include <initializer_list>
#include <tuple>

namespace exactjit {
namespace {
constexpr std::string_view kOp = "rms_norm_backward";
ArgName arg(std::string_view name) { return {kOp, name}; }

// Tile partials of dshift and dscale (plan tiles) and of dweight: the same plan tiles where
// modulated (one pass over the rows adds all three), tiles of consecutive rows where not.
struct Regions {
  SegmentLayout layout;
  int64_t shift_partials = 0, scale_partials = 0, weight_partials = 0, weight_tiles = 0;
  int64_t end = 0;  ///< -1: beyond 64 bits (then the offsets are unusable)
};

Regions regions(int64_t rows, int64_t seq, int64_t table_rows, int64_t hidden, bool weighted) {
  Regions r;
  CheckedSize at = 0, weight_tiles = CheckedSize(rows).ceil_div(kTilePositions);
  if (table_rows > 0) {
    r.layout = segment_layout(rows, seq, table_rows);
    const CheckedSize partials = align_workspace(CheckedSize(r.layout.max_tiles) * hidden * 4);
    at = r.layout.end;
    r.shift_partials = at.value_or(-1);
    at = at + partials;
    r.scale_partials = at.value_or(-1);
    at = at + partials;
    weight_tiles = r.layout.max_tiles;
  }
  r.weight_tiles = weight_tiles.value_or(-1);
  if (weighted) {
    r.weight_partials = at.value_or(-1);
    at = at + align_workspace(weight_tiles * hidden * 4);
  }
  r.end = at.value_or(-1);
  return r;
}
}  // namespace

namespace {
// The one-pass kernel (templates/rms_norm_one_pass.cuh): 128 dot threads, element threads that own
// two column quads each, one producer warp; kOnePassStages stages of three rows (x, grad,
// residual_grad; gated, y too), then the weight row, the m row (gated: the gate row and the gate's
// sums), in dynamic shared memory.
constexpr int kOnePassStages = 4;
constexpr int64_t kOnePassMaxHidden = 6656;  // 128 + 832 + 32 threads: one block of at most 1024
// sm_90's opt-in shared memory per block (227 KB) less the kernel's static arrays (3.2 KB).
constexpr int64_t kOnePassMaxSharedBytes = 227 * 1024 - 4096;

bool one_pass_gated(const KernelSpec& spec) { return spec.op == Op::GateResidualRmsNormOnePass; }

int one_pass_element_threads(const KernelSpec& spec) { return static_cast<int>((spec.hidden / 4 + 63) / 64 * 32); }
int one_pass_block_threads(const KernelSpec& spec) { return 128 + one_pass_element_threads(spec) + 32; }

// Gated, the gate's tile sums follow in fp32: the block's 72 registers a thread hold the other sums
// but not these (ptxas spills them).
int64_t one_pass_shared_bytes(const KernelSpec& spec) {
  const int64_t elem = static_cast<int64_t>(dtype_size(spec.dtype));
  if (one_pass_gated(spec)) return ((kOnePassStages * 4 + 3) * elem + 4) * spec.hidden;
  return (kOnePassStages * 3 + 2) * elem * spec.hidden;
}

RuleBreak one_pass_rule(const KernelSpec& spec) {
  if (RuleBreak broken = rms_norm_rule(spec)) return broken;
  if (spec.dtype != DType::BF16)
    return {RuleSubject::Spec, fmt::format("the one-pass backward is for bf16 rows (got {})", dtype_name(spec.dtype))};
  if (spec.hidden % 8 != 0 || spec.hidden > kOnePassMaxHidden)
    return {RuleSubject::Sizes, fmt::format("the one-pass backward needs H a multiple of 8 (16-byte rows) and <= {} "
                                            "(got {})", kOnePassMaxHidden, spec.hidden)};
  if (one_pass_shared_bytes(spec) > kOnePassMaxSharedBytes)
    return {RuleSubject::Sizes, fmt::format("the one-pass backward's rows take {} bytes of shared memory at H = {}, "
                                            "over the {} a block may hold", one_pass_shared_bytes(spec), spec.hidden,
                                            kOnePassMaxSharedBytes)};
  // Bulk copies exist on sm_100 too, but there ptxas spills this block's 72 registers a thread.
  if (spec.target.sm != 90)
    return {RuleSubject::Spec, fmt::format("the one-pass backward is built for sm_90 (bulk copies; the target is {})",
                                           spec.target.name())};
  return {};
}

// The one-pass kernel pays a tile's whole walk on one SM, so it needs enough tiles to share the
// SMs; below that the dx kernel and the parameter tiles (every row in parallel) are faster.
bool one_pass_fills(int64_t max_tiles, const DeviceTraits& device) {
  return device.multiprocessors > 0 && max_tiles >= device.multiprocessors / 2;
}
// Whether the parameter tiles' launch of `blocks` blocks fills the device: at least four per SM.
// Below that, their walks (long chains of compensated adds) run one column a thread instead of a
// quad: more warps for the same walk (docs/perf-notes.md v13). An unknown device counts as filled.
bool tiles_fill_device(int64_t blocks, const DeviceTraits& device) {
  return device.multiprocessors <= 0 || blocks >= 4 * static_cast<int64_t>(device.multiprocessors);
}
}  // namespace

int64_t rms_norm_backward_workspace(int64_t rows, int64_t seq, int64_t table_rows, int64_t hidden, bool weighted) {
  const KernelSpec sizes = make_spec(Op::RmsNormBackward, DType::F32, IndexType::I64, hidden, 0, 4);
  if (rows < 0 || seq < 1 || rows % seq != 0 || table_rows < 0 || !size_caps_rule(sizes).empty() ||
      rms_norm_rule(sizes))
    return -1;
  return regions(rows, seq, table_rows, hidden, weighted).end;
}

int64_t rms_norm_backward_partial_tiles(int64_t rows, int64_t seq, int64_t table_rows) {
  if (rows < 0 || seq < 1 || rows % seq != 0 || table_rows < 0) return -1;
  return table_rows > 0 ? segment_layout(rows, seq, table_rows).max_tiles
                        : CheckedSize(rows).ceil_div(kTilePositions).value_or(-1);
}

llvm::Expected<LaunchSequence> plan_rms_norm_backward(const RmsNormBackwardArgs& a, const DeviceTraits& device) {
  const bool modulated = a.scale || a.index;
  if (modulated && !(a.scale && a.index)) return invalid(arg("scale"), "scale and index must be given together");
  if (!std::isfinite(a.eps) || a.eps < 0)
    return invalid(arg("eps"), fmt::format("must be finite and >= 0 (got {})", a.eps));
  if (a.dweight && !a.weight) return invalid(arg("dweight"), "needs the forward's weight");
  if ((a.dshift || a.dscale) && !modulated) return invalid(arg("dshift"), "dshift/dscale need scale and index");
  const RmsNormTilePartials* given = a.tile_partials;
  if (given) {
    if (a.dx || a.dweight || a.dshift || a.dscale || a.residual_grad || a.gate_part)
      return invalid(arg("tile_partials"), "are asked for alone: dx and the folded gradients must be null");
    if (given->weight && !a.weight) return invalid(arg("weight_partials"), "needs the forward's weight");
    if ((given->shift || given->scale) && !modulated)
      return invalid(arg(given->shift ? "shift_partials" : "scale_partials"),
                     "needs scale and index (the modulated form)");
  }
  llvm::SmallVector<NamedTensor, 16> tensors = {{"grad", &a.grad}, {"x", &a.x}, {"rstd", &a.rstd}};
  for (const auto& [name, t] : {std::pair{"weight", a.weight}, {"scale", a.scale}, {"index", a.index}, {"dx", a.dx},
                                {"dweight", a.dweight}, {"dshift", a.dshift}, {"dscale", a.dscale},
                                {"workspace", a.workspace}, {"residual_grad", a.residual_grad},
                                {"shift_partials", given ? given->shift : nullptr},
                                {"scale_partials", given ? given->scale : nullptr},
                                {"weight_partials", given ? given->weight : nullptr}})
    if (t) tensors.push_back({name, t});
  if (auto err = require_cuda_on_one_device(kOp, tensors)) return err;

  auto dtype = float_dtype(arg("x"), a.x);
  if (!dtype) return dtype.takeError();
  if (a.x.ndim < 1) return invalid(arg("x"), "must have a last dimension H");
  const int64_t hidden = a.x.shape[a.x.ndim - 1];
  if (std::string rule = cap_rule(kHiddenCap, hidden); !rule.empty()) return invalid(arg("x"), rule);
  if (auto err = require_row_rules(make_spec(Op::RmsNormBackward, *dtype, IndexType::I64, hidden, 0, 4), arg("x"),
                                   arg("scale")))
    return err;
  const size_t elem = dtype_size(*dtype);
  if (!is_contiguous(a.x) || data_address(a.x) % (4 * elem) != 0)
    return invalid(arg("x"), fmt::format("must be contiguous and aligned to 4 elements ({} bytes)", 4 * elem));
  const int64_t rows = element_count(a.x) / hidden;
  if (auto err = require_like(arg("grad"), a.grad, "x", a.x)) return err;
  if (data_address(a.grad) % (4 * elem) != 0) return invalid(arg("grad"), "must be aligned to 4 elements");
  if (a.dx) {
    if (auto err = require_like(arg("dx"), *a.dx, "x", a.x)) return err;
    if (data_address(*a.dx) % (4 * elem) != 0) return invalid(arg("dx"), "must be aligned to 4 elements");
  }
  if (a.residual_grad) {
    if (!a.dx) return invalid(arg("residual_grad"), "is added to dx, which is not asked for");
    if (auto err = require_like(arg("residual_grad"), *a.residual_grad, "x", a.x)) return err;
    if (data_address(*a.residual_grad) % (4 * elem) != 0)
      return invalid(arg("residual_grad"), "must be aligned to 4 elements");
  }
  if (a.rstd.dtype.code != kDLFloat || a.rstd.dtype.bits != 32 || a.rstd.ndim != 1 || a.rstd.shape[0] != rows ||
      !is_contiguous(a.rstd))
    return invalid(arg("rstd"), fmt::format("must be ({},) float32 contiguous, as the forward returns it", rows));
  if (a.weight) {
    if (auto err = require_dense(arg("weight"), *a.weight, {hidden}, *dtype)) return err;
    if (data_address(*a.weight) % (4 * elem) != 0) return invalid(arg("weight"), "must be aligned to 4 elements");
  }
  // The parameter gradients in x's dtype or float32, each its own (gradient_dtype).
  auto grad_dtype_of = [&](const char* name, const DLTensor* t) -> llvm::Expected<DType> {
    return t ? gradient_dtype(arg(name), *t, "x", *dtype) : *dtype;
  };
  auto dweight_dtype = grad_dtype_of("dweight", a.dweight);
  if (!dweight_dtype) return dweight_dtype.takeError();
  if (a.dweight)
    if (auto err = require_dense(arg("dweight"), *a.dweight, {hidden}, *dweight_dtype)) return err;
  auto dshift_dtype = grad_dtype_of("dshift", a.dshift);
  if (!dshift_dtype) return dshift_dtype.takeError();
  auto dscale_dtype = grad_dtype_of("dscale", a.dscale);
  if (!dscale_dtype) return dscale_dtype.takeError();

  int64_t table_rows = 0, table_stride = 0, seq = rows > 0 ? rows : 1;
  IndexType index_type = IndexType::I64;
  if (modulated) {
    auto scale_dtype = float_dtype(arg("scale"), *a.scale);
    if (!scale_dtype) return scale_dtype.takeError();
    if (*scale_dtype != *dtype) return invalid(arg("scale"), fmt::format("must have x's dtype {}", dtype_name(*dtype)));
    if (a.scale->ndim != 2 || a.scale->shape[1] != hidden || a.scale->shape[0] < 1 || stride_of(*a.scale, 1) != 1)
      return invalid(arg("scale"), fmt::format("must be (R, {}) with unit column stride (got {})", hidden,
                                               shape_string(*a.scale)));
    table_rows = a.scale->shape[0];
    table_stride = table_rows == 1 ? hidden : stride_of(*a.scale, 0);
    if (std::string rule = cap_rule(kTableStrideCap, table_stride); !rule.empty()) return invalid(arg("scale"), rule);
    if (auto err = require_row_rules(make_spec(Op::RmsNormBackward, *dtype, IndexType::I64, hidden, table_stride, 4),
                                     arg("x"), arg("scale")))
      return err;
    if (data_address(*a.scale) % (4 * elem) != 0)
      return invalid(arg("scale"), fmt::format("must be aligned to 4 elements ({} bytes)", 4 * elem));
    auto itype = index_dtype(arg("index"), *a.index);
    if (!itype) return itype.takeError();
    index_type = *itype;
    if (a.index->ndim != 1 || a.index->shape[0] < 1 || !is_contiguous(*a.index))
      return invalid(arg("index"), fmt::format("must be (S,) contiguous (got {})", shape_string(*a.index)));
    seq = a.index->shape[0];
    if (rows % seq != 0) return invalid(arg("index"), fmt::format("length S = {} must divide M = {}", seq, rows));
    if (auto err = require_plan_limits(arg("index"), seq, arg("scale"), table_rows)) return err;
    for (const auto& [name, t, t_dtype] :
         {std::tuple{"dshift", a.dshift, *dshift_dtype}, {"dscale", a.dscale, *dscale_dtype}})
      if (t)
        if (auto err = require_dense(arg(name), *t, {table_rows, hidden}, t_dtype)) return err;
  }

  const int64_t partial_tiles = rms_norm_backward_partial_tiles(rows, seq, table_rows);
  if (given)
    for (const auto& [name, t] : {std::pair{"shift_partials", given->shift}, {"scale_partials", given->scale},
                                  {"weight_partials", given->weight}})
      if (t)
        if (auto err = require_partials(arg(name), *t, hidden, partial_tiles, fmt::format("{} tiles", partial_tiles)))
          return err;

  LaunchSequence sequence;
  // Each parameter gradient's tile partials go to the workspace (then folded into the gradient) or,
  // given tile_partials, to the caller's tensors (not folded).
  const DLTensor* want_shift = given ? given->shift : a.dshift;
  const DLTensor* want_scale = given ? given->scale : a.dscale;
  const DLTensor* want_weight = given ? given->weight : a.dweight;
  const bool table_grads = want_shift || want_scale;
  if ((!a.dx && !want_weight && !table_grads) || rows == 0) return sequence;
  const Regions r = regions(rows, seq, table_rows, hidden, a.weight != nullptr);
  const bool needs_workspace = table_grads || want_weight;
  if (needs_workspace)
    if (auto err = require_workspace(arg("workspace"), a.workspace, r.end)) return err;
  // The workspace is written only for the table and weight gradients.
  if (auto err = require_disjoint_outputs(
          kOp, tensors,
          needs_workspace ? llvm::ArrayRef<std::string_view>({"dx", "dweight", "dshift", "dscale", "workspace",
                                                              "shift_partials", "scale_partials", "weight_partials"})
                          : llvm::ArrayRef<std::string_view>({"dx", "dweight", "dshift", "dscale"})))
    return err;

  const uint64_t ws = needs_workspace ? data_address(*a.workspace) : 0;
  const uint64_t weight = a.weight ? data_address(*a.weight) : 0;
  const uint64_t scale = modulated ? data_address(*a.scale) : 0;
  const uint64_t index = modulated ? data_address(*a.index) : 0;
  // Modulated, every parameter gradient is a sum over the table rows' lists: one plan, one pass.
  const bool plan_sums = table_grads || (modulated && want_weight);
  const int device_id = a.x.device.device_id;
  if (plan_sums)
    add_plan_launches(sequence, r.layout, ws, device_id, index_type, index, 0, table_rows, Op::RmsNormBackward);
  auto at_or_null = [&](const DLTensor* wanted, int64_t offset) -> uint64_t {
    if (!wanted) return 0;
    return given ? data_address(*wanted) : ws + offset;
  };
  // dx and the tile partials in one pass where the device and the call allow it (same bits).
  // The cheap tests first: the rule formats its message when broken.
  KernelSpec one_pass = make_spec(Op::RmsNormOnePass, *dtype, IndexType::I64, hidden, 0, 4, a.weight != nullptr);
  auto builds_on_device = [&](KernelSpec spec) {
    spec.target.sm = device.sm;  // the plan's spec leaves the target to the runtime
    return !one_pass_rule(spec);
  };
  const bool rows_by_bulk_copy = data_address(a.x) % 16 == 0 && data_address(a.grad) % 16 == 0 &&
                                 (!a.residual_grad || data_address(*a.residual_grad) % 16 == 0);
  const bool in_one_pass = plan_sums && a.dx && rows_by_bulk_copy && one_pass_fills(r.layout.max_tiles, device) &&
                           builds_on_device(one_pass);
  // The gate part: y by bulk copies, the gate row and d_y by quads, the gate's rows the plan's.
  const OnePassGate* gate = a.gate_part;
  const int64_t gate_stride = !gate || gate->gate.ndim != 2 ? 0
                              : gate->gate.shape[0] == 1 ? hidden
                                                         : stride_of(gate->gate, 0);
  if (in_one_pass && gate && data_address(gate->y) % 16 == 0 && data_address(gate->gate) % (4 * elem) == 0 &&
      gate_stride % 4 == 0 && data_address(gate->d_y) % (4 * elem) == 0 && gate->gate.shape[0] == table_rows) {
    KernelSpec gated = one_pass;
    gated.op = Op::GateResidualRmsNormOnePass;
    if (builds_on_device(gated)) one_pass = gated;
  }
  if (in_one_pass) {
    LaunchPlan& pass = sequence.add(one_pass, device_id, static_cast<uint32_t>(r.layout.max_tiles),
                                    static_cast<uint32_t>(one_pass_block_threads(one_pass)));
    pass.shared_bytes = static_cast<uint32_t>(one_pass_shared_bytes(one_pass));
    const bool gated = one_pass_gated(one_pass);
    for (uint64_t v : {data_address(a.grad), a.residual_grad ? data_address(*a.residual_grad) : 0, data_address(a.x),
                       weight, scale, data_address(a.rstd), data_address(*a.dx), at_or_null(a.dshift, r.shift_partials),
                       at_or_null(a.dscale, r.scale_partials), at_or_null(a.dweight, r.weight_partials),
                       gated ? data_address(gate->y) : 0, gated ? data_address(gate->gate) : 0,
                       gated ? data_address(gate->d_y) : 0, gated ? gate->partials : 0,
                       static_cast<uint64_t>(table_stride), static_cast<uint64_t>(gated ? gate_stride : 0)})
      pass.push(v);
    push_plan_params(pass, r.layout, ws);
  } else if (a.dx) {
    const KernelSpec spec = make_spec(Op::RmsNormBackward, *dtype, modulated ? index_type : IndexType::I64, hidden,
                                      table_stride, 4, a.weight != nullptr);
    if (rows > INT_MAX) return invalid(arg("x"), fmt::format("has too many rows ({}) for one launch", rows));
    const int64_t rows_per_block = codegen::rms_norm_rows_per_block(hidden);
    LaunchPlan& dx = sequence.add(spec, device_id, static_cast<uint32_t>((rows + rows_per_block - 1) / rows_per_block),
                                  codegen::backward_threads(spec));
    for (uint64_t v : {data_address(a.grad), a.residual_grad ? data_address(*a.residual_grad) : 0, data_address(a.x),
                       weight, scale, index, data_address(a.rstd)})
      dx.push(v);
    dx.push_double(a.eps);  // fp32 dx recomputes rstd (in fp64) instead of reading the forward's
    for (uint64_t v : {data_address(*a.dx), static_cast<uint64_t>(rows), static_cast<uint64_t>(seq),
                       static_cast<uint64_t>(table_rows)})
      dx.push(v);
  }
  // A tiles kernel: grad, x, weight, scale, rstd, three partials pointers, the scale rows' stride.
  // Quads where the launch fills the device, else one column a thread (same sums, more threads).
  auto add_tiles = [&](OpCode op, int64_t grid, std::initializer_list<uint64_t> params) -> LaunchPlan& {
    KernelSpec spec = make_spec(op, *dtype, IndexType::I64, hidden, 0, 4, op == Op::RmsNormTableGrad && a.weight);
    if (!tiles_fill_device(grid * codegen::column_slices(spec), device)) spec.vec = 1;
    LaunchPlan& tiles = sequence.add(spec, device_id, static_cast<uint32_t>(grid), codegen::backward_threads(spec));
    tiles.grid_y = static_cast<uint32_t>(codegen::column_slices(spec));
    for (uint64_t v : params) tiles.push(v);
    return tiles;
  };
  if (plan_sums) {
    if (!in_one_pass) {
      // One block per plan tile; the scale rows (row stride table_stride) give dweight's d_n.
      LaunchPlan& tiles = add_tiles(Op::RmsNormTableGrad, r.layout.max_tiles,
                                    {data_address(a.grad), data_address(a.x), weight, scale, data_address(a.rstd),
                                     at_or_null(want_shift, r.shift_partials), at_or_null(want_scale, r.scale_partials),
                                     at_or_null(want_weight, r.weight_partials), static_cast<uint64_t>(table_stride)});
      push_plan_params(tiles, r.layout, ws);
    }
    if (given) return sequence;
    for (const auto& [out, offset, out_dtype] :
         {std::tuple{a.dshift, r.shift_partials, *dshift_dtype}, {a.dscale, r.scale_partials, *dscale_dtype}})
      if (out)
        add_fold_launch(sequence, &r.layout, ws, device_id, out_dtype, ws + offset, r.layout.max_tiles, hidden,
                        data_address(*out));
    if (a.dweight)
      add_fold_launch(sequence, &r.layout, ws, device_id, *dweight_dtype, ws + r.weight_partials, r.layout.max_tiles,
                      hidden, data_address(*a.dweight), /*whole_table=*/true);
    if (one_pass_gated(one_pass))
      add_fold_launch(sequence, &r.layout, ws, device_id, gate->d_gate_dtype, gate->partials, r.layout.max_tiles,
                      hidden, data_address(gate->d_gate));
  } else if (want_weight) {
    if (r.weight_tiles > INT_MAX) return invalid(arg("x"), "has too many rows");
    LaunchPlan& tiles = add_tiles(Op::RmsNormWeightGrad, r.weight_tiles,
                                  {data_address(a.grad), data_address(a.x), 0, 0, data_address(a.rstd),
                                   at_or_null(want_weight, r.weight_partials), 0, 0, 0});
    for (int k = 0; k < 5; ++k) tiles.push(0);  // no plan: tiles of consecutive rows
    tiles.push(static_cast<uint64_t>(seq));
    tiles.push(static_cast<uint64_t>(rows / seq));
    if (given) return sequence;
    add_fold_launch(sequence, nullptr, ws, device_id, *dweight_dtype, ws + r.weight_partials, r.weight_tiles, hidden,
                    data_address(*a.dweight));
  }
  return sequence;
}

std::vector<std::string_view> rms_norm_dx_templates(const KernelSpec&) {
  return {"quad_io.cuh",  "fixed_order_sum.cuh",    "row_sum.cuh",
          "row_slot.cuh", "rms_norm_grad_math.cuh", "rms_norm_backward.cuh"};
}

std::string rms_norm_dx_constants(const KernelSpec& spec, bool residual_grad) {
  return render_backward_constants(spec) + fmt::format("constexpr bool kResidualGrad = {};\n"
                                                       "constexpr int kRowThreads = {};  // threads per row\n",
                                                       residual_grad, codegen::rms_norm_row_threads(spec.hidden));
}

namespace {
std::vector<std::string_view> param_grad_templates(const KernelSpec&) {
  return {"quad_io.cuh", "fixed_order_sum.cuh", "segment_tiles.cuh", "rms_norm_grad_math.cuh",
          "rms_norm_param_grad.cuh"};
}
// dx, of the norm alone (gate_residual_rms_norm's backward adds the residual gradient).
std::string dx_constants(const KernelSpec& spec) { return rms_norm_dx_constants(spec, false); }
// dx: both index types where modulated, weighted and unweighted.
std::vector<KernelSpec> dx_family(const KernelSpec& sizes) {
  std::vector<KernelSpec> specs;
  for (IndexType index : index_types_for(sizes.table_stride))
    for (bool weighted : {true, false})
      specs.push_back(
          make_spec(Op::RmsNormBackward, sizes.dtype, index, sizes.hidden, sizes.table_stride, 4, weighted));
  return specs;
}
// dshift/dscale/dweight over segment tiles of table rows: the table stride is not the kernel's.
// Quads, and one column a thread for launches that do not fill the device.
std::vector<KernelSpec> table_grad_family(const KernelSpec& sizes) {
  std::vector<KernelSpec> specs;
  for (int vec : {4, 1})
    for (bool weighted : {true, false})
      specs.push_back(make_spec(Op::RmsNormTableGrad, sizes.dtype, IndexType::I64, sizes.hidden, 0, vec, weighted));
  return specs;
}
// dweight of the plain form (modulated, the table-grad tiles add it).
std::vector<KernelSpec> weight_grad_family(const KernelSpec& sizes) {
  return {make_spec(Op::RmsNormWeightGrad, sizes.dtype, IndexType::I64, sizes.hidden, 0, 4),
          make_spec(Op::RmsNormWeightGrad, sizes.dtype, IndexType::I64, sizes.hidden, 0, 1)};
}
// rms_norm's row rules, with a quad or one column a thread.
RuleBreak param_grad_rule(const KernelSpec& spec) {
  KernelSpec quads = spec;
  quads.vec = 4;
  if (RuleBreak broken = rms_norm_rule(quads)) return broken;
  if (spec.vec != 4 && spec.vec != 1)
    return {RuleSubject::Spec, fmt::format("parameter-gradient tiles own a quad or one column a thread (vec=4 or 1, "
                                           "got {})", spec.vec)};
  return {};
}
}  // namespace

const OpRow kRmsNormBackwardRow = {
    Op::RmsNormBackward, "rms_norm_backward", OpRole::Backward, "rms_norm",
    SpecShape::Rows, /*describes_weight=*/false, /*row_chunks=*/1, /*threads=*/128, /*row_unroll=*/1,
    {"index", "index"}, ErrorValue::Index, /*value_rule=*/"",
    rms_norm_dx_templates, dx_constants, rms_norm_rule,
    dx_family, [](DType dtype) { return h3_strides(Op::RmsNormBackward, dtype, {0, 6, 2}); }};
// The parameter tiles keep row_unroll 4: 16 cost more at large S (160 registers, fewer blocks per
// SM) than they gained at small S (docs/perf-notes.md, backward v3).
const OpRow kRmsNormTableGradRow = {
    Op::RmsNormTableGrad, "rms_norm_table_grad", OpRole::Backward, "rms_norm",
    SpecShape::Rows, /*describes_weight=*/false, /*row_chunks=*/1, /*threads=*/128, /*row_unroll=*/4,
    {"index", "index"}, ErrorValue::Index, /*value_rule=*/"",
    param_grad_templates, render_table_grad_constants, param_grad_rule,
    table_grad_family, [](DType dtype) { return h3_strides(Op::RmsNormTableGrad, dtype, {0}); }};
// The plain dweight tiles load 8 rows at a time: at S = 4097 their 256-row walk is latency-bound
// (docs/perf-notes.md, v10), and one accumulator per column leaves the registers for it.
const OpRow kRmsNormWeightGradRow = {
    Op::RmsNormWeightGrad, "rms_norm_weight_grad", OpRole::Backward, "rms_norm",
    SpecShape::Rows, /*describes_weight=*/false, /*row_chunks=*/1, /*threads=*/128, /*row_unroll=*/8,
    {"index", "index"}, ErrorValue::Index, /*value_rule=*/"",
    param_grad_templates, render_backward_constants, param_grad_rule,
    weight_grad_family, [](DType dtype) { return h3_strides(Op::RmsNormWeightGrad, dtype, {0}); }};

namespace {
std::vector<std::string_view> one_pass_templates(const KernelSpec&) {
  return {"quad_io.cuh",     "fixed_order_sum.cuh",    "row_sum.cuh",
          "segment_tiles.cuh", "bulk_copy.cuh", "rms_norm_grad_math.cuh", "rms_norm_one_pass.cuh"};
}
// Its partials take the table-grad tiles' groups of rows, so the two give the same bits.
std::string one_pass_constants(const KernelSpec& spec) {
  return codegen::render_spec_constants(spec) +
         fmt::format("constexpr bool kWeighted = {weighted};\n"
                     "constexpr bool kGated = {gated};  // gate_residual_rms_norm: the gate's gradients too\n"
                     "constexpr long long kTilePositions = {tile};\n"
                     "constexpr int kRowUnroll = {unroll};  // dweight's groups of rows (the table-grad tiles')\n"
                     "constexpr int kElementThreads = {elements};  // threads that own column quads\n"
                     "constexpr int kStages = {stages};  // rows in flight\n"
                     "constexpr int kTargetArch = {arch};\n",
                     fmt::arg("weighted", spec.weighted ? "true" : "false"),
                     fmt::arg("gated", one_pass_gated(spec) ? "true" : "false"), fmt::arg("tile", kTilePositions),
                     fmt::arg("unroll", kRmsNormTableGradRow.row_unroll),
                     fmt::arg("elements", one_pass_element_threads(spec)), fmt::arg("stages", kOnePassStages),
                     fmt::arg("arch", spec.target.sm));
}
std::vector<KernelSpec> one_pass_family_of(OpCode op, const KernelSpec& sizes) {
  if (sizes.dtype != DType::BF16) return {};
  return {make_spec(op, sizes.dtype, IndexType::I64, sizes.hidden, 0, 4, true),
          make_spec(op, sizes.dtype, IndexType::I64, sizes.hidden, 0, 4, false)};
}
std::vector<KernelSpec> one_pass_family(const KernelSpec& sizes) {
  return one_pass_family_of(Op::RmsNormOnePass, sizes);
}
std::vector<KernelSpec> gated_one_pass_family(const KernelSpec& sizes) {
  return one_pass_family_of(Op::GateResidualRmsNormOnePass, sizes);
}
}  // namespace

// Built for sm_90 only: the catalog of another target leaves it out.
const OpRow kRmsNormOnePassRow = {
    Op::RmsNormOnePass, "rms_norm_one_pass", OpRole::Backward, "rms_norm",
    SpecShape::Rows, /*describes_weight=*/false, /*row_chunks=*/1, /*threads=*/0, /*row_unroll=*/1,
    {"index", "index"}, ErrorValue::Index, /*value_rule=*/"",
    one_pass_templates, one_pass_constants, one_pass_rule,
    one_pass_family, [](DType dtype) { return h3_strides(Op::RmsNormOnePass, dtype, {0}); }};
// The same kernel forming gate_residual_rms_norm's gate gradients as well (kGated).
const OpRow kGateResidualRmsNormOnePassRow = {
    Op::GateResidualRmsNormOnePass, "gate_residual_rms_norm_one_pass", OpRole::Backward, "gate_residual_rms_norm",
    SpecShape::Rows, /*describes_weight=*/false, /*row_chunks=*/1, /*threads=*/0, /*row_unroll=*/1,
    {"index", "index"}, ErrorValue::Index, /*value_rule=*/"",
    one_pass_templates, one_pass_constants, one_pass_rule,
    gated_one_pass_family, [](DType dtype) { return h3_strides(Op::GateResidualRmsNormOnePass, dtype, {0}); }};

}  // namespace exactjit

extern "C" long long xj_rms_norm_backward_workspace_bytes(long long rows, long long seq, long long table_rows,
                                                          long long hidden, int weighted) {
  return exactjit::rms_norm_backward_workspace(rows, seq, table_rows, hidden, weighted != 0);
}

extern "C" exactjit_status_t xj_rms_norm_backward(xj_runtime* runtime, const DLTensor* grad, const DLTensor* x,
                                                  const DLTensor* weight, const DLTensor* scale, const DLTensor* index,
                                                  const DLTensor* rstd, double eps, const DLTensor* dx,
                                                  const DLTensor* dweight, const DLTensor* dshift,
                                                  const DLTensor* dscale, const DLTensor* workspace, void* stream) {
  return exactjit::c_abi::call_op(
      runtime, "rms_norm_backward", {{"grad", grad}, {"x", x}, {"rstd", rstd}}, [&](exactjit::Runtime& r) {
        return r.launch(exactjit::plan_rms_norm_backward(
                            {*grad, *x, weight, scale, index, *rstd, eps, dx, dweight, dshift, dscale, workspace},
                            r.traits(x->device)),
                        stream);
      });
}

extern "C" long long xj_rms_norm_backward_partial_tiles(long long rows, long long seq, long long table_rows) {
  return exactjit::rms_norm_backward_partial_tiles(rows, seq, table_rows);
}

extern "C" exactjit_status_t xj_rms_norm_backward_tile_partials(
    xj_runtime* runtime, const DLTensor* grad, const DLTensor* x, const DLTensor* weight, const DLTensor* scale,
    const DLTensor* index, const DLTensor* rstd, const DLTensor* shift_partials, const DLTensor* scale_partials,
    const DLTensor* weight_partials, const DLTensor* workspace, void* stream) {
  return exactjit::c_abi::call_op(
      runtime, "rms_norm_backward", {{"grad", grad}, {"x", x}, {"rstd", rstd}}, [&](exactjit::Runtime& r) {
        const exactjit::RmsNormTilePartials partials{shift_partials, scale_partials, weight_partials};
        exactjit::RmsNormBackwardArgs args{*grad,   *x,      weight,  scale,   index,     *rstd, 0.0,
                                           nullptr, nullptr, nullptr, nullptr, workspace};
        args.tile_partials = &partials;
        return r.launch(exactjit::plan_rms_norm_backward(args, r.traits(x->device)), stream);
      });
}
