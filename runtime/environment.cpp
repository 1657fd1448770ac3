// exactjit cache configuration from the environment (see environment.hpp).
#include "runtime/environment.hpp"

#include <cstdlib>
#include <string_view>

namespace exactjit {

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

CacheConfig cache_config_from_environment() {
  auto env = [](const char* name) -> std::string {
    const char* value = std::getenv(name);
    return value ? value : "";
  };
  CacheConfig config;
  config.writable_dir = env("EXACTJIT_CACHE_DIR");
  if (config.writable_dir.empty()) {
    if (const std::string xdg = env("XDG_CACHE_HOME"); !xdg.empty()) {
      config.writable_dir = xdg + "/exactjit";
    } else if (const std::string home = env("HOME"); !home.empty()) {
      config.writable_dir = home + "/.cache/exactjit";
    }
  }
  config.read_only_dirs = split_path_list(env("EXACTJIT_CACHE_PATH"));
  const std::string offline = env("EXACTJIT_OFFLINE");
  config.offline = !offline.empty() && offline != "0" && offline != "false";
  config.pinned_index = env("EXACTJIT_CACHE_INDEX");
  const std::string check = env("EXACTJIT_CACHE_LAYER_CHECK");
  if (check == "refuse") config.layer_check = CacheConfig::LayerCheck::Refuse;
  else if (check == "off") config.layer_check = CacheConfig::LayerCheck::Off;
  return config;
}

}  // namespace exactjit
