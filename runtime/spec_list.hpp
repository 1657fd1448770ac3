// A spec list: the kernels a process used, as text. EXACTJIT_RECORD_MANIFEST=FILE makes every
// Runtime append to FILE each spec it looks up; `exactjit prewarm --manifest FILE` builds them
// (or, with --check, says which the cache layers lack). One canonical KernelSpec::describe() per
// line under a header line:
//
//   exactjit-spec-list-1
//   gate_residual dtype=bf16 hidden=5376 table_stride=32256 vec=8 index=int64 target=sm_90
//   ...
//
// Several processes may record into one file at once. A writer locks the file (LLVM's advisory
// whole-file lock, plus a mutex for the threads of one process, which such locks do not
// separate), reads it, and appends its line in one O_APPEND write only when the line is absent:
// lines never interleave and none repeats. Where locking does not work (some NFS set-ups) or
// times out, the line is appended anyway; a repeat is harmless because the reader deduplicates.
#pragma once

#include "codegen/kernel_spec.hpp"

#include <llvm/ADT/StringRef.h>
#include <llvm/Support/Error.h>

#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

namespace exactjit {

inline constexpr const char* kSpecListFormat = "exactjit-spec-list-1";

/// True when `text` starts with the spec-list header line.
bool is_spec_list(llvm::StringRef text);

/// The specs of a spec list `what` (a file name, for messages), each once, in file order (a
/// repeated spec or header line is skipped); an InvalidArgument error naming the line for anything
/// else that is not a canonical spec. A last line without its newline (a writer that died
/// mid-line) is refused like any other bad line.
llvm::Expected<std::vector<KernelSpec>> parse_spec_list(llvm::StringRef text, llvm::StringRef what);

/// Appends `spec` to the spec list `file` (created with its header when missing) unless it is
/// listed already. Refuses (ErrorCode::Io) a file that is not a spec list or not a regular file.
llvm::Error append_to_spec_list(const std::string& file, const KernelSpec& spec);

/// What a Runtime records: each spec once per recorder; a failure to record is reported once on
/// stderr and never fails the call that used the kernel.
class SpecRecorder {
 public:
  explicit SpecRecorder(std::string file) : file_(std::move(file)) {}
  void record(const KernelSpec& spec);

 private:
  std::string file_;
  std::mutex mutex_;
  std::unordered_set<KernelSpec, KernelSpecHash> recorded_;
  bool warned_ = false;
};

}  // namespace exactjit
