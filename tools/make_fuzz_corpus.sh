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

# tokenizer.json NUL text (or tokenizer_config.json): Llama 3's and SmolLM's pre-tokenizers over the 256 byte
# tokens and a few merges, added tokens, NFC, a TemplateProcessing BOS.
mkdir -p "$corpus/tokenizer_json"
python3 - "$corpus/tokenizer_json" <<'PY'
import json, sys
out = sys.argv[1]
printable = [b for b in range(256) if 0x21 <= b <= 0x7E or 0xA1 <= b <= 0xAC or b >= 0xAE]
chars, n = {}, 256
for b in range(256):
    chars[b] = chr(b) if b in printable else chr(n)
    n += 0 if b in printable else 1
vocab = {chars[b]: b for b in range(256)}
merges = [["\u0120", "t"], ["h", "e"], ["\u0120t", "he"], ["i", "n"], ["1", "2"]]
for a, b in merges:
    vocab[a + b] = len(vocab)
added = lambda content, id: {"id": id, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
                             "normalized": False, "special": True}
level = lambda regex: {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": regex}
llama3 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
bot = len(vocab)
base = {"version": "1.0", "decoder": level(True), "normalizer": None, "post_processor": None,
        "added_tokens": [added("<|begin_of_text|>", bot), added("<|endoftext|>", bot + 1)],
        "model": {"type": "BPE", "dropout": None, "byte_fallback": False, "ignore_merges": True, "vocab": vocab,
                  "merges": merges}}
split = dict(base, pre_tokenizer={"type": "Sequence", "pretokenizers": [
    {"type": "Split", "pattern": {"Regex": llama3}, "behavior": "Isolated", "invert": False}, level(False)]},
    post_processor={"type": "TemplateProcessing",
                    "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                               {"Sequence": {"id": "A", "type_id": 0}}],
                    "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [bot]}}})
digits = dict(base, normalizer={"type": "NFC"}, pre_tokenizer={"type": "Sequence", "pretokenizers": [
    {"type": "Digits", "individual_digits": True}, level(True)]})
digits["model"] = dict(base["model"], ignore_merges=False, merges=[" ".join(m) for m in merges])
for name, tok, rest in [("llama3_split", split, "the 12345 it's  \n\n<|endoftext|>"),
                        ("smollm_digits_nfc", digits, "Cafe\u0301 123 the"),
                        ("with_config", split, json.dumps({"bos_token": "<|begin_of_text|>", "add_bos_token": True}))]:
    open(f"{out}/{name}.bin", "wb").write(json.dumps(tok).encode() + b"\0" + rest.encode())
PY

# Hugging Face config.json files: the test fixtures' (GPT-2, every llama-layout variant: llama, Qwen3, OLMo-2, Gemma
# 1/2/3; GPT-NeoX, GPT-Neo, BERT).
mkdir -p "$corpus/hf_config"
for f in tests/fixtures/gpt2_folders/*/config.json tests/fixtures/llama_folders/*/config.json \
  tests/fixtures/neox_folders/*/config.json tests/fixtures/gpt_neo_folders/*/config.json \
  tests/fixtures/bert_folders/*/config.json; do
  cp "$f" "$corpus/hf_config/$(basename "$(dirname "$f")").json"
done

# Any JSON text (base/json_text.h): a config.json, a tokenizer.json's shape with a repeated vocabulary key and
# every kind of value, a prompt-pair row.
mkdir -p "$corpus/json"
cp "$corpus/hf_config/gqa_tied.json" "$corpus/json/config.json"
cat >"$corpus/json/tokenizer.json" <<'JSON'
{"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "a": 2}, "merges": ["a b"]}, "added_tokens": [{"id": 3, "content": "<s>", "special": true}], "x": [1.5e300, -0.0, 18446744073709551615, -9223372036854775808, "\u00e9\ud83d\ude00", null, true, false]}
JSON
printf '%s' '{"clean": "The cat sat", "corrupt": "The dog sat", "answer": " on", "wrong": " in"}' >"$corpus/json/row.jsonl"

# prompt pairs for a chars model over data/tiny.txt: aligned rows, a second row, one that fails (answer = wrong)
mkdir -p "$corpus/prompt_pairs"
printf '%s\n' '{"clean": "the rose", "corrupt": "the bose", "answer": " ", "wrong": "s"}' \
  '{"clean": "his heir", "corrupt": "her heir", "answer": " ", "wrong": "s"}' >"$corpus/prompt_pairs/rows.jsonl"
printf '%s\n' '{"clean": "ab", "corrupt": "ba", "answer": "c", "wrong": "c"}' >"$corpus/prompt_pairs/same_answer.jsonl"

# PyTorch files: the small torch.save fixtures (tools/fixtures_torch_files.py writes them), hostile ones included.
mkdir -p "$corpus/torch"
for f in values big_endian nested evil_os_system evil_eval_entry lying_storage past_storage legacy; do
  cp "tests/fixtures/torch_files/$f.pt" "$corpus/torch/"
done

# WordPiece (tasks/wordpiece_tokenizer.h): the bpe seeds' texts, a BERT fixture's vocab.txt and a WordPiece
# tokenizer.json, each NUL a text.
mkdir -p "$corpus/wordpiece"
cp "$corpus"/bpe/{english,scripts,invalid_utf8}.txt "$corpus/wordpiece/"
printf '%s\0%s' "$(cat tests/fixtures/bert_folders/mlm_tied/vocab.txt)" "Once upon a time, the [MASK] sat on the mat." \
  >"$corpus/wordpiece/vocab_text.bin"
printf '%s\0%s' '{"model": {"type": "WordPiece", "unk_token": "[UNK]", "vocab": {"[UNK]": 0, "[CLS]": 1, "[SEP]": 2, "a": 3, "##b": 4}}, "normalizer": {"type": "BertNormalizer", "lowercase": true}, "pre_tokenizer": {"type": "BertPreTokenizer"}}' \
  "ab A b" >"$corpus/wordpiece/tokenizer_json.bin"

echo "tools/make_fuzz_corpus.sh: wrote $(find "$corpus" -type f | wc -l) files under $corpus"
