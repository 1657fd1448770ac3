// exactjit compile policy (see nvrtc_options.hpp).
#include "codegen/nvrtc_options.hpp"

namespace exactjit::codegen {

std::vector<std::string> nvrtc_options(const Target& target) {
  return {
      "--gpu-architecture=" + target.name(),
      "--std=c++17",
      "--fmad=false",
      "--prec-div=true",
      "--prec-sqrt=true",
      "--ftz=false",
  };
}

}  // namespace exactjit::codegen
