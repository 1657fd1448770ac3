// The shared device numerics (templates/*.cuh) compiled for the host reproduce, bit for bit,
// golden vectors recorded from PyTorch eager on an H200 (tests/golden/record_golden.py):
// conversions float <-> bf16/fp16 (NaN, Inf, denormals, ties) and the gate_residual element.
#include "support/test_support.hpp"
#include "templates/numerics.cuh"
#include "templates/gate_residual_math.cuh"

#include <llvm/Support/JSON.h>

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

}  // namespace
}  // namespace exactjit
