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
# llama2.c's formats, behind the fuzz target's selector byte (0: a tokenizer file, 1: a checkpoint): a
# 260-token vocabulary (<unk>, <s>, </s>, the 256 byte tokens, " a") and tiny legacy and version-1 checkpoints.
mkdir -p "$corpus/llama2c"
python3 - "$corpus/llama2c" <<'PY'
import struct, sys
out = sys.argv[1]
pieces = [b"<unk>", b"<s>", b"</s>"] + [b"<0x%02X>" % b for b in range(256)] + [b" a"]
tok = struct.pack("<i", 6) + b"".join(struct.pack("<fi", -float(i), len(p)) + p for i, p in enumerate(pieces))
open(f"{out}/tokenizer.bin", "wb").write(b"\0" + tok)
dim, hidden, layers, heads, kv, vocab, seq = 8, 12, 1, 2, 1, 260, 4
kvd, hs = dim * kv // heads, dim // heads
floats = vocab * dim + layers * (2 * dim + 2 * dim * dim + 2 * kvd * dim + 3 * hidden * dim) + dim
values = struct.pack(f"<{floats}f", *[((i * 37) % 17 - 8) / 64 for i in range(floats)])
legacy = struct.pack("<7i", dim, hidden, layers, heads, kv, vocab, seq) + values + b"\0" * (4 * seq * hs)
open(f"{out}/legacy.bin", "wb").write(b"\1" + legacy)
v1 = struct.pack("<Ii7iB", 0x616B3432, 1, dim, hidden, layers, heads, kv, vocab, seq, 1)
open(f"{out}/version1.bin", "wb").write(b"\1" + v1 + b"\0" * (256 - len(v1)) + values)
PY

echo "tools/make_fuzz_corpus.sh: wrote $(find "$corpus" -type f | wc -l) files under $corpus"
