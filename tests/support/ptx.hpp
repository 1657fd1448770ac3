// PTX of a spec and regex counts over it, for the CPU tests' PTX audits.
#pragma once

#include "codegen/render.hpp"
#include "runtime/nvrtc.hpp"

#include <gtest/gtest.h>
#include <llvm/Support/Error.h>

#include <iterator>
#include <regex>
#include <string>

namespace exactjit::test {

// How many times pattern occurs in text.
inline size_t count(const std::string& text, const std::regex& pattern) {
  return static_cast<size_t>(
      std::distance(std::sregex_iterator(text.begin(), text.end(), pattern), std::sregex_iterator()));
}
inline size_t count(const std::string& text, const char* pattern) { return count(text, std::regex(pattern)); }

// The NVRTC PTX of spec (empty, with a test failure, if it does not compile).
inline std::string ptx_of(const KernelSpec& spec) {
  const Nvrtc* nvrtc = *Nvrtc::get();
  auto ptx = nvrtc->ptx(codegen::render(spec));
  EXPECT_TRUE(static_cast<bool>(ptx)) << (ptx ? "" : llvm::toString(ptx.takeError()));
  return ptx ? *ptx : std::string();
}

}  // namespace exactjit::test
