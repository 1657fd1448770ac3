// exactjit cache keys (see content_key.hpp).
#include "runtime/content_key.hpp"

#include "codegen/digest.hpp"
#include "codegen/render.hpp"

namespace exactjit {

std::string source_key(const KernelSource& source) {
  std::string options;
  for (const std::string& option : source.options) options += option + '\n';
  return sha256_fields_hex({codegen::kGeneratorVersion, source.text, options, source.spec.target.name()});
}

std::string content_key(llvm::StringRef source_key, llvm::StringRef compiler_tag) {
  return sha256_fields_hex({source_key, compiler_tag});
}

}  // namespace exactjit
