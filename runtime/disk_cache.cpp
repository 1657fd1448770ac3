// exactjit disk cache (see disk_cache.hpp and docs/cache-format.md).
#include "runtime/disk_cache.hpp"

#include "codegen/digest.hpp"
#include "codegen/render.hpp"
#include "runtime/bounded_input.hpp"
#include "runtime/content_key.hpp"
#include "runtime/errors.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <llvm/Support/CachePruning.h>
#include <llvm/Support/FileSystem.h>
#include <llvm/Support/FormatVariadic.h>
#include <llvm/Support/JSON.h>
#include <llvm/Support/Path.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>

namespace exactjit {
namespace fs = llvm::sys::fs;
namespace path = llvm::sys::path;

namespace {

constexpr const char* kManifestFile = "manifest.json";
constexpr const char* kSourceFile = "kernel.cu";
constexpr const char* kCubinFile = "kernel.cubin";
constexpr const char* kPtxFile = "kernel.ptx";
constexpr auto kAbandonedAfter = std::chrono::hours(1);
// A build lock this old is stale: a compile takes seconds. LLVM's LockFileManager breaks a lock of
// a dead process on this host, but waits out one from another host (or a reused pid) every time.
constexpr auto kStaleLockAfter = std::chrono::minutes(10);
constexpr const char* kLockName = "build";  // LockFileManager adds ".lock" (and "-XXXXXX" while taking it)
// Caps on what a reader takes from an entry, checked before reading: far above any real entry
// (manifests are a few KB, sources under 100 KB, images under a few MB), far below harm.
constexpr uint64_t kMaxManifestBytes = 1 << 20;
constexpr uint64_t kMaxSourceBytes = 16 << 20;
constexpr uint64_t kMaxImageBytes = 256 << 20;

std::string join_path(llvm::StringRef a, llvm::StringRef b) {
  llvm::SmallString<256> joined(a);
  path::append(joined, b);
  return std::string(joined.str());
}

std::string layer_root(const std::string& layer) { return join_path(layer, kCacheFormatDir); }

std::string entry_folder_name(const std::string& compiler_tag, const std::string& content_key) {
  return compiler_tag + "-" + content_key.substr(0, 16);
}

// Folders are made 0777 less the umask (LLVM's default is 0770, which hid a cache pre-warmed by one
// user from every other), so a shared cache is readable wherever the umask allows it.
std::error_code make_folders(const std::string& folder) {
  return fs::create_directories(folder, /*IgnoreExisting=*/true, fs::all_all);
}

// A new, uniquely named folder `prefix` + "-XXXXXX" (createUniqueDirectory, with make_folders' mode).
std::error_code make_unique_folder(const std::string& prefix, llvm::SmallVectorImpl<char>& result) {
  for (int attempt = 0; attempt < 128; ++attempt) {
    fs::createUniquePath(prefix + "-%%%%%%", result, /*MakeAbsolute=*/false);
    const std::error_code ec = fs::create_directory(result, /*IgnoreExisting=*/false, fs::all_all);
    if (ec != std::errc::file_exists) return ec;
  }
  return std::make_error_code(std::errc::file_exists);
}

bool is_link(const std::string& file) {
  fs::file_status st;
  return !fs::status(file, st, /*Follow=*/false) && st.type() == fs::file_type::symlink_file;
}

// An entry folder's name: <compiler tag>-<16 hex digits>. Nothing else is ever deleted as an entry.
bool looks_like_entry(llvm::StringRef name) {
  if (name.size() < 18 || name[name.size() - 17] != '-') return false;
  return llvm::all_of(name.take_back(16), [](char c) { return llvm::isHexDigit(c); });
}

struct Problem {
  std::string message;
  bool transient = false;  ///< a failed read (EACCES, EMFILE, EIO...), not a bad entry
};

Problem describe(llvm::Error error) {
  Problem problem;
  llvm::handleAllErrors(std::move(error), [&](const llvm::ErrorInfoBase& info) {
    problem.message = info.message();
    problem.transient = is_transient_read_error(info.convertToErrorCode());
  });
  return problem;
}

// Writes a whole file and flushes it to stable storage before the entry is renamed in.
llvm::Error write_file_durably(const std::string& file, llvm::StringRef data) {
  int fd = -1;
  if (std::error_code ec = fs::openFileForWrite(file, fd, fs::CD_CreateNew, fs::OF_None))
    return make_error(ErrorCode::Io, fmt::format("cannot create {}: {}", file, ec.message()));
  const char* cursor = data.data();
  size_t left = data.size();
  while (left > 0) {
    const ssize_t written = ::write(fd, cursor, left);
    if (written < 0) {
      if (errno == EINTR) continue;
      const std::string reason = std::strerror(errno);
      ::close(fd);
      return make_error(ErrorCode::Io, fmt::format("cannot write {}: {}", file, reason));
    }
    cursor += written;
    left -= static_cast<size_t>(written);
  }
  const bool synced = ::fsync(fd) == 0;
  const std::string reason = synced ? "" : std::strerror(errno);
  ::close(fd);
  if (!synced) return make_error(ErrorCode::Io, fmt::format("cannot flush {}: {}", file, reason));
  return llvm::Error::success();
}

void sync_directory(const std::string& directory) {
  const int fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text;
}

// Folders directly below `directory` whose names do not start with '.', sorted by name. A symbolic
// link to a folder counts only with follow_links: the writable layer never follows one, so nothing
// it deletes can lie outside it.
std::vector<std::string> subfolders(const std::string& directory, bool follow_links) {
  std::vector<std::string> names;
  std::error_code ec;
  for (fs::directory_iterator it(directory, ec, follow_links), end; it != end && !ec; it.increment(ec)) {
    const llvm::StringRef name = path::filename(it->path());
    if (!name.startswith(".") && it->type() == fs::file_type::directory_file) names.push_back(it->path());
  }
  std::sort(names.begin(), names.end());
  return names;
}

uint64_t folder_bytes(const std::string& directory) {
  uint64_t total = 0;
  std::error_code ec;
  for (fs::directory_iterator it(directory, ec), end; it != end && !ec; it.increment(ec)) {
    fs::file_status st;
    if (!fs::status(it->path(), st)) total += st.getSize();
  }
  return total;
}

// Moves an entry folder out of the way (atomically) and deletes it; safe against concurrent
// readers. Only a real folder named like an entry: never a link, never someone else's folder.
void discard_folder(const std::string& directory) {
  if (!looks_like_entry(path::filename(directory)) || is_link(directory)) return;
  llvm::SmallString<256> doomed;
  const std::string parent = std::string(path::parent_path(directory));
  if (make_unique_folder(join_path(parent, ".bad"), doomed)) return;
  // If the rename fails another process already moved the folder; either way ours is empty or doomed.
  (void)fs::rename(directory, join_path(doomed, "entry"));
  fs::remove_directories(doomed);
}

llvm::Expected<std::string> checked_file(const std::string& directory, const llvm::json::Object& manifest,
                                         llvm::StringRef file, llvm::StringRef bytes_field,
                                         llvm::StringRef sha_field) {
  const llvm::Optional<int64_t> bytes = manifest.getInteger(bytes_field);
  const llvm::Optional<llvm::StringRef> sha = manifest.getString(sha_field);
  if (!bytes || !sha) return make_error(ErrorCode::Io, fmt::format("manifest lacks {} or {}", bytes_field, sha_field));
  if (*bytes <= 0) return make_error(ErrorCode::Io, fmt::format("manifest field {} is {}; it must be positive",
                                                                bytes_field, *bytes));
  auto data = read_bounded_file(join_path(directory, file), file == kSourceFile ? kMaxSourceBytes : kMaxImageBytes);
  if (!data) return data.takeError();
  if (static_cast<int64_t>(data->size()) != *bytes)
    return make_error(ErrorCode::Io, fmt::format("{} is {} bytes, manifest says {} (truncated?)", file,
                                                 data->size(), *bytes));
  if (sha256_hex(*data) != *sha)
    return make_error(ErrorCode::Io, fmt::format("{} does not match its SHA-256 (corrupt)", file));
  return data;
}

}  // namespace

llvm::Expected<DiskEntry> read_entry(const std::string& directory, const std::string& source_key,
                                     const KernelSource* expected) {
  auto text = read_bounded_file(join_path(directory, kManifestFile), kMaxManifestBytes);
  if (!text) return text.takeError();
  auto parsed = parse_bounded_json(*text, kManifestFile);
  if (!parsed) return parsed.takeError();
  const llvm::json::Object* manifest = parsed->getAsObject();
  if (!manifest) return make_error(ErrorCode::Io, "manifest.json is not an object");
  auto field = [&](llvm::StringRef name) { return manifest->getString(name).getValueOr("").str(); };
  if (field("format") != kManifestFormat)
    return make_error(ErrorCode::Io, fmt::format("manifest format '{}' is not {}", field("format"), kManifestFormat));
  DiskEntry entry;
  entry.directory = directory;
  entry.source_key = field("source_key");
  entry.content_key = field("content_key");
  entry.compiler_tag = field("compiler_tag");
  entry.entry = field("entry");
  entry.is_ptx = field("image_kind") == "ptx";
  if (entry.source_key != source_key)
    return make_error(ErrorCode::Io, "manifest names another source key than its folder");
  if (entry.content_key != content_key(entry.source_key, entry.compiler_tag) ||
      path::filename(directory) != entry_folder_name(entry.compiler_tag, entry.content_key))
    return make_error(ErrorCode::Io, "content key does not match the manifest's source key and compiler");
  if (entry.entry.empty()) return make_error(ErrorCode::Io, "manifest lacks the entry-point name");
  auto source = checked_file(directory, *manifest, kSourceFile, "source_bytes", "source_sha256");
  if (!source) return source.takeError();
  if (expected) {  // the source and the entry point are what exactjit renders, not what a file says
    if (*source != expected->text)
      return make_error(ErrorCode::Io, "kernel.cu differs from the source exactjit renders for this spec "
                                       "(forged or stale)");
    if (entry.entry != expected->entry)
      return make_error(ErrorCode::Io, fmt::format("manifest names the entry point '{}', the spec's is '{}'",
                                                   entry.entry, expected->entry));
  }
  auto image = checked_file(directory, *manifest, entry.is_ptx ? kPtxFile : kCubinFile, "image_bytes",
                            "image_sha256");
  if (!image) return image.takeError();
  entry.image = std::move(*image);
  entry.source = std::move(*source);
  if (const llvm::json::Array* options = manifest->getArray("options"))
    for (const llvm::json::Value& option : *options)
      if (llvm::Optional<llvm::StringRef> value = option.getAsString()) entry.options.push_back(value->str());
  return entry;
}

DiskCache::DiskCache(CacheConfig config) : config_(std::move(config)) {
  if (config_.layer_check != CacheConfig::LayerCheck::Off) {
    for (const std::string& layer : config_.read_only_dirs) {
      for (const std::string& folder : {layer, layer_root(layer)}) {
        fs::file_status st;
        if (fs::status(folder, st) || !(st.permissions() & fs::others_write)) continue;
        const bool refuse = config_.layer_check == CacheConfig::LayerCheck::Refuse;
        layer_warnings_.push_back(fmt::format("read-only cache layer {}: {} is writable by every user, so anyone can "
                                              "replace its kernels ({}; EXACTJIT_CACHE_LAYER_CHECK)",
                                              layer, folder, refuse ? "skipped" : "used anyway"));
        if (refuse) refused_layers_.push_back(layer);
        break;
      }
    }
  }
  if (config_.pinned_index.empty()) return;
  auto index = read_layer_index(config_.pinned_index);
  if (index) index_ = std::move(*index);
  else index_problem_ = llvm::toString(index.takeError());
}

llvm::Expected<std::optional<DiskEntry>> DiskCache::lookup(const KernelSource& source, const std::string& source_key,
                                                           std::vector<std::string>& problems) const {
  std::vector<std::pair<std::string, bool>> layers;  // (dir, writable)
  for (const std::string& dir : config_.read_only_dirs) layers.emplace_back(dir, false);
  if (!config_.writable_dir.empty()) layers.emplace_back(config_.writable_dir, true);
  std::call_once(warned_, [&] { problems.insert(problems.end(), layer_warnings_.begin(), layer_warnings_.end()); });
  for (const auto& [layer, writable] : layers) {
    if (!writable && llvm::is_contained(refused_layers_, layer)) continue;
    const std::string folder = join_path(layer_root(layer), source_key);
    if (writable && (is_link(layer_root(layer)) || is_link(folder))) {
      problems.push_back(fmt::format("{} is or lies under a symbolic link; the writable cache does not follow "
                                     "links (skipped)", folder));
      continue;
    }
    std::vector<std::string> entries = subfolders(folder, /*follow_links=*/!writable);
    // Newest compiler tag first (names sort by tag); any verified entry is a hit.
    for (auto it = entries.rbegin(); it != entries.rend(); ++it) {
      auto entry = read_entry(*it, source_key, &source);
      if (entry && !writable && !config_.pinned_index.empty()) {
        const std::string listed = source_key + "/" + std::string(path::filename(*it));
        const auto pinned = index_.image_sha256.find(listed);
        std::string refusal;
        if (!index_problem_.empty()) refusal = fmt::format("the pinned index is unusable: {}", index_problem_);
        else if (pinned == index_.image_sha256.end()) refusal = "not listed in the pinned index";
        else if (pinned->second != sha256_hex(entry->image)) refusal = "its image differs from the pinned index";
        if (!refusal.empty()) {
          problems.push_back(fmt::format("refused cache entry {}: {} ({})", *it, refusal, config_.pinned_index));
          continue;
        }
      }
      if (entry) {
        if (writable) ::utimensat(AT_FDCWD, it->c_str(), nullptr, 0);  // recency for prune
        return std::optional<DiskEntry>(std::move(*entry));
      }
      const Problem problem = describe(entry.takeError());
      const bool remove = writable && !problem.transient && looks_like_entry(path::filename(*it));
      problems.push_back(fmt::format("{} cache entry {}: {}{}", problem.transient ? "unreadable" : "bad", *it,
                                     problem.message,
                                     remove              ? " (removed; rebuilding)"
                                     : problem.transient ? " (a read error: left in place)"
                                     : writable          ? " (not an entry folder: left in place)"
                                                         : " (read-only layer; skipped)"));
      if (remove) discard_folder(*it);
    }
  }
  return std::optional<DiskEntry>();
}

llvm::Expected<DiskEntry> DiskCache::publish(const KernelSource& source, const std::string& source_key,
                                             const CompilerIdentity& compiler, const CompileOutput& output,
                                             const std::string& driver_seen) const {
  if (config_.writable_dir.empty())
    return make_error(ErrorCode::Io, "no writable cache directory (set EXACTJIT_CACHE_DIR or HOME)");
  const std::string folder = join_path(layer_root(config_.writable_dir), source_key);
  if (is_link(layer_root(config_.writable_dir)) || is_link(folder))
    return make_error(ErrorCode::Io, fmt::format("{} is or lies under a symbolic link; the writable cache does not "
                                                 "write through links", folder));
  if (std::error_code ec = make_folders(folder))
    return make_error(ErrorCode::Io, fmt::format("cannot create cache folder {}: {}", folder, ec.message()));

  DiskEntry entry;
  entry.source_key = source_key;
  entry.compiler_tag = compiler.tag();
  entry.content_key = content_key(source_key, entry.compiler_tag);
  entry.entry = source.entry;
  entry.image = output.image;
  entry.is_ptx = output.is_ptx;
  entry.directory = join_path(folder, entry_folder_name(entry.compiler_tag, entry.content_key));

  llvm::json::Array options;
  for (const std::string& option : source.options) options.push_back(option);
  llvm::json::Object manifest{
      {"format", kManifestFormat},
      {"spec", source.spec.describe()},
      {"entry", source.entry},
      {"generator", std::string(codegen::kGeneratorVersion)},
      {"exactjit_version", EXACTJIT_VERSION},
      {"source_key", source_key},
      {"content_key", entry.content_key},
      {"compiler_tag", entry.compiler_tag},
      {"compiler", llvm::json::Object{{"name", "nvrtc"},
                                      {"version", fmt::format("{}.{}", compiler.major, compiler.minor)},
                                      {"library", compiler.library_path},
                                      {"library_bytes", static_cast<int64_t>(compiler.library_size)}}},
      {"options", std::move(options)},
      {"target", source.spec.target.name()},
      {"image_kind", output.is_ptx ? "ptx" : "cubin"},
      {"image_bytes", static_cast<int64_t>(output.image.size())},
      {"image_sha256", sha256_hex(output.image)},
      {"source_bytes", static_cast<int64_t>(source.text.size())},
      {"source_sha256", sha256_hex(source.text)},
      {"driver_seen", driver_seen},
      {"compile_seconds", output.seconds},
      {"compile_log", output.log},
      {"created", utc_now()},
  };

  llvm::SmallString<256> temp;
  if (std::error_code ec = make_unique_folder(join_path(folder, ".tmp-" + entry.compiler_tag), temp))
    return make_error(ErrorCode::Io, fmt::format("cannot create a temporary folder in {}: {}", folder, ec.message()));
  const std::string temp_dir(temp.str());
  auto write_all = [&]() -> llvm::Error {
    if (auto err = write_file_durably(join_path(temp_dir, kSourceFile), source.text)) return err;
    if (auto err = write_file_durably(join_path(temp_dir, output.is_ptx ? kPtxFile : kCubinFile), output.image))
      return err;
    return write_file_durably(join_path(temp_dir, kManifestFile),
                              llvm::formatv("{0:2}", llvm::json::Value(std::move(manifest))).str());
  };
  if (auto err = write_all()) {
    fs::remove_directories(temp_dir);
    return err;
  }
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (!fs::rename(temp_dir, entry.directory)) {
      sync_directory(folder);
      return entry;
    }
    // Someone else published this content key first: theirs is as good as ours if it verifies.
    auto existing = read_entry(entry.directory, source_key, &source);
    if (existing) {
      fs::remove_directories(temp_dir);
      return std::move(*existing);
    }
    llvm::consumeError(existing.takeError());
    discard_folder(entry.directory);
  }
  fs::remove_directories(temp_dir);
  return make_error(ErrorCode::Io, fmt::format("cannot publish cache entry {}", entry.directory));
}

