// Spec lists (EXACTJIT_RECORD_MANIFEST): sixteen processes recording into one file at once leave
// a well-formed list with each spec once; the reader refuses what is not a spec list, naming the
// line, and deduplicates what a lock-less writer may repeat.
#include "kernels/catalog.hpp"
#include "kernels/gate_residual.hpp"
#include "runtime/errors.hpp"
#include "runtime/spec_list.hpp"
#include "support/test_support.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <set>
#include <sstream>

namespace exactjit {
namespace {

std::vector<KernelSpec> some_specs() {
  std::vector<KernelSpec> specs;
  for (DType dtype : {DType::BF16, DType::F16, DType::F32})
    for (int64_t hidden : {64, 128, 256, 512, 1024, 2048})
      for (const KernelSpec& spec :
           spec_family(Op::GateResidual, rows_sizes(dtype, hidden, 2 * hidden), Target{90, false}))
        specs.push_back(spec);
  return specs;  // 72 specs
}

bool failed(llvm::Error error) {
  if (!error) return false;
  llvm::consumeError(std::move(error));
  return true;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// Forks `processes` children that each record every spec into `file`, in the same order (the
// most collisions), all released at once; true when every child succeeded.
bool record_at_once(const std::string& file, const std::vector<KernelSpec>& specs, int processes) {
  int start[2];
  if (::pipe(start) != 0) return false;
  std::vector<pid_t> children;
  for (int p = 0; p < processes; ++p) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(start[1]);
      char go;
      (void)!::read(start[0], &go, 1);
      int failures = 0;
      for (const KernelSpec& spec : specs) failures += failed(append_to_spec_list(file, spec));
      ::_exit(failures ? 1 : 0);
    }
    if (pid > 0) children.push_back(pid);
  }
  ::close(start[0]);
  ::close(start[1]);  // opens the gate: every child's read returns at once
  bool ok = static_cast<int>(children.size()) == processes;
  for (pid_t pid : children) {
    int status = 0;
    ok = ::waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0 && ok;
  }
  return ok;
}

// Several rounds: a race that leaves a repeat shows in one of them (without the file lock, most do).
TEST(SpecList, ProcessesRecordingAtOnceLeaveEachSpecOnce) {
  test::TempDir dir;
  const std::vector<KernelSpec> specs = some_specs();
  std::set<std::string> expected;
  for (const KernelSpec& spec : specs) expected.insert(spec.describe());
  for (int round = 0; round < 20; ++round) {
    const std::string file = dir / ("used-" + std::to_string(round) + ".specs");
    ASSERT_TRUE(record_at_once(file, specs, 16));
    const std::vector<std::string> lines = lines_of(test::read_text(file));
    ASSERT_EQ(lines.size(), specs.size() + 1) << "round " << round;
    EXPECT_EQ(lines.front(), kSpecListFormat);
    std::set<std::string> seen;
    for (size_t k = 1; k < lines.size(); ++k) EXPECT_TRUE(seen.insert(lines[k]).second) << "repeated: " << lines[k];
    EXPECT_EQ(seen, expected);
    EXPECT_EQ(test::expect_value(parse_spec_list(test::read_text(file), file)).size(), specs.size());
  }
}

TEST(SpecList, ReaderDeduplicatesAndNamesTheBadLine) {
  const KernelSpec spec = some_specs().front();
  const std::string line = spec.describe() + "\n";
  const std::string header = std::string(kSpecListFormat) + "\n";
  const auto twice = test::expect_value(parse_spec_list(header + line + line, "f"));
  ASSERT_EQ(twice.size(), 1u);
  EXPECT_EQ(twice.front(), spec);
  EXPECT_TRUE(test::expect_value(parse_spec_list(header, "f")).empty());
  // Two lock-less writers that both found the file empty: two headers, the spec twice.
  EXPECT_EQ(test::expect_value(parse_spec_list(header + header + line + line, "f")).size(), 1u);

  auto refused = [](const std::string& text) {
    auto parsed = parse_spec_list(text, "list.specs");
    if (parsed) return std::string("accepted");
    return take_error(parsed.takeError()).message;
  };
  EXPECT_EQ(refused(line), "list.specs does not start with the line exactjit-spec-list-1");
  EXPECT_EQ(refused(header + line + "gate_residual dtype=bf16\n"),
            "list.specs: line 3 is not a kernel spec exactjit writes: 'gate_residual dtype=bf16'");
  EXPECT_EQ(refused(header + line.substr(0, line.size() - 1)), "list.specs: line 2 is cut short (no newline)");
}

// Lists recorded before the sinusoid and the plan kernels had size fields of their own (their one
// size was `hidden`) still read, as today's specs; near misses of that text do not.
TEST(SpecList, ReadsTheLinesOfGeneratorFive) {
  const std::string header = std::string(kSpecListFormat) + "\n";
  const auto specs = test::expect_value(parse_spec_list(
      header + "timestep_sinusoid dtype=fp32 hidden=256 table_stride=0 vec=1 index=int64 target=sm_90\n"
               "segment_count dtype=fp32 hidden=2 table_stride=0 vec=1 index=int32 target=sm_80\n"
               "segment_fold dtype=bf16 hidden=1 table_stride=0 vec=1 index=int64 target=sm_90\n"
               "timestep_sinusoid dtype=fp32 channels=256 target=sm_90\n",
      "old.specs"));
  ASSERT_EQ(specs.size(), 3u);  // the last line is the first one's spec, as written today
  EXPECT_EQ(specs[0].describe(), "timestep_sinusoid dtype=fp32 channels=256 target=sm_90");
  EXPECT_EQ(specs[0].channels, 256);
  EXPECT_EQ(specs[1].describe(), "segment_count dtype=fp32 keys=2 index=int32 target=sm_80");
  EXPECT_EQ(specs[2].describe(), "segment_fold dtype=bf16 index=int64 target=sm_90");
  for (const char* near_miss : {"segment_fold dtype=bf16 hidden=2 table_stride=0 vec=1 index=int64 target=sm_90",
                                "timestep_sinusoid dtype=fp32 hidden=256 table_stride=8 vec=1 index=int64 target=sm_90",
                                "gate_residual dtype=bf16 hidden=64 table_stride=0 vec=1 index=int64 target=sm_90 x=1"})
    EXPECT_TRUE(failed(parse_spec_list(header + near_miss + "\n", "f").takeError())) << near_miss;
}

TEST(SpecList, WriterRefusesAFileThatIsNotASpecList) {
  test::TempDir dir;
  test::write_text(dir / "notes.txt", "my notes\n");
  const KernelSpec spec = some_specs().front();
  auto err = append_to_spec_list(dir / "notes.txt", spec);
  ASSERT_TRUE(static_cast<bool>(err));
  EXPECT_NE(llvm::toString(std::move(err)).find("it is not an exactjit-spec-list-1 file"), std::string::npos);
  EXPECT_EQ(test::read_text(dir / "notes.txt"), "my notes\n");  // untouched
  EXPECT_TRUE(failed(append_to_spec_list(dir.path(), spec)));  // a folder: refused, no crash
  // A line cut short by a dead writer stays apart from the next one.
  test::write_text(dir / "torn.specs", std::string(kSpecListFormat) + "\ngate_resid");
  ASSERT_FALSE(failed(append_to_spec_list(dir / "torn.specs", spec)));
  EXPECT_EQ(lines_of(test::read_text(dir / "torn.specs")).back(), spec.describe());
}

}  // namespace
}  // namespace exactjit
