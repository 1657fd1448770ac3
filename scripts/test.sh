#!/usr/bin/env bash
# Sets up and builds, then runs the whole test suite (CPU suites always; the GPU suite skips
# cleanly without a driver and runs on a GPU machine).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
ctest --test-dir build --output-on-failure
