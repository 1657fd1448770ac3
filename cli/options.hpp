// exactjit command line: the subcommands and their flags (defined together in options.cpp so
// that every flag is registered after the subcommands it belongs to).
#pragma once

#include <llvm/Support/CommandLine.h>

#include <string>

namespace exactjit::cli {

extern llvm::cl::OptionCategory category;
extern llvm::cl::SubCommand prewarm_command;
extern llvm::cl::SubCommand inspect_command;
extern llvm::cl::SubCommand cache_command;
extern llvm::cl::SubCommand info_command;
extern llvm::cl::SubCommand selftest_command;
extern llvm::cl::SubCommand bench_command;
extern llvm::cl::opt<std::string> bench_out_flag;    // bench
extern llvm::cl::opt<std::string> bench_dir_flag;    // bench
extern llvm::cl::opt<std::string> bench_sizes_flag;  // bench

// Spec flags (prewarm, inspect).
extern llvm::cl::opt<std::string> op_flag;
extern llvm::cl::opt<long long> hidden_flag;
extern llvm::cl::opt<std::string> dtype_flag;
extern llvm::cl::opt<long long> table_stride_flag;
extern llvm::cl::opt<std::string> arch_flag;
extern llvm::cl::opt<std::string> index_type_flag;  // inspect: one spec
extern llvm::cl::opt<int> vec_flag;                 // inspect: one spec
extern llvm::cl::opt<bool> unweighted_flag;         // inspect: one spec
extern llvm::cl::opt<long long> rows_flag;          // inspect: one spec (det_linear backward)
extern llvm::cl::opt<long long> in_features_flag;   // det_linear
extern llvm::cl::opt<long long> out_features_flag;  // det_linear
extern llvm::cl::opt<std::string> activation_flag;  // det_linear
extern llvm::cl::opt<long long> channels_flag;      // timestep_sinusoid

// prewarm
extern llvm::cl::opt<std::string> manifest_flag;
extern llvm::cl::opt<unsigned> jobs_flag;
extern llvm::cl::opt<bool> quiet_flag;
extern llvm::cl::opt<bool> check_flag;

// inspect
extern llvm::cl::opt<std::string> emit_flag;

// cache
extern llvm::cl::opt<std::string> cache_action;
extern llvm::cl::opt<std::string> policy_flag;
extern llvm::cl::opt<bool> rebuild_flag;
extern llvm::cl::opt<std::string> index_out_flag;

// selftest
extern llvm::cl::opt<int> device_flag;

// info, prewarm, cache
extern llvm::cl::opt<bool> json_flag;

// all subcommands
extern llvm::cl::opt<std::string> cache_dir_flag;

}  // namespace exactjit::cli
