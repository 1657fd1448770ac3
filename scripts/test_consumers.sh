#!/usr/bin/env bash
# exactjit as C and C++ projects consume it (CI, no GPU). build/ is installed into build-install/;
# examples/ is then built three ways (find_package on that prefix, add_subdirectory and FetchContent
# of this checkout) and c_abi.c once more by hand through pkg-config. Every program runs with
# EXACTJIT_OFFLINE=1 and an empty cache and must print examples/expected_output.txt (version and
# cache folder filled in) and exit 0. Needs scripts/setup.sh's build.
#
# The consumer build folders sit beside build/, so ccache (same relative and absolute source
# paths) serves the core's objects and only the examples compile.
set -euo pipefail
cd "$(dirname "$0")/.."
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
version=$(sed -n 's/^#define XJ_VERSION_[A-Z]* //p' include/exactjit/exactjit.h | paste -sd.)
configure=(-G Ninja -DCMAKE_BUILD_TYPE=Release)
command -v ccache >/dev/null && configure+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
from_source=(-DCUDAToolkit_ROOT="${CUDAToolkit_ROOT:-/usr/local/cuda}")

check_run() {  # name program: runs it offline against an empty cache, compares what it prints
  local cache="$scratch/cache-$1"
  mkdir "$cache"
  if ! env -u EXACTJIT_CACHE_PATH -u EXACTJIT_ARCH -u EXACTJIT_CHECK_AFTER_LAUNCH EXACTJIT_OFFLINE=1 \
       EXACTJIT_CACHE_DIR="$cache" "$2" >"$scratch/out"; then
    echo "consumers: $1 exited non-zero:" >&2
    cat "$scratch/out" >&2
    return 1
  fi
  sed "s|{version}|$version|g; s|{cache}|$cache|g" examples/expected_output.txt | diff -u - "$scratch/out"
  echo "consumers: $1 ok"
}

rm -rf build-install
cmake --install build --prefix "$PWD/build-install" >/dev/null
cmake -S examples -B build-examples-package "${configure[@]}" -DEXACTJIT_FROM=package \
  -DCMAKE_PREFIX_PATH="$PWD/build-install" >/dev/null
for way in subdirectory fetchcontent; do
  cmake -S examples -B "build-examples-$way" "${configure[@]}" "${from_source[@]}" -DEXACTJIT_FROM=$way >/dev/null
done
for way in package subdirectory fetchcontent; do
  ninja -C "build-examples-$way" c_abi_example cxx_wrapper_example >/dev/null
  check_run "$way-c" "build-examples-$way/c_abi_example"
  check_run "$way-c++" "build-examples-$way/cxx_wrapper_example"
done

PKG_CONFIG_PATH=$(dirname "$(find build-install -name exactjit.pc)")
export PKG_CONFIG_PATH
# shellcheck disable=SC2046  # pkg-config's flags are words
cc examples/c_abi.c -o "$scratch/c_abi_pkg_config" $(pkg-config --cflags --libs exactjit) \
  -Wl,-rpath,"$(pkg-config --variable=libdir exactjit)"
check_run pkg-config-c "$scratch/c_abi_pkg_config"
