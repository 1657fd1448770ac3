// exactjit codegen entry point: KernelSpec -> KernelSource (text, entry name, options).
//
// Rendering is a pure function of the spec and the generator version: the same spec always gives
// the same bytes, which the cache key relies on.
#pragma once

#include "codegen/kernel_source.hpp"

#include <string_view>
#include <vector>

namespace exactjit::codegen {

/// Bumped whenever the generated text of any kernel changes meaning; part of every cache key.
inline constexpr std::string_view kGeneratorVersion = "exactjit-codegen-5";

KernelSource render(const KernelSpec& spec);

/// The readable, unique entry-point name: <stem>_<8 hex of SHA-256(generator, spec)>.
std::string entry_name(const KernelSpec& spec);

/// The constants every spec has (op code, dtype, index width), then its shape's sizes: H, table
/// stride and vector width (SpecShape::Rows) or the key tensors (SpecShape::Plan).
std::string render_spec_constants(const KernelSpec& spec);

/// The constant block of the row-wise ops (gate_residual, adaln_row_gather).
std::string render_row_constants(const KernelSpec& spec);

/// rms_norm: how many per-element parameter quads are loaded together (templates/rms_norm.cuh;
/// measured in bench/tune_rms_norm) and its constant block (rows per block: codegen/geometry.hpp).
inline constexpr int kRmsNormParamBatch = 12;
std::string render_rms_norm_constants(const KernelSpec& spec);
/// The same block for a kernel that normalises rows it forms itself (gate_residual_rms_norm),
/// whose modulation is spec.modulated and whose table stride is the gate's.
std::string render_row_norm_constants(const KernelSpec& spec);

/// timestep_sinusoid and its backward: the channel count is their only specialisation.
std::string render_sinusoid_constants(const KernelSpec& spec);

}  // namespace exactjit::codegen
