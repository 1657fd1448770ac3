// A pinned layer index: every entry a deployment ships, with the SHA-256 of its image, in one file
// kept outside the layers it pins (EXACTJIT_CACHE_INDEX). An entry's own manifest cannot vouch for
// its image (whoever can write the layer can rewrite both); the index can, because a writer of the
// layer cannot write it. Written by `exactjit cache index`.
//
//   exactjit-cache-index-1
//   <source key>/<entry folder> <image sha256>
//   ...
#pragma once

#include <llvm/Support/Error.h>

#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace exactjit {

inline constexpr const char* kLayerIndexFormat = "exactjit-cache-index-1";

struct LayerIndex {
  std::unordered_map<std::string, std::string> image_sha256;  ///< "<source key>/<entry folder>" -> hex
};

/// Reads and checks an index file (bounded like every untrusted file; ErrorCode::Io naming the
/// file and the line on anything malformed or repeated).
llvm::Expected<LayerIndex> read_layer_index(const std::string& file);

/// The text of an index of (entry, image sha256) pairs, sorted by entry.
std::string format_layer_index(std::vector<std::pair<std::string, std::string>> entries);

}  // namespace exactjit
