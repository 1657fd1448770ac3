// exactjit --json output (see json_output.hpp).
#include "cli/json_output.hpp"

#include "cli/options.hpp"

#include <llvm/Support/FormatVariadic.h>
#include <llvm/Support/raw_ostream.h>

namespace exactjit::cli {

std::string command_name() {
  if (prewarm_command) return "prewarm";
  if (cache_command) return "cache " + cache_action.getValue();
  if (info_command) return "info";
  if (inspect_command) return "inspect";
  if (selftest_command) return "selftest";
  if (bench_command) return "bench";
  return "";
}

int print_json(int exit_code, llvm::json::Object fields) {
  fields["format"] = kCliJsonFormat;
  fields["command"] = command_name();
  fields["exit_code"] = exit_code;
  // Pretty-printed with sorted keys (llvm::json::Object is unordered; the writer sorts them).
  llvm::outs() << llvm::formatv("{0:2}", llvm::json::Value(std::move(fields))) << "\n";
  llvm::outs().flush();
  return exit_code;
}

llvm::json::Value path_or_null(const std::string& path) {
  if (path.empty()) return nullptr;
  return path;
}

}  // namespace exactjit::cli
