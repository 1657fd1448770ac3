// exactjit device error records: where a kernel writes a bad index (templates/error_record.cuh)
// instead of trapping, so the CUDA context stays usable. One record per stream: the first
// offending thread claims the record in device memory and writes its report into the record's
// host-mapped mirror, so the host sees the error without synchronising. Every launch on a stream first takes
// the error pending there (the call fails naming the op that found it, and launches nothing);
// synchronize() waits for the stream, then does the same, for a definite answer.
#pragma once

#include "runtime/driver.hpp"

#include <llvm/Support/Error.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <shared_mutex>
#include <unordered_map>

namespace exactjit {

/// Host mirror of xj::ErrorRecord (templates/error_record.cuh).
struct DeviceErrorRecord {
  uint32_t claimed;
  uint32_t op;
  int64_t position;
  int64_t value;
  int64_t bound;
  uint64_t mirror;  ///< device address of the host-mapped copy (0: none)
};
static_assert(sizeof(DeviceErrorRecord) == 40, "must match templates/error_record.cuh");
/// The bytes a report fills (everything but the mirror address), cleared after it is read.
inline constexpr size_t kErrorReportBytes = offsetof(DeviceErrorRecord, mirror);

/// The error records of one CUDA context. A fixed slab of kStreams records is allocated with the
/// context, so a stream first seen under CUDA graph capture needs no allocation; each stream
/// handle gets its own record on first use, and streams beyond the first kStreams - 1 share the
/// last one (their errors are reported to each other). Thread-safe.
class StreamErrorRecords {
 public:
  static constexpr int kStreams = 256;

  static llvm::Expected<std::unique_ptr<StreamErrorRecords>> create(const Driver& driver, CUcontext context);
  ~StreamErrorRecords();
  StreamErrorRecords(const StreamErrorRecords&) = delete;
  StreamErrorRecords& operator=(const StreamErrorRecords&) = delete;

  /// The device address of `stream`'s record, the kernel parameter of every launch on it.
  CUdeviceptr record(CUstream stream);
  /// The bad index a kernel on `stream` reported since the last check, read from the host mirror
  /// without a synchronisation (a report still in flight shows at a later call); clears it: the
  /// mirror at once, the device record in stream order (an async memset on `stream`).
  llvm::Error take_pending(CUstream stream);
  /// For a launch on `stream`: take_pending, then record (one lookup for both).
  llvm::Expected<CUdeviceptr> launch_record(CUstream stream);
  /// Waits for `stream`, then take_pending: every kernel queued before has reported.
  llvm::Error synchronize(CUstream stream);

  /// The host mirror of `stream`'s record (tests write a report into it as a kernel would).
  DeviceErrorRecord* mirror(CUstream stream);

 private:
  StreamErrorRecords(const Driver& driver, CUcontext context) : driver_(driver), context_(context) {}
  int slot(CUstream stream);
  CUdeviceptr device_record(int slot) const {
    return device_ + static_cast<CUdeviceptr>(slot) * sizeof(DeviceErrorRecord);
  }
  llvm::Error take_pending_at(int slot, CUstream stream);

  const Driver& driver_;
  CUcontext context_;
  CUdeviceptr device_ = 0;              // kStreams records in device memory
  DeviceErrorRecord* host_ = nullptr;   // kStreams mirrors in host-mapped pinned memory
  std::shared_mutex mutex_;
  std::unordered_map<CUstream, int> slots_;
};

}  // namespace exactjit
