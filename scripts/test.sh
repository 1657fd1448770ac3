#!/usr/bin/env bash
# Sets up and builds, then runs the whole test suite (CPU suites always; the GPU suite skips
# cleanly without a driver and runs on a GPU machine). Then the packaging as users meet it: the
# wheel in a fresh venv (scripts/test_wheel.sh) and the C/C++ consumers of the CMake package
# (scripts/test_consumers.sh), both on build/'s objects through ccache, each timed. Then the CPU
# suites again, built with AddressSanitizer and UndefinedBehaviorSanitizer in build-asan/ (the
# fuzz tests included; the first report of either sanitizer fails the run).
# EXACTJIT_SKIP_SANITIZERS=1 skips that stage.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
ctest --test-dir build --output-on-failure
for check in test_wheel test_consumers; do
  start=$SECONDS
  "scripts/$check.sh"
  echo "test: $check took $((SECONDS - start)) s"
done
[ "${EXACTJIT_SKIP_SANITIZERS:-0}" = 1 ] && exit 0
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DEXACTJIT_SANITIZE=address,undefined \
  -DCUDAToolkit_ROOT="${CUDAToolkit_ROOT:-/usr/local/cuda}" >/dev/null
ninja -C build-asan exactjit_cpu_tests exactjit_dispatch_tests
# use_sigaltstack=0: LLVM's signal handling in the CLI and ASan's per-thread alternate stack
# collide at thread exit ("failed to deallocate ... unable to unmap"), an artefact of the pair.
# intercept_tls_get_addr=0: after NVRTC is dlopened, GCC 12's LeakSanitizer can record a bogus
# dynamic-TLS range (e.g. "DTLS 6 at 0xad4-0x2000001bd6") and its tracer dies scanning it at exit
# ("Tracer caught signal 11"), failing a CLI run that did its work (cache verify --rebuild).
# Without the interception LSan does not scan dynamic TLS: it can only report more, never hide.
ASAN_OPTIONS=use_sigaltstack=0:intercept_tls_get_addr=0:detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan -R '^(cpu|dispatch)$' --output-on-failure
