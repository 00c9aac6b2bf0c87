#!/usr/bin/env bash
# Makes the fuzz targets' seed corpora (tests/fuzz/corpus) from real files: tiny checkpoints trained
# by build/headlab (reverse with optimizer and trainer state, add with the wrapper form and qkv bias,
# chars, a pruned one), their config JSON (h5dump), and texts. Rerun after a checkpoint format change.
# Usage: tools/make_fuzz_corpus.sh [path/to/headlab]
set -euo pipefail
cd "$(dirname "$0")/.."
hl=${1:-build/headlab}
corpus=tests/fuzz/corpus
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$corpus"/{checkpoint_file,config,text}

tiny=(--emb-dim 8 --n-heads 2 --n-layers 1 --steps 2 --batch-size 4 --warmup 0
      --eval-every 2 --eval-batches 1 --save-every 2)
"$hl" train "${tiny[@]}" --task reverse --out "$tmp/reverse" >/dev/null
"$hl" train "${tiny[@]}" --task add --digits 2 --attention wrapper --qkv-bias --optimizer sgd --out "$tmp/add" >/dev/null
"$hl" train "${tiny[@]}" --task chars --text data/tiny.txt --context-length 8 --out "$tmp/chars" >/dev/null
"$hl" ablate "$tmp/reverse/checkpoint.h5" --batches 1 --batch-size 8 --prune 1 --out "$tmp/ablate" >/dev/null
cp "$tmp/reverse/checkpoint.h5" "$corpus/checkpoint_file/reverse.h5"
cp "$tmp/add/checkpoint.h5" "$corpus/checkpoint_file/add_wrapper_qkv_bias.h5"
cp "$tmp/chars/checkpoint.h5" "$corpus/checkpoint_file/chars.h5"
cp "$tmp/ablate/pruned.h5" "$corpus/checkpoint_file/reverse_pruned.h5"

# Each checkpoint's config; a chars text path relative to the source folder (where ctest runs).
for f in "$corpus"/checkpoint_file/*.h5; do
  h5dump -a /config "$f" | sed -n 's/^ *(0): "\(.*\)"$/\1/p' |
    sed 's#"text_path":"[^"]*"#"text_path":"data/tiny.txt"#' >"$corpus/config/$(basename "$f" .h5).json"
done

head -c 3000 data/tiny.txt >"$corpus/text/tiny_head.txt"
printf 'Ça va? Déjà vu — «naïve» café, 東京, 🙂.\n' >"$corpus/text/multibyte.txt"
printf 'line one\r\nline two\r\n\ttabbed\n' >"$corpus/text/crlf_tabs.txt"
printf 'ab' >"$corpus/text/two_chars.txt"
printf '0\n1\n2\n>\n.\n_\n' >"$corpus/text/vocabulary.txt"
echo "tools/make_fuzz_corpus.sh: wrote $(find "$corpus" -type f | wc -l) files under $corpus"
