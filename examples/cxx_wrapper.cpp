// exactjit from C++ through the header-only wrapper, without a GPU: the same as c_abi.c, with the
// runtime as an RAII object and the offline miss as an xj::Error. Run it with EXACTJIT_OFFLINE=1
// and an empty EXACTJIT_CACHE_DIR; it exits 0 when the error is the offline miss.
#include <exactjit/exactjit.hpp>

#include <iostream>

int main() {
  const char* const spec = "gate_residual dtype=bf16 hidden=5376 table_stride=32256 vec=8 index=int64 target=sm_90";
  std::cout << "exactjit " << xj::version() << " (header " << XJ_VERSION_MAJOR << "." << XJ_VERSION_MINOR << "."
            << XJ_VERSION_PATCH << ")\n";
  try {
    xj::Runtime runtime;  // every option from the environment
    std::cout << runtime.info();
    runtime.prewarm(spec);
    std::cout << "prewarm: found " << spec << "\n";
    return 1;
  } catch (const xj::Error& error) {
    std::cout << "prewarm: status " << error.code() << ": " << error.what() << "\n";
    return error.code() == XJ_ERROR_OFFLINE_MISS ? 0 : 1;
  }
}
