// exactjit: the command-line tool. Parses the subcommand and its flags (LLVM CommandLine) and
// runs it. Exit codes: 0 success, 1 the command failed, 2 bad usage.
#include "cli/commands.hpp"
#include "cli/options.hpp"

#include <fmt/format.h>
#include <llvm/Support/raw_ostream.h>

int main(int argc, char** argv) {
  using namespace exactjit::cli;
  llvm::cl::HideUnrelatedOptions(category);
  llvm::cl::SetVersionPrinter([](llvm::raw_ostream& os) { os << "exactjit " << EXACTJIT_VERSION << "\n"; });
  std::string errors;
  llvm::raw_string_ostream error_stream(errors);
  const bool parsed = llvm::cl::ParseCommandLineOptions(
      argc, argv,
      "exactjit: JIT kernels for the DiT conditioning chain, bitwise equal to PyTorch eager\n\n"
      "  exactjit prewarm [--op OP --hidden H --dtype D --table-stride N --arch A | --manifest F] [-j N]\n"
      "     OP: gate_residual | adaln_row_gather | rms_norm (plain without --table-stride)\n"
      "  exactjit inspect [spec flags] --emit source|options|key|ptx|sass|manifest\n"
      "  exactjit cache ls|stat|verify [--rebuild]|index [--out F]|prune|clear\n"
      "  exactjit info\n"
      "  exactjit selftest [--device N]\n"
      "  exactjit bench [--out DIR] [--sizes S,...]   (GPU machine: reports + plots vs eager/compile)\n\n"
      "Environment: EXACTJIT_CACHE_DIR, EXACTJIT_CACHE_PATH, EXACTJIT_OFFLINE, EXACTJIT_NVRTC_LIBRARY.\n"
      "Exit codes: 0 success, 1 failure, 2 usage error.\n",
      &error_stream);
  if (!parsed) {
    fmt::print(stderr, "{}Run 'exactjit --help' for usage.\n", error_stream.str());
    return kExitUsage;
  }
  if (prewarm_command) return run_prewarm();
  if (inspect_command) return run_inspect();
  if (cache_command) return run_cache();
  if (info_command) return run_info();
  if (selftest_command) return run_selftest();
  if (bench_command) return run_bench();
  fmt::print(stderr, "exactjit: error: no subcommand given. Run 'exactjit --help' for usage.\n");
  return kExitUsage;
}
