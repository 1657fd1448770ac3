#!/usr/bin/env bash
# Fills .whl/ (git-ignored) with the wheels bench/gpu_campaign.sh installs on the GPU machine:
# diffusers 0.42.1 and what it needs, for the MiniMax-H3 checks and the end-to-end benchmark.
# Python 3.12 manylinux wheels, without those the machine's torch venv already has (numpy,
# pillow) and the optional hf_xet, so the folder stays ~11 MB of the 64 MiB `carry` takes.
# huggingface_hub is held below 2: diffusers' peft loader imports the machine's transformers,
# which refuses hub 2.x ("huggingface-hub>=1.5.0,<2.0 is required").
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .whl && mkdir .whl
pip download -q --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 \
  --platform manylinux2014_x86_64 -d .whl diffusers==0.42.1 "huggingface_hub>=1.5,<2"
rm -f .whl/numpy-* .whl/pillow-* .whl/hf_xet-*
du -sh .whl
