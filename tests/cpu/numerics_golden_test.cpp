// The shared device numerics (templates/*.cuh) compiled for the host reproduce, bit for bit,
// golden vectors recorded from PyTorch eager on an H200 (tests/golden/record_golden.py):
// conversions float <-> bf16/fp16 (NaN, Inf, denormals, ties) and the gate_residual element.
#include "kernels/host_model.hpp"
#include "support/test_support.hpp"
#include "templates/numerics.cuh"
#include "templates/gate_residual_math.cuh"

#include <llvm/Support/JSON.h>

#include <cmath>
#include <cstring>
#include <map>

namespace exactjit {
namespace {

const std::string kGoldenDir = std::string(EXACTJIT_SOURCE_DIR) + "/tests/golden/data/";

struct Case {
  std::string in;
  std::string out;
  int64_t count = 0;
};

std::map<std::string, Case> load_cases() {
  std::map<std::string, Case> cases;
  auto parsed = llvm::json::parse(test::read_text(kGoldenDir + "golden.json"));
  if (!parsed) {
    ADD_FAILURE() << "golden.json: " << llvm::toString(parsed.takeError());
    return cases;
  }
  for (const llvm::json::Value& value : *parsed->getAsObject()->getArray("cases")) {
    const llvm::json::Object& object = *value.getAsObject();
    const std::string name = object.getString("name")->str();
    Case c;
    c.in = test::read_text(kGoldenDir + name + ".in.bin");
    c.out = test::read_text(kGoldenDir + name + ".out.bin");
    c.count = *object.getInteger("count");
    cases[name] = c;
  }
  return cases;
}

template <typename T> T at(const std::string& bytes, int64_t k) {
  T v;
  std::memcpy(&v, bytes.data() + k * sizeof(T), sizeof(T));
  return v;
}

const std::map<std::string, Case>& cases() {
  static const std::map<std::string, Case> loaded = load_cases();
  return loaded;
}

std::string fmt_case(const char* op, DType dtype, int64_t hidden) {
  return std::string(op) + "_" + std::string(dtype_name(dtype)) + "_h" + std::to_string(hidden);
}

const Case& get(const std::string& name) {
  auto it = cases().find(name);
  if (it == cases().end()) {
    ADD_FAILURE() << "missing golden case " << name;
    static const Case empty;
    return empty;
  }
  EXPECT_GT(it->second.count, 0);
  return it->second;
}

TEST(NumericsGolden, FloatToBf16) {
  const Case& c = get("f32_to_bf16");
  ASSERT_EQ(c.in.size(), static_cast<size_t>(c.count) * 4);
  for (int64_t k = 0; k < c.count; ++k) {
    const uint32_t in = at<uint32_t>(c.in, k);
    EXPECT_EQ(xj::round_to<xj::bf16>(xj::bits_to_float(in)).bits, at<uint16_t>(c.out, k)) << std::hex << in;
  }
}

TEST(NumericsGolden, FloatToFp16) {
  const Case& c = get("f32_to_fp16");
  for (int64_t k = 0; k < c.count; ++k) {
    const uint32_t in = at<uint32_t>(c.in, k);
    EXPECT_EQ(xj::round_to<xj::fp16>(xj::bits_to_float(in)).bits, at<uint16_t>(c.out, k)) << std::hex << in;
  }
}

TEST(NumericsGolden, Bf16ToFloatForAllPatterns) {
  const Case& c = get("bf16_to_f32");
  ASSERT_EQ(c.count, 65536);
  for (int64_t k = 0; k < c.count; ++k) {
    const xj::bf16 in{at<uint16_t>(c.in, k)};
    EXPECT_EQ(xj::float_to_bits(xj::to_float(in)), at<uint32_t>(c.out, k)) << std::hex << in.bits;
  }
}

TEST(NumericsGolden, Fp16ToFloatForAllPatterns) {
  const Case& c = get("fp16_to_f32");
  ASSERT_EQ(c.count, 65536);
  for (int64_t k = 0; k < c.count; ++k) {
    const xj::fp16 in{at<uint16_t>(c.in, k)};
    EXPECT_EQ(xj::float_to_bits(xj::to_float(in)), at<uint32_t>(c.out, k)) << std::hex << in.bits;
  }
}

template <typename T, typename Bits> void check_gate_residual(const std::string& name) {
  const Case& c = get(name);
  ASSERT_EQ(c.in.size(), static_cast<size_t>(c.count) * 3 * sizeof(Bits));
  int64_t mismatches = 0;
  for (int64_t k = 0; k < c.count; ++k) {
    T residual, gate, y;
    const Bits r = at<Bits>(c.in, k), g = at<Bits>(c.in, c.count + k), yy = at<Bits>(c.in, 2 * c.count + k);
    std::memcpy(&residual, &r, sizeof r);
    std::memcpy(&gate, &g, sizeof g);
    std::memcpy(&y, &yy, sizeof yy);
    const T out = xj::gate_residual_element(residual, gate, y);
    Bits bits;
    std::memcpy(&bits, &out, sizeof bits);
    if (bits != at<Bits>(c.out, k) && ++mismatches <= 5)
      ADD_FAILURE() << name << " element " << k << std::hex << ": residual " << r << " gate " << g << " y " << yy
                    << " -> " << bits << ", PyTorch " << at<Bits>(c.out, k);
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(NumericsGolden, GateResidualBf16) { check_gate_residual<xj::bf16, uint16_t>("gate_residual_bf16"); }
TEST(NumericsGolden, GateResidualFp16) { check_gate_residual<xj::fp16, uint16_t>("gate_residual_fp16"); }
TEST(NumericsGolden, GateResidualFp32) { check_gate_residual<float, uint32_t>("gate_residual_fp32"); }

// rms_norm: the host model reduces each row in the kernel's order and reproduces PyTorch's three
// outputs (weighted, unweighted, modulated) bit for bit. The one step it cannot run is the GPU's
// rsqrt.approx.f32, so the test searches the floats within 4 ulp of 1/sqrt(the model's rsqrt
// argument) for the rstd that PyTorch used: one rstd must give all 3H outputs of the row exactly.
// A wrong output formula, rounding or modulation order fails; a wrong reduction order fails unless
// it lands within 4 ulp of PyTorch's (the GPU parity run pins that part bit for bit).
template <typename Bits> void check_rms_norm(DType dtype, int64_t hidden) {
  const std::string name = fmt_case("rms_norm", dtype, hidden);
  const Case& c = get(name);
  const int64_t rows = c.count / hidden;
  ASSERT_EQ(c.in.size(), static_cast<size_t>(3 * c.count + hidden) * sizeof(Bits));
  const char* x = c.in.data();
  const char* weight = x + c.count * sizeof(Bits);
  const char* scale = weight + hidden * sizeof(Bits);
  const char* shift = scale + c.count * sizeof(Bits);
  const char* outputs[3] = {c.out.data(), c.out.data() + c.count * sizeof(Bits),
                            c.out.data() + 2 * c.count * sizeof(Bits)};
  const size_t row_bytes = static_cast<size_t>(hidden) * sizeof(Bits);
  std::vector<char> got(row_bytes);
  for (int64_t r = 0; r < rows; ++r) {
    const size_t at = static_cast<size_t>(r) * row_bytes;
    const float argument = rms_norm_rsqrt_argument_model(dtype, x + at, hidden, 1e-5f);
    float candidate = static_cast<float>(1.0 / std::sqrt(static_cast<double>(argument)));
    for (int k = 0; k < 4; ++k) candidate = std::nextafter(candidate, 0.0f);
    bool found = false;
    for (int k = 0; k <= 8 && !found; ++k, candidate = std::nextafter(candidate, INFINITY)) {
      found = true;
      const void* forms[3][3] = {
          {weight, nullptr, nullptr}, {nullptr, nullptr, nullptr}, {nullptr, shift + at, scale + at}};
      for (int f = 0; f < 3 && found; ++f) {
        rms_norm_row_model(dtype, x + at, forms[f][0], forms[f][1], forms[f][2], hidden, candidate, got.data());
        found = std::memcmp(got.data(), outputs[f] + at, row_bytes) == 0;
      }
      if (argument != argument) break;  // a NaN row has one candidate, NaN itself
    }
    EXPECT_TRUE(found) << name << " row " << r << ": no rstd within 4 ulp of 1/sqrt(" << argument
                       << ") reproduces PyTorch's outputs";
  }
}

TEST(NumericsGolden, RmsNormRowsPlainWeightedAndModulated) {
  for (int64_t hidden : {12, 256, 4096, 5376}) {
    check_rms_norm<uint16_t>(DType::BF16, hidden);
    check_rms_norm<uint16_t>(DType::F16, hidden);
    check_rms_norm<uint32_t>(DType::F32, hidden);
  }
}

}  // namespace
}  // namespace exactjit
