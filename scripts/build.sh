#!/usr/bin/env bash
# Configures and builds headlab into build/ (Release; CUDA backend wherever nvcc exists).
# Usage: scripts/build.sh [--target NAME]... [cmake configure arguments, e.g. -DHEADLAB_CUDA=OFF]
# Without --target everything is built (library, command, examples, tests).
set -euo pipefail
cd "$(dirname "$0")/.."
targets=()
configure=()
while (($#)); do
  if [[ "$1" == --target ]]; then
    targets+=(--target "$2")
    shift 2
  else
    configure+=("$1")
    shift
  fi
done
./scripts/install-deps.sh
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "${configure[@]}" >/dev/null
cmake --build build -j"$jobs" "${targets[@]}"
