// exactjit error codes: every failure the library reports carries one of these codes (as the
// std::error_code of an llvm::StringError) plus a message that names the argument, path or spec
// involved. The C ABI and the Python binding map the codes one to one.
#pragma once

#include <llvm/Support/Error.h>

#include <string>
#include <system_error>

namespace exactjit {

enum class ErrorCode {
  InvalidArgument = 1,  ///< a caller's tensor, shape, dtype or flag breaks a rule
  CompileFailed = 2,    ///< NVRTC rejected the generated source
  OfflineMiss = 3,      ///< EXACTJIT_OFFLINE is set and the kernel is in no cache
  Cuda = 4,             ///< a CUDA driver call failed
  BadIndex = 5,         ///< a kernel found an index out of range
  Unavailable = 6,      ///< NVRTC or the CUDA driver could not be loaded
  Io = 7,               ///< the cache directory could not be read or written
  Internal = 8,
};

const std::error_category& exactjit_category();
inline std::error_code make_error_code(ErrorCode code) {
  return {static_cast<int>(code), exactjit_category()};
}

/// An llvm::Error with one of our codes and a formatted message.
llvm::Error make_error(ErrorCode code, std::string message);

struct ErrorReport {
  ErrorCode code = ErrorCode::Internal;
  std::string message;
};

/// Consumes an error: its code (Internal for errors not made by make_error) and its message.
ErrorReport take_error(llvm::Error error);

}  // namespace exactjit

namespace std {
template <> struct is_error_code_enum<exactjit::ErrorCode> : true_type {};
}  // namespace std
