// exactjit command line: one function per subcommand, plus what they share.
#pragma once

#include "codegen/kernel_spec.hpp"
#include "runtime/environment.hpp"

#include <llvm/Support/Error.h>

#include <vector>

namespace exactjit::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;  ///< the command ran and something failed (or no GPU)
inline constexpr int kExitUsage = 2;   ///< bad flags or arguments

/// The environment's cache configuration, with --cache-dir applied (main() has refused a
/// malformed environment before any command runs).
CacheConfig cache_config();

/// The targets of --arch (a comma-separated list, each once); without it the first GPU's
/// architecture, or sm_90 without a GPU.
llvm::Expected<std::vector<Target>> targets_from_flags();

/// The specs the spec flags (or --manifest, or nothing: the default catalog) describe, for every
/// target of --arch. With `single`, exactly one spec (inspect). Errors are usage errors.
llvm::Expected<std::vector<KernelSpec>> specs_from_flags(bool single);

/// Prints an error (with --json also as the command's JSON object); returns kExitUsage for
/// invalid arguments, else kExitFailed.
int report_error(llvm::Error error);

int run_prewarm();
int run_inspect();
int run_cache();
int run_info();
int run_selftest();
int run_bench();

}  // namespace exactjit::cli
