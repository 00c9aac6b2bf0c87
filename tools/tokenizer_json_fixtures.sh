#!/usr/bin/env bash
# Small but realistic tokenizer.json files (Llama 3's, Qwen2's and SmolLM's pre-tokenizers, added tokens,
# ignore_merges, NFC) over a vocabulary cut from GPT-2's, and reference ids for many texts from an
# independent implementation: Hugging Face's tokenizers.js (@huggingface/tokenizers on npm), installed
# into a cache folder outside git.
# Usage: tools/tokenizer_json_fixtures.sh   (rewrites tests/fixtures/tokenizer_json/)
set -euo pipefail
cd "$(dirname "$0")/.."
cache=${XDG_CACHE_HOME:-$HOME/.cache}/headlab
npm_dir=$cache/npm
# Pinned: the fixture's ids come from this version.
packages=(@huggingface/tokenizers@0.2.0)

command -v npm >/dev/null || { echo "tokenizer_json_fixtures: npm is needed (apt-get install npm)" >&2; exit 1; }
tools/gpt2_tokenizer_fixtures.sh  # GPT-2's vocab.json and merges.txt in $cache/gpt2
if [[ ! -f "$npm_dir/node_modules/@huggingface/tokenizers/package.json" ]]; then
  npm install --silent --no-audit --no-fund --prefix "$npm_dir" "${packages[@]}" >/dev/null
fi
NODE_PATH="$npm_dir/node_modules" node tools/tokenizer_json_fixtures.js "$cache/gpt2" tests/fixtures/tokenizer_json
