// Pinned layer index (see layer_index.hpp).
#include "runtime/layer_index.hpp"

#include "runtime/bounded_input.hpp"
#include "runtime/errors.hpp"

#include <fmt/format.h>
#include <llvm/ADT/StringExtras.h>
#include <llvm/ADT/StringRef.h>

#include <algorithm>

namespace exactjit {
namespace {
constexpr uint64_t kMaxIndexBytes = 64 << 20;  // ~600k entries
}  // namespace

llvm::Expected<LayerIndex> read_layer_index(const std::string& file) {
  auto text = read_bounded_file(file, kMaxIndexBytes);
  if (!text) return text.takeError();
  llvm::SmallVector<llvm::StringRef, 0> lines;
  llvm::StringRef(*text).split(lines, '\n', -1, /*KeepEmpty=*/false);
  if (lines.empty() || lines.front() != kLayerIndexFormat)
    return make_error(ErrorCode::Io, fmt::format("{} is not a layer index (first line must be {})", file,
                                                 kLayerIndexFormat));
  LayerIndex index;
  for (size_t n = 1; n < lines.size(); ++n) {
    const auto [entry, sha] = lines[n].split(' ');
    const bool hex = sha.size() == 64 && llvm::all_of(sha, [](char c) { return llvm::isHexDigit(c); });
    if (entry.empty() || entry.count('/') != 1 || entry.contains("..") || !hex)
      return make_error(ErrorCode::Io, fmt::format("{} line {}: expected '<source key>/<entry folder> <sha256>'",
                                                   file, n + 1));
    if (!index.image_sha256.emplace(entry.str(), sha.str()).second)
      return make_error(ErrorCode::Io, fmt::format("{} line {}: {} is listed twice", file, n + 1, entry));
  }
  return index;
}

std::string format_layer_index(std::vector<std::pair<std::string, std::string>> entries) {
  std::sort(entries.begin(), entries.end());
  std::string text = std::string(kLayerIndexFormat) + "\n";
  for (const auto& [entry, sha] : entries) text += entry + " " + sha + "\n";
  return text;
}

}  // namespace exactjit
