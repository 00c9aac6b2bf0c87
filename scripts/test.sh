#!/usr/bin/env bash
# The whole test suite: installs missing dependencies, builds (Release, CUDA backend compiled where
# nvcc exists, the Python module), runs every test with ctest (the Python module's pytest suite
# included), then rebuilds the CPU suite with clang under AddressSanitizer + UndefinedBehaviorSanitizer
# (the Python module's pytest suite too, with the sanitizer runtime preloaded into python3), runs it
# again, and runs the libFuzzer targets briefly.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)

# -Werror: the Release build has no warnings, and a change that adds one fails here.
./scripts/build.sh -DHEADLAB_WERROR=ON
echo "== test suite (Release) =="
(cd build && ctest --output-on-failure -j"$jobs")

if [[ "${HEADLAB_SKIP_SANITIZE:-0}" != 1 ]]; then
  echo "== test suite (AddressSanitizer + UndefinedBehaviorSanitizer, clang) and fuzz targets =="
  # clang: libFuzzer comes with it, and at -O1 it builds this pass 3x faster than g++ -O2 -g.
  # A build-asan/ configured by another compiler is started afresh.
  if [[ -f build-asan/CMakeCache.txt ]] && ! grep -q '^CMAKE_CXX_COMPILER:[A-Z]*=.*clang++' build-asan/CMakeCache.txt; then
    rm -rf build-asan
  fi
  cmake -S . -B build-asan -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only -DNDEBUG" -DHEADLAB_SANITIZE=ON -DHEADLAB_FUZZ=ON \
        -DHEADLAB_CUDA=OFF -DHEADLAB_EXAMPLES=OFF >/dev/null
  cmake --build build-asan -j"$jobs"
  # Every suite but the CUDA ones (label cuda; this build has no CUDA) and the install ones (label
  # install: a consumer of instrumented libraries would need the sanitizers too): unit, e2e (training runs,
  # the CLI, analysis, interop), python and fuzz (each target replays its seeds and saved crashes, then
  # fuzzes for HEADLAB_FUZZ_SECONDS). OpenMP's runtime keeps thread pools alive at exit: not a
  # leak of ours.
  (cd build-asan && ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
     ctest --output-on-failure -j"$jobs" -LE "cuda|install")
fi
