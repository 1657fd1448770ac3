// Spec lists: recorded kernel specs (see spec_list.hpp).
#include "runtime/spec_list.hpp"

#include "codegen/op_row.hpp"
#include "runtime/errors.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <llvm/ADT/ScopeExit.h>
#include <llvm/ADT/StringMap.h>
#include <llvm/Support/FileSystem.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

namespace exactjit {
namespace fs = llvm::sys::fs;

namespace {

// A recorded file far larger than any workload's specs is not read back to deduplicate: the line
// is appended (the reader deduplicates), so the cost of a recording stays bounded.
constexpr off_t kMaxDedupBytes = 4 << 20;
constexpr auto kLockTimeout = std::chrono::seconds(10);

llvm::Error io_error(const std::string& file, const std::string& what) {
  return make_error(ErrorCode::Io, fmt::format("cannot record into {}: {}", file, what));
}

// Reads the first `size` bytes of the open file.
bool read_all(int fd, std::string& text, off_t size) {
  text.resize(static_cast<size_t>(size));
  off_t done = 0;
  while (done < size) {
    const ssize_t n = ::pread(fd, text.data() + done, static_cast<size_t>(size - done), done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += n;
  }
  return true;
}

bool write_all(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

// A line as exactjit described the sinusoid and the segment plan kernels before they had size
// fields of their own (generator exactjit-codegen-5): "OP dtype=D hidden=N table_stride=0 vec=1
// index=I target=T", N the channels, the key tensors or 1. Read back as today's spec, so lists
// recorded then still prewarm; only that exact text is accepted.
std::optional<KernelSpec> parse_codegen5_spec(llvm::StringRef line) {
  const auto [name, rest] = line.split(' ');
  const std::optional<OpCode> op = parse_op(std::string_view(name.data(), name.size()));
  if (!op) return std::nullopt;
  const SpecShape shape = op_row(*op).shape;
  if (shape != SpecShape::Channels && shape != SpecShape::Plan) return std::nullopt;
  llvm::SmallVector<llvm::StringRef, 8> fields;
  rest.split(fields, ' ');
  llvm::StringMap<llvm::StringRef> value;
  for (llvm::StringRef field : fields) value.insert(field.split('='));
  const std::string size = value.lookup("hidden").str();
  // Keyed: a plan kernel whose family counts key tensors (segment_count), as its row says.
  const bool keyed = shape == SpecShape::Plan && op_row(*op).family_specs(KernelSpec{}).front().key_tensors != 0;
  const std::string today =
      shape == SpecShape::Channels
          ? fmt::format("{} dtype={} channels={} target={}", name.str(), value.lookup("dtype").str(), size,
                        value.lookup("target").str())
          : fmt::format("{} dtype={}{} index={} target={}", name.str(), value.lookup("dtype").str(),
                        keyed ? " keys=" + size : "", value.lookup("index").str(), value.lookup("target").str());
  const std::optional<KernelSpec> spec = parse_spec(today);
  if (!spec) return std::nullopt;
  const std::string written =
      fmt::format("{} dtype={} hidden={} table_stride=0 vec=1 index={} target={}", name.str(),
                  dtype_name(spec->dtype),
                  shape == SpecShape::Channels ? spec->channels : keyed ? spec->key_tensors : 1,
                  index_type_name(spec->index), spec->target.name());
  if (written != line) return std::nullopt;
  return spec;
}

}  // namespace

bool is_spec_list(llvm::StringRef text) {
  return text.consume_front(kSpecListFormat) && (text.empty() || text.front() == '\n');
}

llvm::Expected<std::vector<KernelSpec>> parse_spec_list(llvm::StringRef text, llvm::StringRef what) {
  if (!is_spec_list(text))
    return make_error(ErrorCode::InvalidArgument,
                      fmt::format("{} does not start with the line {}", what.str(), kSpecListFormat));
  std::vector<KernelSpec> specs;
  std::unordered_set<KernelSpec, KernelSpecHash> seen;
  size_t line_number = 1;
  text = text.drop_front(std::strlen(kSpecListFormat));
  while (text.consume_front("\n") && !text.empty()) {
    ++line_number;
    const size_t end = text.find('\n');
    const llvm::StringRef line = text.take_front(end);
    if (end == llvm::StringRef::npos)
      return make_error(ErrorCode::InvalidArgument,
                        fmt::format("{}: line {} is cut short (no newline)", what.str(), line_number));
    text = text.drop_front(end);
    // A repeated header: writers that found the file empty at once, without a working lock.
    if (line == kSpecListFormat) continue;
    std::optional<KernelSpec> spec = parse_spec(std::string_view(line.data(), line.size()));
    if (!spec) spec = parse_codegen5_spec(line);
    if (!spec)
      return make_error(ErrorCode::InvalidArgument,
                        fmt::format("{}: line {} is not a kernel spec exactjit writes: '{}'", what.str(), line_number,
                                    line.take_front(200).str()));
    if (seen.insert(*spec).second) specs.push_back(*spec);
  }
  return specs;
}

llvm::Error append_to_spec_list(const std::string& file, const KernelSpec& spec) {
  static std::mutex process_mutex;  // the file lock does not separate threads of one process
  std::lock_guard<std::mutex> guard(process_mutex);
  // O_NONBLOCK: opening a FIFO does not wait for a reader; it is refused below.
  const int fd = ::open(file.c_str(), O_RDWR | O_APPEND | O_CREAT | O_CLOEXEC | O_NONBLOCK, 0666);
  if (fd < 0) return io_error(file, std::strerror(errno));
  auto close = llvm::make_scope_exit([&] { ::close(fd); });
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return io_error(file, "not a regular file");
  const bool locked = !fs::tryLockFile(fd, kLockTimeout);
  auto unlock = llvm::make_scope_exit([&] {
    if (locked) (void)fs::unlockFile(fd);
  });
  if (::fstat(fd, &st) != 0) return io_error(file, std::strerror(errno));  // the size once locked
  const std::string line = spec.describe() + "\n";
  std::string text;
  if (st.st_size == 0) {
    text = std::string(kSpecListFormat) + "\n";
  } else {
    std::string existing;
    const off_t readable = std::min<off_t>(st.st_size, kMaxDedupBytes);
    if (!read_all(fd, existing, readable)) return io_error(file, "cannot read it back");
    if (!is_spec_list(existing)) return io_error(file, fmt::format("it is not an {} file", kSpecListFormat));
    if (readable == st.st_size) {
      if (existing.find("\n" + line) != std::string::npos) return llvm::Error::success();
      if (existing.back() != '\n') text = "\n";  // a writer died mid-line: keep ours whole
    }
  }
  text += line;
  if (!write_all(fd, text)) return io_error(file, std::strerror(errno));
  return llvm::Error::success();
}

void SpecRecorder::record(const KernelSpec& spec) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!recorded_.insert(spec).second) return;
  if (auto err = append_to_spec_list(file_, spec)) {
    const std::string message = llvm::toString(std::move(err));
    if (!warned_) fmt::print(stderr, "exactjit: warning: {} (EXACTJIT_RECORD_MANIFEST)\n", message);
    warned_ = true;
  }
}

}  // namespace exactjit
