// exactjit kernel source: what codegen hands to the runtime — one self-contained CUDA file, the
// name of its entry point and the canonical NVRTC options it must be compiled with.
#pragma once

#include "codegen/kernel_spec.hpp"

#include <string>
#include <vector>

namespace exactjit {

struct KernelSource {
  KernelSpec spec;
  std::string entry;                 ///< extern "C" entry point, a valid identifier
  std::string text;                  ///< the whole translation unit; includes no header
  std::vector<std::string> options;  ///< canonical NVRTC options, in order
};

}  // namespace exactjit
