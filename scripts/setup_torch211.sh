#!/usr/bin/env bash
# Create .venv-torch211 with torch 2.11.0 (the GPU image's torch, the oldest this project supports) and
# install titan-core and the five plugins from this checkout into it, to run the fast tier there:
#   bash scripts/setup_torch211.sh && .venv-torch211/bin/python -m pytest -q -m fast
# PyPI's torch 2.11.0 for Linux is the CUDA 13.0 build (no CPU build on PyPI). It imports, and runs on
# CPU, with the CUDA libraries its own libraries link against, so only those are installed (about 3 GB
# in all): not triton, cuda-bindings, nvrtc or nvtx, which torch's metadata also asks for. pip therefore
# reports torch's requirements as unmet; that is expected. Re-running reinstalls this checkout's wheels.
# PYTHON picks the interpreter (python3 by default; the GPU image has 3.12).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${TORCH211_VENV:-.venv-torch211}  # another folder (e.g. for a second Python): TORCH211_VENV=...
quiet=(-q)
if [ "${TITAN_SETUP_VERBOSE:-0}" = 1 ]; then quiet=(); fi
say() { echo "[setup-torch211] $*"; }
start=$SECONDS
# pip's own failure fails the script (pipefail); the lines filtered out are the expected noise above.
pip_install() { "$VENV/bin/python" -m pip install ${quiet[@]+"${quiet[@]}"} "$@" 2>&1 \
  | { grep -v -e "^WARNING: Location" -e "^ERROR: pip's dependency resolver" -e "^torch 2.11.0 requires" || true; }; }

if [ ! -x "$VENV/bin/python" ]; then
  say "creating $VENV with $("$PY" --version 2>&1)"
  "$PY" -m venv "$VENV"
  pip_install --upgrade pip
fi
if [ "$("$VENV/bin/python" -c 'import torch; print(torch.__version__)' 2>/dev/null)" != "2.11.0+cu130" ]; then
  say "installing torch 2.11.0 (CUDA 13.0 build, 0.5 GB) and the CUDA libraries it loads (2.5 GB)"
  pip_install --no-deps "torch==2.11.0"
  pip_install filelock "typing-extensions>=4.10.0" "setuptools<82" "sympy>=1.13.3" "networkx>=2.5.1" jinja2 \
    "fsspec>=0.8.5" \
    "cuda-toolkit[cublas,cudart,cufft,cufile,cupti,curand,cusparse,nvjitlink]==13.0.2" \
    "nvidia-cudnn-cu13==9.19.0.56" "nvidia-cusparselt-cu13==0.8.0" "nvidia-nccl-cu13==2.28.9" \
    "nvidia-nvshmem-cu13==3.4.5"
  "$VENV/bin/python" -c 'import torch; assert torch.__version__ == "2.11.0+cu130", torch.__version__'
fi
say "installing titan-core's dependencies and the test tools (torchao 0.18 without its dependencies)"
pip_install "pydantic>=2.5,<3" "tiktoken>=0.7" "datasets>=2.19" "safetensors>=0.4" "numpy>=1.24" "pytest>=8" \
  "transformers>=4.45" "tokenizers>=0.19" "hatchling>=1.18" "build>=1.0" "matplotlib>=3.7"
# --no-deps: torchao and the six packages would otherwise make pip resolve torch's own CUDA requirements.
pip_install --no-deps "torchao==0.18.0"
say "building titan-core and the five plugins as wheels and installing them"
pip_install --no-deps --force-reinstall . plugins/titan-llama plugins/titan-qwen3 plugins/titan-deepseek \
  plugins/titan-float8 plugins/titan-mx-prototype
"$VENV/bin/python" -c 'import titan_core, titan_llama, titan_qwen3, titan_deepseek, titan_float8, titan_mx_prototype'
say "done in $((SECONDS - start)) s: $VENV/bin/python -m pytest -q -m fast"
