// A random DLTensor for the fuzz tests: odd ranks, negative, zero and huge dimensions and
// strides, null shapes and pointers, misaligned or wrapping addresses, foreign dtypes and devices.
#pragma once

#include <dlpack/dlpack.h>

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

}  // namespace exactjit::test
