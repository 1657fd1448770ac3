// exactjit digests (see digest.hpp).
#include "codegen/digest.hpp"

#include <llvm/ADT/StringExtras.h>
#include <llvm/Support/SHA256.h>

namespace exactjit {

std::string sha256_hex(llvm::StringRef data) {
  llvm::SHA256 sha;
  sha.update(data);
  return llvm::toHex(sha.final(), /*LowerCase=*/true);
}

std::string sha256_fields_hex(std::initializer_list<llvm::StringRef> fields) {
  llvm::SHA256 sha;
  for (llvm::StringRef field : fields) {
    sha.update(std::to_string(field.size()));
    sha.update(":");
    sha.update(field);
  }
  return llvm::toHex(sha.final(), /*LowerCase=*/true);
}

}  // namespace exactjit
