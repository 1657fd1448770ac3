// exactjit CUDA driver (see driver.hpp).
#include "runtime/driver.hpp"

#include "runtime/environment.hpp"
#include "runtime/errors.hpp"

#include <dlfcn.h>
#include <fmt/format.h>

#include <atomic>
#include <cstdlib>
#include <mutex>

namespace exactjit {
namespace {

std::once_flag g_once;
std::atomic<const Driver*> g_driver{nullptr};
std::string g_load_error;

using GetProcAddress = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
constexpr int kApiVersion = 13000;

void load() {
  const std::string forced = environment_text("EXACTJIT_CUDA_LIBRARY");
  const char* name = forced.empty() ? "libcuda.so.1" : forced.c_str();
  void* handle = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    g_load_error = fmt::format("no CUDA driver: cannot load {} ({})", name, dlerror());
    return;
  }
  auto get_proc = reinterpret_cast<GetProcAddress>(dlsym(handle, "cuGetProcAddress_v2"));
  if (!get_proc) {
    g_load_error = fmt::format("CUDA driver {} is older than CUDA 12 (no cuGetProcAddress_v2)", name);
    return;
  }
  auto* driver = new Driver();  // process lifetime, like the library handle
#define XJ_RESOLVE(fn)                                                                          \
  {                                                                                             \
    void* pfn = nullptr;                                                                        \
    CUdriverProcAddressQueryResult status{};                                                    \
    if (get_proc(#fn, &pfn, kApiVersion, CU_GET_PROC_ADDRESS_DEFAULT, &status) != CUDA_SUCCESS || \
        !pfn) {                                                                                 \
      g_load_error = fmt::format("CUDA driver lacks {} (CUDA {} API)", #fn, kApiVersion);      \
      return;                                                                                   \
    }                                                                                           \
    driver->fn = reinterpret_cast<decltype(driver->fn)>(pfn);                                   \
  }
  XJ_DRIVER_FUNCTIONS(XJ_RESOLVE)
#undef XJ_RESOLVE
  if (CUresult rc = driver->cuInit(0); rc != CUDA_SUCCESS) {
    const char* message = nullptr;
    driver->cuGetErrorString(rc, &message);
    g_load_error = fmt::format("cuInit failed: {}", message ? message : "unknown error");
    return;
  }
  driver->cuDriverGetVersion(&driver->version);
  g_driver = driver;
}

}  // namespace

llvm::Expected<const Driver*> Driver::get() {
  std::call_once(g_once, load);
  const Driver* driver = g_driver.load();
  if (!driver) return make_error(ErrorCode::Unavailable, g_load_error);
  return driver;
}

bool Driver::available() {
  auto driver = get();
  if (!driver) {
    llvm::consumeError(driver.takeError());
    return false;
  }
  int count = 0;
  return (*driver)->cuDeviceGetCount(&count) == CUDA_SUCCESS && count > 0;
}

llvm::Error Driver::check(CUresult result, const char* what) const {
  if (result == CUDA_SUCCESS) return llvm::Error::success();
  const char* name = nullptr;
  const char* message = nullptr;
  cuGetErrorName(result, &name);
  cuGetErrorString(result, &message);
  return make_error(ErrorCode::Cuda, fmt::format("{} failed: {} ({})", what, name ? name : "?",
                                                 message ? message : "no message"));
}

ScopedContext::ScopedContext(const Driver& driver, CUcontext context) : driver_(driver) {
  if (driver_.cuCtxGetCurrent(&previous_) == CUDA_SUCCESS && previous_ != context) {
    switched_ = driver_.cuCtxSetCurrent(context) == CUDA_SUCCESS;
  }
}

ScopedContext::~ScopedContext() {
  if (switched_) driver_.cuCtxSetCurrent(previous_);
}

}  // namespace exactjit
