// exactjit compile policy: the canonical NVRTC option list. Exact math is not negotiable: every
// kernel is compiled with --fmad=false --prec-div=true --prec-sqrt=true --ftz=false and never with
// fast math, so the only FMAs in the PTX are the fmaf calls the templates write.
#pragma once

#include "codegen/kernel_spec.hpp"

#include <string>
#include <vector>

namespace exactjit::codegen {

std::vector<std::string> nvrtc_options(const Target& target);

}  // namespace exactjit::codegen
