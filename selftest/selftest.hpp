// exactjit self-test: every catalog op run on a GPU against its host model, bit for bit, plus the
// bad-index path. Used by `exactjit selftest` and by the GPU tests.
#pragma once

#include "codegen/kernel_spec.hpp"
#include "api/runtime.hpp"

#include <llvm/Support/Error.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace exactjit {

/// How a backward case is planned: as for an unknown device (the tile kernels in packs and quads),
/// as for a device that one plan tile fills (the one-pass kernel wherever it applies: modulated
/// bf16 on sm_90, whatever S is), or as for one that no launch fills (one column a thread in the
/// parameter tiles). Each path must give the host model's bits.
enum class TilePath { Unknown, OnePass, Narrow };
/// The device traits that plan `path` on a device of architecture `sm`.
DeviceTraits planned_traits(TilePath path, int sm);

struct GateResidualCase {
  DType dtype = DType::BF16;
  IndexType index = IndexType::I64;
  int64_t hidden = 5376;
  int64_t table_stride = 6 * 5376;  ///< row stride of the gate view (elements)
  int64_t table_rows = 9;
  int64_t seq = 7;
  int64_t batch = 2;
  bool misaligned = false;     ///< offset the activations by one element: forces the scalar path
  bool fp32_table_grad = false;  ///< backward: d_gate in float32
  int64_t bad_position = -1;   ///< >= 0: index[bad_position] is set out of range
  uint64_t seed = 1;
  std::string name() const;
};

struct CaseOutcome {
  Status launch;           ///< what the op call returned
  Status sync;             ///< what Runtime::synchronize returned afterwards
  int64_t mismatches = 0;  ///< elements whose bits differ from the host model (rows it wrote)
  int64_t first_mismatch = -1;
  bool passed = false;     ///< bitwise equal and, for a bad index, the error was reported
  std::string detail;
};

/// Runs one case on `device_id` through `runtime`; errors here are harness failures (no driver,
/// out of memory), not op failures, which land in the outcome.
llvm::Expected<CaseOutcome> run_gate_residual_case(Runtime& runtime, int device_id, const GateResidualCase& c);

struct AdalnRowGatherCase {
  DType dtype = DType::BF16;
  IndexType index = IndexType::I64;
  int64_t hidden = 5376;
  int64_t timesteps = 3;
  int64_t table_stride = 6 * 5376;  ///< row stride of the (3T, 6H) rows view (elements)
  int64_t seq = 7;
  bool misaligned = false;       ///< offset rows and out by one element: forces the scalar path
  int64_t bad_timestep = -1;     ///< >= 0: timestep_indices[bad_timestep] = T (out of range)
  int64_t bad_tag = -1;          ///< >= 0: token_tags[bad_tag] = 3
  uint64_t seed = 1;
  std::string name() const;
};

llvm::Expected<CaseOutcome> run_adaln_row_gather_case(Runtime& runtime, int device_id, const AdalnRowGatherCase& c);

struct RmsNormCase {
  DType dtype = DType::BF16;
  IndexType index = IndexType::I64;
  int64_t hidden = 5376;
  int64_t table_stride = 0;  ///< 0: plain; else shift/scale are chunks 0 and 1 of (R, stride) rows
  int64_t table_rows = 9;
  bool weighted = true;
  int64_t seq = 7;
  int64_t batch = 2;
  int64_t bad_position = -1;  ///< >= 0 (modulated only): index[bad_position] is out of range
  bool fp32_param_grads = false;  ///< backward: dweight, dshift and dscale in float32
  TilePath path = TilePath::Unknown;  ///< backward only
  uint64_t seed = 1;
  std::string name() const;
};

/// rms_norm against the host model: the device's rstd must lie within 4 ulp of 1/sqrt of the
/// model's rsqrt argument (the host cannot run the GPU's rsqrt.approx), and every output must
/// equal the model's output for that rstd, bit for bit.
llvm::Expected<CaseOutcome> run_rms_norm_case(Runtime& runtime, int device_id, const RmsNormCase& c);

/// Backward passes on the same cases: every gradient against its host model bit for bit
/// (kernels/backward_model.hpp), twice, and both runs equal. A planted bad index must be reported
/// by synchronize() naming the backward op.
llvm::Expected<CaseOutcome> run_gate_residual_backward_case(Runtime& runtime, int device_id, const GateResidualCase& c);
llvm::Expected<CaseOutcome> run_rms_norm_backward_case(Runtime& runtime, int device_id, const RmsNormCase& c);
llvm::Expected<CaseOutcome> run_adaln_row_gather_backward_case(Runtime& runtime, int device_id,
                                                               const AdalnRowGatherCase& c);

struct SelftestLine {
  std::string name;
  bool passed = false;
  std::string detail;
};

/// The whole self-test: every default-catalog family, both index types, 16-byte and scalar
/// paths, several S and B, then a bad index followed by a good call. `progress` sees each line.
llvm::Expected<std::vector<SelftestLine>> run_selftest(Runtime& runtime, int device_id,
                                                       const std::function<void(const SelftestLine&)>& progress);

}  // namespace exactjit
