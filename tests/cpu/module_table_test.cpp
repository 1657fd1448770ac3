// The per-context module table (issue 7's logic, on the CPU): a fake driver records which context
// was current for every module load and unload. One kernel used from two contexts is loaded once
// in each, calls restore the caller's context, concurrent callers from both contexts load each
// (context, kernel) exactly once, and a failed load is reported and not remembered.
#include "runtime/module_table.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace exactjit {
namespace {

struct Event {
  std::string what;
  CUcontext context;
  std::string image;
};

std::mutex g_mutex;
std::vector<Event> g_events;
std::atomic<uintptr_t> g_next_handle{0x1000};
thread_local CUcontext t_current = nullptr;

CUcontext context(uintptr_t n) { return reinterpret_cast<CUcontext>(n); }

Driver fake_driver() {
  Driver d;
  d.cuCtxGetCurrent = [](CUcontext* c) { *c = t_current; return CUDA_SUCCESS; };
  d.cuCtxSetCurrent = [](CUcontext c) { t_current = c; return CUDA_SUCCESS; };
  d.cuGetErrorName = [](CUresult, const char** s) { *s = "CUDA_ERROR_INVALID_IMAGE"; return CUDA_SUCCESS; };
  d.cuGetErrorString = [](CUresult, const char** s) { *s = "device kernel image is invalid"; return CUDA_SUCCESS; };
  d.cuModuleLoadData = [](CUmodule* m, const void* image) {
    const std::string text(static_cast<const char*>(image));
    std::lock_guard<std::mutex> lock(g_mutex);
    g_events.push_back({"load", t_current, text});
    if (text.rfind("bad", 0) == 0) return CUDA_ERROR_INVALID_IMAGE;
    *m = reinterpret_cast<CUmodule>(g_next_handle.fetch_add(0x10));
    return CUDA_SUCCESS;
  };
  d.cuModuleGetFunction = [](CUfunction* f, CUmodule m, const char*) {
    *f = reinterpret_cast<CUfunction>(reinterpret_cast<uintptr_t>(m) + 1);
    return CUDA_SUCCESS;
  };
  d.cuModuleUnload = [](CUmodule) {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_events.push_back({"unload", t_current, ""});
    return CUDA_SUCCESS;
  };
  return d;
}

CachedKernel kernel(const std::string& key, const std::string& image = "cubin") {
  CachedKernel k;
  k.source_key = key;
  k.entry = "entry_" + key;
  k.image = image + ":" + key;
  return k;
}

size_t count(const std::string& what, CUcontext ctx) {
  size_t n = 0;
  for (const Event& e : g_events) n += e.what == what && e.context == ctx;
  return n;
}

class ModuleTableTest : public ::testing::Test {
 protected:
  void SetUp() override {
    g_events.clear();
    t_current = context(0xC0);  // the caller's own context
  }
  Driver driver = fake_driver();
};

TEST_F(ModuleTableTest, OneModulePerContextAndKernel) {
  {
    ModuleTable table(driver);
    auto a1 = table.function(context(0xA), kernel("k"));
    auto a2 = table.function(context(0xA), kernel("k"));
    auto b1 = table.function(context(0xB), kernel("k"));
    ASSERT_TRUE(a1 && a2 && b1);
    EXPECT_EQ(*a1, *a2);         // reused in the same context
    EXPECT_NE(*a1, *b1);         // its own module in the other context
    EXPECT_EQ(table.size(), 2u);
    EXPECT_EQ(count("load", context(0xA)), 1u);  // loaded with that context current
    EXPECT_EQ(count("load", context(0xB)), 1u);
    EXPECT_EQ(t_current, context(0xC0));  // the caller's context is restored
  }
  EXPECT_EQ(count("unload", context(0xA)), 1u);  // each unloaded once, in its own context
  EXPECT_EQ(count("unload", context(0xB)), 1u);
  EXPECT_EQ(t_current, context(0xC0));
}

TEST_F(ModuleTableTest, ConcurrentCallersFromTwoContextsLoadEachPairOnce) {
  ModuleTable table(driver);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      t_current = context(0xD0 + t);
      for (int round = 0; round < 50; ++round) {
        const CUcontext ctx = context((t + round) % 2 ? 0xA : 0xB);
        auto f = table.function(ctx, kernel("k" + std::to_string(round % 3)));
        if (!f || t_current != context(0xD0 + t)) ++failures;
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(table.size(), 6u);  // 2 contexts x 3 kernels
  EXPECT_EQ(count("load", context(0xA)), 3u);
  EXPECT_EQ(count("load", context(0xB)), 3u);
}

TEST_F(ModuleTableTest, AFailedLoadIsReportedAndRetried) {
  ModuleTable table(driver);
  auto bad = table.function(context(0xA), kernel("k", "bad"));
  ASSERT_FALSE(static_cast<bool>(bad));
  const std::string message = llvm::toString(bad.takeError());
  EXPECT_NE(message.find("cuModuleLoadData"), std::string::npos) << message;
  EXPECT_NE(message.find("CUDA_ERROR_INVALID_IMAGE"), std::string::npos) << message;
  EXPECT_EQ(table.size(), 0u);
  auto again = table.function(context(0xA), kernel("k", "bad"));
  ASSERT_FALSE(static_cast<bool>(again));
  llvm::consumeError(again.takeError());
  EXPECT_EQ(count("load", context(0xA)), 2u);  // not remembered: the next call tries again
}

}  // namespace
}  // namespace exactjit
