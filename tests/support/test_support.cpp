// exactjit test support (see test_support.hpp).
#include "support/test_support.hpp"

#include "codegen/digest.hpp"

#include <llvm/Support/FileSystem.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/Program.h>

#include <fstream>
#include <regex>
#include <sstream>

namespace exactjit::test {

TempDir::TempDir() {
  llvm::SmallString<128> dir;
  if (llvm::sys::fs::createUniqueDirectory("exactjit-test", dir)) ADD_FAILURE() << "cannot create a temp dir";
  path_ = std::string(dir.str());
}

TempDir::~TempDir() {
  // Read-only folders made by tests must become writable again before removal.
  run_command("/bin/chmod", {"-R", "u+w", path_});
  llvm::sys::fs::remove_directories(path_);
}

std::string read_text(const std::string& file) {
  auto buffer = llvm::MemoryBuffer::getFile(file, /*IsText=*/false, /*RequiresNullTerminator=*/false);
  return buffer ? std::string((*buffer)->getBuffer()) : std::string();
}

void write_text(const std::string& file, const std::string& text) {
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out << text;
}

CommandResult run_command(const std::string& program, const std::vector<std::string>& args,
                          const std::vector<std::string>& env) {
  llvm::SmallString<128> out_file, err_file;
  llvm::sys::fs::createTemporaryFile("exactjit-out", "txt", out_file);
  llvm::sys::fs::createTemporaryFile("exactjit-err", "txt", err_file);
  std::vector<llvm::StringRef> argv{program};
  for (const std::string& arg : args) argv.push_back(arg);
  std::vector<std::string> environment;
  for (char** e = environ; *e; ++e) environment.emplace_back(*e);
  for (const std::string& extra : env) {
    const std::string name = extra.substr(0, extra.find('=') + 1);
    for (std::string& existing : environment)
      if (existing.rfind(name, 0) == 0) existing = "XJ_UNSET_=1";  // overridden below
    environment.push_back(extra);
  }
  std::vector<llvm::StringRef> envp(environment.begin(), environment.end());
  const llvm::Optional<llvm::StringRef> redirects[] = {llvm::None, llvm::StringRef(out_file),
                                                       llvm::StringRef(err_file)};
  CommandResult result;
  result.exit_code = llvm::sys::ExecuteAndWait(program, argv, llvm::ArrayRef<llvm::StringRef>(envp), redirects);
  result.out = read_text(std::string(out_file));
  result.err = read_text(std::string(err_file));
  llvm::sys::fs::remove(out_file);
  llvm::sys::fs::remove(err_file);
  return result;
}

namespace {

/// Writes `content` to the entry's `file` and makes the manifest's `<field>_bytes` and
/// `<field>_sha256` match it.
void forge(const std::string& entry, const std::string& file, const std::string& field, const std::string& content) {
  write_text(entry + "/" + file, content);
  std::string m = read_text(entry + "/manifest.json");
  m = std::regex_replace(m, std::regex("\"" + field + "_bytes\": [0-9]+"),
                         "\"" + field + "_bytes\": " + std::to_string(content.size()));
  m = std::regex_replace(m, std::regex("\"" + field + "_sha256\": \"[0-9a-f]+\""),
                         "\"" + field + "_sha256\": \"" + sha256_hex(content) + "\"");
  write_text(entry + "/manifest.json", m);
}

}  // namespace

void forge_image(const std::string& entry, const std::string& image) { forge(entry, "kernel.cubin", "image", image); }

void forge_source(const std::string& entry, const std::string& source) { forge(entry, "kernel.cu", "source", source); }

}  // namespace exactjit::test
