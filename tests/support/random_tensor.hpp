// A random DLTensor for the fuzz tests: odd ranks, negative, zero and huge dimensions and
// strides, null shapes and pointers, misaligned or wrapping addresses, foreign dtypes and devices.
#pragma once

#include <dlpack/dlpack.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <random>
#include <vector>

namespace exactjit::test {

class RandomTensor {
 public:
  explicit RandomTensor(std::mt19937_64& rng) {
    auto pick = [&rng](uint64_t n) { return static_cast<int64_t>(rng() % n); };
    const int64_t dims_choice[] = {0, 1, 2, 3, 4, 7, 12, 5376, 32256, 1LL << 31, 1LL << 40, -1, -5376};
    t_.ndim = pick(10) == 0 ? static_cast<int>(pick(12)) - 2 : static_cast<int>(1 + pick(3));
    const int rank = std::max(0, std::min(t_.ndim, 10));
    shape_.resize(static_cast<size_t>(rank) + 1);
    strides_.resize(static_cast<size_t>(rank) + 1);
    for (int d = 0; d < rank; ++d) {
      shape_[d] = pick(4) == 0 ? dims_choice[pick(std::size(dims_choice))] : 1 + pick(64);
      strides_[d] = pick(5) == 0 ? dims_choice[pick(std::size(dims_choice))] : 1 + pick(70000);
    }
    t_.shape = pick(20) == 0 ? nullptr : shape_.data();
    t_.strides = pick(2) == 0 ? nullptr : strides_.data();
    const uint64_t bases[] = {0, 1ull << 30, (1ull << 30) + 2, ~0ull - 64, 16, 3};
    t_.data = reinterpret_cast<void*>(bases[pick(std::size(bases))]);
    t_.byte_offset = pick(4) == 0 ? static_cast<uint64_t>(pick(33)) : 0;
    const DLDataType dtypes[] = {{kDLBfloat, 16, 1}, {kDLFloat, 16, 1}, {kDLFloat, 32, 1}, {kDLInt, 32, 1},
                                 {kDLInt, 64, 1},    {kDLFloat, 64, 1}, {kDLUInt, 8, 1},  {kDLFloat, 32, 4}};
    t_.dtype = dtypes[pick(std::size(dtypes))];
    t_.device = {pick(8) == 0 ? kDLCPU : kDLCUDA, static_cast<int32_t>(pick(8) == 0 ? 1 : 0)};
  }
  const DLTensor& get() const { return t_; }
  const DLTensor* maybe(std::mt19937_64& rng) const { return rng() % 3 == 0 ? nullptr : &t_; }

 private:
  std::vector<int64_t> shape_, strides_;
  DLTensor t_{};
};

/// The tensors of one call (null where an optional one was left out), for the oracle.
using Given = std::vector<const DLTensor*>;

/// A call that got past validation was sound: every tensor it was given that holds elements is a
/// CUDA tensor of one lane whose address (data + byte_offset) is non-null, does not wrap and is
/// aligned to its element size.
inline void expect_sound(const Given& given, int iteration) {
  for (const DLTensor* t : given) {
    if (!t || !t->shape) continue;
    int64_t count = 1;
    for (int d = 0; d < t->ndim; ++d) count *= t->shape[d];
    if (count == 0) continue;
    uint64_t address = 0;
    const bool wraps = __builtin_add_overflow(reinterpret_cast<uint64_t>(t->data), t->byte_offset, &address);
    EXPECT_FALSE(wraps) << iteration;
    EXPECT_NE(address, 0u) << iteration;
    EXPECT_EQ(t->device.device_type, kDLCUDA) << iteration;
    EXPECT_EQ(t->dtype.lanes, 1) << iteration;
    if (t->dtype.bits >= 8) {
      EXPECT_EQ(address % (t->dtype.bits / 8), 0u) << iteration;
    }
  }
}

/// Breaks a valid tensor in one way: a null, wrapping or misaligned address, lanes or bits a
/// kernel cannot take, a foreign device.
inline void perturb(DLTensor& t, std::mt19937_64& rng) {
  switch (rng() % 9) {
    case 0: t.data = nullptr; break;
    case 1: t.byte_offset = ~uint64_t{0} - reinterpret_cast<uint64_t>(t.data) + 1 + 2 * (rng() % 4); break;  // wraps
    case 2: t.data = reinterpret_cast<void*>(~uint64_t{0} - 63); break;
    case 3: t.dtype.lanes = static_cast<uint16_t>(rng() % 2 ? 0 : 4); break;
    case 4: t.dtype.bits = static_cast<uint8_t>(rng() % 2 ? 0 : 12); break;
    case 5: t.device.device_type = kDLCPU; break;
    case 6: t.byte_offset = 1 + rng() % 3; break;  // misaligned
    case 7: t.data = nullptr; t.byte_offset = 0; t.device.device_id = 1; break;
    case 8: t.byte_offset = ~uint64_t{0}; break;
  }
}

}  // namespace exactjit::test
