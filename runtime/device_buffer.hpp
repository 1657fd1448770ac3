// exactjit device buffer: RAII device memory in a CUDA context, for the self-test and the GPU
// tests (ops themselves never allocate; callers own their tensors).
#pragma once

#include "runtime/driver.hpp"

#include <llvm/Support/Error.h>

#include <cstddef>

namespace exactjit {

class DeviceBuffer {
 public:
  static llvm::Expected<DeviceBuffer> allocate(const Driver& driver, CUcontext context, size_t bytes);
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&&) = delete;
  DeviceBuffer(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  CUdeviceptr address() const { return address_; }
  size_t bytes() const { return bytes_; }
  llvm::Error upload(const void* host, size_t bytes, size_t offset = 0) const;
  llvm::Error download(void* host, size_t bytes, size_t offset = 0) const;
  llvm::Error fill(unsigned char byte) const;

 private:
  DeviceBuffer(const Driver& driver, CUcontext context, CUdeviceptr address, size_t bytes)
      : driver_(&driver), context_(context), address_(address), bytes_(bytes) {}
  const Driver* driver_;
  CUcontext context_;
  CUdeviceptr address_;
  size_t bytes_;
};

/// The primary context of a device, retained for the life of the process.
llvm::Expected<CUcontext> primary_context(const Driver& driver, int device_id);

}  // namespace exactjit
