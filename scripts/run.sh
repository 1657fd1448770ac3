#!/usr/bin/env bash
# The main job: set up and build, pre-warm the default catalog for this machine's GPU (sm_90
# when there is none), print the summary, show one generated kernel, and on a GPU machine run
# the bitwise self-test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export EXACTJIT_CACHE_DIR="${EXACTJIT_CACHE_DIR:-$PWD/build/cache}"
./build/exactjit info
./build/exactjit prewarm
./build/exactjit cache stat
echo "---- one generated kernel (gate_residual bf16, H = 5376, block table stride 6H) ----"
./build/exactjit inspect --op gate_residual --hidden 5376 --dtype bf16 --emit source
echo "---- (exactjit inspect --emit ptx|options|key|manifest shows the rest) ----"
if ./build/exactjit info | grep -q '^  gpu 0:'; then
  ./build/exactjit selftest
else
  echo "no GPU here: skipping 'exactjit selftest'"
fi
