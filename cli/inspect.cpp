// exactjit inspect: everything an auditor needs about one kernel — its generated source, the
// NVRTC options, its cache keys, PTX, SASS (when cuobjdump is on PATH) or its cache manifest.
#include "cli/commands.hpp"
#include "cli/options.hpp"

#include "codegen/render.hpp"
#include "runtime/content_key.hpp"
#include "runtime/errors.hpp"
#include "runtime/kernel_cache.hpp"
#include "runtime/nvrtc.hpp"

#include <fmt/format.h>
#include <llvm/Support/FileSystem.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/Program.h>

namespace exactjit::cli {
namespace {

int emit_sass(const KernelSource& source) {
  auto cuobjdump = llvm::sys::findProgramByName("cuobjdump");
  if (!cuobjdump) {
    fmt::print(stderr, "exactjit: error: --emit sass needs cuobjdump on PATH (it is not)\n");
    return kExitFailed;
  }
  if (source.spec.target.ptx) {
    fmt::print(stderr, "exactjit: error: --emit sass needs a real target (sm_NN), not {}\n", source.spec.target.name());
    return kExitUsage;
  }
  KernelCache cache(cache_config());
  auto lookup = cache.get(source);
  if (!lookup) return report_error(lookup.takeError());
  llvm::SmallString<128> file;
  int fd = -1;
  if (llvm::sys::fs::createTemporaryFile("exactjit", "cubin", fd, file)) {
    fmt::print(stderr, "exactjit: error: cannot create a temporary file\n");
    return kExitFailed;
  }
  {
    llvm::raw_fd_ostream out(fd, /*shouldClose=*/true);
    out << lookup->kernel->image;
  }
  const llvm::StringRef args[] = {*cuobjdump, "--dump-sass", file};
  const int rc = llvm::sys::ExecuteAndWait(*cuobjdump, args);
  llvm::sys::fs::remove(file);
  return rc == 0 ? kExitOk : kExitFailed;
}

}  // namespace

int run_inspect() {
  auto specs = specs_from_flags(/*single=*/true);
  if (!specs) return report_error(specs.takeError());
  const KernelSource source = codegen::render(specs->front());
  const std::string what = emit_flag;

  if (what == "source") {
    fmt::print("{}", source.text);
    return kExitOk;
  }
  if (what == "options") {
    for (const std::string& option : source.options) fmt::print("{}\n", option);
    return kExitOk;
  }
  if (what == "key") {
    const std::string key = source_key(source);
    fmt::print("spec:        {}\nentry:       {}\nsource key:  {}\n", source.spec.describe(), source.entry, key);
    auto nvrtc = Nvrtc::get();
    if (!nvrtc) return report_error(nvrtc.takeError());
    const std::string tag = (*nvrtc)->identity().tag();
    fmt::print("compiler:    {}\ncontent key: {}\n", tag, content_key(key, tag));
    return kExitOk;
  }
  if (what == "ptx") {
    auto nvrtc = Nvrtc::get();
    if (!nvrtc) return report_error(nvrtc.takeError());
    auto ptx = (*nvrtc)->ptx(source);
    if (!ptx) return report_error(ptx.takeError());
    fmt::print("{}", *ptx);
    return kExitOk;
  }
  if (what == "manifest") {
    KernelCache cache(cache_config());
    auto lookup = cache.get(source);
    if (!lookup) return report_error(lookup.takeError());
    if (lookup->kernel->directory.empty()) {
      fmt::print(stderr, "exactjit: error: the kernel compiled but could not be cached, so it has no manifest\n");
      return kExitFailed;
    }
    auto manifest = llvm::MemoryBuffer::getFile(lookup->kernel->directory + "/manifest.json");
    if (!manifest) {
      fmt::print(stderr, "exactjit: error: cannot read the manifest in {}\n", lookup->kernel->directory);
      return kExitFailed;
    }
    fmt::print("{}\n", (*manifest)->getBuffer().str());
    return kExitOk;
  }
  if (what == "sass") return emit_sass(source);
  fmt::print(stderr, "exactjit: error: --emit must be source, options, key, ptx, sass or manifest (got '{}')\n", what);
  return kExitUsage;
}

}  // namespace exactjit::cli