std::unique_ptr<llvm::LockFileManager> DiskCache::build_lock(const std::string& source_key,
                                                             std::vector<std::string>& problems) const {
  if (config_.writable_dir.empty()) return nullptr;
  const std::string folder = join_path(layer_root(config_.writable_dir), source_key);
  if (is_link(layer_root(config_.writable_dir)) || is_link(folder) || make_folders(folder)) return nullptr;
  const std::string lock_file = join_path(folder, kLockName) + ".lock";
  fs::file_status st;
  if (!fs::status(lock_file, st, /*Follow=*/false) && st.type() == fs::file_type::regular_file &&
      std::chrono::system_clock::now() - st.getLastModificationTime() > kStaleLockAfter) {
    problems.push_back(fmt::format("stale build lock {} (older than {} minutes): removed", lock_file,
                                   std::chrono::duration_cast<std::chrono::minutes>(kStaleLockAfter).count()));
    (void)fs::remove(lock_file);
  }
  return std::make_unique<llvm::LockFileManager>(join_path(folder, kLockName));
}

std::vector<EntryStatus> DiskCache::scan(bool verify) const {
  std::vector<EntryStatus> result;
  std::vector<std::pair<std::string, bool>> layers;
  for (const std::string& dir : config_.read_only_dirs) layers.emplace_back(dir, true);
  if (!config_.writable_dir.empty()) layers.emplace_back(config_.writable_dir, false);
  for (const auto& [layer, read_only] : layers) {
    if (!read_only && is_link(layer_root(layer))) continue;
    for (const std::string& key_folder : subfolders(layer_root(layer), read_only)) {
      for (const std::string& directory : subfolders(key_folder, read_only)) {
        EntryStatus status;
        status.directory = directory;
        status.read_only = read_only;
        status.bytes = folder_bytes(directory);
        status.spec = "?";
        if (auto text = read_bounded_file(join_path(directory, kManifestFile), kMaxManifestBytes)) {
          if (auto parsed = parse_bounded_json(*text, kManifestFile)) {
            if (const llvm::json::Object* manifest = parsed->getAsObject()) {
              status.spec = manifest->getString("spec").getValueOr("?").str();
              status.compiler_tag = manifest->getString("compiler_tag").getValueOr("").str();
            }
          } else {
            llvm::consumeError(parsed.takeError());
          }
        } else {
          llvm::consumeError(text.takeError());
        }
        if (verify) {
          // As a lookup would: kernel.cu and the entry point are what exactjit renders for the
          // spec the manifest names, and the key folder is that source's key.
          const std::string key(path::filename(key_folder));
          const std::optional<KernelSpec> spec = parse_spec(status.spec);
          const std::optional<KernelSource> rendered =
              spec ? std::optional<KernelSource>(codegen::render(*spec)) : std::nullopt;
          if (!rendered) {
            status.problem = fmt::format("the manifest's spec '{}' is not one exactjit writes", status.spec);
          } else if (source_key(*rendered) != key) {
            status.problem = "the key folder is not the key of the source this exactjit renders for the "
                             "manifest's spec (an entry of another exactjit version, or forged)";
          } else if (auto entry = read_entry(directory, key, &*rendered)) {
            status.image_sha256 = sha256_hex(entry->image);
          } else {
            status.problem = llvm::toString(entry.takeError());
          }
        }
        result.push_back(std::move(status));
      }
    }
  }
  return result;
}

