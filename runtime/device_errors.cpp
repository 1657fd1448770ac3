// exactjit device error records (see device_errors.hpp).
#include "runtime/device_errors.hpp"

#include "codegen/op_row.hpp"
#include "runtime/errors.hpp"

#include <fmt/format.h>

#include <cstring>
#include <mutex>
#include <vector>

namespace exactjit {

namespace {

/// The error a filled record stands for, naming the op and what it found.
llvm::Error report_error(const DeviceErrorRecord& record) {
  const unsigned code = record.op & 0xFFFFu;  // the op's code; the argument sits above it
  const OpRow* row = op_row_by_code(code);
  if (!row)
    return make_error(ErrorCode::BadIndex,
                      fmt::format("a kernel reported a bad index with an unknown op code {}", code));
  const std::string_view argument = index_argument_name(row->op, record.op >> 16);
  if (row->error_value == ErrorValue::FloatBits) {  // the value is the float itself
    float value = 0;
    const uint32_t bits = static_cast<uint32_t>(record.value);
    std::memcpy(&value, &bits, sizeof value);
    return make_error(ErrorCode::BadIndex, fmt::format("{}: {}[{}] = {} is not {}", row->name, argument,
                                                       record.position, value, row->value_rule));
  }
  return make_error(ErrorCode::BadIndex,
                    fmt::format("{}: {}[{}] = {} is out of range [0, {}); the rows that use it were not written",
                                row->name, argument, record.position, record.value, record.bound));
}

}  // namespace

llvm::Expected<std::unique_ptr<StreamErrorRecords>> StreamErrorRecords::create(const Driver& driver,
                                                                               CUcontext context) {
  std::unique_ptr<StreamErrorRecords> records(new StreamErrorRecords(driver, context));
  ScopedContext scope(driver, context);
  constexpr size_t bytes = sizeof(DeviceErrorRecord) * kStreams;
  void* host = nullptr;
  if (auto err = driver.check(driver.cuMemHostAlloc(&host, bytes, CU_MEMHOSTALLOC_DEVICEMAP),
                              "cuMemHostAlloc (error records)"))
    return err;
  records->host_ = static_cast<DeviceErrorRecord*>(host);
  std::memset(host, 0, bytes);
  CUdeviceptr mirrors = 0;
  if (auto err = driver.check(driver.cuMemHostGetDevicePointer(&mirrors, host, 0),
                              "cuMemHostGetDevicePointer (error records)"))
    return err;
  if (auto err = driver.check(driver.cuMemAlloc(&records->device_, bytes), "cuMemAlloc (error records)")) return err;
  std::vector<DeviceErrorRecord> initial(kStreams, DeviceErrorRecord{});
  for (int k = 0; k < kStreams; ++k) initial[k].mirror = mirrors + k * sizeof(DeviceErrorRecord);
  if (auto err = driver.check(driver.cuMemcpyHtoD(records->device_, initial.data(), bytes),
                              "cuMemcpyHtoD (error records)"))
    return err;
  return records;
}

StreamErrorRecords::~StreamErrorRecords() {
  ScopedContext scope(driver_, context_);
  if (device_) driver_.cuMemFree(device_);
  if (host_) driver_.cuMemFreeHost(host_);
}

int StreamErrorRecords::slot(CUstream stream) {
  constexpr size_t kOwn = kStreams - 1;  // streams with a record of their own; the rest share the last
  {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    if (auto it = slots_.find(stream); it != slots_.end()) return it->second;
    if (slots_.size() >= kOwn) return kStreams - 1;  // the map stays bounded, whatever the caller does
  }
  std::lock_guard<std::shared_mutex> lock(mutex_);
  if (auto it = slots_.find(stream); it != slots_.end()) return it->second;
  if (slots_.size() >= kOwn) return kStreams - 1;
  const int next = static_cast<int>(slots_.size());
  slots_.emplace(stream, next);
  return next;
}

CUdeviceptr StreamErrorRecords::record(CUstream stream) { return device_record(slot(stream)); }

DeviceErrorRecord* StreamErrorRecords::mirror(CUstream stream) { return host_ + slot(stream); }

llvm::Expected<CUdeviceptr> StreamErrorRecords::launch_record(CUstream stream) {
  const int slot = this->slot(stream);  // one lookup on the launch path
  if (auto err = take_pending_at(slot, stream)) return err;
  return device_record(slot);
}

llvm::Error StreamErrorRecords::take_pending(CUstream stream) { return take_pending_at(slot(stream), stream); }

llvm::Error StreamErrorRecords::take_pending_at(int slot, CUstream stream) {
  DeviceErrorRecord* mirror = host_ + slot;
  // The kernel writes the fields, fences (membar.sys) and then sets `claimed`: acquire pairs with it.
  if (__atomic_load_n(&mirror->claimed, __ATOMIC_ACQUIRE) == 0) return llvm::Error::success();
  const DeviceErrorRecord report = *mirror;
  ScopedContext scope(driver_, context_);
  // The device record stays claimed (no second report can start) until the memset, queued behind
  // every kernel already on the stream, clears it; the mirror is cleared now.
  std::memset(reinterpret_cast<char*>(mirror) + sizeof(uint32_t), 0, kErrorReportBytes - sizeof(uint32_t));
  __atomic_store_n(&mirror->claimed, 0u, __ATOMIC_RELEASE);
  if (auto err = driver_.check(driver_.cuMemsetD8Async(device_record(slot), 0, kErrorReportBytes, stream),
                               "cuMemsetD8Async (error record)"))
    return err;
  return report_error(report);
}

llvm::Error StreamErrorRecords::synchronize(CUstream stream) {
  ScopedContext scope(driver_, context_);
  if (auto err = driver_.check(driver_.cuStreamSynchronize(stream), "cuStreamSynchronize")) return err;
  return take_pending(stream);
}

}  // namespace exactjit
