// exactjit: the command-line tool. Parses the subcommand and its flags (LLVM CommandLine) and
// runs it. Exit codes: 0 success, 1 the command failed, 2 bad usage (a malformed environment
// variable included).
#include "cli/commands.hpp"
#include "cli/options.hpp"

#include "kernels/op_families.hpp"
#include "runtime/environment.hpp"

#include <fmt/format.h>
#include <llvm/Support/raw_ostream.h>

namespace {

// The overview `exactjit --help` prints: the commands, then the op families and the environment
// variables from the tables the parsers use.
std::string overview() {
  std::string text =
      "exactjit: JIT kernels for the DiT conditioning chain, bitwise equal to PyTorch eager\n\n"
      "  exactjit prewarm [--op OP sizes --dtype D --arch A[,A...] | --manifest F] [--check] [-j N] [--json]\n"
      "  exactjit inspect [spec flags] --emit source|options|key|ptx|sass|manifest\n"
      "  exactjit cache ls|stat|verify [--rebuild]|index [--out F]|prune [--policy P]|clear [--json]\n"
      "  exactjit info [--json]\n"
      "  exactjit selftest [--device N]\n"
      "  exactjit bench [--out DIR] [--sizes S,...]   (GPU machine: reports + plots vs eager/compile)\n\n"
      "Op families (OP: the names in brackets; sizes: the flags after them):\n";
  for (const exactjit::OpFamily& family : exactjit::op_families()) {
    std::string kernels;
    for (exactjit::OpCode op : family.kernels) kernels += (kernels.empty() ? "" : " ") + std::string(op_name(op));
    text += fmt::format("  {:<22} {}\n  {:<22} [{}] {}\n", family.name, family.summary, "", kernels, family.sizes);
  }
  text += "\nEnvironment (booleans: 1/0, true/false, yes/no, on/off; anything else is refused):\n";
  for (const exactjit::EnvironmentVariable& variable : exactjit::environment_variables())
    text += fmt::format("  {:<28} {:<16} {}\n", variable.name, describe_kind(variable), variable.meaning);
  text += "\nExit codes: 0 success, 1 failure, 2 usage error.\n";
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace exactjit::cli;
  llvm::cl::HideUnrelatedOptions(category);
  llvm::cl::SetVersionPrinter([](llvm::raw_ostream& os) { os << "exactjit " << EXACTJIT_VERSION << "\n"; });
  std::string errors;
  llvm::raw_string_ostream error_stream(errors);
  const std::string help = overview();
  if (!llvm::cl::ParseCommandLineOptions(argc, argv, help, &error_stream)) {
    fmt::print(stderr, "{}Run 'exactjit --help' for usage.\n", error_stream.str());
    return kExitUsage;
  }
  if (auto err = exactjit::check_environment()) return report_error(std::move(err));
  if (prewarm_command) return run_prewarm();
  if (inspect_command) return run_inspect();
  if (cache_command) return run_cache();
  if (info_command) return run_info();
  if (selftest_command) return run_selftest();
  if (bench_command) return run_bench();
  fmt::print(stderr, "exactjit: error: no subcommand given. Run 'exactjit --help' for usage.\n");
  return kExitUsage;
}
