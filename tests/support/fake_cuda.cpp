// A stand-in for libcuda.so.1 (load it with EXACTJIT_CUDA_LIBRARY): one sm_90 device whose entry
// points do nothing but count their calls, so the dispatch path can be measured and its driver
// calls pinned on a machine without a GPU. What the runtime itself allocates (its error records)
// is real host memory, "device" and host-mapped alike (one address space, as with unified
// addressing), so copies and memsets really happen and a test can play a kernel that reports a
// bad index by writing a record's mirror. Kernels never run; tensors are the caller's addresses.
#include "runtime/driver.hpp"  // XJ_DRIVER_FUNCTIONS: the entry points the runtime resolves

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace {

#define XJ_SLOT(name) name##_slot,
enum Slot : int { XJ_DRIVER_FUNCTIONS(XJ_SLOT) kSlots };
#undef XJ_SLOT

#define XJ_NAME(name) #name,
constexpr const char* kNames[kSlots] = {XJ_DRIVER_FUNCTIONS(XJ_NAME)};
#undef XJ_NAME

std::atomic<long> g_calls[kSlots];
std::atomic<uintptr_t> g_next_handle{0x10000};
thread_local CUcontext t_current = nullptr;

void count(Slot slot) { g_calls[slot].fetch_add(1, std::memory_order_relaxed); }
uintptr_t new_handle() { return g_next_handle.fetch_add(0x100, std::memory_order_relaxed); }

/// Every entry point without outputs: counted, always succeeds.
template <Slot slot, typename... Args> CUresult succeed(Args...) {
  count(slot);
  return CUDA_SUCCESS;
}

/// Counts the call and writes its one output.
template <typename T> CUresult answer(Slot slot, T* output, T value) {
  count(slot);
  *output = value;
  return CUDA_SUCCESS;
}

CUresult driver_get_version(int* version) { return answer(cuDriverGetVersion_slot, version, 13000); }
CUresult get_error_name(CUresult, const char** name) { return answer(cuGetErrorName_slot, name, "CUDA_ERROR_FAKE"); }
CUresult get_error_string(CUresult, const char** message) {
  return answer(cuGetErrorString_slot, message, "an error of the fake driver");
}
CUresult device_get(CUdevice* device, int ordinal) { return answer(cuDeviceGet_slot, device, ordinal); }
CUresult device_get_count(int* devices) { return answer(cuDeviceGetCount_slot, devices, 1); }
CUresult device_get_attribute(int* value, CUdevice_attribute attribute, CUdevice) {
  return answer(cuDeviceGetAttribute_slot, value, attribute == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR ? 9 : 0);
}
CUresult primary_ctx_retain(CUcontext* context, CUdevice device) {
  return answer(cuDevicePrimaryCtxRetain_slot, context, reinterpret_cast<CUcontext>(uintptr_t{0xC0000} + device));
}
CUresult ctx_get_current(CUcontext* context) { return answer(cuCtxGetCurrent_slot, context, t_current); }
CUresult module_load_data(CUmodule* module, const void*) {
  return answer(cuModuleLoadData_slot, module, reinterpret_cast<CUmodule>(new_handle()));
}
CUresult module_get_function(CUfunction* function, CUmodule, const char*) {
  return answer(cuModuleGetFunction_slot, function, reinterpret_cast<CUfunction>(new_handle()));
}
void* allocate(size_t bytes) { return std::aligned_alloc(256, (bytes + 255) / 256 * 256); }

CUresult mem_alloc(CUdeviceptr* address, size_t bytes) {
  void* memory = allocate(bytes);
  if (!memory) return CUDA_ERROR_OUT_OF_MEMORY;
  return answer(cuMemAlloc_slot, address, reinterpret_cast<CUdeviceptr>(memory));
}
CUresult mem_free(CUdeviceptr address) {
  count(cuMemFree_slot);
  std::free(reinterpret_cast<void*>(address));
  return CUDA_SUCCESS;
}
std::atomic<void*> g_last_host_allocation{nullptr};

CUresult mem_host_alloc(void** host, size_t bytes, unsigned) {
  void* memory = allocate(bytes);
  if (!memory) return CUDA_ERROR_OUT_OF_MEMORY;
  g_last_host_allocation.store(memory);
  return answer(cuMemHostAlloc_slot, host, memory);
}
CUresult mem_free_host(void* host) {
  count(cuMemFreeHost_slot);
  std::free(host);
  return CUDA_SUCCESS;
}
CUresult mem_host_get_device_pointer(CUdeviceptr* device, void* host, unsigned) {
  return answer(cuMemHostGetDevicePointer_slot, device, reinterpret_cast<CUdeviceptr>(host));
}
CUresult memcpy_htod(CUdeviceptr device, const void* host, size_t bytes) {
  count(cuMemcpyHtoD_slot);
  std::memcpy(reinterpret_cast<void*>(device), host, bytes);
  return CUDA_SUCCESS;
}
CUresult memcpy_dtoh(void* host, CUdeviceptr device, size_t bytes) {
  count(cuMemcpyDtoH_slot);
  std::memcpy(host, reinterpret_cast<const void*>(device), bytes);
  return CUDA_SUCCESS;
}
CUresult memset_d8(CUdeviceptr device, unsigned char value, size_t bytes) {
  count(cuMemsetD8_slot);
  std::memset(reinterpret_cast<void*>(device), value, bytes);
  return CUDA_SUCCESS;
}
CUresult memset_d8_async(CUdeviceptr device, unsigned char value, size_t bytes, CUstream) {
  count(cuMemsetD8Async_slot);
  std::memset(reinterpret_cast<void*>(device), value, bytes);
  return CUDA_SUCCESS;
}
CUresult event_create(CUevent* event, unsigned) {
  return answer(cuEventCreate_slot, event, reinterpret_cast<CUevent>(new_handle()));
}
CUresult event_elapsed_time(float* milliseconds, CUevent, CUevent) {
  return answer(cuEventElapsedTime_slot, milliseconds, 0.0f);
}

CUresult device_get_name(char* name, int length, CUdevice) {
  count(cuDeviceGetName_slot);
  std::strncpy(name, "exactjit fake device", static_cast<size_t>(length));
  return CUDA_SUCCESS;
}
CUresult ctx_set_current(CUcontext context) {
  count(cuCtxSetCurrent_slot);
  t_current = context;
  return CUDA_SUCCESS;
}
void* entry_point(const char* symbol) {
  struct Override {
    const char* name;
    void* function;
  };
  // Type-checked: each fake has its entry point's exact type.
#define XJ_OVERRIDE(name, fake) {#name, reinterpret_cast<void*>(static_cast<decltype(&::name)>(&fake))}
  const Override overrides[] = {
      XJ_OVERRIDE(cuDriverGetVersion, driver_get_version),
      XJ_OVERRIDE(cuGetErrorName, get_error_name),
      XJ_OVERRIDE(cuGetErrorString, get_error_string),
      XJ_OVERRIDE(cuDeviceGet, device_get),
      XJ_OVERRIDE(cuDeviceGetCount, device_get_count),
      XJ_OVERRIDE(cuDeviceGetName, device_get_name),
      XJ_OVERRIDE(cuDeviceGetAttribute, device_get_attribute),
      XJ_OVERRIDE(cuDevicePrimaryCtxRetain, primary_ctx_retain),
      XJ_OVERRIDE(cuCtxGetCurrent, ctx_get_current),
      XJ_OVERRIDE(cuCtxSetCurrent, ctx_set_current),
      XJ_OVERRIDE(cuModuleLoadData, module_load_data),
      XJ_OVERRIDE(cuModuleGetFunction, module_get_function),
      XJ_OVERRIDE(cuMemAlloc, mem_alloc),
      XJ_OVERRIDE(cuMemFree, mem_free),
      XJ_OVERRIDE(cuMemHostAlloc, mem_host_alloc),
      XJ_OVERRIDE(cuMemFreeHost, mem_free_host),
      XJ_OVERRIDE(cuMemHostGetDevicePointer, mem_host_get_device_pointer),
      XJ_OVERRIDE(cuMemcpyHtoD, memcpy_htod),
      XJ_OVERRIDE(cuMemcpyDtoH, memcpy_dtoh),
      XJ_OVERRIDE(cuMemsetD8, memset_d8),
      XJ_OVERRIDE(cuMemsetD8Async, memset_d8_async),
      XJ_OVERRIDE(cuEventCreate, event_create),
      XJ_OVERRIDE(cuEventElapsedTime, event_elapsed_time),
  };
#undef XJ_OVERRIDE

  for (const Override& o : overrides)
    if (std::strcmp(symbol, o.name) == 0) return o.function;
  // The rest, each with its own type so no call goes through a mismatched pointer.
#define XJ_SUCCEED(name)             \
  if (std::strcmp(symbol, #name) == 0) \
    return reinterpret_cast<void*>(static_cast<decltype(&::name)>(&succeed<name##_slot>));
  XJ_DRIVER_FUNCTIONS(XJ_SUCCEED)
#undef XJ_SUCCEED
  return nullptr;
}

}  // namespace

extern "C" {

CUresult cuGetProcAddress_v2(const char* symbol, void** function, int, cuuint64_t,
                             CUdriverProcAddressQueryResult* status) {
  *function = entry_point(symbol);
  if (status) *status = *function ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  return *function ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

/// Calls of one entry point (nullptr: of all of them) since the library was loaded.
long exactjit_fake_cuda_calls(const char* entry) {
  long total = 0;
  for (int slot = 0; slot < kSlots; ++slot)
    if (!entry || std::strcmp(entry, kNames[slot]) == 0) total += g_calls[slot].load(std::memory_order_relaxed);
  return total;
}

/// The memory the last cuMemHostAlloc returned (a runtime's error-record mirrors), or null.
void* exactjit_fake_cuda_last_host_allocation() { return g_last_host_allocation.load(); }

}  // extern "C"
