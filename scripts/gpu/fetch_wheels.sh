#!/usr/bin/env bash
# Fill .whl/ with what scripts/gpu/checks.sh installs on a GPU machine that cannot reach a
# package index: the five titan wheels built from this checkout, plus the packages the GPU image
# (Python 3.12, its own CUDA torch) lacks. Run here, where pip can reach PyPI; needs .venv
# (bash scripts/setup.sh). About 6 MiB.
set -euo pipefail
cd "$(dirname "$0")/../.."
rm -rf .whl && mkdir .whl
.venv/bin/python -m pip wheel -q --no-deps --wheel-dir .whl \
  . plugins/titan-llama plugins/titan-qwen3 plugins/titan-deepseek plugins/titan-float8 plugins/titan-mx-prototype
# Versions pinned to what CI tests with; --no-deps because the image has torch, numpy, tiktoken,
# safetensors and matplotlib already, and its torch must not be replaced.
.venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --dest .whl pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
  typing_extensions==4.16.0 torchao==0.18.0
ls -1 .whl
du -sh .whl
