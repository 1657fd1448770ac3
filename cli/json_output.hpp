// exactjit --json: one JSON object on standard output per command run, in the one schema of
// docs/cli-json.md ("format": "exactjit-cli-1", "command", "exit_code", then the command's fields).
#pragma once

#include <llvm/Support/JSON.h>

#include <string>

namespace exactjit::cli {

inline constexpr const char* kCliJsonFormat = "exactjit-cli-1";

/// The command line's command as the JSON names it: "info", "prewarm", "cache verify", ...
std::string command_name();

/// Prints `fields` with the format, command and exit code in front; returns `exit_code`.
int print_json(int exit_code, llvm::json::Object fields);

/// A path, or null when empty (no writable layer, no pinned index).
llvm::json::Value path_or_null(const std::string& path);

}  // namespace exactjit::cli
