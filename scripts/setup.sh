#!/usr/bin/env bash
# Installs what is missing (Debian/Ubuntu packages), configures and builds exactjit into build/.
# The CUDA toolkit (NVRTC and headers) is required and not an apt package: point
# CUDAToolkit_ROOT at it if it is not in /usr/local/cuda.
set -euo pipefail
cd "$(dirname "$0")/.."

# ccache: the wheel and the consumer builds of scripts/test.sh reuse build/'s objects.
# python3-venv, pkg-config: the wheel and pkg-config consumer checks.
packages=(cmake ninja-build g++ llvm-14-dev libgtest-dev libbenchmark-dev libfmt-dev libdlpack-dev python3
          python3-venv pkg-config ccache)
missing=()
for p in "${packages[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  echo "setup: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

cuda_root="${CUDAToolkit_ROOT:-/usr/local/cuda}"
if [ ! -f "$cuda_root/include/nvrtc.h" ]; then
  echo "setup: the CUDA toolkit (nvrtc.h) is not in $cuda_root; set CUDAToolkit_ROOT" >&2
  exit 1
fi
# The Python tests' interpreter: where python3 has torch, a venv over its packages with diffusers
# 0.42.1 added (pure Python, from PyPI), so the MiniMax-H3 integration and context-parallel tests run
# instead of skipping; else, or if PyPI cannot be reached, python3 itself (those tests skip, saying so).
test_python=$(command -v python3)
if python3 -c "import torch" 2>/dev/null; then
  venv=build/test-venv
  if { [ -x "$venv/bin/python" ] || python3 -m venv --system-site-packages "$venv"; } &&
     { "$venv/bin/python" -c "import diffusers" 2>/dev/null ||
       "$venv/bin/pip" install --quiet --disable-pip-version-check diffusers==0.42.1; }; then
    test_python=$PWD/$venv/bin/python
  else
    echo "setup: diffusers could not be installed; the tests that need it will skip" >&2
  fi
fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCUDAToolkit_ROOT="$cuda_root" \
  -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DPython3_EXECUTABLE="$test_python" >/dev/null
ninja -C build
