// exactjit tuning support: what the tune_* programs share — fatal error handling, source edits,
// device buffers filled with random finite bf16 values, and a CUDA-event median timer.
#pragma once

#include "runtime/device_buffer.hpp"
#include "runtime/device_errors.hpp"
#include "runtime/driver.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

namespace exactjit::tune {

inline void die_on(llvm::Error err) {
  if (err) {
    fmt::print(stderr, "tune: {}\n", llvm::toString(std::move(err)));
    std::exit(1);
  }
}

template <typename T> T die_on(llvm::Expected<T> value) {
  if (!value) die_on(value.takeError());
  return std::move(*value);
}

/// Replaces every occurrence; a text that is not there is a broken variant, so it is fatal.
inline void replace_all(std::string& text, const std::string& from, const std::string& to) {
  if (text.find(from) == std::string::npos) {
    fmt::print(stderr, "tune: '{}' not in the source\n", from);
    std::exit(1);
  }
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
    text.replace(at, from.size(), to);
}

/// A device buffer of `bytes` filled with random finite bf16 values (never zeros).
inline DeviceBuffer random_buffer(const Driver& cu, CUcontext ctx, size_t bytes, uint64_t seed) {
  std::vector<uint16_t> pattern(1 << 22);
  for (uint16_t& v : pattern) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    v = static_cast<uint16_t>(((seed >> 33) & 0x3FFF) | 0x3800 | ((seed >> 20) & 0x8000));
  }
  DeviceBuffer buffer = die_on(DeviceBuffer::allocate(cu, ctx, bytes));
  for (size_t at = 0; at < bytes; at += pattern.size() * 2)
    die_on(buffer.upload(pattern.data(), std::min(pattern.size() * 2, bytes - at), at));
  return buffer;
}

/// An index tensor (int64) of `count` rows cycling through `table_rows` with a fixed stride.
inline DeviceBuffer index_buffer(const Driver& cu, CUcontext ctx, int64_t count, int64_t table_rows, int64_t step) {
  std::vector<int64_t> index(static_cast<size_t>(count));
  for (int64_t r = 0; r < count; ++r) index[r] = (r * step + 1) % table_rows;
  DeviceBuffer buffer = die_on(DeviceBuffer::allocate(cu, ctx, index.size() * 8));
  die_on(buffer.upload(index.data(), index.size() * 8));
  return buffer;
}

/// A zeroed device error record for the kernels' last parameter (no host mirror: a tuning run
/// never reports).
inline DeviceBuffer error_record(const Driver& cu, CUcontext ctx) {
  DeviceBuffer buffer = die_on(DeviceBuffer::allocate(cu, ctx, sizeof(DeviceErrorRecord)));
  die_on(buffer.fill(0));
  return buffer;
}

/// Median over `reps` single launches, each bracketed by events; `launch(set)` rotates input sets.
class EventTimer {
 public:
  EventTimer(const Driver& cu, int reps, int sets) : cu_(cu), reps_(reps), sets_(sets) {
    cu_.cuEventCreate(&start_, CU_EVENT_DEFAULT);
    cu_.cuEventCreate(&stop_, CU_EVENT_DEFAULT);
  }
  ~EventTimer() {
    cu_.cuEventDestroy(start_);
    cu_.cuEventDestroy(stop_);
  }
  /// Device-to-device copy rate, GB/s of bytes read + written, over the rotating sets.
  double copy_gbs(const std::vector<DeviceBuffer>& from, const std::vector<DeviceBuffer>& to, size_t bytes) {
    const float ms = median_ms([&](int s) {
      die_on(cu_.check(cu_.cuMemcpyDtoDAsync(to[s].address(), from[s].address(), bytes, nullptr), "copy"));
    });
    return 2.0 * bytes / ms / 1e6;
  }

  template <typename Launch> float median_ms(Launch&& launch) {
    for (int k = 0; k < 3; ++k) launch(k % sets_);
    std::vector<float> times;
    for (int k = 0; k < reps_; ++k) {
      cu_.cuEventRecord(start_, nullptr);
      launch(k % sets_);
      cu_.cuEventRecord(stop_, nullptr);
      die_on(cu_.check(cu_.cuEventSynchronize(stop_), "cuEventSynchronize"));
      float ms = 0;
      cu_.cuEventElapsedTime(&ms, start_, stop_);
      times.push_back(ms);
    }
    std::sort(times.begin(), times.end());
    return times[times.size() / 2];
  }

 private:
  const Driver& cu_;
  int reps_, sets_;
  CUevent start_ = nullptr, stop_ = nullptr;
};

}  // namespace exactjit::tune
