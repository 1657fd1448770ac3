// The public C++ wrapper (include/exactjit/exactjit.hpp) over libexactjit.so alone: this test links
// exactjit::exactjit, the target users get, and nothing of the core, so it also shows that the
// installed headers compile without LLVM or the core's include paths.
#include <exactjit/exactjit.hpp>

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace {

// A kernel small enough to compile quickly, in its canonical text.
constexpr const char* kSpec = "gate_residual dtype=fp32 hidden=256 table_stride=1536 vec=4 index=int64 target=sm_90";

class CxxApi : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (std::filesystem::temp_directory_path() / "xj_cxx_api_XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    cache_dir_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(cache_dir_); }

  xj_runtime_options options(int offline) const {
    xj_runtime_options options = xj::default_options();
    options.cache_dir = cache_dir_.c_str();
    options.read_only_cache_path = "";
    options.offline = offline;
    return options;
  }

  std::string cache_dir_;
};

template <typename Call>
xj::Error error_of(Call call) {
  try {
    call();
  } catch (const xj::Error& error) {
    return error;
  }
  ADD_FAILURE() << "no xj::Error thrown";
  return xj::Error(XJ_OK, "");
}

TEST(CxxApiVersion, LibraryMatchesHeader) {
  EXPECT_EQ(xj::version(), std::to_string(XJ_VERSION_MAJOR) + "." + std::to_string(XJ_VERSION_MINOR) + "." +
                               std::to_string(XJ_VERSION_PATCH));
}

TEST_F(CxxApi, InfoShowsTheResolvedOptions) {
  xj::Runtime runtime(options(1));
  const std::string info = runtime.info();
  EXPECT_NE(info.find("cache: " + cache_dir_ + "\n"), std::string::npos) << info;
  EXPECT_NE(info.find("offline: yes\n"), std::string::npos) << info;
}

TEST_F(CxxApi, OfflineMissThrowsWithTheSpecAndTheFix) {
  xj::Runtime runtime(options(1));
  const xj::Error error = error_of([&] { runtime.prewarm(kSpec); });
  EXPECT_EQ(error.code(), XJ_ERROR_OFFLINE_MISS);
  EXPECT_NE(std::string(error.what()).find(kSpec), std::string::npos) << error.what();
  EXPECT_NE(std::string(error.what()).find("exactjit prewarm"), std::string::npos) << error.what();
}

TEST_F(CxxApi, PrewarmCompilesThenServesOffline) {
  xj::Runtime(options(0)).prewarm(kSpec);
  xj::Runtime(options(1)).prewarm(kSpec);  // from the disk cache: no miss
}

TEST_F(CxxApi, BadSpecTextIsAnInvalidArgument) {
  xj::Runtime runtime(options(1));
  const xj::Error error = error_of([&] { runtime.prewarm("gate_residual dtype=fp32"); });
  EXPECT_EQ(error.code(), XJ_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(error.what()).find("canonical spec"), std::string::npos) << error.what();
}

TEST_F(CxxApi, OpOnHostMemoryThrowsNamingTheArgument) {
  xj::Runtime runtime(options(1));
  float data[4] = {};
  int64_t shape[2] = {1, 4};
  int64_t index_data[1] = {};
  int64_t index_shape[1] = {1};
  DLTensor x{data, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, shape, nullptr, 0};
  DLTensor index{index_data, {kDLCPU, 0}, 1, {kDLInt, 64, 1}, index_shape, nullptr, 0};
  const xj::Error error = error_of([&] { runtime.gate_residual(x, x, index, x, x); });
  EXPECT_EQ(error.code(), XJ_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(error.what()).find("gate_residual"), std::string::npos) << error.what();
}

TEST_F(CxxApi, MovedRuntimeKeepsWorking) {
  xj::Runtime first(options(1));
  xj::Runtime second = std::move(first);
  EXPECT_EQ(first.get(), nullptr);
  EXPECT_NE(second.info().find("offline: yes"), std::string::npos);
  first = std::move(second);
  EXPECT_NE(first.info().find("offline: yes"), std::string::npos);
}

}  // namespace
