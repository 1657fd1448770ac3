// exactjit's environment variables and the cache configuration they describe (see environment.hpp).
#include "runtime/environment.hpp"

#include "runtime/errors.hpp"

#include <fmt/format.h>
#include <llvm/ADT/StringExtras.h>
#include <llvm/ADT/StringRef.h>

#include <cstdlib>

namespace exactjit {
namespace {

constexpr EnvironmentVariable kVariables[] = {
    {"EXACTJIT_CACHE_DIR", EnvKind::Path, "",
     "writable cache (default $XDG_CACHE_HOME/exactjit, else ~/.cache/exactjit)"},
    {"EXACTJIT_CACHE_PATH", EnvKind::PathList, "",
     "read-only layers (a shipped, pre-warmed cache), searched before the writable one"},
    {"EXACTJIT_CACHE_INDEX", EnvKind::Path, "",
     "a pinned layer index (exactjit cache index --out F): a read-only entry not listed in it, or whose "
     "image differs, is refused"},
    {"EXACTJIT_CACHE_LAYER_CHECK", EnvKind::Choice, "warn|refuse|off",
     "what to do with a read-only layer any user may write: report it, skip it, or accept it"},
    {"EXACTJIT_OFFLINE", EnvKind::Boolean, "",
     "never compile: a miss is an error naming the spec and the prewarm command; `exactjit prewarm` "
     "only checks the layers"},
    {"EXACTJIT_RECORD_MANIFEST", EnvKind::Path, "",
     "append every kernel spec the process uses to this file, once (exactjit prewarm --manifest FILE "
     "builds them)"},
    {"EXACTJIT_ARCH", EnvKind::Arch, "", "compile for this target instead of the device's"},
    {"EXACTJIT_CHECK_AFTER_LAUNCH", EnvKind::Boolean, "",
     "synchronise after every op so a bad index is reported by the call itself"},
    {"EXACTJIT_NVRTC_LIBRARY", EnvKind::Path, "", "explicit path to libnvrtc.so"},
    {"EXACTJIT_CUDA_LIBRARY", EnvKind::Path, "", "explicit path to libcuda.so.1"},
    {"EXACTJIT_LIBRARY", EnvKind::Path, "", "(Python) explicit path to libexactjit.so"},
    {"EXACTJIT_TORCH_EXTENSION", EnvKind::BooleanOrPath, "",
     "(Python) off keeps the ctypes path; a path picks the libexactjit_torch.so to load"},
};

constexpr std::string_view kBooleanSpellings = "1/0, true/false, yes/no, on/off";

const EnvironmentVariable& variable(std::string_view name) {
  for (const EnvironmentVariable& v : kVariables)
    if (v.name == name) return v;
  llvm_unreachable("an environment variable missing from the table");
}

llvm::Error malformed(const EnvironmentVariable& v, const std::string& value, std::string_view accepted) {
  return make_error(ErrorCode::InvalidArgument,
                    fmt::format("{}='{}' is not valid: use {}", v.name, value, accepted));
}

// A choice variable's word, the default (the first listed) when unset.
llvm::Expected<std::string> environment_choice(std::string_view name) {
  const EnvironmentVariable& v = variable(name);
  llvm::SmallVector<llvm::StringRef, 4> words;
  llvm::StringRef(v.choices.data(), v.choices.size()).split(words, '|');
  const std::string value = environment_text(name);
  if (value.empty()) return words.front().str();
  for (llvm::StringRef word : words)
    if (word.equals_insensitive(value)) return word.str();
  return malformed(v, value, fmt::format("one of {}", v.choices));
}

}  // namespace

llvm::ArrayRef<EnvironmentVariable> environment_variables() { return kVariables; }

std::string describe_kind(const EnvironmentVariable& v) {
  switch (v.kind) {
    case EnvKind::Path: return "path";
    case EnvKind::PathList: return "path list (:)";
    case EnvKind::Boolean: return "boolean";
    case EnvKind::Choice: return std::string(v.choices);
    case EnvKind::Arch: return "arch";
    case EnvKind::BooleanOrPath: return "boolean or path";
  }
  return "?";
}

std::string environment_text(std::string_view name) {
  const char* value = std::getenv(std::string(variable(name).name).c_str());
  return value ? value : "";
}

std::optional<bool> parse_boolean(std::string_view text) {
  const llvm::StringRef word(text.data(), text.size());
  for (const char* yes : {"1", "true", "yes", "on"})
    if (word.equals_insensitive(yes)) return true;
  for (const char* no : {"0", "false", "no", "off"})
    if (word.equals_insensitive(no)) return false;
  return std::nullopt;
}

llvm::Expected<bool> environment_boolean(std::string_view name, bool fallback) {
  const EnvironmentVariable& v = variable(name);
  const std::string value = environment_text(name);
  if (value.empty()) return fallback;
  if (const std::optional<bool> parsed = parse_boolean(value)) return *parsed;
  return malformed(v, value, kBooleanSpellings);
}

llvm::Error check_environment() {
  for (const EnvironmentVariable& v : kVariables) {
    if (v.kind == EnvKind::Boolean) {
      if (auto parsed = environment_boolean(v.name); !parsed) return parsed.takeError();
    } else if (v.kind == EnvKind::Choice) {
      if (auto parsed = environment_choice(v.name); !parsed) return parsed.takeError();
    }
  }
  return llvm::Error::success();
}

std::vector<std::string> split_path_list(const std::string& list) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (start <= list.size()) {
    const size_t end = std::min(list.find(':', start), list.size());
    if (end > start) parts.push_back(list.substr(start, end - start));
    start = end + 1;
  }
  return parts;
}

llvm::Expected<CacheConfig> cache_config_from_environment() {
  CacheConfig config;
  config.writable_dir = environment_text("EXACTJIT_CACHE_DIR");
  if (config.writable_dir.empty()) {
    // Not exactjit's variables: the XDG default, then the home folder.
    const char* xdg = std::getenv("XDG_CACHE_HOME");
    const char* home = std::getenv("HOME");
    if (xdg && *xdg) config.writable_dir = std::string(xdg) + "/exactjit";
    else if (home && *home) config.writable_dir = std::string(home) + "/.cache/exactjit";
  }
  config.read_only_dirs = split_path_list(environment_text("EXACTJIT_CACHE_PATH"));
  auto offline = environment_boolean("EXACTJIT_OFFLINE");
  if (!offline) return offline.takeError();
  config.offline = *offline;
  config.pinned_index = environment_text("EXACTJIT_CACHE_INDEX");
  auto check = environment_choice("EXACTJIT_CACHE_LAYER_CHECK");
  if (!check) return check.takeError();
  if (*check == "refuse") config.layer_check = CacheConfig::LayerCheck::Refuse;
  else if (*check == "off") config.layer_check = CacheConfig::LayerCheck::Off;
  return config;
}

}  // namespace exactjit
