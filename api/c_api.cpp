// exactjit C ABI (include/exactjit/exactjit.h): the entry points that are not ops (version,
// runtime, prewarm, synchronize). Each op's xj_<op> is defined in its op's file (api/c_entry.hpp).
#include "api/c_entry.hpp"
#include "runtime/environment.hpp"

#include <new>
#include <string>

using exactjit::c_abi::fail;
using exactjit::c_abi::finish;

extern "C" {

const char* xj_version(void) { return EXACTJIT_VERSION; }

const char* xj_last_error(void) { return exactjit::c_abi::last_error.c_str(); }

exactjit_status_t xj_runtime_create(const xj_runtime_options* options, xj_runtime** runtime) {
  if (!runtime) return fail(XJ_ERROR_INVALID_ARGUMENT, "xj_runtime_create: runtime must not be NULL");
  *runtime = nullptr;
  exactjit::RuntimeOptions resolved = exactjit::RuntimeOptions::from_environment();
  if (!resolved.environment_error.empty())
    return fail(XJ_ERROR_INVALID_ARGUMENT, "xj_runtime_create: " + resolved.environment_error);
  if (options) {
    if (options->struct_size < sizeof(xj_runtime_options))
      return fail(XJ_ERROR_INVALID_ARGUMENT,
                  "xj_runtime_create: options->struct_size must be sizeof(xj_runtime_options)");
    if (options->cache_dir) resolved.cache_dir = options->cache_dir;
    if (options->read_only_cache_path)
      resolved.read_only_dirs = exactjit::split_path_list(options->read_only_cache_path);
    if (options->offline >= 0) resolved.offline = options->offline != 0;
    if (options->arch) resolved.arch = options->arch;
    if (options->check_after_launch >= 0) resolved.check_after_launch = options->check_after_launch != 0;
  }
  *runtime = new (std::nothrow) xj_runtime(std::move(resolved));
  if (!*runtime) return fail(XJ_ERROR_INTERNAL, "xj_runtime_create: out of memory");
  exactjit::c_abi::last_error.clear();
  return XJ_OK;
}

void xj_runtime_destroy(xj_runtime* runtime) { delete runtime; }

const char* xj_runtime_info(xj_runtime* runtime) { return runtime ? runtime->info.c_str() : ""; }

exactjit_status_t xj_prewarm(xj_runtime* runtime, const char* spec) {
  if (!runtime) return fail(XJ_ERROR_INVALID_ARGUMENT, "prewarm: runtime must not be NULL");
  if (!spec) return fail(XJ_ERROR_INVALID_ARGUMENT, "prewarm: spec must not be NULL");
  return finish(runtime->runtime.prewarm(spec));
}

exactjit_status_t xj_synchronize(xj_runtime* runtime, int device_id, void* stream) {
  if (!runtime) return fail(XJ_ERROR_INVALID_ARGUMENT, "synchronize: runtime must not be NULL");
  return finish(runtime->runtime.synchronize(device_id, stream));
}

}  // extern "C"
