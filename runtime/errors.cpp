// exactjit error codes (see errors.hpp).
#include "runtime/errors.hpp"

namespace exactjit {
namespace {

class Category final : public std::error_category {
 public:
  const char* name() const noexcept override { return "exactjit"; }
  std::string message(int code) const override {
    switch (static_cast<ErrorCode>(code)) {
      case ErrorCode::InvalidArgument: return "invalid argument";
      case ErrorCode::CompileFailed: return "compile failed";
      case ErrorCode::OfflineMiss: return "kernel not in cache (offline)";
      case ErrorCode::Cuda: return "CUDA driver error";
      case ErrorCode::BadIndex: return "index out of range";
      case ErrorCode::Unavailable: return "library unavailable";
      case ErrorCode::Io: return "cache I/O error";
      case ErrorCode::Internal: return "internal error";
    }
    return "unknown error";
  }
};

}  // namespace

const std::error_category& exactjit_category() {
  static const Category category;
  return category;
}

llvm::Error make_error(ErrorCode code, std::string message) {
  return llvm::make_error<llvm::StringError>(std::move(message), make_error_code(code));
}

ErrorReport take_error(llvm::Error error) {
  ErrorReport report;
  llvm::handleAllErrors(std::move(error), [&report](const llvm::ErrorInfoBase& info) {
    const std::error_code ec = info.convertToErrorCode();
    if (ec.category() == exactjit_category()) report.code = static_cast<ErrorCode>(ec.value());
    if (!report.message.empty()) report.message += "; ";
    report.message += info.message();
  });
  return report;
}

}  // namespace exactjit
