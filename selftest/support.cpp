// exactjit self-test support (see support.hpp).
#include "selftest/support.hpp"

#include "runtime/errors.hpp"
#include "templates/numerics.cuh"

#include <fmt/format.h>

#include <cstring>
#include <limits>

namespace exactjit::selftest {


uint64_t Generator::next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

double Generator::uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

float Generator::value(bool specials) {
    const uint64_t pick = next() % 1000;
    if (specials && pick == 0) return std::numeric_limits<float>::quiet_NaN();
    if (specials && pick == 1) return std::numeric_limits<float>::infinity();
    if (specials && pick == 2) return -std::numeric_limits<float>::infinity();
    if (pick == 3) return 1e-41f;  // denormal
    if (pick == 4) return -0.0f;
    static const float scales[] = {1.0f, 1e-3f, 30.0f};
    return static_cast<float>((uniform() * 2 - 1) * 4) * scales[next() % 3];
}

void store(std::vector<uint8_t>& bytes, int64_t k, DType dtype, float v) {
  if (dtype == DType::F32) {
    std::memcpy(&bytes[k * 4], &v, 4);
  } else {
    const uint16_t bits = dtype == DType::BF16 ? xj::round_to<xj::bf16>(v).bits : xj::round_to<xj::fp16>(v).bits;
    std::memcpy(&bytes[k * 2], &bits, 2);
  }
}

std::vector<uint8_t> random_storage(Generator& gen, DType dtype, int64_t count, bool specials) {
  std::vector<uint8_t> bytes(static_cast<size_t>(count) * dtype_size(dtype));
  for (int64_t k = 0; k < count; ++k) store(bytes, k, dtype, gen.value(specials));
  return bytes;
}

DLTensor device_tensor(const DeviceBuffer& buffer, uint64_t byte_offset, int device_id, int ndim, int64_t* shape,
                       int64_t* strides, DLDataType dtype) {
  DLTensor t{};
  t.data = reinterpret_cast<void*>(buffer.address());
  t.device = DLDevice{kDLCUDA, device_id};
  t.ndim = ndim;
  t.dtype = dtype;
  t.shape = shape;
  t.strides = strides;
  t.byte_offset = byte_offset;
  return t;
}

std::vector<int64_t> random_indices(Generator& gen, int64_t seq, int64_t table_rows, int64_t bad_position,
                                    int64_t bad_value) {
  std::vector<int64_t> values(static_cast<size_t>(seq));
  for (int64_t s = 0; s < seq; ++s)
    values[s] = s == bad_position ? bad_value : static_cast<int64_t>(gen.next() % static_cast<uint64_t>(table_rows));
  return values;
}

std::vector<uint8_t> index_bytes(IndexType type, const std::vector<int64_t>& values) {
  const size_t width = type == IndexType::I32 ? 4 : 8;
  std::vector<uint8_t> bytes(values.size() * width);
  for (size_t k = 0; k < values.size(); ++k) {
    if (type == IndexType::I32) {
      const int32_t v32 = static_cast<int32_t>(values[k]);
      std::memcpy(&bytes[k * 4], &v32, 4);
    } else {
      std::memcpy(&bytes[k * 8], &values[k], 8);
    }
  }
  return bytes;
}

llvm::Expected<DeviceArena> DeviceArena::open(int device_id) {
  auto driver = Driver::get();
  if (!driver) return driver.takeError();
  auto context = primary_context(**driver, device_id);
  if (!context) return context.takeError();
  return DeviceArena(**driver, *context);
}

DeviceBuffer* DeviceArena::upload(const std::vector<uint8_t>& host, size_t bytes, size_t offset) {
  if (error_) return nullptr;
  auto buffer = DeviceBuffer::allocate(*driver_, context_, bytes);
  if (!buffer) {
    error_ = buffer.takeError();
    return nullptr;
  }
  if (!host.empty()) {
    if (auto err = buffer->upload(host.data(), host.size(), offset)) {
      error_ = std::move(err);
      return nullptr;
    }
  }
  buffers_.push_back(std::move(*buffer));
  return &buffers_.back();
}

DLDataType dl_index(IndexType type) {
  return DLDataType{kDLInt, static_cast<uint8_t>(type == IndexType::I32 ? 32 : 64), 1};
}

DLDataType dl_dtype(DType dtype) {
  switch (dtype) {
    case DType::F32: return {kDLFloat, 32, 1};
    case DType::BF16: return {kDLBfloat, 16, 1};
    case DType::F16: return {kDLFloat, 16, 1};
  }
  return {};
}

void judge(CaseOutcome& outcome, const std::vector<uint8_t>& expected, const std::vector<uint8_t>& actual,
           size_t elem, const std::string& expected_error) {
  const int64_t count = static_cast<int64_t>(expected.size() / elem);
  for (int64_t k = 0; k < count; ++k) {
    if (std::memcmp(&expected[k * elem], &actual[k * elem], elem) != 0) {
      if (outcome.first_mismatch < 0) outcome.first_mismatch = k;
      ++outcome.mismatches;
    }
  }
  const bool bits_equal = outcome.mismatches == 0;
  if (!expected_error.empty()) {
    const bool reported = outcome.sync.code() == static_cast<int>(ErrorCode::BadIndex) &&
                          outcome.sync.message().find(expected_error) != std::string::npos;
    outcome.passed = bits_equal && reported;
    outcome.detail = reported ? "bad index reported: " + outcome.sync.message()
                              : "bad index NOT reported (sync: " + outcome.sync.message() + ")";
  } else {
    outcome.passed = bits_equal && outcome.sync.ok();
    if (!outcome.sync.ok()) outcome.detail = "synchronize: " + outcome.sync.message();
  }
  if (!bits_equal)
    outcome.detail += fmt::format("{}{} of {} elements differ from the host model (first at {})",
                                  outcome.detail.empty() ? "" : "; ", outcome.mismatches, count,
                                  outcome.first_mismatch);
}


}  // namespace exactjit::selftest
