// Bounded reads of untrusted files (see bounded_input.hpp).
#include "runtime/bounded_input.hpp"

#include "runtime/errors.hpp"

#include <fmt/format.h>
#include <llvm/Support/FileSystem.h>
#include <llvm/ADT/ScopeExit.h>
#include <llvm/Support/MemoryBuffer.h>

#include <set>
#include <vector>

namespace exactjit {
namespace fs = llvm::sys::fs;

namespace {

llvm::Error os_error(std::error_code code, const std::string& file) {
  return llvm::createStringError(code, "cannot read %s: %s", file.c_str(), code.message().c_str());
}

// Depth and duplicate keys of JSON text, before the real parser sees it. Lenient about everything
// else: malformed text is left for the parser to refuse. Keys are compared as written (escapes
// not decoded).
llvm::Error check_json_shape(llvm::StringRef text, llvm::StringRef what) {
  struct Frame {
    bool object;
    bool expect_key;
    std::set<std::string> keys;
  };
  std::vector<Frame> stack;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '"') {
      const size_t start = ++i;
      while (i < text.size() && text[i] != '"') i += text[i] == '\\' ? 2 : 1;
      if (i >= text.size()) return llvm::Error::success();  // unterminated: the parser says so
      if (!stack.empty() && stack.back().object && stack.back().expect_key) {
        stack.back().expect_key = false;
        const std::string key = text.substr(start, i - start).str();
        if (!stack.back().keys.insert(key).second)
          return make_error(ErrorCode::Io, fmt::format("{} repeats the key \"{}\" in one object", what, key));
      }
    } else if (c == '{' || c == '[') {
      if (stack.size() >= static_cast<size_t>(kMaxJsonDepth))
        return make_error(ErrorCode::Io, fmt::format("{} nests deeper than {} levels", what, kMaxJsonDepth));
      stack.push_back({c == '{', c == '{', {}});
    } else if (c == '}' || c == ']') {
      if (!stack.empty()) stack.pop_back();
    } else if (c == ',' && !stack.empty() && stack.back().object) {
      stack.back().expect_key = true;
    }
  }
  return llvm::Error::success();
}

}  // namespace

bool is_transient_read_error(const std::error_code& code) {
  return code.category() != exactjit_category() && code != std::errc::no_such_file_or_directory;
}

llvm::Expected<std::string> read_bounded_file(const std::string& file, uint64_t max_bytes) {
  // The type is checked before opening (opening a FIFO for reading blocks until a writer comes)
  // and the size again on the open descriptor, which is then read for exactly that many bytes.
  fs::file_status st;
  if (std::error_code ec = fs::status(file, st)) {
    if (ec == std::errc::no_such_file_or_directory)
      return make_error(ErrorCode::Io, fmt::format("cannot read {}: missing", file));
    return os_error(ec, file);
  }
  if (st.type() != fs::file_type::regular_file)
    return make_error(ErrorCode::Io, fmt::format("{} is not a regular file", file));
  llvm::Expected<fs::file_t> opened = fs::openNativeFileForRead(file, fs::OF_None);
  if (!opened) return os_error(llvm::errorToErrorCode(opened.takeError()), file);
  fs::file_t fd = *opened;
  auto close = llvm::make_scope_exit([&] { fs::closeFile(fd); });
  if (std::error_code ec = fs::status(fd, st)) return os_error(ec, file);
  if (st.type() != fs::file_type::regular_file)
    return make_error(ErrorCode::Io, fmt::format("{} is not a regular file", file));
  if (st.getSize() > max_bytes)
    return make_error(ErrorCode::Io, fmt::format("{} is {} bytes, more than the {} allowed", file, st.getSize(),
                                                 max_bytes));
  auto buffer = llvm::MemoryBuffer::getOpenFile(fd, file, st.getSize(), /*RequiresNullTerminator=*/false);
  if (!buffer) return os_error(buffer.getError(), file);
  return std::string((*buffer)->getBuffer());
}

llvm::Expected<llvm::json::Value> parse_bounded_json(llvm::StringRef text, llvm::StringRef what) {
  if (auto err = check_json_shape(text, what)) return err;
  auto parsed = llvm::json::parse(text);
  if (!parsed)
    return make_error(ErrorCode::Io,
                      fmt::format("{} is not valid JSON ({})", what, llvm::toString(parsed.takeError())));
  return parsed;
}

}  // namespace exactjit
