// exactjit's environment variables: one table (name, kind, meaning) that the parsers below read
// and `exactjit --help` prints, and the cache configuration they describe.
//
// Every boolean variable takes 1/0, true/false, yes/no, on/off in any case (empty or unset: its
// default); any other value is an error naming the variable and the accepted values, so
// EXACTJIT_CHECK_AFTER_LAUNCH=false can no longer turn checking on. A choice variable takes one
// of its listed words, nothing else.
#pragma once

#include <llvm/ADT/ArrayRef.h>
#include <llvm/Support/Error.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace exactjit {

enum class EnvKind {
  Path,           ///< a file or folder
  PathList,       ///< colon-separated folders
  Boolean,        ///< 1/0 true/false yes/no on/off
  Choice,         ///< one of EnvironmentVariable::choices
  Arch,           ///< sm_90, compute_90
  BooleanOrPath,  ///< a boolean, or the path of a file to load (Python)
};

struct EnvironmentVariable {
  std::string_view name;
  EnvKind kind;
  std::string_view choices;  ///< Choice: the accepted words, '|'-separated, the default first
  std::string_view meaning;
};

/// Every variable exactjit (the library, the CLI and the Python binding) reads.
llvm::ArrayRef<EnvironmentVariable> environment_variables();

/// "boolean", "choice: warn|refuse|off", ...: how `exactjit --help` names a kind.
std::string describe_kind(const EnvironmentVariable& variable);

/// The value of a variable of the table ("" when unset).
std::string environment_text(std::string_view name);

/// A boolean variable of the table: its value, `fallback` when unset or empty, or an
/// InvalidArgument error naming the variable, the value and the accepted spellings.
llvm::Expected<bool> environment_boolean(std::string_view name, bool fallback = false);

/// `text` as a boolean (the spellings above), or nullopt.
std::optional<bool> parse_boolean(std::string_view text);

/// Parses every boolean and choice variable that is set; the first malformed one as an error.
llvm::Error check_environment();

struct CacheConfig {
  std::string writable_dir;                ///< empty: no writable layer (read-only deployment)
  std::vector<std::string> read_only_dirs;  ///< searched first, in order
  bool offline = false;
  std::string pinned_index;  ///< empty: read-only entries are trusted by their own manifests
  enum class LayerCheck { Warn, Refuse, Off } layer_check = LayerCheck::Warn;
};

/// The cache configuration the environment describes (EXACTJIT_CACHE_DIR, _CACHE_PATH, _OFFLINE,
/// _CACHE_INDEX, _CACHE_LAYER_CHECK); a malformed value is an InvalidArgument error.
llvm::Expected<CacheConfig> cache_config_from_environment();

/// Splits a colon-separated path list, dropping empty elements.
std::vector<std::string> split_path_list(const std::string& list);

}  // namespace exactjit
