// exactjit device buffer (see device_buffer.hpp).
#include "runtime/device_buffer.hpp"

#include "runtime/errors.hpp"

#include <fmt/format.h>

namespace exactjit {

llvm::Expected<DeviceBuffer> DeviceBuffer::allocate(const Driver& driver, CUcontext context, size_t bytes) {
  ScopedContext scope(driver, context);
  CUdeviceptr address = 0;
  if (auto err = driver.check(driver.cuMemAlloc(&address, bytes == 0 ? 1 : bytes), "cuMemAlloc"))
    return err;
  return DeviceBuffer(driver, context, address, bytes);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : driver_(other.driver_), context_(other.context_), address_(other.address_), bytes_(other.bytes_) {
  other.address_ = 0;
}

DeviceBuffer::~DeviceBuffer() {
  if (!address_) return;
  ScopedContext scope(*driver_, context_);
  driver_->cuMemFree(address_);
}

llvm::Error DeviceBuffer::upload(const void* host, size_t bytes, size_t offset) const {
  if (offset + bytes > bytes_) return make_error(ErrorCode::Internal, "DeviceBuffer::upload past the end");
  ScopedContext scope(*driver_, context_);
  return driver_->check(driver_->cuMemcpyHtoD(address_ + offset, host, bytes), "cuMemcpyHtoD");
}

llvm::Error DeviceBuffer::download(void* host, size_t bytes, size_t offset) const {
  if (offset + bytes > bytes_) return make_error(ErrorCode::Internal, "DeviceBuffer::download past the end");
  ScopedContext scope(*driver_, context_);
  return driver_->check(driver_->cuMemcpyDtoH(host, address_ + offset, bytes), "cuMemcpyDtoH");
}

llvm::Error DeviceBuffer::fill(unsigned char byte) const {
  ScopedContext scope(*driver_, context_);
  return driver_->check(driver_->cuMemsetD8(address_, byte, bytes_), "cuMemsetD8");
}

llvm::Expected<CUcontext> primary_context(const Driver& driver, int device_id) {
  CUdevice device = 0;
  if (auto err = driver.check(driver.cuDeviceGet(&device, device_id), "cuDeviceGet")) return err;
  CUcontext context = nullptr;
  if (auto err = driver.check(driver.cuDevicePrimaryCtxRetain(&context, device), "cuDevicePrimaryCtxRetain"))
    return err;
  return context;
}

}  // namespace exactjit
