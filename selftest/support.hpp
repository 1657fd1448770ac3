// exactjit self-test support: deterministic data, device tensors and the bitwise judge that the
// forward and backward self-test cases share (internal to selftest/).
#pragma once

#include "codegen/kernel_spec.hpp"
#include "api/runtime.hpp"
#include "runtime/device_buffer.hpp"
#include "selftest/selftest.hpp"

#include <dlpack/dlpack.h>
#include <llvm/Support/Error.h>

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

namespace exactjit::selftest {

// Deterministic data: splitmix64 drives values of mixed magnitude plus a sprinkle of specials.
struct Generator {
  uint64_t state;
  uint64_t next();
  double uniform();
  // specials: NaN and infinities too (elementwise ops); reductions want them in chosen rows only.
  float value(bool specials);
};

/// Element k of a storage buffer set to v, rounded to the dtype as the model rounds.
void store(std::vector<uint8_t>& bytes, int64_t k, DType dtype, float v);
std::vector<uint8_t> random_storage(Generator& gen, DType dtype, int64_t count, bool specials = true);
DLTensor device_tensor(const DeviceBuffer& buffer, uint64_t byte_offset, int device_id, int ndim, int64_t* shape,
                       int64_t* strides, DLDataType dtype);
std::vector<uint8_t> index_bytes(IndexType type, const std::vector<int64_t>& values);
/// S random table rows in [0, R), with `bad_value` at bad_position (none when negative).
std::vector<int64_t> random_indices(Generator& gen, int64_t seq, int64_t table_rows, int64_t bad_position,
                                    int64_t bad_value);

/// The device buffers of one case on one device. Each upload allocates a buffer of `bytes` and
/// copies `host` to `offset`; the first failure is kept (later uploads do nothing and return
/// null), so a case checks take_error() once, before it touches any buffer.
class DeviceArena {
 public:
  static llvm::Expected<DeviceArena> open(int device_id);
  DeviceArena(DeviceArena&&) = default;
  ~DeviceArena() { llvm::consumeError(std::move(error_)); }

  DeviceBuffer* upload(const std::vector<uint8_t>& host, size_t bytes, size_t offset = 0);
  llvm::Error take_error() { return std::move(error_); }

 private:
  DeviceArena(const Driver& driver, CUcontext context) : driver_(&driver), context_(context) {}
  const Driver* driver_;
  CUcontext context_;
  std::deque<DeviceBuffer> buffers_;
  llvm::Error error_ = llvm::Error::success();
};
DLDataType dl_index(IndexType type);
DLDataType dl_dtype(DType dtype);

/// Compares the device output with the host model's bit for bit and judges the case: equal bits
/// and, when a bad index was planted, an error at synchronize() that names `expected_error`.
void judge(CaseOutcome& outcome, const std::vector<uint8_t>& expected, const std::vector<uint8_t>& actual,
           size_t elem, const std::string& expected_error);

}  // namespace exactjit::selftest
