// exactjit disk cache: immutable, verified, layered entries (format: docs/cache-format.md).
//
//   <root>/exactjit-v1/<source key>/<compiler tag>-<content key[0:16]>/
//       manifest.json   provenance: spec, options, compiler, target, driver seen, sizes, hashes
//       kernel.cu       the exact source that was compiled
//       kernel.cubin    (or kernel.ptx for a virtual target)
//
// An entry is written into a temporary directory beside its final place and renamed in; it is
// never modified afterwards. A reader verifies the manifest, the sizes and the SHA-256 of the image
// and the source before use; anything missing, short or wrong is a miss that the caller rebuilds,
// and is reported. Read-only layers (a shipped, pre-warmed cache) are searched before the
// writable one. Locks only avoid duplicate compiles across processes; correctness never depends
// on them.
#pragma once

#include "runtime/environment.hpp"
#include "runtime/layer_index.hpp"
#include "runtime/nvrtc.hpp"

#include <llvm/Support/Error.h>
#include <llvm/Support/LockFileManager.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace exactjit {

inline constexpr const char* kCacheFormatDir = "exactjit-v1";
inline constexpr const char* kManifestFormat = "exactjit-cache-1";

struct DiskEntry {
  std::string directory;  ///< the entry's folder
  std::string source_key;
  std::string content_key;
  std::string compiler_tag;
  std::string entry;  ///< kernel entry-point name
  std::string image;  ///< cubin bytes or PTX text
  bool is_ptx = false;
  std::string source;                ///< kernel.cu, verified
  std::vector<std::string> options;  ///< the NVRTC options the manifest records
};

/// One entry as `cache ls` / `cache verify` see it.
struct EntryStatus {
  std::string directory;
  std::string spec;  ///< from the manifest ("?" when unreadable)
  std::string compiler_tag;
  uint64_t bytes = 0;
  bool read_only = false;
  std::string problem;       ///< empty when the entry verifies
  std::string image_sha256;  ///< with verify, of an entry that verifies
};

struct PruneResult {
  unsigned removed_entries = 0;
  uint64_t freed_bytes = 0;
  uint64_t remaining_bytes = 0;
};

class DiskCache {
 public:
  explicit DiskCache(CacheConfig config);
  const CacheConfig& config() const { return config_; }

  /// Searches the read-only layers, then the writable one, for `source` (whose key is
  /// `source_key`). An entry is used only if its kernel.cu is byte for byte the source rendered for
  /// the spec; its entry point is the spec's. Bad entries found on the way are described in
  /// `problems`; in the writable layer they are also removed.
  llvm::Expected<std::optional<DiskEntry>> lookup(const KernelSource& source, const std::string& source_key,
                                                  std::vector<std::string>& problems) const;

  /// Publishes a freshly compiled kernel into the writable layer. Losing a race to another
  /// writer of the same content key is fine: the winner's verified entry is returned.
  llvm::Expected<DiskEntry> publish(const KernelSource& source, const std::string& source_key,
                                    const CompilerIdentity& compiler, const CompileOutput& output,
                                    const std::string& driver_seen) const;

  /// A cross-process lock on building `source_key` (nullptr when there is no writable layer).
  /// Holding it is advisory: a crashed owner or an NFS directory only costs a duplicate compile.
  /// A lock older than ten minutes is stale: it is removed and described in `problems`.
  std::unique_ptr<llvm::LockFileManager> build_lock(const std::string& source_key,
                                                    std::vector<std::string>& problems) const;

  /// Every entry of every layer; with verify, each one fully checked: its kernel.cu and entry
  /// point against what exactjit renders for the spec its manifest names (the key folder must be
  /// that source's key), then every file against its size and SHA-256.
  std::vector<EntryStatus> scan(bool verify) const;

  /// Removes entries of the writable layer by an LLVM cache-pruning policy string
  /// ("prune_after=24h:cache_size_bytes=1g", see llvm/Support/CachePruning.h), least recently
  /// used first, plus abandoned temporary folders.
  llvm::Expected<PruneResult> prune(const std::string& policy) const;

  /// Removes everything exactjit wrote in the writable layer (only <root>/exactjit-v1).
  llvm::Error clear() const;

 private:
  CacheConfig config_;
  // The pinned index (config_.pinned_index), read once; when it cannot be read, why: then every
  // read-only entry is refused (a pin that does not load must not fail open).
  LayerIndex index_;
  std::string index_problem_;
  // Read-only layers any user may write (EXACTJIT_CACHE_LAYER_CHECK): what to report, once, and
  // with Refuse, which layers lookups skip.
  std::vector<std::string> layer_warnings_;
  std::vector<std::string> refused_layers_;
  mutable std::once_flag warned_;
};

/// Verifies one entry folder; returns the entry or a description of what is wrong with it. With
/// `expected`, kernel.cu must equal its text and the manifest's entry point its entry.
llvm::Expected<DiskEntry> read_entry(const std::string& directory, const std::string& source_key,
                                     const KernelSource* expected = nullptr);

}  // namespace exactjit
