// exactjit device error records (see device_errors.hpp).
#include "runtime/device_errors.hpp"

#include "codegen/kernel_spec.hpp"
#include "runtime/errors.hpp"

#include <fmt/format.h>

#include <cstring>

namespace exactjit {

llvm::Expected<CUdeviceptr> allocate_error_record(const Driver& driver, CUcontext context) {
  ScopedContext scope(driver, context);
  CUdeviceptr record = 0;
  if (auto err = driver.check(driver.cuMemAlloc(&record, sizeof(DeviceErrorRecord)), "cuMemAlloc (error record)"))
    return err;
  if (auto err = driver.check(driver.cuMemsetD8(record, 0, sizeof(DeviceErrorRecord)), "cuMemsetD8 (error record)"))
    return err;
  return record;
}

llvm::Error check_error_record(const Driver& driver, CUcontext context, CUstream stream, CUdeviceptr record) {
  ScopedContext scope(driver, context);
  if (auto err = driver.check(driver.cuStreamSynchronize(stream), "cuStreamSynchronize")) return err;
  DeviceErrorRecord host{};
  if (auto err = driver.check(driver.cuMemcpyDtoH(&host, record, sizeof host), "cuMemcpyDtoH (error record)"))
    return err;
  if (host.claimed == 0) return llvm::Error::success();
  if (auto err = driver.check(driver.cuMemsetD8(record, 0, sizeof host), "cuMemsetD8 (error record)")) return err;
  const unsigned code = host.op & 0xFFFFu;  // op code + 1; the argument sits above it
  if (code < 1) return make_error(ErrorCode::BadIndex, "a kernel reported a bad index without naming its op");
  const Op op = static_cast<Op>(code - 1);
  if (op == Op::TimestepSinusoid) {  // the value is the float itself
    float t = 0;
    const uint32_t bits = static_cast<uint32_t>(host.value);
    std::memcpy(&t, &bits, sizeof t);
    return make_error(ErrorCode::BadIndex,
                      fmt::format("timestep_sinusoid: t[{}] = {} is not a finite value in [0, 1] (check_range)",
                                  host.position, t));
  }
  return make_error(ErrorCode::BadIndex,
                    fmt::format("{}: {}[{}] = {} is out of range [0, {}); the rows that use it were not written",
                                op_name(op), index_argument_name(op, host.op >> 16), host.position, host.value,
                                host.bound));
}

}  // namespace exactjit
