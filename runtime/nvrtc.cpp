// exactjit NVRTC compiler (see nvrtc.hpp). Each entry point is listed once with its type from
// nvrtc.h; the library is dlopened so that exactjit starts on machines without the toolkit.
#include "runtime/nvrtc.hpp"

#include "codegen/digest.hpp"
#include "runtime/environment.hpp"
#include "runtime/errors.hpp"

#include <dlfcn.h>
#include <fmt/format.h>
#include <nvrtc.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <mutex>

namespace exactjit {

#define XJ_NVRTC_FUNCTIONS(X)                                                                  \
  X(nvrtcVersion) X(nvrtcGetNumSupportedArchs) X(nvrtcGetSupportedArchs) X(nvrtcCreateProgram) \
  X(nvrtcDestroyProgram) X(nvrtcCompileProgram) X(nvrtcGetProgramLogSize)                     \
  X(nvrtcGetProgramLog) X(nvrtcGetCUBINSize) X(nvrtcGetCUBIN) X(nvrtcGetPTXSize)              \
  X(nvrtcGetPTX) X(nvrtcGetErrorString)

struct Nvrtc::Api {
#define XJ_DECLARE(name) decltype(&::name) name = nullptr;
  XJ_NVRTC_FUNCTIONS(XJ_DECLARE)
#undef XJ_DECLARE
};

namespace {

std::once_flag g_once;
std::atomic<const Nvrtc*> g_instance{nullptr};
std::string g_load_error;

std::vector<std::string> candidate_libraries() {
  std::vector<std::string> names;
  if (std::string forced = environment_text("EXACTJIT_NVRTC_LIBRARY"); !forced.empty()) {
    names.push_back(forced);
    return names;  // an explicit choice is not second-guessed
  }
  names = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"};
  if (const char* home = std::getenv("CUDA_HOME"); home && *home)
    names.push_back(std::string(home) + "/lib64/libnvrtc.so.13");
  names.push_back("/usr/local/cuda/lib64/libnvrtc.so.13");
  names.push_back("/usr/local/cuda/lib64/libnvrtc.so.12");
  return names;
}

std::string join_options(const std::vector<std::string>& options) {
  std::string joined;
  for (const std::string& option : options) joined += (joined.empty() ? "" : " ") + option;
  return joined;
}

}  // namespace

std::string CompilerIdentity::tag() const {
  const std::string file = library_path.substr(library_path.find_last_of('/') + 1);
  const std::string fingerprint = sha256_fields_hex({file, std::to_string(library_size)});
  return fmt::format("nvrtc-{}.{}-{}", major, minor, fingerprint.substr(0, 8));
}

bool Nvrtc::loaded() { return g_instance.load() != nullptr; }

llvm::Expected<const Nvrtc*> Nvrtc::get() {
  std::call_once(g_once, [] {
    void* handle = nullptr;
    std::string tried;
    for (const std::string& name : candidate_libraries()) {
      handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (handle) break;
      tried += fmt::format("\n  {}: {}", name, dlerror());
    }
    if (!handle) {
      g_load_error = "cannot load NVRTC (set EXACTJIT_NVRTC_LIBRARY to libnvrtc.so); tried:" + tried;
      return;
    }
    auto* api = new Nvrtc::Api();  // lives as long as the process, like the library
#define XJ_RESOLVE(name)                                                             \
  api->name = reinterpret_cast<decltype(api->name)>(dlsym(handle, #name));          \
  if (!api->name) {                                                                  \
    g_load_error = fmt::format("NVRTC library lacks the entry point {}", #name);     \
    return;                                                                          \
  }
    XJ_NVRTC_FUNCTIONS(XJ_RESOLVE)
#undef XJ_RESOLVE
    auto* nvrtc = new Nvrtc();
    nvrtc->api_ = api;
    api->nvrtcVersion(&nvrtc->identity_.major, &nvrtc->identity_.minor);
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(api->nvrtcVersion), &info) && info.dli_fname) {
      char resolved[PATH_MAX];
      nvrtc->identity_.library_path = realpath(info.dli_fname, resolved) ? resolved : info.dli_fname;
      struct stat st {};
      if (stat(nvrtc->identity_.library_path.c_str(), &st) == 0)
        nvrtc->identity_.library_size = static_cast<uint64_t>(st.st_size);
    }
    int count = 0;
    if (api->nvrtcGetNumSupportedArchs(&count) == NVRTC_SUCCESS && count > 0) {
      nvrtc->archs_.resize(static_cast<size_t>(count));
      api->nvrtcGetSupportedArchs(nvrtc->archs_.data());
    }
    g_instance = nvrtc;
  });
  const Nvrtc* instance = g_instance.load();
  if (!instance) return make_error(ErrorCode::Unavailable, g_load_error);
  return instance;
}

llvm::Expected<CompileOutput> Nvrtc::compile(const KernelSource& source) const {
  return run(source, source.options, source.spec.target.ptx);
}

llvm::Expected<std::string> Nvrtc::ptx(const KernelSource& source) const {
  std::vector<std::string> options = source.options;
  Target virtual_target = source.spec.target;
  virtual_target.ptx = true;
  for (std::string& option : options)
    if (option.rfind("--gpu-architecture=", 0) == 0) option = "--gpu-architecture=" + virtual_target.name();
  auto output = run(source, options, /*want_ptx=*/true);
  if (!output) return output.takeError();
  return std::move(output->image);
}

llvm::Expected<CompileOutput> Nvrtc::run(const KernelSource& source,
                                         const std::vector<std::string>& options,
                                         bool want_ptx) const {
  const auto start = std::chrono::steady_clock::now();
  const std::string file_name = source.entry + ".cu";
  nvrtcProgram program = nullptr;
  nvrtcResult rc = api_->nvrtcCreateProgram(&program, source.text.c_str(), file_name.c_str(), 0,
                                            nullptr, nullptr);
  if (rc != NVRTC_SUCCESS)
    return make_error(ErrorCode::CompileFailed, fmt::format("nvrtcCreateProgram for {}: {}",
                                                            source.spec.describe(),
                                                            api_->nvrtcGetErrorString(rc)));
  std::vector<const char*> argv;
  for (const std::string& option : options) argv.push_back(option.c_str());
  rc = api_->nvrtcCompileProgram(program, static_cast<int>(argv.size()), argv.data());

  CompileOutput output;
  size_t log_size = 0;
  if (api_->nvrtcGetProgramLogSize(program, &log_size) == NVRTC_SUCCESS && log_size > 1) {
    output.log.resize(log_size);
    api_->nvrtcGetProgramLog(program, output.log.data());
    output.log.resize(log_size - 1);  // drop the terminating NUL
  }
  if (rc != NVRTC_SUCCESS) {
    api_->nvrtcDestroyProgram(&program);
    return make_error(ErrorCode::CompileFailed,
                      fmt::format("NVRTC failed to compile {} ({}): {}\n  options: {}\n  log:\n{}",
                                  source.spec.describe(), file_name, api_->nvrtcGetErrorString(rc),
                                  join_options(options), output.log));
  }
  size_t size = 0;
  if (want_ptx) {
    rc = api_->nvrtcGetPTXSize(program, &size);
    if (rc == NVRTC_SUCCESS) {
      output.image.resize(size);
      rc = api_->nvrtcGetPTX(program, output.image.data());
      if (!output.image.empty() && output.image.back() == '\0') output.image.pop_back();
    }
    output.is_ptx = true;
  } else {
    rc = api_->nvrtcGetCUBINSize(program, &size);
    if (rc == NVRTC_SUCCESS) {
      output.image.resize(size);
      rc = api_->nvrtcGetCUBIN(program, output.image.data());
    }
  }
  api_->nvrtcDestroyProgram(&program);
  if (rc != NVRTC_SUCCESS || output.image.empty())
    return make_error(ErrorCode::CompileFailed,
                      fmt::format("NVRTC produced no {} for {}: {}", want_ptx ? "PTX" : "cubin",
                                  source.spec.describe(), api_->nvrtcGetErrorString(rc)));
  output.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return output;
}

}  // namespace exactjit
