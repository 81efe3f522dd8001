#!/usr/bin/env bash
# The `candle` feature (kda::candle, its examples) compiles and passes clippy: candle's CUDA
# backend builds its kernels with the nvcc that .ci/setup put in .venv-nvcc (CUDA_COMPUTE_CAP picks
# their target; the H200's). Linking and running need the CUDA libraries and a GPU (README).
set -euo pipefail
cd "$(dirname "$0")/.."
cuda=$(ls -d .venv-nvcc/lib/python3*/site-packages/nvidia/cu13 | head -1)
export PATH="$PWD/$cuda/bin:$PATH" CUDA_ROOT="$PWD/$cuda" CUDA_PATH="$PWD/$cuda" CUDA_COMPUTE_CAP=90
cargo clippy -p kda --features candle --all-targets -- -D warnings
