// exactjit NVRTC compiler: libnvrtc loaded with dlopen on first use (never at start-up), the
// compiler's identity for cache keys, and compile-to-cubin / compile-to-PTX.
//
// A process that finds every kernel in the cache never loads NVRTC: Nvrtc::loaded() proves it.
#pragma once

#include "codegen/kernel_source.hpp"

#include <llvm/Support/Error.h>

#include <string>
#include <vector>

namespace exactjit {

struct CompilerIdentity {
  int major = 0;
  int minor = 0;
  std::string library_path;  ///< the resolved file that was loaded
  uint64_t library_size = 0;
  /// "nvrtc-13.0-<8 hex>": version plus a fingerprint of the library file (path name and size),
  /// so two builds of one version never share a cache entry.
  std::string tag() const;
};

struct CompileOutput {
  std::string image;  ///< cubin bytes, or PTX text when the target is virtual
  bool is_ptx = false;
  std::string log;  ///< NVRTC's log (warnings), possibly empty
  double seconds = 0;
};

class Nvrtc {
 public:
  /// Loads libnvrtc once per process (EXACTJIT_NVRTC_LIBRARY, then the loader's search path,
  /// then $CUDA_HOME/lib64 and /usr/local/cuda/lib64). Thread-safe.
  static llvm::Expected<const Nvrtc*> get();
  /// Whether this process has loaded NVRTC (without loading it).
  static bool loaded();

  const CompilerIdentity& identity() const { return identity_; }
  /// Real architectures NVRTC can emit cubins for (e.g. 75 ... 121).
  const std::vector<int>& supported_archs() const { return archs_; }

  /// Compiles source.text with source.options; the target inside source.spec decides cubin/PTX.
  /// A failure carries the NVRTC log, the options and the spec.
  llvm::Expected<CompileOutput> compile(const KernelSource& source) const;
  /// The PTX of the same source for compute_<sm> (the audit surface).
  llvm::Expected<std::string> ptx(const KernelSource& source) const;

  struct Api;  // the dlopened entry points (nvrtc.cpp)

 private:
  Nvrtc() = default;
  llvm::Expected<CompileOutput> run(const KernelSource& source, const std::vector<std::string>& options,
                                    bool want_ptx) const;
  const Api* api_ = nullptr;
  CompilerIdentity identity_;
  std::vector<int> archs_;
};

}  // namespace exactjit
