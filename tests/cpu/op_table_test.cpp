// The op table: every op has exactly one row; names and codes are unique and the codes never
// change (error records and the generated sources carry them); every row's families, rules,
// templates and constants hold together.
#include "codegen/op_row.hpp"
#include "codegen/render.hpp"
#include "kernels/catalog.hpp"
#include "kernels/det_linear.hpp"
#include "kernels/op_families.hpp"
#include "kernels/rms_norm_backward.hpp"
#include "kernels/segment_plan.hpp"
#include "kernels/timestep_sinusoid.hpp"
#include "runtime/kernel_cache.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>

namespace exactjit {
namespace {

TEST(OpTable, EveryOpHasOneRowThatNamesIt) {
  std::set<OpCode> ops;
  for (const OpRow* row : op_table()) {
    EXPECT_TRUE(ops.insert(row->op).second) << row->name << " has two rows";
    EXPECT_EQ(&op_row(row->op), row) << row->name;
    EXPECT_EQ(parse_op(row->name), row->op) << row->name;
    EXPECT_EQ(op_row_by_code(op_code(row->op)), row) << row->name;
  }
  EXPECT_EQ(op_row_by_code(0), nullptr);  // OpCode{}: no op
  EXPECT_EQ(op_row_by_code(300), nullptr);
  EXPECT_EQ(parse_op("gate_residual_rms_norm_typo"), std::nullopt);
}

// The codes are in every error record and every generated source (so in every cache key): a new op
// takes a new code, an existing one never changes.
TEST(OpTable, CodesAreStable) {
  const std::map<std::string, unsigned> pinned = {
      {"gate_residual", 1},         {"adaln_row_gather", 2},           {"rms_norm", 3},
      {"timestep_sinusoid", 4},     {"det_linear", 5},                 {"gate_residual_backward", 6},
      {"adaln_row_gather_backward", 7}, {"rms_norm_backward", 8},     {"rms_norm_table_grad", 9},
      {"rms_norm_weight_grad", 10}, {"timestep_sinusoid_backward", 11}, {"det_linear_input_grad", 12},
      {"det_linear_weight_grad", 13}, {"segment_count", 14},           {"segment_scan", 15},
      {"segment_scatter", 16},      {"segment_fold", 17},              {"det_linear_input_fold", 18},
      {"gate_residual_rms_norm", 19}, {"gate_residual_rms_norm_backward", 20}};
  std::set<unsigned> codes;
  for (const OpRow* row : op_table()) {
    EXPECT_TRUE(codes.insert(op_code(row->op)).second) << row->name << " reuses code " << op_code(row->op);
    EXPECT_GE(op_code(row->op), 1u);
    EXPECT_LE(op_code(row->op), 0xFFFFu);  // the error record keeps the argument above 16 bits
    const auto it = pinned.find(std::string(row->name));
    if (it != pinned.end()) {
      EXPECT_EQ(op_code(row->op), it->second) << row->name << "'s code changed";
    }
  }
  for (const auto& [name, code] : pinned) EXPECT_TRUE(parse_op(name).has_value()) << name << " lost its row";
}

TEST(OpTable, EveryRowIsInItsFamilyOnce) {
  std::map<OpCode, int> listed;
  for (const OpFamily& family : op_families())
    for (OpCode op : family.kernels) {
      ++listed[op];
      EXPECT_EQ(op_row(op).family, family.name);
    }
  for (const OpRow* row : op_table()) {
    EXPECT_EQ(listed[row->op], 1) << row->name;
    EXPECT_EQ(op_family(row->op).name, row->family);
  }
  for (const OpFamily& family : op_families()) {
    ASSERT_FALSE(family.kernels.empty()) << family.name;
    if (family.name != "segment_plan") {
      EXPECT_EQ(op_row(family.kernels.front()).role, OpRole::Forward) << family.name;
    }
    // The help line is on the family's first row, and only there.
    EXPECT_FALSE(family.summary.empty()) << family.name;
    EXPECT_FALSE(family.sizes.empty()) << family.name;
    for (size_t k = 1; k < family.kernels.size(); ++k)
      EXPECT_TRUE(op_row(family.kernels[k]).family_summary.empty()) << op_name(family.kernels[k]);
  }
}

// default_catalog is the rows' catalogs: each lists only its own op's specs, each spec keeps the
// row's rule, and every kernel of H3's chain is there (the rows that must have shapes do).
TEST(OpTable, CatalogIsTheRowsCatalogs) {
  size_t total = 0;
  for (DType dtype : {DType::BF16, DType::F16, DType::F32})
    for (const OpRow* row : op_table())
      for (const KernelSpec& spec : row->catalog(dtype)) {
        EXPECT_EQ(spec.op, row->op) << row->name;
        EXPECT_EQ(row->rule(spec).rule, "") << spec.describe();
        ++total;
      }
  EXPECT_EQ(default_catalog(Target{90, false}).size(), total);
  for (const OpRow* row : op_table()) {
    size_t specs = 0;
    for (DType dtype : {DType::BF16, DType::F16, DType::F32}) specs += row->catalog(dtype).size();
    EXPECT_GT(specs, 0u) << row->name << " has no catalog shape";
  }
}

// Each row's family at H3's sizes: specs of the row's op that its own rules accept, and that
// render with its constants (the op code among them) and its templates.
TEST(OpTable, FamiliesKeepTheirRowsRulesAndRender) {
  for (const OpRow* row : op_table()) {
    size_t count = 0;
    for (DType dtype : {DType::BF16, DType::F32}) {  // det_linear_input_fold: bf16 only
      KernelSpec sizes = rows_sizes(dtype, kDefaultHidden, 6 * kDefaultHidden);
      if (row->shape == SpecShape::Linear) sizes = linear_sizes(dtype, kTimeEmbedDim, 18 * kDefaultHidden);
      if (row->shape == SpecShape::Channels) sizes = channels_sizes(256);
      const std::vector<KernelSpec> specs = spec_family(row->op, sizes, Target{90, false});
      count += specs.size();
      for (const KernelSpec& spec : specs) {
        EXPECT_EQ(spec.op, row->op);
        EXPECT_EQ(row->rule(spec).rule, "") << spec.describe();
        EXPECT_FALSE(static_cast<bool>(validate_spec(spec))) << spec.describe();
        const KernelSource source = codegen::render(spec);
        EXPECT_NE(source.text.find("constexpr unsigned kOpCode = " + std::to_string(op_code(row->op)) + ";"),
                  std::string::npos)
            << spec.describe();
        for (std::string_view name : row->templates(spec))
          EXPECT_NE(source.text.find("// ---- templates/" + std::string(name) + " ----"), std::string::npos)
              << spec.describe() << " lacks " << name;
      }
    }
    EXPECT_GT(count, 0u) << row->name;
  }
}

// A rule is written once, in the row, and validate_spec reports it with the spec.
TEST(OpTable, ValidateSpecReportsTheRowsRule) {
  KernelSpec spec = spec_family(Op::RmsNormWeightGrad, rows_sizes(DType::BF16, 64, 0), Target{90, false}).front();
  spec.vec = 2;
  EXPECT_EQ(op_row(spec.op).rule(spec).rule,
            "parameter-gradient tiles own a quad or one column a thread (vec=4 or 1, got 2)");
  EXPECT_EQ(op_row(spec.op).rule(spec).subject, RuleSubject::Spec);
  llvm::Error error = validate_spec(spec);
  ASSERT_TRUE(static_cast<bool>(error));
  EXPECT_NE(llvm::toString(std::move(error)).find(spec.describe() + ": parameter-gradient tiles own"),
            std::string::npos);
  spec.vec = 4;
  spec.target.sm = 70;
  error = validate_spec(spec);
  ASSERT_TRUE(static_cast<bool>(error));
  EXPECT_NE(llvm::toString(std::move(error)).find("targets older than sm_75"), std::string::npos);
}

// Each spec shape has size fields of its own, and describe(), the size caps and the prewarm command
// of an offline miss name them: the sinusoid's channels and segment_count's key tensors were once
// a `hidden`, and plan kernels printed a hidden of 1.
TEST(OpTable, EachShapeNamesItsOwnSizes) {
  KernelSpec sinusoid = channels_sizes(256);
  sinusoid.op = Op::TimestepSinusoidBackward;
  sinusoid.target = Target{90, false};
  EXPECT_EQ(sinusoid.describe(), "timestep_sinusoid_backward dtype=fp32 channels=256 target=sm_90");
  EXPECT_EQ(sinusoid.hidden, 0);
  EXPECT_EQ(prewarm_command(sinusoid), "exactjit prewarm --op timestep_sinusoid_backward --channels 256 --arch sm_90");
  EXPECT_NE(codegen::render(sinusoid).text.find("constexpr int kChannels = 256;"), std::string::npos);
  sinusoid.channels = 65538;
  EXPECT_NE(llvm::toString(validate_spec(sinusoid)).find("channels C must be in [1, 65536] (got 65538)"),
            std::string::npos);

  KernelSpec count = make_plan_spec(Op::SegmentCount, DType::F32, IndexType::I32, 2);
  count.target = Target{80, false};
  EXPECT_EQ(count.describe(), "segment_count dtype=fp32 keys=2 index=int32 target=sm_80");
  EXPECT_EQ(count.stem(), "segment_count_fp32_k2_i32_sm80");
  EXPECT_EQ(prewarm_command(count), "exactjit prewarm --op segment_count --dtype fp32 --arch sm_80");
  const std::string text = codegen::render(count).text;
  EXPECT_NE(text.find("constexpr int kKeyTensors = 2;"), std::string::npos);
  EXPECT_EQ(text.find("kHidden"), std::string::npos);
  EXPECT_TRUE(llvm::is_contained(spec_family(Op::SegmentCount, KernelSpec{}, count.target), count));
  count.key_tensors = 3;
  EXPECT_NE(llvm::toString(validate_spec(count)).find("combines 1 or 2 index tensors"), std::string::npos);

  const KernelSpec linear =
      spec_family(Op::DetLinear, linear_sizes(DType::BF16, 2688, 10752), Target{90, false}).front();
  EXPECT_EQ(linear.in_features, 2688);
  EXPECT_EQ(linear.hidden, 0);
  EXPECT_EQ(linear.table_stride, 0);
  for (const KernelSpec& spec : default_catalog(Target{90, false}))
    EXPECT_EQ(parse_spec(spec.describe()), spec) << spec.describe();
}

// The op table is the one place an op is registered (issue 16): api/, cli/, codegen/ and runtime/
// name no op (no Op:: code, no planner, no op file's header), and each op's C entry point xj_<op>
// is defined in the op's own file, the one that defines its row.
TEST(OpTable, AnOpIsNamedOnlyInItsFilesAndTheTable) {
  namespace fs = std::filesystem;
  const fs::path root = EXACTJIT_SOURCE_DIR;
  auto text_of = [](const fs::path& path) {
    std::ostringstream text;
    text << std::ifstream(path).rdbuf();
    return text.str();
  };
  std::map<std::string, std::string> row_file;  // op name -> the kernels/ file defining its row
  std::set<std::string> op_headers;
  for (const auto& entry : fs::directory_iterator(root / "kernels")) {
    if (entry.path().extension() != ".cpp") continue;
    const std::string text = text_of(entry.path());
    const std::regex row(R"re(const OpRow k\w+Row = \{\s*Op::\w+,\s*"(\w+)")re");
    for (auto it = std::sregex_iterator(text.begin(), text.end(), row); it != std::sregex_iterator(); ++it) {
      row_file[(*it)[1]] = entry.path().filename().string();
      op_headers.insert("kernels/" + entry.path().stem().string() + ".hpp");
    }
  }
  ASSERT_EQ(row_file.size(), op_table().size()) << "a row the scan did not find";

  const std::regex names_an_op(R"re(\bOp::[A-Z]\w*|\bplan_\w+\()re");
  for (const char* layer : {"api", "cli", "codegen", "runtime"})
    for (const auto& entry : fs::directory_iterator(root / layer)) {
      const std::string text = text_of(entry.path());
      std::smatch match;
      EXPECT_FALSE(std::regex_search(text, match, names_an_op)) << entry.path() << " names " << match.str();
      for (const std::string& header : op_headers)
        EXPECT_EQ(text.find("#include \"" + header + "\""), std::string::npos)
            << entry.path() << " includes " << header;
    }

  const std::string header = text_of(root / "include/exactjit/exactjit.h");
  for (const auto& [name, file] : row_file) {
    const std::string entry_point = "xj_" + name + "(";
    if (header.find(entry_point) == std::string::npos) continue;  // an internal kernel (segment_*, *_grad)
    EXPECT_NE(text_of(root / "kernels" / file).find("exactjit_status_t " + entry_point), std::string::npos)
        << entry_point << " is not defined in kernels/" << file;
  }
}

}  // namespace
}  // namespace exactjit
