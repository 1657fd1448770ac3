// exactjit device error records: one small block of device memory per CUDA context that kernels
// write a bad index into (templates/error_record.cuh) instead of trapping. The host reads it at a
// synchronisation point, turns it into an error naming the op, and clears it; the context stays
// usable throughout.
#pragma once

#include "runtime/driver.hpp"

#include <llvm/Support/Error.h>

#include <cstdint>

namespace exactjit {

/// Host mirror of xj::ErrorRecord (templates/error_record.cuh).
struct DeviceErrorRecord {
  uint32_t claimed;
  uint32_t op;
  int64_t position;
  int64_t value;
  int64_t bound;
};
static_assert(sizeof(DeviceErrorRecord) == 32, "must match templates/error_record.cuh");

/// Allocates and zeroes one record in `context`.
llvm::Expected<CUdeviceptr> allocate_error_record(const Driver& driver, CUcontext context);

/// Waits for `stream`, reads the record and clears it: an error naming the op if a kernel
/// reported a bad index since the last check.
llvm::Error check_error_record(const Driver& driver, CUcontext context, CUstream stream, CUdeviceptr record);

}  // namespace exactjit
