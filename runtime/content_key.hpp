// exactjit cache keys.
//
// The source key names a kernel without naming a compiler: SHA-256 over the generator version,
// the full source text, the canonical options and the target. A process can compute it without
// loading NVRTC, which is what lets a pre-warmed cache be used where NVRTC is never loaded.
// The content key names one compiled entry: SHA-256 over the source key and the compiler identity
// (NVRTC version and build fingerprint). Two different content keys never share a file.
#pragma once

#include "codegen/kernel_source.hpp"

#include <llvm/ADT/StringRef.h>

#include <string>

namespace exactjit {

std::string source_key(const KernelSource& source);
std::string content_key(llvm::StringRef source_key, llvm::StringRef compiler_tag);

}  // namespace exactjit
