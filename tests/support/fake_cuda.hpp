// The counting fake of libcuda (tests/support/fake_cuda.cpp, built as libexactjit_fake_cuda.so;
// the build passes its path as EXACTJIT_FAKE_CUDA). The runtime loads it through
// EXACTJIT_CUDA_LIBRARY, the only way to reach the copy of the runtime inside libexactjit.so too.
#pragma once

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>

namespace exactjit::test {

class FakeCuda {
 public:
  /// Points the runtime at the fake; call before anything in the process loads the driver.
  FakeCuda() {
    setenv("EXACTJIT_CUDA_LIBRARY", EXACTJIT_FAKE_CUDA, 1);
    void* library = dlopen(EXACTJIT_FAKE_CUDA, RTLD_NOW | RTLD_LOCAL);  // the runtime's copy: same handle
    calls_ = library ? reinterpret_cast<long (*)(const char*)>(dlsym(library, "exactjit_fake_cuda_calls")) : nullptr;
    last_host_allocation_ =
        library ? reinterpret_cast<void* (*)()>(dlsym(library, "exactjit_fake_cuda_last_host_allocation")) : nullptr;
    if (!calls_ || !last_host_allocation_) {
      std::fprintf(stderr, "cannot load the fake driver %s: %s\n", EXACTJIT_FAKE_CUDA, dlerror());
      std::abort();
    }
  }

  /// Calls of one entry point (nullptr: of all of them) so far.
  long calls(const char* entry = nullptr) const { return calls_(entry); }
  /// What the last cuMemHostAlloc returned: a new runtime's error-record mirrors, slot 0 first.
  void* last_host_allocation() const { return last_host_allocation_(); }

 private:
  long (*calls_)(const char*) = nullptr;
  void* (*last_host_allocation_)() = nullptr;
};

}  // namespace exactjit::test
