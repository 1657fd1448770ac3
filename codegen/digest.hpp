// exactjit digests: SHA-256 in lower-case hex, used for entry names, cache keys and manifests.
#pragma once

#include <llvm/ADT/StringRef.h>

#include <initializer_list>
#include <string>

namespace exactjit {

std::string sha256_hex(llvm::StringRef data);

/// SHA-256 over several fields, each length-prefixed so that no two different field lists hash
/// the same byte stream.
std::string sha256_fields_hex(std::initializer_list<llvm::StringRef> fields);

}  // namespace exactjit
