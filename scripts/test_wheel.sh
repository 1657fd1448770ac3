#!/usr/bin/env bash
# The wheel as a Python user gets it (CI, no GPU): `pip install .` into a fresh venv, then, from
# outside the checkout and with neither PYTHONPATH nor EXACTJIT_LIBRARY set: the exactjit command
# is on PATH and runs; the package loads the libexactjit.so inside it; the wheel is tagged
# py3-none-linux_*; the library needs nothing beyond glibc (and libtinfo, through LLVM Support);
# the CPU Python tests pass against it (EXACTJIT_TEST_INSTALLED=1; the torch ones skip without
# torch). The build folder sits beside build/, so ccache serves the core's objects.
set -euo pipefail
cd "$(dirname "$0")/.."
checkout=$PWD
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
command -v ccache >/dev/null && export CMAKE_CXX_COMPILER_LAUNCHER=ccache
# The compiler CMake picks for build/ (ccache keys on its name; scikit-build-core would pass Python's g++).
export CC="${CC:-cc}" CXX="${CXX:-c++}"

python3 -m venv "$scratch/venv"
"$scratch/venv/bin/pip" install --quiet --disable-pip-version-check . -C build-dir="$checkout/build-wheel" \
  -C cmake.define.CUDAToolkit_ROOT="${CUDAToolkit_ROOT:-/usr/local/cuda}"

cd "$scratch"
unset PYTHONPATH EXACTJIT_LIBRARY
export PATH="$scratch/venv/bin:$PATH"
[ "$(command -v exactjit)" = "$scratch/venv/bin/exactjit" ]
exactjit --version
package=$(python -c 'import exactjit, os; print(os.path.dirname(exactjit.__file__))')
[ "$(python -c 'import exactjit; print(exactjit.library_path())')" = "$package/libexactjit.so" ]
grep -q '^Tag: py3-none-linux_' "$package"/../exactjit-*.dist-info/WHEEL
needed=$(readelf -d "$package/libexactjit.so" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | sort | paste -sd' ')
[ "$needed" = "ld-linux-x86-64.so.2 libc.so.6 libm.so.6 libtinfo.so.6" ] || { echo "wheel: libexactjit.so needs $needed" >&2; exit 1; }
echo "wheel: $(basename "$package"/../exactjit-*.dist-info) at $package, needs $needed"
for test in test_binding_cpu test_integration_cpu test_ops_cpu test_extension_cpu; do
  EXACTJIT_TEST_INSTALLED=1 python "$checkout/tests/python/$test.py"
done
