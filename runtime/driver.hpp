// exactjit CUDA driver: libcuda.so.1 loaded with dlopen when a launch first needs it, every entry
// point resolved once through cuGetProcAddress (CUDA 13 semantics) and listed once, with its type.
#pragma once

#include <cuda.h>
#include <llvm/Support/Error.h>

#include <string>

namespace exactjit {

#define XJ_DRIVER_FUNCTIONS(X)                                                                  \
  X(cuInit) X(cuDriverGetVersion) X(cuGetErrorName) X(cuGetErrorString) X(cuDeviceGet)         \
  X(cuDeviceGetCount) X(cuDeviceGetName) X(cuDeviceGetAttribute) X(cuDevicePrimaryCtxRetain)   \
  X(cuDevicePrimaryCtxRelease)                                                                \
  X(cuCtxGetCurrent) X(cuCtxSetCurrent)                                                        \
  X(cuModuleLoadData) X(cuModuleUnload) X(cuModuleGetFunction) X(cuFuncSetAttribute)          \
  X(cuLaunchKernel)                                                                            \
  X(cuMemAlloc) X(cuMemFree) X(cuMemcpyHtoD) X(cuMemcpyDtoH) X(cuMemsetD8) X(cuMemsetD8Async)  \
  X(cuMemHostAlloc) X(cuMemFreeHost) X(cuMemHostGetDevicePointer)                              \
  X(cuStreamSynchronize)                                                                       \
  X(cuEventCreate) X(cuEventDestroy) X(cuEventRecord) X(cuEventSynchronize) X(cuEventElapsedTime) \
  X(cuMemcpyDtoDAsync)

struct Driver {
#define XJ_DECLARE(name) decltype(&::name) name = nullptr;
  XJ_DRIVER_FUNCTIONS(XJ_DECLARE)
#undef XJ_DECLARE
  int version = 0;  ///< cuDriverGetVersion, e.g. 13000

  /// Loads libcuda.so.1 (or EXACTJIT_CUDA_LIBRARY) and calls cuInit once per process.
  static llvm::Expected<const Driver*> get();
  /// Whether a driver with at least one device is present; loads it if needed, never fails.
  static bool available();

  /// Turns a failed driver call into an error naming the call and the driver's message.
  llvm::Error check(CUresult result, const char* what) const;
};

/// RAII: makes `context` current on this thread for a scope and restores the previous one.
class ScopedContext {
 public:
  ScopedContext(const Driver& driver, CUcontext context);
  ~ScopedContext();
  ScopedContext(const ScopedContext&) = delete;
  ScopedContext& operator=(const ScopedContext&) = delete;

 private:
  const Driver& driver_;
  CUcontext previous_ = nullptr;
  bool switched_ = false;
};

}  // namespace exactjit
