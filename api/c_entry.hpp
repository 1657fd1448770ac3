// exactjit C ABI internals (include/exactjit/exactjit.h): the runtime handle, the calling thread's
// last message, and the one shape of every op's entry point. api/c_api.cpp defines the entry
// points that are not ops; each op's file (kernels/<op>.cpp) defines its own xj_<op> with
// call_op, so adding an op edits no file here. No exception or C++ type crosses this boundary.
#pragma once

#include "exactjit/exactjit.h"

#include "api/runtime.hpp"

#include <initializer_list>
#include <string>
#include <string_view>

struct xj_runtime {
  explicit xj_runtime(exactjit::RuntimeOptions options) : runtime(std::move(options)), info(runtime.info()) {}
  exactjit::Runtime runtime;
  const std::string info;  // options never change, so xj_runtime_info's text is made once
};

namespace exactjit::c_abi {

/// The calling thread's last message (xj_last_error); one per thread within the library.
inline thread_local std::string last_error;

inline exactjit_status_t finish(const Status& status) {
  last_error = status.message();
  return static_cast<exactjit_status_t>(status.code());
}

inline exactjit_status_t fail(exactjit_status_t code, std::string message) {
  last_error = std::move(message);
  return code;
}

/// A pointer argument the entry point requires, by its name in exactjit.h.
struct Required {
  std::string_view name;
  const void* pointer;
};

/// An op's entry point: the runtime and every required argument non-null (else the first null
/// one is named), then `run(runtime)` (plan and launch: Runtime::launch), whose status the call
/// returns.
template <typename Run>
exactjit_status_t call_op(xj_runtime* runtime, std::string_view op, std::initializer_list<Required> required, Run run) {
  if (!runtime) return fail(XJ_ERROR_INVALID_ARGUMENT, std::string(op) + ": runtime must not be NULL");
  for (const Required& argument : required)
    if (!argument.pointer)
      return fail(XJ_ERROR_INVALID_ARGUMENT, std::string(op) + ": " + std::string(argument.name) + " must not be NULL");
  return finish(run(runtime->runtime));
}

}  // namespace exactjit::c_abi
