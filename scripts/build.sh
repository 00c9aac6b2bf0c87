#!/usr/bin/env bash
# Configures and builds headlab into build/ (Release; CUDA backend wherever nvcc exists).
# Extra arguments go to cmake's configure step, e.g. scripts/build.sh -DHEADLAB_CUDA=OFF
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j"$jobs"
