// exactjit command line flags (see options.hpp).
#include "cli/options.hpp"

#include "kernels/op_families.hpp"

namespace exactjit::cli {
namespace cl = llvm::cl;

namespace {

const std::string& op_flag_description() {
  static const std::string text = "Op: " + op_names();
  return text;
}

}  // namespace

cl::OptionCategory category("exactjit options");
cl::SubCommand prewarm_command("prewarm",
                               "Compile kernels into the cache (no flags: the whole default catalog)");
cl::SubCommand inspect_command("inspect", "Show one kernel: its source, options, key, PTX, SASS or manifest");
cl::SubCommand cache_command("cache", "Manage the cache: ls | stat | verify | prune | clear");
cl::SubCommand info_command("info", "Show NVRTC, driver, GPU and cache directories");
cl::SubCommand selftest_command("selftest", "Run every catalog op on the GPU against the host model, bitwise");
cl::SubCommand bench_command("bench",
                             "Benchmark every op against eager and torch.compile on this GPU: reports and plots");

#define XJ_SPEC_SUBS cl::sub(prewarm_command), cl::sub(inspect_command)
cl::opt<std::string> op_flag("op", cl::desc(op_flag_description()), cl::value_desc("name"), XJ_SPEC_SUBS,
                             cl::cat(category));
cl::opt<long long> hidden_flag("hidden", cl::desc("Hidden size H (default 5376)"), cl::value_desc("H"),
                               cl::init(0), XJ_SPEC_SUBS, cl::cat(category));
cl::opt<std::string> dtype_flag("dtype", cl::desc("bf16 | fp16 | fp32 (prewarm default: all three)"),
                                cl::value_desc("dtype"), XJ_SPEC_SUBS, cl::cat(category));
cl::opt<long long> table_stride_flag("table-stride",
                                     cl::desc("Row stride of the table view in elements (default 6H)"),
                                     cl::value_desc("N"), cl::init(0), XJ_SPEC_SUBS, cl::cat(category));
cl::opt<std::string> arch_flag("arch",
                               cl::desc("Target: sm_90, compute_90, 90; prewarm: a comma-separated list, each built "
                                        "(default: the GPU's, else sm_90)"),
                               cl::value_desc("arch[,arch...]"), XJ_SPEC_SUBS, cl::cat(category));
cl::opt<std::string> index_type_flag("index-type", cl::desc("inspect: int64 | int32 (default int64)"),
                                     cl::value_desc("type"), cl::init("int64"), cl::sub(inspect_command),
                                     cl::cat(category));
cl::opt<int> vec_flag("vec", cl::desc("inspect: elements per access, 1 or the 16-byte width (default: widest)"),
                      cl::value_desc("N"), cl::init(0), cl::sub(inspect_command), cl::cat(category));
cl::opt<bool> unweighted_flag("unweighted", cl::desc("inspect: rms_norm without a weight (default: weighted)"),
                              cl::sub(inspect_command), cl::cat(category));
cl::opt<long long> rows_flag("rows", cl::desc("inspect: det_linear backward: the call's rows T (1..8), which pick "
                                               "the row tile (default 3)"),
                             cl::value_desc("T"), cl::init(0), cl::sub(inspect_command), cl::cat(category));
cl::opt<long long> channels_flag("channels", cl::desc("timestep_sinusoid: channels C (default 256)"),
                                 cl::value_desc("C"), cl::init(0), XJ_SPEC_SUBS, cl::cat(category));
cl::opt<long long> in_features_flag("in-features", cl::desc("det_linear: in_features K (default 2688)"),
                                    cl::value_desc("K"), cl::init(0), XJ_SPEC_SUBS, cl::cat(category));
cl::opt<long long> out_features_flag("out-features", cl::desc("det_linear: out_features N (default 18 x 5376)"),
                                     cl::value_desc("N"), cl::init(0), XJ_SPEC_SUBS, cl::cat(category));
cl::opt<std::string> activation_flag("activation", cl::desc("det_linear: none | silu (prewarm default: both)"),
                                     cl::value_desc("act"), XJ_SPEC_SUBS, cl::cat(category));
#undef XJ_SPEC_SUBS

cl::opt<std::string> manifest_flag("manifest",
                                   cl::desc("A spec list recorded by EXACTJIT_RECORD_MANIFEST, or a JSON file listing "
                                            "specs: [{\"op\":..,\"hidden\":..,\"dtype\":..,\"table_stride\":..,"
                                            "\"arch\":..}, ...]; op and its sizes (hidden, channels, "
                                            "in_features/out_features) are required"),
                                   cl::value_desc("file"), cl::sub(prewarm_command), cl::cat(category));
cl::opt<bool> check_flag("check",
                         cl::desc("Compile nothing: list every kernel the cache layers lack; exit 1 if any "
                                  "(what plain prewarm does under EXACTJIT_OFFLINE)"),
                         cl::sub(prewarm_command), cl::cat(category));
cl::opt<unsigned> jobs_flag("j", cl::desc("Parallel compiles (default: number of cores)"), cl::value_desc("N"),
                            cl::init(0), cl::sub(prewarm_command), cl::cat(category));
cl::opt<bool> quiet_flag("quiet", cl::desc("Only print the summary"), cl::sub(prewarm_command), cl::cat(category));

cl::opt<std::string> emit_flag("emit", cl::desc("source | options | key | ptx | sass | manifest"),
                               cl::value_desc("what"), cl::init("source"), cl::sub(inspect_command),
                               cl::cat(category));

cl::opt<std::string> cache_action(cl::Positional, cl::desc("<ls|stat|verify|index|prune|clear>"), cl::Required,
                                  cl::sub(cache_command), cl::cat(category));
cl::opt<std::string> index_out_flag("out", cl::desc("index: the layer index file to write (default: standard output)"),
                                    cl::value_desc("file"), cl::sub(cache_command), cl::cat(category));
cl::opt<bool> rebuild_flag("rebuild",
                           cl::desc("verify: also recompile every entry's kernel.cu with its recorded options and "
                                    "compare the image byte for byte (needs the entry's NVRTC build)"),
                           cl::sub(cache_command), cl::cat(category));
cl::opt<std::string> policy_flag("policy",
                                 cl::desc("prune: LLVM cache policy, e.g. prune_after=168h:cache_size_bytes=1g"),
                                 cl::value_desc("policy"), cl::init("prune_after=720h:cache_size_bytes=2g"),
                                 cl::sub(cache_command), cl::cat(category));

cl::opt<std::string> bench_out_flag("out", cl::desc("bench: folder for the reports and plots"), cl::value_desc("dir"),
                                    cl::init("bench-report"), cl::sub(bench_command), cl::cat(category));
cl::opt<std::string> bench_dir_flag("bench-dir",
                                    cl::desc("bench: the checkout's bench/ folder (default: this build's)"),
                                    cl::value_desc("dir"), cl::sub(bench_command), cl::cat(category));
cl::opt<std::string> bench_sizes_flag("sizes", cl::desc("bench: comma-separated S (default 4097,32768,131072)"),
                                      cl::value_desc("S,..."), cl::sub(bench_command), cl::cat(category));
cl::opt<int> device_flag("device", cl::desc("CUDA device ordinal (default 0)"), cl::init(0),
                         cl::sub(selftest_command), cl::cat(category));

cl::opt<bool> json_flag("json", cl::desc("Print one JSON object on standard output (docs/cli-json.md)"),
                        cl::sub(prewarm_command), cl::sub(cache_command), cl::sub(info_command), cl::cat(category));

cl::opt<std::string> cache_dir_flag("cache-dir", cl::desc("Writable cache directory (default: EXACTJIT_CACHE_DIR)"),
                                    cl::value_desc("dir"), cl::sub(prewarm_command), cl::sub(inspect_command),
                                    cl::sub(cache_command), cl::sub(info_command), cl::sub(selftest_command),
                                    cl::cat(category));

}  // namespace exactjit::cli
