#!/usr/bin/env bash
# The whole test suite: installs missing dependencies, builds (Release, CUDA backend compiled where
# nvcc exists), runs every test with ctest, then rebuilds the CPU suite under AddressSanitizer +
# UndefinedBehaviorSanitizer and runs it again.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)

./scripts/build.sh
echo "== test suite (Release) =="
(cd build && ctest --output-on-failure -j"$jobs")

if [[ "${HEADLAB_SKIP_SANITIZE:-0}" != 1 ]]; then
  echo "== test suite (AddressSanitizer + UndefinedBehaviorSanitizer) =="
  cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHEADLAB_SANITIZE=ON -DHEADLAB_CUDA=OFF \
        -DHEADLAB_EXAMPLES=OFF >/dev/null
  cmake --build build-asan -j"$jobs"
  # OpenMP's runtime keeps thread pools alive at exit: not a leak of ours. Every suite but the CUDA
  # ones (label cuda; this build has no CUDA): unit and e2e (training runs, the CLI, analysis,
  # interop), the e2e ones about 1.5 minutes on 2 cores.
  (cd build-asan && ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
     ctest --output-on-failure -j"$jobs" -LE cuda)
fi
