// exactjit test support: temporary cache folders, running the CLI, reading files.
#pragma once

#include <llvm/Support/Error.h>

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace exactjit::test {

/// A fresh folder under the system temp dir, removed with everything in it at scope exit.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

struct CommandResult {
  int exit_code = -1;
  std::string out;  ///< stdout
  std::string err;  ///< stderr
};

/// Runs a program with arguments and extra environment (NAME=value) and collects its output.
CommandResult run_command(const std::string& program, const std::vector<std::string>& args,
                          const std::vector<std::string>& env = {});

std::string read_text(const std::string& file);
void write_text(const std::string& file, const std::string& text);

/// Swaps the image of the cache entry folder `entry` for `image` and rewrites its manifest's image
/// size and SHA-256 to match: what someone who can write a layer can do. The entry still verifies
/// against its own manifest.
void forge_image(const std::string& entry, const std::string& image);
/// The same for kernel.cu: `source` written and the manifest's source size and hash made to match.
void forge_source(const std::string& entry, const std::string& source);

/// Fails the test with the error's message if it is an error; returns the value.
template <typename T> T expect_value(llvm::Expected<T> value) {
  if (!value) {
    ADD_FAILURE() << llvm::toString(value.takeError());
    return T{};
  }
  return std::move(*value);
}

}  // namespace exactjit::test
