// Reading files exactjit does not trust (cache entries, prewarm manifests) with the limits the
// underlying readers lack: a size cap checked before a byte is read, regular files only (a FIFO
// would block a reader forever), and for JSON a nesting-depth cap (LLVM's parser recurses once per
// level, so a deep file overflows the stack) and no duplicate keys (LLVM's parser keeps the last).
#pragma once

#include <llvm/Support/Error.h>
#include <llvm/Support/JSON.h>

#include <cstdint>
#include <string>

namespace exactjit {

inline constexpr int kMaxJsonDepth = 64;

/// The whole of `file`, refused (ErrorCode::Io, naming the file) when missing, not a regular file
/// or larger than `max_bytes`. Any other failure to open or read it keeps the operating system's
/// error code (EACCES, EMFILE, EIO...): a reader can tell a bad file from a failed read.
llvm::Expected<std::string> read_bounded_file(const std::string& file, uint64_t max_bytes);

/// True when `error` is a failed read rather than a bad file (see read_bounded_file); consumes
/// nothing: it only looks at the error's code.
bool is_transient_read_error(const std::error_code& code);

/// JSON text of `what` (a file name, for messages), refused (ErrorCode::Io) when it nests deeper
/// than kMaxJsonDepth, repeats a key in one object, or does not parse.
llvm::Expected<llvm::json::Value> parse_bounded_json(llvm::StringRef text, llvm::StringRef what);

}  // namespace exactjit
