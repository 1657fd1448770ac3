// exactjit cache configuration from the environment:
//   EXACTJIT_CACHE_DIR   the writable cache (default $XDG_CACHE_HOME/exactjit, else ~/.cache/exactjit)
//   EXACTJIT_CACHE_PATH  colon-separated read-only layers, searched before the writable one
//   EXACTJIT_OFFLINE=1   never compile: a miss is an error naming the prewarm command
//   EXACTJIT_CACHE_INDEX a pinned layer index (runtime/layer_index.hpp): read-only entries not in it,
//                        or whose image differs from it, are refused
//   EXACTJIT_CACHE_LAYER_CHECK=warn|refuse|off  a read-only layer that any user may write (its
//                        folder or its exactjit-v1 is world-writable) is reported (default), skipped,
//                        or accepted silently
#pragma once

#include <string>
#include <vector>

namespace exactjit {

struct CacheConfig {
  std::string writable_dir;                ///< empty: no writable layer (read-only deployment)
  std::vector<std::string> read_only_dirs;  ///< searched first, in order
  bool offline = false;
  std::string pinned_index;  ///< empty: read-only entries are trusted by their own manifests
  enum class LayerCheck { Warn, Refuse, Off } layer_check = LayerCheck::Warn;
};

/// The configuration the environment describes (see the file comment).
CacheConfig cache_config_from_environment();

/// Splits a colon-separated path list, dropping empty elements.
std::vector<std::string> split_path_list(const std::string& list);

}  // namespace exactjit