llvm::Expected<PruneResult> DiskCache::prune(const std::string& policy_text) const {
  // LLVM's policy parser knows keys prune does not implement, and gives an unset expiry a default
  // of one week: prune applies exactly the keys it is given and refuses the others.
  llvm::SmallVector<llvm::StringRef, 4> clauses;
  llvm::StringRef(policy_text).split(clauses, ':', -1, /*KeepEmpty=*/false);
  bool expiry_given = false;
  for (llvm::StringRef clause : clauses) {
    const llvm::StringRef key = clause.split('=').first;
    if (key != "prune_after" && key != "cache_size_bytes" && key != "cache_size_files")
      return make_error(ErrorCode::InvalidArgument,
                        fmt::format("bad prune policy '{}': key '{}' is not supported (prune_after, "
                                    "cache_size_bytes, cache_size_files)", policy_text, key));
    expiry_given |= key == "prune_after";
  }
  auto policy = llvm::parseCachePruningPolicy(policy_text);
  if (!policy)
    return make_error(ErrorCode::InvalidArgument,
                      fmt::format("bad prune policy '{}': {}", policy_text, llvm::toString(policy.takeError())));
  if (!expiry_given) policy->Expiration = std::chrono::seconds(0);
  if (config_.writable_dir.empty()) return make_error(ErrorCode::Io, "no writable cache directory to prune");
  const std::string root = layer_root(config_.writable_dir);
  if (is_link(root))
    return make_error(ErrorCode::Io, fmt::format("refusing to prune {}: it is a symbolic link", root));
  struct Candidate {
    std::string directory;
    std::chrono::system_clock::time_point used;
    uint64_t bytes;
  };
  std::vector<Candidate> entries;
  PruneResult result;
  const auto now = std::chrono::system_clock::now();
  for (const std::string& key_folder : subfolders(root, /*follow_links=*/false)) {
    // Abandoned temporary and discarded folders of crashed writers (real folders only).
    std::error_code ec;
    for (fs::directory_iterator it(key_folder, ec, /*follow_symlinks=*/false), end; it != end && !ec;
         it.increment(ec)) {
      const llvm::StringRef name = path::filename(it->path());
      fs::file_status st;
      if (fs::status(it->path(), st, /*Follow=*/false) || now - st.getLastModificationTime() <= kAbandonedAfter)
        continue;
      if ((name.startswith(".tmp-") || name.startswith(".bad")) && st.type() == fs::file_type::directory_file)
        fs::remove_directories(it->path());
      else if (name.startswith(std::string(kLockName) + ".lock") && st.type() == fs::file_type::regular_file)
        (void)fs::remove(it->path());  // a build lock (or its temporary) nobody released
    }
    for (const std::string& directory : subfolders(key_folder, /*follow_links=*/false)) {
      if (!looks_like_entry(path::filename(directory))) continue;  // not ours to prune
      fs::file_status st;
      if (fs::status(directory, st)) continue;
      entries.push_back({directory, st.getLastModificationTime(), folder_bytes(directory)});
    }
  }
  std::sort(entries.begin(), entries.end(), [](const Candidate& a, const Candidate& b) { return a.used < b.used; });
  uint64_t total = 0;
  for (const Candidate& c : entries) total += c.bytes;
  size_t remaining = entries.size();
  for (const Candidate& c : entries) {  // least recently used first
    const bool expired = policy->Expiration.count() > 0 && now - c.used > policy->Expiration;
    const bool too_big = policy->MaxSizeBytes > 0 && total > policy->MaxSizeBytes;
    const bool too_many = policy->MaxSizeFiles > 0 && remaining > policy->MaxSizeFiles;
    if (!expired && !too_big && !too_many) continue;
    discard_folder(c.directory);
    total -= c.bytes;
    remaining -= 1;
    result.removed_entries += 1;
    result.freed_bytes += c.bytes;
  }
  // rmdir only succeeds on empty folders, so a concurrent writer's temporary folder survives.
  for (const std::string& key_folder : subfolders(root, /*follow_links=*/false)) (void)fs::remove(key_folder);
  result.remaining_bytes = total;
  return result;
}

llvm::Error DiskCache::clear() const {
  if (config_.writable_dir.empty()) return make_error(ErrorCode::Io, "no writable cache directory to clear");
  const std::string root = layer_root(config_.writable_dir);
  if (is_link(root)) return make_error(ErrorCode::Io, fmt::format("refusing to clear {}: it is a symbolic link", root));
  if (!fs::exists(root)) return llvm::Error::success();
  if (std::error_code ec = fs::remove_directories(root))
    return make_error(ErrorCode::Io, fmt::format("cannot remove {}: {}", root, ec.message()));
  return llvm::Error::success();
}

}  // namespace exactjit
